"""Hybrid models whose layers hold Mamba-2 mixers or short convolutions beside or instead of attention, read from
their config: Nemotron-H (``nemotron_h``: NVIDIA's Nemotron-H, Nemotron Nano 2, Nemotron 3 Nano), Granite 4.0-H
(``granitemoehybrid``), Falcon-H1 (``falcon_h1``) and LFM2 (``lfm2``).

Nemotron-H's ``config.json`` names each layer in ``hybrid_override_pattern`` (transformers 5 reads it into, and
saves, ``layers_block_type``: ``linear_attention`` for a Mamba layer): ``M`` a Mamba-2 mixer, ``*`` attention, ``-`` a
non-gated MLP (relu^2 through ``up_proj`` and ``down_proj``), ``E`` a mixture of non-gated experts beside one shared
expert of ``moe_shared_expert_intermediate_size`` (through a ``moe_latent_size`` projection where given). A layer
holds that block alone (and a norm): Nemotron-Nano-9B-v2's 56 layers are 27 Mamba, 4 attention and 25 MLP layers,
so counting every layer as attention and a gated MLP (the uniform decoder's counts) put its parameters at 2x and the
KV cache a token at 14x. Granite 4.0-H's ``layer_types`` give each layer a Mamba-2 mixer or attention, and every
layer a gated MLP of ``shared_intermediate_size`` (``input_linear`` to twice it, ``output_linear``) and, with
``num_local_experts``, gated experts of ``intermediate_size`` beside it. Falcon-H1's layers each run attention and a
Mamba-2 mixer (``mamba_d_ssm`` wide) side by side, then a gated MLP. A Mamba-2 mixer projects ``H`` to ``2 x inner +
2 x groups x state + heads`` (``inner = heads x head_dim``), convolves ``conv_dim = inner + 2 x groups x state``
channels (a ``conv`` window), and carries a ``heads x head_dim x state`` recurrent state a row (float32 in
transformers' cache). LFM2 (``lfm2``) mixes short-convolution layers (``conv`` in ``layer_types``: ``in_proj`` H to
3 H, a depthwise convolution over ``conv_L_cache`` tokens, ``out_proj``; their state a row is the convolution's
window) with a few attention layers, every layer with a SwiGLU MLP of the width transformers derives from
``intermediate_size`` (``block_auto_adjust_ff_dim``; the hub's config.json names it ``block_ff_dim``): counted as
attention in every layer and no MLP (the width unread), LFM2-1.2B's parameters had read 0.30B for 1.17B, its KV
cache 16 layers for 6 and its rank-64 adapters 13.6M for 44.4M.
"""
from __future__ import annotations

PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
BLOCK_TYPES = {"linear_attention": "mamba", "mamba": "mamba", "full_attention": "attention", "attention": "attention",
               "mlp": "mlp", "moe": "moe"}  # (layers_block_type's / layer_types' names, today's and the legacy ones)
# families whose Mamba mixers transformers runs, in training and where mamba_ssm is installed, through one fused kernel
# handed out_proj's weight (mamba_split_conv1d_scan_combined): an adapter on out_proj is bypassed there. PEFT refuses
# to adapt it for the first five (its _check_lora_target_modules_mamba); all-linear leaves it out for all of them
MAMBA_FAMILIES = ("nemotron_h", "falcon_h1", "mamba", "mamba2", "falcon_mamba", "granitemoehybrid", "bamba", "zamba2")
NOT_ADAPTED_IN_MAMBA = ("out_proj",)
NO_EXPERTS = dict(experts=0, top_k=0, width=0, expert_gated=False, shared=0, latent=0)
NO_MAMBA = dict(mamba=0, heads=0, head_dim=0, groups=0, state=0, conv=0)  # (LFM2: no Mamba mixer)


def blocks_of(c) -> dict | None:
    """The blocks of a Nemotron-H, Granite 4.0-H, Falcon-H1 or LFM2 (text) config, a ``config.json`` dict or a
    transformers config: ``{"layers", "mamba", "attention", "mlp", "moe", "short_convs"}`` (how many layers, and how
    many hold each block; LFM2's convolutions' window ``short_conv`` and the model's ``hidden`` width, 0 elsewhere), the
    MLPs' ``mlp_width`` and ``mlp_kind`` (``plain``: up and down; ``fused``: gate and up in one linear layer, then
    down; ``gated``: gate, up and down), the Mamba-2 mixer's ``heads``, ``head_dim``, ``groups``, ``state``, ``conv``
    and the experts' ``experts``, ``top_k``, ``width``, ``expert_gated``, ``shared``, ``latent``; None for other
    models. Nemotron-H's keys are the hub's (``hybrid_override_pattern``, ``mamba_n_groups`` / ``n_groups``, ...) or
    transformers 5's saved ones (``layers_block_type``, no ``num_hidden_layers``)."""
    get = c.get if isinstance(c, dict) else (lambda key: getattr(c, key, None))
    read = {"nemotron_h": _nemotron_h, "granitemoehybrid": _granite, "falcon_h1": _falcon_h1,
            "lfm2": _lfm2}.get(get("model_type"))
    out = read(get) if read else None
    return {**NO_EXPERTS, "short_convs": 0, "short_conv": 0, "hidden": 0, **out} if out and out["layers"] else None


