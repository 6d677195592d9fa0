"""Launch candidates of bench/gpu/tune.py's sweeps: stage 1 (tiles, warps, stages; the Gluon kernels'
ping-pong launches with ``pingpong``), stage 2 (GROUP_N and the forwards' grid knobs around the
stage-1 winner), ordered as a local search from the built-in configuration. Pure functions of the
built-in configuration, the dtype and the architecture's shared-memory limit: nothing is compiled or run.
"""
from __future__ import annotations

import itertools
import json

from pacs_fast.kernels import aot
from pacs_fast.kernels.linear_logprobs_launch import PINGPONG_CONFIGS


def _tile_sweep(base, dt, arch, blocks_h, stages):
    """Tiles BLOCK_N x BLOCK_V in {64, 128, 256}^2, BLOCK_H, warps 4 / 8, stages: kept when the fp32
    accumulator is 16..128 registers per thread and the operand ring fits the shared memory limit."""
    item = 4 if dt == "fp32" else 2
    out = []
    for bn, bv, bh, w, st in itertools.product((64, 128, 256), (64, 128, 256), blocks_h, (4, 8), stages):
        acc = bn * bv / (32 * w)
        if not 16 <= acc <= 128 or (bn + bv) * bh * item * st > aot.SMEM_LIMIT[arch]:
            continue
        out.append(dict(base, BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh, num_warps=w, num_stages=st))
    return out


def stage1(name, base, dt, arch, pingpong=False):
    """Stage-1 candidates, the built-in first. ``pingpong`` (the Gluon kernels): also their ping-pong
    launches (PINGPONG=1, 4-warp consumers), the built-in one second (``PINGPONG_CONFIGS``)."""
    if name.startswith("token_logprobs."):
        cands = [dict(base, BLOCK_V=bv, num_warps=w, num_stages=st)
                 for bv, w, st in itertools.product((1024, 2048, 4096, 8192), (4, 8, 16), (1, 2, 3))]
    elif name.endswith("grad_bwd"):
        cands = _tile_sweep(base, dt, arch, (32, 64), (1, 2, 3))
    else:
        cands = _tile_sweep(base, dt, arch, (32, 64, 128), (2, 3, 4, 5))
    kernel = name.split(".")[1]
    if pingpong and kernel in PINGPONG_CONFIGS:  # one 4-warp consumer per tile: smaller tiles, deeper rings
        cands += [dict(c, PINGPONG=1) for c in _tile_sweep(base, dt, arch, (32, 64, 128), (3, 4, 5, 6))
                  if c["num_warps"] == 4]
        return _dedupe([base, dict(base, **PINGPONG_CONFIGS[kernel])] + _by_distance(base, cands)[1:])
    return _by_distance(base, cands)


def _by_distance(base, cands):
    """The built-in configuration first, then the others by how many parameters differ from it
    (a local search: the budget may end the sweep), bigger tiles first among equals."""
    def key(c):
        return (sum(c[k] != base[k] for k in base), -c.get("BLOCK_N", 1) * c["BLOCK_V"], -c.get("BLOCK_H", 0))
    return _dedupe([base] + sorted(cands, key=key))


def stage2(name, best):
    if name.startswith("token_logprobs."):
        return []
    extra = dict(PERSISTENT=(0, 1, 2), V_TILES=(1, 2)) if name.endswith("stats_tiles") else \
        dict(PERSISTENT=(1, 2), FLATTEN=(0, 1)) if name.endswith("_tma") else {}
    keys = ["GROUP_N"] + list(extra)
    values = [(4, 8, 16, 32, 64)] + list(extra.values())
    return _dedupe([dict(best, **dict(zip(keys, combo))) for combo in itertools.product(*values)])


def _dedupe(cands):
    seen, out = set(), []
    for c in cands:
        k = json.dumps(c, sort_keys=True)
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out
