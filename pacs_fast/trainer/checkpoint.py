"""Atomic checkpoints: ``run_dir/checkpoints/step_000040/``.

Each checkpoint folder holds the policy in Hugging Face format (``model.safetensors``,
``config.json``, tokenizer files: ``AutoModelForCausalLM.from_pretrained`` loads it),
``learner.pt`` (optimiser, reference / value-head weights), ``trainer_state.pt`` (step, data
position, RNG states, summary so far) and ``trainer_state.json`` (the readable part). It is written
into a temporary folder and moved into place with ``os.replace``; then ``checkpoints/latest`` (a
one-line file, also replaced atomically) names it. A run killed at any moment leaves either the
previous or the new checkpoint, never a partial one.
"""
from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(run_dir: str | Path, step: int, *, learner, tokenizer, trainer_state: dict,
                    keep: int = 2, is_main: bool = True) -> Path:
    """Writes checkpoint ``step`` atomically and prunes all but the newest ``keep``. Returns its path.

    In a multi-process launch every rank calls it (the learner's state gathering is collective);
    only ``is_main`` writes files.
    """
    learner_state = learner.state_dict()
    ckpt_root = Path(run_dir) / "checkpoints"
    name = f"step_{step:06d}"
    final = ckpt_root / name
    tmp = ckpt_root / f".tmp-{name}"
    if not is_main:
        learner.save_hf(tmp)  # collective; writes nothing on other ranks
        return final
    ckpt_root.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    learner.save_hf(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    torch.save(learner_state, tmp / "learner.pt")
    torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / "trainer_state.pt")
    readable = {k: v for k, v in trainer_state.items() if isinstance(v, (int, float, str, dict, list))}
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **readable}, indent=1, default=str))
    for f in tmp.iterdir():  # make the contents durable before the rename publishes them
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _write_text_atomic(ckpt_root / "latest", name + "\n")
    existing = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir())
    for old in existing[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if pointer.exists():
        p = root / pointer.read_text().strip()
        if (p / "trainer_state.pt").exists():
            return p
    done = sorted(p for p in root.glob("step_*") if (p / "trainer_state.pt").exists())
    return done[-1] if done else None


def load_checkpoint(path: str | Path, *, learner) -> dict:
    """Restores the learner (policy weights, optimiser, ...) from a checkpoint folder and returns
    its trainer state (RNG states are restored too)."""
    from safetensors.torch import load_file

    path = Path(path)
    learner.load_hf_weights(load_file(str(path / "model.safetensors")).items())
    learner.load_state_dict(torch.load(path / "learner.pt", weights_only=False))
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    set_rng_state(state["rng"])
    return state
