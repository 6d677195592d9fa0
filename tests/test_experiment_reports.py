"""The experiment runner's report and settings under hostile use (sweep of 2026-12-01): a finished run whose files
are damaged is named and left out of the tables (a torn summary.json had crashed the report, a torn line of
metrics.jsonl had shifted "step 0" and "final", and a missing metrics.jsonl read as success); a runner whose runs
all fail leaves the folder's results as they were; a report that cannot be written is printed with one error line;
``--report`` with arms takes the recorded seeds and baseline; spec.json records the config's absolute path; two
overrides glued by a space, runner keys in a config file and an empty config.yaml are refused; the quiet defaults
yield to a config file; a note says when the baseline's mean takes seeds the difference does not pair."""
import json
from pathlib import Path

import numpy as np
import pytest

from pacs_fast import experiment as ex
from pacs_fast.experiment_args import parse_args, spec_defaults
from pacs_fast.experiment_results import ReportNotWritten, collect, run_result

from test_experiment import TINY


def _finished(run_dir: Path, accs: dict, *, final_step=None, summary=None):
    """A finished run folder: eval records at ``accs``' steps, a summary of the last (or ``final_step``)."""
    run_dir.mkdir(parents=True)
    final_step = max(accs) if final_step is None else final_step
    lines = [json.dumps({"kind": "eval", "step": s, "eval/acc": a}) for s, a in sorted(accs.items())]
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    text = json.dumps({"acc_before": accs.get(0), "acc_after": accs.get(final_step), "final_eval_step": final_step,
                       "steps": final_step}) if summary is None else summary
    (run_dir / "summary.json").write_text(text)


def test_the_numbers_are_read_by_their_steps_and_a_damaged_run_is_named(tmp_path):
    jobs = ex.make_jobs([ex.Arm("a", [])], [0, 1, 2, 3, 4, 5, 6], [], tmp_path)
    runs = {job.seed: job.run_dir for job in jobs}
    _finished(runs[0], {0: 0.25, 2: 0.75, 4: 0.5})
    _finished(runs[1], {0: 0.25, 2: 0.5}, summary='{"acc_before": 0.25, "acc_af')  # torn summary.json
    _finished(runs[2], {0: 0.25, 2: 0.75, 4: 0.5})
    lines = (runs[2] / "metrics.jsonl").read_text().splitlines()
    (runs[2] / "metrics.jsonl").write_text("\n".join(lines[:2] + [lines[2][:20]]) + "\n")  # the final eval torn
    _finished(runs[3], {0: 0.25, 2: 0.5})
    (runs[3] / "metrics.jsonl").unlink()
    _finished(runs[4], {0: 0.25, 2: 0.5})
    (runs[4] / "metrics.jsonl").write_text('{"kind": "eval", "step": 0, "eval/acc": null}\n'
                                           '{"kind": "eval", "step": 2, "eval/acc": 0.5}\n')
    _finished(runs[5], {2: 0.5, 4: 0.75})  # the step-0 evaluation lost
    _finished(runs[6], {0: 0.25, 2: 0.5})
    (runs[6] / "metrics.jsonl").write_text('{"kind": "train", "step": 1}\n')  # no evaluation at all
    got = run_result(runs[0])
    assert (got["start"], got["final"], got["best"], got["curve"]) == (0.25, 0.5, 0.75, [(0, 0.25), (2, 0.75), (4, 0.5)])
    damaged = {}
    res = collect(jobs, damaged)
    assert list(res["a"]) == [0]
    assert damaged == {("a", 1): "summary.json cannot be read (JSONDecodeError)",
                       ("a", 2): "metrics.jsonl holds no evaluation of step 4 (the final one)",
                       ("a", 3): "metrics.jsonl is missing",
                       ("a", 4): "the evaluation of step 0 has eval/acc None, not a number",
                       ("a", 5): "metrics.jsonl holds no evaluation of step 0",
                       ("a", 6): "metrics.jsonl holds no held-out evaluation"}
    md = ex.report(jobs, [ex.Arm("a", [])], None, tmp_path, "# t")
    assert "- a: seed 2 finished, but its files are damaged (metrics.jsonl holds no evaluation of step 4 (the " \
           "final one)): not in the tables" in md
    assert "did not finish" not in md  # (they did: the missing metrics.jsonl had been named so, exit status 0)


def test_a_runner_whose_runs_all_fail_keeps_the_folders_results(tmp_path, capsys, warm_cache, monkeypatch):
    out = tmp_path / "exp"
    out.mkdir()
    (out / "results.md").write_text("the earlier table")
    config = tmp_path / "common.yaml"
    config.write_text("train:\n  eval_every: 1\n")
    monkeypatch.chdir(tmp_path)
    code = ex.main(["--out", str(out), "--arms", "pacs", "--seeds", "7", "--timeout", "0.1", "--config",
                    "common.yaml", f"warmup.cache_dir={warm_cache}", *TINY])
    err = capsys.readouterr().err
    assert code == 1 and "no run of these arms and seeds has finished" in err, err
    assert (out / "results.md").read_text() == "the earlier table" and not (out / "results.json").exists()
    assert json.loads((out / "spec.json").read_text())["config"] == str(config)  # (absolute: --report elsewhere)


def test_a_report_that_cannot_be_written_is_printed_with_one_error_line(tmp_path, capsys):
    jobs = ex.make_jobs([ex.Arm("a", [])], [0], [], tmp_path)
    _finished(jobs[0].run_dir, {0: 0.25, 2: 0.5})
    (tmp_path / "results.md").mkdir()  # (as a full disk or a read-only folder refuses the file)
    with pytest.raises(ReportNotWritten) as e:
        ex.report(jobs, [ex.Arm("a", [])], None, tmp_path, "# t")
    assert "| a | 1 | 0.250 | 0.500 | 0.500 |" in e.value.md
    assert ex._print_report(jobs, [ex.Arm("a", [])], None, tmp_path, "# t") == 1
    printed = capsys.readouterr()
    assert "| a | 1 |" in printed.out and printed.err.startswith(f"error: cannot write {tmp_path / 'results.md'} (")


