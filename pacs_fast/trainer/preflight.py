"""Pre-flight checks from the model's ``config.json``, before any model is loaded: a learner or a
rollout that cannot fit in memory (:func:`check_memory`, from the estimates of
:mod:`pacs_fast.trainer.memory_model`), a ``learner.tp_size`` megatron cannot shard the model over
(:func:`check_tensor_parallel`), a model megatron cannot build (:func:`check_megatron_model`), a model whose
logits are not its head's in a way the learner cannot reproduce (:func:`check_logits_transform`), LoRA
adapters on layers it does not have (:func:`check_lora_targets`), more
and more threads or reward workers than CPUs (:func:`check_cpus`). The rollout engine's own checks (the model's
context, what vLLM cannot run) are in :mod:`pacs_fast.trainer.engine_checks`.

Memory is compared with what the run's device has (``MemAvailable`` of the host, or the GPU's total).
Refused, with one line naming the keys: a learner whose weights, gradients and AdamW moments cannot fit
(such as a 7B model in fp32 on an 80 GiB GPU), an optimiser step that cannot, a
``learner.max_tokens_per_micro_batch`` budget whose micro-batch cannot fit or, without a budget, a single
group of full-length rows (the least a micro-batch holds), and a Hugging Face engine whose decode step
cannot (such as ``rollout.n=10000`` on a 151,936-token vocabulary: 24 GB of vocabulary-sized tensors); the
default run and the configs in ``configs/`` pass. :func:`memory_warnings` names a micro-batch of
``learner.micro_batch_prompts`` full-length groups that may not fit; :func:`print_learner_memory` prints the
breakdown (``print_learner_memory(load_config("run.yaml", ["key=value"]))``).
"""
from __future__ import annotations

import copy
import json

from pathlib import Path

from pacs_fast.config.model_files import safetensors_weight_files
from pacs_fast.config.reward_specs import uses_verifier
from pacs_fast.config.remote_code import trusted
from pacs_fast.config.validation import splits_groups
from pacs_fast.trainer.memory_model import (GiB, engine_row_terms, engine_rows, format_learner_memory, group_tokens,
                                            hf_engine_bytes, largest_micro_batch, learner_bytes, learner_layout,
                                            learner_memory, lora_params, master_weights, model_params, model_shape,
                                            moment_shards, recompute_advice, recompute_setting, row_limits, run_device,
                                            varlen_unsupported)


