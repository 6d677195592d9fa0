"""GPG (Group Policy Gradient, Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
Reasoning", arXiv 2504.02546) and DRO's quadratic-penalty loss (Direct Reward Optimization, Richemond et al. 2024,
arXiv 2405.19107; Kimi k1.5's), as verl defines them
(``compute_gpg_outcome_advantage``, ``compute_policy_loss_gpg``, ``compute_policy_loss_dro`` in
``verl.trainer.ppo.core_algos``, 0.9.1; ``tests/test_gpg_dro.py`` checks them against the installed verl).

Both are REINFORCE on the current log-probs, with no ratio and no clip:

- GPG's loss ``l_t = -A_i logp_t``, on GPG's advantages ``A_i = alpha (R_i - mean_g R)`` (a group of one: ``R_i``),
  where ``alpha = B / max(1, M)`` over the whole step, ``B`` its responses and ``M`` those with a non-zero reward
  (verl's ``count_nonzero`` of the scores): the gradient is rescaled for the share of responses that carry one.
  The scale is the step's, so a batch split over data-parallel groups takes the whole step's counts
  (:func:`gpg_totals` of each share, summed; as REINFORCE++'s whitening in :mod:`.reinforce_pp`). Rows that
  ``learner.mask_truncated`` takes out of the loss still count in ``B`` and ``M`` (verl, whose formula this is,
  has no such setting; their group means count them too, as every baseline's do).
- DRO's loss ``l_t = -(A_t logp_t - beta / 2 (logp_t - old_logp_t)^2)`` (verl's ``dro``, ``dro_beta`` required):
  the policy gradient with a quadratic pull back to the rollout policy, on GRPO's advantages in the trainer (as
  verl's; the paper's soft value baseline is not built here). Tinker's DRO loss is the same term.

``token_weights`` (the off-policy correction's weights) multiply each term, as verl's ``rollout_is_weights``; the KL
penalty to a reference is a separate term.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import check_group_size, check_real, check_tensor
from pacs_fast.algorithms._policy_terms import LOG_RATIO_CLAMP, check_inputs, finish_loss, padded_inputs
from pacs_fast.algorithms._stable import centred_in_groups
from pacs_fast.algorithms.aggregation import masked_mean


@torch.no_grad()
def gpg_totals(rewards: torch.Tensor) -> tuple[float, float]:
    """``(responses, responses with a non-zero reward)`` of this batch: what :func:`gpg_advantages` scales with;
    summed over a step's data-parallel shares, the step's."""
    check_tensor("gpg_totals", "rewards", rewards, ndim=1)
    return float(rewards.numel()), float(torch.count_nonzero(rewards))


@torch.no_grad()
def gpg_advantages(rewards: torch.Tensor, group_size: int, *, totals: tuple[float, float] | None = None
                   ) -> torch.Tensor:
    """GPG's advantages (module docstring).

    Args:
        rewards: ``[B]`` outcome rewards (rows ``[kG, (k+1)G)`` are one group). group_size: ``G``.
        totals: the step's :func:`gpg_totals` when ``rewards`` are one data-parallel share of it; None: this
            batch's own.
    Returns:
        ``[B]`` float32 (float64 for float64 rewards), no gradient.
    """
    fn = "gpg_advantages"
    check_tensor(fn, "rewards", rewards, ndim=1)
    if rewards.is_complex():  # (its imaginary part was dropped, with only torch's warning)
        raise ValueError(f"{fn}: rewards must be real numbers, got {rewards.dtype}")
    group_size = check_group_size(fn, group_size, rewards.shape[0], "rewards")
    rows, nonzero = totals if totals is not None else gpg_totals(rewards)
    alpha = rows / max(nonzero, 1.0)
    r = rewards.to(torch.float64)
    centred = r if group_size == 1 else centred_in_groups(r.reshape(-1, group_size)).reshape(-1)
    dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    return (alpha * centred).to(dtype)


def gpg_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor | None, *, loss_agg_mode: str = "token-mean", horizon: float | None = None,
                    global_count: float | None = None, logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0,
                    kl_estimator: str = "k3", kl_clamp: float | None = None,
                    token_weights: torch.Tensor | None = None, check_finite: bool = False):
    """GPG's loss ``-A logp`` (module docstring), aggregated.

    Args:
        logp, old_logp: ``[B, T]`` current (differentiable) and rollout-policy (detached) log-probs; ``old_logp``
            only enters the metrics (``ppo_kl``, ``approx_kl``).
        advantages: ``[B]`` or ``[B, T]`` (detached): :func:`gpg_advantages`.
        mask, loss_agg_mode, horizon, global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, token_weights,
            check_finite: as :func:`~pacs_fast.algorithms.policy_loss.policy_loss`.
    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``ppo_kl``, ``approx_kl``, and ``kl`` with the penalty on.
    """
    fn = "gpg_policy_loss"
    _, _, kl_coef, kl_clamp, horizon, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, 0.0, 0.0, horizon, global_count,
        logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    log_ratio = (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return finish_loss(-adv * logp, logp, log_ratio, mask, token_weights, loss_agg_mode, horizon, global_count,
                       logp_ref, kl_coef, kl_estimator, kl_clamp, {})


def dro_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor | None, *, beta: float, loss_agg_mode: str = "token-mean",
                    horizon: float | None = None, global_count: float | None = None,
                    logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
                    kl_clamp: float | None = None, token_weights: torch.Tensor | None = None,
                    check_finite: bool = False):
    """DRO's loss ``-(A logp - beta / 2 (logp - old_logp)^2)`` (module docstring), aggregated.

    Args:
        logp, old_logp, advantages, mask: as :func:`gpg_policy_loss` (``old_logp`` enters the penalty).
        beta: the quadratic penalty's coefficient (> 0; verl's ``dro_beta``, which has no default).
        loss_agg_mode, horizon, global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, token_weights,
            check_finite: as :func:`~pacs_fast.algorithms.policy_loss.policy_loss`.
    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``sq_log_ratio`` (the mean of ``(logp - old_logp)^2``), ``ppo_kl``,
        ``approx_kl``, and ``kl`` with the penalty on.
    """
    fn = "dro_policy_loss"
    beta = check_real(fn, "beta", beta, positive=True)
    _, _, kl_coef, kl_clamp, horizon, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, 0.0, 0.0, horizon, global_count,
        logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    log_ratio = logp - old_logp  # unclamped in the penalty (verl's): a clamp would cut its pull back
    per_token = -(adv * logp - 0.5 * beta * log_ratio.square())
    metrics = {}
    with torch.no_grad():
        metrics["sq_log_ratio"] = masked_mean(log_ratio.square(), mask)
    return finish_loss(per_token, logp, log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), mask, token_weights,
                       loss_agg_mode, horizon, global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, metrics)
