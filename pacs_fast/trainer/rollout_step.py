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
Every generation batch of the run (one per step without filtering) has its own seed
(:func:`batch_seed`), and round ``r`` scores prompt ``i`` as the step's prompt ``r * P + i``
(layout-free, as the plain step). With asynchronous rollouts the rounds are the batches the engines
generated ahead (:class:`pacs_fast.trainer.async_loop.RemoteRounds`): a step consumes them in order and
the producer keeps ``rollout.max_staleness + 1`` in flight, so no group is staler than the bound. Metrics:
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

from pacs_fast.config.validation import MAX_BATCH_SAMPLES
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.trainer.problems import problem_fields, problem_texts, prompt_lists
from pacs_fast.trainer.step import score_and_batch

BATCH_SEED_STRIDE = MAX_BATCH_SAMPLES  # seeds of consecutive generation batches lie this far apart (>= prompts x G)


class NoGroupKept(RuntimeError):
    """Dynamic sampling kept no group in ``rollout.max_gen_batches`` rounds."""


@dataclass
class StepRollouts:
    """This data-parallel group's rollouts of a step: ``problems[i]``'s completions ``comps[i]`` (``G``
    each), their ``rewards`` (flat, prompt-major), the learner's ``batch``, the index ``offset`` of
    ``problems[0]`` in the step's prompts, the step's update ``seed``, the filter's ``metrics``, the
    oldest policy ``version`` that generated them and each group's (``versions``; asynchronous rollouts, None
    otherwise: with dynamic sampling a step's groups may come from batches of different versions)."""
    problems: list[dict]
    comps: list
    rewards: list[float]
    prompt_ids: list[list[int]]
    batch: RolloutBatch
    offset: int
    seed: int
    metrics: dict
    version: int | None = None
    versions: list | None = None


@dataclass
class Round:
    """One generation batch (``P`` prompts; ``index``: its number in the run, from 1): this
    data-parallel group's share ``problems`` (the first at ``offset`` in the batch) and their
    ``comps`` and the policy ``version`` that generated them (None: the current one)."""
    problems: list[dict]
    offset: int
    comps: list
    index: int
    version: int | None = None


def step_seed(cfg, step: int) -> int:
    """The seed of ``step``'s update (its mini-batch shuffle)."""
    return (cfg.train.seed * 1_000_003 + step) % 2**62


def batch_seed(cfg, index: int) -> int:
    """The sampling seed of generation batch ``index``: prompt ``i`` of the batch samples with
    ``batch_seed + i * G`` (layout-free; batches never share a seed: they are BATCH_SEED_STRIDE apart)."""
    return ((cfg.train.seed * 1_000_003 + index) % 2**42) * BATCH_SEED_STRIDE


def sampling_params(cfg, seed: int) -> SamplingParams:
    return SamplingParams(n=cfg.rollout.n, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                          top_k=cfg.rollout.top_k, min_p=cfg.rollout.min_p,
                          max_new_tokens=cfg.rollout.max_new_tokens, return_logprobs=True, seed=seed,
                          stop=tuple(cfg.rollout.stop))


class LocalRounds:
    """Generation batches of the colocated layout: drawn from the sampler and generated by this
    process's engine when asked (``s.batches`` counts them)."""

    def __init__(self, s):
        self.s = s

    def next(self) -> Round:
        s, cfg = self.s, self.s.cfg
        s.batches += 1
        problems, offset = s.world.share([s.train_problems[i] for i in s.sampler.take(cfg.train.prompts_per_step)])
        seed = batch_seed(cfg, s.batches) + offset * cfg.rollout.n
        comps = s.engine.generate(prompt_lists(problems), sampling_params(cfg, seed))
        return Round(problems, offset, comps, s.batches)

    def pause(self) -> None:
        self.s.engine.sleep()  # vLLM on CUDA frees its KV cache while the learner works (a no-op elsewhere)


