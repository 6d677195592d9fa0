"""The math verifier: is a model's response equivalent to the gold answer?

Reference semantics (PACS ``src/reward_function.py``, via ``math_verify.metric.math_metric``):

- the gold answer is wrapped in ``\\boxed{...}`` and parsed with ``LatexExtractionConfig()``;
- the prediction is parsed from the whole response with
  ``(ExprExtractionConfig(), LatexExtractionConfig())`` (math-verify picks the last ``\\boxed{}``,
  then "final answer is ..." anchors, then plain expressions);
- the score is 1.0 when ``math_verify.verify(gold, pred, float_rounding=6)`` holds, else 0.0;
  any error or timeout scores 0.0.

math-verify's own timeouts use ``signal.alarm`` with whole seconds and are swallowed inside the
library, so here they are switched off and one wall-clock limit per item is enforced with
``signal.setitimer`` (main thread only). Some hostile inputs (huge integer powers) spend their
time in C code that no signal interrupts: :class:`pacs_fast.reward.BatchScorer` therefore runs
items in worker processes and kills a worker that overruns. Use it for untrusted output at scale.

Fast path: the common case -- an integer gold answer and a response whose only ``\\boxed{...}``
holds a plain integer -- is decided by integer equality without math-verify (microseconds instead
of milliseconds, never imports sympy, linear time so it cannot hang). It fires only where
math-verify provably extracts that boxed integer: exactly one ``\\boxed`` (directly followed by
``{``), no ``\\fbox``, no ``final answer ... is`` anchor anywhere (math-verify's only patterns that
outrank ``\\boxed``), no percent marker after the box, ASCII digits, at most 30 of them. Anything
else falls through to math-verify unchanged (:func:`_fast_integer_score`).
"""
from __future__ import annotations

import functools
import logging
import re
import signal
import threading
import time
from dataclasses import dataclass

# Statuses of one scored item.
OK = "ok"                  # prediction extracted and compared (score 1.0 or 0.0)
NO_ANSWER = "no_answer"    # nothing could be extracted from the response (score 0.0)
GOLD_ERROR = "gold_error"  # the gold answer does not parse (a data problem; score 0.0)
TIMEOUT = "timeout"        # the item ran past its time limit (score 0.0)
ERROR = "error"            # an unexpected exception or a crashed worker (score 0.0)
STATUSES = (OK, NO_ANSWER, GOLD_ERROR, TIMEOUT, ERROR)

DEFAULT_TIME_LIMIT = 5.0   # seconds per item (math-verify's own default per parse / verify call)

_quiet_done = False


