"""The experiment's results math on damaged run files (sweep of the results math): an evaluation without a step
number and a null greedy accuracy had crashed the whole report, an ``Infinity`` accuracy had passed as a number
(best inf, a NaN interval), and an evaluation after the summary's final one had been taken as the run's best."""
import json
from pathlib import Path

import numpy as np
import pytest

from pacs_fast import experiment as ex
from pacs_fast.experiment_results import collect, run_result


def _run(run_dir: Path, lines: list, final_step: int = 8, acc_after: float = 0.6):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    (run_dir / "summary.json").write_text(json.dumps({"acc_after": acc_after, "final_eval_step": final_step,
                                                      "steps": final_step}))


def _ev(step, acc, **kw):
    return {"kind": "eval", "step": step, "eval/acc": acc, **kw}


@pytest.mark.parametrize("lines, why", [
    ([_ev(0, 0.2), {"kind": "eval", "eval/acc": 0.5}, _ev(8, 0.6)], "an evaluation has step None, not a step number"),
    ([_ev(0, 0.2), _ev("x", 0.5), _ev(8, 0.6)], "an evaluation has step 'x', not a step number"),
    (['{"kind": "eval", "step": 0, "eval/acc": 0.2}', '{"kind": "eval", "step": 4, "eval/acc": Infinity}',
      _ev(8, 0.6)], "the evaluation of step 4 has eval/acc inf, not a number"),
    ([_ev(0, 0.2), _ev(8, 0.6), _ev(12, 0.95)], "metrics.jsonl holds an evaluation of step 12, after the final one "
                                                "(step 8)"),
])
def test_a_damaged_evaluation_names_the_run_instead_of_crashing_or_counting(tmp_path, lines, why):
    jobs = ex.make_jobs([ex.Arm("a", [])], [0, 1], [], tmp_path)
    _run(jobs[0].run_dir, lines)
    _run(jobs[1].run_dir, [_ev(0, 0.2), _ev(4, 0.7), _ev(8, 0.6)])
    damaged = {}
    res = collect(jobs, damaged)
    assert damaged == {("a", 0): why} and list(res["a"]) == [1]
    assert res["a"][1]["best"] == 0.7 and res["a"][1]["final"] == 0.6


def test_a_null_greedy_accuracy_is_left_out_not_a_crash(tmp_path):
    """A seed without a greedy accuracy (null in its final evaluation) neither crashes the report nor turns the
    arm's mean and difference into NaN: both take the seeds with a value, and a note names the seed."""
    arms = [ex.Arm("a", []), ex.Arm("b", [])]
    jobs = ex.make_jobs(arms, [0, 1], [], tmp_path)
    for job in jobs:
        greedy = None if (job.arm.name, job.seed) == ("a", 0) else 0.5
        _run(job.run_dir, [_ev(0, 0.2), _ev(8, 0.6, **{"eval/greedy_acc": greedy, "eval/pass@n": 0.9})])
    assert np.isnan(run_result(jobs[0].run_dir)["greedy"])
    md = ex.report(jobs, arms, "b", tmp_path, "# t")  # (TypeError: None - float)
    assert "| a | 2 | 0.200 ± 0.000 | 0.600 ± 0.000 | 0.600 ± 0.000 | +0.000 [+0.000, +0.000] (n=2)" in md
    assert ("| a | 2 | 0.500 (1 of 2 seeds) | 0.900 ± 0.000 | +0.000 [no interval: one seed] (n=1) | "
            "+0.000 [+0.000, +0.000] (n=2) |") in md
    assert ("- a: greedy (final): seed(s) [0] have no value: the mean takes the other 1, the difference the seeds "
            "with a value in both arms") in md
    stats = json.loads((tmp_path / "results.json").read_text())["stats"]["a"]
    assert stats["greedy"]["mean"] == 0.5 and stats["greedy"]["per_seed"] == [None, 0.5]
    assert stats["greedy_minus_b"]["seeds"] == [1]


def test_an_arm_whose_seeds_all_lack_a_value_says_so(tmp_path):
    arms = [ex.Arm("a", []), ex.Arm("b", [])]
    jobs = ex.make_jobs(arms, [0, 1], [], tmp_path)
    for job in jobs:
        greedy = None if job.arm.name == "a" else 0.5
        _run(job.run_dir, [_ev(0, 0.2), _ev(8, 0.6, **{"eval/greedy_acc": greedy, "eval/pass@n": 0.9})])
    md = ex.report(jobs, arms, "b", tmp_path, "# t")
    assert "| a | 2 | no value | 0.900 ± 0.000 | no seed with a value in both | +0.000 [+0.000, +0.000] (n=2) |" in md
    assert "- a: greedy (final): seed(s) [0, 1] have no value: no mean" in md


def test_steps_only_some_seeds_evaluated_are_named_as_left_out_of_the_curves(tmp_path):
    """One seed evaluated every 2 steps, the other every 4: the curves plot steps 0, 4 and 8 (every seed's), and
    results.md names steps 2 and 6 (they had vanished from curves.png without a word)."""
    from pacs_fast.experiment_results import curve_steps_left_out

    arms = [ex.Arm("a", [])]
    jobs = ex.make_jobs(arms, [0, 1], [], tmp_path)
    _run(jobs[0].run_dir, [_ev(s, 0.1 * s / 2) for s in (0, 2, 4, 6, 8)], acc_after=0.4)
    _run(jobs[1].run_dir, [_ev(s, 0.1 * s / 2) for s in (0, 4, 8)], acc_after=0.4)
    md = ex.report(jobs, arms, None, tmp_path, "# t")
    assert curve_steps_left_out(collect(jobs)["a"]) == [2, 6]
    assert "left out, evaluated by only some seeds: a: steps [2, 6]." in md
    assert (tmp_path / "curves.png").stat().st_size > 0
