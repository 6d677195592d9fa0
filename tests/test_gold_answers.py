"""Gold answers and held-out sets a user brings (bring-your-own-data sweep): what no response can match, or
what does not measure what it says, is reported before any model loads.

- A float answer is written positionally (``7.2e-05`` -> ``0.000072``: math-verify read the ``e`` as Euler's
  number, so the right answer scored 0); a gold answer ending a sentence (``5.``) is the number.
- ``unmatchable_golds``: the answers the verifier cannot match even against ``\\boxed{<gold>}``; the trainer
  warns about some and refuses a set where all are (every reward would be 0).
- ``data_warnings``: a held-out set smaller than ``data.eval_size``, one that shares problems with the
  training set, gold answers that read like worked solutions or questions (GSM8K's ``#### 72``, swapped keys).
"""
import json

import pytest

from pacs_fast.config import load_config
from pacs_fast.data.datasets import _answer_text, load_dataset
from pacs_fast.reward import score_item
from pacs_fast.reward import gold_check
from pacs_fast.trainer.problems import check_gold_answers, data_warnings, load_problems

GSM8K_SOLUTION = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72"


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_float_answer_is_written_so_that_the_right_answer_matches(tmp_path):
    assert [_answer_text(v, "w", "a") for v in (7.2e-05, 1e-5, -3.5e-07, 0.5, 12.0)] == \
        ["0.000072", "0.00001", "-0.00000035", "0.5", "12"]
    path = _write(tmp_path / "f.jsonl", [{"problem": "tiny?", "answer": 7.2e-05}])
    gold = load_dataset(path)[0].answer
    assert score_item("\\boxed{0.000072}", gold).score == 1.0
    assert score_item("\\boxed{0.000073}", gold).score == 0.0


@pytest.mark.parametrize("response,want", [("\\boxed{5}", 1.0), ("The final answer is 5.", 1.0), ("\\boxed{5.}", 1.0),
                                           ("\\boxed{6}", 0.0), ("\\boxed{5.5}", 0.0)])
def test_a_gold_answer_ending_a_sentence_is_the_number(response, want):
    assert score_item(response, "5.").score == want
    assert score_item(response.replace("5", "43_5", 1) if want else response, "43_5.").score == want  # math_train's


