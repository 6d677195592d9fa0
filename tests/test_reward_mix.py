"""A mix of rewards: ``reward.fn=verifier,module:function reward.fn_weights=[0.8,0.2]`` (TRL's ``reward_funcs``
with ``reward_weights``). Each response's reward is the weighted sum of its components' rewards; each component's
mean is recorded (``reward/<name>/mean``, ``eval/<name>/mean``); bad settings are one line before any model
loads; a bad component stops the run with one line naming it. ``python -m pacs_fast.eval --reward-fn a,b
--reward-weights 0.5,0.5`` scores the same way."""
import json

import pytest

from pacs_fast.config import load_config, unused_settings, validate
from pacs_fast.config.reward_specs import checked_weights, component_names
from pacs_fast.trainer.reward_mix import make_reward_mix
from pacs_fast.trainer.rewards import Scorer
from pacs_fast.trainer.user_functions import UserFunctionError

from test_run_safety import cache, cli  # noqa: F401  (fixture)
from test_train import TINY
from test_eval_cli import _run_args, dataset, model_dir  # noqa: F401,E402  (fixtures)

SEEN: dict[str, list] = {"short": [], "lang": []}


def short(problems, responses, answers):
    SEEN["short"].append(list(responses))
    return [float(len(r) < 12) for r in responses]


def has_digit(problems, responses, answers):
    return [float(any(ch.isdigit() for ch in r)) for r in responses]


class Other:
    @staticmethod
    def short(problems, responses, answers):  # (the same name as short above: the metric names keep them apart)
        return [float(len(r) < 3) for r in responses]


def hangs(problems, responses, answers):
    import time
    time.sleep(30)


def too_large(problems, responses, answers):
    return [1.5] * len(responses)


def raises(problems, responses, answers):
    raise KeyError("no such test")


def any_fields(problems, responses, answers, **fields):
    return [float(x == "py") for x in fields["lang"]]


def lang(problems, responses, answers, lang):
    SEEN["lang"].append(sorted(zip(responses, lang)))
    return [float(x == "py") for x in lang]


class FakeVerifier:
    """The verifier's batch scorer as the mix uses it: ``score(texts, answers).scores`` (1 when the answer
    appears in the response)."""

    def __init__(self):
        self.calls, self.closed = 0, False

    def score(self, texts, answers):
        self.calls += 1
        return type("R", (), {"scores": [float(a in t) for t, a in zip(texts, answers)]})()

    def close(self):
        self.closed = True


@pytest.mark.parametrize("fn,weights,message", [
    ("verifier,m:f", [0.5, 0.6], r"reward.fn_weights must sum to 1 .* \(sum 1.1\)"),
    ("verifier,m:f", [1.5, -0.5], r"reward.fn_weights must be finite and >= 0"),
    ("verifier,m:f", [1.0], r"reward.fn_weights has 1 weights for the 2 components of reward.fn \(verifier, m:f\)"),
    ("m:f", [1.0], r"reward.fn_weights weighs the components of a list in reward.fn .* names one, m:f: leave "
                   r"reward.fn_weights out"),
    ("verifier,verifier", [], r"reward.fn names 'verifier' twice"),
    ("verifier,score", [], r"reward.fn: 'score' is neither 'verifier' \(the math verifier\) nor 'module:function'"),
    ("verifier,m:f", ["a", "b"], r"reward.fn_weights must be numbers"),
    ("verifier,m:f", [True, False], r"reward.fn_weights must be numbers, got \[True, False\]"),
])
def test_bad_settings_are_one_line_naming_the_key(fn, weights, message):
    cfg = load_config(None, [f"reward.fn={fn}", f"reward.fn_weights={json.dumps(weights)}"])
    with pytest.raises(ValueError, match=message):
        validate(cfg)


