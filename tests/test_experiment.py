"""The experiment runner: arms x seeds in subprocesses, resumable, a paired table and curves.

The end-to-end test trains 2 arms x 2 seeds of a 2-step run of a tiny model (no warm-up), so it
checks the mechanics (skip, resume, restart, mismatch, outputs), not learning.
"""
import json
import shutil

import numpy as np
import pytest
import yaml

from pacs_fast import experiment as ex

TINY = ["warmup.steps=0", "model.tiny_hidden_size=32", "model.tiny_num_layers=1", "train.steps=2",
        "train.prompts_per_step=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2",
        "rollout.n=2", "data.eval_size=4", "rollout.eval_n=1", "rollout.max_new_tokens=4",
        "train.eval_every=1", "train.save_every=1", "data.arith_train_size=50"]


def test_parse_seeds_and_arms():
    assert ex.parse_seeds("0-3") == [0, 1, 2, 3]
    assert ex.parse_seeds("5,1,2") == [5, 1, 2]
    with pytest.raises(ValueError):
        ex.parse_seeds("1,1")
    arm = ex.parse_arm("pacs_bwd:algo.name=pacs,algo.noise_correction=backward")
    assert arm.name == "pacs_bwd" and arm.overrides == ["algo.name=pacs", "algo.noise_correction=backward"]
    assert ex.parse_arm("pacs_noweight").overrides == ["algo.name=pacs", "algo.weight=none"]
    # a preset's name with keys starts from the preset (it had dropped it: `grpo:learner.lr=2e-5` trained PACS)
    assert ex.parse_arm("grpo:learner.lr=2e-5").overrides == ["algo.name=grpo", "learner.lr=2e-5"]
    assert ex.parse_arm("pacs_noweight:algo.weight=question").overrides == [
        "algo.name=pacs", "algo.weight=none", "algo.weight=question"]  # (the later key wins)
    with pytest.raises(ValueError, match="preset"):
        ex.parse_arm("nonsense")
    from pacs_fast.config import ALGORITHMS, load_config, validate
    for name in ex.PRESETS:  # every preset is a run the trainer accepts
        validate(load_config(None, ex.parse_arm(name).overrides))
    named = {o.split("=", 1)[1] for arm in ex.PRESETS.values() for o in arm if o.startswith("algo.name=")}
    assert named == set(ALGORITHMS)  # a preset for every algorithm
    with pytest.raises(ValueError, match="section.key=value"):
        ex.parse_arm("x:algo.name")


def test_bootstrap_interval(seed):
    rng = np.random.default_rng(seed)
    d = rng.normal(0.1, 0.05, size=8)
    lo, hi = ex.bootstrap_ci(d, seed=seed)
    assert lo < d.mean() < hi
    assert hi - lo < 4 * d.std(ddof=1)  # about 2 x 1.96 x std / sqrt(8) ~ 1.4 std
    assert ex.bootstrap_ci(np.array([0.2, 0.2, 0.2]))[0] == pytest.approx(0.2)
    assert np.isnan(ex.bootstrap_ci(np.array([0.1]))[0])


def test_table_pairs_by_seed():
    mk = lambda final: {"start": 0.1, "final": final, "best": final, "curve": [(0, 0.1), (5, final)]}  # noqa: E731
    res = {"a": {0: mk(0.5), 1: mk(0.7)}, "b": {0: mk(0.4), 1: mk(0.5), 2: mk(0.9)}}
    text, stats = ex.table(res, [ex.Arm("a", []), ex.Arm("b", [])], "b")
    assert stats["a"]["final_minus_b"]["per_seed"] == pytest.approx([0.1, 0.2])  # seed 2 has no pair
    assert stats["a"]["final"]["mean"] == pytest.approx(0.6)
    assert "+0.150" in text


