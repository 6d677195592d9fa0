"""A hostile sweep of the math verifier (pacs_fast/reward/): responses written the way a reasoning model writes its
final answer, against real gold answers of the shipped sets, where our wrapping of math-verify (normalisation, box
handling) scored a right answer 0 or a wrong one 1 (``and`` / ``or`` / ``percent`` read as a unit word; ``\\boxed 6``
missed by the "boxed" extraction), and two cheap guards where math-verify itself misreads a common form (a choice
label before an AMC value; ``\\boxed 6`` outranked by an earlier draft box). Where it is the point of a case, it is
checked against math-verify called the way the PACS reference calls it (gold wrapped in ``\\boxed{}``, ``parse`` +
``verify``)."""
import pytest

from pacs_fast.reward import BatchScorer, math_reward
from pacs_fast.reward.answers import extract_answer
from pacs_fast.reward.verifier import _score_math_verify, normalize_math_text

EXTRACTIONS = ("reference", "boxed")


def _math_verify(response: str, gold: str) -> float:
    """The PACS reference reward: math-verify alone, no normalisation of ours."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    pred = parse(response, (ExprExtractionConfig(), LatexExtractionConfig()))
    return 1.0 if verify(parse("\\boxed{" + gold + "}", (LatexExtractionConfig(),)), pred, float_rounding=6) else 0.0


# A box ending in a bare "and" / "or" is an unfinished list ("5 and ..."), not the number with a unit word: math-verify
# reads the connective as a separator ("5,": no answer) and scores 0, but the per-box unit rule (boxes.py) dropped
# "\text{ and }" as if it were "\text{ cm}" and paid 1.
@pytest.mark.parametrize("response,gold", [
    ("so the answer is $\\boxed{5 \\text{ and }}$", "5"),
    ("\\boxed{5 \\text{ or }}", "5"),
    ("\\boxed{27\\text{ and}}", "27"),                       # amc23 #0's gold
    ("\\boxed{72 \\text{or}}", "72"),                        # gsm8k train-0's gold
    ("\\boxed{204_5 \\text{ and }}", "204_5"),               # math500's base-5 gold
])
@pytest.mark.parametrize("extraction", EXTRACTIONS)
def test_a_box_ending_in_and_or_is_no_answer(response, gold, extraction):
    assert math_reward(response, gold, extraction=extraction) == 0.0
    assert extract_answer(response, extraction) != gold


def test_and_or_in_a_box_is_read_as_math_verify_reads_it():
    for text in ("\\boxed{5 \\text{ and }}", "\\boxed{5 \\text{ or }}", "\\boxed{5\\text{and}}"):
        assert normalize_math_text(text) == text  # left for math-verify (its "and"/"or" are separators)
        assert _score_math_verify(text, "5").score == _math_verify(text, "5") == 0.0
    # a real unit word after the value is still dropped, per box (the rule's purpose)
    assert normalize_math_text("\\boxed{5 \\text{ cm}} or \\boxed{6 \\text{ cm}}") == "\\boxed{5} or \\boxed{6}"
    assert normalize_math_text("\\boxed{5 \\text{ and } 7}") == "\\boxed{5 \\text{ and } 7}"
    assert math_reward("\\boxed{5 \\text{ and } 7}", "5, 7") == 1.0
    assert math_reward("\\boxed{5 \\text{ and up}}", "5") == _math_verify("\\boxed{5 \\text{ and up}}", "5")


# "percent" spelled out in a box is the percent sign to math-verify (``5\text{percent}`` reads 5%, equal to a gold
# 0.05); the unit rule dropped it as a unit word and read 5, so a right answer scored 0. Now it is ``\%`` per box.
@pytest.mark.parametrize("response,gold,expected", [
    ("\\boxed{5\\text{percent}}", "0.05", 1.0),
    ("\\boxed{5 \\text{ percent}}", "0.05", 1.0),
    ("\\boxed{5 \\text{ percent}}", "5", 1.0),               # as math-verify reads 5\% against a gold 5
    ("\\boxed{6 \\text{ percent}}", "0.05", 0.0),
    ("\\boxed{5 \\text{ percent}} or \\boxed{6 \\text{ percent}}", "5", 0.0),   # a hedge stays a hedge
])
@pytest.mark.parametrize("extraction", EXTRACTIONS)
def test_percent_spelled_out_in_a_box_is_a_percent(response, gold, expected, extraction):
    assert math_reward(response, gold, extraction=extraction) == expected


# ``\boxed 6`` (TeX's one-token argument, no braces) is a box: math-verify reads it when it is the only one, but the
# "boxed" extraction read no box (no_answer, 0), and under the reference an earlier draft box outranked it.
DRAFT = "\\boxed{17}? No: that used the wrong formula. Redo it with the corrected count, 3 + 4 = 7 and 12 - 6 = 6, so "


@pytest.mark.parametrize("response,gold,expected", [
    ("The answer is \\boxed 6.", "6", 1.0),
    ("$\\boxed 6$", "6", 1.0),
    ("\\[\\boxed 45\\]", "45", 1.0),
    ("The answer is \\boxed -3.", "-3", 1.0),
    ("The answer is \\boxed 7.", "6", 0.0),
])
@pytest.mark.parametrize("extraction", EXTRACTIONS)
def test_a_box_without_braces_is_a_box(response, gold, expected, extraction):
    assert math_reward(response, gold, extraction=extraction) == expected


def test_a_box_without_braces_outranks_an_earlier_draft_box():
    # the reference reads the last box (the draft is more than 70 characters before it: not joined with it)
    assert math_reward(DRAFT + "\\boxed 6.", "6") == 1.0
    assert math_reward(DRAFT + "\\boxed 6.", "17") == 0.0
    # "boxed" pays a box that alone is the gold only when every box is (a correction scores 0: verifier docstring)
    assert math_reward(DRAFT + "\\boxed 6.", "6", extraction="boxed") == 0.0
    assert math_reward(DRAFT.replace("\\boxed{17}", "17") + "\\boxed 6.", "6", extraction="boxed") == 1.0


def test_a_box_without_braces_is_braced_only_around_a_whole_number():
    assert normalize_math_text("so \\boxed 6.") == "so \\boxed{6}."
    assert normalize_math_text("so \\boxed 1{,}000.") == "so \\boxed{1000}."
    for text in ("\\boxed 2^{10}", "\\boxed 1,000", "\\boxed 6\\sqrt{2}", "\\boxed 12 cm", "\\boxed 3.5x"):
        assert normalize_math_text(text) == text, text       # more follows: what was boxed is unclear, left alone
    for text in ("so \\boxed 6.", "\\boxed 1\\,000$", "\\boxed 6"):
        once = normalize_math_text(text)
        assert normalize_math_text(once) == once


# An AMC answer written with its choice label, ``\boxed{\textbf{(C)}\ 27}``: math-verify reads the label as a factor
# (c*27) and scores 0 against the gold 27. The label before a value is dropped.
@pytest.mark.parametrize("response,gold,expected", [
    ("The answer is $\\boxed{\\textbf{(C)}\\ 27}$", "27", 1.0),      # amc23 #0
    ("\\boxed{\\text{(B)} 36}", "36", 1.0),                          # amc23 #1
    ("\\boxed{(A)\\ \\frac{3}{56}}", "\\frac{3}{56}", 1.0),
    ("\\boxed{\\textbf{(E) }-50}", "-50", 1.0),
    ("\\boxed{\\text{(B)} 28}", "27", 0.0),
    ("\\boxed{\\textbf{(C)}}", "\\text{(C)}", 1.0),                  # a label alone is the answer (math500 golds)
    ("\\boxed{\\textbf{(D)}}", "\\text{(C)}", 0.0),
])
@pytest.mark.parametrize("extraction", EXTRACTIONS)
def test_a_choice_label_before_the_value(response, gold, expected, extraction):
    assert math_reward(response, gold, extraction=extraction) == expected


def test_a_choice_label_is_dropped_only_before_a_value():
    assert normalize_math_text("\\boxed{\\textbf{(C)}\\ 27}") == "\\boxed{27}"
    for text in ("\\boxed{\\textbf{(C)}}", "\\boxed{(A)+(B)}", "\\boxed{(F)\\ 27}", "\\boxed{x(A) 2}"):
        assert normalize_math_text(text) == text, text


def test_batch_scorer_agrees():
    responses = ["\\boxed{5 \\text{ and }}", "\\boxed{5\\text{percent}}", "The answer is \\boxed 6.",
                 "\\boxed{\\textbf{(C)}\\ 27}", "\\boxed{27 \\text{ cm}}"]
    golds = ["5", "0.05", "6", "27", "27"]
    expected = [0.0, 1.0, 1.0, 1.0, 1.0]
    for extraction in EXTRACTIONS:
        with BatchScorer(num_workers=1, time_limit=10.0, extraction=extraction) as scorer:
            assert scorer.score(responses, golds).scores == expected, extraction


def test_the_new_rules_are_idempotent(seed):
    import random

    rng = random.Random(seed)
    pieces = ["\\boxed", "\\boxed ", "\\boxed{", "\\fbox{", "}", "{", "1", "23", "456", "000", "{,}", "\\,", "~", ",",
              ".", " ", "$", "\\]", "\n", "-", "(C)", "\\textbf{(B)}", "\\text{(A) }", "\\ ", "\\quad", "\\text{ and }",
              "\\text{ or}", "\\text{percent}", "\\text{ cm}", "^2", "\\frac", "\\sqrt", "x", "\\%", "\\mbox{ pct}"]
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        once = normalize_math_text(text)
        assert normalize_math_text(once) == once, (text, once)