def _quiet_math_verify() -> None:
    """math-verify logs a warning per unparsable prediction and when timeouts are off: silence it."""
    global _quiet_done
    if not _quiet_done:
        for name in ("math_verify", "math_verify.parser", "math_verify.grader", "math_verify.metric",
                     "latex2sympy2_extended"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        _quiet_done = True


class ItemTimeout(BaseException):
    """Raised by the item alarm. A BaseException so that math-verify's ``except Exception`` does
    not swallow it."""


@dataclass(frozen=True)
class ScoredItem:
    """Score and status of one response (see the status constants of this module)."""

    score: float
    status: str


@functools.lru_cache(maxsize=1)
def _configs():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return (LatexExtractionConfig(),), (ExprExtractionConfig(), LatexExtractionConfig())


@functools.lru_cache(maxsize=8192)
def _parse_gold(answer: str):
    from math_verify import parse

    gold_cfg, _ = _configs()
    return parse("\\boxed{" + answer + "}", gold_cfg, parsing_timeout=None)


# -- the fast path: integer gold, one boxed integer ------------------------------------------------
# math-verify (0.9) parses the prediction with priority groups; the only patterns ranked above
# ``\boxed`` (priority 0 and the non-boxed ones of priority 50) are anchored on "final answer" +
# "is" (case-insensitive). At priority 50 every match holding the single ``\boxed{...}`` (the plain
# ``\boxed{.+}`` one, and ``$...$`` / ``\[...\]`` / ... environments around it) is normalised by
# ``extract_boxed_content``, which with one ``\boxed`` and no ``\fbox`` keeps just the box content;
# an environment may be followed by a percent marker, which would make the number a percentage.
# The content ``[+-]?[0-9]+`` then parses to that integer (leading zeros, "+5", "-0" included), as
# does the gold, and ``verify`` compares two sympy Integers exactly. Hence integer equality.
_WS = " \t\n\r"
_INT_RE = re.compile(r"[+-]?[0-9]{1,30}")                       # ASCII digits only: \d is Unicode
_BOXED_INT_RE = re.compile(r"\\boxed\{[ \t\n\r]*([+-]?[0-9]{1,30})[ \t\n\r]*\}")
# math-verify's anchors are ``(?i:final answer is)`` and ``(?i:final answer.{0,100}?)\s+is``; both imply
# ``final answer.{0,100}?\s+is`` with IGNORECASE and DOTALL, which backtracks quadratically on long
# whitespace runs. This equivalent form (the run is entered at its first position inside the window,
# then taken possessively) matches the same strings in linear time.
_FINAL_ANSWER_RE = re.compile(r"final answer(?:.{0,99}?\S)?\s++is", re.IGNORECASE | re.DOTALL)
_PERCENT_RE = re.compile(r"%|[Pp]ercent|[Pp]ct")


def _fast_integer_score(response: str, answer: str) -> ScoredItem | None:
    """Scores the common case exactly as math-verify would, or returns ``None`` (use math-verify).

    Fires only when the stripped gold ``answer`` is a plain integer (``[+-]?[0-9]{1,30}``) and
    ``response`` contains exactly one ``\\boxed`` -- directly followed by ``{``, holding a plain
    integer with optional ASCII whitespace -- no ``\\fbox``, no ``final answer ... is`` and no
    percent marker (``%``, ``percent``, ``pct``) after the box. Returns ``ScoredItem(1.0 or 0.0, OK)``
    by integer equality; ``tests/test_reward_fast_path.py`` checks agreement with math-verify.
    """
    if not isinstance(response, str) or not isinstance(answer, str):
        return None
    gold = answer.strip(_WS)
    if _INT_RE.fullmatch(gold) is None:
        return None
    start = response.find("\\boxed")
    if start < 0 or response.find("\\boxed", start + 6) >= 0 or "\\fbox" in response:
        return None
    m = _BOXED_INT_RE.match(response, start)
    if m is None:
        return None
    if _PERCENT_RE.search(response, m.end()) is not None or _FINAL_ANSWER_RE.search(response) is not None:
        return None
    return ScoredItem(1.0 if int(m.group(1)) == int(gold) else 0.0, OK)


def _score_unlimited(response: str, answer: str) -> ScoredItem:
    """The reference comparison with no time limit (callers bound the time): the fast path when it
    applies, else math-verify."""
    item = _fast_integer_score(response, answer)
    return item if item is not None else _score_math_verify(response, answer)


def _score_math_verify(response: str, answer: str) -> ScoredItem:
    """The reference comparison through math-verify only, with no time limit."""
    from math_verify import parse, verify

    _quiet_math_verify()
    try:
        gold = _parse_gold(answer)
    except ItemTimeout:
        raise
    except Exception:
        return ScoredItem(0.0, GOLD_ERROR)
    if not gold:
        return ScoredItem(0.0, GOLD_ERROR)
    _, pred_cfg = _configs()
    try:
        pred = parse(response, pred_cfg, parsing_timeout=None)
    except ItemTimeout:
        raise
    except Exception:
        return ScoredItem(0.0, ERROR)
    if not pred:
        return ScoredItem(0.0, NO_ANSWER)
    try:
        ok = verify(gold, pred, 6, timeout_seconds=None)
    except ItemTimeout:
        raise
    except Exception:
        return ScoredItem(0.0, ERROR)
    return ScoredItem(1.0 if ok else 0.0, OK)


_warm_done = False


def warm_up() -> None:
    """Imports math-verify and runs one parse + verify, with no time limit (once per process).

    The first comparison of a process spends seconds importing math-verify, sympy and the LaTeX
    grammar; :func:`score_item` calls this *before* arming an item's timer, so that one-time cost
    never counts against (or times out, or half-imports under) the per-item limit.
    """
    global _warm_done
    if not _warm_done:
        _score_math_verify("\\boxed{1}", "1")
        _warm_done = True


def score_item(response: str, answer: str, time_limit: float | None = DEFAULT_TIME_LIMIT) -> ScoredItem:
    """Scores one response with a status. Never raises on model output.

    ``time_limit`` (seconds, float) is enforced with ``signal.setitimer`` when called from the main
    thread; from another thread (or with ``None``) the item runs without a limit. Items the exact
    fast path decides (see the module docstring) return at once. Otherwise the first call of a
    process first runs :func:`warm_up` (math-verify's import) outside the limit. The caller's
    SIGALRM handler and timer are restored afterwards.
    """
    if not isinstance(response, str):
        return ScoredItem(0.0, ERROR)
    answer = str(answer)
    fast = _fast_integer_score(response, answer)  # exact, microseconds: no import, no alarm
    if fast is not None:
        return fast
    warm_up()  # the one-time import cost, outside the time limit
    use_alarm = (time_limit is not None and time_limit > 0
                 and threading.current_thread() is threading.main_thread())
    if not use_alarm:
        try:
            return _score_unlimited(response, answer)
        except Exception:
            return ScoredItem(0.0, ERROR)

    def _on_alarm(signum, frame):
        raise ItemTimeout()

    # A caller's pending timer (e.g. pytest-timeout's) is paused and re-armed afterwards.
    old_handler = signal.signal(signal.SIGALRM, _on_alarm)
    started = time.monotonic()
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, 0)
    limit = float(time_limit) if old_delay <= 0 else min(float(time_limit), old_delay)
    try:
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            return _score_unlimited(response, answer)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ItemTimeout:
        return ScoredItem(0.0, TIMEOUT)
    except Exception:
        return ScoredItem(0.0, ERROR)
    finally:
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            remaining = old_delay - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-3), old_interval)


def math_reward(response: str, answer: str, *, time_limit: float | None = DEFAULT_TIME_LIMIT) -> float:
    """1.0 if ``response`` states an answer equivalent to ``answer`` (gold, LaTeX), else 0.0.

    The PACS reference semantics (see the module docstring). Never raises on model output:
    parse errors, timeouts and garbage all score 0.0.

    >>> math_reward("... so the answer is $\\\\boxed{0.5}$.", "\\\\frac{1}{2}")
    1.0
    """
    return score_item(response, answer, time_limit).score


def gold_parses(answer: str) -> bool:
    """True when the gold ``answer`` parses (the check every shipped benchmark passes)."""
    _quiet_math_verify()
    try:
        return bool(_parse_gold(str(answer)))
    except Exception:
        return False
