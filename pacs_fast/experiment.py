"""Seed-paired comparisons of algorithms: runs arms x seeds of ``python -m pacs_fast.train`` in
subprocesses and writes a table and curves.

    python -m pacs_fast.experiment --out docs/efficacy/main --arms pacs,pacs_noweight,grpo,rloo,dr_grpo,ppo \\
        --seeds 0-4 --baseline grpo --config configs/arith_hard.yaml train.steps=150
    python -m pacs_fast.experiment --out exp --arm "pacs_bwd:algo.name=pacs,algo.noise_correction=backward" ...
    python -m pacs_fast.experiment --out docs/efficacy/main --report     # table + plots from what finished

Arms: a built-in name (``pacs``, ``pacs_noweight`` = PACS with ``algo.weight=none``, ``grpo``,
``rloo``, ``dr_grpo``, ``ppo``) or ``NAME:key=value,key=value`` (overrides on top of the common
ones). Every run of seed ``s`` sets ``train.seed=s`` and ``warmup.seed=s``: the arms of one seed
share one warmed-up model (built once, by the first run of that seed, before the others of that
seed start) and the same held-out problems, so differences between arms pair up by seed. An arm
with ``rollout.ranks=R`` (asynchronous rollouts) runs under torchrun with its R engine processes and
the learner's (``--workers`` counts runs, not processes).

Resumable: run ``<out>/runs/<arm>/seed<s>`` is skipped when it has ``summary.json``; a run with a
checkpoint but no summary is resumed (``--resume``, which continues exactly); one without a
checkpoint is restarted from scratch. A run folder whose ``config.yaml`` differs from the config the
spec asks for is an error (never silently mixed); ``--restart-mismatched`` deletes and reruns it.

Outputs (written atomically): ``<out>/results.md`` (final and best held-out accuracy, mean ± std
over seeds; paired differences against ``--baseline`` with a bootstrap 95% interval over seeds),
``<out>/results.json`` (every number, per seed), ``<out>/curves.png`` (held-out accuracy against
step, mean with a ±1 std band per arm).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pacs_fast.experiment_results import bootstrap_ci, report, table  # noqa: F401 (the runner's API)
from pacs_fast.files import write_text_atomic

PRESETS = {
    "pacs": ["algo.name=pacs"],
    "pacs_noweight": ["algo.name=pacs", "algo.weight=none"],
    "grpo": ["algo.name=grpo"],
    "rloo": ["algo.name=rloo"],
    "dr_grpo": ["algo.name=dr_grpo"],
    "ppo": ["algo.name=ppo"],
}
QUIET = ["train.progress=false", "train.tensorboard=false", "train.plots=false"]


@dataclass
class Arm:
    name: str
    overrides: list[str]


@dataclass
class Job:
    arm: Arm
    seed: int
    run_dir: Path
    argv: list[str]   # config overrides of this run (besides --config)


# ----------------------------------------------------------------------------- spec
MAX_SEEDS = 1000  # runs of one experiment; more is a typo (each seed is len(arms) training runs)


def parse_seeds(text: str) -> list[int]:
    """``"0-4"`` -> [0, 1, 2, 3, 4]; ``"0,3,7"`` -> [0, 3, 7]. Seeds are integers >= 0, at most
    :data:`MAX_SEEDS` of them; anything else is a ValueError naming ``--seeds``."""
    usage = f"--seeds {text!r}: give distinct integers >= 0 as a range or a list (e.g. 0-4 or 0,1,2)"
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, dash, hi = part.partition("-")
        if not lo.strip().isdigit() or (dash and not hi.strip().isdigit()):
            raise ValueError(usage)
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a:
            raise ValueError(f"{usage}; {part!r} runs backwards")
        if len(out) + b - a + 1 > MAX_SEEDS:
            raise ValueError(f"--seeds {text!r} asks for more than {MAX_SEEDS} seeds")
        out.extend(range(a, b + 1))
    if not out or len(set(out)) != len(out):
        raise ValueError(usage)
    return out


def parse_arm(text: str) -> Arm:
    """A preset name, or ``NAME:key=value,key=value``."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"arm {text!r}: the name must be letters, digits, '_' or '-'")
    if not sep:
        if name not in PRESETS:
            raise ValueError(f"arm {name!r} is not a preset ({', '.join(PRESETS)}); give NAME:key=value,...")
        return Arm(name, list(PRESETS[name]))
    overrides = [o.strip() for o in rest.split(",") if o.strip()]
    for o in overrides:
        if "=" not in o:
            raise ValueError(f"arm {name!r}: override {o!r} must look like section.key=value")
    return Arm(name, overrides)


