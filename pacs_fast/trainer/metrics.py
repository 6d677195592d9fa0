"""Metrics: a JSONL file (one record per train step / evaluation), TensorBoard scalars, and a
rich progress display on the terminal.

Records are ``{"kind": "train"|"eval", "step": s, ...}``. Keys under ``time/`` and ``perf/``
(timings, throughput) are the only ones that differ between two runs with the same seed.
"""
from __future__ import annotations

import json
import os
import math
import re
import threading
import time
from pathlib import Path

from pacs_fast.files import write_text_atomic
from pacs_fast.trainer.tracker_ids import forget_run

NONDETERMINISTIC_PREFIXES = ("time/", "perf/")


def read_jsonl(path: str | Path, *, raw: bool = False, keys=None) -> list[dict]:
    """The records of a metrics file (a torn last line is skipped).

    The file is append-only: a resumed run appends ``{"kind": "resume", "step": s}`` and then
    re-runs the steps after its checkpoint ``s``. By default the records superseded that way (those
    written before the marker with a step after ``s``) and the markers are left out, which gives the
    run's history as an uninterrupted run would have written it; ``raw=True`` returns every line.
    A run restarted from step 0 (it had no checkpoint) writes the marker with step -1: every earlier
    record is superseded. ``samples.jsonl`` carries the same markers.

    ``keys``: keep only these keys of each record (and ``kind`` / ``step``): the file is read a line at a
    time, so a long run's history costs its kept values, not the file's text (a 100k-step run's files held
    ~0.2 GB of text, and every sample's prompt and response, at the end of training; a sweep of long runs).
    Lines end at ``\n`` only (``str.splitlines`` also split at U+2028 inside a response's text)."""
    out = []
    p = Path(path)
    if not p.exists():
        return out
    keep = None if keys is None else set(keys) | {"kind", "step"}
    with open(p, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict):
                continue
            if not raw and rec.get("kind") == "resume":
                at = rec.get("step")
                if isinstance(at, (int, float)) and not isinstance(at, bool):  # (a marker without one is unreadable)
                    out = [r for r in out if not _after(r.get("step", 0), at)]
                continue
            out.append(rec if keep is None else {k: v for k, v in rec.items() if k in keep})
    return out


def _after(step, at) -> bool:
    """Whether a record's ``step`` is after a resume marker's ``at`` (a record whose step is not a number is not:
    it is kept, as written)."""
    return isinstance(step, (int, float)) and not isinstance(step, bool) and step > at


def deterministic_view(records: list[dict]) -> list[dict]:
    """The records without timing keys (what must match between a resumed and an uninterrupted run)."""
    return [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC_PREFIXES)} for r in records]


def _clean(v):
    """``v`` as strict JSON holds it: a non-finite float is None (inside lists and mappings too: json.dumps wrote a
    bare NaN there, which strict JSON readers refuse)."""
    if isinstance(v, float):
        return v + 0.0 if math.isfinite(v) else None  # (-0.0, a loss of exactly zero times -1, reads 0.0)
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    return v


def end_torn_line(path: str | Path) -> bool:
    """Appends a newline to ``path`` when its last line is cut (no final newline), so that the next
    record starts on a line of its own and the torn one is skipped as unreadable. Returns whether
    it did."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return False
        f.write(b"\n")
        f.flush()
        os.fsync(f.fileno())
    return True


def scalar_metrics(kind: str, values: dict) -> dict:
    """``{name: value}`` of a record's finite numbers as TensorBoard and the trackers name them: ``{kind}/{key}``
    (``reward/mean`` of a train record: ``train/reward/mean``), the key alone when it already starts with
    ``kind/`` (``eval/acc`` of an eval record)."""
    return {(k if k.startswith(kind + "/") else f"{kind}/{k}"): float(v) for k, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def begins_at_resume(tracker) -> bool:
    """Whether ``tracker`` (opened by a resume) logs to a run of its own begun now: a W&B offline resume's part
    (``part``), or a tracker the run had not used before (``began``; pacs_fast/trainer/trackers.py)."""
    return bool(getattr(tracker, "part", None) or getattr(tracker, "began", False))


def close_quietly(tracker, status: str) -> str | None:
    """``tracker.close(status)`` (a W&B / MLflow / trackio run of pacs_fast/trainer/trackers.py); what it raised as
    one line (None when it closed)."""
    try:
        tracker.close(status)
    except Exception as e:
        return one_line(e)
    return None


def one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def _forget_run(run_dir: Path, name) -> None:
    """:func:`~pacs_fast.trainer.tracker_ids.forget_run`; a failure to note it is not the training's (the warning
    line names the tracker)."""
    if not name:
        return
    try:
        forget_run(run_dir, name)
    except Exception:
        pass


MISSING_FILE = ".missing_from_step"  # in tb/: the first step a resumed session without TensorBoard logged


def _missing_from(tb_dir: Path) -> float:
    """The first step ``tb_dir`` lacks (:data:`MISSING_FILE`; inf when it lacks none)."""
    try:
        return int((tb_dir / MISSING_FILE).read_text())
    except (OSError, ValueError):
        return math.inf


def _note_missing(tb_dir: Path, step: int) -> None:
    """Notes in ``tb_dir`` that its run's steps from ``step`` on are not in TensorBoard (the earliest so noted)."""
    if step < _missing_from(tb_dir):
        write_text_atomic(tb_dir / MISSING_FILE, str(step))


