"""The learning-rate schedule of a run (``learner.lr_schedule``, ``learner.lr_warmup_steps``,
``learner.min_lr_ratio``): the factor on ``learner.lr`` (and PPO's ``learner.critic_lr``) for each training step,
a pure function of the step, so a resumed run uses the uninterrupted run's rates with no state of its own.

- Warm-up: training step ``s <= W`` (1-based, ``W = lr_warmup_steps``) trains at ``s / W`` of the rate. (Hugging
  Face's schedulers, and verl's through them, give their first step ``0 / W``: an update with no effect.)
- Then ``constant`` (1), or a decay over the steps left, with ``p = (s - 1 - W) / (total - W)`` (Hugging Face's
  ``get_linear_schedule_with_warmup`` / ``get_cosine_with_min_lr_schedule_with_warmup`` at their step ``s - 1``,
  ``total = train.steps``): ``linear`` ``m + (1 - m)(1 - p)`` and ``cosine`` ``m + (1 - m)(1 + cos(pi p)) / 2``,
  ``m = min_lr_ratio`` (the floor; 0: down to 0 after the last step).
"""
from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_scale(step: int, *, total: int, warmup: int = 0, schedule: str = "constant", min_ratio: float = 0.0) -> float:
    """The factor on the configured learning rate for training step ``step`` (1-based) of ``total``."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"learner.lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {schedule!r}")
    if warmup > 0 and step <= warmup:
        return step / warmup
    if schedule == "constant":
        return 1.0
    p = min(max((step - 1 - warmup) / max(total - warmup, 1), 0.0), 1.0)
    shape = 1.0 - p if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))
    return min_ratio + (1.0 - min_ratio) * shape
