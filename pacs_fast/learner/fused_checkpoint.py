"""Checkpoints of a model whose tensors transformers fuses when it loads them, in the layout of the model's own
checkpoint. transformers 5 loads a mixture of experts' per-expert weights (Qwen3-MoE's and OLMoE's
``mlp.experts.<e>.{gate,up,down}_proj.weight``, Mixtral's ``block_sparse_moe.experts.<e>.w1/w2/w3``, DeepSeek-V2's)
into one tensor a layer (``mlp.experts.gate_up_proj`` ``[E, 2F, H]``, ``down_proj`` ``[E, H, F]``), and its
``save_pretrained`` writes them back under the hub's names. The learner's checkpoints do as it does
(:meth:`FusedLayout.to_checkpoint`: transformers' own ``revert_weight_conversion``), so that every loader of the
hub's layout reads them (transformers 4, vLLM before 0.32, converters to other formats: the fused names had been
written, which they do not know), and reads both layouts back (:meth:`FusedLayout.model_weights`: a checkpoint
written before 2026-12-07 holds the fused names).

Reading back inverts the revert exactly without knowing what it does: the revert only moves elements (splits,
chunks, transposes), so reverting tensors that hold their own element indices tells where each element of each
checkpoint tensor goes in the model's tensors. transformers 4 fuses nothing: no layout there."""
from __future__ import annotations

from collections.abc import Mapping

import torch

from pacs_fast.data.checkpoint_names import unit_of


class FusedLayout:
    """How a model's tensors (model names) and its checkpoint's (the hub's names) correspond, found once on ``meta``
    stand-ins: :attr:`renamed` ``{model name: checkpoint name}`` for tensors kept whole (most: the same name), and for
    the others, grouped by unit (a transformer block, :func:`unit_of`), :attr:`fused` ``{unit: (model names,
    {checkpoint name: shape})}``. Use :meth:`of`."""

    def __init__(self, model, shapes: dict[str, tuple[tuple[int, ...], torch.dtype]], renamed: dict[str, str],
                 fused: dict[str, tuple[list[str], dict[str, tuple[int, ...]]]]):
        self.model, self.shapes, self.renamed, self.fused = model, shapes, renamed, fused

    @classmethod
    def of(cls, model, named_tensors) -> FusedLayout | None:
        """The layout of ``model`` (a transformers model; a PEFT model's base is read) for ``named_tensors``
        (``(model name, tensor)`` pairs; only shapes and dtypes are read). None when transformers fuses none of
        them (its revert gives each back whole, renamed or not), under transformers 4, or when its revert fails on
        stand-ins (the model's names are then written, as before)."""
        try:
            from transformers.core_model_loading import revert_weight_conversion
        except ImportError:
            return None
        model = model.get_base_model() if hasattr(model, "get_base_model") else model
        shapes = {n: (tuple(t.shape), t.dtype) for n, t in named_tensors}
        meta = {n: torch.empty(s, dtype=d, device="meta") for n, (s, d) in shapes.items()}
        try:
            reverted = revert_weight_conversion(model, dict(meta))
        except Exception:  # noqa: BLE001 - a conversion it cannot reverse on stand-ins: the model's names
            return None
        found = {id(t): n for n, t in reverted.items()}
        renamed = {n: found[id(t)] for n, t in meta.items() if id(t) in found}
        if len(renamed) == len(meta):
            return None
        units: dict[str, list[str]] = {}
        for n in meta:
            if n not in renamed:
                units.setdefault(unit_of(n), []).append(n)
        fused = {}
        for unit, names in units.items():  # (each unit's reverted alone: what a bucket of whole units is)
            try:
                part = revert_weight_conversion(model, {n: meta[n] for n in names})
            except Exception:  # noqa: BLE001 - as above
                return None
            fused[unit] = (names, {n: tuple(t.shape) for n, t in part.items()})
        made = {n for _, out in fused.values() for n in out}
        if made != set(reverted) - set(renamed.values()):  # (a unit's revert needed another unit's tensors)
            return None
        return cls(model, shapes, renamed, fused)

    def to_checkpoint(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A bucket of whole units (model names) under the checkpoint's names and shapes: transformers'
        ``revert_weight_conversion``, what its ``save_pretrained`` writes."""
        from transformers.core_model_loading import revert_weight_conversion

        return revert_weight_conversion(self.model, tensors)

    def model_weights(self, weights: Mapping, shapes: dict[str, tuple[int, ...]]) -> Mapping:
        """``weights`` (a checkpoint's ``{name: tensor}``, lazy or not; ``shapes`` its names' shapes) under the
        model's names, with ``.shapes``: a checkpoint in the hub's layout is read as the model holds it
        (:class:`ModelNamedWeights`), one written under the model's own names (before 2026-12-07) as it is."""
        if all(n in shapes for names, _ in self.fused.values() for n in names):
            return weights if getattr(weights, "shapes", None) is not None else _Shaped(weights, shapes)
        return ModelNamedWeights(self, weights, shapes)


class _Shaped(Mapping):
    """A mapping as it is, with the ``.shapes`` a learner's load reads."""

    def __init__(self, weights: Mapping, shapes: dict):
        self._weights, self.shapes = weights, dict(shapes)

    def __getitem__(self, name):
        return self._weights[name]

    def __contains__(self, name) -> bool:
        return name in self.shapes

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self):
        return len(self.shapes)


