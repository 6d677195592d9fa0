"""The RL training loop, top to bottom.

set up (:mod:`.session`) -> for each step: rollout -> score -> learn -> sync the engine -> log /
evaluate / save -> summary.

Every phase is a named function in its own module: :mod:`.session` (config, run folder, data,
model, learner, engine, resume), :mod:`.parallel` (processes: who does what), :mod:`.step` (learn,
metrics, samples), :mod:`.evaluation`, :mod:`.checkpoint`, :mod:`.run_folder`. Everything random is
seeded from ``train.seed`` and the step, so a run resumed from a checkpoint continues exactly as the
uninterrupted run (for a given seed and process layout).

Multi-process launches (``torchrun ... learner.backend=megatron learner.tp_size=T``): every rank
has a rollout engine (vLLM: one per tensor-parallel group). Each data-parallel group takes its
contiguous share of the step's prompts, generates and scores it, and the learner trains on that
share (the ranks of a tensor-parallel group hold the same one); rollouts never travel between
ranks, only metrics do. Evaluation is spread the same way. Only global rank 0 writes files.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from pacs_fast.code_version import code_version
from pacs_fast.config import Config
from pacs_fast.gc_heap import freeze_long_lived
from pacs_fast.learner.base import NonFiniteError
from pacs_fast.trainer.checkpoint import CheckpointError, save_checkpoint
from pacs_fast.trainer.engine_checks import warn_engine_mismatch
from pacs_fast.trainer.evaluation import eval_line
from pacs_fast.trainer.metrics import read_jsonl
from pacs_fast.trainer.parallel import close_world
from pacs_fast.trainer.plots import PANELS  # (matplotlib is imported only to draw)
from pacs_fast.trainer.rollout_step import NoGroupKept, rollout_step
from pacs_fast.trainer.session import Session, SetupError, end_status, start
from pacs_fast.trainer.step import (WEIGHTED_MEANS, learn, reward_component_metrics, reward_component_rewards,
                                   sample_rows, step_record, terms_over_groups)
from pacs_fast.trainer.user_functions import UserFunctionError

__all__ = ["train", "SetupError", "TrainingStopped"]


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (a non-finite loss or gradient, a checkpoint that could not be
    written); nothing non-finite or partial was saved."""


