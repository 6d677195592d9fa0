"""The built-in arithmetic task: disjoint deterministic splits, correct answers the verifier accepts."""
import random

import pytest

from pacs_fast.data.arithmetic import arithmetic_splits, make_problem


def test_splits_are_disjoint_deterministic_and_correct(seed):
    digits = random.Random(seed).choice([1, 2, 3])
    train, held = arithmetic_splits(300, 50, seed=seed, max_digits=digits, ops="+-*")
    again = arithmetic_splits(300, 50, seed=seed, max_digits=digits, ops="+-*")
    assert (train, held) == again
    assert len(held) == 50 and len({p["id"] for p in train}) == len(train)
    assert not {p["id"] for p in train} & {p["id"] for p in held}
    for p in train + held:
        a, op, b = next((p["problem"].partition(o) for o in "+-*" if o in p["problem"][1:]), None)
        assert int(p["answer"]) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert len(a) <= digits and len(b) <= digits
        assert p["prompt"] == p["problem"] + "=" and p["response"] == f"\\boxed{{{p['answer']}}}"
    other = arithmetic_splits(300, 50, seed=seed + 1, max_digits=digits, ops="+-*")
    assert other != (train, held)


def test_small_space_is_enumerated():
    train, held = arithmetic_splits(10_000, 20, seed=0, max_digits=1, ops="+")
    assert len(train) + len(held) == 100  # every 1-digit sum, each once


def test_verifier_accepts_reference_and_rejects_wrong(seed):
    from pacs_fast.reward import math_reward, score_item
    score_item("\\boxed{1}", "1", time_limit=None)  # the first call imports math-verify (slow): not under a limit
    rng = random.Random(seed)
    p = make_problem(rng.randint(0, 99), rng.choice("+-"), rng.randint(0, 99))
    assert math_reward(p["response"], p["answer"]) == 1.0
    assert math_reward(f"\\boxed{{{int(p['answer']) + 1}}}", p["answer"]) == 0.0


def test_two_step_problems(seed):
    from pacs_fast.data.arithmetic import evaluate_expression
    train, held = arithmetic_splits(200, 30, seed=seed, max_digits=2, ops="+-*", terms=3)
    assert not {p["id"] for p in train} & {p["id"] for p in held}
    for p in train + held:
        # Python's own arithmetic (same precedence) is the reference; only digits and + - * occur
        assert set(p["problem"]) <= set("0123456789+-*")
        assert int(p["answer"]) == eval(p["problem"])  # noqa: S307
        assert sum(p["problem"].count(o) for o in "+-*") == 2
    assert evaluate_expression([2, 3, 4], ["+", "*"]) == 14 and evaluate_expression([9, 3, 4], ["-", "-"]) == 2
    small_train, small_held = arithmetic_splits(10_000, 10, seed=seed, max_digits=1, ops="+", terms=3)
    assert len(small_train) + len(small_held) == 1000  # every 1-digit a+b+c, each once


def test_bad_arguments():
    with pytest.raises(ValueError, match="ops"):
        arithmetic_splits(10, 2, ops="/")
    with pytest.raises(ValueError, match="max_digits"):
        arithmetic_splits(10, 2, max_digits=0)
    with pytest.raises(ValueError, match="eval_size"):
        arithmetic_splits(10, 100, max_digits=1, ops="+")
    with pytest.raises(ValueError, match="terms"):
        arithmetic_splits(10, 2, terms=5)
