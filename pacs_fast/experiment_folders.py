"""The folders of an experiment's runs (``python -m pacs_fast.experiment``, :mod:`pacs_fast.experiment`): the config
each run records, whether a run is done, to resume, fresh or made with other settings, and the planning that checks
every folder's lock and settings before it deletes any.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pacs_fast.experiment_args import Arm
from pacs_fast.experiment_results import finished

# Settings that change nothing a run reports (trackers and plots, logged samples, checkpoint spacing and count, reward
# workers and timeout, freed-memory caching, the warm-up cache's folder, vLLM's memory share, activation recompute;
# the trainer's resume takes each: SAFE_RESUME_KEYS): another value on a rerun is
# the same experiment. A run still to finish resumes with the new values (the trainer's --resume takes them:
# SAFE_RESUME_KEYS); a finished run keeps its own (a note says so).
RERUN_KEYS = ("train.loggers", "train.tensorboard", "train.plots", "train.progress", "train.log_samples",
              "train.save_every", "train.keep_checkpoints", "train.reward_workers", "reward.user_fn_timeout_s",
              "train.keep_freed_memory", "warmup.cache_dir", "rollout.gpu_memory_utilization",
              "model.gradient_checkpointing", "model.recompute_granularity")


@dataclass
class Job:
    arm: Arm
    seed: int
    run_dir: Path
    argv: list[str]   # config overrides of this run (besides --config)


def processes(cfg) -> int:
    """Processes of one run: 1, or with ``rollout.ranks=R`` (asynchronous rollouts) R engine
    processes and the learner's (1, or ``learner.tp_size`` for megatron), launched by torchrun."""
    if not cfg.rollout.ranks:
        return 1
    return cfg.rollout.ranks + (cfg.learner.tp_size if cfg.learner.backend == "megatron" else 1)


def intended_config(config: str | None, argv: list[str]):
    """The config a job's trainer records in its ``config.yaml`` (its files as absolute paths, as the trainer
    writes them: a relative ``data.dataset`` otherwise read as another setting on the next run)."""
    from pacs_fast.config import load_config, validate
    from pacs_fast.trainer.run_folder import record_absolute_paths
    cfg = load_config(config, argv)
    validate(cfg, world=processes(cfg))
    if cfg.reward.fn or cfg.reward.appeal or cfg.reward.step_rewards:  # the user's functions import, before any run
        from pacs_fast.trainer.rewards import check_callables
        check_callables(cfg)
    record_absolute_paths(cfg)
    return cfg


def config_takes(config: str | None, argv: list[str]) -> bool:
    """Whether :func:`intended_config` takes ``argv``."""
    try:
        intended_config(config, argv)
    except ValueError:
        return False
    return True


