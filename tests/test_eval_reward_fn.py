"""``python -m pacs_fast.eval --reward-fn module:function``: the user's reward in the verifier's place (the
trainer's ``reward.fn``), recorded in the run settings (a resume with another function is refused), pass@k
counting responses that score above 0.5."""
import json

import pytest

from pacs_fast import eval as ev
from pacs_fast.evaluation.results import read_samples

from test_eval_cli import _run_args, dataset, model_dir  # noqa: F401  (fixtures)

SEEN: list[tuple[list, list, list]] = []


def odd_length(problems, responses, answers):
    SEEN.append((list(problems), list(responses), list(answers)))
    return [float(len(r) % 2 == 1) for r in responses]


def half(problems, responses, answers):
    return [0.5] * len(responses)


def mostly(problems, responses, answers):
    return [0.75] * len(responses)


def out_of_range(problems, responses, answers):
    return [2] * len(responses)


def test_the_users_function_scores_every_response(model_dir, dataset, tmp_path,  # noqa: F811
                                                                            capsys):
    SEEN.clear()
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, dataset, out, "--reward-fn", "test_eval_reward_fn:odd_length")) == 0
    rows = {json.loads(x)["id"]: json.loads(x) for x in dataset.read_text().splitlines()}
    recs = read_samples(out / "samples_toy.jsonl")
    assert len(recs) == 4 and SEEN
    for r in recs.values():
        assert r["scores"] == [float(len(t) % 2 == 1) for t in r["responses"]]
        assert r["statuses"] == ["user_fn"] * 2 and r["num_correct"] == sum(r["scores"])
    for problems, responses, answers in SEEN:  # each response with its own problem text and answer
        assert all(rows[f"q{p.split('+')[0]}"]["answer"] == a for p, a in zip(problems, answers))
    settings = json.loads((out / "run_config.json").read_text())
    assert settings["reward_fn"] == "test_eval_reward_fn:odd_length"
    result = json.loads((out / "results.json").read_text())["benchmarks"]["toy"]
    assert result["correct_counts"] == [int(sum(r["scores"])) for _, r in sorted(recs.items())]
    assert result["status_counts"] == {"user_fn": 8}
    # another function (or the verifier) into the same folder: refused, the samples kept
    capsys.readouterr()
    assert ev.main(_run_args(model_dir, dataset, out, "--reward-fn", "test_eval_reward_fn:half")) == 2
    assert "reward_fn differ" in capsys.readouterr().err
    assert ev.main(_run_args(model_dir, dataset, out)) == 2
    assert len(read_samples(out / "samples_toy.jsonl")) == 4


@pytest.mark.parametrize("fn,score,correct", [("half", 0.5, 0), ("mostly", 0.75, 2)])
def test_soft_rewards_are_kept_and_count_as_correct_above_a_half(model_dir, dataset, tmp_path, fn, score,  # noqa: F811
                                                                 correct):
    """As the trainer's reward/acc and eval/pass@n count them."""
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, dataset, out, "--reward-fn", f"test_eval_reward_fn:{fn}")) == 0
    assert all(r["scores"] == [score, score] and r["num_correct"] == correct
               for r in read_samples(out / "samples_toy.jsonl").values())
    result = json.loads((out / "results.json").read_text())["benchmarks"]["toy"]
    assert result["correct_counts"] == [correct] * 4 and result["pass_at_k"]["1"] == correct / 2


@pytest.mark.parametrize("spec,message", [
    ("no_such_module_x:f", "error: --reward-fn='no_such_module_x:f' cannot be loaded"),
    ("odd_length", "error: --reward-fn must look like 'module:function', got 'odd_length'"),
    ("test_eval_reward_fn:out_of_range", "error: --reward-fn returned 2.0 as the reward of response 0"),
])
def test_a_bad_function_is_one_line(model_dir, dataset, tmp_path, capsys, spec, message):  # noqa: F811
    assert ev.main(_run_args(model_dir, dataset, tmp_path / "run", "--reward-fn", spec)) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), errors


def checks_cases(problems, responses, answers):
    """Test cases given as a JSON list in the answer field: each answer arrives as its JSON text."""
    cases = [json.loads(a) for a in answers]
    SEEN.append((list(problems), list(responses), cases))
    return [float(all(c["out"] in r for c in case)) for r, case in zip(responses, cases)]


def test_structured_answers_reach_the_function_as_json_text(model_dir, tmp_path):  # noqa: F811
    """A list or an object in the answer field (test cases) was refused ("must be a string or a number"); it
    is its JSON text now, for reward.fn / --reward-fn to read."""
    from pacs_fast.data.datasets import load_dataset

    rows = [{"id": f"c{i}", "problem": f"echo {i}", "tests": [{"in": str(i), "out": str(i)}, {"in": "x", "out": "é"}]}
            for i in range(3)] + [{"id": "d", "problem": "echo d", "tests": {"in": "d", "out": "d"}}]
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = load_dataset(data, answer_field="tests")
    assert [json.loads(p.answer) for p in loaded] == [r["tests"] for r in rows] and "é" in loaded[0].answer
    (tmp_path / "empty.jsonl").write_text(json.dumps({"problem": "p", "tests": []}) + "\n")
    with pytest.raises(ValueError, match="field 'tests' is empty"):
        load_dataset(tmp_path / "empty.jsonl", answer_field="tests")
    SEEN.clear()
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, data, out, "--answer-field", "tests", "--limit", "3",
                             "--reward-fn", "test_eval_reward_fn:checks_cases")) == 0
    assert [case for _, _, cases in SEEN for case in cases] == [r["tests"] for r in rows[:3] for _ in range(2)]
