"""High-entropy token selection ("Beyond the 80/20 Rule", Wang et al. 2025, arXiv 2506.01939; TRL's
``top_entropy_quantile``): the policy gradient of a baseline kept on the "forking" tokens only, the top
fraction of response tokens by the policy's entropy at their position (the paper: 20%, on DAPO).

The entropies are the update's own forward's (the fused log-prob kernel gives them with the log-probs),
detached: the selection is a constant mask, like an importance weight. The losses keep their
denominators (the unselected tokens' terms are 0, as in TRL), so the KL penalty and the entropy bonus
still see every token.
"""
from __future__ import annotations

import math
import numbers

import torch


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, top_frac: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens among ``mask``'s whose entropy is among the top ``top_frac`` of them.

    Args:
        entropy: ``[B, T]`` per-token entropies (any float dtype; read detached).
        mask: ``[B, T]`` the tokens to choose from (non-zero = a candidate: the response tokens that enter
            the loss).
        top_frac: the fraction kept, in (0, 1]: the ``ceil(top_frac * n)`` highest of the ``n`` candidates,
            and any candidate tied with the lowest of those (1 keeps every candidate).
    Returns:
        ``(keep, threshold)``: ``[B, T]`` float32 0 / 1, and the 0-d entropy threshold (the lowest kept
        entropy; NaN without candidates). A NaN entropy (NaN logits) is always kept, so that the NaN reaches
        the loss instead of being masked away (and counts as the largest, as ``torch.kthvalue`` orders it).
    """
    if isinstance(top_frac, torch.Tensor) and top_frac.numel() == 1 and not top_frac.is_complex():
        top_frac = top_frac.item()
    if isinstance(top_frac, bool) or not isinstance(top_frac, numbers.Real) or not 0.0 < top_frac <= 1.0:
        raise ValueError(f"high_entropy_mask: top_frac must be a number in (0, 1], got {top_frac!r}")
    if not isinstance(entropy, torch.Tensor) or not isinstance(mask, torch.Tensor):
        raise ValueError(f"high_entropy_mask: entropy and mask must be tensors, got {type(entropy).__name__} and "
                         f"{type(mask).__name__}")
    if entropy.shape != mask.shape:
        raise ValueError(f"high_entropy_mask: entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} differ")
    candidates = mask != 0
    entropy = entropy.detach().float()
    values = entropy[candidates]
    n = values.numel()
    if n == 0:
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device), \
            torch.full((), float("nan"), device=mask.device)
    k = min(n, max(1, math.ceil(top_frac * n - 1e-9)))  # (0.2 * 10 is 2.0000000000000004 in floats)
    threshold = torch.kthvalue(values, n - k + 1).values
    keep = candidates & ((entropy >= threshold) | entropy.isnan())  # (a NaN threshold keeps every NaN only)
    return keep.float(), threshold
