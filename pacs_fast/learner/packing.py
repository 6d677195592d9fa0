"""Packed rows for the learner: whole sequences laid end to end in bins, without padding.

A micro-batch's rows are right-padded to its longest one; on long, uneven responses most of the
forward and backward then runs on padding. :func:`pack` lays the rows (each without its last token,
which is only ever a label) end to end into ``nb`` bins of ``capacity`` tokens (first-fit decreasing;
``capacity`` = the longest row, so the bins are as long as the padded batch's rows and there are
fewer of them), with per-sequence position ids that restart at 0 and an attention mask that never
crosses a sequence boundary (block-diagonal causal, ``[nb, 1, C, C]``: boolean for SDPA-style
implementations, additive for ``eager``; a sliding-window model's mask keeps its window, one mask per
layer type where the model mixes window and full layers: :func:`mask_window`). With flash-attention
(``flash_attention_2/3``) the bins are a single row and the boundaries come from the position ids alone
(its varlen path), with no mask.
With ``varlen=True`` (``learner.packed_attention``, :func:`packed_attention_mode`) the rows also form
one row, with no mask, and carry ``cu_seqlens`` (int32 ``[b + 1]``) and their longest length:
:func:`packed_hidden` passes them to :mod:`pacs_fast.ops.varlen_attention`, which attends inside each
sequence without building the ``[C, C]`` mask or computing its masked blocks.

Exact: every real token sees exactly the tokens it sees in the padded batch, at the same positions,
so log-probs, entropies and gradients equal the padded forward's up to floating-point rounding (the
matmuls run on other shapes).

:func:`token_budget_micro_batches` cuts a mini-batch's groups into micro-batches of about equal token
count (sorted first-fit decreasing), never splitting a group; with ``learner.packing=off`` (and with the dense
mask's bins) :func:`padded_budget_micro_batches` counts the token slots its forward runs (rows x the longest row;
with the shared-prefix forward each group's prefix once plus the rows' rests).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch

FLASH = ("flash_attention_2", "flash_attention_3")
PACKED_ATTENTION = ("auto", "varlen", "dense")
# which forward ran, counted over the forwards since the last update with their token slots: a step's
# learner/forward/* (the megatron learner has no shared-prefix forward: 0 there)
FORWARD_KINDS = ("packed", "shared_prefix", "padded")


def forward_metrics(forwards) -> dict[str, float]:
    """``forward/<kind>`` and ``forward/token_slots`` of a counter of forwards (:data:`FORWARD_KINDS`)."""
    return {f"forward/{k}": float(forwards[k]) for k in FORWARD_KINDS + ("token_slots",)}


def first_fit_decreasing(sizes: list[int], capacity: int) -> list[list[int]]:
    """Indices of ``sizes`` in bins whose sums stay <= ``capacity`` (each size <= capacity), the
    largest first, each into the first bin it fits. Deterministic (ties by index)."""
    if sizes and max(sizes) > capacity:
        raise ValueError(f"an item of {max(sizes)} does not fit a bin of {capacity}")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        for b, free in enumerate(room):
            if sizes[i] <= free:
                bins[b].append(i)
                room[b] -= sizes[i]
                break
        else:
            bins.append([i])
            room.append(capacity - sizes[i])
    return bins


@dataclass
class Packed:
    """A packed micro-batch. ``input_ids`` / ``position_ids`` ``[nb, C]`` int64, ``attention_mask``
    ``[nb, 1, C, C]`` (bool, or float additive; a dict of them per layer type for a model that mixes sliding-window
    and full layers) or None (flash); ``row``, ``start``, ``length``
    ``[b]``: the bin of row ``i``, where its tokens start there, how many it has. Varlen layout:
    ``cu_seqlens`` int32 ``[b + 1]`` (the boundaries in the single row; the sequences' host lengths ride along as
    its ``pacs_fast_lengths`` attribute, for :func:`pacs_fast.ops.varlen_attention.attend`) and ``max_length``."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | dict | None
    row: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor
    cu_seqlens: torch.Tensor | None = None
    max_length: int = 0

    @property
    def slots(self) -> int:
        return int(self.input_ids.numel())

    def gather(self, hidden: torch.Tensor, sel: torch.Tensor) -> torch.Tensor:
        """``hidden [nb, C, H]`` at the ``(row i, position t)`` pairs where ``sel [b, T-1]`` is
        True, in ``sel``'s row-major order (what the padded forward's ``hidden[sel]`` gives)."""
        i, t = sel.nonzero(as_tuple=True)
        return hidden[self.row[i], self.start[i] + t]


