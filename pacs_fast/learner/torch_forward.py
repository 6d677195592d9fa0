"""How the torch learner runs its forwards: which layout a batch takes, its micro-batches, and the log-probs.

:class:`TorchForwards` is a part of :class:`~pacs_fast.learner.torch_learner.TorchLearner` (a mixin). With
``learner.shared_prefix`` the longest common prefix of each group's rows (its prompt and any start its ``G`` responses
share) runs once and the rest of each row on top of its key/value cache (:mod:`pacs_fast.learner.shared_prefix`),
else every row runs whole: packed end to end without padding (``learner.packing``, :mod:`pacs_fast.learner.packing`)
or right-padded. The two are alternatives, not layers: the shared-prefix forward already skips the G-1 repeats of a
group's prompt, which packing cannot; packing removes the padding of whole rows. ``learner.packing=auto`` packs when
that runs at least 20% fewer token slots than the forward it replaces (padded rows, or the shared prefix plus each
row's rest padded to the longest rest): on long, uneven responses the padding outweighs the prompt repeats. ``on``
always packs (instead of the shared-prefix forward too), ``off`` never. Packed rows attend through
:mod:`pacs_fast.ops.varlen_attention` (one row, ``cu_seqlens``, no ``[S, S]`` mask) or the dense block-diagonal mask:
``learner.packed_attention``. Every forward is counted by kind in the learner's ``forwards`` (``packed``,
``shared_prefix``, ``padded``, and their ``token_slots``). Micro-batches hold ``learner.micro_batch_prompts`` groups,
or, with ``learner.max_tokens_per_micro_batch``, whole groups of about equal token counts, a group over the budget
trained a few rows at a time (:mod:`pacs_fast.learner.long_groups`).

It reads the learner's ``cfg`` (``learner``), ``device``, ``vocab_size``, ``temperature``, ``logit_scale``,
``softcap``, ``lm_head_fp32``, ``value_head``, ``model``, ``forwards`` and ``_switched`` (set in
``TorchLearner.__init__``).
"""
from __future__ import annotations

import torch

from pacs_fast.causal_lm import decoder_body, lm_head
from pacs_fast.learner.base import RolloutBatch, check_response_ids
from pacs_fast.learner.long_groups import row_parts, whole_and_split
from pacs_fast.learner.packing import (Packed, group_costs, mask_window, micro_batch_groups, pack,
                                      packed_attention_mode, packed_hidden, padded_rows_only, padded_slots,
                                      say_no_shared_prefix, say_padded_rows, shared_prefix_problem,
                                      shared_prefix_slots)
from pacs_fast.learner.shared_prefix import (common_prefix_lengths, scatter_to_rows, select_trained,
                                            shared_prefix_hidden, split_groups, trained_states)
from pacs_fast.ops import varlen_attention
from pacs_fast.ops.linear_logprobs import linear_logprobs


