"""GSPO, CISPO and GMPO policy losses, with verl's definitions (``compute_policy_loss_gspo`` /
``compute_policy_loss_cispo`` / ``compute_policy_loss_geo_mean`` in ``verl.trainer.ppo.core_algos``, 0.9.1;
``tests/test_sequence_losses.py`` and ``tests/test_gmpo_sapo.py`` check values and gradients against the installed
verl). GMPO: :func:`gmpo_policy_loss`.

**GSPO** (Zheng et al. 2025, arXiv 2507.18071): one importance ratio per sequence, the geometric mean
of the token ratios over the response, ``s_i = exp(mean_t (logp - old_logp))``, applied per token in
the form with a stop-gradient, ``s_i,t = sg[s_i] * exp(logp_t - sg[logp_t])`` (value ``s_i``, gradient
``s_i * grad logp_t``), clipped to ``[1 - clip_low, 1 + clip_high]`` as PPO clips a token ratio::

    l_t = max(-A s_i,t, -A clip(s_i,t, 1 - clip_low, 1 + clip_high))     (log s_i,t clamped at <= 10)

with the paper's small range (``GSPO_CLIP``: 3e-4 / 4e-4) and ``seq-mean-token-mean`` aggregation (the
paper's sequence-level objective; verl's function default). No dual clip. Differences from TRL
(``importance_sampling_level="sequence"``): TRL computes ``s_i`` without the stop-gradient form (one
``[B, 1]`` ratio whose gradient spreads ``s_i / |y_i|`` over the tokens, which is the same gradient
under ``seq-mean-token-mean``), does not clamp the log-ratio at 10, and aggregates with its own
``loss_type`` (default ``"dapo"``: token-mean, which weighs long sequences more). We follow verl because
the token form lets per-token factors (the off-policy correction's weights, per-token advantages) multiply
each token's term, and the clamp keeps ``exp`` finite for a far-moved policy. Here the sequence
mean runs over ``mask`` (the tokens that train: off-policy rejection and ``learner.mask_truncated``
remove tokens from it), as verl's runs over the ``response_mask`` it is given.

**CISPO** (MiniMax-M1, arXiv 2506.13585): REINFORCE with a clipped, stop-gradient token importance
weight, ``l_t = -sg[clip(ratio_t, 1 - clip_low, 1 + clip_high)] * A * logp_t`` (ratio log clamped to
``[-20, 20]``, as verl), ``token-mean`` aggregation. Every token keeps a gradient (none is clipped
out, unlike PPO's surrogate); the loss *value* is the weighted ``-A logp``, not a surrogate near 0.
Defaults ``CISPO_CLIP`` = (10.0, 0.2): verl's CISPO recipe (``examples/cispo_trainer``:
``clip_ratio_low=10``, ``clip_ratio_high=0.2``); a ``clip_low >= 1`` puts the lower bound at or below
0, i.e. no lower bound, which is what MiniMax describes ("we did not impose a lower bound on the IS
weight by setting eps_low to a large value; we only tuned eps_high"). TRL's ``loss_type="cispo"``
differs: it clamps only from above, at ``epsilon_high`` itself (a ratio cap, recommended 5.0, i.e.
``clip_high=4.0`` here), never from below, and has no log-ratio clamp; we keep verl's two-sided form
(``clip_low >= 1`` gives TRL's one-sided one) so that one ``algo.clip_*`` pair means the same in every
algorithm of the trainer.

Both take ``token_weights`` (the off-policy correction's importance weights, constant) that multiply
each token's term before aggregation, as verl's ``rollout_is_weights``; the KL penalty is not
weighted. Metrics: detached 0-d tensors (no device sync).
"""
from __future__ import annotations

import torch

from pacs_fast.algorithms._checks import mask_select
from pacs_fast.algorithms._policy_terms import check_inputs, finish_loss, padded_inputs
from pacs_fast.algorithms.aggregation import masked_mean

#: (clip_low, clip_high) defaults: GSPO's paper (section 5.1), verl's CISPO recipe (module docstring)
GSPO_CLIP = (3e-4, 4e-4)
CISPO_CLIP = (10.0, 0.2)
GMPO_CLIP = (0.4, 0.4)  # in log space: the paper's ratio range (e^-0.4, e^0.4)
GSPO_LOG_RATIO_MAX = 10.0   # verl clamps log s_i,t from above only
CISPO_LOG_RATIO_CLAMP = 20.0


