"""User functions the config names (reward.step_rewards, reward.appeal) run with a time limit and
their returns are checked by type (issue 23, finding 3): a hang, an exception, None, a string (never
iterated by character) or nested junk stops the run at step 1 with one line naming the key and the
step, exit 1, no checkpoint for the step."""
import time

import pytest

from pacs_fast.trainer.user_functions import UserFunctionError
from pacs_fast.trainer.user_functions import call_with_time_limit, checked_flags, checked_numbers

from test_run_safety import cache, cli  # noqa: F401  (fixture)
from test_train import TINY


def steps_hang(prompts, steps, answers):
    time.sleep(30)


def steps_raise(prompts, steps, answers):
    raise RuntimeError("boom")


def steps_none(prompts, steps, answers):
    return None


def steps_strings(prompts, steps, answers):
    return ["1" * len(s) for s in steps]  # one character per step: today parsed as numbers


def appeal_hang(texts, answers):
    time.sleep(30)


def appeal_raise(texts, answers):
    raise KeyError("judge")


def appeal_string(texts, answers):
    return "0" * len(texts)  # today: every "0" counted as an overturned verdict


def appeal_nested(texts, answers):
    return [[False]] * len(texts)


CASES = [
    ("step_rewards", "steps_hang", "reward.step_rewards did not return within 2 s (reward.user_fn_timeout_s)"),
    ("step_rewards", "steps_raise", "reward.step_rewards raised RuntimeError: boom"),
    ("step_rewards", "steps_none", "reward.step_rewards returned NoneType None for 16 responses: expected a list"),
    ("step_rewards", "steps_strings", "reward.step_rewards returned str '1"),
    ("appeal", "appeal_hang", "reward.appeal did not return within 2 s"),
    ("appeal", "appeal_raise", "reward.appeal raised KeyError: 'judge'"),
    ("appeal", "appeal_string", "reward.appeal returned str '0"),
    ("appeal", "appeal_nested", "reward.appeal returned [False] as the verdict of response 0"),
]


@pytest.mark.parametrize("key,fn,message", CASES, ids=[c[1] for c in CASES])
def test_a_misbehaving_user_function_stops_the_run_with_one_line(tmp_path, cache, capsys, key, fn, message):  # noqa: F811
    extra = ["algo.name=rloo"] if key == "step_rewards" else []
    t0 = time.perf_counter()
    code, _, err = cli(TINY + extra + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r",
                                       "train.steps=2", f"reward.{key}=test_user_functions:{fn}",
                                       "reward.user_fn_timeout_s=2"], capsys)
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]  # (progress bars aside)
    assert code == 1 and len(lines) == 1 and lines[0].startswith(f"error: step 1: {message}"), err
    assert err.strip().endswith(lines[0]) and "no checkpoint was written" in lines[0] and "Traceback" not in err
    assert not any((tmp_path / "r" / "checkpoints").glob("step_*"))
    if fn.endswith("hang"):
        assert time.perf_counter() - t0 < 25  # the run did not wait for the 30 s function


def test_checks_by_type():
    import numpy as np
    import torch

    assert checked_flags([True, 0, 1.0, np.bool_(False)], 4, key="k") == [True, False, True, False]
    assert checked_flags(np.array([1, 0]), 2, key="k") == [True, False]
    for bad, match in (("01", "returned str '01'"), (None, "returned NoneType"), ([2], "returned 2 as the verdict"),
                       (["1"], "returned '1' as the verdict"), ([True], "1 verdicts for 2 responses")):
        with pytest.raises(UserFunctionError, match=match):
            checked_flags(bad, 1 if match != "1 verdicts for 2 responses" else 2, key="k")
    assert checked_numbers((0.5, 1, True, torch.tensor(2.0)), key="k", what="w") == [0.5, 1.0, 1.0, 2.0]
    for bad in ("0.5", [float("nan")], [[1.0]], None, ["0.5"]):
        with pytest.raises(UserFunctionError):
            checked_numbers(bad, key="k", what="w")
    assert call_with_time_limit(lambda a, b: a + b, (1, 2), key="k", timeout_s=5) == 3