def test_unmatchable_golds_scores_each_distinct_answer_once(monkeypatch):
    calls = []
    real = gold_check.score_item
    monkeypatch.setattr(gold_check, "score_item", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    answers = ["12", "\\text{}", "\\frac{1}{2}", "12", "\\text{}", "x^2+1"]
    assert gold_check.unmatchable_golds(answers) == [1, 4]
    assert sorted(calls) == sorted(set(answers))


def _cfg(tmp_path, rows, *extra, held=None):
    args = [f"data.dataset={_write(tmp_path / 'train.jsonl', rows)}", "data.eval_size=4", "train.prompts_per_step=4",
            *extra]
    if held is not None:
        args.append(f"data.eval_dataset={_write(tmp_path / 'held.jsonl', held)}")
    cfg = load_config(None, args)
    return cfg, *load_problems(cfg)


def test_some_unmatchable_answers_are_a_warning_all_of_them_an_error(tmp_path):
    rows = [{"id": f"r{i}", "problem": f"p{i}", "answer": "\\text{}" if i % 5 == 0 else str(i)} for i in range(30)]
    cfg, train, held = _cfg(tmp_path, rows, held=[{"problem": "q", "answer": "3"}])
    lines = []
    check_gold_answers(cfg, train, held, lines.append)
    assert len(lines) == 1 and lines[0].startswith("warning: data.dataset: 6 of 30 gold answers cannot be matched")
    assert "e.g. 'r0': answer '\\\\text{}'" in lines[0]

    cfg, train, held = _cfg(tmp_path, [{"problem": f"p{i}", "answer": "\\text{}"} for i in range(30)],
                            held=[{"problem": "q", "answer": "3"}])
    with pytest.raises(ValueError, match=r"^data.dataset: none of the 30 gold answers checked can be matched .*"
                                         r"is data.answer_key=answer the field holding the answer\?$"):
        check_gold_answers(cfg, train, held, lines.append)
    # trained on process rewards alone, the verifier's reward does not train: a warning
    cfg.reward.step_rewards, cfg.reward.outcome_weight = "m:f", 0.0
    lines.clear()
    check_gold_answers(cfg, train, held, lines.append)
    assert len(lines) == 1 and "30 of 30 gold answers" in lines[0]
    # a held-out set nothing can match is refused whatever trains
    cfg, train, held = _cfg(tmp_path, rows[1:5], held=[{"problem": "q", "answer": "}"}])
    with pytest.raises(ValueError, match=r"^data.eval_dataset '.*held.jsonl': none of the 1 gold answers"):
        check_gold_answers(cfg, train, held, lines.append)


def test_a_large_training_set_is_checked_on_a_seeded_sample(tmp_path, monkeypatch):
    from pacs_fast.trainer import problems

    monkeypatch.setattr(problems, "GOLD_SAMPLE", 10)
    rows = [{"problem": f"p{i}", "answer": "\\text{}" if i == 0 else str(i)} for i in range(200)]
    cfg, train, held = _cfg(tmp_path, rows, held=[{"problem": "q", "answer": "3"}])
    seen = []
    real = gold_check.unmatchable_golds
    monkeypatch.setattr(gold_check, "unmatchable_golds", lambda answers, **k: seen.append(list(answers)) or real(answers, **k))
    check_gold_answers(cfg, train, held, lambda line: None)
    assert [len(a) for a in seen] == [10, 1]


def test_held_out_sets_that_do_not_measure_what_they_say(tmp_path):
    rows = [{"problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(6)]
    cfg, train, held = _cfg(tmp_path, rows)  # one row in five of 6: 1 held out, 4 asked
    assert data_warnings(cfg, train, held) == [
        "the held-out split holds 1 problem (one row in five of data.dataset's 6), fewer than data.eval_size=4"]
    cfg, train, held = _cfg(tmp_path, rows * 5)  # every row five times: a held-out problem's copies leave training
    # (it warned "4 of the 4 problems ... are also training problems"; then nothing, while 16 of the 30 rows left training)
    assert data_warnings(cfg, train, held) == [
        "the held-out split's 4 problems repeat in 16 other rows of data.dataset's 30, which stay out of training (the "
        "run trains on none of a held-out problem's copies): 10 rows train; give data.eval_dataset to keep them all"]
    held_out = {h["problem"] for h in held}
    assert held_out and not any(r["problem"] in held_out for r in train)
    assert len(train) == 30 - 5 * len(held_out)  # every copy of a held-out problem is held out or dropped
    cfg, train, held = _cfg(tmp_path, rows, held=rows[:2])  # the training file given again, short
    lines = data_warnings(cfg, train, held)
    assert len(lines) == 2 and "holds 2 problems (its rows), fewer than data.eval_size=4" in lines[0]
    assert lines[1].startswith("2 of the 2 problems of data.eval_dataset")
    cfg, train, held = _cfg(tmp_path, rows, held=[{"problem": "new", "answer": "1"}] * 4)
    # no training problem among them; but one problem four times is counted four times in eval/acc (it said nothing)
    assert data_warnings(cfg, train, held) == [
        "3 of the 4 problems of data.eval_dataset repeat another (white space and Unicode normal form aside): eval/acc "
        "counts each copy, weighting those problems more (rollout.eval_n samples a problem several times)"]
    cfg, train, held = _cfg(tmp_path, rows, held=[{"problem": f"new {i}", "answer": "1"} for i in range(4)])
    assert data_warnings(cfg, train, held) == []


def test_a_step_that_draws_more_prompts_than_the_training_set_holds(tmp_path):
    """8 prompts a step from 4 training problems drew each of them twice in every step, without a word (sweep of
    2026-12-02); as many prompts as problems is every problem once."""
    rows = [{"problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(5)]
    for per_step, warned in ((5, True), (4, False)):
        cfg, train, held = _cfg(tmp_path, rows, f"train.prompts_per_step={per_step}", "data.eval_size=1")
        assert len(train) == 4
        lines = data_warnings(cfg, train, held)
        assert lines == ([f"train.prompts_per_step={per_step} is more than the 4 training problems: each step draws "
                          f"some of them more than once (their groups train twice in one step)"] if warned else [])


@pytest.mark.parametrize("answer", [GSM8K_SOLUTION, "What is the sum of the first ten positive odd integers here?"])
def test_answers_that_read_like_solutions_or_questions(tmp_path, answer):
    rows = [{"id": f"r{i}", "problem": f"p{i}", "answer": answer if i < 3 else str(i)} for i in range(25)]
    cfg, train, held = _cfg(tmp_path, rows)
    lines = data_warnings(cfg, train, held)
    assert len(lines) == 1 and lines[0].startswith("3 of the 25 gold answers read like worked solutions or questions")
    assert lines[0].endswith("is data.answer_key=answer the final-answer field?")


def test_the_shipped_sets_raise_no_warning():
    for name in ("math_train", "gsm8k_train"):
        cfg = load_config(None, [f"data.dataset={name}", "data.eval_size=64"])
        train, held = load_problems(cfg)
        lines = data_warnings(cfg, train, held)
        check_gold_answers(cfg, train, held, lines.append)
        assert lines == [], (name, lines)
    # math_train repeats one problem (train/algebra/2463.json and 24377.json); with split seed 46 one copy lands in
    # the held-out split: the other now stays out of training (it warned "1 of the 128 problems ... are also
    # training problems", review of 2026-11-28)
    cfg = load_config(None, ["data.dataset=math_train", "data.split_seed=46"])
    train, held = load_problems(cfg)
    assert data_warnings(cfg, train, held) == [] and len(train) + len(held) == 7496 - 1
    # a shipped benchmark smaller than data.eval_size is what it is: no line (a short user file still gets one)
    for bench in ("aime2024", "aime2025", "amc23"):
        cfg = load_config(None, ["data.dataset=math_train", f"data.eval_dataset={bench}"])
        assert data_warnings(cfg, *load_problems(cfg)) == [], bench
    # one larger than data.eval_size is cut to its first problems: a line says so (MATH-500 was evaluated on 128 of
    # its 500 problems without a word, a sweep of 2026-11-29), none when every problem is asked for
    cfg = load_config(None, ["data.dataset=math_train", "data.eval_dataset=math500"])
    assert data_warnings(cfg, *load_problems(cfg)) == [
        "data.eval_dataset 'math500' holds 500 problems and the run evaluates its first 128 (data.eval_size=128): "
        "eval/acc is not the whole set's; set data.eval_size=500 to evaluate every problem"]
    cfg = load_config(None, ["data.dataset=math_train", "data.eval_dataset=math500", "data.eval_size=500"])
    assert data_warnings(cfg, *load_problems(cfg)) == []


def test_the_held_out_split_of_a_file_does_not_follow_train_seed():
    """The split of a training file is seeded by data.split_seed, not train.seed: runs with different seeds
    trained and were evaluated on different problems (their results did not pair up)."""
    def held(*overrides):
        return [row["problem"] for row in load_problems(load_config(None, ["data.dataset=gsm8k_train", *overrides]))[1]]

    assert held("train.seed=0") == held("train.seed=1") == held("data.split_seed=0", "train.seed=7")
    assert held("data.split_seed=1") != held("data.split_seed=0")


def test_a_run_with_no_matchable_answer_stops_before_any_model(tmp_path, monkeypatch):
    from pacs_fast.trainer import session, train
    from pacs_fast.trainer.loop import SetupError

    from pacs_fast.data.tiny import make_tiny_model

    make_tiny_model(tmp_path / "model", seed=0)
    monkeypatch.setattr(session, "find_model", lambda *a, **k: pytest.fail("a model was looked for"))
    path = _write(tmp_path / "d.jsonl", [{"problem": f"p{i}", "answer": "}"} for i in range(10)])
    cfg = load_config(None, [f"data.dataset={path}", f"model.path={tmp_path / 'model'}", f"train.out_dir={tmp_path}",
                             "train.progress=false"])
    with pytest.raises(SetupError, match="none of the 8 gold answers checked can be matched"):
        train(cfg, tmp_path / "run")


def test_eval_warns_about_a_files_gold_answers(tmp_path):
    """``python -m pacs_fast.eval --benchmarks my.jsonl``: the same two checks, on the first 512 answers, before
    any model loads (printed by ``_load_problems`` for user files; the shipped sets pass both)."""
    import argparse

    from pacs_fast.evaluation.args import gold_warnings

    rows = [{"id": f"r{i}", "problem": f"p{i}", "answer": GSM8K_SOLUTION if i < 2 else "}" if i == 5 else str(i)}
            for i in range(8)]
    problems = load_dataset(_write(tmp_path / "mine.jsonl", rows))
    args = argparse.Namespace(answer_field="answer", extraction="boxed", time_limit=5.0)
    lines = gold_warnings(problems, args)
    assert len(lines) == 2
    assert lines[0].startswith("2 of 8 gold answers read like worked solutions or questions") and \
        lines[0].endswith("is --answer-field answer the final-answer field?")
    assert lines[1].startswith("1 of 8 gold answers cannot be matched by the verifier") and "'r5': '}'" in lines[1]
    assert gold_warnings(problems, args, sample=6)[1].startswith("1 of 6 gold answers checked cannot")
    assert gold_warnings(load_dataset("math_train", limit=300), args) == []


def test_the_built_in_task_says_when_it_has_fewer_problems_than_asked():
    """data.arith_train_size past the family's distinct problems was capped without a word (1e12 gave the same
    9,872 problems as the default); the default itself asks for all there are."""
    cfg = load_config(None, ["data.arith_train_size=50000"])
    train, held = load_problems(cfg)
    assert data_warnings(cfg, train, held) == [
        f"data.arith_train_size=50000 is more than the built-in task has with these settings: it trains on its "
        f"{len(train)} problems (every distinct one less the held-out ones)"]
    assert len(train) == 10_000 - 128
    for over in ([], ["data.arith_train_size=500"]):
        cfg = load_config(None, over)
        assert data_warnings(cfg, *load_problems(cfg)) == [], over