def pack(ids: torch.Tensor, attention_mask: torch.Tensor, *, implementation: str = "sdpa",
         dtype: torch.dtype = torch.float32, varlen: bool = False, window: int | None = None,
         layered: bool = False) -> Packed:
    """Packs the rows of a right-padded batch ``ids [b, T]`` (real tokens where ``attention_mask``
    is 1), each without its last token (see the module docstring). ``implementation``: the model's
    attention implementation, which decides the mask's form; ``dtype``: the additive mask's dtype;
    ``varlen``: one row, no mask, ``cu_seqlens`` set. ``window`` (the model's sliding window,
    :func:`mask_window`): the mask also keeps each query to the keys less than ``window`` positions
    back, as the model's own sliding-window mask; with ``layered`` (a model whose ``layer_types`` mix
    full and sliding layers) ``attention_mask`` is ``{"full_attention": ..., "sliding_attention": ...}``,
    the per-type mapping those models take (one mask for every layer otherwise)."""
    b, T = ids.shape
    lengths = (attention_mask.sum(-1).long() - 1).clamp(min=1)  # the last real token is only a label
    sizes = lengths.tolist()
    flash = implementation in FLASH or varlen
    capacity = sum(sizes) if flash else max(sizes)
    bins = first_fit_decreasing(sizes, capacity)
    nb = len(bins)
    row_of, start_of, fill, order = [0] * b, [0] * b, [], []
    for k, members in enumerate(bins):  # (integers only: no tensor op per row)
        at = 0
        for i in sorted(members):  # row order inside a bin: deterministic, readable
            row_of[i], start_of[i] = k, at
            at += sizes[i]
            order.append(i)
        fill.append(at)
    row = torch.tensor(row_of, dtype=torch.long)
    start = torch.tensor(start_of, dtype=torch.long)
    # every row's first sizes[i] tokens to slots start[i].. of bin row[i], in one gather and scatter over the packed
    # tokens: a copy per row (for ids on a GPU a device-to-host copy and sync per row) cost O(rows) Python
    order_t = torch.tensor(order, dtype=torch.long)
    size = torch.tensor(sizes, dtype=torch.long)[order_t]
    first = size.cumsum(0) - size                                  # where each row's tokens begin among the N packed
    seg_of = torch.repeat_interleave(order_t, size)                # [N]: each packed token's row
    at = torch.arange(len(seg_of)) - torch.repeat_interleave(first, size)  # [N]: its position in its row
    dest = at + torch.repeat_interleave(row[order_t] * capacity + start[order_t], size)  # [N]: its flat slot
    packed = torch.zeros(nb, capacity, dtype=ids.dtype)
    packed.view(-1)[dest] = ids.cpu().reshape(-1)[at + torch.repeat_interleave(order_t * T, size)]
    # empty slots (those past a bin's fill): 0, 1, ... any valid positions, never read
    pos = torch.arange(capacity)[None, :] - torch.tensor(fill, dtype=torch.long)[:, None]
    pos.view(-1)[dest] = at
    seg = torch.full((nb, capacity), -1, dtype=torch.long)  # -1: an empty slot
    seg.view(-1)[dest] = seg_of
    mask = None
    if not flash:
        causal = torch.ones(capacity, capacity, dtype=torch.bool).tril()
        same = seg[:, :, None] == seg[:, None, :]
        allowed = (same & causal)[:, None]  # an empty slot sees the empty slots before it: no empty row
        # inside a bin a sequence's slots are its positions, so the window counts slots (transformers'
        # sliding_window_overlay: kv > q - window); a slot always sees itself: no empty row either
        near = None if not window else (torch.arange(capacity)[:, None] - torch.arange(capacity)[None, :]) < window

        def form(ok):
            if implementation == "eager":
                return torch.zeros(ok.shape, dtype=dtype).masked_fill_(~ok, torch.finfo(dtype).min)
            return ok
        mask = form(allowed if near is None else allowed & near)
        if near is not None and layered:
            mask = {"full_attention": form(allowed), "sliding_attention": mask}
    cu = None
    if varlen:  # one bin, its rows in row order (sorted(members) above)
        from pacs_fast.ops.varlen_attention import LENGTHS_ATTR, cu_seqlens

        cu = cu_seqlens(sizes, ids.device)
        setattr(cu, LENGTHS_ATTR, tuple(sizes))  # the host lengths travel with it (to a recomputed layer too)
    if isinstance(mask, dict):
        mask = {k: m.to(ids.device) for k, m in mask.items()}
    elif mask is not None:
        mask = mask.to(ids.device)
    return Packed(packed.to(ids.device), pos.to(ids.device), mask,
                  row.to(ids.device), start.to(ids.device), lengths.to(ids.device), cu, max(sizes, default=0))


