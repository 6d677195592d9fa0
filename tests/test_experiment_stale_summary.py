"""Lifecycle sweep of the experiment runner: a finished run extended by hand (``--resume RUN train.steps=N``) and
stopped before its new end keeps its older ``summary.json``, while its ``config.yaml`` already records the new
``train.steps``. The runner took that summary for the new end: the run was "already done" (never resumed again) and
its table row gave the earlier end's accuracy as the final one of an N-step run (its curve the steps past it too)."""
import json

from pacs_fast import experiment as ex
from pacs_fast.config import save_config
from pacs_fast.experiment_results import collect

from test_experiment import TINY


def _run(job, *, steps_run: int, evals: dict) -> None:
    """``job``'s folder as the trainer leaves it: ``config.yaml`` of the spec, a checkpoint, the evaluations and a
    summary written at the end of a ``steps_run``-step run."""
    job.run_dir.mkdir(parents=True)
    save_config(ex.intended_config(None, job.argv), job.run_dir / "config.yaml")
    (job.run_dir / "checkpoints" / f"step_{max(evals):06d}").mkdir(parents=True)
    (job.run_dir / "metrics.jsonl").write_text("".join(json.dumps({"kind": "eval", "step": s, "eval/acc": a}) + "\n"
                                                       for s, a in sorted(evals.items())))
    final = max(s for s in evals if s <= steps_run)
    (job.run_dir / "summary.json").write_text(json.dumps({"acc_before": evals[0], "acc_after": evals[final],
                                                          "final_eval_step": final, "steps": steps_run}))


def test_a_summary_of_fewer_steps_than_the_config_is_not_a_finished_run(tmp_path, capsys):
    arms, out = [ex.parse_arm("grpo")], tmp_path / "exp"
    extended, done = ex.make_jobs(arms, [0, 1], [*TINY, "train.steps=4"], out)
    # seed 0: finished at step 2, resumed with train.steps=4 (config.yaml says 4), stopped after step 3's evaluation
    _run(extended, steps_run=2, evals={0: 0.25, 1: 0.5, 2: 0.75, 3: 0.5})
    _run(done, steps_run=4, evals={0: 0.25, 2: 0.5, 4: 0.75})  # seed 1: finished at its train.steps
    assert [ex.job_state(j, None) for j in (extended, done)] == ["resume", "done"]
    todo, n_done = ex.plan([extended, done], None, restart_mismatched=False)
    assert [(j.seed, state) for j, state in todo] == [(0, "resume")] and n_done == 1
    assert ex.command(extended, None, "resume")[-2:] == ["--resume", str(extended.run_dir)]
    res = collect([extended, done])
    assert list(res["grpo"]) == [1]  # not the step-2 accuracy as seed 0's final one
    md = ex.report([extended, done], arms, None, out, "# t")
    assert "- grpo: seed(s) [0] did not finish" in md and "| grpo | 1 |" in md
    capsys.readouterr()


def test_summaries_without_steps_or_a_config_still_count_as_finished(tmp_path):
    """Runs from before summary.json recorded ``steps`` (and folders without a readable config.yaml, which
    collect names as damaged) are read as before."""
    from pacs_fast.experiment_results import finished

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    assert finished(run)
    (run / "summary.json").write_text(json.dumps({"steps": 3}))
    assert finished(run)  # (no config.yaml)
    (run / "config.yaml").write_text("train: [unclosed\n")
    assert finished(run)
    (run / "config.yaml").write_text("train:\n  steps: 5\n")
    assert not finished(run)
    (run / "summary.json").unlink()
    assert not finished(run)


def test_a_stale_summary_without_checkpoints_is_resumed_in_place_not_deleted(tmp_path, capsys):
    """Without a checkpoint a stale-summary run would have been "fresh" with files: deleted by the plan. The
    trainer's --resume starts such a run again from step 0 in its own folder (append-only), so it is resumed."""
    job = ex.make_jobs([ex.parse_arm("grpo")], [0], [*TINY, "train.steps=4"], tmp_path / "exp")[0]
    _run(job, steps_run=2, evals={0: 0.25, 2: 0.75})
    for p in (job.run_dir / "checkpoints").iterdir():
        p.rmdir()
    assert ex.job_state(job, None) == "resume"
    todo, _ = ex.plan([job], None, restart_mismatched=False)
    assert [state for _, state in todo] == ["resume"] and (job.run_dir / "summary.json").is_file()
    capsys.readouterr()


def test_a_resume_that_leaves_the_stale_summary_counts_as_failed(tmp_path, monkeypatch):
    """The runner counted a run as finished when its summary.json existed after the trainer exited: a resume of a
    stale-summary run that stopped at once (a refused setting, a crash) was 'done' again."""
    import sys

    job = ex.make_jobs([ex.parse_arm("grpo")], [0], [*TINY, "train.steps=4"], tmp_path / "exp")[0]
    _run(job, steps_run=2, evals={0: 0.25, 2: 0.75})
    monkeypatch.setattr(ex, "command", lambda job, config, state: [sys.executable, "-c", "pass"])  # writes nothing
    lines = []
    counts = ex.run_jobs([(job, "resume")], None, workers=1, threads=1, log=lines.append)
    assert counts == {"finished": 0, "failed": 1}, lines
