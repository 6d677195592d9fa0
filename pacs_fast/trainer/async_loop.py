"""Asynchronous rollouts: engines on their own processes, generating ahead of the learner within a
staleness bound (``rollout.ranks=R``, ``rollout.max_staleness=K``).

    torchrun --nproc_per_node 3 -m pacs_fast.train rollout.ranks=2 rollout.max_staleness=1
    torchrun --nproc_per_node 4 -m pacs_fast.train rollout.ranks=2 rollout.engine=vllm rollout.tp_size=2 \
        learner.backend=megatron learner.tp_size=2 rollout.max_staleness=1

Processes ``0..R-1`` run rollout engines (:func:`pacs_fast.rollout.remote.serve`: an HF engine per
process, or a vLLM engine per ``rollout.tp_size`` processes), the rest the learner (the torch
learner on one process, or megatron's tensor / data parallel learner on several), each role in a
process group of its own (:mod:`.roles`). The learner's first process (the driver) alone talks to
the engines, through point-to-point messages (:class:`~pacs_fast.rollout.remote.RemoteEngines`), and
alone writes the run folder.

The learner's loop, step ``t``: keep requests in flight for every step ``u`` whose batch may still
be generated within the bound (``u - 1 - version <= K``, ``version`` = updates done so far; the
step's prompts are taken from the sampler when its request is sent, on every learner process alike),
wait for step ``t``'s completions (the driver receives them and hands them to the other learner
processes; each data-parallel group scores and trains its share, as in the synchronous loop), learn
(with the off-policy correction of ``correction.*``, on by default when ``K > 0``), push the new
weights to the engines (queued sends: the learner goes on at once), log, evaluate, save. An engine
handles its messages in order, so a batch generated after the weights of version ``v`` were queued
uses ``v`` or newer; ``rollout/policy_version`` and ``rollout/staleness = t - 1 - policy_version``
(<= K) are in every record and ``samples.jsonl`` row. With ``K = 0`` the engines generate step ``t``
only after update ``t - 1``: the synchronous schedule on separate processes, with the same results as
the one-process loop.

Evaluation runs on the learner's processes with the HF engine (on the torch learner's live policy,
or synced from megatron's). Checkpoints store the sampler position after the last *trained* step's
prompts, so ``--resume`` trains every step once: the batches in flight at the stop are dropped and
regenerated from the checkpoint's policy (those first steps then have staleness 0; the log says how
many were in flight).
"""
from __future__ import annotations

import time
from collections import deque
from pathlib import Path

from pacs_fast.config import Config
from pacs_fast.learner.base import NonFiniteError
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.rollout.remote import RemoteEngines, serve
from pacs_fast.trainer.loop import (TrainingStopped, evaluate_and_report, evaluate_unless_reported, finish,
                                   log_samples, reset_reference_if_due, save)
from pacs_fast.trainer.roles import Roles, close_roles, split_launch
from pacs_fast.trainer.rollout_step import sampling_params, step_seed
from pacs_fast.trainer.session import start
from pacs_fast.trainer.step import TOKEN_MEANS, learn, score_and_batch, step_record
from pacs_fast.trainer.user_functions import UserFunctionError


def run(cfg: Config, run_dir: str | Path, *, resume: bool = False) -> dict | None:
    """This process's part of an asynchronous launch: the learner (returns the summary on every
    learner process) or an engine (returns None). Creates and tears down the process groups."""
    roles = split_launch(cfg.rollout.ranks)
    try:
        if roles.role == "learner":
            return train_async(cfg, run_dir, roles, resume=resume)
        serve_engine(cfg, roles)
        return None
    finally:
        close_roles()