def rollout_step(s, step: int, timings: dict, rounds=None) -> StepRollouts:
    """Generates (``rounds``: a source of generation batches, :class:`LocalRounds` by default) and
    scores the step's rollouts, this data-parallel group's share, filtered with
    ``rollout.filter_groups``; the batch from :func:`~pacs_fast.trainer.step.score_and_batch`.
    ``timings["time/rollout"]``: the time spent waiting for generation. ``s``: the session. Collective."""
    cfg, world = s.cfg, s.world
    P, G = cfg.train.prompts_per_step, cfg.rollout.n
    rounds = rounds or LocalRounds(s)
    seed = step_seed(cfg, step)
    if not cfg.rollout.filter_groups:
        t0 = time.perf_counter()
        r = rounds.next()
        rounds.pause()
        timings["time/rollout"] = time.perf_counter() - t0
        rewards, prompt_ids, batch = score_and_batch(s, step, r.problems, r.comps, timings, offset=r.offset)
        return StepRollouts(r.problems, r.comps, rewards, prompt_ids, batch, r.offset, seed, {}, r.version,
                            None if r.version is None else [r.version] * len(r.problems))
    need = P // world.dp
    kept_problems, kept_comps, kept_rewards, kept_versions = [], [], [], []
    n_rounds, gen_time, score_time, gen_tokens = 0, 0.0, 0.0, 0
    while n_rounds < cfg.rollout.max_gen_batches and world.any(len(kept_problems) < need):
        t0 = time.perf_counter()
        r = rounds.next()
        gen_time += time.perf_counter() - t0
        gen_tokens += sum(len(c.token_ids) for cs in r.comps for c in cs)
        t0 = time.perf_counter()
        rewards = s.scorer([c.text for cs in r.comps for c in cs],
                           [p["answer"] for p in r.problems for _ in range(G)], step=step,
                           first=(n_rounds * P + r.offset) * G, problems=problem_texts(r.problems, G),
                           fields=problem_fields(r.problems, G))
        score_time += time.perf_counter() - t0
        for i, (problem, cs) in enumerate(zip(r.problems, r.comps)):
            group = rewards[i * G:(i + 1) * G]
            if max(group) != min(group):
                kept_problems.append(problem)
                kept_comps.append(cs)
                kept_rewards.extend(group)
                kept_versions.append(r.version)
        n_rounds += 1
    rounds.pause()
    timings["time/rollout"] = gen_time
    k = min(min(world.gather_dp(len(kept_problems))), need)
    if k == 0:
        raise NoGroupKept(f"rollout.filter_groups kept no group in {n_rounds} generation rounds of {P} prompts "
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
    metrics = {"rollout/gen_rounds": float(n_rounds), "rollout/prompts_drawn": float(n_rounds * P),
               "rollout/trained_groups": float(k * world.dp),  # the same on every rank
               "rollout/kept_frac": len(kept_problems) / (n_rounds * P / world.dp),  # equal shares: the mean is global
               # every round's responses over the time spent generating them (the trained rows are fewer)
               "perf/rollout_tokens_per_s": gen_tokens / max(gen_time, 1e-9)}
    if "reward/flipped_frac" in getattr(s.scorer, "last", {}):  # a noisy verifier: over the rows that train, as
        # reward/* (the scorer's own value is its last round's)
        clean = s.scorer.clean([c.text for cs in comps for c in cs], [p["answer"] for p in problems for _ in range(G)],
                               problem_texts(problems, G), problem_fields(problems, G))
        metrics["reward/flipped_frac"] = sum(a != b for a, b in zip(rewards, clean)) / max(len(clean), 1)
    versions = [v for v in kept_versions[:k] if v is not None]
    if versions:  # asynchronous: each group's staleness (the policy that generated it vs the one it trains)
        metrics["rollout/staleness_mean"] = sum(step - 1 - v for v in versions) / len(versions)
    return StepRollouts(problems, comps, rewards, prompt_ids, batch, world.dp_rank * k, seed, metrics,
                        min(versions) if versions else None, versions or None)
