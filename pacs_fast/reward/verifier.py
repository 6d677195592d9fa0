"""The math verifier: is a model's response equivalent to the gold answer?

Reference semantics (PACS ``src/reward_function.py``, via ``math_verify.metric.math_metric``):

- the gold answer is wrapped in ``\\boxed{...}`` and parsed with ``LatexExtractionConfig()``;
- the prediction is parsed from the whole response with
  ``(ExprExtractionConfig(), LatexExtractionConfig())`` (math-verify takes "final answer is ..."
  anchors first, then ``\\boxed{}``, then plain expressions);
- the score is 1.0 when ``math_verify.verify(gold, pred, float_rounding=6)`` holds, else 0.0;
  any error or timeout scores 0.0.

**Several boxed answers** (math-verify's rule, hence the PACS reference reward's): the last box is read
together with the boxes just before it -- within 10 characters, or within 70 with "and" / "or" / "," / ";"
between and a different content -- as the set of their distinct contents; boxes each in its own ``$...$`` /
``\\[...\\]`` are read as the last one, with up to 5 before it joined by "and" / "or" / ",". So
``\\boxed{3} or \\boxed{5}`` equals a gold ``3, 5`` or ``\\{3, 5\\}`` but neither ``3`` nor ``5``, a repeated box
counts once, and a box corrected a paragraph later (``$\\boxed{3}$. Wait, ... the answer is $\\boxed{5}$.``)
is read as its last box, 5 (only bare boxes close together, as above, make such a correction a set).

**Written forms normalised first** (:func:`normalize_math_text`, on the response and the gold,
before math-verify, which misses them): ``\\boxed {x}`` (space) and ``\\fbox{x}`` are ``\\boxed{x}``; a trailing
unit word in a box (``\\boxed{15 \\text{ cm}^2}``) is dropped per box, as math-verify drops it from a single box
(joining several, it kept only the first box: :mod:`pacs_fast.reward.boxes`); ``90\\degree`` /
``90\\textdegree`` are ``90^\\circ``; a base ``(2516)_8`` is ``2516_8``; ``\\boxed 6`` (no braces, a number
and then an end) is ``\\boxed{6}``; a choice label before a boxed value (``\\boxed{\\textbf{(C)}\\ 27}``) is dropped,
math-verify reading it as a factor; a bare ``and`` / ``or`` ending a box is no unit (``\\boxed{5 \\text{ and }}``
is an unfinished list, no answer), a spelled-out ``percent`` in a box is ``\\%``;
thin-space and other digit-group separators inside a number with groups of three digits
(``1\\,000``, ``1{,}000``, ``1\\!000``, ``1\\;000``, ``1\\:000``, ``1\\ 000``, ``1~000``,
``\\thinspace``, U+2009 / U+202F / U+00A0 / U+2008 and the Arabic thousands separator U+066C) are
dropped, one kind of separator per number; non-ASCII decimal digits (Arabic-Indic, Persian,
Devanagari, full-width, ...: Unicode category Nd) become ASCII digits, and the Arabic decimal
separator U+066B and the full-width full stop U+FF0E between digits become ``.``. A plain space
between digit groups is left alone (``1 000`` may be a list), as is a comma (math-verify reads
``1,000`` itself).

**Extraction** (``extraction=``, ``reward.extraction``, ``eval --extraction``): ``"reference"`` (the default: the
PACS reference above) or ``"boxed"``: only the complete, non-empty ``\\boxed{...}`` of a response are read -- after
its last ``</think>`` where it has one (a reasoning model's boxes inside ``<think>`` are drafts;
:func:`~pacs_fast.reward.boxes.answer_part`) -- and a response without one scores 0 (``no_answer``); an empty
``\\boxed{}`` (the prompt's "within \\boxed{}" echoed) is no box. With several distinct boxes, a box that alone
equals the gold pays only if every box does (so a hedge or a correction scores 0); if none alone does, their set is
read as above (a multi-part answer boxed in parts). The reference reads more: with no box it takes a "final answer
is" phrase's leading number, or the last number in the text, so an unfinished or truncated response, a hedge ("the
answer is 5 or 6") or a negation ("the answer is not 5") can score 1 against a gold 5. Asked for ``\\boxed{}`` by
the prompt, a model that answers without one gets no reward under ``"boxed"``. ``"answer_tag"`` (R1-Zero's format)
reads the last complete ``<answer>...</answer>`` after the thinking, its content as a box's
(:mod:`pacs_fast.reward.answer_tag`); a response without one scores 0.

math-verify's own timeouts use ``signal.alarm`` with whole seconds and are swallowed inside the library, so here
they are switched off and one wall-clock limit per item is enforced with ``signal.setitimer`` (main thread only;
:mod:`pacs_fast.reward.time_limit`). Some hostile inputs (huge integer powers) spend their time in C code that no
signal interrupts: :class:`pacs_fast.reward.BatchScorer` therefore runs items in worker processes and kills a worker
that overruns. Use it for untrusted output at scale.

Fast path: the common case -- an integer gold answer and a response whose only ``\\boxed{...}`` holds a plain
integer (before or after the normalisation) -- is decided by integer equality without math-verify (microseconds
instead of milliseconds, never imports sympy, linear time so it cannot hang). It fires only where math-verify
provably extracts that boxed integer: exactly one ``\\boxed`` (directly followed by ``{``), no ``\\fbox``, no
``final answer ... is`` anchor anywhere (math-verify's only patterns that outrank ``\\boxed``), no percent marker
after the box, ASCII digits, at most 30 of them. Anything else falls through to math-verify unchanged
(:func:`_fast_integer_score`).
"""
from __future__ import annotations