def test_weights_default_equal_sum_within_rounding_and_names_stay_apart():
    assert checked_weights("verifier,a:f,b:g", []) == [1 / 3] * 3
    assert checked_weights("verifier,a:f,b:g", [0.7, 0.2, 0.1]) == [0.7, 0.2, 0.1]  # (sums to 0.9999999999999999)
    assert component_names(["verifier", "a:score", "b.c:score", "d:x.run"]) == ["verifier", "a:score", "b.c:score",
                                                                                  "run"]
    assert component_names(["a.b:c", "a:b.c"]) == ["a.b:c", "a:b.c"]  # (with ':' as '.', both were a.b.c)
    with pytest.raises(ValueError, match="reward.fn_fields hands dataset fields to reward.fn"):
        validate(load_config(None, ["reward.fn=verifier", "reward.fn_fields=[tests]"]))
    validate(load_config(None, ["reward.fn=verifier"]))  # (the verifier alone: the default)
    validate(load_config(None, ["reward.fn=verifier,"]))  # (a stray comma, as in a list)
    with pytest.raises(ValueError, match="a mix of rewards in reward.fn gives weighted sums"):
        validate(load_config(None, ["reward.fn=verifier,m:f", "reward.noise_fp=0.1"]))


def test_which_settings_a_mix_leaves_unused():
    mixed = unused_settings(load_config(None, ["reward.fn=verifier,test_reward_mix:short",
                                               "reward.extraction=boxed"]))
    assert not any("reward.extraction" in line for line in mixed), mixed  # the verifier still scores
    alone = unused_settings(load_config(None, ["reward.fn=test_reward_mix:short,test_reward_mix:has_digit",
                                               "reward.extraction=boxed"]))
    assert any("reward.extraction" in line for line in alone), alone
    one = unused_settings(load_config(None, ["reward.fn=test_reward_mix:short", "reward.fn_weights=[]"]))
    assert not any("reward.fn_weights" in line for line in one)
    with pytest.raises(ValueError, match="reward.fn_weights weighs the components of a list"):
        validate(load_config(None, ["reward.fn_weights=[0.5, 0.5]"]))


def test_the_mix_is_the_weighted_sum_and_keeps_each_part():
    verifier = FakeVerifier()
    mix = make_reward_mix("verifier,test_reward_mix:short,test_reward_mix:has_digit", [0.5, 0.3, 0.2],
                          keywords=[], verifier_factory=lambda: verifier)
    texts = ["the answer is 4", "4", "five", "a long answer without it"]
    answers = ["4", "4", "5", "9"]
    got = mix(["p"] * 4, texts, answers)
    v = [float(a in t) for t, a in zip(texts, answers)]
    s = [float(len(t) < 12) for t in texts]
    d = [float(any(ch.isdigit() for ch in t)) for t in texts]
    assert got == pytest.approx([0.5 * a + 0.3 * b + 0.2 * c for a, b, c in zip(v, s, d)], abs=1e-15)
    assert mix.last_parts == {"verifier": v, "short": s, "has_digit": d}
    assert len(set(got)) > 2  # (the parts differ across responses: a wrong weight would show)
    mix.close()
    assert verifier.closed


@pytest.mark.parametrize("bad,message", [
    ("too_large", "reward.fn component too_large returned 1.5 as the reward of response 0"),
    ("raises", "reward.fn component raises raised KeyError: 'no such test'"),
])
def test_a_bad_component_is_one_line_naming_it(bad, message):
    mix = make_reward_mix(f"verifier,test_reward_mix:{bad}", [], keywords=[], verifier_factory=FakeVerifier)
    scorer = Scorer(0, user_fn=mix)
    with pytest.raises(UserFunctionError) as e:
        scorer(["4"], ["4"], step=1, problems=["2+2"])
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_two_functions_of_one_name_stay_apart_and_a_hang_names_its_component():
    mix = make_reward_mix("test_reward_mix:short,test_reward_mix:Other.short", [0.25, 0.75], keywords=[],
                          verifier_factory=FakeVerifier)
    got = mix(["p"] * 3, ["ab", "abcdef", "a long response"], ["1"] * 3)
    assert got == [1.0, 0.25, 0.0]  # short: 1, 1, 0; Other.short: 1, 0, 0
    assert mix.last_parts == {"test_reward_mix:short": [1.0, 1.0, 0.0], "test_reward_mix:Other.short": [1.0, 0.0, 0.0]}
    hung = make_reward_mix("test_reward_mix:short,test_reward_mix:hangs", [], keywords=[],
                           verifier_factory=FakeVerifier)
    with pytest.raises(UserFunctionError, match=r"reward.fn did not return within 0.5 s .*; its component hangs was "
                                                r"running"):
        Scorer(0, user_fn=hung, timeout_s=0.5)(["x"], ["1"], step=1, problems=["p"])


