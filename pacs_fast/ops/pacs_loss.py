"""Fused grouped PACS loss (Triton): autograd Function and the public ``fused_pacs_loss``.

Same semantics and return values as ``pacs_fast.algorithms.pacs_loss(..., backend="torch")``;
formulas in :mod:`pacs_fast.algorithms.pacs`. The forward is one launch where each group is small or the
groups fill the GPU (a program per group streams its rows, then computes the proxies, the group scores,
the class-balanced weights, the BCE terms and the per-sequence gradient coefficient), else two: pass A
streams the tokens over a ``(row block, token split)`` grid into per-(row, split) partial sums, pass B
(one program per group) reduces them and finishes the group (``launch_config("fwd_one")`` chooses).
The backward kernel writes ``dlogp`` in one pass over a ``(row block, token split)`` grid
(kernels/pacs_loss.py). A call's wall time on a GPU is mostly host time (Python, autograd, Triton's
launcher: bench/bench_pacs_loss_host.py); the Function takes its options as one argument and returns
the five terms as one ``[5, B]`` output for that reason.

Cost: the forward reads logp, logp_ref and mask once; the backward reads mask and writes dlogp
once. Saved for backward: one ``[B]`` coefficient (plus references to mask / cu_seqlens). The
partials and the loss are reduced in a fixed order (deterministic, no atomics). Device syncs: none
(a step can be captured in a CUDA graph). The checks that read device values are opt-in: ``cu_seqlens``
with ``PACS_FAST_DEBUG_CHECKS=1`` (kernels/dispatch.py; one sync; without it a wrong ``cu_seqlens``
gives a wrong loss, never a read outside ``logp``: the kernels clamp each row's span into the buffer),
non-finite values and rewards outside [0, 1] with ``check_finite=True`` (one sync).
"""
from __future__ import annotations

import functools
import math
import numbers

import torch

from pacs_fast.kernels import pacs_loss as _k
from pacs_fast.kernels import dispatch
from pacs_fast.ops.backend import apply_op, refuse_double_backward, require_triton

SCORES = tuple(_k.SCORES)
WEIGHT_MODES = tuple(_k.WEIGHT_MODES)
PROXIES = tuple(_k.PROXIES)
TERM_KEYS = ("proxy", "score", "pred_reward", "weight", "sample_loss")


class _FusedPacsLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, logp_ref, mask, rewards, cu_seqlens, options):
        group_size, beta, score, weight_mode, proxy = options  # one argument: apply's per-argument host work
        try:  # the kernel only: what save_for_backward raises (a checkpoint's recomputation stop, saved-tensor
            loss, terms, coef = _k.pacs_loss_fwd(  # hooks) is not a kernel failure and passes through
                logp, logp_ref, mask, rewards, cu_seqlens, group_size=group_size, beta=beta,
                score=score, weight_mode=weight_mode, proxy=proxy)
        except Exception as e:  # an import / compile / launch error: recorded, warned once, and raised as
            dispatch.failed("tiles", FWD_KERNEL, e)  # KernelFailed (algorithms.pacs_loss runs its torch path)
            raise dispatch.KernelFailed(f"{_FN}: {dispatch._reason(e)}; {_INSTEAD}") from e
        ctx.save_for_backward(coef, mask, cu_seqlens)
        ctx.logp_shape = logp.shape
        ctx.logp_dtype = logp.dtype
        ctx.mark_non_differentiable(terms)  # [5, B]: one output, split by the caller that asks for them
        ctx.set_materialize_grads(False)  # no zero-filled grad for it
        return loss, terms

    @staticmethod
    def backward(ctx, grad_loss, _grad_terms):
        refuse_double_backward("the fused PACS loss", "pacs_loss(backend='torch') is twice differentiable")
        coef, mask, cu_seqlens = ctx.saved_tensors
        dlogp = None
        if ctx.needs_input_grad[0] and grad_loss is not None:
            args = (grad_loss, coef, mask, cu_seqlens, ctx.logp_shape, ctx.logp_dtype)
            if not dispatch.broken("tiles", BWD_KERNEL):
                try:
                    dlogp = _k.pacs_loss_bwd(*args)
                except Exception as e:  # an import / compile / launch error: the torch twin (one warning)
                    dispatch.failed("tiles", BWD_KERNEL, e)
            if dlogp is None:
                dlogp = _torch_backward(*args)
        return dlogp, None, None, None, None, None


