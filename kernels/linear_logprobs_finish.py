"""The Triton forward's finish: the merge of the tiles' per-row partials and the target logit, in one
memory-bound pass over the rows.

The GEMM-shaped forwards (kernels/linear_logprobs_fwd.py, kernels/linear_logprobs_tma.py) leave fp32
partials ``(m, s, a)`` of shape ``[S, N]``, one row per vocab block (see ``ops/vocab_parallel.py`` for
the partial and its merge). ``_finish_kernel`` gives, per row ``i`` of a block of ``BLOCK_R`` rows:

    m_i = max_k m[k, i]                      (ref_i = m_i, or 0 when the row is all -inf)
    s_i = sum_k s[k, i] * exp(m[k, i] - ref_i)
    a_i = sum_k exp(m[k, i] - ref_i) * (a[k, i] + (m[k, i] - ref_i) * s[k, i])   (0 where the scale is 0)
    t_i = (hidden[i] . weight[y_i - v_offset] + bias[y_i - v_offset]) * inv_t    (0 where this shard
                                                                                  does not own y_i)

(with ``SOFTCAP`` > 0 the dot is soft-capped before ``inv_t``, ``SOFTCAP * tanh(. / SOFTCAP)``, as the partials were)

which is ``vocab_parallel.merge_splits`` followed by the target logit's gather-dot, the same math in
another summation order (fp32 sums of exactly the same fp32 terms; bf16 products are exact in fp32).

Why a kernel: on one H200 (2026-11-26, N=8192, H=4096, V=151,936, bf16) these two steps were ~15
torch launches and ~0.5 ms of the forward's ~16 ms of device time, most of it the gather-dot's fp32
copies of ``hidden`` and of the gathered weight rows (4 x 64-128 MB passes,
bench/results/gpu/20261126_h200/profiles/). Here they read each byte once: ``hidden`` (N*H), the
N gathered weight rows (N*H) and the partials (12*S*N bytes), about 190 MB at that shape.

Non-finite rows follow the torch merge: an all -inf row has ``m = -inf, s = 0``; a NaN or +inf logit
makes ``s`` NaN (``exp(inf - inf)``), so the row's log-prob and entropy are NaN.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import LAUNCH_OPTIONS
from .linear_logprobs_tiles import _softcap

BLOCK_R = 16    # rows per program (N = 8192: 512 programs)
BLOCK_S = 32    # partial rows (vocab blocks) per step of the merge
BLOCK_H = 256   # hidden columns per step of the gather-dot
NUM_WARPS = 4


@triton.jit
def _finish_kernel(M, S, A, n_split, N, Hd, stride_h, W, stride_w, B, LABELS, v_offset, V, n_h, inv_t,
                   M_out, S_out, A_out, T_out,
                   HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, SOFTCAP: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = rows < N
    # merge, pass 1: the row max (the reference point of every partial)
    mx = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    for s0 in range(0, n_split, BLOCK_S):
        sp = s0 + tl.arange(0, BLOCK_S)
        off = sp[:, None].to(tl.int64) * N + rows[None, :]
        msk = (sp[:, None] < n_split) & rmask[None, :]
        mx = tl.maximum(mx, tl.max(tl.load(M + off, mask=msk, other=float("-inf")), 0))
    ref = tl.where(mx == float("-inf"), 0.0, mx)
    # merge, pass 2: the rescaled sums (as vocab_parallel._rescale)
    s_acc = tl.zeros((BLOCK_R,), tl.float32)
    a_acc = tl.zeros((BLOCK_R,), tl.float32)
    for s0 in range(0, n_split, BLOCK_S):
        sp = s0 + tl.arange(0, BLOCK_S)
        off = sp[:, None].to(tl.int64) * N + rows[None, :]
        msk = (sp[:, None] < n_split) & rmask[None, :]
        d = tl.load(M + off, mask=msk, other=float("-inf")) - ref[None, :]
        scale = tl.exp(d)  # 0 for an empty partial (m = -inf) against a finite reference
        s_k = tl.load(S + off, mask=msk, other=0.0)
        s_acc += tl.sum(s_k * scale, 0)
        if ENTROPY:
            a_k = tl.load(A + off, mask=msk, other=0.0)
            a_acc += tl.sum(tl.where(scale == 0.0, 0.0, scale * (a_k + d * s_k)), 0)
    tl.store(M_out + rows, mx, mask=rmask)
    tl.store(S_out + rows, s_acc, mask=rmask)
    if ENTROPY:
        tl.store(A_out + rows, a_acc, mask=rmask)
    # the target logit: one gathered weight row per hidden row, fp32 products and sums
    local = tl.load(LABELS + rows, mask=rmask, other=0) - v_offset
    owned = rmask & (local >= 0) & (local < V)
    safe = tl.where(owned, local, 0).to(tl.int64)
    acc = tl.zeros((BLOCK_R,), tl.float32)
    for k0 in range(0, n_h, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        kmask = ks < n_h
        h = tl.load(Hd + rows[:, None].to(tl.int64) * stride_h + ks[None, :],
                    mask=owned[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        w = tl.load(W + safe[:, None] * stride_w + ks[None, :],
                    mask=owned[:, None] & kmask[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(h * w, 1)
    if HAS_BIAS:
        acc += tl.load(B + safe, mask=owned, other=0.0).to(tl.float32)
    if SOFTCAP > 0:
        acc = _softcap(acc, SOFTCAP)
    tl.store(T_out + rows, tl.where(owned, acc * inv_t, 0.0), mask=rmask)


def finish(m, s, a, hidden, weight, bias, labels, v_offset: int, inv_t: float, softcap: float = 0.0):
    """Merged ``(m, s, a or None, target)`` fp32 ``[N]`` from the partials ``m, s, a`` (fp32 ``[S, N]``;
    ``a`` None without entropy) and the target logits of ``labels`` (int64 ``[N]``, global vocabulary
    ids; rows whose id is outside ``[v_offset, v_offset + V)`` get target 0) under ``hidden`` ``[N, H]``,
    this shard's ``weight`` ``[V, H]`` (same dtype, unit stride along H) and optional ``bias`` ``[V]``;
    ``softcap`` > 0: the target logit soft-capped as the partials' logits were (kernels/linear_logprobs_fwd.py)."""
    n_split, n = m.shape
    entropy = a is not None
    dev = hidden.device
    m_out = torch.empty(n, dtype=torch.float32, device=dev)
    s_out = torch.empty_like(m_out)
    a_out = torch.empty_like(m_out) if entropy else None
    t_out = torch.empty_like(m_out)
    if n == 0:
        return m_out, s_out, a_out, t_out
    for name, t in (("hidden", hidden), ("weight", weight)):
        if t.stride(1) != 1:
            raise ValueError(f"finish: {name} must have unit stride along H, got strides {t.stride()}")
    labels = labels.contiguous()
    _finish_kernel[(triton.cdiv(n, BLOCK_R),)](
        m, s, a if entropy else s, n_split, n, hidden, hidden.stride(0), weight, weight.stride(0),
        bias if bias is not None else hidden, labels, int(v_offset), weight.shape[0], hidden.shape[1],
        float(inv_t), m_out, s_out, a_out if entropy else s_out, t_out,
        HAS_BIAS=bias is not None, ENTROPY=entropy, BLOCK_R=BLOCK_R, BLOCK_S=BLOCK_S, BLOCK_H=BLOCK_H,
        SOFTCAP=float(softcap), num_warps=NUM_WARPS, **LAUNCH_OPTIONS)
    return m_out, s_out, a_out, t_out