import functools
import logging
import numbers
import re
import unicodedata
from dataclasses import dataclass
from decimal import Decimal

from pacs_fast.reward.answer_tag import ANSWER_TAG, tag_as_box
from pacs_fast.reward.boxes import (AFTER_THINK, answer_part, box_list, boxed_answers,  # noqa: F401 (re-export)
                                    strip_box_units, strip_choice_label)
from pacs_fast.reward.time_limit import (DEFAULT_TIME_LIMIT, MAX_TIME_LIMIT, ItemTimeout,  # noqa: F401 (re-export)
                                         check_time_limit, run_limited)

# Statuses of one scored item.
OK = "ok"                  # prediction extracted and compared (score 1.0 or 0.0)
NO_ANSWER = "no_answer"    # nothing could be extracted from the response (score 0.0)
GOLD_ERROR = "gold_error"  # the gold answer does not parse (a data problem; score 0.0)
TIMEOUT = "timeout"        # the item ran past its time limit (score 0.0)
ERROR = "error"            # an unexpected exception or a crashed worker (score 0.0)
STATUSES = (OK, NO_ANSWER, GOLD_ERROR, TIMEOUT, ERROR)

EXTRACTIONS = ("reference", "boxed", ANSWER_TAG)  # what is read from a response (module docstring)

_quiet_done = False


