"""Groups larger than a micro-batch, trained exactly a few rows at a time (cached per-token gradients).

A group's rows are coupled by the loss: PACS's score compares a row's proxy with its group's, GRPO's advantage is a
function of its group's rewards, so a micro-batch holds whole groups. With long responses one group can exceed
``learner.max_tokens_per_micro_batch`` (DAPO: 16 responses of 20,480 tokens, ~330k tokens). With
``learner.split_groups=auto`` such a group trains in two passes over its rows, cut into micro-batches of rows under
the budget (gradient caching, as GradCache does for contrastive losses, Gao et al. 2021):

1. a no-grad forward keeps each row's per-token log-probs (and the entropies and values the objective reads):
   ``[rows, T]`` floats, no activations;
2. the objective of those groups on these tensors, as leaves, gives the loss, its metrics, and its gradient with
   respect to every token's log-prob (entropy, value);
3. the rows' forwards again, with grad: each backward of ``sum(cached gradient x logp)`` adds its rows' share.

By the chain rule the third pass's gradients sum to the objective's gradient at these parameters (which do not change
within a mini-batch), whatever the objective, up to the rounding between the two forwards. The loss and metrics are
the whole groups' (step 2). Cost: one more forward of those rows (about a third of their forward and backward; a
quarter with full recompute). Dropout would draw other masks in the two forwards: refused. With the fused old
log-probs (the first mini-batch, :mod:`~pacs_fast.learner.fused_old_logprobs`) step 1's log-probs are the old ones.
What the objective selects per micro-batch (``algo.entropy_top_frac``'s high-entropy tokens, Clip-Cov's and KL-Cov's
tokens) it selects over the split groups together, as over one micro-batch. No-grad passes (old and reference
log-probs, values) cut such groups by rows as well: nothing couples rows there.

One pass where the objective is a sum over rows once each row's advantage is known
(:func:`~pacs_fast.learner.objective.rows_apart`: per-token ``batch.advantages``, or GRPO's, RLOO's, Dr. GRPO's and
verl's loss modes' outcome advantages computed over the whole groups first): the row micro-batches then run forward
and backward with the objective directly, as whole groups do (:func:`train_rows`), no cached pass. PACS (its score
couples its rows' log-probs), Clip-Cov, KL-Cov and ``algo.entropy_top_frac < 1`` keep the two passes.
:func:`train_long_groups` decides, for both learners.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from pacs_fast.learner.base import RolloutBatch, group_rows
from pacs_fast.learner.objective import rows_apart
from pacs_fast.learner.packing import group_costs, micro_batch_groups

# forward(micro-batch, *, entropy: bool = <the learner's choice>) -> (logp [b, w], entropy [b, w] or None, values
# [b, w] or None), differentiable; entropy=False: none needed (the grad pass of a split group whose loss has no
# entropy term skips it even when the first pass needed the old entropies)
Forward = Callable[..., tuple]


def row_view(batch: RolloutBatch) -> RolloutBatch:
    """``batch`` with each row its own group (``group_size`` 1): the micro-batch cuts then cut rows (a row view is
    for forwards and their cuts; its objective would score rows alone)."""
    return dataclasses.replace(batch, group_size=1)


def whole_and_split(batch: RolloutBatch, budget: int, costs: list[int], cut, *,
                    split: str) -> list[tuple[list[int], bool]]:
    """A mini-batch's micro-batches as ``(group positions, whole)``: the groups within ``budget`` (``costs``: what
    each group alone counts, :func:`~pacs_fast.learner.packing.group_costs`) as ``cut(sub-batch)`` cuts them (group
    positions per micro-batch), and the groups over it, all together, as one item with ``whole`` False (trained by
    :func:`train_split`). ``split="off"``: every group to ``cut``, which refuses a group over the budget."""
    over = [g for g, c in enumerate(costs) if budget and c > budget] if split == "auto" else []
    if not over:
        return [(p, True) for p in cut(batch)]
    gone = set(over)
    fits = [g for g in range(batch.num_groups) if g not in gone]
    whole = [[fits[i] for i in p] for p in cut(batch.groups(fits))] if fits else []
    return [(p, True) for p in whole] + [(over, False)]


def row_parts(batch: RolloutBatch, budget: int, flags: dict) -> list[list[int]]:
    """``batch``'s rows (positions) cut into micro-batches under ``budget`` as the learner cuts groups (``flags``:
    :func:`~pacs_fast.learner.packing.micro_batch_groups`'s; no shared prefix: a row is its own group). ValueError
    naming the key when one row alone is over the budget (a sequence trains whole)."""
    rows = row_view(batch)
    flags = {**flags, "shared_prefix": False}
    costs = group_costs(rows, **flags)
    if costs and max(costs) > budget:
        raise ValueError(f"a sequence of {max(costs)} token slots is larger than learner.max_tokens_per_micro_batch="
                         f"{budget}: raise the budget (a group larger than it trains a few rows at a time, a row "
                         f"trains whole)")
    return micro_batch_groups(rows, 1, budget, **flags)


def forward_pieces(batch: RolloutBatch, items: list[tuple[list[int], bool]], cut_rows):
    """``(micro-batch, its row indices in batch)`` for a no-grad pass over :func:`whole_and_split`'s ``items``: a whole
    item's groups together, a split item's rows as ``cut_rows(sub-batch)`` cuts them (row positions)."""
    for groups, whole in items:
        rows = group_rows(groups, batch.group_size)
        if whole:
            yield batch.groups(groups), rows
            continue
        sub = batch.groups(groups)
        for p in cut_rows(sub):
            yield row_view(sub).groups(p), rows[torch.as_tensor(p, dtype=torch.long)]


def no_grad_rows(forward: Forward, batch: RolloutBatch, parts: list[list[int]]):
    """Pass 1 (call under ``torch.no_grad``): the forwards of ``batch``'s rows cut into ``parts`` (row
    positions), each output gathered back to ``[rows, width of batch]`` (zeros past a part's width), or None."""
    rows = row_view(batch)
    outs = [forward(rows.groups(p)) for p in parts]
    width = batch.input_ids.shape[1]
    gathered = []
    for k in range(3):
        if not outs or outs[0][k] is None:
            gathered.append(None)
            continue
        first = outs[0][k]
        full = first.new_zeros(batch.num_rows, width)
        for p, o in zip(parts, outs):
            full[torch.as_tensor(p, dtype=torch.long, device=full.device), :o[k].shape[1]] = o[k]
        gathered.append(full)
    return tuple(gathered)


def train_split(batch: RolloutBatch, forward: Forward, parts: list[list[int]], loss_fn, *,
                on_first_forward=None):
    """The gradient of ``loss_fn`` over ``batch``'s whole groups accumulated into the parameters' ``.grad``, a few
    rows at a time (the module's three passes). ``forward``: as the learner's update runs it (the entropies and
    values it returns are those the objective or ``on_first_forward`` read); ``parts``: row positions per
    micro-batch (:func:`row_parts`); ``loss_fn(batch, logp, entropy, values)`` ->
    ``(loss, metrics)``: the objective of whole groups; ``on_first_forward(batch, logp, entropy)``: called with pass
    1's detached outputs before the objective (the fused old log-probs). Returns ``(loss detached, metrics)``."""
    with torch.no_grad():
        cached = no_grad_rows(forward, batch, parts)
    if on_first_forward is not None:
        on_first_forward(batch, cached[0], cached[1])
    leaves = [None if t is None else t.detach().requires_grad_(True) for t in cached]
    loss, metrics = loss_fn(batch, *leaves)
    used = [t for t in leaves if t is not None]
    grads = dict(zip(map(id, used), torch.autograd.grad(loss, used, allow_unused=True)))
    cached_grads = [None if t is None else grads[id(t)] for t in leaves]
    rows = row_view(batch)
    for p in parts:
        index = torch.as_tensor(p, dtype=torch.long)
        outs = forward(rows.groups(p), entropy=cached_grads[1] is not None)  # (only what the loss's gradient reads)
        surrogate = None
        for out, g in zip(outs, cached_grads):
            if out is None or g is None:
                continue
            term = (g[index.to(g.device), :out.shape[1]] * out.to(g.dtype)).sum()
            surrogate = term if surrogate is None else surrogate + term
        if surrogate is not None and surrogate.requires_grad:
            surrogate.backward()
    return loss.detach(), {k: v.detach() for k, v in metrics.items()}


def train_rows(batch: RolloutBatch, forward: Forward, parts: list[list[int]], loss_fn, *, on_first_forward=None):
    """:func:`train_split`'s gradient in one forward and backward per micro-batch of rows, for a ``batch`` whose
    objective sums over rows (:func:`~pacs_fast.learner.objective.rows_apart`'s: each row carries its group's
    advantage): ``loss_fn(rows, logp, entropy, values)`` of each part (a batch of ``group_size`` 1) after
    ``on_first_forward(rows, logp, entropy)`` (its old log-probs, before its loss). Returns ``(loss detached,
    metrics, order)``: the sums of the parts' losses and 0-d metrics, their per-row metrics concatenated in
    ``order`` (``[rows]`` int64: ``batch``'s row positions in the order the parts ran, and passed
    ``on_first_forward``)."""
    rows = row_view(batch)
    total, scalars, per_row = None, {}, {}
    for p in parts:
        part = rows.groups(p)
        logp, ent, values = forward(part)
        if on_first_forward is not None:
            on_first_forward(part, logp, ent)
        loss, met = loss_fn(part, logp, ent, values)
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
        for k, v in met.items():
            if v.dim() == 0:
                scalars[k] = scalars[k] + v.detach() if k in scalars else v.detach()
            else:
                per_row.setdefault(k, []).append(v.detach())
    order = torch.as_tensor([i for p in parts for i in p], dtype=torch.long)
    return total, {**scalars, **{k: torch.cat(v) for k, v in per_row.items()}}, order


def train_micro_batch(algo, mcb: RolloutBatch, whole: bool, forward: Forward, loss_fn, cut_rows, *,
                      on_first_forward=None):
    """One item of :func:`whole_and_split` in both learners' updates: whole groups run forward (then
    ``on_first_forward(mcb, logp, entropy)``), their loss and its backward; groups over the budget go to
    :func:`train_long_groups` in the micro-batches of rows ``cut_rows(mcb)`` gives. Returns ``(loss detached,
    metrics, order)``: ``order`` the row positions of ``mcb`` in the order ``on_first_forward`` saw them and the per-row
    metrics hold them (a slice of all of them for whole groups)."""
    if not whole:
        return train_long_groups(algo, mcb, forward, cut_rows(mcb), loss_fn, on_first_forward=on_first_forward)
    logp, ent, values = forward(mcb)
    if on_first_forward is not None:
        on_first_forward(mcb, logp, ent)
    loss, metrics = loss_fn(mcb, logp, ent, values)
    loss.backward()
    return loss.detach(), metrics, slice(None)


def train_long_groups(algo, batch: RolloutBatch, forward: Forward, parts: list[list[int]], loss_fn, *,
                      on_first_forward=None):
    """A split item (:func:`whole_and_split`) trained a few rows at a time: in one pass (:func:`train_rows`) where
    :func:`~pacs_fast.learner.objective.rows_apart` lets ``algo``'s rows train apart, else in :func:`train_split`'s
    two. Arguments as theirs. Returns ``(loss detached, metrics, order)``: ``order`` (``[rows]`` int64) the row
    positions in the order ``on_first_forward`` saw them and the per-row metrics hold them (the two passes:
    ``batch``'s)."""
    apart = rows_apart(algo, batch)
    if apart is not None:
        return train_rows(apart, forward, parts, loss_fn, on_first_forward=on_first_forward)
    loss, metrics = train_split(batch, forward, parts, loss_fn, on_first_forward=on_first_forward)
    return loss, metrics, torch.arange(batch.num_rows)
