"""The megatron learner's optimiser: AdamW, replicated on every data-parallel rank or, with
``learner.distributed_optimizer=true``, sharded over them (ZeRO-1).

Sharded: :class:`torch.distributed.optim.ZeroRedundancyOptimizer` over the learner's data-parallel
group. Each rank keeps the AdamW moments of its share of the parameters (whole tensors, greedily
balanced by size, the largest first), steps only those, then every parameter is broadcast from the
rank that owns it. Gradients are still SUM all-reduced before the step (the learner clips on the
global norm), so every rank's step computes the same numbers as the replicated optimiser: AdamW is
element-wise, and sharding only decides which rank computes which element. Optimiser memory per
rank is about ``1 / dp`` of the replicated one (whole tensors: the largest one bounds the balance).

Why not megatron-core's ``DistributedOptimizer``: it needs megatron's own
``DistributedDataParallel`` wrapper (contiguous gradient buffers, reduce-scatter hooks), which the
learner does not use (it all-reduces gradients itself, in one flat buffer, over gloo or NCCL), and it
does not build without CUDA: with the wrapper and gloo groups in place, ``get_megatron_optimizer(...,
use_distributed_optimizer=True)`` stops in ``megatron/core/optimizer/optimizer.py`` at
``torch.tensor([0], dtype=torch.int, device='cuda')`` with "AssertionError: Torch not compiled with
CUDA enabled" (megatron-core 0.16.1, this project's CPU torch), so it cannot be tested here. ZeRO-1
over the same group gives the same memory saving with the learner unchanged, and is tested on CPU.

Checkpoints are unchanged: :func:`full_state_dict_on_dp0` consolidates the sharded state on
data-parallel rank 0 in the plain ``torch.optim.AdamW`` format (global parameter indices), which is
what the replicated optimiser saves, so a checkpoint resumes with or without sharding and under any
data-parallel size; ``load_state_dict`` of such a state keeps each rank's share.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer


def make_optimizer(params: list[torch.nn.Parameter], cfg, *, dp_group, dp_size: int) -> torch.optim.Optimizer:
    """AdamW with the ``learner`` section's settings; sharded over ``dp_group`` when
    ``cfg.distributed_optimizer`` and there is more than one data-parallel rank."""
    kw = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if getattr(cfg, "distributed_optimizer", False) and dp_size > 1:
        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW, process_group=dp_group, **kw)
    return torch.optim.AdamW(params, **kw)


def is_sharded(optimizer) -> bool:
    return isinstance(optimizer, ZeroRedundancyOptimizer)


def local_state(optimizer) -> dict:
    """``{param: {"step", "exp_avg", "exp_avg_sq"}}`` of the parameters this rank steps."""
    return optimizer.optim.state if is_sharded(optimizer) else optimizer.state


def owns(optimizer, param) -> bool:
    """Whether this rank steps ``param`` (always, unless sharded)."""
    return not is_sharded(optimizer) or optimizer._param_to_rank[param] == optimizer.rank


def state_bytes(optimizer) -> int:
    """Bytes of optimiser-state tensors this rank holds (the AdamW moments of its share)."""
    return sum(v.numel() * v.element_size() for st in local_state(optimizer).values()
               for v in st.values() if torch.is_tensor(v) and v.dim() > 0)


def full_state_dict_on_dp0(optimizer, dp_rank: int) -> dict | None:
    """The whole ``torch.optim.AdamW``-format state dict on data-parallel rank 0 (None on the others).
    Collective over the data-parallel group when sharded."""
    if is_sharded(optimizer):
        optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if dp_rank == 0 else None


def param_states(optimizer, params: list[torch.nn.Parameter], dp_group) -> dict[int, dict]:
    """``{id(param): {"step", "exp_avg", "exp_avg_sq"}}`` of every parameter on every rank (a sharded
    optimiser broadcasts each parameter's state from its owner; collective over ``dp_group``).
    Parameters without state yet (before the first step) are left out."""
    if not is_sharded(optimizer):
        return {id(p): optimizer.state[p] for p in params if optimizer.state.get(p)}
    owner_of = optimizer._param_to_rank  # torch's partition (group ranks), the one step() uses
    mine = optimizer.optim.state
    owns_any = any(owner_of[p] == optimizer.rank for p in params)
    stepped = torch.tensor([float(len(mine) > 0 or not owns_any)])
    dist.all_reduce(stepped, op=dist.ReduceOp.MIN, group=dp_group)
    if not stepped.item():  # no step since the optimiser was made
        return {}
    out = {}
    for p in params:
        src = dist.get_global_rank(dp_group, owner_of[p])
        st = mine.get(p) or {"step": torch.zeros(()), "exp_avg": torch.empty_like(p), "exp_avg_sq": torch.empty_like(p)}
        step = torch.as_tensor(st["step"], dtype=torch.float32).reshape(1).clone()
        for t in (step, st["exp_avg"], st["exp_avg_sq"]):
            dist.broadcast(t, src=src, group=dp_group)
        out[id(p)] = {"step": step.reshape(()), "exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"]}
    return out
