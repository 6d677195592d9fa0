"""A training session: everything :func:`pacs_fast.trainer.loop.train` sets up before its loop.

In order: the config is checked and the run folder claimed (nothing is loaded before that), the
processes are joined (:mod:`.parallel`), the data loaded, the model found (or the built-in one
warmed up, once per node), the learner, this rank's rollout engine and the verifier built, and the
run either resumed from its newest usable checkpoint or its starting policy evaluated.
"""
from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from pacs_fast.code_version import code_version, resume_note
from pacs_fast.config import Config, hazard_warnings, to_dict, unused_settings, validate
from pacs_fast.config.model_files import vocab_problem
from pacs_fast.data.prompt_date import pinned_date_kwargs, today
from pacs_fast.data.prompts import build_prompt, prompt_warnings, system_in_user_turn, template_kwargs_effect
from pacs_fast.data.tokenizer_files import load_tokenizer
from pacs_fast.gc_heap import freeze_long_lived
from pacs_fast.openmp import threads_beside_other_jobs
from pacs_fast.reward.boxes import opens_think
from pacs_fast.rollout.base import folder_stop_ids
from pacs_fast.rollout.stop_strings import special_token_warning
from pacs_fast.signals import Stopped
from pacs_fast.trainer.build import build_engine, build_learner, check_installed, resolve_device
from pacs_fast.learner.base import CheckpointMismatch
from pacs_fast.trainer.checkpoint import (changed_model_files, checkpoints_newest_first, newest_intact,
                                          remove_stale_temporaries, restore_newest, settle_after_resume)
from pacs_fast.trainer.correction import correction_warnings
from pacs_fast.trainer.evaluation import eval_line, evaluate
from pacs_fast.trainer.metrics import MetricsLogger, Progress, begins_at_resume, read_jsonl
from pacs_fast.trainer.parallel import World, init_world, quiet_warnings
from pacs_fast.trainer.engine_checks import model_context, vllm_refusal, vllm_window_warning
from pacs_fast.trainer.preflight import (check_cpus, check_logits_transform, check_lora_targets, check_megatron_model,
                                         check_memory, check_packed_attention, check_quantized, check_tensor_parallel,
                                         memory_warnings)
from pacs_fast.trainer.problems import (check_context, check_gold_answers, check_token_budget, data_digest,
                                        data_warnings, encode, load_problems, resumed_problems)
from pacs_fast.trainer.rewards import Scorer, check_callables
from pacs_fast.trainer.run_claim import check_new_run_dir
from pacs_fast.trainer.run_folder import RunFolder, claim_run_folder
from pacs_fast.trainer.sampler import PromptSampler
from pacs_fast.trainer.step_credit import StepCredit
from pacs_fast.trainer.trackers import check_trackers, open_trackers
from pacs_fast.trainer.user_functions import UserFunctionError


class SetupError(ValueError):
    """Bad input found before any training work (config, files, data, checkpoint)."""


@dataclass
class Session:
    cfg: Config
    world: World
    run_dir: Path
    model_path: Path
    tokenizer: object
    learner: object
    engine: object
    sync: Callable[[], object]
    scorer: Scorer
    sampler: PromptSampler
    train_problems: list[dict]
    held_out: list[dict]
    progress: Progress
    credit: StepCredit | None = None  # process rewards (reward.step_rewards), else None
    folder: RunFolder | None = None  # rank 0 only
    logger: MetricsLogger | None = None  # rank 0 only
    start_step: int = 0
    batches: int = 0  # generation batches consumed so far (one per step without rollout.filter_groups)
    initial_eval: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    wall_before: float | None = 0.0  # wall time of the kept steps in earlier sessions (the checkpoint resumed
    # from); None when that checkpoint did not record it (written before 2026-11-28)
    code_versions: list[str] = field(default_factory=list)  # the pacs_fast versions that trained the run, in order
    data_sha1: str = ""  # problems.data_digest of the training and held-out problems (kept in each checkpoint)
    prompt_date: str | None = None  # the date_string a dating chat template's prompts got (kept in each checkpoint)
    # an asynchronous run's generation batches in flight at the resumed checkpoint, with their completions
    # (trainer/async_loop.py; None: a checkpoint that saved none, from before 2026-12-01 or of a synchronous run)
    in_flight: list[dict] | None = None
    t_start: float = field(default_factory=time.perf_counter)  # when this session started (train() sets it)

    def wall_time(self) -> float | None:
        """Wall time of the run so far: earlier sessions up to the resumed checkpoint, then this one (None when
        the earlier sessions' is unknown)."""
        return None if self.wall_before is None else self.wall_before + time.perf_counter() - self.t_start

    def log(self, text: str) -> None:
        if self.world.is_main:
            self.progress.print(text)

    def evaluate(self) -> dict:
        return evaluate(self.cfg, self.engine, self.scorer, self.held_out, self.world)

    def close(self, status: str = "failed") -> None:
        """Closes the progress bar, the metrics logger (its trackers' runs with ``status``: failed, the default, or
        killed (:func:`end_status`); a finished run's logger is closed as finished by the loop's ``finish``), the
        run folder, the scorer and the engine; each is closed when an earlier one raised (the first error is raised
        after)."""
        self.progress.close()
        error = None
        for part in (self.logger, self.folder, self.scorer, self.engine):
            if part is None:
                continue
            try:
                part.close(status) if part is self.logger else part.close()
            except BaseException as e:  # (a signal while one closed: the rest close all the same, then it is raised)
                error = error or e
        if error is not None:
            raise error