def available_bytes(device: str) -> int | None:
    """Memory the engine's device has: the GPU's total, or the host's MemAvailable (None if unknown)."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(cfg, *, available: int | None = None) -> None:
    """ValueError naming the keys when the learner's weights, gradients and optimiser moments, or the
    HF engine's decode step, cannot fit in the memory of the run's device (see the module)."""
    shape = model_shape(cfg)
    if not shape:
        return
    if available is None:
        available = available_bytes(run_device(cfg))
    if available is None:
        return
    available, shared = _per_local_process(cfg, available)
    need = learner_bytes(cfg, shape)
    if need > available:
        model = (f"model.path={cfg.model.path}" if cfg.model.path else
                 f"the built-in tiny model (model.tiny_hidden_size={cfg.model.tiny_hidden_size}, "
                 f"model.tiny_num_layers={cfg.model.tiny_num_layers})")
        masters = master_weights(cfg, shape)
        fixes = ["a larger learner.tp_size" if cfg.learner.backend == "megatron" else
                 "learner.backend=megatron with learner.tp_size > 1"]
        if cfg.model.lora_rank:  # (megatron takes no adapters; their size is the rank's)
            fixes = [f"a smaller model.lora_rank (its adapters: {lora_params(shape, cfg.model.lora_rank) / 1e6:,.1f}M "
                     f"parameters)"]
        if masters:  # named only where it would fit (a 7.6B model on 22.5 GiB needs 57 GiB without masters too)
            pure = copy.deepcopy(cfg)
            pure.learner.master_weights = False
            if learner_bytes(pure, shape) <= available:
                fixes.insert(0, f"learner.master_weights=false, which needs 8 bytes a parameter, "
                                f"{learner_bytes(pure, shape) / GiB:.1f} GiB (pure bf16: at a small learner.lr most "
                                f"updates round away)")
        raise ValueError(
            f"{model} cannot be trained here: its {model_params(shape) / 1e9:.2f}B parameters' weights, gradients"
            f" and AdamW moments{' (split over the data-parallel ranks)' * (moment_shards(cfg) > 1)} in "
            f"model.dtype={cfg.model.dtype}{' with fp32 master weights (18 bytes a parameter)' * masters} "
            f"need at least {need / GiB:.1f} GiB per learner process (learner.tp_size={cfg.learner.tp_size}), and "
            f"{available / GiB:.1f} GiB are available{shared}; use {', '.join(fixes)} or a larger device")
    need = hf_engine_bytes(cfg, shape)
    if cfg.rollout.engine == "hf" and need > available:
        r, rows, longest = cfg.rollout, engine_rows(cfg), row_limits(cfg)[2]
        within = ", within the model's context" if longest < cfg.data.max_prompt_tokens + r.max_new_tokens else ""
        driver = " and ".join(k for k, v in engine_row_terms(cfg).items() if v >= rows)  # each alone holds it there
        raise ValueError(
            f"the HF rollout engine cannot fit: it decodes {rows:,} rows at once ({driver}, at most 1,024 a chunk) "
            f"of up to {longest:,} tokens (data.max_prompt_tokens={cfg.data.max_prompt_tokens} + "
            f"rollout.max_new_tokens={r.max_new_tokens}{within}), whose "
            f"logits over {shape['vocab']:,} tokens and KV cache over {shape['layers']} layers need about "
            f"{need / GiB:.1f} GiB, and {available / GiB:.1f} GiB are available{shared}; lower {driver}, "
            f"data.max_prompt_tokens or rollout.max_new_tokens")
    budget = cfg.learner.max_tokens_per_micro_batch
    # a budget is filled at most by a whole mini-batch (a budget of 3,000,000 for 224 tokens was refused)
    mem = learner_memory(cfg, shape, tokens=largest_micro_batch(cfg) if budget else group_tokens(cfg),
                         device=run_device(cfg))
    available, engine = learner_available(cfg, available)
    base = mem["weights"] + mem["gradients"] + mem["optimizer"] + mem["reference"]
    if mem["step"] > available:
        fix = ("a larger learner.tp_size, learner.distributed_optimizer=true with 2 or more data-parallel ranks, "
               if cfg.learner.backend == "megatron" else "a smaller model.lora_rank, " if cfg.model.lora_rank else
               "learner.backend=megatron with learner.tp_size > 1, " if cfg.model.dtype != "float32" else
               "model.dtype=bfloat16, learner.backend=megatron with learner.tp_size > 1, ")
        if master_weights(cfg, shape):
            fix += "learner.master_weights=false (pure bf16: at a small learner.lr most updates round away), "
        raise ValueError(
            f"the optimiser step cannot fit in the learner: {base / GiB:.1f} GiB of weights, gradients and AdamW "
            f"moments{' (and the fixed reference model)' * bool(mem['reference'])} and "
            f"{mem['optimizer_step'] / GiB:.1f} GiB of its temporaries, and {available / GiB:.1f} GiB "
            f"are available{engine}{shared}; use {fix}or a larger device")
    if mem["backward"] > available:
        what = (f"learner.max_tokens_per_micro_batch={budget}" if budget else
                f"one group of rollout.n={cfg.rollout.n} full-length rows (data.max_prompt_tokens="
                f"{cfg.data.max_prompt_tokens}, rollout.max_new_tokens={cfg.rollout.max_new_tokens}: "
                f"{mem['tokens']:,} tokens)")
        other = mem["workspace"] + mem["tied_gradient"]
        tied = " and tied-embedding gradient" if mem["tied_gradient"] else ""
        advice = recompute_advice(cfg)
        ways, note = [], ""
        split = splits_groups(cfg)  # a group over the budget trains a few rows at a time (not with LoRA dropout)
        if budget or split:  # the largest budget that fits, where it still holds what a micro-batch must
            lo, hi = 0, mem["tokens"]
            while lo < hi:
                mid = (lo + hi + 1) // 2
                fits = learner_memory(cfg, shape, tokens=mid, device=run_device(cfg))["backward"] <= available
                lo, hi = (mid, hi) if fits else (lo, mid - 1)
            if split:
                least, kind, detail = (1 + cfg.rollout.max_new_tokens, "one row",
                                       f"the longest prompt + rollout.max_new_tokens={cfg.rollout.max_new_tokens}")
            else:
                least, kind, detail = (cfg.rollout.n * (1 + cfg.rollout.max_new_tokens), "a group",
                                       f"rollout.n={cfg.rollout.n} x (the longest prompt + rollout.max_new_tokens="
                                       f"{cfg.rollout.max_new_tokens})")
            from pacs_fast.learner.objective import COUPLED_ROWS  # (those pay one more forward of a split group's rows)
            extra = cfg.algo.name in COUPLED_ROWS or cfg.algo.entropy_top_frac < 1
            how = (f"a group larger than it trains a few rows at a time{', one more forward of its rows' * extra}; "
                   if split else "")
            if lo >= least:
                ways.append(f"{'lower the budget' if budget else 'set learner.max_tokens_per_micro_batch'} to at most "
                            f"{lo:,} tokens ({how}it must still hold {kind}: {detail})")
            elif budget:
                note = f" (a lower budget cannot help: it must hold {kind}, {detail} >= {least:,} tokens)"
        if advice:
            ways.append(f"set {advice}")
        lc = cfg.learner
        if lc.backend == "megatron" and lc.tp_size > 1 and not lc.sequence_parallel:
            ways.append("set learner.sequence_parallel=true")
        raise ValueError(
            f"{what} cannot fit in the learner: with {recompute_setting(cfg)}, "
            f"{mem['per_token'] / 1024:.0f} KiB of activations per token x {mem['tokens']:,} tokens = "
            f"{mem['activations'] / GiB:.1f} GiB on top of {base / GiB:.1f} GiB of weights, gradients and optimiser "
            f"state and {other / GiB:.1f} GiB of log-prob workspace{tied}, "
            f"and {available / GiB:.1f} GiB are available{engine}{shared}; "
            + "".join(f"{w}, " for w in ways[:-1]) + (f"{ways[-1]} or " if ways else "") + "use a larger device"
            + note)


def _per_local_process(cfg, available: int) -> tuple[int, str]:
    """On the CPU the learner processes of one host (:func:`learner_layout`) share its memory: each one's share,
    and a note (a GPU's memory is its own rank's; engine ranks of an asynchronous launch are not counted)."""
    local = learner_layout(cfg)[1]
    if run_device(cfg) != "cpu" or local <= 1:
        return available, ""
    return available // local, f" to each of the {local} learner processes that share this host's memory"


def learner_available(cfg, available: int) -> tuple[int, str]:
    """The device memory the learner has, and a note: without ``rollout.ranks`` a vLLM engine on the
    same GPU keeps ``rollout.gpu_memory_utilization`` of it while the learner runs."""
    if cfg.rollout.engine == "vllm" and not cfg.rollout.ranks and run_device(cfg) == "cuda":
        share = cfg.rollout.gpu_memory_utilization
        return int(available * (1 - share)), f" (the rest of rollout.gpu_memory_utilization={share})"
    return available, ""


def memory_warnings(cfg, *, available: int | None = None) -> list[str]:
    """A line when a micro-batch of ``learner.micro_batch_prompts`` full-length groups (no token
    budget) would not fit the device, though one group does (:func:`check_memory` refuses that)."""
    shape = model_shape(cfg)
    available = available if available is not None else available_bytes(run_device(cfg)) if shape else None
    if not shape or available is None or cfg.learner.max_tokens_per_micro_batch:
        return []
    available = learner_available(cfg, _per_local_process(cfg, available)[0])[0]
    mem = learner_memory(cfg, shape, device=run_device(cfg))
    if mem["total"] <= available:
        return []
    fit = (available - (mem["backward"] - mem["activations"])) / max(mem["per_token"], 1)
    return [f"a micro-batch of learner.micro_batch_prompts={cfg.learner.micro_batch_prompts} groups of full-length "
            f"rows ({mem['tokens']:,} tokens) needs about {mem['total'] / GiB:.1f} GiB in the learner and "
            f"{available / GiB:.1f} GiB are available: set learner.max_tokens_per_micro_batch (about "
            f"{max(int(fit), 0):,} tokens fit){f' or {recompute_advice(cfg)}' if recompute_advice(cfg) else ''}"]


def check_tensor_parallel(cfg) -> None:
    """ValueError naming ``learner.tp_size`` when megatron cannot shard the model over it: the
    attention heads, the key/value heads and the MLP width must all be multiples of it (checked
    from ``config.json`` before the model loads; megatron would refuse it after the warm-up). Also
    ``rollout.tp_size`` (vLLM engines on their own processes): the heads a multiple of it, the
    key/value heads a multiple or a divisor of it (vLLM replicates them)."""
    shape = model_shape(cfg)
    T, heads, kv = cfg.rollout.tp_size, shape.get("heads"), shape.get("kv_heads")
    if T > 1 and heads and kv and (heads % T or (kv % T if kv >= T else T % kv)):
        raise ValueError(f"rollout.tp_size={T} cannot shard the model over vLLM's tensor-parallel ranks: "
                         f"num_attention_heads={heads} must be a multiple of it and num_key_value_heads={kv} a "
                         f"multiple or a divisor of it")
    tp = cfg.learner.tp_size
    if cfg.learner.backend != "megatron" or tp <= 1:
        return
    from pacs_fast.learner.megatron.model import unshardable  # megatron's own rule (imports no megatron)

    bad = unshardable(tp, num_attention_heads=heads, num_key_value_heads=kv,
                      intermediate_size=shape.get("intermediate"))
    if bad:
        model = (f"model.path={cfg.model.path}" if cfg.model.path
                 else f"the built-in tiny model (model.tiny_hidden_size={cfg.model.tiny_hidden_size})")
        raise ValueError(f"learner.tp_size={tp} cannot shard {model}: {', '.join(bad)} "
                         f"{'is' if len(bad) == 1 else 'are'} not a multiple of {tp}")


def check_megatron_model(cfg) -> None:
    """ValueError naming ``learner.backend=megatron`` and ``model.path`` when megatron's builder cannot
    reproduce the model (a RoPE scaling such as Llama-3.1's or YaRN, sliding windows, another
    architecture: :func:`pacs_fast.learner.megatron.model.check_hf_config`; dropout, which it would silently leave
    out: :func:`~pacs_fast.learner.megatron.model.check_no_dropout`), read from ``config.json``
    before any model loads; it was a traceback on every rank after the run folder had been made. A folder of
    ``.bin`` weights alone (megatron reads safetensors) too. A folder transformers cannot read is left to the model's
    own error."""
    if cfg.learner.backend != "megatron" or not cfg.model.path:
        return
    folder = Path(cfg.model.path).expanduser()
    if not (folder / "config.json").is_file():
        return
    from transformers import AutoConfig

    from pacs_fast.learner.megatron.model import check_hf_config, check_no_dropout  # imports no megatron
    try:
        hf_config = AutoConfig.from_pretrained(folder, trust_remote_code=trusted())
    except Exception:  # noqa: BLE001 - the loader's own error comes when the model loads
        return
    try:
        check_hf_config(hf_config)
        check_no_dropout(hf_config)  # (built without dropout: it would train silently without it)
    except ValueError as e:
        raise ValueError(f"learner.backend=megatron cannot build model.path={cfg.model.path}: {e}; "
                         f"learner.backend=torch trains it") from None
    if next(folder.glob("*.safetensors"), None) is None:  # (it was each rank's error once torchrun had started them)
        raise ValueError(f"learner.backend=megatron cannot load model.path={cfg.model.path}: it has PyTorch .bin "
                         "weights only and megatron reads *.safetensors; save the model once with save_pretrained "
                         "(safetensors by default), or learner.backend=torch trains it")
    try:  # the files the learner reads: model.safetensors, else those its index names (as transformers)
        safetensors_weight_files(folder)
    except (OSError, ValueError) as e:
        raise ValueError(f"learner.backend=megatron cannot load model.path={cfg.model.path}: {e}") from None


def check_logits_transform(cfg) -> None:
    """ValueError naming ``model.path`` when its ``config.json`` says the model's forward transforms the LM head's
    logits (Gemma 2's ``final_logit_softcapping``, a ``logit_scale``: :func:`pacs_fast.causal_lm.logits_transform`)
    in a way the learner cannot reproduce, before the model loads: ``learner.backend=megatron`` (its log-probs come
    from ``hidden @ W.T`` alone: it would train on other log-probs than the engines sampled from, silently), a
    transform :func:`pacs_fast.causal_lm.logits_map` does not map. The torch learner reproduces the rest."""
    folder = Path(cfg.model.path).expanduser() if cfg.model.path else None
    if folder is None or not (folder / "config.json").is_file():
        return
    from transformers import AutoConfig

    from pacs_fast.causal_lm import logits_map, logits_transform
    try:  # (the class's defaults too: a config.json written with use_diff omits Gemma 2's default cap of 30)
        hf_config = AutoConfig.from_pretrained(folder, trust_remote_code=trusted())
    except Exception:  # noqa: BLE001 - the loader's own error comes when the model loads
        return
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    if getattr(text, "final_logit_softcapping", None) == 0:  # (transformers and vLLM test it against None only)
        raise ValueError(f"model.path={cfg.model.path}: its config has final_logit_softcapping=0.0, which transformers "
                         f"and vLLM apply as a cap of 0 (0 * tanh(logits / 0): every logit 0 or NaN); set it to null "
                         f"for no cap")
    why = logits_transform(hf_config)
    if not why:
        return
    head_map = logits_map(hf_config)
    if cfg.learner.backend == "megatron" or head_map is None:
        learner = ("learner.backend=megatron does not apply it (learner.backend=torch does)"
                   if head_map is not None and cfg.learner.backend == "megatron" else "no learner applies it")
        raise ValueError(f"model.path={cfg.model.path}: its config has {why}, a transform of the LM head's logits; "
                         f"{learner}: it would train on other log-probs than the engines sample from; not supported")


def check_quantized(cfg) -> None:
    """ValueError naming ``model.path`` when its ``config.json`` has a ``quantization_config`` (gpt-oss's hub
    checkpoints: MXFP4 experts as ``*_blocks`` / ``*_scales``), before the model loads. transformers dequantizes
    MXFP4 to bfloat16 where it has no MXFP4 kernel (the CPU) and keeps it quantized where it has one (its quantizer's
    ``is_trainable`` is False); on the CPU the run trained bfloat16 experts beside a float32 model and wrote
    checkpoints whose config.json still said
    ``quant_method: mxfp4`` over bfloat16 tensors (tests/test_gpt_oss_path_sweep.py). A dequantized copy trains."""
    folder = Path(cfg.model.path).expanduser() if cfg.model.path else None
    if folder is None or not (folder / "config.json").is_file():
        return
    try:
        quant = json.loads((folder / "config.json").read_text()).get("quantization_config")
    except (OSError, ValueError, AttributeError):  # (the loader's own error comes when the model loads)
        return
    if quant:
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else "?"
        how = ("transformers' from_pretrained(path, quantization_config=Mxfp4Config(dequantize=True), "
               "dtype=torch.bfloat16).save_pretrained(copy)" if method == "mxfp4" else "a full-precision copy")
        raise ValueError(f"model.path={cfg.model.path}: its weights are quantized (config.json quantization_config: "
                         f"quant_method {method}), which the learner cannot train; give a dequantized copy as "
                         f"model.path ({how})")


def check_lora_targets(cfg) -> list[str]:
    """ValueError naming ``model.lora_target_modules`` when its names match no linear layer of the model (Phi-3 has
    ``qkv_proj`` where Llama has ``q_proj``), from the model built on the meta device from its ``config.json`` (no
    weights: well under a second at 7B) with the adapters put in (:func:`pacs_fast.learner.lora.add_lora`), before the
    model loads; it was refused after the model had loaded. Returns the warning lines: linear layers the setting
    names that PEFT leaves without adapters (:func:`pacs_fast.learner.lora.bare_linears`: a mixture of experts'
    dense MLPs, which had stayed model.path's without a word)."""
    if not cfg.model.lora_rank or cfg.learner.backend != "torch" or not cfg.model.path:
        return []
    folder = Path(cfg.model.path).expanduser()
    if not (folder / "config.json").is_file():
        return []
    import torch
    from transformers import AutoConfig

    from pacs_fast.causal_lm import auto_model_class
    from pacs_fast.learner.lora import add_lora, bare_linears
    try:
        with torch.device("meta"):
            config = AutoConfig.from_pretrained(folder, trust_remote_code=trusted())
            model = auto_model_class(config).from_config(config)
    except Exception:  # noqa: BLE001 - the loader's own error comes when the model loads
        return []
    m = cfg.model
    # (on the meta device too: PEFT makes a fused MoE's expert adapters on the default device before moving them to
    # their base's, 3.99B random fp32 weights for Qwen3-30B-A3B at rank 64: 30 s where this check takes 3)
    with torch.device("meta"):
        add_lora(model, rank=m.lora_rank, alpha=m.lora_alpha or 2.0 * m.lora_rank, dropout=m.lora_dropout,
                 target_modules=m.lora_target_modules)
    bare = bare_linears(model, m.lora_target_modules)
    if not bare:
        return []
    import re

    kinds = {re.sub(r"\.\d+\.", ".N.", name.rsplit(".", 1)[0]): name for name in reversed(bare)}  # (one a module)
    return [f"model.lora_target_modules={m.lora_target_modules}: PEFT leaves {len(bare)} of the linear layers it "
            f"names without adapters (e.g. {', '.join(sorted(kinds.values())[:4])}): it maps gate_proj / up_proj / down_proj onto a "
            f"mixture of experts' fused experts by name, and takes them from its dense MLPs (first layers, shared "
            f"experts) as well; those stay model.path's weights"]


def check_packed_attention(cfg) -> None:
    """ValueError naming ``learner.packed_attention=varlen`` when the model's ``config.json`` says varlen attention
    would not be its exact attention (:func:`pacs_fast.ops.varlen_attention.unsupported`: another family, sliding
    windows, attention dropout, flex attention), before the model loads; it was refused at the first packed
    forward, after the model and the engine had loaded. Flash-attention models take their own varlen path.
    Also the environment's ``PACS_FAST_VARLEN_BACKEND`` and ``PACS_FAST_VARLEN_LONG`` (read at the first packed
    forward), whatever the settings."""
    import os

    from pacs_fast.ops import varlen_split
    from pacs_fast.ops.varlen_attention import BACKENDS, FLASH

    forced = os.environ.get("PACS_FAST_VARLEN_BACKEND", "auto")
    if forced != "auto" and forced not in BACKENDS:
        raise ValueError(f"PACS_FAST_VARLEN_BACKEND must be auto or one of {', '.join(BACKENDS)}, got {forced!r}")
    varlen_split.long_threshold()  # (a ValueError naming PACS_FAST_VARLEN_LONG)
    lc = cfg.learner
    if lc.backend != "torch" or lc.packing == "off" or lc.packed_attention != "varlen":
        return

    why = None if cfg.model.attention in FLASH else varlen_unsupported(cfg)
    if why:
        raise ValueError(f"learner.packed_attention=varlen cannot run model.path={cfg.model.path}: {why}; use "
                         f"learner.packed_attention=dense or auto")


def check_cpus(cfg, *, cpus: int | None = None) -> None:
    """ValueError naming ``train.threads`` or ``train.reward_workers`` when it asks for more threads
    or scoring processes than this process has CPUs: more gain nothing, 1,000 reward workers took
    minutes to start, and ``train.threads=1000000`` exhausted the threads the OS allows (the
    tokenizer's thread pool then crashed the process)."""
    from pacs_fast.reward.batch import usable_cpus

    cpus = usable_cpus() if cpus is None else cpus
    if cfg.train.threads > cpus:
        raise ValueError(f"train.threads={cfg.train.threads} is more than the {cpus} CPUs this process may use; "
                         f"use at most {cpus} (0 = torch's default)")
    if cfg.train.reward_workers > cpus and uses_verifier(cfg.reward.fn):  # (else no verifier workers, named unused)
        raise ValueError(f"train.reward_workers={cfg.train.reward_workers} is more than the {cpus} CPUs this "
                         f"process may use (each worker is a process scoring on one CPU); use at most {cpus}")


def print_learner_memory(cfg, *, available: int | None = None) -> dict:
    """Prints the learner's memory breakdown (:func:`format_learner_memory`) and any
    :func:`memory_warnings` line for ``cfg`` (a loaded run config); returns the breakdown."""
    mem = learner_memory(cfg, device=run_device(cfg))
    print(format_learner_memory(cfg, mem))
    for line in memory_warnings(cfg, available=available):
        print(f"warning: {line}")
    return mem
