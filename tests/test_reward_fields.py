"""``reward.fn_fields`` / ``eval --reward-fields``: dataset fields (test cases, a language) handed to the user's
reward function as keyword arguments, one list per field with each response's row value, as TRL hands a reward
function the dataset's columns. Names, rows and the function's signature are checked before any model loads;
the values join the scorer's memo key and each call gets its own copy."""
import json

import pytest

from pacs_fast import eval as ev
from pacs_fast.config import load_config, validate
from pacs_fast.config.reward_fields import RowFields, field_keywords
from pacs_fast.data.datasets import load_dataset
from pacs_fast.evaluation.results import read_samples
from pacs_fast.trainer.problems import data_digest, load_problems
from pacs_fast.trainer.rewards import Scorer, check_callables, user_rewards

from test_eval_cli import _run_args, model_dir  # noqa: F401  (fixture)
from test_run_safety import cli

CALLS: list[dict] = []


def by_cases(problems, responses, answers, cases, lang):
    """1 when the response names one of its row's cases and the row's language is py; records what came (each
    case list with "edited" appended: the function's copy, one per row, the run's rows must not change)."""
    out = []
    for r, c, lang_ in zip(responses, cases, lang):
        if c[-1:] != ["edited"]:  # (the responses of one row share its copy)
            c.append("edited")
        out.append(float(lang_ == "py" and any(x in r for x in c[:-1])))
    CALLS.append({"problems": list(problems), "responses": list(responses), "cases": [list(c) for c in cases],
                  "lang": list(lang)})
    return out


def takes_anything(problems, responses, answers, **fields):
    CALLS.append({"fields": {k: list(v) for k, v in fields.items()}, "responses": list(responses)})
    return [0.0] * len(responses)


def three_arguments(problems, responses, answers):
    return [0.0] * len(responses)


def rows(n=20):
    return [{"id": f"q{i}", "problem": f"{i}+1=", "answer": str(i + 1),
             "extra_info": {"cases": [str(i + 1), str(i)], "index": i}, "lang": "py" if i % 2 else "c"}
            for i in range(n)]


def write(path, data):
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


@pytest.mark.parametrize("names,message", [
    ("cases", "must be a list"),
    (["tests", ""], "each entry must be a dataset field's name"),
    (["class"], "'class' .*not a Python name"),
    (["a-b"], "not a Python name"),
    (["x.answers"], "'answers', the name of an argument every call already passes"),
    (["a.tests", "b.tests"], "'a.tests' and 'b.tests' would both arrive as the keyword argument 'tests'"),
    (["extra_info.tests.0"], "names a list item; a dotted name reads the keys of nested objects, not list positions: "
                             "hand the whole list \\('extra_info.tests'\\)"),
])
def test_field_names_that_cannot_be_keyword_arguments_are_refused(names, message):
    with pytest.raises(ValueError, match=message):
        field_keywords(names, "reward.fn_fields")


def test_dotted_names_arrive_under_their_last_part():
    assert field_keywords(["extra_info.tests", "lang"], "k") == {"extra_info.tests": "tests", "lang": "lang"}


