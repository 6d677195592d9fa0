"""Trackers that fail, and runs that fail, under hostile use (sweep of 2026-12-01): a tracker failing mid-run is left
out with one warning line while training goes on; a run's tracker runs end as finished, failed or killed; the
summary is written before the trackers close; a W&B offline resume part first gets the history up to its
checkpoint; a resume whose trackers fail keeps config.yaml as it was; bad tracker settings are refused before the
model loads (a logger named twice, an unreachable MLflow server, a trackio project too long for a file name, a
damaged trackers.json, ``wandb offline``'s settings file)."""
import json

import pytest

import pacs_fast.trainer.loop as loop
import pacs_fast.trainer.trackers as trackers
from pacs_fast.config import load_config
from pacs_fast.trainer import train
from pacs_fast.trainer.metrics import MetricsLogger, read_jsonl
from pacs_fast.trainer.trackers import check_trackers

from conftest import copy_as_killed_in_checkpoint
from test_train import TINY


class FakeTracker:
    """Stands in for the MLflow tracker of ``train.loggers=[mlflow]``: records what it gets and how it was closed;
    ``FakeTracker.fail`` names what raises (``log@<step>``, ``close``, ``start``, ``start_resumed``)."""
    name = "mlflow"
    made: list = []
    fail: set = set()

    def __init__(self, cfg, run_dir, config, run_id):
        if "start" in self.fail or (run_id and "start_resumed" in self.fail):
            raise RuntimeError("the store refused the run")
        self.id, self.part = run_id or "fake-run", ("part" if run_id else None)
        self.logged, self.closed = [], []
        FakeTracker.made.append(self)

    def log(self, kind, step, values):
        if f"log@{step}" in self.fail:
            raise ConnectionError("the server went away\nsecond line")
        self.logged.append((kind, step))

    def log_samples(self, step, rows):
        pass

    def log_images(self, step, paths):
        pass

    def close(self, status="finished"):
        self.closed.append(status)
        if "close" in self.fail:
            raise OSError("cannot close")


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(trackers.TRACKERS, "mlflow", FakeTracker)
    monkeypatch.setattr(FakeTracker, "made", [])
    monkeypatch.setattr(FakeTracker, "fail", set())
    return FakeTracker


def _cfg(warm_cache, *extra):
    return load_config(None, TINY + [f"warmup.cache_dir={warm_cache}", "train.steps=3", "train.eval_every=0",
                                     "train.save_every=1", "train.loggers=[mlflow]", "train.plots=false",
                                     "train.tensorboard=false", *extra])


def test_a_tracker_failing_mid_run_is_left_out_and_training_goes_on(fake, warm_cache, tmp_path, capsys):
    fake.fail = {"log@2"}
    summary = train(_cfg(warm_cache), tmp_path / "run")
    (tracker,) = fake.made
    assert summary["steps"] == 3 and (tmp_path / "run" / "summary.json").is_file()
    assert ("train", 1) in tracker.logged and max(s for _, s in tracker.logged) == 1 and tracker.closed == ["failed"]
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning: train.loggers=mlflow")]
    assert warnings == ["warning: train.loggers=mlflow: logging failed (ConnectionError: the server went away); that "
                        "tracker is off for the rest of this run (metrics.jsonl holds every record)"]
    assert [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 3]


def test_a_tracker_that_cannot_close_loses_no_summary(fake, warm_cache, tmp_path, capsys):
    fake.fail = {"close"}
    train(_cfg(warm_cache), tmp_path / "run")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 3
    assert fake.made[0].closed == ["finished"]
    assert "warning: train.loggers=mlflow: closing its run failed (OSError: cannot close)" in capsys.readouterr().out


@pytest.mark.parametrize("error,status", [(RuntimeError("boom"), "failed"), (KeyboardInterrupt(), "killed")])
def test_a_run_that_stops_ends_its_tracker_runs_as_failed_or_killed(fake, warm_cache, tmp_path, monkeypatch, error,
                                                                    status):
    real = loop.log_samples

    def breaking(s, step, *args, **kw):
        if step == 2:
            raise error
        return real(s, step, *args, **kw)

    monkeypatch.setattr(loop, "log_samples", breaking)
    with pytest.raises(type(error)):
        train(_cfg(warm_cache), tmp_path / "run")
    assert fake.made[0].closed == [status]


