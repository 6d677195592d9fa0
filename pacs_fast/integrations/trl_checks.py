"""Checks of a TRL setup for PACS, made before TRL loads anything (:mod:`pacs_fast.integrations.trl`): groups that
a micro-batch could split, options PACS does not support, reward functions whose rewards cannot be PACS's label.
Imports nothing from TRL (they read the config's fields).
"""
from __future__ import annotations

import warnings

import torch

from pacs_fast.algorithms.pacs import GROUP_SCORES


def check_group_settings(args) -> None:
    """Raises ValueError naming the TRL arguments when micro-batches could split a group, or when
    an option PACS does not support is set."""
    G = args.num_generations
    if args.per_device_train_batch_size % G:
        raise ValueError(
            f"PACS needs whole groups in every micro-batch: per_device_train_batch_size="
            f"{args.per_device_train_batch_size} is not a multiple of num_generations={G} (a PACS "
            f"score couples the {G} completions of a prompt); use e.g. "
            f"per_device_train_batch_size={G * max(1, args.per_device_train_batch_size // G)}")
    if args.score in GROUP_SCORES and G < 2:
        raise ValueError(f"PACS score={args.score!r} needs num_generations >= 2, got {G}")
    Ge = args.num_generations_eval
    if Ge is not None or args.eval_strategy != "no":  # a set value is checked whatever eval_strategy says:
        # trainer.evaluate() runs with eval_strategy="no" too (it had let num_generations_eval=1 or 3 through)
        if Ge is not None and (isinstance(Ge, bool) or not isinstance(Ge, int) or Ge < 1):
            raise ValueError(f"PACS: num_generations_eval must be a whole number >= 1 (the responses per prompt "
                             f"that form a group in evaluation) or None (num_generations), got {Ge!r}")
        named = f"num_generations_eval={Ge}" if Ge is not None else f"num_generations={G} (num_generations_eval unset)"
        Ge = Ge or G
        if args.per_device_eval_batch_size % Ge:
            raise ValueError(f"PACS evaluation needs whole groups: per_device_eval_batch_size="
                             f"{args.per_device_eval_batch_size} is not a multiple of {named}")
        if args.score in GROUP_SCORES and Ge < 2:
            raise ValueError(f"PACS score={args.score!r} needs num_generations_eval >= 2 (it compares a response with "
                             f"its group mates in evaluation too), got {named}")
    if getattr(args, "use_vllm", False) and getattr(args, "vllm_importance_sampling_correction", False):
        mode = getattr(args, "vllm_importance_sampling_mode", "sequence_mask")
        if str(mode).startswith("token"):
            raise ValueError(f"PACS: vllm_importance_sampling_mode={mode!r} weights each token, which has no meaning "
                             "in PACS's per-sequence BCE (a sequence's weight is the product of its token ratios): use "
                             "'sequence_mask' (TRL's default) or 'sequence_truncate', or "
                             "vllm_importance_sampling_correction=False")
        if args.pacs_backend == "triton":
            raise ValueError("PACS: pacs_backend='triton' takes no per-sample factor, and vLLM's importance-sampling "
                             "correction (vllm_importance_sampling_correction=True) weighs each sample: use "
                             "pacs_backend='auto', or vllm_importance_sampling_correction=False")
    if args.sync_ref_model:
        raise ValueError("PACS: sync_ref_model is not supported: PACS loads no reference model (its reference is "
                         "the rollout policy's log-probs); leave sync_ref_model=False")
    if args.top_entropy_quantile < 1.0:
        raise ValueError("PACS: top_entropy_quantile < 1 is not supported (the PACS loss is per sequence)")
    if args.off_policy_mask_threshold is not None:
        raise ValueError("PACS: off_policy_mask_threshold is not supported")
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        raise ValueError("PACS: entropy_coef / use_adaptive_entropy are not supported")


def check_reward_funcs(reward_funcs, weights) -> None:
    """Before TRL loads anything: a reward model (a path or a ``PreTrainedModel``: TRL scores with its raw logit,
    unbounded) is refused, and weights whose positive part sums past 1 warn (functions in [0, 1] can then give a
    weighted reward above 1, which stops the run at that step). PACS's label must lie in [0, 1]."""
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    for i, f in enumerate(funcs):
        if isinstance(f, (str, torch.nn.Module)):
            what = f"the reward model {f!r}" if isinstance(f, str) else f"a reward model ({type(f).__name__})"
            raise ValueError(f"PACSTrainer: reward_funcs[{i}] is {what}, whose scores are unbounded logits; PACS "
                             "needs rewards in [0, 1] (the verifier's label): pass a function that returns "
                             "sigmoid(score) of the model, or a 0/1 verdict")
    given = weights is not None
    weights = list(weights) if given else [1.0] * len(funcs)  # (TRL's default: 1 each)
    total = sum(max(float(w), 0.0) for w in weights)
    if total > 1 + 1e-5:  # (without reward_weights, several functions warned nothing and the run stopped at step 1)
        named = f"reward_weights={weights}" if given else f"{len(funcs)} reward functions with TRL's default weights 1"
        warnings.warn(f"PACSTrainer: {named} sum to {total:g}: reward functions in [0, 1] can then give a weighted "
                      "reward above 1, which PACS refuses at the step it happens; give reward_weights that sum "
                      "to 1", stacklevel=3)
    if any(float(w) < 0 for w in weights):
        warnings.warn(f"PACSTrainer: reward_weights={weights} hold a negative weight: reward functions in [0, 1] can "
                      "then give a weighted reward below 0, which PACS refuses at the step it happens", stacklevel=3)
