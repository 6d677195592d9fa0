"""FLOPs of a learner update, counted from the model's shape (for MFU beside every learner table).

For sequences of lengths ``s_i`` (``T = sum s_i`` tokens through the decoder) and ``T_head`` tokens
through the LM head (the torch learner runs the head on response tokens only; default ``T``)::

    FLOPs = 6 P_layers T  +  6 V H T_head  +  6 L Hq sum_i s_i^2

term by term (:data:`FORMULA` prints it beside the tables):

- dense layers, forward + backward: ``6 x P_layers x T``, with ``P_layers = L (H (Hq + 2 Hkv) + Hq H
  + 3 H F)`` the matmul weights of the decoder layers (q, k, v, o projections and the gated MLP; of a
  mixture of experts the ``top_k`` experts a token passes through, its shared experts and router: :func:`mlp_params`;
  ``Hq = heads x head_dim``, ``Hkv = kv_heads x head_dim``; norms, biases, RoPE, the embedding
  lookup are not matmuls and not counted);
- LM head: ``6 x V x H x T_head``;
- causal attention: forward ``2 x 2 x s^2 / 2 x Hq`` per layer per sequence (``QK^T`` and ``PV``,
  half the square under the causal mask), ``x 3`` for forward + backward: ``6 L Hq sum_i s_i^2``.

A hybrid model (Qwen3.5, Qwen3-Next: ``shape["linear"]``, pacs_fast/config/linear_attention.py) counts its
linear-attention layers' own projections in ``P_layers``, ``s^2`` in its full-attention layers alone (``L`` those),
and ``18 x value_heads x key_dim x value_dim`` a token a linear layer for the delta rule's state (read, corrected,
written: forward + backward). A Nemotron-H model (``shape["blocks"]``, pacs_fast/config/hybrid_blocks.py) counts
each layer's one block (Mamba-2, attention, a non-gated MLP or MoE), ``s^2`` in its attention layers alone and
``12 x heads x head_dim x state`` a token a Mamba layer for its selective scan; Granite 4.0-H, Falcon-H1 and LFM2
(its short-convolution layers' projections) alike.

Recomputation (gradient checkpointing) is not counted: it is work, not useful work. MFU = FLOPs /
(seconds x the device's dense bf16 peak, :data:`PEAK_BF16`), as verl's FLOP counter and Megatron's
report count it.
"""
from __future__ import annotations

from pacs_fast.config.hybrid_blocks import (blocks_of, mamba_params, mamba_recurrence_flops, mlp_block_params,
                                            short_conv_params)
from pacs_fast.config.linear_attention import linear_attention_of, linear_params
from pacs_fast.config.linear_layers import GATED_ATTENTION, gated_q_proj, mlp_matrices
from pacs_fast.config.model_files import mla_of, moe_of
from pacs_fast.config.per_layer import config_attr, intermediate_of, layer_shape

FORMULA = ("FLOPs = 6*P_layers*T + 6*V*H*T_head + 3*(2*2*L*Hq*sum(s^2)/2), P_layers = L*(H*(Hq+2*Hkv) + Hq*H "
           "+ 3*H*F), T tokens, T_head tokens through the LM head, s each sequence's length; recompute not counted; "
           "MFU = FLOPs / (time * dense bf16 peak)")
# dense bf16 tensor-core peaks (FLOP/s), without sparsity; matched in this order against the device name
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12),
             ("A100", 312e12))


def shape_of(config, dtype_bytes: int = 2) -> dict:
    """The shape dict (vocab, hidden, layers, heads, kv_heads, head_dim, intermediate, tied, bytes) of a
    Hugging Face config (the keys :mod:`pacs_fast.trainer.memory_model` reads from ``config.json``)."""
    c = getattr(config, "text_config", None) or config
    heads, blocks = c.num_attention_heads, blocks_of(c)
    return {"vocab": c.vocab_size, "hidden": c.hidden_size, "layers": c.num_hidden_layers, "heads": heads,
            "kv_heads": config_attr(c, "num_key_value_heads") or heads,
            "head_dim": config_attr(c, "head_dim") or c.hidden_size // heads,
            "intermediate": intermediate_of(c),
            "tied": bool(getattr(config, "tie_word_embeddings", getattr(c, "tie_word_embeddings", True))),
            "bytes": dtype_bytes, "moe": None if blocks else moe_of(c), "mla": mla_of(c),
            "linear": linear_attention_of(c), "blocks": blocks, "model_type": getattr(c, "model_type", None),
            **layer_shape(c)}


def mlp_params(shape: dict, *, active: bool = False) -> int:
    """The MLPs' weights of all decoder layers (``3 H F`` a gated layer, ``2 H F`` a plain one:
    :func:`pacs_fast.config.linear_layers.mlp_matrices`); of a mixture of experts (``shape["moe"]``),
    ``3 H (E F_e + F_shared) + H E`` (the router) a MoE layer with all ``E`` experts (what memory holds), or with the
    ``top_k`` a token passes through (``active``: what its FLOPs count)."""
    H, F, moe = shape["hidden"], shape.get("intermediate") or 0, shape.get("moe")
    if shape.get("blocks"):  # (Nemotron-H: MLP and MoE layers of their own, non-gated)
        return mlp_block_params(H, shape["blocks"], active=active)
    m = mlp_matrices(shape)  # (3 gated, 2 for a plain MLP: pacs_fast/config/linear_layers.py)
    if not moe:  # (Gemma 4's double-wide MLPs: twice F in its KV-shared layers; Gemma 3n's widths a layer: their sum)
        if shape.get("mlp_total"):
            return m * H * shape["mlp_total"]
        return (shape["layers"] + shape.get("wide_mlp_layers", 0)) * m * H * F
    experts = moe["top_k"] if active else moe["experts"]
    sparse = 3 * H * (experts * moe["width"] + moe["shared"]) + H * moe["experts"]
    return (shape["layers"] - moe["layers"]) * 3 * H * F + moe["layers"] * sparse


