"""How long idle OpenMP threads spin, for the command lines (``python -m pacs_fast.train`` / ``eval``).

torch's CPU build runs its parallel regions on GNU OpenMP (libgomp), whose idle threads spin about
300,000 iterations at every barrier before they sleep. With one process per machine that is free; with
two CPU-heavy processes on the same cores (an evaluation beside a training run, two experiments), each
one's spinning threads take the time slices the other's working threads need, and a tiny model's step
hits a barrier every few microseconds. Measured here (``bench/bench_contention.py``, 2 cores, the
default job, median s/step; the side-by-side cell is the slower run; bench/README.md):

| setting | one run | two side by side |
|---|---:|---:|
| libgomp's default (spin 300,000) | 0.26 | 2.9-16 (1.2, 4.5, 9.3, 16.0 in four tries) |
| ``GOMP_SPINCOUNT=10000`` (this module's) | 0.24 | 1.05-1.09 |
| ``GOMP_SPINCOUNT=1000`` | 0.38 | 0.50 |
| ``OMP_WAIT_POLICY=PASSIVE`` (no spin) | 0.48-0.56 | 0.41 |

So the command lines set ``GOMP_SPINCOUNT=10000`` (a one-run step as fast as the default, two runs
side by side 3-15x faster than with it), unless the user chose ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT``, or opted out with ``PACS_FAST_OMP_WAIT_POLICY=keep``, and only before torch loads
(libgomp reads its environment then). Importing the library (``import pacs_fast``) changes nothing.
"""
from __future__ import annotations

import os
import sys

SPINCOUNT = "10000"


def quiet_openmp_waits() -> bool:
    """Sets ``GOMP_SPINCOUNT`` for this process and its children unless the user set a wait policy or
    spin count, opted out, or torch is already loaded. Returns whether it set it."""
    if any(k in os.environ for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")) or \
            os.environ.get("PACS_FAST_OMP_WAIT_POLICY") == "keep":
        return False
    if "torch" in sys.modules:
        return False
    os.environ["GOMP_SPINCOUNT"] = SPINCOUNT
    return True