class ModelNamedWeights(Mapping):
    """A hub-layout checkpoint's tensors under the model's names (:meth:`FusedLayout.model_weights`). A kept tensor is
    the checkpoint's, read when asked for; a fused one is assembled, with the rest of its unit's, from the
    checkpoint tensors its unit reverts into, when the first of them is asked for (then held until each is taken: a
    block's experts). :attr:`shapes`: ``{name: shape}`` of what it holds: a unit whose checkpoint tensors are some
    there, some missing or of other shapes is a ValueError naming them; one wholly absent leaves its fused tensors
    out (a load names them missing), and a checkpoint name the model has no use for is kept under its own (a load
    names it unknown)."""

    def __init__(self, layout: FusedLayout, weights: Mapping, shapes: dict[str, tuple[int, ...]]):
        self._layout, self._weights = layout, weights
        self._source: dict[str, str] = {}  # model name -> checkpoint name, for tensors kept whole
        self._unit: dict[str, str] = {}  # model name -> unit, for fused ones
        used = set()
        for model_name, ckpt_name in layout.renamed.items():
            if ckpt_name in shapes:
                self._source[model_name] = ckpt_name
                used.add(ckpt_name)
        for unit, (names, parts) in layout.fused.items():
            absent = [n for n in parts if n not in shapes]
            wrong = [f"{n} {tuple(shapes[n])} (not {s})" for n, s in parts.items() if n in shapes and shapes[n] != s]
            if len(absent) < len(parts) and (absent or wrong):  # (a unit wholly absent: its tensors named missing)
                raise ValueError(f"load_hf_weights: the checkpoint's tensors that make the model's {', '.join(names)} "
                                 f"are not all there: {len(absent)} missing ({', '.join(absent[:3])}), {len(wrong)} of "
                                 f"another shape ({', '.join(wrong[:3])})")
            if not absent:
                self._unit.update(dict.fromkeys(names, unit))
                used.update(parts)
        self._source.update({n: n for n in shapes if n not in used and n not in self._unit})
        self.shapes = {m: tuple(shapes[c]) for m, c in self._source.items()}
        self.shapes.update({m: layout.shapes[m][0] for m in self._unit})
        self._ready: dict[str, torch.Tensor] = {}

    def __contains__(self, name) -> bool:  # (Mapping's own reads the tensor)
        return name in self.shapes

    def __iter__(self):
        return iter(self.shapes)

    def __len__(self):
        return len(self.shapes)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self._source:
            return self._weights[self._source[name]]
        if name not in self._ready:
            self._ready.update(self._assemble(self._unit[name]))
        return self._ready.pop(name)

    def _assemble(self, unit: str) -> dict[str, torch.Tensor]:
        """The unit's fused tensors: each element put where the revert of its model tensor's element index took it."""
        from transformers.core_model_loading import revert_weight_conversion

        names, parts = self._layout.fused[unit]
        sizes = [torch.Size(self._layout.shapes[n][0]).numel() for n in names]
        total = sum(sizes)
        kind = torch.int32 if total < 2**31 else torch.int64
        index, start = {}, 0
        for n, size in zip(names, sizes):
            index[n] = torch.arange(start, start + size, dtype=kind).view(self._layout.shapes[n][0])
            start += size
        places = revert_weight_conversion(self._layout.model, index)
        if set(places) != set(parts) or sum(p.numel() for p in places.values()) != total:
            raise ValueError(f"load_hf_weights: the checkpoint's tensors of {unit} do not make the model's "
                             f"{', '.join(names)} (transformers' revert of them gave other names or sizes)")
        flat = None
        for ckpt_name, place in places.items():
            t = self._weights[ckpt_name]
            if flat is None:
                flat = torch.empty(total, dtype=t.dtype)
            flat[place.reshape(-1).long()] = t.reshape(-1).to(flat.dtype)
            del t
        out, start = {}, 0
        for n, size in zip(names, sizes):
            out[n] = flat[start:start + size].view(self._layout.shapes[n][0])
            start += size
        return out
