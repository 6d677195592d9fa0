"""The run folder (``runs/<name>/``): created once, never silently overwritten, every file written
atomically or append-only.

- Claiming a new run's folder and its lock (:func:`claim_run_dir`, :class:`RunLock`): pacs_fast/trainer/run_claim.py,
  whose names this module also exports; :func:`claim_run_folder` takes the next free automatic name under a race.
- :func:`resume_config`: ``--resume`` reads ``config.yaml`` and checks it against the copy stored
  in the newest checkpoint; a cut or edited ``config.yaml`` is refused with a clear message, and a
  command-line override is accepted only for the keys that cannot change what was trained
  (:data:`SAFE_RESUME_KEYS`: more steps, logging, threads), and :data:`MOVABLE_KEYS` (``model.path``, the
  data files) when the recorded one is gone (the checkpoint restores the weights, the problems' digest is
  checked; a model folder inside the run is refused: pruning deletes it).
- :class:`RunFolder`: ``config.yaml`` and ``summary.json`` (atomic), ``samples.jsonl``
  (append-only: a few rollouts per step, with their prompt, response, reward and score terms; a
  resumed run appends a resume marker, as in ``metrics.jsonl``).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from pathlib import Path

from pacs_fast.config import (SHIPPED_DATASETS, Config, load_config, parse_override, read_yaml, save_config,
                              to_dict)
from pacs_fast.config.validation import _get
from pacs_fast.config.dataset_files import absolute_spec, dataset_exists
from pacs_fast.files import is_temporary, write_text_atomic
from pacs_fast.trainer.metrics import end_torn_line
from pacs_fast.trainer.run_claim import (CONFIG_FILE, LOCK_FILE, RunFolderTaken, RunLock, _is_used, broken_link,
                                         resume_command)

# Keys a resumed run may change on its command line: they do not alter the trajectory up to the
# checkpoint (train.steps extends or shortens the run; the others are logging / resources).
SAFE_RESUME_KEYS = frozenset({
    "train.steps", "train.eval_every", "train.save_every", "train.keep_checkpoints", "train.progress",
    "train.plots", "train.tensorboard", "train.threads", "train.reward_workers", "train.log_samples",
    "train.keep_freed_memory", "rollout.gpu_memory_utilization", "reward.user_fn_timeout_s", "train.loggers",
    # activation recompute gives the same values bit for bit (tests/test_recompute.py): the way on after running
    # out of memory (full recompute in the torch learner turns the shared-prefix forward off: the plain forward's
    # values, equal to float rounding)
    "model.gradient_checkpointing", "model.recompute_granularity",
    # megatron's sequence parallelism: the same values up to the order of two-rank sums (tests/test_megatron_tp.py),
    # activations between the tensor-parallel regions divided by tp: the other way on after running out of memory
    "learner.sequence_parallel",
    # where the warm-up cache lives: its entries are keyed by what builds them, not by the folder (a run moved to a
    # machine where the recorded folder cannot be written resumes with another)
    "warmup.cache_dir",
    # whether the model folder's own code runs: it is the same code either way (refused, or run as before)
    "model.trust_remote_code",
})
# may change on --resume when the recorded file or folder is gone (moved, deleted): the checkpoint restores the
# weights, and the problems must have the digest the checkpoint kept (pacs_fast/trainer/session.py)
MOVABLE_KEYS = frozenset({"model.path", "data.dataset", "data.eval_dataset"})
_BUILT_IN_DATA = SHIPPED_DATASETS + ("arithmetic",)  # data.dataset names that are not files
_AUTOMATIC_NAME = re.compile(r"(.+-\d{8}-\d{6})(?:-(\d+))?")


def claim_run_folder(run_dir: str | Path, *, new: bool, automatic: bool) -> "RunFolder":
    """``RunFolder(run_dir, new=new)``, locked. A run without ``train.run_name`` (``automatic``) whose name
    another run took between :func:`claim_run_dir`'s choice and this lock (two runs started within one
    second) takes the next free suffix instead of being refused."""
    run_dir = Path(run_dir)
    for _ in range(1000):
        try:
            return RunFolder(run_dir, new=new)
        except RunFolderTaken:
            parts = _AUTOMATIC_NAME.fullmatch(run_dir.name) if automatic and new else None
            if parts is None:
                raise
            run_dir = run_dir.with_name(f"{parts[1]}-{int(parts[2] or 1) + 1}")
    raise ValueError(f"no free run folder name after {run_dir}: give train.run_name")


def resume_config(run_dir: str | Path, overrides: list[str] | tuple = (), *, checkpoint: Path | None = None) -> Config:
    """The config of the run in ``run_dir`` for ``--resume``, plus the allowed ``overrides``.

    ``config.yaml`` must be readable and equal the config stored in ``checkpoint`` (the newest
    intact checkpoint, when there is one); overrides must be in :data:`SAFE_RESUME_KEYS`.
    Raises ValueError (naming the file or key) otherwise."""
    run_dir = Path(run_dir)
    saved = run_dir / CONFIG_FILE
    owner = _run_holding(run_dir) if not saved.is_file() else None
    if owner is not None:
        raise ValueError(f"--resume {run_dir}: that is inside the run in {owner}; resume the run (it continues from "
                         f"its newest intact checkpoint): {resume_command(owner)}")
    if not run_dir.is_dir():
        raise ValueError(f"--resume {run_dir}: {broken_link(run_dir) or 'no such run folder'}")
    if not saved.is_file():
        copies = sorted((run_dir / "checkpoints").glob(f"step_*/{CONFIG_FILE}"))
        hint = (f"; the newest checkpoint holds a copy of the run's config: {copies[-1]}" if copies else
                " (is it a run folder? a run stopped before its setup finished has none: run its command again)")
        raise ValueError(f"--resume {run_dir}: no {CONFIG_FILE} there{hint}")
    run = run_dir.resolve().parent.parent
    if run_dir.resolve().parent.name == "checkpoints" and (run / CONFIG_FILE).is_file():
        # a checkpoint holds a copy of config.yaml: taken for a run, it would start again from step 0 in there
        raise ValueError(f"--resume {run_dir}: that is a checkpoint of the run in {run}; resume the run (it "
                         f"continues from its newest intact checkpoint): {resume_command(run)}")
    try:
        cfg = load_run_config(saved)
    except ValueError as e:
        raise ValueError(f"--resume {run_dir}: {CONFIG_FILE} is unreadable or cut ({e}); the copy in the newest "
                         f"checkpoint (checkpoints/step_*/{CONFIG_FILE}) holds the run's config") from None
    if checkpoint is not None and (checkpoint / CONFIG_FILE).is_file():
        stored = to_dict(load_run_config(checkpoint / CONFIG_FILE))
        now = to_dict(cfg)
        diff = [f"{s}.{k}" for s in now for k in now[s]
                if now[s][k] != stored.get(s, {}).get(k) and f"{s}.{k}" not in SAFE_RESUME_KEYS  # (overrides)
                and not (f"{s}.{k}" in MOVABLE_KEYS and _gone(stored.get(s, {}).get(k)))]  # (moved files)
        if diff:
            raise ValueError(f"--resume {run_dir}: {CONFIG_FILE} differs from the config stored in {checkpoint.name} "
                             f"({', '.join(diff[:5])}{', ...' if len(diff) > 5 else ''}); restore it (e.g. copy "
                             f"{checkpoint / CONFIG_FILE}) or start a new run")
    for text in overrides:
        key, value = parse_override(text)
        if key in MOVABLE_KEYS and _gone(_get(cfg, key)):  # the data: the problems' digest is checked later
            if key == "model.path":
                _check_moved_model(run_dir, cfg.model.path, value)
            continue
        if key not in SAFE_RESUME_KEYS:
            load_config(None, [text])  # an unknown key or a bad value: that error, naming it
            if _get(load_run_config(saved, [text]), key) == _get(cfg, key):
                continue  # the value the run has already: nothing changes
            if key in ("train.out_dir", "train.run_name"):
                raise ValueError(f"--resume: {key} names the run folder, which --resume gives ({run_dir}); drop "
                                 f"{key}={value}")
            if key in ("train.project", "train.tracker_group"):  # (the reason said the training would differ)
                raise ValueError(f"--resume: {key} cannot change in a resumed run: its tracker runs (trackers.json) "
                                 f"live under the project and group it started with; drop {key}={value}, or start "
                                 f"a new run")
            raise ValueError(f"--resume: {key} cannot change in a resumed run (it would not continue the same "
                             f"training); allowed: {', '.join(sorted(SAFE_RESUME_KEYS))}")
    return load_run_config(saved, overrides)


def _run_holding(path: Path) -> Path | None:
    """The run folder (its config.yaml and lock) that ``path`` lies inside, else None."""
    for parent in Path(path).resolve().parents:
        if (parent / CONFIG_FILE).is_file() and (parent / LOCK_FILE).is_file():
            return parent
    return None


def finished_summary(run_dir: str | Path, cfg: Config) -> dict | None:
    """For ``--resume`` of a run that has nothing left to do: its ``summary.json`` (else None). That is a run whose
    newest checkpoint (intact, named by ``latest``, none pruning would remove, no temporary a kill left) is
    ``train.steps``' and whose summary reports that step's evaluation, resumed with no override that changes its
    config (a tracker added, plots asked for: those resume as before). Such a resume changed the records all the same:
    a resume marker in ``metrics.jsonl`` and ``samples.jsonl``, a TensorBoard file, and a summary whose ``wall_time_s``
    and ``session_wall_time_s`` counted the no-op session."""
    from pacs_fast.trainer.checkpoint import checkpoints_newest_first, latest_name, problem_of, step_of
    from pacs_fast.trainer.metrics import read_jsonl

    run_dir, steps = Path(run_dir), cfg.train.steps
    if _locked(run_dir):  # a live run extends it: the resume is refused as before, naming that run
        return None
    found = checkpoints_newest_first(run_dir)
    keep = cfg.train.keep_checkpoints
    if (not found or step_of(found[0]) != steps or latest_name(run_dir) != found[0].name
            or (keep and len(found) > keep) or problem_of(found[0]) is not None):
        return None
    if any((run_dir / "checkpoints").glob(".tmp-*")) or any(is_temporary(p.name) for p in run_dir.rglob(".*")):
        return None
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict) or summary.get("steps") != steps or summary.get("final_eval_step") != steps:
        return None
    if to_dict(load_run_config(run_dir / CONFIG_FILE)) != to_dict(cfg):
        return None
    if any(r.get("step", 0) > steps for r in read_jsonl(run_dir / "metrics.jsonl", keys=())):
        return None
    return summary


def _locked(run_dir: Path) -> bool:
    """Whether a live run holds ``run_dir``'s lock (:class:`RunLock`), found without taking or changing it."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def load_run_config(path: str | Path, overrides: list[str] | tuple = ()) -> Config:
    """A run's ``config.yaml`` (:func:`~pacs_fast.config.load_config`); one written before ``data.split_seed``
    existed, whose held-out set is a split of its training file, gets it set to the run's ``train.seed``, which
    seeded that split then (the resumed run trains and evaluates on the problems it started with)."""
    cfg = load_config(path, overrides)
    if is_legacy_split(read_yaml(path), cfg) and not any(o.startswith("data.split_seed=") for o in overrides):
        cfg.data.split_seed = cfg.train.seed
    return cfg


