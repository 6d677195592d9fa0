"""Which sequences of a packed row a varlen kernel should not attend (issue 38): the long ones.

On an H200 (bench/results/gpu/20261204_h200/) torch's ``varlen_attn`` (flash-attention 2's kernels, no Hopper
instructions) spent 2.0 s of a 3.5 s learner update on two 33k-token sequences, where SDPA's causal kernel
(cuDNN's Hopper flash attention) spent 1.1 s on the same rows padded: the whole gap between the packed and the
padded forward at equal lengths. A long sequence needs no varlen kernel: alone it is one causal row, and one
SDPA call per such sequence (per group of equal-length ones) costs far more device time than its launch. Short
ones stay in one varlen call, where one SDPA call each would be launch-bound.

:func:`plan` splits the host lengths of a packed row at a threshold (``PACS_FAST_VARLEN_LONG`` tokens,
default :data:`DEFAULT_LONG`; 0: never): the long sequences grouped by length, the short ones gathered into one
sub-row with its own boundaries, and where every output token goes back. Device index tensors are built once per
(lengths, threshold, device) and reused by every layer of the forward and its backward.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import torch

LONG_ENV = "PACS_FAST_VARLEN_LONG"
DEFAULT_LONG = 4096  # tokens; the GPU measurement behind it: bench/gpu/attention.py (docs/GPU.md)


def long_threshold() -> int:
    """``PACS_FAST_VARLEN_LONG`` (tokens; 0: no sequence is long), default :data:`DEFAULT_LONG`."""
    raw = os.environ.get(LONG_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_LONG
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise ValueError(f"{LONG_ENV} must be a whole number of tokens >= 0 (0: never split), got {raw!r}")
    return n


@dataclasses.dataclass(frozen=True)
class Plan:
    """``long``: ``(length, first token of each sequence, token indices or None for one sequence)`` per group of
    equal-length long sequences; ``short_index`` ``[n_short]`` int64 (the short sequences' tokens, in order) or
    None, ``short_cu`` int32 ``[k + 1]`` their boundaries in that sub-row, ``short_max`` the longest;
    ``where`` ``[N]`` int64: the row position of each output token, long groups first, then the short sub-row."""

    long: tuple
    short_index: torch.Tensor | None
    short_cu: torch.Tensor | None
    short_max: int
    where: torch.Tensor


@functools.lru_cache(maxsize=64)
def plan(lengths: tuple, long: int, device: torch.device) -> Plan | None:
    """The split of a packed row whose sequences have ``lengths`` (host ints, in row order) at ``long`` tokens;
    None when no sequence is that long (``long`` 0: never) or there is nothing to split (one sequence)."""
    if long <= 0 or len(lengths) < 2 or max(lengths) < long:
        return None
    starts, at = [], 0
    for n in lengths:
        starts.append(at)
        at += n
    by_len: dict[int, list[int]] = {}
    short_st, short_len = [], []
    for s, n in zip(starts, lengths):
        if n >= long:
            by_len.setdefault(n, []).append(s)
        elif n > 0:
            short_st.append(s)
            short_len.append(n)
    pin = torch.device(device).type == "cuda"

    def dev(x):  # host -> device without waiting for the stream
        return x.pin_memory().to(device, non_blocking=True) if pin else x.to(device)

    groups, where = [], []
    for n, st in by_len.items():
        idx = (torch.tensor(st)[:, None] + torch.arange(n)).reshape(-1)
        groups.append((n, tuple(st), dev(idx) if len(st) > 1 else None))
        where.append(idx)
    short_index = short_cu = None
    if short_st:
        idx = torch.cat([torch.arange(s, s + n) for s, n in zip(short_st, short_len)])
        where.append(idx)
        short_index = dev(idx)
        cu = torch.zeros(len(short_len) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(short_len).cumsum(0)
        short_cu = dev(cu)
    return Plan(tuple(groups), short_index, short_cu, max(short_len, default=0), dev(torch.cat(where)))
