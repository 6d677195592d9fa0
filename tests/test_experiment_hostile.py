"""Hostile inputs to the experiment runner (issue 41): a second runner on a live experiment, folders
that are not the runner's own, bad --timeout / --arm / runner-owned keys, failed runs, --report on
nothing. Every refusal is one line, exit status 2, before any run starts."""
import os
import signal
import sys
import threading
import time

import pytest

from pacs_fast import experiment as ex

TINY = ["warmup.steps=0", "model.tiny_hidden_size=32", "model.tiny_num_layers=1", "train.steps=2",
        "train.prompts_per_step=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2",
        "rollout.n=2", "data.eval_size=4", "rollout.eval_n=1", "rollout.max_new_tokens=4",
        "train.eval_every=1", "train.save_every=1", "data.arith_train_size=50"]


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_a_live_run_folder_is_never_deleted_or_reused(tmp_path, capsys, warm_cache):
    """A trainer still in its warm-up holds its run folder's lock and has written nothing else yet:
    the runner must not take that folder for a fresh one (deleting the live run's lock)."""
    from pacs_fast.trainer.run_folder import LOCK_FILE, RunLock
    out = tmp_path / "exp"
    run = out / "runs" / "pacs" / "seed0"
    live = RunLock(run, new=True)  # another open file description than the runner's: held against it
    inode = (run / LOCK_FILE).stat().st_ino
    try:
        code = ex.main(["--out", str(out), "--arms", "pacs", "--seeds", "0", "--timeout", "60",
                        f"warmup.cache_dir={warm_cache}", *TINY])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.count("\n") == 1 and str(run) in err and "in use" in err, err
        assert (run / LOCK_FILE).stat().st_ino == inode and sorted(p.name for p in run.iterdir()) == [LOCK_FILE]
        assert not (out / "runs" / "pacs" / "seed0.log").exists()
    finally:
        live.release()


