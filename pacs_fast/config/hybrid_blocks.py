"""Hybrid models whose layers are each one block of their own kind: Nemotron-H (``nemotron_h``: NVIDIA's Nemotron-H,
Nemotron Nano 2, Nemotron 3 Nano).

Its ``config.json`` names each layer in ``hybrid_override_pattern`` (transformers 5 reads it into, and saves,
``layers_block_type``: ``linear_attention`` for a Mamba layer): ``M`` a Mamba-2 mixer, ``*`` attention, ``-`` a
non-gated MLP (relu^2 through ``up_proj`` and ``down_proj``), ``E`` a mixture of non-gated experts beside one shared
expert of ``moe_shared_expert_intermediate_size`` (through a ``moe_latent_size`` projection where given). A layer
holds that block alone (and a norm): Nemotron-Nano-9B-v2's 56 layers are 27 Mamba, 4 attention and 25 MLP layers,
so counting every layer as attention and a gated MLP (the uniform decoder's counts) put its parameters at 2x and the
KV cache a token at 14x. A Mamba-2 layer projects ``H`` to ``2 x inner + 2 x groups x state + heads`` (``inner =
mamba_num_heads x mamba_head_dim``), convolves ``conv_dim = inner + 2 x groups x state`` channels (a ``conv_kernel``
window), and carries a ``heads x head_dim x state`` recurrent state a row (float32 in transformers' cache).
"""
from __future__ import annotations

PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
BLOCK_TYPES = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention", "attention": "attention",
               "mlp": "mlp", "moe": "moe"}  # (layers_block_type's names, today's and the legacy ones)
# what PEFT refuses to adapt in these families' Mamba mixers (its _check_lora_target_modules_mamba: the fused
# kernels read out_proj's weight directly); the LoRA helpers leave them out of all-linear
MAMBA_FAMILIES = ("nemotron_h", "falcon_h1", "mamba", "mamba2", "falcon_mamba")
NOT_ADAPTED_IN_MAMBA = ("out_proj",)


def blocks_of(c) -> dict | None:
    """The blocks of a Nemotron-H (text) config, a ``config.json`` dict or a transformers config: ``{"mamba",
    "attention", "mlp", "moe"}`` (how many layers of each kind), the Mamba-2 mixer's ``heads``, ``head_dim``,
    ``groups``, ``state``, ``conv`` and the experts' ``experts``, ``top_k``, ``width``, ``shared``, ``latent``; None for
    other models. The config.json keys are the hub's (``hybrid_override_pattern``, ``mamba_n_groups`` /
    ``n_groups``, ...) or transformers 5's saved ones (``layers_block_type``, no ``num_hidden_layers``)."""
    get = c.get if isinstance(c, dict) else (lambda key: getattr(c, key, None))
    if get("model_type") != "nemotron_h":
        return None
    pattern = get("hybrid_override_pattern")
    kinds = ([PATTERN.get(ch) for ch in pattern] if isinstance(pattern, str) and pattern else
             [BLOCK_TYPES.get(k) for k in (get("layers_block_type") or get("layer_types") or [])])
    if not kinds or None in kinds:
        return None

    def first(*keys, default=None):
        return next((get(k) for k in keys if get(k) is not None), default)

    out = {kind: kinds.count(kind) for kind in ("mamba", "attention", "mlp", "moe")}
    out.update(heads=int(first("mamba_num_heads", default=128)), head_dim=int(first("mamba_head_dim", default=64)),
               groups=int(first("n_groups", "mamba_n_groups", default=8)), state=int(first("ssm_state_size",
                                                                                          default=128)),
               conv=int(first("conv_kernel", "mamba_d_conv", default=4)))
    moe = bool(out["moe"])  # (a dense model's expert keys, transformers' defaults in a saved config, read as 0)
    out.update(experts=int(first("n_routed_experts", default=0)) * moe,
               top_k=int(first("num_experts_per_tok", default=1)) * moe,
               width=int(first("moe_intermediate_size", default=0)) * moe,
               shared=int(first("moe_shared_expert_intermediate_size", default=0)) * moe,
               latent=int(first("moe_latent_size", default=0)) * moe)
    return out


