"""Runs a two-process bench script under torchrun in a work folder (a temporary one, removed after, when the
user gave no ``--workdir``): the launcher of bench_megatron.py and bench_megatron_learner.py."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile


def launch(script: str, workdir: str, prefix: str) -> None:
    """Re-runs ``script`` with this process's arguments under ``torchrun --nproc_per_node=2`` and exits with its
    status; ``workdir``: the ``--workdir`` given, or "" for a temporary folder named ``prefix...``."""
    own = not workdir
    workdir = workdir or tempfile.mkdtemp(prefix=prefix)
    argv = sys.argv[1:] + (["--workdir", workdir] if own else [])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", script, *argv]
    try:
        code = subprocess.call(cmd, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    sys.exit(code)
