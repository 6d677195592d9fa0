"""Token sampling for the HF engine: nucleus (top-p) filtering with transformers' semantics, inverse-CDF
draws from per-row counter-based uniforms, and the two logits processors ``model.generate`` is given
(padded vocabulary rows masked; the sampled tokens' log-probs under the raw logits recorded)."""
from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # a 32-bit integer hash multiplier (< 2**31: products of 32-bit lanes fit in int64)
_GOLDEN = 0x9E3779B9


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche hash of int64 tensors holding values in ``[0, 2**32)``."""
    x = x ^ (x >> 16)
    x = (x * _MIX) & _M32
    x = x ^ (x >> 16)
    x = (x * _MIX) & _M32
    return x ^ (x >> 16)


def row_keys(row_seeds: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    """``[rows, 2]`` int64 keys (two 32-bit lanes) for :func:`row_uniforms` from one integer seed per
    output row (any Python ints; taken modulo 2**64): 64 bits of seed, so the uniforms can resolve
    finer than 2**-32 across seeds."""
    seeds = [int(s) % 2**64 for s in row_seeds]
    lo = torch.tensor([s & _M32 for s in seeds], dtype=torch.int64, device=device)
    hi = torch.tensor([s >> 32 for s in seeds], dtype=torch.int64, device=device)
    first = _mix32(_mix32(hi) ^ lo)
    return torch.stack([first, _mix32(_mix32(first ^ _GOLDEN) ^ hi)], dim=1)


def unit_interval(k: torch.Tensor) -> torch.Tensor:
    """float64 ``(2k + 1) / 2**53`` for int64 ``k`` in ``[0, 2**52)``: every value a float64 exactly
    (``2k + 1 < 2**53``), the least ``2**-53``, the largest ``1 - 2**-53``, symmetric about 1/2, one
    value per ``k``."""
    return (k * 2 + 1).to(torch.float64) * 2.0 ** -53


def row_uniforms(keys: torch.Tensor, step: int) -> torch.Tensor:
    """``[rows]`` float64 uniforms in ``(0, 1)`` on a grid of ``2**-52`` for decoding step ``step``:
    a hash of (row key, step), so a row's draws depend on its own seed and position only, not on
    which rows share its batch, how they are chunked, merged or compacted, nor on the process layout.
    keys: ``[rows, 2]`` from :func:`row_keys`. For a fixed step the map from a key's 64 bits to the
    two 32-bit hashes is one-to-one; the top 26 bits of each make the 52 of :func:`unit_interval`."""
    first = _mix32(_mix32(keys[:, 0] ^ ((step * _GOLDEN + 1) & _M32)) ^ _GOLDEN)
    second = _mix32(_mix32(keys[:, 1] ^ first) ^ _GOLDEN)
    return unit_interval(((first >> 6) << 26) | (second >> 6))


# top_p_remove_mask (on CPU) looks for the nucleus among the top 256 logits of each row, then the top 4,096,
# before sorting the whole row: on Qwen's 151,936 ids (64 rows, this CPU) topk 13 / 47 ms against the sort's
# 440 ms.
_TOP_P_CANDIDATES = (256, 4096)


def top_p_remove_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens nucleus (top-p) filtering removes, as transformers' ``TopPLogitsWarper``.

    logits: ``[rows, V]`` float (already temperature-scaled). Returns a ``[rows, V]`` bool mask,
    True where the token is dropped: sorted by ascending probability, a token is dropped when the
    cumulative probability up to and including it is ``<= 1 - top_p`` (so the kept set is the
    smallest one whose probability is ``>= top_p``, i.e. a token stays while the mass above it is
    below ``top_p``); the most likely token is always kept. The running sums are float64 (of the
    float32 probabilities): transformers' float32 sum over 151,936 ids drifts by ~1e-6 (up to 3e-4),
    so the two can differ on tokens whose mass above lies that close to ``top_p``.
    On CPU, rows whose nucleus ends within their top 256 (then 4,096) logits, and not in a tie, are
    decided from those alone (:func:`_top_p_from_candidates`); the rest sort the row
    (:func:`_top_p_sorted`). On other devices every row sorts: a GPU sorts fast, and picking rows would
    read their count from the device (the lean loop makes no host sync but its done check).
    """
    if logits.device.type != "cpu":
        return _top_p_sorted(logits, top_p)
    rows, vocab = logits.shape
    drop = torch.ones_like(logits, dtype=torch.bool)
    todo, sort = torch.arange(rows, device=logits.device), []
    lse = logits.logsumexp(dim=-1, keepdim=True) if _TOP_P_CANDIDATES[0] < vocab else None
    for k in _TOP_P_CANDIDATES:
        if k >= vocab or todo.numel() == 0:
            break
        whole = todo.numel() == rows
        part = logits if whole else logits.index_select(0, todo)
        part_lse = lse if whole else lse.index_select(0, todo)
        settled, part_drop, reach = _top_p_from_candidates(part, part_lse, top_p, k)
        if whole and bool(settled.all()):  # the usual case on a trained model: its mask is the answer
            return part_drop
        drop.index_copy_(0, todo[settled], part_drop[settled])
        # a row whose next candidates cannot hold top_p (each later token is at most as likely as the k-th)
        # goes to the sort now
        nxt = next((c for c in _TOP_P_CANDIDATES if c > k), vocab)
        hopeless = ~settled & (reach[0] + (nxt - k) * reach[1] < top_p)
        sort.append(todo[hopeless])
        todo = todo[~settled & ~hopeless]
    todo = torch.cat([todo, *sort]) if sort else todo
    if todo.numel():
        part = logits if todo.numel() == rows else logits.index_select(0, todo)
        drop.index_copy_(0, todo, _top_p_sorted(part, top_p))
    return drop


