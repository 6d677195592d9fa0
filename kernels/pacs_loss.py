"""Grouped PACS loss: a one- or two-pass forward and a one-pass backward, plus thin launchers.

The two-pass forward and the backward stream the tokens over a 2-D grid ``(row block, token split)`` so
that every SM has programs in flight (issue 22: the loss at memory speed) whatever the shape. Where each
group is small or the groups alone fill the GPU, the one-pass forward (``_pacs_one_pass_kernel``) does the
whole forward in one launch, a program per group: one Triton launch fewer per call, which is host time
(issue 39: a call's wall time is mostly the host's). ``launch_config("fwd_one")`` chooses
(kernels/pacs_loss_launch.py). Formulas: the docstrings of pacs_fast/algorithms/pacs.py.

One-pass forward (``_pacs_one_pass_kernel``), grid ``(B / G,)``: program ``g`` reads ``[BLOCK_G, BLOCK_T]``
tiles of its group's rows (each row's own length) into per-row sums, then runs steps 2-5 below.

Forward, pass A (``_pacs_sums_kernel``), grid ``(cdiv(B, ROWS), N_SPLIT)``: program ``(b, s)``
reads ``[ROWS, BLOCK_T]`` tiles of ``logp`` (``- logp_ref``, ``* mask``) at token blocks
``s, s + N_SPLIT, s + 2 N_SPLIT, ...`` of rows ``b * ROWS ...`` (each row's own length) and
writes the row's partial sums ``sum_t mask * x`` and ``sum_t mask`` into a ``[2, B, N_SPLIT]``
workspace (no atomics; a program past a row's end stores zeros).

Forward, pass B (``_pacs_group_kernel``), one program per group of ``G`` consecutive sequences:

1. reduces the ``[G, N_SPLIT]`` partials in a fixed order -> proxy ``r_i`` (``logratio`` or
   ``mean_logp``);
2. group statistics -> score ``psi_i`` (``rloo`` / ``grpo`` / ``dr_grpo`` / ``naive``);
3. class-balanced weight ``w_i`` (``question`` / ``none`` / ``only_positive`` / ``only_negative``);
4. per-sample weighted BCE-with-logits and the group's share of the loss (summed afterwards in a
   fixed order: deterministic, no atomics);
5. the per-sequence gradient coefficient ``coef_k = d loss / d logp[k, t] / mask[k, t]``
   (the loss is known in the forward, so the backward only scales and broadcasts it).

Backward (``_pacs_bwd_kernel``): ``dlogp[k, t] = grad_loss * coef_k * mask[k, t]`` in one pass over
the same kind of ``(row block, token split)`` grid.

Layouts: padded (``PACKED=False``): row ``i`` starts at ``i * T`` and has ``T`` tokens (contiguous
``[B, T]``). Packed (``PACKED=True``): row ``i`` is ``[cu_seqlens[i], cu_seqlens[i+1])`` of a 1-D
buffer (spans clamped into the buffer, ``_row_span``). ``mask`` is optional (``HAS_MASK``); a bool mask
selects, a numeric mask multiplies, and positions where it is 0 never reach the sums (even NaN / Inf).
Everything is accumulated in fp32 (fp64 for fp64 ``logp``) whatever the input dtype. Packed grids are
sized from the average row length (no device sync): a row much longer than the average is read by its
row block's N_SPLIT programs, several blocks each; packed rows start anywhere, so their loads are not
vectorised (padded rows: 16-byte loads, checked by tests/test_kernels_compile.py).

The launch parameters (tiles, grid, warps; the overrides ``CONFIG`` and ``POLICY``) are
kernels/pacs_loss_launch.py's. This module imports only triton, torch and that module.
"""
from __future__ import annotations

import functools
import struct

import torch
import triton
import triton.language as tl

from . import LAUNCH_OPTIONS
from .pacs_loss_launch import _arch, _sm_count, launch_config, launch_configs  # noqa: F401 (launch_config: aot_cases)

SCORES = {"rloo": 0, "grpo": 1, "dr_grpo": 2, "naive": 3}
WEIGHT_MODES = {"question": 0, "none": 1, "only_positive": 2, "only_negative": 3}
PROXIES = {"logratio": 0, "mean_logp": 1}

MAX_GROUP_SIZE = 1024
GRPO_EPS = 1e-6


