"""bench/bench_contention.py compares OpenMP wait policies with a thread per core (its tables' "a thread per
core (the default)"). Since the trainer with ``train.threads=0`` takes only the cores it finds free at its start
(pacs_fast/openmp.py), a cell that left ``OMP_NUM_THREADS`` unset got 1 thread whenever anything else was busy:
both runs of a side-by-side pair (each sees the other's start-up), and on a shared machine the lone run too. Every
policy then measured ``+t1``, where there is no barrier spinning to compare. The cells' environments must keep
the trainer from choosing, unless the policy asks for its choice (``tauto``)."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench():
    spec = importlib.util.spec_from_file_location("bench_contention", ROOT / "bench" / "bench_contention.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("policy,threads", [("default", None), ("spin10000", None), ("PASSIVE", None),
                                            ("spin10000+t1", "1")])
def test_every_cell_keeps_the_trainer_from_choosing_its_threads(monkeypatch, policy, threads):
    import torch

    from pacs_fast import openmp

    mod = bench()
    env = mod._env(policy)
    want = threads or mod._default_threads()
    assert env["OMP_NUM_THREADS"] == want and env["PACS_FAST_OMP_WAIT_POLICY"] == "keep"
    # torch's own count, found without the caller's OMP_NUM_THREADS (the tests run with 1)
    assert int(mod._default_threads()) >= 1
    # the trainer's choice under this environment, with another job keeping every other CPU busy
    monkeypatch.setenv("OMP_NUM_THREADS", env["OMP_NUM_THREADS"])
    monkeypatch.setattr(openmp, "busy_cpus", lambda *a, **k: 64.0)
    assert openmp.threads_beside_other_jobs(max(2, torch.get_num_threads())) is None


def test_tauto_leaves_the_choice_to_the_trainer():
    env = bench()._env("spin10000+tauto")
    assert "OMP_NUM_THREADS" not in env and env["GOMP_SPINCOUNT"] == "10000"
