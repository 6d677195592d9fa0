"""A policy's weights written as a Hugging Face folder, one bucket of whole layers at a time, and read back a tensor
at a time (:class:`LazyHFCheckpoint`).

Both learners write the transformers layout: one bucket is ``model.safetensors``; several are
``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json`` (``{"metadata": {"total_size":
bytes}, "weight_map": {name: file}}``), which ``from_pretrained``, vLLM and :func:`~pacs_fast.trainer.checkpoint.
load_checkpoint` read. Each file is written atomically; a bucket never splits a unit (a transformer block, the
embedding, ...; :func:`pacs_fast.data.checkpoint_names.unit_of`), so it may exceed its size by up to one unit.
Writing a bucket at a time bounds the host memory a save takes to about one bucket, not the model (a 7B policy
in fp32 is 28 GB); reading a tensor at a time bounds a load's (a resume's, the megatron learner's model load) to
about one tensor, the largest (the embedding).
"""
from __future__ import annotations

import json
import re
from collections.abc import ItemsView, Mapping
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

import torch

from pacs_fast.config.model_files import SAFE_INDEX_NAME, SAFE_WEIGHTS_NAME, safetensors_weight_files
from pacs_fast.data.checkpoint_names import unit_of
from pacs_fast.files import write_atomic

WEIGHTS_NAME = SAFE_WEIGHTS_NAME
INDEX_NAME = SAFE_INDEX_NAME
# the torch learner's file size (about; transformers' own shards of published models are 2-5 GB): a save
# holds one such bucket in host memory at a time
SHARD_BYTES = 4 << 30
_SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")

T = TypeVar("T")


