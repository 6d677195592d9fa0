"""The files and folders a run reads or writes, checked before any model loads: a ValueError naming the key.

Paths are checked for what the file system can take first (a name over 255 bytes, a path over 4,095: the
OS's ``File name too long`` had been a traceback), then for what they must be (a model folder, a writable
output folder, a dataset file, folder or glob).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from pacs_fast.config.dataset_files import dataset_exists, dataset_files
from pacs_fast.config.model_files import hub_model_folder, model_folder_problem
from pacs_fast.config.remote_code import trust
from pacs_fast.config.schema import Config

# Names data.dataset / data.eval_dataset accept besides files (pacs_fast.data.datasets ships them;
# tests/test_config.py checks this list against it).
SHIPPED_DATASETS = ("math_train", "gsm8k_train", "math500", "amc23", "aime2024", "aime2025")
NAME_MAX, PATH_MAX = 255, 4095  # bytes of one path component / of a whole path (Linux)
RUN_FILES_ROOM = 200  # bytes a run folder's own files add to its path (checkpoints/step_000000/model-....safetensors)
PATH_KEYS = ("model.path", "train.out_dir", "train.run_name", "warmup.cache_dir", "data.dataset",
             "data.eval_dataset")


def _value(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def check_path_length(key: str, value: str, room: int = 0) -> None:
    """ValueError naming ``key`` when ``value`` cannot be a path here: text that is no file name (a lone
    surrogate), a component over :data:`NAME_MAX` bytes, or the whole over :data:`PATH_MAX` less ``room`` (bytes
    kept for what goes inside: a run folder's checkpoints)."""
    try:
        whole = len(os.fsencode(os.path.expanduser(value)))  # (os.path's: ~nosuchuser stays as it is)
        longest = max((len(os.fsencode(p)) for p in Path(value).parts), default=0)
    except UnicodeEncodeError:
        raise ValueError(f"{key} {value!r} is not text a file name can hold (a lone surrogate)") from None
    if longest > NAME_MAX or whole > PATH_MAX - room:
        what = (f"a name of {longest} bytes (a file or folder name takes at most {NAME_MAX})" if longest > NAME_MAX
                else f"{whole} bytes (a path takes at most {PATH_MAX}" + (f", less {room} for the files inside)"
                                                                          if room else ")"))
        raise ValueError(f"{key} {value[:60]!r}... is too long for a path: {what}")


def warmup_cache_root(cfg: Config) -> Path:
    """Where warmed-up tiny models are cached: ``warmup.cache_dir``, else ``$PACS_FAST_CACHE``, else
    ``~/.cache/pacs_fast``."""
    return Path(cfg.warmup.cache_dir or os.environ.get("PACS_FAST_CACHE") or "~/.cache/pacs_fast").expanduser()


def write_problem(folder: Path) -> str | None:
    """Why the existing folder ``folder`` cannot take a new folder (a read-only mount, no permission), else None.
    Tried for real (a temporary folder made and removed), since root passes every permission check on a read-only
    file system."""
    import shutil
    import tempfile

    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".pacs_fast-write-test-", dir=folder))
    except OSError as e:
        return str(e.strerror or e)
    return None