def serve_engine(cfg: Config, roles: Roles) -> int:
    """An engine process: builds its engine on the model folder the driver names, then serves."""
    import torch

    from pacs_fast.trainer.build import resolve_device, set_attention

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    tp = cfg.rollout.tp_size

    def build(info):
        if cfg.rollout.engine == "vllm":
            from pacs_fast.rollout.parallel_engines import colocated_engine_kwargs
            from pacs_fast.rollout.vllm_engine import VLLMEngine
            return VLLMEngine(info["model_path"], seed=cfg.train.seed, vocab_size=info["vocab_size"],
                              gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                              lm_head_fp32=cfg.model.lm_head_fp32,
                              **colocated_engine_kwargs(tp, len(roles.engine_ranks) // tp))
        from transformers import AutoTokenizer

        from pacs_fast.rollout.hf import HFEngine
        tokenizer = AutoTokenizer.from_pretrained(info["model_path"])
        engine = HFEngine(info["model_path"], tokenizer, device=resolve_device(cfg), batch_size=info["batch_size"],
                          lm_head_fp32=cfg.model.lm_head_fp32)
        set_attention(engine.model, cfg.model.attention)
        return engine

    return serve(build, roles.bridge, roles.driver, answers=roles.rank % tp == 0)


def _params(cfg: Config, step: int) -> SamplingParams:
    return sampling_params(cfg, step_seed(cfg, step))  # as the synchronous loop


def train_async(cfg: Config, run_dir: str | Path, roles: Roles, *, resume: bool = False) -> dict:
    """The learner's loop (see the module docstring) on every learner process; returns the summary."""
    t_start = time.perf_counter()
    tp = cfg.rollout.tp_size
    groups = [roles.engine_ranks[i:i + tp] for i in range(0, len(roles.engine_ranks), tp)]
    engines = RemoteEngines(roles.bridge, groups) if roles.is_driver else None  # the driver's alone
    try:
        s = start(cfg, run_dir, resume=resume)
    except BaseException:
        if engines:
            engines.close(wait=False)  # the engines wait for their setup: let them go
        raise
    world, K, P = s.world, cfg.rollout.max_staleness, cfg.train.prompts_per_step
    if engines:
        engines.setup({"model_path": str(s.model_path), "vocab_size": len(s.tokenizer),
                       "batch_size": getattr(s.engine, "batch_size", 64)})
    version = s.start_step
    if s.start_step:  # resumed: the engines start from the checkpoint's policy
        weights = s.learner.export_hf_weights()  # collective over megatron's tensor-parallel group
        if engines:
            engines.push_weights(weights, version)
        s.log(f"asynchronous resume: the batches in flight at the stop (up to {K + 1}) are regenerated "
              f"from the step-{s.start_step} policy")
    in_flight: deque = deque()  # (step, problems, sampler state after taking them)
    next_step = s.start_step + 1
    last_eval = dict(s.initial_eval)
    clean = False
    try:
        for step in range(s.start_step + 1, cfg.train.steps + 1):
            t_step, tm = time.perf_counter(), {}
            while next_step <= cfg.train.steps and next_step - 1 - version <= K:
                problems = [s.train_problems[i] for i in s.sampler.take(P)]  # every learner process alike
                if engines:
                    engines.generate(next_step, [p["prompt_ids"] for p in problems], _params(cfg, next_step))
                in_flight.append((next_step, problems, s.sampler.state_dict()))
                next_step += 1
            _, problems, sampler_state = in_flight.popleft()
            reset_reference_if_due(cfg, s.learner, step)  # as the synchronous loop (the reference is the learner's)
            t0 = time.perf_counter()
            comps, gen_version = engines.collect(step) if engines else (None, None)
            comps, gen_version = world.broadcast((comps, gen_version))
            tm["time/rollout"] = time.perf_counter() - t0  # the learner's wait for this batch
            problems, offset = world.share(problems)  # this data-parallel group's share, as the synchronous loop
            comps = comps[offset:offset + len(problems)]
            rewards, prompt_ids, batch = score_and_batch(s, step, problems, comps, tm, offset=offset)
            diagnostic = step in (1, cfg.train.steps) or bool(cfg.train.eval_every and step % cfg.train.eval_every == 0)
            try:
                lm, mismatch = learn(cfg, s.learner, batch, prompt_ids, comps, seed=_params(cfg, step).seed,
                                     diagnostic=diagnostic, timings=tm)
            except NonFiniteError as e:
                raise TrainingStopped(f"step {step}: {e}; no checkpoint was written for it") from e
            version = step
            t0 = time.perf_counter()
            weights = s.learner.export_hf_weights()
            if engines:
                engines.push_weights(weights, version)
            tm["time/sync"] = time.perf_counter() - t0
            tm["time/step"] = time.perf_counter() - t_step
            terms = getattr(s.learner, "last_terms", {})
            record = world.reduce_record({**step_record(batch, comps, lm, mismatch, terms, tm, epoch=s.sampler.epoch),
                                          **getattr(s.scorer, "last", {}), **(s.credit.last if s.credit else {})},
                                         TOKEN_MEANS)
            record.update({"rollout/policy_version": gen_version, "rollout/staleness": step - 1 - gen_version,
                           "rollout/generating_ranks": cfg.rollout.ranks})
            if s.logger:
                s.logger.log("train", step, record)
                log_samples(s, step, problems, comps, rewards, terms, extra={"policy_version": gen_version})
            s.progress.update(step, f"reward {record['reward/mean']:.2f}  held-out {last_eval['eval/acc']:.2f}  "
                                    f"staleness {step - 1 - gen_version}  {tm['time/step']:.1f}s/step")
            last = step == cfg.train.steps
            if last or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
                s.sync()  # the evaluation engine: shares the torch learner's model (a no-op), or a copy
                last_eval = evaluate_and_report(s, step)
            if last or (cfg.train.save_every and step % cfg.train.save_every == 0):
                # the sampler as step `step` left it: the prompts of the requests in flight are taken again on resume
                save(s, step, sampler_state)
        evaluate_unless_reported(s)
        clean = True
    except UserFunctionError as e:
        raise TrainingStopped(f"step {step}: {e}; no checkpoint was written for it") from e
    finally:
        if engines:
            engines.close(wait=clean)  # after an error the engines may be gone: do not wait for them
        s.progress.close()
        if not clean:
            s.close()
    summary = finish(s, wall_time=time.perf_counter() - t_start) if world.is_main else None
    summary = world.broadcast(summary)
    world.barrier()
    s.close()
    if hasattr(s.learner, "close"):  # megatron's parallel state
        s.learner.close()
    return summary
