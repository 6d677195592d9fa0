"""Rollout-training mismatch correction in a step (the ``correction`` section; docs/OFF_POLICY.md).

:func:`apply_correction` turns the engine's per-token log-probs of the sampled tokens
(``batch.behaviour_logp``, the behaviour policy ``mu``) and the learner's log-probs before the update
(the proximal policy ``pi_old``) into :attr:`RolloutBatch.is_weights` / :attr:`RolloutBatch.kept_mask`
with :func:`pacs_fast.algorithms.off_policy.off_policy_correction`; the objective
(:func:`pacs_fast.learner.objective.objective`) then weights each token's clipped term (baselines) or each
sample's BCE term (PACS) and aggregates over the kept tokens. Metrics go to the step record under
``correction/``.

Temperature. The engines report log-probs under the temperature-1 distribution (the
:class:`~pacs_fast.rollout.base.RolloutEngine` contract); the learner's ``old_logp`` is at
``rollout.temperature``. At T = 1 the ratio is ``old_logp - behaviour_logp``, exactly
``log pi_old(y) / mu(y)``. At T != 1 the learner runs one extra no-grad forward at temperature 1 and
the ratio is taken there: like is compared with like (the same logits, the same normaliser), and it
measures what the correction is for (stale weights, other numerics), but it is the temperature-1
ratio, not that of the tempered sampling distributions (close, not equal). ``rollout.top_p < 1``,
``top_k > 0`` and ``min_p > 0`` are applied on neither side: the run says so at its start
(:func:`correction_warnings`). A learner that fuses the old log-probs into its update computes them before
it when the correction is on (the weights are needed first), except where :func:`fused_correction`:
at temperature 1 without rejection the update sets each row's weights from its own first forward
(``update(correct=...)``), which is the proximal policy, so the correction costs no forward.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms.off_policy import off_policy_correction
from pacs_fast.config import Config, is_level
from pacs_fast.learner.base import RolloutBatch


def correction_on(cfg: Config) -> bool:
    return (is_level(cfg), cfg.correction.rs_level) != ("none", "none")


def correction_warnings(cfg: Config) -> list[str]:
    """Lines to print at the start of a run whose correction cannot be what it claims: with
    ``rollout.top_p < 1`` (or ``top_k``, ``min_p``) the behaviour policy is the kept set (renormalised),
    which neither side of the ratio includes, so the weights measure stale weights and numerics only,
    not the truncation; a
    ``correction.is_cap`` below 1 caps every weight under 1 (the loss shrinks where the policies agree)."""
    if not correction_on(cfg):
        return []
    out = []
    if is_level(cfg) != "none" and cfg.correction.is_cap < 1:
        out.append(f"correction.is_cap={cfg.correction.is_cap:g} is below 1: every importance weight is capped under 1, "
                   f"so the loss shrinks by that factor or more even where the policies agree (a truncation cap is "
                   f">= 1; the default 2)")
    filters = (("top_p", cfg.rollout.top_p, 1.0), ("top_k", cfg.rollout.top_k, 0), ("min_p", cfg.rollout.min_p, 0.0))
    truncating = [f"rollout.{k}={v:g}" for k, v, off in filters if v != off]
    if truncating:
        verb = "truncates" if len(truncating) == 1 else "truncate"
        out.append(f"{' and '.join(truncating)} {verb} the sampling distribution, and the off-policy correction "
                   f"(correction.is_level={is_level(cfg)}, rs_level={cfg.correction.rs_level}) compares the "
                   f"untruncated distributions: its weights do not include the truncation (a sampled token's "
                   f"behaviour probability is p / Z, Z the kept tokens' mass); use rollout.top_p=1, top_k=0, min_p=0 "
                   f"for an exact correction (docs/OFF_POLICY.md)")
    return out


def fused_correction(cfg: Config, learner) -> bool:
    """Whether the learner's update computes the correction from its own first forward (no extra
    forward before the update): it fuses the old log-probs, the proximal log-probs are those old
    log-probs (``rollout.temperature`` 1) and nothing is rejected (``rs_level=none``: rejection
    changes the denominators, which the update needs before its first forward), unless
    ``correction.fused`` is false."""
    return (correction_on(cfg) and cfg.correction.fused and learner.fuses_old_logprobs and learner.fuses_correction
            and cfg.rollout.temperature == 1.0 and cfg.correction.rs_level == "none")


def proximal_logprobs(cfg: Config, learner, batch: RolloutBatch) -> torch.Tensor:
    """The learner's log-probs of the batch before the update at temperature 1 (``batch.old_logp``
    at T = 1; otherwise one extra no-grad forward). Collective like ``compute_logprobs``."""
    if cfg.rollout.temperature == 1.0:
        return batch.old_logp
    saved, learner.temperature = learner.temperature, 1.0
    try:
        return learner.compute_logprobs(batch)
    finally:
        learner.temperature = saved


def apply_correction(cfg: Config, batch: RolloutBatch, proximal: torch.Tensor) -> dict[str, float]:
    """Sets ``batch.is_weights`` / ``batch.kept_mask`` from ``batch.behaviour_logp`` and ``proximal``
    (``[B, T]``, see :func:`proximal_logprobs`); returns the ``correction/...`` metrics. ValueError
    when the engine gave no log-probs."""
    if batch.behaviour_logp is None:
        raise ValueError("correction.is_level / rs_level need the rollout engine's log-probs of the sampled tokens, "
                         "and this engine returned none")
    c = cfg.correction
    mask = batch.response_mask
    weights, kept, metrics = off_policy_correction(proximal.float().cpu(), batch.behaviour_logp.float().cpu(),
                                                   mask.cpu() > 0, is_level=is_level(cfg), is_cap=c.is_cap,
                                                   rs_level=c.rs_level, rs_low=c.rs_low, rs_high=c.rs_high)
    batch.is_weights = weights.to(mask)
    batch.kept_mask = kept.to(mask)
    return {f"correction/{k}": v for k, v in metrics.items()}
