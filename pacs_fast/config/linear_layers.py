"""Which linear layers a decoder layer holds where a family differs from Qwen2 / LLaMA's seven (``q_proj``, ``k_proj``,
``v_proj``, ``o_proj`` and a gated MLP's ``gate_proj``, ``up_proj``, ``down_proj``), by ``model_type``: what the
parameter, FLOP and LoRA adapter counts read (:mod:`pacs_fast.learner.flops`,
:mod:`pacs_fast.trainer.adapter_count`) before a model loads.

- :data:`PLAIN_MLP`: an MLP of two matrices, ``H -> F -> H`` with no gate (GPT-NeoX / Pythia, StarCoder2, Phi-2,
  Nemotron's and Arcee's relu^2, Apertus' xIELU, ...): ``2 H F`` a layer, not ``3 H F`` (counted gated, with their
  ``F = 4 H``: Pythia-6.9B's parameters 9.00B for 6.86B, StarCoder2-7B's 10.12B for 7.40B, Phi-2's 30% over, what
  the memory check holds for weights, gradients and AdamW moments; their update FLOPs 30-35% over).
- :data:`FUSED_QKV`: one projection to queries, keys and values (Phi-3's ``qkv_proj``, GPT-NeoX's
  ``query_key_value``): the weights are the same, but LoRA puts one adapter on it, ``r (H + Hq + 2 Hkv)``.
- :data:`FUSED_GATE_UP`: one projection to gate and up (Phi-3's and GLM-4's ``gate_up_proj``): one adapter,
  ``r (H + 2 F)``. Counted as separate layers, all-linear rank-64 adapters had read Phi-4-mini's 111.1M for PEFT's
  92.3M, GLM-Z1-9B's 200.9M for 190.4M, Pythia-6.9B's 192.9M for 134.2M.
- Multi-head latent attention's adapters (:func:`attention_adapters`): its own projections, not ``heads x head_dim``
  ones (GLM-4.7-Flash's 2,650.9M for 2,695.0M, DeepSeek-V2-Lite's 0.5% short).

Each set is checked against the built model and PEFT's adapters (tests/test_glm_path_sweep.py).
"""
from __future__ import annotations

PLAIN_MLP = frozenset({"gpt_neox", "persimmon", "starcoder2", "phi", "nemotron", "arcee", "apertus", "jais2",
                       "nanochat"})
FUSED_QKV = frozenset({"phi3", "gpt_neox", "persimmon"})
FUSED_GATE_UP = frozenset({"phi3", "glm", "glm4"})
# an attention whose output a sigmoid gate scales, computed by a projection of its own, ``gate_proj`` ``H -> Hq``
# (Arcee's AFMoE / Trinity; Qwen3-Next's and Qwen3.5's gate is half of a twice-wide q_proj instead: shape["linear"])
GATED_ATTENTION = frozenset({"afmoe"})
# linear-attention hybrids whose full-attention layers have no output gate (Qwen3-Next's and Qwen3.5's q_proj is twice
# as wide, half of it the gate), and whose linear layers project q, k, v, gate, a and b apart (AI2's Olmo Hybrid)
UNGATED_HYBRID_ATTENTION = frozenset({"olmo_hybrid"})


def gated_q_proj(shape: dict) -> bool:
    """Whether the shape's full-attention ``q_proj`` is twice ``Hq`` wide, half of it an output gate (Qwen's
    linear-attention hybrids: ``shape["linear"]``, but :data:`UNGATED_HYBRID_ATTENTION`)."""
    return bool(shape.get("linear")) and shape.get("model_type") not in UNGATED_HYBRID_ATTENTION


def mlp_matrices(shape: dict) -> int:
    """The matrices of one dense MLP of the shape's family: 2 (:data:`PLAIN_MLP`) or 3 (gated)."""
    return 2 if shape.get("model_type") in PLAIN_MLP else 3


def mlp_adapters(shape: dict) -> int:
    """``in + out`` of LoRA adapters on one dense MLP's linear layers (``rank x`` this is their parameters): ``gate``
    and ``up`` (``H + F`` each; one ``H + 2 F`` where fused, none for the gate of a plain MLP) and ``down``
    (``F + H``); 0 where the config gives no MLP width."""
    H, F = shape["hidden"], shape.get("intermediate") or 0
    if not F:
        return 0
    kind = shape.get("model_type")
    up = (H + F) if kind in PLAIN_MLP else (H + 2 * F) if kind in FUSED_GATE_UP else 2 * (H + F)
    return up + (F + H)


def attention_adapters(shape: dict) -> int:
    """``in + out`` of LoRA adapters on one attention layer's projections: queries (twice ``Hq`` wide where a hybrid
    model's ``q_proj`` gates the output, :func:`gated_q_proj`), keys and values (one ``H + Hq + 2 Hkv`` where fused),
    the output (an output gate's own ``gate_proj``, :data:`GATED_ATTENTION`, stays bare: PEFT's all-linear takes
    that name from every layer of a mixture of experts, for its experts); of multi-head latent attention
    (``shape["mla"]``) its own projections: ``q_a_proj`` / ``q_b_proj`` through the query rank (or one
    ``q_proj``), ``kv_a_proj_with_mqa`` to the latent and the shared rope key, ``kv_b_proj`` from the latent to
    ``heads x (nope + v)``, ``o_proj`` from ``heads x v``."""
    H, mla = shape["hidden"], shape.get("mla")
    if mla:
        heads, qk = shape["heads"], mla["nope"] + mla["rope"]
        q = (H + mla["q_lora"]) + (mla["q_lora"] + heads * qk) if mla["q_lora"] else H + heads * qk
        return (q + (H + mla["kv_lora"] + mla["rope"]) + (mla["kv_lora"] + heads * (mla["nope"] + mla["v"]))
                + (heads * mla["v"] + H))
    hd, kv = shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    q = shape["heads"] * hd * (2 if gated_q_proj(shape) else 1)  # (Qwen's hybrids' q_proj gates its output: x 2)
    if shape.get("model_type") in FUSED_QKV:
        return (H + q + 2 * kv) + (shape["heads"] * hd + H)
    return (H + q) + 2 * (H + kv) + (shape["heads"] * hd + H)
