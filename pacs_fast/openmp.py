"""OpenMP's wait policy for the command lines (``python -m pacs_fast.train`` / ``eval``).

torch's CPU build runs its parallel regions on GNU OpenMP (libgomp), whose idle threads spin (about
300,000 iterations at every barrier) before they sleep. With one process per machine that is free;
with two CPU-heavy processes on the same cores (an evaluation beside a training run, two
experiments), each one's spinning threads take the time slices the other's working threads need,
and the small parallel regions of a tiny model's step hit a barrier every few microseconds:
measured here, two default runs side by side went from 0.45 s/step to 2-18 s/step.
``OMP_WAIT_POLICY=PASSIVE`` makes idle threads sleep at once (``bench/bench_contention.py`` has the
table). The command lines set it when the user has not (``OMP_WAIT_POLICY`` unset) and torch is not
loaded yet (libgomp reads its environment when it loads); ``PACS_FAST_OMP_WAIT_POLICY=keep`` leaves
libgomp's default. Importing the library (``import pacs_fast``) changes nothing.
"""
from __future__ import annotations

import os
import sys


def quiet_openmp_waits() -> bool:
    """Sets ``OMP_WAIT_POLICY=PASSIVE`` for this process and its children unless the user set a
    policy, opted out, or torch is already loaded. Returns whether it set it."""
    if "OMP_WAIT_POLICY" in os.environ or os.environ.get("PACS_FAST_OMP_WAIT_POLICY") == "keep":
        return False
    if "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