def is_legacy_split(saved: dict, cfg: Config) -> bool:
    """Whether ``saved`` (a ``config.yaml``'s mapping, loaded as ``cfg``) is from before ``data.split_seed`` and
    split a training file (the built-in task and a given ``data.eval_dataset`` have no such split)."""
    return "split_seed" not in (saved.get("data") or {}) and splits_training_file(cfg)


def splits_training_file(cfg: Config) -> bool:
    """Whether the held-out set is a split of the training file (not the built-in task's own, not a
    ``data.eval_dataset``)."""
    return cfg.data.dataset != "arithmetic" and not cfg.data.eval_dataset


def _gone(path) -> bool:
    """A recorded file or folder (or a glob) that no longer exists (a shipped dataset's name, or none, is never
    gone)."""
    return bool(path) and str(path) not in _BUILT_IN_DATA and not dataset_exists(str(path))


def record_absolute_paths(cfg: Config) -> None:
    """A run's files (:data:`MOVABLE_KEYS`) as absolute paths (``os.path.abspath``: a symlink stays one), so
    that its ``config.yaml`` names them wherever ``--resume`` is run from (a relative ``data.dataset`` was "no
    longer there" from another folder). Called for a new run, for a resume's overrides and by the experiment
    runner's comparison. Shipped names, hub ids and paths that do not exist here stay as given; a dataset glob
    that matches stays a glob (:func:`pacs_fast.config.dataset_files.absolute_spec`)."""
    for key in sorted(MOVABLE_KEYS):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value and value not in _BUILT_IN_DATA and dataset_exists(value):  # (a glob that matches too)
            setattr(getattr(cfg, section), name, absolute_spec(value))
    if cfg.warmup.cache_dir:  # (the cache a resume from another folder finds; the key may change on --resume)
        cfg.warmup.cache_dir = os.path.abspath(os.path.expanduser(cfg.warmup.cache_dir))


