"""Claiming a new run's folder: ``runs/<name>/`` is created once and never silently overwritten.

- :func:`claim_run_dir`: a new run refuses an existing run folder (the error names it and
  ``--resume``); an automatic name (``algo-timestamp``) takes the next free suffix.
- :class:`RunLock`: the run that writes a folder holds an exclusive lock on its ``.run.lock`` for its
  whole life (``fcntl.flock``: the system drops it when the process dies, however it dies). Two runs
  started together with one ``train.run_name``, or a ``--resume`` of a folder whose run is still
  alive, are refused before any model work; a folder left by a killed run resumes as before.
- A run folder (or a folder above it) that is a symbolic link to nothing is one line naming the link and its
  target (:func:`broken_link`), not the system's "File exists".
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from pacs_fast.config import Config
from pacs_fast.files import is_temporary, remove_temporaries

CONFIG_FILE = "config.yaml"
LOCK_FILE = ".run.lock"


class RunFolderTaken(ValueError):
    """The folder holds another run, or another live run holds its lock."""


def _is_used(path: Path) -> bool:
    """Whether ``path`` holds a run: anything but its lock and the temporary files of atomic writes (a run killed
    while writing its ``config.yaml`` left one beside the lock: that folder is as good as empty). A symbolic link
    to nothing counts as used (an automatic name passes it by)."""
    return os.path.lexists(path) and (not path.is_dir() or any(p.name != LOCK_FILE and not is_temporary(p.name)
                                                               for p in path.iterdir()))


def broken_link(path: str | Path) -> str | None:
    """A line naming the first of ``path`` and the folders above it that is a symbolic link to nothing (and the
    target it names); None when there is none. ``mkdir`` there fails with the system's bare "File exists"."""
    path = Path(os.path.abspath(Path(path).expanduser()))
    for p in reversed((path, *path.parents)):
        if p.is_symlink() and not p.exists():
            return (f"{str(p)!r} is a symbolic link to {os.readlink(p)!r}, which does not exist: create that folder "
                    f"or remove the link")
    return None


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``run_dir/.run.lock``, held until :meth:`release` (or
    the process's end). ``new=True`` (a new run): after taking the lock, the folder must still hold
    nothing else, so of two runs racing for one name exactly one proceeds. Raises ValueError naming
    the folder (and the pid that holds it) otherwise."""

    def __init__(self, run_dir: str | Path, *, new: bool, what: str = "run folder",
                 other: str = "choose another train.run_name", writes: str = "its lock, metrics and checkpoints"):
        self.run_dir = Path(run_dir)
        path = self.run_dir / LOCK_FILE
        self._fd = None
        for _ in range(100):  # until the file locked is the one at the path (see below)
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:  # a read-only mount, no permission, a link to nothing: one line, not a traceback
                link = broken_link(self.run_dir)
                raise ValueError(f"{what} {str(self.run_dir)!r} cannot be written ({link or e.strerror or e}): a run "
                                 f"writes {writes} there (nothing was changed)") from None
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(self._fd)
                self._fd = None
                raise RunFolderTaken(f"{what} {str(self.run_dir)!r} is in use by another run (pid {holder}): wait "
                                     f"for it to end, or {other} (nothing was changed)") from None
            # a failed new run removes its lock file before it lets go (RunFolder.close(abandon=True)): a lock
            # taken on the file it removed locks nothing, so take the one now at the path instead
            try:
                here = os.stat(path)
            except FileNotFoundError:
                here = None
            mine = os.fstat(self._fd)
            if here is not None and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
                break
            os.close(self._fd)
            self._fd = None
        else:
            raise ValueError(f"{what} {str(self.run_dir)!r}: its lock file kept changing under this run; try again")
        if new and _is_used(self.run_dir):
            self.release()
            check_new_run_dir(self.run_dir)  # raises: another run got there first
        if new:
            remove_temporaries(self.run_dir)  # a killed run's, stale under this lock
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    __del__ = release  # a run set up in-process that failed half way drops its lock with the object


def claim_run_dir(cfg: Config) -> Path:
    """The folder of a new run: ``train.out_dir / train.run_name``. A user-given name that is
    already a run folder (anything in it) is refused; an automatic name gets ``-2``, ``-3``, ..."""
    out = Path(cfg.train.out_dir).expanduser()
    if cfg.train.run_name:
        run_dir = out / cfg.train.run_name
        check_new_run_dir(run_dir)
        return run_dir
    base = f"{cfg.algo.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir, k = out / base, 1
    while _is_used(run_dir):
        k += 1
        run_dir = out / f"{base}-{k}"
    check_not_inside_a_run(run_dir)
    return run_dir


def resume_command(run_dir: str | Path) -> str:
    """``--resume RUN_DIR`` as a shell takes it back (quoted; ``./`` before a name that starts with ``-``, which
    argparse would read as an option)."""
    import shlex

    text = str(run_dir)
    return f"--resume {shlex.quote('./' + text if text.startswith('-') else text)}"


def check_not_inside_a_run(run_dir: str | Path) -> None:
    """ValueError when a folder above ``run_dir`` is a run folder (its ``config.yaml`` and lock): a run made in
    another's ``checkpoints/`` was taken by that run's resume for a damaged checkpoint, and deleted when it wrote
    that step (or, while it was live, by its pruning: a traceback in the new run)."""
    for parent in Path(run_dir).expanduser().resolve().parents:
        if (parent / CONFIG_FILE).is_file() and (parent / LOCK_FILE).is_file():
            raise ValueError(f"run folder {str(run_dir)!r} is inside the run folder {str(parent)!r}, whose "
                             f"checkpoints and pruning would take it for theirs: choose a train.out_dir outside it")


def check_new_run_dir(run_dir: str | Path) -> None:
    """ValueError when ``run_dir`` already holds something (a run folder is never overwritten), or lies inside
    another run's folder (:func:`check_not_inside_a_run`)."""
    run_dir = Path(run_dir)
    check_not_inside_a_run(run_dir)
    link = broken_link(run_dir)
    if link:
        raise ValueError(f"run folder {str(run_dir)!r}: {link} (nothing was changed)")
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run folder {str(run_dir)!r} is a file")
    if _is_used(run_dir):
        raise RunFolderTaken(f"run folder {str(run_dir)!r} already exists: continue it with "
                             f"`{resume_command(run_dir)}`, or choose another train.run_name (nothing was "
                             f"overwritten)")
