"""Files written atomically: a temporary file next to the target, then ``os.replace`` over it.

A reader, or a run killed mid-write, sees the old or the new file, never a cut one. Imports nothing
from the rest of the package, so every layer may use it.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Callable

#: the name :func:`write_atomic` (and ``save_config``) gives its temporary file: ``.<name>.tmp-<pid>``
_TEMPORARY = re.compile(r"\..+\.tmp-\d+")


def temporary_name(path: str | Path) -> Path:
    """The temporary file beside ``path`` that this process fills before renaming it over ``path``."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def is_temporary(name: str) -> bool:
    """Whether a file name is one of :func:`temporary_name`'s (of any process)."""
    return _TEMPORARY.fullmatch(name) is not None


def remove_temporaries(folder: str | Path, *, recursive: bool = False) -> list[Path]:
    """Removes the temporary files of atomic writes in ``folder`` (and below with ``recursive``) and returns them:
    only for a caller that holds the folder's lock, so that no live writer owns them (a run killed mid-write,
    by SIGKILL, the OOM killer or a power cut, left them; they are never a file's only copy)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in (folder.rglob(".*.tmp-*") if recursive else folder.glob(".*.tmp-*"))
             if is_temporary(p.name) and p.is_file() and not p.is_symlink()]
    for p in found:
        p.unlink(missing_ok=True)
    return found


def _umask() -> int:
    try:  # read, not set: setting it to read it back races with files other threads create
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(path: str | Path) -> None:
    """Adds to ``path``'s mode the bits a new file gets under the process's umask (``0o666 & ~umask``: 0644
    under the usual 022); never removes one (a default ACL's may be wider), and a file system that refuses
    ``chmod`` leaves it as it is. safetensors' ``save_file`` creates its file 0600, so a checkpoint's weights
    could be read by their owner alone (a serving container of another user could not load them)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        want = mode | (0o666 & ~_umask())
        if want != mode:
            os.chmod(path, want)
    except OSError:
        pass


def write_atomic(path: str | Path, write: Callable[[Path], object], *, fsync: bool = True) -> None:
    """Calls ``write(tmp)`` to fill a temporary file beside ``path``, makes it durable and renames it
    over ``path`` (the temporary file is removed if anything fails). The file gets the umask's mode
    (:func:`default_mode`) whatever ``write`` created it with."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        write(tmp)
        default_mode(tmp)
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """``path`` holds ``text`` (UTF-8), written atomically."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
