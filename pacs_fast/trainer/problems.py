"""The run's problems: the training set and the held-out set, loaded and tokenised.

Bad files fail here, before any model work. The built-in arithmetic task brings its own prompt
format (``prompt``); other datasets go through the chat template (:mod:`pacs_fast.data.prompts`).
"""
from __future__ import annotations

import hashlib
import json

import torch

from pacs_fast.config import Config


def data_digest(train: list[dict], held_out: list[dict]) -> str:
    """SHA-1 of the training and held-out problems and answers, in order (kept in each checkpoint: a resume
    on edited, moved or replaced data would not continue the same training)."""
    h = hashlib.sha1()
    for rows in (train, held_out):
        for row in rows:
            h.update(json.dumps([row.get("problem"), row.get("answer")], ensure_ascii=False).encode("utf-8"))
        h.update(b"|")
    return h.hexdigest()


def load_problems(cfg: Config) -> tuple[list[dict], list[dict]]:
    """(train, held-out) problems as dicts with ``problem``, ``answer`` (and ``prompt`` for the
    built-in task, whose prompt format is its own). Errors on bad files come here, before any work."""
    if cfg.data.dataset == "arithmetic":
        from pacs_fast.data.arithmetic import arithmetic_splits
        # The problem set is fixed by data.arith_seed (not train.seed): runs with different seeds
        # train and are evaluated on the same problems, so their results pair up.
        return arithmetic_splits(cfg.data.arith_train_size, cfg.data.eval_size, seed=cfg.data.arith_seed,
                                 max_digits=cfg.data.arith_max_digits, ops=cfg.data.arith_ops,
                                 terms=cfg.data.arith_terms)
    from pacs_fast.data.datasets import load_dataset

    def load(path):
        return [{"id": p.id, "problem": p.problem, "answer": p.answer}
                for p in load_dataset(path, problem_field=cfg.data.problem_key, answer_field=cfg.data.answer_key,
                                          field_settings="data.problem_key= / data.answer_key=")]

    train = load(cfg.data.dataset)
    if not train:
        raise ValueError(f"data.dataset {cfg.data.dataset!r} has no rows")
    if cfg.data.eval_dataset:
        held = load(cfg.data.eval_dataset)[: cfg.data.eval_size]
    else:  # a seeded held-out split of the training file
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.train.seed)).tolist()
        n_eval = min(cfg.data.eval_size, len(train) // 5)
        if n_eval == 0:
            raise ValueError(f"data.dataset {cfg.data.dataset!r} has {len(train)} rows: too few to hold out an "
                             f"evaluation split (one row in five, at least 5 rows); give data.eval_dataset")
        held = [train[i] for i in order[:n_eval]]
        train = [train[i] for i in order[n_eval:]]
    return train, held


def encode(cfg: Config, tokenizer, problems: list[dict], what: str, log) -> tuple[list[dict], float]:
    """Adds ``prompt_ids`` to each problem and drops prompts longer than ``data.max_prompt_tokens``.
    Returns the kept problems and the dropped share; more than 5% dropped is a warning."""
    if problems and "prompt" in problems[0]:
        ids = [tokenizer.encode(p["prompt"], add_special_tokens=False) for p in problems]
    else:
        from pacs_fast.data.prompts import encode_prompts
        ids = encode_prompts(tokenizer, [p["problem"] for p in problems])
    out = [{**p, "prompt_ids": i} for p, i in zip(problems, ids) if 0 < len(i) <= cfg.data.max_prompt_tokens]
    dropped = 1.0 - len(out) / max(len(problems), 1)
    if len(out) < len(problems):
        longest = max(len(i) for i in ids)
        warn = "WARNING: " if dropped > 0.05 else ""
        log(f"{warn}{what}: dropped {len(problems) - len(out)} of {len(problems)} prompts ({dropped:.0%}) longer "
            f"than data.max_prompt_tokens={cfg.data.max_prompt_tokens} tokens (the longest has {longest}, chat "
            f"template included)")
    if not out:
        raise ValueError(f"{what}: no prompt fits data.max_prompt_tokens={cfg.data.max_prompt_tokens}")
    return out, dropped


def check_context(cfg: Config, context: int | None, sets: list[tuple[str, list[dict]]], log) -> None:
    """Each ``(name, encoded problems)`` set against the model's ``context`` (prompt + response
    tokens, :func:`pacs_fast.trainer.preflight.model_context`; None: nothing to check).

    ``rollout.engine=vllm``: a prompt of ``context`` tokens or more is a ValueError here (vLLM's
    engine would refuse it in the middle of the run). A prompt that leaves fewer than
    ``rollout.max_new_tokens`` tokens of the context is a warning: vLLM ends its responses at the
    context, the HF engine generates past the positions the model was trained on."""
    if not context:
        return
    new, vllm = cfg.rollout.max_new_tokens, cfg.rollout.engine == "vllm"
    drop = f"data.max_prompt_tokens={context - new if context > new else context - 1} or lower drops them"
    for what, problems in sets:
        lengths = [len(p["prompt_ids"]) for p in problems]
        i = max(range(len(lengths)), key=lengths.__getitem__)
        longest = f"the longest (problem {problems[i].get('id', i)!r}) has {lengths[i]} tokens, chat template included"
        over = sum(n >= context for n in lengths)
        if vllm and over:
            raise ValueError(f"{what}: {over} of {len(lengths)} prompts do not fit the model's context of {context} "
                             f"tokens (vLLM's max_model_len): {longest}; {drop}")
        short = sum(n + new > context for n in lengths)
        if short:
            cut = ("vLLM ends their responses at the context" if vllm
                   else "the HF engine generates past the model's max_position_embeddings")
            room = f"rollout.max_new_tokens={max(context - lengths[i], 1)} or lower leaves room for every response"
            fix = room if new >= context else f"{drop}, or {room}"  # no prompt leaves room for new >= context
            log(f"WARNING: {what}: {short} of {len(lengths)} prompts leave fewer than rollout.max_new_tokens={new} "
                f"tokens of the model's context of {context}: {cut}; {longest}; {fix}")


def check_token_budget(cfg: Config, what: str, problems: list[dict]) -> None:
    """``learner.max_tokens_per_micro_batch`` (when set) against the largest group these encoded
    training prompts can give: ``rollout.n x (longest prompt + rollout.max_new_tokens)`` tokens.
    A ValueError naming the key, the longest prompt and the budget that fits, before any model
    loads (the learner would refuse the group at its first step)."""
    budget = cfg.learner.max_tokens_per_micro_batch
    if not budget or not problems:
        return
    lengths = [len(p["prompt_ids"]) for p in problems]
    i = max(range(len(lengths)), key=lengths.__getitem__)
    largest = cfg.rollout.n * (lengths[i] + cfg.rollout.max_new_tokens)
    if budget < largest:
        raise ValueError(f"learner.max_tokens_per_micro_batch={budget} cannot hold the largest group of {what}: "
                         f"rollout.n={cfg.rollout.n} x (its longest prompt, problem {problems[i].get('id', i)!r}, "
                         f"{lengths[i]} tokens + rollout.max_new_tokens={cfg.rollout.max_new_tokens}) = {largest} "
                         f"tokens; raise it to {largest}, or lower data.max_prompt_tokens to drop the long prompts")
