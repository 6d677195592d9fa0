"""The training objective every learner shares: one micro-batch's loss, scaled so that the sum over
a mini-batch's micro-batches is the mini-batch's loss exactly, with the denominators it needs
(:func:`minibatch_counts`) and the masks and weights it aggregates with.

Token alignment as in :mod:`pacs_fast.learner.base`: ``logp[b, t]`` is the log-prob of
``input_ids[b, t]``, and rows ``[kG, (k+1)G)`` are one group.
"""
from __future__ import annotations

import dataclasses
import zlib

import torch

from pacs_fast.config import AlgoConfig
from pacs_fast.learner.base import RolloutBatch


#: the algorithms that are verl's policy-loss modes on GRPO's advantages (and TRL's VESPO)
VERL_LOSS_MODES = ("gspo", "cispo", "clip_cov", "kl_cov", "gmpo", "sapo", "dppo_tv", "dppo_kl", "dro", "vespo")
#: the algorithms whose advantages are the whole step's (the trainer sets ``batch.advantages``): what they are, and
#: the function that computes them
_WHITENED = ("batch-whitened", "pacs_fast.algorithms.reinforce_pp.reinforce_pp_advantages")
STEP_ADVANTAGES = {"reinforce_plus_plus": _WHITENED, "reinforce_plus_plus_baseline": _WHITENED,
                   "gpg": ("step-scaled", "pacs_fast.algorithms.gpg.gpg_advantages")}


#: the loss modes' metrics that are means over the sequences with loss tokens (not over tokens or every row)
SEQUENCE_MEANS = ("seq_ratio_mean", "phi_seq_mean")


def resolve_loss_agg(algo: AlgoConfig) -> str:
    """``algo.loss_agg`` with ``auto`` resolved per algorithm (Dr. GRPO: constant-horizon token sums)."""
    if algo.loss_agg != "auto":
        return algo.loss_agg
    return {"dr_grpo": "seq-mean-token-sum-norm", "gspo": "seq-mean-token-mean", "gmpo": "seq-mean-token-mean",
            "sapo": "seq-mean-token-mean", "dppo_tv": "seq-mean-token-sum-norm",
            "dppo_kl": "seq-mean-token-sum-norm"}.get(algo.name, "token-mean")


def needs_entropy(algo: AlgoConfig) -> bool:
    """Whether the objective reads the entropies (the bonus, or the high-entropy token selection)."""
    return bool(algo.entropy_coef) or algo.entropy_top_frac < 1.0


def needs_reference(algo: AlgoConfig) -> bool:
    """Whether the objective uses ``ref_logp``."""
    if algo.name == "pacs":
        return algo.proxy == "logratio"
    return algo.kl_coef != 0


def holds_reference_model(algo: AlgoConfig) -> bool:
    """Whether a separate reference model is kept (else ``ref_logp`` is the rollout policy's)."""
    if algo.name == "pacs":
        return algo.proxy == "logratio" and algo.ref == "fixed"
    return algo.kl_coef != 0


def loss_mask(micro: RolloutBatch) -> torch.Tensor:
    """``[b, T]`` the tokens the losses aggregate over: the response, less rejected tokens
    (:attr:`RolloutBatch.kept_mask`) and less the rows of :attr:`RolloutBatch.truncated`."""
    mask = micro.response_mask if micro.kept_mask is None else micro.kept_mask
    if micro.truncated is not None:
        mask = mask * (~micro.truncated.bool()).to(mask.dtype)[:, None]
    return mask


def minibatch_counts(mb: RolloutBatch) -> dict[str, float]:
    """Denominators of a mini-batch, for exact accumulation over its micro-batches (rejected tokens
    and rows, :attr:`RolloutBatch.kept_mask`, and truncated rows, :attr:`RolloutBatch.truncated`, are
    not counted). ``member_rows``: PACS's rows that stay in groups of at least 2 (its rloo / grpo / dr_grpo
    scores: ``algorithms.pacs.GROUP_SCORES``)."""
    mask = loss_mask(mb)
    member = (torch.ones(mb.num_rows, dtype=torch.bool) if mb.truncated is None
              else ~mb.truncated.bool().cpu())  # still in its group (PACS scores the members)
    counted = member.clone()
    if mb.kept_mask is not None:  # rejected rows stay members, their BCE term goes
        counted &= ~((mb.response_mask.sum(-1) > 0) & (mb.kept_mask.sum(-1) == 0)).cpu()
    in_pairs = (member.view(-1, mb.group_size).sum(1) >= 2).repeat_interleave(mb.group_size)
    return {"rows": float(counted.sum()), "member_rows": float((counted & in_pairs).sum()),
            "tokens": float(mask.sum()), "seqs": float((mask.sum(-1) > 0).sum()), "all_rows": float(mb.num_rows)}