def test_what_the_tables_cannot_pair_or_spread_is_said(tmp_path, monkeypatch):
    """An arm's mean over seeds the baseline lacks is named next to the paired difference; one seed shows no
    '± 0.000' (its std is undefined); results.json is strict JSON (a missing interval is null, not NaN); an
    unfinished run is named above the tables (a sweep read +0.219 paired against +0.031 from the means, with
    nothing saying a seed was left out)."""
    mk = lambda final: {"start": 0.1, "final": final, "best": final, "greedy": float("nan"),  # noqa: E731
                        "pass_n": 0.5, "curve": [(0, 0.1), (5, final)]}
    res = {"a": {0: mk(0.5), 1: mk(0.7), 2: mk(0.1)}, "b": {0: mk(0.4), 1: mk(0.5)}, "c": {0: mk(0.3)}}
    arms = [ex.Arm("a", []), ex.Arm("b", []), ex.Arm("c", [])]
    text, stats = ex.table(res, arms, "b")
    assert "- a: seed(s) [2] have no finished b run: the differences pair seeds [0, 1], the mean takes all 3" in text
    assert "- with 2 paired seeds the percentile bootstrap's interval is narrower than 95%" in text
    row_c = next(line for line in text.splitlines() if line.startswith("| c |"))
    assert row_c.startswith("| c | 1 | 0.100 | 0.300 | 0.300 |") and "±" not in row_c
    assert np.isnan(stats["c"]["final"]["std"])
    jobs = ex.make_jobs(arms, [0, 1, 2], [], tmp_path)
    # (finished runs, as read)
    monkeypatch.setattr("pacs_fast.experiment_results.collect", lambda jobs, damaged=None: res)
    md = ex.report(jobs, arms, "b", tmp_path, "# t")
    assert "- b: seed(s) [2] did not finish" in md and "- c: seed(s) [1, 2] did not finish" in md
    strict = json.loads((tmp_path / "results.json").read_text(),
                        parse_constant=lambda c: pytest.fail(f"results.json holds {c}"))
    assert strict["stats"]["c"]["final"]["std"] is None and strict["runs"]["a"]["0"]["greedy"] is None


def test_greedy_evaluations_are_labelled_greedy(tmp_path, monkeypatch):
    """rollout.eval_temperature=0: eval/acc is the greedy accuracy and there is no eval/greedy_acc; the tables
    called it sampled and showed a NaN greedy column and pass@1 as pass@n (a sweep)."""
    mk = lambda final, t: {"start": 0.1, "final": final, "best": final, "greedy": float("nan"),  # noqa: E731
                           "pass_n": final, "curve": [(0, 0.1), (5, final)], "eval_temperature": t}
    arms = [ex.Arm("a", []), ex.Arm("b", [])]
    jobs = ex.make_jobs(arms, [0, 1], [], tmp_path)
    res = {"a": {0: mk(0.5, 0.0), 1: mk(0.7, 0.0)}, "b": {0: mk(0.4, 0.0), 1: mk(0.5, 0.0)}}
    monkeypatch.setattr("pacs_fast.experiment_results.collect", lambda jobs, damaged=None: res)
    md = ex.report(jobs, arms, "b", tmp_path, "# t")
    assert "Held-out greedy accuracy" in md and "sampled" not in md and "pass@n (final)" not in md and "nan" not in md
    res["b"][1]["eval_temperature"] = 0.6
    md = ex.report(jobs, arms, "b", tmp_path, "# t")
    assert "Held-out sampled accuracy" in md and "evaluated at different rollout.eval_temperature ([0.0, 0.6])" in md


def test_runs_of_different_pacs_fast_code_are_named(tmp_path, monkeypatch):
    """An experiment continued after an upgrade put runs of two versions (another sampler) in one mean with no
    word (a sweep of runs made by older versions); the versions come from each run's summary.json."""
    mk = lambda v: {"start": 0.1, "final": 0.5, "best": 0.5, "greedy": 0.5, "pass_n": 0.5,  # noqa: E731
                    "curve": [(0, 0.1), (5, 0.5)], "code_versions": v}
    arms = [ex.Arm("a", []), ex.Arm("b", [])]
    jobs = ex.make_jobs(arms, [0, 1], [], tmp_path)
    res = {"a": {0: mk(["0.1.0+g1"]), 1: mk(["0.1.0+g1"])}, "b": {0: mk(["0.1.0+g1"]), 1: mk(["0.1.0+g1"])}}
    monkeypatch.setattr("pacs_fast.experiment_results.collect", lambda jobs, damaged=None: res)
    assert "different pacs_fast code" not in ex.report(jobs, arms, "b", tmp_path, "# t")
    res["a"][1]["code_versions"] = ["unrecorded", "0.1.0+g2"]
    res["b"][1]["code_versions"] = ["0.1.0+g2"]
    md = ex.report(jobs, arms, "b", tmp_path, "# t")
    assert ("trained by different pacs_fast code (sampling, training or defaults may differ between versions; pair "
            "runs of one version): 0.1.0+g1: a/seed0, b/seed0; 0.1.0+g2: b/seed1; unrecorded then 0.1.0+g2: a/seed1"
            ) in md, md


