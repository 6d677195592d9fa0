"""The verifier's integer fast path agrees with math-verify wherever it fires, and fires on the common forms."""
import random
import subprocess
import sys

import pytest

from pacs_fast.reward import BatchScorer, score_item
from pacs_fast.reward.verifier import OK, ScoredItem, _fast_integer_score, _score_math_verify, _score_unlimited

# Pieces of text around the box: words, numbers, the anchors math-verify ranks above or beside
# \boxed ("final answer ... is", "answer:"), LaTeX environments, braces, percent markers.
_PIECES = [
    "so", "the answer", "Answer:", "answer: 7", "We get", "x =", "=", " ", "  ", "\n", "\n\n", ".", ",", ":", "**",
    "1", "42", "-3", "0.5", "1,000", "12 percent", "3/4", "2+2", "$7$", "$x=9$", "\\(8\\)", "\\[6\\]", "$$10$$",
    "$", "$$", "\\[", "\\]", "\\(", "\\)", "[", "]", " [", "] ", "{", "}", "\\{", "\\}", "%", "\\%", "percent",
    "Percentage", "pct", "\\frac{1}{2}", "\\sqrt{2}", "\\text{cm}", "and", "or", "I hope", "Final Answer",
    "**Final Answer**", "final answer is 6", "The final answer is", "FINAL ANSWER: the value is 11", "is",
    "final answer" + " " * 120 + "is", "Final answer:\n\n is", "final answerXis", "final" + "\n" * 3 + "answer is",
    "\\boxed", "\\boxed{3}", "\\fbox{2}", "\\\\", "\\", "\u0663", "\u00a0", "\t", "°", "\\circ", "^", "m",
]

# Wrappers around the box, eligible and near-eligible: {n} is the boxed number's text.
_BOXES = [
    "\\boxed{{{n}}}", "\\boxed{{{n}}}", "\\boxed{{{n}}}", "\\boxed{{ {n} }}", "\\boxed{{\n{n}\n}}",
    "\\boxed{{\t{n}\r}}", "$\\boxed{{{n}}}$", "$$\\boxed{{{n}}}$$", "\\[\\boxed{{{n}}}\\]",
    "\\[\n\\boxed{{{n}}}\n\\]", "\\(\\boxed{{{n}}}\\)", " [\\boxed{{{n}}}] ", "$x = \\boxed{{{n}}}$",
    "\\boxed {{{n}}}", "\\boxed{{{{{n}}}}}", "\\fbox{{{n}}}", "\\boxed{{{n}.0}}", "\\boxed{{{n}\\%}}",
    "\\boxed{{{n}}}\\%", "$\\boxed{{{n}}}$ percent", "\\boxed{{{n}}} and \\boxed{{{n}}}",
    "\\boxed{{{n}}}, \\boxed{{1}}", "\\boxed{{- {n}}}", "\\boxed{{{n}\u00a0}}", "\\boxed{{{n}^\\circ}}", "\\boxed{{{n}",
    "\\boxed{{x={n}}}", "\\boxed{{{n}}}}}", "\\boxed{{\\{{{n}\\}}}}",
]


def _random_int_text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.6:
        v = rng.randint(-50, 1000)
    elif kind < 0.9:
        v = rng.randint(-10**12, 10**12)
    else:
        v = rng.randint(-10**31, 10**31)  # around the 30-digit cap
    text = str(v)
    if rng.random() < 0.15:  # leading zeros
        sign, digits = ("-", text[1:]) if text.startswith("-") else ("", text)
        text = sign + "0" * rng.randint(1, 3) + digits
    if rng.random() < 0.1 and not text.startswith("-"):
        text = "+" + text
    if rng.random() < 0.05:
        text = "-0"
    return text


def _near(rng: random.Random, gold_text: str) -> str:
    """A number text equal or close to the gold's value (so that both scores occur)."""
    v = int(gold_text)
    kind = rng.random()
    if kind < 0.45:
        return str(v)
    if kind < 0.55:
        return "0" + str(v) if v >= 0 else "-0" + str(-v)
    if kind < 0.6:
        return "+" + str(v) if v >= 0 else str(v)
    if kind < 0.7:
        return str(-v)
    if kind < 0.8:
        return "\u0661\u0662" if rng.random() < 0.5 else str(v).replace("1", "\uff11")  # non-ASCII digits
    return str(v + rng.choice([-10, -1, 1, 2, 100]))


