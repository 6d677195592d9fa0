"""One run per run folder, and a metrics log that survives a torn last line (issue 23, findings 1-2).

- Two runs started together with one ``train.run_name``: exactly one trains, the other is refused
  with one line before any model work (the folder is claimed with an exclusive lock, then checked).
- ``--resume`` of a folder whose run is still alive is refused; a killed run's folder resumes.
- ``--resume`` after ``metrics.jsonl`` was cut mid-line: the resume marker starts a line of its own,
  so the killed run's records after the checkpoint are superseded and every step is read once.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pacs_fast.trainer.metrics import end_torn_line, read_jsonl
from pacs_fast.trainer.run_folder import RunLock

from test_run_safety import cache, cli, copy_run, finished  # noqa: F401  (fixtures)
from test_train import TINY

ROOT = Path(__file__).resolve().parent.parent


def test_two_runs_started_together_with_one_name(tmp_path, warm_cache):
    args = [sys.executable, "-m", "pacs_fast.train", *TINY, "train.steps=1", f"warmup.cache_dir={warm_cache}",
            f"train.out_dir={tmp_path}", "train.run_name=same", "train.eval_every=0"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    subprocess.run(args[:-2] + [f"train.out_dir={tmp_path / 'warm'}", "train.run_name=warm"], env=env, check=True,
                   capture_output=True, timeout=300)  # the warm-up is cached; both racers start from it
    procs = [subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    err = next(e for code, e in results if code == 2).strip()
    assert err.count("\n") == 0 and ("in use by another run" in err or "already exists" in err), err
    records = read_jsonl(tmp_path / "same" / "metrics.jsonl", raw=True)
    assert [r["kind"] for r in records].count("train") == 1  # one writer: one train record, one step-0 eval
    assert [(r["kind"], r["step"]) for r in records if r["kind"] == "eval"][0] == ("eval", 0)
    assert len([r for r in records if r["kind"] == "eval" and r["step"] == 0]) == 1


def test_resume_of_a_live_run_is_refused(finished, tmp_path, capsys):  # noqa: F811
    run = copy_run(finished, tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".run.lock"}
    lock = RunLock(run, new=False)  # the "live" run (another open file description than the resume's)
    try:
        code, _, err = cli(["--resume", str(run), "train.steps=5"], capsys)
    finally:
        lock.release()
    assert code == 2 and "in use by another run" in err and f"pid {os.getpid()}" in err and err.count("\n") == 1
    assert "stop it first" in err and "train.run_name" not in err  # (a resume's folder is given: no other name)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".run.lock"} == before
    code, _, err = cli(["--resume", str(run), "train.steps=5"], capsys)  # the owner is gone: it resumes
    assert code == 0, err


def test_resume_after_a_torn_metrics_line_reads_every_step_once(finished, tmp_path, capsys):  # noqa: F811
    run = copy_run(finished, tmp_path)
    shutil.rmtree(run / "checkpoints" / "step_000004")  # killed after step 4's records, before its checkpoint
    log = run / "metrics.jsonl"
    text = log.read_text()
    log.write_text(text[:-len(text.splitlines()[-1]) // 2 - 1])  # the last record cut mid-line
    assert not log.read_text().endswith("\n")
    code, _, err = cli(["--resume", str(run)], capsys)
    assert code == 0, err
    raw = log.read_text().splitlines()
    assert {"kind": "resume", "step": 2} in [json.loads(line) for line in raw if line.startswith('{"kind": "resume"')]
    steps = [r["step"] for r in read_jsonl(log) if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4]  # today's bug: the marker joined the torn line and steps 3-4 came twice
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval_step"] == 4


def test_end_torn_line(tmp_path):
    p = tmp_path / "m.jsonl"
    assert not end_torn_line(p)  # no file
    p.write_text('{"a": 1}\n')
    assert not end_torn_line(p) and p.read_text() == '{"a": 1}\n'
    p.write_text('{"a": 1}\n{"b": ')
    assert end_torn_line(p) and p.read_text() == '{"a": 1}\n{"b": \n'


def test_a_lock_taken_on_an_abandoned_lock_file_is_taken_again(tmp_path):
    """A failed new run removes its folder (``RunFolder.close(abandon=True)``), unlinking the lock file before
    it lets go. A run that had opened that file just before took the lock on a file no longer there and went
    on, and a third run of the same name got a lock as well (review of 2026-11-30). Now a lock is taken on the
    file at the path: the late run's lock is the one the third run finds taken."""
    import fcntl
    import os

    from pacs_fast.trainer.run_folder import LOCK_FILE, RunFolder, RunFolderTaken, RunLock

    run = tmp_path / "r"
    first = RunFolder(run, new=True)
    opened = os.open(run / LOCK_FILE, os.O_RDWR)  # the late run's open, just before the unlink
    real_open = os.open

    def open_the_removed_file_first(path, *args):
        nonlocal opened
        if opened is not None and str(path).endswith(LOCK_FILE):
            fd, opened = opened, None
            return fd
        return real_open(path, *args)

    first.close(abandon=True)
    assert not run.exists()
    os.open = open_the_removed_file_first
    try:
        late = RunLock(run, new=True)
    finally:
        os.open = real_open
    assert (run / LOCK_FILE).exists()
    mine, there = os.fstat(late._fd), os.stat(run / LOCK_FILE)
    assert (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
    with pytest.raises(RunFolderTaken, match="is in use by another run"):
        RunLock(run, new=True)
    late.release()
    fd = os.open(run / LOCK_FILE, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    os.close(fd)
