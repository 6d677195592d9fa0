"""``reward.fn = "module:function"``: the user's reward, in [0, 1], in the math verifier's place for every
reward of a run (training, dynamic sampling, the held-out evaluation), for tasks math-verify cannot judge
(unit tests, a format, a judge). Checked before any model loads; a bad return stops the run with one line."""
import json
import time

import pytest

from pacs_fast.config import load_config
from pacs_fast.trainer.problems import check_gold_answers, load_problems
from pacs_fast.trainer.rewards import Scorer, user_rewards
from pacs_fast.trainer.user_functions import UserFunctionError

from test_run_safety import cache, cli  # noqa: F401  (fixture)
from test_train import TINY

CALLS: list[tuple[list, list, list]] = []


def even_length(problems, texts, answers):
    """Not the verifier's judgement: 1 for a response of even length (the test can tell which one ran)."""
    CALLS.append((list(problems), list(texts), list(answers)))
    return [float(len(t) % 2 == 0) for t in texts]


def soft_half(problems, texts, answers):
    return [0.5] * len(texts)


def too_large(problems, texts, answers):
    return [1.5] * len(texts)


def hangs(problems, texts, answers):
    time.sleep(30)


def test_the_users_function_scores_training_and_evaluation(tmp_path, cache, capsys):  # noqa: F811
    CALLS.clear()
    code, out, err = cli(TINY + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r",
                                 "train.steps=2", "rollout.filter_groups=true", "rollout.max_gen_batches=3",
                                 "reward.fn=test_user_reward:even_length"], capsys)
    assert code == 0, err
    assert CALLS, "reward.fn was never called"
    problems = {p for call in CALLS for p in call[0]}
    assert all("+" in p and "=" not in p for p in problems), problems  # the problem text, not the prompt
    for ps, texts, answers in CALLS:  # distinct (problem, response, answer) triples, aligned
        assert len(ps) == len(texts) == len(answers) and len(set(zip(ps, texts, answers))) == len(texts)
        assert all(str(eval(p)) == a for p, a in zip(ps, answers))  # each response's own problem and answer
    samples = [json.loads(x) for x in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    rows = [s for s in samples if "response" in s]
    assert rows and all(s["reward"] == float(len(s["response"]) % 2 == 0) for s in rows), rows[:3]
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/acc" in r]
    scored = [t for _, texts, _ in CALLS for t in texts]
    assert len(evals) == 2 and all(0 <= r["eval/acc"] <= 1 for r in evals)
    assert any(len(t) % 2 == 0 for t in scored) and any(len(t) % 2 for t in scored)
    assert "gold answers" not in err  # the verifier's gold check does not apply


def test_soft_rewards_train_and_are_their_mean(tmp_path, cache, capsys):  # noqa: F811
    code, _, err = cli(TINY + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r",
                               "train.steps=1", "reward.fn=test_user_reward:soft_half"], capsys)
    assert code == 0, err
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "reward/mean" in r)
    assert step["reward/mean"] == 0.5 and step["reward/acc"] == 0.0  # acc counts rewards > 0.5
    assert all(r["eval/acc"] == 0.5 for r in records if "eval/acc" in r)


@pytest.mark.parametrize("fn,message", [
    ("too_large", "error: step 0 (the held-out evaluation): reward.fn returned 1.5 as the reward of response 0"),
    ("hangs", "error: step 0 (the held-out evaluation): reward.fn did not return within 2 s"),
])
def test_a_bad_reward_stops_the_run_at_its_first_call_with_one_line(tmp_path, cache, capsys, fn, message):  # noqa: F811
    code, _, err = cli(TINY + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r",
                               "train.steps=2", f"reward.fn=test_user_reward:{fn}", "reward.user_fn_timeout_s=2"],
                       capsys)
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert code == 1 and len(lines) == 1 and lines[0].startswith(message), err
    assert "no checkpoint was written" in lines[0] and "Traceback" not in err


@pytest.mark.parametrize("value,message", [
    ("nowhere_module:f", "reward.fn='nowhere_module:f' cannot be loaded"),
    ("even_length", "reward.fn must look like 'module:function', got 'even_length'"),
    ("test_user_reward:CALLS", "reward.fn='test_user_reward:CALLS' is not callable"),
])
def test_a_reward_function_that_cannot_load_is_one_line_before_any_model(tmp_path, capsys, monkeypatch, value,
                                                                         message):
    monkeypatch.setattr("pacs_fast.trainer.build.build_learner", lambda *a, **k: pytest.fail("model work started"))
    code, _, err = cli(TINY + [f"train.out_dir={tmp_path}", "train.run_name=r", f"reward.fn={value}"], capsys)
    lines = [line for line in err.strip().splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and message in lines[0], err


def test_the_verifiers_settings_are_named_unused_and_its_gold_check_skipped(tmp_path):
    from pacs_fast.config import unused_settings

    cfg = load_config(None, ["reward.fn=test_user_reward:even_length", "reward.extraction=boxed",
                             "train.reward_workers=1"])
    lines = unused_settings(cfg)
    assert any("reward.extraction" in line and "with reward.fn" in line for line in lines), lines
    assert any("train.reward_workers" in line for line in lines), lines
    # answers math-verify cannot match (a program's expected output): refused for the verifier, fine for reward.fn
    rows = [{"problem": f"print the word number {i}", "answer": "\\text{}"} for i in range(12)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for fn in ("", "test_user_reward:even_length"):
        cfg = load_config(None, [f"data.dataset={tmp_path / 't.jsonl'}", "data.eval_size=4", f"reward.fn={fn}"])
        train, held = load_problems(cfg)[:2]
        if fn:
            check_gold_answers(cfg, train, held, print)
        else:
            with pytest.raises(ValueError, match="none of the .* gold answers checked can be matched"):
                check_gold_answers(cfg, train, held, print)


def test_the_scorer_memoises_triples_and_checks_every_return():
    CALLS.clear()
    scorer = Scorer(0, user_fn=even_length)
    assert scorer.batch is None  # no verifier workers
    got = scorer(["ab", "abc", "ab"], ["1", "1", "2"], problems=["p", "p", "q"])
    assert got == [1.0, 0.0, 1.0] and len(CALLS) == 1 and len(CALLS[0][1]) == 3  # ("ab","1") twice, distinct problems
    assert scorer(["ab", "abc"], ["1", "1"], problems=["p", "p"]) == [1.0, 0.0] and len(CALLS) == 1  # memoised
    with pytest.raises(ValueError, match="give each response's problem text"):
        scorer(["x"], ["1"])
    for bad, match in (([0.5, 0.5], "returned 2 rewards for 1 responses"), ([float("nan")], "non-finite"),
                       ("1", "returned str"), ([-0.1], "returned -0.1 as the reward of response 0")):
        with pytest.raises(UserFunctionError, match=match):
            user_rewards(lambda p, t, a: bad, ["p"], ["t"], ["a"], key="reward.fn", timeout_s=5)