def _random_case(rng: random.Random) -> tuple[str, str]:
    gold = _random_int_text(rng)
    r = rng.random()
    if r < 0.05:
        gold = rng.choice(["5.0", "\\frac{1}{2}", "1,000", "\u0665", "x", "", "10%", "1e3"])
        n = "5"
    else:
        n = _near(rng, gold)
    if rng.random() < 0.2:
        gold = rng.choice([" ", "\n", "\t", "\u00a0", ""]) + gold + rng.choice([" ", "\n", ""])
    box = rng.choice(_BOXES).format(n=n) if rng.random() < 0.97 else n  # sometimes no box at all
    prefix = "".join(rng.choice(_PIECES) + rng.choice(["", " "]) for _ in range(rng.randint(0, 6)))
    suffix = "".join(rng.choice(_PIECES) + rng.choice(["", " "]) for _ in range(rng.randint(0, 3)))
    if rng.random() < 0.4:
        suffix = rng.choice(["", ".", "$.", " and that is it.", "\n"])
    return prefix + box + suffix, gold


def test_differential_against_math_verify(seed):
    """Wherever the fast path fires, it equals math-verify's result exactly."""
    rng = random.Random(seed)
    fired = {0.0: 0, 1.0: 0}
    n_cases = 3000
    for _ in range(n_cases):
        response, gold = _random_case(rng)
        fast = _fast_integer_score(response, gold)
        if fast is None:
            continue
        ref = _score_math_verify(response, gold)
        assert fast == ref, (response, gold, fast, ref)
        fired[fast.score] += 1
    # The test would pass vacuously if the fast path never fired: make sure it fired often, both ways.
    assert fired[1.0] >= n_cases // 50 and fired[0.0] >= n_cases // 50, fired


def test_final_answer_anchor_regex_covers_math_verifys(seed):
    """The linear-time anchor check finds every string math-verify's anchors find (it is exactly the
    backtracking form with a case-insensitive "is", a superset)."""
    import re

    from pacs_fast.reward.verifier import _FINAL_ANSWER_RE

    # math_verify.parser: priority 0 (prefix of) and priority 50 anchors
    anchors = [re.compile(r"(?i:final answer is)", re.DOTALL),
               re.compile(r"(?i:final answer.{0,100}?)\s+is", re.DOTALL),
               re.compile(r"(?i:final answer.{0,100}?)\s+is")]
    backtracking = re.compile(r"final answer.{0,100}?\s+is", re.IGNORECASE | re.DOTALL)
    rng = random.Random(seed)
    pieces = ["final answer", "FINAL ANSWER", "Final Answer", "final", "answer", " ", "  ", "\n", "\t", "\u00a0",
              "is", "IS", "iS", "x", "ab", ":", "**", "a" * 40, "b" * 90, " " * 30, "\u0130s", "\u0131s"]
    hits = 0
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        found = _FINAL_ANSWER_RE.search(text) is not None
        assert found == (backtracking.search(text) is not None), text
        if any(a.search(text) for a in anchors):
            assert found, text
        hits += found
    assert 100 < hits < 2900, hits


def _typical(rng: random.Random, gold: int, correct: bool) -> str:
    n = gold if correct else gold + rng.choice([-2, -1, 1, 3])
    steps = " ".join(f"Step {k}: {rng.randint(1, 99)} + {rng.randint(1, 99)} = ${rng.randint(2, 198)}$."
                     for k in range(rng.randint(0, 5)))
    return rng.choice([
        f"\\boxed{{{n}}}",
        f"{steps} So the answer is $\\boxed{{{n}}}$.",
        f"{steps}\n\n**Final Answer**\n\\[\n\\boxed{{{n}}}\n\\]",
        f"{steps} Therefore \\( x = \\boxed{{{n}}} \\)",
        f"{steps} The answer: \\boxed{{ {n} }}.",
    ])


def test_fires_on_typical_forms(seed):
    rng = random.Random(seed)
    for _ in range(60):
        gold = rng.randint(-10**6, 10**6)
        correct = rng.random() < 0.5
        response = _typical(rng, gold, correct)
        fast = _fast_integer_score(response, str(gold))
        assert fast is not None, response
        assert fast == ScoredItem(1.0 if correct else 0.0, OK) == _score_math_verify(response, str(gold)), response
        assert score_item(response, str(gold)) == fast == _score_unlimited(response, str(gold))


