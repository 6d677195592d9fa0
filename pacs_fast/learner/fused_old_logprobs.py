"""Old log-probs and the off-policy correction from the learner's own first forward (both learners).

Before the first optimiser step of an update the policy *is* the one the old log-probs are taken
under (the proximal policy), and without active dropout train and eval forwards agree (the megatron
model has none: ``hidden_dropout`` and ``attention_dropout`` are 0; the torch learner does not fuse with
it), so the forward of the first mini-batch already gives its rows' old log-probs (``logp.detach()``),
entropies and, with the rollout policy as the reference, their ``ref_logp``; the rows of the later
mini-batches get them from one no-grad pass before the update (the learner's ``compute_logprobs``). With
``correct=`` (``update(correct=...)``, :func:`pacs_fast.trainer.correction.fused_correction`) each
row's importance weights are set from the same numbers just before its loss, so the correction costs
no forward either. Exact up to the summation order of other micro-batch shapes. A group trained a few
rows at a time (:mod:`pacs_fast.learner.long_groups`) gives its old log-probs from its no-grad first pass.

Data parallelism (megatron): each data-parallel rank runs its share of the first mini-batch; with full
batches the values are gathered so every rank ends with the whole batch's ``old_logp`` /
``old_entropy`` / ``is_weights`` / ``kept_mask`` (a row may train on another rank in a later
epoch); with DP-local batches each group keeps its own rows.
"""
from __future__ import annotations

import torch

from pacs_fast.learner.base import RolloutBatch, group_rows


class FusedOldLogprobs:
    """One update's fused old log-probs (and correction). Construct it just before the first
    mini-batch (collective: the no-grad pass over the other groups), call :meth:`take` after each of
    the first mini-batch's micro-batch forwards, then :meth:`finish` once."""

    def __init__(self, learner, batch: RolloutBatch, first_groups: torch.Tensor, correct=None):
        B, T = batch.input_ids.shape
        self.batch, self.correct, self.parts = batch, correct, []
        batch.old_logp = torch.zeros(B, T)
        batch.old_entropy = torch.zeros(B, T)
        rest = sorted(set(range(batch.num_groups)) - set(first_groups.tolist()))
        if rest:  # (the same count on every rank: equal group counts and mini-batch sizes)
            lp, ent = learner.compute_logprobs(batch.groups(rest), return_entropy=True)
            rows = group_rows(rest, batch.group_size)
            batch.old_logp[rows, :lp.shape[1]] = lp
            batch.old_entropy[rows, :ent.shape[1]] = ent
        if learner.needs_ref and not learner.holds_reference and batch.ref_logp is None:
            batch.ref_logp = batch.old_logp  # the rollout policy is the reference
        if correct is not None:  # every row; the first mini-batch's again from its forwards
            correct(batch, batch.old_logp)

    def take(self, mcb: RolloutBatch, logp: torch.Tensor, ent: torch.Tensor) -> None:
        """Micro-batch ``mcb`` of the first mini-batch after its forward (``logp`` / ``ent``
        ``[b, w]``): its old (and rollout-reference) log-probs and its correction from them."""
        mcb.old_logp = logp.detach()
        if self.batch.ref_logp is self.batch.old_logp:
            mcb.ref_logp = mcb.old_logp
        cols = [mcb.old_logp.float(), ent.detach().float()]
        if self.correct is not None:
            self.correct(mcb, mcb.old_logp)
            if mcb.kept_mask is not None and not torch.equal(mcb.kept_mask, mcb.response_mask):
                raise ValueError("update: correct= rejected tokens; rejection changes the mini-batch's denominators, "
                                 "which the fused update counts before its forwards (compute_logprobs first)")
            cols += [mcb.is_weights.float(), mcb.kept_mask.float()]
        T = self.batch.input_ids.shape[1]
        self.parts.append(torch.stack([torch.nn.functional.pad(c, (0, T - c.shape[1])) for c in cols], 1))

    def finish(self, to_sorted, rows: torch.Tensor) -> None:
        """Writes the first mini-batch's values into the batch. ``to_sorted``: this rank's per-row
        values in micro-batch order -> the mini-batch's rows in its sorted order (gathered over
        data-parallel ranks with full batches), whose batch rows are ``rows``."""
        values = to_sorted(torch.cat(self.parts))  # [rows, 2 or 4, T]
        b = self.batch
        b.old_logp[rows] = values[:, 0]
        b.old_entropy[rows] = values[:, 1]
        if self.correct is not None:
            b.is_weights[rows] = values[:, 2].to(b.is_weights.dtype)
            b.kept_mask[rows] = values[:, 3].to(b.kept_mask.dtype)
        self.parts = []
