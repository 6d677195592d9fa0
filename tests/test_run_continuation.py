"""How a run continues and what its folder records (a hostile sweep of run outputs and resumes):

- pruning after a resume that skipped a damaged newer checkpoint keeps the checkpoint just written and the one
  resumed from (it deleted both, leaving only the damaged one: the run could not be resumed again);
- ``--resume`` overrides go into ``config.yaml`` (and so into the checkpoints): they were used but not recorded,
  so the next resume fell back to the old ``train.steps`` / ``train.keep_checkpoints`` (and pruned by them);
- a resume on edited or replaced training data is one line before any model work (it trained on the new
  problems silently, or crashed after loading the model when their number changed);
- a mistyped key with ``--resume`` is named as unknown; a folder without ``config.yaml`` names the copy in its
  checkpoint; a read-only run folder is one line; a stop during setup says what to do;
- plots are written whole (a kill mid-write left a 0-byte PNG)."""
import json
import signal

import pytest

from pacs_fast.trainer.metrics import read_jsonl

from test_run_safety import STEPS, cache, cli, copy_run, finished  # noqa: F401  (fixtures)
from test_train import TINY


def _ckpts(run):
    return sorted(p.name for p in (run / "checkpoints").glob("step_*"))


def test_pruning_after_skipping_a_damaged_checkpoint_keeps_the_resumable_ones(finished, tmp_path, capsys):  # noqa: F811
    run = copy_run(finished, tmp_path)
    (run / "summary.json").unlink()
    state = run / "checkpoints" / "step_000004" / "learner.pt"
    state.write_bytes(state.read_bytes()[:1000])
    code, out, err = cli(["--resume", str(run), "train.steps=3", "train.keep_checkpoints=1", "train.save_every=1"],
                         capsys)
    assert code == 0, err
    assert "skipping checkpoint step_000004" in out and "step_000002 (step 2)" in out
    assert _ckpts(run) == ["step_000003", "step_000004"]  # the new one kept; the damaged newer one left alone
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"
    code, out, err = cli(["--resume", str(run), "train.steps=4"], capsys)  # and it resumes again
    assert code == 0, err
    assert "step_000003 (step 3)" in out and (run / "checkpoints" / "latest").read_text().strip() == "step_000004"


def test_resume_overrides_are_recorded_and_read_by_the_next_resume(finished, tmp_path, capsys):  # noqa: F811
    run = copy_run(finished, tmp_path)
    code, _, err = cli(["--resume", str(run), "train.steps=6", "train.keep_checkpoints=3"], capsys)
    assert code == 0, err
    for cfg in (run / "config.yaml", run / "checkpoints" / "step_000006" / "config.yaml"):
        text = cfg.read_text()
        assert "steps: 6" in text and "keep_checkpoints: 3" in text, cfg
    assert _ckpts(run) == ["step_000002", "step_000004", "step_000006"]
    code, out, err = cli(["--resume", str(run)], capsys)  # it was refused: "train.steps=4 is below ... step 6"
    assert code == 0, err
    assert _ckpts(run) == ["step_000002", "step_000004", "step_000006"]  # keep 3, not the old 2
    code, _, err = cli(["--resume", str(run), "train.steps=8"], capsys)  # a changed config is still compared:
    assert code == 0, err  # with a safe key's change recorded, the checkpoint's older copy does not refuse it
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == list(range(1, 9))


def test_a_moved_dataset_file_is_given_again_and_checked(finished, tmp_path, capsys, cache):  # noqa: F811
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(40)))
    args = TINY + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r", "train.steps=1",
                   "train.save_every=1", f"data.dataset={data}", f"model.path={finished / 'checkpoints' / 'step_000004'}"]
    code, _, err = cli(args, capsys)
    assert code == 0, err
    run, moved = tmp_path / "r", tmp_path / "elsewhere.jsonl"
    data.rename(moved)
    code, _, err = cli(["--resume", str(run), "train.steps=2"], capsys)
    assert code == 2 and err.count("\n") == 1 and "data.dataset" in err and "no longer exists" in err, err
    other = tmp_path / "other.jsonl"
    other.write_text(moved.read_text().replace('"answer": "0"', '"answer": "7"'))
    code, _, err = cli(["--resume", str(run), "train.steps=2", f"data.dataset={other}"], capsys)
    assert code == 2 and "the problems differ" in err, err  # moved, but not the same problems
    code, out, err = cli(["--resume", str(run), "train.steps=2", f"data.dataset={moved}"], capsys)
    assert code == 0 and "(step 1)" in out, err
    assert f"dataset: {moved}" in (run / "config.yaml").read_text()