def layers_of(c) -> int | None:
    """How many layers a Nemotron-H config has (its pattern's length: transformers 5 saves no ``num_hidden_layers``),
    else None."""
    b = blocks_of(c)
    return sum(b[k] for k in ("mamba", "attention", "mlp", "moe")) if b else None


def mamba_inner(b: dict) -> tuple[int, int]:
    """``(inner, conv_dim)`` of a Mamba-2 mixer: ``heads x head_dim`` and ``inner + 2 x groups x state``."""
    inner = b["heads"] * b["head_dim"]
    return inner, inner + 2 * b["groups"] * b["state"]


def mamba_params(H: int, b: dict) -> int:
    """The matmul and convolution weights of one Mamba-2 mixer: ``in_proj`` ``H x (inner + conv_dim + heads)``, the
    depthwise ``conv1d`` ``conv_dim x conv``, ``out_proj`` ``inner x H`` (its per-head ``A``, ``D``, ``dt_bias`` and
    norm left out, as the other models' norms are)."""
    inner, conv_dim = mamba_inner(b)
    return H * (inner + conv_dim + b["heads"]) + conv_dim * b["conv"] + inner * H


def mlp_block_params(H: int, F: int, b: dict, *, active: bool = False) -> int:
    """The MLP and MoE blocks' weights, all layers: ``2 H F`` an MLP layer (up and down, no gate); an MoE layer's
    ``experts`` (``top_k`` of them where ``active``: a token's), each ``2 x in x width`` (``in`` the latent width
    where there is one, with its two ``H x latent`` projections), the shared expert's ``2 H shared`` and the router's
    ``H x experts``."""
    inner = b["latent"] or H
    experts = b["top_k"] if active else b["experts"]
    moe = experts * 2 * inner * b["width"] + 2 * H * b["shared"] + H * b["experts"] + \
        (2 * H * b["latent"] if b["latent"] else 0)
    return b["mlp"] * 2 * H * F + b["moe"] * moe


def mamba_state_bytes(b: dict, dtype_bytes: int) -> int:
    """Bytes of a row's state in all Mamba layers (the HF engine's cache, whatever the row's length): the
    convolution's window, ``conv`` inputs of ``conv_dim`` channels in the model's dtype, and the recurrent ``heads x
    head_dim x state`` in float32."""
    _, conv_dim = mamba_inner(b)
    return b["mamba"] * (conv_dim * b["conv"] * dtype_bytes + b["heads"] * b["head_dim"] * b["state"] * 4)


def mamba_recurrence_flops(b: dict, tokens: int) -> int:
    """The selective scan's FLOPs over ``tokens`` tokens, forward + backward: a token updates and reads each
    layer's ``heads x head_dim x state`` state (2 x 2 FLOPs an element), x 3 with the backward."""
    return 12 * b["mamba"] * b["heads"] * b["head_dim"] * b["state"] * tokens


def lora_block_params(H: int, F: int, attention: int, b: dict) -> int:
    """Rank-1 adapters (``in + out`` a linear layer) on ``all-linear`` of a Nemotron-H model: ``attention`` (one
    attention layer's adapters) in its attention layers, ``in_proj`` in its Mamba layers (PEFT refuses ``out_proj``
    there: :data:`NOT_ADAPTED_IN_MAMBA`; ``conv1d`` is no linear layer), ``up_proj`` and ``down_proj`` in its MLP
    layers; an MoE layer's shared expert, latent projections and experts (fused ``[experts, out, in]`` tensors, which
    PEFT adapts in place with ``experts`` rows and columns a rank: :data:`pacs_fast.learner.lora.EXPERTS_BESIDE_MLP`;
    the router's weight stays bare)."""
    inner, conv_dim = mamba_inner(b)
    moe = 2 * (H + b["shared"]) + (2 * (H + b["latent"]) if b["latent"] else 0) + \
        2 * b["experts"] * ((b["latent"] or H) + b["width"])
    return (b["attention"] * attention + b["mamba"] * (H + inner + conv_dim + b["heads"]) + b["mlp"] * 2 * (H + F)
            + b["moe"] * moe)
