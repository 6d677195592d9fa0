"""Experiment tracking under hostile use (sweep of 2026-12-06), each case failing before its fix:

- a tracker that failed mid-run, or sat out a resumed session (``train.loggers`` without it), was continued by the
  next ``--resume`` as the same tracker run, without the steps it had missed: a silent gap (MLflow showed steps
  1, 6, 7 of a run trained 1-7). Its id now leaves ``trackers.json``, and the resume begins a run of its own that
  first gets the history up to its checkpoint from ``metrics.jsonl``;
- ``WANDB_MODE`` that W&B refuses (``Offline``, a typo) passed the checks (``Offline`` counted as offline) and
  failed after the model loaded with "ValidationError: 1 validation error for Settings";
- ``MLFLOW_TRACKING_URI`` naming a file store that cannot be written (a path under a file) failed after the model
  loaded;
- W&B's service process dying mid-run: after the one warning line, W&B's exit hook printed a 30-line traceback;
- TensorBoard turned on at a resume held only the steps after the checkpoint (no step-0 evaluation), and one left
  out of a resumed session lacked that session's steps;
- W&B offline kept a copy of every step's samples table (what ``wandb sync`` uploads) in
  ``~/.local/share/wandb/artifacts/staging``, outside the run folder, never removed.
"""
import json
import os
import subprocess
import sys
import uuid

import pytest

import pacs_fast.trainer.trackers as trackers
from pacs_fast.config import load_config
from pacs_fast.trainer import train
from pacs_fast.trainer.metrics import read_jsonl
from pacs_fast.trainer.run_folder import resume_config
from pacs_fast.trainer.trackers import check_trackers

from test_train import TINY


class StoreTracker:
    """Stands in for MLflow: a store of runs (``runs``: id -> the (kind, step) records it holds), which a resume
    continues by id as MLflow does; ``fail`` names the step whose logging raises (the server gone)."""
    name = "mlflow"
    runs: dict = {}
    fail: set = set()

    def __init__(self, cfg, run_dir, config, run_id):
        self.id = run_id or uuid.uuid4().hex
        self.runs.setdefault(self.id, [])

    def log(self, kind, step, values):
        if step in self.fail:
            raise ConnectionError("the tracking server went away")
        self.runs[self.id].append((kind, step))

    def log_samples(self, step, rows):
        pass

    def log_images(self, step, paths):
        pass

    def close(self, status="finished"):
        pass


@pytest.fixture
def store(monkeypatch):
    monkeypatch.setitem(trackers.TRACKERS, "mlflow", StoreTracker)
    monkeypatch.setattr(StoreTracker, "runs", {})
    monkeypatch.setattr(StoreTracker, "fail", set())
    return StoreTracker


def _cfg(warm_cache, *extra):
    return load_config(None, TINY + [f"warmup.cache_dir={warm_cache}", "train.eval_every=2", "train.save_every=1",
                                     "train.plots=false", "train.tensorboard=false", "train.loggers=[mlflow]",
                                     *extra])


def _held(run, store):
    """The records the tracker run named in ``trackers.json`` holds, against ``metrics.jsonl``'s."""
    held = store.runs[json.loads((run / "trackers.json").read_text())["mlflow"]]
    return held, [(r["kind"], r["step"]) for r in read_jsonl(run / "metrics.jsonl")]


def test_a_resume_after_a_tracker_failed_mid_run_leaves_it_no_gap(store, warm_cache, tmp_path, capsys):
    run = tmp_path / "run"
    store.fail = {2}
    train(_cfg(warm_cache, "train.steps=3"), run)  # the tracker goes off at step 2; training goes on to 3
    assert capsys.readouterr().out.count("warning: train.loggers=mlflow: logging failed") == 1
    store.fail = set()  # the server is back
    train(resume_config(run, ["train.steps=5"]), run, resume=True)
    held, records = _held(run, store)
    assert [s for k, s in held if k == "train"] == [1, 2, 3, 4, 5]  # (the continued run held 1, 4, 5)
    assert held == records  # every record once, in order


def test_a_tracker_that_sat_out_a_resumed_session_gets_its_steps_back(store, warm_cache, tmp_path):
    run = tmp_path / "run"
    train(_cfg(warm_cache, "train.steps=2"), run)
    train(resume_config(run, ["train.steps=3", "train.loggers=[tensorboard]"]), run, resume=True)  # without it
    train(resume_config(run, ["train.steps=4", "train.loggers=[mlflow]"]), run, resume=True)  # with it again
    held, records = _held(run, store)
    assert [s for k, s in held if k == "train"] == [1, 2, 3, 4]  # (the continued run held 1, 2, 4)
    assert held == records


