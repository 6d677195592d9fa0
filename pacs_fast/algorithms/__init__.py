"""Algorithms (pure PyTorch, any device, differentiable): PACS and the RLVR baselines.

- PACS: :func:`pacs_loss` and its pieces :func:`reward_proxy`, :func:`group_scores`,
  :func:`class_balanced_weights` (module :mod:`.pacs`).
- Baselines: :func:`policy_loss` (PPO clipped surrogate, DAPO clip-higher, dual clip, KL),
  :func:`grpo_loss` (GRPO / Dr. GRPO / RLOO), :func:`value_loss` (module :mod:`.policy_loss`);
  :func:`group_advantages`, :func:`gae` (:mod:`.advantages`); :func:`kl_penalty` (:mod:`.kl`);
  :func:`aggregate_loss` (:mod:`.aggregation`); :func:`gspo_policy_loss`, :func:`cispo_policy_loss`
  (:mod:`.sequence_losses`); :func:`clip_cov_policy_loss`, :func:`kl_cov_policy_loss`
  (:mod:`.covariance_losses`); :func:`gmpo_policy_loss` (:mod:`.sequence_losses`), :func:`sapo_policy_loss`
  (:mod:`.sapo`); :func:`dppo_policy_loss` (:mod:`.dppo`); :func:`gpg_advantages`, :func:`gpg_policy_loss`,
  :func:`dro_policy_loss` (:mod:`.gpg`); :func:`vespo_policy_loss` (:mod:`.vespo`); :func:`overlong_penalty`
  (DAPO's overlong reward shaping, :mod:`.overlong`);
  :func:`high_entropy_mask` (the high-entropy tokens a policy gradient keeps, :mod:`.token_selection`).
- Evaluation: :func:`pass_at_k` (:mod:`.pass_at_k`).
"""
from pacs_fast.algorithms.advantages import gae, group_advantages, masked_whiten
from pacs_fast.algorithms.aggregation import LOSS_AGG_MODES, aggregate_loss, masked_mean
from pacs_fast.algorithms.covariance_losses import clip_cov_policy_loss, kl_cov_policy_loss
from pacs_fast.algorithms.kl import KL_ESTIMATORS, kl_penalty
from pacs_fast.algorithms.pacs import (
    PROXIES,
    SCORES,
    WEIGHT_MODES,
    class_balanced_weights,
    group_scores,
    pacs_loss,
    reward_proxy,
)
from pacs_fast.algorithms.pass_at_k import pass_at_k
from pacs_fast.algorithms.overlong import overlong_penalty
from pacs_fast.algorithms.policy_loss import grpo_loss, policy_loss, value_loss
from pacs_fast.algorithms.dppo import dppo_policy_loss
from pacs_fast.algorithms.gpg import dro_policy_loss, gpg_advantages, gpg_policy_loss
from pacs_fast.algorithms.sapo import sapo_policy_loss
from pacs_fast.algorithms.sequence_losses import cispo_policy_loss, gmpo_policy_loss, gspo_policy_loss
from pacs_fast.algorithms.token_selection import high_entropy_mask
from pacs_fast.algorithms.vespo import vespo_policy_loss

__all__ = [
    "KL_ESTIMATORS", "LOSS_AGG_MODES", "PROXIES", "SCORES", "WEIGHT_MODES", "aggregate_loss", "cispo_policy_loss",
    "class_balanced_weights", "clip_cov_policy_loss", "dppo_policy_loss", "dro_policy_loss", "gae", "gmpo_policy_loss",
    "gpg_advantages", "gpg_policy_loss", "group_advantages", "group_scores", "grpo_loss", "gspo_policy_loss",
    "high_entropy_mask", "kl_cov_policy_loss", "kl_penalty", "masked_mean", "masked_whiten", "overlong_penalty",
    "pacs_loss", "pass_at_k", "policy_loss", "reward_proxy", "sapo_policy_loss", "value_loss", "vespo_policy_loss",
]
