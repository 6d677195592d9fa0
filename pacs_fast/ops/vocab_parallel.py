"""Per-row softmax statistics: merging partial results (vocab chunks, kernel splits, TP ranks).

A *partial* over a set of vocabulary columns of one row, with scaled logits ``x`` (temperature
already applied), is the triple

    m  = max_j x_j                       (-inf when the set is empty or all -inf)
    s  = sum_j exp(x_j - m)
    a  = sum_j exp(x_j - m) * (x_j - m)  (only needed for the entropy)

Two partials merge exactly (``merge``); the final row quantities are
``lse = m + log s`` and ``entropy = log s - a / s``. Vocab parallelism is the same merge
across ranks: an all-reduce MAX of ``m`` followed by one all-reduce SUM of ``(s, a, target)``
rescaled to the global max (``allreduce_stats``). All tensors here are fp32 ``[N]`` (or
``[S, N]`` for ``merge_splits``); these are O(N) ops.
"""
from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from pacs_fast.kernels import dispatch

NEG_INF = float("-inf")


def _rescale(m_i, s_i, a_i, m_ref):
    """Rescales partial ``i`` (reference point ``m_i``) to reference ``m_ref >= m_i``."""
    scale = torch.exp(m_i - m_ref)  # 0 for m_i = -inf (m_ref finite)
    s = s_i * scale
    a = None
    if a_i is not None:
        a = torch.where(scale == 0, torch.zeros_like(a_i), scale * (a_i + (m_i - m_ref) * s_i))
    return s, a


def merge(m1, s1, a1, m2, s2, a2):
    """Merges two partials of the same rows; ``a1``/``a2`` may be None (no entropy)."""
    m = torch.maximum(m1, m2)
    # Reference point: the max, or 0 when both partials are empty (all -inf), to avoid inf - inf.
    ref = torch.where(m == NEG_INF, torch.zeros_like(m), m)
    s1, a1 = _rescale(m1, s1, a1, ref)
    s2, a2 = _rescale(m2, s2, a2, ref)
    a = None if a1 is None else a1 + a2
    return m, s1 + s2, a


def merge_splits(m, s, a):
    """Merges ``[S, N]`` partials along dim 0 (e.g. the vocab splits of a Triton launch)."""
    mx = m.amax(0)
    ref = torch.where(mx == NEG_INF, torch.zeros_like(mx), mx)
    s_r, a_r = _rescale(m, s, a, ref.unsqueeze(0))
    return mx, s_r.sum(0), None if a_r is None else a_r.sum(0)


def finalize(m, s, a, target, valid):
    """Row results from merged statistics: ``(lse, logp, entropy or None)``; invalid rows -> 0.

    ``logp = (target - m) - log s``, not ``target - lse``: one fp32 ``lse = m + log s`` is rounded to
    ulp(m) (~1e-6 at m ~ 20, 4e-6 at 100), which for a confident token (``log s`` ~ 1e-6 or less) is
    its whole log-prob; ``target - m`` is exact when the target is within 2x of the max (Sterbenz).
    A row with any NaN or +inf logit gives NaN; a row that is all -inf gives NaN.
    """
    log_s = torch.log(s)
    lse = m + log_s
    logp = torch.where(valid, (target - m) - log_s, torch.zeros_like(lse))
    ent = None
    if a is not None:
        ent = torch.where(valid, log_s - a / s, torch.zeros_like(lse))
    return lse, logp, ent


# group -> {local vocab: (offset, global vocab)}; weak on the group, so that a destroyed process group is not
# kept alive here until interpreter exit (a gloo group torn down then can abort the process)
_OFFSETS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def label_masks(labels, ignore_index: int, v_glob: int, check: bool = True):
    """``(keep, bad)`` ``[N]`` bool on the device, with no host sync: ``keep`` the rows that count (label
    in ``[0, v_glob)``), ``bad`` those whose label is neither that nor ``ignore_index`` (the ops give them
    NaN). With ``PACS_FAST_DEBUG_CHECKS=1`` (and ``check``) a bad label raises here (one device sync)."""
    ignored = labels == ignore_index
    in_range = (labels >= 0) & (labels < v_glob)
    bad = ~ignored & ~in_range
    if check and dispatch.debug_checks() and bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"labels must be in [0, {v_glob}) or equal ignore_index={ignore_index}: label "
                         f"{int(labels[i])} at row {i} ({dispatch.DEBUG_ENV} check)")
    return in_range & ~ignored, bad


def check_tp_group(group, fn: str) -> None:
    """``tp_group`` must be None or a ``torch.distributed`` process group (a ValueError naming it)."""
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise ValueError(f"{fn}: tp_group must be a torch.distributed process group or None, got "
                         f"{type(group).__name__}")


def shard_offset(local_vocab: int, group) -> tuple[int, int]:
    """``(first global vocab id of this rank's shard, global vocab size)``; shards are contiguous
    and in rank order (as in Megatron's ``VocabParallelEmbedding`` / column-parallel LM head). The
    all-gather of the shard sizes (and its device-to-host read) runs once per (group, shard size):
    the shards of an LM head do not change within a run."""
    if group is None:
        return 0, local_vocab
    try:
        return _OFFSETS[group][local_vocab]
    except (KeyError, TypeError):  # first call (TypeError: a group that cannot be a weak key)
        pass
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size(group))]
    mine = torch.tensor([local_vocab], dtype=torch.int64)
    if dist.get_backend(group) == "nccl":
        sizes = [t.cuda() for t in sizes]
        mine = mine.cuda()
    dist.all_gather(sizes, mine, group=group)
    sizes = [int(t.item()) for t in sizes]
    rank = dist.get_rank(group)
    out = sum(sizes[:rank]), sum(sizes)
    try:
        _OFFSETS.setdefault(group, {})[local_vocab] = out
    except TypeError:
        pass
    return out


def allreduce_stats(m, s, a, target, group):
    """Combines this rank's partials (over its vocab shard) with the other ranks' in place of a
    single-process computation. ``target`` holds the target logit on the owner rank, 0 elsewhere.
    Returns ``(m, s, a, target)`` global. Two collectives: MAX over [N], SUM over [k, N]."""
    if group is None:
        return m, s, a, target
    m_glob = m.clone()
    dist.all_reduce(m_glob, op=dist.ReduceOp.MAX, group=group)
    ref = torch.where(m_glob == NEG_INF, torch.zeros_like(m_glob), m_glob)
    s_r, a_r = _rescale(m, s, a, ref)
    parts = [s_r, target] if a_r is None else [s_r, target, a_r]
    packed = torch.stack(parts)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    a_out = None if a_r is None else packed[2]
    return m_glob, packed[0], a_out, packed[1]


def allreduce_sum_(t: torch.Tensor, group) -> torch.Tensor:
    if group is not None:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return t
