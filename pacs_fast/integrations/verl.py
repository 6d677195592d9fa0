"""PACS in verl: an advantage estimator and a policy loss, both named ``"pacs"``, registered in
verl's registries (``verl.trainer.ppo.core_algos``) when this module is imported.

Written against verl 0.9.1 (``SUPPORTED_VERL``). Make every verl process import it with
``VERL_USE_EXTERNAL_MODULES=pacs_fast.integrations.verl`` (verl imports the listed modules when it
is imported itself, in the driver and in every Ray worker), then set::

    algorithm.adv_estimator=pacs  algorithm.use_kl_in_reward=False
    actor_rollout_ref.actor.policy_loss.loss_mode=pacs  actor_rollout_ref.actor.use_kl_loss=False
    actor_rollout_ref.actor.shuffle=False  actor_rollout_ref.actor.use_dynamic_bsz=False
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=<multiple of rollout.n>
    trainer.balance_batch=False
    data.train_batch_size=<multiple of the actor's data-parallel size: GPUs over its model parallelism>
    actor_rollout_ref.actor.ppo_mini_batch_size=<multiple of the actor's data-parallel size>

How the data gets through. verl's policy-loss hook receives per-token tensors only
(``old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
rollout_is_weights``). The ``"pacs"`` estimator writes the sequence reward ``R_i`` (the sum of
``token_level_rewards``) and a group tag into ``advantages`` (``R_i + 2 * (1 + group mod 127)`` on
response tokens, mod 15 with soft rewards; see ``pacs_fast.integrations._groups``); the ``"pacs"`` loss reads
them back, checks that the micro-batch holds whole groups of ``rollout.n`` contiguous responses (``uid``
runs), and computes ``pacs_fast.pacs_loss`` with ``old_log_prob`` (the rollout policy's
recomputed log-probs) as the reference: PACS ``ref="rollout"``, as in the paper's verl code.

Scaling: the PACS loss is a mean over sequences; with verl's global batch info it is scaled as
verl's ``seq-mean`` modes are (``sum_i loss_i / global_batch_size * dp_size``), so micro-batches
and data-parallel ranks add up to the mean over the mini-batch. ``loss_agg_mode`` is not used.

Options (beta, score, weight_mode, proxy): ``"pacs"`` uses the paper's defaults
(``PACS_DEFAULTS``); ``register_pacs_loss("pacs_grpo", score="grpo")`` registers a variant under
another name, from a module of yours listed in ``VERL_USE_EXTERNAL_MODULES``.

Rollout correction: sequence-level importance sampling (``algorithm.rollout_correction.rollout_is='sequence'``,
verl's truncated or IcePop weights pi_old / pi_rollout) weighs each sample's BCE term (a masked sample keeps its place
in its group's score and in the mean's count, as in verl's own losses). Not supported: token-level weights,
rejection sampling and bypass mode (``check_config`` and the loss say so), dynamic batch sizes, shuffled
mini-batches, a KL term in the reward (they change or split groups).
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

try:
    import verl
    from verl.trainer.ppo import core_algos
except ImportError as e:  # pragma: no cover - depends on the environment
    # no repository path in the message: an installed pacs_fast has no docs/ (requirements/nodeps.txt: CI's set)
    raise ImportError(f"pacs_fast.integrations.verl needs verl's core_algos (tested with verl==0.9.1): {e}; "
                      "CI installs verl==0.9.1 with --no-deps and what core_algos imports (ray, tensordict, "
                      "omegaconf, codetiming, orjson, msgpack, pyvers)") from e

from pacs_fast.algorithms.pacs import GROUP_SCORES, PROXIES, SCORES, WEIGHT_MODES, pacs_loss
from pacs_fast.integrations._groups import (
    check_beta,
    check_whole_groups,
    decode_tagged_advantages,
    encode_tagged_advantages,
    pacs_metrics,
)

SUPPORTED_VERL = "0.9"
PACS_DEFAULTS = {"beta": 1.0, "score": "rloo", "weight_mode": "question", "proxy": "logratio"}

__all__ = ["PACS_DEFAULTS", "SUPPORTED_VERL", "check_config", "compute_pacs_advantage",
           "compute_policy_loss_pacs", "register_pacs_loss"]

if not getattr(verl, "__version__", "").startswith(SUPPORTED_VERL + "."):
    warnings.warn(f"pacs_fast.integrations.verl was written for verl {SUPPORTED_VERL}.x; found "
                  f"{getattr(verl, '__version__', 'unknown')}", stacklevel=2)

_FIX = ("keep each prompt's rollout.n responses contiguous and whole: "
        "actor_rollout_ref.actor.shuffle=False, actor_rollout_ref.actor.use_dynamic_bsz=False, "
        "trainer.balance_batch=False, actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu a multiple "
        "of actor_rollout_ref.rollout.n, data.train_batch_size and actor_rollout_ref.actor.ppo_mini_batch_size "
        "(prompts) multiples of the actor's data-parallel size, algorithm.adv_estimator=pacs")


def _get(cfg, dotted: str, default=None):
    cur = cfg
    for part in dotted.split("."):
        if cur is None:
            return default
        cur = cur.get(part, None) if hasattr(cur, "get") else getattr(cur, part, None)
    return default if cur is None else cur


def check_config(config, loss_name: str = "pacs") -> None:
    """Start-time check of a full verl trainer config (the Hydra/OmegaConf tree or a dict):
    raises one ValueError listing every setting that would split groups or change the loss. A key the config
    does not hold counts as verl's default (``trainer.balance_batch``: True, so it must be given as False)."""
    n = _whole_number(_get(config, "actor_rollout_ref.rollout.n"), "actor_rollout_ref.rollout.n")
    actor = "actor_rollout_ref.actor."
    problems = []
    if _get(config, "algorithm.adv_estimator") != "pacs":
        problems.append("algorithm.adv_estimator must be 'pacs'")
    if _get(config, actor + "policy_loss.loss_mode") != loss_name:
        problems.append(f"{actor}policy_loss.loss_mode must be {loss_name!r}")
    if n is None or int(n) < 2:
        problems.append(f"actor_rollout_ref.rollout.n must be >= 2 (got {n})")
    if float(_get(config, actor + "entropy_coeff", 0.0) or 0.0) != 0.0:
        problems.append(f"{actor}entropy_coeff must be 0 (an entropy bonus is a term PACS does not have)")
    for key, default in (("algorithm.use_kl_in_reward", False), (actor + "shuffle", False),
                         (actor + "use_dynamic_bsz", False), ("trainer.balance_batch", True),
                         (actor + "use_kl_loss", False)):
        if bool(_get(config, key, default)):
            problems.append(f"{key} must be False" + (" (verl's default is True)" if default else "")
                            + (" (a KL loss to verl's reference model is a term PACS does not have)"
                               if key.endswith("use_kl_loss") else ""))
    correction = _get(config, "algorithm.rollout_correction")
    if correction is not None and (_get(correction, "rollout_is") not in (None, "sequence")
                                   or _get(correction, "rollout_rs") or _get(correction, "bypass_mode", False)):
        problems.append("algorithm.rollout_correction must be off or sequence-level importance sampling alone "
                        "(rollout_is null or 'sequence', rollout_rs null, bypass_mode false): a token weight means "
                        "nothing in PACS's per-sequence BCE, rejection masks tokens out of its log-ratio, and bypass "
                        "mode puts the rollout engine's log-probs in its reference")
    micro = _get(config, actor + "ppo_micro_batch_size_per_gpu")
    if n and (micro is None or int(micro) % int(n)):
        old = _get(config, actor + "ppo_micro_batch_size")  # (verl's deprecated global size: not what it splits by)
        also = (f" (the deprecated {actor}ppo_micro_batch_size={old} is a global size the check does not read: "
                f"give the per-GPU one)" if micro is None and old is not None else "")
        problems.append(f"{actor}ppo_micro_batch_size_per_gpu ({micro}) must be a multiple of "
                        f"actor_rollout_ref.rollout.n ({n}){also}")
    # verl hands each data-parallel rank one contiguous equal chunk of the batch (DataProto.chunk /
    # chunk_tensordict, under the dispatch of update_actor): train_batch_size * n rows / dp each, and each rank
    # cuts its chunk into mini-batches of ppo_mini_batch_size * n / dp rows (engine_workers.train_mini_batch).
    # Both hold whole groups of n exactly when the prompt counts are multiples of dp: verl itself asks only that
    # the row counts be (6 prompts x n=4 on 8 ranks: 3 rows each, groups cut across ranks).
    dp = _actor_dp_size(config, actor)
    if dp:
        for key in ("data.train_batch_size", actor + "ppo_mini_batch_size"):
            size = _whole_number(_get(config, key), key)
            if size is not None and size % dp:
                problems.append(f"{key} ({size} prompts) must be a multiple of the actor's data-parallel size ({dp}: "
                                f"trainer.nnodes x trainer.n_gpus_per_node over its model parallelism): verl splits "
                                f"the batch into equal contiguous parts per data-parallel rank, which would cut a "
                                f"prompt's group")
    if problems:
        raise ValueError("PACS in verl: " + "; ".join(problems))


