"""train.loggers (pacs_fast/trainer/trackers.py): a short run logs its config, metrics, samples and plots
to W&B (offline files), MLflow (its file store in the run folder) and trackio (a local store), and its
resume continues the same tracker runs; bad values and a missing login are one line before any model
loads."""
import json
import os
import sqlite3
import sys

import pytest

from pacs_fast.config import load_config
from pacs_fast.trainer.trackers import check_trackers

from test_train import TINY


def cli(args, capsys):
    from pacs_fast.train import main
    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("value,match", [
    ("[tensorboard,neptune]", "train.loggers: unknown logger 'neptune'"),
    ("[[wandb]]", "train.loggers must be a list of names"),
])
def test_bad_names_are_refused(value, match):
    with pytest.raises(ValueError, match=match):
        check_trackers(load_config(None, [f"train.loggers={value}"]))


def test_wandb_online_without_a_login_and_a_missing_library_are_refused(monkeypatch, tmp_path):
    import importlib.util

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    with pytest.raises(ValueError, match=r"train.loggers=wandb: not logged in to W&B; .*WANDB_MODE=offline"):
        check_trackers(load_config(None, ["train.loggers=[wandb]"]))
    monkeypatch.setenv("WANDB_MODE", "offline")
    check_trackers(load_config(None, ["train.loggers=[wandb]"]))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(ValueError, match=r"train.loggers=mlflow needs the mlflow package: pip install"):
        check_trackers(load_config(None, ["train.loggers=[mlflow]"]))


