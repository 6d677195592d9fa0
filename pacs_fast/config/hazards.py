"""Settings that run but train badly: a warning each at the start of a run, never an error.

``algo.score=grpo`` (PACS) with the log-ratio proxy: the score ``psi = (r - mean) / (std + 1e-6)`` normalises a
learned quantity, so its gradient is ``1 / (std of the group's proxies + 1e-6)``. Every step starts with the
policy equal to its reference (``r = 0`` in every group, ``algo.ref=rollout``; after each reset with
``ref=fixed``): there the gradient is ``(delta_ij - 1/G) / 1e-6``. Measured on the built-in task: gradient
norms of 1.8e6-3.2e6 a step against 3.6-6.0 with ``rloo``, so ``learner.grad_clip`` sets the update's size and
the eps its direction.
"""
from __future__ import annotations

from pacs_fast.config.schema import Config


def hazard_warnings(cfg: Config) -> list[str]:
    """One line per setting of ``cfg`` that runs but is known to train badly, naming the key and the way out."""
    a = cfg.algo
    out = []
    if a.name == "pacs" and a.score == "grpo" and a.proxy == "logratio":
        out.append("algo.score=grpo divides by the std of each group's proxies (+1e-6), and every step starts with "
                   "the proxies equal (the policy is its reference): gradients of ~1e6 (learner/grad_norm), so "
                   "learner.grad_clip sets the update's size and the 1e-6 its direction; algo.score=rloo (the "
                   "default) has no such point")
    return out
