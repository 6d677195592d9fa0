"""maj@k (majority-vote accuracy): the block estimator against hand and brute-force counts, the answer classes
(math-verify's equivalence), the eval's results.json against a recomputation from its samples file, and folders
written before maj@k (no ``answers`` in the samples, no ``maj_at_k`` in results.json) that still load and report."""
import dataclasses
import json
import random
import time

import pytest

from pacs_fast import eval as ev
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.evaluation.majority import answer_classes, class_correctness, majority_at_k, records_majority
from pacs_fast.evaluation.results import is_correct, load_results, read_samples
from pacs_fast.reward import answers as an
from pacs_fast.reward.answers import extract_answer, same_answer
from pacs_fast.reward.verifier import NO_ANSWER, OK, normalize_math_text, score_item
from pacs_fast.rollout.hf import HFEngine


def _maj(answers, correct_answers, k):
    """maj@k of string answers, a class per distinct string, correct when in ``correct_answers``."""
    classes = answer_classes(answers, lambda a, b: False)
    ok = class_correctness(classes, [a in correct_answers for a in answers])
    return majority_at_k(classes, ok, k)


@pytest.mark.parametrize("answers, k, expected", [
    # a tie in each block: half a credit (1 of the 2 tied classes is correct)
    (["a", "b", "a", "b"], 1, 0.5), (["a", "b", "a", "b"], 2, 0.5), (["a", "b", "a", "b"], 4, 0.5),
    # a block without a vote scores 0; "a" wins the other
    ([None, None, "a", "a"], 2, 0.5), ([None, None, "a", "a"], 1, 0.5), ([None, None, "a", "a"], 4, 1.0),
    # n = 5 not a multiple of k: blocks [a b] (tie: 1/2) and [b b] (0); the 5th sample is left out
    (["a", "b", "b", "b", "a"], 2, 0.25), (["a", "b", "b", "b", "a"], 4, 0.0), (["a", "b", "b", "b", "a"], 1, 0.4),
    (["a", "b", "b", "b", "a"], 5, 0.0),
    # a three-way tie with one correct class: 1/3; the wrong "c" alone wins the second block
    (["a", "b", "c", "c", "c", "b"], 3, (1 / 3 + 0) / 2),
    ([None, None, None], 3, 0.0),  # no vote at all
])
def test_block_estimator_against_hand_counts(answers, k, expected):
    """Exact: the credits are ratios of small integers ("a" is the correct answer)."""
    assert _maj(answers, {"a"}, k) == pytest.approx(expected, abs=1e-12)


def _brute_force(classes, class_ok, k):
    """An independent count: per block, the votes tallied by hand, the top classes listed, ties split."""
    credits = []
    for start in range(0, len(classes) - k + 1, k):
        tally = {}
        for c in classes[start:start + k]:
            if c is not None:
                tally[c] = tally.get(c, 0) + 1
        if not tally:
            credits.append(0.0)
            continue
        top = [c for c in tally if tally[c] == max(tally.values())]
        credits.append(len([c for c in top if class_ok[c]]) / len(top))
    return sum(credits) / len(credits)


def test_block_estimator_against_a_brute_force_count(seed):
    rng = random.Random(seed)
    for _ in range(300):
        n = rng.randint(1, 13)
        answers = [rng.choice([None, "1", "2", "3", "4"]) for _ in range(n)]
        classes = answer_classes(answers, lambda a, b: False)
        ok = class_correctness(classes, [a == "2" for a in answers])
        for k in range(1, n + 1):
            assert majority_at_k(classes, ok, k) == pytest.approx(_brute_force(classes, ok, k), abs=1e-12)
    with pytest.raises(ValueError, match="k = 3"):
        majority_at_k([0, 0], {0: True}, 3)


def test_classes_are_ordered_by_count_and_compared_with_their_representative():
    calls = []

    def same(a, b):
        calls.append((a, b))
        return a.rstrip("!") == b.rstrip("!")

    answers = ["x", "y", "y", None, "y!", "x", "y", "z"]
    # y (3 votes) first, then x (2), then y! (joins y), then z; identical strings are never compared
    assert answer_classes(answers, same) == [1, 0, 0, None, 0, 1, 0, 2]
    assert all(a != b for a, b in calls) and len(calls) == 1 + 1 + 2  # x: 1 class, y! (joins y at once), z: 2
    # past max_compared distinct strings, each is its own class (not compared at all)
    calls.clear()
    assert answer_classes(answers, same, max_compared=2) == [1, 0, 0, None, 2, 1, 0, 3] and len(calls) == 1
    # past max_comparisons calls of same, no more are made: z is a class of its own (it had matched nothing anyway)
    calls.clear()
    assert answer_classes(answers, same, max_comparisons=2) == [1, 0, 0, None, 0, 1, 0, 2] and len(calls) == 2
    calls.clear()
    assert answer_classes(answers, same, max_comparisons=1) == [1, 0, 0, None, 2, 1, 0, 3] and len(calls) == 1


