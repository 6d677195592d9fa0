"""Stop strings (``SamplingParams.stop``, ``rollout.stop``, ``pacs_fast.eval --stop``), as vLLM's ``stop`` with
``include_stop_str_in_output=True``: a response ends at the first token after which its text holds one of the
strings; its tokens end with that token, its text just after the string (the earliest-ending one where several
complete at that token), and its ``finish_reason`` is ``"stop"``. Only the response's text is searched, never the
prompt's; the text is the tokenizer's ``decode(ids, skip_special_tokens=True)``, as ``Completion.text``.

The string stays in the response (its tokens are trained, the verifier reads it: a format such as
``<answer>...</answer>`` with ``stop=["</answer>"]`` keeps its closing tag). vLLM's default drops it from the text
but keeps its tokens; pacs_fast always keeps both, so the verifier and the learner see the same response.

:class:`StopStrings` finds the stop in a response (:meth:`StopStrings.cut`) and, inside a decode loop, tells
which rows have just reached one (:meth:`StopStrings.hits`: the last tokens decoded, enough to hold any of the
strings, then the whole response to confirm), so the HF engine stops decoding those rows.
"""
from __future__ import annotations

import torch


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
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _holds(self, text: str) -> bool:
        return any(s in text for s in self.stop)

    def cut(self, ids: list[int], text: str | None = None) -> tuple[int, str] | None:
        """``(k, text)``: the first ``k`` tokens of the response ``ids`` are the shortest start whose text holds a
        stop string, ``text`` their text cut just after the earliest-ending string; None when the response's
        text (``text``, or its decode) holds none."""
        if not self._holds(self._decode(ids) if text is None else text):
            return None
        lo, hi = 0, len(ids)  # the text of ids[:lo] holds no string (lo = 0: empty), that of ids[:hi] one
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._holds(self._decode(ids[:mid])):
                hi = mid
            else:
                lo = mid
        head = self._decode(ids[:hi])
        end = min(head.find(s) + len(s) for s in self.stop if s in head)
        return hi, head[:end]

    def hits(self, tokens: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor:
        """``[rows]`` bool on ``tokens``' device: the rows of ``tokens`` (``[rows, t]`` int, each row's response
        so far) whose text holds a stop string; rows where ``skip`` (``[rows]`` bool) is True are not checked
        (False). One host transfer of the last :attr:`window` tokens; a row found there is confirmed on its
        whole response (what :meth:`cut` reads)."""
        rows = tokens.shape[0]
        out = torch.zeros(rows, dtype=torch.bool)
        todo = list(range(rows)) if skip is None else (~skip).nonzero().flatten().tolist()
        if not todo or tokens.shape[1] == 0:
            return out.to(tokens.device)
        recent = tokens[:, -self.window:].cpu().tolist()
        texts = self.tokenizer.batch_decode([recent[i] for i in todo], skip_special_tokens=True)
        for i, text in zip(todo, texts):
            if self._holds(text) and self._holds(self._decode(tokens[i].tolist())):
                out[i] = True
        return out.to(tokens.device)
