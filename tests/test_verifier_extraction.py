"""``extraction="boxed"`` (``reward.extraction``, ``eval --extraction``): only complete ``\\boxed{}`` answers
are read. The reference extraction (PACS's, math-verify's own) pays responses that never state an answer:
an unfinished one (the last number in the text), a hedge or a negation after "the answer is", a box cut off
by the token limit. Measured on the shipped sets' reference solutions cut at 80% of the text before their
answer (first 1,500 of each): 16.7% of gsm8k's and 6.5% of math_train's score 1 under the reference, 0% and
2.1% under boxed (README, "Reward"). Also the written
forms math-verify misses (``\\boxed{12.}``, an en dash for a minus, ``90°``), now normalised in both modes."""
import json

import pytest

from pacs_fast.reward import BatchScorer, boxed_answers, math_reward, score_item
from pacs_fast.reward.verifier import NO_ANSWER, OK

# (response, gold): no answer is stated, or a wrong one; the reference pays each of them
UNEARNED = [
    ("Let me compute. First, 2+3 = 5. Then we multiply by", "5"),          # unfinished: the last number
    ("There are 12 edges, then", "12"),
    ("The answer is not 5.", "5"),                                          # negation
    ("The answer is 5 or 6.", "5"),                                         # hedge
    ("The final answer is 2k+2", "2"),                                      # a leading number of an expression
    ("So \\boxed{\\frac{1}{2} + \\sqrt", "\\frac{1}{2}"),                   # a box cut off at the token limit
    ("\\boxed{6}. My final answer is $5$? No.", "5"),                       # a phrase outranking the box
]
EARNED = [
    ("so the answer is \\boxed{5}.", "5"),
    ("We get $\\boxed{\\dfrac{1}{2}}$", "0.5"),
    ("\\boxed{3} and \\boxed{5}", "3, 5"),                                  # several boxes: their set, as before
    ("the set is \\boxed{\\{1, 2\\}} done", "\\{1,2\\}"),                    # escaped braces inside a box
    ("\\boxed{12.}", "12"),                                                 # normalised (math-verify read none)
    ("\\boxed{\u20137}", "-7"),                                             # en dash as a minus
    ("\\boxed{90\u00b0}", "90"),                                            # a degree sign
]


@pytest.mark.parametrize("response,gold", UNEARNED)
def test_boxed_reads_no_unstated_answer(response, gold):
    from math_verify import parse, verify

    assert verify(parse("\\boxed{" + gold + "}"), parse(response))  # math-verify's own verdict: paid
    assert math_reward(response, gold) == 1.0  # the reference extraction is unchanged
    assert math_reward(response, gold, extraction="boxed") == 0.0


@pytest.mark.parametrize("response,gold", EARNED)
def test_both_extractions_pay_a_boxed_answer(response, gold):
    assert math_reward(response, gold) == 1.0
    assert math_reward(response, gold, extraction="boxed") == 1.0


def test_the_normalised_forms_were_missed_before():
    from math_verify import parse, verify

    for response, gold in EARNED[-3:]:
        assert not verify(parse("\\boxed{" + gold + "}"), parse(response)), response


def test_a_response_without_a_complete_box_has_no_answer():
    assert score_item("The answer is 5.", "5", extraction="boxed").status == NO_ANSWER
    assert boxed_answers("a \\boxed{1} b \\boxed{\\frac{1}{2}} c \\boxed{2 + \\sqrt") == "\\boxed{1} \\boxed{\\frac{1}{2}}"
    assert boxed_answers("\\boxed{" * 50_000) == ""  # open boxes: none, and no quadratic rescan
    with pytest.raises(ValueError, match="extraction must be one of"):
        score_item("x", "1", extraction="strict")


def test_a_time_limit_past_the_timer_is_refused():
    """1e10 s overflowed ``signal.setitimer`` inside the scoring try: every answer, right ones included,
    scored 0 with status "error" (inline) or the worker pool raised a traceback. Refused now; 1e6 s scores."""
    for call in (lambda: score_item("\\boxed{\\frac{1}{2}}", "0.5", time_limit=1e10),
                 lambda: BatchScorer(0, time_limit=1e10)):
        with pytest.raises(ValueError, match=r"time_limit must be in \[0, 1e\+06\] seconds"):
            call()
    assert score_item("\\boxed{\\frac{1}{2}}", "0.5", time_limit=1e6).score == 1.0


def test_shipped_golds_boxed_score_one_in_boxed_mode():
    """Every gold answer of the shipped benchmarks, boxed at the end of a response, is paid (a perfect model
    loses nothing to the stricter extraction). No time limit: under a loaded CI machine (the AVX2 emulation
    beside it) one item, ``(8,-2)``, took past the 5 s default once and scored 0; the extraction is what this
    checks."""
    from pacs_fast.data.datasets import shipped_path

    golds = []
    for name in ("aime2024", "aime2025", "amc23", "math500"):
        golds += [json.loads(line)["answer"] for line in open(shipped_path(name))]
    scores = [math_reward(f"... so the answer is \\boxed{{{g}}}.", g, extraction="boxed", time_limit=None)
              for g in golds]
    missed = [g for g, s in zip(golds, scores) if s != 1.0]
    assert len(golds) == 600 and not missed, missed[:10]


def test_worker_processes_score_as_inline():
    texts = [r for r, _ in UNEARNED + EARNED]
    golds = [g for _, g in UNEARNED + EARNED]
    with BatchScorer(num_workers=1, extraction="boxed") as pool:
        assert pool.score(texts, golds).scores == [0.0] * len(UNEARNED) + [1.0] * len(EARNED)


