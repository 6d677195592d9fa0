"""The parameters of a run's LoRA adapters (``model.lora_rank``), counted from the model's shape before it loads
(:func:`lora_params`): what the memory check (:mod:`pacs_fast.trainer.memory_model`) adds for the adapters, their
gradients and AdamW moments."""
from __future__ import annotations

from pacs_fast.config.hybrid_blocks import lora_block_params
from pacs_fast.config.linear_layers import UNGATED_HYBRID_ATTENTION, attention_adapters, mlp_adapters
from pacs_fast.config.per_layer import altup_laurel_adapters
from pacs_fast.learner.lora import EXPERTS_BESIDE_MLP, OWN_FUSED_EXPERTS, UNMAPPED_FUSED_EXPERTS

SHARED_EXPERT_GATE = ("qwen2_moe", "qwen3_next", "qwen3_5_moe_text")  # (a shared expert scaled by a gate)


def lora_params(shape: dict, rank: int) -> int:
    """Parameters of rank-``rank`` LoRA adapters on every linear layer of the decoder (``all-linear``; named
    modules take fewer): ``rank x (in + out)`` per layer. A mixture of experts (``shape["moe"]``; transformers 5
    fuses each layer's experts into ``[experts, out, in]`` tensors, which PEFT adapts in place with ``rank x
    experts`` rows and columns, the fused gate and up projections at twice the rank): ``rank x (H + E)`` on each
    router and ``rank x E x (2 (H + 2 F_e) + F_e + H)`` on each layer's experts. PEFT's ``all-linear`` leaves a MoE
    model's dense MLPs (``mlp_only_layers``, DeepSeek's first layers, shared experts) without adapters: its mapping
    of the hub's ``gate_proj`` / ``up_proj`` / ``down_proj`` onto the fused experts takes those names from them.
    (Counting one dense MLP a layer gave 0.13B of Qwen3-30B-A3B's 3.99B adapter parameters at rank 64.) A family
    whose own checkpoints hold the experts fused (gpt-oss: :data:`pacs_fast.learner.lora.OWN_FUSED_EXPERTS`) takes
    them at the rank itself, gate and up in one ``[experts, in, 2 F_e]`` tensor. A hybrid model (``shape["linear"]``)
    takes its linear-attention layers' own projections and its gated ``q_proj`` (twice ``heads x head_dim``); a shared
    expert its gate (:data:`SHARED_EXPERT_GATE`) and, where PEFT maps no experts (Qwen3.5-MoE), its three layers."""
    H, linear = shape["hidden"], shape.get("linear")
    attention = attention_adapters(shape)  # (fused q / k / v, multi-head latent attention: their own layers)
    if shape.get("blocks"):  # (Nemotron-H: each layer's one block)
        return rank * lora_block_params(H, attention, shape["blocks"])
    mixers = shape["layers"] * attention
    if shape.get("attention_widths"):  # (Gemma 4: each layer's own widths; no k / v projection where it has none)
        mixers = sum((H + q) + (H + k if k else 0) + (H + v if v else 0) + (q + H)
                     for q, k, v in shape["attention_widths"])
    if linear:  # (a hybrid's linear-attention layers: their own projections, not q, k, v, o)
        key, value = linear["key_heads"] * linear["key_dim"], linear["value_heads"] * linear["value_dim"]
        own = (H + 2 * key + value) + (H + value) + 2 * (H + linear["value_heads"]) + (value + H)
        if shape.get("model_type") in UNGATED_HYBRID_ATTENTION:  # (Olmo Hybrid's q, k and v projections apart)
            own += 2 * H
        if shape.get("model_type") == "qwen3_next":  # (its in_proj_qkvz and in_proj_ba: 2 projections fewer)
            own -= 2 * H
        mixers += linear["layers"] * (own - attention)
    d = shape.get("per_layer_input_dim", 0)  # (Gemma 4's per-layer inputs: a gate and a projection a layer, and the
    mixers += (shape["layers"] * 2 * (H + d) + H + shape["layers"] * d) if d else 0  # model's projection to them)
    mixers += altup_laurel_adapters(shape)
    moe = shape.get("moe")
    if moe:
        E, w, S = moe["experts"], moe["width"], moe["shared"]
        own = shape.get("model_type") in OWN_FUSED_EXPERTS or shape.get("model_type") in EXPERTS_BESIDE_MLP
        gate_up = 1 if own else 2  # (the rank of the fused gate and up)
        experts = (H + E) + E * (gate_up * (H + 2 * w) + (w + H))
        if S and (shape.get("model_type") in UNMAPPED_FUSED_EXPERTS  # (its shared expert keeps its adapters;
                  or shape.get("model_type") in EXPERTS_BESIDE_MLP):  # Gemma 4's dense MLP its own)
            experts += 3 * (H + S)
        if S and shape.get("model_type") in SHARED_EXPERT_GATE:  # (a linear H -> 1 PEFT adapts)
            experts += H + 1
        return rank * (mixers + moe["layers"] * experts)
    mlp = mlp_adapters(shape)  # (a plain MLP's two layers, a fused gate and up: pacs_fast/config/linear_layers.py)
    wide = shape.get("wide_mlp_layers", 0) * 3 * shape["intermediate"] if shape["intermediate"] else 0
    return rank * (mixers + shape["layers"] * mlp + wide)
