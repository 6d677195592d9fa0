"""Grouped PACS loss: one fused forward kernel and one backward kernel, plus thin launchers.

Forward (``_pacs_fwd_kernel``), one program per group of ``G`` consecutive sequences, a
``[BLOCK_G, BLOCK_T]`` tile streamed over the tokens:

1. masked per-sequence sums over the tokens -> proxy ``r_i`` (``logratio`` or ``mean_logp``);
2. group statistics -> score ``psi_i`` (``rloo`` / ``grpo`` / ``dr_grpo`` / ``naive``);
3. class-balanced weight ``w_i`` (``question`` / ``none`` / ``only_positive`` / ``only_negative``);
4. per-sample weighted BCE-with-logits and the group's partial loss (summed afterwards, in a fixed
   order: deterministic, no atomics);
5. the per-sequence gradient coefficient ``coef_k = d loss / d logp[k, t] / mask[k, t]``
   (the loss is known in the forward, so the backward only scales and broadcasts it).

Backward (``_pacs_bwd_kernel``): ``dlogp[k, t] = grad_loss * coef_k * mask[k, t]`` in one pass,
grid ``(B, n_split)``, each program striding over its row's token blocks.

Layouts: padded (``PACKED=False``): row ``i`` starts at ``i * T`` and has ``T`` tokens (contiguous
``[B, T]``). Packed (``PACKED=True``): row ``i`` is ``[cu_seqlens[i], cu_seqlens[i+1])`` of a 1-D
buffer. ``mask`` is optional (``HAS_MASK``); a bool mask selects, a numeric mask multiplies, and
positions where it is 0 never reach the sums (even NaN / Inf). Everything is accumulated in fp32
(fp64 for fp64 ``logp``) whatever the input dtype. Formulas: DESIGN.md section 1.

This module imports only triton and torch.
"""
from __future__ import annotations

import struct

import torch
import triton
import triton.language as tl

SCORES = {"rloo": 0, "grpo": 1, "dr_grpo": 2, "naive": 3}
WEIGHT_MODES = {"question": 0, "none": 1, "only_positive": 2, "only_negative": 3}
PROXIES = {"logratio": 0, "mean_logp": 1}

MAX_GROUP_SIZE = 1024
GRPO_EPS = 1e-6