def train(cfg: Config, run_dir: str | Path, *, resume: bool = False) -> dict:
    """Runs (or resumes) training in ``run_dir``; returns the summary dict.

    Raises :class:`SetupError` (a ValueError) for bad input, before any model work, and
    :class:`TrainingStopped` when a step cannot go on."""
    t_start = time.perf_counter()
    try:
        s = start(cfg, run_dir, resume=resume)
    except UserFunctionError as e:  # reward.fn at the step-0 evaluation
        raise TrainingStopped(f"{e}; no checkpoint was written") from e
    s.t_start = t_start
    world, learner = s.world, s.learner
    last_eval = latest_eval(s)
    freeze_long_lived()  # a command line's process: what lives now lives to the end (pacs_fast/gc_heap.py)
    try:
        for step in range(s.start_step + 1, cfg.train.steps + 1):
            t_step, tm = time.perf_counter(), {}
            reset_reference_if_due(cfg, learner, step)

            # rollout and score this data-parallel group's share of the step's prompts (dynamic sampling:
            # rounds of prompts until enough groups with differing rewards are kept)
            try:
                r = rollout_step(s, step, tm)
            except NoGroupKept as e:
                raise TrainingStopped(f"step {step}: {e}") from e
            problems, comps, rewards, prompt_ids, batch, seed = r.problems, r.comps, r.rewards, r.prompt_ids, \
                r.batch, r.seed

            # learn, then load the new weights into the engine
            diagnostic = step in (1, cfg.train.steps) or bool(cfg.train.eval_every and step % cfg.train.eval_every == 0)
            try:
                lm, mismatch = learn(cfg, learner, batch, prompt_ids, comps, seed=seed, diagnostic=diagnostic,
                                     timings=tm, step=step)
            except NonFiniteError as e:
                raise TrainingStopped(f"step {step}: {e}; no checkpoint was written for it (the newest kept is the "
                                      f"last good one)") from e
            t0 = time.perf_counter()
            s.sync()
            tm["time/sync"] = time.perf_counter() - t0

            # log (metrics and samples of the data-parallel groups combined)
            tm["time/step"] = time.perf_counter() - t_step
            terms = getattr(learner, "last_terms", {})
            whole = terms_over_groups(world, terms, batch)  # every group's rows
            record = {**step_record(batch, comps, lm, mismatch, whole, tm, epoch=s.sampler.epoch),
                      **getattr(s.scorer, "last", {}), **(s.credit.last if s.credit else {}), **r.metrics,
                      **reward_component_metrics(s, problems, comps)}
            record = world.reduce_record(record, WEIGHTED_MEANS)
            record["rollout/generating_ranks"] = world.count(any(len(c.token_ids) for cs in comps for c in cs))
            if step == s.start_step + 1 and world.is_main:  # (the engine holds the learner's weights: same model?)
                warn_engine_mismatch(cfg, record, step)
            if s.logger:
                s.logger.log("train", step, record)
            log_samples(s, step, problems, comps, rewards, terms, batch)  # (collective with data parallelism)
            s.progress.update(step, f"reward {record['reward/mean']:.2f}  held-out {last_eval['eval/acc']:.2f}  "
                                    f"{tm['time/step']:.1f}s/step")

            # evaluate, save
            last = step == cfg.train.steps
            if last or (cfg.train.eval_every and step % cfg.train.eval_every == 0):
                last_eval = evaluate_and_report(s, step)
            if last or (cfg.train.save_every and step % cfg.train.save_every == 0):
                save(s, step)
        evaluate_unless_reported(s)
    except UserFunctionError as e:  # reward.fn / reward.appeal / reward.step_rewards gave something unusable
        s.close("failed")
        raise TrainingStopped(f"step {step}: {e}; no checkpoint was written for it") from e
    except BaseException as e:  # verifier workers, the engine; the trackers' runs marked as failed or killed
        s.close(end_status(e))
        raise
    finally:
        s.progress.close()
    summary = finish(s) if world.is_main else None
    summary = world.broadcast(summary)
    world.barrier()  # every rank is done with the collectives before the engine (and its groups) goes
    s.close()
    close_world(world, learner)
    return summary


def latest_eval(s: Session) -> dict:
    """The newest held-out evaluation of the run so far, which the progress line shows until the next one: a resumed
    run's last one up to its checkpoint (``metrics.jsonl``, rank 0's: only it shows the line), else the step-0 one.
    A resume had shown the step-0 accuracy as ``held-out`` until its first evaluation (0.30 beside a run at 0.44)."""
    if s.start_step and s.world.is_main:
        evals = [r for r in read_jsonl(s.run_dir / "metrics.jsonl", keys=("eval/acc",))
                 if r["kind"] == "eval" and r["step"] <= s.start_step and isinstance(r.get("eval/acc"), (int, float))]
        if evals:
            return evals[-1]
    return dict(s.initial_eval)


def reset_reference_if_due(cfg: Config, learner, step: int) -> bool:
    """``algo.reset_every=K`` (PACS with ``algo.ref=fixed``, or a baseline's KL reference): before steps K+1,
    2K+1, ... the reference becomes the current policy, or ``algo.reset_mix`` of it (and, with
    ``algo.reset_optimizer``, the optimiser starts afresh). Returns whether it reset. Collective where the
    learner is (megatron)."""
    a = cfg.algo
    if not (a.reset_every and step > 1 and (step - 1) % a.reset_every == 0):
        return False
    learner.reset_reference(reset_optimizer=a.reset_optimizer, mix=a.reset_mix)
    return True


