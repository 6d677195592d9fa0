"""``reward.fn = "module:function"``: the user's reward, in [0, 1], in the math verifier's place for every
reward of a run (training, dynamic sampling, the held-out evaluation), for tasks math-verify cannot judge
(unit tests, a format, a judge). Checked before any model loads; a bad return stops the run with one line."""
import json
import signal
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


# -- hostile sweep of reward.fn (each case failed before its mend) --------------------------------------

def shrinks_its_input(problems, texts, answers):
    texts.pop()
    return [0.0] * len(texts)


def just_over_one(problems, texts, answers):
    return [1.0000001] * len(texts)


def two_dimensional(problems, texts, answers):
    import numpy as np
    return np.zeros((len(texts), 3))


def raises_two_lines(problems, texts, answers):
    raise RuntimeError("the judge failed:\n  connection refused")


class Judge:
    @staticmethod
    def score(problems, texts, answers):
        return [1.0] * len(texts)


JUDGE = Judge()


def test_each_bad_return_is_one_line_that_says_what_came_back():
    cases = [(shrinks_its_input, "reward.fn returned 2 rewards for 3 responses"),  # (it said "for 2")
             (just_over_one, "reward.fn returned 1.0000001 as the reward of response 0"),  # (it said "returned 1")
             (two_dimensional, "reward.fn returned ndarray array([[0., 0., 0.], [0., 0., 0.], [0., 0., 0.]])"),
             (raises_two_lines, "reward.fn raised RuntimeError: the judge failed: connection refused")]
    for fn, message in cases:
        with pytest.raises(UserFunctionError) as e:
            user_rewards(fn, ["p"] * 3, ["a", "b", "c"], ["1"] * 3, key="reward.fn", timeout_s=5)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_methods_load_and_a_module_that_exits_on_import_is_named(tmp_path, monkeypatch):
    from pacs_fast.trainer.rewards import load_callable

    assert load_callable("test_user_reward:Judge.score", "reward.fn")([], ["x"], []) == [1.0]
    assert load_callable("test_user_reward:JUDGE.score", "reward.fn")([], ["x"], []) == [1.0]
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"reward.fn='exits_on_import:f' cannot be loaded: importing "
                                         r"exits_on_import called sys.exit\(5\)"):
        load_callable("exits_on_import:f", "reward.fn")


def test_label_noise_refuses_soft_rewards_instead_of_rounding_them():
    """reward.noise_fp flips 0 / 1 labels: a soft reward was thresholded at 0.5 and counted as flipped (sweep:
    reward/flipped_frac 0.94 at noise 0.3, every trained label 0 or 1)."""
    scorer = Scorer(0, user_fn=soft_half, noise_fp=0.3)
    assert scorer(["a"], ["1"], problems=["p"]) == [0.5]  # evaluation: no noise
    with pytest.raises(UserFunctionError, match=r"reward.noise_fp / reward.noise_fn flip 0 / 1 labels, but "
                                                r"reward.fn returned 0.5 for response 0"):
        scorer(["a", "b"], ["1", "1"], step=1, problems=["p", "p"])
    assert Scorer(0, user_fn=even_length, noise_fp=0.3)(["ab"] * 4, ["1"] * 4, step=1, problems=["p"] * 4)


def test_the_verifier_settings_reward_fn_leaves_unused_are_not_refused(monkeypatch):
    from pacs_fast.trainer.preflight import check_cpus

    cfg = load_config(None, ["train.reward_workers=64"])
    with pytest.raises(ValueError, match="train.reward_workers=64 is more than the 2 CPUs"):
        check_cpus(cfg, cpus=2)
    check_cpus(load_config(None, ["train.reward_workers=64", "reward.fn=test_user_reward:even_length"]), cpus=2)


