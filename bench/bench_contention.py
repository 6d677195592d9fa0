"""Two CPU-heavy runs on one machine: the default training job alone and two side by side, under the
OpenMP wait policies, as a user who runs eval beside training (or two experiments) meets it.

    python bench/bench_contention.py                       # 20 steps per run, 2 rounds
    python bench/bench_contention.py --steps 12 --rounds 2 --policies default,spin10000,spin1000,PASSIVE
    python bench/bench_contention.py --policies spin10000,spin10000+t1         # also: one torch thread per run

Each cell is the median ``time/step`` of a run's steps (the first step left out) in seconds; the
side-by-side cell is the slower of the two runs. Every cell tells the trainer to set nothing itself
(``PACS_FAST_OMP_WAIT_POLICY=keep``; ``OMP_NUM_THREADS`` = torch's default, a thread per core, unless a ``tN``
part sets it or ``tauto`` leaves the choice to the trainer, which then takes only the cores it finds free at its
start, pacs_fast/openmp.py: unpinned, a side-by-side pair or any other load silently turned every cell into
``+t1``): ``default`` is libgomp's own (spin ~300k iterations at every barrier before sleeping), ``spinN`` sets
``GOMP_SPINCOUNT=N`` (the trainer's default is 10000, pacs_fast/openmp.py), ``PASSIVE`` sleeps at once.
Policies alternate within each round (A/B, B/A), medians over rounds. The built-in model's warm-up is built
once first (cached) so that no run includes it.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUIET = ["train.progress=false", "train.tensorboard=false", "train.plots=false", "train.eval_every=0",
         "train.save_every=0", "train.log_samples=0"]


def _env(policy: str) -> dict:
    """``default``: libgomp's own; ``PASSIVE`` / ``ACTIVE``: OMP_WAIT_POLICY; ``spinN``: GOMP_SPINCOUNT=N
    (idle threads spin N iterations, then sleep; libgomp's default is 300,000); ``tN``: N torch threads
    (OMP_NUM_THREADS=N; default: one per core); ``tauto``: the trainer's own choice (the cores it finds free at
    its start). Joined with ``+``: ``spin10000+t1``."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env["PACS_FAST_OMP_WAIT_POLICY"] = "keep"  # the trainer sets nothing itself: the cell's setting alone
    auto = False
    for part in policy.split("+"):
        if part.startswith("spin"):
            env["GOMP_SPINCOUNT"] = part[4:]
        elif part.startswith("t") and part[1:].isdigit():
            env["OMP_NUM_THREADS"] = part[1:]
        elif part == "tauto":
            auto = True
        elif part in ("PASSIVE", "ACTIVE"):
            env["OMP_WAIT_POLICY"] = part
        elif part != "default":
            raise SystemExit(f"unknown policy part {part!r} in {policy!r}")
    if not auto:  # (set: the trainer keeps torch's thread count)
        env.setdefault("OMP_NUM_THREADS", _default_threads())
    return env


@functools.lru_cache(maxsize=None)
def _default_threads() -> str:
    """torch's own thread count (one per core) in a process without ``OMP_NUM_THREADS``."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                          capture_output=True, text=True, check=True).stdout.split()[-1]


def _launch(out: Path, name: str, steps: int, cache: Path, policy: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pacs_fast.train", *QUIET, f"train.steps={steps}", f"train.out_dir={out}",
           f"train.run_name={name}", f"warmup.cache_dir={cache}"]
    return subprocess.Popen(cmd, env=_env(policy), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _step_time(run: Path) -> float:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = [r["time/step"] for r in recs if r.get("kind") == "train"][1:]
    return statistics.median(times) if times else float("nan")


def measure(out: Path, steps: int, cache: Path, policy: str, together: int, tag: str) -> float:
    procs = [(_launch(out, f"{tag}-{k}", steps, cache, policy), out / f"{tag}-{k}") for k in range(together)]
    for p, _ in procs:
        _, err = p.communicate(timeout=3600)
        if p.returncode:
            raise SystemExit(f"run failed: {err[-2000:]}")
    return max(_step_time(run) for _, run in procs)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--policies", default="default,PASSIVE")
    a = ap.parse_args(argv)
    policies = a.policies.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        out, cache = Path(tmp) / "runs", Path(tmp) / "cache"
        t0 = time.time()
        measure(out, 1, cache, "PASSIVE", 1, "warmup")  # builds the cached warm-up
        print(f"warm-up built in {time.time() - t0:.0f} s", flush=True)
        cells: dict[tuple[str, int], list[float]] = {}
        for r in range(a.rounds):
            order = policies if r % 2 == 0 else policies[::-1]
            for together in (1, 2):
                for policy in order:
                    t = measure(out, a.steps, cache, policy, together, f"r{r}-{policy}-{together}")
                    cells.setdefault((policy, together), []).append(t)
                    print(f"round {r}: {policy:8s} x{together}: {t:.3f} s/step", flush=True)
    print(f"\n| setting | one run (s/step) | two side by side (s/step, slower run) | slowdown |")
    print("|---|---:|---:|---:|")
    for policy in policies:
        one, two = statistics.median(cells[(policy, 1)]), statistics.median(cells[(policy, 2)])
        print(f"| {policy} | {one:.3f} | {two:.3f} | {two / one:.1f}x |")


if __name__ == "__main__":
    main()