def _top_p_sorted(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """:func:`top_p_remove_mask` by transformers' steps (the whole row sorted ascending, ties in its
    order), the running sum in float64."""
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    drop_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1, dtype=torch.float64) <= (1.0 - top_p)
    drop_sorted[..., -1] = False
    return drop_sorted.scatter(-1, order, drop_sorted)


def _top_p_from_candidates(logits: torch.Tensor, lse: torch.Tensor, top_p: float, k: int):
    """``([rows] settled, [rows, V] drop, ([rows] mass, [rows] least))``: top-p from each row's ``k``
    largest logits (``lse``: ``[rows, 1]``, the rows' logsumexp), the same rule read from the top (a
    token stays while the float64 mass above it is below ``top_p``). A row is settled when its kept
    set ends before the ``k``-th candidate (every later token then has at least ``top_p`` above it)
    and its last kept logit is not tied with the next (the sorted path orders ties its own way).
    ``mass``: the candidates' probability; ``least``: the ``k``-th's."""
    values, ids = torch.topk(logits, k, dim=-1)                      # descending
    probs = (values - lse).exp()                                     # [rows, k] float32
    running = probs.cumsum(dim=-1, dtype=torch.float64)
    keep = running - probs < top_p                                   # the mass above each; the first: none
    kept = keep.sum(dim=-1, keepdim=True)
    edge = kept.clamp(max=k - 1)
    settled = ((kept < k) & (values.gather(1, edge - 1) != values.gather(1, edge))).squeeze(1)
    drop = torch.ones_like(logits, dtype=torch.bool).scatter_(1, ids, ~keep)
    return settled, drop, (running[:, -1], probs[:, -1].double())


def min_p_remove_mask(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Which tokens min-p filtering removes, as vLLM's and transformers' ``MinPLogitsWarper``: those
    whose probability under ``softmax(logits)`` is below ``min_p`` times the row's largest (the most
    likely token always stays). logits: ``[rows, V]`` float (temperature-scaled); ``[rows, V]`` bool."""
    probs = logits.softmax(dim=-1)
    return probs < min_p * probs.amax(dim=-1, keepdim=True)


def top_k_remove_mask(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Which tokens top-k filtering removes, as vLLM's and transformers' ``TopKLogitsWarper``: those
    below the row's ``top_k``-th largest logit (tokens tied with it stay). ``[rows, V]`` bool."""
    kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits < kth


