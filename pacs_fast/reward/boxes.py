"""The ``\\boxed{...}`` of a response: listing them, and box forms math-verify misreads.

- :func:`box_list` / :func:`boxed_answers`: the complete, non-empty boxes of a text (what ``extraction="boxed"``
  reads). A box left open (a truncated response) or an empty one (``\\boxed{}``: the instruction "put your final
  answer within \\boxed{}" echoed, often inside ``<think>``) states no answer and is skipped.
- :func:`strip_box_units`: ``\\boxed{15 \\text{ cm}^2}`` -> ``\\boxed{15}``. math-verify drops such a trailing
  unit from a single box itself, but when it joins several boxes (``15 \\text{ cm},16 \\text{ cm}``) its unit rule
  (``\\text{.*?}...$``) runs from the first box's ``\\text{`` to the end and keeps only the first box: a hedge
  ``\\boxed{15 \\text{ cm}} or \\boxed{16 \\text{ cm}}`` was paid for a gold 15, and ``\\boxed{15 \\text{ cm}}, i.e.
  \\boxed{15}`` was not. Stripped per box first, each box reads as math-verify reads it alone. Two kinds of word are
  no unit: a bare ``and`` / ``or`` stays (``\\boxed{5 \\text{ and }}`` is an unfinished list, which math-verify reads
  as ``5,``, no answer; dropped, it was paid as 5), and ``percent`` / ``percentage`` / ``pct`` become ``\\%``
  (math-verify's percent: ``\\boxed{5\\text{percent}}`` equals a gold 0.05; dropped, it read 5).
- :func:`strip_choice_label`: ``\\boxed{\\textbf{(C)}\\ 27}`` -> ``\\boxed{27}``. An answer choice's label (A to E in
  parentheses, optionally in ``\\text`` / ``\\textbf`` / ``\\mathrm`` / ``\\mathbf``) opening a box before a value,
  AMC's style: math-verify reads the label as a factor (``c*27``), so the right value scored 0. A label alone stays.

- :func:`answer_part`: what ``extraction="boxed"`` reads of a response, the text after its last ``</think>``
  (a reasoning model's answer, after its thinking: boxes inside ``<think>`` are drafts), or all of it; up to a
  ``<think>`` left open there (a response cut inside its thinking states no answer yet); the thinking marks of
  Magistral (``[THINK]``), Seed-OSS (``<seed:think>``), Command A Reasoning, MiniMax-M3 and Gemma 4 (its thought
  channel) alike (:data:`THINK_MARKS`; special tokens the engines' texts keep). A prompt that opens the thinking itself
  (:func:`opens_think`: DeepSeek-R1's ``<think>``) has its responses read as ``<think>`` + response.
  gpt-oss's harmony prompts (ending ``<|start|>assistant``: :func:`opens_think` says :data:`HARMONY`) leave the
  channel to the model, which thinks in ``analysis`` then answers in ``final``; its texts, decoded without special
  tokens, read ``analysis<draft>assistantfinal<answer>``: only the last final message is read
  (:func:`final_channel`; none yet: no answer).

Pure text functions (str -> str / list[str]), linear time; no math-verify import.
"""
from __future__ import annotations

import re

# a box whose content is a value ending in a digit or a closing brace, then one unit word (letters and spaces in
# \text / \mbox / \mathrm / \textrm, optionally squared or cubed) and nothing else; the value holds no other such
# command and braces at most one level deep (\frac{270}7)
_UNIT_CMD = r"\\(?:text|mbox|mathrm|textrm)"
_UNIT_BOX_RE = re.compile(r"(\\boxed\{(?:[^{}\\]|\\(?!text|mbox|mathrm|textrm)|\{[^{}]*\})*?[0-9}])"
                          r"(?:\s|\\[,;:! ]|~)*" + _UNIT_CMD
                          + r"\{( *[A-Za-z][ A-Za-z]*)\}(?:\^[0-9]|\^\{[0-9]\})?\s*\}")
_NOT_UNITS = ("and", "or")                         # math-verify's separators: "5 and" is an unfinished list
_PERCENT_WORDS = ("percent", "percentage", "pct")  # math-verify's percent sign

# a choice label (A-E) opening a box, before a value: a number, a fraction or a root, optionally negative
_CHOICE_BOX_RE = re.compile(r"(\\boxed\{)[ \t]*(?:\\(?:text|textbf|mathrm|mathbf)\{[ \t]*\([A-E]\)[ \t]*\}|\([A-E]\))"
                            r"(?:[ \t]|\\[,;:! ]|~|\\q?quad(?![A-Za-z]))*"
                            r"(?=-?[0-9.]|-?\\(?:[dt]?frac|sqrt)(?![A-Za-z]))")


THINK_START, THINK_END = "<think>", "</think>"
# the thinking markers answer_part knows: <think>'s, and those of families whose thinking has marks of its own (each
# a special token in its tokenizer, or an added one: the engines' texts keep them, pacs_fast/rollout/base.py
# decode_texts), as vLLM's reasoning parsers read them: Magistral's (tekken control tokens), Seed-OSS's, Command A
# Reasoning's, MiniMax-M3's, Gemma 4's thought channel ("<|channel>thought\n...<channel|>answer")
THINK_MARKS = ((THINK_START, THINK_END), ("[THINK]", "[/THINK]"), ("<seed:think>", "</seed:think>"),
               ("<|START_THINKING|>", "<|END_THINKING|>"), ("<mm:think>", "</mm:think>"), ("<|channel>", "<channel|>"))