@pytest.mark.parametrize("overrides,message", [
    (["reward.fn_fields=[lang]"], "reward.fn_fields hands dataset fields to reward.fn; set reward.fn"),
    (["reward.fn_fields=[lang]", "reward.fn=m:f"], "the built-in arithmetic task has none"),
    (["reward.fn_fields=lang", "reward.fn=m:f"], r"expects list, got 'lang' \(a list in brackets"),
])
def test_the_config_key_is_checked_with_the_key_named(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(load_config(None, overrides))


def test_rows_keep_the_fields_as_the_file_holds_them_and_a_missing_one_names_the_line(tmp_path):
    data = rows(3)
    data[1]["lang"] = None  # a null is a value (a parquet column with gaps), kept as None
    path = write(tmp_path / "d.jsonl", data)
    loaded = load_dataset(path, fields=["extra_info.cases", "lang"], fields_setting="reward.fn_fields")
    assert [p.fields for p in loaded] == [{"extra_info.cases": r["extra_info"]["cases"], "lang": r["lang"]}
                                          for r in data]
    del data[2]["lang"]
    write(path, data)
    with pytest.raises(ValueError, match=r"d.jsonl:3: missing field 'lang' that reward.fn_fields asks for"):
        load_dataset(path, fields=["lang"], fields_setting="reward.fn_fields")


def test_the_scorer_passes_columns_memoises_by_the_fields_and_hands_out_copies():
    CALLS.clear()
    scorer = Scorer(0, user_fn=by_cases)
    a, b = {"cases": ["1", "0"], "lang": "py"}, {"cases": ["2"], "lang": "c"}
    got = scorer(["1", "1", "2", "x"], ["1", "1", "2", "2"], problems=["0+1=", "0+1=", "1+1=", "1+1="],
                 fields=[a, a, b, b])
    assert got == [1.0, 1.0, 0.0, 0.0]
    assert len(CALLS) == 1 and sorted(CALLS[0]["responses"]) == ["1", "2", "x"]  # distinct keys only
    assert a == {"cases": ["1", "0"], "lang": "py"}, "the function's edit reached the run's row"
    for r, c, lang in zip(CALLS[0]["responses"], CALLS[0]["cases"], CALLS[0]["lang"]):  # each response's own row
        assert (c[:-1], lang) == ((a["cases"], "py") if r == "1" else (b["cases"], "c"))
    # the same problem, response and answer with other field values is another key: scored again
    again = scorer(["2"], ["2"], problems=["1+1="], fields=[{"cases": ["2"], "lang": "py"}])
    assert again == [1.0] and len(CALLS) == 2
    assert scorer(["2"], ["2"], problems=["1+1="], fields=[dict(b)]) == [0.0] and len(CALLS) == 2  # memoised


def test_memo_keys_keep_apart_what_json_would_mix_up():
    import numpy as np

    from pacs_fast.config.reward_fields import RowFields, memo_key

    a, b = np.zeros(2000), np.zeros(2000)
    b[1000] = 1.0  # (their repr shows neither middle)
    pairs = [({"x": [1, 2]}, {"x": (1, 2)}), ({"x": b"x"}, {"x": "b'x'"}), ({"x": a}, {"x": b}), ({"x": 1}, {"x": 1.0}),
             ({1: 2, "a": 3}, {"1": 2, "a": 3})]
    for one, other in pairs:
        assert memo_key(one) != memo_key(other), (one, other)
        assert memo_key(one) == memo_key(dict(one))  # equal values: the same key
    lam = {"f": lambda: 0}  # cannot be pickled: a key of its own every time
    assert memo_key(lam) != memo_key(lam)
    row = RowFields(x=[1, 2])
    assert row.memo_key == memo_key({"x": [1, 2]}) and row._memo_key is not None  # computed once, kept
    calls = []

    def tuples_only(problems, responses, answers, x):
        calls.append(1)
        return [float(isinstance(v, tuple)) for v in x]

    scorer = Scorer(0, user_fn=tuples_only)
    kept = RowFields(x=[3])
    scorer(["r"], ["a"], problems=["p"], fields=[kept])
    assert kept._memo_key == memo_key({"x": [3]})  # the scorer's key, kept in the row for the next calls
    calls.clear()
    assert scorer(["r"], ["a"], problems=["p"], fields=[{"x": [1, 2]}]) == [0.0]
    assert scorer(["r"], ["a"], problems=["p"], fields=[{"x": (1, 2)}]) == [1.0] and len(calls) == 2


def test_each_row_is_copied_once_per_call():
    seen = []

    def keeps(problems, responses, answers, cases):
        seen.append([id(c) for c in cases])
        cases[0].append("edited")
        return [0.0] * len(responses)

    row, other = RowFields(cases=["1"]), RowFields(cases=["2"])
    user_rewards(keeps, ["p"] * 3, ["a", "b", "c"], ["1"] * 3, key="reward.fn", timeout_s=5, fields=[row, row, other])
    ids = seen[0]
    assert ids[0] == ids[1] != ids[2] and id(row["cases"]) not in ids  # one copy per row, never the run's
    assert row == {"cases": ["1"]} and other == {"cases": ["2"]}


def test_a_function_that_cannot_take_the_fields_is_refused_before_any_model(tmp_path, capsys, monkeypatch,
                                                                            model_dir):  # noqa: F811
    path = write(tmp_path / "d.jsonl", rows())
    monkeypatch.setattr("pacs_fast.trainer.build.build_learner", lambda *a, **k: pytest.fail("model work started"))
    base = [f"data.dataset={path}", f"train.out_dir={tmp_path / 'runs'}", "data.eval_size=4", f"model.path={model_dir}"]
    for fn, fields, message in (
            ("three_arguments", "[lang]", "function(problems, responses, answers, lang) (keyword arguments: the "
                                          "fields of reward.fn_fields): got an unexpected keyword argument 'lang'"),
            ("by_cases", "[]", "keyword arguments: none: reward.fn_fields names no dataset field): missing a "
                               "required argument: 'cases'"),
            ("by_cases", "[extra_info.cases]", "missing a required argument: 'lang'")):
        code, _, err = cli(base + [f"reward.fn=test_reward_fields:{fn}", f"reward.fn_fields={fields}"], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    check_callables(load_config(None, base + ["reward.fn=test_reward_fields:takes_anything",
                                              "reward.fn_fields=[lang,extra_info]"]))  # **fields takes any
    code, _, err = cli(base + ["reward.fn=test_reward_fields:takes_anything",
                               "reward.fn_fields=[extra_info.tests,lang]"], capsys)
    assert code == 2 and "d.jsonl:1: missing field 'extra_info.tests' that reward.fn_fields asks for" in err, err
    assert not list((tmp_path / "runs").glob("*/*")), "a run folder was written"


def test_the_data_digest_reads_the_fields_only_when_there_are_some(tmp_path):
    path = write(tmp_path / "d.jsonl", rows())
    plain = load_config(None, [f"data.dataset={path}", "data.eval_size=4"])
    with_fields = load_config(None, [f"data.dataset={path}", "data.eval_size=4", "reward.fn=json:dumps",
                                     "reward.fn_fields=[extra_info.cases,lang]"])
    train, held = load_problems(plain)
    assert all("fields" not in p for p in train + held)
    # (the digest a checkpoint made before reward.fn_fields existed holds: a resume of such a run still matches)
    import hashlib
    old = hashlib.sha1()
    for part in (train, held):
        for p in part:
            old.update(json.dumps([p["problem"], p["answer"]], ensure_ascii=False).encode("utf-8"))
        old.update(b"|")
    assert data_digest(train, held) == old.hexdigest()
    train_f, held_f = load_problems(with_fields)
    by_id = {r["id"]: r for r in rows()}
    assert [p["id"] for p in train_f] == [p["id"] for p in train]  # the same split
    assert [p["fields"] for p in train_f + held_f] == [{"cases": by_id[p["id"]]["extra_info"]["cases"],
                                                        "lang": by_id[p["id"]]["lang"]} for p in train_f + held_f]
    digest = data_digest(train_f, held_f)
    assert digest != data_digest(train, held)  # edited test cases would not continue the same training
    train_f[0]["fields"]["cases"] = ["edited"]
    assert data_digest(train_f, held_f) != digest


def test_a_run_hands_every_reward_call_each_responses_row(tmp_path, capsys, model_dir):  # noqa: F811
    CALLS.clear()
    data = rows()
    path = write(tmp_path / "d.jsonl", data)
    code, _, err = cli([f"model.path={model_dir}", f"data.dataset={path}", f"train.out_dir={tmp_path}",
                        "train.run_name=r", "data.eval_size=4", "train.steps=1", "rollout.n=2", "rollout.eval_n=2",
                        "train.prompts_per_step=4", "rollout.max_new_tokens=4", "learner.mini_batch_prompts=2",
                        "learner.micro_batch_prompts=1", "train.progress=false",
                        "reward.fn=test_reward_fields:by_cases", "reward.fn_fields=[extra_info.cases,lang]"], capsys)
    assert code == 0, err
    by_problem = {r["problem"]: r for r in data}
    for call in CALLS:  # the held-out evaluations and the training step alike: each response with its own row
        assert len(call["problems"]) == len(call["responses"]) == len(call["cases"]) == len(call["lang"])
        for problem, cases, lang in zip(call["problems"], call["cases"], call["lang"]):
            assert (cases[:-1], lang) == (by_problem[problem]["extra_info"]["cases"], by_problem[problem]["lang"])
    assert len(CALLS) >= 3  # step 0's evaluation, the step's rollouts, step 1's evaluation
    samples = [json.loads(x) for x in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    trained = [s for s in samples if "response" in s]
    by_answer = {r["answer"]: r for r in data}  # (a sample records the prompt as the model saw it, and the answer)
    assert trained and all(s["reward"] == float(by_answer[s["answer"]]["lang"] == "py" and any(
        c in s["response"] for c in by_answer[s["answer"]]["extra_info"]["cases"])) for s in trained), trained[:2]


def test_eval_hands_the_fields_and_records_them(model_dir, tmp_path, capsys):  # noqa: F811
    CALLS.clear()
    data = rows(4)
    path = write(tmp_path / "toy.jsonl", data)
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, path, out, "--reward-fn", "test_reward_fields:by_cases",
                             "--reward-fields", "extra_info.cases, lang")) == 0
    recs = read_samples(out / "samples_toy.jsonl")
    assert len(recs) == 4 and CALLS
    for call in CALLS:
        for problem, cases, lang in zip(call["problems"], call["cases"], call["lang"]):
            row = next(r for r in data if r["problem"] == problem)
            assert (cases[:-1], lang) == (row["extra_info"]["cases"], row["lang"])
    for r in recs.values():
        row = next(x for x in data if x["id"] == r["id"])
        assert r["scores"] == [float(row["lang"] == "py" and any(c in t for c in row["extra_info"]["cases"]))
                               for t in r["responses"]]
    assert json.loads((out / "run_config.json").read_text())["reward_fields"] == ["extra_info.cases", "lang"]
    capsys.readouterr()
    # an edited field value, resumed into the same folder: refused (the samples scored the old value)
    edited = [dict(r, lang="py") for r in data]
    write(path, edited)
    assert ev.main(_run_args(model_dir, path, out, "--reward-fn", "test_reward_fields:by_cases",
                             "--reward-fields", "extra_info.cases,lang")) == 2
    assert "its --reward-fields values differ" in capsys.readouterr().err
    write(path, data)
    # a trailing comma is nothing (as in the trainer's YAML list)
    assert ev.main(_run_args(model_dir, path, out, "--reward-fn", "test_reward_fields:by_cases",
                             "--reward-fields", "extra_info.cases,lang,")) == 0
    capsys.readouterr()
    # other fields into the same folder: refused, the samples kept
    assert ev.main(_run_args(model_dir, path, out, "--reward-fn", "test_reward_fields:takes_anything",
                             "--reward-fields", "lang")) == 2
    assert "reward_fields differ" in capsys.readouterr().err
    for extra, message in ((["--reward-fields", "lang"], "--reward-fields hands dataset fields to --reward-fn"),
                           (["--reward-fn", "test_reward_fields:takes_anything", "--reward-fields", " , "],
                            "names no field"),
                           (["--reward-fn", "test_reward_fields:three_arguments", "--reward-fields", "lang"],
                            "got an unexpected keyword argument 'lang'"),
                           (["--reward-fn", "test_reward_fields:takes_anything", "--reward-fields", "nope"],
                            "toy.jsonl:1: missing field 'nope' that --reward-fields asks for")):
        assert ev.main(_run_args(model_dir, path, tmp_path / "other", *extra)) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "other").exists()
