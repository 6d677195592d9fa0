"""Baseline losses: PPO clipped surrogate (with DAPO clip-higher and dual clip), GRPO / RLOO /
Dr. GRPO on top of it, and the clipped PPO value loss.

Recipes (token-level losses with the definitions of verl's ``core_algos``, 0.7.0 and 0.9.1; see
``tests/test_verl_semantics.py``):

- PPO:     ``advantages, returns = gae(...)``; ``policy_loss(...)`` + ``value_loss(...)`` for the critic.
- GRPO:    ``grpo_loss(..., advantage="grpo")``, optionally ``logp_ref=..., kl_coef=0.001`` (k3 KL).
- Dr.GRPO: ``grpo_loss(..., advantage="dr_grpo", loss_agg_mode="seq-mean-token-sum-norm", horizon=max_len)``
  (``"token-sum-norm"``: the sum over sequences that verl <= 0.7.0 used under that name).
- RLOO:    ``grpo_loss(..., advantage="rloo")``.
- DAPO:    ``grpo_loss(..., clip_low=0.2, clip_high=0.28, loss_agg_mode="token-mean")``.

Metrics are returned as a dict of detached 0-d tensors (no device sync; call ``.item()`` to log).
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import (
    check_choice,
    check_finite_values,
    check_mask,
    check_real,
    check_same_device,
    check_same_shape,
    check_tensor,
    compute_dtype,
    mask_nonzero,
    zero_masked,
)
from pacs_fast.algorithms._stable import k3
from pacs_fast.algorithms.advantages import group_advantages
from pacs_fast.algorithms.aggregation import LOSS_AGG_MODES, _aggregate, masked_mean
from pacs_fast.algorithms.kl import KL_ESTIMATORS, _kl_penalty

LOG_RATIO_CLAMP = 20.0


def _check_clip(fn, clip_low, clip_high, clip_c):
    clip_low = check_real(fn, "clip_low", clip_low, nonneg=True)
    if clip_low >= 1:
        raise ValueError(f"{fn}: clip_low must be < 1 (the lower ratio bound is 1 - clip_low), got {clip_low}")
    clip_high = clip_low if clip_high is None else check_real(fn, "clip_high", clip_high, nonneg=True)
    if clip_c is not None:
        clip_c = check_real(fn, "clip_c", clip_c)
        if clip_c <= 1:
            raise ValueError(f"{fn}: clip_c (dual-clip bound on the ratio for negative advantages) "
                             f"must be > 1 (None turns it off), got {clip_c}")
    return clip_low, clip_high, clip_c


def check_policy_inputs(fn: str, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, logp_ref,
                        kl_coef, kl_estimator, kl_clamp, horizon, global_count, check_finite):
    """The checks every clipped / importance-weighted policy loss makes (policy_loss, GSPO, CISPO):
    shapes and dtypes of ``logp`` / ``old_logp`` / ``advantages`` / ``mask`` / ``token_weights``, the
    aggregation, the KL penalty's settings, and (``check_finite``) NaN / Inf at unmasked positions.
    ValueError names ``fn`` and the argument. Returns ``(kl_coef, kl_clamp, horizon, global_count)``
    as floats (or None)."""
    check_tensor(fn, "logp", logp, ndim=2, floating=True)
    check_tensor(fn, "old_logp", old_logp, floating=True)
    check_same_shape(fn, "old_logp", old_logp, "logp", logp)
    check_tensor(fn, "advantages", advantages, ndim=(1, 2), floating=True)
    if advantages.dim() == 1 and advantages.shape[0] != logp.shape[0]:
        raise ValueError(f"{fn}: advantages has {advantages.shape[0]} entries but logp has "
                         f"{logp.shape[0]} rows")
    check_same_device(fn, "advantages", advantages, "logp", logp)
    if advantages.dim() == 2:
        check_same_shape(fn, "advantages", advantages, "logp", logp)
    if mask is not None:
        check_mask(fn, mask, logp, "logp")
    if token_weights is not None:
        check_tensor(fn, "token_weights", token_weights, floating=True)
        check_same_shape(fn, "token_weights", token_weights, "logp", logp)
    check_choice(fn, "loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    kl_coef = check_real(fn, "kl_coef", kl_coef, nonneg=True)  # < 0 would reward moving away from the reference
    check_choice(fn, "kl_estimator", kl_estimator, KL_ESTIMATORS)
    if kl_coef != 0:
        if logp_ref is None:
            raise ValueError(f"{fn}: logp_ref is required when kl_coef != 0")
        check_tensor(fn, "logp_ref", logp_ref, floating=True)
        check_same_shape(fn, "logp_ref", logp_ref, "logp", logp)
    if kl_clamp is not None:
        kl_clamp = check_real(fn, "kl_clamp", kl_clamp, positive=True)
    if horizon is not None:
        horizon = check_real(fn, "horizon", horizon, positive=True)
    if global_count is not None:
        global_count = check_real(fn, "global_count", global_count, nonneg=True)
    if check_finite:
        where = mask_nonzero(mask)
        check_finite_values(fn, "logp", logp, where)
        check_finite_values(fn, "old_logp", old_logp, where)
        check_finite_values(fn, "advantages", advantages, where if advantages.dim() == 2 else None)
        if kl_coef != 0:
            check_finite_values(fn, "logp_ref", logp_ref, where)
    return kl_coef, kl_clamp, horizon, global_count


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                mask: torch.Tensor | None, *, clip_low: float = 0.2, clip_high: float | None = None,
                clip_c: float | None = 3.0, loss_agg_mode: str = "token-mean",
                horizon: float | None = None, global_count: float | None = None,
                logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0,
                kl_estimator: str = "k3", kl_clamp: float | None = None,
                token_weights: torch.Tensor | None = None, check_finite: bool = False):
    """PPO clipped surrogate policy loss, per token, aggregated.

    With ``ratio = exp(logp - old_logp)`` (log-ratio clamped to ``[-20, 20]``) and advantage ``A``::

        l = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))
        dual clip (clip_c not None, A < 0 only):  l = min(l, -A * clip_c)
        loss = aggregate_loss(l, mask, loss_agg_mode) + kl_coef * aggregate_loss(KL, mask, loss_agg_mode)

    Args:
        logp: ``[B, T]`` current policy log-probs (differentiable, any float dtype).
        old_logp: ``[B, T]`` log-probs of the rollout policy (detached).
        advantages: ``[B]`` (one per sequence, broadcast over tokens) or ``[B, T]`` (detached).
        mask: ``[B, T]`` bool or 0/1 response mask, or None.
        clip_low, clip_high: ratio bounds ``[1 - clip_low, 1 + clip_high]``; ``clip_high`` defaults to
            ``clip_low`` (symmetric PPO); DAPO's clip-higher uses e.g. 0.2 / 0.28.
        clip_c: dual-clip constant (> 1) for negative advantages (Ye et al. 2020, arXiv 1912.09729):
            bounds the loss of a token with ``A < 0`` at ``-A * clip_c`` however large its ratio.
            Default 3.0, verl's ``clip_ratio_c`` (always on in verl); None turns it off.
        loss_agg_mode, horizon, global_count: see :func:`~pacs_fast.algorithms.aggregation.aggregate_loss`.
        logp_ref, kl_coef, kl_estimator, kl_clamp: optional KL(pi || ref) penalty
            (see :func:`~pacs_fast.algorithms.kl.kl_penalty`); used when ``kl_coef > 0`` (>= 0).
        token_weights: ``[B, T]`` constant weights of each token's clipped term (off-policy correction:
            the importance weight pi_old / mu of decoupled PPO, :mod:`pacs_fast.algorithms.off_policy`);
            the KL penalty is not weighted. None: 1.
        check_finite: raise ValueError naming the argument on NaN/Inf at unmasked positions.
    Returns:
        ``(loss, metrics)``: 0-d loss (fp32; fp64 for fp64 input) and detached 0-d tensors
        ``pg_loss``, ``clip_frac`` (tokens whose clipped term is active), ``clip_frac_high``
        (ratio > 1 + clip_high with A > 0), ``clip_frac_low`` (ratio < 1 - clip_low with A < 0),
        ``dual_clip_frac`` (dual clip active), ``ppo_kl`` (mean of ``old_logp - logp``),
        ``approx_kl`` (k3 estimate of KL(old || new): mean of ``ratio - 1 - log ratio``), and
        ``kl`` (mean KL penalty) when the penalty is on.
    """
    fn = "policy_loss"
    kl_coef, kl_clamp, horizon, global_count = check_policy_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, logp_ref, kl_coef, kl_estimator,
        kl_clamp, horizon, global_count, check_finite)
    clip_low, clip_high, clip_c = _check_clip(fn, clip_low, clip_high, clip_c)
    # what stands at masked positions (padding's NaN / Inf) never enters a product (its gradient would be NaN)
    keep = mask_nonzero(mask)
    logp, old_logp, logp_ref, token_weights = (zero_masked(x, keep)
                                               for x in (logp, old_logp, logp_ref, token_weights))
    if advantages.dim() == 2:
        advantages = zero_masked(advantages, keep)
    # one cast for the surrogate and the KL term: their gradients add in fp32 and round to a bf16 logp once
    logp = logp.to(compute_dtype(logp))

    dtype = compute_dtype(logp)
    adv = advantages.detach().to(dtype)
    if adv.dim() == 1:
        adv = adv[:, None]
    log_ratio = (logp.to(dtype) - old_logp.detach().to(dtype)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    metrics = {}
    with torch.no_grad():
        metrics["clip_frac"] = masked_mean((loss_clipped > loss_unclipped).to(dtype), mask)
        metrics["clip_frac_high"] = masked_mean(((ratio > 1 + clip_high) & (adv > 0)).to(dtype), mask)
        metrics["clip_frac_low"] = masked_mean(((ratio < 1 - clip_low) & (adv < 0)).to(dtype), mask)
    if clip_c is not None:
        loss_dual = -adv * clip_c
        with torch.no_grad():
            metrics["dual_clip_frac"] = masked_mean(((per_token > loss_dual) & (adv < 0)).to(dtype), mask)
        per_token = torch.where(adv < 0, torch.minimum(per_token, loss_dual), per_token)
    else:
        metrics["dual_clip_frac"] = torch.zeros((), dtype=dtype, device=logp.device)
    if token_weights is not None:
        per_token = per_token * token_weights.detach().to(dtype)
    loss = _aggregate(per_token, mask, loss_agg_mode, horizon, global_count)
    with torch.no_grad():
        metrics["pg_loss"] = loss.detach().clone()
        metrics["ppo_kl"] = masked_mean(-log_ratio.detach(), mask)
        metrics["approx_kl"] = masked_mean(k3(log_ratio.detach()), mask)
    if kl_coef != 0:
        kl = _kl_penalty(logp, logp_ref, kl_estimator, kl_clamp)
        kl_loss = _aggregate(kl, mask, loss_agg_mode, horizon, global_count)
        metrics["kl"] = kl_loss.detach().clone()
        loss = loss + kl_coef * kl_loss
    return loss, metrics


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None,
              rewards: torch.Tensor, *, group_size: int, advantage: str = "grpo",
              norm_std: bool = True, eps: float = 1e-6, **policy_kwargs):
    """GRPO-family loss: group-relative outcome advantages + the clipped surrogate.

    ``A_i = group_advantages(rewards, group_size, advantage, norm_std=norm_std, eps=eps)`` is
    broadcast over the tokens of response ``i`` and passed to :func:`policy_loss` with
    ``policy_kwargs`` (clip_low, clip_high, clip_c, loss_agg_mode, horizon, global_count, logp_ref,
    kl_coef, kl_estimator, kl_clamp, check_finite).

    Args:
        logp, old_logp: ``[B, T]``; mask: ``[B, T]`` or None; rewards: ``[B]``.
        group_size: ``G``, rows ``[kG, (k+1)G)`` answer the same prompt.
        advantage: ``"grpo"`` | ``"dr_grpo"`` | ``"rloo"``.
    Returns:
        ``(loss, metrics)`` as :func:`policy_loss`, metrics also holding ``adv_mean`` and ``adv_abs_mean``.
    """
    fn = "grpo_loss"
    check_tensor(fn, "rewards", rewards, ndim=1)
    check_tensor(fn, "logp", logp, ndim=2, floating=True)
    if rewards.shape[0] != logp.shape[0]:
        raise ValueError(f"{fn}: rewards has {rewards.shape[0]} entries but logp has {logp.shape[0]} rows")
    if policy_kwargs.get("check_finite"):  # here, not as NaN advantages reported under policy_loss's name
        check_finite_values(fn, "rewards", rewards)
    adv = group_advantages(rewards, group_size, advantage, norm_std=norm_std, eps=eps)
    loss, metrics = policy_loss(logp, old_logp, adv.to(compute_dtype(logp)), mask, **policy_kwargs)
    metrics["adv_mean"] = adv.mean()
    metrics["adv_abs_mean"] = adv.abs().mean()
    return loss, metrics


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
               mask: torch.Tensor | None, *, clip_range: float | None = 0.2,
               loss_agg_mode: str = "token-mean", horizon: float | None = None,
               global_count: float | None = None):
    """Clipped PPO value loss ``0.5 * agg(max((V - G)^2, (clip(V, V_old - c, V_old + c) - G)^2))``.

    Args:
        values: ``[B, T]`` current critic predictions (differentiable).
        old_values: ``[B, T]`` critic values at rollout time (detached).
        returns: ``[B, T]`` targets (e.g. from :func:`~pacs_fast.algorithms.advantages.gae`; detached).
        mask: ``[B, T]`` or None. clip_range: ``c`` (None: unclipped ``0.5 * agg((V - G)^2)``).
    Returns:
        ``(loss, metrics)`` with detached 0-d ``vf_clip_frac`` (tokens where the clipped term wins)
        and ``vf_loss``.
    """
    fn = "value_loss"
    check_tensor(fn, "values", values, ndim=2, floating=True)
    check_tensor(fn, "old_values", old_values, floating=True)
    check_same_shape(fn, "old_values", old_values, "values", values)
    check_tensor(fn, "returns", returns, floating=True)
    check_same_shape(fn, "returns", returns, "values", values)
    if mask is not None:
        check_mask(fn, mask, values, "values")
    check_choice(fn, "loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    keep = mask_nonzero(mask)  # padding's NaN / Inf never enters a product (nor its gradient)
    values, old_values, returns = (zero_masked(x, keep) for x in (values, old_values, returns))
    if clip_range is not None:
        clip_range = check_real(fn, "clip_range", clip_range, nonneg=True)
    if horizon is not None:
        horizon = check_real(fn, "horizon", horizon, positive=True)
    if global_count is not None:
        global_count = check_real(fn, "global_count", global_count, nonneg=True)
    dtype = compute_dtype(values)
    v = values.to(dtype)
    ret = returns.detach().to(dtype)
    loss_unclipped = (v - ret) ** 2
    if clip_range is None:
        per_token = loss_unclipped
        clip_frac = torch.zeros((), dtype=dtype, device=v.device)
    else:
        old = old_values.detach().to(dtype)
        v_clipped = torch.minimum(torch.maximum(v, old - clip_range), old + clip_range)
        loss_clipped = (v_clipped - ret) ** 2
        per_token = torch.maximum(loss_unclipped, loss_clipped)
        with torch.no_grad():
            clip_frac = masked_mean((loss_clipped > loss_unclipped).to(dtype), mask)
    loss = 0.5 * _aggregate(per_token, mask, loss_agg_mode, horizon, global_count)
    return loss, {"vf_loss": loss.detach().clone(), "vf_clip_frac": clip_frac}
