"""Where a warning of the kernels' layer points: the user's line, not torch's ``Function.apply`` or ours.

``warnings.warn(..., stacklevel=stacklevel())`` names the first frame outside this package's kernels,
``pacs_fast`` and ``torch`` (and the standard library's decorator helpers ``contextlib`` / ``functools``),
however deep the call came from (an op's forward, its backward under ``loss.backward()``, a learner).
Imports only the standard library.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys

_HELPERS = {os.path.abspath(m.__file__) for m in (contextlib, functools)}


def _inside(filename: str, folders: tuple[str, ...]) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(folders) or path in _HELPERS


def stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made in the function that calls this (1: that function's
    own line, when no frame outside the library is found)."""
    folders = [os.path.dirname(os.path.abspath(__file__))]
    for name in ("pacs_fast", "torch"):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            folders.append(os.path.dirname(os.path.abspath(path)))
    folders = tuple(f + os.sep for f in folders)
    frame, level = sys._getframe(1), 1
    while frame is not None and _inside(frame.f_code.co_filename, folders):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 1
