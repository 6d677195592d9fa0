"""Advantages for the baselines: group-relative outcome advantages (GRPO / Dr. GRPO / RLOO) and GAE.

All functions here return constants (computed under ``torch.no_grad``): advantages are targets.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import (
    check_choice,
    check_group_size,
    check_mask,
    check_real,
    check_same_shape,
    check_tensor,
    compute_dtype,
    mask_nonzero,
)
from pacs_fast.algorithms._stable import centred_in_groups

ADVANTAGE_MODES = ("grpo", "dr_grpo", "rloo")


@torch.no_grad()
def group_advantages(rewards: torch.Tensor, group_size: int, mode: str = "grpo", *,
                     norm_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Outcome advantage of each response relative to its group (contiguous rows of ``group_size``).

    - ``"grpo"``: ``(R_i - mean_g) / (std_g + eps)`` with the unbiased std; ``norm_std=False`` drops
      the division (then identical to ``"dr_grpo"``).
    - ``"dr_grpo"``: ``R_i - mean_g`` (Dr. GRPO: no std normalisation).
    - ``"rloo"``: ``R_i - (S_g - R_i)/(G-1)``, leave-one-out baseline.

    A group of one response (``group_size=1``) has no baseline: as in verl (0.7.0 to 0.9.1,
    ``compute_grpo_outcome_advantage`` sets mean 0 and std 1 for a single-response group,
    ``compute_rloo_outcome_advantage`` leaves the score unchanged), the advantage is ``R_i``
    (``R_i / (1 + eps)`` for ``"grpo"`` with ``norm_std``): plain REINFORCE without a baseline.
    With ``eps=0`` a ``"grpo"`` group of equal rewards (std 0) gets advantage 0, as with ``eps > 0``.

    Args:
        rewards: ``[B]`` scalar rewards per response (any real dtype).
    Returns:
        ``[B]`` fp32 (fp64 for fp64 input), no gradient. Broadcast over tokens by the policy losses.
    """
    fn = "group_advantages"
    check_choice(fn, "mode", mode, ADVANTAGE_MODES)
    check_tensor(fn, "rewards", rewards, ndim=1)
    if rewards.is_complex():  # (its imaginary part was dropped silently)
        raise ValueError(f"{fn}: rewards must be real numbers, got {rewards.dtype}")
    group_size = check_group_size(fn, group_size, rewards.shape[0], "rewards")
    eps = check_real(fn, "eps", eps, nonneg=True)
    dtype = compute_dtype(rewards) if rewards.is_floating_point() else torch.float32
    g = rewards.to(dtype).reshape(-1, group_size)
    if g.shape[0] == 0:  # no groups (std over none would warn)
        return g.reshape(-1)
    if group_size == 1:  # verl: mean 0, std 1 (no baseline)
        return (g / (1.0 + eps) if mode == "grpo" and norm_std else g).reshape(-1)
    centered = centred_in_groups(g)  # a group of equal rewards: exactly 0
    if mode == "rloo":
        out = centered * (group_size / (group_size - 1))
    elif mode == "grpo" and norm_std:
        scale = centered.std(dim=1, keepdim=True, correction=1) + eps
        # eps = 0 and equal rewards: 0, not 0 / 0; a NaN / Inf reward makes its group NaN (as "rloo" and
        # "dr_grpo" do), never 0, which would drop the group from training without a sign
        out = torch.where(scale == 0, 0.0, centered / scale)
    else:
        out = centered
    return out.reshape(-1)


