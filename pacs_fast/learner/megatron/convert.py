"""Weight conversion between Hugging Face (Qwen2 / Qwen3 / Llama) and megatron-core ``GPTModel`` shards.

Layouts (megatron local spec, tensor-parallel size ``tp``, rank ``r``):

- ``linear_qkv`` (weight ``[(nq + 2 nkv) d, H]``, bias likewise): fused and interleaved per query
  group — for each of the ``nkv`` groups ``g``: its ``nq/nkv`` query heads, then key head ``g``,
  then value head ``g`` (``d`` = head size). Rank ``r`` holds the contiguous groups
  ``[r nkv/tp, (r+1) nkv/tp)``, i.e. the ``r``-th of ``tp`` equal row chunks of the fused tensor.
- ``linear_fc1`` (``[2 F, H]``): the gated MLP halves ``[gate; up]``; rank ``r`` holds
  ``[gate_r; up_r]`` (its chunk of each half, stacked), not a chunk of the stacked tensor.
- ``linear_proj`` (o_proj) and ``linear_fc2`` (down_proj): row-parallel, split along columns.
- word embeddings and the untied ``output_layer``: vocabulary rows padded with zeros up to a
  multiple of ``tp`` (:func:`~pacs_fast.learner.megatron.model.padded_vocab_size`), then split
  into ``tp`` contiguous shards. Tied models have no ``output_layer.weight`` (megatron reuses the
  embedding shard) and HF's ``lm_head.weight`` is omitted on export, as ``save_pretrained`` does.
- norms: replicated.

The pure functions (:func:`hf_to_megatron`, :func:`megatron_to_hf`) work on plain state dicts and
need no process group; :func:`load_hf_into_model` and :func:`export_hf_state_dict` move weights
into / out of a live (sharded) model.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from pacs_fast.learner.megatron.model import check_hf_config, head_dim, padded_vocab_size


# ----------------------------------------------------------------------------- helpers
def _dims(hf_config):
    n_q = hf_config.num_attention_heads
    n_kv = getattr(hf_config, "num_key_value_heads", None) or n_q
    return n_q, n_kv, head_dim(hf_config)


def _tied(hf_config) -> bool:
    return bool(getattr(hf_config, "tie_word_embeddings", False))


def _fuse_qkv(q, k, v, hf_config):
    """HF q/k/v (weights [heads*d, H] or biases [heads*d]) -> megatron fused, grouped layout."""
    n_q, n_kv, d = _dims(hf_config)
    rest = q.shape[1:]
    q = q.reshape(n_kv, (n_q // n_kv) * d, *rest)
    k = k.reshape(n_kv, d, *rest)
    v = v.reshape(n_kv, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _split_qkv(qkv, hf_config):
    """Inverse of :func:`_fuse_qkv`."""
    n_q, n_kv, d = _dims(hf_config)
    rest = qkv.shape[1:]
    g = qkv.reshape(n_kv, (n_q // n_kv + 2) * d, *rest)
    q, k, v = torch.split(g, [(n_q // n_kv) * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _pad_vocab(w, hf_config, tp):
    vp = padded_vocab_size(hf_config.vocab_size, tp)
    if w.shape[0] != hf_config.vocab_size:
        raise ValueError(f"embedding has {w.shape[0]} rows, hf_config.vocab_size={hf_config.vocab_size}")
    if vp == w.shape[0]:
        return w
    return torch.cat([w, w.new_zeros(vp - w.shape[0], *w.shape[1:])], dim=0)


# Each rule: megatron suffix -> (kind, HF names). kind: "rep" replicated, "col" split dim 0,
# "row" split dim 1, "qkv", "fc1", "vocab".
def _layer_rules(hf_config, i):
    pre = f"model.layers.{i}."
    rules = {
        "input_layernorm.weight": ("rep", [pre + "input_layernorm.weight"]),
        "self_attention.linear_qkv.weight": ("qkv", [pre + f"self_attn.{p}_proj.weight" for p in "qkv"]),
        "self_attention.linear_proj.weight": ("row", [pre + "self_attn.o_proj.weight"]),
        "pre_mlp_layernorm.weight": ("rep", [pre + "post_attention_layernorm.weight"]),
        "mlp.linear_fc1.weight": ("fc1", [pre + "mlp.gate_proj.weight", pre + "mlp.up_proj.weight"]),
        "mlp.linear_fc2.weight": ("row", [pre + "mlp.down_proj.weight"]),
    }
    if hf_config.model_type == "qwen2":
        rules["self_attention.linear_qkv.bias"] = ("qkv", [pre + f"self_attn.{p}_proj.bias" for p in "qkv"])
    if hf_config.model_type == "qwen3":  # one [head_dim] weight each, the same on every tensor-parallel rank
        rules["self_attention.q_layernorm.weight"] = ("rep", [pre + "self_attn.q_norm.weight"])
        rules["self_attention.k_layernorm.weight"] = ("rep", [pre + "self_attn.k_norm.weight"])
    return {f"decoder.layers.{i}.{k}": v for k, v in rules.items()}


def conversion_rules(hf_config) -> dict[str, tuple[str, list[str]]]:
    """megatron parameter name -> (layout kind, HF names it is made of), for ``hf_config``."""
    check_hf_config(hf_config)
    rules = {"embedding.word_embeddings.weight": ("vocab", ["model.embed_tokens.weight"])}
    for i in range(hf_config.num_hidden_layers):
        rules.update(_layer_rules(hf_config, i))
    rules["decoder.final_layernorm.weight"] = ("rep", ["model.norm.weight"])
    if not _tied(hf_config):
        rules["output_layer.weight"] = ("vocab", ["lm_head.weight"])
    return rules


# ----------------------------------------------------------------------------- pure conversion
def hf_to_megatron(hf_state: Mapping, hf_config, *, tp_size: int = 1, tp_rank: int = 0) -> dict:
    """Rank ``tp_rank``'s megatron parameter shards from a full HF state dict.

    ``hf_state`` maps HF names to full tensors (any ``Mapping``, e.g. a lazy checkpoint view; each
    tensor is read once; extra keys such as a tied ``lm_head.weight`` are ignored). Returns megatron
    parameter name -> tensor (new memory, same dtype as the input).
    """
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank={tp_rank} must be in [0, tp_size={tp_size})")
    out = {}
    for name, (kind, hf_names) in conversion_rules(hf_config).items():
        missing = [n for n in hf_names if n not in hf_state]
        if missing:
            raise ValueError(f"hf_state is missing {missing}")
        out[name] = _shard_of(kind, [hf_state[n] for n in hf_names], hf_config, tp_size, tp_rank).clone().contiguous()
    return out


def _shard_of(kind: str, ts: list, hf_config, tp_size: int, tp_rank: int) -> torch.Tensor:
    """Rank ``tp_rank``'s shard of one megatron parameter of ``kind`` from its full HF tensors ``ts`` (a view of
    them where the layout allows)."""
    if kind == "rep":
        return ts[0]
    if kind == "row":
        return ts[0].chunk(tp_size, dim=1)[tp_rank]
    if kind == "vocab":
        return _pad_vocab(ts[0], hf_config, tp_size).chunk(tp_size, dim=0)[tp_rank]
    if kind == "qkv":
        return _fuse_qkv(*ts, hf_config).chunk(tp_size, dim=0)[tp_rank]
    if kind == "fc1":
        return torch.cat([t.chunk(tp_size, dim=0)[tp_rank] for t in ts], dim=0)
    raise AssertionError(kind)  # pragma: no cover - the table of conversion_rules is closed


def merge_shard(kind: str, shards: list) -> torch.Tensor:
    """Full megatron tensor (TP=1 layout) from the ``tp`` shards of a parameter of ``kind``."""
    if kind == "rep" or len(shards) == 1:  # one shard: the full tensor itself (no copy)
        return shards[0]
    if kind == "row":
        return torch.cat(shards, dim=1)
    if kind in ("vocab", "qkv"):
        return torch.cat(shards, dim=0)
    if kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    raise ValueError(f"unknown kind {kind!r}")


def unit_rules(hf_config) -> list[tuple[str, dict[str, tuple[str, list[str]]]]]:
    """:func:`conversion_rules` cut into units, in checkpoint order: ``[(unit, rules), ...]`` with
    unit ``"model.embed_tokens"``, ``"model.layers.<i>"``, ``"model.norm"``, ``"lm_head"`` (the unit
    names of :func:`pacs_fast.data.checkpoint_names.unit_of`). A unit is what a weight-sync or export
    bucket never splits."""
    units: dict[str, dict] = {}
    for name, rule in conversion_rules(hf_config).items():
        hf = rule[1][0]
        unit = ".".join(hf.split(".")[:3]) if hf.startswith("model.layers.") else hf.rpartition(".")[0]
        units.setdefault(unit, {})[name] = rule
    return list(units.items())


def hf_shapes(local_shapes: Mapping, hf_config, *, tp_size: int = 1, rules: Mapping | None = None) -> dict:
    """``{hf_name: full shape}`` inferred from this rank's megatron shard shapes (no communication):
    what a gather of these shards would produce. Raises ValueError naming the parameter when a
    shard's shape cannot come from ``hf_config`` (e.g. a wrong size)."""
    n_q, n_kv, d = _dims(hf_config)
    out = {}
    for name, (kind, hf_names) in (rules or conversion_rules(hf_config)).items():
        if name not in local_shapes:
            raise ValueError(f"no shard for megatron parameter {name!r}")
        s = list(local_shapes[name])
        if kind == "rep":
            out[hf_names[0]] = tuple(s)
        elif kind == "row":
            out[hf_names[0]] = (s[0], s[1] * tp_size, *s[2:])
        elif kind == "vocab":
            vp = padded_vocab_size(hf_config.vocab_size, tp_size)
            if s[0] * tp_size != vp:
                raise ValueError(f"{name}: shard of {s[0]} rows x tp={tp_size} != padded vocabulary {vp}")
            out[hf_names[0]] = (hf_config.vocab_size, *s[1:])
        elif kind == "qkv":
            full = s[0] * tp_size
            if full != (n_q + 2 * n_kv) * d:
                raise ValueError(f"{name}: shard of {s[0]} rows x tp={tp_size} != (heads {n_q} + 2 x kv heads "
                                 f"{n_kv}) x head size {d}")
            for hf, heads in zip(hf_names, (n_q, n_kv, n_kv)):
                out[hf] = (heads * d, *s[1:])
        elif kind == "fc1":
            if s[0] % 2:
                raise ValueError(f"{name}: shard of {s[0]} rows is not [gate; up] halves")
            for hf in hf_names:
                out[hf] = (s[0] // 2 * tp_size, *s[1:])
        else:  # pragma: no cover
            raise AssertionError(kind)
    return out


def megatron_to_hf(shards: list[dict], hf_config, *, rules: Mapping | None = None) -> dict:
    """Full HF state dict from the megatron state dicts of all ``tp`` ranks (``shards[r]``).

    Vocabulary padding is stripped; a tied model gives no ``lm_head.weight``. ``rules``: a subset
    of :func:`conversion_rules` (e.g. one unit of :func:`unit_rules`) to convert only those.
    """
    if not shards:
        raise ValueError("shards must hold one state dict per tensor-parallel rank")
    out = {}
    for name, (kind, hf_names) in (rules or conversion_rules(hf_config)).items():
        missing = [r for r, sd in enumerate(shards) if name not in sd]
        if missing:
            raise ValueError(f"shards of ranks {missing} are missing {name!r}")
        full = merge_shard(kind, [sd[name] for sd in shards])
        if kind == "vocab":
            out[hf_names[0]] = full[: hf_config.vocab_size]
        elif kind == "qkv":
            out.update(zip(hf_names, _split_qkv(full, hf_config)))
        elif kind == "fc1":
            out.update(zip(hf_names, full.chunk(2, dim=0)))
        else:
            out[hf_names[0]] = full
    return {k: v.contiguous() for k, v in out.items()}


# ----------------------------------------------------------------------------- live models
def _model_params(model) -> dict:
    return dict(model.named_parameters())


@torch.no_grad()
def load_hf_into_model(model, hf_state: Mapping, hf_config, *, tp_size: int = 1, tp_rank: int = 0,
                       shapes: Mapping | None = None) -> None:
    """Copy a full HF state dict into this rank's megatron ``GPTModel`` shard (in place).

    Every model parameter must be covered and every shape must match, else ValueError, before anything is copied.
    ``shapes``: ``{hf_name: shape}`` of ``hf_state`` (default: its ``shapes`` attribute, a
    :class:`~pacs_fast.learner.hf_folder.LazyHFCheckpoint`'s from its file headers, else its tensors').
    Then a parameter at a time: its HF tensors are read (``hf_state[name]``), its shard copied into place, they are
    dropped: with a lazy ``hf_state`` host memory holds one parameter's full tensors (at most the embedding, or
    q/k/v, or gate/up), not the model nor this rank's shards.
    """
    rules = conversion_rules(hf_config)
    params = _model_params(model)
    if set(params) != set(rules):
        raise ValueError(f"model parameters and converted names differ: only in model "
                         f"{sorted(set(params) - set(rules))}, only converted {sorted(set(rules) - set(params))}")
    want = hf_shapes({n: p.shape for n, p in params.items()}, hf_config, tp_size=tp_size, rules=rules)
    missing = [n for n in want if n not in hf_state]
    if missing:
        raise ValueError(f"hf_state is missing {missing}")
    shapes = getattr(hf_state, "shapes", None) if shapes is None else shapes
    got = {n: tuple(shapes[n] if shapes is not None else hf_state[n].shape) for n in want}
    wrong = [f"{n}: {got[n]} (the model's: {want[n]})" for n in want if got[n] != tuple(want[n])]
    if wrong:
        raise ValueError(f"wrong shapes of {len(wrong)} HF tensor(s): {'; '.join(wrong[:5])}")
    for name, (kind, hf_names) in rules.items():
        params[name].copy_(_shard_of(kind, [hf_state[n] for n in hf_names], hf_config, tp_size, tp_rank))


@torch.no_grad()
def gather_unit(local: Mapping, rules: Mapping, hf_config, *, tp_group=None, dst: int | None = None,
                dtype=None) -> dict | None:
    """Full HF tensors of the parameters in ``rules`` (one unit of :func:`unit_rules`) from this
    rank's megatron shards ``local``; collective over ``tp_group``.

    Shards are cast to ``dtype`` (if given) before they travel. ``dst=None``: every TP rank gets
    the tensors (all-gather); ``dst=r``: only TP-group rank ``r`` does (others get None), so no
    other rank ever holds a full tensor. Only this unit's tensors are alive: memory is one unit.
    """
    import torch.distributed as dist

    tp = 1 if tp_group is None else dist.get_world_size(tp_group)
    me = 0 if tp_group is None else dist.get_rank(tp_group)
    receives = dst is None or me == dst
    merged = {}
    for name, (kind, _) in rules.items():
        if name not in local:
            raise ValueError(f"no tensor for megatron parameter {name!r}")
        t = local[name].detach()
        if dtype is not None and t.dtype != dtype:
            t = t.to(dtype)
        if tp == 1 or kind == "rep":
            merged[name] = t
            continue
        t = t.contiguous()
        parts = None
        if receives:
            if kind in ("vocab", "qkv"):  # row chunks: gather straight into the full tensor (no concat copy)
                full = torch.empty((t.shape[0] * tp, *t.shape[1:]), dtype=t.dtype, device=t.device)
                parts = list(full.chunk(tp))
            else:
                parts = [torch.empty_like(t) for _ in range(tp)]
        # into the output tensors directly: gloo's collectives stage through a flat copy of the
        # output (a second full tensor), so on CPU the shards travel point to point
        if dst is None and t.device.type != "cpu":
            if kind in ("vocab", "qkv"):
                dist.all_gather_into_tensor(full, t, group=tp_group)
            else:
                dist.all_gather(parts, t, group=tp_group)
        elif dst is None:
            reqs = []
            for r in range(tp):
                if r == me:
                    parts[r].copy_(t)
                else:
                    reqs.append(dist.isend(t, group_dst=r, group=tp_group))
                    reqs.append(dist.irecv(parts[r], group_src=r, group=tp_group))
            for q in reqs:
                q.wait()
        elif me == dst:
            for r in range(tp):
                if r == me:
                    parts[r].copy_(t)
                else:
                    dist.recv(parts[r], group_src=r, group=tp_group)
        else:
            dist.send(t, group_dst=dst, group=tp_group)
        if receives:
            merged[name] = full if kind in ("vocab", "qkv") else merge_shard(kind, parts)
        del parts
    if not receives:
        return None
    return megatron_to_hf([merged], hf_config, rules=rules)


@torch.no_grad()
def gather_to_hf(local: dict, hf_config, *, tp_group=None) -> dict:
    """Full HF-named tensors from this rank's megatron-named shards ``local`` (parameters, their
    gradients, or per-parameter optimiser state); collective over ``tp_group``.

    ``local`` must hold every megatron parameter name of :func:`conversion_rules`. Every rank of
    ``tp_group`` must call it and gets the full dict. ``tp_group=None``: unsharded.
    """
    import torch.distributed as dist

    tp = 1 if tp_group is None else dist.get_world_size(tp_group)
    gathered = [dict() for _ in range(tp)]
    for name, (kind, _) in conversion_rules(hf_config).items():
        if name not in local:
            raise ValueError(f"no tensor for megatron parameter {name!r}")
        t = local[name].detach()
        if tp == 1 or kind == "rep":
            parts = [t] * tp
        else:
            parts = [torch.empty_like(t) for _ in range(tp)]
            dist.all_gather(parts, t.contiguous(), group=tp_group)
        for r in range(tp):
            gathered[r][name] = parts[r]
    return megatron_to_hf(gathered, hf_config)


@torch.no_grad()
def export_hf_state_dict(model, hf_config, *, tp_group=None, dtype=None, grads: bool = False) -> dict:
    """The full HF state dict of a (TP-sharded) megatron ``GPTModel``; collective over ``tp_group``.

    Every rank of ``tp_group`` must call it; every rank gets the full dict (CPU tensors, ``dtype``
    or the parameters' dtype). With ``tp_group=None`` the model is taken as unsharded. With
    ``grads=True`` the parameters' ``.grad`` are exported instead (zeros where None), in HF names.
    """
    local = {}
    for name, p in _model_params(model).items():
        t = p.grad if grads else p
        local[name] = torch.zeros_like(p) if t is None else t
    hf = gather_to_hf(local, hf_config, tp_group=tp_group)
    return {k: v.to(device="cpu", dtype=dtype or v.dtype).clone() for k, v in hf.items()}
