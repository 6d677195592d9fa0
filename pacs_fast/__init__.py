"""pacs_fast: PACS (arXiv 2509.02522) and RLVR baselines, with fused Triton kernels.

Public API (imported lazily, so ``import pacs_fast`` stays cheap and a missing optional
dependency only matters for the names that need it):

- ops (autograd + backend dispatch): ``token_logprobs``, ``linear_logprobs``, ``fused_pacs_loss``
- algorithms: ``pacs_loss`` and its pieces (``reward_proxy``, ``group_scores``,
  ``class_balanced_weights``), baselines (``policy_loss``, ``grpo_loss``, ``value_loss``,
  ``gspo_policy_loss``, ``cispo_policy_loss``, ``clip_cov_policy_loss``, ``kl_cov_policy_loss``,
  ``gmpo_policy_loss``, ``sapo_policy_loss``, ``dppo_policy_loss``, ``gpg_advantages``, ``gpg_policy_loss``,
  ``dro_policy_loss``, ``vespo_policy_loss``,
  ``group_advantages``, ``gae``, ``kl_penalty``,
  ``aggregate_loss``, ``overlong_penalty``, ``high_entropy_mask``), ``off_policy_correction``
  (truncated / masked importance sampling against the engine's log-probs), ``pass_at_k``
- reward: ``math_reward``, ``score_batch``, ``BatchScorer``
- data: ``load_benchmark``, ``load_dataset``, ``build_prompt``, ``encode_prompts``
- rollout: ``SamplingParams``, ``Completion``, ``RolloutEngine``, ``HFEngine``, ``VLLMEngine``
- learner / trainer: ``Learner``, ``RolloutBatch``, ``TorchLearner``, ``fuse_layers`` (a Hugging Face model's
  RMSNorm and SwiGLU through Liger-Kernel, on a GPU), ``Config``, ``load_config``
  (the Megatron learner lives in ``pacs_fast.learner.megatron``; megatron-core is heavy to import)
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
    "gspo_policy_loss": "pacs_fast.algorithms.sequence_losses",
    "cispo_policy_loss": "pacs_fast.algorithms.sequence_losses",
    "clip_cov_policy_loss": "pacs_fast.algorithms.covariance_losses",
    "kl_cov_policy_loss": "pacs_fast.algorithms.covariance_losses",
    "gmpo_policy_loss": "pacs_fast.algorithms.sequence_losses",
    "sapo_policy_loss": "pacs_fast.algorithms.sapo",
    "dppo_policy_loss": "pacs_fast.algorithms.dppo",
    "gpg_advantages": "pacs_fast.algorithms.gpg",
    "gpg_policy_loss": "pacs_fast.algorithms.gpg",
    "dro_policy_loss": "pacs_fast.algorithms.gpg",
    "vespo_policy_loss": "pacs_fast.algorithms.vespo",
    "overlong_penalty": "pacs_fast.algorithms.overlong",
    "high_entropy_mask": "pacs_fast.algorithms.token_selection",
    "group_advantages": "pacs_fast.algorithms.advantages",
    "gae": "pacs_fast.algorithms.advantages",
    "kl_penalty": "pacs_fast.algorithms.kl",
    "aggregate_loss": "pacs_fast.algorithms.aggregation",
    "off_policy_correction": "pacs_fast.algorithms.off_policy",
    "fused_pacs_loss": "pacs_fast.ops.pacs_loss",
    "math_reward": "pacs_fast.reward",
    "score_batch": "pacs_fast.reward",
    "BatchScorer": "pacs_fast.reward",
    "load_benchmark": "pacs_fast.data.datasets",
    "load_dataset": "pacs_fast.data.datasets",
    "build_prompt": "pacs_fast.data.prompts",
    "encode_prompts": "pacs_fast.data.prompts",
    "SamplingParams": "pacs_fast.rollout.base",
    "Completion": "pacs_fast.rollout.base",
    "RolloutEngine": "pacs_fast.rollout.base",
    "HFEngine": "pacs_fast.rollout.hf",
    "VLLMEngine": "pacs_fast.rollout.vllm_engine",
    "Learner": "pacs_fast.learner.base",
    "RolloutBatch": "pacs_fast.learner.base",
    "TorchLearner": "pacs_fast.learner.torch_learner",
    "fuse_layers": "pacs_fast.learner.fused_layers",
    "Config": "pacs_fast.config",
    "load_config": "pacs_fast.config",
}

__all__ = sorted(_EXPORTS)


def _kernels_of_a_source_checkout() -> None:
    """``pacs_fast.kernels`` is the top-level ``kernels/`` folder, which setup.py installs under
    that name. A checkout used without installing it (e.g. ``PYTHONPATH=. python bench/...`` on a
    GPU machine with its own PyTorch) has nothing that maps it, so the folder is registered as
    that subpackage here. Installed (also editable) copies are left alone, unless an editable install of
    another tree maps it while this package is a checkout with its own ``kernels/`` (a second worktree
    on ``PYTHONPATH``): this checkout's kernels then serve, not the other tree's."""
    import importlib.util
    import os
    import sys

    name = __name__ + ".kernels"
    here = os.path.dirname(os.path.abspath(__file__))
    folder = os.path.join(os.path.dirname(here), "kernels")
    if name in sys.modules or not os.path.isfile(os.path.join(folder, "__init__.py")):
        return
    spec = importlib.util.find_spec(name)
    # a checkout of this project (setup.py beside it, its kernels/ has the dispatcher), not a site-packages
    # folder that happens to hold another package named kernels
    checkout = all(os.path.isfile(p) for p in (os.path.join(os.path.dirname(here), "setup.py"),
                                                os.path.join(folder, "dispatch.py")))
    if spec is not None and (not checkout or spec.origin is None
                             or os.path.realpath(os.path.dirname(spec.origin)) == os.path.realpath(folder)):
        return
    spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                  submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    globals()["kernels"] = module


_kernels_of_a_source_checkout()


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pacs_fast' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
