"""Colocated vLLM engines on every rank of a torchrun launch (one engine per tensor-parallel group),
and the shard-local weight sync from a tensor-parallel learner into them.

Layout. With ``world = tp * dp`` processes, both vLLM (``distributed_executor_backend=
"external_launcher"``, with or without ``data_parallel_size=dp``) and megatron-core (default order) put tensor
parallelism innermost: global rank ``r`` has ``tp_rank = r % tp`` and ``dp_rank = r // tp``; a TP
group is ``tp`` consecutive ranks, a DP group every ``tp``-th rank. :func:`check_layout` asserts that
vLLM's (and, when initialised, megatron's) groups are exactly these, so one TP group of the learner
hosts one engine and engine TP = learner TP.

Contract (every rank of the launch):

- Build ``VLLMEngine(path, **colocated_engine_kwargs(tp, dp), ...)`` on every rank after the learner
  (the process group exists then; vLLM reuses it).
- ``engine.generate(prompts, params)`` and ``engine.score(seqs)`` are collective over the TP group
  (default, independent engines) -- and over the world with ``lockstep=True``, where vLLM's
  data-parallel engines step together: then every rank calls them the same number of times, in the
  same order. The ranks of one TP group pass identical prompts and seeds (their DP group's share,
  :func:`dp_share`); each DP group passes its own; each call returns that DP group's completions on
  every rank of the group. An empty share is allowed (in lock-step mode the rank still joins).
- Seeds: pass ``params.seed = seed + offset * n`` where ``offset`` is the index of the group's first
  prompt in the step's list (:func:`dp_share` returns it); prompt ``i`` then gets the same seed as in
  a single engine generating the whole list, so rollouts do not depend on ``dp``.
- :func:`sync_colocated(engine, learner)` after each update (collective over the world): checks
  every name and shape against the engine *before* anything is gathered (all ranks raise together
  on a mismatch, the engine untouched), then streams buckets of whole layers gathered inside each TP
  group, cast to the engine dtype, into the engine's reload path, then resets its prefix cache.
- CUDA: build the engine with sleep mode (the default there) and call ``engine.sleep()`` after the
  rollout: level 1 frees the KV cache (and offloads the weights) while the learner works; the sync
  wakes the weights only, the next ``generate`` the KV cache. (Not runnable on the CPU test machines:
  vLLM's CPU worker has no sleep mode, so both calls are no-ops there.)
- ``engine.close()`` last: under ``external_launcher`` vLLM's shutdown destroys the default process
  group, so every collective of the learner / trainer must be done before it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from pacs_fast.collective import collective_check


@dataclass(frozen=True)
class EngineLayout:
    """Where this process sits: ``rank = dp_rank * tp_size + tp_rank``."""

    rank: int
    world: int
    tp_rank: int
    tp_size: int
    dp_rank: int
    dp_size: int

    def tp_group_ranks(self) -> list[int]:
        return [self.dp_rank * self.tp_size + t for t in range(self.tp_size)]

    def dp_group_ranks(self) -> list[int]:
        return [d * self.tp_size + self.tp_rank for d in range(self.dp_size)]


def engine_layout(tp_size: int) -> EngineLayout:
    """This process's ``(tp_rank, dp_rank, dp_size)`` for ``tp_size`` in the current process group
    (a 1-process layout when ``torch.distributed`` is not initialised)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if tp_size < 1 or world % tp_size:
        raise ValueError(f"tensor_parallel_size={tp_size} must divide the number of processes ({world})")
    return EngineLayout(rank, world, rank % tp_size, tp_size, rank // tp_size, world // tp_size)


def colocated_engine_kwargs(tp_size: int, dp_size: int, *, lockstep: bool = False) -> dict:
    """``vllm.LLM`` keyword arguments for one engine per TP group inside the torchrun processes.

    Default: independent engines (vLLM's "external data parallelism": no ``data_parallel_size``; each
    TP group's engine runs on its own, ``generate`` is collective over the TP group only).
    ``lockstep=True``: vLLM's own data parallelism (``data_parallel_size=dp``): the DP engines step
    together (one all-reduce per step, dummy steps for a group that finished), so every call is
    collective over the world; measured slower on CPU (bench/README.md), kept as an option."""
    kw = {"tensor_parallel_size": int(tp_size), "distributed_executor_backend": "external_launcher"}
    if lockstep:
        kw["data_parallel_size"] = int(dp_size)
    return kw


def check_layout(tp_size: int) -> EngineLayout:
    """Asserts that vLLM's TP / DP groups (and megatron's, when initialised) are those of
    :class:`EngineLayout`; returns it. ValueError naming both layouts otherwise."""
    import sys

    layout = engine_layout(tp_size)
    want = {"tp": layout.tp_group_ranks(), "dp": layout.dp_group_ranks()}
    from vllm.distributed import parallel_state as vps

    got = {"tp": list(vps.get_tp_group().ranks), "dp": list(vps.get_dp_group().ranks)}
    if got["dp"] == [layout.rank] and got["tp"] == want["tp"]:
        got["dp"] = want["dp"]  # vLLM's "external DP": independent engines, no data_parallel_size given
    if got != want:
        raise ValueError(f"vLLM's rank layout {got} on rank {layout.rank} is not the expected {want} "
                         "(tensor-parallel innermost); engine TP must equal learner TP")
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is not None and ps.model_parallel_is_initialized():
        mg = {"tp": dist.get_process_group_ranks(ps.get_tensor_model_parallel_group()),
              "dp": dist.get_process_group_ranks(ps.get_data_parallel_group())}
        if mg != want:
            raise ValueError(f"megatron's rank layout {mg} on rank {layout.rank} differs from vLLM's {want}: "
                             "the engine's TP groups would not be the learner's (use the same tp size and "
                             "megatron's default order)")
    return layout


def dp_share(items: Sequence, dp_rank: int, dp_size: int) -> tuple[list, int]:
    """DP group ``dp_rank``'s contiguous, equal share of ``items`` and the index of its first item.
    ``len(items)`` must divide by ``dp_size`` (every group the same number of optimiser steps)."""
    if len(items) % dp_size:
        raise ValueError(f"{len(items)} prompts cannot be shared evenly by {dp_size} data-parallel groups")
    k = len(items) // dp_size
    return list(items[dp_rank * k:(dp_rank + 1) * k]), dp_rank * k


def check_manifest(engine, manifest) -> None:
    """ValueError naming the tensor unless ``manifest`` (``[(hf_name, shape)]``) is exactly the
    engine's checkpoint (every name known, every shape equal, nothing missing). Nothing is sent."""
    from pacs_fast.rollout.weight_sync import prepare

    spec = engine.weight_spec
    pairs = [(n, torch.empty(tuple(s), device="meta")) for n, s in manifest]
    prepare(pairs, spec)  # unknown name, wrong shape, duplicate, partial layer
    missing = set(spec.shapes) - {n for n, _ in manifest}
    if missing:
        raise ValueError(f"weight sync: the learner has no tensor for {sorted(missing)[:4]} of the engine's checkpoint")


def sync_colocated(engine, learner, *, bucket_bytes: int | None = None) -> dict:
    """Loads the learner's weights into this rank's colocated engine, a bucket of layers at a time.

    Collective over the world (every rank calls it). ``learner`` needs ``hf_weight_manifest()`` and
    ``iter_hf_weight_buckets(bucket_bytes, dtype=...)`` (the megatron learner has both). Returns the
    engine's sync statistics plus ``check_seconds`` and ``seconds`` (wall time of the whole sync).
    """
    start = time.perf_counter()
    bucket_bytes = int(bucket_bytes or engine.sync_bucket_bytes)
    error = None
    try:
        check_manifest(engine, learner.hf_weight_manifest())
    except ValueError as e:
        error = f"weight sync refused before the engine was touched: {e}"
    collective_check(error)
    checked = time.perf_counter()
    stats = engine.load_weight_buckets(learner.iter_hf_weight_buckets(bucket_bytes, dtype=engine.dtype))
    stats = dict(stats, check_seconds=checked - start, seconds=time.perf_counter() - start)
    return stats