@torch.no_grad()
def masked_whiten(x: torch.Tensor, mask: torch.Tensor | None, *, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the unmasked entries (unbiased var); masked entries -> 0.

    As verl's ``masked_whiten``: its masked means divide by ``count + 1e-8`` and the variance then
    takes Bessel's ``count / (count - 1)``; that 1e-8 moves the result by ~1e-9 relative, which an
    entry near zero showed as a 2e-7 relative difference (tests/test_verl_semantics.py). Computed in fp32 at
    least and returned in ``x``'s dtype (bf16 / fp16 inputs: one rounding at the end)."""
    if x.numel() == 0:  # (an empty batch: argmax below had raised IndexError)
        return x.clone()
    out_dtype, x = x.dtype, x.to(compute_dtype(x))  # in fp32 at least: an fp16 count of 65,504+ tokens is inf
    sel = torch.ones_like(x, dtype=torch.bool) if mask is None else mask_nonzero(mask)
    n = sel.sum().to(x.dtype)
    # in differences from one selected entry c (its index found on the device: no host sync), so that equal
    # entries keep their digits (a constant input gave 2.4e-3 for ~1e-4 / n in fp32): verl's mean
    # sum(x) / (n + 1e-8) is c + (sum(d) - 1e-8 c) / (n + 1e-8)
    c = x.reshape(-1).index_select(0, sel.reshape(-1).to(torch.uint8).argmax().reshape(1)).squeeze(0)
    d = torch.where(sel, x - c, 0.0)
    mean_d = (d.sum() - c * 1e-8) / (n + 1e-8)
    centred = d - mean_d
    mean = c + mean_d
    var = torch.where(sel, centred ** 2, 0.0).sum() / (n + 1e-8) * (n / (n - 1).clamp(min=1))
    out = centred * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(sel, out, 0.0).to(out_dtype)


@torch.no_grad()
def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, *,
        gamma: float = 1.0, lam: float = 1.0, whiten: bool = True):
    """Generalised advantage estimation (Schulman et al. 2016) for PPO, per response.

    Only response tokens (``mask != 0``) are steps of the trajectory: masked-out tokens (padding, or
    tool/observation tokens inside a multi-turn response) are skipped — their reward and value are
    ignored and the recursion jumps over them. The value after the last response token is 0.
    For the response tokens ``t_1 < ... < t_n`` of a row::

        delta_k = r_{t_k} + gamma * V_{t_{k+1}} - V_{t_k}         (V_{t_{n+1}} = 0)
        A_{t_k} = delta_k + gamma * lam * A_{t_{k+1}}              (A_{t_{n+1}} = 0)
        returns = A + V

    Args:
        token_rewards: ``[B, T]`` per-token rewards (an outcome reward sits on the last response token).
        values: ``[B, T]`` critic values of the rollout (old values).
        mask: ``[B, T]`` bool or 0/1, or None (all tokens).
        gamma, lam: discount and GAE lambda in ``[0, 1]``.
        whiten: normalise the advantages over the batch's response tokens (mean 0, unit unbiased
            variance, verl's default for PPO); returns are computed before whitening.
    Returns:
        ``(advantages, returns)``, both ``[B, T]`` fp32 (fp64 for fp64 input), 0 at masked-out
        positions, no gradient.
    """
    fn = "gae"
    check_tensor(fn, "token_rewards", token_rewards, ndim=2)
    check_tensor(fn, "values", values, ndim=2, floating=True)
    check_same_shape(fn, "values", values, "token_rewards", token_rewards)
    if mask is not None:
        check_mask(fn, mask, token_rewards, "token_rewards")
    gamma = check_real(fn, "gamma", gamma, nonneg=True)
    lam = check_real(fn, "lam", lam, nonneg=True)
    if gamma > 1 or lam > 1:
        raise ValueError(f"{fn}: gamma and lam must lie in [0, 1], got gamma={gamma}, lam={lam}")
    dtype = compute_dtype(values)
    # the recursion in float64 (MPS has none): at gamma = lam = 1 an fp32 one accumulated 2.8e-6 of max |A| over
    # 16k tokens, 47 roundings; the [B] vectors of each step cost nothing more in float64
    acc = dtype if values.device.type == "mps" else torch.float64
    r = token_rewards.to(acc)
    v = values.to(acc)
    sel = torch.ones_like(v, dtype=torch.bool) if mask is None else mask_nonzero(mask)
    num_rows, length = v.shape
    next_value = v.new_zeros(num_rows)
    last_adv = v.new_zeros(num_rows)
    adv = torch.empty_like(v)
    for t in range(length - 1, -1, -1):  # sequential by nature; O(T) small ops
        s = sel[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        cand = delta + (gamma * lam) * last_adv
        last_adv = torch.where(s, cand, last_adv)
        next_value = torch.where(s, v[:, t], next_value)
        adv[:, t] = last_adv
    adv = torch.where(sel, adv, 0.0)
    returns = torch.where(sel, adv + v, 0.0).to(dtype)
    adv = adv.to(dtype)
    if whiten:
        adv = masked_whiten(adv, sel)
    return adv, returns