def test_the_scorer_records_each_components_mean_over_every_response_memo_or_not():
    """Repeated responses count once per response (the memo scores each distinct one once), and a memo
    cleared since the scoring is scored again."""
    SEEN["short"].clear()
    mix = make_reward_mix("verifier,test_reward_mix:short", [0.6, 0.4], keywords=[], verifier_factory=FakeVerifier)
    scorer = Scorer(0, user_fn=mix)
    texts = ["4", "4", "4", "it is 4, surely, yes", "no"]
    answers, problems = ["4"] * 5, ["2+2"] * 5
    rewards = scorer(texts, answers, step=1, problems=problems)
    assert rewards == pytest.approx([1.0, 1.0, 1.0, 0.6, 0.4])
    assert len(SEEN["short"]) == 1 and len(SEEN["short"][0]) == 3  # three distinct responses
    want = {"reward/verifier/mean": 4 / 5, "reward/short/mean": 4 / 5}
    assert scorer.component_metrics(texts, answers, problems) == pytest.approx(want)
    assert len(SEEN["short"]) == 1  # (read from the memo)
    scorer.memo.clear()
    scorer.parts.clear()
    assert scorer.component_metrics(texts, answers, problems) == pytest.approx(want)
    assert Scorer(0, user_fn=short).component_metrics(texts, answers, problems) == {}  # one function: none


def test_fields_reach_every_function_of_the_mix():
    SEEN["lang"].clear()
    with pytest.raises(ValueError, match="reward.fn component 'test_reward_mix:short' cannot take the call"):
        make_reward_mix("test_reward_mix:lang,test_reward_mix:short", [0.5, 0.5], keywords=["lang"],
                        verifier_factory=FakeVerifier)
    mix = make_reward_mix("test_reward_mix:lang,test_reward_mix:any_fields", [0.5, 0.5], keywords=["lang"],
                          verifier_factory=FakeVerifier)
    scorer = Scorer(0, user_fn=mix)
    got = scorer(["a", "b", "c"], ["1", "1", "1"], problems=["p", "q", "p"],
                 fields=[{"lang": "py"}, {"lang": "rs"}, {"lang": "py"}])
    assert got == [0.5 * 1 + 0.5 * 1, 0.5 * 0 + 0.5 * 0, 0.5 * 1 + 0.5 * 1]
    assert SEEN["lang"] == [[("a", "py"), ("b", "rs"), ("c", "py")]]  # each response with its own row


def test_a_run_trains_on_the_mix_and_records_each_part(tmp_path, cache, capsys):  # noqa: F811
    code, out, err = cli(TINY + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r",
                                 "train.steps=2", "reward.fn=verifier,test_reward_mix:short,test_reward_mix:has_digit",
                                 "reward.fn_weights=[0.5,0.3,0.2]"], capsys)
    assert code == 0, err
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "reward/mean" in r]
    assert len(train) == 2
    for r in train:
        mixed = 0.5 * r["reward/verifier/mean"] + 0.3 * r["reward/short/mean"] + 0.2 * r["reward/has_digit/mean"]
        assert r["reward/mean"] == pytest.approx(mixed, abs=1e-6)
    evals = [r for r in records if "eval/acc" in r]
    assert evals and all({"eval/verifier/mean", "eval/short/mean", "eval/has_digit/mean"} <= set(r) for r in evals)
    for r in evals:
        mixed = 0.5 * r["eval/verifier/mean"] + 0.3 * r["eval/short/mean"] + 0.2 * r["eval/has_digit/mean"]
        assert r["eval/acc"] == pytest.approx(mixed, abs=1e-6)
    samples = [json.loads(x) for x in (tmp_path / "r" / "samples.jsonl").read_text().splitlines()]
    rows = [s for s in samples if "response" in s]
    assert rows and any(0 < s["reward"] < 1 for s in rows)  # weighted sums, not the verifier's 0 / 1
    for s in rows:  # each row's components, as they weigh into its reward
        p = s["reward_parts"]
        assert set(p) == {"verifier", "short", "has_digit"} and p["short"] == float(len(s["response"]) < 12)
        assert s["reward"] == pytest.approx(0.5 * p["verifier"] + 0.3 * p["short"] + 0.2 * p["has_digit"], abs=1e-12)


