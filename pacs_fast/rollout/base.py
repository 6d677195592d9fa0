"""The rollout engine interface: prompts in, ``n`` sampled completions per prompt out.

Engines (``hf.HFEngine``, ``vllm_engine.VLLMEngine``) implement :class:`RolloutEngine`; the trainer
and ``pacs_fast.eval`` only talk to this interface.
"""
from __future__ import annotations

import abc
import weakref
from dataclasses import dataclass
from typing import Iterable

import torch

from pacs_fast.config.remote_code import trusted
from pacs_fast.config.stop_string_checks import check_stop_strings
from pacs_fast.reward.boxes import THINK_END, THINK_MARKS, THINK_START

@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``n`` completions per prompt; ``seed`` makes a call reproducible.

    The filters apply as vLLM applies them, every engine alike: ``logits / temperature``, then min-p
    (drop tokens whose probability is below ``min_p`` times the largest; 0 = off), then top-k (keep
    the ``top_k`` largest logits and any tied with the k-th; 0 = off), then top-p (the smallest set
    of the remaining, renormalised, whose probability is ``>= top_p``; 1 = off). ``stop``: strings that end a
    response, kept in it (:mod:`pacs_fast.rollout.stop_strings`; a list is taken as a tuple)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    return_logprobs: bool = False
    top_k: int = 0
    min_p: float = 0.0
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "stop", check_stop_strings(self.stop, "SamplingParams.stop"))
        if self.n < 1:
            raise ValueError(f"SamplingParams.n must be >= 1, got {self.n}")
        if not (0 <= self.temperature < float("inf")):  # (NaN passed a `< 0` check)
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not 0 <= self.min_p < 1:
            raise ValueError(f"SamplingParams.min_p must be in [0, 1) (0 = off), got {self.min_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Completion:
    """One sampled response.

    token_ids: response tokens only (the EOS token included when the model emitted it).
    text: decoded response without special tokens (but for :data:`KEPT_SPECIAL`: :func:`decode_texts`).
    finish_reason: ``"stop"`` (EOS or a stop string) or ``"length"`` (hit ``max_new_tokens``).
    logprobs: per-token log-probs of ``token_ids`` under the engine's sampling model at
        temperature 1 (unscaled logits), when ``return_logprobs`` was asked; else ``None``.
    """

    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[float] | None = None


def pack_completions(comps: list[list[Completion]]) -> dict:
    """``comps`` (per prompt, its completions) as a few flat tensors and lists (what a checkpoint stores, no pickled
    objects: 8 bytes a token, int32 ids and float32 log-probs, which every engine's are, else float64, plus the
    text); :func:`unpack_completions` gives them back equal, float for float."""
    flat = [c for cs in comps for c in cs]
    ids = torch.tensor([t for c in flat for t in c.token_ids], dtype=torch.int64)
    lps = torch.tensor([x for c in flat for x in (c.logprobs or ())], dtype=torch.float64)
    if ids.numel() and -2**31 <= int(ids.min()) and int(ids.max()) < 2**31:
        ids = ids.to(torch.int32)
    if torch.equal(lps.float().double(), lps):  # (a NaN stays float64)
        lps = lps.float()
    return {"per_prompt": [len(cs) for cs in comps], "lengths": torch.tensor([len(c.token_ids) for c in flat]),
            "token_ids": ids, "texts": [c.text for c in flat], "finish_reasons": [c.finish_reason for c in flat],
            "has_logprobs": [c.logprobs is not None for c in flat], "logprobs": lps}


def unpack_completions(packed: dict) -> list[list[Completion]]:
    """The completions :func:`pack_completions` packed."""
    lengths = packed["lengths"].tolist()
    ids, lps = packed["token_ids"].tolist(), packed["logprobs"].tolist()
    flat, at, at_lp = [], 0, 0
    for n, text, reason, has in zip(lengths, packed["texts"], packed["finish_reasons"], packed["has_logprobs"]):
        flat.append(Completion(ids[at:at + n], text, reason, lps[at_lp:at_lp + n] if has else None))
        at, at_lp = at + n, at_lp + (n if has else 0)
    out, at = [], 0
    for k in packed["per_prompt"]:
        out.append(flat[at:at + k])
        at += k
    return out


def check_prompt_token_ids(prompt_token_ids, *, max_len: int | None = None) -> list[list[int]]:
    """Validates ``prompt_token_ids`` (a list of non-empty token-id lists or 1-D tensors) and returns
    it as lists of ints; ``max_len`` bounds each prompt's length (exclusive)."""
    if not isinstance(prompt_token_ids, (list, tuple)):
        raise ValueError("prompt_token_ids must be a list of lists of token ids")
    out = []
    for i, p in enumerate(prompt_token_ids):
        p = p.tolist() if isinstance(p, torch.Tensor) else list(p)
        if not p:
            raise ValueError(f"prompt_token_ids[{i}] is empty")
        if max_len is not None and len(p) >= max_len:
            raise ValueError(f"prompt_token_ids[{i}] has {len(p)} tokens; max_model_len is {max_len}")
        out.append([int(t) for t in p])
    return out


class RolloutEngine(abc.ABC):
    """Generates completions and receives the learner's weights."""

    @abc.abstractmethod
    def generate(self, prompt_token_ids: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """Returns ``params.n`` completions for each prompt: ``out[i][j]`` is sample j of prompt i."""

    @abc.abstractmethod
    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Loads weights given with Hugging Face parameter names (all of them, or a subset)."""

    def sleep(self) -> None:
        """Frees the engine's accelerator memory while the learner trains (no-op where unsupported)."""

    def wake_up(self) -> None:
        """Undoes :meth:`sleep`."""

    def close(self) -> None:
        """Releases the engine."""


# special tokens a response's text keeps: the thinking markers of families with their own (Magistral's tekken control
# tokens, Seed-OSS's, Gemma 4's thought channel...: pacs_fast/reward/boxes.py THINK_MARKS but <think>'s), which a
# decode skipping special tokens drops (kept as vLLM's Mistral tokenizer decodes Magistral's); extraction="boxed"
# reads the answer after them (answer_part): dropped, a response cut inside its thinking was paid for a draft box
KEPT_SPECIAL = tuple(mark for pair in THINK_MARKS if pair != (THINK_START, THINK_END) for mark in pair)


_KEPT_IDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {id: kept token}


def _kept_ids(tokenizer) -> dict[int, str]:
    """``{id: token}`` of the tokenizer's :data:`KEPT_SPECIAL` tokens, found once a tokenizer (``get_added_vocab``
    builds its dict anew on each call: the stop strings' checks decode every few tokens)."""
    try:
        return _KEPT_IDS[tokenizer]
    except (KeyError, TypeError):
        pass
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    kept = {added[t]: t for t in KEPT_SPECIAL if t in added}
    try:
        _KEPT_IDS[tokenizer] = kept
    except TypeError:  # (an object that takes no weak reference: found on each call)
        pass
    return kept


def holds_kept_special(tokenizer, ids: list[int]) -> bool:
    """Whether the response ``ids`` holds one of the tokenizer's :data:`KEPT_SPECIAL` tokens."""
    kept = _kept_ids(tokenizer)
    return bool(kept) and any(i in kept for i in ids)


def decode_texts(tokenizer, ids: list[list[int]]) -> list[str]:
    """The texts of responses ``ids``: ``batch_decode(ids, skip_special_tokens=True)``, but for the tokenizer's
    :data:`KEPT_SPECIAL` tokens, kept where they are (``[THINK]a[/THINK]b</s>`` -> ``"[THINK]a[/THINK]b"``)."""
    kept = _kept_ids(tokenizer)
    if not kept or not any(i in kept for row in ids for i in row):
        return tokenizer.batch_decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    out = []
    for row in ids:
        parts, start = [], 0
        for j, i in enumerate(list(row) + [None]):
            if i is None or i in kept:
                parts.append(tokenizer.decode(row[start:j], skip_special_tokens=True,
                                              clean_up_tokenization_spaces=False))
                parts.append(kept.get(i, ""))
                start = j + 1
        out.append("".join(parts))
    return out


def eos_token_ids(tokenizer, generation_config) -> list[int]:
    """The ids generation stops at: the tokenizer's EOS, then the generation config's (an id or a list;
    ``generation_config`` may be None), each once, in that order."""
    ids: list[int] = []
    for value in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            if v is not None and int(v) not in ids:
                ids.append(int(v))
    return ids


def folder_stop_ids(model_path, tokenizer) -> list[int]:
    """The EOS ids generation stops at for a model folder, as the engines read them (the tokenizer's, then
    generation_config.json's), before its model loads."""
    from transformers import GenerationConfig

    try:
        generation_config = GenerationConfig.from_pretrained(model_path, trust_remote_code=trusted())
    except (OSError, ValueError):  # no generation_config.json
        generation_config = None
    return eos_token_ids(tokenizer, generation_config)