def test_the_trainer_and_its_config_pass_it_on():
    from pacs_fast.config import load_config, validate
    from pacs_fast.trainer.rewards import Scorer

    cfg = load_config(None, ["reward.extraction=boxed", "reward.time_limit_s=2.5"])
    scorer = Scorer.from_config(cfg)
    assert (scorer.batch.extraction, scorer.batch.time_limit) == ("boxed", 2.5)
    assert scorer.clean(["The answer is not 5.", "\\boxed{5}"], ["5", "5"]) == [0.0, 1.0]
    for bad, key in ((["reward.extraction=strict"], "reward.extraction"), (["reward.time_limit_s=0"],
                                                                          "reward.time_limit_s")):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            validate(load_config(None, bad), world=1)


def test_a_dash_between_numbers_stays_a_dash():
    from pacs_fast.reward.verifier import normalize_math_text

    assert normalize_math_text("pages 3\u20135, x = \u20132") == "pages 3\u20135, x = -2"  # a range; a minus sign


@pytest.mark.parametrize("response,gold,expected", [
    # the prompt's "within \\boxed{}" echoed inside <think> (R1 style): no box, not an empty answer
    ("<think>\nI need to put the answer in \\boxed{}. 2+3=5.\n</think>\n\nThe answer is $\\boxed{5}$.", "5", 1.0),
    # a hedge with units, each box in its own $...$: the boxes' join kept the first box only (paid)
    ("The answer is $\\boxed{15 \\text{ cm}}$ or $\\boxed{16 \\text{ cm}}$.", "15", 0.0),
    ("$\\boxed{\\frac{1}{2} \\text{ cm}}$, that is $\\boxed{0.5\\text{ cm}}$", "0.5", 1.0),  # every box is it
    ("$\\boxed{3}$. Wait, I erred: the answer is $\\boxed{5}$.", "5", 0.0),                   # both stated
    ("\\boxed{3} and \\boxed{5}", "3, 5", 1.0),                                              # parts of one answer
])
def test_boxed_mode_reads_each_box(response, gold, expected):
    """Scored on main c705990 under ``extraction="boxed"``: 0, 1, 0, 0, 1 (the first three wrong: the
    verifier helper's corpus, 750 + 561 + 561 items of those kinds). A box that alone is the gold pays only
    when every box does."""
    assert score_item(response, gold, extraction="boxed").score == expected


def test_an_empty_box_is_no_box():
    assert boxed_answers("\\boxed{} a \\boxed{ } b \\boxed{5}") == "\\boxed{5}"
    assert score_item("Put it in \\boxed{}.", "5", extraction="boxed").status == NO_ANSWER


def test_boxed_mode_reads_the_answer_after_the_thinking():
    """A reasoning model's boxes inside <think> are drafts: under ``extraction="boxed"`` only the boxes after the last
    </think> count (743 of 743 R1-style responses that boxed another intermediate value in <think> scored 0 with
    the every-box rule; verifier helper's corpus of 2026-12-03), and a response whose only box is inside <think>
    states no answer. The reference mode reads the whole text, as math-verify does. The worker scorer's fast path
    (run in the parent) reads the same part."""
    from pacs_fast.reward.answers import extract_answer

    draft = "<think>\nTry x = 2: \\boxed{4}? No, recheck: 2+3=5.\n</think>\n\nSo the answer is $\\boxed{5}$."
    only_in_think = "<think>\nIt is \\boxed{5}.\n</think>\n\nI am not sure."
    template_open = "x = 2: \\boxed{4}? no.\n</think>\nThe answer is \\boxed{5}."  # (<think> in the prompt)
    cases = [(draft, 1.0, OK), (only_in_think, 0.0, NO_ANSWER), (template_open, 1.0, OK)]
    for response, score, status in cases:
        item = score_item(response, "5", extraction="boxed")
        assert (item.score, item.status) == (score, status), response
    assert score_item(only_in_think, "5").score == 1.0  # the reference reads the thinking too
    with BatchScorer(num_workers=1, extraction="boxed") as scorer:
        got = scorer.score([r for r, _, _ in cases], ["5"] * len(cases))
    assert got.scores == [s for _, s, _ in cases] and got.statuses == [st for _, _, st in cases]
    assert [extract_answer(r, "boxed") for r, _, _ in cases] == ["5", None, "5"]


def test_boxed_mode_reads_no_draft_of_a_thinking_left_open():
    """A response cut inside its <think> (the length limit; Qwen3-style models write the <think> themselves) has only
    drafts: under ``extraction="boxed"`` it states no answer, as one whose only box is inside a closed <think>
    (before: its draft box was read, and paid). Text before the open <think> is still read."""
    from pacs_fast.reward.answers import extract_answer

    cut = "<think>\nTry x = 2: \\boxed{5}? recheck 2+3 ..."
    reopened = "<think>a</think>\n\\boxed{5}<think>\nwait, \\boxed{6}"
    for response, score, status, answer in [(cut, 0.0, NO_ANSWER, None), (reopened, 1.0, OK, "5")]:
        item = score_item(response, "5", extraction="boxed")
        assert (item.score, item.status) == (score, status), response
        assert extract_answer(response, "boxed") == answer
    assert score_item(cut, "5").score == 1.0  # the reference reads the thinking too