@pytest.mark.parametrize("case", ["added", "sat_out"])
def test_tensorboard_on_at_a_resume_holds_every_step(warm_cache, tmp_path, case):
    """TensorBoard turned on at a resume (``added``: the run began without it) held only the steps after the
    checkpoint, no step-0 evaluation; one off for a resumed session (``sat_out``) lacked that session's steps. Read by
    both of TensorBoard's loaders."""
    from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
    from tensorboard.util import tensor_util

    run = tmp_path / "run"
    first = "[jsonl]" if case == "added" else "[tensorboard]"
    train(_cfg(warm_cache, "train.steps=2", "train.tensorboard=true", f"train.loggers={first}"), run)
    if case == "sat_out":
        train(resume_config(run, ["train.steps=3", "train.loggers=[jsonl]"]), run, resume=True)
    train(resume_config(run, ["train.steps=4", "train.loggers=[tensorboard]"]), run, resume=True)
    records = read_jsonl(run / "metrics.jsonl")
    for name, kind, key in (("train/reward/mean", "train", "reward/mean"), ("eval/acc", "eval", "eval/acc")):
        want = [(r["step"], pytest.approx(r[key])) for r in records if r["kind"] == kind]
        steps = {"train": [1, 2, 3, 4], "eval": [0, 2, 4] if case == "added" else [0, 2, 3, 4]}[kind]
        assert [s for s, _ in want] == steps
        plain = event_accumulator.EventAccumulator(str(run / "tb"))
        plain.Reload()
        assert [(e.step, e.value) for e in plain.Scalars(name)] == want
        plugin = plugin_event_accumulator.EventAccumulator(str(run / "tb"))
        plugin.Reload()
        assert [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in plugin.Tensors(name)] == want


@pytest.mark.parametrize("mode", ["Offline", "ofline", "OFFLINE"])
def test_a_wandb_mode_wandb_refuses_is_one_line_before_loading(monkeypatch, mode):
    monkeypatch.setenv("WANDB_MODE", mode)
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # (logged in: the mode alone is wrong)
    with pytest.raises(ValueError, match=rf"train.loggers=wandb: WANDB_MODE={mode} is not a mode W&B takes \(online, "
                                         r"offline, shared, disabled, dryrun, run\); WANDB_MODE=offline keeps"):
        check_trackers(load_config(None, ["train.loggers=[tensorboard,wandb]"]))
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_trackers(load_config(None, ["train.loggers=[tensorboard,wandb]"]))
    monkeypatch.setenv("WANDB_MODE", mode)
    check_trackers(load_config(None, ["train.loggers=[tensorboard]"]))  # no W&B in this run: not read


@pytest.mark.parametrize("form", ["plain", "file_uri"])
def test_an_mlflow_file_store_that_cannot_be_written_is_refused_before_loading(monkeypatch, tmp_path, form):
    (tmp_path / "afile").write_text("")
    store = tmp_path / "afile" / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.as_uri() if form == "file_uri" else str(store))
    with pytest.raises(ValueError, match=r"train.loggers=mlflow: MLFLOW_TRACKING_URI=.*afile/mlruns: MLflow's file "
                                         r"store there cannot be written \(.*Not a directory"):
        check_trackers(load_config(None, ["train.loggers=[mlflow]"]))
    fine = tmp_path / "new" / "mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", fine.as_uri() if form == "file_uri" else str(fine))
    check_trackers(load_config(None, ["train.loggers=[mlflow]"]))
    assert not (tmp_path / "new").exists()  # (checked, not made: MLflow makes it when the run starts)


WANDB_SCRIPT = r"""
import os, signal, subprocess, sys, time
from pathlib import Path
from pacs_fast.config import load_config
from pacs_fast.trainer.metrics import MetricsLogger
from pacs_fast.trainer.trackers import open_trackers
run = Path(sys.argv[1])
run.mkdir()
logger = MetricsLogger(run, tensorboard=False, trackers=open_trackers(
    load_config(None, ["train.loggers=[wandb]", "train.project=pf-sweep"]), run, {"a": 1}))
for step in (1, 2):
    logger.log("train", step, {"reward/mean": step / 10})
    logger.log_samples(step, [{"step": step, "prompt": "1+1", "response": "2", "answer": "2", "reward": 1.0}])
if sys.argv[2] == "kill":  # W&B's service process dies (the OOM killer, a crash)
    for pid in subprocess.run(["pgrep", "-P", str(os.getpid())], capture_output=True, text=True).stdout.split():
        os.kill(int(pid), signal.SIGKILL)
    time.sleep(0.5)
    for step in (3, 4):
        logger.log("train", step, {"reward/mean": step / 10})
logger.close()
print("END")
"""


def _wandb_script(tmp_path, how):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "XDG_"))}
    env.update(WANDB_MODE="offline", HOME=str(home), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", WANDB_SCRIPT, str(tmp_path / "run"), how], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("END"), proc.stderr[-3000:]
    return proc, home


def test_wandb_s_service_dying_mid_run_is_one_warning_line(tmp_path):
    proc, _ = _wandb_script(tmp_path, "kill")
    assert proc.stdout.count("warning: train.loggers=wandb: logging failed") == 1, proc.stdout
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr[-3000:]


def test_wandb_offline_keeps_its_samples_tables_in_the_run_folder(tmp_path):
    _, home = _wandb_script(tmp_path, "plain")
    staged = list((tmp_path / "run" / "wandb").rglob("artifacts/staging/*"))
    assert len(staged) >= 2, staged  # each step's samples table, for `wandb sync`
    outside = [p for p in home.rglob("*") if p.is_file() and ".cache" not in p.parts]  # (W&B's debug logs aside)
    assert outside == [], outside