# (response, gold, the fast path's score or None where it must fall through); math-verify must agree.
EDGE_CASES = [
    ("\\boxed{85}", "85", 1.0),
    ("\\boxed{007}", "7", 1.0),                      # leading zeros: math-verify reads 7
    ("\\boxed{7}", "007", 1.0),
    ("\\boxed{+5}", "5", 1.0),
    ("\\boxed{5}", "+5", 1.0),
    ("\\boxed{-0}", "0", 1.0),
    ("\\boxed{-5}", "5", 0.0),
    ("\\boxed{ 5 }", "5", 1.0),                      # whitespace inside the braces
    ("\\boxed{\n5\n}", " 5\n", 1.0),
    ("\\boxed{5}. Then 6 and 7 follow.", "5", 1.0),  # numbers after the box do not matter
    ("We compute 6 and 7, answer: 8. $\\boxed{5}$", "5", 1.0),
    ("**Final Answer**\n\\[\n\\boxed{85}\n\\]", "85", 1.0),  # "final answer" without "is"
    ("$x = 3 + \\boxed{5}$", "5", 1.0),
    ("\\boxed{5}}", "5", 1.0),
    ("\\boxed{" + "9" * 30 + "}", "9" * 29 + "8", 0.0),   # large integers compare exactly
    ("\\boxed{" + "9" * 30 + "}", "9" * 30, 1.0),
    ("The final answer is 6. \\boxed{5}", "5", None),     # a "final answer ... is" anchor
    ("\\boxed{5}. The final answer is 6", "5", None),
    ("\\boxed {5}", "5", None),                           # math-verify finds no box here
    ("\\boxed{{5}}", "5", None),                          # a set {5}
    ("\\fbox{5}", "5", None),
    ("\\boxed{5} \\fbox{6}", "5", None),
    ("\\boxed{5} and \\boxed{6}", "5", None),             # several boxes form a set
    ("\\boxed{5}, then \\boxed{5}", "5", None),
    ("$\\boxed{5}$%", "5", None),                         # a percentage
    ("$\\boxed{5}$ percent", "5", None),
    ("\\boxed{\u0661\u0662}", "12", None),                # Arabic-Indic digits: the second try, on normalised text
    ("\\boxed{12}", "\u0661\u0662", None),
    ("\\boxed{1" + "0" * 30 + "}", "1" + "0" * 30, None),  # over the 30-digit cap
    ("\\boxed{- 5}", "-5", None),
    ("\\boxed{5.0}", "5", None),
    ("\\boxed{5}", "5.0", None),
    ("\\boxed{5\u00a0}", "5", None),                      # non-ASCII whitespace
    ("no box, just 5", "5", None),
]


@pytest.mark.parametrize("response,gold,expected", EDGE_CASES)
def test_edge_cases(response, gold, expected):
    fast = _fast_integer_score(response, gold)
    if expected is None:
        assert fast is None
    else:
        assert fast == ScoredItem(expected, OK) == _score_math_verify(response, gold)


def test_not_strings_fall_through():
    assert _fast_integer_score(None, "5") is None
    assert _fast_integer_score("\\boxed{5}", 5) is None
    assert score_item("\\boxed{5}", 5).score == 1.0  # score_item turns the answer into a string


def test_fast_path_needs_no_math_verify_import():
    code = ("import sys; from pacs_fast.reward.verifier import score_item; "
            "assert score_item('x \\\\boxed{12} y', '12').score == 1.0; "
            "assert score_item('\\\\boxed{13}', '12').score == 0.0; "
            "assert 'math_verify' not in sys.modules and 'sympy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_batch_scorer_scores_fast_items_in_the_parent(seed):
    rng = random.Random(seed)
    golds = [rng.randint(0, 999) for _ in range(40)]
    right = [rng.random() < 0.5 for _ in golds]
    responses = [_typical(rng, g, ok) for g, ok in zip(golds, right)]
    with BatchScorer(num_workers=2, time_limit=10.0) as scorer:
        done = []
        res = scorer.score(responses, [str(g) for g in golds], callback=done.append)
        assert res.scores == [1.0 if ok else 0.0 for ok in right]
        assert scorer._workers == []  # no worker was started for fast items
        assert done == list(range(1, len(golds) + 1))
        # mixed with items only math-verify decides: order and progress stay right
        slow = [rng.random() < 0.3 for _ in golds]
        mixed = [f"\\boxed{{{g if ok else g + 1}.0}}" if s else r
                 for g, ok, s, r in zip(golds, right, slow, responses)]
        done.clear()
        res = scorer.score(mixed, [str(g) for g in golds], callback=done.append)
        assert res.scores == [1.0 if ok else 0.0 for ok in right]
        assert sorted(done) == done and done[-1] == len(golds)
        assert res.counts[OK] == len(golds)