def _actor_dp_size(config, actor: str) -> int | None:
    """The actor's data-parallel size as verl derives it: the GPUs (``trainer.nnodes x trainer.n_gpus_per_node``)
    over its model parallelism (megatron: tensor x pipeline x context parallel sizes; FSDP: the Ulysses sequence
    parallel size). None where the config lacks the GPU counts."""
    nnodes, gpus = _get(config, "trainer.nnodes"), _get(config, "trainer.n_gpus_per_node")
    if nnodes is None or gpus is None:
        return None
    world = _whole_number(nnodes, "trainer.nnodes") * _whole_number(gpus, "trainer.n_gpus_per_node")
    strategy = str(_get(config, actor + "strategy", "fsdp"))
    if strategy == "megatron":
        keys = [f"{actor}megatron.{k}_parallel_size" for k in ("tensor_model", "pipeline_model", "context")]
    elif strategy in ("fsdp", "fsdp2"):  # verl 0.9 reads fsdp_config's; the actor's own (deprecated) wins when > 1
        key = actor + "ulysses_sequence_parallel_size"
        if (_whole_number(_get(config, key, 1), key) or 1) <= 1:
            key = actor + "fsdp_config.ulysses_sequence_parallel_size"
        keys = [key]
    else:  # (veomni, torchtitan: parallel layouts of their own, not read here: no check rather than a wrong one)
        return None
    split = 1
    for key in keys:
        split *= _whole_number(_get(config, key, 1), key) or 1
    return world // split if world % split == 0 else None  # (verl refuses sizes that do not divide)


