"""Experiment trackers beside ``metrics.jsonl`` (always written): ``train.loggers``, any of
``tensorboard`` (the default), ``wandb``, ``mlflow``, ``trackio`` (``jsonl`` names the file that is
always there). The libraries are the optional extra ``pip install 'pacs_fast[loggers]'``.

Each tracker gets, under the run folder's name and ``train.project``: the resolved config (once), every
record of ``metrics.jsonl`` as ``<kind>/<key>`` scalars at its step (``train/reward/mean``, ``eval/acc``,
``checkpoint/time/checkpoint``; MLflow writes ``@`` as ``_at_``), each step's logged samples as a table (``samples``: step, prompt, response, answer,
reward, psi / pred_reward where PACS recorded them), and the run's plots at the end. The metric names
map to verl's and TRL's in docs/TRACKERS.md.

Where they write (nothing leaves the machine unless the user configured it to):
- ``wandb``: ``run_dir/wandb`` (``WANDB_MODE=offline`` keeps it there for ``wandb sync`` later; W&B's data folder,
  where it stages the samples tables, is ``run_dir/wandb/data`` unless ``WANDB_DATA_DIR`` is set); online
  needs a login (``wandb login`` / ``WANDB_API_KEY``), checked before any model loads.
- ``mlflow``: ``MLFLOW_TRACKING_URI`` when set (a server or a database), else MLflow's file store in
  ``run_dir/mlruns`` (its maintenance-mode filesystem backend, switched on for that folder only).
- ``trackio``: its local store (``TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``); ``trackio
  show --project <train.project>`` opens the dashboard.

A resumed run continues the same tracker runs (ids kept in ``run_dir/trackers.json``, written
atomically); the steps it redoes after its checkpoint are logged again at the same step numbers (MLflow's
sample tables of those steps replaced). W&B offline cannot continue a run (W&B resumes on its server): there
a resume is a new run, ``<name>-resumed-<k>`` (its id under ``wandb_offline_parts``; ``wandb`` keeps the run's
own), which first gets the run's records up to the checkpoint from ``metrics.jsonl`` (the samples tables and
plots of those steps stay in the earlier part). At each checkpoint TensorBoard and trackio write what they
buffer; MLflow writes as it logs; W&B's records go to its own service process, which writes its file: a kill
that takes that process too (the whole process group) loses what it had not written, steps before the
checkpoint included, which the offline resume's replay puts back.

A tracker that fails mid-run (its server, store or network) is closed and left out for the rest of the run,
with one warning line (``metrics.jsonl`` holds every record); its id is set aside in ``trackers.json``
(``<name>_earlier_runs``), as is that of a tracker a resumed session leaves out of ``train.loggers``: their runs
lack steps, and the next resume that names the tracker begins a run of its own, which first gets the records up to
its checkpoint (a continued run had kept the gap). The runs end as FINISHED, FAILED (an error) or
KILLED (Ctrl-C, SIGTERM) in MLflow, and with exit code 0 or 1 in W&B.
"""
from __future__ import annotations

import json
import math
import os
import re
import urllib.parse
import uuid
from pathlib import Path

from pacs_fast.files import write_text_atomic
from pacs_fast.trainer.metrics import close_quietly, scalar_metrics
from pacs_fast.trainer.tracker_checks import LOGGERS, check_trackers, tracker_group  # noqa: F401 (re-export)
from pacs_fast.trainer.tracker_ids import IDS_FILE, forget_run, read_ids, set_aside  # noqa: F401 (re-export)



def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _mlflow_name(name: str) -> str:
    """MLflow's metric names allow letters, digits and ``_-. :/`` only (``eval/pass@n`` -> ``eval/pass_at_n``)."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name.replace("@", "_at_"))


SAMPLE_COLUMNS = ("step", "prompt", "response", "response_tokens", "finish_reason", "answer", "reward", "trained_reward",
                  "psi", "pred_reward")


def _rows(rows: list[dict]) -> list[list]:
    return [[r.get(c) for c in SAMPLE_COLUMNS] for r in rows]


def run_name(cfg, run_dir: Path) -> str:
    """A tracker run's name: the run folder's, after ``train.tracker_group`` when there is one (an experiment's
    arm: the arms' runs of one seed had one name, ``seed0``, in W&B and MLflow)."""
    group = tracker_group(cfg)
    return f"{group}-{run_dir.name}" if group else run_dir.name


# how a run ended (Session.close): MLflow's run status for each; W&B takes an exit code
STATUSES = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}


