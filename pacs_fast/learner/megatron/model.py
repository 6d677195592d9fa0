"""Build a megatron-core ``GPTModel`` from a Hugging Face Qwen2 / Qwen3 / Llama config.

Supported: ``Qwen2ForCausalLM`` (QKV bias), ``Qwen3ForCausalLM`` (no biases; an RMSNorm over the head dimension
on the queries and keys before RoPE, megatron's ``qk_layernorm``; a ``head_dim`` of its own) and
``LlamaForCausalLM`` (no biases) style decoders — RoPE (the default rope type, and Llama 3.x's ``llama3`` scaling;
non-interleaved halves as in HF), grouped-query attention, SwiGLU MLP, RMSNorm, tied or untied input/output
embeddings. Built with megatron's *local* layer spec (no Transformer Engine; every norm ``torch.nn.RMSNorm``,
which also runs sequence parallel: :mod:`~pacs_fast.learner.megatron.sequence_parallel`), dropout 0 (a checkpoint
whose config asks for dropout is refused: :func:`check_no_dropout`), fp32 parameters unless ``params_dtype`` says
otherwise; its core attention is :mod:`~pacs_fast.learner.megatron.core_attention`'s (megatron's
``DotProductAttention`` plus a varlen path for packed THD rows).

The vocabulary is padded to a multiple of the tensor-parallel size (see
:func:`padded_vocab_size`); :mod:`pacs_fast.learner.megatron.convert` fills and strips the pad.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pacs_fast.causal_lm import config_dropouts

SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``tp_size`` (each rank gets an equal shard)."""
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if tp_size < 1:
        raise ValueError(f"tp_size must be positive, got {tp_size}")
    return -(-vocab_size // tp_size) * tp_size


# Llama 3.x's RoPE scaling ("llama3"): megatron's RotaryEmbedding(rope_scaling=True, rope_scaling_factor=f) applies
# Meta's formula with these fixed, as every Llama 3.1 / 3.2 checkpoint has them; a config with others is refused
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _rope(hf_config) -> tuple[float, float | None]:
    """``(rope_theta, llama3 scaling factor or None)`` of ``hf_config``; ValueError for a RoPE megatron's local
    spec does not build: a rope type other than ``default`` and ``llama3``, a ``llama3`` whose low / high frequency
    factors or original context differ from :data:`LLAMA3_FIXED`."""
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    legacy = getattr(hf_config, "rope_scaling", None)
    if legacy and not params.get("rope_type", params.get("type")):  # (transformers 4: rope_scaling alone)
        params.update(legacy)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in (None, "default", "llama3"):
        raise ValueError(f"hf_config: rope_type {rope_type!r} is not supported (only 'default' and 'llama3')")
    if legacy and legacy.get("rope_type", legacy.get("type")) not in (None, "default", "llama3"):
        raise ValueError(f"hf_config: rope_scaling {legacy!r} is not supported")
    theta = params.get("rope_theta", getattr(hf_config, "rope_theta", None))
    if theta is None:
        raise ValueError("hf_config has no rope_theta")
    if rope_type != "llama3":
        return float(theta), None
    other = {k: params.get(k) for k, v in LLAMA3_FIXED.items() if params.get(k) is None or float(params[k]) != v}
    if other or params.get("factor") is None:
        raise ValueError(f"hf_config: rope_type 'llama3' with {other or {'factor': None}} is not supported (megatron "
                         f"builds it with {LLAMA3_FIXED} and a factor, as Llama 3.1 / 3.2)")
    return float(theta), float(params["factor"])


def check_hf_config(hf_config) -> None:
    """Raise ValueError when ``hf_config`` describes something this builder cannot reproduce."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"hf_config.model_type must be one of {SUPPORTED_MODEL_TYPES}, got {model_type!r}")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hf_config.hidden_act must be 'silu' (SwiGLU), got {hf_config.hidden_act!r}")
    if model_type in ("llama", "qwen3") and (getattr(hf_config, "attention_bias", False)
                                             or getattr(hf_config, "mlp_bias", False)):
        raise ValueError(f"hf_config: {model_type} attention_bias / mlp_bias are not supported")
    if model_type in ("qwen2", "qwen3") and getattr(hf_config, "use_sliding_window", False):
        raise ValueError("hf_config.use_sliding_window=True is not supported")
    _rope(hf_config)


def check_no_dropout(hf_config) -> None:
    """ValueError naming each dropout probability > 0 of ``hf_config`` (a ``PretrainedConfig`` or its dict; Qwen2 /
    Llama: ``attention_dropout``; :func:`pacs_fast.causal_lm.config_dropouts`, what the torch learner reads). The
    megatron model is built without dropout, while the torch learner trains such a checkpoint with it: the run
    would silently train another model. (Conversions of weights do not call it: dropout does not change them.)"""
    found = config_dropouts(hf_config)
    if found:
        raise ValueError(f"hf_config has {', '.join(f'{k}={v}' for k, v in found.items())}: the megatron learner "
                         f"trains without dropout (the torch learner applies it); set it to 0 in config.json to "
                         f"train without")


def head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def unshardable(tp_size: int, **sizes: int | None) -> list[str]:
    """``"name=value"`` of each of ``sizes`` (attention heads, key/value heads, MLP width) that
    ``tp_size`` tensor-parallel ranks cannot split evenly (None: unknown, skipped)."""
    return [f"{name}={n}" for name, n in sizes.items() if n and n % tp_size]


def transformer_config_from_hf(hf_config, *, tp_size: int = 1, params_dtype=torch.float32, **overrides):
    """A megatron ``TransformerConfig`` equivalent to ``hf_config`` (dropout 0, no fusions).

    ``overrides`` are passed to ``TransformerConfig`` last (e.g. ``recompute_granularity``).
    """
    from megatron.core.transformer import TransformerConfig

    check_hf_config(hf_config)
    n_heads = hf_config.num_attention_heads
    n_kv = getattr(hf_config, "num_key_value_heads", None) or n_heads
    bad = unshardable(tp_size, num_attention_heads=n_heads, num_key_value_heads=n_kv,
                      intermediate_size=hf_config.intermediate_size)
    if bad:
        raise ValueError(f"tp_size={tp_size} must divide {', '.join(bad)}")
    kwargs = dict(
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        ffn_hidden_size=hf_config.intermediate_size,
        num_attention_heads=n_heads,
        num_query_groups=n_kv,
        kv_channels=head_dim(hf_config),
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=hf_config.model_type == "qwen2",
        qk_layernorm=hf_config.model_type == "qwen3",  # its q_norm / k_norm over the head dimension
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp_size,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=params_dtype == torch.bfloat16,
        fp16=params_dtype == torch.float16,
        use_cpu_initialization=True,
        perform_initialization=False,  # weights come from the HF checkpoint
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        attention_softmax_in_fp32=True,
        init_method_std=getattr(hf_config, "initializer_range", 0.02),
    )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def recompute_overrides(enabled: bool, granularity: str = "full") -> dict:
    """``TransformerConfig`` keywords for ``model.gradient_checkpointing`` / ``model.recompute_granularity``:
    ``full``, every layer recomputed from its input (uniform, one layer a unit); ``selective``, each layer's dense
    MLP (``recompute_modules=["mlp"]``: most of a layer's activations; megatron's default module, the core
    attention, would save nothing with a varlen / flash kernel, pacs_fast/learner/recompute.py)."""
    from pacs_fast.config.schema import RECOMPUTE_GRANULARITIES

    if granularity not in RECOMPUTE_GRANULARITIES:
        raise ValueError(f"model.recompute_granularity must be one of {', '.join(RECOMPUTE_GRANULARITIES)}, "
                         f"got {granularity!r}")
    if not enabled:
        return {}
    if granularity == "full":
        return dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    return dict(recompute_granularity="selective", recompute_modules=["mlp"])


def build_gpt_model(hf_config, *, tp_size: int = 1, params_dtype=torch.float32, **overrides):
    """A megatron-core ``GPTModel`` (this rank's shard) for ``hf_config``; weights uninitialised.

    Needs megatron's ``parallel_state`` initialised with tensor-parallel size ``tp_size``. Load
    weights with :func:`pacs_fast.learner.megatron.convert.load_hf_into_model`. ``overrides`` go to the
    ``TransformerConfig``; ``sequence_parallel=True`` (``tp_size`` > 1) splits the activations between the
    tensor-parallel regions along the sequence (:mod:`pacs_fast.learner.megatron.sequence_parallel`).
    """
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from pacs_fast.learner.megatron.core_attention import core_attention_class
    from pacs_fast.learner.megatron.sequence_parallel import mark_norms, rms_norm_spec

    config = transformer_config_from_hf(hf_config, tp_size=tp_size, params_dtype=params_dtype, **overrides)
    theta, scaling = _rope(hf_config)
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=config.qk_layernorm)
    spec.submodules.self_attention.submodules.core_attention = core_attention_class()  # + packed (THD) rows
    model = GPTModel(
        config=config,
        transformer_layer_spec=rms_norm_spec(spec, config),  # torch's RMSNorm, which takes sequence_parallel
        vocab_size=padded_vocab_size(hf_config.vocab_size, tp_size),
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=True,
        post_process=True,
        parallel_output=True,
        share_embeddings_and_output_weights=bool(getattr(hf_config, "tie_word_embeddings", False)),
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=theta,
        rope_scaling=scaling is not None,  # Llama 3.x
        rope_scaling_factor=scaling or 8.0,
    )
    mark_tensor_parallel_params(model)
    mark_norms(model)  # the norm weights whose gradients the tensor-parallel ranks sum
    in_params_dtype(model, params_dtype)
    pad = getattr(hf_config, "pad_token_id", None)
    if isinstance(pad, int) and 0 <= pad < hf_config.vocab_size:
        no_gradient_at_padding(model, pad)
    return model


def in_params_dtype(model, params_dtype) -> None:
    """Every floating-point parameter in ``params_dtype``. Megatron's local spec builds its norms as
    ``torch.nn.RMSNorm`` without a dtype (megatron's ``Float16Module``, which this learner does not use, would
    cast them): a bf16 model kept fp32 norm weights, which the rollout engines' bf16 copies do not have, made
    ``F.rms_norm`` leave its fused kernel ("Mismatch dtype between input and weight") and mixed fp32 tensors
    into the exported bf16 checkpoint (sweep of 2026-11-29). Their precision lives in the fp32 master weights
    (``learner.master_weights``), as every other bf16 parameter's. Buffers (RoPE's ``inv_freq``) are left as
    they are."""
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != params_dtype:
            p.data = p.data.to(params_dtype)


def no_gradient_at_padding(model, pad_id: int) -> None:
    """Hugging Face's ``nn.Embedding(padding_idx=config.pad_token_id)`` (Qwen2, Llama): the embedding row of
    ``pad_id`` gets no gradient from its lookups (a head tied to it still gets the head's). Megatron's
    ``VocabParallelEmbedding`` has no such row: without this, a pad id that also occurs as a real token (the
    tiny model's ``<pad>``, a ``pad_token_id`` that is ``<|endoftext|>``) trained that row where the torch
    learner did not (long-response sweep, 2026-11-28: grad_norm 7.31 torch vs 8.39 megatron). The lookups of
    ``pad_id`` pass forward unchanged and backward nothing."""
    def hook(module, args, out):
        ids = args[0] if args else None
        pad = None if ids is None else ids == pad_id
        if pad is not None and getattr(module, "reduce_scatter_embeddings", False):
            # sequence parallelism: out is [S / tp, B, H], this rank's part of the transposed sequence
            from megatron.core import parallel_state as ps

            pad = pad.t().chunk(ps.get_tensor_model_parallel_world_size())[ps.get_tensor_model_parallel_rank()]
        if pad is None or tuple(out.shape[:2]) != tuple(pad.shape):
            raise RuntimeError(f"the word embedding's output {tuple(out.shape)} does not match its input ids "
                               f"{tuple(ids.shape) if ids is not None else None}")
        return torch.where(pad.unsqueeze(-1), out.detach(), out)

    model.embedding.word_embeddings.register_forward_hook(hook)


def mark_tensor_parallel_params(model) -> None:
    """Set megatron's ``tensor_model_parallel`` / ``partition_dim`` attributes on every weight.

    megatron sets them on weights only while initialising them (``perform_initialization=True``);
    weights loaded from a checkpoint instead would otherwise look replicated to anything that
    reads them (the TP-aware gradient norm, megatron's optimiser and checkpointing).
    """
    from megatron.core.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        set_defaults_if_not_set_tensor_model_parallel_attributes,
    )
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    dims = ((ColumnParallelLinear, 0), (VocabParallelEmbedding, 0), (RowParallelLinear, 1))
    for module in model.modules():
        for cls, dim in dims:
            w = getattr(module, "weight", None)
            if isinstance(module, cls) and w is not None and not hasattr(w, "tensor_model_parallel"):
                set_tensor_model_parallel_attributes(w, True, dim, 1)
    for p in model.parameters():
        set_defaults_if_not_set_tensor_model_parallel_attributes(p)
