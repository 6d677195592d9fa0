"""Checkpoints: ``run_dir/checkpoints/step_000040/``, written atomically, verified on load.

Each checkpoint folder holds the policy in Hugging Face format (``model.safetensors``, or shards and their
index past :data:`pacs_fast.learner.hf_folder.SHARD_BYTES`,
``config.json`` keeping every key of the input model's, :func:`keep_input_config_keys`; the model
folder's tokenizer files and ``generation_config.json`` copied byte for byte, so
``AutoModelForCausalLM.from_pretrained`` and the stop ids are those of the input model),
the learner's state (optimiser, reference / value-head weights), ``trainer_state.pt`` (step, data
position, RNG states), ``trainer_state.json`` (its readable part), the run's resolved
``config.yaml``, and last ``manifest.json`` (every file's size).

Writing: a temporary folder ``.tmp-step_*``, fsync, ``os.replace`` into place, then
``checkpoints/latest`` (one line, replaced atomically) names it. A run killed at any moment leaves
the previous or the new checkpoint, never a partial one; a full disk is reported as such, the
temporary folder removed, the older checkpoints intact. Loading takes the newest checkpoint whose
files match its manifest and load, and says which newer one it skipped and why.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from pacs_fast.config.model_files import safetensors_problem
from pacs_fast.files import remove_temporaries, write_text_atomic
from pacs_fast.learner.base import CheckpointMismatch
from pacs_fast.learner.hf_folder import LazyHFCheckpoint, WeightFileError, checkpoint_weight_files

MANIFEST = "manifest.json"
# trainer-state entries kept in trainer_state.pt alone (not readable text: an asynchronous run's completions in flight)
PICKLED_ONLY = frozenset({"in_flight"})
# Files of the input model folder that a checkpoint carries unchanged (the weights and config.json
# are the learner's own): tokenizer files, chat template, generation settings.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".gguf")


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or none could be loaded (the message says which file)."""


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


# What a checkpoint holds besides the model (this module's, the megatron learner's): never copied from a
# model folder that is itself a checkpoint (a second-stage run from another run's step_N), where the old
# manifest.json was listed in the new one and then replaced, so no checkpoint of that run could be resumed.
CHECKPOINT_OWN_FILES = (MANIFEST, "trainer_state.json", "config.yaml", "learner_state.json")


def model_side_files(model_dir: str | Path) -> list[Path]:
    """The files of a Hugging Face model folder that are not weights, ``config.json`` nor a
    checkpoint's own files (:data:`CHECKPOINT_OWN_FILES`)."""
    model_dir = Path(model_dir)
    return sorted(p for p in model_dir.iterdir() if p.is_file() and p.name != "config.json"
                  and not p.name.endswith(WEIGHT_SUFFIXES) and not p.name.endswith(".index.json")
                  and not p.name.startswith(".") and p.name not in CHECKPOINT_OWN_FILES)


#: a model folder's side file larger than this (not a tokenizer's: Qwen2.5's tokenizer.json is 7 MB) is recorded by
#: its size, not read at every checkpoint
HASHED_BYTES = 64 << 20


def model_files_record(model_dir: str | Path) -> dict:
    """What of the model folder shapes the run besides the weights, for a resume to compare: its resolved ``path``
    and the SHA-1 of ``config.json`` and of each :func:`model_side_files` file (tokenizer, chat template,
    generation config; not the documentation; a file over :data:`HASHED_BYTES`: its size). A resume on a folder
    edited in place (its chat template or stop ids changed) trained on other prompts without a word."""
    model_dir = Path(model_dir)
    files = [model_dir / "config.json"] if (model_dir / "config.json").is_file() else []
    files += [f for f in model_side_files(model_dir)
              if not f.name.lower().endswith(".md") and not f.name.upper().startswith(("LICENSE", "NOTICE"))]
    return {"path": str(model_dir.resolve()),
            "files": {f.name: _side_file_digest(f) if f.stat().st_size <= HASHED_BYTES else f"{f.stat().st_size} bytes"
                      for f in files}}


