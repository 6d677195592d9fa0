"""Hostile sweep of the user-supplied reward path (``reward.fn``, ``reward.appeal``, ``reward.step_rewards``,
``reward.user_fn_timeout_s``) of 2026-12-07.

Found and fixed (each case below failed before its fix):
- A ``reward.fn`` that changed the working directory (a judge that ``chdir``-s into a scratch folder) sent the run's
  later files (TensorBoard events, checkpoints) under the new folder when ``train.out_dir`` is relative: the run died
  with a FileNotFoundError traceback from TensorBoard's writer thread. The working directory is put back after
  every call of a user function (and after its module's import: a module that ``chdir``-s to its own folder when
  imported had put the run folder there). The run then trains exactly as with a pure function.
- ``torch.set_num_threads`` in a function's thread changed the count every thread started later takes (the next
  call's, an asynchronous run's); put back too.
- A module that installs a SIGTERM handler when imported replaced the trainer's (a scheduler's stop then ran the
  module's handler, not the run's clean stop); the handlers of SIGINT / SIGTERM / SIGHUP are put back after the
  import.
- ``reward.step_split`` holding a character that byte-level BPE splits over several tokens (``"。"``, ``"∴"`` under a
  Qwen2.5-shaped tokenizer) never matched: each token alone decodes to replacement characters, so every response
  was one step without a word.
- An exception without a message (a bare ``assert`` in the function) stopped the run with ``reward.fn raised
  AssertionError: ; no checkpoint ...``.

Checked and held: numpy / torch returns (arrays, scalars, bools) are read as numbers, and a generator, a dict, a
NaN, a None or a 2-D array is one line naming the key; the training does not read the global RNGs a function draws
from; a function's print goes to stdout and changes nothing.
"""
from __future__ import annotations

import json
import os
import random
import signal
import threading

import numpy as np
import pytest
import torch

from pacs_fast.trainer.step_credit import StepCredit
from pacs_fast.trainer.user_functions import UserFunctionError, call_with_time_limit, load_callable, user_rewards

from test_data_path_sweep import qwen_chatml_tokenizer
from test_run_safety import cache, cli  # noqa: F401  (fixture)
from test_train import TINY


def pure(problems, texts, answers):
    return [float(len(t) % 2 == 0) for t in texts]


def meddles(problems, texts, answers):
    """``pure``'s rewards, after changing what it can of the process: the working directory, torch's threads,
    the global RNGs; and a print."""
    random.random(), np.random.rand(), torch.rand(3)
    torch.set_num_threads(1)
    os.makedirs("scratch", exist_ok=True)
    os.chdir("scratch")
    print("judging", len(texts), "responses")
    return pure(problems, texts, answers)


def _records(folder):
    rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "wall"))} for r in rows]


def test_a_reward_fn_that_changes_the_process_trains_as_a_pure_one(tmp_path, cache, capsys,  # noqa: F811
                                                                    monkeypatch):
    monkeypatch.chdir(tmp_path)  # a relative train.out_dir, as a command line gives it
    threads = min(2, len(os.sched_getaffinity(0)))  # (fixed: a count chosen beside other jobs could differ)
    for name in ("pure", "meddles"):
        code, out, err = cli(TINY + [f"warmup.cache_dir={cache}", "train.out_dir=runs", f"train.run_name={name}",
                                     "train.steps=2", "train.save_every=1", f"train.threads={threads}",
                                     f"reward.fn=test_user_reward_sweep:{name}"], capsys)
        assert code == 0, err[-3000:]
        assert os.getcwd() == str(tmp_path)
    assert "judging" in out
    a, b = tmp_path / "runs" / "pure", tmp_path / "runs" / "meddles"
    saved = [sorted(p.name for p in (f / "checkpoints").iterdir()) for f in (a, b)]
    assert saved[0] == saved[1] and saved[0]  # (its checkpoints in its own folder, not under the new directory)
    assert not (tmp_path / "scratch" / "runs").exists()
    assert _records(a) == _records(b)  # the same training, metric for metric
    samples = [[{k: v for k, v in json.loads(x).items() if k != "time"} for x in (f / "samples.jsonl").read_text()
                .splitlines()] for f in (a, b)]
    assert samples[0] == samples[1]


