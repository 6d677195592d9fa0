"""Stop strings (``SamplingParams.stop``, ``rollout.stop``, ``pacs_fast.eval --stop``), as vLLM's ``stop`` with
``include_stop_str_in_output=True``: a response ends at the first token after which its text holds one of the
strings; its tokens end with that token, its text just after the string (the earliest-ending one where several
complete at that token), and its ``finish_reason`` is ``"stop"``. Only the response's text is searched, never the
prompt's; the text is the tokenizer's ``decode(ids, skip_special_tokens=True)`` (Magistral's ``[THINK]`` /
``[/THINK]`` kept: base.py ``decode_texts``), as ``Completion.text``, as vLLM's
incremental detokenizer emits it: a token that ends in an incomplete character (a byte-level BPE token holding
``>`` and the first byte of a CJK character, say) is held back until the character completes, so a string that it
completes fires at the token that completes the character. A special token (``<|endoftext|>``) is not in that
text: as a stop string it never fires (the EOS ids end a response anyway).

The string stays in the response (its tokens are trained, the verifier reads it: a format such as
``<answer>...</answer>`` with ``stop=["</answer>"]`` keeps its closing tag). vLLM's default drops it from the text
but keeps its tokens; pacs_fast always keeps both, so the verifier and the learner see the same response.

:class:`StopStrings` finds the stop in a response (:meth:`StopStrings.cut`) and, inside a decode loop, tells
which rows have just reached one (:meth:`StopStrings.hits`: the last tokens decoded, enough to hold any of the
strings, then the whole response to confirm), so the HF engine stops decoding those rows.
"""
from __future__ import annotations

import torch

from pacs_fast.rollout.base import decode_texts


class StopStrings:
    """The stop strings ``stop`` of one call, matched on ``tokenizer``'s decoded text.

    ``check_every``: a decode loop calls :meth:`hits` every this many tokens (the window it decodes then
    covers them all)."""

    def __init__(self, tokenizer, stop: tuple[str, ...], check_every: int = 1):
        if not stop:
            raise ValueError("StopStrings needs at least one stop string")
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        # the tokens that can hold one string: a character takes at most 4 (byte-level tokens of its UTF-8
        # bytes), the token before the string's first may carry its first character's leading space (a
        # SentencePiece decode drops the first token's), and the tokens since the last check
        self.window = 4 * max(len(s) for s in self.stop) + 2 + max(int(check_every), 1)

    def _decode(self, ids: list[int]) -> str:
        return decode_texts(self.tokenizer, [ids])[0]

    def _emitted(self, ids: list[int], text: str | None = None) -> str:
        """The text of ``ids`` as vLLM's incremental detokenizer has emitted it: a token whose text ends in an
        incomplete character (a byte-level token holding the first bytes of one, decoded as U+FFFD) is held back,
        its text whole, until a later token completes the character (a stop string that ends just before it
        fires one token later, as in vLLM). ``text``: the decode of ``ids`` when the caller has it."""
        k = len(ids)
        text = self._decode(ids) if text is None else text
        while text.endswith("\ufffd") and k > 0:
            k -= 1
            text = self._decode(ids[:k])
        return text

    def _holds(self, text: str) -> bool:
        return any(s in text for s in self.stop)

    def cut(self, ids: list[int], text: str | None = None) -> tuple[int, str] | None:
        """``(k, text)``: the first ``k`` tokens of the response ``ids`` are the shortest start whose emitted text
        (:meth:`_emitted`) holds a stop string, ``text`` that text cut just after the earliest-ending string; None
        when the response's text (``text``, or its decode) holds none."""
        whole = self._decode(ids) if text is None else text  # (one decode of the whole response)
        if not self._holds(whole) or not self._holds(self._emitted(ids, whole)):
            return None  # (a string only in a response's held-back end never fires in vLLM either)
        lo, hi = 0, len(ids)  # the emitted text of ids[:lo] holds no string (lo = 0: empty), that of ids[:hi] one
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._holds(self._emitted(ids[:mid])):
                hi = mid
            else:
                lo = mid
        head = self._emitted(ids[:hi])
        end = min(head.find(s) + len(s) for s in self.stop if s in head)
        return hi, head[:end]

    def hits(self, tokens: torch.Tensor, skip: torch.Tensor | None = None, *, upto: int | None = None,
             rows: torch.Tensor | None = None) -> torch.Tensor:
        """``[n]`` bool on ``tokens``' device: which of the checked rows' responses so far hold a stop string.

        ``tokens``: ``[R, S]`` int, a decode loop's token buffer; the checked rows are ``tokens[rows]`` (an index
        tensor; None: every row), each row's response its first ``upto`` tokens (None: all ``S``). Rows where
        ``skip`` (``[n]`` bool) is True are not checked (False). One host transfer of the checked rows' last
        :attr:`window` tokens (never their whole history: a 16k-token response costs what a short one does); a
        row found there is confirmed on its whole response (what :meth:`cut` reads)."""
        upto = tokens.shape[1] if upto is None else upto
        n = tokens.shape[0] if rows is None else rows.shape[0]
        out = torch.zeros(n, dtype=torch.bool)
        todo = list(range(n)) if skip is None else (~skip).nonzero().flatten().tolist()
        if not todo or upto == 0:
            return out.to(tokens.device)
        lo = max(0, upto - self.window)
        recent = (tokens[:, lo:upto] if rows is None else tokens[rows, lo:upto]).cpu().tolist()
        texts = decode_texts(self.tokenizer, [recent[i] for i in todo])
        for i, text in zip(todo, texts):
            if self._holds(text):
                row = tokens[i if rows is None else int(rows[i])]
                out[i] = self._holds(self._emitted(row[:upto].tolist()))
        return out.to(tokens.device)


def special_token_warning(tokenizer, stop, name: str) -> str | None:
    """A warning line for a stop string that holds one of ``tokenizer``'s special tokens (``<|endoftext|>``): a
    response's text is decoded without them (as vLLM's), so it never ends one; None otherwise."""
    specials = set(getattr(tokenizer, "all_special_tokens", None) or [])
    specials |= {t.content for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()
                 if getattr(t, "special", False)}
    held = [s for s in stop if any(sp and sp in s for sp in specials)]
    if not held:
        return None
    return (f"{name}: {held[0]!r} holds a special token of the tokenizer, which a response's text leaves out (it is "
            f"decoded without special tokens, as vLLM's): it never ends a response (an EOS token ends one anyway; "
            f"another special token can be made a stop by the model's generation_config eos_token_id)")

