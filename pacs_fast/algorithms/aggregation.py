"""Token-loss aggregation modes (verl's ``loss_agg_mode`` names and definitions).

For a per-token loss ``l[B, T]`` and a response mask ``m[B, T]``:

- ``"token-mean"``: ``sum(l m) / sum(m)`` — every token of the batch weighs the same (DAPO).
- ``"seq-mean-token-sum"``: mean over sequences of ``sum_t l m``.
- ``"seq-mean-token-mean"``: mean over sequences of ``sum_t l m / sum_t m`` (original GRPO).
- ``"seq-mean-token-sum-norm"``: ``seq-mean-token-sum / horizon`` with a *constant* horizon
  (default ``T = l.shape[-1]``, verl's ``loss_scale_factor``; pass the generation's max length to
  keep it fixed): Dr. GRPO's objective (arXiv 2503.20783 eq. 3, ``MAX_TOKENS``). verl >= 0.7.1.
- ``"token-sum"``: ``sum(l m)``, no normalisation (verl >= 0.9.0).
- ``"token-sum-norm"``: ``sum_i sum_t l m / horizon``, a *sum* over sequences: what verl <= 0.7.0
  computed under the name ``"seq-mean-token-sum-norm"`` (so the verl of the PACS paper's GRPO / PPO
  scripts), ``B`` times the mode above for ``B`` non-empty sequences.

verl changed ``"seq-mean-token-sum-norm"`` in 0.7.1 from the sum to the mean over sequences; the name
here follows current verl, and the older definition keeps a name of its own.
``tests/test_verl_semantics.py`` checks every mode against verl 0.7.0's and 0.9.1's ``agg_loss``
written out and, where verl is installed, against verl itself. Sequences without any response token
are left out of the sequence means (they count neither in the numerator nor the denominator; verl
does the same). A batch without any response token gives a 0 loss that is still connected to the
graph (zero gradients). ``global_count`` replaces the denominator (total tokens for ``token-mean``,
total non-empty sequences for the ``seq-mean-*`` modes: verl's ``batch_num_tokens`` /
``global_batch_size``), for gradient accumulation over micro-batches: each micro-batch's loss is then its
share of the whole batch's, and their gradients add up to the whole batch's. Over data-parallel ranks,
DDP and FSDP *average* the ranks' gradients: pass the whole batch's count (over every rank) divided by
the world size, or the gradient is the world size times too small (verl's ``agg_loss`` multiplies by
``dp_size`` for the same reason). ``"token-sum"`` and ``"token-sum-norm"`` are sums, already additive
over micro-batches, and ignore it (under DDP their loss needs a factor of the world size).
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import (
    check_choice,
    check_mask,
    check_real,
    check_tensor,
    compute_dtype,
    mask_select,
)

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                  "token-sum", "token-sum-norm")


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``x`` over positions where ``mask`` is nonzero (0 when there are none)."""
    if mask is None:
        return x.mean()
    x = x.to(compute_dtype(x)) if x.is_floating_point() else x.float()
    den = mask_select(torch.ones_like(x), mask).sum()
    return mask_select(x, mask).sum() / torch.where(den > 0, den, 1.0)


def _aggregate(loss_mat, mask, mode, horizon, global_count):
    dtype = compute_dtype(loss_mat)
    x = mask_select(loss_mat.to(dtype), mask)
    counts = mask_select(torch.ones_like(x), mask)
    if mode == "token-mean":
        if global_count is not None:
            return x.sum() / (global_count if global_count > 0 else 1.0)
        den = counts.sum()
        return x.sum() / torch.where(den > 0, den, 1.0)
    tokens_per_seq = counts.sum(-1)
    nonempty = tokens_per_seq > 0
    seq = x.sum(-1)
    if mode == "token-sum":
        return seq.sum()
    if mode == "token-sum-norm":  # verl <= 0.7.0's seq-mean-token-sum-norm: a sum, no global_count
        return seq.sum() / (loss_mat.shape[-1] if horizon is None else horizon)
    if mode == "seq-mean-token-mean":
        seq = seq / torch.where(nonempty, tokens_per_seq, 1.0)
    total = torch.where(nonempty, seq, 0.0).sum()
    if global_count is None:
        den = nonempty.to(dtype).sum()
        loss = total / torch.where(den > 0, den, 1.0)
    else:
        loss = total / (global_count if global_count > 0 else 1.0)
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mat.shape[-1] if horizon is None else horizon)
    return loss


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor | None, mode: str = "token-mean", *,
                   horizon: float | None = None, global_count: float | None = None) -> torch.Tensor:
    """Aggregates a per-token loss ``[B, T]`` into a scalar (see the module docstring for the modes).

    Args:
        loss_mat: ``[B, T]`` float tensor (any float dtype; computed in fp32, fp64 kept).
        mask: ``[B, T]`` bool or 0/1, or None (all tokens).
        mode: one of ``LOSS_AGG_MODES``.
        horizon: the constant divisor of ``"seq-mean-token-sum-norm"`` / ``"token-sum-norm"``
            (default ``T``; pass the generation's maximum length to keep it fixed).
        global_count: optional denominator override (tokens or sequences, see module docstring);
            ignored by ``"token-sum"`` / ``"token-sum-norm"``. Under DDP / FSDP (gradients averaged
            over ranks): the count over all ranks divided by the world size. ``0`` means no token
            (sequence) anywhere, so this micro-batch has none either: the loss is its sum, 0 (a count
            of 0 beside unmasked tokens is a caller's error this cannot see without a host sync).
    Returns:
        0-d tensor.
    """
    fn = "aggregate_loss"
    check_choice(fn, "mode", mode, LOSS_AGG_MODES)
    check_tensor(fn, "loss_mat", loss_mat, ndim=2, floating=True)
    if mask is not None:
        check_mask(fn, mask, loss_mat, "loss_mat")
    if horizon is not None:
        horizon = check_real(fn, "horizon", horizon, positive=True)
    if global_count is not None:
        global_count = check_real(fn, "global_count", global_count, nonneg=True)
    return _aggregate(loss_mat, mask, mode, horizon, global_count)