def packed_attention_mode(model, setting: str = "auto", *, announce: bool = True) -> str:
    """How packed rows attend (``learner.packed_attention``): ``"flash"`` (the model runs
    flash-attention: its own varlen path), ``"varlen"`` (:mod:`pacs_fast.ops.varlen_attention`) or
    ``"dense"`` (the block-diagonal mask). ``auto``: varlen where it is the model's exact attention,
    else dense with one warning line naming why (``announce=False``: not yet, as long as no row has packed);
    ``varlen`` refuses (ValueError) where it is not."""
    from pacs_fast.ops.varlen_attention import base_implementation, unsupported

    if setting not in PACKED_ATTENTION:
        raise ValueError(f"learner.packed_attention must be one of {PACKED_ATTENTION}, got {setting!r}")
    if base_implementation(model.config) in FLASH:
        return "flash"
    if setting == "dense":
        return "dense"
    why = unsupported(model.config)
    if why is None:
        return "varlen"
    if setting == "varlen":
        raise ValueError(f"learner.packed_attention=varlen cannot run this model: {why}; use "
                         f"learner.packed_attention=dense")
    if announce:
        _dense_once(why)
    return "dense"


@functools.lru_cache(maxsize=None)
def _dense_once(why: str) -> None:
    print(f"pacs_fast: packed rows use the dense block-diagonal mask ({why})", file=sys.stderr, flush=True)


def mask_window(config) -> tuple[int | None, bool]:
    """``(window, layered)`` for :func:`pack`'s dense mask: the model's sliding window (None: none,
    :func:`pacs_fast.ops.varlen_attention.windowed`) and whether its ``layer_types`` mix window and full layers (the
    models that have them take a mask per layer type; the others apply ``sliding_window`` to every layer)."""
    from pacs_fast.ops.varlen_attention import windowed

    if windowed(config) is None:
        return None, False
    config = config.get_text_config() if hasattr(config, "get_text_config") else config  # (a wrapper's: Gemma 3's)
    return int(config.sliding_window), bool(getattr(config, "layer_types", None))


# layer kinds that carry a state along the row (``layer_types`` / ``layers_block_type`` entries): Qwen3.5's and
# Qwen3-Next's Gated DeltaNet (``linear_attention``), Mamba layers, LFM2's short convolutions, RecurrentGemma's
RECURRENT_LAYERS = ("linear_attention", "mamba", "conv", "rwkv", "hybrid", "recurrent")
RECURRENT_FAMILIES = ("mamba", "mamba2", "falcon_mamba", "falcon_h1", "rwkv", "xlstm")


