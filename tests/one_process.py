"""A Python child process outside any torchrun launch (the one-process megatron checks): ``RANK`` / ``WORLD_SIZE``
/ ``LOCAL_RANK`` / ``MASTER_*`` of a surrounding launch removed, warnings off, one thread."""
from __future__ import annotations

import os
import subprocess
import sys

TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_python(args, *, timeout: int = 240) -> subprocess.CompletedProcess:
    """``python ARGS`` in a clean environment; asserts exit 0 (the end of stderr in the message). Returns the
    completed process (text stdout / stderr)."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_KEYS}
    proc = subprocess.run([sys.executable, *map(str, args)], env={**env, "PYTHONWARNINGS": "ignore",
                                                                  "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def write_learner_spec(folder, seed: int) -> dict:
    """A tiny untied model under ``folder/m`` and one learner batch (groups of 4, rewards 1, 0, 1, 0, ...), saved as
    ``folder/spec.pt`` for a one-process script to load; returns the spec."""
    import torch

    from pacs_fast.data.tiny import make_tiny_model
    from test_entropy_selection import _learner_batch

    gen = torch.Generator().manual_seed(seed)
    batch = _learner_batch(gen)
    batch["rewards"] = torch.tensor([1.0, 0.0] * 8)
    spec = {"model": str(make_tiny_model(os.path.join(folder, "m"), seed=seed % 1000, tie_word_embeddings=False)),
            "batch": batch}
    torch.save(spec, os.path.join(folder, "spec.pt"))
    return spec
