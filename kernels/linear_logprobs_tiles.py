"""The device-side pieces (``@triton.jit`` helpers) that the ``linear_logprobs`` kernels share: the logits
tile's K-loop (``_logits_tile``), the online and one-tile softmax partials (``_online_fold``,
``_tile_stats``) and their store (``_store_partial``), the backward's ``dz`` epilogue (``_dlogits_tile``,
``_capped_dlogits``), Gemma 2's logit soft-cap and its slope (``_softcap``, ``_softcap_and_slope``) and the grouped
tile order (``_grouped_tile``, ``_tile_ids``). kernels/linear_logprobs.py (the split forward, the atomic backward, the
pointer dz kernel), kernels/linear_logprobs_fwd.py, _tma.py, _gluon.py and _finish.py import them by name: a
``@triton.jit`` function finds the helpers it calls in its own module's globals. Their host-side counterparts
(launch parameters, ``_prec``, ``_upcast``) are in kernels/linear_logprobs_launch.py. This module imports only triton
and kernels/base2.py.

Notation as in kernels/linear_logprobs.py: the unscaled logits ``y = hidden @ weight.T + bias``, the scaled
``x = y * inv_t``. The row's log-sum-exp reaches ``_dlogits_tile`` in two parts, ``m`` (row max) and
``log s`` (``x - lse = (x - m) - log s``): a single fp32 ``lse = m + log s`` is rounded to ulp(m), which
for logits in the hundreds (3e-5 at 300) is an error of that size in every ``p`` of the row.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .base2 import LN2, LOG2E, T_MIN, finite_max, natural_partial

# The epilogues work in base 2 (kernels/base2.py) on the unscaled logits ``y = h @ W.T + b``
# (``x = y * inv_t``): per logit the forward issues a max, a subtraction and a multiply, an ex2, an add
# and (entropy) a clamp and an FMA; a few per-row operations follow.


@triton.jit
def _logits_tile(Hd, stride_h, W, stride_w, B, rows, cols, rmask, cmask, n_h,
                 HAS_BIAS: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr):
    """The unscaled logits ``y = hidden[rows] @ weight[cols].T + bias[cols]`` fp32 [BLOCK_N, BLOCK_V]
    (0 outside the rows / cols); the epilogues fold ``inv_t`` in."""
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
    return acc


@triton.jit
def _softcap(y, CAP: tl.constexpr):
    """Gemma 2's soft-cap ``CAP * tanh(y / CAP)`` of a logits tile (fp32): ``tanh(u) = sign(u) (1 - e) / (1 + e)``,
    ``e = exp(-2 |u|)``: one ex2, no overflow (+-inf gives +-CAP), few live registers; ``1 - e`` near ``u = 0`` errs
    by ~ulp(1) absolute, ~CAP * 6e-8 on the capped logit (the fp32 GEMM's own error of a logit ~CAP is ulp(CAP))."""
    e = tl.exp2(tl.abs(y) * (-2.0 * LOG2E / CAP))
    return tl.where(y < 0.0, -CAP, CAP) * ((1.0 - e) / (1.0 + e))


@triton.jit
def _softcap_and_slope(y, CAP: tl.constexpr):
    """``(CAP tanh(y / CAP), 1 / cosh(y / CAP)^2)`` of a logits tile, from one ``e = exp(-2 |y| / CAP)``: the slope
    ``4 e / (1 + e)^2`` has no cancellation where tanh saturates (``1 - tanh^2`` there is 0 or ~1e-7 off), 0 at
    +-inf."""
    e = tl.exp2(tl.abs(y) * (-2.0 * LOG2E / CAP))
    r = 1.0 / (1.0 + e)
    return tl.where(y < 0.0, -CAP, CAP) * ((1.0 - e) * r), 4.0 * e * r * r


@triton.jit
def _online_fold(my, s, a, y, c, ENTROPY: tl.constexpr):
    """Folds the unscaled logits tile ``y`` [BLOCK_N, BLOCK_V] (-inf in masked columns) into the running
    per-row base-2 sums ``(my, s, a)`` (``my``: max of y; ``s``, ``a``: relative to it, kernels/base2.py;
    ``natural_partial`` turns them into the merge's partial), ``c = inv_t log2(e)``:
    ``ops/vocab_parallel.py``'s merge, one tile at a time."""
    my_new = tl.maximum(my, tl.max(y, 1))
    ref = finite_max(my_new)
    d = (my - ref) * c  # -inf for the empty partial
    scale = tl.exp2(d)
    t = (y - ref[:, None]) * c
    e = tl.exp2(t)
    if ENTROPY:
        a = tl.where(scale == 0.0, 0.0, scale * (a + d * s))
        a += tl.sum(e * tl.maximum(t, T_MIN), 1)
    s = s * scale + tl.sum(e, 1)
    return my_new, s, a


@triton.jit
def _tile_stats(y, cmask, inv_t, ENTROPY: tl.constexpr):
    """The per-row partial ``(m, s, a)`` of ``x = y * inv_t`` for one unscaled logits tile ``y``
    [BLOCK_N, BLOCK_V] whose columns outside ``cmask`` do not exist (``_online_fold`` from the empty
    partial, without its dead rescale terms); ``a`` is ``s`` (unused) without ``ENTROPY``."""
    y = tl.where(cmask[None, :], y, float("-inf"))
    my = tl.max(y, 1)
    t = (y - finite_max(my)[:, None]) * (inv_t * LOG2E)
    e = tl.exp2(t)
    s = tl.sum(e, 1)
    a = s
    if ENTROPY:
        a = tl.sum(e * tl.maximum(t, T_MIN), 1)
    return natural_partial(my, s, a, inv_t, ENTROPY)


@triton.jit
def _store_partial(M_out, S_out, A_out, out, rmask, m, s, a, ENTROPY: tl.constexpr):
    """Stores one tile's per-row partial ``(m, s, a)`` at flat offsets ``out`` (``block * N + rows``)
    of the ``[S, N]`` outputs, rows outside ``rmask`` skipped."""
    tl.store(M_out + out, m, mask=rmask)
    tl.store(S_out + out, s, mask=rmask)
    if ENTROPY:
        tl.store(A_out + out, a, mask=rmask)


@triton.jit
def _dlogits_tile(y, rows, cols, rmask, cmask, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH,
                  ENTROPY: tl.constexpr):
    """dz = dx * inv_t of a recomputed unscaled logits tile ``y`` (``x = y * inv_t``); entries outside
    the rows / cols are not defined (the stores mask them; ``_grad_bwd_kernel`` zeroes them). Base 2
    as the forward: ``x - m`` is one FMA of y, ``(x - m - log s) log2(e)`` a second, then one ex2;
    ``inv_t`` and ``ln 2`` are folded into per-row factors."""
    m = tl.load(M + rows, mask=rmask, other=0.0)
    log_s = tl.load(LOGS + rows, mask=rmask, other=0.0)
    gl = tl.load(GL + rows, mask=rmask, other=0.0) * inv_t
    # two-part lse (module docstring): x - m first, one rounding
    t = tl.fma(tl.fma(y, inv_t, -m[:, None]), LOG2E, -(log_s * LOG2E)[:, None])
    p = tl.exp2(t)
    if ENTROPY:  # dz = -p (gh (x - lse) + gl + gh H) inv_t, with (x - lse) = t ln 2
        gh = tl.load(GH + rows, mask=rmask, other=0.0) * inv_t
        c = gl + gh * tl.load(ENT + rows, mask=rmask, other=0.0)
        dz = -p * tl.fma(tl.maximum(t, T_MIN), (gh * LN2)[:, None], c[:, None])
    else:
        dz = p * -gl[:, None]
    labels = (tl.load(LABELS + rows, mask=rmask, other=-1) - v_offset).to(tl.int32)  # a 32-bit compare below
    return dz + tl.where(cols[None, :] == labels[:, None], gl[:, None], 0.0)


@triton.jit
def _capped_dlogits(y, rows, cols, rmask, cmask, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH,
                    ENTROPY: tl.constexpr, SOFTCAP: tl.constexpr):
    """``_dlogits_tile`` of the raw logits tile ``y``; with ``SOFTCAP`` > 0, of the capped ``SOFTCAP tanh(y / SOFTCAP)``
    times the cap's slope ``1 / cosh(y / SOFTCAP)^2``: the gradient w.r.t. ``y``."""
    if SOFTCAP > 0:
        yc, slope = _softcap_and_slope(y, SOFTCAP)
        dz = _dlogits_tile(yc, rows, cols, rmask, cmask, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH,
                           ENTROPY) * slope
    else:
        dz = _dlogits_tile(y, rows, cols, rmask, cmask, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH, ENTROPY)
    return dz


@triton.jit
def _tile_ids(N, V, BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, GROUP_N: tl.constexpr):
    """(row block, vocab block) of this program; GROUP_N consecutive row blocks sweep the vocab
    blocks together so that concurrently running programs share weight tiles in L2."""
    return _grouped_tile(tl.program_id(0), tl.cdiv(N, BLOCK_N), tl.cdiv(V, BLOCK_V), GROUP_N)


@triton.jit
def _grouped_tile(pid, n_blocks_n, n_blocks_v, GROUP_N: tl.constexpr):
    """(row block, vocab block) of tile number ``pid`` in grouped order (see ``_tile_ids``)."""
    per_group = GROUP_N * n_blocks_v
    first_n = (pid // per_group) * GROUP_N
    group_size = tl.minimum(n_blocks_n - first_n, GROUP_N)
    pid_n = first_n + (pid % per_group) % group_size
    pid_v = (pid % per_group) // group_size
    return pid_n, pid_v