@triton.jit
def _row_span(cu_ptr, rows, valid, T, PACKED: tl.constexpr):
    """(start, length, longest length) of ``rows`` (int64; rows with ``valid`` False: length 0). Packed:
    ``T`` is the buffer's length, and each span is clamped into ``[0, T)`` (``cu_seqlens`` is not checked
    on the host, which would be a device sync: a wrong one gives wrong sums, never an access outside)."""
    if PACKED:
        start = tl.load(cu_ptr + rows, mask=valid, other=0).to(tl.int64)
        end = tl.load(cu_ptr + rows + 1, mask=valid, other=0).to(tl.int64)
        start = tl.minimum(tl.maximum(start, 0), T)
        length = tl.minimum(tl.maximum(end, start), T) - start
        max_len = tl.max(length, axis=0)
    else:
        start = rows * T  # int64: B * T may exceed 2**31
        length = tl.where(valid, T, 0).to(tl.int64)
        max_len = T
    return start, length, max_len


@triton.jit
def _in_rows(tt, valid, length, T, PACKED: tl.constexpr):
    """[ROWS, BLOCK_T] mask of the token positions ``tt`` inside their rows. Padded rows compare
    with the scalar ``T``: a per-row bound would hide the alignment and make every load scalar."""
    if PACKED:
        inb = tt[None, :] < length[:, None]
    else:
        inb = (tt[None, :] < T) & valid[:, None]
    return inb


@triton.jit
def _token_sums(logp_ptr, ref_ptr, mask_ptr, start, length, valid, max_len, T, t_first, t_step,
                ACC: tl.constexpr, PACKED: tl.constexpr, HAS_MASK: tl.constexpr, HAS_REF: tl.constexpr,
                ROWS: tl.constexpr, BLOCK_T: tl.constexpr):
    """Per row of ``ROWS``: ``(sum_t mask * x, sum_t mask)`` over the token blocks starting at ``t_first``,
    ``t_first + t_step``, ... (``x = logp - logp_ref`` with ``HAS_REF``, else ``logp``), in ``ACC``."""
    acc = tl.zeros([ROWS, BLOCK_T], dtype=ACC)
    cnt = tl.zeros([ROWS, BLOCK_T], dtype=ACC)
    offs_t = tl.arange(0, BLOCK_T)
    for t0 in range(t_first, max_len, t_step):
        tt = t0 + offs_t
        inb = _in_rows(tt, valid, length, T, PACKED)
        idx = start[:, None] + tt[None, :]
        x = tl.load(logp_ptr + idx, mask=inb, other=0.0).to(ACC)
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
    return tl.sum(acc, axis=1), tl.sum(cnt, axis=1)


@triton.jit
def _group_finish(s, n_tok, grp, rows, offs_g, valid_g, b64, g_float,
                  beta_hi, beta_lo, inv_b_hi, inv_b_lo, eps_hi, eps_lo, rewards_ptr, terms_ptr, coef_ptr,
                  partial_ptr, ACC: tl.constexpr, PROXY: tl.constexpr, SCORE: tl.constexpr,
                  WEIGHT: tl.constexpr, BLOCK_G: tl.constexpr):
    """Steps 1-5 of the module docstring for the group ``grp`` from its rows' sums ``s`` and token
    counts ``n_tok`` ([BLOCK_G], ``ACC``): writes the terms, the coefficients and the group's share."""
    # float scalars arrive as fp32 pairs (hi + lo) so that the fp64 path keeps full precision
    beta = tl.cast(beta_hi, ACC) + tl.cast(beta_lo, ACC)
    inv_B = tl.cast(inv_b_hi, ACC) + tl.cast(inv_b_lo, ACC)
    eps = tl.cast(eps_hi, ACC) + tl.cast(eps_lo, ACC)
    Gf = tl.cast(g_float, ACC)  # exact: G <= MAX_GROUP_SIZE (an int arg equal to 1 is a constexpr)
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
        # fractionally (n_1 = sum R, n_0 = sum (1 - R)), w = R G/(2 n_1) + (1 - R) G/(2 n_0); n_0 summed,
        # not G - n_1: with rewards near 1 that difference cancels (n_0 = 1e-3 off by 1e-4 relative in fp32)
        n_pos = tl.sum(R, axis=0)
        n_neg = tl.sum(tl.where(valid_g, 1.0 - R, 0.0), axis=0)
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
    # softplus(psi) - R psi as (1 - R) psi + log1p(e) for psi >= 0 and -R psi + log1p(e) below, e = exp(-|psi|):
    # the linear part exact; softplus - R psi cancelled for a confident sample (psi = 16, R = 1: 0 for 1.1e-7)
    e = tl.exp(-tl.abs(psi))  # in (0, 1]: no overflow
    u = 1.0 + e
    log1p_e = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))  # log1p(e), Goldberg's form
    pos = psi >= 0
    sample_loss = w * (tl.where(pos, (1.0 - R) * psi, -R * psi) + log1p_e)
    sample_loss = tl.where(valid_g, sample_loss, 0.0)
    q = e / u  # sigmoid(-|psi|)
    pred = tl.where(pos, 1.0 / u, q)

    # ---- 5. d loss / d r_k, then the per-token coefficient --------------------------------
    # sigmoid(psi) - R without its cancellation: (1 - R) - q for psi >= 0, q - R below
    g = tl.where(valid_g, w * tl.where(pos, (1.0 - R) - q, q - R) * inv_B, 0.0)
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

    # the terms: [5, B] rows proxy, score, pred_reward, weight, sample_loss
    tl.store(terms_ptr + rows, r, mask=valid_g)
    tl.store(terms_ptr + b64 + rows, psi, mask=valid_g)
    tl.store(terms_ptr + 2 * b64 + rows, pred, mask=valid_g)
    tl.store(terms_ptr + 3 * b64 + rows, w, mask=valid_g)
    tl.store(terms_ptr + 4 * b64 + rows, sample_loss, mask=valid_g)
    tl.store(coef_ptr + rows, coef, mask=valid_g)
    tl.store(partial_ptr + grp, tl.sum(sample_loss, axis=0) * inv_B)


