"""Held-out evaluation during training: sampled and greedy accuracy of the current policy.

Spread over the data-parallel groups: each group evaluates a contiguous share of the held-out
problems (prompt ``i`` keeps the seed it has in a single engine's call), the per-sample rewards are
gathered, and every rank computes the same metrics.
"""
from __future__ import annotations

import time

import numpy as np

from pacs_fast.config import Config
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.trainer.problems import problem_fields, problem_texts, prompt_lists
from pacs_fast.trainer.rewards import Scorer

EVAL_SEED_OFFSET = 99_991  # the same seed every evaluation: evaluations of one run pair up


def evaluate_share(cfg: Config, engine, scorer: Scorer, problems: list[dict], offset: int) -> dict:
    """Rewards and lengths of this group's share of the held-out problems (``offset``: the index
    of its first problem in the whole set). Lists, for :func:`merge`."""
    prompts = prompt_lists(problems)
    n = cfg.rollout.eval_n
    # greedy decoding (eval_temperature 0) gives every sample of a problem the same response: one is
    # generated and counted n times
    draws = n if cfg.rollout.eval_temperature > 0 else 1
    params = SamplingParams(n=draws, temperature=cfg.rollout.eval_temperature, top_p=cfg.rollout.eval_top_p,
                            top_k=cfg.rollout.eval_top_k, min_p=cfg.rollout.eval_min_p,
                            max_new_tokens=cfg.rollout.max_new_tokens,
                            seed=cfg.train.seed + EVAL_SEED_OFFSET + offset * n, stop=tuple(cfg.rollout.stop))
    comps = engine.generate(prompts, params)
    args = ([c.text for cs in comps for c in cs], [p["answer"] for p in problems for _ in range(draws)])
    rewards = scorer(*args, problems=problem_texts(problems, draws), fields=problem_fields(problems, draws))
    lengths = [len(c.token_ids) for cs in comps for c in cs]
    copies = n // draws
    # a mix of rewards (reward.fn=a,b): each component's rewards too
    parts = getattr(scorer, "component_rewards", lambda *a: {})(*args, problem_texts(problems, draws),
                                                                problem_fields(problems, draws))
    out = {"rewards": [r for r in rewards for _ in range(copies)],
           "lengths": [x for x in lengths for _ in range(copies)], "greedy": [],
           "components": {name: [r for r in values for _ in range(copies)] for name, values in parts.items()}}
    if cfg.rollout.eval_temperature > 0:
        greedy = engine.generate(prompts, SamplingParams(n=1, temperature=0.0, stop=tuple(cfg.rollout.stop),
                                                         max_new_tokens=cfg.rollout.max_new_tokens))
        out["greedy"] = scorer([cs[0].text for cs in greedy], [p["answer"] for p in problems],
                               problems=problem_texts(problems, 1), fields=problem_fields(problems, 1))
    return out


def _unscored(texts: list[str], answers: list[str], **_) -> list[float]:
    """The scorer of the ranks whose scores are not used (rank 0's are broadcast)."""
    return [0.0] * len(texts)


def evaluate(cfg: Config, engine, scorer: Scorer, problems: list[dict], world) -> dict:
    """Held-out metrics (``eval/acc``: mean reward of ``eval_n`` samples per problem; ``pass@n``;
    greedy accuracy; mean response length), the same on every rank. Collective. An engine that
    ``generates_for_every_rank`` (the engine ranks of an asynchronous run) takes the whole set at once."""
    t0 = time.perf_counter()
    if getattr(engine, "generates_for_every_rank", False):  # every rank generates (collective), rank 0 scores
        mine = evaluate_share(cfg, engine, scorer if world.is_main else _unscored, problems, 0)
        parts = [world.broadcast(mine)]
    else:
        mine, offset = world.split(problems)
        parts = world.gather_dp(evaluate_share(cfg, engine, scorer, mine, offset))
    rewards = [r for p in parts for r in p["rewards"]]
    per_problem = np.asarray(rewards).reshape(len(problems), cfg.rollout.eval_n)
    out = {"eval/acc": float(np.mean(rewards)), "eval/pass@n": float((per_problem.max(1) > 0.5).mean()),
           "eval/response_length": float(np.mean([x for p in parts for x in p["lengths"]]))}
    if cfg.rollout.eval_temperature > 0:
        out["eval/greedy_acc"] = float(np.mean([r for p in parts for r in p["greedy"]]))
    for name in parts[0].get("components", {}):  # (the scoring rank's: every share has the same components)
        out[f"eval/{name}/mean"] = float(np.mean([r for p in parts for r in p["components"].get(name, [])]))
    out["time/eval"] = time.perf_counter() - t0
    return out


def eval_line(step: int, result: dict) -> str:
    """The printed line of an evaluation: ``step 5: held-out accuracy 0.412 (greedy 0.438)``; at
    ``rollout.eval_temperature=0`` the accuracy is the greedy one and is printed alone."""
    greedy = result.get("eval/greedy_acc")
    return (f"step {step}: held-out accuracy {result['eval/acc']:.3f}"
            + ("" if greedy is None else f" (greedy {greedy:.3f})"))
