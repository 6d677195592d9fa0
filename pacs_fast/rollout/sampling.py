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
    """``[rows]`` int64 keys for :func:`row_uniforms` from one integer seed per output row (any
    Python ints; taken modulo 2**64)."""
    seeds = [int(s) % 2**64 for s in row_seeds]
    lo = torch.tensor([s & _M32 for s in seeds], dtype=torch.int64, device=device)
    hi = torch.tensor([s >> 32 for s in seeds], dtype=torch.int64, device=device)
    return _mix32(_mix32(hi) ^ lo)


def row_uniforms(keys: torch.Tensor, step: int) -> torch.Tensor:
    """``[rows]`` float32 uniforms in ``(0, 1)`` for decoding step ``step``: a hash of (row key,
    step), so a row's draws depend on its own seed and position only, not on which rows share its
    batch, how they are chunked, merged or compacted, nor on the process layout."""
    h = _mix32(keys ^ ((step * _GOLDEN + 1) & _M32))
    h = _mix32(h ^ _GOLDEN)
    # (2k + 1) / 2**24 for the hash's top 23 bits k: every value is a float32 exactly, the smallest 2**-24 and
    # the largest 1 - 2**-24. (k / 2**24 + 2**-25 over 24 bits rounded its top value to 1.0 in float32: one
    # draw in 2**24 was u = 1, past every token's cumulative probability.)
    return ((h >> 9) * 2 + 1).to(torch.float32) * 2.0 ** -24


def top_p_remove_mask(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which tokens nucleus (top-p) filtering removes, as transformers' ``TopPLogitsWarper``.

    logits: ``[rows, V]`` float (already temperature-scaled). Returns a ``[rows, V]`` bool mask,
    True where the token is dropped: sorted by ascending probability, a token is dropped when the
    cumulative probability up to and including it is ``<= 1 - top_p`` (so the kept set is the
    smallest one whose probability is ``>= top_p``); the most likely token is always kept.
    """
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    drop_sorted = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= (1.0 - top_p)
    drop_sorted[..., -1] = False
    return drop_sorted.scatter(-1, order, drop_sorted)


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                  uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row from ``[rows, V]`` float32 logits: ``[rows]`` int64.

    ``temperature == 0``: argmax. Else a draw from ``softmax(logits / temperature)`` restricted by
    :func:`top_p_remove_mask` (``top_p == 1`` keeps every token), by inverse CDF: one uniform
    ``u`` per row, the first token whose cumulative probability exceeds ``u * total``
    (zero-probability tokens are never drawn). ``uniforms``: the ``[rows]`` values of ``u`` in
    (0, 1) (e.g. :func:`row_uniforms`); default: drawn from the global torch RNG of the device.

    Resolution: ``u`` on :func:`row_uniforms`' grid of 2**-23 and a float32 CDF make the draw exact only to
    ~1.2e-7 per token: a token less likely than that is drawn with probability 0 or ~1.2e-7 at a step, not its
    own (the tail's total is kept; which tail tokens hold it moves). Over Qwen's 151,936 ids the drawn
    distribution differs from the reported log-probs' by up to about the tail's mass in total variation
    (measured 4e-5 to 3e-3 on synthetic logits, 2026-11-30); vLLM's sampler has no such grid.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature if temperature != 1 else logits
    if top_p < 1:
        scaled = scaled.masked_fill(top_p_remove_mask(scaled, top_p), float("-inf"))
    cdf = scaled.softmax(dim=-1).cumsum_(dim=-1)
    u = torch.rand((cdf.shape[0], 1), device=cdf.device, dtype=cdf.dtype) if uniforms is None else \
        uniforms.to(device=cdf.device, dtype=cdf.dtype)[:, None]
    total = cdf[:, -1:].contiguous()
    token = torch.searchsorted(cdf, u * total, right=True)
    # u * total can round up to total itself (u = 1 - 2**-24 and total in [1, 2) is a tie in float32; torch.rand
    # never gives 1 but a caller's uniforms may): no cdf entry exceeds it, so the draw is the last token with
    # probability > 0 (the first whose cdf reaches total), never a later, filtered one
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(token, last).squeeze(1)


class MaskPaddedRows:
    """A logits processor that sets the scores of ids ``>= vocab_size`` (padded rows) to -inf."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[1] <= self.vocab_size:
            return scores
        return torch.cat([scores[:, :self.vocab_size], scores.new_full(
            (scores.shape[0], scores.shape[1] - self.vocab_size), float("-inf"))], dim=1)


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