def _first(get, *keys, default=None):
    return next((get(k) for k in keys if get(k) is not None), default)


def _nemotron_h(get) -> dict | None:
    """One block a layer, named by the pattern (or ``layers_block_type``)."""
    pattern = get("hybrid_override_pattern")
    kinds = ([PATTERN.get(ch) for ch in pattern] if isinstance(pattern, str) and pattern else
             [BLOCK_TYPES.get(k) for k in (get("layers_block_type") or get("layer_types") or [])])
    if None in kinds:
        return None
    out = {k: kinds.count(k) for k in ("mamba", "attention", "mlp", "moe")}
    out.update(layers=len(kinds), mlp_width=int(get("intermediate_size") or 0), mlp_kind="plain",
               heads=int(_first(get, "mamba_num_heads", default=128)),
               head_dim=int(_first(get, "mamba_head_dim", default=64)),
               groups=int(_first(get, "n_groups", "mamba_n_groups", default=8)),
               state=int(_first(get, "ssm_state_size", default=128)),
               conv=int(_first(get, "conv_kernel", "mamba_d_conv", default=4)))
    if out["moe"]:  # (a dense model's expert keys, transformers' defaults in a saved config, are not read)
        out.update(experts=int(_first(get, "n_routed_experts", default=0)),
                   top_k=int(_first(get, "num_experts_per_tok", default=1)),
                   width=int(_first(get, "moe_intermediate_size", default=0)),
                   shared=int(_first(get, "moe_shared_expert_intermediate_size", default=0)),
                   latent=int(_first(get, "moe_latent_size", default=0)))
    return out


def _mamba_keys(get, inner: int) -> dict:
    """Granite's and Falcon-H1's ``mamba_*`` keys (``mamba_d_head`` ``auto``: ``inner / mamba_n_heads``)."""
    heads, head_dim = int(_first(get, "mamba_n_heads", default=128)), get("mamba_d_head")
    return dict(heads=heads, head_dim=inner // heads if head_dim in (None, "auto") else int(head_dim),
                groups=int(_first(get, "mamba_n_groups", default=1)),
                state=int(_first(get, "mamba_d_state", default=256)), conv=int(_first(get, "mamba_d_conv", default=4)))


def _granite(get) -> dict | None:
    """Each layer: its Mamba-2 mixer or attention, a gated shared MLP and, with experts, an MoE beside it."""
    kinds = [BLOCK_TYPES.get(k) for k in (get("layer_types") or get("layers_block_type") or [])]
    kinds = kinds or ["mamba"] * int(get("num_hidden_layers") or 0)  # (transformers' default: every layer Mamba)
    if None in kinds:
        return None
    L, experts = len(kinds), int(get("num_local_experts") or 0)
    out = dict(layers=L, mamba=kinds.count("mamba"), attention=kinds.count("attention"), mlp=L,
               moe=L if experts else 0, mlp_width=int(get("shared_intermediate_size") or 0), mlp_kind="fused",
               **_mamba_keys(get, int(_first(get, "mamba_expand", default=2)) * int(get("hidden_size") or 0)))
    if experts:
        out.update(experts=experts, top_k=int(_first(get, "num_experts_per_tok", default=1)),
                   width=int(get("intermediate_size") or 0), expert_gated=True)
    return out


def _falcon_h1(get) -> dict:
    """Each layer: attention and a Mamba-2 mixer side by side (``mamba_d_ssm`` wide, else ``mamba_expand x H``), then
    a gated MLP."""
    L = int(get("num_hidden_layers") or 0)
    inner = int(get("mamba_d_ssm") or int(_first(get, "mamba_expand", default=2)) * int(get("hidden_size") or 0))
    return dict(layers=L, mamba=L, attention=L, mlp=L, moe=0, mlp_width=int(get("intermediate_size") or 0),
                mlp_kind="gated", **_mamba_keys(get, inner))


