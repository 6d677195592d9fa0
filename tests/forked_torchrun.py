"""``torchrun`` with its ranks forked from one interpreter that has already imported the heavy libraries.

Most of a multi-process test's CPU is start-up: every rank of ``python -m torch.distributed.run`` is a
fresh interpreter importing torch, transformers, vLLM and megatron-core (6-9 s of CPU each on the CI's
2 cores; measured with ``python -X importtime``), and torchrun imports torch once more. Here torchrun
itself runs in an interpreter that imported them first, and starts its ranks with its own
``--start-method fork --run-path``: each rank is a fork of that interpreter (the modules shared, not
imported again) running the same module or script as ``__main__`` with the same arguments, under the
same environment torchrun gives every rank (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``TORCHELASTIC_RUN_ID``, ...). A 3-process run with a vLLM engine and a megatron learner took 14.6 s of
CPU instead of 28-34 s, with records identical to the plain launch's; the four files of vLLM / megatron layouts
(test_async_scaleout, test_train_scaleout, test_scaleout, test_async_rollouts) 264 s of CPU instead of 442
(``PACS_FAST_TEST_FORKED=0`` and ``=1`` one after the other, one pytest process).

What it does not test: a rank starting as a fresh interpreter. The tests of that path (a config error
printed once, a run killed with SIGKILL and its resume, a TP=2 megatron resume) launch
``python -m torch.distributed.run`` as users do (:func:`torchrun_command` with ``forked=False``).

    python tests/forked_torchrun.py --preload torch,vllm --nproc_per_node=2 --standalone -m pacs_fast.train ...
    python tests/forked_torchrun.py --preload torch,megatron.core --nproc_per_node=2 --standalone tests/worker.py ...
"""
from __future__ import annotations

import os
import runpy
import signal
import sys

# what every launch preloads (a rank imports the rest itself, as in a plain launch)
BASE = ("torch", "transformers")
MEGATRON = BASE + ("megatron.core",)
BOTH = BASE + ("vllm", "megatron.core")
_SCRIPT, _MODULE = "--as-script", "--as-module"


def torchrun_command(nproc: int, *target: str, preload: tuple[str, ...] = BASE, forked: bool = True) -> list[str]:
    """The command that runs ``target`` (``"-m", "pkg.mod", args...`` or ``"script.py", args...``) on
    ``nproc`` standalone ranks: forked from a preloaded interpreter, or (``forked=False``) torchrun's own."""
    head = [f"--nproc_per_node={nproc}", "--standalone", *target]
    if not forked or os.environ.get("PACS_FAST_TEST_FORKED") == "0":  # 0: every launch plain (to compare)
        return [sys.executable, "-m", "torch.distributed.run", *head]
    return [sys.executable, os.path.abspath(__file__), "--preload", ",".join(preload), *head]


def launch_env(**extra: str) -> dict[str, str]:
    """The test process's environment for a launch: one compute thread a rank, no inherited rank variables."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", **extra}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _default_signal_handlers(*, quiet_int: bool = False) -> None:
    """The stop signals' handlers as a fresh interpreter has them (Ctrl-C raising KeyboardInterrupt; with
    ``quiet_int``, ending the process too). A fork inherits those torchrun's agent installed: SIGTERM raised its
    SignalException, an Exception the program does not expect, and a rank stopped by torchrun printed a traceback
    that a rank of a plain launch does not."""
    for name in os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT").split(","):
        sig = getattr(signal, name.strip(), None)
        if sig is not None:
            keep_int = sig == signal.SIGINT and not quiet_int
            signal.signal(sig, signal.default_int_handler if keep_int else signal.SIG_DFL)


def _run_rank(argv: list[str]) -> None:
    """In a rank: run the module or script as ``python -m`` / ``python script.py`` would (``sys.path[0]``
    the working directory or the script's folder, ``sys.argv`` as the program sees it)."""
    kind, target, args = argv[0], argv[1], argv[2:]
    _default_signal_handlers()  # a fresh interpreter's
    try:
        _run_target(kind, target, args)
    finally:  # a fork lingers in torchrun's wrapper until the agent reads its result: stopped there, it ends quietly
        _default_signal_handlers(quiet_int=True)  # (as a plain launch's rank, already gone)


def _run_target(kind: str, target: str, args: list[str]) -> None:
    if kind == _MODULE:
        sys.path[0] = os.getcwd()
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        sys.argv = [target, *args]
        runpy.run_path(target, run_name="__main__")


def _launch(argv: list[str]) -> None:
    if argv[:1] != ["--preload"] or len(argv) < 2:
        sys.exit("usage: forked_torchrun.py --preload MOD[,MOD...] TORCHRUN_OPTIONS (-m MODULE | SCRIPT) ARGS...")
    preload, argv = argv[1].split(","), argv[2:]
    # as the command lines do before torch loads (pacs_fast/openmp.py); the ranks inherit the loaded libgomp
    from pacs_fast.openmp import quiet_openmp_waits

    quiet_openmp_waits()
    import importlib
    import importlib.util

    for name in filter(None, preload):
        if importlib.util.find_spec(name.split(".")[0]) is None:
            continue  # not installed: a rank that needs it fails as in a plain launch
        if name == "vllm":
            from vllm import LLM  # noqa: F401  (the engine class pulls in most of vLLM's import time)
        else:
            importlib.import_module(name)
    # torchrun's options (as --name=value), then the target: "-m MODULE" or the first argument not starting with "-"
    i = next(k for k, a in enumerate(argv) if a == "-m" or not a.startswith("-"))
    if argv[i] == "-m":
        rank_argv = [_MODULE, argv[i + 1], *argv[i + 2:]]
    else:
        rank_argv = [_SCRIPT, *argv[i:]]
    from torch.distributed.run import main

    main(["--start-method", "fork", "--run-path", *argv[:i], os.path.abspath(__file__), *rank_argv])


if __name__ == "__main__":
    if sys.argv[1:2] in ([_MODULE], [_SCRIPT]):
        _run_rank(sys.argv[1:])
    else:
        _launch(sys.argv[1:])
