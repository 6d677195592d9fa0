"""A policy's weights written as a Hugging Face folder, one bucket of whole layers at a time.

Both learners write the transformers layout: one bucket is ``model.safetensors``; several are
``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json`` (``{"metadata": {"total_size":
bytes}, "weight_map": {name: file}}``), which ``from_pretrained``, vLLM and :func:`~pacs_fast.trainer.checkpoint.
load_checkpoint` read. Each file is written atomically; a bucket never splits a unit (a transformer block, the
embedding, ...; :func:`pacs_fast.data.checkpoint_names.unit_of`), so it may exceed its size by up to one unit.
Writing a bucket at a time bounds the host memory a save takes to about one bucket, not the model (a 7B policy
in fp32 is 28 GB).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

from pacs_fast.data.checkpoint_names import unit_of
from pacs_fast.files import write_atomic

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
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
