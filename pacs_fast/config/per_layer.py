"""Decoder widths that vary by layer, read from a config object or its ``config.json``.

transformers 5 builds "heterogeneous" configs: Gemma 4's full-attention layers have ``global_head_dim`` heads (512
beside 256) and, with ``attention_k_eq_v``, ``num_global_key_value_heads`` key / value heads; such a config raises
``AmbiguousGlobalPerLayerAttributeError`` (a RuntimeError, which ``getattr(c, k, default)`` does not catch) when
``head_dim`` is read off it, and writes the overrides into ``config.json`` as ``per_layer_config``
(``{"05": {"head_dim": 512}, ...}``); the hub's files give ``global_head_dim`` instead. Gemma 4's last
``num_kv_shared_layers`` layers reuse an earlier layer's keys and values: no key / value projections, no cache.
"""
from __future__ import annotations


def config_attr(config, key: str, default=None):
    """``getattr(config, key, default)`` that reads a heterogeneous config's global value instead of raising (the
    value the config was given for all layers; :func:`layer_widths` has each layer's)."""
    try:
        return getattr(config, key, default)
    except RuntimeError:  # (transformers' AmbiguousGlobalPerLayerAttributeError)
        read = getattr(config, "_getattr_without_heterogeneous_validation", None)
        return read(key, default) if read is not None else default


def text_dict(config) -> dict:
    """The decoder's config as a dict: a config object's ``to_dict()`` (its text config's), or a ``config.json``
    dict (its ``text_config``)."""
    if hasattr(config, "to_dict"):
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return text.to_dict()
    return config.get("text_config") or config if isinstance(config, dict) else {}


