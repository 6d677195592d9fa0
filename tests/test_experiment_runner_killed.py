"""An experiment runner killed with -9 takes the processes it started with it.

The runner starts each run as a child (``python -m pacs_fast.train``, or ``torchrun`` for a run with several
processes). A trainer dies with the runner on its own (``signals.die_with_launcher``), but torchrun is not ours:
killed with -9 (or by the OOM killer), the runner left torchrun and its ranks training, holding the run's lock.
``run_jobs`` now starts every child with ``signals.stop_with_this_process()``: the kernel sends it SIGTERM when
the runner dies. The child here stands for torchrun: a plain Python process that knows nothing of the runner.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pacs_fast import signals

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

ROOT = Path(__file__).resolve().parents[1]

RUNNER = textwrap.dedent("""
    import sys
    from pathlib import Path
    import pacs_fast.experiment as E
    from pacs_fast.experiment_args import Arm
    from pacs_fast.experiment_folders import Job
    out = Path(sys.argv[1])
    child = [sys.executable, "-c", "import os, time; open(%r, 'w').write(str(os.getpid())); time.sleep(120)"
             % str(out / "child.pid")]
    E.command = lambda job, config, state: child  # torchrun's stand-in: knows nothing of the runner
    job = Job(Arm("a", []), 0, out / "runs" / "a" / "seed0", [])
    E.run_jobs([(job, "resume")], None, workers=1, threads=1)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"  # a zombie is dead, only not yet reaped
    except FileNotFoundError:
        return False


def _wait_for(check, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def test_a_child_of_a_killed_runner_stops(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path)], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pid_file = tmp_path / "child.pid"
    child = None
    try:
        # the runner imports torch through pacs_fast (seconds on this CPU): a generous wait, ended by the file
        assert _wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 120), \
            runner.stderr.read().decode() if runner.poll() is not None else "no child started"
        child = int(pid_file.read_text())
        assert _alive(child)
        runner.kill()  # -9: no handler of the runner's runs
        runner.wait()
        # the kernel sends SIGTERM at the runner's death; before the fix the child slept its 120 s out
        assert _wait_for(lambda: not _alive(child), 20), "the run outlived the runner killed with -9"
    finally:
        if runner.poll() is None:
            runner.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_the_request_is_made_in_the_child_only(tmp_path):
    """The preexec function changes the child, not the caller: the caller's own death signal stays unset."""
    preexec = signals.stop_with_this_process()
    assert callable(preexec)
    out = tmp_path / "sig"
    code = ("import ctypes, sys; v = ctypes.c_int(); "
            "ctypes.CDLL(None).prctl(2, ctypes.byref(v)); open(sys.argv[1], 'w').write(str(v.value))")  # GET
    subprocess.run([sys.executable, "-c", code, str(out)], preexec_fn=preexec, check=True, timeout=60)
    assert int(out.read_text()) == int(signal.SIGTERM)
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, timeout=60)
    assert int(out.read_text()) == 0  # a child started without it (and so this process) has none
