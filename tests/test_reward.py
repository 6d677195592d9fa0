"""The math verifier: the equivalences the paper's data needs, non-equivalences, hostile inputs."""
import random
import threading
import time
from fractions import Fraction

import pytest

from pacs_fast.reward import BatchScorer, gold_parses, math_reward, score_batch, score_item
from pacs_fast.reward.verifier import ERROR, NO_ANSWER, OK, TIMEOUT

EQUIVALENT = [
    # (response, gold)
    ("so the answer is $\\boxed{0.5}$", "\\frac{1}{2}"),         # fraction vs decimal
    ("$\\boxed{\\frac{1}{2}}$", "0.5"),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34"),                       # \dfrac, \frac34
    ("\\boxed{\\tfrac{3}{4}}", "\\dfrac{3}{4}"),
    ("\\boxed{[2,5)}", "[2,5)"),                                  # intervals
    ("\\boxed{(-\\infty, 3]}", "(-\\infty,3]"),
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}"),                          # sets (order-free)
    ("\\boxed{90^\\circ}", "90"),                                 # degrees
    ("\\boxed{90}", "90^\\circ"),
    ("\\boxed{50\\%}", "50"),                                     # percent
    ("\\boxed{\\text{Monday}}", "\\text{Monday}"),                # text answers
    ("\\boxed{1,000}", "1000"),                                   # thousands separator
    ("\\boxed{1000}", "1,000"),
    ("The final answer is 27", "27.0"),                           # AMC "27" vs "27.0"
    ("\\boxed{27.0}", "27"),
    ("\\boxed{27}", "27.0"),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
    ("\\boxed{864}", "864 \\mbox{ inches}^2"),                    # MATH-500 answer with units
    ("Thus $x = \\boxed{-\\frac{7}{3}}$.", "-\\frac73"),
    ("\\boxed{5} and \\boxed{6}", "5, 6"),                         # several boxed answers form a set
]

NOT_EQUIVALENT = [
    ("\\boxed{0.51}", "\\frac{1}{2}"),
    ("\\boxed{28}", "27"),
    ("\\boxed{(2,5]}", "[2,5)"),
    ("\\boxed{\\{1,3\\}}", "\\{1,2\\}"),
    ("\\boxed{\\text{Tuesday}}", "\\text{Monday}"),
    ("\\boxed{\\sqrt{2}}", "2"),
    ("\\boxed{x+1}", "x-1"),
    ("\\boxed{5}, then \\boxed{6}", "5"),                          # ... so one of them is not enough
    ("I do not know.", "27"),
    ("", "27"),
]


@pytest.fixture(scope="module")
def scorer():
    """For correctness: a limit no well-formed item reaches, even on a loaded machine."""
    with BatchScorer(num_workers=2, time_limit=10.0, grace=1.0) as s:
        yield s


@pytest.fixture(scope="module")
def strict_scorer():
    with BatchScorer(num_workers=2, time_limit=1.0, grace=0.5) as s:
        yield s


@pytest.mark.parametrize("response,gold", EQUIVALENT)
def test_equivalent(response, gold):
    assert math_reward(response, gold) == 1.0


@pytest.mark.parametrize("response,gold", NOT_EQUIVALENT)
def test_not_equivalent(response, gold):
    assert math_reward(response, gold) == 0.0


def test_random_numbers(seed):
    rng = random.Random(seed)
    for _ in range(20):
        p, q = rng.randint(-999, 999), rng.choice([2, 4, 5, 8, 10, 20, 25])
        f = Fraction(p, q)
        decimal = f"{float(f):.6f}".rstrip("0").rstrip(".")
        gold = f"\\frac{{{f.numerator}}}{{{f.denominator}}}" if f.denominator != 1 else str(f.numerator)
        if f.numerator < 0 and f.denominator != 1:
            gold = f"-\\frac{{{-f.numerator}}}{{{f.denominator}}}"
        assert math_reward(f"\\boxed{{{decimal}}}", gold) == 1.0, (decimal, gold)
        assert math_reward(f"\\boxed{{{decimal}1}}", gold) == 0.0, (decimal, gold)
        n = rng.randint(1000, 10**7)
        assert math_reward(f"The answer is $\\boxed{{{n:,}}}$.", str(n)) == 1.0
        assert math_reward(f"\\boxed{{{n + rng.randint(1, 9)}}}", str(n)) == 0.0


def test_never_raises_and_statuses():
    assert math_reward(None, "1") == 0.0
    assert math_reward(12, "12") == 0.0  # not a string: scored 0, no exception
    assert score_item("no numbers here", "1").status == NO_ANSWER
    assert score_item("\\boxed{1}", "1").status == OK
    assert gold_parses("\\frac{1}{2}") and not gold_parses("")


def test_works_outside_the_main_thread():
    out = []
    t = threading.Thread(target=lambda: out.append(math_reward("\\boxed{\\frac{2}{4}}", "0.5")))
    t.start()
    t.join(30)
    assert out == [1.0]


def test_batch_matches_single_calls(scorer):
    cases = EQUIVALENT + NOT_EQUIVALENT
    res = scorer.score([r for r, _ in cases], [g for _, g in cases])
    assert res.scores == [math_reward(r, g) for r, g in cases]
    assert sum(res.counts.values()) == len(cases)
    assert res.counts[NO_ANSWER] == res.num_parse_failures >= 2  # "I do not know." and ""
    # one answer for all responses, and an empty batch
    res = scorer.score(["\\boxed{3}", "\\boxed{4}", "3"], "3")
    assert res.scores == [1.0, 0.0, 1.0]
    assert scorer.score([], []).scores == []
    with pytest.raises(ValueError, match="answers"):
        scorer.score(["a", "b"], ["1"])