def _event_files(tb_dir: Path) -> bool:
    """Whether ``tb_dir`` holds TensorBoard event files (a run that logged to TensorBoard before)."""
    try:
        return any(name.startswith("events.out.tfevents.") for name in os.listdir(tb_dir))
    except OSError:  # no folder yet
        return False


def wait_past_event_files(tb_dir: Path) -> None:
    """Returns once the clock's second is past every ``events.out.tfevents.<second>...`` file in ``tb_dir``.
    TensorBoard reads a run's event files in name order, and a writer names its file by the second it opened
    it, then host, pid and a per-process counter, compared as text: two files of one second can sort against
    their order of writing (pid 999 after 1000, counter 9 after 10), and a resume's events (its purge of
    the redone steps) would be read before the run they purge. At most a second's wait, and only for a
    writer opened within the second of an earlier one (a resume in the same process: tests)."""
    latest = -1
    try:
        for name in os.listdir(tb_dir):
            hit = re.match(r"events\.out\.tfevents\.(\d+)\.", name)
            if hit:
                latest = max(latest, int(hit.group(1)))
    except OSError:  # no folder yet
        return
    while time.time() < latest + 1:
        time.sleep(max(0.001, latest + 1 - time.time()))


class MetricsLogger:
    """Appends records to ``run_dir/metrics.jsonl`` and TensorBoard (``run_dir/tb``), and hands them to
    the experiment ``trackers`` of ``train.loggers`` (:mod:`pacs_fast.trainer.trackers`).

    The file is only ever appended to. ``resume_step``: a ``resume`` marker is appended (records
    after that step, written by a killed run after its last checkpoint, are superseded: see
    :func:`read_jsonl`) and TensorBoard events after it are purged.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, resume_step: int | None = None,
                 trackers: list | None = None, warn=print):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.trackers = list(trackers or [])  # W&B / MLflow / trackio (pacs_fast/trainer/trackers.py)
        self.warn = warn  # prints a warning line (a tracker that failed)
        self._closing: list = []  # threads closing trackers that failed (their server may be gone: not waited on)
        end_torn_line(self.path)  # a run killed mid-write leaves half a record: never append to it
        # TensorBoard on at a resume after a session without it (or none before: train.loggers without it): the steps
        # it lacks, from the first that session logged, are purged and written again from the records (as a tracker
        # added at a resume gets them: MetricsLogger.replay); it had held none of them, a gap
        tb_dir = Path(run_dir) / "tb"
        purge_from, history = None if resume_step is None else resume_step + 1, []
        if resume_step is not None and not tensorboard and _event_files(tb_dir):
            _note_missing(tb_dir, resume_step + 1)  # (this session's steps: not in TensorBoard)
        elif resume_step is not None and tensorboard:
            purge_from = min(purge_from, _missing_from(tb_dir) if _event_files(tb_dir) else 0)
            if purge_from <= resume_step:
                history = [r for r in read_jsonl(self.path) if purge_from <= r.get("step", -1) <= resume_step]
        self._file = open(self.path, "a", buffering=1)
        if resume_step is not None:
            self._file.write(json.dumps({"kind": "resume", "step": int(resume_step)}) + "\n")
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                # a session-start event at every start, the first included: TensorBoard's loader takes the
                # first one it reads for the run's start and purges only at a later one (the resume's), so
                # a fresh run without one showed the steps a resume redid twice
                wait_past_event_files(tb_dir)  # its file sorts after the earlier ones
                self.tb = SummaryWriter(str(tb_dir), purge_step=purge_from if purge_from is not None else 0)
            except ImportError:  # tensorboard missing: JSONL only
                self.tb = None
        if self.tb is not None and resume_step is not None:
            for rec in history:
                values = {k: x for k, x in rec.items() if k not in ("kind", "step")}
                for name, v in scalar_metrics(rec["kind"], values).items():
                    self.tb.add_scalar(name, v, int(rec["step"]))
            self.tb.flush()
            (tb_dir / MISSING_FILE).unlink(missing_ok=True)

    def log(self, kind: str, step: int, values: dict) -> dict:
        record = {"kind": kind, "step": int(step), **{k: _clean(v) for k, v in values.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self.tb is not None:
            for name, v in scalar_metrics(kind, values).items():
                self.tb.add_scalar(name, v, step)
        self._each("logging", lambda t: t.log(kind, int(step), values))
        return record

    def replay(self, records: list[dict]) -> None:
        """Logs ``records`` (``read_jsonl``'s history up to the checkpoint a resume continues from) to each tracker
        that begins a run of its own at this resume (:func:`begins_at_resume`), so that the new run holds the whole
        history: a kill that took W&B's service process with the training lost what that process had not written
        yet, steps before the checkpoint included, and the resumed run had only the steps after it; a tracker added
        at a resume had no step-0 evaluation."""
        def send(t):
            for rec in records:
                t.log(rec["kind"], int(rec["step"]), {k: v for k, v in rec.items() if k not in ("kind", "step")})

        self._each("replaying the run's records", send, only=begins_at_resume)

    def _each(self, what: str, call, only=None) -> None:
        """``call(tracker)`` for each tracker; one that raises is closed (as failed) and left out for the rest of
        the run, with one warning line: a tracker's server, store or network failing mid-run had stopped the
        training (and, at its end, lost ``summary.json``), while ``metrics.jsonl`` holds every record anyway."""
        for t in [t for t in self.trackers if only is None or only(t)]:
            try:
                call(t)
            except Exception as e:
                self.trackers.remove(t)
                _forget_run(self.path.parent, getattr(t, "name", None))  # (a resume begins a run of its own)
                # closed beside the training: its server gone, MLflow's end_run retried as long as the failed call
                closing = threading.Thread(target=close_quietly, args=(t, "failed"), daemon=True)
                closing.start()
                self._closing.append(closing)
                self.warn(f"warning: train.loggers={getattr(t, 'name', type(t).__name__)}: {what} failed "
                          f"({one_line(e)}); that tracker is off for the rest of this run (metrics.jsonl holds every "
                          f"record)")

    def log_text(self, tag: str, step: int, text: str) -> None:
        """A text entry in TensorBoard (Markdown), e.g. rollout samples."""
        if self.tb is not None:
            self.tb.add_text(tag, text, step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """The step's logged samples as a table in each tracker."""
        self._each("logging the samples", lambda t: t.log_samples(int(step), rows))

    def log_images(self, step: int, paths: list) -> None:
        """The end-of-run plots, at the run's last step (trackio gave them a step past it)."""
        self._each("logging the plots", lambda t: t.log_images(int(step), list(paths)))

    def flush(self) -> None:
        """Writes what TensorBoard and the trackers buffer (at a checkpoint: a run killed after it keeps every
        record up to it everywhere, as it does in metrics.jsonl), and puts ``metrics.jsonl`` on the disk: the
        checkpoint that follows is fsynced before it is published, so after a power cut a checkpoint whose records
        were still in the page cache had survived them, and a resume from it left a gap nothing reported."""
        self._file.flush()
        os.fsync(self._file.fileno())
        if self.tb is not None:
            self.tb.flush()
        self._each("flushing", lambda t: t.flush() if hasattr(t, "flush") else None)

    def close(self, status: str = "finished") -> None:
        """Closes the file and TensorBoard, then each tracker with ``status`` (how the run ended: finished, failed,
        killed; MLflow and W&B record it), one that fails to close with a warning line."""
        self._file.close()
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()
            self.tb = None
        for closing in self._closing:  # (a failed tracker's close: a few seconds at most, then left to itself)
            closing.join(timeout=5.0)
        trackers, self.trackers = self.trackers, []
        stopped = None
        for t in trackers:
            try:
                failed = close_quietly(t, status)
            except BaseException as e:  # a signal while one closed: the others close all the same (MLflow's exit
                stopped = stopped or e  # hook had ended the next one's run as FINISHED), then it is raised
                continue
            if failed:
                self.warn(f"warning: train.loggers={getattr(t, 'name', type(t).__name__)}: closing its run failed "
                          f"({failed}); what it received before is in its store, metrics.jsonl holds every record")
        if stopped is not None:
            raise stopped


class Progress:
    """A rich progress bar with the latest key metrics (a no-op when disabled)."""

    def __init__(self, total: int, *, enabled: bool, start: int = 0, description: str = "RL"):
        self.enabled = enabled
        self._p = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
                TimeElapsedColumn, TimeRemainingColumn
            self._p = RichProgress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                   TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                                   transient=False)
            self._p.start()
            self._task = self._p.add_task(description, total=total, completed=start, info="")

    def update(self, step: int, info: str) -> None:
        if self._p is not None:
            self._p.update(self._task, completed=step, info=info)

    def print(self, text: str) -> None:
        """One line above the bar, as given: no rich markup (``[tensorboard,wandb]`` or ``[/tmp/x]`` in a
        message is text) and no wrapping at the console's width (a redirected run's log keeps one line
        per message)."""
        if self._p is not None:
            self._p.console.print(text, markup=False, soft_wrap=True)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
