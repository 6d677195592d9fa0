"""GEMM-shaped forward of ``linear_logprobs``: per-row softmax partials of ``x = (hidden @ weight.T
+ bias) * inv_t`` (``SOFTCAP`` > 0: of ``SOFTCAP * tanh((hidden @ weight.T + bias) / SOFTCAP) * inv_t``) from one
``[BLOCK_N, V_TILES * BLOCK_V]`` logits tile per program.

``_stats_tiles_kernel`` is laid out like a GEMM: every program owns one (row block, vocab block)
tile, reduces the full H for it (``_logits_tile``: a ``tl.dot`` K-loop in ``BLOCK_H`` steps) and
folds its ``V_TILES`` sub-tiles of ``BLOCK_V`` columns into one per-row partial ``(m, s, a)``
(max, sum ``exp(x - m)``, sum ``exp(x - m) * (x - m)``; ``_online_fold``, the tile-wise form of
``ops/vocab_parallel.py``'s merge). Tiles are numbered in grouped order (``_grouped_tile``, as in
the backward and the Triton matmul tutorial): ``GROUP_N`` consecutive row blocks sweep a band of
vocab blocks together, so the programs resident at one time share their weight tiles (and their
hidden blocks) in L2 instead of streaming the 1.2 GB LM head once per row block.

Each program writes its partial to column ``rows`` of row ``vocab block`` of three fp32 workspace
arrays ``[n_vblocks, N]``; kernels/linear_logprobs_finish.py merges them along dim 0 with the math
that merges tensor-parallel ranks (``vocab_parallel.merge_splits``), so the two-part log-sum-exp
``(m, log s)`` and the entropy come out of the math the split forward and the TP path use. Workspace:
``12 * N * cdiv(V, V_TILES * BLOCK_V)`` bytes; at N=8192, V=151,936 that is 116.7 MB for
``BLOCK_V = 128`` (1,187 vocab blocks) and 58.4 MB for 256 (594 blocks), plus the merge's
temporaries of the same order (a few ``[n_vblocks, N]`` fp32 arrays).

``PERSISTENT`` (launch_config / ``CONFIG``): 0 launches one program per tile; k > 0 launches
``k * SMs`` programs that stride over the tile numbers (same grouped order, so the set of tiles in
flight is the same), which removes the per-program launch and prologue cost at the price of a
loop. The target logit is an O(N*H) gather-dot, in the same finishing kernel as the merge.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import LAUNCH_OPTIONS
from .base2 import LOG2E, natural_partial
from .linear_logprobs_launch import _cfg, _prec, _upcast, num_sms
from .linear_logprobs_tiles import _grouped_tile, _logits_tile, _online_fold, _softcap, _store_partial, _tile_stats


@triton.jit
def _tile_partial(t, Hd, stride_h, W, stride_w, B, N, V, n_h, inv_t, n_blocks_n, n_blocks_v,
                  M_out, S_out, A_out,
                  HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                  GROUP_N: tl.constexpr, V_TILES: tl.constexpr, SOFTCAP: tl.constexpr):
    pid_n, pid_v = _grouped_tile(t, n_blocks_n, n_blocks_v, GROUP_N)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    if V_TILES == 1:
        cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
        cmask = cols < V
        y = _logits_tile(Hd, stride_h, W, stride_w, B, rows, cols, rmask, cmask, n_h,
                         HAS_BIAS, DOT_PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
        if SOFTCAP > 0:
            y = _softcap(y, SOFTCAP)
        m, s, a = _tile_stats(y, cmask, inv_t, ENTROPY)
    else:
        my = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        s = tl.zeros((BLOCK_N,), tl.float32)
        a = tl.zeros((BLOCK_N,), tl.float32)
        for j in range(V_TILES):
            cols = (pid_v * V_TILES + j) * BLOCK_V + tl.arange(0, BLOCK_V)
            cmask = cols < V
            y = _logits_tile(Hd, stride_h, W, stride_w, B, rows, cols, rmask, cmask, n_h,
                             HAS_BIAS, DOT_PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
            if SOFTCAP > 0:
                y = _softcap(y, SOFTCAP)
            my, s, a = _online_fold(my, s, a, tl.where(cmask[None, :], y, float("-inf")), inv_t * LOG2E,
                                    ENTROPY)
        m, s, a = natural_partial(my, s, a, inv_t, ENTROPY)
    _store_partial(M_out, S_out, A_out, pid_v.to(tl.int64) * N + rows, rmask, m, s, a, ENTROPY)


@triton.jit
def _stats_tiles_kernel(Hd, stride_h, W, stride_w, B, N, V, n_h, inv_t, M_out, S_out, A_out,
                        HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, DOT_PREC: tl.constexpr,
                        UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                        BLOCK_H: tl.constexpr, GROUP_N: tl.constexpr, V_TILES: tl.constexpr,
                        PERSISTENT: tl.constexpr, SOFTCAP: tl.constexpr):
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    n_blocks_v = tl.cdiv(V, BLOCK_V * V_TILES)
    if PERSISTENT:
        for t in range(tl.program_id(0), n_blocks_n * n_blocks_v, tl.num_programs(0)):
            _tile_partial(t, Hd, stride_h, W, stride_w, B, N, V, n_h, inv_t, n_blocks_n, n_blocks_v,
                          M_out, S_out, A_out, HAS_BIAS, ENTROPY, DOT_PREC, UPCAST,
                          BLOCK_N, BLOCK_V, BLOCK_H, GROUP_N, V_TILES, SOFTCAP)
    else:
        _tile_partial(tl.program_id(0), Hd, stride_h, W, stride_w, B, N, V, n_h, inv_t, n_blocks_n,
                      n_blocks_v, M_out, S_out, A_out, HAS_BIAS, ENTROPY, DOT_PREC, UPCAST,
                      BLOCK_N, BLOCK_V, BLOCK_H, GROUP_N, V_TILES, SOFTCAP)


def workspace_bytes(n: int, v: int, cfg: dict) -> int:
    """Bytes of the three fp32 ``[n_vblocks, N]`` partial arrays (entropy on)."""
    return 3 * 4 * n * triton.cdiv(v, cfg["BLOCK_V"] * cfg["V_TILES"])


def stats_tiles(hidden, weight, bias, inv_t: float, entropy: bool, softcap: float = 0.0):
    """Partial ``(m, s, a)`` fp32 ``[n_vblocks, N]`` of the scaled logits, one row per vocab block of
    ``V_TILES * BLOCK_V`` columns (``a`` None without entropy); merge along dim 0. ``softcap`` > 0: of the
    soft-capped logits ``softcap * tanh(y / softcap) * inv_t``."""
    n, n_h = hidden.shape
    v = weight.shape[0]
    cfg = _cfg("stats_tiles", hidden, weight, softcap)
    bn, bv, vt = cfg["BLOCK_N"], cfg["BLOCK_V"], cfg["V_TILES"]
    n_tiles = triton.cdiv(n, bn) * triton.cdiv(v, bv * vt)
    m = torch.empty(triton.cdiv(v, bv * vt), n, dtype=torch.float32, device=hidden.device)
    s = torch.empty_like(m)
    a = torch.empty_like(m) if entropy else s
    persistent = cfg["PERSISTENT"]
    grid = (min(n_tiles, persistent * num_sms(hidden.device)) if persistent else n_tiles,)
    if n > 0:
        _stats_tiles_kernel[grid](
            hidden, hidden.stride(0), weight, weight.stride(0), bias if bias is not None else hidden,
            n, v, n_h, inv_t, m, s, a,
            HAS_BIAS=bias is not None, ENTROPY=entropy, DOT_PREC=_prec(hidden), UPCAST=_upcast(hidden),
            BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=cfg["BLOCK_H"], GROUP_N=cfg["GROUP_N"], V_TILES=vt,
            PERSISTENT=persistent > 0, SOFTCAP=float(softcap), num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"], **LAUNCH_OPTIONS)
    return m, s, (a if entropy else None)