def test_second_table_pairs_greedy_and_pass_n():
    mk = lambda g, p: {"start": 0.1, "final": 0.2, "best": 0.2, "greedy": g, "pass_n": p}  # noqa: E731
    res = {"a": {0: mk(0.5, 0.9), 1: mk(0.6, 0.8)}, "b": {0: mk(0.4, 0.7), 1: mk(0.4, 0.9)}}
    text, stats = ex.table(res, [ex.Arm("a", []), ex.Arm("b", [])], "b", ("greedy", "pass_n"))
    assert stats["a"]["greedy_minus_b"]["per_seed"] == pytest.approx([0.1, 0.2])
    assert stats["a"]["pass_n_minus_b"]["per_seed"] == pytest.approx([0.2, -0.1])
    assert text.splitlines()[0] == "| arm | seeds | greedy (final) | pass@n (final) | greedy − b (95% CI) | pass@n − b (95% CI) |"
    assert "+0.150" in text and "+0.050" in text


def test_without_a_baseline_the_table_has_no_difference_columns():
    mk = lambda: {"start": 0.1, "final": 0.2, "best": 0.3}  # noqa: E731
    text, stats = ex.table({"a": {0: mk(), 1: mk()}}, [ex.Arm("a", []), ex.Arm("b", [])], None)
    lines = text.splitlines()
    assert lines[0] == "| arm | seeds | step 0 | final | best |" and lines[1] == "|---|---|---|---|---|"
    assert lines[3] == "| b | 0 | | | |" and not any("minus" in k for k in stats["a"])  # (was "final − —", empty)


def test_without_a_baseline_results_md_speaks_of_no_differences(tmp_path, monkeypatch):
    from pacs_fast import experiment_results as er

    run = {"start": 0.1, "final": 0.2, "best": 0.3, "greedy": 0.2, "pass_n": 0.4, "curve": [(0, 0.1), (1, 0.2)],
           "eval_temperature": 1.0}
    monkeypatch.setattr(er, "collect", lambda jobs, damaged=None: {"a": {0: run, 1: run}})
    md = er.report([], [ex.Arm("a", [])], None, tmp_path, "# h")
    assert "paired" not in md and "−" not in md and "mean ± std over seeds" in md
    assert "paired by seed" in er.report([], [ex.Arm("a", [])], "a", tmp_path, "# h")