def _side_file_digest(f: Path) -> str:
    """SHA-1 of a side file; of a JSON file, of its values less ``transformers_version`` (the same folder rebuilt
    under another transformers, the built-in model's warm-up cache, is not an edit)."""
    data = f.read_bytes()
    if f.suffix == ".json":
        try:
            value = json.loads(data)
        except ValueError:
            value = None
        if isinstance(value, dict):
            value.pop("transformers_version", None)
            data = json.dumps(value, sort_keys=True).encode()
    return hashlib.sha1(data).hexdigest()


def changed_model_files(recorded: dict | None, model_dir: str | Path) -> list[str]:
    """The files of ``model_dir`` that differ from ``recorded`` (:func:`model_files_record`, kept in each checkpoint's
    trainer state): changed, added or removed. Empty when nothing was recorded (a checkpoint from before the record)
    or when the folder is another one than the recorded (a moved model given again: ``--resume RUN model.path=DIR``)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("files"), dict):
        return []
    now = model_files_record(model_dir)
    if now["path"] != recorded.get("path"):
        return []
    before = recorded["files"]
    return sorted(n for n in set(before) | set(now["files"]) if before.get(n) != now["files"].get(n))


def keep_input_config_keys(saved: Path, original: Path) -> None:
    """Adds to the checkpoint's ``config.json`` (``saved``, written by the running transformers) every
    key of the input model's (``original``) that it dropped, and ``torch_dtype`` = its ``dtype``.
    transformers 5 writes RoPE as ``rope_parameters`` only: a transformers-4 loader of the checkpoint
    then built ``rope_theta`` 10,000 instead of Qwen2.5's 1e6 and no Llama-3.1 RoPE scaling, silently
    (the real-shape sweep; 0.06 log-prob change on 16 tokens of random weights). Keys both have keep
    the saved value; transformers 5 reads the legacy ones as the same ``rope_parameters``. The same inside each
    sub-config both have (``text_config``: Gemma 3 4B+'s ``rope_scaling`` had been dropped there)."""
    try:
        given, written = json.loads(original.read_text()), json.loads(saved.read_text())
    except (OSError, ValueError):  # no input config (or none written): nothing to keep
        return
    if not isinstance(given, dict) or not isinstance(written, dict):
        return
    merged = _with_dropped_keys(given, written)
    if "dtype" in written:
        merged["torch_dtype"] = written["dtype"]
    if merged != written:
        saved.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")


def _with_dropped_keys(given: dict, written: dict) -> dict:
    """``written`` with the keys of ``given`` it lacks, and so within each ``*_config`` both hold as objects."""
    merged = {**{k: v for k, v in given.items() if k not in written}, **written}
    for k, v in written.items():
        if k.endswith("_config") and isinstance(v, dict) and isinstance(given.get(k), dict):
            merged[k] = _with_dropped_keys(given[k], v)
    return merged


def _fsync_tree(folder: Path) -> None:
    for f in folder.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def _disk_error(e: BaseException, where: Path) -> str | None:
    """A plain 'no space' message when ``e`` comes from a full disk (torch's zip writer reports it
    as 'unexpected pos'), else None."""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "No space left on device"
    text = str(e)
    if "No space left" in text or "unexpected pos" in text:
        free = shutil.disk_usage(where).free
        return f"No space left on device ({free / 2**20:.0f} MiB free)"
    return None


def save_checkpoint(run_dir: str | Path, step: int, *, learner, model_dir: str | Path, config_yaml: Path,
                    trainer_state: dict, world, keep: int = 2, before_publish=None, late_state=None) -> Path:
    """Writes checkpoint ``step`` atomically and prunes all but the newest ``keep``. Returns its path.

    Collective: every rank calls it (the learner's state and weights are gathered inside); only
    ``world.is_main`` writes the shared files. Raises :class:`CheckpointError` on a write failure
    (after removing the temporary folder). ``before_publish()``: called on the main rank once the checkpoint is
    complete, just before its rename makes it the newest (the trainer records it there: a stop after the rename
    finds the record written; one before it, a record that the resume from the older checkpoint supersedes).
    ``late_state()``: more trainer state, asked for on every rank (collective) once the learner's files are written
    (an asynchronous run's batches in flight: the engines generate them meanwhile); its errors pass through."""
    ckpt_root = Path(run_dir) / "checkpoints"
    name = f"step_{step:06d}"
    final, tmp = ckpt_root / name, ckpt_root / f".tmp-{name}"
    failure = None
    if world.is_main:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    world.barrier()
    try:
        _save_learner_state(learner, tmp, world)
        learner.save_hf(tmp)  # collective; the writing rank writes
    except Exception as e:  # noqa: BLE001 - OSError, torch's RuntimeError, safetensors' SafetensorError, ...:
        failure = e  # every rank learns of it below (a rank that raised alone would leave the others waiting)
    if late_state is not None and not world.any(failure is not None):
        try:
            trainer_state = {**trainer_state, **late_state()}
        except BaseException:
            if world.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
    try:
        if failure is None and world.is_main:
            keep_input_config_keys(tmp / "config.json", Path(model_dir) / "config.json")
            for f in model_side_files(model_dir):
                if not (tmp / f.name).exists():  # what the learner wrote stays
                    shutil.copy2(f, tmp / f.name)
            shutil.copy2(config_yaml, tmp / "config.yaml")
            trainer_state = {**trainer_state, "model_files": model_files_record(model_dir)}
            with open(tmp / "trainer_state.pt", "wb") as fh:
                torch.save({**trainer_state, "step": step, "rng": rng_state()}, fh)
            readable = {k: v for k, v in trainer_state.items()
                        if k not in PICKLED_ONLY and (v is None or isinstance(v, (int, float, str, dict, list)))}
            (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **readable}, indent=1, default=str))
            manifest = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
            (tmp / MANIFEST).write_text(json.dumps({"step": step, "files": manifest}, indent=1))
            _fsync_tree(tmp)
    except Exception as e:  # noqa: BLE001 - the main rank's writes, as above
        failure = e
    if world.any(failure is not None):
        if world.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        cause = _disk_error(failure, ckpt_root) if failure is not None else None
        older = latest_name(run_dir)
        kept = f"; the last good checkpoint {older} is intact" if older else ""
        raise CheckpointError(f"writing checkpoint {ckpt_root / name} failed: {cause or failure or 'on another rank'}"
                              f"{kept}") from failure
    if world.is_main:
        if before_publish is not None:
            before_publish()
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_text_atomic(ckpt_root / "latest", name + "\n")
        prune(ckpt_root, final, keep)
    world.barrier()
    return final