def _whole_number(value, key: str):
    """``value`` (None, or a count verl read from YAML: an int, or a float / string holding one) as an int; a ValueError
    naming ``key`` otherwise (2.5 had been truncated to 2, "four" raised int()'s own error)."""
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if isinstance(value, bool) or not math.isfinite(number) or number != int(number):
        raise ValueError(f"PACS in verl: {key} must be a whole number, got {value!r}")
    return int(number)


def _check_actor_config(config, score: str) -> int:
    """The settings visible to the loss (an ActorConfig); returns the group size rollout.n. verl's ``ppo_loss`` adds
    an entropy bonus (``entropy_coeff``) and a KL loss (``use_kl_loss``) to what the policy loss returns: both are
    refused here, at every call (the documented ``main_ppo`` command need not call :func:`check_config`)."""
    if config is None:
        raise ValueError("PACS policy loss: verl passed no actor config (needs rollout_n)")
    n = _whole_number(_get(config, "rollout_n"), "actor_rollout_ref.rollout.n")
    if n is None or int(n) < 1:
        raise ValueError("PACS policy loss: actor config has no rollout_n")
    if int(n) < 2 and score in GROUP_SCORES:
        raise ValueError(f"PACS policy loss: actor_rollout_ref.rollout.n={n}, but score={score!r} compares a response "
                         f"with its group mates: set actor_rollout_ref.rollout.n >= 2")
    if _get(config, "use_kl_loss", False):
        raise ValueError("PACS policy loss: actor_rollout_ref.actor.use_kl_loss must be False (verl adds a KL loss "
                         "to verl's reference model, a term PACS does not have)")
    if float(_get(config, "entropy_coeff", 0.0) or 0.0) != 0.0:
        raise ValueError(f"PACS policy loss: actor_rollout_ref.actor.entropy_coeff must be 0 (got "
                         f"{_get(config, 'entropy_coeff')}: verl adds an entropy bonus, a term PACS does not have)")
    if _get(config, "use_dynamic_bsz", False):
        raise ValueError("PACS policy loss: actor_rollout_ref.actor.use_dynamic_bsz must be False; " + _FIX)
    if _get(config, "shuffle", False):
        raise ValueError("PACS policy loss: actor_rollout_ref.actor.shuffle must be False; " + _FIX)
    micro = _get(config, "ppo_micro_batch_size_per_gpu")
    if micro is not None and int(micro) % int(n):
        raise ValueError(f"PACS policy loss: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro} "
                         f"is not a multiple of rollout.n={n}; " + _FIX)
    return int(n)