def test_an_offline_resume_part_gets_the_history_up_to_its_checkpoint(fake, warm_cache, tmp_path):
    run = tmp_path / "run"
    train(_cfg(warm_cache), run)
    killed = copy_as_killed_in_checkpoint(run, tmp_path / "killed", 3)  # checkpoint 2 intact, step 3 to redo
    from pacs_fast.trainer.run_folder import resume_config
    train(resume_config(killed), killed, resume=True)
    first, resumed = fake.made
    assert resumed.part == "part"
    history = [(k, s) for k, s in first.logged if s <= 2]
    # the history up to the checkpoint first (as metrics.jsonl holds it), then the redone step
    assert resumed.logged[:len(history)] == history and ("train", 3) in resumed.logged[len(history):]


def test_a_resume_whose_tracker_fails_keeps_its_config(fake, warm_cache, tmp_path, capsys):
    from pacs_fast.train import main

    run = tmp_path / "run"
    train(_cfg(warm_cache), run)
    before = (run / "config.yaml").read_text()
    fake.fail = {"start_resumed"}
    with pytest.raises(SystemExit) as stop:
        main(["--resume", str(run), "train.steps=5"])
    assert stop.value.code == 2
    assert "the tracker cannot start (RuntimeError: the store refused the run)" in capsys.readouterr().err
    assert (run / "config.yaml").read_text() == before  # (train.steps=5 had been kept: the next resume failed alike)


def test_tracker_settings_refused_before_loading(tmp_path, monkeypatch):
    import socket

    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ValueError, match="train.loggers lists 'wandb' twice"):
        check_trackers(load_config(None, ["train.loggers=[wandb,tensorboard,wandb]"]))
    for project in ("p" * 300, "项" * 90):
        with pytest.raises(ValueError, match="trackio keeps a project in a file named after it"):
            check_trackers(load_config(None, ["train.loggers=[trackio]", f"train.project={project}"]))
    check_trackers(load_config(None, ["train.loggers=[trackio]", "train.project=" + "项" * 70]))
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (not listening: refused)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
        with pytest.raises(ValueError, match=f"no server answers at 127.0.0.1:{port}"):
            check_trackers(load_config(None, ["train.loggers=[mlflow]"]))


def test_wandb_offline_from_its_settings_file_counts_as_offline(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # (no ~/.netrc login)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["train.loggers=[wandb]"])
    with pytest.raises(ValueError, match="not logged in to W&B"):
        check_trackers(cfg)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "settings").write_text("[default]\nmode = offline\n")  # what `wandb offline` writes
    check_trackers(cfg)
    (tmp_path / "wandb").mkdir()  # the working folder's settings win over the global ones
    (tmp_path / "wandb" / "settings").write_text("[default]\nmode = online\n")
    with pytest.raises(ValueError, match="not logged in to W&B"):
        check_trackers(cfg)


def test_a_damaged_trackers_file_is_named(tmp_path, fake):
    (tmp_path / "trackers.json").write_text('{"mlflow": "98')
    cfg = load_config(None, ["train.loggers=[mlflow]"])
    with pytest.raises(ValueError, match=f"{tmp_path / 'trackers.json'} is not the JSON object of tracker run ids"):
        trackers.open_trackers(cfg, tmp_path, {})


def test_the_logger_closes_its_file_when_a_tracker_fails_to(tmp_path, fake):
    fake.fail = {"close"}
    said = []
    logger = MetricsLogger(tmp_path, tensorboard=False, trackers=[FakeTracker(None, tmp_path, {}, None)],
                           warn=said.append)
    logger.log("train", 1, {"x": 1.0})
    logger.close("failed")
    assert logger._file.closed and fake.made[0].closed == ["failed"] and len(said) == 1


