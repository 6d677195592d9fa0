"""How the command-line tools stop on a signal: SIGTERM (a scheduler's stop, ``kill``) and SIGHUP (a closed
terminal) end a run as Ctrl-C does, through the same clean-up, with one line and exit status 128 + the signal;
under torchrun a rank also stops when its launcher dies. Used by ``python -m pacs_fast.train`` and
``python -m pacs_fast.experiment`` (only when run as commands: a caller's own process keeps its handlers)."""
from __future__ import annotations

import os
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """SIGTERM or SIGHUP, raised in the main thread (a BaseException, as KeyboardInterrupt: no ``except
    Exception`` swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def raise_on_stop_signals() -> None:
    """SIGTERM and SIGHUP raise :class:`Stopped` where their handler is the default (``nohup``'s ignored
    SIGHUP stays ignored)."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _raise_stopped)


def exit_at_next_signal() -> None:
    """Once a stop is under way (its line printed, the exit begun): a second Ctrl-C, SIGTERM or SIGHUP ends the process
    at once with 128 + that signal, quietly. It had raised in the exit's clean-up (the engines' and pools' shutdown,
    atexit), printing a traceback and dying by SIGINT (status -2). Every file is written atomically or appended, and
    the run lock is the process's flock: nothing is left half-written."""
    def now(signum, frame):
        os._exit(exit_status(signum))

    for sig in (signal.SIGINT, *STOP_SIGNALS):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, now)


def default_stop_signals() -> None:
    """Undoes :func:`raise_on_stop_signals` (a rank that is exiting anyway ends quietly when stopped)."""
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is _raise_stopped:
            signal.signal(sig, signal.SIG_DFL)


# set by ``python -m pacs_fast.experiment`` in the environment of the trainers it starts: its process id
RUNNER_PID_VAR = "PACS_FAST_RUNNER_PID"


def _prctl():
    """libc's ``prctl`` (Linux), or None where it cannot be found."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except Exception:
        return None


def die_with_launcher() -> None:
    """Under torchrun every rank runs in a session of its own: a launcher killed with -9 (or by the OOM
    killer) left its ranks training, holding the run lock; so did a trainer the experiment runner started
    (``RUNNER_PID_VAR``). PR_SET_PDEATHSIG has the kernel send the process SIGTERM when its launcher
    dies (Linux; elsewhere nothing changes)."""
    runner = None if "TORCHELASTIC_RUN_ID" in os.environ else os.environ.get(RUNNER_PID_VAR)
    if ("TORCHELASTIC_RUN_ID" not in os.environ and not runner) or not sys.platform.startswith("linux"):
        return
    prctl = _prctl()
    if prctl is None:  # no prctl: the rank outlives a killed launcher, as before
        return
    prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    parent = os.getppid()
    if parent == 1 or (runner and runner.isdigit() and parent != int(runner)):
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher died before the request was in place


def stop_with_this_process():
    """A ``preexec_fn`` for ``subprocess.Popen`` (Linux; None elsewhere): the child gets SIGTERM when the process
    that started it dies, killed with -9 included. A torchrun the experiment runner started went on running its
    ranks when the runner was killed (the ranks die with torchrun, :func:`die_with_launcher`; torchrun itself is not
    ours): SIGTERM stops torchrun as Ctrl-C does, and it stops its ranks. Call from the thread that outlives the
    child (the kernel sends the signal when the forking thread exits)."""
    prctl = _prctl() if sys.platform.startswith("linux") else None
    if prctl is None:  # no prctl: the child outlives a killed parent, as before
        return None
    parent = os.getpid()

    def preexec() -> None:  # in the child, between fork and exec: no Python objects shared with other threads
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (kept across exec)
        if os.getppid() != parent:  # the parent died before the request was in place
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def exit_status(signum: int) -> int:
    """128 + the signal: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP (the shells' convention)."""
    return 128 + int(signum)


def name(signum: int) -> str:
    return signal.Signals(signum).name