@core_algos.register_adv_est("pacs")
def compute_pacs_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                           index: np.ndarray | None = None, config=None, **kwargs):
    """verl advantage estimator ``"pacs"``: passes the sequence reward and the group through.

    Args:
        token_level_rewards: ``[B, T]``; ``R_i`` is the row sum, in [0, 1].
        response_mask: ``[B, T]``.
        index: ``[B]`` prompt uids (verl's ``uid``); rows of one prompt must be contiguous.
    Returns:
        ``(advantages, returns)``, both ``[B, T]`` fp32 ``R_i + 2 * (1 + group mod 127)`` on response tokens
        (mod 15 with soft rewards; to be read by the ``"pacs"`` policy loss, not a real advantage).
    """
    if index is None:
        raise ValueError("PACS advantage estimator: verl passed no prompt uid (data.non_tensor_batch['uid'])")
    if config is not None and bool(_get(config, "use_kl_in_reward", False)):
        raise ValueError("PACS advantage estimator: algorithm.use_kl_in_reward must be False "
                         "(PACS needs the verifier's reward in [0, 1])")
    uid = np.asarray(index)
    if uid.ndim != 1 or uid.shape[0] != token_level_rewards.shape[0]:
        raise ValueError(f"PACS advantage estimator: the prompt uids (data.non_tensor_batch['uid']) must be one "
                         f"hashable id per row, shape [{token_level_rewards.shape[0]}]; got shape {tuple(uid.shape)}")
    starts = np.concatenate([[True], uid[1:] != uid[:-1]])
    run = np.cumsum(starts) - 1
    if len(set(uid[starts].tolist())) != int(starts.sum()):
        raise ValueError("PACS advantage estimator: the responses of a prompt (uid) are not contiguous "
                         "in the batch; " + _FIX)
    sizes = np.bincount(run)
    if sizes.min() != sizes.max():
        raise ValueError(f"PACS advantage estimator: groups of different sizes {sorted(set(sizes.tolist()))}; "
                         "every prompt needs rollout.n responses")
    rewards = token_level_rewards.detach().sum(dim=-1)
    adv = encode_tagged_advantages(rewards, torch.as_tensor(run, device=rewards.device), response_mask)
    return adv, adv.clone()


