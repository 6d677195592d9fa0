"""A minus sign written as an en / figure dash or a full-width or small hyphen-minus before a fraction, a root, pi or
infinity (``\\boxed{–\\frac{1}{2}}``): the verifier normalised such a dash to ``-`` before digits only, and
math-verify drops it, so the answer lost its sign: paid for a gold ``\\frac{1}{2}`` (a wrong answer marked right,
in eval's pass@k and the trainer's reward) and not for the gold ``-\\frac{1}{2}`` (sweep of the eval CLI)."""
import pytest

from pacs_fast.reward.answers import extract_answer, same_answer
from pacs_fast.reward.verifier import normalize_math_text, score_item

DASHES = ["\u2013", "\u2012", "\ufe63", "\uff0d"]
VALUES = ["\\frac{1}{2}", "\\dfrac{1}{2}", "\\tfrac12", "\\sqrt{2}", "\\pi", "\\infty"]


@pytest.mark.parametrize("dash", DASHES)
@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize("template", ["\\boxed{%s}", "So the answer is $\\boxed{%s}$.", "The final answer is $%s$."])
def test_a_dash_before_a_latex_number_is_a_minus(dash, value, template):
    response = template % (dash + value)
    assert score_item(response, value).score == 0.0  # the positive gold: a wrong sign (it had scored 1)
    assert score_item(response, "-" + value).score == 1.0
    assert score_item(response, "-" + value, extraction="boxed").score == float("boxed" in template)
    answer = extract_answer(response)  # maj@k votes with the same sign
    assert answer is not None and same_answer(answer, "-" + value) and not same_answer(answer, value)


def test_ranges_and_words_are_left_alone():
    assert normalize_math_text("pages 3\u20135, x = \u2013\\frac{1}{2}") == "pages 3\u20135, x = -\\frac{1}{2}"
    assert normalize_math_text("3\u2013\\frac12") == "3\u2013\\frac12"       # right after a number: a range
    assert normalize_math_text("\u2013\\pix \u2013\\fracture") == "\u2013\\pix \u2013\\fracture"  # other commands
    text = normalize_math_text("\\boxed{\u2013 \\sqrt{3}}")
    assert text == "\\boxed{- \\sqrt{3}}" and normalize_math_text(text) == text  # idempotent