def recurrent_layers(config) -> str | None:
    """Why some layer of the model carries a state along its row (a causal convolution, a linear-attention or SSM
    recurrence), or None. Such a layer sees no attention mask: on packed rows its state runs from one sequence into
    the next. transformers passes the boundaries (``cu_seq_lens_q``) only to the fused kernels (flash-linear-
    attention, causal-conv1d); its torch path, the CPU's, ignores them: a tiny Qwen3.5's packed log-probs were off by
    up to 1.3 nats from the padded ones (sweep of 2026-12-07). In the shared-prefix forward the padding of a group's
    prefix (padded to the micro-batch's longest) runs through the recurrence before the rows' rests. Right-padded
    rows are exact (the state only runs forward), so these models train on them."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    kinds = [*(getattr(config, "layer_types", None) or []), *(getattr(config, "layers_block_type", None) or [])]
    found = sorted({k for k in kinds if isinstance(k, str) and k in RECURRENT_LAYERS})
    if found:
        return f"the model has recurrent layers ({', '.join(found)})"
    kind = getattr(config, "model_type", None)
    return f"model_type={kind} is recurrent" if kind in RECURRENT_FAMILIES else None


def chunked_attention(config) -> str | None:
    """Why the model's attention is cut into chunks along the row (Llama 4's ``chunked_attention`` layers: a token sees
    the tokens of its own ``attention_chunk_size`` chunk of positions alone), or None. Packed rows start a sequence at
    a slot that is no chunk boundary and the shared-prefix forward shifts the rows' rests by the prefix's padding:
    a tiny Llama 4's packed log-probs were 0.33 nats off its own at a chunk of 8 (sweep of 2026-12-07). Right-padded
    rows are exact (slots are positions), so these models train on them."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(config, "attention_chunk_size", None)
    if size and "chunked_attention" in (getattr(config, "layer_types", None) or []):
        return f"the model has chunked attention (attention_chunk_size={size})"
    return None


def padded_rows_only(config) -> str | None:
    """Why the model's rows must be right-padded, never packed nor share a prefix forward: recurrent layers
    (:func:`recurrent_layers`) or chunked attention (:func:`chunked_attention`); None for the others."""
    return recurrent_layers(config) or chunked_attention(config)


@functools.lru_cache(maxsize=None)
def say_padded_rows(why: str) -> None:
    """One line per process: a recurrent or chunked model's rows are not packed (:func:`padded_rows_only`)."""
    what = "cut their chunks at other tokens" if "chunked" in why else "carry their state across sequences"
    print(f"pacs_fast: {why}: packed rows would {what}, so the torch learner runs "
          f"padded rows (learner.packing has no effect)", file=sys.stderr, flush=True)


def shared_prefix_problem(config) -> str | None:
    """Why the shared-prefix forward would not give the attention of the model of ``config`` (its transformers config;
    None: it does): sliding-window layers (:func:`pacs_fast.ops.varlen_attention.windowed`), or recurrent ones
    (:func:`recurrent_layers`). It pads each group's prefix to the micro-batch's longest, so a window counted in
    slots takes the padding for tokens, and the sliding cache keeps the last slots, padding included: off by up to
    0.15 in log-prob (sweep of 2026-12-02). The padded forward (right-padded rows: slots are positions) and packed
    rows (:func:`pack` with :func:`mask_window`, or flash-attention's varlen path, which
    takes the window) keep it. GPT-Neo names its windowed layers ``local`` in ``attention_layers`` (the window:
    ``window_size``), which :func:`windowed` does not read: its shared-prefix forward was off by 0.26 nats per token
    on average (1.9 at most) at a window of 8, silently (sweep of 2026-12-02); its packed and padded rows are exact."""
    from pacs_fast.ops.varlen_attention import windowed

    if "local" in (getattr(config, "attention_layers", None) or []):
        return f"the model has local (windowed) attention layers (window_size={getattr(config, 'window_size', None)})"
    return windowed(config) or padded_rows_only(config)


@functools.lru_cache(maxsize=None)
def say_no_shared_prefix(why: str) -> None:
    """One line per process: a model's window or recurrent layers (``why``) keep the torch learner off its
    shared-prefix forward."""
    if "recurrent" in why or "chunked" in why:  # (padded_rows_only's reasons)
        through = "shift the chunks" if "chunked" in why else "run through the state"
        print(f"pacs_fast: {why}: the torch learner runs padded rows, not the shared-prefix forward (its padded "
              f"prefixes would {through})", file=sys.stderr, flush=True)
        return
    print(f"pacs_fast: {why}: the torch learner runs packed or padded rows, which keep the window, not the "
          f"shared-prefix forward", file=sys.stderr, flush=True)


