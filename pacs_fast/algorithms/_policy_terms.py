"""What verl's policy-loss modes share here (GSPO, CISPO, GMPO in :mod:`.sequence_losses`; Clip-Cov, KL-Cov in
:mod:`.covariance_losses`; SAPO in :mod:`.sapo`): the input checks, the inputs with padding zeroed in the compute
dtype, and the finish (the off-policy weights, the aggregation, the KL penalty to a reference, the shared
metrics), each as :func:`~pacs_fast.algorithms.policy_loss.policy_loss` does it.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import check_real, compute_dtype, mask_nonzero, zero_masked
from pacs_fast.algorithms._stable import k3
from pacs_fast.algorithms.aggregation import _aggregate, masked_mean
from pacs_fast.algorithms.kl import _kl_penalty
from pacs_fast.algorithms.policy_loss import check_policy_inputs

LOG_RATIO_CLAMP = 20.0  # approx_kl's log-ratio bound (verl's)


def check_inputs(fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, clip_low, clip_high,
                 horizon, global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite):
    """policy_loss's input checks (:func:`~pacs_fast.algorithms.policy_loss.check_policy_inputs`) and
    the two clip ranges (>= 0; no dual clip here). Returns ``(clip_low, clip_high, kl_coef, kl_clamp, horizon,
    global_count)`` as floats (or None)."""
    kl_coef, kl_clamp, horizon, global_count = check_policy_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, logp_ref, kl_coef, kl_estimator,
        kl_clamp, horizon, global_count, check_finite)
    clip_low = check_real(fn, "clip_low", clip_low, nonneg=True)
    clip_high = check_real(fn, "clip_high", clip_high, nonneg=True)
    return clip_low, clip_high, kl_coef, kl_clamp, horizon, global_count


def padded_inputs(mask, logp, old_logp, advantages, logp_ref, token_weights):
    """``(logp, old_logp, advantages, logp_ref, token_weights)`` with 0 where ``mask`` leaves a token out (padding's
    NaN / Inf never enters a product, so its gradient stays 0: ``0 * NaN`` in a backward is NaN); ``logp`` in the
    compute dtype (float32, float64 for float64), ``old_logp`` and ``advantages`` detached in it, ``advantages``
    ``[B, T]`` (a ``[B]`` one broadcast over each row's tokens)."""
    keep = mask_nonzero(mask)
    # logp in the compute dtype once: the surrogate's and the KL term's gradients add in fp32 and round to a bf16
    # logp once (two casts rounded each apart: 10% of entries one bf16 step off)
    logp = zero_masked(logp, keep).to(compute_dtype(logp))
    dtype = logp.dtype
    adv = advantages.detach().to(dtype)
    adv = adv[:, None].expand_as(logp) if adv.dim() == 1 else zero_masked(adv, keep)
    return (logp, zero_masked(old_logp, keep).detach().to(dtype), adv, zero_masked(logp_ref, keep),
            zero_masked(token_weights, keep))


def finish_loss(per_token, logp, log_ratio, mask, token_weights, mode, horizon, global_count, logp_ref, kl_coef,
                kl_estimator, kl_clamp, metrics):
    """Weights, aggregation, the KL penalty and the shared metrics (``pg_loss``, ``ppo_kl``, ``approx_kl``,
    ``kl``), as :func:`~pacs_fast.algorithms.policy_loss.policy_loss`. Returns ``(loss, metrics)``."""
    dtype = per_token.dtype
    if token_weights is not None:
        per_token = per_token * token_weights.detach().to(dtype)
    loss = _aggregate(per_token, mask, mode, horizon, global_count)
    with torch.no_grad():
        lr = log_ratio.detach()
        metrics["pg_loss"] = loss.detach().clone()
        metrics["ppo_kl"] = masked_mean(-lr, mask)
        lr_c = lr.clamp(max=LOG_RATIO_CLAMP)
        metrics["approx_kl"] = masked_mean(k3(lr_c) + (lr_c - lr), mask)
    if kl_coef != 0:
        kl_loss = _aggregate(_kl_penalty(logp, logp_ref, kl_estimator, kl_clamp), mask, mode, horizon, global_count)
        metrics["kl"] = kl_loss.detach().clone()
        loss = loss + kl_coef * kl_loss
    return loss, metrics