def layer_widths(config) -> list[tuple[int, int, bool]]:
    """``(head_dim, kv_heads, has_kv)`` of each decoder layer: the config's own values, a layer's
    ``per_layer_config`` override, else for a full-attention layer ``global_head_dim`` /
    ``num_global_key_value_heads`` where given (Gemma 4's hub keys; the key / value heads only with
    ``attention_k_eq_v``); ``has_kv`` False for the last ``num_kv_shared_layers`` layers. Empty when the config
    does not give the decoder's shape."""
    c = text_dict(config)
    layers, heads, hidden = c.get("num_hidden_layers"), c.get("num_attention_heads"), c.get("hidden_size")
    if not (layers and heads and hidden):
        return []
    head_dim = int(c.get("head_dim") or hidden // heads)
    kv = int(c.get("num_key_value_heads") or heads)
    overrides = {int(k): v for k, v in (c.get("per_layer_config") or {}).items() if isinstance(v, dict)}
    types = c.get("layer_types") or []
    shared_from = int(layers) - int(c.get("num_kv_shared_layers") or 0)
    out = []
    for i in range(int(layers)):
        hd, k = head_dim, kv
        if i in overrides:
            hd, k = int(overrides[i].get("head_dim", hd)), int(overrides[i].get("num_key_value_heads", k))
        elif not overrides and i < len(types) and types[i] == "full_attention":
            hd = int(c.get("global_head_dim") or hd)
            if c.get("attention_k_eq_v") and c.get("num_global_key_value_heads"):
                k = int(c["num_global_key_value_heads"])
        out.append((hd, k, i < shared_from))
    return out


def per_layer_input_params(config) -> int:
    """The parameters of Gemma 3n's / Gemma 4's per-layer inputs (``hidden_size_per_layer_input`` > 0): a second
    embedding of ``vocab_size_per_layer_input`` rows by ``layers x d`` (262,144 x 35 x 256 = 2.3B in Gemma 4 E2B,
    more than its decoder), the model's projection to it, and each layer's gate and projection (their norms, a few
    thousand, left out as the model's other norms are); 0 for other models."""
    c = text_dict(config)
    d, layers, hidden = c.get("hidden_size_per_layer_input") or 0, c.get("num_hidden_layers"), c.get("hidden_size")
    if not (d and layers and hidden):
        return 0
    vocab = int(c.get("vocab_size_per_layer_input") or c.get("vocab_size") or 0)
    return vocab * layers * d + hidden * layers * d + layers * 2 * hidden * d


def attention_widths(config) -> list[tuple[int, int, int]] | None:
    """``(q, k, v)`` output widths of each layer's query, key and value projections (``heads x head_dim``, ``kv_heads x
    head_dim``; 0 where the layer has none: Gemma 4's KV-shared layers have neither, its full-attention layers under
    ``attention_k_eq_v`` no value projection) for a config whose layers differ (:func:`layer_widths`), else None (the
    uniform ``layers x`` one layer's counts hold)."""
    c = text_dict(config)
    widths = layer_widths(c)
    if not widths or len({w for w in widths}) == 1 and not c.get("attention_k_eq_v"):
        return None
    heads, types = int(c["num_attention_heads"]), c.get("layer_types") or []
    out = []
    for i, (hd, kv, has_kv) in enumerate(widths):
        shares_v = bool(c.get("attention_k_eq_v")) and i < len(types) and types[i] != "sliding_attention"
        out.append((heads * hd, kv * hd if has_kv else 0, kv * hd if has_kv and not shares_v else 0))
    return out


def cached_kv_width(config) -> int | None:
    """Elements the KV cache holds a token, all layers: ``2 x kv_heads x head_dim`` of each layer with keys and values
    of its own (:func:`layer_widths`), for a config whose layers differ; None otherwise."""
    c = text_dict(config)
    if attention_widths(c) is None:
        return None
    return sum(2 * kv * hd for hd, kv, has_kv in layer_widths(c) if has_kv)


def wide_mlp_layers(config) -> int:
    """Layers whose MLP is twice ``intermediate_size`` wide (Gemma 4's ``use_double_wide_mlp``: its KV-shared
    layers), else 0."""
    c = text_dict(config)
    return int(c.get("num_kv_shared_layers") or 0) if c.get("use_double_wide_mlp") else 0


def layer_shape(config) -> dict:
    """What a shape dict (:func:`pacs_fast.learner.flops.shape_of`, :func:`pacs_fast.trainer.memory_model.model_shape`)
    adds for layers that differ: ``attention_widths`` (:func:`attention_widths`), ``cached_kv``
    (:func:`cached_kv_width`), ``wide_mlp_layers`` (:func:`wide_mlp_layers`), ``per_layer_inputs``
    (:func:`per_layer_input_params`) and ``per_layer_input_dim``, ``mlp_total`` (MLP widths that differ by layer:
    their sum) and ``altup`` (:func:`altup_laurel`), each only where it applies (nothing for the many uniform
    models)."""
    c = text_dict(config)  # (once: a config object's to_dict() for every reading below)
    found = {"attention_widths": attention_widths(c), "cached_kv": cached_kv_width(c), "wide_mlp_layers":
             wide_mlp_layers(c), "altup": altup_laurel(c), "per_layer_inputs": per_layer_input_params(c)}
    widths = mlp_widths(c)
    if widths and len(set(widths)) > 1:
        found["mlp_total"] = sum(widths)
    if found["per_layer_inputs"]:
        found["per_layer_input_dim"] = int(c["hidden_size_per_layer_input"])
    return {k: v for k, v in found.items() if v}


def mlp_widths(config) -> list[int] | None:
    """Each layer's MLP width where the config gives one per layer (Gemma 3n's ``intermediate_size`` is a list), else
    None (``intermediate_size`` is one number)."""
    widths = text_dict(config).get("intermediate_size")
    return [int(w) for w in widths] if isinstance(widths, (list, tuple)) and widths else None


def intermediate_of(config) -> int | None:
    """``intermediate_size`` as one number: itself, or the mean of a per-layer list (:func:`mlp_widths`; exact where
    the layers agree, and the counts take the list's sum: ``mlp_total`` of :func:`layer_shape`)."""
    widths = mlp_widths(config)
    if widths:
        return round(sum(widths) / len(widths))
    value = text_dict(config).get("intermediate_size")
    return int(value) if value else None


def altup_laurel(config) -> dict | None:
    """Gemma 3n's AltUp (``altup_num_inputs`` n: a router ``n x H``, prediction ``n^2 x n`` and correction ``n x n``
    coefficients a layer, ``2 (n - 1)`` projections ``H x H`` of the model) and LAuReL (``laurel_rank`` r: two ``H x
    r`` projections a layer) as ``{"n", "laurel"}``; None for other models."""
    c = text_dict(config)
    n, r = c.get("altup_num_inputs"), c.get("laurel_rank")
    return {"n": int(n), "laurel": int(r)} if n and r else None


def altup_laurel_params(shape: dict) -> int:
    """The weights of :func:`altup_laurel` (``shape["altup"]``), 0 without."""
    a = shape.get("altup")
    if not a:
        return 0
    H, L, n = shape["hidden"], shape["layers"], a["n"]
    return L * (2 * H * a["laurel"] + n * H + n ** 3 + n * n) + 2 * (n - 1) * H * H


def altup_laurel_adapters(shape: dict) -> int:
    """What rank-1 LoRA adapters on every one of :func:`altup_laurel`'s linear layers hold (``in + out`` each): the
    LAuReL pair, the router and both coefficient layers a layer, the model's projections."""
    a = shape.get("altup")
    if not a:
        return 0
    H, L, n = shape["hidden"], shape["layers"], a["n"]
    return L * (2 * (H + a["laurel"]) + (H + n) + (n + n * n) + 2 * n) + 2 * (n - 1) * 2 * H