@triton.jit
def _pacs_sums_kernel(
    logp_ptr, ref_ptr, mask_ptr, cu_ptr, ws_ptr,
    B, T,
    ACC: tl.constexpr, PACKED: tl.constexpr, HAS_MASK: tl.constexpr, HAS_REF: tl.constexpr,
    ROWS: tl.constexpr, BLOCK_T: tl.constexpr,
):
    # pass A: masked partial sums of ROWS rows over the token blocks split, split + n_split, ...;
    # the workspace holds the [B, n_split] sums, then the [B, n_split] counts
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    valid = rows < B
    start, length, max_len = _row_span(cu_ptr, rows, valid, T, PACKED)
    s, n_tok = _token_sums(logp_ptr, ref_ptr, mask_ptr, start, length, valid, max_len, T, split * BLOCK_T,
                           n_split * BLOCK_T, ACC, PACKED, HAS_MASK, HAS_REF, ROWS, BLOCK_T)
    out = rows * n_split + split  # [B, n_split] row-major: a group's partials are contiguous
    tl.store(ws_ptr + out, s, mask=valid)
    tl.store(ws_ptr + tl.cast(B, tl.int64) * n_split + out, n_tok, mask=valid)


@triton.jit
def _pacs_group_kernel(
    ws_ptr, rewards_ptr, terms_ptr, coef_ptr, partial_ptr,
    B, n_split, G, g_float, beta_hi, beta_lo, inv_b_hi, inv_b_lo, eps_hi, eps_lo,
    ACC: tl.constexpr, PROXY: tl.constexpr, SCORE: tl.constexpr, WEIGHT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr,
):
    # pass B: one program per group reduces pass A's partials in a fixed order, then finishes the group
    grp = tl.program_id(0).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    valid_g = offs_g < G
    rows = grp * G + offs_g
    acc = tl.zeros([BLOCK_G, BLOCK_S], dtype=ACC)
    cnt = tl.zeros([BLOCK_G, BLOCK_S], dtype=ACC)
    offs_s = tl.arange(0, BLOCK_S)
    b64 = tl.cast(B, tl.int64)  # (an int argument equal to 1 arrives as a constexpr)
    for s0 in range(0, n_split, BLOCK_S):
        ss = s0 + offs_s
        inb = valid_g[:, None] & (ss[None, :] < n_split)
        idx = rows[:, None] * n_split + ss[None, :]
        acc += tl.load(ws_ptr + idx, mask=inb, other=0.0)
        cnt += tl.load(ws_ptr + b64 * n_split + idx, mask=inb, other=0.0)
    _group_finish(tl.sum(acc, axis=1), tl.sum(cnt, axis=1), grp, rows, offs_g, valid_g, b64, g_float,
                  beta_hi, beta_lo, inv_b_hi, inv_b_lo, eps_hi, eps_lo, rewards_ptr, terms_ptr, coef_ptr,
                  partial_ptr, ACC, PROXY, SCORE, WEIGHT, BLOCK_G)