def sequence_weights(micro: RolloutBatch) -> torch.Tensor | None:
    """``[b]`` per-row factors of PACS's BCE terms from :attr:`RolloutBatch.is_weights` (sequence level:
    the same weight on every response token of a row, so the row's mean is that weight; 0 for a
    rejected row; 1 for a row without response tokens), or None without correction."""
    if micro.is_weights is None:
        return None
    n = micro.response_mask.sum(-1)
    mean = (micro.is_weights * micro.response_mask).sum(-1) / n.clamp(min=1)
    return torch.where(n > 0, mean, torch.ones_like(mean))


def objective(algo: AlgoConfig, micro: RolloutBatch, logp: torch.Tensor, entropy: torch.Tensor | None,
              values: torch.Tensor | None, counts: dict[str, float], *, horizon: int):
    """The training loss of one micro-batch, scaled so that summing it over the micro-batches of a
    mini-batch gives the mini-batch loss exactly (whole groups per micro-batch).

    Args:
        algo: the algorithm settings. micro: the micro-batch (with ``old_logp``/``ref_logp``/PPO
            fields as the algorithm needs). logp: ``[b, T]`` differentiable policy log-probs.
        entropy: ``[b, T]`` differentiable entropies (needed when :func:`needs_entropy`).
        values: ``[b, T]`` differentiable values (PPO). counts: :func:`minibatch_counts` of the
            enclosing mini-batch. horizon: max response length (Dr. GRPO's constant divisor).
    Returns:
        ``(loss, metrics)``: 0-d loss; metrics a dict of detached 0-d tensors or ``[b]`` tensors
        (``psi``, ``pred_reward``, ``proxy``, ``weight`` for PACS).
    """
    from pacs_fast.algorithms import aggregate_loss, grpo_loss, policy_loss, value_loss

    mask = loss_mask(micro)  # aggregation mask
    agg = resolve_loss_agg(algo)
    global_count = counts["tokens"] if agg == "token-mean" else counts["seqs"]
    metrics: dict[str, torch.Tensor] = {}
    if algo.name == "pacs":
        loss, terms = _pacs_objective(algo, micro, logp, counts)
        metrics.update(psi=terms["score"], pred_reward=terms["pred_reward"], proxy=terms["proxy"],
                       weight=terms["weight"])
    else:
        kw = dict(clip_low=algo.clip_low, clip_high=algo.clip_high, clip_c=algo.clip_c or None, loss_agg_mode=agg,
                  horizon=float(horizon), global_count=global_count, logp_ref=micro.ref_logp,
                  kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator, kl_clamp=algo.kl_clamp or None,
                  token_weights=micro.is_weights)
        token_share = float(mask.sum()) / max(counts["tokens"], 1.0)  # this micro-batch's share of the tokens
        selection = None  # the high-entropy tokens (VESPO takes them apart from the correction's weights)
        if algo.entropy_top_frac < 1.0:  # the policy gradient on the high-entropy tokens only (token_selection.py)
            from pacs_fast.algorithms.token_selection import high_entropy_mask
            if entropy is None:
                raise ValueError("objective: algo.entropy_top_frac < 1 selects tokens by entropy; give the "
                                 "entropies (entropy=, see needs_entropy)")
            keep, threshold = high_entropy_mask(entropy, mask, algo.entropy_top_frac)
            selection = keep
            kw["token_weights"] = keep if micro.is_weights is None else micro.is_weights * keep
            metrics["entropy_threshold"] = threshold.nan_to_num(0.0) * token_share
            metrics["entropy_kept_frac"] = keep.sum() / max(counts["tokens"], 1.0)
        rewards = _rewards(algo, micro)
        if algo.name in VERL_LOSS_MODES:  # verl's loss modes on GRPO's advantages (algorithms/sequence_losses.py,
            # covariance_losses.py, sapo.py, dppo.py)
            adv = micro.advantages if micro.advantages is not None else _outcome_advantages(micro, rewards, "grpo")
            loss, pm = _verl_loss_mode(algo, micro, logp, adv, mask, kw, selection)
            pm.update(adv_mean=adv.mean(), adv_abs_mean=adv.abs().mean())
        elif algo.name in STEP_ADVANTAGES and micro.advantages is None:
            kind, where = STEP_ADVANTAGES[algo.name]
            raise ValueError(f"objective: algo.name={algo.name} trains on {kind} advantages; set batch.advantages = "
                             f"{where}(...) over the whole step (the trainer does)")
        elif algo.name == "gpg":  # REINFORCE on GPG's step-scaled advantages (algorithms/gpg.py)
            from pacs_fast.algorithms.gpg import gpg_policy_loss
            loss, pm = gpg_policy_loss(logp, micro.old_logp, micro.advantages, mask,
                                       **{k: v for k, v in kw.items() if k not in ("clip_low", "clip_high", "clip_c")})
            pm.update(_row_advantage_means(micro.advantages, micro.response_mask))
        elif micro.advantages is not None:  # per-token: PPO's GAE, REINFORCE++'s (algorithms/reinforce_pp.py), or
            # process-reward credit (trainer/step_credit.py)
            loss, pm = policy_loss(logp, micro.old_logp, micro.advantages, mask, **kw)
            if algo.name in STEP_ADVANTAGES:  # one advantage per row: its rows' mean, as gspo / cispo record
                pm.update(_row_advantage_means(micro.advantages, micro.response_mask))
            if algo.name == "ppo":
                vloss, vm = value_loss(values, micro.old_values, micro.returns, mask,
                                       clip_range=algo.value_clip or None, loss_agg_mode=agg,
                                       horizon=float(horizon), global_count=global_count)
                loss = loss + algo.vf_coef * vloss
                pm.update(vm)
        elif micro.outcome_advantages is None:
            loss, pm = grpo_loss(logp, micro.old_logp, mask, rewards, group_size=micro.group_size,
                                 advantage=algo.name, **kw)
        else:  # grpo_loss on the advantages of whole groups, given (rows_apart)
            adv = micro.outcome_advantages  # (policy_loss casts it to logp's compute dtype, as grpo_loss does)
            loss, pm = policy_loss(logp, micro.old_logp, adv, mask, **kw)
            pm.update(adv_mean=adv.mean(), adv_abs_mean=adv.abs().mean())
        # pg_loss / kl / vf_loss are already scaled by the mini-batch's counts; the other metrics are
        # micro-batch means, weighted by the micro-batch's share: of the tokens for the per-token
        # fractions and KL estimates, of the rows for the advantages' means (one value per row), of the
        # sequences with loss tokens for the means over those (a token share had weighted VESPO's by length,
        # a row share GSPO's / GMPO's by rows that left the loss)
        row_share = micro.num_rows / max(counts["all_rows"], 1.0)
        seq_share = float((mask.sum(-1) > 0).sum()) / max(counts["seqs"], 1.0)
        for k, v in pm.items():
            metrics[k] = v * (1.0 if k in ("pg_loss", "kl", "vf_loss") else
                              row_share if k in ("adv_mean", "adv_abs_mean") else
                              seq_share if k in SEQUENCE_MEANS else token_share)
    if algo.entropy_coef:
        ent = aggregate_loss(entropy, mask, agg, horizon=float(horizon), global_count=global_count)
        loss = loss - algo.entropy_coef * ent
    return loss, metrics