def make_jobs(arms: list[Arm], seeds: list[int], common: list[str], out: Path) -> list[Job]:
    jobs = []
    for s in seeds:  # seed-major: the first job of a seed builds its warm-up
        for arm in arms:
            run_dir = out / "runs" / arm.name / f"seed{s}"
            argv = [*common, *QUIET, *arm.overrides, f"train.seed={s}", f"warmup.seed={s}",
                    f"train.out_dir={run_dir.parent}", f"train.run_name={run_dir.name}"]
            jobs.append(Job(arm, s, run_dir, argv))
    return jobs


def processes(cfg) -> int:
    """Processes of one run: 1, or with ``rollout.ranks=R`` (asynchronous rollouts) R engine
    processes and the learner's (1, or ``learner.tp_size`` for megatron), launched by torchrun."""
    if not cfg.rollout.ranks:
        return 1
    return cfg.rollout.ranks + (cfg.learner.tp_size if cfg.learner.backend == "megatron" else 1)


def intended_config(config: str | None, argv: list[str]):
    from pacs_fast.config import load_config, validate
    cfg = load_config(config, argv)
    validate(cfg, world=processes(cfg))
    return cfg


def config_differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = sorted(set(a) | set(b))
    out = []
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += config_differences(va, vb, f"{prefix}{k}.")
        elif va != vb:
            out.append(f"{prefix}{k}: {vb!r} in the folder, {va!r} asked for")
    return out


def job_state(job: Job, config: str | None) -> str:
    """``done`` | ``resume`` | ``fresh`` | ``mismatch:<why>``."""
    from pacs_fast.config import load_config, to_dict
    if not job.run_dir.exists():
        return "fresh"
    saved = job.run_dir / "config.yaml"
    if saved.is_file():
        want = to_dict(intended_config(config, job.argv))
        have = to_dict(load_config(saved))
        for d in (want, have):  # where the folder lives and the thread count are not the experiment's settings
            d["train"].pop("out_dir", None)
            d["train"].pop("threads", None)
        diff = config_differences(want, have)
        if diff:
            return "mismatch:" + "; ".join(diff[:4])
    if (job.run_dir / "summary.json").is_file():
        return "done"
    ckpts = job.run_dir / "checkpoints"
    if ckpts.is_dir() and any(ckpts.glob("step_*")):
        return "resume"
    return "fresh"


# ----------------------------------------------------------------------------- running
def command(job: Job, config: str | None, state: str) -> list[str]:
    """``python -m pacs_fast.train ...``, or under torchrun (a free port) for an asynchronous run."""
    n = processes(intended_config(config, job.argv))
    launch = [sys.executable, "-m", "pacs_fast.train"]
    if n > 1:
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", f"--master_port={port}",
                  "-m", "pacs_fast.train"]
    if state == "resume":
        return launch + ["--resume", str(job.run_dir)]
    return launch + (["--config", config] if config else []) + job.argv


def warm_state(job: Job, config: str | None) -> str:
    """``ready`` (the seed's warmed-up model is cached: runs of that seed may start together),
    ``building`` (another process is building it: wait) or ``missing``."""
    cfg = intended_config(config, job.argv)
    if cfg.model.path:
        return "ready"
    from pacs_fast.trainer.warmup import cache_root, warmup_key
    root, key = cache_root(cfg) / "warmup", warmup_key(cfg)
    if (root / key / "model.safetensors").exists():
        return "ready"
    for tmp in root.glob(f".tmp-{key}-*"):  # named by the building process's id
        try:
            os.kill(int(tmp.name.rsplit("-", 1)[1]), 0)
            return "building"
        except (ValueError, ProcessLookupError):
            continue  # left by a process that died
        except PermissionError:
            return "building"
    return "missing"


