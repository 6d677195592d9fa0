"""Rollout-training mismatch correction: truncated and masked importance sampling.

Inputs are per-token log-probs of the sampled tokens, ``[B, T]`` floating point, with a response
mask ``[B, T]`` (bool or 0/1):

- ``behaviour_logp``: what the rollout engine sampled from (``mu``), e.g. vLLM's log-probs;
- ``proximal_logp``: the learner's policy before the update (``pi_old``), the policy PPO's ratio is
  taken against (decoupled PPO).

The importance weight is ``w = pi_old / mu``; it is a constant (no gradient). Two independent tools,
as in verl's ``rollout_corr`` (IS weights decoupled from the rejection mask):

- truncated IS (``is_level``): ``w_t = min(exp(lr_t), cap)`` per token, or
  ``w_i = min(exp(sum_t lr_t), cap)`` per sequence, broadcast over its tokens;
- masked IS / rejection (``rs_level``): tokens (``"token"``), whole sequences (``"sequence"``,
  ratio ``exp(sum_t lr_t)``) or whole sequences by the geometric mean (``"geometric"``, ratio
  ``exp(mean_t lr_t)``) whose ratio lies outside ``[low, high]`` leave the response mask, and so
  the loss's denominator too (the caller aggregates with the returned mask).

``lr_t = proximal_logp - behaviour_logp`` on response tokens, 0 elsewhere. All outputs are float32
(float64 for float64 inputs) and detached.
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import check_choice, check_mask, check_real, check_same_shape, check_tensor
from pacs_fast.algorithms._stable import k3

IS_LEVELS = ("none", "token", "sequence")
RS_LEVELS = ("none", "token", "sequence", "geometric")
_MAX_LOG = 20.0  # exp(20) ~ 5e8: sequence log-ratios are clamped before exp so that nothing overflows


def _dtype(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def log_ratios(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor):
    """Per-token ``[B, T]`` and per-sequence ``[B]`` log-ratios ``log pi_old - log mu`` (detached).

    Off the response the token log-ratio is 0, so the sequence log-ratio is the sum over the response.
    """
    fn = "log_ratios"
    check_tensor(fn, "proximal_logp", proximal_logp, ndim=2, floating=True)
    check_tensor(fn, "behaviour_logp", behaviour_logp, ndim=2, floating=True)
    check_same_shape(fn, "behaviour_logp", behaviour_logp, "proximal_logp", proximal_logp)
    check_mask(fn, mask, proximal_logp, "proximal_logp")
    dtype = _dtype(proximal_logp)
    m = mask.to(torch.bool)
    tok = torch.where(m, proximal_logp.detach().to(dtype) - behaviour_logp.detach().to(dtype), 0.0)
    return tok, tok.sum(-1)


def truncated_is_weights(token_log_ratio: torch.Tensor, mask: torch.Tensor, level: str = "token",
                         cap: float = 2.0) -> torch.Tensor:
    """IS weights ``[B, T]``: ``min(ratio, cap)`` at ``level``; 1 for ``"none"``; 0 off the response."""
    fn = "truncated_is_weights"
    check_choice(fn, "level", level, IS_LEVELS)
    cap = check_real(fn, "cap", cap, positive=True)
    m = mask.to(torch.bool)
    if level == "none":
        w = torch.ones_like(token_log_ratio)
    elif level == "token":
        w = token_log_ratio.clamp(max=_MAX_LOG).exp().clamp(max=cap)
    else:
        seq = token_log_ratio.sum(-1).clamp(max=_MAX_LOG).exp().clamp(max=cap)
        w = seq[:, None].expand_as(token_log_ratio)
    return torch.where(m, w, 0.0)


def rejection_mask(token_log_ratio: torch.Tensor, mask: torch.Tensor, level: str = "none",
                   low: float = 0.5, high: float = 2.0) -> torch.Tensor:
    """The response mask ``[B, T]`` (bool) with rejected tokens/sequences removed.

    A ratio is kept when ``low <= ratio <= high``. ``"sequence"`` uses ``exp(sum_t lr_t)``,
    ``"geometric"`` ``exp(mean_t lr_t)`` over the sequence's response tokens.
    """
    fn = "rejection_mask"
    check_choice(fn, "level", level, RS_LEVELS)
    low = check_real(fn, "low", low, nonneg=True)
    high = check_real(fn, "high", high, positive=True)
    if not low < high:
        raise ValueError(f"{fn}: low must be < high, got low={low}, high={high}")
    m = mask.to(torch.bool)
    if level == "none":
        return m
    lo, hi = torch.tensor(low).log(), torch.tensor(high).log()  # compare in log space: no overflow
    if level == "token":
        keep = (token_log_ratio >= lo) & (token_log_ratio <= hi)
    else:
        seq = token_log_ratio.sum(-1)
        if level == "geometric":
            seq = seq / m.sum(-1).clamp(min=1)
        keep = ((seq >= lo) & (seq <= hi))[:, None].expand_as(m)
    return m & keep


def correction_metrics(token_log_ratio: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor,
                       kept_mask: torch.Tensor, cap: float, level: str = "token") -> dict[str, float]:
    """Scalars for the step record (under ``correction/``), over the response tokens of ``mask``.

    ``kl_k1`` / ``kl_k3`` estimate KL(mu || pi_old) per token from samples of mu: ``-lr`` and
    ``(r - 1) - log r`` with ``r = exp(lr)``. ``frac_truncated``: tokens whose untruncated weight at the
    IS ``level`` exceeded ``cap`` (0 for ``"none"``: nothing is truncated, whatever ``cap`` is; a weight
    equal to a cap <= 1 is not a truncation); ``frac_rejected``: tokens removed by the mask.
    """
    m = mask.to(torch.bool)
    n = int(m.sum())
    if n == 0:
        return {}
    lr = token_log_ratio[m]
    w = weights[m]
    seq_lr = token_log_ratio.sum(-1)[m.any(-1)]
    lr_c = lr.clamp(max=_MAX_LOG)
    k3_est = k3(lr_c) + (lr_c - lr)  # (e^lr - 1) - lr, exp clamped; accurate at small lr (_stable.py)
    log_cap = torch.tensor(float(cap), dtype=token_log_ratio.dtype).log()
    if level == "none":
        truncated = torch.zeros_like(lr, dtype=torch.bool)
    elif level == "token":
        truncated = lr > log_cap
    else:
        truncated = (token_log_ratio.sum(-1, keepdim=True) > log_cap).expand_as(m)[m]
    return {
        "is_weight_mean": float(w.mean()),
        "is_weight_max": float(w.max()),
        "frac_truncated": float(truncated.float().mean()),
        "frac_rejected": float(1.0 - kept_mask.to(torch.bool)[m].float().mean()),
        "kl_k1": float((-lr).mean()),
        "kl_k3": float(k3_est.mean()),
        "seq_log_ratio_mean": float(seq_lr.mean()),
        "seqs": float(seq_lr.numel()),  # the rows with response tokens (the weight of seq_log_ratio_mean)
        "seq_log_ratio_min": float(seq_lr.min()),
        "seq_log_ratio_max": float(seq_lr.max()),
    }


def off_policy_correction(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                          *, is_level: str = "token", is_cap: float = 2.0, rs_level: str = "none",
                          rs_low: float = 0.5, rs_high: float = 2.0):
    """``(weights [B, T], kept_mask [B, T] bool, metrics)``: multiply the per-token loss by ``weights``
    and aggregate it with ``kept_mask`` as the response mask (rejected tokens leave the denominator).

    With ``behaviour_logp == proximal_logp`` the weights are exactly 1 on the response and nothing is
    rejected (for any ``rs`` bounds with ``low <= 1 <= high``).
    """
    tok, _ = log_ratios(proximal_logp, behaviour_logp, mask)
    weights = truncated_is_weights(tok, mask, is_level, is_cap)
    kept = rejection_mask(tok, mask, rs_level, rs_low, rs_high)
    metrics = correction_metrics(tok, mask, weights, kept, is_cap, is_level)  # weights before rejection
    return torch.where(kept, weights, 0.0), kept, metrics