def config_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(a) | set(b))
    out = []
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_differences(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {vb!r} in the folder, {va!r} asked for")
    return out


def rerun_changes(job: Job, config: str | None) -> dict[str, tuple]:
    """``{key: (the folder's value, the spec's)}`` of the :data:`RERUN_KEYS` that the spec now sets otherwise than
    ``job``'s existing run recorded (empty when the run has no ``config.yaml``)."""
    from pacs_fast.config import load_config
    from pacs_fast.config.validation import _get
    saved = job.run_dir / "config.yaml"
    if not saved.is_file():
        return {}
    want, have = intended_config(config, job.argv), load_config(saved)
    return {k: (_get(have, k), _get(want, k)) for k in RERUN_KEYS if _get(have, k) != _get(want, k)}


def _values(values) -> str:
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return " / ".join(repr(v) for v in seen[:3]) + (" / ..." if len(seen) > 3 else "")


def job_state(job: Job, config: str | None) -> str:
    """``done`` | ``resume`` | ``fresh`` | ``mismatch:<why>``."""
    from pacs_fast.config import load_config, to_dict
    from pacs_fast.trainer.run_folder import splits_training_file
    if not job.run_dir.exists():
        return "fresh"
    saved = job.run_dir / "config.yaml"
    if saved.is_file():
        want = to_dict(intended_config(config, job.argv))
        try:
            have_cfg = load_config(saved) if saved.read_text(encoding="utf-8", errors="replace").strip() else None
        except ValueError:
            have_cfg = None
        if have_cfg is None:  # (an empty one read as the defaults: "other settings", which --restart-mismatched deleted)
            raise ValueError(f"{saved} is empty or cannot be read: this run's settings are unknown; restore it (its "
                             f"checkpoints hold a copy) or move {job.run_dir} away (nothing was changed)")
        have = to_dict(have_cfg)
        legacy = have_cfg.data.split_seed == have_cfg.train.seed and splits_training_file(have_cfg)
        if legacy and want["data"]["split_seed"] == 0:
            # a run from before data.split_seed, resumed once: its split follows its train.seed (run_folder.py)
            have["data"]["split_seed"] = 0
        for d in (want, have):  # where the folder lives, threads and logging are not the experiment's settings
            for key in ("out_dir", "threads", "tracker_group"):  # (a resumed run keeps its own thread count: the
                d["train"].pop(key, None)                       # same floating-point path, an exact continuation)
            for key in RERUN_KEYS:
                section, _, name = key.partition(".")
                d[section].pop(name, None)
        diff = config_differences(want, have)
        if diff:
            return "mismatch:" + "; ".join(diff[:4])
    if finished(job.run_dir):
        return "done"
    ckpts = job.run_dir / "checkpoints"
    # a summary of fewer train.steps than config.yaml's (a finished run resumed with more and stopped): resumed,
    # never deleted (without a checkpoint the trainer's --resume starts it again from step 0 in its folder)
    if (ckpts.is_dir() and any(ckpts.glob("step_*"))) or (job.run_dir / "summary.json").is_file():
        return "resume"
    return "fresh"


# ----------------------------------------------------------------------------- the folders
def take_lock(folder: Path, what: str):
    """The trainer's run lock (:class:`~pacs_fast.trainer.run_claim.RunLock`) on ``folder``, for
    the caller to release; a ValueError naming ``folder`` while a live process holds it."""
    from pacs_fast.trainer.run_claim import LOCK_FILE, RunLock
    try:
        return RunLock(folder, new=False)
    except OSError as e:
        raise ValueError(f"{what} {str(folder)!r}: cannot take its lock ({e.strerror})") from None
    except ValueError:
        holder = (folder / LOCK_FILE).read_text(errors="replace").strip() or "?"
        raise ValueError(f"{what} {str(folder)!r} is in use by a live {'runner' if what == '--out' else 'run'} "
                         f"(pid {holder}): wait for it to end, or use another --out (nothing was changed)") from None


def plan(jobs: list[Job], config: str | None, *, restart_mismatched: bool,
         log=print) -> tuple[list[tuple[Job, str]], int]:
    """The jobs to run with their state (see :func:`job_state`), and how many are done already.

    Every existing run folder is checked before any is changed: one whose lock a live process holds,
    one with files but no ``config.yaml`` (not provably this experiment's run) and, without
    ``restart_mismatched``, one made with other settings are ValueErrors naming the folder. Then the
    experiment's own dead runs that start afresh (no checkpoint, or mismatched) are deleted under
    their lock. A finished run that recorded other :data:`RERUN_KEYS` than the spec's is kept (one note line)."""
    from pacs_fast.files import is_temporary
    from pacs_fast.trainer.run_claim import CONFIG_FILE, LOCK_FILE
    todo, delete, done, kept = [], [], 0, {}
    for job in jobs:
        folder, files = job.run_dir, []
        if folder.exists():
            if not folder.is_dir():
                raise ValueError(f"run folder {str(folder)!r} is a file: move it away or use another --out")
            files = [p.name for p in folder.iterdir() if p.name != LOCK_FILE and not is_temporary(p.name)]
            if files and CONFIG_FILE not in files:
                raise ValueError(f"{str(folder)!r} holds files but no {CONFIG_FILE}: it is not a run of this "
                                 f"experiment; move it away or use another --out (nothing was changed)")
            take_lock(folder, "run folder").release()
        state = job_state(job, config)
        if state.startswith("mismatch:"):
            if not restart_mismatched:
                raise ValueError(f"{folder} was made with other settings ({state[9:]}); use another --out, "
                                 f"or --restart-mismatched to delete and rerun it")
            state = "fresh"
        if state == "done":
            done += 1
            for key, (have, want) in rerun_changes(job, config).items():
                kept.setdefault(key, []).append((job, have, want))
            continue
        if state == "fresh" and files:  # started, no checkpoint (or mismatched): restart, never mix
            delete.append(folder)
        todo.append((job, state))
    for arm_folder in {job.run_dir.parent for job in jobs}:  # what a runner stopped mid-delete left (we hold --out)
        for doomed in arm_folder.glob(".*.deleting-*") if arm_folder.is_dir() else []:
            shutil.rmtree(doomed, ignore_errors=True)
    for folder in delete:
        lock = take_lock(folder, "run folder")
        # renamed first, in one step: a stop mid-delete had left a folder of files without config.yaml under the
        # run's name, refused from then on as "not a run of this experiment"
        doomed = folder.with_name(f".{folder.name}.deleting-{os.getpid()}")
        os.rename(folder, doomed)
        shutil.rmtree(doomed)  # the lock file with it; the lock itself drops on release
        lock.release()
    if kept:  # (one line: which keys, what the finished runs have, what is asked)
        said = "; ".join(f"{key}: {_values(h for _, h, _ in runs)} in them, {_values(w for _, _, w in runs)} asked"
                         for key, runs in kept.items())
        n = len({id(job) for runs in kept.values() for job, _, _ in runs})
        log(f"note: {n} finished run(s) keep the settings they ran with ({said}); these change nothing they report")
    return todo, done
