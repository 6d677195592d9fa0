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
