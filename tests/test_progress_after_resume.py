"""The progress line's ``held-out`` accuracy is the newest evaluation, after a resume too.

A resumed run started its line from the step-0 evaluation (kept in the checkpoint's trainer state) and showed it
as ``held-out`` until its own first evaluation, beside a run whose last evaluation (in ``metrics.jsonl``, up to the
checkpoint) said otherwise: a stale number shown as the current one (metrics audit of 2026-12-03).
"""
import pacs_fast.trainer.session as session
from pacs_fast.config import load_config
from pacs_fast.trainer import train
from pacs_fast.trainer.metrics import Progress, read_jsonl

# the tiny built-in task (tests/test_train.py's TINY)
TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=8", "rollout.n=4", "rollout.eval_n=2",
        "rollout.max_new_tokens=6", "train.prompts_per_step=4", "learner.mini_batch_prompts=2",
        "learner.micro_batch_prompts=1", "warmup.steps=30", "warmup.batch_size=32", "model.tiny_hidden_size=64",
        "model.tiny_num_layers=1", "learner.lr=3e-3", "train.progress=false", "train.tensorboard=false",
        "train.seed=0", "train.log_samples=0", "train.plots=false"]


def test_a_resumed_runs_progress_line_shows_its_last_evaluation(tmp_path, warm_cache, monkeypatch):
    lines, accs = {}, iter([0.125, 0.75, 0.5])  # each evaluation's accuracy: distinct, whatever the tiny model scores
    monkeypatch.setattr(Progress, "update", lambda self, step, info: lines.__setitem__(step, info))
    real = session.evaluate
    monkeypatch.setattr(session, "evaluate", lambda *a: {**real(*a), "eval/acc": next(accs)})
    run = tmp_path / "run"
    first = TINY + [f"warmup.cache_dir={warm_cache}", "train.eval_every=2", "train.save_every=2"]
    train(load_config(None, first + ["train.steps=2"]), run)
    evals = {r["step"]: r["eval/acc"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "eval"}
    assert evals == {0: 0.125, 2: 0.75}
    assert f"held-out {evals[0]:.2f} " in lines[2]  # (step 2's line is written before step 2's evaluation)
    lines.clear()
    train(load_config(None, first + ["train.steps=3"]), run, resume=True)
    assert f"held-out {evals[2]:.2f} " in lines[3], (lines[3], evals)  # the old code: evals[0]
