"""Long responses in a step's batch: DAPO's overlong reward shaping and overlong filtering.

:func:`shape_batch` runs in :func:`pacs_fast.trainer.step.score_and_batch` (so in the synchronous and
the asynchronous loop alike), after the verifier and before anything reads ``batch.rewards``
(process-reward credit, the learner's advantages / PACS labels, PPO's GAE):

- ``reward.overlong_buffer_len = N > 0``: each response of ``L`` tokens (EOS included, as verl counts
  them) gets :func:`pacs_fast.algorithms.overlong.overlong_penalty` with ``L_max = rollout.max_new_tokens``
  and ``penalty_factor = reward.overlong_penalty`` added to its reward (verl's DAPO reward manager);
  PACS's label is ``clip(R + penalty, 0, 1)`` (the BCE needs a label in [0, 1];
  :mod:`pacs_fast.algorithms.overlong`). ``batch.verifier_rewards`` keeps the verifier's rewards, so
  the step's ``reward/mean`` / ``reward/acc`` stay the verifier's; the shaping's own metrics come back
  from :func:`shape_batch`.
- ``learner.mask_truncated``: the rows whose response ended at ``rollout.max_new_tokens`` without EOS
  (``finish_reason == "length"``) are marked in ``batch.truncated`` and leave the loss
  (:func:`pacs_fast.learner.objective.loss_mask`, and for PACS its groups). Every step records
  ``response/truncated_frac`` (:func:`truncated_rows`), with or without it.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms.overlong import overlong_penalty, shaped_rewards
from pacs_fast.config import Config
from pacs_fast.learner.base import RolloutBatch


def truncated_rows(comps) -> torch.Tensor:
    """``[B]`` bool: the completions (``comps[i][j]``, prompt-major as the batch) that hit the length limit."""
    return torch.tensor([c.finish_reason == "length" for cs in comps for c in cs], dtype=torch.bool)


def shape_batch(cfg: Config, batch: RolloutBatch, comps) -> dict[str, float]:
    """Applies ``reward.overlong_buffer_len`` and ``learner.mask_truncated`` to ``batch`` in place.
    Returns the shaping's metrics (empty without it): ``reward/overlong_penalty_mean`` (verl's
    ``overlong_reward``, before PACS's label clip), ``reward/overlong_frac`` (responses it penalised,
    verl's ``overlong``) and ``reward/shaped_mean`` (the mean reward, or PACS label, that trains)."""
    metrics = {}
    if cfg.reward.overlong_buffer_len:
        lengths = batch.response_mask.sum(-1)
        penalty = overlong_penalty(lengths, cfg.rollout.max_new_tokens, cfg.reward.overlong_buffer_len,
                                   cfg.reward.overlong_penalty)
        batch.verifier_rewards = batch.rewards.clone()
        batch.rewards = shaped_rewards(batch.rewards, penalty, label=cfg.algo.name == "pacs")
        metrics = {"reward/overlong_penalty_mean": float(penalty.double().mean()),
                   "reward/overlong_frac": float((penalty < 0).double().mean()),
                   "reward/shaped_mean": float(batch.rewards.double().mean())}
    if cfg.learner.mask_truncated:
        batch.truncated = truncated_rows(comps)
    return metrics
