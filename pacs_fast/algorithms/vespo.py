"""VESPO's Gamma-weighted sequence loss (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693), with
TRL's definition (``GRPOTrainer.get_gamma_weights`` and ``loss_type="vespo"``; ``tests/test_vespo.py`` checks it
against the installed TRL).

In place of a clip, each sequence's importance weight ``w = exp(sum_t (logp_t - old_logp_t))`` (the product of its
token ratios; each token's log-ratio clamped to [-20, 20], the sum to [log 1e-8, 20]) sets a detached weight

    phi(w) = e^lambda * w^k * e^(-lambda w)     (a Gamma shape, phi(1) = 1, largest at w = k / lambda)

with ``(k, lambda) = (k_pos, lambda_pos)`` for ``A >= 0`` and ``(k_neg, lambda_neg)`` otherwise (TRL's 2, 3 and 3, 2):
sequences far from the rollout policy in either direction fade out smoothly. Each token's term is

    l_t = -phi(w) * A * logp_t

whose gradient is ``phi(w) A grad logp_t``. ``is_weights`` (the off-policy correction's token weights against the
engine's policy) enter ``w`` as ``sum_t log(is_weight_t)`` (each clamped to [log 1e-8, 20]), as TRL folds its vLLM
importance-sampling ratios in, and do not multiply the terms; ``token_weights`` (a 0/1 token selection) do. The KL
penalty to a reference is a separate term; TRL aggregates with ``dapo``, our ``token-mean``.
"""
from __future__ import annotations

import math

import torch

from pacs_fast.algorithms._checks import check_real, check_same_shape, check_tensor
from pacs_fast.algorithms._policy_terms import LOG_RATIO_CLAMP, check_inputs, finish_loss, padded_inputs

#: (k_pos, lambda_pos, k_neg, lambda_neg): TRL's defaults
VESPO_SHAPE = (2.0, 3.0, 3.0, 2.0)
LOG_W_MIN = math.log(1e-8)  # TRL's lower clamp of a log weight


@torch.no_grad()
def gamma_weights(log_ratio: torch.Tensor, adv: torch.Tensor, valid: torch.Tensor, *, k_pos: float, lambda_pos: float,
                  k_neg: float, lambda_neg: float, is_weights: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, 1]`` phi(w) of each sequence (module docstring), detached. ``log_ratio``, ``adv``: ``[B, T]``;
    ``valid``: ``[B, T]`` 0/1 the tokens of each sequence; ``is_weights``: ``[B, T]`` or None."""
    log_w = (log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP) * valid).sum(-1, keepdim=True)
    if is_weights is not None:
        log_is = torch.log(is_weights.to(log_w.dtype)).clamp(LOG_W_MIN, LOG_RATIO_CLAMP)
        log_w = log_w + torch.where(valid > 0, log_is, 0.0).sum(-1, keepdim=True)
    log_w = log_w.clamp(LOG_W_MIN, LOG_RATIO_CLAMP)
    # a row's advantage: its first token's (one value per row; a row without tokens has weight 0 anyway)
    nonneg = adv[:, :1] >= 0
    k = torch.where(nonneg, k_pos, k_neg).to(log_w.dtype)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor | None, *, k_pos: float = VESPO_SHAPE[0], lambda_pos: float = VESPO_SHAPE[1],
                      k_neg: float = VESPO_SHAPE[2], lambda_neg: float = VESPO_SHAPE[3],
                      is_weights: torch.Tensor | None = None, loss_agg_mode: str = "token-mean",
                      horizon: float | None = None, global_count: float | None = None,
                      logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
                      kl_clamp: float | None = None, token_weights: torch.Tensor | None = None,
                      check_finite: bool = False):
    """VESPO (module docstring), aggregated.

    Args:
        logp, old_logp: ``[B, T]`` current (differentiable) and rollout-policy (detached) log-probs.
        advantages: ``[B]`` (detached): one per sequence; TRL's VESPO runs on GRPO's advantages.
        mask: ``[B, T]`` bool or 0/1 (the tokens that train), or None.
        k_pos, lambda_pos, k_neg, lambda_neg: the Gamma shapes for ``A >= 0`` and ``A < 0`` (k >= 0, lambda > 0).
        is_weights: ``[B, T]`` the off-policy correction's weights (> 0 where they count), folded into ``w``.
        loss_agg_mode, horizon, global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite: as
            :func:`~pacs_fast.algorithms.policy_loss.policy_loss`; token_weights: multiply each term (a 0/1 token
            selection: ``algo.entropy_top_frac``).
    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``phi_seq_mean`` (phi over the sequences with tokens: 1 on-policy),
        ``ppo_kl``, ``approx_kl``, and ``kl`` with the penalty on.
    """
    fn = "vespo_policy_loss"
    _, _, kl_coef, kl_clamp, horizon, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, 0.0, 0.0, horizon, global_count,
        logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    if advantages.dim() != 1:
        raise ValueError(f"{fn}: advantages must be [B] (one per sequence: VESPO weighs whole sequences), got shape "
                         f"{tuple(advantages.shape)}")
    k_pos, k_neg = (check_real(fn, k, v, nonneg=True) for k, v in (("k_pos", k_pos), ("k_neg", k_neg)))
    lambda_pos, lambda_neg = (check_real(fn, k, v, positive=True)
                              for k, v in (("lambda_pos", lambda_pos), ("lambda_neg", lambda_neg)))
    if is_weights is not None:
        check_tensor(fn, "is_weights", is_weights, floating=True)
        check_same_shape(fn, "is_weights", is_weights, "logp", logp)
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    valid = torch.ones_like(logp) if mask is None else (mask != 0).to(logp.dtype)
    log_ratio = logp - old_logp
    phi = gamma_weights(log_ratio.detach(), adv, valid, k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg,
                        lambda_neg=lambda_neg, is_weights=None if is_weights is None else is_weights.detach())
    per_token = -phi * adv * logp
    metrics = {}
    with torch.no_grad():
        rows = valid.sum(-1) > 0
        metrics["phi_seq_mean"] = (phi[:, 0] * rows).sum() / rows.sum().clamp(min=1)
    return finish_loss(per_token, logp, log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), mask, token_weights,
                       loss_agg_mode, horizon, global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, metrics)
