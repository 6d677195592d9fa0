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

import importlib.util
import json
import math
import netrc
import os
import re
import tempfile
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

from pacs_fast.files import write_text_atomic
from pacs_fast.trainer.metrics import close_quietly, scalar_metrics

LOGGERS = ("tensorboard", "jsonl", "wandb", "mlflow", "trackio")
IDS_FILE = "trackers.json"
_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}


def _wandb_logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("//")[-1].split("/")[0]
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def check_trackers(cfg) -> None:
    """ValueError naming ``train.loggers`` for an unknown name, a tracker whose library is missing, or
    W&B online without a login; before anything loads."""
    names = cfg.train.loggers
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"train.loggers must be a list of names ({', '.join(LOGGERS)}), e.g. "
                         f"train.loggers=[tensorboard,wandb]; got {names!r}")
    for i, name in enumerate(names):
        if name not in LOGGERS:
            raise ValueError(f"train.loggers: unknown logger {name!r}; choose from {', '.join(LOGGERS)}")
        if name in names[:i]:  # (W&B and trackio logged every step twice, MLflow refused its second run)
            raise ValueError(f"train.loggers lists {name!r} twice; name each logger once")
        package = _PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise ValueError(f"train.loggers={name} needs the {package} package: pip install 'pacs_fast[loggers]'")
        if package:  # installed but broken (a dependency missing, a version clash): now, not after the model loads
            try:
                importlib.import_module(package)
            except Exception as e:
                raise ValueError(f"train.loggers={name}: importing the {package} package failed "
                                 f"({type(e).__name__}: {e}); repair it (pip install 'pacs_fast[loggers]') or "
                                 f"leave {name} out") from e
    _check_project(cfg.train.project, names)
    group = tracker_group(cfg)
    if "wandb" in names and len(group) > 128:
        raise ValueError(f"train.tracker_group is {len(group)} characters long: W&B takes groups of at most 128")
    if "wandb" in names:
        _check_wandb_mode()
    if "mlflow" in names:
        _check_mlflow_uri()
    if "trackio" in names:
        _check_trackio_dir()
    if "wandb" in names and _wandb_mode() not in ("offline", "disabled", "dryrun") and not _wandb_logged_in():
        raise ValueError("train.loggers=wandb: not logged in to W&B; run `wandb login` or set WANDB_API_KEY, or "
                         "WANDB_MODE=offline to keep the run in the run folder (`wandb sync` it later)")


def _wandb_mode() -> str:
    """W&B's mode as ``wandb.init`` will read it: ``WANDB_MODE``, else the ``mode`` of its settings files (what
    ``wandb offline`` writes: the global one in ``WANDB_CONFIG_DIR`` (default ``~/.config/wandb``), then the
    working folder's ``wandb/settings`` (``WANDB_DIR``'s), which wins); "" when none says."""
    import configparser

    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"].lower()
    mode = ""
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb")
    for path in (config_dir / "settings", Path(os.environ.get("WANDB_DIR") or ".") / "wandb" / "settings"):
        parser = configparser.ConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        mode = parser.get("default", "mode", fallback=mode) or mode
    return mode.lower()


def _check_wandb_mode() -> None:
    """``WANDB_MODE`` must be a mode W&B takes, as written: ``Offline`` counted as offline here (no login asked
    for) and a typo passed, and W&B refused both after the model had loaded ("ValidationError: 1 validation error
    for Settings", naming neither the variable nor the modes)."""
    mode = os.environ.get("WANDB_MODE")
    if not mode:
        return
    try:
        import typing

        import wandb
        modes = typing.get_args(wandb.Settings.model_fields["mode"].annotation)  # (W&B's own list of them)
    except Exception:  # a W&B without it: left to wandb.init
        return
    if modes and mode not in modes:
        raise ValueError(f"train.loggers=wandb: WANDB_MODE={mode} is not a mode W&B takes ({', '.join(modes)}); "
                         f"WANDB_MODE=offline keeps the run in the run folder")


_WANDB_FORBIDDEN = "/\\#?%:"  # characters W&B refuses in a project name (its UsageError lists them)


def _trackio_file_bytes(project: str) -> int:
    """The bytes of the longest file name trackio gives ``project``'s store: its database's, with ``-journal``."""
    try:
        from trackio.sqlite_storage import SQLiteStorage  # (its own name for it: a later trackio may change it)
        name = SQLiteStorage.get_project_db_filename(project)
    except Exception:
        name = f"{project}.db"
    return len(f"{name}-journal".encode("utf-8"))