def _save_learner_state(learner, folder: Path, world) -> None:
    save = getattr(learner, "save_state", None)
    if save is not None:
        save(folder, is_writer=world.is_main)
        return
    state = learner.state_dict()  # collective for multi-process learners
    if world.is_main:
        with open(folder / "learner.pt", "wb") as fh:
            torch.save(state, fh)


def _load_learner_state(learner, folder: Path) -> None:
    load = getattr(learner, "load_state", None)
    if load is not None:
        load(folder)
    else:
        learner.load_state_dict(torch.load(folder / "learner.pt", weights_only=False))


def latest_name(run_dir: str | Path) -> str | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    try:
        return pointer.read_text().strip() or None
    except OSError:
        return None


def problem_of(path: Path) -> str | None:
    """Why the checkpoint folder ``path`` cannot be used (None when its files match its manifest)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except FileNotFoundError:
        return f"{path / MANIFEST} is missing (an incomplete or pre-manifest checkpoint)"
    except (OSError, ValueError) as e:
        return f"{path / MANIFEST} is unreadable ({e})"
    for rel, size in manifest.get("files", {}).items():
        if rel == MANIFEST:  # listed in itself by runs from a checkpoint before 2026-11-28 (the old one's size)
            continue
        f = path / rel
        if not f.is_file():
            return f"{f} is missing"
        if f.stat().st_size != size:
            return f"{f} is truncated or changed ({f.stat().st_size} bytes, {size} written)"
        # a weights file's header (its own few bytes): one overwritten in place, of the size written, was found
        # only by the load, after the model had loaded (the only checkpoint: no one-line refusal before it)
        problem = safetensors_problem(f) if rel.endswith(".safetensors") else None
        if problem:
            return problem
    return None


def checkpoints_newest_first(run_dir: str | Path) -> list[Path]:
    root = Path(run_dir) / "checkpoints"
    return sorted((p for p in root.glob("step_*") if p.is_dir() and _step_of(p) >= 0), key=_step_of, reverse=True)


def intact_checkpoints(run_dir: str | Path) -> list[Path]:
    """The checkpoints of ``run_dir`` whose files match their manifest, newest first."""
    return [p for p in checkpoints_newest_first(run_dir) if problem_of(p) is None]


def newest_intact(run_dir: str | Path) -> Path | None:
    """The newest checkpoint of ``run_dir`` whose files match its manifest (None: none); older ones are not read."""
    return next((p for p in checkpoints_newest_first(run_dir) if problem_of(p) is None), None)


def step_of(path: Path) -> int:
    """The step of checkpoint folder ``path`` (``step_000040`` -> 40)."""
    return int(path.name[len("step_"):])


def check_resumable(run_dir: str | Path, steps: int) -> int | None:
    """Before anything loads, for ``--resume``: the step of the newest intact checkpoint (None when
    the run has none yet: it restarts from step 0). ValueError naming the key or folder when
    ``train.steps`` is below that step (a run cannot go back), or when checkpoints exist and none is
    intact."""
    run_dir = Path(run_dir)
    found = checkpoints_newest_first(run_dir)
    if not found:
        return None
    intact = intact_checkpoints(run_dir)
    if not intact:
        raise ValueError(f"--resume {run_dir}: no usable checkpoint ({found[0].name}: {problem_of(found[0])}"
                         f"{f'; {len(found) - 1} older ones too' if len(found) > 1 else ''})")
    step = step_of(intact[0])
    if steps < step:
        raise ValueError(f"--resume {run_dir}: train.steps={steps} is below the step of its checkpoint "
                         f"{intact[0].name} ({step}); a run cannot go back: give train.steps >= {step}")
    return step


def restore_newest(run_dir: str | Path, *, learner, world, log=print) -> tuple[Path, dict]:
    """Loads the newest usable checkpoint of ``run_dir`` into ``learner``: one whose files match its
    manifest and load. Each newer one skipped is reported by file. Collective (rank 0 checks the
    files; every rank loads). Returns ``(path, trainer_state)``; :class:`CheckpointError` if none."""
    names = world.broadcast([p.name for p in checkpoints_newest_first(run_dir)] if world.is_main else None)
    root = Path(run_dir) / "checkpoints"
    for name in names:
        path = root / name
        problem = world.broadcast(problem_of(path) if world.is_main else None)
        if problem is None:
            try:
                state, error = load_checkpoint(path, learner=learner), None
            except CheckpointError as e:
                state, error = None, str(e)
            if not world.any(error is not None):
                return path, state
            problem = error or "it failed to load on another rank"
        log(f"warning: skipping checkpoint {name}: {problem}")
    raise CheckpointError(f"no usable checkpoint under {root}" + (" (all were skipped, see above)" if names else ""))


def settle_after_resume(run_dir: str | Path, restored: Path, keep: int) -> None:
    """What a save stopped right after its rename left undone (Ctrl-C there): ``latest`` names the checkpoint
    the run resumed from, and of it and the older ones only the newest ``keep`` stay (0: all). Newer,
    damaged ones are left: the run writes them again. Rank 0 only."""
    root = Path(run_dir) / "checkpoints"
    if latest_name(run_dir) != restored.name:
        write_text_atomic(root / "latest", restored.name + "\n")
    prune(root, restored, keep)


def _step_of(folder: Path) -> int:
    """:func:`step_of`, -1 for a folder named otherwise (never pruned)."""
    try:
        return step_of(folder)
    except ValueError:
        return -1


def prune(root: Path, newest: Path, keep: int) -> None:
    """Of ``newest`` and the checkpoints older than it, only the newest ``keep`` stay (0: all). Newer ones are
    left alone: damaged ones a resume skipped (the run writes those steps again and replaces them). Pruning
    over every folder deleted the checkpoint just written and the one the run resumed from, keeping only
    the damaged newer one: the run could not be resumed."""
    upto = _step_of(newest)
    older = sorted((p for p in root.glob("step_*") if p.is_dir() and 0 <= _step_of(p) <= upto), key=_step_of)
    for old in older[:-keep] if keep else []:
        shutil.rmtree(old, ignore_errors=True)


def remove_stale_temporaries(run_dir: str | Path) -> list[Path]:
    """Removes what a run killed while writing left (under the run's lock): ``.tmp-step_*`` checkpoint folders, and
    the temporary files of atomic writes anywhere in the run folder (``checkpoints/.latest.tmp-PID``,
    ``.summary.json.tmp-PID``, ``plots/.curves.png.tmp-PID``, ...); returns them."""
    stale = [p for p in (Path(run_dir) / "checkpoints").glob(".tmp-*") if p.is_dir() and not p.is_symlink()]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale + remove_temporaries(run_dir, recursive=True)


def load_checkpoint(path: str | Path, *, learner) -> dict:
    """Restores the learner (policy weights, optimiser, ...) from a checkpoint folder and returns
    its trainer state (RNG states are restored too). Raises :class:`CheckpointError` naming the file.

    The weights (``model.safetensors``, else the shards ``model.safetensors.index.json`` names:
    :func:`~pacs_fast.learner.hf_folder.checkpoint_weight_files`; a shard it names missing, or neither file, is a
    :class:`CheckpointError` naming them) go to the learner as a
    :class:`~pacs_fast.learner.hf_folder.LazyHFCheckpoint`: its names and shapes are checked from the files' headers,
    then it reads a tensor at a time as it copies them into place, so a resume holds one tensor (the embedding) in
    host memory, not the model (read whole before 2026-12-03: 15 GB for a 7B bf16 policy, on each of a megatron
    launch's processes)."""
    path = Path(path)
    try:
        files = checkpoint_weight_files(path)
    except (OSError, ValueError) as e:  # (its message names the index and the missing file, or the folder)
        raise CheckpointError(f"cannot load checkpoint {path}: {e}") from e
    current = files[-1] if files else path / "model.safetensors"  # (a wrong name or shape: the weights' last file)
    try:
        weights = LazyHFCheckpoint(path, files=files)
        learner.load_hf_weights(weights.items())
        current = path / "learner.pt"
        _load_learner_state(learner, path)  # (a LoRA learner compares the checkpoint's merged weights here)
        current = path / "trainer_state.pt"
        state = torch.load(current, weights_only=False)
    except CheckpointMismatch:  # (the run's settings are wrong, not the file: not skipped as damaged)
        raise
    except WeightFileError as e:  # a weight file, read while the learner took the tensors: that file
        raise CheckpointError(f"cannot load checkpoint file {e.path}: {e}") from e
    except Exception as e:  # noqa: BLE001 - any failure to read a file is reported with the file
        raise CheckpointError(f"cannot load checkpoint file {current}: {type(e).__name__}: {e}") from e
    set_rng_state(state["rng"])
    return state
