"""pacs_fast: PACS (arXiv 2509.02522) and RLVR baselines, with fused Triton kernels.

Public API (imported lazily, so ``import pacs_fast`` stays cheap and a missing optional
dependency only matters for the names that need it):

- ops (autograd + backend dispatch): ``token_logprobs``, ``linear_logprobs``
- algorithms: ``pacs_loss`` and its pieces, baselines, GAE, KL, ``pass_at_k``
- reward: ``math_reward``
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "token_logprobs": "pacs_fast.ops.token_logprobs",
    "linear_logprobs": "pacs_fast.ops.linear_logprobs",
    "pass_at_k": "pacs_fast.algorithms.pass_at_k",
    "pacs_loss": "pacs_fast.algorithms.pacs",
    "reward_proxy": "pacs_fast.algorithms.pacs",
    "group_scores": "pacs_fast.algorithms.pacs",
    "class_balanced_weights": "pacs_fast.algorithms.pacs",
    "policy_loss": "pacs_fast.algorithms.policy_loss",
    "grpo_loss": "pacs_fast.algorithms.policy_loss",
    "value_loss": "pacs_fast.algorithms.policy_loss",
    "group_advantages": "pacs_fast.algorithms.advantages",
    "gae": "pacs_fast.algorithms.advantages",
    "kl_penalty": "pacs_fast.algorithms.kl",
    "aggregate_loss": "pacs_fast.algorithms.aggregation",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pacs_fast' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
