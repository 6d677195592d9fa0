"""Triton kernels for log-probs from hidden states: ``x = (hidden @ weight.T + bias) * inv_t``
computed tile by tile; the ``[N, V]`` logits never exist in memory.

Shapes: hidden ``[N, H]``, weight ``[V, H]`` (same dtype: fp32/bf16/fp16, unit stride along H),
bias ``[V]`` (any float dtype) or None; per-row fp32 vectors ``[N]``. ``tl.dot`` accumulates in fp32 (fp32 inputs
use IEEE fp32 products, not TF32, so fp32 results match a float64 reference to ~1e-5).

``stats_fwd``: grid ``(cdiv(N, BLOCK_N), SPLITS)``. Program (row block, split) computes the
logits tiles ``[BLOCK_N, BLOCK_V]`` of its vocab range (a K-loop of ``tl.dot`` over H in
``BLOCK_H`` steps) and folds them into an online max / sum-exp / sum ``e*(x-m)`` per row,
writing partial ``(m, s, a)`` to ``[SPLITS, N]`` (merged on the host, O(N); the same merge
combines tensor-parallel ranks). The target logit is an O(N*H) gather-dot on the host.

``grad_bwd``: grid over all ``(row block, vocab block)`` tiles, ordered in groups of
``GROUP_N`` row blocks so that concurrently running programs share weight tiles in L2. Each
program recomputes its logits tile, forms

    dx = gl * onehot - p * (gh * (x - lse) + gl + gh * H),   p = exp(x - lse),   dz = dx * inv_t

and, per ``BLOCK_H`` slice, ``dz @ W[vblk]`` -> ``dhidden[nblk]`` and ``dz.T @ hidden[nblk]``
-> ``dweight[vblk]``, both by relaxed fp32 atomic adds (ordering is irrelevant for sums; the
kernel boundary orders them before any reader) into one fp32 buffer each (``[N, H]`` and
``[V, H]``), plus ``sum_rows dz`` -> ``dbias``. That is the one-pass scheme of cut cross-entropy:
no ``[N, V]`` intermediate at all, at the price of (a) summation order that is not
deterministic and (b) atomic traffic of ``4*N*V*H*(1/BLOCK_N + 1/BLOCK_V)`` bytes to L2 (see
bench/README.md). For bf16/fp16 inputs ``dz`` is rounded to the input dtype before the two
backward ``tl.dot``s (tensor cores), as in the forward GEMM; fp32 inputs keep fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CONFIG = {
    "BLOCK_N": 128, "BLOCK_V": 128, "BLOCK_H": 64, "GROUP_N": 8,
    "num_warps": 8, "num_stages": 3, "SPLITS": None,
}


@triton.jit
def _logits_tile(Hd, stride_h, W, stride_w, B, rows, cols, rmask, cmask, n_h, inv_t,
                 HAS_BIAS: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    acc = tl.zeros((BLOCK_N, BLOCK_V), tl.float32)
    for k0 in range(0, n_h, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        kmask = ks < n_h
        h = tl.load(Hd + rows[:, None].to(tl.int64) * stride_h + ks[None, :],
                    mask=rmask[:, None] & kmask[None, :], other=0.0)
        w = tl.load(W + cols[:, None].to(tl.int64) * stride_w + ks[None, :],
                    mask=cmask[:, None] & kmask[None, :], other=0.0)
        if UPCAST:
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PREC)
    if HAS_BIAS:
        acc += tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    return acc * inv_t


@triton.jit
def _stats_fwd_kernel(Hd, stride_h, W, stride_w, B, N, V, n_h, v_per_split, inv_t,
                      M_out, S_out, A_out,
                      HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    v_lo = split * v_per_split
    v_hi = tl.minimum(V, v_lo + v_per_split)
    m = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_N,), tl.float32)
    a = tl.zeros((BLOCK_N,), tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        cmask = cols < v_hi
        x = _logits_tile(Hd, stride_h, W, stride_w, B, rows, cols, rmask, cmask, n_h, inv_t,
                         HAS_BIAS, DOT_PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
        x = tl.where(cmask[None, :], x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, 1))
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        scale = tl.exp(m - ref)
        xr = x - ref[:, None]
        e = tl.exp(xr)
        if ENTROPY:
            a = tl.where(scale == 0.0, 0.0, scale * (a + (m - ref) * s))
            a += tl.sum(tl.where(x == float("-inf"), 0.0, e * xr), 1)
        s = s * scale + tl.sum(e, 1)
        m = m_new
    out = split * N + rows
    tl.store(M_out + out, m, mask=rmask)
    tl.store(S_out + out, s, mask=rmask)
    if ENTROPY:
        tl.store(A_out + out, a, mask=rmask)


@triton.jit
def _grad_bwd_kernel(Hd, stride_h, W, stride_w, B, N, V, n_h, inv_t,
                     LABELS, v_offset, LSE, ENT, GL, GH,
                     DH, DW, DB,
                     HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                     NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                     GROUP_N: tl.constexpr):
    # grouped ordering: GROUP_N consecutive row blocks sweep the vocab blocks together
    pid = tl.program_id(0)
    n_blocks_n = tl.cdiv(N, BLOCK_N)
    n_blocks_v = tl.cdiv(V, BLOCK_V)
    per_group = GROUP_N * n_blocks_v
    first_n = (pid // per_group) * GROUP_N
    group_size = tl.minimum(n_blocks_n - first_n, GROUP_N)
    pid_n = first_n + (pid % per_group) % group_size
    pid_v = (pid % per_group) // group_size

    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < N
    cmask = cols < V
    x = _logits_tile(Hd, stride_h, W, stride_w, B, rows, cols, rmask, cmask, n_h, inv_t,
                     HAS_BIAS, DOT_PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
    lse = tl.load(LSE + rows, mask=rmask, other=0.0)
    gl = tl.load(GL + rows, mask=rmask, other=0.0)
    xr = x - lse[:, None]
    p = tl.exp(xr)
    if ENTROPY:
        gh = tl.load(GH + rows, mask=rmask, other=0.0)
        c = gl + gh * tl.load(ENT + rows, mask=rmask, other=0.0)
        dz = -p * (gh[:, None] * xr + c[:, None])
        dz = tl.where(x == float("-inf"), 0.0, dz)
    else:
        dz = -p * gl[:, None]
    labels = tl.load(LABELS + rows, mask=rmask, other=-1) - v_offset
    dz += tl.where(cols[None, :] == labels[:, None], gl[:, None], 0.0)
    dz = tl.where(rmask[:, None] & cmask[None, :], dz * inv_t, 0.0)
    if NEED_DB:
        tl.atomic_add(DB + cols, tl.sum(dz, 0), mask=cmask, sem="relaxed")
    dz_in = dz.to(Hd.dtype.element_ty)
    if UPCAST:
        dz_in = dz_in.to(tl.float32)
    for k0 in range(0, n_h, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        kmask = ks < n_h
        w = tl.load(W + cols[:, None].to(tl.int64) * stride_w + ks[None, :],
                    mask=cmask[:, None] & kmask[None, :], other=0.0)
        if UPCAST:
            w = w.to(tl.float32)
        dh = tl.dot(dz_in, w, input_precision=DOT_PREC)
        tl.atomic_add(DH + rows[:, None].to(tl.int64) * n_h + ks[None, :], dh,
                      mask=rmask[:, None] & kmask[None, :], sem="relaxed")
        if NEED_DW:
            h = tl.load(Hd + rows[:, None].to(tl.int64) * stride_h + ks[None, :],
                        mask=rmask[:, None] & kmask[None, :], other=0.0)
            if UPCAST:
                h = h.to(tl.float32)
            dw = tl.dot(tl.trans(dz_in), h, input_precision=DOT_PREC)
            tl.atomic_add(DW + cols[:, None].to(tl.int64) * n_h + ks[None, :], dw,
                          mask=cmask[:, None] & kmask[None, :], sem="relaxed")


def _prec(t: torch.Tensor):
    """IEEE fp32 products for fp32 inputs (TF32 would cost ~1e-3 relative error in the logits);
    the default (tensor cores) for bf16/fp16."""
    return "ieee" if t.dtype == torch.float32 else None


def _upcast(t: torch.Tensor) -> bool:
    """Triton 3.9's interpreter returns garbage for bf16 ``tl.dot``; there (only) the bf16 tiles
    are widened to fp32 after loading (same values; dz is still rounded to bf16 first)."""
    return t.device.type != "cuda" and t.dtype == torch.bfloat16


def _blocks(n_h: int):
    bh = min(CONFIG["BLOCK_H"], max(16, triton.next_power_of_2(n_h)))
    return CONFIG["BLOCK_N"], CONFIG["BLOCK_V"], bh


def stats_fwd(hidden, weight, bias, inv_t: float, entropy: bool):
    """Partial ``(m, s, a)`` fp32 ``[SPLITS, N]`` of the scaled logits (``a`` None w/o entropy)."""
    n, n_h = hidden.shape
    v = weight.shape[0]
    bn, bv, bh = _blocks(n_h)
    n_blocks = triton.cdiv(n, bn)
    if CONFIG["SPLITS"] is not None:
        splits = int(CONFIG["SPLITS"])
    elif hidden.device.type == "cuda":
        sms = torch.cuda.get_device_properties(hidden.device).multi_processor_count
        splits = triton.cdiv(4 * sms, n_blocks)
    else:
        splits = 1
    splits = max(1, min(splits, triton.cdiv(v, bv)))
    per = triton.cdiv(triton.cdiv(v, splits), bv) * bv
    splits = triton.cdiv(v, per)
    m = torch.empty(splits, n, dtype=torch.float32, device=hidden.device)
    s = torch.empty_like(m)
    a = torch.empty_like(m) if entropy else s
    if n > 0:
        _stats_fwd_kernel[(n_blocks, splits)](
            hidden, hidden.stride(0), weight, weight.stride(0), bias if bias is not None else hidden,
            n, v, n_h, per, inv_t, m, s, a,
            HAS_BIAS=bias is not None, ENTROPY=entropy, DOT_PREC=_prec(hidden), UPCAST=_upcast(hidden),
            BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh,
            num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return m, s, (a if entropy else None)


def grad_bwd(hidden, weight, bias, inv_t, labels, v_offset, lse, ent, gl, gh,
             need_weight_grad=True, need_bias_grad=True):
    """Returns fp32 ``(dhidden [N, H], dweight [V, H] or None, dbias [V] or None)`` for one
    vocab shard (``labels`` global ids; rows with ``gl = gh = 0`` contribute 0)."""
    n, n_h = hidden.shape
    v = weight.shape[0]
    bn, bv, bh = _blocks(n_h)
    dh = torch.zeros(n, n_h, dtype=torch.float32, device=hidden.device)
    dw = torch.zeros(v, n_h, dtype=torch.float32, device=hidden.device) if need_weight_grad else None
    db = torch.zeros(v, dtype=torch.float32, device=hidden.device) \
        if bias is not None and need_bias_grad else None
    entropy = gh is not None
    if n > 0:
        grid = (triton.cdiv(n, bn) * triton.cdiv(v, bv),)
        _grad_bwd_kernel[grid](
            hidden, hidden.stride(0), weight, weight.stride(0), bias if bias is not None else hidden,
            n, v, n_h, inv_t, labels, v_offset, lse, ent if entropy else lse, gl, gh if entropy else gl,
            dh, dw if dw is not None else dh, db if db is not None else dh,
            HAS_BIAS=bias is not None, ENTROPY=entropy, DOT_PREC=_prec(hidden), UPCAST=_upcast(hidden),
            NEED_DW=dw is not None, NEED_DB=db is not None,
            BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh, GROUP_N=CONFIG["GROUP_N"],
            num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return dh, dw, db
