"""Checking and bucketing learner weights before they are sent to a rollout engine.

A vLLM engine reloads weights in place (``reload_weights`` RPC). A reload that fails half way
(unknown name, wrong shape) leaves vLLM's model on the ``meta`` device, i.e. the engine is dead.
A reload that gives only *part* of one of vLLM's fused layers (say ``q_proj`` without ``k_proj``
and ``v_proj``, which vLLM stores as one ``qkv_proj``) silently fills the rest with garbage.
So everything is checked here, on names and shapes only, before a tensor leaves the learner:

- :class:`WeightSpec` knows the checkpoint's parameter names and shapes (read from the
  safetensors headers: no tensor data is loaded) and which names belong together.
- Names are grouped by *unit*: a transformer block (``...layers.<i>.``: every fused vLLM layer of
  a model lives inside one block) or, outside blocks, one module (``model.embed_tokens``,
  ``model.norm``, ``lm_head``). A sync may send any subset of units, but each unit it touches
  must be complete, and a unit's tensors must arrive next to each other.
- :func:`iter_buckets` packs consecutive complete units into buckets of about ``bucket_bytes``
  (a unit is never split, so a bucket may exceed the size by up to one unit).

Nothing here imports vLLM; the engine is in :mod:`pacs_fast.rollout.vllm_engine`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch

from pacs_fast.config.model_files import safetensors_weight_files
from pacs_fast.config.remote_code import trusted
from pacs_fast.data.checkpoint_names import unit_of

# Checkpoint entries that are buffers, not weights: vLLM's loaders skip them, learners do not send them.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")
# Input-embedding names of the usual HF causal LMs (the target of a tied ``lm_head.weight``).
_EMBED_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight", "embed_in.weight")


def read_checkpoint_shapes(model_path: str | Path) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of every tensor in the weight files of a local folder that a load reads
    (:func:`~pacs_fast.config.model_files.safetensors_weight_files`: ``model.safetensors``, else the files its
    index names; an adapter or a stale file beside them is not the model's).

    Only the file headers are read. Raises ``ValueError`` if ``model_path`` is not a folder, or that function's
    error (FileNotFoundError, ValueError) when the folder has no such files.
    """
    from safetensors import safe_open

    folder = Path(model_path)
    if not folder.is_dir():
        raise ValueError(f"model_path={str(model_path)!r} is not a folder")
    files = safetensors_weight_files(folder)
    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                shapes[key] = tuple(st.get_slice(key).get_shape())
    return shapes


def _shapes_from_config(model_path: str) -> dict[str, tuple[int, ...]]:
    """Fallback for a hub id not available locally: the HF model built on the meta device."""
    from transformers import AutoConfig

    from pacs_fast.causal_lm import auto_model_class

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trusted())
    with torch.device("meta"):
        model = auto_model_class(config).from_config(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _local_folder(model_path: str | Path) -> Path | None:
    p = Path(model_path)
    if p.is_dir():
        return p
    try:  # a hub id that vLLM (or anyone) already downloaded
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(model_path), local_files_only=True,
                                      allow_patterns=["*.json", "*.safetensors"]))
    except Exception:  # noqa: BLE001 - not cached / no hub: use the config fallback
        return None


def _tie_word_embeddings(folder: Path | None, model_path: str | Path) -> bool:
    try:
        if folder is not None and (folder / "config.json").is_file():
            cfg = json.loads((folder / "config.json").read_text())
        else:
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(str(model_path), trust_remote_code=trusted()).to_dict()
    except Exception:  # noqa: BLE001
        return False
    tie = cfg.get("tie_word_embeddings")
    if tie is None:
        tie = (cfg.get("text_config") or {}).get("tie_word_embeddings", False)
    return bool(tie)