def _check_project(project, names) -> None:
    """``train.project`` as the trackers take it: W&B refused ``a/b`` and MLflow an empty name only after the
    model had loaded (a traceback), and the failed run's folder blocked its name."""
    trackers = [n for n in names if n in _PACKAGES]
    if not trackers:
        return
    if not isinstance(project, str) or not project.strip():
        raise ValueError(f"train.project={project!r}: train.loggers={','.join(trackers)} needs a project name")
    if "trackio" in trackers and _trackio_file_bytes(project) > 255:  # (it failed after the model had loaded)
        raise ValueError(f"train.project is {len(project.encode('utf-8'))} bytes long in UTF-8: trackio keeps a "
                         f"project in a file named after it (<project>.db, a .db-journal beside it), and a file name "
                         f"takes at most 255 bytes; shorten it")
    bad = sorted({c for c in project if c in _WANDB_FORBIDDEN})
    if "wandb" in trackers and (bad or len(project) > 128):
        why = f"contains {' '.join(bad)}" if bad else f"is {len(project)} characters long"
        raise ValueError(f"train.project={project!r} {why}: W&B takes names of at most 128 characters without any of "
                         f"{' '.join(_WANDB_FORBIDDEN)}")


_MLFLOW_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")


def _check_mlflow_uri() -> None:
    """``MLFLOW_TRACKING_URI``, when set, must name a store this MLflow has: a database (``sqlite:``,
    ``postgresql:``, ...) needs SQLAlchemy, which mlflow-skinny (the ``loggers`` extra) leaves out, and MLflow
    found that out only at the run's first ``set_experiment``, after the model loaded (a traceback)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return
    try:  # MLflow's own scheme -> store table (private: a later MLflow that moved it skips the check)
        from mlflow.tracking._tracking_service.utils import _tracking_store_registry as registry
    except ImportError:
        return
    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.split("+")[0].lower()
    if parts.password:  # a database URI's password stays out of the message (and the logs it lands in)
        uri = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))
    head = f"train.loggers=mlflow: MLFLOW_TRACKING_URI={uri}"
    try:
        registry.get_store_builder(os.environ["MLFLOW_TRACKING_URI"])
        known_scheme = True
    except Exception:  # UnsupportedModelRegistryStoreURIException, or a URI MLflow cannot parse
        known_scheme = False
    if known_scheme:
        if scheme in ("http", "https"):
            _check_reachable(head, parts, scheme)
        elif scheme in ("", "file"):
            _check_file_store(head, Path(urllib.request.url2pathname(parts.path) if scheme else uri))
        return
    if scheme in _MLFLOW_DATABASES and importlib.util.find_spec("sqlalchemy") is None:
        raise ValueError(f"{head} is a database, and MLflow's database store needs SQLAlchemy and Alembic, which "
                         f"mlflow-skinny (what pacs_fast[loggers] installs) leaves out: pip install sqlalchemy alembic "
                         f"(or the full mlflow), or unset MLFLOW_TRACKING_URI for the file store in the run folder")
    known = ", ".join(sorted(k for k in getattr(registry, "_registry", {}) if k))
    raise ValueError(f"{head}: MLflow has no tracking store for the scheme {scheme!r}"
                     + (f" (it takes {known})" if known else "") + "; fix the URI or unset MLFLOW_TRACKING_URI for "
                     "the file store in the run folder")


def _check_reachable(head: str, parts: urllib.parse.SplitResult, scheme: str) -> None:
    """A tracking server must answer a request within a few seconds: MLflow retried an unreachable one for about 4
    minutes, after the model had loaded. One GET of the server's root through the environment's proxies (as MLflow's
    client goes: ``HTTPS_PROXY``, ``NO_PROXY``); any HTTP answer, an error status included, is a server. Checked
    by the main process only (``RANK`` 0 or unset: the one that logs; a compute node need not reach it)."""
    import urllib.error
    import urllib.request

    if os.environ.get("RANK", "0") != "0":
        return
    try:
        parts.port  # (a port that is not a number, or out of range: a ValueError)
    except ValueError as e:
        raise ValueError(f"{head}: {e}") from None
    root = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/", "", ""))
    try:
        with urllib.request.urlopen(root, timeout=_SERVER_TIMEOUT_S):
            pass
    except urllib.error.HTTPError:  # an answer: a server is there
        return
    except (urllib.error.URLError, OSError, ValueError) as e:
        why = getattr(e, "reason", None) or e
        why = getattr(why, "strerror", None) or why
        raise ValueError(f"{head}: no server answers at {parts.netloc} within {_SERVER_TIMEOUT_S:g} s ({why}); "
                         f"start it, fix the URI, or unset MLFLOW_TRACKING_URI for the file store in the run "
                         f"folder") from None


_SERVER_TIMEOUT_S = 10.0


def _check_file_store(head: str, folder: Path) -> None:
    """A file-store ``MLFLOW_TRACKING_URI`` (``file:///...`` or a plain path) must be a folder this process can make
    or write: one under a file, or on a read-only mount, failed at the run's first ``set_experiment``, after the model
    had loaded. Checked without making it (MLflow makes it when the run starts)."""
    probe = folder
    while not probe.exists() and probe.parent != probe:  # (a path under a file does not exist either)
        probe = probe.parent
    why = None
    if not probe.is_dir():
        why = f"Not a directory: {probe}"
    elif not os.access(probe, os.W_OK | os.X_OK):
        why = f"{probe} cannot be written"
    if why:
        raise ValueError(f"{head}: MLflow's file store there cannot be written ({why}); set it to a folder you can "
                         f"write, or unset MLFLOW_TRACKING_URI for the file store in the run folder")


def _check_trackio_dir() -> None:
    """trackio's local store must be a folder this process can write: trackio swallows its write errors, so a
    run whose ``TRACKIO_DIR`` could not be created said "metrics logged to <dir>", finished with exit code 0 and
    stored nothing."""
    try:
        from trackio.utils import TRACKIO_DIR  # the folder trackio resolved at import (TRACKIO_DIR or HF_HOME/trackio)
    except ImportError:
        return
    where = Path(TRACKIO_DIR)
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=where, prefix=".pacs_fast-write-check-"):
            pass
    except OSError as e:
        raise ValueError(f"train.loggers=trackio: its local store {where} (TRACKIO_DIR, default HF_HOME/trackio) "
                         f"cannot be written ({e.strerror or e}); set TRACKIO_DIR to a folder you can write") from e


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


def tracker_group(cfg) -> str:
    """``train.tracker_group`` ("" when the config has none)."""
    return getattr(cfg.train, "tracker_group", "") or ""


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
    ids = _read_ids(path)
    sitting_out = [name for name in TRACKERS if name in ids and name not in cfg.train.loggers]
    for name in sitting_out:  # (this session's steps: not in their runs)
        _set_aside(ids, name)
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


def _set_aside(ids: dict, name: str) -> None:
    """``name``'s run id out of ``ids`` (listed under ``<name>_earlier_runs``): a run that lacks steps, so that the
    next resume begins a run of its own, which first gets the history up to its checkpoint (MetricsLogger.replay)."""
    ids.setdefault(f"{name}_earlier_runs", []).append(ids.pop(name))


def forget_run(run_dir: str | Path, name: str) -> None:
    """For a tracker gone off mid-run (:meth:`MetricsLogger._each`): its run lacks the rest of this session's
    records, and a resume that continued it left that gap in it, unreported (MLflow showed steps 1, 6, 7 of a run
    trained 1-7); its id is set aside in ``trackers.json``, and the resume begins a run of its own with the whole
    history. Nothing when the run folder has no such id (a logger used without :func:`open_trackers`)."""
    path = Path(run_dir) / IDS_FILE
    try:
        ids = _read_ids(path)
    except ValueError:  # (damaged by hand: the resume names it)
        return
    if isinstance(ids.get(name), str):
        _set_aside(ids, name)
        write_text_atomic(path, json.dumps(ids, indent=1))


def _read_ids(path: Path) -> dict:
    """``trackers.json``'s ids (none when there is no file); a ValueError naming the file when it is not a JSON
    object of them (it is written atomically: an edit by hand)."""
    if not path.is_file():
        return {}
    try:
        ids = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as e:
        ids = e
    if not isinstance(ids, dict):
        raise ValueError(f"{path} is not the JSON object of tracker run ids this run wrote ({ids}); restore it, or "
                         f"delete it to log the rest of the run to new tracker runs")
    return ids

