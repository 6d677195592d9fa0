"""REINFORCE++ outcome advantages (Hu et al., arXiv 2501.03262), as verl defines them
(``compute_reinforce_plus_plus_outcome_advantage`` / ``..._baseline_outcome_advantage`` in
``verl/trainer/ppo/core_algos.py``, with ``verl/utils/torch_functional.py``'s ``masked_whiten``):

- ``reinforce_plus_plus``: each response token's return is the outcome reward ``R_i`` (``gamma`` = 1,
  the KL kept out of the reward: ``algo.kl_coef`` is a loss term here, verl's ``use_kl_loss``);
- ``reinforce_plus_plus_baseline``: ``R_i - mean_g``, the group's mean reward subtracted (a group of
  one response keeps ``R_i``, as verl's mean of 0 there);

then whitened over every response token of the batch, the batch's global token mean and unbiased
token variance: ``(x - mean) / sqrt(var + 1e-8)``, 0 off the mask. Unlike GRPO's per-group std, the
scale is the whole batch's, so a group of equal rewards gets ``-mean / std``, not 0.

A batch split over data-parallel groups whitens with the whole batch's statistics: each share's
:func:`reinforce_pp_totals`, summed, go to :func:`reinforce_pp_advantages` (float64 sums; the same
result as one process up to their rounding).
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import check_group_size, check_mask, check_tensor, mask_nonzero
from pacs_fast.algorithms._stable import centred_in_groups

REINFORCE_PP_MODES = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")


def _centred(rewards: torch.Tensor, group_size: int, baseline: bool) -> torch.Tensor:
    """``[B]`` float64: ``R_i``, or ``R_i - mean_g`` with the baseline (groups of one: ``R_i``)."""
    r = rewards.to(torch.float64)
    if not baseline or group_size == 1:
        return r
    return centred_in_groups(r.reshape(-1, group_size)).reshape(-1)


def _check(fn, rewards, mask, group_size) -> int:
    check_tensor(fn, "rewards", rewards, ndim=1)
    check_tensor(fn, "mask", mask, ndim=2)
    if mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"{fn}: mask has {mask.shape[0]} rows for {rewards.shape[0]} rewards")
    check_mask(fn, mask, mask, "mask")
    return check_group_size(fn, group_size, rewards.shape[0], "rewards")


@torch.no_grad()
def reinforce_pp_totals(rewards: torch.Tensor, mask: torch.Tensor, group_size: int, *,
                        baseline: bool = True) -> tuple[float, float, float]:
    """``(tokens, sum, sum of squares)`` of the unwhitened token values of this batch (float64): what
    :func:`reinforce_pp_advantages` whitens with; summed over a batch's data-parallel shares, the
    whole batch's."""
    group_size = _check("reinforce_pp_totals", rewards, mask, group_size)
    x = _centred(rewards, group_size, baseline)
    n = mask_nonzero(mask).sum(-1).to(torch.float64).to(x.device)
    return float(n.sum()), float((n * x).sum()), float((n * x * x).sum())


@torch.no_grad()
def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, group_size: int, *, baseline: bool = True,
                            totals: tuple[float, float, float] | None = None, eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ token advantages (module docstring).

    Args:
        rewards: ``[B]`` outcome rewards (rows ``[kG, (k+1)G)`` are one group). mask: ``[B, T]`` the response
            tokens (non-zero). group_size: ``G``. baseline: subtract the group mean (``..._baseline``).
        totals: the whole batch's :func:`reinforce_pp_totals` when ``rewards`` are one data-parallel share of
            it; None: this batch's own.
    Returns:
        ``[B, T]`` float32, 0 off the mask, no gradient.
    """
    fn = "reinforce_pp_advantages"
    group_size = _check(fn, rewards, mask, group_size)
    x = _centred(rewards, group_size, baseline)
    n, s, q = totals if totals is not None else reinforce_pp_totals(rewards, mask, group_size, baseline=baseline)
    if n <= 0:
        return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    mean = s / n
    var = max(q / n - mean * mean, 0.0) * (n / (n - 1) if n > 1 else 0.0)  # unbiased, as verl's masked_var
    adv = (x - mean) / (var + eps) ** 0.5
    return torch.where(mask_nonzero(mask), adv[:, None].to(mask.device), 0.0).float()