def test_a_class_is_correct_by_the_majority_of_its_members():
    """Members of one class whose stored scores disagree (math-verify's equivalence is not transitive): more than
    half of them correct makes the class correct; a tie does not."""
    classes = [0, 0, 0, 1, 1, 2]
    correct = [True, True, False, True, False, False]
    assert class_correctness(classes, correct) == {0: True, 1: False, 2: False}


def test_equivalent_answers_are_one_class():
    """The spec's cases: \\frac{1}{2}, 0.5 and 1/2 are one class, 2 another; set answers in either spelling; an
    inequality and its interval (math-verify says so one way only: both ways makes it symmetric)."""
    same = same_answer
    answers = ["\\frac{1}{2}", "0.5", "1/2", "2", "0.5", "3,5", "\\{3,5\\}", "x>1", "(1,\\infty)"]
    classes = answer_classes(answers, same)
    assert classes[0] == classes[1] == classes[2] == classes[4] and classes[3] != classes[0]
    assert classes[5] == classes[6] and classes[7] == classes[8] and len(set(classes)) == 4
    assert not same("1/2", "2") and same("x>1", "(1,\\infty)") and same("(1,\\infty)", "x>1")
    assert same("7", "7") and not same("7", "+8") and same("\\frac{10}{2}", "5")


def test_a_comparison_that_runs_past_the_time_limit_is_not_the_same(monkeypatch):
    """A comparison that would say "the same" after 3 s is cut at 0.2 s: not the same."""
    monkeypatch.setattr(an, "_same_unlimited", lambda a, b: time.sleep(3) or True)
    assert same_answer("a", "b", time_limit=0.2) is False


def test_an_answer_that_cannot_be_compared_in_time_is_compared_no_more(monkeypatch):
    """An answer math-verify cannot compare within the limit (a tower of powers) costs one limit, not one per class
    it would be compared with (each comparison with it would run to the limit: up to 4,096 of them a problem)."""
    from pacs_fast.evaluation.majority import slow_answers_skipped

    calls = []

    def compare(a, b):
        calls.append((a, b))
        if "slow" in (a, b):
            time.sleep(3)
        return False

    monkeypatch.setattr(an, "_same_unlimited", compare)
    answers = ["a", "a", "slow", "b", "c", "d", "slow2"]
    classes = answer_classes(answers, slow_answers_skipped(0.2))
    assert len(set(classes)) == 6  # every distinct answer its own class
    slow_calls = [c for c in calls if "slow" in c]
    assert len(slow_calls) == 1, calls  # (without the skip: 5, one more for each answer after it)


@pytest.mark.parametrize("extraction", ["reference", "boxed"])
def test_extraction_agrees_with_the_verifiers_status(extraction):
    """A response has an answer exactly when the verifier does not score it no_answer (the same reading)."""
    responses = ["so \\boxed{\\frac{1}{2}}", "the final answer is 0.5", "I get 7 apples", "nothing here",
                 "\\boxed{3} and \\boxed{5}", "\\boxed {+05}", "\\fbox{4}", "\\boxed{1\\,000}", "open \\boxed{12",
                 "\\boxed{12.}", "Final answer is $\\boxed{2}$"]
    for r in responses:
        status = score_item(r, "5", extraction=extraction).status
        assert status in (OK, NO_ANSWER)
        assert (extract_answer(r, extraction) is None) == (status == NO_ANSWER), r
    assert [extract_answer(r, extraction) for r in responses[4:8]] == ["3,5", "5", "4", "1000"]
    # the fast path (one boxed integer: no math-verify) gives what math-verify extracts
    for r in ("\\boxed{+05}", "so \\boxed{ 12 } apples", "\\boxed{1\\,000}", "\\boxed{-0}"):
        fast = an._fast_integer_answer(r) or an._fast_integer_answer(normalize_math_text(r))
        assert fast is not None and fast == an._extract_unlimited(normalize_math_text(r), extraction), r
    assert extract_answer("the answer is 7", "boxed") is None and extract_answer("the answer is 7") == "7"


# -- the eval end to end ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _eval(model_dir, tmp_path, *extra, n=4):
    rows = [{"id": f"q{i}", "problem": f"{i}+{i}=", "answer": str(2 * i)} for i in range(3)]
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    assert ev.main(["--model", str(model_dir), "--benchmarks", str(data), "--n", str(n), "--max-tokens", "6",
                    "--engine", "hf", "--out", str(out), "--no-progress", "--samples-per-call", "8",
                    "--scorer-workers", "1", *extra]) == 0
    return out