def end_status(error: BaseException) -> str:
    """How a run that raised ``error`` ended, for its trackers' runs: killed (Ctrl-C, SIGTERM / SIGHUP) or failed."""
    return "killed" if isinstance(error, (KeyboardInterrupt, Stopped)) else "failed"


def start(cfg: Config, run_dir: str | Path, *, resume: bool, engine_builder=None) -> Session:
    """Sets up a run (see the module docstring). Raises :class:`SetupError` for bad input.
    ``engine_builder(model_path, tokenizer, world, build)``: ``(engine, sync)`` in place of ``build()``, which
    gives :func:`~pacs_fast.trainer.build.build_engine`'s (an asynchronous run: its engines' setup first)."""
    try:
        validate(cfg, new_run=not resume)
        check_installed(cfg)
        check_callables(cfg)  # reward.appeal / reward.step_rewards import before any model work
        check_memory(cfg)  # a learner or a rollout that cannot fit is refused before any model loads
        check_cpus(cfg)  # so are more threads or reward workers than CPUs
        check_trackers(cfg)  # a missing tracker library or W&B login, likewise
        check_tensor_parallel(cfg)  # so is a tensor-parallel size megatron cannot shard the model over
        check_megatron_model(cfg)  # and a model megatron's builder cannot reproduce
        check_packed_attention(cfg)  # or learner.packed_attention=varlen cannot run
        check_logits_transform(cfg)  # or a model whose logits the log-prob op cannot reproduce
        check_quantized(cfg)  # or quantized weights (gpt-oss's MXFP4 experts) the learner cannot train
        lora_lines = check_lora_targets(cfg)  # or LoRA adapters on layers the model does not have
        if not resume and cfg.train.run_name:  # (an automatic name another run took moves on: claim_run_folder)
            check_new_run_dir(run_dir)
        quiet_warnings(cfg, is_main=True)  # megatron's import-time notes
        world = init_world(cfg)
    except ValueError as e:
        raise SetupError(str(e)) from e
    quiet_warnings(cfg, world.is_main)
    shared = None
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    elif resolve_device(cfg) == "cpu":  # other jobs on this CPU: take the free cores only (pacs_fast/openmp.py)
        shared = threads_beside_other_jobs(torch.get_num_threads())
        if shared:
            torch.set_num_threads(shared[0])
    if cfg.train.keep_freed_memory:
        from pacs_fast.trainer.allocator import keep_freed_memory
        keep_freed_memory()
    folder, claim_error = None, None
    if world.is_main:
        try:
            folder = claim_run_folder(run_dir, new=not resume, automatic=not cfg.train.run_name)
            run_dir = folder.path
        except ValueError as e:  # another live run holds the folder
            claim_error = str(e)
    claim_error, run_dir = world.broadcast((claim_error, str(run_dir)))  # every rank stops together, or
    if claim_error:  # takes rank 0's folder (a timestamped name could differ between ranks)
        raise SetupError(claim_error)
    run_dir = Path(run_dir)
    if resume and world.is_main:
        remove_stale_temporaries(run_dir)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed % 2**32)
    torch.manual_seed(cfg.train.seed)
    progress = Progress(cfg.train.steps, enabled=cfg.train.progress and world.is_main)
    log = progress.print if world.is_main else (lambda text: None)
    layout = [] if not (cfg.learner.distributed_optimizer and world.dp == 1) else [
        "learner.distributed_optimizer=true has no effect with one data-parallel group (it shards AdamW's state "
        "over two or more)"]
    for line in (unused_settings(cfg) + layout + hazard_warnings(cfg) + correction_warnings(cfg)
                 + memory_warnings(cfg) + lora_lines):
        log(f"warning: {line}")
    if shared:
        log(f"other processes keep {shared[1]:.1f} of this machine's CPUs busy: {shared[0]} torch thread(s) "
            f"(train.threads sets them)")
    try:
        train_problems, held_out = load_problems(cfg)  # bad files fail here, before any model work
        data_sha1 = data_digest(train_problems, held_out)
        newest = newest_trainer_state(run_dir) if resume else None  # (the checkpoint a resume continues from)
        if resume:
            stored = (newest[0], newest[1]["data_sha1"]) if newest and newest[1].get("data_sha1") else None
            if stored and stored[1] != data_sha1:  # (a run whose held-out split was drawn as before 2026-12-06)
                train_problems, held_out = resumed_problems(cfg, train_problems, held_out, stored[1])
                data_sha1 = data_digest(train_problems, held_out)
            check_same_data(run_dir, cfg, data_sha1, stored)
        for line in data_warnings(cfg, train_problems, held_out):
            log(f"warning: {line}")
        check_gold_answers(cfg, train_problems, held_out, log)  # answers no response can match: before any model
        model_path, timings = find_model(cfg, train_problems, world, log)
        if newest:
            check_same_model_files(run_dir, model_path, newest)
        tokenizer = load_tokenizer(model_path, key="model.path")
        problem = vocab_problem(model_path, len(tokenizer))  # (validation read the files; this, the loaded one)
        if problem:
            raise ValueError(f"model.path {str(model_path)!r}: {problem}")
        if system_in_user_turn(tokenizer, cfg.data.system_prompt, cfg.data.prompt_template):
            log("note: the chat template of model.path takes no system message: the system prompt goes first in "
                "the user message (pacs_fast/data/prompts.py)")
        idle = template_kwargs_effect(tokenizer, cfg.data.chat_template_kwargs, cfg.data.prompt_template)
        if idle:
            log(f"warning: data.chat_template_kwargs={cfg.data.chat_template_kwargs}: {idle}")
        # a template that dates its prompts (Llama 3.2's strftime_now): the first session's date, on every rank
        prompt_date = world.broadcast((newest[1].get("prompt_date") if newest else None) or today())
        template_kwargs, prompt_date, line = pinned_date_kwargs(tokenizer, cfg.data.chat_template_kwargs, prompt_date,
                                                                key="data.chat_template_kwargs", again="a --resume",
                                                                prompt_template=cfg.data.prompt_template)
        if line:
            log(line)
        special = special_token_warning(tokenizer, cfg.rollout.stop, "rollout.stop")
        if special:
            log(f"warning: {special}")
        problems = [p["problem"] for p in train_problems[:2000] if "prompt" not in p]
        held = [p["problem"] for p in held_out[:2000] if "prompt" not in p]  # (wrapped again as silently)
        for line in prompt_warnings(tokenizer, problems, folder_stop_ids(model_path, tokenizer), held_out=held,
                                    prompt_template=cfg.data.prompt_template) if problems or held else []:
            log(f"warning: {line}")
        train_problems, dropped_train = encode(cfg, tokenizer, train_problems, "data.dataset", log,
                                               template_kwargs=template_kwargs)
        held_out, dropped_held = encode(cfg, tokenizer, held_out, "the held-out set", log, held_out=True,
                                        template_kwargs=template_kwargs)
        # rank 0's reading on every rank: vLLM's derivation imports vLLM (~3 s), which learner-only ranks never need
        # (with vLLM's refusal of the architecture: every rank raises it, none waits on a collective)
        context, refusal = world.broadcast((model_context(cfg, model_path), vllm_refusal(cfg, model_path))
                                           if world.is_main else None)
        if refusal:
            raise ValueError(refusal)
        window_note = vllm_window_warning(cfg, model_path) if world.is_main else None
        if window_note:
            log(f"warning: {window_note}")
        check_context(cfg, context, [("data.dataset", train_problems), ("the held-out set", held_out)], log)
        check_token_budget(cfg, "data.dataset", train_problems)
    except (ValueError, FileNotFoundError) as e:
        progress.close()
        if folder:
            folder.close(abandon=True)  # a new run's folder holding only its lock goes
        raise SetupError(str(e)) from e
    if folder and not resume:
        try:
            folder.write_config(cfg)
        except OSError:  # a full disk: a new run leaves no folder (it had kept one holding its lock alone)
            progress.close()
            folder.close(abandon=True, discard=True)
            raise

    device = resolve_device(cfg)
    freeze_long_lived()  # transformers, megatron-core, the tokenizer, the problems (pacs_fast/gc_heap.py)
    try:  # a setting the loaded model refuses (model.attention): one line, and a new run leaves no folder
        learner, live_model = build_learner(cfg, model_path, device, tokenizer)
        fused = getattr(learner, "fused_layers", "fused layers: off")
        if cfg.learner.fused_layers == "on" or (cfg.learner.fused_layers == "auto" and str(device).startswith("cuda")):
            log(fused)  # what was fused, or why not (auto: on a GPU, where it would pay; the default)
        if cfg.model.gradient_checkpointing:  # which activations the backward recomputes
            log(getattr(learner, "recompute", None) or f"activation recompute: {cfg.model.recompute_granularity}")
        if getattr(learner, "tp_size", 1) > 1:  # the learner's layout (learner.sequence_parallel: memory, not values)
            log(f"learner: tensor parallel {learner.tp_size} x data parallel {learner.dp_size}, sequence parallel "
                f"{'on' if learner.sequence_parallel else 'off'}")
        if getattr(learner, "lora_line", None):  # what trains (model.lora_rank)
            log(learner.lora_line)
        freeze_long_lived()  # the learner's model: vLLM's collections while it builds an engine skip both

        def build():
            return build_engine(cfg, model_path, learner, live_model, tokenizer, device, world)

        engine, sync = build() if engine_builder is None else engine_builder(model_path, tokenizer, world, build)
    except ValueError as e:
        progress.close()
        if folder:
            folder.close(abandon=not resume, discard=not resume)
        raise SetupError(str(e)) from e
    # prompts that open the <think> their responses continue (DeepSeek-R1's): read off the template around a neutral
    # problem, as eval does (a problem's own text may hold a "<think>"); the built-in task's prompts as they are
    first = (train_problems or held_out or [None])[0]
    think_open = first is not None and opens_think(first["prompt"] if "prompt" in first else build_prompt(
        tokenizer, "1+1?", system=None, instruction=None, template_kwargs=template_kwargs,  # (the template's alone:
        prompt_template=cfg.data.prompt_template))  # R1's data.prompt_template ends in "Assistant: <think>")
    scorer = Scorer.from_config(cfg, gather=world.gather_dp if world.dp > 1 else None,  # one rate for every group
                                think_open=think_open)
    s = Session(cfg=cfg, world=world, run_dir=run_dir, model_path=model_path, tokenizer=tokenizer,
                learner=learner, engine=engine, sync=sync, scorer=scorer,
                sampler=PromptSampler(len(train_problems), seed=cfg.train.seed, shuffle=cfg.data.shuffle),
                train_problems=train_problems, held_out=held_out, progress=progress, folder=folder, timings=timings,
                credit=StepCredit.from_config(cfg, tokenizer), data_sha1=data_sha1,
                prompt_date=prompt_date)
    state = {}
    # a run stopped before its first checkpoint starts again from step 0 in its folder (earlier records superseded)
    restart = bool(world.broadcast(resume and not checkpoints_newest_first(run_dir) if world.is_main else None))
    if restart:
        log(f"{run_dir} has no checkpoint yet: starting it again from step 0")
    elif resume:
        try:
            ckpt, state = restore_newest(run_dir, learner=learner, world=world, log=log)
        except (RuntimeError, CheckpointMismatch) as e:  # (a mismatch: the run's settings, named in one line)
            s.close()
            raise SetupError(f"--resume {run_dir}: {e}") from e
        if world.is_main:  # a stop right after the last save's rename left latest and the pruning behind
            settle_after_resume(run_dir, ckpt, cfg.train.keep_checkpoints)
        s.start_step = state["step"]
        s.batches = int(state.get("batches", s.start_step))  # (checkpoints before dynamic sampling: one per step)
        s.in_flight = state.get("in_flight")
        wall = state.get("wall_time_s")  # (None: a checkpoint from before it was recorded, or from such a run)
        s.wall_before = None if wall is None else float(wall)
        line = resume_note(state.get("code_versions"), code_version())
        if line:
            log(line)
        s.code_versions = list(state.get("code_versions") or ["unrecorded"])
        try:
            s.sampler.load_state_dict(state["sampler"])
        except ValueError as e:  # (a checkpoint from before the data digest: its problem count differs)
            s.close()
            raise SetupError(f"--resume {run_dir}: {e}; restore data.dataset as it was") from e
        if "scorer" in state and hasattr(s.scorer, "load_state_dict"):
            s.scorer.load_state_dict(state["scorer"])
        for line in (layout_change_warning(cfg, state.get("data_parallel"), world.dp),
                     thread_change_warning(state.get("torch_threads"), torch.get_num_threads(), device)):
            if line:
                log(f"warning: {line}")
        s.sync()
        log(f"resumed from {ckpt} (step {s.start_step})")
    progress.update(s.start_step, "")
    if world.is_main:
        marker = (-1 if restart else s.start_step) if resume else None  # -1: every earlier record superseded
        try:
            trackers = open_trackers(cfg, run_dir, to_dict(cfg))
        except ValueError as e:  # a store, server or name the tracker refuses: a new run leaves no folder
            s.folder.close(abandon=not resume, discard=not resume)
            s.folder = None
            s.close()
            raise SetupError(str(e)) from e
        # a tracker run begun at this resume gets the history up to its checkpoint (MetricsLogger.replay), read
        # before the logger appends its resume marker
        upto = marker if any(map(begins_at_resume, trackers)) and marker is not None and marker >= 0 else None
        history = [] if upto is None else [r for r in read_jsonl(Path(run_dir) / "metrics.jsonl")
                                           if r.get("step", upto + 1) <= upto]
        s.logger = MetricsLogger(run_dir, tensorboard=cfg.train.tensorboard and "tensorboard" in cfg.train.loggers,
                                 resume_step=marker, trackers=trackers, warn=log)
        s.logger.replay(history)
        if marker is not None:
            folder.mark_resume(marker)
        if resume:  # its overrides (SAFE_RESUME_KEYS), read by the next resume and the checkpoints, once its setup
            folder.write_config(cfg)  # worked: a resume that failed (a tracker refused) had kept them all the same
    s.initial_eval = state.get("initial_eval")
    if s.initial_eval is None:
        try:
            first = s.evaluate()
        except UserFunctionError as e:  # reward.fn gave something unusable at the step-0 evaluation
            s.close("failed")
            raise UserFunctionError(f"step 0 (the held-out evaluation): {e}") from e  # the loop stops the run on it
        except BaseException as e:  # (Ctrl-C in a long first evaluation: its trackers had ended as finished)
            s.close(end_status(e))
            raise
        s.initial_eval = {**first, "data/dropped_train_prompts": dropped_train,
                          "data/dropped_held_out_prompts": dropped_held}
        if s.logger:
            s.logger.log("eval", 0, s.initial_eval)
        log(eval_line(0, s.initial_eval))
    return s


