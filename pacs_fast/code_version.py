"""Which pacs_fast code a run ran under, recorded in its checkpoints and ``summary.json``.

``code_version()``: ``__version__``, plus ``+g<commit>`` (and ``.dirty`` with uncommitted changes) when the
package runs from its own git checkout (an editable install); a wheel gives ``__version__`` alone. A resume
under other code than the checkpoint's says so in one line: sampling, training or a default may have changed
in between, so the steps after it need not equal an uninterrupted run under the older code (a sweep of runs
made by older versions: an 11-25 run resumed under the 11-29 code diverged from its third step, silently).
"""
from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from pacs_fast import __version__


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> subprocess.CompletedProcess:
        # no optional locks: git status may otherwise take index.lock, failing the user's own git commands meanwhile
        return subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=5, env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode or Path(top.stdout.strip()).resolve() != root:  # not pacs_fast's own checkout
            return __version__
        commit = git("rev-parse", "--short=12", "HEAD").stdout.strip()
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "pacs_fast").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return __version__
    return f"{__version__}+g{commit}" + (".dirty" if dirty else "") if commit else __version__


def resume_note(recorded: list[str] | None, now: str) -> str | None:
    """The line a resume prints when its checkpoint was written under other code (None: the same code)."""
    if recorded and recorded[-1] == now:
        return None
    was = (f"pacs_fast {recorded[-1]}" if recorded else
           "a pacs_fast that did not record its version (before 2026-11-29)")
    return (f"note: the checkpoint was written by {was} and the run continues under {now}: the steps from here may "
            f"differ from an uninterrupted run under the older code (its sampling, training or defaults may have "
            f"changed); summary.json lists the versions of the run")
