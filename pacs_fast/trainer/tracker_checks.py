"""The trackers' settings checked before any model loads (:func:`check_trackers`, called by the trainer and the
experiment runner): ``train.loggers`` names, the libraries, W&B's login, mode and project, MLflow's tracking URI
(a server answering, a database's drivers, a file store that can be written), trackio's folder. Each problem is one
ValueError naming the key or the environment variable. The trackers themselves: :mod:`pacs_fast.trainer.trackers`."""
from __future__ import annotations

import importlib.util
import netrc
import os
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

LOGGERS = ("tensorboard", "jsonl", "wandb", "mlflow", "trackio")
_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}


def tracker_group(cfg) -> str:
    """``train.tracker_group`` ("" when the config has none)."""
    return getattr(cfg.train, "tracker_group", "") or ""


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
