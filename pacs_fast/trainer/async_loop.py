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

The learner's loop, step ``t``: keep ``K + 1`` generation batches in flight (:class:`RemoteRounds`;
a batch's prompts are taken from the sampler when its request is sent, on every learner process
alike), wait for the oldest batch's completions (the driver receives them and hands them to the other
learner processes; each data-parallel group scores and trains its share, as in the synchronous loop;
with ``rollout.filter_groups`` the step takes batches until enough groups are kept, the same
:func:`~pacs_fast.trainer.rollout_step.rollout_step` as the synchronous loop), learn
(with the off-policy correction of ``correction.*``, on by default when ``K > 0``), push the new
weights to the engines (queued sends: the learner goes on at once), log, evaluate, save. An engine
handles its messages in order, so a batch generated after the weights of version ``v`` were queued
uses ``v`` or newer; ``rollout/policy_version`` and ``rollout/staleness = t - 1 - policy_version``
(<= K; with dynamic sampling the oldest of the step's groups, and ``rollout/staleness_mean`` over
its groups) are in every record and ``samples.jsonl`` row. With ``K = 0`` the engines generate step ``t``
only after update ``t - 1``: the synchronous schedule on separate processes, with the same results as
the one-process loop.

Evaluation: with vLLM engines the held-out prompts go to the engine ranks like a batch, after the
weights of the step they evaluate (:class:`EngineRanksEval`: no learner process holds a model copy
for it, and the records equal the one-process vLLM run's); with HF engines it runs on the learner's
processes (on the torch learner's live policy, or an HF copy synced from megatron's).
A checkpoint stores the batches in flight with their completions, policy versions and epochs (collected once the
learner's files are written: the engines generate them meanwhile), and the sampler position after their
prompts, so ``--resume`` goes on exactly as the uninterrupted run: the same batches at the same steps, the same
records and weights, also for a run extended by a larger ``train.steps`` (batches are requested past the end).
Not so from a checkpoint written before the batches were saved (those in flight are regenerated from its
policy, with staleness 0).
"""
from __future__ import annotations

import time
from collections import deque
from pathlib import Path

from pacs_fast.config import Config
from pacs_fast.learner.base import NonFiniteError
from pacs_fast.rollout.base import Completion, RolloutEngine, SamplingParams, pack_completions, unpack_completions
from pacs_fast.rollout.remote import RemoteEngines, serve
from pacs_fast.trainer.engine_checks import warn_engine_mismatch
from pacs_fast.trainer.loop import (TrainingStopped, evaluate_and_report, evaluate_unless_reported, finish,
                                   latest_eval, log_samples, reset_reference_if_due, save)
from pacs_fast.trainer.problems import prompt_lists
from pacs_fast.trainer.roles import Roles, close_roles, split_launch
from pacs_fast.trainer.rollout_step import NoGroupKept, Round, batch_seed, rollout_step, sampling_params
from pacs_fast.trainer.session import end_status, start
from pacs_fast.trainer.step import WEIGHTED_MEANS, learn, reward_component_metrics, step_record, terms_over_groups
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

    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    tp = cfg.rollout.tp_size
    return serve(lambda info: engine_process_engine(cfg, info, len(roles.engine_ranks) // tp), roles.bridge,
                 roles.driver, answers=roles.rank % tp == 0)


def engine_process_engine(cfg: Config, info: dict, n_engines: int):
    """The engine of an engine process: vLLM (one of ``n_engines``, ``rollout.tp_size`` processes each) or HF, on
    the folder ``info["model_path"]``, in ``rollout.dtype`` (:func:`~pacs_fast.trainer.build.engine_dtypes`)."""
    from pacs_fast.trainer.build import engine_dtypes, resolve_device, set_attention, vllm_cpu_sizes

    vllm_dtype, hf_dtype = engine_dtypes(cfg)
    tp = cfg.rollout.tp_size
    if cfg.rollout.engine == "vllm":
        from pacs_fast.rollout.parallel_engines import colocated_engine_kwargs
        from pacs_fast.rollout.vllm_engine import VLLMEngine
        return VLLMEngine(info["model_path"], seed=cfg.train.seed, vocab_size=info["vocab_size"], dtype=vllm_dtype,
                          gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                          lm_head_fp32=cfg.model.lm_head_fp32, **colocated_engine_kwargs(tp, n_engines),
                          **vllm_cpu_sizes(cfg, info["model_path"], tp))
    from pacs_fast.data.tokenizer_files import load_tokenizer
    from pacs_fast.rollout.hf import HFEngine
    tokenizer = load_tokenizer(info["model_path"], key="model.path")
    engine = HFEngine(info["model_path"], tokenizer, device=resolve_device(cfg), dtype=hf_dtype,
                      batch_size=info["batch_size"], lm_head_fp32=cfg.model.lm_head_fp32)
    set_attention(engine.model, cfg.model.attention)
    return engine


class RemoteRounds:
    """The generation batches of an asynchronous run (the rounds of :func:`rollout_step`), on every
    learner process: :meth:`begin_step` keeps ``rollout.max_staleness + 1`` batches in flight (the
    prompts taken from the sampler alike on every learner process; the driver sends the requests);
    :meth:`next` hands out the oldest (a round of dynamic sampling that finds none in flight asks for
    one at once: it is generated by the current policy). A batch requested at the top of step ``t``
    (policy ``t - 1``) is consumed by step ``t + K`` at the latest (each step consumes one or more), so
    no group is staler than ``K``. Without ``rollout.filter_groups`` each step consumes exactly one. Batches
    are requested past ``train.steps`` too (at most K, generated while the last steps train, kept by the last
    checkpoint and then dropped): a run extended by ``--resume <run> train.steps=<more>`` goes on as one started
    with the larger ``train.steps``."""

    def __init__(self, s, engines, *, saved: list[dict] | None = None):
        self.s, self.engines = s, engines
        # (batch index, problems, the sampler's epoch after its prompts: the step that trains it records that one,
        # as the synchronous loop does, not the epoch the producer reached K batches ahead)
        self.in_flight: deque = deque()
        self.ready: dict = {}  # batch index -> (completions, policy version): collected ahead of its step
        self.next_index = s.batches + 1
        self.epoch = s.sampler.epoch  # the epoch of the batch handed out last (``data/epoch`` of its step)
        for b in saved or ():  # a checkpoint's batches in flight (see checkpoint_batches; "epoch" since 2026-12-06)
            self.in_flight.append((b["index"], b["problems"], b.get("epoch", s.sampler.epoch)))
            self.ready[b["index"]] = (unpack_completions(b["comps"]), b["version"])
            self.next_index = b["index"] + 1

    def _request(self) -> None:
        s, cfg = self.s, self.s.cfg
        problems = [s.train_problems[i] for i in s.sampler.take(cfg.train.prompts_per_step)]
        if self.engines:
            self.engines.generate(self.next_index, prompt_lists(problems),
                                  sampling_params(cfg, batch_seed(cfg, self.next_index)))
        self.in_flight.append((self.next_index, problems, s.sampler.epoch))
        self.next_index += 1

    def begin_step(self) -> None:
        while len(self.in_flight) <= self.s.cfg.rollout.max_staleness:
            self._request()

    def next(self) -> Round:
        if not self.in_flight:
            self._request()
        index, problems, self.epoch = self.in_flight.popleft()
        comps, version = self.ready.pop(index) if index in self.ready else self._collect(index)
        problems, offset = self.s.world.share(problems)  # this data-parallel group's share, as the synchronous loop
        self.s.batches = index
        return Round(problems, offset, comps[offset:offset + len(problems)], index, version)

    def _collect(self, index: int) -> tuple[list, int]:
        """Batch ``index``'s completions and policy version, on every learner process (the driver receives them)."""
        comps, version = self.engines.collect(index) if self.engines else (None, None)
        return self.s.world.broadcast((comps, version))

    def checkpoint_batches(self) -> list[dict]:
        """The batches in flight with their completions (``pack_completions``), for a checkpoint (collective: the
        learner waits until the engines have generated them). A resume trains them at the steps the uninterrupted
        run would have, and the sampler stands after their prompts, so the run goes on as if it had not stopped."""
        out = []
        for index, problems, epoch in self.in_flight:
            if index not in self.ready:
                self.ready[index] = self._collect(index)
            comps, version = self.ready[index]
            out.append({"index": index, "problems": problems, "comps": pack_completions(comps), "version": version,
                        "epoch": epoch})
        return out

    def pause(self) -> None:
        pass

    def drain(self) -> None:
        """Collects the batches still in flight at the end (requested past ``train.steps``)."""
        while self.in_flight:
            index = self.in_flight.popleft()[0]
            if self.ready.pop(index, None) is None and self.engines:
                self.engines.collect(index)


class EngineRanksEval(RolloutEngine):
    """The evaluation engine of an asynchronous run with vLLM engines, on every learner process: the driver
    sends the held-out prompts to the engine ranks (behind the weights of the step being evaluated, which
    they apply first) and hands the completions to the other learner processes. Seeds as a one-process
    engine's (:meth:`RemoteEngines.generate` offsets each engine's share), so the evaluation is the
    synchronous run's."""

    generates_for_every_rank = True  # pacs_fast.trainer.evaluation.evaluate: the whole set, not a share

    def __init__(self, engines: RemoteEngines | None, world):
        self.engines, self.world, self.requests = engines, world, 0

    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        self.requests += 1
        comps = None
        if self.engines:
            key = -self.requests  # (generation batches are numbered from 1)
            self.engines.generate(key, prompt_token_ids, params)
            comps, _ = self.engines.collect(key)
        return self.world.broadcast(comps)

    def sync_weights(self, named_tensors) -> None:  # the loop pushes every update to the engines
        pass


def train_async(cfg: Config, run_dir: str | Path, roles: Roles, *, resume: bool = False) -> dict:
    """The learner's loop (see the module docstring) on every learner process; returns the summary."""
    t_start = time.perf_counter()
    tp = cfg.rollout.tp_size
    groups = [roles.engine_ranks[i:i + tp] for i in range(0, len(roles.engine_ranks), tp)]
    engines = RemoteEngines(roles.bridge, groups) if roles.is_driver else None  # the driver's alone

    def evaluation_engine(model_path, tokenizer, world, build):
        """The engines' setup (the step-0 evaluation may need them), then the learner's evaluation engine:
        the engine ranks with vLLM, else ``build()``'s HF engine."""
        from pacs_fast.trainer.build import generate_batch

        if engines:
            engines.setup({"model_path": str(model_path), "vocab_size": len(tokenizer),
                           "batch_size": generate_batch(cfg), "replies_ahead": cfg.rollout.max_staleness + 3})
        return (EngineRanksEval(engines, world), (lambda: None)) if cfg.rollout.engine == "vllm" else build()

    try:
        s = start(cfg, run_dir, resume=resume, engine_builder=evaluation_engine)
    except BaseException as e:
        if engines:
            engines.close(wait=False)  # the engines wait for their setup: let them go
        if isinstance(e, UserFunctionError):  # reward.fn at the step-0 evaluation
            raise TrainingStopped(f"{e}; no checkpoint was written") from e
        raise
    s.t_start = t_start
    world, K = s.world, cfg.rollout.max_staleness
    version = s.start_step
    if s.start_step:  # resumed: the engines start from the checkpoint's policy
        weights = s.learner.export_hf_weights()  # collective over megatron's tensor-parallel group
        if engines:
            engines.push_weights(weights, version)
        if s.in_flight is None:  # a checkpoint from before they were saved
            s.log(f"asynchronous resume: the batches in flight at the stop (up to {K + 1}) are regenerated "
                  f"from the step-{s.start_step} policy")
        elif s.in_flight:
            s.log(f"asynchronous resume: {len(s.in_flight)} batch(es) in flight at the step-{s.start_step} "
                  f"checkpoint, saved with it, train as they would have; newer ones generate from its policy")
        else:  # (with K = 0 none is requested ahead)
            s.log(f"asynchronous resume: no batch was in flight at the step-{s.start_step} checkpoint; the next "
                  f"ones generate from its policy")
    rounds = RemoteRounds(s, engines, saved=s.in_flight)
    s.in_flight = None  # (the rounds hold them until their steps)
    last_eval = latest_eval(s)
    clean, status = False, "failed"
    try:
        for step in range(s.start_step + 1, cfg.train.steps + 1):
            t_step, tm = time.perf_counter(), {}
            rounds.begin_step()
            reset_reference_if_due(cfg, s.learner, step)  # as the synchronous loop (the reference is the learner's)
            try:  # the next batch(es) in flight (tm["time/rollout"]: the learner's wait for them), scored
                r = rollout_step(s, step, tm, rounds)
            except NoGroupKept as e:
                raise TrainingStopped(f"step {step}: {e}") from e
            problems, comps, rewards, prompt_ids, batch = r.problems, r.comps, r.rewards, r.prompt_ids, r.batch
            gen_version = r.version
            diagnostic = step in (1, cfg.train.steps) or bool(cfg.train.eval_every and step % cfg.train.eval_every == 0)
            try:
                lm, mismatch = learn(cfg, s.learner, batch, prompt_ids, comps, seed=r.seed,
                                     diagnostic=diagnostic, timings=tm, step=step)
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
            whole = terms_over_groups(world, terms, batch)  # every group's rows
            record = world.reduce_record({**step_record(batch, comps, lm, mismatch, whole, tm, epoch=rounds.epoch),
                                          **getattr(s.scorer, "last", {}), **(s.credit.last if s.credit else {}),
                                          **r.metrics, **reward_component_metrics(s, problems, comps)},
                                         WEIGHTED_MEANS)
            record.update({"rollout/policy_version": gen_version, "rollout/staleness": step - 1 - gen_version,
                           "rollout/generating_ranks": cfg.rollout.ranks})
            if step == s.start_step + 1 and gen_version == step - 1 and world.is_main:  # (sampled with these weights)
                warn_engine_mismatch(cfg, record, step)
            if s.logger:
                s.logger.log("train", step, record)
            log_samples(s, step, problems, comps, rewards, terms, batch,  # each row its own group's policy version
                        group_extra=[{"policy_version": v} for v in r.versions or [gen_version] * len(problems)])
            s.progress.update(step, f"reward {record['reward/mean']:.2f}  held-out {last_eval['eval/acc']:.2f}  "
                                    f"staleness {step - 1 - gen_version}  {tm['time/step']:.1f}s/step")
            last = step == cfg.train.steps
            if last or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
                s.sync()  # the evaluation engine: shares the torch learner's model (a no-op), or a copy
                last_eval = evaluate_and_report(s, step)
            if last or (cfg.train.save_every and step % cfg.train.save_every == 0):
                save(s, step, in_flight=rounds.checkpoint_batches)  # (the learner waits for the engines there)
        evaluate_unless_reported(s)
        rounds.drain()
        clean = True
    except UserFunctionError as e:
        raise TrainingStopped(f"step {step}: {e}; no checkpoint was written for it") from e
    except BaseException as e:  # the trackers' runs end as killed (Ctrl-C, SIGTERM) or failed
        status = end_status(e)
        raise
    finally:
        if engines:
            engines.close(wait=clean)  # after an error the engines may be gone: do not wait for them
        s.progress.close()
        if not clean:
            s.close(status)
    summary = finish(s) if world.is_main else None
    summary = world.broadcast(summary)
    world.barrier()
    s.close()
    if hasattr(s.learner, "close"):  # megatron's parallel state
        s.learner.close()
    return summary