def _torch_backward(grad_loss, coef, mask, cu_seqlens, logp_shape, logp_dtype):
    """The backward kernel's torch twin (its fallback): ``dlogp = grad_loss * coef[row] * mask`` (0 where
    the mask is 0, whatever the coefficient), with no host sync (packed rows found by a search)."""
    c = coef * grad_loss.reshape(()).to(coef.dtype)
    if cu_seqlens is None:
        per = c[:, None].expand(logp_shape)
    else:
        pos = torch.arange(logp_shape[0], device=coef.device)
        row = torch.searchsorted(cu_seqlens[1:].to(torch.long), pos, right=True).clamp_max(coef.shape[0] - 1)
        per = c[row]
    if mask is not None:
        per = torch.where(mask != 0, per * mask.to(c.dtype), torch.zeros((), dtype=c.dtype, device=c.device))
    return per.to(logp_dtype).contiguous()


_FN = "fused_pacs_loss"
FWD_KERNEL = "PACS loss forward"  # kernels/dispatch.py names of this op's kernels
BWD_KERNEL = "PACS loss backward"
# what a caller of fused_pacs_loss itself runs when the kernel cannot (pacs_fast.pacs_loss does it on its own)
_INSTEAD = "pacs_fast.pacs_loss (backend='auto' or 'torch') computes the same loss on its PyTorch path"


def _check_choice(name: str, value, options) -> None:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{_FN}: {name} must be one of {tuple(options)}, got {value!r}")


def _check_options(group_size, beta, score, weight_mode, proxy) -> tuple:
    """The options checked (ValueError names the argument); returns them as the kernels take them:
    ``(int group_size, float beta, score, weight_mode, proxy)``. Memoised (a run passes the same
    options call after call) when they hash, types apart (``True`` is not ``1`` here)."""
    if torch.compiler.is_compiling():  # dynamo traces the check itself (it warns of a memo)
        return _check_options_now(group_size, beta, score, weight_mode, proxy)
    try:
        return _check_options_memo(group_size, beta, score, weight_mode, proxy)
    except TypeError:  # an unhashable option: the check's own error, not the memo's
        return _check_options_now(group_size, beta, score, weight_mode, proxy)


def _check_options_now(group_size, beta, score, weight_mode, proxy) -> tuple:
    _check_choice("score", score, SCORES)
    _check_choice("weight_mode", weight_mode, WEIGHT_MODES)
    _check_choice("proxy", proxy, PROXIES)
    if isinstance(beta, bool) or not isinstance(beta, numbers.Real) or not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"{_FN}: beta must be a finite real number > 0, got {beta!r} (0 gives an exactly zero "
                         "gradient, < 0 trains against the verifier)")
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or group_size < 1:
        raise ValueError(f"{_FN}: group_size must be a positive int, got {group_size!r}")
    group_size = int(group_size)  # numpy integers too, as pacs_loss takes them
    if group_size > _k.MAX_GROUP_SIZE:
        raise ValueError(f"{_FN}: group_size must be <= {_k.MAX_GROUP_SIZE} for the fused kernel, "
                         f"got {group_size}; use backend='torch'")
    if group_size < 2 and score in ("rloo", "grpo", "dr_grpo"):  # algorithms.pacs.GROUP_SCORES (a layer above)
        raise ValueError(f"{_FN}: group_size=1 is not allowed with score={score!r} (needs G >= 2)")
    return group_size, float(beta), score, weight_mode, proxy


_check_options_memo = functools.lru_cache(maxsize=64, typed=True)(_check_options_now)


