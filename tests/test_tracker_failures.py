"""The trackers under hostile settings and a kill (sweep of 2026-11-30), each fixed at its root:

- a file-store ``MLFLOW_TRACKING_URI`` (``file:///...``, a plain folder: MLflow's most common shared setup)
  failed after the model loaded: MLflow keeps its file store behind ``MLFLOW_ALLOW_FILE_STORE``;
- a ``train.project`` W&B refuses (``a/b``) or an empty one failed after the model loaded;
- a tracker that could not start left the new run's folder (its ``config.yaml``) behind, blocking the name,
  and ``--resume`` of it failed the same way;
- after a kill and ``--resume``, MLflow's sample tables of the redone steps held both sessions' rows
  (``log_table`` appends to an existing file);
- trackio batches records in a background thread: a run killed just after a checkpoint lost the steps up to it
  from trackio's store for good (the resume redoes only later steps): the trackers flush at each checkpoint.
"""
import json
import os
import sqlite3
import subprocess
import sys

import pytest

from pacs_fast.config import load_config
from pacs_fast.trainer.trackers import check_trackers

from test_train import TINY


@pytest.mark.parametrize("loggers, project, match", [
    ("[wandb]", "a/b", r"train.project='a/b' contains /: W&B takes names of at most 128 characters"),
    ("[tensorboard,wandb]", "x#y?", r"train.project='x#y\?' contains # \?"),
    ("[wandb]", "p" * 129, "is 129 characters long"),
    ("[mlflow]", "' '", r"train.project=' ': train.loggers=mlflow needs a project name"),
    ("[trackio,mlflow]", "''", r"train.project='': train.loggers=trackio,mlflow needs a project name"),
])
def test_a_project_name_the_tracker_refuses_is_one_line_before_loading(monkeypatch, loggers, project, match):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ValueError, match=match):
        check_trackers(load_config(None, [f"train.loggers={loggers}", f"train.project={project}"]))
    check_trackers(load_config(None, [f"train.loggers={loggers}", "train.project=my proj ünï"]))
    check_trackers(load_config(None, ["train.loggers=[tensorboard]", "train.project=a/b"]))  # no tracker: not read


MLFLOW_SCRIPT = r"""
import json, os, sys
from pathlib import Path
import mlflow
from pacs_fast.config import load_config
from pacs_fast.trainer.trackers import MlflowTracker
store, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
os.environ["MLFLOW_TRACKING_URI"] = sys.argv[3]
assert "MLFLOW_ALLOW_FILE_STORE" not in os.environ
cfg = load_config(None, ["train.project=pf-uri"])
rows = lambda tag: [{"step": 3, "prompt": f"{tag}{i}", "response": "r", "answer": "1", "reward": 1.0} for i in range(4)]
t = MlflowTracker(cfg, run_dir, {"a": 1}, None)
t.log("train", 3, {"reward/mean": 0.5})
t.log_samples(3, rows("killed"))
t.close()
again = MlflowTracker(cfg, run_dir, {"a": 1}, t.id)  # the resume redoes step 3
again.log_samples(3, rows("redone"))
again.log_samples(4, rows("new"))
again.close()
client = mlflow.MlflowClient()
read = lambda step: json.loads(Path(client.download_artifacts(t.id, f"samples/step_{step:06d}.json", str(run_dir))).read_text())
print(json.dumps({"step3": read(3), "step4": read(4), "ids": [t.id, again.id],
                  "tags": json.loads(client.get_run(t.id).data.tags["mlflow.loggedArtifacts"])}))
"""


@pytest.mark.parametrize("form", ["file_uri", "plain_folder"])
def test_a_file_store_uri_works_and_a_redone_steps_table_is_replaced(tmp_path, form):
    """In a subprocess: MLflow's tracking URI and MLFLOW_ALLOW_FILE_STORE are process-wide."""
    store = tmp_path / "store"
    uri = store.as_uri() if form == "file_uri" else str(store)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"}
    proc = subprocess.run([sys.executable, "-c", MLFLOW_SCRIPT, str(store), str(tmp_path / "run"), uri],
                          env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ids"][0] == got["ids"][1]  # the resume continued the run
    assert store.is_dir() and not (tmp_path / "run" / "mlruns").exists()  # in the URI's store, not the run folder
    prompts = lambda table: [row[table["columns"].index("prompt")] for row in table["data"]]  # noqa: E731
    assert prompts(got["step3"]) == [f"redone{i}" for i in range(4)]  # not the killed session's 4 rows + these 4
    assert prompts(got["step4"]) == [f"new{i}" for i in range(4)]
    assert {"path": "samples/step_000003.json", "type": "table"} in got["tags"]  # still a table in MLflow's UI


def test_trackio_holds_every_record_up_to_a_flush(tmp_path):
    """trackio writes from a background thread every 0.5 s; with that thread held back, the tracker's flush
    (called at every checkpoint) must put the records in the store (before it, the store lacks them)."""
    script = r"""
import sqlite3, sys
from pathlib import Path
import trackio.run
trackio.run.BATCH_SEND_INTERVAL = 1e6  # the background thread writes nothing until the run finishes
from pacs_fast.config import load_config
from pacs_fast.trainer.trackers import TrackioTracker
t = TrackioTracker(load_config(None, ["train.project=pf-flush"]), Path(sys.argv[1]), {}, None)
db = Path(sys.argv[2]) / "pf-flush.db"
def steps():
    if not db.exists():
        return []
    with sqlite3.connect(db) as con:
        return [r[0] for r in con.execute("select step from metrics order by step")]
t.log("train", 1, {"reward/mean": 0.5})
t.log("checkpoint", 1, {"time/checkpoint": 0.1})
before = steps()
t.flush()
print("RESULT", before, steps())
t.close()
"""
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run"), str(tmp_path / "trackio")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert result == ["RESULT [] [1, 1]"], proc.stdout  # nothing before the flush; the step's two records after


def test_a_tracker_that_cannot_start_leaves_no_run_folder(tmp_path, capsys, monkeypatch, warm_cache):
    """A tracker refusing at start (a server down, a name it refuses: here forced) after the model loaded: one
    line, exit status 2, and the new run's folder (its config.yaml, the tracker's own files) is gone, so the name
    is free for the corrected command."""
    from pacs_fast.trainer import trackers

    class Refuses:
        def __init__(self, cfg, run_dir, config, run_id):
            (run_dir / "mlruns").mkdir()  # what a tracker may have begun before refusing
            raise RuntimeError("simulated: the tracking server refused the connection")

    monkeypatch.setitem(trackers.TRACKERS, "mlflow", Refuses)
    from pacs_fast.train import main
    args = TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.run_name=r",
                   "train.loggers=[tensorboard,mlflow]"]
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err  # (above it: the model load's progress bars, on stderr)
    last = err.rstrip("\n").split("\n")[-1]
    assert e.value.code == 2 and err.count("error:") == 1, err
    assert last.startswith("error: train.loggers=mlflow: the tracker cannot start (RuntimeError: simulated"), err
    assert not (tmp_path / "r").exists()
