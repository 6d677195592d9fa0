"""Folders built under a temporary name, then renamed into place, in a folder several processes may fill
at once (the warmed-up model cache: runs side by side, containers and nodes sharing it).

A builder writes ``.build-<name>-<token>`` beside the final folder ``<name>`` while it holds an
exclusive ``flock`` on ``.build-<name>-<token>.lock``; the kernel drops the lock when the builder
ends, however it ends. Whether a temporary's builder is alive is whether its lock is held: unlike a
process id, that holds across PID namespaces (containers share the kernel's locks; process ids there
are other numbers, and pid 1 is alive everywhere) and across hosts where the file system supports
locks (NFS maps ``flock`` to its byte-range locks). A process id was what the cache's temporaries
carried before (``.tmp-<name>-<pid>``): a run in one container removed the temporary another container
was still writing, which then renamed a model folder without its tokenizer into the cache, and the
experiment runner waited without end on a killed container's ``.tmp-<name>-1``. Those older
temporaries are still removed when their process id is gone here.

Imports nothing from the rest of the package.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator


def _lock_of(temporary: Path) -> Path:
    return temporary.with_name(temporary.name + ".lock")


def _builder_alive(lock: Path) -> bool:
    """Whether the lock file ``lock`` is held by a process (the temporary's builder); also True where
    it cannot be told (no lock support on this file system: nothing is removed on a guess)."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held (EWOULDBLOCK), or no locks here (ENOLCK)
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def building_now(parent: str | Path, name: str) -> bool:
    """Whether a live process is building ``parent/name`` (one of its temporaries' locks is held)."""
    return any(_builder_alive(lock) for lock in Path(parent).glob(f".build-{name}-*.lock"))


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def remove_dead_builds(parent: str | Path) -> list[Path]:
    """Removes the temporaries of ``parent`` whose builder is gone (a run killed while building), and
    the older ``.tmp-<name>-<pid>`` ones whose process id is gone on this host; returns them."""
    removed = []
    for lock in Path(parent).glob(".build-*.lock"):
        if not _builder_alive(lock):
            temporary = lock.with_name(lock.name[:-len(".lock")])
            _remove(temporary)  # the folder first: a temporary without its lock file is never taken for dead
            lock.unlink(missing_ok=True)
            removed.append(temporary)
    for temporary in Path(parent).glob(".tmp-*-*"):  # made before the locks
        pid = temporary.name.rsplit("-", 1)[1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # still running (another run is writing it)
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _remove(temporary)
        removed.append(temporary)
    return removed


@contextlib.contextmanager
def build_folder(final: str | Path) -> Iterator[Path]:
    """Yields an empty temporary folder beside ``final`` to fill, holding its lock; when the block ends
    without an error the folder is renamed to ``final`` (or dropped where another process put ``final``
    in place first). On an error, the temporary folder is removed. The lock file is removed last."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = final.with_name(f".build-{final.name}-{uuid.uuid4().hex[:12]}")
    lock = _lock_of(temporary)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):  # a file system without locks: built all the same, nothing told
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        temporary.mkdir()
        try:
            yield temporary
            try:
                os.replace(temporary, final)
            except OSError:  # another process finished the same folder first
                pass
        finally:
            _remove(temporary)
    finally:
        lock.unlink(missing_ok=True)
        os.close(fd)