def layer_params(shape: dict) -> int:
    """``P_layers``: the matmul weights of all decoder layers (see the module docstring) a token passes through:
    of a mixture of experts, its ``top_k`` experts, the shared ones and the router (:func:`mlp_params`)."""
    return mixer_params(shape) + mlp_params(shape, active=True)


def mixer_params(shape: dict) -> int:
    """The token mixers' weights of all decoder layers: :func:`attention_params` a layer, but for a hybrid model's
    linear-attention layers (``shape["linear"]``: Qwen3.5), whose projections are their own
    (:func:`pacs_fast.config.linear_attention.linear_params`)."""
    linear, widths, blocks = shape.get("linear"), shape.get("attention_widths"), shape.get("blocks")
    if blocks:  # (Nemotron-H: attention layers and Mamba-2 layers of their own; its MLP layers mix nothing)
        return blocks["attention"] * attention_params(shape) + blocks["mamba"] * mamba_params(shape["hidden"], blocks) \
            + blocks["short_convs"] * short_conv_params(shape["hidden"], blocks)  # (LFM2's convolution layers)
    if widths:  # (layers of different widths: Gemma 4's wider full-attention layers, its KV-shared ones)
        return sum(shape["hidden"] * (q + k + v) + q * shape["hidden"] for q, k, v in widths)
    if not linear:
        return shape["layers"] * attention_params(shape)
    return (shape["layers"] - linear["layers"]) * attention_params(shape) + \
        linear["layers"] * linear_params(shape["hidden"], linear)


def attention_params(shape: dict) -> int:
    """The attention projections' weights of one decoder layer: ``H (Hq + 2 Hkv) + Hq H``; of multi-head latent
    attention (``shape["mla"]``: DeepSeek-V2/V3), its query projection (through the ``q_lora`` rank where there is
    one) to ``heads x (nope + rope)``, ``kv_a_proj_with_mqa`` to the latent and the shared rope key, ``kv_b_proj``
    from the latent to ``heads x (nope + v)`` and ``o_proj`` from ``heads x v`` (``heads x head_dim`` had counted
    DeepSeek-V2-Lite's 13.8M a layer as 16.8M)."""
    H, mla = shape["hidden"], shape.get("mla")
    if mla:
        heads, qk = shape["heads"], mla["nope"] + mla["rope"]
        q = mla["q_lora"] * (H + heads * qk) if mla["q_lora"] else H * heads * qk
        return (q + H * (mla["kv_lora"] + mla["rope"]) + mla["kv_lora"] * heads * (mla["nope"] + mla["v"])
                + heads * mla["v"] * H)
    hq, hkv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    gate = hq if gated_q_proj(shape) or shape.get("model_type") in GATED_ATTENTION else 0  # (Qwen3.5's / Qwen3-Next's
    # full attention gates its output, q_proj x 2; AFMoE's through a gate_proj of its own; Olmo Hybrid's not at all)
    return H * (hq + gate + 2 * hkv) + hq * H


def update_flops(shape: dict, lengths: list[int], head_tokens: int | None = None) -> dict:
    """Useful FLOPs of one forward + backward over sequences of ``lengths`` (see the module
    docstring): ``{"dense", "head", "attention", "total"}``."""
    T = sum(lengths)
    head_tokens = T if head_tokens is None else head_tokens
    mla = shape.get("mla")  # (MLA: QK^T over heads x (nope + rope), PV over heads x v)
    hqk, hv = ((shape["heads"] * (mla["nope"] + mla["rope"]), shape["heads"] * mla["v"]) if mla else
               (shape["heads"] * shape["head_dim"],) * 2)
    linear = shape.get("linear")  # (a hybrid model: s^2 in its full-attention layers alone; its linear layers'
    # delta rule reads, corrects and writes a value_heads x key_dim x value_dim state a token: 3 x 2 x that, x 3)
    full = shape["layers"] - (linear["layers"] if linear else 0)
    blocks = shape.get("blocks")  # (Nemotron-H: s^2 in its attention layers alone, the scan in its Mamba layers)
    if blocks:
        full = blocks["attention"]
    if shape.get("attention_widths"):  # (each layer's own query width: QK^T and PV over heads x its head_dim)
        full, hqk = 1, sum(q for q, _, _ in shape["attention_widths"])
        hv = hqk
    recurrence = 18 * linear["layers"] * linear["value_heads"] * linear["key_dim"] * linear["value_dim"] * T \
        if linear else 0
    recurrence += mamba_recurrence_flops(blocks, T) if blocks else 0
    out = {"dense": 6 * layer_params(shape) * T, "head": 6 * shape["vocab"] * shape["hidden"] * head_tokens,
           "attention": 3 * 2 * full * (hqk + hv) * sum(s * s for s in lengths) // 2 + recurrence}
    out["total"] = out["dense"] + out["head"] + out["attention"]
    return out


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name (``torch.cuda.get_device_name()``), else None."""
    for key, peak in PEAK_BF16:
        if key.lower() in (device_name or "").lower():
            return peak
    return None


def mfu(flops: float, seconds: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: ``flops / (seconds x peak)`` (None without a peak or a time)."""
    return flops / (seconds * peak) if peak and seconds > 0 else None
