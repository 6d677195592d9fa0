"""bench/gpu_tune.py --dry-run (no GPU): enumerates every kernel's sweep, AOT-compiles a small subset,
writes sm_90.json into a temporary folder; launch_config then reads it (kernels/tuning.py), an
explicit CONFIG override still wins, and an architecture without a table (or with an unreadable one)
keeps the built-in configuration."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="the tuner's compile filter needs the triton package")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, H, V = 8192, 4096, 151936


def _tune(*args, timeout=240):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu_tune.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _config(mod, kernel, arch):
    from pacs_fast.kernels import linear_logprobs as KL, token_logprobs as KT
    if mod == "token_logprobs":
        return KT.launch_config(kernel, N=N, V=V, dtype=torch.bfloat16, arch=arch)
    return KL.launch_config(kernel, N=N, V=V, H=H, dtype=torch.bfloat16, arch=arch)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    out = tmp_path_factory.mktemp("tuned")
    proc = _tune("--dry-run", "--out-dir", str(out), "--jobs", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "stage-1 candidates" in proc.stdout
    return out, json.loads((out / "sm_90.json").read_text())


def test_dry_run_enumerates_filters_and_writes_every_kernel(table):
    _, data = table
    assert data["schema"] == 1 and data["arch"] == 90 and data["dry_run"] is True
    assert set(data["kernels"]) == {"linear_logprobs.stats_tiles.16", "linear_logprobs.dlogits.16",
                                    "linear_logprobs.grad_bwd.16", "token_logprobs.stats_fwd.16",
                                    "token_logprobs.grad_bwd.16"}
    for key, rec in data["kernels"].items():
        assert rec["ms"] is None and rec["timed"] == 0, key  # nothing is timed without a GPU
        assert rec["enumerated"] > rec["compiled"] >= 2, key  # the sweep is larger than the subset compiled
    # the compile filter really filters: 128x256 tiles spill in the backward kernels on sm_90
    assert data["kernels"]["linear_logprobs.dlogits.16"]["compile_rejected"] >= 1


def test_launch_config_reads_the_written_table(table, monkeypatch):
    from pacs_fast.kernels import linear_logprobs as KL, tuning
    out, data = table
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)  # no table: the built-in configurations
    builtin = {k: _config(*k.split(".")[:2], 90) for k in data["kernels"]}
    monkeypatch.setattr(tuning, "TUNED_DIR", str(out))
    differs = 0
    for key, rec in data["kernels"].items():
        got = _config(*key.split(".")[:2], 90)
        assert got == rec["config"], (key, got, rec["config"])
        assert rec["builtin"] == builtin[key]
        differs += got != builtin[key]
    assert differs >= 1  # at least one entry is not the built-in one, so the read is visible
    # an explicit CONFIG override wins over the measured table
    monkeypatch.setitem(KL.CONFIG, "num_stages", 5)
    assert _config("linear_logprobs", "stats_tiles", 90)["num_stages"] == 5
    monkeypatch.setitem(KL.CONFIG, "num_stages", None)
    # another architecture has no table: built-in
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)
    want80 = _config("linear_logprobs", "stats_tiles", 80)
    monkeypatch.setattr(tuning, "TUNED_DIR", str(out))
    assert _config("linear_logprobs", "stats_tiles", 80) == want80


def test_unreadable_table_is_ignored_with_a_warning(tmp_path, monkeypatch):
    from pacs_fast.kernels import tuning
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)
    want = _config("linear_logprobs", "dlogits", 90)
    (tmp_path / "sm_90.json").write_text('{"schema": 1, "arch": 90, "kernels": ')  # cut short
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    with pytest.warns(UserWarning, match="ignoring the tuned launch table"):
        assert _config("linear_logprobs", "dlogits", 90) == want
    # an entry's unknown keys and non-integers are ignored; known keys are taken
    (tmp_path / "sm_90.json").write_text(json.dumps({"schema": 1, "arch": 90, "kernels": {
        "linear_logprobs.dlogits.16": {"config": {"num_stages": 4, "BOGUS": 1, "BLOCK_N": "x"}}}}))
    os.utime(tmp_path / "sm_90.json", ns=(1, 2))  # a new stamp: re-read
    assert _config("linear_logprobs", "dlogits", 90) == dict(want, num_stages=4)


def test_dry_run_refuses_the_repository_table_folder():
    path = os.path.join(ROOT, "kernels", "tuned", "sm_90.json")
    before = open(path, "rb").read() if os.path.exists(path) else None
    proc = _tune("--dry-run", "--out-dir", os.path.dirname(path), "--kernels", "token_logprobs.stats_fwd",
                 timeout=120)
    assert proc.returncode != 0 and "not into kernels/tuned" in proc.stderr
    assert (open(path, "rb").read() if os.path.exists(path) else None) == before  # untouched