def gspo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor | None, *, clip_low: float = GSPO_CLIP[0], clip_high: float = GSPO_CLIP[1],
                     loss_agg_mode: str = "seq-mean-token-mean", horizon: float | None = None,
                     global_count: float | None = None, logp_ref: torch.Tensor | None = None,
                     kl_coef: float = 0.0, kl_estimator: str = "k3", kl_clamp: float | None = None,
                     token_weights: torch.Tensor | None = None, check_finite: bool = False):
    """GSPO's clipped sequence-ratio surrogate (module docstring), aggregated.

    Args:
        logp, old_logp: ``[B, T]`` current (differentiable) and rollout-policy (detached) log-probs.
        advantages: ``[B]`` or ``[B, T]`` (detached); GSPO uses group-normalised outcome advantages
            (:func:`~pacs_fast.algorithms.advantages.group_advantages` with ``"grpo"``).
        mask: ``[B, T]`` bool or 0/1, or None; the sequence mean of the log-ratio runs over it.
        clip_low, clip_high: bounds ``[1 - clip_low, 1 + clip_high]`` of ``s_i`` (paper: 3e-4 / 4e-4).
        loss_agg_mode, horizon, global_count: see :func:`~pacs_fast.algorithms.aggregation.aggregate_loss`.
        logp_ref, kl_coef, kl_estimator, kl_clamp: optional KL penalty (as :func:`policy_loss`).
        token_weights: ``[B, T]`` constant factors of each token's term (off-policy correction).
    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``clip_frac`` (tokens whose clipped term is active, verl's
        ``pg_clipfrac``), ``clip_frac_high`` / ``clip_frac_low`` (``s_i`` above / below the range with
        ``A > 0`` / ``A < 0``), ``seq_ratio_mean`` (mean ``s_i`` over non-empty sequences), ``ppo_kl``,
        ``approx_kl`` (per token, as :func:`policy_loss`), and ``kl`` with the penalty on.
    """
    fn = "gspo_policy_loss"
    clip_low, clip_high, kl_coef, kl_clamp, horizon, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, clip_low, clip_high, horizon,
        global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    dtype, lp = logp.dtype, logp
    log_ratio = lp - old_logp.detach().to(dtype)
    m = torch.ones_like(lp) if mask is None else mask_select(torch.ones_like(lp), mask)
    seq_len = m.sum(-1).clamp(min=1)
    seq_log_ratio = mask_select(log_ratio.detach(), mask).sum(-1) / seq_len
    log_s = (lp - lp.detach() + seq_log_ratio[:, None]).clamp(max=GSPO_LOG_RATIO_MAX)
    s = torch.exp(log_s)
    loss_unclipped = -adv * s
    loss_clipped = -adv * s.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    metrics = {}
    with torch.no_grad():
        sd = s.detach()
        metrics["clip_frac"] = masked_mean((loss_clipped > loss_unclipped).to(dtype), mask)
        metrics["clip_frac_high"] = masked_mean(((sd > 1 + clip_high) & (adv > 0)).to(dtype), mask)
        metrics["clip_frac_low"] = masked_mean(((sd < 1 - clip_low) & (adv < 0)).to(dtype), mask)
        nonempty = m.sum(-1) > 0
        seq_ratio = seq_log_ratio.clamp(max=GSPO_LOG_RATIO_MAX).exp()
        metrics["seq_ratio_mean"] = (torch.where(nonempty, seq_ratio, 0.0).sum()
                                     / nonempty.sum().clamp(min=1).to(dtype))
    return finish_loss(per_token, logp, log_ratio, mask, token_weights, loss_agg_mode, horizon, global_count,
                   logp_ref, kl_coef, kl_estimator, kl_clamp, metrics)


def cispo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      mask: torch.Tensor | None, *, clip_low: float = CISPO_CLIP[0],
                      clip_high: float = CISPO_CLIP[1], loss_agg_mode: str = "token-mean",
                      horizon: float | None = None, global_count: float | None = None,
                      logp_ref: torch.Tensor | None = None, kl_coef: float = 0.0, kl_estimator: str = "k3",
                      kl_clamp: float | None = None, token_weights: torch.Tensor | None = None,
                      check_finite: bool = False):
    """CISPO's clipped-IS-weight REINFORCE loss (module docstring), aggregated.

    Args: as :func:`gspo_policy_loss`; ``clip_low`` may be >= 1 (no lower bound on the weight).
    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``clip_frac`` (tokens whose weight was clipped, verl's
        ``pg_clipfrac``), ``clip_frac_high`` / ``clip_frac_low`` (ratio above / below the range),
        ``ppo_kl``, ``approx_kl``, and ``kl`` with the penalty on.
    """
    fn = "cispo_policy_loss"
    clip_low, clip_high, kl_coef, kl_clamp, horizon, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, loss_agg_mode, clip_low, clip_high, horizon,
        global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    dtype, lp = logp.dtype, logp
    log_ratio = (lp - old_logp.detach().to(dtype)).clamp(-CISPO_LOG_RATIO_CLAMP, CISPO_LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio.detach())
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = -weight * adv * lp
    metrics = {}
    with torch.no_grad():
        metrics["clip_frac"] = masked_mean((ratio != weight).to(dtype), mask)
        metrics["clip_frac_high"] = masked_mean((ratio > 1 + clip_high).to(dtype), mask)
        metrics["clip_frac_low"] = masked_mean((ratio < 1 - clip_low).to(dtype), mask)
    return finish_loss(per_token, logp, log_ratio, mask, token_weights, loss_agg_mode, horizon, global_count,
                   logp_ref, kl_coef, kl_estimator, kl_clamp, metrics)