@dataclass(frozen=True)
class WeightSpec:
    """Names and shapes a sync may carry, and how they are grouped.

    shapes: checkpoint (HF) name -> shape.
    aliases: names accepted but not sent (e.g. a tied ``lm_head.weight``) -> the name they mirror.
    """

    shapes: Mapping[str, tuple[int, ...]]
    aliases: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_pretrained(cls, model_path: str | Path) -> "WeightSpec":
        """Reads the safetensors headers (local folder or HF cache), else builds from the config."""
        folder = _local_folder(model_path)
        try:
            shapes = read_checkpoint_shapes(folder) if folder is not None else None
        except (OSError, ValueError):  # (no weight files the load would read: the config's names and shapes)
            shapes = None
        if shapes is None:
            shapes = _shapes_from_config(str(model_path))
        shapes = {k: v for k, v in shapes.items() if not k.endswith(IGNORED_SUFFIXES)}
        aliases = {}
        if _tie_word_embeddings(folder, model_path):
            embed = [k for k in shapes if k.endswith(_EMBED_SUFFIXES)]
            if len(embed) == 1:
                for head in ("lm_head.weight", "embed_out.weight"):
                    aliases[head] = embed[0]
                    shapes.pop(head, None)  # some tied checkpoints store a copy; vLLM skips it
        return cls(shapes=shapes, aliases=aliases)

    @cached_property
    def units(self) -> dict[str, frozenset[str]]:
        """unit -> the checkpoint names in it."""
        out: dict[str, set[str]] = {}
        for name in self.shapes:
            out.setdefault(unit_of(name), set()).add(name)
        return {k: frozenset(v) for k, v in out.items()}

    def expected_shape(self, name: str) -> tuple[int, ...] | None:
        if name in self.shapes:
            return tuple(self.shapes[name])
        if name in self.aliases:
            return tuple(self.shapes[self.aliases[name]])
        return None

    # -- checks ------------------------------------------------------------------------------
    def check_tensor(self, name, tensor) -> None:
        """Raises ``ValueError`` naming the tensor when it cannot be loaded."""
        if not isinstance(name, str):
            raise ValueError(f"named_tensors: names must be str, got {type(name).__name__}")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"named_tensors[{name!r}]: expected a torch.Tensor, got {type(tensor).__name__}")
        if name.endswith(IGNORED_SUFFIXES):
            return
        shape = self.expected_shape(name)
        if shape is None:
            close = sorted(k for k in self.shapes if k.rpartition(".")[2] == name.rpartition(".")[2])[:3]
            hint = f" (checkpoint names look like {close})" if close else ""
            raise ValueError(f"named_tensors: {name!r} is not a parameter of the checkpoint{hint}; "
                             "names must be Hugging Face checkpoint names")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"named_tensors[{name!r}]: shape {tuple(tensor.shape)} != checkpoint shape {shape}")
        if not tensor.is_floating_point():
            raise ValueError(f"named_tensors[{name!r}]: dtype {tensor.dtype} is not floating point")

    def check_unit(self, unit: str, names: Iterable[str]) -> None:
        """Raises ``ValueError`` unless ``names`` is the whole unit (aliases / buffers aside)."""
        given = {n for n in names if n in self.shapes}
        if not given:
            return
        missing = self.units.get(unit, frozenset()) - given
        if missing:
            raise ValueError(
                f"named_tensors: partial sync of {unit!r} (missing {sorted(missing)[:4]}"
                f"{' ...' if len(missing) > 4 else ''}); a sync must carry every parameter of each "
                "transformer block / module it touches, given consecutively (vLLM fuses e.g. "
                "q/k/v into one layer)")


def group_units(named_tensors: Iterable[tuple[str, torch.Tensor]], spec: WeightSpec,
                ) -> Iterator[tuple[str, list[tuple[str, torch.Tensor]]]]:
    """Yields ``(unit, [(name, tensor), ...])`` for each run of consecutive names of one unit.

    Each yielded unit has been checked (names, shapes, dtype, no duplicates, complete) before it
    is yielded. A unit interrupted by another one is reported as partial (its tensors must be
    consecutive); its later names would be duplicates of a complete unit.
    Aliases (a tied ``lm_head.weight``) and ignored buffers are checked and dropped.
    """
    seen_names: set[str] = set()
    unit, items = None, []

    def flush():
        spec.check_unit(unit, [n for n, _ in items])
        return unit, items

    for pair in named_tensors:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError("named_tensors must yield (name, tensor) pairs")
        name, tensor = pair
        skip = isinstance(name, str) and (name in spec.aliases or name.endswith(IGNORED_SUFFIXES))
        u = unit_of(name) if isinstance(name, str) and not skip else unit
        if u != unit and items:  # the previous unit ended: hand it on before checking the next
            yield flush()
            items = []
        spec.check_tensor(name, tensor)
        if name in seen_names:
            raise ValueError(f"named_tensors: {name!r} is given twice")
        seen_names.add(name)
        if skip:
            continue
        unit = u
        items.append((name, tensor))
    if items:
        yield flush()


def tensor_bytes(t: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    return t.numel() * (dtype or t.dtype).itemsize


def iter_buckets(named_tensors: Iterable[tuple[str, torch.Tensor]], spec: WeightSpec,
                 bucket_bytes: int, dtype: torch.dtype | None = None,
                 ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Checked buckets of whole units, each about ``bucket_bytes`` (counted in ``dtype``).

    Streaming: a bucket is yielded as soon as it is full, so a generator input is never held in
    memory whole. To check *everything* before the first bucket leaves, give a list / dict (see
    :func:`prepare`).
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for _, items in group_units(named_tensors, spec):
        bucket.extend(items)
        size += sum(tensor_bytes(t, dtype) for _, t in items)
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def prepare(named_tensors, spec: WeightSpec) -> Iterable[tuple[str, torch.Tensor]]:
    """Checks a sized input (dict / list / tuple) completely, returning it sorted unit by unit.

    Only references are kept (no tensor is copied). Any other iterable (a generator) is returned
    unchanged and is checked unit by unit while it streams.
    """
    if isinstance(named_tensors, Mapping):
        pairs = list(named_tensors.items())
    elif isinstance(named_tensors, (list, tuple)):
        pairs = list(named_tensors)
    else:
        return named_tensors
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise ValueError("named_tensors must hold (name: str, tensor) pairs")
    order: dict[str, int] = {}
    for name, _ in pairs:  # stable sort by each unit's first appearance
        order.setdefault(unit_of(name), len(order))
    pairs.sort(key=lambda p: order[unit_of(p[0])])
    for _ in group_units(pairs, spec):  # raises before anything is sent
        pass
    return pairs