def test_a_second_runner_on_the_same_out_is_refused(tmp_path, capsys, monkeypatch, warm_cache):
    """Two runners with one --out: the second refuses (naming the folder) while the first lives; the
    first's run is untouched. The runs here are stand-ins that hold the trainer's run lock."""
    fake_trainer = ("import sys, time; from pacs_fast.trainer.run_folder import RunLock; "
                    "lock = RunLock(sys.argv[1], new=True); time.sleep(60)")
    monkeypatch.setattr(ex, "command", lambda job, config, state: [sys.executable, "-c", fake_trainer,
                                                                   str(job.run_dir)])
    out = tmp_path / "exp"
    args = ["--out", str(out), "--arms", "pacs", "--seeds", "0", "--timeout", "15", "--threads", "1",
            f"warmup.cache_dir={warm_cache}", *TINY]
    first: list[int] = []
    thread = threading.Thread(target=lambda: first.append(ex.main(args)))
    thread.start()
    lock = out / "runs" / "pacs" / "seed0" / ".run.lock"
    deadline = time.time() + 30
    while not (lock.is_file() and lock.read_text().strip()) and time.time() < deadline:
        time.sleep(0.1)
    assert lock.read_text().strip(), "the first runner's run never started"
    holder = lock.read_text()
    try:
        assert ex.main(args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(out) in err and "in use" in err, err
        assert lock.read_text() == holder  # the first's run folder is still its own
    finally:
        os.kill(int(holder.split()[0]), signal.SIGKILL)  # its run dies (not waiting out --timeout's 15 s)
        thread.join()
    assert first == [1]  # its run failed: said so in the exit status


def test_a_run_whose_exit_fails_after_its_summary_counts_as_finished(tmp_path, monkeypatch):
    """A run that wrote summary.json but was stopped by --timeout while exiting was logged FAILED and counted in
    "N failed", while the end-of-run check (summary.json) counted it done, and the table held it (kill sweep): one
    rule now, its summary."""
    late = ("import pathlib, sys; from pacs_fast.trainer.run_folder import RunLock; RunLock(sys.argv[1], new=True); "
            "pathlib.Path(sys.argv[1], 'summary.json').write_text('{}'); sys.exit(int(sys.argv[2]))")
    monkeypatch.setattr(ex, "command", lambda job, config, state: [sys.executable, "-c", late, str(job.run_dir),
                                                                   "3" if job.seed == 0 else "0"])
    jobs = ex.make_jobs([ex.parse_arm("pacs")], [0, 1], [], tmp_path)
    lines: list[str] = []
    counts = ex.run_jobs([(job, "fresh") for job in jobs], None, workers=1, threads=1, log=lines.append)
    assert counts == {"finished": 2, "failed": 0}, lines
    assert any("seed 0: done (exit 3 after its summary" in x for x in lines), lines
    assert not any("FAILED" in x for x in lines)


def test_a_folder_that_is_not_its_own_run_is_kept(tmp_path, capsys, warm_cache):
    """A run folder with files but no config.yaml is not provably this experiment's run: refused,
    not deleted."""
    out = tmp_path / "exp"
    run = out / "runs" / "pacs" / "seed0"
    run.mkdir(parents=True)
    (run / "notes.txt").write_text("mine")
    code = ex.main(["--out", str(out), "--arms", "pacs", "--seeds", "0", "--timeout", "60",
                    f"warmup.cache_dir={warm_cache}", *TINY])
    err = one_line_error(capsys)
    assert code == 2 and str(run) in err and "config.yaml" in err
    assert (run / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_timeout_must_be_positive(tmp_path, capsys, value, warm_cache):
    out = tmp_path / "exp"
    code = ex.main(["--out", str(out), "--arms", "pacs", "--seeds", "0", "--timeout", value,
                    f"warmup.cache_dir={warm_cache}", *TINY])
    err = one_line_error(capsys)
    assert code == 2 and f"--timeout {value}" in err and "positive" in err, err
    assert not out.exists()


def test_failed_runs_make_a_nonzero_exit_after_the_report(tmp_path, capsys, warm_cache):
    out = tmp_path / "exp"
    code = ex.main(["--out", str(out), "--arms", "pacs", "--seeds", "0", "--timeout", "0.1",
                    f"warmup.cache_dir={warm_cache}", *TINY])
    printed = capsys.readouterr()
    assert code == 1, printed
    # no run finished: no table (an empty one had replaced the folder's results.md; sweep of 2026-12-01)
    assert not (out / "results.md").exists() and "no run of these arms and seeds has finished" in printed.err
    last = printed.err.strip().splitlines()[-1]
    assert "1 of 1 runs failed" in last and "seed0.log" in last, last
    # why it failed, in the runner's line and in the run's log (a sweep: "FAILED (exit -9...)", no word of the
    # timeout); the run is stopped as a SIGTERM stops a trainer (its clean exit), not killed outright
    assert "FAILED (timed out after --timeout 0.1 s, exit " in printed.out, printed.out
    assert "stopping this run: --timeout 0.1 s reached" in (out / "runs" / "pacs" / "seed0.log").read_text()


@pytest.mark.parametrize("args, key, flag", [
    (["train.seed=3"], "train.seed", "--seeds"),
    (["warmup.seed=7"], "warmup.seed", "--seeds"),
    (["train.out_dir=elsewhere"], "train.out_dir", "--out"),
    (["--arm", "x:algo.name=grpo,train.run_name=mine"], "train.run_name", "--out"),
    (["--arm", "x:train.threads=2"], "train.threads", "--threads"),
    (["--arm", "x:train.tracker_group=g"], "train.tracker_group", "--arm"),
])
def test_keys_the_runner_owns_are_refused(tmp_path, capsys, args, key, flag, warm_cache):
    out = tmp_path / "exp"
    code = ex.main(["--out", str(out), "--arms", "pacs", "--seeds", "0", "--timeout", "60",
                    f"warmup.cache_dir={warm_cache}", *TINY, *args])
    err = one_line_error(capsys)
    assert code == 2 and key in err and flag in err, err
    assert not out.exists()


def test_the_quiet_defaults_yield_to_the_users_settings(tmp_path):
    from pacs_fast.config import load_config
    job = ex.make_jobs([ex.parse_arm("pacs")], [0], ["train.plots=true"], tmp_path)[0]
    assert load_config(None, job.argv).train.plots is True
    assert load_config(None, ex.make_jobs([ex.parse_arm("pacs")], [0], [], tmp_path)[0].argv).train.plots is False
    from pacs_fast.config import save_config  # a folder made before with other logging still matches
    job.run_dir.mkdir(parents=True)
    save_config(load_config(None, ex.make_jobs([ex.parse_arm("pacs")], [0], [], tmp_path)[0].argv),
                job.run_dir / "config.yaml")
    assert ex.job_state(job, None) == "fresh"


def test_plan_deletes_only_its_own_dead_runs(tmp_path):
    """A folder holding only a dead run's lock is reused as it is; one with this experiment's
    config.yaml and no checkpoint is deleted (under its lock) and rerun; a finished one is kept."""
    from pacs_fast.config import save_config
    from pacs_fast.trainer.run_folder import RunLock
    jobs = ex.make_jobs([ex.parse_arm("pacs"), ex.parse_arm("grpo")], [0, 1], [], tmp_path)
    lock_only, own_dead, finished = jobs[0].run_dir, jobs[1].run_dir, jobs[2].run_dir
    RunLock(lock_only, new=True).release()  # the run died before writing anything
    for job in (jobs[1], jobs[2]):
        job.run_dir.mkdir(parents=True)
        save_config(ex.intended_config(None, job.argv), job.run_dir / "config.yaml")
    (finished / "summary.json").write_text("{}")
    todo, done = ex.plan(jobs, None, restart_mismatched=False)
    assert done == 1 and [(j.run_dir, state) for j, state in todo] == [
        (lock_only, "fresh"), (own_dead, "fresh"), (jobs[3].run_dir, "fresh")]
    assert lock_only.is_dir() and not own_dead.exists() and (finished / "summary.json").is_file()


def test_plan_takes_a_folder_a_run_left_while_writing_its_config(tmp_path):
    """A trainer killed while writing config.yaml left the lock and ``.config.yaml.tmp-PID``: the plan refused the
    folder ("holds files but no config.yaml"); it now runs it as a fresh run (the trainer removes the temporary),
    and a folder with a file of the user's is still refused."""
    from pacs_fast.trainer.run_folder import RunLock
    jobs = ex.make_jobs([ex.parse_arm("pacs")], [0, 1], [], tmp_path)
    RunLock(jobs[0].run_dir, new=True).release()
    (jobs[0].run_dir / ".config.yaml.tmp-77").write_text("algo:\n")
    todo, done = ex.plan(jobs, None, restart_mismatched=False)
    assert done == 0 and [(j.run_dir, s) for j, s in todo] == [(jobs[0].run_dir, "fresh"), (jobs[1].run_dir, "fresh")]
    (jobs[0].run_dir / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds files but no config.yaml"):
        ex.plan(jobs, None, restart_mismatched=False)


def test_arm_overrides_split_on_top_level_commas_only(tmp_path):
    arm = ex.parse_arm("x:learner.betas=[0.9,0.95],algo.name=grpo")
    assert arm.overrides == ["learner.betas=[0.9,0.95]", "algo.name=grpo"]
    assert ex.parse_arm("x: learner.betas=[0.9, 0.95] ").overrides == ["learner.betas=[0.9, 0.95]"]
    assert ex.parse_arm('x:reward.step_split=",",algo.name=grpo').overrides == ['reward.step_split=","',
                                                                                "algo.name=grpo"]
    cfg = ex.intended_config(None, ex.make_jobs([arm], [0], [], tmp_path)[0].argv)
    assert cfg.learner.betas == [0.9, 0.95] and cfg.algo.name == "grpo"
    assert ex.parse_arm("pacs_bwd:algo.name=pacs,algo.noise_correction=backward").overrides == [
        "algo.name=pacs", "algo.noise_correction=backward"]  # the documented form is unchanged


@pytest.mark.parametrize("text", ["x:learner.betas=[0.9,0.95", "x:learner.betas=0.9]", "x:algo.name",
                                  "x:reward.step_split=\",algo.name=grpo"])
def test_arm_parse_errors_name_the_arm_and_the_form(text):
    with pytest.raises(ValueError) as e:
        ex.parse_arm(text)
    assert repr(text) in str(e.value) and "NAME:section.key=value" in str(e.value), str(e.value)


def test_report_on_a_folder_without_runs_creates_nothing(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert ex.main(["--out", str(missing), "--arms", "pacs", "--report"]) == 2
    err = one_line_error(capsys)
    assert str(missing) in err and not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert ex.main(["--out", str(empty), "--arms", "pacs", "--report"]) == 2
    assert str(empty) in one_line_error(capsys) and list(empty.iterdir()) == []
    # without --arms: the arms come from spec.json, which an empty folder does not have
    assert ex.main(["--out", str(empty), "--report"]) == 2
    err = one_line_error(capsys)
    assert str(empty / "spec.json") in err and "--arms" in err and list(empty.iterdir()) == []


def test_one_seed_has_no_interval_and_says_so():
    """A bootstrap over one seed has no interval: the table said [+nan, +nan]."""
    res = {"a": {0: {"start": 0.2, "final": 0.5, "best": 0.6}}, "b": {0: {"start": 0.2, "final": 0.4, "best": 0.4}}}
    text, stats = ex.table(res, [ex.Arm("a", []), ex.Arm("b", [])], "b")
    assert "+0.100 [no interval: one seed] (n=1)" in text and "nan" not in text



def test_report_with_no_finished_run_exits_1_and_keeps_the_results(tmp_path, capsys):
    """Runs started but none finished: the report had written an empty table over results.md and exited 0."""
    out = tmp_path / "exp"
    (out / "runs" / "pacs" / "seed0").mkdir(parents=True)  # a run that has not finished (no summary.json)
    (out / "results.md").write_text("the last report\n")
    assert ex.main(["--out", str(out), "--arms", "pacs", "--seeds", "0", "--report"]) == 1
    err = one_line_error(capsys)
    assert "has finished" in err and str(out) in err, err
    assert (out / "results.md").read_text() == "the last report\n" and not (out / "results.json").exists()


def test_a_bad_setting_of_one_arm_names_the_arm(tmp_path, capsys):
    """With many arms, an arm's bad value printed the config's error alone (sweep): the arm is named now; a bad
    value every arm shares is not blamed on the first arm."""
    args = ["--out", str(tmp_path / "exp"), "--arms", "pacs", "--arm", "cc_bad:algo.name=clip_cov,algo.cov_low=5,"
            "algo.cov_high=1", "--seeds", "0", *TINY]
    assert ex.main(args) == 2
    err = one_line_error(capsys)
    assert "arm cc_bad (algo.name=clip_cov,algo.cov_low=5,algo.cov_high=1): algo.cov_low must be below" in err, err
    assert ex.main(["--out", str(tmp_path / "exp"), "--arms", "pacs,grpo", "--seeds", "0", *TINY,
                    "learner.lr=-1"]) == 2
    err = one_line_error(capsys)
    assert "learner.lr" in err and "arm " not in err, err
    assert not (tmp_path / "exp").exists()