def layout_change_warning(cfg: Config, before: int | None, now: int) -> str | None:
    """The line for a resume on another number of data-parallel groups than the checkpoint's (``before``;
    None: a checkpoint that did not record it) where that changes the training that follows: with several
    mini-batches per step or dynamic sampling each group draws from its own share of the step."""
    if before is None or before == now:
        return None
    mini, per_step = cfg.learner.mini_batch_prompts, cfg.train.prompts_per_step
    if mini >= per_step and not cfg.rollout.filter_groups:
        return None  # one optimiser step per step: the layout gives the same training (README)
    why = (f"learner.mini_batch_prompts={mini} < train.prompts_per_step={per_step}" if mini < per_step
           else "rollout.filter_groups=true")
    return (f"the run trained on {before} data-parallel group{'s' * (before != 1)} and resumes on {now}: with "
            f"{why} each group draws its mini-batches from its own share of the step, so the steps from here "
            f"differ from an uninterrupted run (resume on {before} to continue it exactly)")


def thread_change_warning(before: int | None, now: int, device: str) -> str | None:
    """The line for a resume on a CPU with another torch thread count than the checkpoint's run (``before``; None:
    not recorded): CPU kernels split their sums by thread, so the steps from here differ from an uninterrupted run
    in float rounding (measured: weights 1.2e-7 apart after a few steps of the tiny model)."""
    if before is None or before == now or device != "cpu":
        return None
    return (f"the run trained with {before} torch thread{'s' * (before != 1)} and resumes with {now}: on a CPU the "
            f"steps from here differ from an uninterrupted run in float rounding (train.threads={before} continues "
            f"it exactly)")