def _lfm2(get) -> dict | None:
    """Each layer: a short convolution (``short_convs`` of them, a ``short_conv`` window) or attention, then a gated
    MLP of transformers' derived width (``Lfm2MLP``: 2/3 of ``intermediate_size``, or ``block_ff_dim`` where the hub's
    config.json gives it, times ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``)."""
    kinds = get("layer_types") or []
    if not kinds:  # (transformers' default: attention at full_attn_idxs, every layer when none is given)
        L, full = int(get("num_hidden_layers") or 0), get("full_attn_idxs")
        kinds = ["full_attention" if full is None or i in full else "conv" for i in range(L)]
    width = int(get("block_ff_dim") or get("intermediate_size") or 0)
    if get("block_auto_adjust_ff_dim") is not False:
        width = int(2 * width / 3)
        if get("block_ffn_dim_multiplier") is not None:
            multiple = int(get("block_multiple_of") or 256)
            width = multiple * ((int(float(get("block_ffn_dim_multiplier")) * width) + multiple - 1) // multiple)
    return dict(NO_MAMBA, layers=len(kinds), attention=kinds.count("full_attention"), mlp=len(kinds), moe=0,
                short_convs=kinds.count("conv"), short_conv=int(get("conv_L_cache") or 3), mlp_width=width,
                mlp_kind="gated", hidden=int(get("hidden_size") or 0))


def short_conv_params(H: int, b: dict) -> int:
    """The weights of one LFM2 short-convolution layer: ``in_proj`` ``H x 3 H``, the depthwise convolution ``H x
    short_conv``, ``out_proj`` ``H x H``."""
    return 3 * H * H + H * b["short_conv"] + H * H


def layers_of(c) -> int | None:
    """How many layers a hybrid config has (Nemotron-H's pattern's length: transformers 5 saves no
    ``num_hidden_layers``), else None."""
    b = blocks_of(c)
    return b["layers"] if b else None


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


def mlp_block_params(H: int, b: dict, *, active: bool = False) -> int:
    """The MLP and MoE blocks' weights, all layers: an MLP's ``2 H mlp_width`` (``plain``: up and down), else ``3 H
    mlp_width``; an MoE's ``experts`` (``top_k`` of them where ``active``: a token's), each ``2 x in x width`` (``3 x``
    where ``expert_gated``; ``in`` the latent width where there is one, with its two ``H x latent`` projections), the
    shared expert's ``2 H shared`` and the router's ``H x experts``."""
    inner = b["latent"] or H
    experts = b["top_k"] if active else b["experts"]
    moe = experts * (3 if b["expert_gated"] else 2) * inner * b["width"] + 2 * H * b["shared"] + H * b["experts"] + \
        (2 * H * b["latent"] if b["latent"] else 0)
    return b["mlp"] * (2 if b["mlp_kind"] == "plain" else 3) * H * b["mlp_width"] + b["moe"] * moe


def mamba_state_bytes(b: dict, dtype_bytes: int) -> int:
    """Bytes of a row's state in all Mamba layers (the HF engine's cache, whatever the row's length): the
    convolution's window, ``conv`` inputs of ``conv_dim`` channels in the model's dtype, and the recurrent ``heads x
    head_dim x state`` in float32; and in LFM2's short-convolution layers, their window of ``short_conv`` inputs of
    ``hidden`` channels."""
    _, conv_dim = mamba_inner(b)
    return b["mamba"] * (conv_dim * b["conv"] * dtype_bytes + b["heads"] * b["head_dim"] * b["state"] * 4) + \
        b["short_convs"] * b["hidden"] * b["short_conv"] * dtype_bytes  # (LFM2's: the convolution's window)


def mamba_recurrence_flops(b: dict, tokens: int) -> int:
    """The selective scan's FLOPs over ``tokens`` tokens, forward + backward: a token updates and reads each
    layer's ``heads x head_dim x state`` state (2 x 2 FLOPs an element), x 3 with the backward."""
    return 12 * b["mamba"] * b["heads"] * b["head_dim"] * b["state"] * tokens


def lora_block_params(H: int, attention: int, b: dict) -> int:
    """Rank-1 adapters (``in + out`` a linear layer) on ``all-linear``: ``attention`` (one attention layer's adapters)
    in its attention layers, ``in_proj`` in its Mamba layers (all-linear leaves ``out_proj`` out:
    :data:`NOT_ADAPTED_IN_MAMBA`; ``conv1d`` is no linear layer), the MLPs' linear layers (by ``mlp_kind``); an MoE
    layer's shared expert and latent projections, and Nemotron-H's experts (fused ``[experts, out, in]`` tensors,
    which PEFT adapts in place with ``experts`` rows and columns a rank:
    :data:`pacs_fast.learner.lora.EXPERTS_BESIDE_MLP`), Granite's likewise (gate and up in one tensor); the routers'
    weights stay bare (parameters, not linear layers, which all-linear leaves alone)."""
    inner, conv_dim = mamba_inner(b)
    W = b["mlp_width"]
    mlp = {"plain": 2 * (H + W), "fused": (H + 2 * W) + (W + H), "gated": 3 * (H + W)}[b["mlp_kind"]]
    E, F_e = b["experts"], b["width"]
    moe = E * ((H + 2 * F_e) + (F_e + H)) if b["expert_gated"] else (  # (Granite's: fused gate and up, then down)
        2 * (H + b["shared"]) + (2 * (H + b["latent"]) if b["latent"] else 0) + 2 * E * ((b["latent"] or H) + F_e))
    return b["attention"] * attention + b["mamba"] * (H + inner + conv_dim + b["heads"]) + b["mlp"] * mlp + \
        b["moe"] * moe + b["short_convs"] * ((H + 3 * H) + (H + H))  # (LFM2's in_proj and out_proj)
