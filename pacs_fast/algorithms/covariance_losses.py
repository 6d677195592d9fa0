"""Clip-Cov and KL-Cov policy losses ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", Cui et al. 2025, arXiv 2505.22617), with verl's definitions (``compute_policy_loss_clip_cov`` /
``compute_policy_loss_kl_cov`` in ``verl.trainer.ppo.core_algos``, 0.9.1; ``tests/test_covariance_losses.py``
checks values and gradients against the installed verl).

The paper finds the policy's entropy falls where a token's log-prob and its advantage covary: a confident token
with a positive advantage, or an unlikely one with a negative advantage. Both losses act on a small fraction of
the tokens with the largest centred covariance, over the tokens that train in one call (a micro-batch, as in
verl)::

    cov_t = (A_t - mean A) * (logp_t - mean logp)        (means over the tokens of ``mask``, logp detached)

- **Clip-Cov**: PPO's clipped surrogate ``max(-A ratio, -A clip(ratio, 1 - clip_low, 1 + clip_high))`` (no dual
  clip), with the gradient of ``max(1, int(cov_frac * n))`` tokens (``n``: the tokens of ``mask``) set to 0: a
  uniform random draw among the tokens whose covariance lies strictly inside ``(cov_low, cov_high)`` (paper and
  verl: 1 and 5) and whose clipped term is not already active. The draw is ``torch.randperm`` of ``generator``
  over those tokens in row-major order, as verl draws with the global generator; or, with ``token_keys``, the
  tokens of the smallest keys (the trainer's: keys drawn from each row's own content, so that the draw does not
  depend on the order of the rows in the micro-batch, which differs between the learners).
- **KL-Cov**: the unclipped ``-A ratio`` on every token, plus ``cov_kl_coef * |logp - old_logp|`` on the
  ``max(1, int(cov_frac * n))`` tokens of the largest covariance (the paper's recipe: ``cov_frac`` 2e-3 for 7B,
  2e-4 for 32B, coefficient 1).

Defaults: verl 0.9.1's config (``cov_frac`` 2e-4, bounds 1 and 5, ``ppo_kl_coef`` 0.1; its function's fallback
of 1 is never reached through the config). The log-ratio is clamped to [-20, 20] (PPO's clamp here; verl leaves
it) so that ``exp`` stays finite: tokens whose policy moved further than that (a ratio beyond e^20) take the
clamped value and no gradient, where verl's are unbounded. ``token_weights`` (the off-policy
correction's constant weights) multiply each token's term, as verl's ``rollout_is_weights``; the KL penalty
to a reference (``kl_coef``) is a separate term, as in :func:`~pacs_fast.algorithms.policy_loss.policy_loss`.
The selection reads the tokens' values on the host (one sync per call, as verl's). Metrics: detached 0-d
tensors.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import check_real, compute_dtype, mask_nonzero
from pacs_fast.algorithms._policy_terms import check_inputs, finish_loss, padded_inputs
from pacs_fast.algorithms.aggregation import masked_mean

#: verl 0.9.1's config defaults (``policy_loss.clip_cov_ratio`` / ``kl_cov_ratio``, ``clip_cov_lb`` /
#: ``clip_cov_ub``, ``ppo_kl_coef``: verl/workers/config/actor.py ``PolicyLossConfig``)
COV_FRAC = 2e-4
COV_BOUNDS = (1.0, 5.0)
KL_COV_COEF = 0.1
LOG_RATIO_CLAMP = 20.0


def token_covariance(advantages: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``[B, T]`` centred covariance terms ``(A_t - mean A) * (logp_t - mean logp)``, means over ``mask``'s
    tokens; detached, in the compute dtype (float32, float64 for float64 input). ``advantages``: ``[B]`` or
    ``[B, T]``."""
    dtype = compute_dtype(logp)
    lp = logp.detach().to(dtype)
    adv = advantages.detach().to(dtype)
    adv = adv[:, None].expand_as(lp) if adv.dim() == 1 else adv
    return (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask))