def find_model(cfg: Config, train_problems: list[dict], world: World, log) -> tuple[Path, dict]:
    """The model folder: ``model.path``, or the built-in tiny model after its (cached) warm-up.
    The first process of each node builds or finds the cache (a cache folder is per node unless
    the user shares it); the node's other processes then read it."""
    if cfg.model.path:
        return Path(cfg.model.path).expanduser(), {}
    from pacs_fast.trainer.warmup import default_model
    t0 = time.perf_counter()
    # (an asynchronous launch's learner starts after the engine processes: its rank 0 is first there)
    first_on_node = int(os.environ.get("LOCAL_RANK", world.rank)) == 0 or world.rank == 0
    path = None
    if first_on_node:
        path = default_model(cfg, train_problems, log=log)  # it removes a killed warm-up's temporary folder
    world.barrier()
    if not first_on_node:
        path = default_model(cfg, train_problems, log=log)
    return path, {"time/warmup": time.perf_counter() - t0}


def newest_trainer_state(run_dir: Path) -> tuple[Path, dict] | None:
    """``(checkpoint, state)``: the newest intact checkpoint of ``run_dir`` and its ``trainer_state.json``; None where
    there is none or it cannot be read."""
    newest = newest_intact(run_dir)
    try:
        state = json.loads((newest / "trainer_state.json").read_text()) if newest else None
    except (OSError, ValueError):
        return None
    return (newest, state) if isinstance(state, dict) else None


