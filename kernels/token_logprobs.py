"""Triton kernels: per-row softmax statistics of a logits matrix, and the recomputed gradient.

Shapes: logits ``[N, V]`` (fp32/bf16/fp16, unit stride along V), per-row fp32 vectors ``[N]``.
All arithmetic is fp32; the temperature is folded in (``x = logits * inv_t``), and the exponentials
are taken in base 2 (kernels/base2.py: one ex2 instruction per logit, sums moved to natural units once
per row).

``stats_fwd``: grid ``(N, SPLITS)``; program (row, split) streams its contiguous vocab range in
``BLOCK_V`` blocks with an online max / sum-exp (and sum ``e * (x - m)`` for the entropy) and
writes the partial ``(m, s, a)`` to ``[SPLITS, N]`` outputs (merged on the host side, an O(N)
op; the same merge combines tensor-parallel ranks). Splits keep the GPU busy when N is small.

``grad_bwd``: grid ``(N, cdiv(V, BLOCK_V))``; each block is recomputed from the logits:

    dx = gl * onehot - p * (gh * xr + gl + gh * H),   xr = (x - m) - log(s),   p = exp(xr)
    dlogits = dx * inv_t  (0 on ignored rows)

The row's log-sum-exp is passed in two parts, the max ``m`` and ``log s``, never as one fp32
``lse = m + log s``: for logits in the hundreds ``lse`` would be rounded to ulp(m) (3e-5 at 300),
and ``p`` with it; ``x - m`` is exact for the large entries, so ``p`` keeps fp32 accuracy.

written to ``dlogits`` (which may alias ``logits``: each element is read, then written, by the
same program, so the in-place backward is safe).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import LAUNCH_OPTIONS, tuning
from .base2 import LN2, LOG2E, T_MIN, finite_max, natural_partial

# Overrides of the launch parameters (None: ``launch_config`` decides). Tests shrink the blocks
# to keep the interpreter fast and to exercise several blocks and splits on small shapes.
CONFIG = {"BLOCK_V": None, "BLOCK_V_BWD": None, "num_warps": None, "num_stages": None, "SPLITS": None}

# Per-architecture launch parameters (``arch`` = compute capability * 10; None: interpreter/CPU).
# Chosen from the ahead-of-time compile report (``python bench/gpu/compile_report.py``, table in
# docs/GPU.md; asserted by tests/test_kernels_compile.py): both kernels stream one row with
# BLOCK_V / (32 * num_warps) elements per thread, use no shared memory beyond the reduction
# scratch, and stay far below the register limit (no spills) on sm_80 / sm_90 / sm_100.
# They are memory-bound: BLOCK_V = 4096 with 8 warps gives 16 fp32 values (two 16-byte
# loads of bf16) per thread and per iteration, enough bytes in flight per SM.
_ARCH_CONFIGS = {
    "stats_fwd": {None: dict(BLOCK_V=4096, num_warps=8, num_stages=3)},
    "grad_bwd": {None: dict(BLOCK_V=4096, num_warps=8, num_stages=3)},
}
KERNELS = ("stats_fwd", "grad_bwd")


def launch_config(kernel: str, *, N: int, V: int, dtype: torch.dtype, arch: int | None) -> dict:
    """Launch parameters of ``kernel`` (``"stats_fwd"`` or ``"grad_bwd"``) for logits ``[N, V]``
    of ``dtype`` on compute capability ``arch`` (e.g. 80, 90; None off-GPU): a dict with
    ``BLOCK_V``, ``num_warps``, ``num_stages``. The launchers below and the compile test both
    call this, so the test checks exactly what runs. ``CONFIG`` entries that are not None win, then
    a measured table (kernels/tuning.py, written by bench/gpu/tune.py), then ``_ARCH_CONFIGS``."""
    if kernel not in _ARCH_CONFIGS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    table = _ARCH_CONFIGS[kernel]
    cfg = dict(table.get(arch, table[None]))
    cfg = tuning.apply(cfg, "token_logprobs", kernel, arch, "32" if dtype == torch.float32 else "16")
    block_key = "BLOCK_V" if kernel == "stats_fwd" else "BLOCK_V_BWD"
    if CONFIG[block_key] is not None:
        cfg["BLOCK_V"] = tuning.override(block_key, CONFIG[block_key])
    for k in ("num_warps", "num_stages"):
        if CONFIG[k] is not None:
            cfg[k] = tuning.override(k, CONFIG[k])
    cfg["BLOCK_V"] = min(cfg["BLOCK_V"], max(16, triton.next_power_of_2(max(V, 1))))
    return cfg


def device_arch(device) -> int | None:
    """Compute capability * 10 of a CUDA device (90 for an H100), None for other devices."""
    if torch.device(device).type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


@triton.jit
def _stats_fwd_kernel(X, stride_x, V, v_per_split, inv_t,
                      M_out, S_out, A_out, N,
                      ENTROPY: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    split = tl.program_id(1)
    v_lo = split * v_per_split
    v_hi = tl.minimum(V, v_lo + v_per_split)
    x_row = X + row.to(tl.int64) * stride_x
    c = inv_t * LOG2E  # base-2 sums relative to the running max of y (kernels/base2.py)
    my = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    a = tl.zeros((), tl.float32)
    for off in range(v_lo, v_hi, BLOCK_V):
        cols = off + tl.arange(0, BLOCK_V)
        y = tl.load(x_row + cols, mask=cols < v_hi, other=float("-inf")).to(tl.float32)
        my_new = tl.maximum(my, tl.max(y, 0))
        ref = finite_max(my_new)  # 0 while everything seen is -inf (avoids inf - inf)
        d = (my - ref) * c  # -inf while my = -inf: scale 0
        scale = tl.exp2(d)
        t = (y - ref) * c
        e = tl.exp2(t)
        if ENTROPY:
            a = tl.where(scale == 0.0, 0.0, scale * (a + d * s))
            a += tl.sum(e * tl.maximum(t, T_MIN), 0)
        s = s * scale + tl.sum(e, 0)
        my = my_new
    m, s, a = natural_partial(my, s, a, inv_t, ENTROPY)
    out = split * N + row
    tl.store(M_out + out, m)
    tl.store(S_out + out, s)
    if ENTROPY:
        tl.store(A_out + out, a)


@triton.jit
def _grad_bwd_kernel(X, stride_x, DX, stride_dx, V, inv_t,
                     LABELS, v_offset, ignore_index, M, LOGS, ENT, GL, GH,
                     ENTROPY: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    blk = tl.program_id(1)
    cols = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    cmask = cols < V
    label = tl.load(LABELS + row)
    valid = label != ignore_index
    y = tl.load(X + row.to(tl.int64) * stride_x + cols, mask=cmask, other=0.0).to(tl.float32)
    gl = tl.load(GL + row) * inv_t
    # two-part lse (module docstring), in base 2 as the forward: x - m first, one rounding
    t = tl.fma(tl.fma(y, inv_t, -tl.load(M + row)), LOG2E, -tl.load(LOGS + row) * LOG2E)
    p = tl.exp2(t)
    if ENTROPY:  # dx = -p (gh xr + gl + gh H) with xr = t ln 2, the factor inv_t folded into gl, gh
        gh = tl.load(GH + row) * inv_t
        c = gl + gh * tl.load(ENT + row)
        dx = -p * tl.fma(tl.maximum(t, T_MIN), gh * LN2, c)
    else:
        dx = p * -gl
    dx += tl.where(cols == (label - v_offset).to(tl.int32), gl, 0.0)
    dx = tl.where(valid, dx, 0.0)
    tl.store(DX + row.to(tl.int64) * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=cmask)


def _splits(n_rows: int, n_cols: int, block_v: int, device) -> int:
    if CONFIG["SPLITS"] is not None:
        return max(1, min(tuning.override("SPLITS", CONFIG["SPLITS"]), triton.cdiv(n_cols, block_v)))
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = triton.cdiv(4 * sms, max(n_rows, 1))  # ~4 programs per SM
    return max(1, min(want, triton.cdiv(n_cols, block_v)))


def stats_fwd(logits: torch.Tensor, inv_t: float, entropy: bool):
    """Partial statistics ``(m, s, a)`` each fp32 ``[SPLITS, N]`` (``a`` None without entropy)."""
    n, v = logits.shape
    cfg = launch_config("stats_fwd", N=n, V=v, dtype=logits.dtype, arch=device_arch(logits.device))
    block = cfg["BLOCK_V"]
    splits = _splits(n, v, block, logits.device)
    per = triton.cdiv(triton.cdiv(v, splits), block) * block
    splits = triton.cdiv(v, per)
    m = torch.empty(splits, n, dtype=torch.float32, device=logits.device)
    s = torch.empty_like(m)
    a = torch.empty_like(m) if entropy else s
    if n > 0:
        _stats_fwd_kernel[(n, splits)](logits, logits.stride(0), v, per, inv_t, m, s, a, n,
                                       ENTROPY=entropy, BLOCK_V=block, num_warps=cfg["num_warps"],
                                       num_stages=cfg["num_stages"], **LAUNCH_OPTIONS)
    return m, s, (a if entropy else None)


def grad_bwd(logits, dlogits, inv_t, labels, v_offset, ignore_index, m, log_s, ent, gl, gh):
    """Writes the logits gradient into ``dlogits`` (may be ``logits`` itself). ``m``/``log_s``:
    fp32 ``[N]`` row max and log sum-exp relative to it (``lse = m + log_s``, kept apart);
    ``gh``/``ent`` None without an entropy gradient; ``labels`` global ids, ``v_offset`` the
    shard's first id."""
    n, v = logits.shape
    cfg = launch_config("grad_bwd", N=n, V=v, dtype=logits.dtype, arch=device_arch(logits.device))
    block = cfg["BLOCK_V"]
    entropy = gh is not None
    if n > 0:
        _grad_bwd_kernel[(n, triton.cdiv(v, block))](
            logits, logits.stride(0), dlogits, dlogits.stride(0), v, inv_t,
            labels, v_offset, ignore_index, m, log_s, ent if entropy else m, gl, gh if entropy else gl,
            ENTROPY=entropy, BLOCK_V=block, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
            **LAUNCH_OPTIONS)
    return dlogits