@triton.jit
def _pacs_fwd_kernel(
    logp_ptr, ref_ptr, mask_ptr, rewards_ptr, cu_ptr,
    proxy_ptr, score_ptr, pred_ptr, weight_ptr, sample_loss_ptr, coef_ptr, partial_ptr,
    T, G, g_float, beta_hi, beta_lo, inv_b_hi, inv_b_lo, eps_hi, eps_lo,
    ACC: tl.constexpr, PACKED: tl.constexpr, HAS_MASK: tl.constexpr, HAS_REF: tl.constexpr,
    PROXY: tl.constexpr, SCORE: tl.constexpr, WEIGHT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr,
):
    # float scalars arrive as fp32 pairs (hi + lo) so that the fp64 path keeps full precision
    beta = tl.cast(beta_hi, ACC) + tl.cast(beta_lo, ACC)
    inv_B = tl.cast(inv_b_hi, ACC) + tl.cast(inv_b_lo, ACC)
    eps = tl.cast(eps_hi, ACC) + tl.cast(eps_lo, ACC)
    Gf = tl.cast(g_float, ACC)  # exact: G <= MAX_GROUP_SIZE (an int arg equal to 1 is a constexpr)
    grp = tl.program_id(0).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    valid_g = offs_g < G
    rows = grp * G + offs_g  # int64: B * T may exceed 2**31
    if PACKED:
        start = tl.load(cu_ptr + rows, mask=valid_g, other=0).to(tl.int64)
        end = tl.load(cu_ptr + rows + 1, mask=valid_g, other=0).to(tl.int64)
        length = end - start
        max_len = tl.max(length, axis=0)
    else:
        start = rows * T
        length = tl.where(valid_g, T, 0).to(tl.int64)
        max_len = T

    # ---- 1. masked per-sequence sums ------------------------------------------------------
    acc = tl.zeros([BLOCK_G, BLOCK_T], dtype=ACC)
    cnt = tl.zeros([BLOCK_G, BLOCK_T], dtype=ACC)
    offs_t = tl.arange(0, BLOCK_T)
    for t0 in range(0, max_len, BLOCK_T):
        tt = t0 + offs_t
        inb = (tt[None, :] < length[:, None]) & valid_g[:, None]
        idx = start[:, None] + tt[None, :]
        x = tl.load(logp_ptr + idx, mask=inb, other=0.0).to(ACC)
        if PROXY == 0:
            if HAS_REF:
                x = x - tl.load(ref_ptr + idx, mask=inb, other=0.0).to(ACC)
        if HAS_MASK:
            m = tl.load(mask_ptr + idx, mask=inb, other=0).to(ACC)
            # masked-out positions never reach the sums, even NaN / Inf
            acc += tl.where(m != 0, x * m, 0.0)
            cnt += m
        else:
            acc += x
            cnt += inb.to(ACC)
    s = tl.sum(acc, axis=1)
    n_tok = tl.sum(cnt, axis=1)
    if PROXY == 0:
        r = beta * s
    else:
        r = tl.where(n_tok > 0, beta * s / tl.where(n_tok > 0, n_tok, 1.0), 0.0)
    r = tl.where(valid_g, r, 0.0)

    # ---- 2. group statistics -> score -------------------------------------------------------
    # Centre after shifting by the group's first proxy (same value, better rounding): a group of
    # equal proxies then centres to exactly 0 instead of +-1 ulp noise that grpo's 1/(std + eps)
    # would amplify (the torch reference does the same).
    r0 = tl.sum(tl.where(offs_g == 0, r, 0.0), axis=0)
    shifted = tl.where(valid_g, r - r0, 0.0)
    d = tl.where(valid_g, shifted - tl.sum(shifted, axis=0) / Gf, 0.0)
    if SCORE == 0:  # rloo: r_i - (S - r_i)/(G-1) == G/(G-1) (r_i - mean)
        psi = d * (Gf / (Gf - 1.0))
    elif SCORE == 1:  # grpo, unbiased std
        std = tl.sqrt(tl.sum(d * d, axis=0) / (Gf - 1.0))
        den = std + eps
        psi = d / den
    elif SCORE == 2:  # dr_grpo
        psi = d
    else:  # naive
        psi = r
    psi = tl.where(valid_g, psi, 0.0)

    # ---- 3. weights -------------------------------------------------------------------------
    R = tl.load(rewards_ptr + rows, mask=valid_g, other=0.0).to(ACC)
    if WEIGHT == 0:
        # question: sklearn "balanced" inside groups holding both labels; soft rewards count
        # fractionally (n_1 = sum R, n_0 = G - n_1), w = R G/(2 n_1) + (1 - R) G/(2 n_0)
        n_pos = tl.sum(R, axis=0)
        n_neg = Gf - n_pos
        mixed = (n_pos > 0) & (n_neg > 0)
        w_pos = Gf / (2.0 * tl.where(mixed, n_pos, 1.0))
        w_neg = Gf / (2.0 * tl.where(mixed, n_neg, 1.0))
        w = tl.where(mixed, R * w_pos + (1.0 - R) * w_neg, 1.0)
    elif WEIGHT == 1:
        w = tl.zeros([BLOCK_G], ACC) + 1.0
    elif WEIGHT == 2:
        w = R
    else:
        w = 1.0 - R
    w = tl.where(valid_g, w, 0.0)

    # ---- 4. weighted BCE with logits ----------------------------------------------------------
    e = tl.exp(-tl.abs(psi))  # in (0, 1]: no overflow
    softplus = tl.maximum(psi, 0.0) + tl.log(1.0 + e)
    sample_loss = w * (softplus - R * psi)
    sample_loss = tl.where(valid_g, sample_loss, 0.0)
    pred = tl.where(psi >= 0, 1.0 / (1.0 + e), e / (1.0 + e))

    # ---- 5. d loss / d r_k, then the per-token coefficient --------------------------------
    g = tl.where(valid_g, w * (pred - R) * inv_B, 0.0)
    sum_g = tl.sum(g, axis=0)
    if SCORE == 0:
        dr = (Gf * g - sum_g) / (Gf - 1.0)
    elif SCORE == 1:
        # psi_i = d_i / (std + eps); d std / d r_k = d_k / ((G - 1) std), taken as 0 when std == 0
        gd = tl.sum(g * d, axis=0)
        safe_std = tl.where(std > 0, std, 1.0)
        dstd = tl.where(std > 0, d / ((Gf - 1.0) * safe_std), 0.0)
        dr = (g - sum_g / Gf) / den - gd / (den * den) * dstd
    elif SCORE == 2:
        dr = g - sum_g / Gf
    else:
        dr = g
    coef = beta * dr
    if PROXY == 1:
        coef = tl.where(n_tok > 0, coef / tl.where(n_tok > 0, n_tok, 1.0), 0.0)

    tl.store(proxy_ptr + rows, r, mask=valid_g)
    tl.store(score_ptr + rows, psi, mask=valid_g)
    tl.store(pred_ptr + rows, pred, mask=valid_g)
    tl.store(weight_ptr + rows, w, mask=valid_g)
    tl.store(sample_loss_ptr + rows, sample_loss, mask=valid_g)
    tl.store(coef_ptr + rows, coef, mask=valid_g)
    tl.store(partial_ptr + grp, tl.sum(sample_loss, axis=0))