def _check_writable(key: str, folder: Path) -> None:
    """ValueError naming ``key`` when ``folder`` (or, where it does not exist yet, its nearest existing
    parent) cannot take a new folder: a file, a read-only mount, no permission (:func:`write_problem`)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{key} {str(folder)!r} cannot be created: {str(probe)!r} is a file")
    problem = write_problem(probe)
    if problem:
        raise ValueError(f"{key} {str(folder)!r} is not writable ({problem} in {str(probe)!r}); choose "
                         f"another {key}")


_ENV_VAR = re.compile(r"\$(?:\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)")


def check_no_env_var(key: str, value: str) -> None:
    """ValueError naming ``key`` when ``value`` holds ``$NAME`` / ``${NAME}`` and is no existing path as written:
    a shell expands it, but not inside quotes nor in a config file, and pacs_fast does not either
    (``train.out_dir: $HOME/runs`` had made a folder named ``$HOME`` in the current one)."""
    found = _ENV_VAR.search(value)
    if found and not os.path.lexists(os.path.expanduser(value)):
        raise ValueError(f"{key} {value!r} holds {found.group(0)}, which is not expanded (a shell expands it outside "
                         f"quotes; a config file and a quoted override keep it as text): write the path itself")


def validate_paths(cfg: Config, *, new_run: bool = True) -> None:
    """Files and folders the run reads or writes, checked before any model work. ``new_run=False`` (a resume, whose
    folder ``--resume`` names): the recorded ``train.out_dir`` is not checked."""
    for key in PATH_KEYS:
        check_path_length(key, _value(cfg, key))
        check_no_env_var(key, _value(cfg, key))
    # the run folder (an automatic name takes up to ~40 bytes) and room for its files (checkpoints/step_N/...)
    check_path_length("train.out_dir / train.run_name", str(Path(cfg.train.out_dir) / (cfg.train.run_name or "x" * 40)),
                      room=RUN_FILES_ROOM)
    trust(cfg.model.trust_remote_code)  # (this process's loaders run a model folder's own code, or refuse it)
    revision = cfg.model.revision.strip()
    if revision and not cfg.model.path:
        raise ValueError(f"model.revision={revision} needs a hub id model.path (org/name); the built-in tiny model "
                         f"has no revisions")
    if cfg.model.path:
        path = Path(cfg.model.path).expanduser()
        if path.exists() and revision:  # (a folder holds one model: nothing to pick)
            raise ValueError(f"model.revision={revision}: model.path {cfg.model.path!r} is a folder here; "
                             f"model.revision picks a commit, branch or tag of a Hugging Face Hub id (org/name)")
        if not path.exists():
            # a hub id: its snapshot folder (the commit in its path), at model.revision
            snapshot = hub_model_folder(cfg.model.path, revision=revision or None)
            if snapshot is None:
                raise ValueError(f"model.path {cfg.model.path!r} does not exist (give a Hugging Face model folder or "
                                 f"hub id, or leave it empty for the built-in tiny model)")
            cfg.model.path, path, cfg.model.revision = str(snapshot), snapshot, ""  # (the folder names the commit)
        problem = model_folder_problem(path)
        if problem:
            raise ValueError(f"model.path {cfg.model.path!r}{problem}")
    if new_run and not cfg.train.out_dir.strip():
        raise ValueError("train.out_dir is empty: give the folder runs go in ('.' for the current one; in a YAML "
                         "file a bare ~ is null: write '~' or '~/runs' in quotes)")
    if new_run:
        _check_writable("train.out_dir", Path(cfg.train.out_dir).expanduser())
    if not cfg.model.path and not warmup_cache_root(cfg).is_dir():  # (an existing cache may be a read-only,
        _check_writable("warmup.cache_dir", warmup_cache_root(cfg))  # shared one: its models are only read)
    for key in ("data.dataset", "data.eval_dataset"):
        value = _value(cfg, key)
        if key == "data.dataset" and not value.strip():  # (an empty path is the current folder)
            raise ValueError(f"data.dataset is empty: give the training set (arithmetic, the built-in task; "
                             f"{', '.join(SHIPPED_DATASETS[:2])}; or a file, folder or glob)")
        if not value or value in SHIPPED_DATASETS or (key == "data.dataset" and value == "arithmetic"):
            continue
        if not dataset_exists(value):
            raise ValueError(f"{key} {value!r} is neither a shipped dataset ({', '.join(SHIPPED_DATASETS)}"
                             f"{', arithmetic' if key == 'data.dataset' else ''}) nor an existing file, folder or glob")
        try:  # a folder of several splits or subsets, a glob of no data file
            dataset_files(value)
        except (ValueError, OSError) as e:
            raise ValueError(f"{key}: {e}") from None
    if cfg.data.dataset != "arithmetic" and not cfg.model.path:
        raise ValueError("data.dataset is not the built-in task but model.path is empty: the built-in tiny model "
                         "only knows the built-in arithmetic task; set model.path to a Hugging Face model folder")
    out = Path(cfg.train.out_dir).expanduser()
    if new_run and out.exists() and not out.is_dir():
        raise ValueError(f"train.out_dir {cfg.train.out_dir!r} is a file, not a folder")
    name = cfg.train.run_name
    if name and any("\udc80" <= c <= "\udcff" for c in name):  # bytes of the command line that are no UTF-8
        raise ValueError(f"train.run_name {name!r} is not UTF-8 text: give the name in UTF-8")
    if name and (name in (".", "..") or name.startswith(".") or any(c in name for c in '/\\\0')
                 or name != name.strip() or not name.isprintable()):
        raise ValueError(f"train.run_name {name!r} must be a plain folder name (no '/', '\\\\', no leading '.', "
                         f"no leading or trailing space, no control character)")