def check_same_data(run_dir: Path, cfg: Config, data_sha1: str, stored: tuple[Path, str] | None) -> None:
    """ValueError before any model work when the problems differ from those of the checkpoint a resume
    continues from (``stored``: its folder and the digest its trainer_state.json records; None, not checked: a
    checkpoint from before the digest)."""
    if stored and stored[1] != data_sha1:
        raise ValueError(f"--resume {run_dir}: the problems differ from those {stored[0].name} trained on "
                         f"(data.dataset {cfg.data.dataset!r} or data.eval_dataset was edited, moved or replaced): "
                         f"restore them, or start a new run from its weights (model.path={stored[0]})")


def check_same_model_files(run_dir: Path, model_path: Path, newest: tuple[Path, dict]) -> None:
    """ValueError before the model loads when a resume's model folder was edited in place since the checkpoint it
    continues from (``newest``: :func:`newest_trainer_state`): its tokenizer, chat template, generation config or
    config.json, i.e. other prompts, stop ids or architecture than those the run trained with. A checkpoint from before
    the record, or another folder than the recorded one (a moved model given again): not checked."""
    ckpt, state = newest
    changed = changed_model_files(state.get("model_files"), model_path) if Path(model_path).is_dir() else []
    if changed:
        raise ValueError(f"--resume {run_dir}: model.path {str(model_path)!r} changed since {ckpt.name} was "
                         f"written ({', '.join(changed[:5])}{', ...' if len(changed) > 5 else ''} edited, added or "
                         f"removed): the run would go on with other prompts, stop ids or architecture; restore the "
                         f"files (the checkpoint holds copies of its tokenizer files: {ckpt}), or start a new run "
                         f"from its weights (model.path={ckpt})")
