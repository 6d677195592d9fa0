"""The lean sampler's decode loops of :class:`pacs_fast.rollout.hf.HFEngine` (its module docstring
describes them): :meth:`LeanDecoder._lean_batch`, one row of the decoded batch per output row, and
:meth:`LeanDecoder._merged_batch`, one per group of output rows whose tokens so far are identical.

``LeanDecoder`` is a mixin: the engine provides ``model``, ``device``, ``pad_id``, ``eos_ids``,
``vocab_cut`` (the padded LM-head rows to cut, or None), ``max_model_len`` (the context, or None),
``_left_pad``, ``_stop_strings`` and ``_completions``. A row whose response holds one of ``params.stop``
is done (:meth:`~pacs_fast.rollout.stop_strings.StopStrings.hits`; ``_completions`` cuts it there).

Both loops take ``limits``, each prompt's response tokens at most (None: ``max_new_tokens`` for
every prompt): a row is done once it holds that many, as at an EOS (the engine's context: its
response ends where prompt + response reach ``max_model_len``, as vLLM's does). Finished rows
still in the batch keep their positions below the context (nothing they compute is kept), so a
model with learned absolute positions never indexes past its table.
"""
from __future__ import annotations

import torch

from pacs_fast.rollout.base import Completion, SamplingParams
from pacs_fast.rollout.sampling import row_uniforms, sample_tokens

# The lean loop reads its all-rows-done flag from a CUDA device only every this many steps.
_CUDA_DONE_CHECK_EVERY = 4
# The lean loop drops finished rows from its batch once they are this fraction of the active rows.
_COMPACT_FRACTION = 0.125


def select_rows(cache, index: torch.Tensor) -> None:
    """``cache.batch_select_indices(index)`` (rows may repeat: ``batch_repeat_interleave`` too), also for a hybrid
    model's cache: transformers 5.19's linear-attention cache layers (Qwen3.5's / Qwen3-Next's Gated DeltaNet, whose
    conv and recurrent states are a row's whole past) have neither method (an AttributeError at the first repeat,
    merge or compaction), and a layer that holds both kinds (``LinearAttentionAndFullAttentionLayer``) would take
    DynamicLayer's, leaving its states unselected; their ``reorder_cache`` selects every state."""
    layers = getattr(cache, "layers", None) or []
    if not any(_holds_states(layer) for layer in layers):
        cache.batch_select_indices(index)
        return
    for layer in layers:
        if _holds_states(layer):
            layer.reorder_cache(index)
        else:
            layer.batch_select_indices(index)


def repeat_rows(cache, rows: int, n: int, device) -> None:
    """``cache.batch_repeat_interleave(n)`` of its ``rows`` rows, hybrid caches included (:func:`select_rows`)."""
    if not any(_holds_states(layer) for layer in getattr(cache, "layers", None) or []):
        cache.batch_repeat_interleave(n)
    else:
        select_rows(cache, torch.arange(rows, device=device).repeat_interleave(n))


def _holds_states(layer) -> bool:
    return hasattr(layer, "conv_states") or hasattr(layer, "recurrent_states")


