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
import time

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


def busy_cpus(sample_s: float = 0.1, *, stat_path: str = "/proc/stat") -> float:
    """CPUs other processes keep busy now: the machine's non-idle CPU time over ``sample_s`` seconds of
    ``/proc/stat`` while this process sleeps (so its own share is ~0), in CPUs. Without ``/proc/stat`` (not
    Linux): the 1-minute load average."""
    def sample():
        with open(stat_path) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle  # user nice system idle iowait irq softirq steal (guest is inside user)

    try:
        t0, i0 = sample()
        time.sleep(sample_s)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    ticks = os.sysconf("SC_CLK_TCK") * sample_s
    return max(0.0, ((t1 - t0) - (i1 - i0)) / ticks) if ticks > 0 else 0.0


def free_cpu_threads(cpus: int, busy: float) -> int:
    """Threads for a CPU job that finds ``busy`` of its ``cpus`` CPUs taken by other processes: the free ones,
    at least 1. A CPU another process keeps busy makes every parallel region wait for the thread that shares it:
    two runs side by side on 2 cores took 1.58 s/step each with a thread per core, against 0.50 (the first, 2
    threads) and 0.37 s/step (the second, 1 thread) when the second took the free core only (0.28 s/step alone;
    bench/README.md)."""
    return max(1, min(cpus, cpus - int(busy + 0.5)))


def threads_beside_other_jobs(cpus: int, *, sample_s: float = 0.1) -> tuple[int, float] | None:
    """``(threads, busy CPUs)`` when other processes keep some of this process's ``cpus`` busy and no thread
    count was chosen (``OMP_NUM_THREADS`` unset); None when nothing needs to change (all free, or chosen)."""
    if "OMP_NUM_THREADS" in os.environ or cpus <= 1:
        return None
    busy = busy_cpus(sample_s)
    n = free_cpu_threads(cpus, busy)
    return (n, busy) if n < cpus else None