def test_a_tracker_added_at_a_resume_gets_the_history(fake, warm_cache, tmp_path):
    from pacs_fast.trainer.run_folder import resume_config

    run = tmp_path / "run"
    train(_cfg(warm_cache, "train.loggers=[tensorboard]"), run)
    killed = copy_as_killed_in_checkpoint(run, tmp_path / "killed", 3)
    train(resume_config(killed, ["train.loggers=[tensorboard,mlflow]"]), killed, resume=True)
    (added,) = fake.made
    assert added.logged[0] == ("eval", 0) and ("train", 1) in added.logged and ("train", 3) in added.logged


def test_metrics_jsonl_is_strict_json_inside_lists_too(tmp_path):
    # a non-finite number inside a list or a mapping had been written as a bare NaN / Infinity (strict readers refuse)
    logger = MetricsLogger(tmp_path, tensorboard=False)
    logger.log("train", 1, {"x": float("nan"), "lst": [1.0, float("nan")], "d": {"a": float("-inf"), "b": [2.0]}})
    logger.close()

    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(line, parse_constant=refuse) == {"kind": "train", "step": 1, "x": None, "lst": [1.0, None],
                                                       "d": {"a": None, "b": [2.0]}}


def test_the_tracker_group_names_and_tags_the_runs(tmp_path, monkeypatch):
    # (python -m pacs_fast.experiment sets it to the arm: its arms' runs of one seed had all been "seed0")
    from pathlib import Path

    from pacs_fast.trainer.trackers import MlflowTracker, run_name

    cfg = load_config(None, ["train.tracker_group=pacs", "train.project=p"])
    assert run_name(cfg, Path("out/runs/pacs/seed0")) == "pacs-seed0"
    assert run_name(load_config(None, []), Path("runs/seed0")) == "seed0"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "store").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    tracker = MlflowTracker(cfg, tmp_path / "seed0", {}, None)
    try:
        info = tracker.mlflow.get_run(tracker.id)
        assert info.info.run_name == "pacs-seed0" and info.data.tags["group"] == "pacs"
    finally:
        tracker.close()
    with pytest.raises(ValueError, match="train.tracker_group is 129 characters long"):
        monkeypatch.setenv("WANDB_MODE", "offline")
        check_trackers(load_config(None, ["train.loggers=[wandb]", "train.tracker_group=" + "g" * 129]))


def test_a_resume_that_changes_the_trackers_project_is_refused_for_the_right_reason(tmp_path):
    from pacs_fast.config.loading import save_config
    from pacs_fast.trainer.run_folder import resume_config

    (tmp_path / "run").mkdir()
    save_config(load_config(None, ["train.project=a"]), tmp_path / "run" / "config.yaml")
    for override in ("train.project=b", "train.tracker_group=g"):
        with pytest.raises(ValueError, match=f"--resume: {override.split('=')[0]} cannot change in a resumed run: its "
                                             r"tracker runs \(trackers.json\) live under the project and group"):
            resume_config(tmp_path / "run", [override])


def test_a_stop_in_the_first_evaluation_ends_the_tracker_runs_as_killed(fake, warm_cache, tmp_path, monkeypatch):
    # (the step-0 evaluation runs inside the setup: its trackers had been closed as finished, or left to MLflow's
    # exit hook, which ends a run as finished)
    from pacs_fast.trainer.session import Session

    def stopped(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Session, "evaluate", stopped)
    with pytest.raises(KeyboardInterrupt):
        train(_cfg(warm_cache), tmp_path / "run")
    assert fake.made[0].closed == ["killed"]


def test_a_signal_while_one_tracker_closes_leaves_the_others_closing(tmp_path):
    # (a SIGTERM during W&B's finish had skipped MLflow's close: its exit hook then ended the run as FINISHED)
    from pacs_fast.signals import Stopped

    class Interrupted(FakeTracker):
        def close(self, status="finished"):
            raise Stopped(15)

    first, second = Interrupted(None, tmp_path, {}, None), FakeTracker(None, tmp_path, {}, None)
    logger = MetricsLogger(tmp_path, tensorboard=False, trackers=[first, second], warn=lambda line: None)
    with pytest.raises(Stopped):
        logger.close("killed")
    assert second.closed == ["killed"] and logger._file.closed