def check_moved_files(run_dir: Path, cfg: Config, newest: Path | None) -> None:
    """For ``--resume``: a recorded model folder or data file that is gone is one line saying how to continue
    (its new place as an override; for the model, a checkpoint's copy), before any model work."""
    if _gone(cfg.model.path) and newest is not None and cfg.model.lora_rank:  # (the checkpoints: merged weights)
        raise ValueError(f"--resume {run_dir}: model.path {cfg.model.path!r} no longer exists; the run's LoRA adapters "
                         f"train on that base model, which its checkpoints do not hold (they hold the merged "
                         f"weights: as model.path, the adapters would apply twice): give the base model's new "
                         f"place, {resume_command(run_dir)} model.path=DIR")
    if _gone(cfg.model.path) and newest is not None:
        raise ValueError(f"--resume {run_dir}: model.path {cfg.model.path!r} no longer exists; the run's checkpoints "
                         f"hold the model: copy one out (cp -r {newest} DIR) and continue with "
                         f"{resume_command(run_dir)} model.path=DIR")
    for key in ("data.dataset", "data.eval_dataset"):
        if _gone(_get(cfg, key)):
            raise ValueError(f"--resume {run_dir}: {key} {_get(cfg, key)!r} no longer exists; give its new place: "
                             f"{resume_command(run_dir)} {key}=PATH (the same problems: the checkpoint's digest of "
                             f"them is checked)")