def test_a_bad_mix_is_one_line_before_any_model(tmp_path, capsys):
    code, out, err = cli(["train.out_dir=" + str(tmp_path), "reward.fn=verifier,no_such_module_q:f"], capsys)
    assert code == 2 and "error: reward.fn='no_such_module_q:f' cannot be loaded" in err, err
    assert not (tmp_path / "runs").exists() and not list(tmp_path.iterdir())


def _odd(text: str) -> int:
    return sum(map(ord, text)) % 2


def test_eval_scores_a_mix_records_its_weights_and_refuses_others(model_dir, dataset, tmp_path, capsys,  # noqa: F811
                                                                  monkeypatch):
    """The verifier of the mix is --scorer-workers' batch scorer; here one that passes responses whose character
    codes sum to an odd number (a random tiny model never writes a right answer, and the weights must show on both
    parts; at --max-tokens 6 its responses are often all 6 characters, so their length's parity did not vary)."""
    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples

    made = []

    class OddVerifier(FakeVerifier):
        def score(self, texts, answers):
            return type("R", (), {"scores": [float(_odd(t)) for t in texts]})()

    def verifier(args):
        made.append(args.scorer_workers)
        return OddVerifier()

    monkeypatch.setattr(ev, "_verifier", verifier)
    out = tmp_path / "run"
    mix = ["--reward-fn", "verifier,test_reward_mix:short", "--scorer-workers", "0"]
    assert ev.main(_run_args(model_dir, dataset, out, *mix, "--reward-weights", "0.25,0.75")) == 0
    assert made == [0]
    scores, odd, short_ = [], [], []
    for r in read_samples(out / "samples_toy.jsonl").values():
        want = [0.25 * _odd(t) + 0.75 * float(len(t) < 12) for t in r["responses"]]
        assert r["scores"] == pytest.approx(want, abs=1e-12) and r["statuses"] == ["user_fn"] * 2
        # each component's rewards of each response, as the mix weighed them
        assert r["score_parts"] == {"verifier": [float(_odd(t)) for t in r["responses"]],
                                    "short": [float(len(t) < 12) for t in r["responses"]]}
        scores += r["scores"]
        odd += r["score_parts"]["verifier"]
        short_ += r["score_parts"]["short"]
    assert json.loads((out / "run_config.json").read_text())["reward_weights"] == [0.25, 0.75]
    result = json.loads((out / "results.json").read_text())["benchmarks"]["toy"]
    assert result["mean_score"] == pytest.approx(sum(scores) / len(scores), abs=1e-12)
    assert result["mean_score_parts"] == pytest.approx({"verifier": sum(odd) / len(odd),
                                                        "short": sum(short_) / len(short_)}, abs=1e-12)
    assert 0 < sum(odd) < len(odd) or 0 < sum(short_) < len(short_)  # (the parts differ from the mix)
    table = (out / "table.md").read_text()
    assert "| Model | toy (mix) | toy verifier | toy short |" in table
    assert f"{result['mean_score_parts']['short']:.3f} |" in table
    capsys.readouterr()
    assert ev.main(_run_args(model_dir, dataset, out, *mix, "--reward-weights", "0.5,0.5")) == 2
    assert "reward_weights differ" in capsys.readouterr().err
    assert ev.main(_run_args(model_dir, dataset, tmp_path / "new", *mix, "--reward-weights", "0.5,0.6")) == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error:")]
    assert errors == ["error: --reward-weights must sum to 1 (the reward is their weighted sum of rewards in "
                      "[0, 1], so that it stays in [0, 1]), got [0.5, 0.6] (sum 1.1)"], errors
    assert not (tmp_path / "new").exists()
    # weights without a list to weigh; a list written with spaces and a stray comma is recorded as written without
    assert ev.main(_run_args(model_dir, dataset, tmp_path / "new", "--reward-weights", "0.5,0.5")) == 2
    assert "--reward-weights weighs the components of a list in --reward-fn" in capsys.readouterr().err
    assert ev.main(_run_args(model_dir, dataset, tmp_path / "new", "--reward-fn", "m:f", "--reward-weights", "1")) == 2
    assert "(e.g. --reward-fn verifier,my_checks:format_score --reward-weights 0.8,0.2)" in capsys.readouterr().err
    assert ev.main(_run_args(model_dir, dataset, out, "--reward-fn", "verifier, test_reward_mix:short,",
                             "--scorer-workers", "0", "--reward-weights", "0.25,0.75")) == 0  # (the same run)
    # the verifier alone is the default: it reads no fields
    assert ev.main(_run_args(model_dir, dataset, tmp_path / "new", "--reward-fn", "verifier", "--reward-fields",
                             "tests")) == 2
    assert "--reward-fields hands dataset fields to --reward-fn" in capsys.readouterr().err