def gmpo_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor | None, *, clip_low: float = GMPO_CLIP[0], clip_high: float = GMPO_CLIP[1],
                     loss_agg_mode: str = "seq-mean-token-mean", horizon: float | None = None,
                     global_count: float | None = None, logp_ref: torch.Tensor | None = None,
                     kl_coef: float = 0.0, kl_estimator: str = "k3", kl_clamp: float | None = None,
                     token_weights: torch.Tensor | None = None, check_finite: bool = False):
    """GMPO's geometric-mean ratio loss (Zhao et al. 2025, arXiv 2507.20673; verl's ``geo_mean`` loss mode), one
    term per sequence::

        l_i = -A_i * exp(mean_t c_t),
        c_t = sign(A_i) * min(sign(A_i) lr_t, sign(A_i) clip(lr_t, -clip_low, clip_high))

    with ``lr_t = logp - old_logp`` clipped in log space on the side that would grow the objective (the paper's
    range e^-0.4 .. e^0.4: ``GMPO_CLIP``), ``A_i`` the row's mean advantage, and the mean over ``mask``'s tokens.
    The loss is the mean of ``l_i`` over the sequences with tokens (``global_count``: their number in the
    mini-batch; verl's ``torch.mean`` also counts rows without a token, as 0); ``token_weights`` enter as their
    geometric mean per row (verl's). The KL penalty, with ``kl_coef``, is aggregated ``seq-mean-token-mean``, as
    the policy term: ``loss_agg_mode`` must be ``seq-mean-token-mean`` (verl's geo_mean takes none), ``horizon``
    is not read.

    Returns:
        ``(loss, metrics)``: ``pg_loss``, ``clip_frac_high`` / ``clip_frac_low`` (tokens whose log-ratio left the
        range, with ``A > 0`` / ``A < 0``: verl's ``pg_clipfrac`` / ``pg_clipfrac_lower``), ``clip_frac`` (their
        sum), ``seq_ratio_mean``, ``ppo_kl``, ``approx_kl``, and ``kl`` with the penalty on.
    """
    fn = "gmpo_policy_loss"
    mode = "seq-mean-token-mean"
    if loss_agg_mode != mode:
        raise ValueError(f"{fn}: GMPO's terms are per sequence: loss_agg_mode must be {mode!r}, got {loss_agg_mode!r}")
    clip_low, clip_high, kl_coef, kl_clamp, _, global_count = check_inputs(
        fn, logp, old_logp, advantages, mask, token_weights, mode, clip_low, clip_high, None,
        global_count, logp_ref, kl_coef, kl_estimator, kl_clamp, check_finite)
    logp, old_logp, adv, logp_ref, token_weights = padded_inputs(mask, logp, old_logp, advantages, logp_ref,
                                                                 token_weights)
    dtype, lp = logp.dtype, logp
    m = torch.ones_like(lp) if mask is None else mask_select(torch.ones_like(lp), mask)
    n = m.sum(-1).clamp(min=1)
    log_ratio = lp - old_logp.detach().to(dtype)
    sign = torch.sign(adv)
    clipped = log_ratio.clamp(-clip_low, clip_high)
    kept = sign * torch.minimum(sign * log_ratio, sign * clipped)
    row_adv = (adv * m).sum(-1) / n
    seq_ratio = torch.exp((kept * m).sum(-1) / n)
    row_loss = -row_adv * seq_ratio
    if token_weights is not None:  # the weights' geometric mean per row
        w = token_weights.detach().to(dtype)
        row_loss = row_loss * torch.exp((torch.log(w + 1e-10) * m).sum(-1) / n)
    metrics = {}
    with torch.no_grad():
        out = log_ratio != clipped
        metrics["clip_frac_high"] = masked_mean((out & (adv > 0)).to(dtype), mask)
        metrics["clip_frac_low"] = masked_mean((out & (adv < 0)).to(dtype), mask)
        metrics["clip_frac"] = metrics["clip_frac_high"] + metrics["clip_frac_low"]
        nonempty = m.sum(-1) > 0
        metrics["seq_ratio_mean"] = (torch.where(nonempty, seq_ratio.detach(), 0.0).sum()
                                     / nonempty.sum().clamp(min=1).to(dtype))
    per_token = row_loss[:, None].expand_as(lp)  # each token of a row carries the row's term: its mean is l_i
    return finish_loss(per_token, logp, log_ratio, mask, None, mode, None, global_count, logp_ref, kl_coef,
                       kl_estimator, kl_clamp, metrics)