def _rewards(algo: AlgoConfig, micro: RolloutBatch) -> torch.Tensor:
    """``[b]`` the rewards the baselines' outcome advantages take: ``micro.rewards``, corrected for a noisy verifier
    (``algo.noise_correction``, :mod:`pacs_fast.algorithms.noisy_labels`: row by row)."""
    if getattr(algo, "noise_correction", "none") == "none":
        return micro.rewards
    from pacs_fast.algorithms.noisy_labels import corrected_rewards
    return corrected_rewards(micro.rewards, algo.noise_correction, algo.noise_rho0, algo.noise_rho1)


def _outcome_advantages(micro: RolloutBatch, rewards: torch.Tensor, mode: str) -> torch.Tensor:
    """``[b]`` each row's outcome advantage in its group: ``micro.outcome_advantages`` where given (whole groups'
    before their rows were cut, :func:`rows_apart`), else from ``rewards`` over ``micro``'s groups."""
    if micro.outcome_advantages is not None:
        return micro.outcome_advantages
    from pacs_fast.algorithms import group_advantages
    return group_advantages(rewards, micro.group_size, mode)


#: what couples a micro-batch's rows beyond their groups' outcome advantages: PACS's score (of its rows' log-probs),
#: Clip-Cov's and KL-Cov's token selection (over the micro-batch's tokens)
COUPLED_ROWS = ("pacs", "clip_cov", "kl_cov")