FIXED = [  # problem i (gold 2i) gets these 4 responses, whatever the tiny model writes
    ["\\boxed{0}", "\\boxed{1}", "\\boxed{1}", "\\boxed{0.0}"],        # 0 vs 1, 2 votes each: ties
    ["\\boxed{2}", "\\boxed{\\frac{4}{2}}", "\\boxed{3}", "nothing"],   # 2 (two spellings) wins
    ["\\boxed{5}", "\\boxed{5}", "\\boxed{4}", "\\boxed{5}"],          # 5 (wrong) wins
]


@pytest.fixture
def fixed_responses(monkeypatch):
    real = HFEngine.generate

    def fixed(self, prompts, params):
        outs = real(self, prompts, params)
        start = fixed.done  # (the calls come in problem order: problems 0 and 1, then 2)
        fixed.done += len(outs)
        return [[dataclasses.replace(c, text=FIXED[start + i][j]) for j, c in enumerate(comp)]
                for i, comp in enumerate(outs)]

    fixed.done = 0
    monkeypatch.setattr(HFEngine, "generate", fixed)


def test_results_hold_maj_at_k_as_the_samples_give_it(model_dir, tmp_path, fixed_responses, capsys):
    """Known responses (exact: ratios of small integers): maj@1 is the share in a correct class,
    (2/4 + 2/4 + 1/4) / 3; maj@2 = (blocks [0 1] and [1 0.0] ties: 1/2 each; [2 4/2] 1, [3 none] 0; [5 5] 0,
    [4 5] tie 1/2) / 3; maj@4 = (2-2 tie 1/2 + 1 + 0) / 3."""
    out = _eval(model_dir, tmp_path, "--k", "1,2,4")
    toy = load_results(out / "results.json")["benchmarks"]["toy"]
    expected = {"1": (2 / 4 + 2 / 4 + 1 / 4) / 3, "2": ((0.5 + 0.5) / 2 + (1 + 0) / 2 + (0 + 0.5) / 2) / 3,
                "4": (0.5 + 1 + 0) / 3}
    assert toy["maj_at_k"] == pytest.approx(expected, abs=1e-12) and set(toy["maj_at_k"]) == set(toy["pass_at_k"])
    recs = read_samples(out / "samples_toy.jsonl")
    assert recs[1]["answers"] == ["2", "\\frac{4}{2}", "3", None] and recs[0]["answers"][3] == "0.0"
    table = capsys.readouterr().out
    assert "toy maj@4" in table and f"{100 * expected['4']:.2f}" in table


def test_maj_at_k_of_a_sampled_run_equals_a_recomputation(model_dir, tmp_path):
    """The tiny model's own (random) responses: results.json's maj@k is the samples file's, recomputed from the
    stored answers and again from the responses alone (the answers re-extracted)."""
    out = _eval(model_dir, tmp_path, "--temperature", "1.0", n=8)
    toy = load_results(out / "results.json")["benchmarks"]["toy"]
    recs = [r for _, r in sorted(read_samples(out / "samples_toy.jsonl").items())]
    assert all(len(r["answers"]) == 8 for r in recs)
    assert toy["maj_at_k"] == records_majority(recs, [1, 2, 4, 8], "reference", 5.0, correct=is_correct)
    bare = [{k: v for k, v in r.items() if k != "answers"} for r in recs]
    assert records_majority(bare, [1, 2, 4, 8], "reference", 5.0, correct=is_correct) == toy["maj_at_k"]