def test_runner_end_to_end(tmp_path, capsys, warm_cache):
    out = tmp_path / "exp"
    common = ["--out", str(out), "--arms", "pacs,grpo", "--seeds", "0-1", "--baseline", "grpo", "--workers", "2",
              f"warmup.cache_dir={warm_cache}", *TINY]
    assert ex.main(common) == 0
    res = json.loads((out / "results.json").read_text())
    assert set(res["stats"]) == {"pacs", "grpo"}
    assert res["stats"]["pacs"]["seeds"] == [0, 1]
    assert len(res["stats"]["pacs"]["final_minus_grpo"]["per_seed"]) == 2
    assert (out / "curves.png").stat().st_size > 1000
    assert "| pacs | 2 |" in (out / "results.md").read_text()
    arms = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("Arms: ")]
    assert arms == ["Arms: " + "; ".join(f"{a.name}: " + " ".join(f"`{o}`" for o in a.overrides)
                                         for a in map(ex.parse_arm, ("pacs", "grpo"))) + "."], arms  # (their settings)
    assert "`algo.name=grpo`" in arms[0]
    assert "pass@n − grpo" in (out / "results.md").read_text() and "greedy" in res["stats"]["pacs"]
    # each run's trackers are grouped by its arm (the arms' runs of a seed had one name, seed0, in W&B and MLflow)
    saved = out / "runs" / "grpo" / "seed1" / "config.yaml"
    assert yaml.safe_load(saved.read_text())["train"]["tracker_group"] == "grpo"
    job = ex.make_jobs([ex.parse_arm("grpo")], [1], [*TINY, f"warmup.cache_dir={warm_cache}"], out)[0]
    text = saved.read_text()  # a run from before the runner set the group: done, not another setting
    saved.write_text(text.replace("tracker_group: grpo", "tracker_group: ''"))
    assert ex.job_state(job, None) == "done"
    saved.write_text(text)
    # --report alone (the docs' command) takes the arms, seeds, settings and baseline spec.json recorded
    before = (out / "results.md").read_text()
    (out / "results.md").unlink()
    assert ex.main(["--out", str(out), "--report"]) == 0
    assert (out / "results.md").read_text() == before
    capsys.readouterr()

    # a killed run (summary and last checkpoint gone) is resumed; one with no checkpoint restarts;
    # the finished ones are skipped
    killed = out / "runs" / "pacs" / "seed1"
    (killed / "summary.json").unlink()
    newest = sorted((killed / "checkpoints").glob("step_*"))[-1]
    shutil.rmtree(newest)
    assert ex.job_state(ex.make_jobs([ex.parse_arm("pacs")], [1], [*TINY, "train.threads=1",
                                      f"warmup.cache_dir={warm_cache}"], out)[0], None) == "resume"
    early = out / "runs" / "grpo" / "seed0"
    (early / "summary.json").unlink()
    shutil.rmtree(early / "checkpoints")
    assert ex.main(common) == 0
    printed = capsys.readouterr().out
    assert "2 already done, 2 finished now, 0 failed" in printed
    log = (out / "runs" / "pacs" / "seed1.log").read_text()
    assert "--resume" in log
    assert (killed / "summary.json").is_file() and (early / "summary.json").is_file()

    # other settings in an existing folder: refused, not mixed; and not reported as if they were these settings
    assert ex.main([*common, "algo.beta=0.5"]) == 2
    assert "other settings" in capsys.readouterr().err
    before = (out / "results.md").read_text()
    assert ex.main([*common, "train.steps=50", "--report"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --report:") and "was made with other settings (train.steps" in err, err
    assert (out / "results.md").read_text() == before  # (it was rewritten with the wrong settings in its header)


def test_warm_state_sees_other_processes_building(tmp_path):
    """Building is a held lock, not a live process id: a container's killed build left ``.tmp-<key>-1``, and
    pid 1 is alive everywhere, so the runner waited without end (concurrency sweep, 2026-11-29)."""
    import fcntl
    import os
    from pacs_fast.trainer.warmup import MODEL_FILES, warmup_key
    from pacs_fast.config import load_config
    job = ex.make_jobs([ex.parse_arm("pacs")], [0], [f"warmup.cache_dir={tmp_path}"], tmp_path / "out")[0]
    key = warmup_key(load_config(None, job.argv))
    root = tmp_path / "warmup"
    root.mkdir()
    assert ex.warm_state(job, None) == "missing"
    (root / f".tmp-{key}-1").mkdir()  # before the locks: a killed container's build, pid 1
    (root / f".build-{key}-0dead").mkdir()
    (root / f".build-{key}-0dead.lock").touch()  # a killed build: its lock is free
    assert ex.warm_state(job, None) == "missing"
    (root / f".build-{key}-1live").mkdir()
    fd = os.open(root / f".build-{key}-1live.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a live one
        assert ex.warm_state(job, None) == "building"
    finally:
        os.close(fd)
    (root / key).mkdir()
    (root / key / "model.safetensors").write_bytes(b"x")
    assert ex.warm_state(job, None) == "missing"  # a folder without its tokenizer is no cached model
    for name in MODEL_FILES:
        (root / key / name).write_bytes(b"x")
    assert ex.warm_state(job, None) == "ready"


def test_asynchronous_arms_run_under_torchrun(tmp_path):
    """An arm with rollout.ranks=R is launched by torchrun with R + 1 processes (R + learner.tp_size
    for megatron); the others stay plain python, and the resume command keeps the launcher."""
    arms = [ex.Arm("sync", ["algo.name=grpo"]), ex.Arm("k1", ["rollout.ranks=1", "rollout.max_staleness=1"]),
            ex.Arm("mg", ["rollout.ranks=2", "learner.backend=megatron", "learner.tp_size=2"])]
    jobs = ex.make_jobs(arms, [0], ["train.prompts_per_step=8"], tmp_path)
    sync, k1, mg = (ex.command(j, None, "fresh") for j in jobs)
    assert sync[1:3] == ["-m", "pacs_fast.train"]
    assert k1[1:4] == ["-m", "torch.distributed.run", "--nproc_per_node=2"] and k1[5:7] == ["-m", "pacs_fast.train"]
    # torchrun binds its own store's port: a port probed here could be taken before torchrun binds it
    # (EADDRINUSE, seen in CI between parallel launches)
    assert k1[4] == "--standalone" and not any(a.startswith("--master") for a in k1 + mg)
    assert "rollout.ranks=1" in k1 and mg[3] == "--nproc_per_node=4"
    assert ex.command(jobs[1], None, "resume")[-2:] == ["--resume", str(jobs[1].run_dir)]
    assert ex.command(jobs[1], None, "resume")[3] == "--nproc_per_node=2"


def test_more_threads_per_run_than_cpus_is_one_line(tmp_path, capsys):
    """--threads above the CPUs this process may use is refused before any run starts (each run's
    train.threads would be refused by the trainer itself, once per job)."""
    import os
    n = len(os.sched_getaffinity(0))
    assert ex.main(["--arms", "pacs", "--seeds", "1", "--threads", str(n + 1), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"--threads {n + 1} (per run) is more than the {n} CPUs" in err and err.count("\n") == 1, err
    assert not (tmp_path / "x").exists()


def test_a_relative_data_file_is_not_another_setting_on_the_next_run(tmp_path, monkeypatch):
    """The trainer records its files as absolute paths (config.yaml, run_folder.record_absolute_paths): the
    runner's comparison of a finished run with the job takes them alike, or a relative data.dataset read as
    another setting ("mismatch") when the experiment was run again."""
    from pacs_fast.config import save_config

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                                              for i in range(30)))
    from pacs_fast.data.tiny import make_tiny_model

    make_tiny_model(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    job = ex.make_jobs([ex.parse_arm("pacs")], [0], ["data.dataset=d.jsonl", "model.path=m"], tmp_path / "out")[0]
    cfg = ex.intended_config(None, job.argv)
    assert cfg.data.dataset == str(tmp_path / "d.jsonl") and cfg.model.path == str(tmp_path / "m")
    job.run_dir.mkdir(parents=True)
    save_config(cfg, job.run_dir / "config.yaml")  # as the trainer wrote it
    (job.run_dir / "summary.json").write_text("{}")
    assert ex.job_state(job, None) == "done"


def test_a_run_from_before_split_seed_is_not_another_setting_after_its_resume(tmp_path, monkeypatch):
    """A run made before data.split_seed split its training file by train.seed; its resume records that seed as
    data.split_seed (run_folder.load_run_config). The runner's next comparison once read it as another setting
    ("mismatch: data.split_seed: 3 in the folder, 0 asked for"); a run recorded with another split seed still is."""
    from pacs_fast.config import save_config
    from pacs_fast.data.tiny import make_tiny_model
    from pacs_fast.trainer.run_folder import resume_config

    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                                              for i in range(30)))
    make_tiny_model(tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    job = ex.make_jobs([ex.parse_arm("pacs")], [3], ["data.dataset=d.jsonl", "model.path=m"], tmp_path / "out")[0]
    job.run_dir.mkdir(parents=True)
    save_config(ex.intended_config(None, job.argv), job.run_dir / "config.yaml")
    saved = job.run_dir / "config.yaml"
    saved.write_text("".join(line for line in saved.read_text().splitlines(True) if "split_seed" not in line))
    assert ex.job_state(job, None) == "fresh"  # (no checkpoint yet) the old folder matches
    cfg = resume_config(job.run_dir)
    assert cfg.data.split_seed == 3
    save_config(cfg, saved)  # as the resumed run records it
    assert ex.job_state(job, None) == "fresh"
    cfg.data.split_seed = 4
    save_config(cfg, saved)
    assert ex.job_state(job, None).startswith("mismatch:data.split_seed: 4 in the folder, 0 asked for")


def test_settings_that_change_no_result_may_change_between_runner_calls(tmp_path, capsys):
    """Adding a tracker (or more logged samples, other checkpoint spacing, ...) to a half-done experiment had been
    refused as "made with other settings": the runner resumes an unfinished run with the new values (the trainer's
    --resume takes them: each is in SAFE_RESUME_KEYS), keeps a finished one with a note, and still refuses a
    setting that changes what trains."""
    from pacs_fast.config import load_config, save_config
    from pacs_fast.trainer.run_folder import SAFE_RESUME_KEYS, resume_config

    assert set(ex.RERUN_KEYS) <= SAFE_RESUME_KEYS
    arms, out = [ex.parse_arm("pacs")], tmp_path / "out"
    first = ex.make_jobs(arms, [0, 1], [*TINY, "train.log_samples=2"], out)
    for job in first:
        job.run_dir.mkdir(parents=True)
        save_config(ex.intended_config(None, job.argv), job.run_dir / "config.yaml")  # as the trainer wrote it
    (first[0].run_dir / "checkpoints" / "step_1").mkdir(parents=True)  # seed 0: to resume
    (first[1].run_dir / "summary.json").write_text("{}")  # seed 1: finished
    again = ex.make_jobs(arms, [0, 1], [*TINY, "train.log_samples=5", "train.keep_checkpoints=3"], out)
    assert [ex.job_state(j, None) for j in again] == ["resume", "done"]
    todo, done = ex.plan(again, None, restart_mismatched=False)
    assert [(j.seed, s) for j, s in todo] == [(0, "resume")] and done == 1
    note = capsys.readouterr().out
    assert note.count("note:") == 1 and "note: 1 finished run(s) keep the settings they ran with (" in note
    assert "train.log_samples: 2 in them, 5 asked" in note and "train.keep_checkpoints: 2 in them, 3 asked" in note
    cmd = ex.command(again[0], None, "resume")
    overrides = cmd[cmd.index("--resume") + 2:]
    assert sorted(overrides) == ["train.keep_checkpoints=3", "train.log_samples=5"], cmd
    cfg = resume_config(again[0].run_dir, overrides)  # what the trainer's --resume reads: taken, recorded
    assert (cfg.train.log_samples, cfg.train.keep_checkpoints) == (5, 3)
    assert load_config(again[1].run_dir / "config.yaml").train.log_samples == 2  # the finished run: untouched
    assert ex.command(ex.make_jobs(arms, [0], [*TINY, "train.log_samples=2"], out)[0], None, "resume")[-1] == \
        str(again[0].run_dir)  # nothing changed: no overrides
    changed = ex.make_jobs(arms, [0], [*TINY, "train.log_samples=5", "learner.lr=0.5"], out)[0]
    assert ex.job_state(changed, None).startswith("mismatch:learner.lr: ")
    # (a sweep: train.tensorboard / plots had been accepted but never reached a stopped run; a path with a character
    # outside the BMP went through json.dumps's escapes, which YAML read as two lone surrogates)
    odd = ex.make_jobs(arms, [0], [*TINY, "train.tensorboard=true", f"warmup.cache_dir={tmp_path}/cache \U0001F600"],
                       out)[0]
    overrides = (cmd := ex.command(odd, None, "resume"))[cmd.index("--resume") + 2:]
    assert "train.tensorboard=true" in overrides and f'warmup.cache_dir="{tmp_path}/cache \U0001F600"' in overrides
    cfg = resume_config(odd.run_dir, overrides)
    assert cfg.train.tensorboard is True and cfg.warmup.cache_dir == f"{tmp_path}/cache \U0001F600"


def test_a_tracker_that_cannot_start_is_refused_before_any_run(tmp_path, capsys):
    """It had been found by each run in turn (every one failed, exit 1) after the finished runs' note."""
    assert ex.main(["--out", str(tmp_path / "x"), "--arms", "grpo,pacs", "--seeds", "0", *TINY,
                    "train.loggers=[tensorboard,nosuchtracker]"]) == 2
    err = capsys.readouterr().err  # (the common settings' fault: no arm is blamed)
    assert err.startswith("error: train.loggers: unknown logger 'nosuchtracker'") and "arm" not in err, err
    assert not (tmp_path / "x" / "runs").exists()
