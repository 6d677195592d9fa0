"""bench/gpu/attention.py's dry run (CPU, tiny rows, the CPU path standing in for the varlen kernel): every
layout x method row is written, every method's output and gradients equal the varlen path's (fp32: the same
per-sequence attention), and the split methods send the long sequences to SDPA where some reach the threshold."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_run_cut_short_keeps_the_layouts_it_finished(tmp_path):
    """Written after every layout (flex's first call compiles, which may outlast a lease phase's limit): killed once
    the first layout is printed, the JSON holds that layout's rows."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "gpu" / "attention.py"), "--out", str(tmp_path),
                             "--dry-run"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("4k "):  # the second layout has begun printing: the first was written before it
                break
        proc.kill()
    finally:
        proc.wait(timeout=60)
        proc.stdout.close()
    rows = json.loads((tmp_path / "attention.json").read_text())["rows"]
    assert rows and {r["layout"] for r in rows} <= {"1k", "4k"} and sum(r["layout"] == "1k" for r in rows) == 8


def test_dry_run_writes_every_row_and_the_methods_agree(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env.pop("PACS_FAST_VARLEN_LONG", None)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "attention.py"), "--out", str(tmp_path),
                           "--dry-run"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "attention.json").read_text())["rows"]
    methods = ["varlen", "split >= 8", "split >= 16", "split >= 32", "split >= 64", "split views >= 32",
               "sdpa groups", "flex"]
    assert [(r["layout"], r["method"]) for r in rows] == [(x, m) for x in ("1k", "4k", "32k", "mix") for m in methods]
    for r in rows:
        assert r["ms"] > 0 and r["max_rel_diff_vs_varlen"] <= 1e-5, r
        split = r["method"].startswith("split")  # (the views variant splits at the same threshold as "split >= 32")
        long = split and r["longest"] >= int(r["method"].split()[-1])
        assert ("sdpa_long" in r["kernels"]) == long, r
    mix = {r["method"]: r["kernels"] for r in rows if r["layout"] == "mix"}
    assert mix["split >= 16"]["sdpa_long"] > 1 and mix["split >= 16"]["varlen_attn"] == 1
    # the views variant: one varlen call per run of short sequences between the long ones, the same long ones
    assert mix["split views >= 32"]["sdpa_long"] == mix["split >= 32"]["sdpa_long"]
    assert mix["split views >= 32"]["varlen_attn"] >= 1
    assert "| mix |" in (tmp_path / "attention.md").read_text()
    assert all(r["first_call_s"] > 0 for r in rows)  # (flex's compile time on a GPU)
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]  # (no temporary file left)


def test_a_method_that_fails_gets_a_row_saying_why_and_the_others_are_timed(tmp_path, monkeypatch):
    """A method raising in its first call (flex's compile on a GPU could) no longer ends the benchmark: its row holds
    the error, every other method is timed."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_attention", ROOT / "bench" / "gpu" / "attention.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.delenv("PACS_FAST_VARLEN_LONG", raising=False)
    monkeypatch.setattr(mod, "split_views", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no views here")))
    from pacs_fast.ops import varlen_attention as va
    monkeypatch.setitem(va._KERNELS, "varlen_attn", va._KERNELS["varlen_attn"])  # (the dry run replaces it)
    assert mod.main(["--out", str(tmp_path), "--dry-run", "--rounds", "1"]) == 0
    rows = json.loads((tmp_path / "attention.json").read_text())["rows"]
    bad = [r for r in rows if "error" in r]
    assert [r["method"] for r in bad] == ["split views >= 32"] * 4 and bad[0]["error"] == "RuntimeError: no views here"
    assert len(rows) == 32 and all(r["ms"] > 0 for r in rows if "error" not in r)
    assert "| failed | | | RuntimeError: no views here |" in (tmp_path / "attention.md").read_text()