def test_batch_many_items_in_order(scorer, seed):
    rng = random.Random(seed)
    golds = [str(rng.randint(0, 999)) for _ in range(300)]
    right = [rng.random() < 0.5 for _ in golds]
    fmt = ["\\boxed{{{}}}", "\\boxed{{{}.0}}"]  # integer fast path (parent) / math-verify (workers)
    responses = [rng.choice(fmt).format(g if ok else int(g) + 1) for g, ok in zip(golds, right)]
    done = []
    res = scorer.score(responses, golds, callback=done.append)
    assert res.scores == [1.0 if ok else 0.0 for ok in right]
    assert done[-1] == len(golds)


HOSTILE = [
    "\\boxed{10^{10^{10}}}",
    "The answer is 10**10**10",
    "{" * 1_000_000,
    "\\boxed{" + "{" * 1_000_000 + "}",
    "\\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}",
    "\\boxed{" + "\\frac{1}{" * 2000 + "2" + "}" * 2000 + "}",
    "\\boxed{100000000!}",
]


def test_hostile_inputs_are_bounded(strict_scorer):
    scorer = strict_scorer
    responses = HOSTILE + ["\\boxed{7}"]
    t0 = time.monotonic()
    res = scorer.score(responses, "7")
    elapsed = time.monotonic() - t0
    assert res.scores[:-1] == [0.0] * len(HOSTILE)
    assert res.scores[-1] == 1.0 or res.statuses[-1] == TIMEOUT  # (only a starved machine times it out)
    assert all(s in (TIMEOUT, NO_ANSWER, OK, ERROR) for s in res.statuses)
    # Contract: each item costs at most time_limit + grace; 2 workers share 8 items, plus slack for
    # a loaded machine and worker replacement.
    per_item = scorer.time_limit + scorer.grace
    assert elapsed < len(responses) / scorer.num_workers * per_item + 20, elapsed
    assert res.num_timeouts >= 1


def test_watchdog_kills_and_replaces_stuck_worker():
    """With the in-worker alarm off, only the parent's deadline can stop an item."""
    with BatchScorer(num_workers=1, time_limit=0.5, grace=0.5, worker_alarm=False) as s:
        t0 = time.monotonic()
        res = s.score(["\\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}", "\\boxed{2.0}", "\\boxed{3.0}"], "2")
        elapsed = time.monotonic() - t0
        assert res.statuses[0] == TIMEOUT and res.scores == [0.0, 1.0, 0.0]
        assert s.workers_replaced == 1
        assert elapsed < 1.0 + 20, elapsed  # limit + grace, plus a replacement's start-up and slack


def test_score_batch_shared_pool():
    res = score_batch(["\\boxed{\\frac{1}{3}}", "0.333"], "\\frac13", num_workers=1, time_limit=2.0)
    assert res.scores == [1.0, 0.0]


def test_a_number_gold_is_read_as_the_number_it_is(scorer):
    """A float gold was scored as ``str(float)``: ``1e-05`` reads as 1 times Euler's number minus 5 to
    math-verify, so ``\\boxed{0.00001}`` scored 0 and ``\\boxed{e-5}`` scored 1 (hostile sweep, 2026-11-30);
    now numbers are written out in full, in every scoring entry point; a gold that is no answer is refused."""
    import numpy as np

    for gold, right, wrong in ((1e-5, "0.00001", "e-5"), (1e16, "10000000000000000", "e+16"),
                               (1e20, "100000000000000000000", "e+20"), (np.float32(0.1), "0.1", "0.2"),
                               (Fraction(1, 4), "0.25", "e/4"), (Fraction(1, 3), "\\frac{1}{3}", "0.333"),
                               (Fraction(4, 2), "2", "4/2+1"), (np.int64(12), "12", "13")):
        assert math_reward(f"\\boxed{{{right}}}", gold) == 1.0, gold
        assert math_reward(f"\\boxed{{{wrong}}}", gold) == 0.0, gold
        assert scorer.score([f"\\boxed{{{right}}}", f"\\boxed{{{wrong}}}"], [gold, gold]).scores == [1.0, 0.0]
        assert scorer.score([f"\\boxed{{{right}}}"], gold).scores == [1.0]  # one gold for all
    for bad in (True, None, [2], float("nan")):
        with pytest.raises(ValueError, match="gold answer must be a"):
            math_reward("\\boxed{2}", bad)
        with pytest.raises(ValueError, match="gold answer must be a"):
            scorer.score(["\\boxed{2}"], [bad])


def test_bad_arguments():
    with pytest.raises(ValueError, match="time_limit"):
        BatchScorer(1, time_limit=0)
    with pytest.raises(ValueError, match="num_workers"):
        BatchScorer(-1)


def test_callers_alarm_survives():
    """A timer the caller armed (pytest-timeout's, say) is still pending after a scored item."""
    import signal

    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        assert math_reward("\\boxed{2}", "2") == 1.0
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining < 30.0 and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_crashed_worker_is_replaced():
    """A worker that dies mid-item (segfault, OOM kill) costs that item an 'error', nothing more."""
    import os
    import signal

    with BatchScorer(num_workers=1, time_limit=60.0) as s:
        assert s.score(["\\boxed{1.0}"], "1").scores == [1.0]  # the worker is up (".0": not the fast path)
        pid = s._workers[0].proc.pid
        killer = threading.Timer(0.5, os.kill, (pid, signal.SIGKILL))
        killer.start()
        res = s.score(["\\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}", "\\boxed{2.0}"], "2")
        killer.join()
        assert res.statuses[0] == ERROR and res.scores == [0.0, 1.0]
        assert s.workers_replaced == 1
