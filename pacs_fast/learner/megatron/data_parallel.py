"""The data-parallel side of :class:`~pacs_fast.learner.megatron.learner.MegatronLearner`: which
groups a data-parallel rank takes, the check that ranks computing on the same rows were given the
same batch, and the gathers / SUM reductions over the data-parallel group. Every function but
:func:`dp_share` is collective over the group it is given (``None``: the whole world).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from pacs_fast.learner.base import RolloutBatch


def dp_share(n: int, dp_size: int, dp_rank: int) -> list[int]:
    """Data-parallel rank ``dp_rank``'s contiguous share of ``range(n)`` groups (equal shares)."""
    if n % dp_size:
        raise ValueError(f"{n} groups cannot be split evenly over {dp_size} data-parallel "
                         "ranks: make learner.mini/micro_batch_prompts multiples of it")
    k = n // dp_size
    return list(range(dp_rank * k, (dp_rank + 1) * k))


def check_same_batch(batch: RolloutBatch, group, *, local_batches: bool, device) -> None:
    """Ranks that compute on the same rows must be given the same batch: every rank of ``group``
    (all ranks for full batches, the TP group for DP-local ones). A cheap fingerprint compared over
    ``group`` turns a silent divergence into a ValueError on each of its ranks."""
    if dist.get_world_size(group) == 1:
        return
    ids = batch.input_ids.to(torch.float64)
    w = (torch.arange(ids.numel(), dtype=torch.float64) % 1009 + 1).view_as(ids)
    fp = torch.stack([ids.sum(), (ids * w.to(ids.device)).sum(), batch.rewards.double().sum(),
                      batch.response_mask.double().sum(), torch.tensor(float(ids.numel()), dtype=torch.float64)])
    fp = torch.nan_to_num(fp, nan=1.5e300).to(device)  # NaN rewards: equal, not "different"
    lo, hi = fp.clone(), fp.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=group)
    if not torch.equal(lo, hi):
        if local_batches:
            raise ValueError("batch: the ranks of one tensor-parallel group were given different batches; "
                             "with local_batches=True the ranks of a TP group must pass the same batch "
                             "(their data-parallel group's share)")
        raise ValueError("batch: the processes were given different batches; every rank of a "
                         "megatron launch must pass the same rollout batch")


def gather_dp(local: torch.Tensor, group, size: int) -> torch.Tensor:
    """Concatenation over the ``size`` data-parallel ranks (in rank order) of equally shaped tensors."""
    if size == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(size)]
    dist.all_gather(parts, local.contiguous(), group=group)
    return torch.cat(parts)


def all_reduce_sum(tensors: list[torch.Tensor], group, size: int) -> None:
    """SUM all-reduce over the ``size`` data-parallel ranks, in place, through one flat fp32 buffer."""
    if size == 1 or not tensors:
        return
    flat = torch.cat([t.reshape(-1).float() for t in tensors])
    dist.all_reduce(flat, group=group)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def sum_counts(counts: dict[str, float], group, size: int, device) -> dict[str, float]:
    """DP-local batches: a mini-batch's token / row ``counts`` summed over the ``size`` data-parallel groups."""
    if size == 1:
        return counts
    c = torch.tensor([counts[k] for k in sorted(counts)], dtype=torch.float64, device=device)
    dist.all_reduce(c, group=group)
    return dict(zip(sorted(counts), c.tolist()))


def filled_grads(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every parameter's ``.grad``, zeros where none arrived (a parameter no micro-batch reached), so that
    every rank reduces the same tensors."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return [p.grad for p in params]


def local_mini_batch_groups(P: int, mini_batch_prompts: int, group, size: int, device) -> int:
    """DP-local batches: groups per local mini-batch when this data-parallel group holds ``P``
    groups; every data-parallel group must hold the same number (the same number of optimiser steps
    everywhere)."""
    n = torch.tensor([float(P), -float(P)], device=device)
    if size > 1:
        dist.all_reduce(n, op=dist.ReduceOp.MAX, group=group)
    if n[0] != -n[1]:
        raise ValueError(f"update: the data-parallel groups hold different numbers of groups (this one {P}, "
                         f"between {int(-n[1])} and {int(n[0])}); give each the same share of the step's prompts")
    mini = min(mini_batch_prompts, P * size)
    if mini % size:
        raise ValueError(f"update: a mini-batch of {mini} groups cannot be split over {size} "
                         "data-parallel groups")
    return mini // size