# the extractions that read only a response's answer part (:func:`answer_part`): ``"boxed"`` its boxes, ``"answer_tag"``
# its last <answer>...</answer> (pacs_fast/reward/answer_tag.py)
AFTER_THINK = ("boxed", "answer_tag")
HARMONY = "harmony"  # what opens_think says of a harmony (gpt-oss) prompt
HARMONY_TURN = "<|start|>assistant"  # the harmony template's generation prompt
# a final-channel message's start as the engines' texts hold it (special tokens skipped: "<|end|><|start|>assistant
# <|channel|>final<|message|>" reads "assistantfinal"), and with the tokens kept
FINAL_STARTS = ("<|channel|>final<|message|>", "assistantfinal")


def answer_part(text: str) -> str:
    """The text after the last ``</think>`` of ``text`` (module docstring), or ``text`` without one; in either, only
    what precedes a ``<think>`` never closed (``"<think>draft \\boxed{4}"`` -> ``""``: drafts, as inside a closed
    one). The other families' marks (:data:`THINK_MARKS`: Magistral's ``[THINK]`` / ``[/THINK]``, Seed-OSS's
    ``<seed:think>``, Gemma 4's ``<|channel>`` ...) are read as ``<think>`` / ``</think>``."""
    i, n = max((text.rfind(end), len(end)) for _, end in THINK_MARKS)
    part = text if i < 0 else text[i + n:]
    j = min((k for k in (part.find(start) for start, _ in THINK_MARKS) if k >= 0), default=-1)
    return part if j < 0 else part[:j]


def opens_think(prompt: str) -> bool | str:
    """Whether ``prompt`` ends inside a ``<think>`` it opened (DeepSeek-R1's generation prompt ``<｜Assistant｜><think>``
    and others that start the thinking for the model; or one of the other :data:`THINK_MARKS`): its responses continue
    that block, their drafts before its end, and ``extraction="boxed"`` reads them as ``<think>`` + response
    (:func:`answer_part`).
    :data:`HARMONY` (truthy) for a harmony prompt (gpt-oss's: the model opens its analysis channel itself), whose
    responses ``"boxed"`` reads in their final channel alone (:func:`final_channel`)."""
    if prompt.endswith(HARMONY_TURN):
        return HARMONY
    return any(prompt.rfind(start) > prompt.rfind(end) for start, end in THINK_MARKS)


def final_channel(text: str) -> str:
    """The content of a harmony response's last ``final`` message (``"analysismaybe \\boxed{9}assistantfinalSo
    \\boxed{8}"`` -> ``"So \\boxed{8}"``; a response that opens with it: ``"finalSo ..."``), or ``""`` where it has
    none (cut in its analysis, or only commentary: its boxes are drafts)."""
    at = max(text.rfind(m) + len(m) if m in text else -1 for m in FINAL_STARTS)
    if at >= 0:
        return text[at:]
    return text[len("final"):] if text.startswith("final") else ""


def with_prompt_think(responses, think_open: bool | str, extraction: str):
    """``responses`` as ``extraction`` reads them: under ``"boxed"`` and ``"answer_tag"`` (:data:`AFTER_THINK`),
    where the prompts open the ``<think>`` (``think_open``: :func:`opens_think`), each text as ``<think>`` + response
    (harmony's: its final channel, :func:`final_channel`); else as they are."""
    if not (think_open and extraction in AFTER_THINK):
        return responses
    if think_open == HARMONY:
        return [final_channel(r) if isinstance(r, str) else r for r in responses]
    return [THINK_START + r if isinstance(r, str) else r for r in responses]


def strip_box_units(text: str) -> str:
    """``\\boxed{<value> \\text{ unit}^2}`` -> ``\\boxed{<value>}`` for every such box; ``and`` / ``or`` kept, a
    percent word -> ``\\%`` (module docstring). Idempotent."""
    return _UNIT_BOX_RE.sub(_unit_repl, text) if "\\boxed{" in text else text


def _unit_repl(m: re.Match) -> str:
    word = m.group(2).strip()
    if word in _NOT_UNITS:
        return m.group(0)
    return m.group(1) + ("\\%}" if word in _PERCENT_WORDS else "}")


def strip_choice_label(text: str) -> str:
    """``\\boxed{\\textbf{(C)}\\ 27}`` -> ``\\boxed{27}``: a choice label (A to E) opening a box before a value (module
    docstring). Idempotent."""
    return _CHOICE_BOX_RE.sub(r"\1", text) if "\\boxed{" in text else text


def box_list(text: str) -> list[str]:
    """The complete, non-empty ``\\boxed{...}`` of ``text`` in order, each as written (``"\\boxed{5}"``).
    Linear time."""
    out, start = [], text.find("\\boxed{")
    while start >= 0:
        depth, i = 0, start + 6
        while i < len(text):
            c = text[i]
            if c == "\\":
                i += 2  # an escaped character (\{, \}) never opens or closes the box
                continue
            depth += (c == "{") - (c == "}")
            i += 1
            if depth == 0:
                if text[start + 7:i - 1].strip():
                    out.append(text[start:i])
                break
        else:
            break  # open to the end: no later box can be complete either
        start = text.find("\\boxed{", i)
    return out


def boxed_answers(text: str) -> str:
    """The complete, non-empty ``\\boxed{...}`` of ``text``, each as written, joined by spaces; ``""`` when
    there is none. A box left open (a truncated response) or empty does not count. Linear time."""
    return " ".join(box_list(text))
