"""SAPO's soft-gated policy loss (Soft Adaptive Policy Optimization, Gao et al. 2025, arXiv 2511.20347), with
verl's definition (``compute_policy_loss_sapo`` in ``verl.trainer.ppo.core_algos``, 0.9.1;
``tests/test_gmpo_sapo.py`` checks values and gradients against the installed verl).

In place of PPO's hard clip, each token's ratio ``r = exp(logp - old_logp)`` (log clamped to [-20, 20]) goes
through a smooth gate whose slope is 1 at ``r = 1`` (on-policy it is the plain policy gradient) and decays as
the ratio leaves 1, faster for negative advantages::

    l_t = -A_t * f(r_t, tau),   f(r, tau) = sigmoid(tau * (r - 1)) * 4 / tau,   tau = tau_pos if A_t > 0 else tau_neg

Defaults: the paper's and verl's ``tau_pos = 1.0``, ``tau_neg = 1.05``. The terms are aggregated
``seq-mean-token-mean`` (verl's SAPO forces it). ``token_weights`` (the off-policy correction's constant weights)
multiply each token's term, as verl's ``rollout_is_weights``; the KL penalty to a reference is a separate term.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import check_real
from pacs_fast.algorithms.aggregation import masked_mean
from pacs_fast.algorithms._policy_terms import check_inputs, finish_loss, padded_inputs

SAPO_TAUS = (1.0, 1.05)  # (tau_pos, tau_neg): the paper's and verl's
LOG_RATIO_CLAMP = 20.0


def sapo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor | None, *, tau_pos: float = SAPO_TAUS[0], tau_neg: float = SAPO_TAUS[1],
                     loss_agg_mode: str = "seq-mean-token-mean", horizon: float | None = None,
                     global_count: float | None = None, logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0,
                     kl_estimator: str = "k3", kl_clamp: float | None = None,
                     token_weights: torch.Tensor | None = None, check_finite: bool = False):
    """SAPO (module docstring), aggregated ``seq-mean-token-mean``.

    Args:
        logp, old_logp: ``[B, T]`` current (differentiable) and rollout-policy (detached) log-probs.
        advantages: ``[B]`` or ``[B, T]`` (detached); verl's SAPO runs on GRPO's advantages.
        mask: ``[B, T]`` bool or 0/1 (the tokens that train), or None.
        tau_pos, tau_neg: the gate's temperatures for positive and non-positive advantages (> 0).
        loss_agg_mode: must be ``"seq-mean-token-mean"``; global_count: the mini-batch's sequences.
        horizon, logp_ref, kl_coef, kl_estimator, kl_clamp, token_weights, check_finite: as
            :func:`~pacs_fast.algorithms.policy_loss.policy_loss`.
    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``gate_mean`` (the mean gate slope ``4 s (1 - s)``, 1 on-policy, 0 far
        from it), ``ppo_kl``, ``approx_kl``, and ``kl`` with the penalty on.
    """
    fn = "sapo_policy_loss"
    if loss_agg_mode != "seq-mean-token-mean":
        raise ValueError(f"{fn}: SAPO aggregates per sequence (verl's): loss_agg_mode must be "
                         f"'seq-mean-token-mean', got {loss_agg_mode!r}")
    _, _, kl_coef, kl_clamp, horizon, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, 0.0, 0.0, horizon, global_count,
        logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    tau_pos = check_real(fn, "tau_pos", tau_pos, positive=True)
    tau_neg = check_real(fn, "tau_neg", tau_neg, positive=True)
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    dtype, lp = logp.dtype, logp
    log_ratio = (lp - old_logp.detach().to(dtype)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, tau_pos, tau_neg).to(dtype)
    s = torch.sigmoid(tau * (ratio - 1.0))
    per_token = -adv * s * (4.0 / tau)
    metrics = {}
    with torch.no_grad():
        metrics["gate_mean"] = masked_mean(4.0 * s * (1.0 - s), mask)
    return finish_loss(per_token, logp, log_ratio, mask, token_weights, loss_agg_mode, horizon, global_count,
                   logp_ref, kl_coef, kl_estimator, kl_clamp, metrics)