class WandbTracker:
    name = "wandb"

    def __init__(self, cfg, run_dir: Path, config: dict, run_id: str | None):
        import wandb

        self.wandb = wandb
        _wandb_data_dir(run_dir)
        own = name = run_name(cfg, run_dir)
        self.part = None
        if run_id and wandb.setup().settings.mode in ("offline", "dryrun"):
            # W&B resumes runs on its server only: offline, a second folder of one id restarts its step counter
            # and `wandb sync` keeps one of the two (wandb/wandb#3841). A resume is a run of its own instead
            # (numbered), and the run's own id stays the one an online resume continues.
            parts = len(list((run_dir / "wandb").glob("*run-*")))  # the run's folders so far, online or offline
            name = f"{own}-resumed-{max(parts, 1)}"
        self.run = wandb.init(project=cfg.train.project, name=name, dir=str(run_dir), config=config,
                              id=None if name != own else run_id, resume="allow", group=tracker_group(cfg) or None)
        for kind in ("train", "eval", "checkpoint", "plots"):
            self.run.define_metric(f"{kind}/*", step_metric="step")
        self.id = self.run.id if name == own else run_id
        self.part = None if name == own else self.run.id  # an offline resume's own run (trackers.json)

    def log(self, kind: str, step: int, values: dict) -> None:
        self.run.log({**scalar_metrics(kind, values), "step": step})

    def log_samples(self, step: int, rows: list[dict]) -> None:
        self.run.log({"samples": self.wandb.Table(columns=list(SAMPLE_COLUMNS), data=_rows(rows)), "step": step})

    def log_images(self, step: int, paths: list[Path]) -> None:
        self.run.log({**{f"plots/{p.stem}": self.wandb.Image(str(p)) for p in paths}, "step": step})

    def close(self, status: str = "finished") -> None:
        try:
            self.run.finish(exit_code=0 if status == "finished" else 1)
        except Exception:  # its service process gone (killed, crashed): W&B's exit hook would fail the same way at
            try:  # the process's exit, a 30-line traceback after the run's one warning line; torn down now
                self.wandb.teardown(1)
            except Exception:
                pass
            raise


_DATA_DIR_SET: list[str] = []  # the WANDB_DATA_DIR this process set (a user's own is left as it is)


def _wandb_data_dir(run_dir: Path) -> None:
    """W&B's data folder (``WANDB_DATA_DIR``, where it stages the files of the artifacts it logs: each samples
    table, which ``wandb sync`` uploads from there) in ``run_dir/wandb/data`` unless the user set one: W&B's default,
    ``~/.local/share/wandb``, gathered a file per logged step outside the run folder, never removed offline (nor when
    the run folder was deleted)."""
    now = os.environ.get("WANDB_DATA_DIR")
    if now and now not in _DATA_DIR_SET:
        return
    os.environ["WANDB_DATA_DIR"] = str((run_dir / "wandb" / "data").resolve())
    _DATA_DIR_SET.append(os.environ["WANDB_DATA_DIR"])