class TorchForwards:
    """The forwards of a :class:`~pacs_fast.learner.torch_learner.TorchLearner`: layout, micro-batches, log-probs."""

    def _forward(self, model, batch: RolloutBatch, *, entropy: bool, values: bool):
        """Differentiable ``logp [b, T]`` (and entropy / values ``[b, T]``, else None)."""
        ids = batch.input_ids.to(self.device)
        mask = batch.response_mask.to(self.device)
        b, T = ids.shape
        att = batch.attention_mask.to(self.device)
        layout = None
        if self._shares_prefixes(model):
            layout = split_groups(ids, att, batch.group_size)
        rival = padded_slots(att) if layout is None else shared_prefix_slots(ids, att, batch.group_size)
        packed = self._packed(model, ids, att, rival)  # on: always; auto: when it runs fewer token slots
        if packed is not None:
            layout = None
        kind = "packed" if packed is not None else ("shared_prefix" if layout is not None else "padded")
        self.forwards[kind] += 1
        self.forwards["token_slots"] += packed.slots if packed is not None else rival
        if layout is not None:  # each group's common prefix once, the rest of its G rows on top
            sel = select_trained(layout, mask, batch.group_size)
            h, labels = trained_states(*shared_prefix_hidden(decoder_body(model), layout, batch.group_size), layout, sel)

            def scatter(x):
                return scatter_to_rows(x, sel, T)
        else:
            sel = mask[:, 1:] > 0                              # positions t >= 1 that are response tokens
            if packed is not None:  # rows end to end, no padding (pacs_fast/learner/packing.py)
                h = packed.gather(packed_hidden(decoder_body(model), packed), sel)
            else:
                # Rows are right-padded, so the causal mask alone is exact for every real token. The last
                # column is only ever a label, so it is not fed.
                hidden = decoder_body(model)(input_ids=ids[:, :max(T - 1, 1)],
                                         use_cache=False).last_hidden_state[:, :T - 1]  # [b, T-1, H]
                h = hidden[sel]                                # hidden state that predicts token t
            labels = ids[:, 1:][sel]

            def scatter(x):
                full = x.new_zeros(b, T - 1).masked_scatter(sel, x)
                return torch.cat([x.new_zeros(b, 1), full], dim=1)
        head = lm_head(model)
        weight, bias = head.weight, head.bias
        if self.vocab_size is not None:  # padded rows: never sampled, not part of the distribution
            weight, bias = weight[:self.vocab_size], (bias[:self.vocab_size] if bias is not None else None)
            check_response_ids(labels, self.vocab_size)
        # (self.temperature: the rollout's, or 1 for the passes that swap it in: trainer/step.py, correction.py)
        out = linear_logprobs(h, weight, labels, bias=bias, temperature=self.temperature / self.logit_scale,
                              return_entropy=entropy, backend=self.cfg.logprob_backend, upcast=self.lm_head_fp32,
                              softcap=self.softcap)
        lp, ent = out if entropy else (out, None)
        v = None
        if values:  # in float32 at least (a group's shared values sum their rows' gradients in this dtype)
            v = scatter(self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1))
        return scatter(lp), (scatter(ent) if ent is not None else None), v

    def _packed(self, model, ids: torch.Tensor, attention_mask: torch.Tensor, rival_slots: int) -> Packed | None:
        """The packed layout of these whole rows, or None for the other forward (``learner.packing``:
        ``on`` always packs; ``auto`` packs when that runs >= 20% fewer token slots than the
        ``rival_slots`` of the padded or shared-prefix forward, or when those slots would exceed
        ``learner.max_tokens_per_micro_batch``, which cut these rows by real tokens). Attention: ``learner.packed_attention``
        (:func:`~pacs_fast.learner.packing.packed_attention_mode`); varlen switches ``model`` to
        :mod:`pacs_fast.ops.varlen_attention` until the public call ends (``packing.restores_attention``)."""
        if self.cfg.packing == "off" or (ids.shape[0] < 2 and self.cfg.packing == "auto"):
            return None
        if self._rows_unpacked(model):
            return None
        varlen = packed_attention_mode(model, self.cfg.packed_attention, announce=False) == "varlen"
        impl = varlen_attention.base_implementation(model.config)
        window, layered = mask_window(model.config)  # (the dense mask keeps a sliding window; varlen has none)
        packed = pack(ids, attention_mask, implementation=impl, dtype=next(model.parameters()).dtype, varlen=varlen,
                      window=window, layered=layered)
        budget = self.cfg.max_tokens_per_micro_batch  # (the cut counted real tokens: the rival must not exceed it)
        if self.cfg.packing == "auto" and packed.slots > 0.8 * rival_slots and not (budget and rival_slots > budget):
            return None
        if not varlen:  # (auto's line on the dense mask, once rows do pack)
            packed_attention_mode(model, self.cfg.packed_attention)
        base = varlen_attention.activate(model) if varlen else None
        if base is not None:
            self._switched.append((model, base))
        return packed

    def _micro_batches(self, batch: RolloutBatch, limit: int, model=None) -> list[tuple[list[int], bool]]:
        """Group positions of ``batch`` per micro-batch, with whether they train whole: ``limit`` groups each, or,
        with ``learner.max_tokens_per_micro_batch``, about equal real-token counts (whole groups; with
        ``learner.packing=off`` the token slots of the forward ``model`` runs: shared-prefix or padded; packed rows
        with the dense mask: the padded forward's slots, which bound its bins), the groups over the budget as one
        item trained a few rows at a time (``learner.split_groups``, :mod:`~pacs_fast.learner.long_groups`)."""
        model = self.model if model is None else model
        flags, budget = self._cut_flags(model), self.cfg.max_tokens_per_micro_batch
        costs = group_costs(batch, **flags) if budget else []
        return whole_and_split(batch, budget, costs, lambda b: micro_batch_groups(b, limit, budget, **flags),
                               split=self.cfg.split_groups)

    def _cut_flags(self, model) -> dict:
        """How the budget counts ``model``'s forwards (:func:`~pacs_fast.learner.packing.micro_batch_groups`)."""
        padded = self.cfg.packing == "off" or self._rows_unpacked(model)
        dense = bool(self.cfg.max_tokens_per_micro_batch) and not padded and \
            packed_attention_mode(model, self.cfg.packed_attention, announce=False) == "dense"
        return dict(padded=padded, shared_prefix=self._shares_prefixes(model), dense=dense)

    @staticmethod
    def _rows_unpacked(model) -> bool:
        """Whether ``model`` has recurrent layers or chunked attention (:func:`~pacs_fast.learner.packing.
        padded_rows_only`: packed rows would carry their state across sequences, or cut their chunks elsewhere):
        padded rows then, one line says so."""
        why = padded_rows_only(model.config)
        if why:
            say_padded_rows(why)
        return why is not None

    def _row_parts(self, sub: RolloutBatch, model=None) -> list[list[int]]:
        return row_parts(sub, self.cfg.max_tokens_per_micro_batch, self._cut_flags(self.model if model is None
                                                                                   else model))

    def _shares_prefixes(self, model) -> bool:
        """Whether ``model``'s forwards run the shared-prefix forward: ``learner.shared_prefix``, without full
        recompute (which turns the cache off) or sliding-window layers (:func:`~pacs_fast.learner.packing.
        shared_prefix_problem`: packed or padded rows keep the window, one line says so)."""
        if not self.cfg.shared_prefix or getattr(model, "is_gradient_checkpointing", False):
            return False
        why = shared_prefix_problem(model.config)
        if why:
            say_no_shared_prefix(why)
        return why is None

    def _rest_lengths(self, batch: RolloutBatch) -> torch.Tensor | None:
        """With the shared-prefix forward, what each group runs per row (its longest row past the
        group's common prefix): the micro-batch sort key. None (longest rows) otherwise."""
        if not self.cfg.shared_prefix or batch.group_size < 2:
            return None
        lengths = batch.attention_mask.sum(-1).long()
        longest = lengths.view(batch.num_groups, batch.group_size).max(-1).values
        return longest - common_prefix_lengths(batch.input_ids, lengths, batch.group_size)
