"""The RL training loop, top to bottom.

set up (processes, run folder, data, model, learner, engine) -> resume or evaluate the start ->
for each step: rollout -> score -> learn -> sync the engine -> log / evaluate / save -> summary.

Each phase is a named function in its own module: :mod:`.parallel` (processes, who does what),
:mod:`.run_folder` (the folder and its files), :mod:`.problems`, :mod:`.build` (learner and
engine), :mod:`.rewards`, :mod:`.step` (learn, metrics, samples), :mod:`.evaluation`,
:mod:`.checkpoint`. Everything random is seeded from ``train.seed`` and the step, so a run resumed
from a checkpoint continues exactly as the uninterrupted run.

Multi-process launches (``torchrun ... learner.backend=megatron``): rank 0 runs the rollout
engine, the verifier and the evaluations and broadcasts each step's rollouts and rewards, so every
rank holds the same batch (the megatron learner trains each data-parallel rank on its share of the
whole groups). The learner's calls are collective: every rank makes them; only rank 0 writes files.
"""
from __future__ import annotations

import atexit
import gc
import random
import time
from pathlib import Path

import numpy as np
import torch

from pacs_fast.config import Config, validate
from pacs_fast.learner.base import NonFiniteError
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.trainer.batch import build_batch
from pacs_fast.trainer.build import build_engine, build_learner, check_installed, resolve_device
from pacs_fast.trainer.checkpoint import CheckpointError, remove_stale_temporaries, restore_newest, save_checkpoint
from pacs_fast.trainer.evaluation import evaluate
from pacs_fast.trainer.metrics import MetricsLogger, Progress, read_jsonl
from pacs_fast.trainer.parallel import close_world, init_world, quiet_warnings
from pacs_fast.trainer.problems import encode, load_problems
from pacs_fast.trainer.rewards import Scorer
from pacs_fast.trainer.run_folder import RunFolder, check_new_run_dir, remove_dead_temporaries
from pacs_fast.trainer.sampler import PromptSampler
from pacs_fast.trainer.step import learn, sample_rows, step_record

# train() freezes the objects alive when its loop starts (gc.freeze): frozen objects are never
# finalised, so they are released at exit in any case (also after an exception in the loop).
atexit.register(gc.unfreeze)