def sequence_weights(rollout_is_weights: torch.Tensor | None, response_mask: torch.Tensor) -> torch.Tensor | None:
    """verl's ``rollout_is_weights`` (``[B, T]``; ``algorithm.rollout_correction.rollout_is='sequence'``: each row's
    truncated or IcePop-masked ratio pi_old / pi_rollout, the same on all its response tokens) as PACS's ``[B]``
    sample weights (docs/OFF_POLICY.md: a sequence-level BCE takes the sequence ratio); None without them. Weights
    that vary along a row (``rollout_is='token'``) are a ValueError naming the setting."""
    if rollout_is_weights is None:
        return None
    m = response_mask.bool()
    w = rollout_is_weights.detach().to(torch.float64)
    big = torch.finfo(torch.float64).max
    hi, lo = torch.where(m, w, -big).amax(dim=-1), torch.where(m, w, big).amin(dim=-1)
    if bool((hi != lo).any()):
        row = int((hi != lo).nonzero()[0, 0])
        raise ValueError(f"PACS policy loss: the rollout-correction weights vary along row {row} (token-level "
                         "importance sampling, algorithm.rollout_correction.rollout_is='token'), which means nothing in "
                         "PACS's per-sequence BCE: set rollout_is='sequence' (or null)")
    return hi


def _pacs_policy_loss(options: dict):
    def compute_policy_loss_pacs(old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                                 advantages: torch.Tensor, response_mask: torch.Tensor,
                                 loss_agg_mode: str = "token-mean", config=None,
                                 rollout_is_weights: torch.Tensor | None = None,
                                 ) -> tuple[torch.Tensor, dict[str, Any]]:
        """verl policy loss: PACS on one micro-batch (``[B, T]`` tensors, whole groups)."""
        G = _check_actor_config(config, options["score"])
        rewards, tags = decode_tagged_advantages(advantages, response_mask, _FIX)
        check_whole_groups(tags, G, _FIX)
        weights = sequence_weights(rollout_is_weights, response_mask)
        weights = None if weights is None else weights.to(device=log_prob.device, dtype=log_prob.dtype)
        loss, terms = pacs_loss(log_prob, old_log_prob, response_mask, rewards.to(log_prob.device),
                                group_size=G, return_terms=True, sample_weights=weights, **options)
        metrics = {f"actor/{k}": v for k, v in pacs_metrics(terms, rewards).items()}
        metrics["actor/pacs/loss"] = float(loss.detach())  # the micro-batch's mean (verl averages over them)
        info = _get(config, "global_batch_info", None) or {}
        global_batch_size = info.get("global_batch_size")
        if global_batch_size is not None:
            loss = loss * (log_prob.shape[0] / float(global_batch_size) * float(info.get("dp_size", 1)))
        return loss, metrics

    return compute_policy_loss_pacs


def register_pacs_loss(name: str = "pacs", **options) -> Any:
    """Registers a PACS policy loss under ``name`` with ``options`` (beta, score, weight_mode,
    proxy; the rest from ``PACS_DEFAULTS``) and returns it."""
    unknown = set(options) - set(PACS_DEFAULTS)
    if unknown:
        raise ValueError(f"register_pacs_loss: unknown options {sorted(unknown)}; known: {sorted(PACS_DEFAULTS)}")
    merged = {**PACS_DEFAULTS, **options}
    merged["beta"] = check_beta(merged["beta"], "register_pacs_loss")
    for key, allowed in (("score", SCORES), ("weight_mode", WEIGHT_MODES), ("proxy", PROXIES)):
        if merged[key] not in allowed:
            raise ValueError(f"register_pacs_loss: {key} must be one of {allowed}, got {merged[key]!r}")
    fn = _pacs_policy_loss(merged)
    core_algos.register_policy_loss(name)(fn)
    return fn


compute_policy_loss_pacs = register_pacs_loss("pacs")
