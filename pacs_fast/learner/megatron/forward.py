"""Per-token log-probs of a batch under a (tensor-parallel) megatron-core ``GPTModel``.

The decoder runs as usual; its final hidden states go straight into the vocab-parallel
:func:`pacs_fast.ops.linear_logprobs` with this rank's output-layer (or tied embedding) shard, so
the ``[tokens, vocab]`` logits are never gathered (nor, with the fused op, materialised).

Padding. Rows may be left- and right-padded (prompt left-padded, response right-padded); the
valid tokens of a row must be contiguous. megatron's ``GPTModel`` applies RoPE at positions
``0..S-1`` regardless of ``position_ids``, so each row is first shifted left to start at column 0
(positions then equal ``cumsum(attention_mask) - 1``, as in the HF / vLLM convention) and padding
sits only at the end, where causal attention keeps it from influencing valid tokens. Only the
causal mask applies (no mask is passed: the core attention runs a causal kernel); results are shifted back.
Padded or packed, only the labelled positions' hidden states (the response tokens, given ``label_mask``) reach the
LM head: prompt and padding cost no vocabulary work.

The padded rows attend through a causal kernel without a mask (:mod:`~pacs_fast.learner.megatron.core_attention`:
no ``[S, S]`` mask or scores).

Packing (``packing="on"``; ``"auto"``: when it runs >= 20% fewer token slots than the padded rows, or their slots
exceed the micro-batch's token budget, as in the torch learner; on the H200 the padded rows ran 40,411 tokens/s
against THD's 36,933 at 8 x 4k, bench/results/gpu/20261204_h200). The left-aligned
rows are laid end to end (:func:`pacs_fast.learner.packing.pack`), each keeping its own positions
(restarting at 0), and attention never crosses a boundary. Two layouts (``packed_attention``):

- ``varlen`` (``auto``): THD. All rows form one sequence of ``t`` tokens (``[t, 1, h]`` inside the
  decoder) with megatron ``PackedSeqParams`` (``qkv_format="thd"``, ``cu_seqlens``, the longest row:
  :func:`~pacs_fast.learner.megatron.core_attention.thd_params`). megatron's THD RoPE restarts the
  angles at 0 in each sequence and the layer spec's core attention
  (:mod:`~pacs_fast.learner.megatron.core_attention`) attends inside each sequence with a varlen
  kernel: no ``[t, t]`` mask or score matrix, no work across sequences.
- ``dense``: rows packed into bins of the longest row's size, the block-diagonal causal mask
  ``[bins, 1, C, C]`` through megatron's unfused softmax (``masked_softmax_fusion=False``), and RoPE
  at each token's own position: megatron's ``RotaryEmbedding`` only produces positions ``0..S-1``
  for a whole row, so for one forward it returns per-token frequencies ``[S, bins, 1, d]``, which its
  bshd rotation broadcasts like its own ``[S, 1, 1, d]``.

Sequence parallelism (``learner.sequence_parallel``; :mod:`~pacs_fast.learner.megatron.sequence_parallel`): the
rows, bins or packed row run padded to a multiple of the tensor-parallel size at their end, and the decoder's
output (this rank's part of the sequence) is gathered before the LM head, the padding dropped.

Inside a sequence RoPE's scores depend only on relative positions, so the restart only matters for
rounding; it keeps the angles, hence the numbers, those of the padded forward. Exact: every token
attends to the same tokens at the same positions (tests/test_megatron_packing.py,
tests/test_megatron_thd.py).
"""
from __future__ import annotations

import contextlib

import torch

from pacs_fast.learner.megatron.sequence_parallel import (gather_hidden, is_sequence_parallel, pad_columns, pad_thd,
                                                          tp_size_of)

#: Logit bias of the vocabulary rows added for tensor-parallel padding (excluded from softmax).
PAD_LOGIT = -1e30
#: ``learner.packed_attention``: packed rows as THD through a varlen kernel (auto, varlen) or the dense mask
PACKED_ATTENTION = ("auto", "varlen", "dense")


