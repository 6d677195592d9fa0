"""The answer a response states, as the math verifier reads it, and whether two answers are the same.

What majority voting (maj@k, :mod:`pacs_fast.evaluation.majority`) counts:

- :func:`extract_answer`: the answer math-verify extracts from a response under the verifier's ``extraction``
  (``"reference"``, ``"boxed"`` or ``"answer_tag"``, :mod:`pacs_fast.reward.verifier`), after the verifier's
  :func:`~pacs_fast.reward.verifier.normalize_math_text`, as a string: math-verify's extracted text with its
  whitespace runs collapsed to one space, and a plain integer in canonical digits (``+05`` -> ``5``); ``None``
  when nothing is extracted (the verifier's ``no_answer``), on a timeout or an error (``"boxed"`` reads what the
  verifier reads, after a response's last ``</think>``; ``"answer_tag"`` the content of its last ``<answer>`` tag
  there, as a box's: :mod:`pacs_fast.reward.answer_tag`). The verifier's exact fast
  path (one ``\\boxed{}`` holding an integer, :func:`~pacs_fast.reward.verifier.boxed_integer`) is taken
  here too: no math-verify import, microseconds.
- :func:`same_answer`: two answer strings are the same when math-verify's ``verify(..., float_rounding=6)``
  (the verifier's comparison) holds with either one parsed as the gold (``\\boxed{...}``, the verifier's gold
  parse): symmetric by construction (``x>1`` / ``(1,\\infty)`` hold one way only). Identical strings and two
  integers are decided without math-verify. A timeout or an error is "not the same".

Each call runs under the verifier's time-limit machinery (``signal.setitimer`` on the main thread, math-verify's
import first outside the limit; another thread or ``time_limit`` None / 0: no limit).
"""
from __future__ import annotations

import re

from pacs_fast.reward import verifier as _v
from pacs_fast.reward.boxes import AFTER_THINK
from pacs_fast.reward.time_limit import DEFAULT_TIME_LIMIT, check_time_limit, run_limited
from pacs_fast.reward.verifier import boxed_answers, check_extraction, normalize_math_text, read_part

_INT_RE = re.compile(r"[+-]?[0-9]{1,30}")


def _canonical(text: str) -> str | None:
    """``text`` with whitespace runs collapsed (and stripped); a plain integer as ``str(int)``; ``""`` -> None."""
    text = " ".join(text.split())
    if _INT_RE.fullmatch(text):
        return str(int(text))
    return text or None


def _fast_integer_answer(text: str) -> str | None:
    """The boxed integer math-verify provably extracts from ``text`` (:func:`~pacs_fast.reward.verifier.
    boxed_integer`, the verifier's fast path), or None (ask math-verify)."""
    value = _v.boxed_integer(text)
    return None if value is None else str(value)


def _extract_unlimited(text: str, extraction: str) -> str | None:
    """math-verify's extraction from the normalised ``text``, no time limit."""
    from math_verify import parse

    _v._quiet_math_verify()
    gold_cfg, pred_cfg = _v._configs()
    if extraction in AFTER_THINK:  # ("answer_tag": its tag as a box, read_part)
        text, pred_cfg = boxed_answers(text), gold_cfg
        if not text:
            return None
    pred = parse(text, pred_cfg, parsing_timeout=None)
    if not pred:
        return None
    strings = [x for x in pred if isinstance(x, str)]
    return _canonical(strings[-1] if strings else str(pred[0]))


def _same_unlimited(a: str, b: str) -> bool:
    from math_verify import verify

    _v._quiet_math_verify()
    gold_a, gold_b = _v._parse_gold(normalize_math_text(a)), _v._parse_gold(normalize_math_text(b))
    if not gold_a or not gold_b:
        return False
    if getattr(gold_a[0], "is_Integer", False) is True and getattr(gold_b[0], "is_Integer", False) is True:
        return bool(gold_a[0] == gold_b[0])  # (two integers: equal as numbers; no simplification needed)
    return bool(verify(gold_a, gold_b, 6, timeout_seconds=None) or verify(gold_b, gold_a, 6, timeout_seconds=None))


def _limited(fn, time_limit, default):
    """``fn()`` under the verifier's time limit (:func:`~pacs_fast.reward.time_limit.run_limited`, math-verify's
    import first, outside it), or ``default`` on a timeout or an exception."""
    check_time_limit(time_limit)
    _v.warm_up()
    return run_limited(fn, time_limit, on_timeout=default, on_error=default)


def extract_answer(response: str, extraction: str = "reference",
                   time_limit: float | None = DEFAULT_TIME_LIMIT) -> str | None:
    """The answer the verifier reads in ``response`` (module docstring) as a string, or None: nothing extracted,
    a timeout (``time_limit`` seconds) or an error. ``extraction``: ``"reference"`` | ``"boxed"`` | ``"answer_tag"``.

    >>> extract_answer("so $\\\\boxed{\\\\frac{1}{2}}$"), extract_answer("\\\\boxed{+05}"), extract_answer("no")
    ('\\\\frac{1}{2}', '5', None)
    """
    check_extraction(extraction)
    if not isinstance(response, str):
        return None
    response = read_part(response, extraction)  # ("boxed": after the last </think>; "answer_tag": its tag, boxed)
    text = normalize_math_text(response)
    fast = _fast_integer_answer(response)
    if fast is None:
        fast = _fast_integer_answer(text)
    if fast is not None:  # (exact: no import, no alarm)
        return fast
    if extraction in AFTER_THINK and not boxed_answers(text):
        return None
    return _limited(lambda: _extract_unlimited(text, extraction), time_limit, None)


def same_answer(a: str, b: str, time_limit: float | None = DEFAULT_TIME_LIMIT, *, on_timeout=False) -> bool:
    """Whether the answer strings ``a`` and ``b`` (:func:`extract_answer`'s) are the same (module docstring):
    identical, two equal integers, or math-verify's ``verify`` with either as the gold. Symmetric; an error is
    False, a timeout (``time_limit`` seconds for both directions) ``on_timeout``.

    >>> same_answer("\\\\frac{1}{2}", "0.5"), same_answer("1/2", "2")
    (True, False)
    """
    if a == b:
        return True
    if _INT_RE.fullmatch(a) and _INT_RE.fullmatch(b):
        return int(a) == int(b)
    check_time_limit(time_limit)
    _v.warm_up()
    return run_limited(lambda: _same_unlimited(a, b), time_limit, on_timeout=on_timeout, on_error=False)
