"""The command lines shorten libgomp's idle spinning (``GOMP_SPINCOUNT=10000``) unless the user chose a
wait policy or spin count, or opted out (pacs_fast/openmp.py): two CPU-heavy processes on one machine no
longer take each other's time slices by spinning (bench/bench_contention.py)."""
import os
import subprocess
import sys

import pytest

PROBE = "import os, sys, pacs_fast.{cli}; print(os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)"


@pytest.mark.parametrize("cli", ["train", "eval"])
@pytest.mark.parametrize("given,want", [(None, "10000"), ("policy", None), ("spin", "500"), ("keep", None)])
def test_the_cli_sets_the_wait_policy_before_torch_loads(cli, given, want):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "PACS_FAST_OMP_WAIT_POLICY")}
    if given == "keep":
        env["PACS_FAST_OMP_WAIT_POLICY"] = "keep"
    elif given == "policy":  # the user's own wait policy: no spin count is added
        env["OMP_WAIT_POLICY"] = "ACTIVE"
    elif given == "spin":
        env["GOMP_SPINCOUNT"] = "500"
    out = subprocess.run([sys.executable, "-c", PROBE.format(cli=cli)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    policy, torch_loaded = out.stdout.split()
    assert policy == str(want) and torch_loaded == "True"  # set before torch loaded: libgomp reads it then


def test_nothing_is_set_once_torch_is_loaded(monkeypatch):
    from pacs_fast.openmp import quiet_openmp_waits

    for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "PACS_FAST_OMP_WAIT_POLICY"):
        monkeypatch.delenv(k, raising=False)
    import torch  # noqa: F401  (loaded: too late for libgomp)
    assert quiet_openmp_waits() is False and "GOMP_SPINCOUNT" not in os.environ


def _stat(busy, idle):
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    return f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n"


def test_busy_cpus_reads_the_non_idle_time_between_two_samples(tmp_path, monkeypatch):
    import pacs_fast.openmp as om

    stat = tmp_path / "stat"
    stat.write_text(_stat(1000, 5000))
    tick = os.sysconf("SC_CLK_TCK")
    # 0.1 s on 2 CPUs is 0.2 s of CPU time: 1.5 CPUs busy and 0.5 idle in that window
    monkeypatch.setattr(om.time, "sleep", lambda s: stat.write_text(_stat(1000 + int(0.15 * tick), 5000 + int(0.05 * tick))))
    assert om.busy_cpus(0.1, stat_path=str(stat)) == pytest.approx(1.5, abs=0.02)
    monkeypatch.setattr(om.time, "sleep", lambda s: None)  # nothing moved: nothing busy
    assert om.busy_cpus(0.1, stat_path=str(stat)) == 0.0


@pytest.mark.parametrize("cpus,busy,want", [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.9, 1), (2, 5.0, 1),
                                            (16, 3.4, 13), (16, 0.0, 16), (1, 1.0, 1)])
def test_a_job_takes_the_free_cpus_and_at_least_one(cpus, busy, want):
    from pacs_fast.openmp import free_cpu_threads

    assert free_cpu_threads(cpus, busy) == want


def test_a_chosen_thread_count_is_left_alone(monkeypatch):
    import pacs_fast.openmp as om

    monkeypatch.setattr(om, "busy_cpus", lambda sample_s=0.1: 1.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert om.threads_beside_other_jobs(2) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert om.threads_beside_other_jobs(2) == (1, 1.0)
    monkeypatch.setattr(om, "busy_cpus", lambda sample_s=0.1: 0.2)
    assert om.threads_beside_other_jobs(2) is None


def test_a_process_spinning_beside_is_seen_busy():
    from pacs_fast.openmp import busy_cpus

    hog = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 20: pass"])
    try:
        import time
        time.sleep(0.3)
        seen = max(busy_cpus(0.2) for _ in range(3))
    finally:
        hog.kill()
        hog.wait()
    assert seen >= 0.7, seen  # one core spins (the other xdist worker may add to it, never take from it)


def test_the_trainer_takes_the_free_cores_beside_another_job(tmp_path, monkeypatch, capsys, warm_cache):
    import torch

    import pacs_fast.openmp as om
    from pacs_fast.train import main
    from test_train import TINY

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(om, "busy_cpus", lambda sample_s=0.1: 1.0)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        main(TINY + ["train.steps=1", "train.eval_every=0", f"train.out_dir={tmp_path}",
                     f"warmup.cache_dir={warm_cache}"])
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    out = capsys.readouterr()
    assert used == 1 and "other processes keep 1.0 of this machine's CPUs busy: 1 torch thread(s)" in out.out + out.err
