"""The training run's lifecycle as a user drives it (the lifecycle sweep of 2026-12-05): kills at chosen points and
their resumes, ``--resume`` with changed settings, a finished run resumed, bad input."""
import json

from pacs_fast import eval as ev

from pacs_fast.trainer.metrics import read_jsonl

from test_eval_cli import _one_line_error, _record, _run_args, _write_settings, dataset, model_dir, no_model_load  # noqa: F401
from test_run_safety import cache, cli, copy_run, finished  # noqa: F401  (fixtures)


def _files(run):
    return {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".run.lock"}


def test_a_no_op_resume_of_a_finished_run_changes_nothing(finished, tmp_path, capsys):  # noqa: F811
    """``--resume`` of a finished run, with nothing to train, evaluate or repair, had rewritten summary.json (its
    ``wall_time_s`` grew by the no-op session, ``session_wall_time_s`` became that session's), appended resume markers
    to metrics.jsonl and samples.jsonl and opened a TensorBoard file. It now says so in one line and changes nothing;
    an override that changes the config (here a plot setting) resumes as before."""
    run = copy_run(finished, tmp_path)
    before = _files(run)
    code, out, err = cli(["--resume", str(run)], capsys)
    assert code == 0, err
    assert "has finished its 4 steps" in out and "nothing was changed" in out, out
    assert _files(run) == before
    code, out, err = cli(["--resume", str(run), "train.steps=4", "train.plots=false"], capsys)
    assert code == 0, err
    assert read_jsonl(run / "metrics.jsonl", raw=True)[-1] == {"kind": "resume", "step": 4}
    assert json.loads((run / "summary.json").read_text())["final_eval_step"] == 4


def test_an_eval_resume_under_another_time_limit_is_refused(model_dir, dataset, tmp_path, capsys, no_model_load,  # noqa: F811
                                                             monkeypatch):
    """The verifier's ``--time-limit`` scores the samples (a comparison that runs past it scores 0) and is recorded in
    run_config.json; a resume under another one appended samples scored otherwise and recorded the new limit over the
    old as if every sample had been scored under it. It is refused as another ``--extraction`` is, naming both values;
    the same limit resumes."""
    out = tmp_path / "run"
    _write_settings(model_dir, dataset, out, monkeypatch, capsys)  # (the default 5 s)
    rows = [json.loads(x) for x in dataset.read_text().splitlines()]
    (out / "samples_toy.jsonl").write_text("".join(json.dumps(_record(i, r["problem"], r["answer"])) + "\n"
                                                   for i, r in enumerate(rows[:2])))
    settings = (out / "run_config.json").read_text()
    assert ev.main(_run_args(model_dir, dataset, out, "--time-limit", "1")) == 2
    _one_line_error(capsys, "time_limit 5.0 there, 1.0 here", "--overwrite")
    assert (out / "run_config.json").read_text() == settings and not (out / "results.json").exists()