def test_what_a_function_changes_is_put_back_after_each_call(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def chdir_then(result):
            def fn(*args, **kwargs):
                torch.set_num_threads(1)
                os.chdir("/")
                if isinstance(result, BaseException):
                    raise result
                return result
            return fn

        assert user_rewards(chdir_then([1.0, 0.0]), ["p", "q"], ["a", "b"], ["1", "2"], key="reward.fn",
                            timeout_s=5) == [1.0, 0.0]
        assert os.getcwd() == str(tmp_path)
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start(), t.join()
        assert torch.get_num_threads() == 2 and seen == [2]  # (a thread started later had taken the function's 1)
        with pytest.raises(UserFunctionError, match="reward.appeal raised RuntimeError: judge down"):
            call_with_time_limit(chdir_then(RuntimeError("judge down")), (), key="reward.appeal", timeout_s=5)
        assert os.getcwd() == str(tmp_path)
    finally:
        torch.set_num_threads(before)


def test_a_module_that_changes_the_process_when_imported_changes_nothing_of_the_run(tmp_path, monkeypatch):
    here = tmp_path / "work"
    here.mkdir()
    module = tmp_path / "lib"
    module.mkdir()
    (module / "sweep_moves_in.py").write_text(
        "import os, signal\n"
        "os.chdir(os.path.dirname(os.path.abspath(__file__)))  # (to read its own files by relative paths)\n"
        "signal.signal(signal.SIGTERM, lambda *a: None)\n"
        "def score(problems, responses, answers):\n    return [1.0] * len(responses)\n")
    monkeypatch.syspath_prepend(str(module))
    monkeypatch.chdir(here)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        fn = load_callable("sweep_moves_in:score", "reward.fn")
        assert fn([], ["x"], []) == [1.0]
        assert os.getcwd() == str(here)  # a relative train.out_dir stays where the command line gave it
        assert signal.getsignal(signal.SIGTERM) is handler  # the run's stop stays the run's
    finally:
        signal.signal(signal.SIGTERM, handler)


def _no_message(problems, texts, answers):
    raise AssertionError  # (a bare assert in the user's module; pytest rewrites this file's own)


def test_an_exception_without_a_message_is_one_clear_line():
    with pytest.raises(UserFunctionError) as e:
        user_rewards(_no_message, ["p"], ["a"], ["1"], key="reward.fn", timeout_s=5)
    assert str(e.value) == "reward.fn raised AssertionError (no message)"


def _steps_by_text(prompts, steps, answers):
    return [[0.0] * len(s) for s in steps]


@pytest.mark.parametrize("split,text,steps", [
    ("。", "第一步。第二步。答案5", ["第一步。", "第二步。", "答案5"]),  # (each character: 3 byte tokens here)
    ("∴", "a ∴ b ∴ c", ["a ∴", " b ∴", " c"]),
    ("\n\n", "日本 café.\n\n∑ is 5.\n\n\nAnswer: 5", ["日本 café.\n\n", "∑ is 5.\n\n", "\nAnswer: 5"]),  # (held)
    (". ", "One. Two. Three", ["One. ", "Two. ", "Three"]),  # (held)
])
def test_a_step_split_holding_a_character_bpe_splits_over_tokens_cuts_steps(split, text, steps):
    tok, im_end, _ = qwen_chatml_tokenizer()
    ids = tok.encode(text) + [im_end]
    credit = StepCredit(_steps_by_text, tok, split=split)
    ends, texts = credit.split_steps(ids)
    assert texts == steps
    assert ends[-1] == len(ids) and ends == sorted(set(ends))
    for end, step in zip(ends, steps):  # each step ends with the token that completes its last character
        assert tok.decode(ids[:end], skip_special_tokens=True).endswith(step)
        assert not tok.decode(ids[:end - 1], skip_special_tokens=True).endswith(step) or end == len(ids)


def _gen(problems, texts, answers):
    return (1.0 for _ in texts)


@pytest.mark.parametrize("value,expected", [
    (np.array([1, 0, 1], dtype=np.float32), [1.0, 0.0, 1.0]),
    ([np.float64(0.25), np.int64(1), np.bool_(False)], [0.25, 1.0, 0.0]),
    (torch.tensor([0.5, 1.0, 0.0]), [0.5, 1.0, 0.0]),
    ((True, False, True), [1.0, 0.0, 1.0]),
    ((x for x in [1.0] * 3), "reward.fn returned generator"),
    ({"a": 1.0, "b": 0.0, "c": 1.0}, "reward.fn returned dict"),
    (np.array([0.5, np.nan, 1.0]), "reward.fn returned a non-finite reward"),
    ([1.0, None, 0.0], "reward.fn returned [1.0, None, 0.0] for 3 responses: not a list of numbers"),
    ([1.0, -0.5, 0.0], "reward.fn returned -0.5 as the reward of response 1"),
    (np.ones((3, 1)), "reward.fn returned ndarray"),
    ([1.0, 1.0], "reward.fn returned 2 rewards for 3 responses"),
    (0.5, "reward.fn returned float 0.5"),
])
def test_returns_are_read_as_numbers_or_refused_in_one_line(value, expected):
    def fn(problems, texts, answers):
        return value
    args = (fn, ["p"] * 3, ["a", "b", "c"], ["1"] * 3)
    if isinstance(expected, list):
        assert user_rewards(*args, key="reward.fn", timeout_s=5) == expected
        return
    with pytest.raises(UserFunctionError) as e:
        user_rewards(*args, key="reward.fn", timeout_s=5)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value), str(e.value)