def test_old_folders_load_and_report(model_dir, tmp_path, fixed_responses, capsys):
    """A folder from before maj@k: samples without ``answers`` and a results.json without ``maj_at_k`` load,
    compare with a new one (no maj@k column where one side lacks it), and ``eval report`` adds maj@k from the
    responses, equal to the run's own."""
    out = _eval(model_dir, tmp_path, "--k", "1,2,4")
    new = load_results(out / "results.json")
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    path = out / "samples_toy.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    (old_dir / "samples_toy.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "answers"})
                                                       + "\n" for r in recs))
    old = json.loads((out / "results.json").read_text())
    del old["benchmarks"]["toy"]["maj_at_k"]
    (old_dir / "results.json").write_text(json.dumps(old))
    (old_dir / "run_config.json").write_text((out / "run_config.json").read_text())
    assert "maj_at_k" not in load_results(old_dir / "results.json")["benchmarks"]["toy"]
    capsys.readouterr()
    assert ev.main(["compare", str(old_dir), str(out), "--out", str(tmp_path / "c.png"), "--labels", "old,new"]) == 0
    assert "maj@" not in capsys.readouterr().out  # (the old side has none)
    assert ev.main(["report", "--out", str(old_dir)]) == 0
    assert load_results(old_dir / "results.json")["benchmarks"]["toy"]["maj_at_k"] == new["benchmarks"]["toy"][
        "maj_at_k"]
    capsys.readouterr()
    table = tmp_path / "t.md"
    assert ev.main(["compare", str(old_dir), str(out), "--out", str(tmp_path / "c.png"), "--labels", "old,new",
                    "--table", str(table)]) == 0
    assert "| old |" in table.read_text() and "toy maj@4" in table.read_text()
    # a hand-edited maj@k is refused, as a pass@k is
    edited = json.loads((out / "results.json").read_text())
    edited["benchmarks"]["toy"]["maj_at_k"]["2"] = 1.5
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    with pytest.raises(ValueError, match="toy.maj_at_k"):
        load_results(tmp_path / "edited.json")
    # and hand-edited answers in a samples line
    recs[0]["answers"] = recs[0]["answers"][:2]
    (tmp_path / "bad.jsonl").write_text(json.dumps(recs[0]) + "\n")
    with pytest.raises(ValueError, match="answers must be a list"):
        read_samples(tmp_path / "bad.jsonl")


def test_a_users_reward_has_no_maj_at_k(tmp_path):
    """Scores of a user's --reward-fn are no verifier verdicts on an extracted answer: no maj@k is made up."""
    recs = [{"benchmark": "toy", "index": 0, "id": "0", "answer": "1", "n": 2, "scores": [1.0, 0.0],
             "statuses": ["ok", "ok"], "responses": ["\\boxed{1}", "\\boxed{2}"]}]
    (tmp_path / "samples_toy.jsonl").write_text(json.dumps(recs[0]) + "\n")
    (tmp_path / "run_config.json").write_text(json.dumps({"reward_fn": "my_mod:score", "extraction": "reference"}))
    assert ev.main(["report", "--out", str(tmp_path)]) == 0
    assert "maj_at_k" not in load_results(tmp_path / "results.json")["benchmarks"]["toy"]
    (tmp_path / "run_config.json").unlink()  # (no settings: the verifier's reference extraction, as pass@k reads)
    assert ev.main(["report", "--out", str(tmp_path)]) == 0
    assert load_results(tmp_path / "results.json")["benchmarks"]["toy"]["maj_at_k"] == {"1": 0.5, "2": 0.5}


def test_a_slow_answer_does_not_shut_the_class_it_was_compared_with(monkeypatch):
    """A tower of powers timing out against the most common answer marks the tower slow, not that answer: a later
    string equal to it still joins its class (marking both split "1/2" and "0.5", and the vote went to the tower).
    The timeout is simulated (``same_answer`` answers None, its on_timeout): no clock involved."""
    from pacs_fast.evaluation.majority import problem_majority, slow_answers_skipped

    equal = {frozenset(("1/2", "0.5"))}

    def fake_same(a, b, time_limit=None, *, on_timeout=False):
        if "slow" in (a, b):
            return on_timeout
        return frozenset((a, b)) in equal

    monkeypatch.setattr(an, "same_answer", fake_same)
    answers = ["1/2", "slow", "1/2", "slow", "1/2", "slow", "0.5", "0.5"]
    classes = answer_classes(answers, slow_answers_skipped(1.0))
    assert classes == [0, 1, 0, 1, 0, 1, 0, 0]  # (marking both: "0.5" a class 2 of its own)
    # "1/2" and "0.5": 5 votes to the tower's 3 (marking both: a 3-3 tie of a right and a wrong class, 0.5)
    assert problem_majority(answers, [a != "slow" for a in answers], [8], slow_answers_skipped(1.0)) == {8: 1.0}


def test_a_slow_representative_is_compared_no_more(monkeypatch):
    """The most common answer being the slow one: it is marked at its second timeout (or the first against a string
    compared in time), so it costs at most two limits, not one per later string."""
    from pacs_fast.evaluation.majority import slow_answers_skipped

    calls = []

    def fake_same(a, b, time_limit=None, *, on_timeout=False):
        calls.append((a, b))
        return on_timeout if "slow" in (a, b) else False

    monkeypatch.setattr(an, "same_answer", fake_same)
    answers = ["slow"] * 5 + ["a", "a", "b", "c", "d", "e"]
    classes = answer_classes(answers, slow_answers_skipped(1.0))
    assert len(set(classes)) == 6
    assert sum("slow" in c for c in calls) <= 2, calls  # (marking only b: 5, one per later string)
