"""What a run needs in memory, from the model's ``config.json`` (or the built-in tiny model's
settings), before any model is loaded: the model's shape (:func:`model_shape`), the learner's share
of weights, gradients and AdamW moments (:func:`learner_bytes`), the activations of a micro-batch and
the log-prob workspace (:func:`learner_memory`), and the Hugging Face engine's decode step
(:mod:`pacs_fast.trainer.engine_memory`). :mod:`pacs_fast.trainer.preflight` compares them with the device's memory.

The learner's floor (:func:`learner_bytes`) is its share of the weights, gradients and AdamW moments
in the model's dtype (with fp32 master weights: the masters, and fp32 gradients and moments):
a lower bound (activations come on top), so
it refuses only runs that cannot start, such as a 7B model in fp32 on an 80 GiB GPU. On top of it,
:func:`learner_memory` adds the activations of a micro-batch (per token: :func:`activation_bytes_per_token`,
with and without ``model.gradient_checkpointing``) and the log-prob workspace.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from pacs_fast.config.hybrid_blocks import blocks_of, layers_of
from pacs_fast.config.linear_attention import linear_attention_of
from pacs_fast.config.per_layer import altup_laurel_params, intermediate_of, layer_shape
from pacs_fast.config.model_files import SAFE_INDEX_NAME, SAFE_WEIGHTS_NAME, mla_of, moe_of
from pacs_fast.learner.flops import mixer_params, mlp_params
from pacs_fast.learner.objective import holds_reference_model
from pacs_fast.trainer.adapter_count import SHARED_EXPERT_GATE, lora_params  # noqa: F401 - (re-exported)
from pacs_fast.trainer.engine_memory import (_bytes_of, engine_row_terms, engine_rows, hf_engine_bytes,  # noqa: F401
                                             kv_per_token, row_limits)  # (the engine's, re-exported)
from pacs_fast.trainer.model_attention import packed_rows_dense, varlen_unsupported, windowed_model  # noqa: F401

GiB = 1024 ** 3


def model_shape(cfg) -> dict:
    """vocab, hidden, layers, heads, kv_heads, head_dim, intermediate (None when the config does not
    say), tied (the LM head shares the embedding), dtype bytes of the run's model, from its
    ``config.json`` (or the built-in tiny model's settings); an empty dict when unknown."""
    if not cfg.model.path:
        from pacs_fast.trainer.warmup import tiny_model_kwargs

        t = tiny_model_kwargs(cfg)
        return {"vocab": 128, "hidden": t["hidden_size"], "layers": t["num_layers"], "heads": t["num_heads"],
                "kv_heads": t["num_kv_heads"], "head_dim": 32, "intermediate": t["intermediate_size"], "tied": True,
                "bytes": _dtype_bytes(cfg)}  # (the learner loads it in model.dtype, as any other model)
    try:
        c = json.loads((Path(cfg.model.path).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    top, c = c, c.get("text_config", c)
    H, heads = c.get("hidden_size"), c.get("num_attention_heads")
    layers, blocks = c.get("num_hidden_layers") or layers_of(c), blocks_of(c)  # (Nemotron-H's: its pattern's)
    if not (H and heads and c.get("vocab_size") and layers):
        return {}
    return {"vocab": int(c["vocab_size"]), "hidden": int(H), "layers": int(layers), "heads": int(heads),
            "kv_heads": int(c.get("num_key_value_heads") or heads), "head_dim": int(c.get("head_dim") or H // heads),
            "intermediate": intermediate_of(c),  # (Gemma 3n's is a list a layer)
            "tied": _tied(top, Path(cfg.model.path).expanduser()),
            "bytes": _dtype_bytes(cfg), "softcap": _softcapped(c), "moe": None if blocks else moe_of(c),
            "mla": mla_of(c), "linear": linear_attention_of(c), "blocks": blocks, "model_type": c.get("model_type"),
            **layer_shape(c)}


def _softcapped(c: dict) -> bool:
    """Whether a (text) config soft-caps its logits (Gemma 2's ``final_logit_softcapping``; its class's default,
    30, where config.json omits the key): the log-prob op's torch path then holds a third logits tile."""
    return bool(c.get("final_logit_softcapping", 30.0 if c.get("model_type") == "gemma2" else None))


def _dtype_bytes(cfg) -> int:
    return _bytes_of(cfg.model.dtype)


def _tied(config: dict, folder: Path | None = None) -> bool:
    """Whether the LM head is the embedding: ``tie_word_embeddings`` of ``config.json`` (top level, else
    its ``text_config``), else whether ``folder``'s weights hold a head of their own (Mistral Small 3.1's
    ``language_model.lm_head.weight``, whose config class says tied: its head had been counted once), else the
    default of transformers' config class for its ``model_type`` (False for Qwen2 and Llama, True for GPT-2), else
    True (the parameter count stays a lower bound)."""
    for c in (config, config.get("text_config") or {}):
        if isinstance(c.get("tie_word_embeddings"), bool):
            return c["tie_word_embeddings"]
    if folder is not None and _head_in_weights(folder):
        return False
    try:
        from transformers import AutoConfig

        return bool(AutoConfig.for_model(config["model_type"]).tie_word_embeddings)
    except Exception:  # no or an unknown model_type: count the head once
        return True


def _head_in_weights(folder: Path) -> bool:
    """Whether the model folder's safetensors name an LM head tensor (read from the index, or the file's header)."""
    try:
        if (folder / SAFE_WEIGHTS_NAME).is_file():
            from safetensors import safe_open

            with safe_open(str(folder / SAFE_WEIGHTS_NAME), framework="pt") as f:
                names = list(f.keys())
        else:
            names = list(json.loads((folder / SAFE_INDEX_NAME).read_text(encoding="utf-8"))["weight_map"])
    except Exception:  # noqa: BLE001 - no safetensors, an unreadable index: the config class's default then
        return False
    return any(n == "lm_head.weight" or n.endswith(".lm_head.weight") for n in names)


def model_params(shape: dict) -> int:
    """Parameters of the model, at least: the embedding, and the LM head unless it is the embedding
    (``shape["tied"]``, default True), each layer's attention projections and, where the config gives
    its width, its gated MLP, of a mixture of experts every expert's (:func:`pacs_fast.learner.flops.mlp_params`;
    counting one MLP a layer left out 89% of Qwen3-30B-A3B's parameters) (norms and biases, a few per mille, left
    out)."""
    embeddings = 1 if shape.get("tied", True) else 2  # (MLA's and linear attention's own projections: flops)
    return (embeddings * shape["vocab"] * shape["hidden"] + mixer_params(shape) + mlp_params(shape)
            + shape.get("per_layer_inputs", 0)  # (Gemma 4's per-layer input embeddings: 2.3B of E2B's 5.1B)
            + altup_laurel_params(shape))  # (Gemma 3n's AltUp and LAuReL)


def learner_layout(cfg) -> tuple[int, int]:
    """(data-parallel size, learner processes on this host) of the launch: the megatron learner's processes are
    the launch's (:func:`pacs_fast.config.launch_checks.world_size`) less ``rollout.ranks``, ``learner.tp_size`` to a
    data-parallel rank; torchrun's ``LOCAL_WORLD_SIZE`` counts this host's, less the engine ranks among them (the
    launch's ranks ``0..rollout.ranks-1``; torchrun numbers a node's processes consecutively, so this host's are
    launch ranks ``RANK - LOCAL_RANK`` on: on a second node the engines of the first are not there); the torch
    learner is one process."""
    from pacs_fast.config.launch_checks import world_size

    if cfg.learner.backend != "megatron":
        return 1, 1
    learners = max(world_size() - cfg.rollout.ranks, 1)
    here = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    # (the launch's rank: the asynchronous layout gives each role its own RANK, pacs_fast/trainer/roles.py)
    launch_rank = int(os.environ.get("PACS_FAST_LAUNCH_RANK", os.environ.get("RANK", "0")) or 0)
    first = max(launch_rank - int(os.environ.get("LOCAL_RANK", "0") or 0), 0)  # this host's first launch rank
    local = here - max(min(cfg.rollout.ranks, first + here) - first, 0)
    return max(learners // max(cfg.learner.tp_size, 1), 1), min(max(local, 1), learners)


def moment_shards(cfg) -> int:
    """Ranks AdamW's moments are split over: the data-parallel ranks with ``learner.distributed_optimizer``
    (megatron's make_optimizer shards only when there are 2 or more), else 1."""
    return learner_layout(cfg)[0] if cfg.learner.distributed_optimizer else 1


def master_weights(cfg, shape: dict) -> bool:
    """Whether the learner keeps fp32 master weights (a bf16 / fp16 model with ``learner.master_weights``):
    then its gradients and AdamW's moments are fp32 too."""
    return cfg.learner.master_weights and shape["bytes"] < 4


def _state_bytes(cfg, shape: dict) -> tuple[int, int, int]:
    """``(weights, gradients, moments)`` bytes of one learner process: its ``learner.tp_size`` share, the moments
    split over the data-parallel ranks with ``learner.distributed_optimizer``; in the model's dtype, or with fp32
    master weights (:func:`master_weights`) the masters counted with the weights and the rest in fp32."""
    params = model_params(shape) // max(cfg.learner.tp_size, 1)
    fp32 = master_weights(cfg, shape)
    if cfg.model.lora_rank:  # (torch learner) the base frozen: gradients, moments and masters of the adapters only
        adapters = lora_params(shape, cfg.model.lora_rank)
        grads = adapters * (4 if fp32 else shape["bytes"])
        return (params + adapters) * shape["bytes"] + (adapters * 4 if fp32 else 0), grads, 2 * grads
    grads = params * (4 if fp32 else shape["bytes"])
    return params * shape["bytes"] + (params * 4 if fp32 else 0), grads, 2 * grads // moment_shards(cfg)


def learner_bytes(cfg, shape: dict) -> int:
    """The least memory one learner process holds: its share (``learner.tp_size``) of the weights and
    their gradients, and of AdamW's two moments (split over the data-parallel ranks with
    ``learner.distributed_optimizer``), all in the model's dtype (activations come on top); with fp32
    master weights (:func:`master_weights`) the masters too, and gradients and moments in fp32."""
    return sum(_state_bytes(cfg, shape))


NORM_COPY = 4  # bytes per element of the fp32 copy Hugging Face's RMSNorm saves of its input


def activation_bytes_per_token(shape: dict, *, recompute: bool | str = False, tp: int = 1, attention: str = "flash",
                               longest: int = 0, megatron: bool = False, fused: bool = False,
                               sequence_parallel: bool = False) -> float:
    """Bytes the backward keeps per token of a micro-batch, all layers (the torch learner's Hugging
    Face decoder; megatron's is close). One Qwen2 / LLaMA decoder layer, ``b`` the model dtype's
    bytes, ``H`` hidden, ``Hq = heads x head_dim``, ``Hkv = kv_heads x head_dim``, ``F`` the MLP width
    (0 when the config does not say: a lower bound), ``a`` heads, ``t`` = ``tp`` (tensor parallel
    shards what is between the norms)::

        A = 2 (4 + b) H                 two RMSNorms: the fp32 copy of the input and the normalised output
          + b (3 Hq + 2 Hkv) / t        q, k (after RoPE), v, the attention output, o_proj's contiguous input
          + 4 b F / t                   the MLP: gate, up, silu(gate), silu(gate) * up
          + 4 a / t                     the attention's fp32 log-sum-exp

    (Korthikanti et al. 2022 count ``34 H + 5 a S`` per token per layer for a GPT layer in fp16 with
    dropout; ``5 a S`` is the score matrices', which flash / varlen attention never keeps.) Without
    recompute: ``L A + (4 + b) H`` (the final norm). With ``model.gradient_checkpointing`` (``recompute``
    True or ``"full"``): each layer's input, ``L b H``, plus one layer recomputed in the backward, ``A``, plus
    the final norm; ``"selective"`` (each layer's MLP recomputed, pacs_fast/learner/recompute.py): ``L (A - M)
    + M`` plus the final norm, ``M = 4 b F / t`` the MLP's (its input, the norm's output, stays).
    ``attention``: ``"flash"`` (flash / varlen / SDPA without a mask: no ``S`` term), ``"eager"``
    (``+ a S (4 + b) / t`` per layer: fp32 probabilities and their cast, ``S`` = ``longest``);
    the dense packed mask is counted per micro-batch (:func:`dense_mask_bytes`). ``megatron``: its MLP keeps one
    more ``b F / t`` (``M = 5 b F / t``): measured on an H200 (bench/results/gpu/20261129_h200, Qwen2.5-1.5B shape,
    no recompute), the megatron learner's peaks were 7.5-14% above the torch learner's model at the same budgets,
    and within 1.3% of it with the MLP recomputed. ``fused`` (``learner.fused_layers``, :func:`fused_layers_of`):
    Liger's SwiGLU keeps gate and up and its output, ``M = 3 b F / t`` (both learners); the torch learner's Liger
    RMSNorm keeps its bf16 input instead of an fp32 copy, ``2 (b + b) H`` for the two norms (measured: 4% over the
    torch learner's peaks with them, exact for the megatron learner's). ``sequence_parallel`` (megatron's, at
    ``tp`` > 1: :mod:`pacs_fast.learner.megatron.sequence_parallel`): what lies outside the tensor-parallel regions
    is split along the sequence too, so the norms' ``2 (4 + b) H``, full recompute's saved layer inputs ``L b H``
    and the final norm's fp32 copy and output are divided by ``t``; the LM head keeps the gathered ``b H``."""
    b, H, L = shape["bytes"], shape["hidden"], shape["layers"]
    a, hd = shape["heads"], shape["head_dim"]
    F = shape.get("intermediate") or 0
    mlp = (3 if fused else 5 if megatron else 4) * b * F / tp
    norm_copy = b if fused and not megatron else NORM_COPY  # (megatron's norms stay torch's)
    sp = tp if sequence_parallel else 1
    widths = shape.get("attention_widths")  # (layers of different widths: their mean, the sum over layers exact)
    qkv = (sum(3 * q + k + v for q, k, v in widths) / L if widths else 3 * a * hd + 2 * shape["kv_heads"] * hd)
    layer = 2 * (norm_copy + b) * H / sp + (b * qkv + 4 * a) / tp + mlp
    if attention == "eager":
        layer += a * longest * (4 + b) / tp
    if recompute not in (False, True, "full", "selective"):
        raise ValueError(f"recompute must be False, True, 'full' or 'selective', got {recompute!r}")
    if recompute == "selective":
        body = L * (layer - mlp) + mlp
    else:
        body = L * b * H / sp + layer if recompute else L * layer
    final_norm = (NORM_COPY + b) * H
    return body + (final_norm / sp + b * H if sp > 1 else final_norm)


def lora_dropout_bytes_per_token(shape: dict, recompute: bool | str = False) -> float:
    """What ``model.lora_dropout`` > 0 adds to :func:`activation_bytes_per_token`: each adapted linear layer keeps its
    own dropped copy of its input and the mask (``b + 1`` bytes an element), every linear layer counted (as
    :func:`lora_params` does): q, k, v, gate and up take ``H``, o_proj ``Hq``, down_proj ``F``. Recompute keeps one
    layer's (full) or the attention's of every layer and one layer's MLP (selective). Measured on the CPU (a 2-layer
    Qwen2.5-0.5B-width model, fp32, tests/test_lora_sweep.py): 305 KB a token kept with dropout, 205 KB without."""
    b, H = shape["bytes"], shape["hidden"]
    attention = (3 * H + shape["heads"] * shape["head_dim"]) * (b + 1)
    mlp = (2 * H + (shape.get("intermediate") or 0)) * (b + 1)
    if recompute in (True, "full"):
        return attention + mlp
    return shape["layers"] * attention + (mlp if recompute == "selective" else shape["layers"] * mlp)


def fused_layers_of(cfg, device: str = "cuda") -> bool:
    """Whether the learner's layers run fused (``learner.fused_layers``: ``on``; ``auto`` where a CUDA GPU is here
    and liger-kernel can fuse this learner's model, :func:`pacs_fast.learner.fused_layers.why_not`)."""
    mode = cfg.learner.fused_layers
    if mode != "auto":
        return mode == "on"
    import torch

    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        return False
    from pacs_fast.learner.fused_layers import why_not

    return why_not("cuda", megatron=cfg.learner.backend == "megatron") is None


def sequence_parallel_of(cfg) -> bool:
    """Whether the learner runs megatron's sequence parallelism (``learner.sequence_parallel`` at ``tp_size`` > 1)."""
    lc = cfg.learner
    return lc.backend == "megatron" and lc.tp_size > 1 and bool(lc.sequence_parallel)


def recompute_of(cfg) -> bool | str:
    """What the learner's backward recomputes: False, ``"full"`` or ``"selective"`` (``model.gradient_checkpointing``,
    ``model.recompute_granularity``)."""
    return cfg.model.recompute_granularity if cfg.model.gradient_checkpointing else False


def recompute_setting(cfg) -> str:
    """The settings :func:`recompute_of` reads, as a message names them."""
    if not cfg.model.gradient_checkpointing:
        return "model.gradient_checkpointing=false"
    return f"model.gradient_checkpointing=true, model.recompute_granularity={cfg.model.recompute_granularity}"


def recompute_advice(cfg) -> str:
    """What recomputes more, for a message that says what does not fit ("" when nothing does)."""
    if not cfg.model.gradient_checkpointing:
        return "model.gradient_checkpointing=true"
    return "model.recompute_granularity=full" if cfg.model.recompute_granularity == "selective" else ""


def dense_mask_bytes(shape: dict, tokens: int, longest: int) -> int:
    """``learner.packed_attention=dense``: bins of ``longest`` tokens, each with a boolean
    ``[S, S]`` mask (shared) and the float bias SDPA's masked kernel keeps for the backward, per layer."""
    bins = -(-tokens // max(longest, 1))
    return bins * longest * longest * (1 + shape["layers"] * shape["bytes"])


def logprob_workspace_bytes(shape: dict, tokens: int, *, device: str = "cuda", lm_head_fp32: bool = False,
                            tp: int = 1, torch_path: bool = False) -> int:
    """The log-prob op's scratch (pacs_fast/ops/linear_logprobs.py): the Triton backward's ``dz``
    chunk (512 MiB; CPU: two 64 MiB tiles), fp32 (max, sum-exp, entropy) partials per 128-column
    block of this rank's ``V / tp`` vocabulary and token (``12 N cdiv(V / tp, 128)``, kernels/
    linear_logprobs_fwd.py), the gathered hidden states and their gradient; with ``model.lm_head_fp32``
    also fp32 copies of the head and its gradient and of the hidden states. ``tokens`` bounds the
    response tokens the op sees. ``torch_path`` on a GPU (``learner.logprob_backend=torch``): two 64 MiB logits
    tiles (three for a soft-capped model's), an fp32 ``[V, H]`` gradient accumulator for a bf16 /
    fp16 head, fp32 copies of the hidden states and their gradient."""
    V, H, b = -(-shape["vocab"] // max(tp, 1)), shape["hidden"], shape["bytes"]
    if device == "cuda" and torch_path:
        out = (64 << 20) * (3 if shape.get("softcap") else 2) + (V * H * 4 if b != 4 else 0) + 2 * tokens * H * 4
    else:
        out = (512 << 20) + 12 * -(-V // 128) * tokens if device == "cuda" else 128 << 20
    out += 2 * tokens * H * b
    if lm_head_fp32:
        out += 2 * V * H * 4 + tokens * H * 4
    return out


def group_tokens(cfg) -> int:
    """Tokens of one group of full-length rows as the learner runs it: ``G (P + R)``, or ``P + G R``
    with the shared-prefix forward (torch, no full recompute, ``learner.packing`` not ``on``, no sliding window);
    rows within the model's context (:func:`row_limits`: the shared prompt's length that makes the most tokens)."""
    G, (P, R, S) = cfg.rollout.n, row_limits(cfg)
    shared = (cfg.learner.backend == "torch" and cfg.learner.shared_prefix and recompute_of(cfg) != "full"
              and cfg.learner.packing != "on" and not windowed_model(cfg))  # (a window: the padded forward)
    if not shared:
        return G * S
    if S == P + R:  # (no context, or rows within it)
        return P + G * R
    prompt = min(max(S - R, 1), P)  # (a prompt of S - R tokens leaves each response R; longer ones leave less)
    return prompt + G * min(R, S - prompt)


def run_device(cfg) -> str:
    if cfg.model.device != "auto":
        return cfg.model.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def largest_micro_batch(cfg) -> int:
    """Tokens of the largest micro-batch a learner process can make: its token budget
    (``learner.max_tokens_per_micro_batch``, at most its whole mini-batch of full-length groups: a budget past
    that is never filled), else ``learner.micro_batch_prompts`` groups of :func:`group_tokens`. A data-parallel
    rank's mini-batch is its share (:func:`learner_layout`; the megatron learner's local batches)."""
    lc, dp = cfg.learner, learner_layout(cfg)[0]
    mini = max(min(lc.mini_batch_prompts, cfg.train.prompts_per_step) // dp, 1)  # groups of a rank's mini-batch
    if lc.max_tokens_per_micro_batch:
        return min(lc.max_tokens_per_micro_batch, mini * group_tokens(cfg))
    return min(lc.micro_batch_prompts, mini) * group_tokens(cfg)


def learner_memory(cfg, shape: dict | None = None, *, tokens: int | None = None, device: str = "cuda") -> dict:
    """Bytes one learner process holds at its peak, by part: ``weights``, ``gradients``, ``optimizer``
    (AdamW's two moments in the model's dtype; split over the data-parallel ranks with
    ``learner.distributed_optimizer``), each divided by ``learner.tp_size`` (with fp32 master weights,
    :func:`master_weights`: the masters counted with the weights, gradients and moments in fp32);
    ``activations`` = ``tokens`` x
    :func:`activation_bytes_per_token` (:func:`recompute_of`; ``tokens`` defaults to
    :func:`largest_micro_batch`), plus :func:`dense_mask_bytes` with ``learner.packed_attention=dense``;
    ``workspace`` (:func:`logprob_workspace_bytes`); ``tied_gradient``: with a head tied to the embedding, the
    embedding lookup's dense ``[V, H]`` gradient, alive while it is added into the head's at the end of the
    backward; ``optimizer_step``: AdamW's temporaries (``torch.optim.AdamW``'s defaults: on a GPU its foreach
    step makes a ``sqrt`` copy of every moment it steps at once, ~the weights (their share with the sharded
    optimiser); on the CPU its per-tensor step two copies of the largest tensor); ``backward`` (weights, gradients,
    moments, activations, workspace, tied gradient) and ``step`` (weights, gradients, moments, temporaries)
    peaks, ``total`` the larger; ``tokens``, ``per_token``. Measured on the CPU (a 2-layer Qwen2.5-0.5B-width
    model in fp32, bench/bench_learner_memory.py): the total 1.7-9.8% under the measured peak, against 13-26%
    under without the last two terms."""
    shape = shape or model_shape(cfg)
    lc, tp = cfg.learner, max(cfg.learner.tp_size, 1)
    if tokens is None:
        tokens = largest_micro_batch(cfg)
    longest = row_limits(cfg)[2]
    # megatron's dense-mask packed forward is its local DotProductAttention: [b, heads, S, S] scores kept for the
    # backward, as eager attention's (its THD rows and its padded rows, a causal kernel, never build them)
    megatron_scores = lc.backend == "megatron" and lc.packing != "off" and lc.packed_attention == "dense"
    attention = "eager" if cfg.model.attention == "eager" or megatron_scores else "flash"
    per_token = activation_bytes_per_token(shape, recompute=recompute_of(cfg), tp=tp, attention=attention,
                                           longest=longest, megatron=lc.backend == "megatron",
                                           fused=fused_layers_of(cfg, device),
                                           sequence_parallel=sequence_parallel_of(cfg))
    if cfg.model.lora_rank and cfg.model.lora_dropout > 0:
        per_token += lora_dropout_bytes_per_token(shape, recompute_of(cfg))
    weights, grads, moments = _state_bytes(cfg, shape)
    b_opt = 4 if master_weights(cfg, shape) else shape["bytes"]  # AdamW's dtype
    shards = moment_shards(cfg)
    out = {"weights": weights, "gradients": grads, "optimizer": moments,
           "activations": int(tokens * per_token), "tokens": int(tokens), "per_token": per_token,
           "workspace": logprob_workspace_bytes(shape, tokens, device=device, lm_head_fp32=cfg.model.lm_head_fp32,
                                                tp=tp, torch_path=lc.logprob_backend == "torch")}
    if packed_rows_dense(cfg):
        out["activations"] += dense_mask_bytes(shape, tokens, longest)
    H, b = shape["hidden"], shape["bytes"]
    # (LoRA: the embedding is frozen, no gradient of it; the largest tensor AdamW steps is an adapter's)
    out["tied_gradient"] = shape["vocab"] * H * b // tp if shape.get("tied", True) and not cfg.model.lora_rank else 0
    largest = max(shape["vocab"] * H, H * (shape["intermediate"] or 0)) * b_opt // tp
    if cfg.model.lora_rank:
        largest = cfg.model.lora_rank * (H + max(H, shape["intermediate"] or 0)) * b_opt
    out["optimizer_step"] = grads // shards if device == "cuda" else 2 * largest
    # a fixed reference policy (algo.ref=fixed, a baseline's KL): a second copy of the weights in the model's dtype;
    # with LoRA a copy of the adapters (the reference shares the frozen base)
    ref_bytes = lora_params(shape, cfg.model.lora_rank) * b if cfg.model.lora_rank else model_params(shape) * b // tp
    out["reference"] = ref_bytes if holds_reference_model(cfg.algo) else 0
    base = out["weights"] + out["gradients"] + out["optimizer"] + out["reference"]
    out["backward"] = base + out["activations"] + out["workspace"] + out["tied_gradient"]
    out["step"] = base + out["optimizer_step"]
    out["total"] = max(out["backward"], out["step"])
    return out


def format_learner_memory(cfg, mem: dict | None = None) -> str:
    """The breakdown of :func:`learner_memory`, one part a line, in GiB."""
    mem = mem or learner_memory(cfg)
    rows = [(k, mem[k]) for k in ("weights", "gradients", "optimizer", "reference", "activations", "workspace",
                                  "tied_gradient", "optimizer_step", "total")]
    head = (f"learner memory per process (model.dtype={cfg.model.dtype}, learner.tp_size={cfg.learner.tp_size}, "
            f"{recompute_setting(cfg)}): {mem['tokens']:,} tokens per "
            f"micro-batch x {mem['per_token'] / 1024:.1f} KiB of activations per token")
    return "\n".join([head] + [f"  {k:<15}{v / GiB:9.2f} GiB" for k, v in rows])