def _result(label, reward_fn, parts, mean=0.5):
    return {"label": label, "settings": {"reward_fn": reward_fn},
            "benchmarks": {"toy": {"n": 2, "pass_at_k": {"1": 0.5}, "correct_counts": [1], "mean_score": mean,
                                   "mean_score_parts": parts}}}


def test_the_component_table_keys_columns_by_function():
    """A component named `reward` headed its column like the mix's ("toy reward" twice), and `compare` put two
    functions of one name (fmt:score, fmt2:score) in one column, and one function (named `score` in one result,
    `fmt:score` where it clashed) in two (sweep): columns are functions now, the mix is `(mix)`."""
    from pacs_fast.evaluation.report import component_table

    one = component_table([_result("a", "verifier,evenlen:reward", {"verifier": 0.25, "reward": 0.75})])
    assert "| Model | toy (mix) | toy verifier | toy reward |" in one and "| a | 0.500 | 0.250 | 0.750 |" in one
    two = component_table([_result("a", "verifier,fmt:score", {"verifier": 0.1, "score": 0.2}),
                           _result("b", "fmt2:score,fmt:score", {"fmt2:score": 0.3, "fmt:score": 0.4})])
    assert "| Model | toy (mix) | toy verifier | toy fmt:score | toy fmt2:score |" in two, two
    assert "| a | 0.500 | 0.100 | 0.200 | - |" in two and "| b | 0.500 | - | 0.400 | 0.300 |" in two, two
    assert component_table([_result("a", "", {})]) == ""


def test_records_without_parts_leave_the_means_out_with_a_warning():
    """A run resumed from records written before score_parts lost its component means without a word (sweep)."""
    from pacs_fast.evaluation.results import parts_warnings, summarize_benchmark

    recs = [{"index": i, "n": 2, "scores": [1.0, 0.5], "score_parts": {"verifier": [1.0, 0.0], "short": [1.0, 1.0]}}
            for i in range(3)]
    whole = summarize_benchmark(recs)
    assert whole["mean_score_parts"] == {"verifier": 0.5, "short": 1.0} and whole["mean_score"] == 0.75
    del recs[0]["score_parts"]
    part = summarize_benchmark(recs)
    assert "mean_score_parts" not in part and part["score_parts_missing"] == 1
    lines = parts_warnings({"benchmarks": {"toy": part}})
    assert len(lines) == 1 and lines[0].startswith("toy: 1 of 3 problems were scored before")
    assert parts_warnings({"benchmarks": {"toy": whole}}) == []