def filter_logits(scaled: torch.Tensor, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> torch.Tensor:
    """``scaled`` (``[rows, V]`` temperature-scaled logits) with the filtered tokens at -inf, in vLLM's
    order: min-p, then top-k, then top-p over what is left (:class:`~pacs_fast.rollout.base.SamplingParams`).
    Returns ``scaled`` itself when every filter is off."""
    if min_p > 0:
        scaled = scaled.masked_fill(min_p_remove_mask(scaled, min_p), float("-inf"))
    if 0 < top_k < scaled.shape[-1]:
        scaled = scaled.masked_fill(top_k_remove_mask(scaled, top_k), float("-inf"))
    if top_p < 1:
        scaled = scaled.masked_fill(top_p_remove_mask(scaled, top_p), float("-inf"))
    return scaled


# sample_tokens' block width: the [rows, V] probabilities are summed in float32 blocks of this many tokens
# (relative error ~1e-7 log2(256) per block), then only the drawn block's running sum is taken in float64.
_BLOCK = 256


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                  uniforms: torch.Tensor | None = None, top_k: int = 0, min_p: float = 0.0) -> torch.Tensor:
    """One token per row from ``[rows, V]`` float32 logits: ``[rows]`` int64.

    ``temperature == 0``: argmax. Else a draw from ``softmax(logits / temperature)`` restricted by
    :func:`filter_logits` (min-p, top-k, top-p; ``top_p == 1``, ``top_k == 0``, ``min_p == 0`` keep every
    token), by inverse CDF: one uniform ``u`` per row picks the point ``u * total`` of the cumulative
    probability; the token whose interval holds it is drawn (zero-probability tokens are never drawn).
    ``uniforms``: the ``[rows]`` values of ``u`` in (0, 1) (e.g. :func:`row_uniforms`; taken in
    float64); default: drawn from the global torch RNG of the device.

    Resolution: the inverse CDF runs in two levels, the blocks of ``_BLOCK`` tokens (float32 block
    sums, their running sum float64), then the tokens of the drawn block (float64 running sum,
    rescaled to the block's sum), with ``u`` on :func:`row_uniforms`' grid of 2**-52: each token is
    drawn at its own float32 probability to ~1e-6 *of it*, however small it is. (One float32 running
    sum over the vocabulary has a spacing of ~6e-8 near 1: tokens below it were drawn at 0 or at that
    spacing, and up to ~3e-3 of the mass over Qwen's 151,936 ids went to other tokens.) Which tokens
    the filters keep is decided in float32, as vLLM and transformers decide it.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = filter_logits(logits / temperature if temperature != 1 else logits, top_p, top_k, min_p)
    probs = scaled.softmax(dim=-1)
    rows, vocab = probs.shape
    full = vocab // _BLOCK
    sums = probs[:, :full * _BLOCK].view(rows, full, _BLOCK).sum(-1)
    if full * _BLOCK < vocab:
        sums = torch.cat([sums, probs[:, full * _BLOCK:].sum(-1, keepdim=True)], dim=1)
    u = torch.rand((rows, 1), device=probs.device, dtype=torch.float64) if uniforms is None else \
        uniforms.to(device=probs.device, dtype=torch.float64)[:, None]
    block_cdf = sums.cumsum(dim=-1, dtype=torch.float64)
    point = u * block_cdf[:, -1:]
    block = _inverse_cdf(block_cdf, point)
    own = sums.gather(1, block).double()                             # the drawn block's float32 sum
    start = block_cdf.gather(1, block) - own
    ids = block * _BLOCK + torch.arange(_BLOCK, device=probs.device)
    inside = probs.gather(1, ids.clamp(max=vocab - 1)).masked_fill_(ids >= vocab, 0)
    inner_cdf = inside.cumsum(dim=-1, dtype=torch.float64)
    # the point's place in its block, on the block's own float64 sum (equal to the float32 block sum to ~1e-7)
    within = (point - start).clamp_(min=0) * (inner_cdf[:, -1:] / own)
    return (block * _BLOCK + _inverse_cdf(inner_cdf, within)).squeeze(1)


def _inverse_cdf(cdf: torch.Tensor, point: torch.Tensor) -> torch.Tensor:
    """``[rows, 1]`` index of the first entry of the running sum ``cdf`` (``[rows, n]``) above
    ``point`` (``[rows, 1]``). A point at or past the total (a caller's
    ``u = 1``, or a rounding up) takes the last entry with probability > 0 (the first whose running sum
    reaches the total), never a later, filtered one."""
    index = torch.searchsorted(cdf, point, right=True)
    last = torch.searchsorted(cdf, cdf[:, -1:].contiguous(), right=False)
    return torch.minimum(index, last)


class MaskPaddedRows:
    """A logits processor that sets the scores of ids ``>= vocab_size`` (padded rows) to -inf."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[1] <= self.vocab_size:
            return scores
        return torch.cat([scores[:, :self.vocab_size], scores.new_full(
            (scores.shape[0], scores.shape[1] - self.vocab_size), float("-inf"))], dim=1)


class MinPFilter:
    """A logits processor for ``model.generate``'s ``logits_processor=`` list, which runs before its
    temperature, top-k and top-p warpers: removes (-inf) the tokens :func:`min_p_remove_mask` drops from
    ``scores / temperature``, so min-p comes after the temperature and before top-k / top-p, in vLLM's
    order (transformers' own ``min_p`` runs after top-p)."""

    def __init__(self, min_p: float, temperature: float):
        self.min_p, self.temperature = min_p, temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        drop = min_p_remove_mask(scores / self.temperature if self.temperature != 1 else scores, self.min_p)
        return scores.masked_fill(drop, float("-inf"))


class LogprobRecorder:
    """A logits processor that records log-softmax(raw logits)[sampled token] per step.

    Placed in ``logits_processor=`` it runs before the temperature / top-p warpers (transformers
    merges custom processors before the warpers), so it sees unscaled logits. The token sampled at
    step t appears in ``input_ids`` at step t+1; the last one is read from the final sequences.
    """

    def __init__(self):
        self.prev: torch.Tensor | None = None  # [rows, V] float32 log-probs of the previous step
        self.steps: list[torch.Tensor] = []    # per step [rows] float32

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.LongTensor) -> torch.Tensor:
        """``[rows, steps]`` log-probs of the generated tokens."""
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, sequences[:, -1:]).squeeze(1))
            self.prev = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.empty(0)
