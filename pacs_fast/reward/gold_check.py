"""Gold answers no response can match: found before a run or an evaluation starts.

A gold answer the verifier cannot match even against a response that states it (``\\boxed{<gold>}``)
gives every response a reward of 0, silently: a label column the verifier cannot read (``data.answer_key``
naming the wrong field, ``#### 72`` left in a GSM8K answer), a form math-verify does not parse as
written. :func:`unmatchable_golds` scores ``\\boxed{gold}`` (under ``extraction="answer_tag"``
``<answer>gold</answer>``: :func:`stated`) against each distinct gold with the verifier the run uses; the trainer
and ``python -m pacs_fast.eval`` report what it finds before any model loads
(pacs_fast/trainer/problems.py: ``check_gold_answers``). Integers take the verifier's exact fast path
(microseconds); a LaTeX gold goes through math-verify (~2 ms each here), so the trainer checks every
held-out answer and a seeded sample of the training answers.
"""
from __future__ import annotations

import json
import re
from typing import Sequence

from pacs_fast.reward.answer_tag import ANSWER_CLOSE, ANSWER_OPEN, ANSWER_TAG
from pacs_fast.reward.verifier import DEFAULT_TIME_LIMIT, check_extraction, gold_text, score_item

_COMMAND_RE = re.compile(r"\\[A-Za-z]+")
_WORD_RE = re.compile(r"[A-Za-z]{2,}")


def reads_like_prose(answer: str) -> bool:
    """A gold answer that is a worked solution (GSM8K's ``... #### 72``) or a question (swapped fields)
    rather than a final answer: a line break, ``####``, or 8 or more words outside LaTeX commands (the
    shipped sets' answers have at most 3). math-verify matches a response's final answer against all of it."""
    return "\n" in answer or "####" in answer or len(_WORD_RE.findall(_COMMAND_RE.sub("", answer))) >= 8


def json_object(answer: str) -> dict | None:
    """The object a gold answer is the JSON text of (a dataset field holding ``{"ground_truth": "2", ...}``, verl's
    ``reward_model`` column, read whole), else None."""
    if not answer.lstrip().startswith("{"):
        return None
    try:
        value = json.loads(answer)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def object_hint(answer: str, field: str) -> str:
    """``"; ..."`` naming the nested field to read when ``answer`` is a JSON object (:func:`json_object`), else
    ``""``: ``ground_truth`` or ``answer`` where the object has one, else its first text or number."""
    value = json_object(answer)
    keys = [k for k, v in (value or {}).items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)]
    if not keys:
        return ""
    key = next((k for k in ("ground_truth", "answer") if k in keys), keys[0])
    return f"; the field holds an object: read its answer with a dotted name, {field}.{key}"


def stated(answer: str, extraction: str = "reference") -> str:
    """A response stating ``answer`` as ``extraction`` reads one: ``\\boxed{<answer>}``, under ``"answer_tag"``
    ``<answer><answer></answer>`` (``stated("<answer>", ...)``: how the lines name that form)."""
    return ANSWER_OPEN + answer + ANSWER_CLOSE if extraction == ANSWER_TAG else "\\boxed{" + answer + "}"


def unmatchable_golds(answers: Sequence[str], *, extraction: str = "reference",
                      time_limit: float | None = DEFAULT_TIME_LIMIT) -> list[int]:
    """Indices into ``answers`` (strings) of the gold answers that the response ``\\boxed{<gold>}``
    (:func:`stated`: ``<answer><gold></answer>`` under ``"answer_tag"``) does not score 1 against (``score_item``
    with this ``extraction`` and per-item ``time_limit``), and of those
    that are a JSON object (:func:`json_object`: never a final answer, though ``\\boxed{<its text>}`` matches it
    as text). Each distinct answer is scored once."""
    check_extraction(extraction)
    verdict: dict[str, bool] = {}
    bad = []
    for i, answer in enumerate(answers):
        answer = gold_text(answer)
        if answer not in verdict:
            verdict[answer] = json_object(answer) is None and score_item(
                stated(answer, extraction), answer, time_limit=time_limit, extraction=extraction).score >= 1.0
        if not verdict[answer]:
            bad.append(i)
    return bad