def _validate(logp, logp_ref, mask, rewards, group_size, beta, score, weight_mode, proxy,
              cu_seqlens) -> tuple:
    """Checks shapes and options (no device sync); returns the options as ``_check_options`` does.
    ValueError names the argument."""
    options = _check_options(group_size, beta, score, weight_mode, proxy)
    group_size = options[0]
    if not isinstance(logp, torch.Tensor) or not logp.is_floating_point():
        raise ValueError(f"{_FN}: logp must be a floating-point tensor")
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1 or rewards.is_complex():
        raise ValueError(f"{_FN}: rewards must be a real 1-D tensor [B]")
    B = rewards.shape[0]
    if cu_seqlens is None:
        if logp.dim() != 2:
            raise ValueError(f"{_FN}: logp must be [B, T] (or 1-D with cu_seqlens), got shape "
                             f"{tuple(logp.shape)}")
        if logp.shape[0] != B:
            raise ValueError(f"{_FN}: rewards has {B} entries but logp has {logp.shape[0]} rows")
    else:
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or \
                cu_seqlens.is_floating_point() or cu_seqlens.is_complex() or \
                cu_seqlens.dtype == torch.bool:
            raise ValueError(f"{_FN}: cu_seqlens must be a 1-D integer tensor [B + 1]")
        if logp.dim() != 1:
            raise ValueError(f"{_FN}: logp must be 1-D [total] with cu_seqlens, got shape "
                             f"{tuple(logp.shape)}")
        if cu_seqlens.shape[0] != B + 1:
            raise ValueError(f"{_FN}: cu_seqlens must have B + 1 = {B + 1} entries (B from "
                             f"rewards), got {cu_seqlens.shape[0]}")
    if logp_ref is None and proxy == "logratio":
        raise ValueError(f"{_FN}: logp_ref is required with proxy='logratio'")
    if logp_ref is not None and (not isinstance(logp_ref, torch.Tensor) or logp_ref.shape != logp.shape
                                 or not logp_ref.is_floating_point()):
        raise ValueError(f"{_FN}: logp_ref must be a float tensor shaped like logp {tuple(logp.shape)}")
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.shape != logp.shape
                             or mask.is_complex()):
        raise ValueError(f"{_FN}: mask must be a bool/real tensor shaped like logp {tuple(logp.shape)}")
    if B % group_size:
        raise ValueError(f"{_FN}: batch size {B} (from rewards) is not divisible by "
                         f"group_size={group_size}")
    if B == 0:
        raise ValueError(f"{_FN}: rewards is empty (B = 0)")
    for name, t in (("logp_ref", logp_ref), ("mask", mask), ("rewards", rewards),
                    ("cu_seqlens", cu_seqlens)):
        if t is not None and t.device != logp.device:
            raise ValueError(f"{_FN}: {name} is on {t.device} but logp is on {logp.device}")
    return options


def _check_cu_seqlens(cu, total: int) -> None:
    """One device sync (``PACS_FAST_DEBUG_CHECKS=1`` only): a wrong cu_seqlens would otherwise give
    silently wrong sums (the kernels clamp the spans: never an access outside ``logp``)."""
    bad = (cu[0] != 0) | (cu[-1] != total) | (cu[1:] < cu[:-1]).any()
    if bool(bad):
        raise ValueError(f"{_FN}: cu_seqlens must start at 0, be non-decreasing and end at "
                         f"logp.shape[0] = {total}")


def _check_finite(logp, logp_ref, mask, rewards) -> None:
    where = None if mask is None else (mask if mask.dtype == torch.bool else mask != 0)
    for name, t in (("logp", logp), ("logp_ref", logp_ref)):
        if t is None:
            continue
        bad = ~torch.isfinite(t.detach())
        if where is not None:
            bad = bad & where
        if bool(bad.any()):
            raise ValueError(f"{_FN}: {name} contains NaN or Inf at unmasked positions")
    if rewards.is_floating_point() and not bool(torch.isfinite(rewards).all()):
        raise ValueError(f"{_FN}: rewards contains NaN or Inf")
    if bool(((rewards < 0) | (rewards > 1)).any()):
        raise ValueError(f"{_FN}: rewards must lie in [0, 1]")