@triton.jit
def _pacs_bwd_kernel(
    grad_ptr, coef_ptr, mask_ptr, cu_ptr, dlogp_ptr,
    T,
    PACKED: tl.constexpr, HAS_MASK: tl.constexpr, N_SPLIT: tl.constexpr, BLOCK_T: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    if PACKED:
        start = tl.load(cu_ptr + row).to(tl.int64)
        length = tl.load(cu_ptr + row + 1).to(tl.int64) - start
    else:
        start = row * T
        length = T
    c = tl.load(coef_ptr + row) * tl.load(grad_ptr).to(coef_ptr.dtype.element_ty)
    offs = tl.arange(0, BLOCK_T)
    for t0 in range(split * BLOCK_T, length, N_SPLIT * BLOCK_T):
        tt = t0 + offs
        inb = tt < length
        idx = start + tt
        if HAS_MASK:
            m = tl.load(mask_ptr + idx, mask=inb, other=0).to(c.dtype)
            val = tl.where(m != 0, c * m, 0.0)
        else:
            val = tl.zeros([BLOCK_T], c.dtype) + c
        tl.store(dlogp_ptr + idx, val.to(dlogp_ptr.dtype.element_ty), mask=inb)


def _hi_lo(x: float) -> tuple[float, float]:
    """``x == hi + lo`` (to ~2**-48) with ``hi`` and ``lo`` exactly representable in fp32."""
    hi = struct.unpack("f", struct.pack("f", float(x)))[0]
    return hi, float(x) - hi


def _as_kernel_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None:
        return None
    mask = mask.contiguous()
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask


KERNELS = ("fwd", "bwd")


def launch_config(kernel: str, *, B: int, T: int, G: int, dtype: torch.dtype, arch: int | None) -> dict:
    """Launch parameters of ``kernel`` (``"fwd"`` or ``"bwd"``) for ``B`` sequences of ``T`` tokens
    on average in groups of ``G`` (``dtype`` of ``logp``; ``arch`` = compute capability * 10 or
    None). The launchers and tests/test_kernels_compile.py both call this.

    fwd: one program per group holds a ``[BLOCK_G, BLOCK_T]`` tile of at most 4096 elements
    (``BLOCK_G`` = next power of two >= G): two fp32 accumulators of 4096 / (32 * num_warps)
    values per thread, far from the register limit on sm_80/90/100 (compile report in
    docs/GPU.md). bwd: a memory-bound broadcast, ``BLOCK_T`` about a quarter of a row (128 to
    1024) and up to 64 programs per row. fp64 ``logp`` (references) uses the same tiles."""
    if kernel == "fwd":
        block_g = max(triton.next_power_of_2(G), 2)
        block_t = max(16, min(512, 4096 // block_g))
        return dict(BLOCK_G=block_g, BLOCK_T=block_t, num_warps=4 if block_g * block_t <= 4096 else 8,
                    num_stages=3)
    if kernel == "bwd":
        avg_len = max(1, T)
        block_t = min(1024, max(128, triton.next_power_of_2(avg_len) // 4))
        return dict(BLOCK_T=block_t, N_SPLIT=min(64, triton.cdiv(avg_len, block_t)), num_warps=4,
                    num_stages=3)
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")


def _arch(device) -> int | None:
    if torch.device(device).type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def pacs_loss_fwd(logp, logp_ref, mask, rewards, cu_seqlens, *, group_size, beta, score,
                  weight_mode, proxy):
    """Launches the forward kernel (no validation: the caller validates).

    logp: [B, T] (padded, contiguous) or [total] (packed with ``cu_seqlens`` [B + 1] int32/int64),
    any float dtype. logp_ref: same layout, or None (only with ``proxy="mean_logp"``).
    mask: same layout (bool or numeric, 0 = padding) or None (every token counts). rewards: [B].
    Compute dtype: fp64 for fp64 ``logp``, else fp32.
    Returns ``(loss, proxy, score, pred_reward, weight, sample_loss, coef)``: loss 0-d, the others
    [B], all in the compute dtype; ``coef[k] = d loss / d logp[k, t]`` for a token with mask 1.
    """
    packed = cu_seqlens is not None
    B = rewards.shape[0]
    T = 0 if packed else logp.shape[1]
    G = int(group_size)
    n_groups = B // G
    dev = logp.device
    acc = torch.float64 if logp.dtype == torch.float64 else torch.float32
    outs = [torch.empty(B, device=dev, dtype=acc) for _ in range(6)]
    partial = torch.empty(n_groups, device=dev, dtype=acc)
    kmask = _as_kernel_mask(mask)
    cfg = launch_config("fwd", B=B, T=max(T, 1), G=G, dtype=logp.dtype, arch=_arch(dev))
    _pacs_fwd_kernel[(n_groups,)](
        logp, logp if logp_ref is None else logp_ref, logp if kmask is None else kmask,
        rewards.contiguous(), rewards if cu_seqlens is None else cu_seqlens,
        *outs, partial, T, G, float(G), *_hi_lo(beta), *_hi_lo(1.0 / B), *_hi_lo(GRPO_EPS),
        ACC=tl.float64 if acc == torch.float64 else tl.float32, PACKED=packed,
        HAS_MASK=kmask is not None, HAS_REF=logp_ref is not None,
        PROXY=PROXIES[proxy], SCORE=SCORES[score], WEIGHT=WEIGHT_MODES[weight_mode],
        BLOCK_G=cfg["BLOCK_G"], BLOCK_T=cfg["BLOCK_T"], num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    loss = partial.sum() / B
    return (loss, *outs)


def pacs_loss_bwd(grad_loss, coef, mask, cu_seqlens, logp_shape, logp_dtype):
    """dlogp (shape ``logp_shape``, dtype ``logp_dtype``) = grad_loss * coef[row] * mask."""
    packed = cu_seqlens is not None
    B = coef.shape[0]
    dlogp = torch.empty(logp_shape, device=coef.device, dtype=logp_dtype)
    if dlogp.numel() == 0:
        return dlogp
    T = 0 if packed else logp_shape[1]
    cfg = launch_config("bwd", B=B, T=max(1, dlogp.numel() // B), G=1, dtype=logp_dtype,
                        arch=_arch(coef.device))
    block_t, n_split = cfg["BLOCK_T"], cfg["N_SPLIT"]
    kmask = _as_kernel_mask(mask)
    grad = grad_loss.reshape(1).to(coef.dtype)
    _pacs_bwd_kernel[(B, n_split)](
        grad, coef, dlogp if kmask is None else kmask, coef if cu_seqlens is None else cu_seqlens,
        dlogp, T,
        PACKED=packed, HAS_MASK=kmask is not None, N_SPLIT=n_split, BLOCK_T=block_t,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return dlogp