class MlflowTracker:
    name = "mlflow"

    def __init__(self, cfg, run_dir: Path, config: dict, run_id: str | None):
        import mlflow

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri or urllib.parse.urlsplit(uri).scheme in ("", "file"):  # a folder: MLflow's file store, which
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # it keeps in maintenance mode behind this
        if not uri:
            mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        self.mlflow = mlflow
        mlflow.set_experiment(cfg.train.project)
        group = {"group": tracker_group(cfg)} if tracker_group(cfg) else None
        self.run = mlflow.start_run(run_id=run_id, run_name=None if run_id else run_name(cfg, run_dir), tags=group)
        self.id = self.run.info.run_id
        self.tables: set[str] = set()  # sample tables already in the run (a resumed run's redone steps)
        if run_id:
            client = mlflow.MlflowClient()
            self.tables = {f.path for f in client.list_artifacts(self.id, "samples")}
        else:
            mlflow.log_params({k: str(v)[:500] for k, v in _flat(config).items()})

    def log(self, kind: str, step: int, values: dict) -> None:
        self.mlflow.log_metrics({_mlflow_name(k): v for k, v in scalar_metrics(kind, values).items()}, step=step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        path = f"samples/step_{step:06d}.json"
        if path in self.tables:  # a step the killed run logged: replaced (log_table appends to the file)
            data = [[None if isinstance(v, float) and not math.isfinite(v) else v for v in row] for row in _rows(rows)]
            self.mlflow.log_text(json.dumps({"columns": list(SAMPLE_COLUMNS), "data": data}, default=str), path)
            return
        self.mlflow.log_table({c: [r.get(c) for r in rows] for c in SAMPLE_COLUMNS}, artifact_file=path)

    def log_images(self, step: int, paths: list[Path]) -> None:  # (artifacts have no step)
        for p in paths:
            self.mlflow.log_artifact(str(p), artifact_path="plots")

    def close(self, status: str = "finished") -> None:
        self.mlflow.end_run(status=STATUSES[status])


class TrackioTracker:
    name = "trackio"

    def __init__(self, cfg, run_dir: Path, config: dict, run_id: str | None):
        import trackio

        self.trackio = trackio
        # trackio knows a run by its name: a new run's gets a suffix of its own, or every run of one folder name
        # (another out_dir's seed0, an experiment's arms) was continued as one run, their metrics mixed
        self.id = run_id or f"{run_name(cfg, run_dir)}-{uuid.uuid4().hex[:6]}"
        self.run = trackio.init(project=cfg.train.project, name=self.id, config=config,
                                group=tracker_group(cfg) or None,
                                resume="allow" if run_id else "never", embed=False, auto_log_cpu=False,
                                auto_log_gpu=False)

    def log(self, kind: str, step: int, values: dict) -> None:
        self.trackio.log(scalar_metrics(kind, values), step=step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        self.trackio.log({"samples": self.trackio.Table(columns=list(SAMPLE_COLUMNS), data=_rows(rows))}, step=step)

    def log_images(self, step: int, paths: list[Path]) -> None:
        self.trackio.log({f"plots/{p.stem}": self.trackio.Image(str(p)) for p in paths}, step=step)

    def flush(self) -> None:
        """Writes what trackio's background thread has not yet stored (it batches records every 0.5 s):
        at a checkpoint, so that a run killed after it keeps every step up to it (the resume redoes only later
        ones). trackio 0.43 has no public flush; one without these internals skips it."""
        flush, lock = getattr(self.run, "_flush_queues_inline", None), getattr(self.run, "_client_lock", None)
        if flush is not None and lock is not None and getattr(self.run, "_is_local", False):
            with lock:
                flush()

    def close(self, status: str = "finished") -> None:  # (trackio records no status)
        self.trackio.finish()


TRACKERS = {"wandb": WandbTracker, "mlflow": MlflowTracker, "trackio": TrackioTracker}


def open_trackers(cfg, run_dir: str | Path, config: dict) -> list:
    """The trackers of ``train.loggers`` other than TensorBoard and the JSONL file, each continuing
    the run it started before when ``run_dir/trackers.json`` names one (a resumed run)."""
    run_dir = Path(run_dir)
    path = run_dir / IDS_FILE
    ids = read_ids(path)
    sitting_out = [name for name in TRACKERS if name in ids and name not in cfg.train.loggers]
    for name in sitting_out:  # (this session's steps: not in their runs)
        set_aside(ids, name)
    out = []
    for name in cfg.train.loggers:
        if name in TRACKERS:
            try:
                tracker = TRACKERS[name](cfg, run_dir, config, ids.get(name))
            except Exception as e:  # a server, a store or a name the library refuses: one line, the others closed
                for opened in out:  # as failed (an MLflow server had kept an empty run marked finished)
                    close_quietly(opened, "failed")
                first = (str(e).strip().splitlines() or [repr(e)])[0]
                raise ValueError(f"train.loggers={name}: the tracker cannot start ({type(e).__name__}: {first})") from e
            tracker.began = name not in ids  # a run of its own begun now (a tracker added at a resume)
            ids[name] = tracker.id
            if getattr(tracker, "part", None):
                ids.setdefault(f"{name}_offline_parts", []).append(tracker.part)
            out.append(tracker)
    if out or sitting_out:
        write_text_atomic(path, json.dumps(ids, indent=1))
    return out