def rows_apart(algo: AlgoConfig, batch: RolloutBatch) -> RolloutBatch | None:
    """``batch`` (whole groups) with what lets its rows train apart, or None. Where the objective is a sum over
    rows once each row's advantage is known (per-token ``batch.advantages``: PPO's GAE, GPG's and REINFORCE++'s
    step advantages, process-reward credit; or the outcome advantages of GRPO, RLOO, Dr. GRPO and of verl's loss
    modes, whose rows couple only through ``group_advantages`` of their group's rewards), the objective of any
    micro-batch of its rows (``group_size`` 1) is their exact share of the whole groups': ``batch`` itself, or a
    copy with :attr:`RolloutBatch.outcome_advantages` (``[B]``, from the noise-corrected rewards) set. None for
    PACS, Clip-Cov, KL-Cov and ``algo.entropy_top_frac < 1`` (they select over the micro-batch), and for an
    algorithm without the advantages it needs (the objective raises)."""
    if algo.name in COUPLED_ROWS or algo.entropy_top_frac < 1.0:
        return None
    if batch.advantages is not None:  # every branch that reads them sums over rows (objective)
        return batch
    mode = "grpo" if algo.name in VERL_LOSS_MODES else algo.name
    if mode not in ("grpo", "rloo", "dr_grpo"):  # (ppo, the step-advantage algorithms: need batch.advantages)
        return None
    from pacs_fast.algorithms import group_advantages
    return dataclasses.replace(batch, outcome_advantages=group_advantages(_rewards(algo, batch), batch.group_size,
                                                                          mode))