def fused_pacs_loss(logp, logp_ref, mask, rewards, *, group_size, beta=1.0, score="rloo",
                    weight_mode="question", proxy="logratio", return_terms=False, cu_seqlens=None,
                    check_finite=False):
    """Grouped PACS loss with the fused Triton kernels (CUDA, or the interpreter on CPU).

    Same contract as ``pacs_fast.algorithms.pacs_loss``; formulas in :mod:`pacs_fast.algorithms.pacs`.

    Args:
        logp: [B, T] log-probs of the sampled tokens under the trained policy (any float dtype;
            gets the gradient), or packed [total] with ``cu_seqlens``.
        logp_ref: same layout, reference-policy log-probs (never gets a gradient). Unused (may be
            None) with ``proxy="mean_logp"``.
        mask: same layout, bool or 0/1 (1 = response token), or None (every token counts).
            Values at positions where the mask is 0 never reach the result, even NaN / Inf.
        rewards: [B] verifier rewards in [0, 1] (0/1 or soft; float, int or bool). With
            ``weight_mode="question"`` soft rewards count fractionally: ``n_1 = sum_g R``,
            ``n_0 = sum_g (1 - R)``, ``w_i = R_i G/(2 n_1) + (1 - R_i) G/(2 n_0)`` in mixed groups.
        group_size: G (2..1024 here; 1 allowed for naive); groups are B/G contiguous rows.
        beta, score ("rloo" | "grpo" | "dr_grpo" | "naive"), weight_mode ("question" | "none" |
            "only_positive" | "only_negative"), proxy ("logratio" | "mean_logp"): as there.
        return_terms: also return a dict of detached [B] tensors: "proxy" r, "score" psi,
            "pred_reward" sigmoid(psi), "weight" w, "sample_loss" w*(softplus(psi) - R*psi).
        cu_seqlens: [B + 1] integer offsets of the packed rows (``cu_seqlens[0] == 0``,
            non-decreasing, ``cu_seqlens[-1] == total``; checked, with one device sync, only when
            ``PACS_FAST_DEBUG_CHECKS=1``: otherwise a wrong one gives a wrong loss, read in bounds).
        check_finite: raise ValueError on NaN/Inf in logp / logp_ref at unmasked positions, or on
            rewards that are non-finite or outside [0, 1] (one device sync). Otherwise non-finite
            unmasked inputs propagate to the loss.

    Returns:
        0-d loss (fp32; fp64 for fp64 ``logp``; differentiable wrt ``logp`` only), or
        ``(loss, terms)`` with the terms in the same dtype.
    """
    options = _validate(logp, logp_ref, mask, rewards, group_size, beta, score, weight_mode, proxy, cu_seqlens)
    require_triton(logp)
    if proxy == "mean_logp":
        logp_ref = None  # not read
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.detach()
        if cu_seqlens.dtype not in (torch.int32, torch.int64):
            cu_seqlens = cu_seqlens.long()
        cu_seqlens = cu_seqlens.contiguous()
        if dispatch.debug_checks():  # a device sync: opt-in
            _check_cu_seqlens(cu_seqlens, logp.shape[0])
    if check_finite:
        _check_finite(logp, logp_ref, mask, rewards)
    acc = torch.float64 if logp.dtype == torch.float64 else torch.float32
    rewards = rewards.detach().to(acc).contiguous()
    ref_c = None if logp_ref is None else logp_ref.detach().contiguous()
    mask_c = None if mask is None else mask.detach().contiguous()
    if dispatch.broken("tiles", FWD_KERNEL):
        raise dispatch.KernelFailed(f"{_FN}: the forward kernel failed earlier in this process; {_INSTEAD}")
    loss, terms = apply_op(  # (a kernel error: KernelFailed, from the forward)
        _FusedPacsLoss.apply, logp.contiguous(), ref_c, mask_c, rewards, cu_seqlens, options, triton=True)
    if not return_terms:
        return loss
    return loss, dict(zip(TERM_KEYS, terms.unbind(0)))
