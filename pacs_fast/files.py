"""Files written atomically: a temporary file next to the target, then ``os.replace`` over it.

A reader, or a run killed mid-write, sees the old or the new file, never a cut one. Imports nothing
from the rest of the package, so every layer may use it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def write_atomic(path: str | Path, write: Callable[[Path], object], *, fsync: bool = True) -> None:
    """Calls ``write(tmp)`` to fill a temporary file beside ``path``, makes it durable and renames it
    over ``path`` (the temporary file is removed if anything fails)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """``path`` holds ``text`` (UTF-8), written atomically."""
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
