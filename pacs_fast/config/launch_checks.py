"""The checks of a config that depend on the launch (``torchrun``'s processes): the learner's tensor- and
data-parallel layout, the asynchronous engines' ranks; each a ValueError naming the key, on one line
(:func:`pacs_fast.config.validate` runs them with the rest)."""
from __future__ import annotations

import os

from pacs_fast.config.schema import Config


def world_size() -> int:
    """Number of processes of the launch (torchrun's ``WORLD_SIZE``; 1 for a plain ``python -m``; in an
    asynchronous launch, whose roles set ``WORLD_SIZE`` to their own, the launch's as it was)."""
    raw = os.environ.get("PACS_FAST_LAUNCH_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable WORLD_SIZE={raw!r} is not an integer") from None


def validate_parallel(cfg: Config, world: int) -> None:
    """Process layout: ``world = learner.tp_size x dp``; each data-parallel rank trains an equal
    share of the whole groups of every mini-batch (as :class:`MegatronLearner` splits them)."""
    tp = cfg.learner.tp_size
    if world < 1:
        raise ValueError(f"the number of processes (WORLD_SIZE) must be >= 1, got {world}")
    if cfg.learner.backend == "torch":
        if world > 1:
            raise ValueError(f"learner.backend=torch runs in one process, but this launch has {world} "
                             f"(WORLD_SIZE); use learner.backend=megatron under torchrun, or run plain python")
        if tp != 1:
            raise ValueError(f"learner.tp_size={tp} needs learner.backend=megatron (the torch learner is "
                             f"one process)")
        return
    if world % tp:
        where = (f"the learner's processes ({world}: torchrun's processes less rollout.ranks)" if cfg.rollout.ranks
                 else f"the number of processes ({world}, torchrun's --nproc_per_node x nodes)")
        raise ValueError(f"learner.tp_size={tp} must divide {where}: world = tp_size x data-parallel size")
    dp = world // tp
    mini = cfg.learner.mini_batch_prompts
    if mini % dp:
        raise ValueError(f"learner.mini_batch_prompts={mini} must be a multiple of the data-parallel size {dp} "
                         f"(= {world} processes / learner.tp_size={tp}): every data-parallel rank trains an "
                         f"equal share of whole groups")


def validate_async(cfg: Config, world: int) -> None:
    """rollout.ranks / rollout.max_staleness / rollout.tp_size: engines on their own processes."""
    R, K, T = cfg.rollout.ranks, cfg.rollout.max_staleness, cfg.rollout.tp_size
    if cfg.rollout.max_gen_batches < 1:
        raise ValueError(f"rollout.max_gen_batches must be >= 1, got {cfg.rollout.max_gen_batches}")
    if R < 0 or K < 0:
        raise ValueError(f"rollout.ranks and rollout.max_staleness must be >= 0, got {R} and {K}")
    if T < 1:
        raise ValueError(f"rollout.tp_size must be >= 1, got {T}")
    if K and not R:
        raise ValueError(f"rollout.max_staleness={K} needs rollout.ranks >= 1 (engines on their own processes: "
                         f"torchrun --nproc_per_node R+1 -m pacs_fast.train rollout.ranks=R ...)")
    if K > max(cfg.train.steps, 1):  # (K + 1 batches are generated before step 1 trains: 1,000 asked for 1,001)
        raise ValueError(f"rollout.max_staleness={K} is more than train.steps={cfg.train.steps}: the engines would "
                         f"generate {K + 1} batches before step 1 trains, {K + 1 - cfg.train.steps} of them past the "
                         f"run's last step; give rollout.max_staleness <= train.steps")
    if not R:
        if T != 1:
            raise ValueError(f"rollout.tp_size={T} applies with rollout.ranks (engines on their own processes); "
                             "colocated vLLM engines take learner.tp_size")
        return
    if world <= R:
        raise ValueError(f"rollout.ranks={R} needs more than {R} processes ({R} for the engines, at least 1 for the "
                         f"learner); this launch has {world} (WORLD_SIZE): torchrun --nproc_per_node {R + 1}")
    if cfg.learner.backend == "torch" and world != R + 1:
        raise ValueError(f"rollout.ranks={R} with learner.backend=torch needs {R + 1} processes (the learner is one "
                         f"process), this launch has {world} (WORLD_SIZE): torchrun --nproc_per_node {R + 1}, or "
                         f"learner.backend=megatron for a learner on several")
    if T > 1 and cfg.rollout.engine != "vllm":
        raise ValueError(f"rollout.tp_size={T} needs rollout.engine=vllm (an HF engine is one process)")
    if R % T:
        raise ValueError(f"rollout.ranks={R} must be a multiple of rollout.tp_size={T} (one engine per {T} processes)")
    engines = R // T
    if cfg.train.prompts_per_step % engines:
        raise ValueError(f"train.prompts_per_step={cfg.train.prompts_per_step} must be a multiple of the number of "
                         f"engines (rollout.ranks / rollout.tp_size = {engines}): each generates an equal share")


def launch_problem(cfg: Config, world: int) -> str | None:
    """Why a launch of ``world`` processes cannot run ``cfg`` (its tensor-parallel size, asynchronous engine
    ranks, data-parallel batches), or None: :func:`validate`'s checks that depend on the launch, no others."""
    try:
        validate_async(cfg, world)
        validate_parallel(cfg, world - cfg.rollout.ranks if cfg.rollout.ranks else world)
    except ValueError as e:
        return str(e)
    return None