def restores_attention(method):
    """Decorates a learner's public method: at the end of the outermost call, every model its
    varlen packed forwards switched (``self._switched``: ``(model, base)`` pairs, ``self._depth``
    the calls in progress) gets its attention implementation back. The switch lasts the whole
    call, backward included (gradient checkpointing recomputes attention there)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        self._depth += 1
        try:
            return method(self, *args, **kwargs)
        finally:
            self._depth -= 1
            if not self._depth:
                from pacs_fast.ops.varlen_attention import restore

                while self._switched:
                    restore(*self._switched.pop())
    return call


def packed_hidden(decoder, packed: Packed) -> torch.Tensor:
    """The decoder's last hidden states ``[nb, C, H]`` on ``packed`` (varlen: the boundaries go to
    the attention function as transformers' ``cu_seq_lens_q/k`` / ``max_length_q/k`` keywords, and
    no mask is built; the model must be switched by :func:`pacs_fast.ops.varlen_attention.activate`)."""
    if packed.cu_seqlens is None:
        return decoder(input_ids=packed.input_ids, position_ids=packed.position_ids,
                       attention_mask=packed.attention_mask, use_cache=False).last_hidden_state
    from pacs_fast.ops.varlen_attention import varlen_forward

    cu, m = packed.cu_seqlens, packed.max_length
    with varlen_forward():
        return decoder(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None,
                       use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=m,
                       max_length_k=m).last_hidden_state


def padded_slots(attention_mask: torch.Tensor) -> int:
    """Token slots the padded forward runs: ``b * (T - 1)`` with ``T`` the longest row."""
    lengths = attention_mask.sum(-1).long()
    return int(attention_mask.shape[0] * max(int(lengths.max()) - 1, 1))


def shared_prefix_slots(ids: torch.Tensor, attention_mask: torch.Tensor, group_size: int) -> int:
    """Token slots the shared-prefix forward runs (:mod:`pacs_fast.learner.shared_prefix`): the groups' common
    prefixes padded to the longest, ``g x P``, plus every row's rest padded to the longest rest ``R`` without its last
    column (only ever a label), ``b x (R - 1)``."""
    from pacs_fast.learner.shared_prefix import common_prefix_lengths

    lengths = attention_mask.sum(-1).long()
    prefix = common_prefix_lengths(ids, lengths, group_size)
    rest = lengths - prefix.repeat_interleave(group_size)
    return int(prefix.numel() * prefix.max()) + int(ids.shape[0] * (max(int(rest.max()), 1) - 1))


def token_budget_micro_batches(group_tokens: list[int], budget: int) -> list[list[int]]:
    """Positions of ``group_tokens`` (tokens of each group) cut into micro-batches of at most
    ``budget`` tokens each, about equal (first-fit decreasing; a group is never split). ValueError
    naming both numbers when one group alone is larger than the budget."""
    if group_tokens and max(group_tokens) > budget:
        raise ValueError(f"a group of {max(group_tokens)} tokens is larger than learner.max_tokens_per_micro_batch="
                         f"{budget}: raise the budget (a group's G responses train together)")
    bins = first_fit_decreasing(group_tokens, budget)
    return [sorted(b) for b in bins]


def padded_budget_micro_batches(group_longest: list[int], group_size: int, budget: int,
                                fixed: list[int] | None = None, *, dense: bool = False) -> list[list[int]]:
    """Positions of the groups cut into micro-batches whose padded forward runs at most ``budget`` token slots:
    ``k x max(fixed) + rows x longest`` for ``k`` groups (``group_longest``: each group's longest row as fed, the
    rows padded to the micro-batch's longest; ``fixed``: each group's shared prefix, run once and padded to the
    micro-batch's longest prefix; none by default): the groups by decreasing longest row, each micro-batch filled in
    that order (its first group sets its length). ``dense``: the rows are packed into dense-mask bins as long as the
    longest row, which hold at most as many slots (the bound the cut keeps). ValueError naming both numbers when one
    group alone is over the budget."""
    fixed = fixed or [0] * len(group_longest)
    alone = [f + group_size * n for f, n in zip(fixed, group_longest)]
    if alone and max(alone) > budget:
        i = max(range(len(alone)), key=alone.__getitem__)
        what = (f"a shared prefix of {fixed[i]} tokens and {group_size} rests padded to {group_longest[i]}"
                if fixed[i] else f"{group_size} rows padded to {group_longest[i]} tokens")
        how, fix = (("learner.packed_attention=dense packs rows into bins as long as the longest row",
                     "use learner.packed_attention=varlen") if dense else
                    ("learner.packing=off pads each row to the longest", "pack the rows (learner.packing=auto)"))
        raise ValueError(f"a group of {what} ({alone[i]} token slots: {how}) is larger than "
                         f"learner.max_tokens_per_micro_batch={budget}: raise the budget or {fix}")
    bins: list[list[int]] = []
    longest = top = 0
    for i in sorted(range(len(group_longest)), key=lambda i: (-group_longest[i], i)):
        if bins and (len(bins[-1]) + 1) * (max(top, fixed[i]) + group_size * longest) <= budget:
            bins[-1].append(i)
            top = max(top, fixed[i])
        else:
            bins.append([i])
            longest, top = group_longest[i], fixed[i]
    return [sorted(b) for b in bins]


def micro_batch_groups(batch, limit: int, budget: int = 0, *, padded: bool = False,
                       shared_prefix: bool = False, dense: bool = False) -> list[list[int]]:
    """Group positions of ``batch`` (a :class:`~pacs_fast.learner.base.RolloutBatch`) per
    micro-batch: ``limit`` consecutive groups each, or, with a token ``budget`` (> 0), whole groups of
    about equal real-token counts (:func:`token_budget_micro_batches`); ``padded`` (``learner.packing=off``:
    rows padded to the micro-batch's longest) counts the token slots the padded forward runs instead, and with
    ``shared_prefix`` (the torch learner's shared-prefix forward) each group's common prefix once plus every row's
    rest padded (:func:`padded_budget_micro_batches`; where a group has no common prefix, or ``G`` is 1, the padded
    forward runs and is counted), so that the budget bounds the memory either way. ``dense`` (packed rows with the
    dense mask, ``learner.packed_attention=dense``): bins as long as the longest row, cut by the padded forward's
    slots, no fewer than the bins' (counting real tokens let the bins run up to ~1.5x the budget); where ``auto``
    would run the shared-prefix forward instead and its slots exceed the budget, the learner packs
    (``TorchLearner._packed``). Both learners cut this way."""
    if budget and (padded or dense):
        longest, fixed = _padded_lengths(batch, shared_prefix=shared_prefix and not dense)
        return padded_budget_micro_batches(longest, batch.group_size, budget, fixed, dense=dense and not padded)
    if budget:
        return token_budget_micro_batches(_group_tokens(batch), budget)
    return [list(range(s, min(s + limit, batch.num_groups))) for s in range(0, batch.num_groups, limit)]


def group_costs(batch, *, padded: bool = False, shared_prefix: bool = False, dense: bool = False) -> list[int]:
    """What each group of ``batch`` alone counts against a token budget, as :func:`micro_batch_groups` cuts with
    the same flags: its real tokens, or the token slots its padded (shared-prefix, dense-bin) forward runs."""
    if padded or dense:
        longest, fixed = _padded_lengths(batch, shared_prefix=shared_prefix and not dense)
        return [(f or 0) + batch.group_size * n for f, n in zip(fixed or [0] * len(longest), longest)]
    return _group_tokens(batch)


def _group_tokens(batch) -> list[int]:
    return [int(t) for t in batch.attention_mask.sum(-1).view(batch.num_groups, batch.group_size).sum(-1).tolist()]


def _padded_lengths(batch, *, shared_prefix: bool) -> tuple[list[int], list[int] | None]:
    """Each group's longest row as its padded forward feeds it and, with the shared-prefix forward (where every group
    has a common prefix and ``G`` >= 2), each group's prefix (run once; else None)."""
    G = batch.group_size
    lengths = batch.attention_mask.sum(-1).long()
    fixed = None
    fed = (lengths - 1).clamp(min=1)  # a row's last token is only a label: the padded forward and the bins skip it
    if shared_prefix and G >= 2:
        from pacs_fast.learner.shared_prefix import common_prefix_lengths

        prefix = common_prefix_lengths(batch.input_ids, lengths, G)
        if bool((prefix >= 1).all()):  # (a group without a common prefix: the padded forward runs instead)
            fed = (lengths - prefix.repeat_interleave(G) - 1).clamp(min=0)  # nor the shared-prefix forward's rest
            fixed = [int(p) for p in prefix]
    return [int(t) for t in fed.view(batch.num_groups, G).amax(-1).tolist()], fixed