def test_relative_paths_are_recorded_whole_and_a_resume_runs_from_any_folder(finished, tmp_path, capsys, cache,  # noqa: F811
                                                                            monkeypatch):
    """Bring-your-own-data sweep: config.yaml kept ``data.dataset: d/six.jsonl`` as given, and a ``--resume``
    from another folder said the data "no longer exists"."""
    import os

    import yaml

    (tmp_path / "d").mkdir()
    data = tmp_path / "d" / "six.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(40)))
    model = finished / "checkpoints" / "step_000004"
    monkeypatch.chdir(tmp_path)
    args = TINY + [f"warmup.cache_dir={cache}", "train.out_dir=runs", "train.run_name=r", "train.steps=1",
                   "train.save_every=1", "data.dataset=d/six.jsonl", f"model.path={os.path.relpath(model)}"]
    code, _, err = cli(args, capsys)
    assert code == 0, err
    run = tmp_path / "runs" / "r"
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert recorded["data"]["dataset"] == str(data) and recorded["model"]["path"] == str(model)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, out, err = cli(["--resume", str(run), "train.steps=2"], capsys)
    assert code == 0 and "(step 1)" in out, err


@pytest.mark.parametrize("edit", ["changed", "shorter"])
def test_a_resume_on_other_data_is_one_line_before_any_model_work(finished, tmp_path, capsys, cache, monkeypatch,  # noqa: F811
                                                                  edit):
    data = tmp_path / "d.jsonl"
    rows = [{"problem": f"{i}+{i}=", "answer": str(2 * i)} for i in range(40)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = TINY + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r", "train.steps=1",
                   "train.save_every=1", f"data.dataset={data}",
                   f"model.path={finished / 'checkpoints' / 'step_000004'}"]  # the tiny model, trained
    code, _, err = cli(args, capsys)
    assert code == 0, err
    rows = rows[:30] if edit == "shorter" else [{**rows[0], "answer": "1"}] + rows[1:]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    import pacs_fast.trainer.build as build

    def no_model(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(build, "build_learner", no_model)
    code, _, err = cli(["--resume", str(tmp_path / "r"), "train.steps=2"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "the problems differ from those step_000001 trained on" in err and "model.path=" in err


def test_resume_messages(finished, tmp_path, capsys):  # noqa: F811
    run = copy_run(finished, tmp_path)
    code, _, err = cli(["--resume", str(run), "train.stepz=5"], capsys)
    assert code == 2 and "train.stepz" in err and "cannot change in a resumed run" not in err, err
    assert "train.steps" in err  # the closest valid name
    (run / "config.yaml").unlink()
    code, _, err = cli(["--resume", str(run)], capsys)
    assert code == 2 and "no config.yaml there" in err and "step_000004/config.yaml" in err, err


def test_a_read_only_run_folder_is_one_line(finished, tmp_path, capsys, monkeypatch):  # noqa: F811
    import os

    run = copy_run(finished, tmp_path)
    real = os.open

    def read_only(path, flags, *a, **k):
        if str(path).endswith(".run.lock"):
            raise OSError(30, "Read-only file system", str(path))
        return real(path, flags, *a, **k)
    monkeypatch.setattr(os, "open", read_only)
    code, _, err = cli(["--resume", str(run), "train.steps=5"], capsys)
    assert code == 2 and err.count("\n") == 1 and "cannot be written (Read-only file system)" in err, err


def test_a_stop_during_setup_says_to_run_the_command_again(tmp_path, capsys):
    from pacs_fast import train

    with pytest.raises(SystemExit) as e:
        train.stopped(signal.SIGTERM, tmp_path / "run")
    assert e.value.code == 143
    assert "stopped before its setup finished (nothing to resume): run the same command again" in \
        capsys.readouterr().err


def test_plots_are_written_whole(tmp_path, monkeypatch):
    from pacs_fast.trainer import plots

    records = [{"kind": "train", "step": i, "reward/mean": 0.1 * i} for i in range(1, 4)]
    first = plots.plot_run(tmp_path, records)
    assert first and all(p.stat().st_size > 0 for p in first)
    good = {p: p.read_bytes() for p in first}
    import matplotlib.figure

    def dies(self, fname, *a, **k):
        open(fname, "wb").close()  # the file exists, empty, when the process is killed
        raise KeyboardInterrupt
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", dies)
    with pytest.raises(KeyboardInterrupt):
        plots.plot_run(tmp_path, records)
    assert {p: p.read_bytes() for p in first} == good  # the old plot stays whole


def test_a_run_whose_model_folder_is_gone_resumes_from_a_copy(finished, tmp_path, capsys, cache):  # noqa: F811
    """Its checkpoints hold the model, but model.path could not change on --resume: a dead end."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(finished / "checkpoints" / "step_000004", model)
    args = TINY + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r", "train.steps=1",
                   "train.save_every=1", f"model.path={model}"]
    code, _, err = cli(args, capsys)
    assert code == 0, err
    run = tmp_path / "r"
    code, _, err = cli(["--resume", str(run), f"model.path={finished}"], capsys)  # the old one still exists
    assert code == 2 and "model.path cannot change in a resumed run" in err, err
    shutil.rmtree(model)
    code, _, err = cli(["--resume", str(run), "train.steps=2"], capsys)
    assert code == 2 and err.count("\n") == 1 and "no longer exists" in err and "model.path=DIR" in err, err
    inside = run / "checkpoints" / "step_000001"
    code, _, err = cli(["--resume", str(run), "train.steps=2", f"model.path={inside}"], capsys)
    assert code == 2 and "is inside the run" in err, err
    moved = tmp_path / "moved"
    shutil.copytree(inside, moved)
    code, out, err = cli(["--resume", str(run), "train.steps=2", f"model.path={moved}"], capsys)
    assert code == 0 and "step_000001 (step 1)" in out, err
    assert f"path: {moved}" in (run / "config.yaml").read_text()
    code, _, err = cli(["--resume", str(run), "train.steps=3"], capsys)  # recorded: a plain resume continues
    assert code == 0, err
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 3]


def test_a_run_folder_given_as_a_model_names_its_checkpoint(finished, tmp_path, capsys):  # noqa: F811
    """``eval --model RUN`` / ``model.path=RUN`` said only "no config.json"; ``RUN/checkpoints/latest`` (a text
    file) only "is a file"."""
    from pacs_fast import eval as ev
    from pacs_fast.config import load_config, validate

    newest = finished / "checkpoints" / "step_000004"
    for given in (finished, finished / "checkpoints", finished / "checkpoints" / "latest"):
        with pytest.raises(ValueError, match=f"that is a training run: give one of its checkpoints, e.g. the newest, "
                                             f"{newest}"):
            validate(load_config(None, [f"model.path={given}", "data.dataset=math500"]), world=1)
        assert ev.main(["--model", str(given), "--benchmarks", "math500", "--out", str(tmp_path / "e")]) == 2
        assert f"e.g. the newest, {newest}" in capsys.readouterr().err


def test_checkpoints_of_two_runs_get_two_labels():
    from pacs_fast.evaluation.args import model_label

    assert model_label("runs/a/checkpoints/step_000060/") == "a-step_000060"
    assert model_label("runs/b/checkpoints/step_000060") == "b-step_000060"
    assert model_label("/models/Qwen2.5-0.5B") == "Qwen2.5-0.5B"
    # an experiment's arms: every arm's runs are named seed<s> (their evals shared one default folder, whose
    # refusal then offered --overwrite over the other arm's samples: concurrency sweep, 2026-11-29)
    assert model_label("exp/runs/pacs/seed0/checkpoints/step_000003") == "pacs-seed0-step_000003"
    assert model_label("exp/runs/grpo/seed0/checkpoints/step_000003/") == "grpo-seed0-step_000003"
    assert model_label("runs/seed0/checkpoints/step_000003") == "seed0-step_000003"  # a run named seed0 alone


def test_resume_keeps_the_split_of_a_run_from_before_split_seed_and_takes_unchanged_values(tmp_path):
    """A run whose config.yaml predates data.split_seed split its training file by train.seed: resumed, it keeps
    that split (the seed is taken from train.seed), while a new run's recorded split_seed stands. An override
    equal to the run's own value changes nothing and is taken (algo.beta=1.0 was refused as a change)."""
    from pacs_fast.config import load_config, save_config
    from pacs_fast.trainer.run_folder import resume_config

    old, new = tmp_path / "old", tmp_path / "new"
    for run in (old, new):
        run.mkdir()
        save_config(load_config(None, ["data.dataset=gsm8k_train", "train.seed=5"]), run / "config.yaml")
    text = (old / "config.yaml").read_text()
    (old / "config.yaml").write_text("".join(line for line in text.splitlines(True) if "split_seed" not in line))
    assert "split_seed" in (new / "config.yaml").read_text()
    assert resume_config(old).data.split_seed == 5 and resume_config(new).data.split_seed == 0
    assert resume_config(old, ["data.split_seed=5"]).data.split_seed == 5  # its own value: taken
    with pytest.raises(ValueError, match="data.split_seed cannot change in a resumed run"):
        resume_config(old, ["data.split_seed=0"])
    # the built-in task (and a given data.eval_dataset) has no split of a file: nothing to keep, no idle key set
    arith = tmp_path / "arith"
    arith.mkdir()
    save_config(load_config(None, ["train.seed=5"]), arith / "config.yaml")
    text = (arith / "config.yaml").read_text()
    (arith / "config.yaml").write_text("".join(line for line in text.splitlines(True) if "split_seed" not in line))
    assert resume_config(arith).data.split_seed == 0
    assert resume_config(new, ["algo.beta=1.0"]).algo.beta == 1.0
    with pytest.raises(ValueError, match="algo.beta cannot change in a resumed run"):
        resume_config(new, ["algo.beta=0.5"])
