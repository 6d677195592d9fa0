"""Persistent TMA versions of the two GEMM-shaped ``linear_logprobs`` kernels (Hopper and later).

``_stats_tma_kernel`` (``CONFIG["FWD"] = "tma"``): the same per-tile partials as
kernels/linear_logprobs_fwd.py (``(m, s, a)`` per row and vocab block, ``[n_vblocks, N]`` fp32,
merged by kernels/linear_logprobs_finish.py). ``_dlogits_tma_kernel`` (``CONFIG["DLOGITS"] = "tma"``):
the chunked backward's ``dz`` tiles, as ``_dlogits_kernel`` of kernels/linear_logprobs.py (same
``_dlogits_tile`` epilogue, from kernels/linear_logprobs_tiles.py), before the two cuBLAS GEMMs. Both
compute their logits tiles the way the fastest Triton GEMMs on Hopper are written:

- the hidden and weight tiles arrive by tensor-memory-accelerator copies (host ``TensorDescriptor``s
  ``[BLOCK_N, BLOCK_H]`` and ``[BLOCK_V, BLOCK_H]``): no per-thread address arithmetic or masks in the
  K-loop, out-of-range rows, columns and the H tail read as zeros (so a ragged H needs no mask);
- a persistent grid (``PERSISTENT`` programs per SM) strides over the tiles in the grouped order of
  the other forward (``GROUP_N`` row blocks sweep a band of vocab blocks together, sharing L2);
- ``tl.range(..., flatten=FLATTEN)`` lets Triton's software pipeliner overlap the next tile's first
  loads with this tile's epilogue (the online log-sum-exp and entropy fold, or ``dz``), the part a
  GEMM does not have; ``WARP_SPECIALIZE`` asks for Triton's automatic warp specialisation of that
  loop where the compiler supports it (it is a no-op on sm_90 in Triton 3.9).

Why: on one H200 (2026-11-26) the tiled forward took 1.3x cuBLAS's GEMM of the same shape, 96 % of
it in the tile kernel, and the backward's recompute kernel is the same GEMM shape
(bench/results/gpu/20261126_h200/). These variants are selectable and measured side by side
(``bench/gpu/logprobs.py`` method ``pacs_triton_tma`` selects both); they become the default only
where a GPU run shows them faster. Used for bf16 / fp16 inputs on sm_90+ (and the interpreter) with
16-byte aligned rows; anything else falls back to the pointer kernels (``tma_usable``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import LAUNCH_OPTIONS
from .linear_logprobs_launch import _cfg, _prec, _upcast, descriptor_inputs, device_arch, num_sms
from .linear_logprobs_tiles import _dlogits_tile, _grouped_tile, _store_partial, _tile_stats


@triton.jit
def _tma_logits(Hdesc, Wdesc, B, V, n_h, r0, c0, HAS_BIAS: tl.constexpr, DOT_PREC: tl.constexpr,
                UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """The unscaled logits tile ``y`` ``[BLOCK_N, BLOCK_V]`` at rows ``r0..``, vocab ids ``c0..`` (rows and
    columns past the descriptors' shapes, and the H tail, read as zeros)."""
    acc = tl.zeros((BLOCK_N, BLOCK_V), tl.float32)
    for k in range(tl.cdiv(n_h, BLOCK_H)):
        h = Hdesc.load([r0, k * BLOCK_H])
        w = Wdesc.load([c0, k * BLOCK_H])
        if UPCAST:
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, w.T, acc, input_precision=DOT_PREC)
    if HAS_BIAS:
        cols = c0 + tl.arange(0, BLOCK_V)
        acc += tl.load(B + cols, mask=cols < V, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _tma_tile(t, Hdesc, Wdesc, B, V, n_h, n_blocks_n, n_blocks_v, HAS_BIAS: tl.constexpr,
              DOT_PREC: tl.constexpr, UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
              BLOCK_H: tl.constexpr, GROUP_N: tl.constexpr):
    """Tile number ``t`` of the grouped order: its unscaled logits, row and vocab ids, vocab block."""
    pid_n, pid_v = _grouped_tile(t, n_blocks_n, n_blocks_v, GROUP_N)
    y = _tma_logits(Hdesc, Wdesc, B, V, n_h, pid_n * BLOCK_N, pid_v * BLOCK_V, HAS_BIAS, DOT_PREC,
                    UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
    return y, pid_n * BLOCK_N + tl.arange(0, BLOCK_N), pid_v * BLOCK_V + tl.arange(0, BLOCK_V), pid_v


@triton.jit
def _stats_tma_kernel(Hdesc, Wdesc, B, N, V, n_h, inv_t, M_out, S_out, A_out,
                      HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, DOT_PREC: tl.constexpr,
                      UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                      BLOCK_H: tl.constexpr, GROUP_N: tl.constexpr, FLATTEN: tl.constexpr,
                      WARP_SPECIALIZE: tl.constexpr):
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    n_blocks_v = tl.cdiv(V, BLOCK_V)
    for t in tl.range(tl.program_id(0), n_blocks_n * n_blocks_v, tl.num_programs(0), flatten=FLATTEN,
                      warp_specialize=WARP_SPECIALIZE):
        y, rows, cols, pid_v = _tma_tile(t, Hdesc, Wdesc, B, V, n_h, n_blocks_n, n_blocks_v, HAS_BIAS,
                                         DOT_PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H, GROUP_N)
        m, s, a = _tile_stats(y, cols < V, inv_t, ENTROPY)
        _store_partial(M_out, S_out, A_out, pid_v.to(tl.int64) * N + rows, rows < N, m, s, a, ENTROPY)


@triton.jit
def _dlogits_tma_kernel(Hdesc, Wdesc, B, N, V, n_h, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH, DZ, stride_dz,
                        HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, DOT_PREC: tl.constexpr,
                        UPCAST: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr,
                        BLOCK_H: tl.constexpr, GROUP_N: tl.constexpr, FLATTEN: tl.constexpr,
                        WARP_SPECIALIZE: tl.constexpr):
    # one chunk, as _dlogits_kernel: the descriptors, LABELS/M/... start at the chunk's first row and
    # vocab id (``v_offset`` = that id minus the shard's first id); DZ is [N, V] with row stride stride_dz
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    n_blocks_v = tl.cdiv(V, BLOCK_V)
    for t in tl.range(tl.program_id(0), n_blocks_n * n_blocks_v, tl.num_programs(0), flatten=FLATTEN,
                      warp_specialize=WARP_SPECIALIZE):
        y, rows, cols, _ = _tma_tile(t, Hdesc, Wdesc, B, V, n_h, n_blocks_n, n_blocks_v, HAS_BIAS,
                                     DOT_PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H, GROUP_N)
        rmask = rows < N
        cmask = cols < V
        dz = _dlogits_tile(y, rows, cols, rmask, cmask, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH, ENTROPY)
        tl.store(DZ + rows[:, None].to(tl.int64) * stride_dz + cols[None, :], dz.to(DZ.dtype.element_ty),
                 mask=rmask[:, None] & cmask[None, :])


def tma_usable(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """bf16 / fp16 inputs of one dtype, unit stride along H, 16-byte aligned bases and row strides
    (what a TMA descriptor needs: ``descriptor_inputs``), on sm_90+ or under the interpreter
    (``TensorDescriptor`` on CPU tensors); fp32 keeps the tiled forward (IEEE products, a correctness path).
    The dispatcher checks the same (kernels/dispatch.py ``takes``) before it imports this module."""
    arch = device_arch(hidden.device)
    return (arch is None or arch >= 90) and descriptor_inputs(hidden, weight)


def _descriptors(hidden, weight, cfg):
    """``(hidden descriptor, weight descriptor, grid)`` of a persistent TMA launch: blocks
    ``[BLOCK_N, BLOCK_H]`` / ``[BLOCK_V, BLOCK_H]``, ``PERSISTENT`` programs per SM (at most one per tile)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    (n, n_h), v = hidden.shape, weight.shape[0]
    bn, bv, bh = cfg["BLOCK_N"], cfg["BLOCK_V"], cfg["BLOCK_H"]
    hdesc = TensorDescriptor(hidden, [n, n_h], [hidden.stride(0), 1], [bn, bh])
    wdesc = TensorDescriptor(weight, [v, n_h], [weight.stride(0), 1], [bv, bh])
    n_tiles = triton.cdiv(n, bn) * triton.cdiv(v, bv)
    return hdesc, wdesc, (max(1, min(n_tiles, cfg["PERSISTENT"] * num_sms(hidden.device))),)


def stats_tma(hidden, weight, bias, inv_t: float, entropy: bool):
    """Partial ``(m, s, a)`` fp32 ``[cdiv(V, BLOCK_V), N]`` of the scaled logits (``a`` None without
    entropy), as ``linear_logprobs_fwd.stats_tiles``; the caller checks ``tma_usable`` first."""
    n, n_h = hidden.shape
    v = weight.shape[0]
    cfg = _cfg("stats_tma", hidden, weight)
    m = torch.empty(triton.cdiv(v, cfg["BLOCK_V"]), n, dtype=torch.float32, device=hidden.device)
    s = torch.empty_like(m)
    a = torch.empty_like(m) if entropy else s
    if n > 0 and v > 0:
        hdesc, wdesc, grid = _descriptors(hidden, weight, cfg)
        _stats_tma_kernel[grid](
            hdesc, wdesc, bias if bias is not None else hidden, n, v, n_h, inv_t, m, s, a,
            HAS_BIAS=bias is not None, ENTROPY=entropy, DOT_PREC=_prec(hidden), UPCAST=_upcast(hidden),
            BLOCK_N=cfg["BLOCK_N"], BLOCK_V=cfg["BLOCK_V"], BLOCK_H=cfg["BLOCK_H"], GROUP_N=cfg["GROUP_N"],
            FLATTEN=bool(cfg["FLATTEN"]),
            WARP_SPECIALIZE=bool(cfg["WARP_SPECIALIZE"]), num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"], **LAUNCH_OPTIONS)
    return m, s, (a if entropy else None)


def dlogits_tma(h_c, w_c, b_c, inv_t, labels, v_offset, m, log_s, ent, gl, gh, dz, entropy: bool):
    """``dz`` [n_c, v_c] (input dtype) of one chunk of the chunked backward: rows ``h_c`` [n_c, H],
    vocab rows ``w_c`` [v_c, H] (``b_c`` [>= v_c] or None), the per-row vectors starting at the
    chunk's first row; the caller checks ``tma_usable(h_c, w_c)`` first."""
    n, n_h = h_c.shape
    v = w_c.shape[0]
    cfg = _cfg("dlogits_tma", h_c, w_c)
    hdesc, wdesc, grid = _descriptors(h_c, w_c, cfg)
    _dlogits_tma_kernel[grid](
        hdesc, wdesc, b_c if b_c is not None else h_c, n, v, n_h, inv_t, labels, v_offset, m, log_s,
        ent if entropy else m, gl, gh if entropy else gl, dz, dz.stride(0),
        HAS_BIAS=b_c is not None, ENTROPY=entropy, DOT_PREC=_prec(h_c), UPCAST=_upcast(h_c),
        BLOCK_N=cfg["BLOCK_N"], BLOCK_V=cfg["BLOCK_V"], BLOCK_H=cfg["BLOCK_H"], GROUP_N=cfg["GROUP_N"],
        FLATTEN=bool(cfg["FLATTEN"]),
        WARP_SPECIALIZE=bool(cfg["WARP_SPECIALIZE"]), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **LAUNCH_OPTIONS)
