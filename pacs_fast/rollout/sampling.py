"""Token sampling for the HF engine: nucleus (top-p) filtering with transformers' semantics, inverse-CDF
draws, and the two logits processors ``model.generate`` is given (padded vocabulary rows masked; the
sampled tokens' log-probs under the raw logits recorded)."""
from __future__ import annotations

import torch


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


def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """One token per row from ``[rows, V]`` float32 logits: ``[rows]`` int64.

    ``temperature == 0``: argmax. Else a draw from ``softmax(logits / temperature)`` restricted by
    :func:`top_p_remove_mask` (``top_p == 1`` keeps every token), by inverse CDF: one uniform
    ``u`` per row, the first token whose cumulative probability exceeds ``u * total``
    (zero-probability tokens are never drawn). Uses the global torch RNG of ``logits.device``.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / temperature if temperature != 1 else logits
    if top_p < 1:
        scaled = scaled.masked_fill(top_p_remove_mask(scaled, top_p), float("-inf"))
    cdf = scaled.softmax(dim=-1).cumsum_(dim=-1)
    u = torch.rand((cdf.shape[0], 1), device=cdf.device, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=cdf.shape[1] - 1)


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