class SetupError(ValueError):
    """Bad input found before any training work (config, files, data, checkpoint)."""


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (a non-finite loss or gradient); nothing non-finite was saved."""


def train(cfg: Config, run_dir: str | Path, *, resume: bool = False) -> dict:
    """Runs (or resumes) training in ``run_dir``; returns the summary dict.

    Raises :class:`SetupError` (a ValueError) for bad input, before any model work, and
    :class:`TrainingStopped` when a step's loss or gradient norm is not finite."""
    t_start = time.perf_counter()
    try:
        validate(cfg)
        check_installed(cfg)
        if not resume:
            check_new_run_dir(run_dir)
    except ValueError as e:
        raise SetupError(str(e)) from e
    quiet_warnings(cfg, is_main=True)  # megatron's import-time notes
    try:
        world = init_world(cfg)
    except ValueError as e:
        raise SetupError(str(e)) from e
    quiet_warnings(cfg, world.is_main)
    run_dir = Path(world.broadcast(str(run_dir)))  # a timestamped name could differ between ranks
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if cfg.train.keep_freed_memory:
        from pacs_fast.trainer.allocator import keep_freed_memory
        keep_freed_memory()
    folder = RunFolder(run_dir) if world.is_main else None
    if resume and world.is_main:
        remove_stale_temporaries(run_dir)
    random.seed(cfg.train.seed)
    np.random.seed(cfg.train.seed % 2**32)
    torch.manual_seed(cfg.train.seed)

    # 1. data (bad files fail here, before any model work)
    try:
        train_problems, held_out = load_problems(cfg)
    except (ValueError, FileNotFoundError) as e:
        raise SetupError(str(e)) from e
    progress = Progress(cfg.train.steps, enabled=cfg.train.progress and world.is_main)
    log = progress.print if world.is_main else (lambda text: None)
    timings = {}

    # 2. model: the user's, or the built-in tiny model after a (cached) supervised warm-up
    if cfg.model.path:
        model_path = Path(cfg.model.path).expanduser()
    else:
        from pacs_fast.trainer.warmup import cache_root, default_model
        t0 = time.perf_counter()
        if world.is_main:  # rank 0 builds (or finds) the cached model; the others then read the cache
            remove_dead_temporaries(cache_root(cfg))
            model_path = default_model(cfg, train_problems, log=log)
        world.barrier()
        if not world.is_main:
            model_path = default_model(cfg, train_problems, log=log)
        timings["time/warmup"] = time.perf_counter() - t0
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    try:
        train_problems, dropped_train = encode(cfg, tokenizer, train_problems, "data.dataset", log)
        held_out, dropped_held = encode(cfg, tokenizer, held_out, "the held-out set", log)
    except ValueError as e:
        progress.close()
        raise SetupError(str(e)) from e
    if folder and not resume:
        folder.write_config(cfg)

    # 3. learner, rollout engine, verifier (rollouts, rewards and evaluations run on rank 0)
    device = resolve_device(cfg)
    learner, live_model = build_learner(cfg, model_path, device, tokenizer)
    engine, shares_model = (build_engine(cfg, model_path, live_model, tokenizer, device) if world.is_main
                            else (None, False))
    scorer = Scorer.from_config(cfg) if world.is_main else None
    sampler = PromptSampler(len(train_problems), seed=cfg.train.seed, shuffle=cfg.data.shuffle)
    P, G = cfg.train.prompts_per_step, cfg.rollout.n
    rollout_params = dict(n=G, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                          max_new_tokens=cfg.rollout.max_new_tokens, return_logprobs=True)

    def sync_engine():  # the export is collective (megatron); only rank 0 has an engine
        if not shares_model:
            weights = learner.export_hf_weights()
            if engine is not None:
                engine.sync_weights(weights)

    def shared_eval():
        return world.broadcast(evaluate(cfg, engine, scorer, held_out) if world.is_main else None)

    # 4. resume, or evaluate the starting policy
    start_step, state = 0, {}
    if resume:
        try:
            ckpt, state = restore_newest(run_dir, learner=learner, world=world, log=log)
        except RuntimeError as e:
            raise SetupError(f"--resume {run_dir}: {e}") from e
        start_step = state["step"]
        sampler.load_state_dict(state["sampler"])
        sync_engine()
        log(f"resumed from {ckpt} (step {start_step})")
    progress.update(start_step, "")
    logger = MetricsLogger(run_dir, tensorboard=cfg.train.tensorboard,
                           resume_step=start_step if resume else None) if world.is_main else None
    initial_eval = state.get("initial_eval")
    if initial_eval is None:
        initial_eval = {**shared_eval(), "data/dropped_train_prompts": dropped_train,
                        "data/dropped_held_out_prompts": dropped_held}
        if logger:
            logger.log("eval", 0, initial_eval)
        log(f"step 0: held-out accuracy {initial_eval['eval/acc']:.3f} (greedy "
            f"{initial_eval.get('eval/greedy_acc', float('nan')):.3f})")
    last_eval = dict(initial_eval)
    train_time = state.get("train_time", 0.0)

    # 5. the loop. Everything alive now lives to the end: keep it out of the cyclic garbage
    # collector's full passes (which otherwise stall a step now and then for a few hundred ms).
    gc.freeze()
    for step in range(start_step + 1, cfg.train.steps + 1):
        t_step = time.perf_counter()
        tm = {}
        if (cfg.algo.name == "pacs" and cfg.algo.ref == "fixed" and cfg.algo.reset_every
                and step > 1 and (step - 1) % cfg.algo.reset_every == 0):
            learner.reset_reference(reset_optimizer=cfg.algo.reset_optimizer)

        # rollout and score (rank 0), then every rank gets the batch
        t0 = time.perf_counter()
        problems = [train_problems[i] for i in sampler.take(P)]
        seed = (cfg.train.seed * 1_000_003 + step) % 2**62
        comps = rewards = None
        if world.is_main:
            comps = engine.generate([p["prompt_ids"] for p in problems], SamplingParams(seed=seed, **rollout_params))
        tm["time/rollout"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        if world.is_main:
            rewards = scorer([c.text for cs in comps for c in cs], [p["answer"] for p in problems for _ in range(G)],
                             step=step)
        tm["time/reward"] = time.perf_counter() - t0
        comps, rewards = world.broadcast((comps, rewards))

        # learn
        prompt_ids = [p["prompt_ids"] for p in problems]
        batch = build_batch(prompt_ids, [[c.token_ids for c in cs] for cs in comps], rewards,
                            pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        diagnostic = step in (1, cfg.train.steps) or bool(cfg.train.eval_every and step % cfg.train.eval_every == 0)
        try:
            lm, mismatch = learn(cfg, learner, batch, prompt_ids, comps, seed=seed, diagnostic=diagnostic, timings=tm)
        except NonFiniteError as e:
            progress.close()
            raise TrainingStopped(f"step {step}: {e}; no checkpoint was written for it (the newest kept is the "
                                  f"last good one)") from e
        t0 = time.perf_counter()
        sync_engine()
        tm["time/sync"] = time.perf_counter() - t0

        # log
        tm["time/step"] = time.perf_counter() - t_step
        train_time += tm["time/step"]
        terms = getattr(learner, "last_terms", {})
        record = step_record(batch, comps, lm, mismatch, terms, tm, epoch=sampler.epoch)
        if logger:
            logger.log("train", step, record)
            if cfg.train.log_samples:
                rows = sample_rows(step, tokenizer, problems, comps, rewards, terms, cfg.train.log_samples)
                folder.append_samples(rows)
                logger.log_text("samples", step, "\n\n".join(
                    f"**reward {r['reward']:g}** `{r['prompt']}` → `{r['response']}`" for r in rows))
        progress.update(step, f"reward {record['reward/mean']:.2f}  held-out {last_eval['eval/acc']:.2f}  "
                              f"{tm['time/step']:.1f}s/step")

        # evaluate, save
        last = step == cfg.train.steps
        if last or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
            last_eval = shared_eval()
            if logger:
                logger.log("eval", step, last_eval)
            log(f"step {step}: held-out accuracy {last_eval['eval/acc']:.3f} (greedy "
                f"{last_eval.get('eval/greedy_acc', float('nan')):.3f})")
        if last or (cfg.train.save_every and step % cfg.train.save_every == 0):
            t0 = time.perf_counter()
            try:
                save_checkpoint(run_dir, step, learner=learner, model_dir=model_path, config_yaml=run_dir / "config.yaml",
                                world=world, keep=cfg.train.keep_checkpoints,
                                trainer_state={"sampler": sampler.state_dict(), "initial_eval": initial_eval,
                                               "train_time": train_time})
            except CheckpointError as e:
                progress.close()
                raise TrainingStopped(f"step {step}: {e}") from e
            if logger:
                logger.log("checkpoint", step, {"time/checkpoint": time.perf_counter() - t0})

    # 6. summary, from the recorded evaluations (a resumed finished run reports the same)
    gc.unfreeze()
    progress.close()
    summary = None
    if world.is_main:
        logger.close()
        folder.close()
        summary = finish(cfg, run_dir, folder, wall_time=time.perf_counter() - t_start, timings=timings)
    summary = world.broadcast(summary)
    if scorer is not None:
        scorer.close()
    if engine is not None:
        engine.close()
    close_world(world, learner)
    return summary


def finish(cfg: Config, run_dir: Path, folder: RunFolder, *, wall_time: float, timings: dict) -> dict:
    """Writes ``summary.json`` (and the plots) from ``metrics.jsonl``: the first and the last
    recorded evaluation, so a resumed or re-resumed run reports what it measured."""
    records = read_jsonl(run_dir / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    first, final = evals[0], evals[-1]
    trains = [r for r in records if r["kind"] == "train"]
    summary = {
        "acc_before": first["eval/acc"], "acc_after": final["eval/acc"],
        "greedy_acc_before": first.get("eval/greedy_acc"), "greedy_acc_after": final.get("eval/greedy_acc"),
        "final_eval_step": final["step"], "steps": cfg.train.steps, "wall_time_s": wall_time,
        "train_time_s": sum(r.get("time/step", 0.0) for r in trains), **timings, "run_dir": str(run_dir),
    }
    if cfg.train.plots:
        from pacs_fast.trainer.plots import plot_run
        plot_run(run_dir, records, calibration_of(run_dir))
    folder.write_summary(summary)
    greedy = (f"  (greedy {summary['greedy_acc_before']:.3f} -> {summary['greedy_acc_after']:.3f})"
              if summary["greedy_acc_before"] is not None and summary["greedy_acc_after"] is not None else "")
    print(f"\nheld-out accuracy: {summary['acc_before']:.3f} -> {summary['acc_after']:.3f}{greedy}  |  wall time "
          f"{wall_time:.0f} s  |  run folder {run_dir}", flush=True)
    return summary


def calibration_of(run_dir: Path):
    """(predicted reward, reward) pairs of the logged samples, for the calibration plot (None if none)."""
    rows = read_jsonl(run_dir / "samples.jsonl", raw=True)
    pairs = [(r["pred_reward"], r["reward"]) for r in rows if r.get("pred_reward") is not None]
    return ([p for p, _ in pairs], [r for _, r in pairs]) if pairs else None