def left_align(input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Shift each row so its valid tokens start at column 0.

    input_ids / attention_mask: ``[B, T]``. Returns ``(ids, mask, shift, length)``: shifted ids
    and mask trimmed to the longest row, and per-row ``shift`` (leading pads) and ``length`` (valid
    tokens), int64 ``[B]``. Raises ValueError when a row's valid tokens are not contiguous.
    """
    if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids and attention_mask must both be [B, T]; got "
                         f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    mask = attention_mask.bool()
    B, T = mask.shape
    shift = torch.where(mask.any(1), mask.int().argmax(1), torch.zeros(B, dtype=torch.long,
                                                                        device=mask.device)).long()
    length = mask.sum(1).long()
    cols = torch.arange(T, device=mask.device)
    src = (cols.unsqueeze(0) + shift.unsqueeze(1)) % T
    mask_l = mask.gather(1, src)
    if not torch.equal(mask_l, cols.unsqueeze(0) < length.unsqueeze(1)):
        raise ValueError("attention_mask: the valid (1) tokens of each row must be contiguous")
    width = max(int(length.max()), 1) if B else 1
    ids_l = input_ids.gather(1, src)[:, :width]
    return ids_l, mask_l[:, :width], shift, length


def unalign(values_l: torch.Tensor, shift: torch.Tensor, T: int) -> torch.Tensor:
    """Inverse of :func:`left_align` for per-token values ``[B, W]`` -> ``[B, T]`` (0 outside)."""
    B, W = values_l.shape
    full = values_l.new_zeros(B, T)
    full[:, :W] = values_l
    cols = torch.arange(T, device=values_l.device)
    src = (cols.unsqueeze(0) - shift.unsqueeze(1)) % T
    return full.gather(1, src)


@contextlib.contextmanager
def _hidden_states_only(model):
    """Make ``GPTModel.forward`` return the decoder output (after the final norm), not logits."""
    saved = model.post_process
    model.post_process = False
    try:
        yield
    finally:
        model.post_process = saved


def output_weight(model) -> torch.Tensor:
    """This rank's vocab shard ``[V_pad / tp, H]`` of the LM head (the embedding when tied)."""
    if model.share_embeddings_and_output_weights:
        return model.shared_embedding_or_output_weight()
    return model.output_layer.weight


def pad_bias(vocab_size: int, local_vocab: int, tp_rank: int, device, dtype=torch.float32):
    """Bias for this rank's vocab shard excluding padded rows from the softmax, or None."""
    first = tp_rank * local_vocab
    if first + local_vocab <= vocab_size:
        return None
    ids = torch.arange(first, first + local_vocab, device=device)
    return torch.where(ids < vocab_size, 0.0, PAD_LOGIT).to(dtype)


@contextlib.contextmanager
def _rope_at(model, position_ids: torch.Tensor):
    """For the forwards inside, ``model``'s rotary embedding gives token ``(b, s)`` the angle of
    ``position_ids[b, s]`` (``[S, B, 1, d]`` instead of positions ``0..S-1`` for every row)."""
    rope = getattr(model, "rotary_pos_emb", None)
    if rope is None:
        raise ValueError("learner.packing: this model has no rotary position embedding; use learner.packing=off")
    freqs = rope(int(position_ids.max()) + 1)  # [P, 1, 1, d]
    per_token = freqs[position_ids.t()].squeeze(2)  # [S, B, 1, d]
    rope.forward = lambda *args, **kwargs: per_token  # the instance attribute shadows the (cached) method
    try:
        yield
    finally:
        del rope.forward


def _decoder_output(model, S: int, **inputs) -> torch.Tensor:
    """``model(**inputs)``'s final hidden states ``[S, b, H]`` (after the final norm): under sequence parallelism
    gathered from the ranks' parts and the padding columns past ``S`` dropped."""
    with _hidden_states_only(model):
        out = model(**inputs)
    return gather_hidden(out)[:S] if is_sequence_parallel(model) else out


def _hidden(model, ids: torch.Tensor, position_ids: torch.Tensor, blocked: torch.Tensor, *,
            rope_at_positions: bool = False) -> torch.Tensor:
    """The decoder's final hidden states ``[B, S, H]``; ``blocked [B or 1, 1, S, S]``: True where
    attention is not allowed (megatron's convention), None for causal attention; ``rope_at_positions``: RoPE at
    ``position_ids`` (:func:`_rope_at`; the dense mask's bins), else at ``0..S-1``. Under sequence parallelism the
    rows run padded to a multiple of the tensor-parallel size (:func:`~pacs_fast.learner.megatron.sequence_parallel.pad_columns`)."""
    S = ids.shape[1]
    if is_sequence_parallel(model):
        ids, position_ids, blocked, _ = pad_columns(ids, position_ids, blocked, tp_size_of(model))
    with _rope_at(model, position_ids) if rope_at_positions else contextlib.nullcontext():
        out = _decoder_output(model, S, input_ids=ids, position_ids=position_ids, attention_mask=blocked)
    return out.transpose(0, 1)


def _packed_or_none(ids_l: torch.Tensor, att_l: torch.Tensor, packing: str, thd: bool, budget: int = 0):
    """The packed layout of the left-aligned rows (``packing``: on / auto / off), or None; ``thd``:
    one row without a mask (all sequences end to end), else bins with the block-diagonal mask. ``budget``
    (``learner.max_tokens_per_micro_batch``, which cut these rows by real tokens): ``auto`` packs where the padded
    forward's slots would exceed it."""
    from pacs_fast.learner.packing import pack, padded_slots

    if packing not in ("auto", "on", "off"):
        raise ValueError(f"packing must be 'auto', 'on' or 'off', got {packing!r}")
    if packing == "off" or (ids_l.shape[0] < 2 and packing == "auto"):
        return None
    packed = pack(ids_l, att_l, implementation="flash_attention_2" if thd else "sdpa")  # flash: one row, no mask
    slots = padded_slots(att_l)
    if packing == "auto" and packed.slots > 0.8 * slots and not (budget and slots > budget):
        return None
    return packed


def _thd_hidden(model, packed) -> torch.Tensor:
    """The decoder's final hidden states ``[1, t, H]`` on the single packed row, THD (see the module)."""
    from pacs_fast.learner.megatron.core_attention import thd_params

    start, length = packed.start.cpu(), packed.length.cpu()
    order = start.argsort()
    cu = torch.zeros(len(order) + 1, dtype=torch.int32)
    cu[1:] = length[order].cumsum(0)
    if packed.input_ids.shape[0] != 1 or not torch.equal(cu[:-1].long(), start[order]) \
            or int(cu[-1]) != packed.input_ids.shape[1]:
        raise AssertionError("THD packing: the rows must lie end to end in one row")
    ids, positions, t = packed.input_ids, packed.position_ids, packed.input_ids.shape[1]
    if is_sequence_parallel(model):  # t a multiple of tp: one more sequence, of padding
        ids, positions, cu = pad_thd(ids, positions, cu, tp_size_of(model))
    params = thd_params(cu, int((cu[1:] - cu[:-1]).max()), ids.device)
    out = _decoder_output(model, t, input_ids=ids, position_ids=positions, attention_mask=None,
                          packed_seq_params=params)  # [t, 1, H]
    return out.transpose(0, 1)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, vocab_size: int,
                   label_mask: torch.Tensor | None = None, tp_group=None, temperature: float = 1.0,
                   return_entropy: bool = False, backend: str = "auto", packing: str = "off",
                   packed_attention: str = "auto", lm_head_fp32: bool = False, forwards=None, budget: int = 0,
                   value_head=None):
    """``logp[B, T]`` (fp32): ``logp[b, t] = log p(input_ids[b, t] | valid tokens before t)``.

    0 at padding and at the first valid token of each row (nothing predicts it). With
    ``return_entropy`` also the entropy ``[B, T]`` of the distribution that predicted token t.
    ``vocab_size`` is the real (HF) vocabulary size; padded rows of the shard are excluded.
    ``label_mask`` (``[B, T]`` bool): only these positions are computed (others give 0 and cost no
    LM-head work), e.g. the response mask.
    ``packing``: rows end to end without padding (see the module docstring): ``on``, ``off``, or
    ``auto`` (when that runs >= 20% fewer token slots than the padded rows, or the padded rows' slots exceed
    ``budget``, the ``learner.max_tokens_per_micro_batch`` that cut these rows by real tokens).
    ``packed_attention``: how packed rows attend: ``varlen`` / ``auto`` (THD, a varlen kernel) or
    ``dense`` (the block-diagonal mask); see the module docstring.
    ``lm_head_fp32``: the LM head in fp32 (``linear_logprobs(..., upcast=True)``: fp32 copies of the
    bf16 hidden states and the output-layer shard; the gradients reach them in bf16).
    ``forwards`` (a ``Counter``): counts this forward as ``packed`` or ``padded`` and its ``token_slots``
    (:func:`pacs_fast.learner.packing.forward_metrics`).
    ``value_head`` (PPO's ``Linear(H, 1)``, the same on every TP rank): also its values ``[B, T]`` of the same
    hidden states (the whole sequence's on every rank), returned third: ``(logp, entropy or None, values)``.
    Collective over ``tp_group`` (every TP rank passes the same batch).
    """
    from pacs_fast.ops.linear_logprobs import linear_logprobs

    B, T = input_ids.shape
    ids_l, mask_l, shift, _ = left_align(input_ids, attention_mask)
    if label_mask is not None and label_mask.shape != input_ids.shape:
        raise ValueError(f"label_mask must be {tuple(input_ids.shape)}, got {tuple(label_mask.shape)}")
    W = ids_l.shape[1]
    att_l = mask_l
    if label_mask is not None:
        cols = torch.arange(T, device=input_ids.device)
        src = (cols.unsqueeze(0) + shift.unsqueeze(1)) % T
        mask_l = mask_l & label_mask.bool().gather(1, src)[:, :W]
    if packed_attention not in PACKED_ATTENTION:
        raise ValueError(f"packed_attention must be one of {PACKED_ATTENTION}, got {packed_attention!r}")
    thd = packed_attention != "dense"  # auto: THD is exact for every model build_gpt_model makes
    packed = _packed_or_none(ids_l, att_l, packing, thd, budget)
    sel = mask_l[:, 1:]  # the labelled positions: only their hidden states reach the LM head
    if forwards is not None:
        from pacs_fast.learner.packing import padded_slots

        forwards["packed" if packed is not None else "padded"] += 1
        forwards["token_slots"] += packed.slots if packed is not None else padded_slots(att_l)
    if packed is None:  # the last column is only ever a label: not fed (padded_slots counts B x (W - 1))
        F = max(W - 1, 1)
        position_ids = torch.arange(F, device=ids_l.device).unsqueeze(0).expand(B, F)
        hidden = _hidden(model, ids_l[:, :F], position_ids, None)[:, :W - 1][sel]  # predicts tokens 1..W-1
    else:  # gathered out of the bins
        if thd:
            bins = _thd_hidden(model, packed)
        else:
            bins = _hidden(model, packed.input_ids, packed.position_ids, ~packed.attention_mask,
                           rope_at_positions=True)
        hidden = packed.gather(bins, sel)
    labels = ids_l[:, 1:][sel]
    weight = output_weight(model)
    tp_rank = 0 if tp_group is None else torch.distributed.get_rank(tp_group)
    bias = pad_bias(vocab_size, weight.shape[0], tp_rank, weight.device)
    out = linear_logprobs(
        hidden.reshape(-1, hidden.shape[-1]), weight, labels.reshape(-1), bias=bias,
        temperature=temperature, return_entropy=return_entropy, tp_group=tp_group, backend=backend,
        upcast=lm_head_fp32)
    logp, ent = (out if return_entropy else (out, None))

    def full(values):  # [B, T] with 0 at padding and at each row's first token
        values = values.new_zeros(B, W - 1).masked_scatter(sel, values)
        return unalign(torch.cat([values.new_zeros(B, 1), values.view(B, W - 1)], 1), shift, T)

    if value_head is not None:  # (in the head's dtype, fp32: a bf16 value had 3 digits)
        v = value_head(hidden.reshape(-1, hidden.shape[-1]).to(value_head.weight.dtype)).squeeze(-1)
        return full(logp), (None if ent is None else full(ent)), full(v)
    return full(logp) if ent is None else (full(logp), full(ent))
