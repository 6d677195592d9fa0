"""Held-out evaluation during training: sampled and greedy accuracy of the current policy."""
from __future__ import annotations

import time

import numpy as np

from pacs_fast.config import Config
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.trainer.rewards import Scorer


def evaluate(cfg: Config, engine, scorer: Scorer, problems: list[dict]) -> dict:
    """Held-out accuracy: mean reward of ``eval_n`` samples per problem (and of the greedy answer)."""
    t0 = time.perf_counter()
    prompts = [p["prompt_ids"] for p in problems]
    out = {}
    params = SamplingParams(n=cfg.rollout.eval_n, temperature=cfg.rollout.eval_temperature,
                            top_p=cfg.rollout.eval_top_p, max_new_tokens=cfg.rollout.max_new_tokens,
                            seed=cfg.train.seed + 99_991)  # the same seed every evaluation: paired comparisons
    comps = engine.generate(prompts, params)
    rewards = scorer([c.text for cs in comps for c in cs], [p["answer"] for p in problems for _ in range(params.n)])
    out["eval/acc"] = float(np.mean(rewards))
    per_problem = np.asarray(rewards).reshape(len(problems), params.n)
    out["eval/pass@n"] = float((per_problem.max(1) > 0.5).mean())
    out["eval/response_length"] = float(np.mean([len(c.token_ids) for cs in comps for c in cs]))
    if cfg.rollout.eval_temperature > 0:
        greedy = engine.generate(prompts, SamplingParams(n=1, temperature=0.0,
                                                         max_new_tokens=cfg.rollout.max_new_tokens))
        out["eval/greedy_acc"] = float(np.mean(scorer([cs[0].text for cs in greedy], [p["answer"] for p in problems])))
    out["time/eval"] = time.perf_counter() - t0
    return out
