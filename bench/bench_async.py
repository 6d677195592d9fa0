"""Asynchronous rollouts vs the lock-step schedule (issue 20): wall time per training step.

    python bench/bench_async.py                 # 1 engine process + 1 learner process, K = 0 vs 1 vs 2
    python bench/bench_async.py --rounds 3 --steps 12 --extra rollout.max_new_tokens=32
    python bench/bench_async.py --ks 1 --rounds 1 --steps 3 --extra warmup.steps=0 rollout.max_new_tokens=4  # quick

Each measurement is ``torchrun --nproc_per_node 2 -m pacs_fast.train rollout.ranks=1
rollout.max_staleness=K`` on the built-in task and model (warm-up cached once, shared by every run),
``--steps`` PACS steps, 1 torch thread per process; the K values alternate round by round. Reported:
the median over rounds of each run's median ``time/step`` over steps 3.. (the first steps fill the
pipeline), and the learner's median wait for its batch (``time/rollout``). K = 0 is the synchronous
schedule on the same two processes (the engine idles while the learner trains, and the other way
round); K >= 1 lets the engine generate the next batch during the update.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import yaml


def one(out: str, name: str, k: int, steps: int, extra: list[str]) -> dict:
    args = [f"train.out_dir={out}", f"warmup.cache_dir={out}/cache", f"train.run_name={name}", f"train.steps={steps}",
            "rollout.ranks=1", f"rollout.max_staleness={k}", "train.eval_every=0", "train.save_every=0",
            "train.progress=false", "train.plots=false", "train.tensorboard=false", "data.eval_size=8",
            "rollout.eval_n=1", "train.prompts_per_step=8", "learner.mini_batch_prompts=8",
            "learner.micro_batch_prompts=8", "rollout.max_new_tokens=24", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           "-m", "pacs_fast.train", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"run {name} (rollout.max_staleness={k}) failed:\n{proc.stderr[-4000:]}")
    recs = [json.loads(x) for x in open(os.path.join(out, name, "metrics.jsonl")) if x.strip()]
    train = [r for r in recs if r["kind"] == "train"][2:]
    cfg = yaml.safe_load(open(os.path.join(out, name, "config.yaml")))
    rows = cfg["train"]["prompts_per_step"] * cfg["rollout"]["n"]
    return {"step_s": statistics.median(r["time/step"] for r in train),
            "tok_s": statistics.median(rows * r["response/length"] / r["time/step"] for r in train),
            "wait_s": statistics.median(r["time/rollout"] for r in train),
            "update_s": statistics.median(r["time/update"] for r in train),
            "staleness": max(r["rollout/staleness"] for r in train)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ks", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="steps per run, at least 3 (steps 3.. are measured)")
    ap.add_argument("--extra", nargs="*", default=[], help="more config overrides (section.key=value) for every run")
    a = ap.parse_args()
    if a.steps < 3 or a.rounds < 1:
        ap.error("--steps: at least 3 (the first two fill the pipeline and are not measured); --rounds: at least 1")
    ks = [int(k) for k in a.ks.split(",")]
    out = tempfile.mkdtemp(prefix="bench_async_")
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    runs: dict[int, list[dict]] = {k: [] for k in ks}
    for r in range(a.rounds):
        for k in (ks if r % 2 == 0 else ks[::-1]):
            runs[k].append(one(out, f"k{k}_r{r}", k, a.steps, a.extra))
    base = statistics.median(x["step_s"] for x in runs[ks[0]])
    print(f"asynchronous rollouts, 1 engine + 1 learner process (CPU, 1 thread each), {a.steps} steps, "
          f"median of {a.rounds} runs of the median over steps 3..")
    print(f"| rollout.max_staleness | s / step | steps / s vs K={ks[0]} | rollout tokens / s | learner's wait for "
          f"rollouts (s) | update (s) | max staleness |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for k in ks:
        med = {key: statistics.median(x[key] for x in runs[k]) for key in ("step_s", "tok_s", "wait_s", "update_s")}
        print(f"| {k} | {med['step_s']:.3f} | {base / med['step_s']:.2f}x | {med['tok_s']:.0f} | {med['wait_s']:.3f} | "
              f"{med['update_s']:.3f} | {max(x['staleness'] for x in runs[k])} |")


if __name__ == "__main__":
    main()