def _count(cov_frac: float, n: int) -> int:
    """How many tokens the losses act on: ``max(1, int(cov_frac * n))`` (verl's, float for float)."""
    return max(int(cov_frac * float(n)), 1)


def clip_cov_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                         mask: torch.Tensor | None, *, clip_low: float = 0.2, clip_high: float | None = None,
                         cov_frac: float = COV_FRAC, cov_low: float = COV_BOUNDS[0], cov_high: float = COV_BOUNDS[1],
                         generator: torch.Generator | None = None, token_keys=None,
                         loss_agg_mode: str = "token-mean",
                         horizon: float | None = None, global_count: float | None = None,
                         logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
                         kl_clamp: float | None = None, token_weights: torch.Tensor | None = None,
                         check_finite: bool = False):
    """Clip-Cov (module docstring), aggregated.

    Args:
        logp, old_logp: ``[B, T]`` current (differentiable) and rollout-policy (detached) log-probs.
        advantages: ``[B]`` or ``[B, T]`` (detached); the paper's and verl's GRPO advantages.
        mask: ``[B, T]`` bool or 0/1 (the tokens that train), or None.
        clip_low, clip_high: the ratio range ``[1 - clip_low, 1 + clip_high]`` (``clip_high`` None: clip_low).
        cov_frac: the fraction of the tokens whose gradient is cut, in (0, 1].
        cov_low, cov_high: the open band of covariance the cut tokens are drawn from (``cov_low < cov_high``).
        generator: the CPU generator of the draw (None: torch's default one).
        token_keys: ``[B, T]`` random keys in place of the generator's draw: the candidates of the smallest keys; or
            a function returning them, called only when there is a draw (more candidates than tokens to cut).
        loss_agg_mode, horizon, global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, token_weights,
            check_finite: as :func:`~pacs_fast.algorithms.policy_loss.policy_loss`.
    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``clip_frac`` / ``clip_frac_high`` / ``clip_frac_low`` (PPO's),
        ``cov_cut_frac`` (tokens whose gradient was cut: verl's ``pg_clipfrac`` for this loss), ``ppo_kl``,
        ``approx_kl``, and ``kl`` with the penalty on.
    """
    fn = "clip_cov_policy_loss"
    clip_high = clip_low if clip_high is None else clip_high
    clip_low, clip_high, kl_coef, kl_clamp, horizon, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, clip_low, clip_high, horizon,
        global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    if clip_low >= 1:
        raise ValueError(f"{fn}: clip_low must be < 1 (the lower ratio bound is 1 - clip_low), got {clip_low}")
    cov_frac, cov_low, cov_high = _check_cov(fn, cov_frac, cov_low, cov_high)
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    dtype, lp = logp.dtype, logp
    log_ratio = (lp - old_logp.detach().to(dtype)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    valid = mask_nonzero(mask) if mask is not None else torch.ones_like(lp, dtype=torch.bool)
    with torch.no_grad():
        clipped = (loss_clipped > loss_unclipped) & valid
        cov = token_covariance(adv, lp, mask)
        band = (valid & ~clipped & (cov > cov_low) & (cov < cov_high)).cpu()
        picked = torch.nonzero(band)  # row-major, as verl's
        count = _count(cov_frac, int(valid.sum()))
        if len(picked) > count and token_keys is not None:
            keys = (token_keys() if callable(token_keys) else token_keys).detach().cpu()[picked[:, 0], picked[:, 1]]
            picked = picked[torch.argsort(keys, stable=True)[:count]]
        elif len(picked) > count:
            picked = picked[torch.randperm(len(picked), generator=generator)[:count]]
        keep = torch.ones(lp.shape, dtype=dtype)
        keep[picked[:, 0], picked[:, 1]] = 0.0
        keep = keep.to(lp.device)
    per_token = torch.maximum(loss_unclipped, loss_clipped) * keep
    metrics = {}
    with torch.no_grad():
        metrics["clip_frac"] = masked_mean(clipped.to(dtype), mask)
        metrics["clip_frac_high"] = masked_mean(((ratio > 1 + clip_high) & (adv > 0)).to(dtype), mask)
        metrics["clip_frac_low"] = masked_mean(((ratio < 1 - clip_low) & (adv < 0)).to(dtype), mask)
        metrics["cov_cut_frac"] = masked_mean((keep == 0).to(dtype), mask)
    return finish_loss(per_token, logp, log_ratio, mask, token_weights, loss_agg_mode, horizon, global_count,
                   logp_ref, kl_coef, kl_estimator, kl_clamp, metrics)


def kl_cov_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                       mask: torch.Tensor | None, *, cov_frac: float = COV_FRAC, cov_kl_coef: float = KL_COV_COEF,
                       loss_agg_mode: str = "token-mean", horizon: float | None = None,
                       global_count: float | None = None, logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0,
                       kl_estimator: str = "k3", kl_clamp: float | None = None,
                       token_weights: torch.Tensor | None = None, check_finite: bool = False):
    """KL-Cov (module docstring), aggregated.

    Args:
        logp, old_logp, advantages, mask: as :func:`clip_cov_policy_loss`.
        cov_frac: the fraction of the tokens that get the KL term, in (0, 1].
        cov_kl_coef: the coefficient of ``|logp - old_logp|`` on them (>= 0; verl's ``ppo_kl_coef``, 0.1; the
            paper's recipe: 1).
        loss_agg_mode, horizon, global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, token_weights,
            check_finite: as :func:`~pacs_fast.algorithms.policy_loss.policy_loss` (``kl_coef``: the penalty
            to a reference policy, apart from this loss's own term).
    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``cov_kl_frac`` (tokens with the KL term), ``cov_kl_abs`` (mean
        ``|logp - old_logp|`` over every token: verl's ``ppo_kl`` for this loss), ``ppo_kl``, ``approx_kl``,
        and ``kl`` with the penalty on.
    """
    fn = "kl_cov_policy_loss"
    _, _, kl_coef, kl_clamp, horizon, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, 0.0, 0.0, horizon, global_count,
        logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    cov_frac, _, _ = _check_cov(fn, cov_frac, *COV_BOUNDS)
    cov_kl_coef = check_real(fn, "cov_kl_coef", cov_kl_coef, nonneg=True)
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    dtype, lp = logp.dtype, logp
    log_ratio = (lp - old_logp.detach().to(dtype)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    valid = mask_nonzero(mask) if mask is not None else torch.ones_like(lp, dtype=torch.bool)
    with torch.no_grad():
        n = int(valid.sum())
        chosen = torch.zeros(lp.shape, dtype=dtype, device=lp.device)
        if n:
            cov = token_covariance(adv, lp, mask)[valid]
            top = torch.topk(cov, _count(cov_frac, n), largest=True).indices
            flat = torch.nonzero(valid.reshape(-1)).squeeze(1)[top]
            chosen.view(-1)[flat] = 1.0
    per_token = -adv * torch.exp(log_ratio) + chosen * (cov_kl_coef * log_ratio.abs())
    metrics = {}
    with torch.no_grad():
        metrics["cov_kl_frac"] = masked_mean(chosen, mask)
        metrics["cov_kl_abs"] = masked_mean(log_ratio.detach().abs(), mask)
    return finish_loss(per_token, logp, log_ratio, mask, token_weights, loss_agg_mode, horizon, global_count,
                   logp_ref, kl_coef, kl_estimator, kl_clamp, metrics)


def _check_cov(fn: str, cov_frac, cov_low, cov_high) -> tuple[float, float, float]:
    cov_frac = check_real(fn, "cov_frac", cov_frac, positive=True)
    if cov_frac > 1:
        raise ValueError(f"{fn}: cov_frac is a fraction of the tokens, in (0, 1], got {cov_frac}")
    cov_low, cov_high = check_real(fn, "cov_low", cov_low), check_real(fn, "cov_high", cov_high)
    if not cov_low < cov_high:
        raise ValueError(f"{fn}: cov_low must be below cov_high (an open band of covariance), got {cov_low} and "
                         f"{cov_high}")
    return cov_frac, cov_low, cov_high