def test_report_with_arms_takes_the_recorded_seeds_and_baseline(tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps({"arms": {"a": [], "b": []}, "seeds": [0, 1], "baseline": "b"}))
    arms = [ex.Arm("a", []), ex.Arm("b", [])]
    a = parse_args(["--out", str(tmp_path), "--report", "--arms", "pacs,grpo"])
    spec_defaults(a, arms)
    assert (a.seeds, a.baseline) == ("0,1", "b")
    a = parse_args(["--out", str(tmp_path), "--report", "--arms", "pacs,grpo", "--seeds", "3", "--baseline", "grpo"])
    spec_defaults(a, arms)
    assert (a.seeds, a.baseline) == ("3", "grpo")  # (what the command line gives wins)
    a = parse_args(["--out", str(tmp_path), "--report", "--arms", "pacs,grpo"])
    spec_defaults(a, arms[:1])  # the recorded baseline is not among the arms reported: no difference columns
    assert (a.seeds, a.baseline) == ("0,1", None)


def test_overrides_glued_by_a_space_and_runner_keys_in_a_config_file_are_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match=r"'train.project=p learner.lr=2e-5' holds 'learner.lr=' after a space: "
                                         r"separate an arm's overrides with commas"):
        ex.parse_arm("a:train.project=p learner.lr=2e-5")
    assert ex.parse_arm("a:data.instruction=Think. Then answer: x=1.").overrides == [
        "data.instruction=Think. Then answer: x=1."]
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  seed: 7\n")
    assert ex.main(["--out", str(tmp_path / "o"), "--arms", "pacs", "--config", str(config)]) == 2
    assert f"--config {config}: 'train.seed=': the runner owns train.seed" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_quiet_defaults_yield_to_a_config_file(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  plots: true\n")
    job = ex.make_jobs([ex.parse_arm("pacs")], [0], [], tmp_path / "o", str(config))[0]
    cfg = ex.intended_config(str(config), job.argv)
    assert cfg.train.plots is True and cfg.train.tensorboard is False  # (the file's plots had been turned off)


def test_an_empty_config_yaml_is_refused_not_compared_as_the_defaults(tmp_path):
    job = ex.make_jobs([ex.parse_arm("pacs")], [0], TINY, tmp_path)[0]
    _finished(job.run_dir, {0: 0.25, 2: 0.5})
    (job.run_dir / "config.yaml").write_text("")
    with pytest.raises(ValueError, match="config.yaml is empty or cannot be read: this run's settings are unknown"):
        ex.job_state(job, None)
    with pytest.raises(ValueError, match="is empty or cannot be read"):  # (--restart-mismatched had deleted it)
        ex.plan([job], None, restart_mismatched=True)
    assert (job.run_dir / "summary.json").is_file()


def test_an_out_folder_that_cannot_be_written_is_named_as_out(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("pacs_fast.config.paths.write_problem", lambda folder: "Read-only file system")
    assert ex.main(["--out", str(tmp_path / "o"), "--arms", "pacs", "--seeds", "0", *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out '{tmp_path / 'o'}' cannot hold the runs' folders (Read-only file system") \
        and "choose another --out" in err and "train.out_dir" not in err, err


def test_a_baseline_with_seeds_the_arm_lacks_is_noted():
    mk = lambda final: {"start": 0.1, "final": final, "best": final, "greedy": 0.5, "pass_n": 0.5,  # noqa: E731
                        "curve": [(0, 0.1), (5, final)]}
    res = {"a": {0: mk(0.5)}, "b": {0: mk(0.4), 1: mk(0.8)}}
    text, stats = ex.table(res, [ex.Arm("a", []), ex.Arm("b", [])], "b")
    assert "- b: seed(s) [1] have no finished a run: the differences of a pair seeds [0], b's mean takes all 2" in text
    assert stats["a"]["final_minus_b"]["mean"] == pytest.approx(0.1)  # not 0.5 - 0.6
    assert np.isclose(stats["b"]["final"]["mean"], 0.6)


def test_a_restart_deletes_a_run_folder_in_one_step(tmp_path, monkeypatch):
    # (a stop inside shutil.rmtree had left files without config.yaml under the run's name: refused ever after)
    import shutil as sh

    job = ex.make_jobs([ex.parse_arm("pacs")], [0], TINY, tmp_path)[0]
    job.run_dir.mkdir(parents=True)
    from pacs_fast.config.loading import save_config
    save_config(ex.intended_config(None, job.argv), job.run_dir / "config.yaml")  # started, no checkpoint: restart
    (job.run_dir / "metrics.jsonl").write_text("")
    real = sh.rmtree

    def interrupted(path, *a, **kw):
        if not Path(path).name.startswith((job.run_dir.name, f".{job.run_dir.name}")):  # (the config check's test)
            return real(path, *a, **kw)
        (Path(path) / "config.yaml").unlink()  # as far as a Ctrl-C lets it get
        raise KeyboardInterrupt

    monkeypatch.setattr(sh, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ex.plan([job], None, restart_mismatched=False)
    monkeypatch.setattr(sh, "rmtree", real)
    assert not job.run_dir.exists()  # the run's name is free: the next runner starts it afresh
    todo, done = ex.plan([job], None, restart_mismatched=False)
    assert [state for _, state in todo] == ["fresh"] and not list(job.run_dir.parent.glob(".*deleting-*"))
