"""Rollouts with a Hugging Face causal LM (CPU or GPU): the engine of the tests and CPU runs.

``HFEngine(model_or_path, tokenizer, sampler=...)`` implements
:class:`pacs_fast.rollout.base.RolloutEngine` with one of two decoders:

- ``sampler="lean"`` (default): a plain decode loop over the model's forward. Each *unique* prompt
  is prefilled once (left-padded, ``position_ids = cumsum(mask) - 1``, ``logits_to_keep=1``), its
  KV cache is repeated ``n`` times (``cache.batch_repeat_interleave``), then one token per step is
  sampled for all rows: argmax when ``temperature == 0``, else inverse-CDF sampling (one float64
  uniform per row; block sums, then the drawn block's float64 running sum: every token at its own
  probability, however small) from ``softmax(logits / temperature)`` after min-p, top-k and top-p
  filtering in vLLM's order, each with the semantics of vLLM's and transformers' warpers
  (:func:`~pacs_fast.rollout.sampling.filter_logits`).
  Finished rows are fed the pad id; the loop stops at ``max_new_tokens`` or once every row has
  emitted an EOS. That check reads one count from the device: every step on CPU, every
  ``_CUDA_DONE_CHECK_EVERY`` steps on CUDA (a few wasted steps at the end instead of a host sync
  per step; the extra tokens come after every row's EOS and are cut). At the same check, once
  the finished rows are ``>= _COMPACT_FRACTION`` of the batch they are dropped from it
  (``cache.batch_select_indices``). When no prompt of a chunk is padded the attention mask is
  omitted (the model then takes its mask-free attention path).
  The model's forward must take ``position_ids``, ``past_key_values`` and ``logits_to_keep`` and
  its cache must support ``batch_repeat_interleave`` (``transformers`` causal LMs and their
  attention caches do); use ``sampler="generate"`` for models that do not.
  Chunks are made of whole prompts, ``max(1, batch_size // n)`` of them, taken in order of prompt length (a
  prompt whose ``n`` exceeds ``batch_size`` is decoded ``batch_size`` rows at a time: its rows' draws are their
  own keys', so the samples do not change); on CPU with SDPA
  attention, prompts of one length worth ``>= _MIN_BUCKET_ROWS`` rows form unpadded chunks of their
  own (mask-free SDPA measured faster than the padded batch despite the extra forward calls; with
  :mod:`pacs_fast.ops.short_attention` the padded batch is faster and no buckets are made).
  Under ``torch.inference_mode``; no host sync in the loop other than the done check. The loops
  live in :mod:`pacs_fast.rollout.lean_decode`.
  *Merged rows* (``merge_rows``, default on CPU): rows whose tokens so far are identical are one
  row of the decoded batch, at first the ``n`` rows of each prompt (no cache repeat). Every output
  row still draws its own token from that row's distribution; rows that drew different tokens
  split into separate batch rows (their cache rows copied), rows that drew an EOS leave. While
  samples agree (answer formats, low-entropy policies, greedy) far fewer rows are decoded. It
  reads the batch's new shape from the device every step, so it is off by default on CUDA.
- ``sampler="generate"``: ``model.generate`` on prompts repeated ``n`` times, left-padded, in
  chunks of ``batch_size`` rows, with a clean ``GenerationConfig`` (sampling unless
  ``temperature == 0``, ``top_p``, ``top_k``, no repetition penalty) and min-p as a logits processor
  of ours (:class:`~pacs_fast.rollout.sampling.MinPFilter`: vLLM's order, before top-k / top-p); log-probs
  are recorded by a logits processor that sees the raw logits before temperature and the filters. During
  the call the model's ``generation_config`` is a blank one (transformers would fill unset settings from
  it), restored after.

Both samplers draw from the same distribution and are greedy-identical, but they consume random
numbers differently: the same seed gives different samples under the two.
Common to both: the model's own generation defaults are NOT applied (runs match vLLM's explicit
sampling parameters); with ``params.seed = s`` sample ``j`` of prompt ``i`` is seeded with
``s + i * n + j`` (as vLLM's per-request seeds), so a prompt's samples do not depend on the other
prompts of the call: a data-parallel split of the prompts (each share called with its first
prompt's seed) gives the one-process samples, up to the logits' last bits: the prompts batched
together (their padding, the batch's size) change the model's float rounding, which can tip a draw
that falls within that rounding of a token boundary (measured at the Qwen2.5-0.5B width with random
weights, a near-flat distribution: one 256-token sample in 96 split from the other batching's, part
way through). The lean sampler draws each row's uniforms from a
counter-based hash of (its seed, step) (:func:`~pacs_fast.rollout.sampling.row_uniforms`: also
independent of chunking, merging and compaction); ``"generate"`` runs each prompt under
``torch.random.fork_rng`` seeded with ``s + i * n``. Without a seed the draws come from the global
RNG. The caller's global RNG is untouched with a seed; responses are cut
after the first EOS (kept; several EOS ids allowed) or after the token completing one of
``params.stop`` (:mod:`~pacs_fast.rollout.stop_strings`: both samplers stop decoding such a row),
``finish_reason`` is ``"stop"`` or ``"length"``; with ``return_logprobs`` each sampled token's
log-prob under the *unscaled* (temperature 1) logits is returned; the model's ``training`` flag is restored.
*Context*: as vLLM's, a response ends where prompt + response reach ``max_model_len`` (default: the
model's ``max_position_embeddings``; ``finish_reason`` "length"), a prompt that fills it is a
ValueError; the tokens up to that point are those of an engine without the limit.
*Padded vocabulary rows*: an LM head with more rows than the tokenizer has ids (every Qwen
checkpoint) has its rows ``>= len(tokenizer)`` cut from the logits before any sampling, greedy
decoding or log-prob: such ids are never drawn and log-probs are those of the distribution over
the real ids (the learner's with ``TorchLearner(vocab_size=len(tokenizer))``).
*fp32 LM head* (``lm_head_fp32=True``, a bf16/fp16 model): during each call the head computes fp32
logits from fp32 copies of the hidden states and its weight (:mod:`pacs_fast.rollout.fp32_head`).

Given a live ``nn.Module`` (the trainer's policy) the engine uses it in place (no copy): the
rollouts then always see the current weights and :meth:`HFEngine.sync_weights` is needed only
when the engine holds its own copy (loaded from a path).
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
from pathlib import Path
from typing import Iterable

import torch

from pacs_fast.causal_lm import lm_head
from pacs_fast.config.model_files import config_positions
from pacs_fast.config.remote_code import trusted
from pacs_fast.ops.short_attention import NAME as SHORT_ATTENTION
from pacs_fast.rollout.base import (Completion, RolloutEngine, SamplingParams, check_prompt_token_ids, decode_texts,
                                   eos_token_ids)
from pacs_fast.rollout.fp32_head import fp32_lm_head
from pacs_fast.rollout.lean_decode import LeanDecoder
from pacs_fast.rollout.sampling import LogprobRecorder, MaskPaddedRows, MinPFilter, row_keys
from pacs_fast.rollout.stop_strings import StopStrings

SAMPLERS = ("lean", "generate")
# On CPU, prompts of one length worth this many rows (prompts x n) decode in unpadded chunks of
# their own (see HFEngine._lean_chunks).
_MIN_BUCKET_ROWS = 128


_GENERATE = threading.Lock()  # one blank-config generate call at a time in this process (see below)
_MISSING = object()


@contextlib.contextmanager
def _blank_generation_defaults(model):
    """Within: ``model.generation_config`` is a blank ``GenerationConfig``. ``model.generate`` fills every
    setting the given config leaves unset from the model's own (transformers 5: ``min_p``, ``typical_p``,
    ``suppress_tokens``, stop strings, ...: a Qwen folder's file sets four), which would filter what is
    sampled while the recorded log-probs describe the unfiltered distribution. The model's own is back on
    exit, also after an error; calls from several threads take turns (two interleaved swaps on one model
    would restore each other's blank one)."""
    from transformers import GenerationConfig

    with _GENERATE:
        saved = getattr(model, "generation_config", _MISSING)
        model.generation_config = GenerationConfig()
        try:
            yield
        finally:
            if saved is _MISSING:
                del model.generation_config
            else:
                model.generation_config = saved


def _stop_string_criteria(stops: StopStrings, width: int):
    """A transformers ``StoppingCriteria`` ending the rows of ``model.generate`` whose response (the ids past
    the prompts' ``width``) holds a stop string of ``stops`` (a function: transformers is imported lazily)."""
    from transformers import StoppingCriteria

    class StopStringCriteria(StoppingCriteria):
        done = None  # the rows found so far (fed pad ids after: not checked again, their whole row confirmed again)

        def __call__(self, input_ids, scores, **kwargs):
            found = stops.hits(input_ids[:, width:], self.done)
            self.done = found if self.done is None else self.done | found
            return self.done.clone()

    return StopStringCriteria()


def model_positions(model) -> int | None:
    """The positions a live model's config says it was trained on (:func:`config_positions`), None when
    it has no config or does not say."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return config_positions(text.to_dict())


class HFEngine(LeanDecoder, RolloutEngine):
    """Rollouts with a Hugging Face causal LM (see the module docstring for the two samplers).

    Args:
        model_or_path: a Hugging Face causal LM folder / hub-style path (loaded here) or a live
            ``PreTrainedModel`` (shared, not copied, used on the device where it lives).
        tokenizer: a tokenizer (default: loaded from the path, or from the module's
            ``config._name_or_path``). Used for EOS / padding ids and for decoding.
        device, dtype: where / how a model loaded from a path lives (ignored for a live module).
        batch_size: rows (prompt x sample) per forward batch. The lean sampler takes ``max(1, batch_size // n)``
            prompts per chunk; a prompt's ``n > batch_size`` samples are decoded ``batch_size`` at a time.
        sampler: ``"lean"`` (default, the fast decode loop) or ``"generate"`` (``model.generate``).
        merge_rows: lean sampler: decode rows with identical tokens so far once (default: on CPU,
            where the loop's per-step host sync is free; see the module docstring).
        lm_head_fp32: logits as ``hidden.float() @ W.float().T`` for a bf16/fp16 model (an fp32
            copy of the head weight per call; see :mod:`pacs_fast.rollout.fp32_head`).
        max_model_len: the context, prompt + response tokens of one sequence, as vLLM's: a prompt of
            that many tokens or more is a ValueError, a response ends there (``finish_reason``
            ``"length"``). Default: the positions the model's config says it was trained on
            (``max_position_embeddings`` or ``n_positions``; :func:`~pacs_fast.config.model_files.config_positions`),
            no limit when it does not say (a RoPE scaling). The attribute holds it (None: no limit).
    """

    def __init__(self, model_or_path, tokenizer=None, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, batch_size: int = 32, sampler: str = "lean",
                 merge_rows: bool | None = None, lm_head_fp32: bool = False, max_model_len: int | None = None):
        from transformers import AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_model_len is not None and int(max_model_len) < 2:
            raise ValueError(f"max_model_len must be >= 2 (a prompt token and a response token), got {max_model_len}")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        self.batch_size = batch_size
        self.sampler = sampler
        self.merge_rows = merge_rows
        if isinstance(model_or_path, torch.nn.Module):
            self.model = model_or_path
            self.owns_model = False
            source = getattr(getattr(model_or_path, "config", None), "_name_or_path", None)
        elif isinstance(model_or_path, (str, Path)):
            source = str(model_or_path)
            from transformers import AutoConfig

            from pacs_fast.causal_lm import auto_model_class
            auto = auto_model_class(AutoConfig.from_pretrained(source, trust_remote_code=trusted()))
            self.model = auto.from_pretrained(source, dtype=dtype, trust_remote_code=trusted()).to(device)
            self.model.eval()
            self.owns_model = True
        else:
            raise ValueError(f"model_or_path must be a path or an nn.Module, got {type(model_or_path).__name__}")
        if tokenizer is None:
            if not source:
                raise ValueError("tokenizer is required when model_or_path is a module without a name_or_path")
            tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trusted())
        self.tokenizer = tokenizer
        self.lm_head_fp32 = bool(lm_head_fp32)
        if self.lm_head_fp32:
            lm_head(self.model)  # a ValueError now, not at the first call, for a model without one
        head = getattr(self.model, "get_output_embeddings", lambda: None)()
        rows = getattr(getattr(head, "weight", None), "shape", (None,))[0]  # None: unknown, cut anyway
        # ids >= len(tokenizer) are padded LM-head rows: cut from the logits (None: nothing to cut)
        self.vocab_cut = len(tokenizer) if rows is None or len(tokenizer) < rows else None
        self.eos_ids = self._eos_ids()
        if not self.eos_ids:
            raise ValueError("neither the tokenizer nor the model's generation config defines an EOS token")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]
        self.max_model_len = int(max_model_len) if max_model_len is not None else model_positions(self.model)

    # -- helpers ---------------------------------------------------------------------------------
    def _eos_ids(self) -> list[int]:
        return eos_token_ids(self.tokenizer, getattr(self.model, "generation_config", None))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _generation_config(self, params: SamplingParams):
        from transformers import GenerationConfig

        sample = params.temperature > 0
        kwargs = dict(max_new_tokens=params.max_new_tokens, do_sample=sample, num_beams=1,
                      pad_token_id=self.pad_id, eos_token_id=list(self.eos_ids), repetition_penalty=1.0,
                      top_p=1.0, temperature=1.0, use_cache=True)
        if sample:
            # top_k=0 switches top-k off; it must be explicit when sampling (an unset top_k is filled
            # from the model's generation defaults, i.e. 50). Greedy decoding ignores it, and setting
            # it there makes transformers warn "generation flags are not valid: ['top_k']". min-p is a
            # logits processor of ours (_generate_batch): transformers' own would run after top-p.
            kwargs.update(temperature=float(params.temperature), top_p=float(params.top_p), top_k=int(params.top_k))
        return GenerationConfig(**kwargs)

    def _check_prompts(self, prompt_token_ids) -> list[list[int]]:
        return check_prompt_token_ids(prompt_token_ids, max_len=self.max_model_len)

    def _response_limits(self, prompts: list[list[int]], params: SamplingParams) -> list[int] | None:
        """Each prompt's response tokens at most, ``min(max_new_tokens, context - prompt)``; None when every
        prompt has room for ``max_new_tokens`` (or there is no context)."""
        ctx, new = self.max_model_len, params.max_new_tokens
        if ctx is None or all(len(p) + new <= ctx for p in prompts):
            return None
        return [min(new, ctx - len(p)) for p in prompts]

    # -- RolloutEngine ---------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``out[i][j]``: completion j (of ``params.n``) for prompt i."""
        prompts = self._check_prompts(prompt_token_ids)
        was_training = self.model.training
        self.model.eval()
        head = fp32_lm_head(self.model) if self.lm_head_fp32 else contextlib.nullcontext()
        try:
            with head:
                results = self._generate_all(prompts, params)
        finally:
            self.model.train(was_training)
        return [results[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    def _generate_all(self, prompts: list[list[int]], params: SamplingParams) -> list[Completion]:
        """All ``len(prompts) * n`` completions, prompt-major."""
        n = params.n
        limits = self._response_limits(prompts, params)
        if self.sampler == "generate":
            if params.seed is None and limits is None:
                return self._generate_rows([p for p in prompts for _ in range(n)], params)
            results: list[Completion] = []
            devices = [self.device] if self.device.type == "cuda" else []
            for i, p in enumerate(prompts):  # each prompt under its own seed (see the module docstring)
                own = params if limits is None else dataclasses.replace(params, max_new_tokens=limits[i])
                with torch.random.fork_rng(devices=devices) if params.seed is not None else contextlib.nullcontext():
                    if params.seed is not None:
                        torch.manual_seed((params.seed + i * n) % 2**63)
                    results.extend(self._generate_rows([p] * n, own))
            return results
        base = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()))
        by_prompt: list[list[Completion]] = [[] for _ in prompts]
        merge = self.device.type == "cpu" if self.merge_rows is None else self.merge_rows
        decode = self._merged_batch if merge else self._lean_batch
        for chunk in self._lean_chunks(prompts, n):
            keys = row_keys([base + i * n + j for i in chunk for j in range(n)], self.device)
            if n > self.batch_size:  # one prompt a chunk: its n rows decoded batch_size at a time (each row's draws
                comps = []  # are its own key's, wherever it is decoded; n = 512 rows had been one batch)
                for s in range(0, n, self.batch_size):
                    part = dataclasses.replace(params, n=min(self.batch_size, n - s))
                    comps += decode([prompts[chunk[0]]], part, keys[s:s + part.n],
                                    None if limits is None else [limits[chunk[0]]])
            else:
                comps = decode([prompts[i] for i in chunk], params, keys,
                               None if limits is None else [limits[i] for i in chunk])
            for k, i in enumerate(chunk):
                by_prompt[i] = comps[k * params.n:(k + 1) * params.n]
        return [c for comps in by_prompt for c in comps]

    def _generate_rows(self, rows: list[list[int]], params: SamplingParams) -> list[Completion]:
        """``model.generate`` on ``rows`` in chunks of ``batch_size``."""
        results: list[Completion] = []
        for start in range(0, len(rows), self.batch_size):
            results.extend(self._generate_batch(rows[start:start + self.batch_size], params))
        return results

    def _lean_chunks(self, prompts: list[list[int]], n: int) -> list[list[int]]:
        """Prompt indices per lean chunk: at most ``max(1, batch_size // n)`` prompts each, in order
        of length (less padding). On CPU with SDPA attention, prompts of one length worth at least
        ``_MIN_BUCKET_ROWS`` rows get chunks of their own: no padding, so no attention mask, and
        SDPA's mask-free path (no mask building, grouped-query attention without repeating K/V
        heads) pays for the extra forward calls once decoding is compute-bound (measured on CPU;
        on a GPU small-batch decoding is bandwidth/launch-bound and splitting a batch costs more).
        With :mod:`pacs_fast.ops.short_attention` a mask costs nothing and every prompt shares
        the chunks (fewer forward calls)."""
        per_chunk = max(1, self.batch_size // n)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        # pacs_fast's short-sequence attention takes padding masks at no extra cost: no buckets then
        short = getattr(getattr(self.model, "config", None), "_attn_implementation", None) == SHORT_ATTENTION
        bucket_rows = _MIN_BUCKET_ROWS if self.device.type == "cpu" and not short else float("inf")
        chunks: list[list[int]] = []
        rest: list[int] = []
        for _, run in itertools.groupby(order, key=lambda i: len(prompts[i])):
            run = list(run)
            if len(run) * n >= bucket_rows:
                chunks.extend(run[s:s + per_chunk] for s in range(0, len(run), per_chunk))
            else:
                rest.extend(run)
        chunks.extend(rest[s:s + per_chunk] for s in range(0, len(rest), per_chunk))
        return chunks

    def _left_pad(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``[rows, width]`` int64 input ids (pad id on the left) and attention mask, on the CPU."""
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            attention[i, width - len(r):] = 1
        return input_ids, attention

    def _stop_strings(self, params: SamplingParams, check_every: int = 1) -> StopStrings | None:
        """The matcher of ``params.stop`` (None without stop strings) for a loop that checks every
        ``check_every`` tokens."""
        return StopStrings(self.tokenizer, params.stop, check_every) if params.stop else None

    def _completions(self, generated: torch.Tensor, logprobs: torch.Tensor | None,
                     limits: list[int] | None = None, stops: StopStrings | None = None) -> list[Completion]:
        """Cuts CPU ``[rows, steps]`` generated ids (and log-probs) after the first EOS, each row at its
        ``limits`` entry (response tokens at most; None: ``steps``), and after the token that completes a
        stop string of ``stops`` (its text just after the string; :mod:`~pacs_fast.rollout.stop_strings`)."""
        is_eos = torch.isin(generated, torch.tensor(self.eos_ids, dtype=generated.dtype))
        if limits is not None:  # tokens past a row's limit (pad ids, perhaps an EOS id) are not its own
            is_eos &= torch.arange(generated.shape[1])[None, :] < torch.tensor(limits)[:, None]
        at_eos = is_eos.any(dim=1)
        stopped = at_eos.tolist()
        cap = generated.shape[1] if limits is None else torch.tensor(limits).clamp(max=generated.shape[1])
        ends = torch.where(at_eos, is_eos.int().argmax(dim=1) + 1, cap).tolist()
        ids = [row[:end] for row, end in zip(generated.tolist(), ends)]
        texts = decode_texts(self.tokenizer, ids)
        if stops is not None:  # a row stopped by a string was fed pad ids after it (perhaps an EOS id): cut first
            for i in range(len(ids)):
                cut = stops.cut(ids[i], texts[i])
                if cut is not None:
                    ends[i], texts[i], stopped[i] = cut[0], cut[1], True
                    ids[i] = ids[i][:ends[i]]
        lps = logprobs.tolist() if logprobs is not None else None
        return [Completion(token_ids=ids[i], text=texts[i], finish_reason="stop" if stop else "length",
                           logprobs=lps[i][:ends[i]] if lps is not None else None)
                for i, stop in enumerate(stopped)]

    # -- sampler="generate" ------------------------------------------------------------------------
    @torch.no_grad()
    def _generate_batch(self, rows: list[list[int]], params: SamplingParams) -> list[Completion]:
        from transformers import LogitsProcessorList, StoppingCriteriaList

        input_ids, attention = self._left_pad(rows)
        width = input_ids.shape[1]
        device = self.device
        recorder = LogprobRecorder() if params.return_logprobs else None
        # the padded rows are masked first: the recorder and the sampler see the real ids only; min-p after
        # the recorder (which records the unfiltered distribution), before generate's warpers (vLLM's order)
        min_p = MinPFilter(params.min_p, params.temperature) if params.min_p > 0 and params.temperature > 0 else None
        processors = [p for p in (MaskPaddedRows(self.vocab_cut) if self.vocab_cut else None, recorder, min_p) if p]
        stops = self._stop_strings(params)
        with _blank_generation_defaults(self.model):
            out = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device),
                generation_config=self._generation_config(params),
                logits_processor=LogitsProcessorList(processors) if processors else None,
                stopping_criteria=StoppingCriteriaList([_stop_string_criteria(stops, width)]) if stops else None,
            )
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        generated = sequences[:, width:].cpu()
        logprobs = recorder.finish(sequences).cpu() if recorder else None
        return self._completions(generated, logprobs, stops=stops)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies tensors into the model by Hugging Face state-dict names (all or a subset).

        Every name and shape is checked before anything is copied (a bad call changes nothing).
        Tensors are cast to the model's dtype and device. A tensor that already *is* the model's
        (a shared module) is skipped. Names a checkpoint gives them (a learner's export: Gemma 3 4B+'s
        ``language_model.model.*``, which transformers loads as ``model.language_model.*``) are taken as the model's.
        """
        items = list(named_tensors)
        state = self.model.state_dict(keep_vars=True)
        if any(n not in state for n, _ in items):
            if getattr(self, "_to_model", None) is None:  # (found once: a sync comes every step)
                from pacs_fast.causal_lm import checkpoint_names

                self._to_model = {v: k for k, v in checkpoint_names(self.model, state.items()).items()}
            items = [(self._to_model.get(n, n), t) for n, t in items]
        unknown = [n for n, _ in items if n not in state]
        bad_shape = [f"{n}: got {tuple(t.shape)}, model has {tuple(state[n].shape)}"
                     for n, t in items if n in state and tuple(t.shape) != tuple(state[n].shape)]
        if unknown or bad_shape:
            msg = []
            if unknown:
                msg.append(f"unknown parameter names {unknown[:5]}{' ...' if len(unknown) > 5 else ''} "
                           f"(the model has e.g. {list(state)[:3]})")
            if bad_shape:
                msg.append("shape mismatch: " + "; ".join(bad_shape[:5]))
            raise ValueError("sync_weights: " + " | ".join(msg))
        with torch.no_grad():
            for name, tensor in items:
                dst = state[name]
                if dst.data_ptr() == tensor.data_ptr():
                    continue
                dst.data.copy_(tensor.detach().to(device=dst.device, dtype=dst.dtype))

    def close(self) -> None:
        if self.owns_model:
            self.model = None
