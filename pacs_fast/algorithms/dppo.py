"""DPPO's binary trust-region losses (Divergence Proximal Policy Optimization, Qi et al. 2026, "Rethinking the Trust
Region in LLM Reinforcement Learning", arXiv 2602.04879), with verl's definitions (``compute_policy_loss_dppo_tv``
/ ``compute_policy_loss_dppo_kl`` in ``verl.trainer.ppo.core_algos``, 0.9.1; ``tests/test_dppo.py`` checks values
and gradients against the installed verl).

PPO's clip judges an update by the sampled token's ratio, a one-sample estimate of how far the policy moved: a rare
token is over-constrained, a likely one under-constrained. DPPO judges it by a divergence of the two distributions,
approximated on the sampled token's probabilities ``p = exp(logp)``, ``p_old = exp(old_logp)`` (the *binary*
approximation: the token against the rest of the vocabulary):

- ``dppo_tv`` (binary total variation): ``D = p - p_old``; a token with ``A > 0`` trains while
  ``D <= delta_high``, one with ``A <= 0`` while ``D >= -delta_low``;
- ``dppo_kl`` (binary KL): ``D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))``;
  ``A > 0`` trains while ``D <= delta_high`` or ``p <= p_old``, ``A <= 0`` while ``D <= delta_low`` or
  ``p >= p_old`` (only a move in the direction the advantage pushes is bounded).

Each token that trains contributes the policy gradient weighted by its detached ratio, truncated at ``c``
(truncated importance sampling in place of PPO's dual clip)::

    l_t = -A_t * sg(min(r_t, c)) * logp_t * keep_t,     r_t = exp(clamp(logp_t - old_logp_t, -20, 20))

whose gradient ``-A_t min(r_t, c) grad logp_t`` is PPO's unclipped one while ``r_t <= c``. The value is not PPO's:
it carries ``logp``, not the ratio (verl's). ``token_weights`` (the off-policy correction's weights) multiply each
term, as verl's ``rollout_is_weights``; the KL penalty to a reference is a separate term.

Defaults are verl's DPPO recipe (``examples/dppo_trainer``): thresholds 0.15 / 0.15 (TV) and 0.05 / 0.05 (KL),
``c = 10000`` (the paper recommends a large one: truncation biases the gradient) and ``seq-mean-token-sum-norm``.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import check_real, mask_nonzero
from pacs_fast.algorithms._policy_terms import LOG_RATIO_CLAMP, check_inputs, finish_loss, padded_inputs
from pacs_fast.algorithms.aggregation import masked_mean

#: (delta_low, delta_high) of verl's DPPO recipe, per divergence
DPPO_THRESHOLDS = {"tv": (0.15, 0.15), "kl": (0.05, 0.05)}
DPPO_TRUNCATION = 1e4  # c: the recipe's clip_ratio_c
BINARY_KL_EPS = 1e-8  # verl's guard in (1 - p_old + eps) / (1 - p + eps)
DIVERGENCES = ("tv", "kl")


def binary_divergence(logp: torch.Tensor, old_logp: torch.Tensor, divergence: str) -> torch.Tensor:
    """``[B, T]`` DPPO's binary divergence of each token (module docstring): ``p - p_old`` (``tv``, signed) or the KL
    of the two Bernoulli distributions ``(p_old, 1 - p_old)`` and ``(p, 1 - p)`` (``kl``), in ``logp``'s dtype. A
    log-prob above 0 (rounding of a certain token's) counts as 0: ``1 - p`` below 0 made verl's KL NaN, and the
    token fell out of the region whatever its move."""
    logp, old_logp = logp.clamp(max=0.0), old_logp.clamp(max=0.0)
    p, p_old = torch.exp(logp), torch.exp(old_logp)
    if divergence == "tv":
        return p - p_old
    return p_old * (old_logp - logp) + (1 - p_old) * torch.log((1 - p_old + BINARY_KL_EPS) / (1 - p + BINARY_KL_EPS))


def trust_region_mask(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, divergence: str,
                      delta_low: float, delta_high: float) -> torch.Tensor:
    """``[B, T]`` bool: the tokens inside DPPO's trust region for their advantage's direction (module docstring)."""
    d = binary_divergence(logp, old_logp, divergence)
    if divergence == "tv":
        up, down = d <= delta_high, d >= -delta_low
    else:
        up, down = (d <= delta_high) | (logp <= old_logp), (d <= delta_low) | (logp >= old_logp)
    return torch.where(adv > 0, up, down)


def dppo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor | None, *, divergence: str = "tv", clip_low: float | None = None,
                     clip_high: float | None = None, clip_c: float | None = DPPO_TRUNCATION,
                     loss_agg_mode: str = "seq-mean-token-sum-norm", horizon: float | None = None,
                     global_count: float | None = None, logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0,
                     kl_estimator: str = "k3", kl_clamp: float | None = None,
                     token_weights: torch.Tensor | None = None, check_finite: bool = False):
    """DPPO-Binary-TV or DPPO-Binary-KL (module docstring), aggregated.

    Args:
        logp, old_logp: ``[B, T]`` current (differentiable) and rollout-policy (detached) log-probs.
        advantages: ``[B]`` or ``[B, T]`` (detached); verl's DPPO runs on GRPO's advantages.
        mask: ``[B, T]`` bool or 0/1 (the tokens that train), or None.
        divergence: ``"tv"`` or ``"kl"``.
        clip_low, clip_high: the trust region's thresholds ``delta_low`` / ``delta_high`` (>= 0) on the divergence,
            not on the ratio (None: ``DPPO_THRESHOLDS[divergence]``; ``clip_high`` None: ``clip_low`` if given).
        clip_c: ``c``, the truncation of the detached ratio (> 1; None: no truncation).
        loss_agg_mode, horizon, global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, token_weights,
            check_finite: as :func:`~pacs_fast.algorithms.policy_loss.policy_loss`.
    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``clip_frac`` (tokens outside the region: verl's ``pg_clipfrac``),
        ``clip_frac_high`` / ``clip_frac_low`` (of them, those with ``A > 0`` / ``A <= 0``), ``trunc_frac`` (tokens
        in the region whose ratio exceeds ``c``: verl's ``pg_clipfrac_lower``), ``ppo_kl``, ``approx_kl``, and
        ``kl`` with the penalty on.
    """
    fn = "dppo_policy_loss"
    if divergence not in DIVERGENCES:
        raise ValueError(f"{fn}: divergence must be one of {DIVERGENCES}, got {divergence!r}")
    default_low, default_high = DPPO_THRESHOLDS[divergence]
    if clip_low is None:
        clip_low = default_low
        clip_high = default_high if clip_high is None else clip_high
    clip_high = clip_low if clip_high is None else clip_high
    clip_low, clip_high, kl_coef, kl_clamp, horizon, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, clip_low, clip_high, horizon,
        global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    if clip_c is not None:
        clip_c = check_real(fn, "clip_c", clip_c)
        if clip_c <= 1:
            raise ValueError(f"{fn}: clip_c (the truncation of the detached ratio) must be > 1 (None: none), "
                             f"got {clip_c}")
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    dtype, lp = logp.dtype, logp
    old = old_logp.detach().to(dtype)
    log_ratio = (lp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    with torch.no_grad():
        ratio = torch.exp(log_ratio)
        weight = ratio if clip_c is None else ratio.clamp(max=clip_c)
        keep = trust_region_mask(lp.detach(), old, adv, divergence, clip_low, clip_high)
    per_token = -adv * weight * lp * keep.to(dtype)
    metrics = {}
    with torch.no_grad():
        valid = mask_nonzero(mask) if mask is not None else torch.ones_like(keep)
        out = ~keep & valid
        metrics["clip_frac"] = masked_mean(out.to(dtype), mask)
        metrics["clip_frac_high"] = masked_mean((out & (adv > 0)).to(dtype), mask)
        metrics["clip_frac_low"] = masked_mean((out & (adv <= 0)).to(dtype), mask)
        over = (ratio > clip_c) if clip_c is not None else torch.zeros_like(keep)
        metrics["trunc_frac"] = masked_mean((over & keep).to(dtype), mask)
    return finish_loss(per_token, logp, log_ratio, mask, token_weights, loss_agg_mode, horizon, global_count,
                       logp_ref, kl_coef, kl_estimator, kl_clamp, metrics)
