"""The processes of a run and the few collectives the trainer loop uses.

A plain ``python -m pacs_fast.train`` is one process (:class:`World` of size 1: every collective
below is a no-op). Under ``torchrun ... learner.backend=megatron learner.tp_size=T`` there are
``T x D`` processes: megatron's parallel state is created here, first, and :class:`World` records
this process's place in it. Rank-specific decisions live here, not in the loop:

- ``world.is_main`` (global rank 0) prints and writes the run folder;
- ``world.share(items)`` is this data-parallel group's contiguous share of a step's prompts (each
  group generates, scores and trains on its own share; the ranks of one tensor-parallel group
  hold the same share; rollouts never travel between ranks, only metrics do);
- ``world.gather(obj)`` / ``world.broadcast(obj)`` move small Python objects (evaluation rewards,
  metrics, decisions) between ranks.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pacs_fast.config import Config


@dataclass
class World:
    """This process's place in the launch. ``tp``/``dp``: tensor- and data-parallel sizes."""

    rank: int = 0
    size: int = 1
    tp: int = 1
    dp: int = 1
    dp_rank: int = 0
    tp_rank: int = 0
    owns_group: bool = False  # whether train() created the process group (then it tears it down)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, items: list) -> tuple[list, int]:
        """This data-parallel group's contiguous, equal share of ``items`` and the index of its
        first item (``len(items)`` divisible by dp: every group takes the same optimiser steps)."""
        if len(items) % self.dp:
            raise ValueError(f"{len(items)} items cannot be split evenly over {self.dp} data-parallel groups")
        k = len(items) // self.dp
        return items[self.dp_rank * k:(self.dp_rank + 1) * k], self.dp_rank * k

    def split(self, items: list) -> tuple[list, int]:
        """Like :meth:`share` for any length (the first ``len % dp`` groups take one more item)."""
        k, extra = divmod(len(items), self.dp)
        start = self.dp_rank * k + min(self.dp_rank, extra)
        return items[start:start + k + (self.dp_rank < extra)], start

    def broadcast(self, obj):
        """Rank 0's ``obj`` on every rank (pickled)."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_dp(self, obj) -> list:
        """``[obj of data-parallel group 0, group 1, ...]`` on every rank (from each group's
        tensor-parallel rank 0; the other ranks of a group hold the same object)."""
        if self.size == 1:
            return [obj]
        every = [None] * self.size
        dist.all_gather_object(every, obj)
        return [every[d * self.tp] for d in range(self.dp)]

    def count(self, flag: bool) -> int:
        """How many ranks have ``flag`` True (every rank gets the count)."""
        if self.size == 1:
            return int(bool(flag))
        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t)
        return int(t.item())

    def reduce_record(self, record: dict, weights: dict[str, str] | None = None) -> dict:
        """One step's metrics over the data-parallel groups (each computed on its own, equal share):
        ``perf/*`` throughputs and ``learner/forward/*`` counts (forwards, token slots) add up, ``time/*``
        take the slowest group, ``*_max`` / ``*_min`` the largest / smallest, the rest the mean (a value
        every group computed alike, e.g. from gathered rows, stays as it is). A statistic that is none of
        these (a standard deviation, a mean over a subset of rows) must be computed from every group's
        rows, not reduced here.
        ``weights``: ``{key: weight_key}`` for means over something other than the share (e.g. a
        per-token mean, weighted by each group's token count ``record[weight_key]``), so the result
        is what one process computes on the whole step; the weight keys themselves add up."""
        if self.dp == 1:
            return record
        weights = weights or {}
        parts = self.gather_dp(record)
        out = {}
        for key in record:
            ok = [p for p in parts if isinstance(p.get(key), (int, float)) and p.get(key) == p.get(key)]
            vals = [p[key] for p in ok]
            if not vals:
                out[key] = record[key]
            elif key.startswith(("perf/", "learner/forward/")) or key in weights.values():  # throughputs, counts
                out[key] = float(sum(vals))
            elif key.startswith("time/") or key.endswith("_max"):
                out[key] = float(max(vals))
            elif key.endswith("_min"):
                out[key] = float(min(vals))
            elif key in weights and all(isinstance(p.get(weights[key]), (int, float)) for p in ok) and \
                    sum(p[weights[key]] for p in ok) > 0:
                w = [p[weights[key]] for p in ok]
                out[key] = float(sum(v * x for v, x in zip(vals, w)) / sum(w))
            elif all(v == vals[0] for v in vals):
                out[key] = float(vals[0])
            else:
                out[key] = float(sum(vals) / len(vals))
        return out

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is True on any rank (a collective decision)."""
        if self.size == 1:
            return bool(flag)
        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)


def init_world(cfg: Config) -> World:
    """Creates the process group and megatron's parallel state (``learner.backend=megatron``),
    before anything decides which process writes files. Megatron's layout: the ranks of one
    tensor-parallel group are consecutive (rank = dp_rank * tp + tp_rank)."""
    owns = not (dist.is_available() and dist.is_initialized())  # asynchronous runs: the learner's own world exists
    if cfg.learner.backend == "megatron":
        from pacs_fast.learner.megatron.learner import init_parallel
        init_parallel(cfg.learner.tp_size, device=cfg.model.device)
    if not (dist.is_available() and dist.is_initialized()):
        return World()
    rank, size = dist.get_rank(), dist.get_world_size()
    tp = cfg.learner.tp_size
    return World(rank=rank, size=size, tp=tp, dp=size // tp, dp_rank=rank // tp, tp_rank=rank % tp,
                 owns_group=owns)


def close_world(world: World, learner) -> None:
    """Tears down what :func:`init_world` created (megatron's state and the process group)."""
    if world.owns_group and hasattr(learner, "close"):
        learner.close()
    if world.owns_group and dist.is_available() and dist.is_initialized():  # vLLM's close may have done it
        dist.destroy_process_group()


def quiet_warnings(cfg: Config, is_main: bool) -> None:
    """Other ranks' warnings and transformers' progress bars repeat rank 0's: they are switched off there.
    Megatron's notes that do not apply to this setup (no Apex / Transformer Engine on CPU, CUDA-only tuning
    hints on CPU, its own deprecated default) are switched off on every rank."""
    if not is_main:
        for category in (UserWarning, FutureWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", category=category)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # every rank's "Loading weights" / "Writing model shards" bars, likewise
    if cfg.learner.backend == "megatron":
        for message in (".*Apex is not installed.*", ".*Transformer Engine and Apex are not installed.*",
                        ".*full scope is deprecated.*"):
            warnings.filterwarnings("ignore", message=message)
        if not torch.cuda.is_available():
            warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS.*")
