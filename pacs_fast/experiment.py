"""Seed-paired comparisons of algorithms: runs arms x seeds of ``python -m pacs_fast.train`` in
subprocesses and writes a table and curves.

    python -m pacs_fast.experiment --out docs/efficacy/main --arms pacs,pacs_noweight,grpo,rloo,dr_grpo,ppo \\
        --seeds 0-4 --baseline grpo --config configs/arith_hard.yaml train.steps=150
    python -m pacs_fast.experiment --out exp --arm "pacs_bwd:algo.name=pacs,algo.noise_correction=backward" ...
    python -m pacs_fast.experiment --out docs/efficacy/main --report     # table + plots from what finished

Arms: a built-in name (``pacs``, ``pacs_noweight`` = PACS with ``algo.weight=none``, ``grpo``,
``rloo``, ``dr_grpo``, ``ppo``) or ``NAME:key=value,key=value`` (overrides on top of the common
ones; split on the commas outside brackets, so ``learner.betas=[0.9,0.95]`` is one value).
Every run of seed ``s`` sets ``train.seed=s`` and ``warmup.seed=s``: the arms of one seed share one
warmed-up model (built once, by the first run of that seed, before the others of that
seed start) and the same held-out problems, so differences between arms pair up by seed. An arm
with ``rollout.ranks=R`` (asynchronous rollouts) runs under torchrun with its R engine processes and
the learner's (``--workers`` counts runs, not processes).

Resumable: run ``<out>/runs/<arm>/seed<s>`` is skipped when it has ``summary.json`` (of the ``train.steps`` its
``config.yaml`` records: a finished run resumed by hand with more steps and stopped is not done); a run with a
checkpoint but no summary is resumed (``--resume``, which continues exactly); one without a
checkpoint is restarted from scratch. A run folder whose ``config.yaml`` differs from the config the
spec asks for is an error (never silently mixed); ``--restart-mismatched`` deletes and reruns it. Settings that
change nothing a run reports (:data:`RERUN_KEYS`: trackers, logged samples, checkpoints' spacing and count, reward
workers and timeout, activation recompute, ...) may change between runner calls: a run still to finish resumes
with the new values, a finished one is kept (one note line); a resumed run keeps its thread count.

One runner per ``<out>`` at a time: the runner holds the trainer's run lock (:class:`RunLock`) on
``<out>/.run.lock`` while it works, and checks the lock of every run folder before it touches any;
a second runner, or a live run in one of the folders, is refused (exit status 2, nothing changed).
A run folder is deleted only when it is provably this experiment's own dead run: its lock is free
and its ``config.yaml`` is the one the spec asks for (or, with ``--restart-mismatched``, another);
a folder with files but no ``config.yaml``, or with an empty or unreadable one, is refused. The runner sets
``train.seed``, ``warmup.seed``, ``train.out_dir``, ``train.run_name``, ``train.threads`` and
``train.tracker_group`` (the arm's name: its tracker runs are ``<arm>-seed<k>``, grouped by arm) itself; giving
them as overrides or in ``--config`` is an error (use ``--seeds``, ``--out``, ``--threads``, ``--arm``). A
finished run whose files are damaged (``summary.json`` unreadable, its step-0 or final evaluation missing from
``metrics.jsonl``) is named above the tables and left out of them. Exit status: 0 when every run finished,
1 when one failed or is damaged (after the report is written; when none finished, the folder's results are
left as they were), when the report's files cannot be written (the table is printed all the same) or, with
``--report``, when none has finished yet (nothing written), 2 for bad arguments or a refused folder.

Outputs (written atomically): ``<out>/results.md`` (final and best held-out accuracy, mean ± std
over seeds; paired differences against ``--baseline`` with a bootstrap 95% interval over seeds),
``<out>/results.json`` (every number, per seed), ``<out>/curves.png`` (held-out accuracy against
step, mean with a ±1 std band per arm).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from pacs_fast.experiment_args import (MAX_SEEDS, PRESETS, Arm, check_resources, parse_args,  # noqa: F401 (API)
                                       config_file_keys, parse_arm, parse_arms, parse_seeds, settings_from_spec,
                                       spec_defaults)
from pacs_fast.experiment_folders import (RERUN_KEYS, Job, config_differences, config_takes,  # noqa: F401 (API)
                                          intended_config, job_state, plan, processes, rerun_changes, take_lock)
from pacs_fast.experiment_results import (ReportNotWritten, bootstrap_ci, collect, finished, report,  # noqa: F401
                                          table)
from pacs_fast import signals
from pacs_fast.files import write_text_atomic

QUIET = ["train.progress=false", "train.tensorboard=false", "train.plots=false"]  # defaults: the user's win


# ----------------------------------------------------------------------------- spec
def make_jobs(arms: list[Arm], seeds: list[int], common: list[str], out: Path, config: str | None = None) -> list[Job]:
    """The runs of ``arms`` x ``seeds`` into ``out`` (``config``: the ``--config`` file, whose settings the quiet
    defaults yield to, as they yield to the overrides)."""
    given = config_file_keys(config)
    quiet = [q for q in QUIET if q.partition("=")[0] not in given]  # (a file's train.plots: true had been dropped)
    jobs = []
    for s in seeds:  # seed-major: the first job of a seed builds its warm-up
        for arm in arms:
            run_dir = out / "runs" / arm.name / f"seed{s}"
            argv = [*quiet, *common, *arm.overrides, f"train.seed={s}", f"warmup.seed={s}",
                    f"train.out_dir={run_dir.parent}", f"train.run_name={run_dir.name}",
                    f"train.tracker_group={arm.name}"]
            jobs.append(Job(arm, s, run_dir, argv))
    return jobs


# ----------------------------------------------------------------------------- running
def command(job: Job, config: str | None, state: str) -> list[str]:
    """``python -m pacs_fast.train ...``, or under ``torchrun --standalone`` for an asynchronous run."""
    n = processes(intended_config(config, job.argv))
    launch = [sys.executable, "-m", "pacs_fast.train"]
    if n > 1:  # --standalone: torchrun binds its store to a port it picks, so runs side by side never collide
        launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", "--standalone",
                  "-m", "pacs_fast.train"]
    if state == "resume":  # (JSON is YAML: lists, strings and null pass as the override's value; ensure_ascii
        # off: YAML read an escaped character outside the BMP as two lone surrogates)
        return launch + ["--resume", str(job.run_dir)] + [f"{k}={json.dumps(v[1], ensure_ascii=False)}"
                                                           for k, v in rerun_changes(job, config).items()]
    return launch + (["--config", config] if config else []) + job.argv


def warm_state(job: Job, config: str | None) -> str:
    """``ready`` (the seed's warmed-up model is cached: runs of that seed may start together),
    ``building`` (another process is building it: wait) or ``missing``."""
    cfg = intended_config(config, job.argv)
    if cfg.model.path:
        return "ready"
    from pacs_fast.folder_build import building_now
    from pacs_fast.trainer.warmup import cache_root, is_complete, warmup_key
    root, key = cache_root(cfg) / "warmup", warmup_key(cfg)
    if is_complete(root / key):
        return "ready"
    # a live builder holds its temporary's lock (a killed one's, in any container, is released)
    return "building" if building_now(root, key) else "missing"


STOP_GRACE_S = 60.0  # a run stopped by the runner closes its engine and workers; then it is killed


def stop_runs(procs: list, log=print) -> None:
    """Sends SIGTERM to each running trainer (it stops as on Ctrl-C; torchrun passes it on to its ranks), waits
    up to :data:`STOP_GRACE_S`, then kills what is left: none is left running on its own (a SIGTERM to the
    runner used to orphan its trainer, which went on holding its run folder's lock)."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        p.send_signal(signal.SIGTERM)
    deadline = time.time() + STOP_GRACE_S
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if live:
        log(f"stopped {len(live)} run(s); the same command resumes them")


def run_jobs(todo: list[tuple[Job, str]], config: str | None, *, workers: int, threads: int, log=print,
             timeout: float | None = None) -> dict[str, int]:
    """Runs the planned ``(job, state)`` pairs (see :func:`plan`), ``workers`` at a time, each killed
    after ``timeout`` seconds (None: no limit); returns how many finished and failed."""
    counts = {"finished": 0, "failed": 0}
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1", signals.RUNNER_PID_VAR: str(os.getpid())}  # (a trainer dies with the runner)
    die_with_me = signals.stop_with_this_process()  # a torchrun too stops when the runner is killed with -9
    running: list[tuple[Job, subprocess.Popen, float, object]] = []
    building: set[int] = set()  # seeds whose warm-up one running job is building
    stopped: dict[int, float] = {}  # pid -> when --timeout stopped it (SIGTERM: the trainer's clean stop; then SIGKILL)
    try:
        while todo or running:
            for job, proc, t0, fh in list(running):
                if proc.poll() is None:
                    if timeout and time.time() - t0 > timeout and proc.pid not in stopped:
                        stopped[proc.pid] = time.time()
                        fh.write(f"pacs_fast.experiment: stopping this run: --timeout {timeout:g} s reached\n")
                        fh.flush()
                        proc.terminate()
                    elif proc.pid in stopped and time.time() - stopped[proc.pid] > 30:
                        proc.kill()
                    continue
                fh.close()
                running.remove((job, proc, t0, fh))
                building.discard(job.seed)
                # finished = its summary.json written for its train.steps (the run's last file; the exit status
                # after it, e.g. a --timeout stop during its exit, changes nothing: the end-of-run check counts the
                # same way; a resumed extension that failed left an older summary: not finished, experiment_results)
                ok = finished(job.run_dir)
                counts["finished" if ok else "failed"] += 1
                why = f"timed out after --timeout {timeout:g} s, " if proc.pid in stopped else ""
                late = f" (exit {proc.returncode} after its summary: {why or 'see the log, '}nothing lost)" \
                    if ok and proc.returncode != 0 else ""
                log(f"[{time.strftime('%H:%M:%S')}] {job.arm.name} seed {job.seed}: "
                    f"{'done' + late if ok else f'FAILED ({why}exit {proc.returncode}; see {job.run_dir}.log)'} "
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
                fh.write(f"$ {shlex.join(cmd)}\n")
                fh.flush()
                proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_me)
                running.append((job, proc, time.time(), fh))
                log(f"[{time.strftime('%H:%M:%S')}] start {job.arm.name} seed {job.seed} ({state})")
            time.sleep(0.5)
    except BaseException:  # Ctrl-C, SIGTERM / SIGHUP (pacs_fast/signals.py): the runs started stop too
        stop_runs([proc for _, proc, _, _ in running], log)
        raise
    return counts


# ----------------------------------------------------------------------------- CLI
def main(argv=None) -> int:
    a = parse_args(argv, description=(__doc__ or "").split("\n\n")[0])  # None under python -OO
    try:
        return _main(a)
    except KeyboardInterrupt:
        return _stopped(signal.SIGINT)
    except signals.Stopped as e:
        return _stopped(e.signum)


def _stopped(signum: int) -> int:
    print(f"stopped by {signals.name(signum)}: run the same command again to resume", file=sys.stderr, flush=True)
    return signals.exit_status(signum)


def _main(a) -> int:
    try:  # every argument error here, before anything is written or started
        arms = settings_from_spec(a) if a.report and not (a.arms.strip() or a.arm) else parse_arms(a)
        if a.report and (Path(a.out) / "spec.json").is_file():  # the recorded seeds and baseline, unless given
            spec_defaults(a, arms)
        check_resources(a)
        seeds = parse_seeds("0-4" if a.seeds is None else a.seeds)
        out = Path(a.out)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {str(out)!r} is a file, not a folder")
        jobs = make_jobs(arms, seeds, [*a.overrides, f"train.threads={a.threads}"], out, a.config)
        checked = set()
        for job in jobs:  # bad settings fail here, naming the arm whose settings make them bad (one seed per arm:
            if job.arm.name in checked:  # the seeds change no check, and 1000 seeds took 35 s)
                continue
            checked.add(job.arm.name)
            try:
                cfg = intended_config(a.config, job.argv)
            except ValueError as e:
                if str(e).startswith("train.out_dir "):  # (the runner's key: the user's is --out)
                    if a.report:  # a read-only folder: the table is printed, not written
                        continue
                    why = re.search(r"\((.*)\); choose", str(e))  # (paths.py's: the mount's or permission's words)
                    raise ValueError(f"--out {str(out)!r} cannot hold the runs' folders ("
                                     f"{why.group(1) if why else e}); choose another --out") from None
                shared = [x for x in job.argv if x not in job.arm.overrides]
                if job.arm.overrides and config_takes(a.config, shared):
                    raise ValueError(f"arm {job.arm.name} ({','.join(job.arm.overrides)}): {e}") from None
                raise
            if not a.report:  # a tracker that cannot start (W&B without a login): said before any run starts
                from pacs_fast.trainer.trackers import check_trackers
                check_trackers(cfg)
        if a.report and not any(job.run_dir.is_dir() for job in jobs):
            what = "holds no runs of these arms and seeds" if out.is_dir() else "does not exist"
            raise ValueError(f"--report: {str(out)!r} {what} (nothing was written)")
        for job in jobs if a.report else []:  # a table of these settings holds only runs made with them
            state = job_state(job, a.config)
            if state.startswith("mismatch:"):
                raise ValueError(f"--report: {job.run_dir} was made with other settings ({state[9:]}): give the "
                                 f"settings it ran with, or --report alone (spec.json's) (nothing was written)")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    header = a.title or f"# Experiment {out.name}"
    header += ("\n\nCommon settings: " + (f"`--config {a.config}` " if a.config else "")
               + " ".join(f"`{o}`" for o in a.overrides) + f"; seeds {seeds}.")
    header += "\n\nArms: " + "; ".join(f"{arm.name}: " + (" ".join(f"`{o}`" for o in arm.overrides) or "the common "
                                                         "settings alone") for arm in arms) + "."
    if a.report:  # reads finished runs only: fine beside a live runner
        if not collect(jobs):  # an empty table would replace the folder's results.md
            print(f"error: --report: no run of these arms and seeds in {str(out)!r} has finished yet (summary.json "
                  "and held-out evaluations); exit status 1, nothing was written", file=sys.stderr)
            return 1
        return _print_report(jobs, arms, a.baseline, out, header)
    try:
        lock = take_lock(out, "--out")  # held to the end: one runner per folder
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from pacs_fast.files import remove_temporaries
    remove_temporaries(out)  # a killed runner's (.results.md.tmp-PID), stale under this lock
    try:
        return run_experiment(a, jobs, arms, seeds, out, header)
    finally:
        lock.release()


def run_experiment(a, jobs: list[Job], arms: list[Arm], seeds: list[int], out: Path, header: str) -> int:
    """Plans (any refusal: exit status 2, nothing changed), records ``spec.json``, runs, reports;
    exit status 1 when a run failed."""
    try:
        todo, done = plan(jobs, a.config, restart_mismatched=a.restart_mismatched)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    spec = {"arms": {x.name: x.overrides for x in arms}, "seeds": seeds,
            "config": str(Path(a.config).resolve()) if a.config else None,  # (a relative one broke --report elsewhere)
            "overrides": list(a.overrides), "baseline": a.baseline}
    write_text_atomic(out / "spec.json", json.dumps(spec, indent=1))
    counts = run_jobs(todo, a.config, workers=a.workers, threads=a.threads, timeout=a.timeout)
    print(f"runs: {done} already done, {counts['finished']} finished now, {counts['failed']} failed", flush=True)
    damaged: dict = {}
    res = collect(jobs, damaged)  # (read once: the report takes them)
    status = 0
    if not res:  # an empty table would replace the folder's results.md (another command's, say)
        print("error: no run of these arms and seeds has finished: no table (results.md, results.json and "
              "curves.png are left as they were)", file=sys.stderr, flush=True)
        status = 1
    else:
        status = _print_report(jobs, arms, a.baseline, out, header, (res, damaged))
    failed = [job for job in jobs if job.seed not in res.get(job.arm.name, {})]
    if failed:
        logs = ", ".join(f"{job.run_dir}.log" for job in failed[:3]) + (", ..." if len(failed) > 3 else "")
        print(f"error: {len(failed)} of {len(jobs)} runs failed or are damaged (see {logs} and the report); exit "
              f"status 1", file=sys.stderr)
        return 1
    return status


def _print_report(jobs: list[Job], arms: list[Arm], baseline: str | None, out: Path, header: str,
                  collected: tuple[dict, dict] | None = None) -> int:
    """Prints the report; 0, or 1 with one error line when its files could not be written (printed all the same)."""
    try:
        print(report(jobs, arms, baseline, out, header, collected), flush=True)
    except ReportNotWritten as e:
        print(e.md, flush=True)
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    signals.raise_on_stop_signals()
    sys.exit(main())
