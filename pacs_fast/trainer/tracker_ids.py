"""``trackers.json`` in a run folder: the tracker run ids a ``--resume`` continues (written by
:func:`pacs_fast.trainer.trackers.open_trackers`), and the ids set aside (``<name>_earlier_runs``) for runs that lack
steps: a tracker gone off mid-run (:class:`pacs_fast.trainer.metrics.MetricsLogger`) or left out of a resumed
session. Apart from the trackers so that the metrics logger, which they import, reads and writes it too."""
from __future__ import annotations

import json
from pathlib import Path

from pacs_fast.files import write_text_atomic

IDS_FILE = "trackers.json"


def set_aside(ids: dict, name: str) -> None:
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
        ids = read_ids(path)
    except ValueError:  # (damaged by hand: the resume names it)
        return
    if isinstance(ids.get(name), str):
        set_aside(ids, name)
        write_text_atomic(path, json.dumps(ids, indent=1))


def read_ids(path: Path) -> dict:
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