def _quiet_math_verify() -> None:
    """math-verify logs a warning per unparsable prediction and when timeouts are off: silence it."""
    global _quiet_done
    if not _quiet_done:
        for name in ("math_verify", "math_verify.parser", "math_verify.grader", "math_verify.metric",
                     "latex2sympy2_extended"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        _quiet_done = True


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
    # a gold answer ending a sentence ("5.", scraped data) is the number: the full stop closing the box goes
    return parse(_BOX_STOP_RE.sub(r"\1", "\\boxed{" + answer + "}"), gold_cfg, parsing_timeout=None)


# -- normalisation of written forms math-verify misses ----------------------------------------------
_BOX_RE = re.compile(r"\\(?:boxed[ \t\n\r]+|fbox[ \t\n\r]*)(?=\{)")
# A digit-group separator: LaTeX spaces, {,}, Unicode thin / narrow / no-break / punctuation spaces,
# the Arabic thousands separator. A number is 1-3 digits then groups of exactly 3, one separator kind.
_SEP = (r"\\[,!;: ]|~|\{,\}|\\thinspace(?![A-Za-z])[ ]?|[\u2009\u202f\u00a0\u2008\u066c]")
# Never start inside a run of groups (right after a digit and a separator): the match at the run's first
# group covers it, or the run is not a number. Without this every group of a run that fails at its end
# was tried again as a start, each trial scanning the rest: quadratic (100 KB of "1~234~234..." took 30 s).
_SEP_LITERALS = ("\\,", "\\!", "\\;", "\\:", "\\ ", "~", "{,}", "\\thinspace", "\\thinspace ", "\u2009", "\u202f",
                 "\u00a0", "\u2008", "\u066c")
_NOT_MID_RUN = "".join(f"(?<![0-9]{re.escape(s)})" for s in _SEP_LITERALS)
_GROUPED_RE = re.compile(r"(?<![0-9.])(?<![0-9],)" + _NOT_MID_RUN + r"([0-9]{1,3})(" + _SEP + r")([0-9]{3}(?:(?:" + _SEP
                         + r")[0-9]{3})*)(?![0-9]|,[0-9]|(?:" + _SEP + r")[0-9])")  # not followed by more groups
_NON_ASCII_DIGIT_RE = re.compile(r"(?![0-9])\d")  # \d on str is Unicode category Nd
_DECIMAL_SEP_RE = re.compile(r"(?<=[0-9])[\u066b\uff0e](?=[0-9])")
# a dash other than '-' (figure / en dash, small / full-width hyphen-minus) where a minus sign is meant: before a
# number -- digits, or a fraction, root, pi or infinity in LaTeX (math-verify drops the dash there, so ``–\frac{1}{2}``
# had been paid for a gold ``\frac{1}{2}``) -- not right after one (``3–5`` is a range)
_DASH_MINUS_RE = re.compile(r"(?<![0-9A-Za-z)\]}.])[\u2012\u2013\ufe63\uff0d]"
                            r"(?=[ \t]*(?:[0-9.]|\\(?:[dt]?frac|sqrt|pi|infty)(?![A-Za-z])))")
_DEGREE_RE = re.compile(r"(?<=[0-9}])[ \t]*\u00b0")  # 90° -> 90^\circ
# \degree / \textdegree (gensymb, textcomp) after a number: math-verify reads none (``90\degree``)
_DEGREE_CMD_RE = re.compile(r"(?<=[0-9}])[ \t]*(?:\^\{\\(?:text)?degree\}|\^?\\(?:text)?degree)(?![A-Za-z])")
# a base written ``(2516)_8`` / ``(2516)_{8}``: math-verify reads none; ``2516_8`` it reads
_PAREN_BASE_RE = re.compile(r"(?<![\w)\]}])\(([0-9]+)\)_(?=[0-9]|\{[0-9]+\})")
# a box with no braces around a number, ``\boxed 6`` (TeX's one-token argument), where only an end follows it (a
# sentence's stop, ``$``, ``\]``, a line end): the "boxed" extraction read no box there, and under the reference an
# earlier draft ``\boxed{...}`` outranked it. More after the number (``\boxed 2^{10}``, ``\boxed 1,000``) is left alone.
_BARE_BOX_RE = re.compile(r"\\boxed[ \t]*([+-]?[0-9]+(?:\.[0-9]+)?)(?![0-9])"
                          r"(?=[ \t]*(?:$|[\n\r$]|\\[\])]|[.,;:!?](?![0-9])))")
# a full stop closing a box's number ("\boxed{12.}"): math-verify reads no answer there
_BOX_STOP_RE = re.compile(r"(\\boxed\{[^{}]{0,64}?[0-9])\.[ \t]*(?=\})")


def _ungroup(m: re.Match) -> str:
    sep = m.group(2)
    rest = m.group(3)
    parts = re.split(_SEP, rest)
    # the same separator throughout (1\,000\,000); a mix is left alone
    if any(s != sep for s in re.findall(_SEP, rest)) or any(len(p) != 3 for p in parts):
        return m.group(0)
    return m.group(1) + "".join(parts)


def normalize_math_text(text: str) -> str:
    """Rewrites the written forms math-verify misses into ones it reads (module docstring):
    ``\\boxed {x}`` / ``\\fbox{x}`` / ``\\boxed 6`` -> ``\\boxed{x}``, a choice label before a boxed value dropped,
    ``1\\,000`` (and other digit-group separators)
    -> ``1000``, non-ASCII decimal digits -> ASCII, a figure / en dash or full-width minus before a number
    -> ``-``, ``90°`` -> ``90^\\circ``, ``\\boxed{12.}`` -> ``\\boxed{12}``. Idempotent; linear time."""
    if not isinstance(text, str):
        return text
    if not text.isascii():
        text = _NON_ASCII_DIGIT_RE.sub(lambda m: str(unicodedata.decimal(m.group(0))), text)
        text = _DECIMAL_SEP_RE.sub(".", text)
        text = _DEGREE_RE.sub(r"^\\circ", _DASH_MINUS_RE.sub("-", text))
    if "degree" in text:
        text = _DEGREE_CMD_RE.sub(r"^\\circ", text)
    if ")_" in text:
        text = _PAREN_BASE_RE.sub(r"\1_", text)
    boxed = "\\boxed" in text or "\\fbox" in text
    if boxed:
        text = strip_box_units(strip_choice_label(_BOX_RE.sub(r"\\boxed", text)))
    text = _GROUPED_RE.sub(_ungroup, text)
    if not boxed:
        return text
    # (after the digit groups are joined: ``\boxed 1{,}000`` is a whole number only then)
    text = _BARE_BOX_RE.sub(r"\\boxed{\1}", text)
    # the box's closing full stop after the digit groups are joined: ``\boxed{1{,}456.}`` became ``\boxed{1456.}``,
    # and only a second pass took its stop (a fuzzed CI run, seed 1331683857)
    return _BOX_STOP_RE.sub(r"\1", text)


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
# then taken possessively) matches the same strings in linear time. ``(?=(\s+))\1`` is the possessive ``\s++``
# spelled for Python 3.10 (possessive quantifiers are 3.11+): a lookahead is atomic, the backreference consumes it.
_FINAL_ANSWER_RE = re.compile(r"final answer(?:.{0,99}?\S)?(?=(\s+))\1is", re.IGNORECASE | re.DOTALL)
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
    value = boxed_integer(response)
    return None if value is None else ScoredItem(1.0 if value == int(gold) else 0.0, OK)


def boxed_integer(response: str) -> int | None:
    """The integer math-verify provably extracts from ``response`` (the fast path's conditions on the response,
    :func:`_fast_integer_score`), else None (math-verify decides). Linear time, no import."""
    start = response.find("\\boxed")
    if start < 0 or response.find("\\boxed", start + 6) >= 0 or "\\fbox" in response:
        return None
    m = _BOXED_INT_RE.match(response, start)
    if m is None:
        return None
    if _PERCENT_RE.search(response, m.end()) is not None or _FINAL_ANSWER_RE.search(response) is not None:
        return None
    return int(m.group(1))


def read_part(response, extraction: str):
    """What ``extraction`` reads of ``response``: under ``"boxed"`` the text after its last ``</think>`` (module
    docstring), under ``"answer_tag"`` its last ``<answer>`` tag there as ``\\boxed{<content>}``
    (:func:`~pacs_fast.reward.answer_tag.tag_as_box`: read as ``"boxed"`` reads it), else all of it; a non-string as
    it is."""
    if extraction not in AFTER_THINK or not isinstance(response, str):
        return response
    part = answer_part(response)
    return tag_as_box(part) if extraction == ANSWER_TAG else part


def _fast_score(response: str, answer: str) -> ScoredItem | None:
    """:func:`_fast_integer_score` on the text as written, else on the normalised text (exact both
    ways: math-verify always sees the normalised text)."""
    item = _fast_integer_score(response, answer)
    if item is None and isinstance(response, str) and isinstance(answer, str):
        item = _fast_integer_score(normalize_math_text(response), normalize_math_text(answer))
    return item


def _score_unlimited(response: str, answer: str, extraction: str = "reference") -> ScoredItem:
    """The comparison with no time limit (callers bound the time): the fast path when it applies (on the
    text as written, then on the normalised text; exact under either extraction), else math-verify."""
    item = _fast_integer_score(response, answer)
    if item is not None:
        return item
    response, answer = normalize_math_text(response), normalize_math_text(answer)
    item = _fast_integer_score(response, answer)
    return item if item is not None else _score_math_verify(response, answer, extraction)


def _score_math_verify(response: str, answer: str, extraction: str = "reference") -> ScoredItem:
    """The comparison through math-verify (after :func:`normalize_math_text`), no time limit. ``"boxed"`` (and
    ``"answer_tag"``, its tag read as a box by :func:`read_part`): math-verify reads only the response's complete
    boxes (:func:`boxed_answers`)."""
    from math_verify import parse, verify

    _quiet_math_verify()
    response, answer = normalize_math_text(response), normalize_math_text(answer)
    try:
        gold = _parse_gold(answer)
    except ItemTimeout:
        raise
    except Exception:
        return ScoredItem(0.0, GOLD_ERROR)
    if not gold:
        return ScoredItem(0.0, GOLD_ERROR)
    gold_cfg, pred_cfg = _configs()
    if extraction in AFTER_THINK:
        boxes = list(dict.fromkeys(box_list(response)))  # distinct, in order
        if not boxes:
            return ScoredItem(0.0, NO_ANSWER)
        if len(boxes) > 1:  # a box that alone is the gold: paid only when every box is (else a hedge)
            alone = [_verifies(gold, box, gold_cfg) for box in boxes]
            if any(alone):
                return ScoredItem(1.0 if all(alone) else 0.0, OK)
        response, pred_cfg = " ".join(boxes), gold_cfg
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


def _verifies(gold, box: str, cfg) -> bool:
    """Whether the one box ``box`` (``"\\boxed{...}"``) alone verifies against the parsed ``gold``."""
    from math_verify import parse, verify

    try:
        pred = parse(box, cfg, parsing_timeout=None)
        return bool(pred) and verify(gold, pred, 6, timeout_seconds=None)
    except ItemTimeout:
        raise
    except Exception:
        return False


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


def gold_text(answer) -> str:
    """The gold ``answer`` as the text the verifier reads: a string as it is; an integer in digits; a fraction
    as ``p/q``; a float or a ``Decimal`` positional, in the shortest digits that round-trip (``1e-05`` ->
    ``"0.00001"``, ``1e16`` -> ``"10000000000000000"``: math-verify reads the ``e`` of ``str(1e-05)`` as Euler's
    number, so ``\\boxed{e-5}`` paid and ``\\boxed{0.00001}`` did not). A bool, None, a list or a NaN is a
    ValueError: no gold."""
    if isinstance(answer, str):
        return answer
    if isinstance(answer, bool) or answer is None or not isinstance(answer, numbers.Number):
        raise ValueError(f"a gold answer must be a string or a number, got {answer!r}")
    if isinstance(answer, numbers.Integral):
        return str(int(answer))
    if isinstance(answer, numbers.Rational):  # a Fraction: exact, as p/q
        return f"{answer.numerator}/{answer.denominator}" if answer.denominator != 1 else str(answer.numerator)
    try:  # str: a numpy float32's own shortest digits (0.1, not float(0.1f)'s 0.10000000149011612)
        value = answer if isinstance(answer, Decimal) else Decimal(str(answer))
    except ArithmeticError:
        raise ValueError(f"a gold answer must be a real number, got {answer!r}") from None
    if not value.is_finite():
        raise ValueError(f"a gold answer must be a finite number, got {answer!r}")
    text = format(value.normalize(), "f")  # (positional: 1E+2 -> 100)
    return "0" if text == "-0" else text


def check_extraction(extraction) -> str:
    if extraction not in EXTRACTIONS:
        raise ValueError(f"extraction must be one of {EXTRACTIONS}, got {extraction!r}")
    return extraction


def score_item(response: str, answer: str, time_limit: float | None = DEFAULT_TIME_LIMIT,
               extraction: str = "reference") -> ScoredItem:
    """Scores one response with a status. Never raises on model output (an unknown ``extraction``, or an
    ``answer`` that is no gold, see :func:`gold_text`: a ValueError). ``extraction``: ``"reference"`` |
    ``"boxed"`` | ``"answer_tag"`` (module docstring).

    ``time_limit`` (seconds, float) is enforced with ``signal.setitimer`` when called from the main
    thread; from another thread (or with ``None``) the item runs without a limit. Items the exact
    fast path decides (see the module docstring) return at once. Otherwise the first call of a
    process first runs :func:`warm_up` (math-verify's import) outside the limit. The caller's
    SIGALRM handler and timer are restored afterwards. A ``time_limit`` above :data:`MAX_TIME_LIMIT`
    is a ValueError (1e10 s overflowed the timer, and every item scored 0 as an error).
    """
    check_extraction(extraction)
    check_time_limit(time_limit)
    if not isinstance(response, str):
        return ScoredItem(0.0, ERROR)
    answer = gold_text(answer)
    response = read_part(response, extraction)
    fast = _fast_score(response, answer)  # exact, microseconds: no import, no alarm
    if fast is not None:
        return fast
    warm_up()  # the one-time import cost, outside the time limit
    return run_limited(lambda: _score_unlimited(response, answer, extraction), time_limit,
                       on_timeout=ScoredItem(0.0, TIMEOUT), on_error=ScoredItem(0.0, ERROR))


def math_reward(response: str, answer: str | float, *, time_limit: float | None = DEFAULT_TIME_LIMIT,
                extraction: str = "reference") -> float:
    """1.0 if ``response`` states an answer equivalent to ``answer`` (gold: LaTeX, or a number), else 0.0.

    The PACS reference semantics (see the module docstring); ``extraction="boxed"`` reads only the
    response's complete ``\\boxed{}``, ``"answer_tag"`` its last ``<answer>...</answer>``. Never raises on model
    output: parse errors, timeouts and garbage all score 0.0.

    >>> math_reward("... so the answer is $\\\\boxed{0.5}$.", "\\\\frac{1}{2}")
    1.0
    """
    return score_item(response, answer, time_limit, extraction).score


def gold_parses(answer: str) -> bool:
    """True when the gold ``answer`` parses (the check every shipped benchmark passes)."""
    _quiet_math_verify()
    try:
        return bool(_parse_gold(normalize_math_text(gold_text(answer))))
    except Exception:
        return False
