"""The Gated DeltaNet (linear-attention) layers of a hybrid model's config: Qwen3.5, Qwen3-Next.

Their ``layer_types`` mix ``linear_attention`` layers (a causal depthwise convolution over ``2 x key + value`` channels,
then a gated delta-rule recurrence whose state is ``value_heads x key_dim x value_dim`` a row) with
``full_attention`` ones (whose queries carry an output gate: ``q_proj`` is twice ``heads x head_dim``). What that
changes for the counts (pacs_fast/learner/flops.py, pacs_fast/trainer/engine_memory.py): only the full-attention
layers cache keys and values and attend over ``s^2``; a linear layer holds a constant state a row and its
projections are its own (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``, ``out_proj``).
"""
from __future__ import annotations


def linear_attention_of(c) -> dict | None:
    """The linear-attention layers of a (text) config, a ``config.json`` dict or a transformers config:
    ``{"layers", "key_heads", "value_heads", "key_dim", "value_dim", "conv"}`` (how many of the layers, the
    ``linear_num_key_heads`` / ``linear_num_value_heads`` / ``linear_key_head_dim`` / ``linear_value_head_dim`` /
    ``linear_conv_kernel_dim`` keys; the layers' kinds from ``layer_types``, else as transformers derives them from
    ``full_attention_interval``); None for a model without them."""
    get = c.get if isinstance(c, dict) else (lambda key: getattr(c, key, None))
    if not get("linear_num_value_heads") or not get("linear_value_head_dim"):
        return None
    # (Qwen3-Next's config.json gives no layer_types: transformers derives them, every full_attention_interval-th
    # layer full attention, default 4; read without them its linear layers had counted as attention)
    every = int(get("full_attention_interval") or 4)
    kinds = get("layer_types") or ["linear_attention" if (i + 1) % every else "full_attention"
                                   for i in range(int(get("num_hidden_layers") or 0))]
    layers = sum(kind == "linear_attention" for kind in kinds)
    if not layers:
        return None
    return {"layers": layers, "key_heads": int(get("linear_num_key_heads") or get("linear_num_value_heads")),
            "value_heads": int(get("linear_num_value_heads")),
            "key_dim": int(get("linear_key_head_dim") or get("linear_value_head_dim")),
            "value_dim": int(get("linear_value_head_dim")), "conv": int(get("linear_conv_kernel_dim") or 4)}


def linear_params(H: int, linear: dict) -> int:
    """The projections' weights of one linear-attention layer: ``in_proj_qkv`` (``H x (2 key + value)``),
    ``in_proj_z`` (``H x value``), ``in_proj_b`` / ``in_proj_a`` (``H x value_heads`` each), ``out_proj``
    (``value x H``), with ``key = key_heads x key_dim`` and ``value = value_heads x value_dim``."""
    key, value = linear["key_heads"] * linear["key_dim"], linear["value_heads"] * linear["value_dim"]
    return H * (2 * key + value) + H * value + 2 * H * linear["value_heads"] + value * H


def linear_state_bytes(linear: dict, dtype_bytes: int) -> int:
    """Bytes of a row's state in all linear layers (the HF engine's cache, whatever the row's length): the
    convolution's window, ``conv`` inputs of ``2 key + value`` channels in the model's dtype (transformers keeps
    ``conv``), and the recurrent ``value_heads x key_dim x value_dim`` in float32 (its delta rule's dtype)."""
    key, value = linear["key_heads"] * linear["key_dim"], linear["value_heads"] * linear["value_dim"]
    conv = (2 * key + value) * linear["conv"] * dtype_bytes
    return linear["layers"] * (conv + linear["value_heads"] * linear["key_dim"] * linear["value_dim"] * 4)