def test_an_installed_tracker_that_fails_to_import_is_refused_before_loading(monkeypatch, tmp_path):
    """``find_spec`` alone passed a tracker whose import then failed after the run folder was made (a
    traceback; hostile sweep, 2026-11-28): the package is imported by the check."""
    import sys

    fake = tmp_path / "trackio"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('cannot import name x from broken_dep')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "trackio" or m.startswith("trackio.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ValueError, match=r"train.loggers=trackio: importing the trackio package failed \(ImportError: "
                                         r"cannot import name x from broken_dep\); repair it"):
        check_trackers(load_config(None, ["train.loggers=[tensorboard,trackio]"]))


def test_the_cli_refuses_before_loading(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    code, _, err = cli(TINY + [f"train.out_dir={tmp_path}", "train.run_name=r", "train.loggers=[wandb]"], capsys)
    assert code == 2 and err.count("\n") == 1 and "not logged in to W&B" in err
    assert not (tmp_path / "r").exists() or not any(p.name != ".run.lock" for p in (tmp_path / "r").iterdir())


def test_an_mlflow_store_this_mlflow_lacks_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    """``MLFLOW_TRACKING_URI=sqlite:///...`` (MLflow's suggested local database) with mlflow-skinny, which the
    loggers extra installs (no SQLAlchemy: requirements/ci.lock has none), or an unknown scheme: one line naming the
    URI before anything loads; MLflow raised at the run's first set_experiment, after the warm-up and the model load
    (a traceback; sweep of 2026-11-29). A server URI must answer a connection (MLflow retried an unreachable one for
    about 4 minutes after the model loaded; sweep of 2026-12-01): an HTTP server is taken (through the environment's
    proxies, as MLflow's client goes), a closed port refused."""
    import http.server
    import threading

    import importlib.util

    assert importlib.util.find_spec("sqlalchemy") is None  # what the loggers extra installs: the refused path runs
    db = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", db)
    code, out, err = cli(TINY + [f"train.out_dir={tmp_path}", "train.run_name=r", "train.loggers=[mlflow]"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: train.loggers=mlflow: MLFLOW_TRACKING_URI={db} is a database") and \
        "pip install sqlalchemy alembic" in err
    assert "warm-up" not in out + err and not (tmp_path / "mlflow.db").exists()
    assert not (tmp_path / "r").exists() or not any(p.name != ".run.lock" for p in (tmp_path / "r").iterdir())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql+psycopg2://pf:s3cret@db.example:5432/mlflow")
    with pytest.raises(ValueError, match=r"MLFLOW_TRACKING_URI=postgresql\+psycopg2://pf:\*\*\*@db.example:5432/mlflow "
                                         r"is a database") as e:
        check_trackers(load_config(None, ["train.loggers=[mlflow]"]))
    assert "s3cret" not in str(e.value)  # the password stays out of the message
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuch://host/x")
    with pytest.raises(ValueError, match=r"MLFLOW_TRACKING_URI=nosuch://host/x: MLflow has no tracking store for "
                                         r"the scheme 'nosuch' \(it takes .*file, http, https"):
        check_trackers(load_config(None, ["train.loggers=[tensorboard,mlflow]"]))
    check_trackers(load_config(None, ["train.loggers=[tensorboard]"]))  # not a logger of this run: not read
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # (a proxy in the environment would answer for the closed port)
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)  # (answers 501: a server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        for fine in (f"http://127.0.0.1:{port}/", f"file://{tmp_path}/store", str(tmp_path / "plain")):
            monkeypatch.setenv("MLFLOW_TRACKING_URI", fine)
            check_trackers(load_config(None, ["train.loggers=[mlflow]"]))
        monkeypatch.setenv("RANK", "1")  # (another rank than the main one does not log: not contacted)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9/")
        check_trackers(load_config(None, ["train.loggers=[mlflow]"]))
        monkeypatch.delenv("RANK")
    finally:
        server.shutdown()
        server.server_close()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}/")  # (closed now: nothing listens there)
    with pytest.raises(ValueError, match=rf"MLFLOW_TRACKING_URI=http://127.0.0.1:{port}/: no server answers at "
                                         rf"127.0.0.1:{port} within 10 s \(Connection refused\); start it"):
        check_trackers(load_config(None, ["train.loggers=[mlflow]"]))


def test_a_trackio_store_that_cannot_be_written_is_refused_before_loading(tmp_path):
    """trackio swallows its write errors: with ``TRACKIO_DIR`` under a file, a run said "metrics logged to ...",
    exited 0 and stored nothing (sweep of 2026-11-29). Now one line, before the warm-up, nothing in the run folder.
    In a subprocess: trackio reads TRACKIO_DIR when it is first imported."""
    import subprocess
    import sys

    (tmp_path / "afile").write_text("")
    store = tmp_path / "afile" / "trackio"
    env = {**os.environ, "TRACKIO_DIR": str(store), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pacs_fast.train", *TINY, f"train.out_dir={tmp_path}",
                           "train.run_name=r", "train.loggers=[tensorboard,trackio]"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: train.loggers=trackio: its local store {store} (TRACKIO_DIR, default "
                                  f"HF_HOME/trackio) cannot be written (Not a directory)"), proc.stderr
    assert "warm-up" not in proc.stdout + proc.stderr
    assert not (tmp_path / "r").exists() or not any(p.name != ".run.lock" for p in (tmp_path / "r").iterdir())


def _train(args, tmp_path):
    """The CLI in a subprocess: trackio reads TRACKIO_DIR when it is first imported."""
    import subprocess
    import sys

    env = {**os.environ, "WANDB_MODE": "offline", "TRACKIO_DIR": str(tmp_path / "trackio"), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run([sys.executable, "-m", "pacs_fast.train", *args], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_run_reaches_every_tracker_and_its_resume_continues_them(tmp_path, monkeypatch, warm_cache):
    common = TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.run_name=r",
                     "train.steps=2", "train.eval_every=1", "train.save_every=1", "train.log_samples=2",
                     "train.loggers=[tensorboard,wandb,mlflow,trackio]", "train.project=pf-test"]
    _train(common, tmp_path)
    run = tmp_path / "r"
    ids = json.loads((run / "trackers.json").read_text())
    assert set(ids) == {"wandb", "mlflow", "trackio"}
    assert (run / "tb").is_dir()
    # W&B: the offline run under the run folder (its transaction log names the metrics and the config; the
    # samples tables and the plots are its media files)
    offline = [p for p in (run / "wandb").glob(f"offline-run-*-{ids['wandb']}")]
    assert len(offline) == 1
    log = (offline[0] / f"run-{ids['wandb']}.wandb").read_bytes()
    assert log.count(b"train/reward/mean") >= 2 and b"eval/pass@n" in log and b"algo" in log
    media = offline[0] / "files" / "media"
    assert len(list((media / "table").glob("samples_*.table.json"))) == 2
    assert {p.name.split("_")[0] for p in (media / "images" / "plots").glob("*.png")} == {"curves", "calibration"}
    # MLflow: the file store in the run folder, every step's metric, the config as params, samples tables
    import mlflow
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # reading the run folder's file store (as the run did)
    client = mlflow.MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    history = client.get_metric_history(ids["mlflow"], "train/reward/mean")
    assert [m.step for m in history] == [1, 2]
    assert client.get_run(ids["mlflow"]).data.params["algo.name"] == "pacs"
    assert {a.path for a in client.list_artifacts(ids["mlflow"], "samples")} == \
        {"samples/step_000001.json", "samples/step_000002.json"}
    assert any(a.path.endswith("curves.png") for a in client.list_artifacts(ids["mlflow"], "plots"))
    # trackio: the local store holds the project's run and its metrics
    db = tmp_path / "trackio" / "pf-test.db"
    with sqlite3.connect(db) as con:
        tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
        assert "metrics" in tables
        n = con.execute("select count(*) from metrics").fetchone()[0]
    assert n >= 2
    # the end-of-run plots at the run's last step (trackio had put them one step past it)
    assert _trackio_plot_steps(db) == [2]
    # resume two more steps: the same tracker runs continue (W&B offline cannot resume a run: W&B resumes on its
    # server, and `wandb sync` of two offline folders of one id keeps one of them; the resume is a run of its own)
    _train(["--resume", str(run), "train.steps=3"], tmp_path)
    again = json.loads((run / "trackers.json").read_text())
    assert {k: again[k] for k in ids} == ids  # W&B's own id kept: an online resume continues that run
    (resumed,) = again["wandb_offline_parts"]
    (part,) = (run / "wandb").glob(f"offline-run-*-{resumed}")
    part_log = (part / f"run-{resumed}.wandb").read_bytes()
    assert resumed != ids["wandb"] and b"r-resumed-1" in part_log
    # the part first got the history up to its checkpoint (steps 1, 2) from metrics.jsonl: it holds every step
    assert part_log.count(b"train/reward/mean") >= log.count(b"train/reward/mean") + 1, \
        (part_log.count(b"train/reward/mean"), log.count(b"train/reward/mean"))
    assert len(list((run / "wandb").glob(f"offline-run-*-{ids['wandb']}"))) == 1  # the first part kept as it was
    history = client.get_metric_history(ids["mlflow"], "train/reward/mean")
    assert [m.step for m in history] == [1, 2, 3]
    assert _trackio_plot_steps(db) == [2, 3]


def _trackio_plot_steps(db) -> list[int]:
    with sqlite3.connect(db) as con:
        return [step for step, values in con.execute("select step, metrics from metrics order by id")
                if b"plots/curves" in (values if isinstance(values, bytes) else values.encode())]


@pytest.mark.parametrize("fresh_by", ["this_version", "no_session_start"])
def test_tensorboard_shows_each_step_once_after_a_resume(tmp_path, fresh_by):
    """A run killed after step 5 (checkpoint at step 4) resumes and logs 5-7 again: TensorBoard's loaders show
    every step once, with the resumed values. The loader behind ``tensorboard --load_fast=false`` takes the first
    session-start event it reads for the run's start and purges only at a later one, so a fresh run now writes one
    too (without it, ``no_session_start``, as runs before 2026-11-29 did, step 5 showed twice). Tags are named as
    the trackers name them (``eval/acc``, not ``eval/eval/acc``)."""
    from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator

    from pacs_fast.trainer.metrics import MetricsLogger

    if fresh_by == "this_version":
        first = MetricsLogger(tmp_path)
    else:  # what an earlier version wrote (no purge step on a fresh start)
        from torch.utils.tensorboard import SummaryWriter
        first = MetricsLogger(tmp_path, tensorboard=False)
        first.tb = SummaryWriter(str(tmp_path / "tb"))
    for step in range(1, 6):
        first.log("train", step, {"reward/mean": float(step)})
    first.log("eval", 4, {"eval/acc": 0.5})
    first.close()
    again = MetricsLogger(tmp_path, resume_step=4)
    for step in range(5, 8):
        again.log("train", step, {"reward/mean": 10.0 + step})
    again.close()

    want = [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 15.0), (6, 16.0), (7, 17.0)]
    plain = event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    plain.Reload()
    assert [(e.step, e.value) for e in plain.Scalars("train/reward/mean")] == want
    assert "eval/acc" in plain.Tags()["scalars"] and "eval/eval/acc" not in plain.Tags()["scalars"]
    plugin = plugin_event_accumulator.EventAccumulator(str(tmp_path / "tb"))
    plugin.Reload()
    from tensorboard.util import tensor_util
    got = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in plugin.Tensors("train/reward/mean")]
    if fresh_by == "this_version":
        assert got == want
    else:  # the earlier runs' files: the resume's event is the first the loader reads (documented, not fixed)
        assert [s for s, _ in got].count(5) == 2


def test_a_resumed_writer_s_event_file_sorts_after_the_run_s(tmp_path):
    """TensorBoard reads a run's event files in name order: second, host, pid, a per-process counter, compared
    as text. A resume within the second of the run's last writer (the resume test above, in a process whose
    counter had reached 9 -> 10: it failed once in CI) named its file so that it sorted first, and its purge of
    the redone steps was read before them. The writer now opens only once the clock is past every existing
    file's second."""
    import time

    from pacs_fast.trainer.metrics import MetricsLogger

    tb = tmp_path / "tb"
    tb.mkdir()
    now = int(time.time())
    earlier = tb / f"events.out.tfevents.{now:010d}.host.99999.9"  # a name any file of this second sorts before
    earlier.write_bytes(b"")
    again = MetricsLogger(tmp_path, resume_step=4)
    again.log("train", 5, {"reward/mean": 1.0})
    again.close()
    names = sorted(p.name for p in tb.iterdir())
    assert names[0] == earlier.name and len(names) == 2, names
    assert int(names[1].split(".")[3]) > now


TRACKIO_PAIR = r"""
import json, sys
from pathlib import Path
from types import SimpleNamespace
from pacs_fast.trainer.trackers import TrackioTracker

cfg, root = SimpleNamespace(train=SimpleNamespace(project="pf-test")), Path(sys.argv[1])
a = TrackioTracker(cfg, root / "A" / "seed0", {"seed": 0}, None)
a.log("train", 1, {"loss": 1.0})
a.close()
b = TrackioTracker(cfg, root / "B" / "seed0", {"seed": 1}, None)  # another run, the same folder name
b.log("train", 1, {"loss": 2.0})
b.close()
again = TrackioTracker(cfg, root / "A" / "seed0", {"seed": 0}, a.id)  # run A resumed: the id from trackers.json
again.log("train", 2, {"loss": 0.5})
again.close()
print("IDS " + json.dumps([a.id, b.id, again.id]))
"""


def test_trackio_runs_of_one_folder_name_stay_apart(tmp_path):
    """trackio knows a run by its name: every run named after its folder's (``seed0`` of another out_dir, each arm
    of an experiment) was continued as one trackio run, the metrics of both in it (concurrency sweep,
    2026-11-29). A new run's name gets a suffix of its own; a resumed run continues its own."""
    import subprocess
    import sys

    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", TRACKIO_PAIR, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b, again = json.loads(proc.stdout.split("IDS ", 1)[1])
    assert a != b and again == a and a.startswith("seed0-") and b.startswith("seed0-")
    with sqlite3.connect(tmp_path / "trackio" / "pf-test.db") as con:
        steps = {}
        for name, step in con.execute("select run_name, step from metrics order by id"):
            steps.setdefault(name, []).append(step)
    assert steps == {a: [1, 2], b: [1]}


def test_the_end_of_run_plots_carry_the_run_s_last_step(monkeypatch, tmp_path):
    """W&B got the plots with no step and bound only train/eval/checkpoint to the ``step`` axis; trackio put them
    one step past the run's last (review of 2026-11-30). Checked through fake libraries: what each tracker hands
    its library."""
    import types

    from pacs_fast.config import load_config
    from pacs_fast.trainer.trackers import TrackioTracker, WandbTracker

    calls = []

    class Run:
        id = "fake"

        def define_metric(self, name, step_metric=None):
            calls.append(("define", name, step_metric))

        def log(self, values):
            calls.append(("wandb", values))

    wandb = types.SimpleNamespace(init=lambda **kw: Run(), Image=lambda path: ("image", path))
    trackio = types.SimpleNamespace(init=lambda **kw: None, Image=lambda path: ("image", path),
                                    log=lambda values, step=None: calls.append(("trackio", values, step)))
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setitem(sys.modules, "trackio", trackio)
    cfg = load_config(None, [])
    plots = [tmp_path / "curves.png", tmp_path / "calibration.png"]
    WandbTracker(cfg, tmp_path, {}, None).log_images(7, plots)
    TrackioTracker(cfg, tmp_path, {}, None).log_images(7, plots)
    assert ("define", "plots/*", "step") in calls
    wandb_log = [c[1] for c in calls if c[0] == "wandb"][0]
    assert wandb_log["step"] == 7 and set(wandb_log) == {"step", "plots/curves", "plots/calibration"}
    assert [c[2] for c in calls if c[0] == "trackio"] == [7]
