"""Triton kernels for log-probs from hidden states: ``x = (hidden @ weight.T + bias) * inv_t``
computed tile by tile; the ``[N, V]`` logits never exist in memory. A ``SOFTCAP`` > 0 (Gemma 2's
``final_logit_softcapping``) caps the logits first, ``SOFTCAP * tanh(y / SOFTCAP)``, in the tiled and split
forwards, the finish, the pointer dz kernel and the atomic backward (the backward through the cap's slope,
kernels/linear_logprobs_tiles.py ``_capped_dlogits``); the TMA and Gluon kernels have no cap (the dispatch
runs the tiled ones for a capped call).

Shapes: hidden ``[N, H]``, weight ``[V, H]`` (same dtype: fp32/bf16/fp16, unit stride along H),
bias ``[V]`` (any float dtype) or None; per-row fp32 vectors ``[N]``. ``tl.dot`` accumulates in fp32 (fp32 inputs
use IEEE fp32 products, not TF32, so fp32 results match a float64 reference to ~1e-5).

``stats_fwd`` runs one of four forwards (``forward_kind``: ``CONFIG["FWD"]``, else the tuned table's
measured choice, else "tiles"), all writing per-row partials
``(m, s, a)`` (max, sum-exp, sum ``e*(x-m)``) to ``[S, N]``; kernels/linear_logprobs_finish.py then
merges them (the merge that combines tensor-parallel ranks) and computes the target logit, an
O(N*H) gather-dot, in one pass.
Before a TMA or Gluon kernel runs, kernels/dispatch.py checks it (the inputs it takes, its import and
Triton API, its shared memory), and any error of it hands the work to the next (Gluon -> TMA -> tiled) with
one warning; ``PACS_FAST_KERNELS=safe`` keeps to the tiled kernels.
``"tiles"`` (default): kernels/linear_logprobs_fwd.py, one GEMM-shaped program per (row block,
vocab block) tile in grouped order, S = vocab blocks. ``"tma"``: kernels/linear_logprobs_tma.py,
the same tiles from TMA copies in a persistent loop (bf16 / fp16 on sm_90+, else "tiles"). ``"gluon"``:
kernels/linear_logprobs_gluon.py, the same tiles from a warp-specialised Gluon kernel (Hopper only,
else "tiles"). ``"split"``: grid ``(cdiv(N, BLOCK_N),
SPLITS)``, program (row block, split) loops over the logits tiles ``[BLOCK_N, BLOCK_V]`` of its
vocab range (a K-loop of ``tl.dot`` over H in ``BLOCK_H`` steps) with an online fold, S = SPLITS.

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

``grad_bwd_chunked`` (kernels/linear_logprobs_bwd.py; the default backward on GPU): vocabulary chunks
sized from a memory budget; per chunk ``_dlogits_kernel`` (or, by ``dz_kind``, the persistent TMA kernel of
kernels/linear_logprobs_tma.py or the Gluon one) recomputes the logits tiles (the same ``tl.dot`` K-loop)
and writes ``dz`` rounded to the input dtype into one ``[n_chunk, v_chunk]`` buffer, then two
cuBLAS GEMMs: ``dhidden += dz @ W[chunk]`` (fp32 accumulator) and ``dW[chunk] = dz.T @ hidden``
(written once when the chunk holds every row). No atomics, deterministic, and the GEMMs run at
cuBLAS speed; the price is the ``dz`` buffer (the budget) and one extra read/write of it.

The row's log-sum-exp reaches both backward kernels in two parts, ``m`` (row max) and ``log s``
(``xr = (x - m) - log s``): a single fp32 ``lse = m + log s`` is rounded to ulp(m), which for
logits in the hundreds (3e-5 at 300) is an error of that size in every ``p`` of the row.

Layers (no import cycle; tests/test_import_graph.py): this module dispatches and sits on top. The
``@triton.jit`` helpers every variant shares are in kernels/linear_logprobs_tiles.py; ``CONFIG``,
``launch_config`` and the other host-side launch helpers in kernels/linear_logprobs_launch.py (this module
re-exports ``CONFIG`` and ``launch_config``, the interface the ops layer, tests and benchmarks use). The
variants (_fwd, _tma, _gluon, _finish) import only those two (and kernels/base2.py), never this module;
it imports them at call time, through kernels/dispatch.py (a launcher replaced on its module, as the tests
do, takes effect).
kernels/linear_logprobs_bwd.py sits above this module (it launches ``_dlogits_kernel`` from here).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import LAUNCH_OPTIONS, dispatch, tuning
from .base2 import LOG2E, natural_partial
from .linear_logprobs_launch import CONFIG, _cfg, _prec, _upcast, _width, device_arch, launch_config  # noqa: F401
from .linear_logprobs_tiles import _capped_dlogits, _logits_tile, _online_fold, _softcap, _store_partial, _tile_ids

FORWARDS = ("tiles", "split", "tma", "gluon")  # the first: the built-in default (forward_kind)
DZ_KERNELS = ("pointer", "tma", "gluon")  # likewise (dz_kind)
# the launch_config kernel each forward / dz kind launches (where it takes the inputs)
FORWARD_KERNEL = {"tiles": "stats_tiles", "split": "stats_fwd", "tma": "stats_tma", "gluon": "stats_gluon"}
DZ_KERNEL = {"pointer": "dlogits", "tma": "dlogits_tma", "gluon": "dlogits_gluon"}


@triton.jit
def _stats_fwd_kernel(Hd, stride_h, W, stride_w, B, N, V, n_h, v_per_split, inv_t,
                      M_out, S_out, A_out,
                      HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr, SOFTCAP: tl.constexpr):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < N
    v_lo = split * v_per_split
    v_hi = tl.minimum(V, v_lo + v_per_split)
    my = tl.full((BLOCK_N,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK_N,), tl.float32)
    a = tl.zeros((BLOCK_N,), tl.float32)
    for v0 in range(v_lo, v_hi, BLOCK_V):
        cols = v0 + tl.arange(0, BLOCK_V)
        cmask = cols < v_hi
        y = _logits_tile(Hd, stride_h, W, stride_w, B, rows, cols, rmask, cmask, n_h,
                         HAS_BIAS, DOT_PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
        if SOFTCAP > 0:
            y = _softcap(y, SOFTCAP)
        my, s, a = _online_fold(my, s, a, tl.where(cmask[None, :], y, float("-inf")), inv_t * LOG2E, ENTROPY)
    m, s, a = natural_partial(my, s, a, inv_t, ENTROPY)
    _store_partial(M_out, S_out, A_out, split * N + rows, rmask, m, s, a, ENTROPY)


@triton.jit
def _dlogits_kernel(Hd, stride_h, W, stride_w, B, N, V, n_h, inv_t,
                    LABELS, v_offset, M, LOGS, ENT, GL, GH, DZ, stride_dz,
                    HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                    GROUP_N: tl.constexpr, SOFTCAP: tl.constexpr):
    # one chunk: Hd/LABELS/M/... start at the chunk's first row, W/B at its first vocab id
    # (``v_offset`` = that id minus the shard's first id); DZ is [N, V] with row stride stride_dz
    pid_n, pid_v = _tile_ids(N, V, BLOCK_N, BLOCK_V, GROUP_N)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < N
    cmask = cols < V
    y = _logits_tile(Hd, stride_h, W, stride_w, B, rows, cols, rmask, cmask, n_h,
                     HAS_BIAS, DOT_PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
    dz = _capped_dlogits(y, rows, cols, rmask, cmask, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH, ENTROPY,
                         SOFTCAP)
    tl.store(DZ + rows[:, None].to(tl.int64) * stride_dz + cols[None, :], dz.to(DZ.dtype.element_ty),
             mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _grad_bwd_kernel(Hd, stride_h, W, stride_w, B, N, V, n_h, inv_t,
                     LABELS, v_offset, M, LOGS, ENT, GL, GH,
                     DH, DW, DB,
                     HAS_BIAS: tl.constexpr, ENTROPY: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                     NEED_DW: tl.constexpr, NEED_DB: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
                     GROUP_N: tl.constexpr, SOFTCAP: tl.constexpr):
    pid_n, pid_v = _tile_ids(N, V, BLOCK_N, BLOCK_V, GROUP_N)

    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < N
    cmask = cols < V
    y = _logits_tile(Hd, stride_h, W, stride_w, B, rows, cols, rmask, cmask, n_h,
                     HAS_BIAS, DOT_PREC, UPCAST, BLOCK_N, BLOCK_V, BLOCK_H)
    dz = _capped_dlogits(y, rows, cols, rmask, cmask, inv_t, LABELS, v_offset, M, LOGS, ENT, GL, GH, ENTROPY,
                         SOFTCAP)
    dz = tl.where(rmask[:, None] & cmask[None, :], dz, 0.0)  # the dots and the bias sum read every entry
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


def forward_kind(arch: int | None = None, width: str = "16", h: int | None = None) -> str:
    """Which forward ``stats_fwd`` runs: ``CONFIG["FWD"]`` when set, else the measured choice
    ``linear_logprobs.forward.<width>`` of ``kernels/tuned/sm_<arch>.json`` (bench/gpu/tune.py writes it
    when it timed several forwards in one run; the one measured at the hidden size nearest ``h``), else
    ``"tiles"``. ``"tiles"``: ``stats_tiles``;
    ``"split"``: ``_stats_fwd_kernel``; ``"tma"``: ``stats_tma`` where ``tma_usable``; ``"gluon"``: the
    warp-specialised ``stats_gluon`` where ``gluon_usable`` (a Hopper GPU); else ``stats_tiles``.
    ``PACS_FAST_KERNELS=safe``: never "tma" / "gluon" (kernels/dispatch.py)."""
    return _kind("FWD", "forward", FORWARDS, arch, width, h)


def dz_kind(arch: int | None = None, width: str = "16", h: int | None = None) -> str:
    """Which dz kernel the chunked backward runs, as ``forward_kind``: ``CONFIG["DLOGITS"]``, else the
    measured choice ``linear_logprobs.dz.<width>``, else ``"pointer"`` (``_dlogits_kernel``); ``"tma"``
    and ``"gluon"`` where they take the inputs (else the pointer kernel)."""
    return _kind("DLOGITS", "dz", DZ_KERNELS, arch, width, h)


def _kind(config_key: str, job: str, allowed: tuple, arch: int | None, width: str, h: int | None) -> str:
    """``CONFIG[config_key]``, else the table's measured choice ``linear_logprobs.<job>.<width>``, else
    ``allowed[0]`` (the built-in default)."""
    kind = CONFIG[config_key]
    if kind is None:
        kind = tuning.choice(tuning.entry_key("linear_logprobs", job, width), arch, allowed, h) or allowed[0]
    if kind not in allowed:
        raise tuning.LaunchConfigError(f"CONFIG[{config_key!r}] must be one of {allowed}, got {kind!r}")
    if kind in ("tma", "gluon") and dispatch.mode() == "safe":  # PACS_FAST_KERNELS=safe: portable kernels
        return allowed[0]
    return kind


def stats_fwd(hidden, weight, bias, inv_t: float, entropy: bool, softcap: float = 0.0):
    """Partial ``(m, s, a)`` fp32 ``[S, N]`` of the scaled logits (``a`` None w/o entropy), to be
    merged along dim 0: S vocab blocks of the tiled forward, or S splits of the split one. A Gluon or
    TMA forward is checked before it runs and falls back (Gluon -> TMA -> tiled) on any error, with one
    warning (kernels/dispatch.py); the tiled forward's errors reach the caller (the ops layer's torch path).
    ``softcap`` > 0: of the soft-capped logits, by the tiled or split forward (the TMA / Gluon ones have no cap)."""
    kind = forward_kind(device_arch(hidden.device), _width(hidden.dtype), hidden.shape[1])
    if kind == "split":
        return _stats_split(hidden, weight, bias, inv_t, entropy, softcap)
    family, mod = dispatch.choose("tiles" if softcap else kind, FORWARD_KERNEL, hidden, weight)
    while family != "tiles":
        try:
            return getattr(mod, FORWARD_KERNEL[family])(hidden, weight, bias, inv_t, entropy)
        except Exception as e:  # compile or launch error: the next family (one warning)
            family, mod = dispatch.choose(dispatch.failed(family, FORWARD_KERNEL[family], e), FORWARD_KERNEL,
                                          hidden, weight)
    from .linear_logprobs_fwd import stats_tiles
    return stats_tiles(hidden, weight, bias, inv_t, entropy, softcap)


def _stats_split(hidden, weight, bias, inv_t: float, entropy: bool, softcap: float = 0.0):
    """The split forward (``CONFIG["FWD"] = "split"``): grid (row blocks, vocab splits)."""
    n, n_h = hidden.shape
    v = weight.shape[0]
    cfg = _cfg("stats_fwd", hidden, weight, softcap)
    bn, bv, bh = cfg["BLOCK_N"], cfg["BLOCK_V"], cfg["BLOCK_H"]
    n_blocks = triton.cdiv(n, bn)
    if CONFIG["SPLITS"] is not None:
        splits = tuning.override("SPLITS", CONFIG["SPLITS"])
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
            BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh, SOFTCAP=float(softcap),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **LAUNCH_OPTIONS)
    return m, s, (a if entropy else None)


def grad_bwd(hidden, weight, bias, inv_t, labels, v_offset, m, log_s, ent, gl, gh,
             need_weight_grad=True, need_bias_grad=True, softcap: float = 0.0):
    """One-pass atomic backward. Returns fp32 ``(dhidden [N, H], dweight [V, H] or None, dbias
    [V] or None)`` for one vocab shard (``labels`` global ids; rows with ``gl = gh = 0``
    contribute 0). ``m``/``log_s``: fp32 ``[N]`` row max and log sum-exp relative to it; ``softcap`` > 0: of the
    soft-capped logits."""
    n, n_h = hidden.shape
    v = weight.shape[0]
    cfg = _cfg("grad_bwd", hidden, weight, softcap)
    bn, bv = cfg["BLOCK_N"], cfg["BLOCK_V"]
    dh = torch.zeros(n, n_h, dtype=torch.float32, device=hidden.device)
    dw = torch.zeros(v, n_h, dtype=torch.float32, device=hidden.device) if need_weight_grad else None
    db = torch.zeros(v, dtype=torch.float32, device=hidden.device) \
        if bias is not None and need_bias_grad else None
    entropy = gh is not None
    if n > 0:
        grid = (triton.cdiv(n, bn) * triton.cdiv(v, bv),)
        _grad_bwd_kernel[grid](
            hidden, hidden.stride(0), weight, weight.stride(0), bias if bias is not None else hidden,
            n, v, n_h, inv_t, labels, v_offset, m, log_s, ent if entropy else m, gl, gh if entropy else gl,
            dh, dw if dw is not None else dh, db if db is not None else dh,
            HAS_BIAS=bias is not None, ENTROPY=entropy, DOT_PREC=_prec(hidden), UPCAST=_upcast(hidden),
            NEED_DW=dw is not None, NEED_DB=db is not None,
            BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=cfg["BLOCK_H"], GROUP_N=cfg["GROUP_N"], SOFTCAP=float(softcap),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **LAUNCH_OPTIONS)
    return dh, dw, db