@triton.jit
def _pacs_one_pass_kernel(
    logp_ptr, ref_ptr, mask_ptr, cu_ptr, rewards_ptr, terms_ptr, coef_ptr, partial_ptr,
    B, T, G, g_float, beta_hi, beta_lo, inv_b_hi, inv_b_lo, eps_hi, eps_lo,
    ACC: tl.constexpr, PACKED: tl.constexpr, HAS_MASK: tl.constexpr, HAS_REF: tl.constexpr,
    PROXY: tl.constexpr, SCORE: tl.constexpr, WEIGHT: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_T: tl.constexpr,
):
    # the whole forward in one launch: one program per group streams its G rows, then finishes the group
    grp = tl.program_id(0).to(tl.int64)
    offs_g = tl.arange(0, BLOCK_G)
    valid_g = offs_g < G
    rows = grp * G + offs_g
    start, length, max_len = _row_span(cu_ptr, rows, valid_g, T, PACKED)
    s, n_tok = _token_sums(logp_ptr, ref_ptr, mask_ptr, start, length, valid_g, max_len, T, 0, BLOCK_T,
                           ACC, PACKED, HAS_MASK, HAS_REF, BLOCK_G, BLOCK_T)
    _group_finish(s, n_tok, grp, rows, offs_g, valid_g, tl.cast(B, tl.int64), g_float,
                  beta_hi, beta_lo, inv_b_hi, inv_b_lo, eps_hi, eps_lo, rewards_ptr, terms_ptr, coef_ptr,
                  partial_ptr, ACC, PROXY, SCORE, WEIGHT, BLOCK_G)


