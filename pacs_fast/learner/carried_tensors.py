"""The tensors of a model folder that transformers does not load into the model, carried unchanged into every
checkpoint of a run that trains it.

A model class names what its checkpoints hold beyond the model itself in ``_keys_to_ignore_on_load_unexpected``:
multi-token-prediction layers above all (Qwen3.5's and Qwen3-Next's ``mtp.*``, DeepSeek-V3's ``model.layers.61.*``,
GLM-4.5's ``model.layers.46.*``, MiMo-V2's, Ernie 4.5's, ...). ``from_pretrained`` skips them, so a checkpoint written
from the loaded model lacked them: vLLM's MTP speculative decoding refuses such a folder ("MTP speculative decoding
layer ... weights missing from checkpoint"), and a next stage could not get them back. They are copied here as the
input holds them (names, dtypes, bytes; not trained: the run's gradients never reach them), one tensor in host memory
at a time, into files of their own after the model's; a resume or a load of the checkpoint skips them, as
``from_pretrained`` does.
"""
from __future__ import annotations

import re
from pathlib import Path
from collections.abc import Mapping
from typing import Iterable, Iterator

import torch

from pacs_fast.data.checkpoint_names import unit_of

# bytes of an element of each safetensors dtype (the header's names)
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 1, "I16": 2, "U16": 2,
             "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def unloaded_pattern(model) -> re.Pattern | None:
    """One regex of the patterns ``model`` (a transformers model) declares in ``_keys_to_ignore_on_load_unexpected``
    (its submodels' included, as transformers gathers them), matched with ``search`` as transformers matches them;
    None when it declares none."""
    patterns = sorted(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())
    return re.compile("|".join(f"(?:{p})" for p in patterns)) if patterns else None


def carried_names(names: Iterable[str], pattern: re.Pattern | None, model_units: set[str]) -> list[str]:
    """The names of ``names`` (a folder's tensor names) that ``pattern`` matches (:func:`unloaded_pattern`) and that
    belong to no unit of the model (``model_units``: :func:`~pacs_fast.data.checkpoint_names.unit_of` of each name
    the model writes: a layer-number pattern such as DeepSeek-V3's ``model\\.layers\\.61`` never takes a layer the
    model holds), in ``names``' order."""
    if pattern is None:
        return []
    return [n for n in names if pattern.search(n) and unit_of(n) not in model_units]


class CarriedTensors:
    """The tensors of model folder ``source`` that the loaded model does not hold (:func:`carried_names`), read a
    tensor at a time from its weight files (:class:`~pacs_fast.learner.hf_folder.LazyHFCheckpoint`). Empty (falsy)
    for the many models that declare nothing to skip or whose folder holds none of it."""

    def __init__(self, source, pattern: re.Pattern | None, model_units: set[str]):
        from pacs_fast.learner.hf_folder import LazyHFCheckpoint

        self.source, self.pattern, self.model_units = Path(source), pattern, set(model_units)
        self._weights = {}
        if pattern is not None:
            try:
                self._weights = LazyHFCheckpoint(source)
            except (OSError, ValueError):  # (no safetensors files: a pytorch_model.bin folder holds none to carry)
                pass
        self.names = carried_names(self._weights, pattern, self.model_units)

    def __bool__(self) -> bool:
        return bool(self.names)

    def layout(self) -> Iterator[tuple[str, int]]:
        """``(name, bytes)`` of each carried tensor, from the files' headers (nothing read)."""
        from safetensors import safe_open

        for name in self.names:
            with safe_open(str(self._weights._file[name]), framework="pt") as h:
                piece = h.get_slice(name)
                yield name, _ITEMSIZE.get(piece.get_dtype(), 4) * _numel(piece.get_shape())

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of each, read as it is reached (backed by the file's mapping: no copy)."""
        for name in self.names:
            yield name, self._weights[name]

    def skipped(self, names: Iterable[str]) -> set[str]:
        """The names of ``names`` (a checkpoint's) that are carried tensors, not the model's: what a load skips."""
        return set(carried_names(names, self.pattern, self.model_units))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class WithoutCarried(Mapping):
    """A learner's ``load_hf_weights`` argument without the carried tensors of ``carried`` (a checkpoint written with
    them): ``{name: tensor}`` (a :class:`~pacs_fast.learner.hf_folder.LazyHFCheckpoint` stays lazy) and
    :attr:`shapes`, which :func:`~pacs_fast.learner.hf_folder.weights_and_shapes` takes as they are."""

    def __init__(self, named_tensors, carried: CarriedTensors):
        from pacs_fast.learner.hf_folder import weights_and_shapes

        self._weights, shapes = weights_and_shapes(named_tensors)
        skip = carried.skipped(shapes)
        self.shapes = {n: s for n, s in shapes.items() if n not in skip}

    def __contains__(self, name) -> bool:  # (Mapping's own reads the tensor)
        return name in self.shapes

    def __getitem__(self, name):
        if name not in self.shapes:
            raise KeyError(name)
        return self._weights[name]

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self):
        return len(self.shapes)
