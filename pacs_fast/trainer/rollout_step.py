"""A step's rollouts: draw the step's prompts, generate and score this data-parallel group's share, and,
with ``rollout.filter_groups`` (DAPO's dynamic sampling), keep only the groups whose verifier rewards
differ, drawing more prompts until ``train.prompts_per_step`` groups are kept.

Dynamic sampling, round by round (one round = ``P = train.prompts_per_step`` prompts from the sampler,
the same on every rank; each data-parallel group generates and scores its share, as without
filtering): a group is kept when its ``G`` rewards are not all equal. Rounds go on while any
data-parallel group holds fewer than its ``P / D`` kept groups, at most ``rollout.max_gen_batches``
rounds; each group then trains on its first ``k`` kept groups, ``k`` the smallest count over the
groups (equal shares: every rank takes the same optimiser steps), and a step that kept fewer than
``P`` in all says so in one warning line. A step that kept no group anywhere stops the run (the data
is all solved or all failed for this policy). Groups kept beyond ``P / D`` are dropped; the prompts
of every round are consumed, so a resumed run draws what the uninterrupted run drew next. Round
``r`` samples with the step's seed plus ``r * ROUND_SEED_STRIDE`` and scores prompt ``i`` of the
round as the step's prompt ``r * P + i`` (layout-free, as the plain step). Metrics:
``rollout/gen_rounds``, ``rollout/prompts_drawn``, ``rollout/kept_frac`` (kept / generated groups) and
``rollout/trained_groups``.

What filtering means for each algorithm: a group whose rewards are all equal gives GRPO, RLOO and
Dr.GRPO a zero advantage for every response, hence no policy gradient; dropping it changes nothing
but the batch's size (and, with token-mean aggregation, the weight of the other groups). PACS is
different: its BCE has a label for every response, and an all-correct (or all-wrong) group still
moves the policy (with the RLOO score the group's scores sum to 0, so the loss pulls them toward 0:
it penalises the policy for rating some of the group's correct responses above the others), so
filtering removes a part of PACS's objective. The default is therefore off for every algorithm,
and DAPO-style runs turn it on explicitly (tests/test_dynamic_sampling.py shows both facts on fixed
samples).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from pacs_fast.learner.base import RolloutBatch
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.trainer.step import score_and_batch

ROUND_SEED_STRIDE = 2 ** 40  # refill rounds sample with seeds far from every step's and prompt's


class NoGroupKept(RuntimeError):
    """Dynamic sampling kept no group in ``rollout.max_gen_batches`` rounds."""


@dataclass
class StepRollouts:
    """This data-parallel group's rollouts of a step: ``problems[i]``'s completions ``comps[i]`` (``G``
    each), their ``rewards`` (flat, prompt-major), the learner's ``batch``, the index ``offset`` of
    ``problems[0]`` in the step's prompts, the step's sampling ``seed`` and the filter's ``metrics``."""
    problems: list[dict]
    comps: list
    rewards: list[float]
    prompt_ids: list[list[int]]
    batch: RolloutBatch
    offset: int
    seed: int
    metrics: dict


def step_seed(cfg, step: int) -> int:
    """The sampling seed of ``step`` (prompt ``i`` of the step gets ``seed + i * G``: layout-free)."""
    return (cfg.train.seed * 1_000_003 + step) % 2**62


def sampling_params(cfg, seed: int) -> SamplingParams:
    return SamplingParams(n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                          max_new_tokens=cfg.rollout.max_new_tokens, return_logprobs=True, seed=seed)


def _generate(s, problems: list[dict], params: SamplingParams):
    return s.engine.generate([p["prompt_ids"] for p in problems], params)


def rollout_step(s, step: int, timings: dict) -> StepRollouts:
    """Draws, generates and scores the step's rollouts (this data-parallel group's share; the batch
    from :func:`~pacs_fast.trainer.step.score_and_batch`), filtered with ``rollout.filter_groups``;
    ``timings["time/rollout"]`` is the generation time of every round. ``s``: the session. Collective."""
    cfg, world = s.cfg, s.world
    P, G = cfg.train.prompts_per_step, cfg.rollout.n
    seed = step_seed(cfg, step)
    if not cfg.rollout.filter_groups:
        t0 = time.perf_counter()
        problems, offset = world.share([s.train_problems[i] for i in s.sampler.take(P)])
        comps = _generate(s, problems, sampling_params(cfg, seed + offset * G))
        s.engine.sleep()  # vLLM on CUDA frees its KV cache while the learner works (a no-op elsewhere)
        timings["time/rollout"] = time.perf_counter() - t0
        rewards, prompt_ids, batch = score_and_batch(s, step, problems, comps, timings, offset=offset)
        return StepRollouts(problems, comps, rewards, prompt_ids, batch, offset, seed, {})
    need = P // world.dp
    kept_problems, kept_comps, kept_rewards = [], [], []
    rounds, gen_time, score_time = 0, 0.0, 0.0
    while rounds < cfg.rollout.max_gen_batches and world.any(len(kept_problems) < need):
        t0 = time.perf_counter()
        problems, offset = world.share([s.train_problems[i] for i in s.sampler.take(P)])
        comps = _generate(s, problems, sampling_params(cfg, seed + rounds * ROUND_SEED_STRIDE + offset * G))
        gen_time += time.perf_counter() - t0
        t0 = time.perf_counter()
        rewards = s.scorer([c.text for cs in comps for c in cs], [p["answer"] for p in problems for _ in range(G)],
                           step=step, first=(rounds * P + offset) * G)
        score_time += time.perf_counter() - t0
        for i, (problem, cs) in enumerate(zip(problems, comps)):
            group = rewards[i * G:(i + 1) * G]
            if max(group) != min(group):
                kept_problems.append(problem)
                kept_comps.append(cs)
                kept_rewards.extend(group)
        rounds += 1
    s.engine.sleep()
    timings["time/rollout"] = gen_time
    k = min(min(world.gather_dp(len(kept_problems))), need)
    if k == 0:
        raise NoGroupKept(f"rollout.filter_groups kept no group in {rounds} generation rounds of {P} prompts "
                          f"(rollout.max_gen_batches={cfg.rollout.max_gen_batches}): every group's rewards were "
                          f"equal (all solved or all failed by this policy); raise rollout.max_gen_batches, use "
                          f"data the policy partly solves, or turn rollout.filter_groups off")
    if k < need and s.world.is_main:
        s.log(f"warning: step {step}: rollout.filter_groups kept {k * world.dp} of train.prompts_per_step={P} groups "
              f"in rollout.max_gen_batches={cfg.rollout.max_gen_batches} rounds; this step trains on those")
    problems, comps = kept_problems[:k], kept_comps[:k]
    rewards, prompt_ids, batch = score_and_batch(s, step, problems, comps, timings, offset=world.dp_rank * k,
                                                 rewards=kept_rewards[:k * G])
    timings["time/reward"] = timings.get("time/reward", 0.0) + score_time
    metrics = {"rollout/gen_rounds": float(rounds), "rollout/prompts_drawn": float(rounds * P),
               "rollout/trained_groups": float(k * world.dp),  # the same on every rank
               "rollout/kept_frac": len(kept_problems) / (rounds * P / world.dp)}  # equal shares: the mean is global
    return StepRollouts(problems, comps, rewards, prompt_ids, batch, world.dp_rank * k, seed, metrics)