@triton.jit
def _pacs_bwd_kernel(
    grad_ptr, coef_ptr, mask_ptr, cu_ptr, dlogp_ptr,
    B, T,
    PACKED: tl.constexpr, HAS_MASK: tl.constexpr, ROWS: tl.constexpr, BLOCK_T: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    split = tl.program_id(1)
    n_split = tl.num_programs(1)
    valid = rows < B
    start, length, max_len = _row_span(cu_ptr, rows, valid, T, PACKED)
    c = tl.load(coef_ptr + rows, mask=valid, other=0.0) * tl.load(grad_ptr).to(coef_ptr.dtype.element_ty)
    offs_t = tl.arange(0, BLOCK_T)
    for t0 in range(split * BLOCK_T, max_len, n_split * BLOCK_T):
        tt = t0 + offs_t
        inb = _in_rows(tt, valid, length, T, PACKED)
        idx = start[:, None] + tt[None, :]
        if HAS_MASK:
            m = tl.load(mask_ptr + idx, mask=inb, other=0).to(c.dtype)
            val = tl.where(m != 0, c[:, None] * m, 0.0)
        else:
            val = tl.zeros([ROWS, BLOCK_T], c.dtype) + c[:, None]
        tl.store(dlogp_ptr + idx, val.to(dlogp_ptr.dtype.element_ty), mask=inb)


@functools.lru_cache(maxsize=256)
def _hi_lo(x: float) -> tuple[float, float]:
    """``x == hi + lo`` (to ~2**-48) with ``hi`` and ``lo`` exactly representable in fp32 (memoised: a
    run passes the same beta and batch size call after call)."""
    hi = struct.unpack("f", struct.pack("f", float(x)))[0]
    return hi, float(x) - hi


def _as_kernel_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None:
        return None
    mask = mask.contiguous()
    return mask.view(torch.uint8) if mask.dtype == torch.bool else mask


def pacs_loss_fwd(logp, logp_ref, mask, rewards, cu_seqlens, *, group_size, beta, score,
                  weight_mode, proxy):
    """Launches the forward: one kernel, or pass A and pass B (``launch_config("fwd_one")`` chooses; no
    validation: the caller validates).

    logp: [B, T] (padded, contiguous) or [total] (packed with ``cu_seqlens`` [B + 1] int32/int64),
    any float dtype. logp_ref: same layout, or None (only with ``proxy="mean_logp"``).
    mask: same layout (bool or numeric, 0 = padding) or None (every token counts). rewards: [B]
    (contiguous, in the compute dtype). Compute dtype: fp64 for fp64 ``logp``, else fp32.
    Returns ``(loss, terms, coef)``: loss 0-d; terms [5, B], the rows proxy, score, pred_reward,
    weight and sample_loss; coef [B], ``coef[k] = d loss / d logp[k, t]`` for a token with mask 1;
    all in the compute dtype.

    Host time is most of a call's wall time (bench/bench_pacs_loss_host.py): one allocation for
    the workspace, the terms and the loss shares (the kernels find their parts by offset), one for
    the coefficient the backward saves (its own: views share a version counter, and an in-place
    edit of a returned term must not invalidate the saved one), and no other tensor op but the
    final sum.
    """
    packed = cu_seqlens is not None
    B = rewards.shape[0]
    T = logp.shape[0] if packed else logp.shape[1]  # packed: the buffer's length (the spans' bound)
    G = int(group_size)
    n_groups = B // G
    dev = logp.device
    wide = logp.dtype == torch.float64
    acc, acc_tl = (torch.float64, tl.float64) if wide else (torch.float32, tl.float32)
    one, sums, grp = launch_configs(("fwd_one", "fwd_sums", "fwd"), B=B, T=max(1, logp.numel() // B), G=G,
                                    dtype=logp.dtype, arch=_arch(dev), sm_count=_sm_count(dev))  # T: the average row
    ws_len = 0 if one["ONE_PASS"] else 2 * B * sums["N_SPLIT"]
    buf = torch.empty(ws_len + 5 * B + n_groups, device=dev, dtype=acc)
    _, terms, partial = buf.split_with_sizes((ws_len, 5 * B, n_groups))
    coef = torch.empty(B, device=dev, dtype=acc)
    kmask = _as_kernel_mask(mask)
    has_ref = logp_ref is not None and proxy == "logratio"
    inputs = (logp, logp_ref if has_ref else logp, logp if kmask is None else kmask, cu_seqlens if packed else logp)
    group = (G, float(G), *_hi_lo(beta), *_hi_lo(1.0 / B), *_EPS_HI_LO)
    options = dict(PROXY=PROXIES[proxy], SCORE=SCORES[score], WEIGHT=WEIGHT_MODES[weight_mode])
    if one["ONE_PASS"]:  # one launch: a program per group streams its rows and finishes the group
        _pacs_one_pass_kernel[(n_groups,)](
            *inputs, rewards, terms, coef, partial, B, T, *group,
            ACC=acc_tl, PACKED=packed, HAS_MASK=kmask is not None, HAS_REF=has_ref, **options,
            BLOCK_G=one["BLOCK_G"], BLOCK_T=one["BLOCK_T"], num_warps=one["num_warps"],
            num_stages=one["num_stages"], **LAUNCH_OPTIONS,
        )
    else:
        # pass A: partial sums (masked x, mask) per (row, split)
        _pacs_sums_kernel[(-(-B // sums["ROWS"]), sums["N_SPLIT"])](
            *inputs, buf, B, T,
            ACC=acc_tl, PACKED=packed, HAS_MASK=kmask is not None, HAS_REF=has_ref,
            ROWS=sums["ROWS"], BLOCK_T=sums["BLOCK_T"], num_warps=sums["num_warps"],
            num_stages=sums["num_stages"], **LAUNCH_OPTIONS,
        )
        # pass B: one program per group
        _pacs_group_kernel[(n_groups,)](
            buf, rewards, terms, coef, partial, B, sums["N_SPLIT"], *group, ACC=acc_tl, **options,
            BLOCK_G=grp["BLOCK_G"], BLOCK_S=grp["BLOCK_S"], num_warps=grp["num_warps"],
            num_stages=grp["num_stages"], **LAUNCH_OPTIONS,
        )
    loss = partial.sum()  # each group's share already carries the 1/B
    return loss, terms.view(5, B), coef


def pacs_loss_bwd(grad_loss, coef, mask, cu_seqlens, logp_shape, logp_dtype):
    """dlogp (shape ``logp_shape``, dtype ``logp_dtype``) = grad_loss * coef[row] * mask; ``grad_loss``
    one element (read on the device: no sync)."""
    packed = cu_seqlens is not None
    B = coef.shape[0]
    dlogp = torch.empty(logp_shape, device=coef.device, dtype=logp_dtype)
    if dlogp.numel() == 0:
        return dlogp
    T = logp_shape[0] if packed else logp_shape[1]
    cfg, = launch_configs(("bwd",), B=B, T=max(1, dlogp.numel() // B), G=1, dtype=logp_dtype,
                          arch=_arch(coef.device), sm_count=_sm_count(coef.device))
    kmask = _as_kernel_mask(mask)
    grad = grad_loss if grad_loss.dtype == coef.dtype else grad_loss.to(coef.dtype)  # read at [0]
    _pacs_bwd_kernel[(-(-B // cfg["ROWS"]), cfg["N_SPLIT"])](
        grad, coef, dlogp if kmask is None else kmask, cu_seqlens if packed else coef, dlogp, B, T,
        PACKED=packed, HAS_MASK=kmask is not None, ROWS=cfg["ROWS"], BLOCK_T=cfg["BLOCK_T"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **LAUNCH_OPTIONS,
    )
    return dlogp


_EPS_HI_LO = _hi_lo(GRPO_EPS)