def log_samples(s: Session, step: int, problems, comps, rewards, terms, batch, extra: dict | None = None,
                group_extra: list[dict] | None = None) -> None:
    """The step's first ``train.log_samples`` rollouts into ``samples.jsonl`` (each row with ``extra``'s
    fields and ``group_extra[i]``'s, ``i`` its group in this data-parallel share (an asynchronous run's policy
    version of each group: with dynamic sampling they differ within a step), and the shaped reward ``batch``
    trained on where it is not the verifier's) and TensorBoard text
    (rank 0). Collective with data parallelism: each group holds its share of
    the step's rows (the first group's first), so they are gathered, numbered as one process numbers them;
    rank 0's share alone held fewer rows than asked (4 of 8 on two ranks)."""
    k = s.cfg.train.log_samples
    if not k or (s.world.dp == 1 and not s.logger):
        return
    # overlong shaping: what trained, beside the verifier's reward (7 digits: float32's, not 0.6666666865348816)
    trained = [float(f"{v:.7g}") for v in batch.rewards[:k].tolist()] if batch.verifier_rewards is not None else None
    rows = sample_rows(step, s.tokenizer, problems, comps, rewards, terms, k, trained)
    if group_extra:  # (before the shares are gathered: "row" counts this share's rows)
        for r in rows:
            r.update(group_extra[r["row"] // len(comps[0])])
    parts = reward_component_rewards(s, problems, comps)  # a mix of rewards: each row's component rewards
    if parts:
        for r in rows:
            r["reward_parts"] = {name: values[r["row"]] for name, values in parts.items()}
    if s.world.dp > 1:
        rows, shares = [], s.world.gather_dp(rows)
        for share in shares:  # the shares in data-parallel order: a row's number counts the groups' rows before it
            rows += [{**r, "row": r["row"] + len(rows)} for r in share][:k - len(rows)]
    if not s.logger:
        return
    rows = [{**r, **(extra or {})} for r in rows]
    s.folder.append_samples(rows)
    s.logger.log_samples(step, rows)
    s.logger.log_text("samples", step, "\n\n".join(f"**reward {r['reward']:g}** `{r['prompt']}` → `{r['response']}`"
                                                  for r in rows))


def evaluate_and_report(s: Session, step: int) -> dict:
    """The held-out evaluation after ``step`` (collective), logged as ``eval`` metrics and printed
    (rank 0); returns its metrics."""
    result = s.evaluate()
    if s.logger:
        s.logger.log("eval", step, result)
    s.log(eval_line(step, result))
    return result


def evaluate_unless_reported(s: Session) -> None:
    """A resumed run with nothing left to train (``train.steps`` = its checkpoint's step) whose last
    evaluation is older than that step (e.g. ``train.eval_every=0``) evaluates its model now, so
    the summary reports the model the run ends with, not an older one. Collective."""
    if s.start_step < s.cfg.train.steps:
        return  # the loop's last step evaluated
    missing = None
    if s.world.is_main:
        evals = [r for r in read_jsonl(s.run_dir / "metrics.jsonl", keys=()) if r["kind"] == "eval"]
        missing = not evals or evals[-1]["step"] != s.start_step
    if s.world.broadcast(missing):
        evaluate_and_report(s, s.start_step)


def save(s: Session, step: int, *, in_flight=None) -> None:
    """Checkpoint ``step`` (collective); a failure stops the run with the reason. ``in_flight()``: an asynchronous
    run's generation batches requested ahead of the learner, with their completions (collective; asked for once
    the weights are written: the engines generate meanwhile). The sampler stands after their prompts; a resume
    trains them as the uninterrupted run would have."""
    t0 = time.perf_counter()
    state = {"sampler": s.sampler.state_dict(), "initial_eval": s.initial_eval,
             "batches": s.batches, "wall_time_s": s.wall_time(), "data_sha1": s.data_sha1,
             "data_parallel": s.world.dp,  # (a resume on another number of groups trains otherwise: session)
             "torch_threads": torch.get_num_threads(),  # (on a CPU another count rounds otherwise: session)
             "code_versions": run_code_versions(s)}
    if s.prompt_date:  # (a dating chat template's date: a resume's prompts say the same day)
        state["prompt_date"] = s.prompt_date
    if hasattr(s.scorer, "state_dict"):
        state["scorer"] = s.scorer.state_dict()

    def late():  # (trainer_state.pt only; trainer_state.json lists their indices)
        batches = in_flight()
        return {"in_flight": batches, "in_flight_batches": [b["index"] for b in batches]}

    def record():  # before the rename that publishes it: a kill right after it kept the checkpoint, not its record
        if s.logger:
            s.logger.log("checkpoint", step, {"time/checkpoint": time.perf_counter() - t0})
            s.logger.flush()  # the trackers hold every step up to the checkpoint (a resume redoes only later ones)
        if s.folder is not None:
            s.folder.sync()  # (metrics.jsonl's and samples.jsonl's records on the disk before the checkpoint)
    try:
        save_checkpoint(s.run_dir, step, learner=s.learner, model_dir=s.model_path,
                        config_yaml=s.run_dir / "config.yaml", world=s.world, keep=s.cfg.train.keep_checkpoints,
                        trainer_state=state, before_publish=record, late_state=late if in_flight else None)
    except CheckpointError as e:
        raise TrainingStopped(f"step {step}: {e}") from e


def finish(s: Session) -> dict:
    """Writes ``summary.json`` (and the plots) from ``metrics.jsonl``: the first and the last
    recorded evaluation, so a resumed or re-resumed run reports what it measured. ``wall_time_s``
    adds the earlier sessions' up to the checkpoint it resumed from (the time of steps a kill lost is
    not counted) to this session's, ``session_wall_time_s`` (from ``s.t_start``)."""
    wall_time = time.perf_counter() - s.t_start
    records = read_jsonl(s.run_dir / "metrics.jsonl",  # what the summary and the plots read, not every key
                         keys={"eval/acc", "eval/greedy_acc", "time/step"} | {key for _, key, _ in PANELS})
    evals = [r for r in records if r["kind"] == "eval"]
    first, final = evals[0], evals[-1]
    summary = {
        "acc_before": first["eval/acc"], "acc_after": final["eval/acc"],
        "greedy_acc_before": first.get("eval/greedy_acc"), "greedy_acc_after": final.get("eval/greedy_acc"),
        "final_eval_step": final["step"], "steps": s.cfg.train.steps,
        "wall_time_s": None if s.wall_before is None else s.wall_before + wall_time, "session_wall_time_s": wall_time,
        "train_time_s": sum(r.get("time/step", 0.0) for r in records if r["kind"] == "train"),
        **s.timings, "run_dir": str(s.run_dir), "code_versions": run_code_versions(s),
    }
    if s.cfg.train.plots:
        from pacs_fast.trainer.plots import plot_run
        last = max((r["step"] for r in records if "step" in r), default=0)
        s.logger.log_images(last, plot_run(s.run_dir, records, calibration_of(s.run_dir)))
    s.folder.write_summary(summary)  # (then the trackers: one failing to close had lost it)
    s.logger.close("finished")
    greedy = (f"  (greedy {summary['greedy_acc_before']:.3f} -> {summary['greedy_acc_after']:.3f})"
              if summary["greedy_acc_before"] is not None and summary["greedy_acc_after"] is not None else "")
    if summary["wall_time_s"] is None:  # resumed from a checkpoint that did not record it
        wall = f"wall time of this session {wall_time:.0f} s (the earlier sessions' was not recorded)"
    else:
        session = f" (this session {wall_time:.0f} s)" if s.wall_before else ""
        wall = f"wall time {summary['wall_time_s']:.0f} s{session}"
    print(f"\nheld-out accuracy: {summary['acc_before']:.3f} -> {summary['acc_after']:.3f}{greedy}  |  {wall}  |  "
          f"run folder {s.run_dir}", flush=True)
    return summary


def run_code_versions(s: Session) -> list[str]:
    """The pacs_fast versions that trained the run so far, in order, this one last (``"unrecorded"`` first for a
    run resumed from a checkpoint written before versions were recorded)."""
    now = code_version()
    return s.code_versions + ([now] if not s.code_versions or s.code_versions[-1] != now else [])


def calibration_of(run_dir: Path):
    """(predicted reward, reward) pairs of the logged samples, for the calibration plot (None if none)."""
    rows = read_jsonl(run_dir / "samples.jsonl", keys=("pred_reward", "reward"))  # redone rows count once
    pairs = [(r["pred_reward"], r["reward"]) for r in rows if r.get("pred_reward") is not None]
    return ([p for p, _ in pairs], [r for _, r in pairs]) if pairs else None