def run_all(jobs: list[Job], config: str | None, *, workers: int, threads: int, restart_mismatched: bool,
            log=print, timeout: float | None = None) -> dict[str, int]:
    """Runs what is not finished, ``workers`` at a time; returns counts by outcome."""
    todo: list[tuple[Job, str]] = []
    counts = {"done_before": 0, "finished": 0, "failed": 0}
    for job in jobs:
        state = job_state(job, config)
        if state.startswith("mismatch:"):
            if not restart_mismatched:
                raise ValueError(f"{job.run_dir} was made with other settings ({state[9:]}); use another --out, "
                                 f"or --restart-mismatched to delete and rerun it")
            shutil.rmtree(job.run_dir)
            state = "fresh"
        if state == "done":
            counts["done_before"] += 1
            continue
        if state == "fresh" and job.run_dir.exists():  # started, no checkpoint: restart, never mix
            shutil.rmtree(job.run_dir)
        todo.append((job, state))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1"}
    running: list[tuple[Job, subprocess.Popen, float, object]] = []
    building: set[int] = set()  # seeds whose warm-up one running job is building
    while todo or running:
        for job, proc, t0, fh in list(running):
            if proc.poll() is None:
                if timeout and time.time() - t0 > timeout:
                    proc.kill()
                continue
            fh.close()
            running.remove((job, proc, t0, fh))
            building.discard(job.seed)
            ok = proc.returncode == 0 and (job.run_dir / "summary.json").is_file()
            counts["finished" if ok else "failed"] += 1
            log(f"[{time.strftime('%H:%M:%S')}] {job.arm.name} seed {job.seed}: "
                f"{'done' if ok else f'FAILED (exit {proc.returncode}; see {job.run_dir}.log)'} "
                f"in {time.time() - t0:.0f} s")
        while todo and len(running) < workers:
            pick = None
            for i, (job, state) in enumerate(todo):
                if job.seed in building:
                    continue
                warm = "ready" if state == "resume" else warm_state(job, config)
                if warm == "ready":
                    pick = i
                    break
                if warm == "missing" and not any(j.seed == job.seed for j, *_ in running):
                    pick = i
                    building.add(job.seed)
                    break
            if pick is None:
                break
            job, state = todo.pop(pick)
            job.run_dir.parent.mkdir(parents=True, exist_ok=True)
            fh = open(f"{job.run_dir}.log", "a")
            cmd = command(job, config, state)
            fh.write(f"$ {' '.join(cmd)}\n")
            fh.flush()
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
            running.append((job, proc, time.time(), fh))
            log(f"[{time.strftime('%H:%M:%S')}] start {job.arm.name} seed {job.seed} ({state})")
        time.sleep(0.5)
    return counts


# ----------------------------------------------------------------------------- CLI
def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m pacs_fast.experiment", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="experiment folder (runs/, results.md, results.json, curves.png)")
    p.add_argument("--arms", default="", help=f"comma-separated presets ({', '.join(PRESETS)})")
    p.add_argument("--arm", action="append", default=[], help="NAME:key=value,key=value (repeatable)")
    p.add_argument("--seeds", default="0-4", help="e.g. 0-4 or 0,2,5")
    p.add_argument("--baseline", default=None, help="arm the others are compared with (paired by seed)")
    p.add_argument("--config", default=None, help="YAML config common to every run")
    p.add_argument("--workers", type=int, default=1, help="runs at a time")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--timeout", type=float, default=0, help="kill a run after this many seconds (0 = never)")
    p.add_argument("--report", action="store_true", help="only write the table and plots from finished runs")
    p.add_argument("--restart-mismatched", action="store_true",
                   help="delete and rerun run folders made with other settings")
    p.add_argument("--title", default="", help="first line of results.md")
    p.add_argument("overrides", nargs="*", help="section.key=value for every run")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        arms = [parse_arm(x) for x in a.arms.split(",") if x.strip()] + [parse_arm(x) for x in a.arm]
        if not arms:
            raise ValueError("no arms: give --arms and/or --arm")
        if len({x.name for x in arms}) != len(arms):
            raise ValueError("arm names must be distinct")
        if a.baseline and a.baseline not in {x.name for x in arms}:
            raise ValueError(f"--baseline {a.baseline!r} is not one of the arms")
        if a.workers < 1 or a.threads < 1:
            raise ValueError("--workers and --threads must be >= 1")
        from pacs_fast.reward.batch import usable_cpus
        cpus = usable_cpus()
        if a.threads > cpus:
            raise ValueError(f"--threads {a.threads} (per run) is more than the {cpus} CPUs this process may use")
        seeds = parse_seeds(a.seeds)
        out = Path(a.out)
        jobs = make_jobs(arms, seeds, [*a.overrides, f"train.threads={a.threads}"], out)
        for job in jobs:  # bad settings fail here, before any run starts
            intended_config(a.config, job.argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    spec = {"arms": {x.name: x.overrides for x in arms}, "seeds": seeds, "config": a.config,
            "overrides": list(a.overrides), "baseline": a.baseline}
    write_text_atomic(out / "spec.json", json.dumps(spec, indent=1))
    header = a.title or f"# Experiment {out.name}"
    header += ("\n\nCommon settings: " + (f"`--config {a.config}` " if a.config else "")
               + " ".join(f"`{o}`" for o in a.overrides) + f"; seeds {seeds}.")
    if not a.report:
        try:
            counts = run_all(jobs, a.config, workers=a.workers, threads=a.threads,
                             restart_mismatched=a.restart_mismatched, timeout=a.timeout or None)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"runs: {counts['done_before']} already done, {counts['finished']} finished now, "
              f"{counts['failed']} failed", flush=True)
    print(report(jobs, arms, a.baseline, out, header))
    return 0


if __name__ == "__main__":
    sys.exit(main())
