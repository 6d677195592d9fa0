"""What the tests of verl's loss modes (GSPO / CISPO, Clip-Cov / KL-Cov, GMPO / SAPO) share: a bad value refused
by the CLI in one line before anything loads, the keys named unused, and a 2-step run of the built-in task."""
from __future__ import annotations

import math

import pytest


def assert_refused_before_loading(overrides, key, tmp_path, capsys):
    """One line naming the key, exit 2, before any model or engine loads (train.py validates first), and nothing
    created under ``tmp_path``."""
    from pacs_fast.train import main

    with pytest.raises(SystemExit) as e:
        main([*overrides, f"train.out_dir={tmp_path}"])
    assert e.value.code == 2
    lines = [x for x in capsys.readouterr().err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and key in lines[0], lines
    assert not any(tmp_path.iterdir())


def unused_keys(overrides) -> list[str]:
    """The keys ``unused_settings`` names for a valid config, sorted."""
    from pacs_fast.config import load_config, unused_settings, validate

    cfg = load_config(None, overrides)
    validate(cfg, world=1)
    return sorted(line.split("=")[0] for line in unused_settings(cfg))


def assert_objective_equals(algo, mb, logp, expected, keys=()) -> dict:
    """The trainer's objective of the micro-batch ``mb`` (two groups of 4 rows, horizon 6) is ``expected``, its
    metrics hold ``keys``, and its two groups as micro-batches sum to it (the mini-batch's counts). Returns the
    metrics."""
    import torch

    from pacs_fast.learner.objective import minibatch_counts, objective

    counts = minibatch_counts(mb)
    whole, met = objective(algo, mb, logp, None, None, counts, horizon=6)
    torch.testing.assert_close(whole, expected)
    assert all(k in met for k in keys), (keys, sorted(met))
    parts = sum(objective(algo, mb.groups([g]), logp[4 * g:4 * g + 4], None, None, counts, horizon=6)[0]
                for g in range(2))
    torch.testing.assert_close(parts, whole)
    return met


def assert_two_step_run(tiny_args, tmp_path, keys):
    """``train.steps=2`` of the built-in task with ``tiny_args``: a train record per step, each with ``keys``
    (and the loss, grad norm, pg loss and advantages' size) finite."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    from pacs_fast.trainer.metrics import read_jsonl

    cfg = load_config(None, [*tiny_args, "train.steps=2", "train.eval_every=0", "train.save_every=0"])
    train(cfg, tmp_path / "run")
    recs = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        for key in ("learner/loss", "learner/grad_norm", "learner/pg_loss", "learner/adv_abs_mean", *keys):
            assert key in r and math.isfinite(r[key]), (key, r.get(key))
    return recs
