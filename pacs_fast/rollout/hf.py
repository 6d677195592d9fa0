"""Rollouts with Hugging Face ``generate`` (CPU or GPU): the engine of the tests and CPU runs.

``HFEngine(model_or_path, tokenizer)`` implements :class:`pacs_fast.rollout.base.RolloutEngine`:

- prompts (token ids) are repeated ``n`` times, left-padded and generated in batches of
  ``batch_size`` rows with a clean ``GenerationConfig`` (sampling unless ``temperature == 0``,
  ``top_p``, ``top_k`` off, no repetition penalty: the model's own generation defaults are NOT
  applied, so runs match vLLM's explicit sampling parameters);
- with ``params.seed`` the call runs under ``torch.random.fork_rng`` seeded with it: the same call
  gives the same completions and the caller's global RNG is left untouched;
- responses are cut after the first EOS (kept), ``finish_reason`` is ``"stop"`` or ``"length"``;
- with ``return_logprobs`` each sampled token's log-prob under the *unscaled* (temperature 1)
  logits is recorded during generation by a logits processor that sees the raw logits before
  temperature / top-p (one ``[rows, V]`` float32 buffer, not the whole ``[T, rows, V]``).

Given a live ``nn.Module`` (the trainer's policy) the engine uses it in place (no copy): the
rollouts then always see the current weights and :meth:`HFEngine.sync_weights` is needed only
when the engine holds its own copy (loaded from a path).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from pacs_fast.rollout.base import Completion, RolloutEngine, SamplingParams, check_prompt_token_ids


class _LogprobRecorder:
    """A logits processor that records log-softmax(raw logits)[sampled token] per step.

    Placed in ``logits_processor=`` it runs before the temperature / top-p warpers (transformers
    merges custom processors before the warpers), so it sees unscaled logits. The token sampled at
    step t appears in ``input_ids`` at step t+1; the last one is read from the final sequences.
    """

    def __init__(self):
        self.prev: torch.Tensor | None = None  # [rows, V] float32 log-probs of the previous step
        self.steps: list[torch.Tensor] = []    # per step [rows] float32

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        self.prev = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, sequences: torch.LongTensor) -> torch.Tensor:
        """``[rows, steps]`` log-probs of the generated tokens."""
        if self.prev is not None:
            self.steps.append(self.prev.gather(1, sequences[:, -1:]).squeeze(1))
            self.prev = None
        return torch.stack(self.steps, dim=1) if self.steps else torch.empty(0)


class HFEngine(RolloutEngine):
    """Rollouts with ``model.generate``.

    Args:
        model_or_path: a Hugging Face causal LM folder / hub-style path (loaded here) or a live
            ``PreTrainedModel`` (shared, not copied, used on the device where it lives).
        tokenizer: a tokenizer (default: loaded from the path, or from the module's
            ``config._name_or_path``). Used for EOS / padding ids and for decoding.
        device, dtype: where / how a model loaded from a path lives (ignored for a live module).
        batch_size: rows (prompt x sample) per ``generate`` call.
    """

    def __init__(self, model_or_path, tokenizer=None, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, batch_size: int = 32):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = batch_size
        if isinstance(model_or_path, torch.nn.Module):
            self.model = model_or_path
            self.owns_model = False
            source = getattr(getattr(model_or_path, "config", None), "_name_or_path", None)
        elif isinstance(model_or_path, (str, Path)):
            source = str(model_or_path)
            self.model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device)
            self.model.eval()
            self.owns_model = True
        else:
            raise ValueError(f"model_or_path must be a path or an nn.Module, got {type(model_or_path).__name__}")
        if tokenizer is None:
            if not source:
                raise ValueError("tokenizer is required when model_or_path is a module without a name_or_path")
            tokenizer = AutoTokenizer.from_pretrained(source)
        self.tokenizer = tokenizer
        self.eos_ids = self._eos_ids()
        if not self.eos_ids:
            raise ValueError("neither the tokenizer nor the model's generation config defines an EOS token")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]

    # -- helpers ---------------------------------------------------------------------------------
    def _eos_ids(self) -> list[int]:
        ids: list[int] = []
        gen_cfg = getattr(self.model, "generation_config", None)
        for value in (self.tokenizer.eos_token_id, getattr(gen_cfg, "eos_token_id", None)):
            for v in (value if isinstance(value, (list, tuple)) else [value]):
                if v is not None and int(v) not in ids:
                    ids.append(int(v))
        return ids

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
            # it there makes transformers warn "generation flags are not valid: ['top_k']".
            kwargs.update(temperature=float(params.temperature), top_p=float(params.top_p), top_k=0)
        return GenerationConfig(**kwargs)

    @staticmethod
    def _check_prompts(prompt_token_ids) -> list[list[int]]:
        return check_prompt_token_ids(prompt_token_ids)

    # -- RolloutEngine ---------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``out[i][j]``: completion j (of ``params.n``) for prompt i."""
        prompts = self._check_prompts(prompt_token_ids)
        rows = [p for p in prompts for _ in range(params.n)]
        results: list[Completion] = []
        was_training = self.model.training
        self.model.eval()
        try:
            if params.seed is None:
                for start in range(0, len(rows), self.batch_size):
                    results.extend(self._generate_batch(rows[start:start + self.batch_size], params))
            else:
                devices = [self.device] if self.device.type == "cuda" else []
                with torch.random.fork_rng(devices=devices):
                    torch.manual_seed(params.seed)
                    for start in range(0, len(rows), self.batch_size):
                        results.extend(self._generate_batch(rows[start:start + self.batch_size], params))
        finally:
            self.model.train(was_training)
        return [results[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    @torch.no_grad()
    def _generate_batch(self, rows: list[list[int]], params: SamplingParams) -> list[Completion]:
        from transformers import LogitsProcessorList

        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            attention[i, width - len(r):] = 1
        device = self.device
        recorder = _LogprobRecorder() if params.return_logprobs else None
        out = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device),
            generation_config=self._generation_config(params),
            logits_processor=LogitsProcessorList([recorder]) if recorder else None,
        )
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        generated = sequences[:, width:].cpu()
        logprobs = recorder.finish(sequences).cpu() if recorder else None
        eos = torch.tensor(self.eos_ids, dtype=torch.long)
        completions = []
        for i in range(len(rows)):
            ids = generated[i]
            hits = torch.nonzero(torch.isin(ids, eos), as_tuple=False)
            if len(hits):
                end, reason = int(hits[0]) + 1, "stop"
            else:
                end, reason = len(ids), "length"
            token_ids = ids[:end].tolist()
            completions.append(Completion(
                token_ids=token_ids,
                text=self.tokenizer.decode(token_ids, skip_special_tokens=True),
                finish_reason=reason,
                logprobs=logprobs[i, :end].tolist() if logprobs is not None else None,
            ))
        return completions

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies tensors into the model by Hugging Face state-dict names (all or a subset).

        Every name and shape is checked before anything is copied (a bad call changes nothing).
        Tensors are cast to the model's dtype and device. A tensor that already *is* the model's
        (a shared module) is skipped.
        """
        items = list(named_tensors)
        state = self.model.state_dict(keep_vars=True)
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