class LeanDecoder:
    """The lean sampler's prefill and decode loops (a mixin of :class:`pacs_fast.rollout.hf.HFEngine`)."""

    def _forward(self, **inputs):
        """The model's forward; a mixture of experts whose config asks for its router's load-balancing loss
        (``output_router_logits: true``) without it: transformers' loss took the cache's attention mask against
        one step's router logits, a RuntimeError at the first decode step (size 4 against 596)."""
        if getattr(getattr(self.model, "config", None), "output_router_logits", False):
            inputs["output_router_logits"] = False
        return self.model(**inputs)

    def _next_logits(self, out) -> torch.Tensor:
        """``[rows, V]`` fp32 logits of the last position, without the padded vocabulary rows
        (then contiguous, a copy of the real columns: the sampler's softmax / cumsum / sort and the
        log-softmax read them densely; a no-op without padded rows)."""
        return out.logits[:, -1, :self.vocab_cut].float().contiguous()

    def _prefill(self, prompts: list[list[int]], cache_method: str):
        """One forward over the left-padded prompts (one row each, ``logits_to_keep=1``).

        Returns ``(cache, logits [P, V] fp32, prompt_mask [P, width], position_ids [P, width],
        padded)`` on the device (``position_ids = cumsum(mask) - 1``; ``padded``: whether any prompt
        is shorter than ``width``, else the forward ran without a mask). The cache must have
        ``cache_method`` (what the caller's loop uses to reshape its batch)."""
        model, device = self.model, self.device
        input_ids, prompt_mask = self._left_pad(prompts)
        padded = any(len(p) != input_ids.shape[1] for p in prompts)
        position_ids = (prompt_mask.cumsum(-1) - 1).clamp_(min=0).to(device)
        prompt_mask = prompt_mask.to(device)
        out = self._forward(input_ids=input_ids.to(device), attention_mask=prompt_mask if padded else None,
                            position_ids=position_ids, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        if not hasattr(cache, cache_method):
            raise RuntimeError(f"sampler='lean' needs a KV cache with {cache_method}; "
                               f"{type(model).__name__} returned {type(cache).__name__}: use sampler='generate'")
        return cache, self._next_logits(out), prompt_mask, position_ids, padded

    def _row_limits(self, limits: list[int] | None, n: int, steps_max: int):
        """``(steps_max, row_limits)``: the loop's steps (the largest limit) and a ``[rows]`` int64 tensor
        of each output row's limit on the device, None when every row may take ``steps_max``."""
        if limits is None:
            return steps_max, None
        steps_max = max(limits)
        if min(limits) == steps_max:
            return steps_max, None
        return steps_max, torch.tensor(limits, device=self.device).repeat_interleave(n)

    def _next_position(self, position: torch.Tensor, row_limit: torch.Tensor | None) -> torch.Tensor:
        """``position + 1``; with rows of different limits, at most the context's last position (rows
        that still run never reach it, their limits stop them; finished ones wait in the batch there).
        With one limit for all, no row's position passes the context."""
        position = position + 1
        return position if row_limit is None else position.clamp_(max=self.max_model_len - 1)

    @torch.inference_mode()
    def _lean_batch(self, prompts: list[list[int]], params: SamplingParams, keys: torch.Tensor,
                    limits: list[int] | None = None) -> list[Completion]:
        """``len(prompts) * n`` completions (prompt-major) with the lean decode loop; ``keys``: the
        rows' :func:`~pacs_fast.rollout.sampling.row_keys`; ``limits``: see the module docstring."""
        model, device, n = self.model, self.device, params.n
        steps_max, rows = params.max_new_tokens, len(prompts) * n
        steps_max, row_limit = self._row_limits(limits, n, steps_max)
        cache, logits, prompt_mask, position_ids, padded = self._prefill(prompts, "batch_repeat_interleave")
        width = prompt_mask.shape[1]
        if n > 1:
            repeat_rows(cache, len(prompts), n, device)
            logits = logits.repeat_interleave(n, dim=0)
        # one preallocated mask for the whole loop (sliced per step), only when there is padding
        mask = None
        if padded:
            mask = torch.ones((rows, width + steps_max), dtype=torch.long, device=device)
            mask[:, :width] = prompt_mask.repeat_interleave(n, dim=0)
        position = position_ids[:, -1:].repeat_interleave(n, dim=0)
        eos = torch.tensor(self.eos_ids, dtype=torch.long, device=device) if len(self.eos_ids) > 1 else None
        tokens = torch.full((rows, steps_max), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((rows, steps_max), dtype=torch.float32, device=device) \
            if params.return_logprobs else None
        done = torch.zeros(rows, dtype=torch.bool, device=device)
        check_every = _CUDA_DONE_CHECK_EVERY if device.type == "cuda" else 1
        stops = self._stop_strings(params, check_every)
        can_compact = hasattr(cache, "batch_select_indices")
        active = rows      # rows still decoded; they are the rows ``row_ids`` of the outputs
        row_ids = None     # None: all rows, in order
        steps = steps_max
        for t in range(steps_max):
            at = slice(None) if row_ids is None else row_ids
            u = row_uniforms(keys[at], t) if params.temperature > 0 else None
            nxt = sample_tokens(logits, params.temperature, params.top_p, u, params.top_k, params.min_p)
            nxt = nxt.masked_fill_(done, self.pad_id)
            tokens[at, t] = nxt
            if logprobs is not None:
                logprobs[at, t] = logits.log_softmax(dim=-1).gather(1, nxt[:, None]).squeeze(1)
            done |= (nxt == self.eos_ids[0]) if eos is None else torch.isin(nxt, eos)
            if row_limit is not None:
                done |= row_limit[at] <= t + 1
            if t + 1 == steps_max:
                break
            if (t + 1) % check_every == 0:
                if stops is not None:
                    done |= stops.hits(tokens, done, upto=t + 1, rows=row_ids)
                finished = int(done.sum())
                if finished == active:
                    steps = t + 1
                    break
                if can_compact and finished >= active * _COMPACT_FRACTION:
                    # drop the finished rows from the batch (their later tokens would be cut anyway)
                    keep = (~done).nonzero().squeeze(1)
                    select_rows(cache, keep)
                    nxt, position, done = nxt[keep], position[keep], done[keep]
                    mask = mask[keep] if padded else None
                    row_ids = keep if row_ids is None else row_ids[keep]
                    active = len(keep)
            position = self._next_position(position, row_limit)
            out = self._forward(input_ids=nxt[:, None], attention_mask=mask[:, :width + t + 1] if padded else None,
                                position_ids=position, past_key_values=cache, use_cache=True)
            logits = self._next_logits(out)
        return self._completions(tokens[:, :steps].cpu(),
                                 logprobs[:, :steps].cpu() if logprobs is not None else None,
                                 None if row_limit is None else row_limit.tolist(), stops)

    @torch.inference_mode()
    def _merged_batch(self, prompts: list[list[int]], params: SamplingParams, keys: torch.Tensor,
                      limits: list[int] | None = None) -> list[Completion]:
        """``len(prompts) * n`` completions (prompt-major) with the lean loop on merged rows.

        A *node* is one row of the decoded batch (of the model's forward and KV cache); it stands
        for every output row whose tokens so far are identical: at first the ``n`` rows of each
        prompt. Each output row draws its own token from its node's distribution; the rows of a node
        that drew the same token stay together, the others split off into new nodes (their cache
        rows copied with ``cache.batch_select_indices``), and nodes whose token is an EOS leave the
        batch. Same distribution per row as unmerged decoding, fewer rows to decode while samples
        agree (a fixed answer format, a low-entropy policy, greedy decoding). Once every node holds
        one row the loop continues as the unmerged one (no regrouping; finished rows are fed the
        pad id and dropped together, ``_COMPACT_FRACTION``)."""
        model, device, n = self.model, self.device, params.n
        steps_max, rows = params.max_new_tokens, len(prompts) * n
        steps_max, row_limit = self._row_limits(limits, n, steps_max)
        cache, logits, prompt_mask, position, padded = self._prefill(prompts, "batch_select_indices")
        width = prompt_mask.shape[1]
        V = logits.shape[-1]                                                   # logits: [nodes, V]
        mask = None
        if padded:  # one mask for the whole loop (sliced per step), a row per node
            mask = torch.ones((len(prompts), width + steps_max), dtype=torch.long, device=device)
            mask[:, :width] = prompt_mask
        position = position[:, -1:]
        eos = torch.tensor(self.eos_ids, dtype=torch.long, device=device)
        row_ids = torch.arange(rows, device=device)   # output row of each active row
        node_of = row_ids // n                         # its node
        tokens = torch.full((rows, steps_max), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((rows, steps_max), dtype=torch.float32, device=device) \
            if params.return_logprobs else None
        steps = steps_max
        check_every = _CUDA_DONE_CHECK_EVERY if device.type == "cuda" else 1  # (stop strings: _completions cuts)
        stops = self._stop_strings(params, check_every)
        merging = True    # some node holds more than one row; else one row per node (as unmerged)
        for t in range(steps_max):
            u = row_uniforms(keys[row_ids], t) if params.temperature > 0 else None
            nxt = sample_tokens(logits.index_select(0, node_of), params.temperature, params.top_p, u,
                                params.top_k, params.min_p)
            tokens[row_ids, t] = nxt
            if logprobs is not None:
                logprobs[row_ids, t] = logits.log_softmax(dim=-1)[node_of, nxt]
            alive = ~torch.isin(nxt, eos)
            if row_limit is not None:
                alive &= row_limit[row_ids] > t + 1
            if stops is not None and (t + 1) % check_every == 0:
                alive &= ~stops.hits(tokens, ~alive, upto=t + 1, rows=row_ids)
            if t + 1 == steps_max or not bool(alive.any()):
                steps = t + 1
                break
            row_ids, nxt, node_of = row_ids[alive], nxt[alive], node_of[alive]
            nodes = len(logits)
            if merging:  # the next nodes: the distinct (node, token) pairs of the rows still going
                pairs, node_of = torch.unique(node_of * V + nxt, return_inverse=True)
                parent, feed = pairs // V, pairs % V
                merging = len(pairs) < len(row_ids)
                select = len(parent) != nodes or bool((parent != torch.arange(nodes, device=device)).any())
            else:  # one row per node: finished nodes are fed the pad id until enough of them are dropped
                feed = torch.full((nodes,), self.pad_id, dtype=torch.long, device=device)
                feed[node_of] = nxt
                select = nodes - len(row_ids) >= nodes * _COMPACT_FRACTION
                if select:
                    parent, feed, node_of = node_of, nxt, torch.arange(len(row_ids), device=device)
            if select:
                select_rows(cache, parent)
                position = position[parent]
                mask = mask[parent] if padded else None
            position = self._next_position(position, row_limit)
            out = self._forward(input_ids=feed[:, None], attention_mask=mask[:, :width + t + 1] if padded else None,
                                position_ids=position, past_key_values=cache, use_cache=True)
            logits = self._next_logits(out)
        return self._completions(tokens[:, :steps].cpu(),
                                 logprobs[:, :steps].cpu() if logprobs is not None else None,
                                 None if row_limit is None else row_limit.tolist(), stops)
