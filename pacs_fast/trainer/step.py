"""One RL step's phases after the rollout, and what a step records.

- :func:`score_and_batch`: the verifier's rewards and the learner's batch of a step's rollouts.
- :func:`learn`: the learner recomputes the old (and reference) log-probs (and values + GAE for
  PPO), then updates; a learner that fuses the old log-probs into its update gets them from its
  first mini-batch's forward.
- :func:`step_record`: the step's metrics (rewards, lengths, entropy, the learner's metrics, PACS's
  psi statistics and calibration, timings).
- :func:`sample_rows`: a few rollouts with their prompt, response, reward and score terms, for
  ``samples.jsonl`` and TensorBoard text.

Log-prob mismatch (``rollout/logprob_diff_mean`` / ``_max``): the engines report each sampled
token's log-prob under the *temperature-1* (raw) distribution; the learner computes log-probs of the
sampling distribution at ``rollout.temperature`` (logits / T; top-p is not applied by either). At
T = 1 the step's old log-probs are compared directly; at T != 1 the learner runs one extra
temperature-1 forward on diagnostic steps only (step 1, evaluation steps), so like is compared with like.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from pacs_fast.algorithms.pacs import GROUP_SCORES
from pacs_fast.algorithms.reinforce_pp import REINFORCE_PP_MODES
from pacs_fast.algorithms.score_metrics import score_metrics
from pacs_fast.config import Config
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.objective import holds_reference_model
from pacs_fast.trainer.batch import build_batch, engine_logprobs, outcome_token_rewards, response_values
from pacs_fast.trainer.overlong import shape_batch, truncated_rows
from pacs_fast.trainer.problems import problem_fields, problem_texts, prompt_lists


OVERLONG_WARN_FRAC = 0.5  # DAPO's buffer (4k of a 20k limit) sits past most responses; half in it is a mistake


def score_and_batch(s, step: int, problems: list[dict], comps, timings: dict, *, offset: int = 0,
                    rewards: list[float] | None = None) -> tuple[list[float], list[list[int]], RolloutBatch]:
    """The verifier's rewards of the step's completions (``timings["time/reward"]``), then the
    learner's batch (with per-token advantages under process rewards; overlong shaping and filtering
    from :mod:`.overlong`, whose ``reward/overlong_*`` metrics also go into ``timings``, the entries of
    the step's record made so far; the returned ``rewards`` are the verifier's). ``s``: the session;
    ``offset``: the index of ``problems[0]`` among the step's prompts (this data-parallel group's
    share). Returns ``(rewards, prompt ids, batch)``."""
    import time

    t0 = time.perf_counter()
    G = s.cfg.rollout.n
    if rewards is None:  # (dynamic sampling scores each round before it keeps a group: pacs_fast/trainer/rollout_step.py)
        rewards = s.scorer([c.text for cs in comps for c in cs], [p["answer"] for p in problems for _ in range(G)],
                           step=step, first=offset * G, problems=problem_texts(problems, G),
                           fields=problem_fields(problems, G))
    timings["time/reward"] = time.perf_counter() - t0
    prompt_ids, responses = prompt_lists(problems), [[c.token_ids for c in cs] for cs in comps]
    batch = build_batch(prompt_ids, responses, rewards, logprobs=engine_logprobs(comps),
                        pad_id=s.tokenizer.pad_token_id if s.tokenizer.pad_token_id is not None else 0)
    # reward.overlong_buffer_len, learner.mask_truncated (trainer/overlong.py); its metrics join the record
    shaping = shape_batch(s.cfg, batch, comps)
    timings.update(shaping)
    # the warnings below are of the whole step; counted (a collective under data parallelism) only where one can
    # come: the overlong one at the first step, the truncated one under learner.mask_truncated (the same on every rank)
    overlong_check = bool(s.cfg.reward.overlong_buffer_len) and step == s.start_step + 1
    # PACS's group scores drop a group left with one member: the rows left may all be such (sweep of 2026-12-06: 7 of 8
    # responses cut, loss 0 and gradient 0, without a word)
    lone = s.cfg.algo.name == "pacs" and s.cfg.algo.score in GROUP_SCORES
    counts = (step_shaping_counts(s.world, batch, shaping, lone=lone)
              if overlong_check or s.cfg.learner.mask_truncated else (0, 0.0, 0))
    rows, over, cut = counts[:3]
    alone = counts[3] if len(counts) > 3 else 0
    if overlong_check and over / max(rows, 1) >= OVERLONG_WARN_FRAC:
        frac = over / rows
        start = s.cfg.rollout.max_new_tokens - s.cfg.reward.overlong_buffer_len
        s.log(f"warning: step {step}: {frac:.0%} of the responses are longer than rollout.max_new_tokens - "
              f"reward.overlong_buffer_len = {start} tokens and take the overlong penalty; a buffer that starts "
              f"before the task's usual length rewards short answers (docs/EFFICACY.md: a 4-token buffer at "
              f"max_new_tokens=12 collapsed every seed): raise rollout.max_new_tokens or lower "
              f"reward.overlong_buffer_len")
    if batch.truncated is not None and rows and cut == rows:
        s.log(f"warning: step {step}: learner.mask_truncated takes every response of this batch out of the loss "
              f"(all {rows} ended at rollout.max_new_tokens={s.cfg.rollout.max_new_tokens} without "
              f"EOS): its gradient is zero (AdamW's momentum and weight decay still move the weights, as in TRL "
              f"and verl); raise rollout.max_new_tokens")
    elif batch.truncated is not None and rows and alone and cut + alone == rows:
        s.log(f"warning: step {step}: learner.mask_truncated takes every response of this batch out of the loss "
              f"({cut} of {rows} ended at rollout.max_new_tokens={s.cfg.rollout.max_new_tokens} without EOS; "
              f"the other {alone} are each the only one left in its group, which algo.score="
              f"{s.cfg.algo.score} cannot score): its gradient is zero (AdamW's momentum and weight decay "
              f"still move the weights, as in TRL and verl); raise rollout.max_new_tokens")
    if s.credit:  # process rewards: per-token advantages (PURE's min-form or the summation form)
        batch.advantages = s.credit.advantages(prompt_ids, responses, [p["answer"] for p in problems], batch)
    gather = s.world.gather_dp if s.world.dp > 1 else None
    if s.cfg.algo.name in REINFORCE_PP_MODES:  # whitened over the whole step: every data-parallel group's share
        batch.advantages = step_reinforce_pp(s.cfg.algo.name, batch, gather)
    if s.cfg.algo.name == "gpg":  # scaled by the whole step's non-zero rewards: every data-parallel group's share
        batch.advantages = step_gpg(batch, gather)
    return rewards, prompt_ids, batch


def step_shaping_counts(world, batch: RolloutBatch, shaping: dict, *, lone: bool = False) -> tuple:
    """``(rows, rows the overlong penalty hit, rows learner.mask_truncated takes out)`` of the whole step: every
    data-parallel group's share summed (collective when ``world.dp > 1``; every group scores its share in
    :func:`score_and_batch`). A share's own counts had warned "100% take the overlong penalty" and "trains nothing"
    of a step whose record said 81% truncated (sweep of 2026-12-01). ``lone``: a fourth count, the rows
    mask_truncated leaves each alone in its group, in the same collective."""
    rows = len(batch.rewards)
    over = shaping.get("reward/overlong_frac", 0.0) * rows
    counts = (rows, over, 0 if batch.truncated is None else int(batch.truncated.sum()))
    if lone:
        kept = None if batch.truncated is None else (~batch.truncated.bool()).view(-1, batch.group_size).sum(dim=1)
        counts += (0 if kept is None else int(kept[kept < 2].sum()),)
    if world.dp > 1:
        parts = world.gather_dp(counts)
        counts = tuple(sum(p[i] for p in parts) for i in range(len(counts)))
    return counts


def step_reinforce_pp(name: str, batch: RolloutBatch, gather=None) -> torch.Tensor:
    """``batch``'s REINFORCE++ advantages (:mod:`pacs_fast.algorithms.reinforce_pp`) from its rewards (shaped,
    as the other baselines train on), whitened with the step's statistics: ``gather`` (``World.gather_dp``,
    collective) sums every data-parallel group's; None: this batch is the step. The statistics are those of
    the tokens that train: rows of :attr:`RolloutBatch.truncated` (``learner.mask_truncated``) leave them, as
    they leave the loss (the group mean of the baseline still counts them, as the other baselines')."""
    from pacs_fast.algorithms.reinforce_pp import reinforce_pp_advantages, reinforce_pp_totals

    baseline = name == "reinforce_plus_plus_baseline"
    trained = batch.response_mask
    if batch.truncated is not None:
        trained = trained * (~batch.truncated.bool()).to(trained.dtype)[:, None]
    totals = reinforce_pp_totals(batch.rewards, trained, batch.group_size, baseline=baseline)
    if gather is not None:
        totals = tuple(math.fsum(part[i] for part in gather(totals)) for i in range(3))
    return reinforce_pp_advantages(batch.rewards, batch.response_mask, batch.group_size, baseline=baseline,
                                   totals=totals)


def step_gpg(batch: RolloutBatch, gather=None) -> torch.Tensor:
    """``[B, T]`` ``batch``'s GPG advantages (:mod:`pacs_fast.algorithms.gpg`) from its rewards (shaped, as the other
    baselines train on) on its response tokens, 0 elsewhere, scaled with the step's counts: ``gather``
    (``World.gather_dp``, collective) sums every data-parallel group's; None: this batch is the step."""
    from pacs_fast.algorithms.gpg import gpg_advantages, gpg_totals

    totals = gpg_totals(batch.rewards)
    if gather is not None:
        totals = tuple(math.fsum(part[i] for part in gather(totals)) for i in range(2))
    adv = gpg_advantages(batch.rewards, batch.group_size, totals=totals).float()
    return adv[:, None].to(batch.response_mask.device) * (batch.response_mask != 0)


def learn(cfg: Config, learner, batch: RolloutBatch, prompt_ids, comps, *, seed: int, diagnostic: bool,
          timings: dict, step: int | None = None) -> tuple[dict, dict]:
    """Old / reference log-probs, the off-policy correction (``correction``, :mod:`.correction`), then
    the update, at training step ``step``'s learning rate (``learner.lr_schedule``; None: the optimiser's as it
    is). Returns ``(learner metrics, with ``lr``, mismatch and correction metrics)``."""
    import time

    from pacs_fast.learner.lr_schedule import lr_scale

    from pacs_fast.trainer.correction import apply_correction, correction_on, fused_correction, proximal_logprobs

    t0 = time.perf_counter()
    fused = fused_correction(cfg, learner)  # the update corrects from its own first forward
    separate = correction_on(cfg) and not fused
    if not learner.fuses_old_logprobs or separate:
        batch.old_logp, batch.old_entropy = learner.compute_logprobs(batch, return_entropy=True)
    correction = apply_correction(cfg, batch, proximal_logprobs(cfg, learner, batch)) if separate else {}
    mismatch = {}
    if cfg.rollout.temperature != 1.0:  # an extra forward at temperature 1, before the update
        mismatch = logprob_mismatch(learner, batch, prompt_ids, comps, temperature=cfg.rollout.temperature,
                                    extra_forward=diagnostic)
    if learner.needs_ref and holds_reference_model(cfg.algo):
        batch.ref_logp = learner.compute_logprobs(batch, reference=True)
    elif learner.needs_ref and batch.old_logp is not None:
        batch.ref_logp = batch.old_logp
    if cfg.algo.name == "ppo":
        from pacs_fast.algorithms import gae
        batch.old_values = learner.compute_values(batch)
        batch.advantages, batch.returns = gae(outcome_token_rewards(batch), batch.old_values,
                                              batch.response_mask, gamma=cfg.algo.gamma, lam=cfg.algo.lam)
    timings["time/logprobs"] = time.perf_counter() - t0
    lc = cfg.learner
    lr = None if step is None else learner.set_lr_scale(lr_scale(step, total=cfg.train.steps, warmup=lc.lr_warmup_steps,
                                                                 schedule=lc.lr_schedule, min_ratio=lc.min_lr_ratio))
    t0 = time.perf_counter()
    if fused:
        metrics = learner.update(batch, seed=seed, correct=lambda rows, lp: apply_correction(cfg, rows, lp))
        correction = apply_correction(cfg, batch, batch.old_logp)  # the metrics; the same weights, row by row
    else:
        metrics = learner.update(batch, seed=seed)
    timings["time/update"] = time.perf_counter() - t0
    if cfg.rollout.temperature == 1.0:  # the old log-probs are the learner's at temperature 1
        mismatch = logprob_mismatch(learner, batch, prompt_ids, comps, temperature=1.0, extra_forward=False)
    if correction_on(cfg):  # which pass gave pi_old (correction.fused)
        correction["correction/fused"] = float(fused)
    if lr is not None:
        metrics["lr"] = lr
    return metrics, {**mismatch, **correction}


def pacs_metrics(terms: dict) -> dict:
    """psi / predicted-reward statistics and the calibration of sigmoid(psi) against R, the verifier's
    reward of each row (``terms["rewards"]``, see :func:`terms_over_groups`): :func:`score_metrics`."""
    if "psi" not in terms:
        return {}
    return score_metrics(terms["psi"], terms["pred_reward"], terms["rewards"], terms["proxy"])


def logprob_mismatch(learner, batch, prompt_ids, comps, *, temperature: float, extra_forward: bool) -> dict:
    """``rollout/logprob_diff_mean`` / ``_max``: |engine log-prob - learner log-prob| over the
    response tokens, both at temperature 1 (see the module docstring). Empty when the engine gave
    no log-probs, or when ``temperature != 1`` and ``extra_forward`` is False. Collective when the
    extra forward runs (every rank calls it with the same arguments)."""
    if any(c.logprobs is None for cs in comps for c in cs):
        return {}
    if temperature == 1.0:
        learner_lp = batch.old_logp
    elif extra_forward and hasattr(learner, "temperature"):
        saved, learner.temperature = learner.temperature, 1.0
        try:
            learner_lp = learner.compute_logprobs(batch)
        finally:
            learner.temperature = saved
    else:
        return {}
    engine_lp = response_values(prompt_ids, [[c.logprobs for c in cs] for cs in comps], batch.input_ids.shape)
    diff = (engine_lp - learner_lp.float().cpu()).abs()[batch.response_mask > 0]
    if diff.numel() == 0:
        return {}
    return {"rollout/logprob_diff_mean": float(diff.double().mean()), "rollout/logprob_diff_max": float(diff.max())}


# Keys of a step record that are means over something other than the rows (response tokens, process steps):
# over data-parallel groups they are weighted by each group's count (World.reduce_record), as one process
# would compute them.
WEIGHTED_MEANS = {**{k: "response/tokens" for k in (
    "entropy", "rollout/logprob_diff_mean", "correction/is_weight_mean", "correction/frac_truncated",
    "correction/frac_rejected", "correction/kl_k1", "correction/kl_k3")},
    "process/step_reward_mean": "process/steps", "correction/seq_log_ratio_mean": "correction/seqs"}
PACS_TERMS = ("psi", "pred_reward", "rewards", "proxy")  # the per-row terms pacs_metrics reads


def last_forward_terms(terms: dict) -> dict:
    """PACS's per-row terms with each row of the batch once, its last forward's (``terms["rows"]``: the row of each
    entry; ascending rows). With ``learner.epochs = E > 1`` the learner records every row E times, the first epoch's
    at the policy before most of the update: the step's ``pacs/*`` had pooled them (E x the rows, a std of two
    policies' scores), while ``samples.jsonl`` and the calibration plot hold each row's last (metrics audit of
    2026-12-03: ``pacs/brier`` 0.200 against 0.162 from the samples at ``learner.epochs=2``). Unchanged without
    ``rows`` or when every row is there once."""
    if "rows" not in terms or "psi" not in terms:
        return terms
    rows = terms["rows"].long()
    if rows.unique().numel() == rows.numel():
        return terms
    last = {int(r): i for i, r in enumerate(rows.tolist())}  # (a later entry of a row overwrites the earlier)
    keep = torch.tensor([last[r] for r in sorted(last)], dtype=torch.long)
    return {k: (v[keep] if torch.is_tensor(v) and v.dim() == 1 and len(v) == len(rows) else v)
            for k, v in terms.items()}


def terms_over_groups(world, terms: dict, batch: RolloutBatch) -> dict:
    """PACS's per-row terms (:data:`PACS_TERMS`) for the step record: ``rewards`` the verifier's
    (``batch.verifier_rewards`` where ``reward.overlong_buffer_len`` trained on shaped labels: sigmoid(psi) is
    calibrated against what the verifier said, as ``reward/*`` and the calibration plot are), and every
    data-parallel group's rows concatenated, what one process holds for the whole step, so that
    :func:`pacs_metrics` (a standard deviation, means over the rows of one label, the calibration gap) is the
    whole step's, not a mean of the groups' own. Each row counts once, with its last forward's terms
    (:func:`last_forward_terms`). Collective when ``world.dp > 1`` (every rank calls it)."""
    terms = last_forward_terms(terms)
    if "psi" in terms and "rows" in terms and batch.verifier_rewards is not None:
        terms = {**terms, "rewards": batch.verifier_rewards.detach().cpu().to(terms["rewards"].dtype)[terms["rows"]]}
    if world.dp == 1:
        return terms
    mine = {k: terms[k].detach().cpu() for k in PACS_TERMS if k in terms}
    parts = [p for p in world.gather_dp(mine) if "psi" in p]  # (a group without rows has no terms)
    if not parts:
        return {}
    return {k: torch.cat([p[k] for p in parts]) for k in PACS_TERMS if all(k in p for p in parts)}


def _scorer_parts(s, method: str, problems: list[dict], comps):
    """``s.scorer.<method>`` (:meth:`~pacs_fast.trainer.rewards.Scorer.component_rewards` / ``component_metrics``)
    on the step's responses (this data-parallel group's, in row order); empty where the scorer has none."""
    call = getattr(s.scorer, method, None)
    if call is None or not comps:
        return {}
    G = s.cfg.rollout.n
    return call([c.text for cs in comps for c in cs], [p["answer"] for p in problems for _ in range(G)],
                problem_texts(problems, G), problem_fields(problems, G))


def reward_component_rewards(s, problems: list[dict], comps) -> dict[str, list[float]]:
    """With a mix of rewards (``reward.fn=a,b``), ``{name: each response's reward from that component}`` for the
    step's responses (this data-parallel group's, in row order); empty otherwise."""
    return _scorer_parts(s, "component_rewards", problems, comps)


def reward_component_metrics(s, problems: list[dict], comps) -> dict[str, float]:
    """With a mix of rewards, ``reward/<name>/mean`` over the step's trained responses (this data-parallel group's;
    the record averages the groups' equal shares); empty otherwise."""
    return _scorer_parts(s, "component_metrics", problems, comps)


def step_record(batch: RolloutBatch, comps, learner_metrics: dict, mismatch: dict, terms: dict,
                timings: dict, *, epoch: int) -> dict:
    """The metrics of one step (a ``train`` record of ``metrics.jsonl``)."""
    mask = batch.response_mask
    R = batch.rewards if batch.verifier_rewards is None else batch.verifier_rewards  # the verifier's
    groups = R.view(-1, batch.group_size)
    n_tokens = float(mask.sum())
    return {
        "reward/mean": float(R.mean()), "reward/acc": float((R > 0.5).float().mean()),
        "reward/all_correct_groups": float((groups.min(1).values > 0.5).float().mean()),
        # wrong as reward/acc counts it (R <= 0.5): a group of 0.5s (partial credit) had been neither all wrong nor
        # all correct, its rows all wrong by reward/acc (metrics truth sweep)
        "reward/all_wrong_groups": float((groups.max(1).values <= 0.5).float().mean()),
        "response/length": n_tokens / len(R), "response/tokens": n_tokens,
        "response/stop_frac": float(np.mean([c.finish_reason == "stop" for cs in comps for c in cs])),
        "response/truncated_frac": float(truncated_rows(comps).double().mean()),
        "entropy": float((batch.old_entropy * mask).sum() / max(n_tokens, 1.0)),
        **mismatch,
        **{f"learner/{k}": v for k, v in learner_metrics.items()},
        **pacs_metrics(terms),
        "data/epoch": epoch,
        **timings,
        "perf/tokens_per_s": float(batch.attention_mask.sum()) / timings["time/step"],
        "perf/rollout_tokens_per_s": n_tokens / max(timings["time/rollout"], 1e-9),
    }


def sample_rows(step: int, tokenizer, problems: list[dict], comps, rewards: list[float], terms: dict,
                k: int, trained: list[float] | None = None) -> list[dict]:
    """The first ``k`` rollouts of the step (the first group's responses first): prompt text as the
    model saw it (chat template included), response, its length in tokens and how it ended (``finish_reason``:
    ``"stop"``, an EOS or one of ``rollout.stop``; ``"length"``, cut at ``rollout.max_new_tokens``), reward (the verifier's) and, where the
    learner recorded
    them per row, PACS's score terms (``psi``, ``pred_reward`` = sigmoid(psi)); ``trained``: the rewards (PACS's
    labels) the step trained on where they differ from the verifier's (overlong shaping), as ``trained_reward``."""
    G = len(comps[0]) if comps else 0
    per_row = {}
    if "rows" in terms:
        rows = terms["rows"].tolist()
        for name in ("psi", "pred_reward", "proxy", "weight"):
            if name in terms and len(terms[name]) == len(rows):
                for r, v in zip(rows, terms[name].tolist()):
                    if v == v:  # NaN: the row left the loss (learner.mask_truncated)
                        per_row.setdefault(r, {})[name] = v
    out = []
    for row in range(min(k, len(rewards))):
        i, j = divmod(row, G)
        out.append({"step": step, "row": row, "prompt": tokenizer.decode(list(problems[i]["prompt_ids"]),
                                                                          clean_up_tokenization_spaces=False),
                    "response": comps[i][j].text, "response_tokens": len(comps[i][j].token_ids),
                    "finish_reason": comps[i][j].finish_reason, "answer": problems[i]["answer"], "reward": rewards[row],
                    **({"trained_reward": trained[row]} if trained is not None else {}), **per_row.get(row, {})})
    return out