def _check_moved_model(run_dir: Path, old: str, new) -> None:
    """``model.path`` may change on ``--resume`` only when the recorded folder is gone (moved, deleted): the
    checkpoint restores the weights, the folder gives the architecture, tokenizer and files each checkpoint
    copies. Not a folder inside the run: pruning would delete it while the run reads it."""
    new_path = Path(str(new)).expanduser().resolve()
    if new_path == run_dir.resolve() or run_dir.resolve() in new_path.parents:
        raise ValueError(f"--resume {run_dir}: model.path={new} is inside the run, whose pruning deletes old "
                         f"checkpoints; copy it out first (cp -r {new} DIR) and give model.path=DIR")


class RunFolder:
    """Writes the run folder's own files (rank 0 only). ``metrics.jsonl`` / ``tb/`` belong to
    :class:`pacs_fast.trainer.metrics.MetricsLogger`, ``checkpoints/`` to
    :mod:`pacs_fast.trainer.checkpoint`."""

    def __init__(self, path: str | Path, *, new: bool = True):
        self.path = Path(path)
        self.new = new
        # before anything is written: see RunLock (a resumed run's folder is its own: only waiting helps)
        self.lock = RunLock(self.path, new=new, other="choose another train.run_name" if new else
                            "stop it first (two runs must not write one folder)")
        self._samples = None

    def write_config(self, cfg: Config) -> None:
        save_config(cfg, self.path / CONFIG_FILE)

    def append_samples(self, rows: list[dict]) -> None:
        """Appends rollout samples (one JSON object each) to ``samples.jsonl``."""
        if self._samples is None:
            end_torn_line(self.path / "samples.jsonl")
            self._samples = open(self.path / "samples.jsonl", "a", encoding="utf-8", buffering=1)
        for row in rows:
            self._samples.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._samples.flush()

    def sync(self) -> None:
        """Puts ``samples.jsonl`` on the disk (before a checkpoint is published: see ``MetricsLogger.flush``)."""
        if self._samples is not None:
            self._samples.flush()
            os.fsync(self._samples.fileno())

    def mark_resume(self, step: int) -> None:
        """A resumed run appends ``{"kind": "resume", "step": step}`` to ``samples.jsonl`` (as to
        ``metrics.jsonl``): the rows a killed run wrote after its checkpoint are superseded by the
        redone steps' (see :func:`pacs_fast.trainer.metrics.read_jsonl`)."""
        if (self.path / "samples.jsonl").is_file():
            self.append_samples([{"kind": "resume", "step": int(step)}])

    def write_summary(self, summary: dict) -> None:
        write_text_atomic(self.path / "summary.json", json.dumps(summary, indent=1))

    def close(self, *, abandon: bool = False, discard: bool = False) -> None:
        """Closes the samples file and drops the lock. ``abandon`` (a new run whose setup failed): a folder
        holding nothing but its lock is removed, so that a failed start leaves no empty run behind.
        ``discard`` (with ``abandon``: a new run whose setup failed after writing its own files, its
        ``config.yaml`` and what a tracker began, before any step): those are removed first, under the lock."""
        if self._samples is not None:
            self._samples.close()
            self._samples = None
        if abandon and discard and self.new:
            for p in self.path.iterdir():
                if p.name == LOCK_FILE:
                    continue
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    p.unlink(missing_ok=True)
        if abandon and self.new and not _is_used(self.path):
            try:  # unlinked under the lock: a run that opens the name after this makes a lock of its own
                (self.path / LOCK_FILE).unlink()
            except OSError:
                pass
        self.lock.release()
        if abandon and self.new:
            try:
                self.path.rmdir()  # only if still empty (another run may have claimed the name since)
            except OSError:
                pass