def _row_advantage_means(advantages: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """``adv_mean`` / ``adv_abs_mean`` of per-token advantages that are one value per row: the rows' means over the
    response tokens ``mask`` (the response mask, not the loss's: a row that leaves the loss, truncated, still counts
    with its advantage, as the other baselines' means of every row do; it had counted as 0)."""
    rows = (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return {"adv_mean": rows.mean(), "adv_abs_mean": rows.abs().mean()}


def _verl_loss_mode(algo: AlgoConfig, micro: RolloutBatch, logp, adv, mask, kw: dict, selection=None):
    """gspo / cispo / clip_cov / kl_cov / gmpo / sapo / dppo_tv / dppo_kl / dro / vespo's loss of a micro-batch with
    ``policy_loss``'s arguments ``kw`` (none has PPO's dual clip: DPPO's ``clip_c`` truncates its detached ratio;
    kl_cov, sapo, dro and vespo clip no ratio). VESPO folds the off-policy correction's weights into its sequence
    weight and multiplies its terms by ``selection`` (the high-entropy tokens) alone. Clip-Cov's random draw takes
    the tokens of the smallest :func:`row_keys`, drawn from each row's own tokens, so that the same rows cut the same
    tokens in a resumed or repeated run and in either learner (which order a micro-batch's groups differently)."""
    from pacs_fast.algorithms.covariance_losses import clip_cov_policy_loss, kl_cov_policy_loss
    from pacs_fast.algorithms.dppo import dppo_policy_loss
    from pacs_fast.algorithms.gpg import dro_policy_loss
    from pacs_fast.algorithms.sapo import sapo_policy_loss
    from pacs_fast.algorithms.sequence_losses import cispo_policy_loss, gmpo_policy_loss, gspo_policy_loss

    if algo.name in ("dppo_tv", "dppo_kl"):
        return dppo_policy_loss(logp, micro.old_logp, adv, mask, divergence=algo.name[-2:], **kw)
    unread = ("clip_c", "clip_low", "clip_high") if algo.name in ("kl_cov", "sapo", "dro", "vespo") else ("clip_c",)
    kw = {k: v for k, v in kw.items() if k not in unread}
    if algo.name == "gspo":
        return gspo_policy_loss(logp, micro.old_logp, adv, mask, **kw)
    if algo.name == "cispo":
        return cispo_policy_loss(logp, micro.old_logp, adv, mask, **kw)
    if algo.name == "gmpo":
        return gmpo_policy_loss(logp, micro.old_logp, adv, mask, **kw)
    if algo.name == "vespo":
        from pacs_fast.algorithms.vespo import vespo_policy_loss
        return vespo_policy_loss(logp, micro.old_logp, adv, mask, k_pos=algo.vespo_k_pos,
                                 lambda_pos=algo.vespo_lambda_pos, k_neg=algo.vespo_k_neg,
                                 lambda_neg=algo.vespo_lambda_neg, is_weights=micro.is_weights,
                                 **{**kw, "token_weights": selection})
    if algo.name == "dro":
        return dro_policy_loss(logp, micro.old_logp, adv, mask, beta=algo.dro_beta, **kw)
    if algo.name == "sapo":
        return sapo_policy_loss(logp, micro.old_logp, adv, mask, tau_pos=algo.tau_pos, tau_neg=algo.tau_neg, **kw)
    if algo.name == "kl_cov":
        return kl_cov_policy_loss(logp, micro.old_logp, adv, mask, cov_frac=algo.cov_frac,
                                  cov_kl_coef=algo.cov_kl_coef, **kw)
    return clip_cov_policy_loss(logp, micro.old_logp, adv, mask, cov_frac=algo.cov_frac, cov_low=algo.cov_low,
                                cov_high=algo.cov_high, token_keys=lambda: row_keys(micro), **kw)


def row_keys(micro: RolloutBatch) -> torch.Tensor:
    """``[B, T]`` float32 keys uniform in [0, 1), each row's drawn from a generator seeded with that row's tokens and
    response mask (CRC-32 of both): a function of the row alone, whatever its place in the micro-batch."""
    ids = micro.input_ids.detach().cpu().to(torch.int64)
    resp = micro.response_mask.detach().cpu() != 0
    keys = torch.empty(ids.shape, dtype=torch.float32)
    for i in range(ids.shape[0]):
        seed = zlib.crc32(resp[i].numpy().tobytes(), zlib.crc32(ids[i].numpy().tobytes()))
        keys[i] = torch.rand(ids.shape[1], generator=torch.Generator().manual_seed(seed))
    return keys


def _pacs_objective(algo: AlgoConfig, micro: RolloutBatch, logp: torch.Tensor, counts: dict[str, float]):
    """PACS's loss of a micro-batch, scaled by the mini-batch's rows. With :attr:`RolloutBatch.truncated`
    the truncated rows leave their groups (no label, no class weight, no part in the score; a group
    left with fewer members than its score needs drops out), as TRL's ``mask_truncated_completions``
    in :mod:`pacs_fast.integrations.trl` (:func:`pacs_fast.algorithms.overlong.loss_over_members`)."""
    from pacs_fast.algorithms import pacs_loss
    from pacs_fast.algorithms.pacs import GROUP_SCORES

    ref = micro.ref_logp if algo.proxy == "logratio" else None
    correction = getattr(algo, "noise_correction", "none")
    resp = micro.response_mask  # the proxy sums every response token, rejected rows included
    weights = sequence_weights(micro)

    def rows(idx, k):  # the loss of rows idx (whole groups of k)
        pick = (lambda t: t) if idx is None else (lambda t: None if t is None else t[idx])
        # backend "auto": the fused kernels on CUDA (two launches, no [B, T] temporaries; their torch twin on a
        # kernel failure, warned once), the torch path on the CPU and wherever sample weights are given
        common = dict(group_size=k, beta=algo.beta, score=algo.score, weight_mode=algo.weight, proxy=algo.proxy,
                      sample_weights=pick(weights))
        if correction != "none":  # noisy verifier: corrected BCE (pacs_fast/algorithms/noisy_labels.py)
            from pacs_fast.algorithms.noisy_labels import pacs_loss_noisy
            return pacs_loss_noisy(pick(logp), pick(ref), pick(resp), pick(micro.rewards), correction=correction,
                                   rho0=algo.noise_rho0, rho1=algo.noise_rho1, **common)
        return pacs_loss(pick(logp), pick(ref), pick(resp), pick(micro.rewards), return_terms=True, backend="auto",
                         **common)

    if micro.truncated is None:
        loss, terms = rows(None, micro.group_size)
        return loss * (micro.num_rows / max(counts["rows"], 1.0)), terms
    from pacs_fast.algorithms.overlong import loss_over_members

    pairs = algo.score in GROUP_SCORES
    total, terms, _ = loss_over_members(rows, ~micro.truncated.bool(), micro.group_size, 2 if pairs else 1)
    for name in ("score", "pred_reward", "proxy", "weight"):  # NaN on the rows that left
        terms.setdefault(name, torch.full((micro.num_rows,), float("nan"), device=logp.device))
    total = logp.sum() * 0.0 if total is None else total
    return total / max(counts["member_rows" if pairs else "rows"], 1.0), terms