def test_the_experiment_runner_imports_the_function_before_any_run(tmp_path, capsys, monkeypatch):
    from pacs_fast import experiment as ex

    monkeypatch.setattr(ex, "run_experiment", lambda *a, **k: pytest.fail("a run started"))
    code = ex.main(["--arms", "pacs", "--seeds", "0", "--out", str(tmp_path / "x"), "reward.fn=nowhere_mod:f"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: reward.fn='nowhere_mod:f' cannot be loaded"), err
    assert not (tmp_path / "x").exists()


def test_a_stop_on_one_rank_alone_is_printed_by_that_rank(monkeypatch, capsys):
    """Under torchrun a reward.fn failing on rank 1's share stopped rank 1 silently (rank 0, waiting in a
    collective, died of the lost connection): no error line at all. A config error, the same on every rank,
    is still printed by rank 0 alone."""
    from pacs_fast import train

    monkeypatch.setattr(train, "PEER_EXIT_DELAY_S", 0.0)
    monkeypatch.setattr(train.signals, "default_stop_signals", lambda: None)  # (this process's handlers stay)
    monkeypatch.setenv("RANK", "1")
    for alike, printed in ((False, "error: rank 1: step 1: reward.fn raised ValueError: x\n"), (True, "")):
        with pytest.raises(SystemExit) as e:
            train.fail("step 1: reward.fn raised ValueError: x", 1, alike=alike)
        assert e.value.code == 1 and capsys.readouterr().err == printed
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit):
        train.fail("bad", 2)
    assert capsys.readouterr().err == "error: bad\n"


def test_the_rank_left_waiting_for_a_stopped_one_says_so_in_one_line(monkeypatch, capsys, tmp_path):
    """Rank 0 waiting in a collective when rank 1 stopped printed gloo's traceback ("Connection closed by
    peer ... GLHF!") after rank 1's line; now one line, exit 1. Other RuntimeErrors keep their traceback."""
    from pacs_fast import train
    from pacs_fast.trainer import loop

    def lost(*a, **k):
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:20690. "
                           "This is typically caused by a remote worker crashing.")

    monkeypatch.setattr(loop, "train", lost)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    args = TINY + [f"train.out_dir={tmp_path}", "train.run_name=r", "learner.backend=megatron"]
    before = {sig: signal.getsignal(sig) for sig in train.signals.STOP_SIGNALS}
    try:  # the command line's handlers: torchrun's SIGTERM during the exit that follows the line must end it quietly
        for sig in before:  # (it raised Stopped in a finaliser: a traceback)
            signal.signal(sig, signal.SIG_DFL)
        train.signals.raise_on_stop_signals()
        code, _, err = cli(args, capsys)
        assert all(signal.getsignal(sig) is signal.SIG_DFL for sig in before)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert code == 1 and err.strip().splitlines()[-1].startswith("error: rank 0: another rank of this launch "
                                                                 "stopped while this one waited"), err
    assert "Traceback" not in err

    def lost_then_stopped(*a, **k):  # torchrun's SIGTERM during the clean-up of the loss: it had been silent
        try:  # (rank 1 prints no "stopped by" line; the launch had no line of ours)
            lost()
        finally:
            raise train.signals.Stopped(signal.SIGTERM)

    monkeypatch.setattr(loop, "train", lost_then_stopped)
    monkeypatch.setenv("RANK", "1")
    code, _, err = cli(TINY + [f"train.out_dir={tmp_path}", "train.run_name=r3", "learner.backend=megatron"], capsys)
    assert code == 1 and err.strip().splitlines()[-1].startswith("error: rank 1: another rank of this launch "
                                                                 "stopped while this one waited"), err
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: nothing went away, the error is its own
    monkeypatch.setattr(loop, "train", lost)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        cli(TINY + [f"train.out_dir={tmp_path}", "train.run_name=r2"], capsys)


def test_the_memo_holds_a_bounded_amount_of_text():
    """A long run's memo: long distinct responses, one call each (a step's), are let go once their keys hold
    ``MEMO_MAX_CHARS`` characters of text; it had been cleared only at 200,000 keys, whatever their length (with
    4k-token responses ~3 GB of the trainer's memory, climbing for hundreds of steps). 64 responses of 2**20
    characters are twice the 2**25 cap: the memo holds at most the cap plus one call's key (its clear comes at the
    start of a call), and the old one held all 64 (67 M characters). A repeat is still scored once."""
    calls = []

    def score(problems, texts, answers):
        calls.append(len(texts))
        return [0.0] * len(texts)

    def held(scorer) -> int:  # the text the memo's keys hold, counted here (the old scorer did not count it)
        return sum(len(x) for key in scorer.memo for x in key if isinstance(x, str))

    scorer = Scorer(0, user_fn=score)
    long = 1 << 20
    most = 0
    for i in range(64):
        text = f"{i:02d}" + "x" * long
        assert scorer([text, text], ["1", "1"], step=i + 1, problems=["p", "p"]) == [0.0, 0.0]
        most = max(most, held(scorer))
    assert calls == [1] * 64  # each distinct response once (the memo works)
    assert most <= (1 << 25) + long + 8, most
    scorer.close()