def whole_unit_buckets(items: Iterable[tuple[str, T]], bucket_bytes: int,
                       nbytes: Callable[[T], int]) -> Iterator[list[tuple[str, T]]]:
    """Consecutive ``(hf_name, item)`` in buckets of at least ``bucket_bytes`` (``nbytes(item)`` summed), each
    closed only where the unit changes (the last bucket may be smaller). Streams: one bucket is held at a time."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket, size, unit = [], 0, None
    for name, item in items:
        if bucket and size >= bucket_bytes and unit_of(name) != unit:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, item))
        size += nbytes(item)
        unit = unit_of(name)
    if bucket:
        yield bucket


def shard_name(i: int, n: int) -> str:
    """File name of bucket ``i`` (from 0) of ``n``: ``model.safetensors`` when ``n == 1``."""
    return WEIGHTS_NAME if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def write_shard(folder: Path, name: str, tensors: dict) -> int:
    """Writes ``tensors`` (``{hf_name: contiguous CPU tensor}``) to ``folder/name`` atomically; returns their bytes."""
    from safetensors.torch import save_file

    write_atomic(Path(folder) / name, lambda p: save_file(tensors, str(p), metadata={"format": "pt"}))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def finish_weights(folder: Path, weight_map: dict[str, str], total_size: int) -> None:
    """After the last shard: the index when there are several files, and the weight files an earlier save into the
    same folder left that this one did not write removed (``from_pretrained`` reads a stale ``model.safetensors``
    before an index)."""
    folder = Path(folder)
    written = set(weight_map.values())
    if len(written) > 1:
        index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
        write_atomic(folder / INDEX_NAME, lambda p: p.write_text(json.dumps(index, indent=2)))
    for p in folder.iterdir():
        stale_shard = p.name == WEIGHTS_NAME or _SHARD_RE.match(p.name)
        if (stale_shard and p.name not in written) or (p.name == INDEX_NAME and len(written) == 1):
            p.unlink()


def save_config(config, folder: Path, *, model=None) -> None:
    """Writes ``config`` (a transformers config) as ``folder/config.json`` with ``architectures`` filled in where it
    has none: the class of ``model`` (a transformers model, as its ``save_pretrained`` names it), else the causal-LM
    class transformers maps its ``model_type`` to. A model folder whose config.json lacks it (a conversion script's,
    ``config.save_pretrained`` alone) loads with transformers, which picks the class by ``model_type``; its
    checkpoints kept none and vLLM refused them ("No model architectures are specified"). ``config`` itself is left
    as it is."""
    import copy

    if not getattr(config, "architectures", None):
        name = type(model).__name__ if model is not None and hasattr(model, "config") else None
        if not (name or "").endswith("ForCausalLM"):
            from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

            name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(config, "model_type", None))
        if name:
            config = copy.deepcopy(config)
            config.architectures = [name]
    config.save_pretrained(folder)


# ----------------------------------------------------------------------------- reading
def checkpoint_weight_files(folder) -> list[Path]:
    """The weight files of a checkpoint (or model) folder, as transformers chooses them
    (:func:`~pacs_fast.config.model_files.safetensors_weight_files`): ``model.safetensors`` alone when it is there,
    else the files ``model.safetensors.index.json`` names. Nothing else in the folder (an adapter, a stale file of
    another name, shards the index does not name) is read. FileNotFoundError when the index names a missing file
    or the folder has neither (an unfinished save: the index is written after the last shard); ValueError for an
    unreadable index. (Shards without their index were read once, by a glob of ``model-*.safetensors``.)"""
    return safetensors_weight_files(folder)


class WeightFileError(Exception):
    """Reading weight file ``path`` failed (its header or a tensor); the message is the cause's
    (``"<type>: <message>"``), ``__cause__`` the cause itself."""

    def __init__(self, path, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.path = Path(path)


class LazyHFCheckpoint(Mapping):
    """Read-only ``{hf_name: tensor}`` view of an HF folder's safetensors files that reads a tensor only when asked
    for it: ``safe_open`` for that tensor alone, which gives it backed by the file's mapping (no copy; its pages are
    read as it is used, and let go with it). A load that copies each tensor into place and drops it holds about one
    tensor in host memory, never the model. (One ``safe_open`` kept open for a whole file kept every page it had
    read resident until it closed: the file, as ``load_file`` did.)

    ``files``: the files to read; None: :func:`checkpoint_weight_files` of ``path`` (a model folder or checkpoint:
    the files transformers would load, its errors for an index naming a missing file or a folder with neither
    ``model.safetensors`` nor the index; every ``*.safetensors`` was read once, an adapter or a stale file among
    them). A name in two files is the later file's. The headers are
    read up front, validated by ``safe_open`` (offsets within the file: a truncated file fails here) into
    :attr:`shapes` (``{name: shape}``, no tensor data read). A file that cannot be read, at construction or for a
    tensor, raises :class:`WeightFileError` naming it."""

    def __init__(self, path, *, files: Iterable | None = None):
        from safetensors import safe_open

        if files is None:
            files = checkpoint_weight_files(path)
        self._file: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        for f in map(Path, files):
            try:
                with safe_open(str(f), framework="pt") as h:
                    shapes = {name: tuple(h.get_slice(name).get_shape()) for name in h.keys()}
            except Exception as e:  # noqa: BLE001 - safetensors' SafetensorError, OSError, ...
                raise WeightFileError(f, e) from e
            self._file.update(dict.fromkeys(shapes, f))
            self.shapes.update(shapes)

    def __getitem__(self, name: str) -> torch.Tensor:
        path = self._file[name]
        try:
            return _read_tensor(path, name)
        except Exception as e:  # noqa: BLE001 - as in __init__
            raise WeightFileError(path, e) from e

    def __contains__(self, name) -> bool:  # (Mapping's own reads the tensor)
        return name in self._file

    def __iter__(self):
        return iter(self._file)

    def __len__(self) -> int:
        return len(self._file)

    def items(self) -> "LazyItems":
        """The ``(name, tensor)`` pairs, each read as it is reached; a learner's ``load_hf_weights`` given them
        finds the view (:func:`weights_and_shapes`) and checks names and shapes before reading any."""
        return LazyItems(self)


class LazyItems(ItemsView):
    """:meth:`LazyHFCheckpoint.items`: an ``ItemsView`` (any consumer of ``(name, tensor)`` pairs takes it) that
    keeps its checkpoint as :attr:`checkpoint`."""

    def __init__(self, checkpoint: LazyHFCheckpoint):
        super().__init__(checkpoint)
        self.checkpoint = checkpoint


def _read_tensor(path: Path, name: str) -> torch.Tensor:
    """Tensor ``name`` of safetensors file ``path``, on the CPU, backed by the file's mapping (kept while it lives)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as h:
        return h.get_tensor(name)


def weights_and_shapes(named_tensors) -> tuple[Mapping, dict[str, tuple[int, ...]]]:
    """A learner's ``load_hf_weights`` argument as ``({name: tensor}, {name: shape})``: a :class:`LazyHFCheckpoint`
    (or its :meth:`~LazyHFCheckpoint.items`) stays lazy, its shapes from its headers (no tensor read); any other
    mapping is taken as it is, other ``(name, tensor)`` pairs are collected into a dict."""
    source = named_tensors.checkpoint if isinstance(named_tensors, LazyItems) else named_tensors
    if isinstance(source, LazyHFCheckpoint) or getattr(source, "shapes", None) is not None:
        return source, dict(source.shapes)
    weights = source if isinstance(source, Mapping) else dict(source)
    return weights, {n: tuple(t.shape) for n, t in weights.items()}


class RenamedWeights(Mapping):
    """``weights`` (a mapping: a :class:`LazyHFCheckpoint` stays lazy, a tensor read when asked for) under other
    names: ``names[n]`` for each name ``n`` it has there, else ``n``."""

    def __init__(self, weights: Mapping, names: dict[str, str], shapes: dict | None = None):
        self._weights = weights
        self._source = {names.get(n, n): n for n in weights}
        self.shapes = None if shapes is None else {names.get(n, n): s for n, s in shapes.items()}

    def __contains__(self, name) -> bool:  # (Mapping's own reads the tensor)
        return name in self._source

    def __getitem__(self, name):
        return self._weights[self._source[name]]

    def __iter__(self):
        return iter(self._source)

    def __len__(self):
        return len(self._source)
