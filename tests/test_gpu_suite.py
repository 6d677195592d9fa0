"""bench/gpu/suite.sh: its plumbing on CPU (--dry-run) and its loud failure without a GPU.

The full dry run (all six steps, including 2 PACS steps of the tiny model) takes ~3 minutes on
this 2-core machine, so CI runs the quick steps; the report writer's run-metrics parsing is tested
on a synthetic metrics.jsonl.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.path.join(ROOT, "bench", "gpu", "suite.sh")
sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))


def _run(out, *args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHON"] = sys.executable
    env.setdefault("OMP_NUM_THREADS", "2")
    return subprocess.run(["bash", SUITE, str(out), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


DRY_STEPS = ("env", "logprobs", "pacs_loss", "megatron_run", "trl_run")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One dry run of the suite's kernel and product steps (one start-up for both tests that read it):
    ``(its folder, its report)``."""
    out = tmp_path_factory.mktemp("dry_run")
    proc = _run(out, "--dry-run", "--steps", ",".join(DRY_STEPS))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, json.loads((out / "gpu_report.json").read_text())


def test_dry_run_plumbing_writes_the_report(dry_run):
    tmp_path, rep = dry_run
    assert rep["dry_run"] and rep["ok"] and set(rep["steps"]) == set(DRY_STEPS)
    rows = {r["method"]: r for r in rep["steps"]["logprobs"]["rows"]}
    for m in ("pacs_triton", "pacs_triton_tma", "pacs_triton_split", "pacs_triton_atomic", "pacs_torch",
              "naive"):  # every method ran
        assert "unavailable" not in rows[m], rows[m]
        assert rows[m]["max_err"]["logp"] < 1e-4
    assert all("fused_ms" in r for r in rep["steps"]["pacs_loss"]["rows"])
    # the floors measured in the same run, and every time as a ratio to them (issue 22, item 1)
    assert all(r["fwd_vs_gemm"] > 0 and r["fwd_bwd_vs_4gemm"] > 0 for r in rows.values() if "unavailable" not in r)
    assert rep["steps"]["logprobs"]["floors"] and all(r["copy_ms"] > 0 and r["copy_bw_fraction"] > 0
                                                       for r in rep["steps"]["pacs_loss"]["rows"])
    md = (tmp_path / "gpu_report.md").read_text()
    assert "DRY RUN" in md and "pacs_triton_atomic" in md and "## PACS loss" in md
    # the image's kernel stacks are recorded (is CuTe DSL there?): versions here, None where missing
    pkgs = rep["steps"]["env"]["packages"]
    assert pkgs["transformers"] and "nvidia-cutlass-dsl" in pkgs and "Installed: " in md
    assert f"transformers {pkgs['transformers']}" in md
    assert "fwd+bwd / 4 GEMMs" in md and "wall share of copy" in md and "GPU share of copy" in md and "four GEMMs" in md
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the failure without a GPU")
def test_without_a_gpu_the_real_suite_fails_loudly(tmp_path):
    proc = _run(tmp_path, "--steps", "env")
    assert proc.returncode == 1
    assert "GPU SUITE FAILED: env" in proc.stderr
    rep = json.loads((tmp_path / "gpu_report.json").read_text())
    assert not rep["ok"] and "no CUDA device" in rep["steps"]["env"]["why"]
    assert "FAILED" in (tmp_path / "gpu_report.md").read_text()


def test_usage_error():
    proc = subprocess.run(["bash", SUITE], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_kernel_shares_sums_per_kernel_and_folds_the_tail():
    """bench/gpu/logprobs.py --profile: per-kernel device time (summed over launches), largest first, the rest
    folded into one row, shares of the total."""
    from logprobs import kernel_breakdown, kernel_shares
    ev = [("_stats_tiles_kernel", 700.0), ("_finish_kernel", 20.0), ("_stats_tiles_kernel", 100.0),
          ("cast", 5.0), ("memset", 3.0), ("gather", 2.0)]
    rows = kernel_shares(ev, top=2)
    assert [r["kernel"] for r in rows] == ["_stats_tiles_kernel", "_finish_kernel", "(other)"]
    assert [r["us"] for r in rows] == [800.0, 20.0, 10.0]
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-3 and rows[0]["share"] == round(800 / 830, 4)
    assert kernel_shares([]) == []
    if not torch.cuda.is_available():
        assert kernel_breakdown(lambda: None) is None  # no GPU: no breakdown, the timings stand


def test_pingpong_method_runs_both_gluon_kernels_with_their_pingpong_launches(monkeypatch):
    """``pacs_triton_gluon_pp``: for the whole case the forward and the dz kernel are the Gluon ones
    and their launchers read PINGPONG_CONFIGS; after it, the defaults again."""
    import logprobs as gpu_logprobs
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_gluon as G
    from pacs_fast.kernels.linear_logprobs_launch import PINGPONG_CONFIGS
    h, w = torch.randn(8, 4096).bfloat16(), torch.randn(40, 4096).bfloat16()
    seen = {}

    def case(name, *args):
        seen.update(fwd=K.CONFIG["FWD"], dz=K.CONFIG["DLOGITS"],
                    **{k: G._cfg(k, h, w) for k in PINGPONG_CONFIGS})
        return {"method": name}
    monkeypatch.setattr(gpu_logprobs, "_bench_case", case)
    before = {k: G._cfg(k, h, w) for k in PINGPONG_CONFIGS}
    assert gpu_logprobs.bench_case("pacs_triton_gluon_pp", 8, 4096, 40, torch.bfloat16, "cpu", 1) == {
        "method": "pacs_triton_gluon_pp"}
    assert seen["fwd"] == "gluon" and seen["dz"] == "gluon"
    for kernel, pp in PINGPONG_CONFIGS.items():
        assert {k: seen[kernel][k] for k in pp} == pp and before[kernel]["PINGPONG"] == 0
        assert G._cfg(kernel, h, w) == before[kernel]
    assert K.CONFIG["FWD"] is None and K.CONFIG["DLOGITS"] is None


def test_logprob_rows_record_the_kernels_and_launches_at_their_shape(tmp_path, monkeypatch):
    """Each ``pacs_triton*`` row of bench/gpu/logprobs.py records which forward and dz kernel ran and their launch
    parameters at the row's shape: with a tuned table measured at H=4096 and H=896 (``by_h``), an H=896
    row shows the H=896 choice and launch, an H=4096 row the main ones; other methods record nothing."""
    import json
    import logprobs as gpu_logprobs
    from pacs_fast.kernels import linear_logprobs as K, tuning
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)  # the built-in launches
    base = K.launch_config("stats_tiles", N=64, V=512, H=4096, dtype=torch.bfloat16, arch=90)
    gl = K.launch_config("stats_gluon", N=64, V=512, H=4096, dtype=torch.bfloat16, arch=90)
    (tmp_path / "sm_90.json").write_text(json.dumps({"schema": 1, "arch": 90, "kernels": {
        "linear_logprobs.stats_gluon.16": {"h": 4096, "config": gl, "by_h": {"896": {"config": dict(gl, GROUP_N=4)}}},
        "linear_logprobs.forward.16": {"h": 4096, "choice": "tiles", "by_h": {"896": {"choice": "gluon"}}}}}))
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    monkeypatch.setattr(K, "device_arch", lambda device: 90)
    w = torch.zeros(512, 1).bfloat16()
    small = gpu_logprobs._kernel_kinds("pacs_triton", torch.zeros(64, 896).bfloat16(), w)
    big = gpu_logprobs._kernel_kinds("pacs_triton", torch.zeros(64, 4096).bfloat16(), w)
    assert (small["forward_kind"], big["forward_kind"], small["dz_kind"]) == ("gluon", "tiles", "pointer")
    assert small["launch"]["forward"] == dict(gl, GROUP_N=4, kernel="stats_gluon")
    assert big["launch"]["forward"] == dict(base, kernel="stats_tiles") and small["launch"]["dz"]["kernel"] == "dlogits"
    assert gpu_logprobs._kernel_kinds("liger_flce", torch.zeros(64, 896), w) == {}
    line = gpu_logprobs._launch_str(small["launch"]["forward"])  # as the benchmark prints it under the row
    assert line.startswith(f"{gl['BLOCK_N']}x{gl['BLOCK_V']}x{gl['BLOCK_H']} w{gl['num_warps']} s{gl['num_stages']} G4")
    assert "PERSISTENT=1" in line and "PINGPONG" not in line  # knobs set to 0 are left out


def test_device_events_profiles_warm_up_plus_calls(monkeypatch):
    """The benchmarks' CUDA-profiler helper runs one warm-up and then ``calls`` calls under the
    profiler; on a CPU (CUDA faked present) the profiler runs and finds no device event."""
    import cuda_profile
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    n = []
    assert cuda_profile.device_events(lambda: n.append(torch.ones(8).sum()), 3) == []
    assert len(n) == 4


def test_phases_from_metrics(tmp_path):
    from suite import phases_from_metrics, report_md
    recs = [{"kind": "eval", "step": 0, "time/eval": 3.0}]
    recs += [{"kind": "train", "step": s, "time/rollout": 10.0 if s == 1 else float(s),
              "time/update": 1.0, "perf/tokens_per_s": 100.0} for s in range(1, 5)]
    p = tmp_path / "metrics.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    n, ph = phases_from_metrics(str(p))
    assert n == 4 and "time/eval" not in ph
    assert ph["time/rollout"] == {"mean": 3.0, "median": 3.0, "first_step": 10.0}  # steps 2..4
    md = report_md({"pacs_run": dict(ok=True, seconds=1.0, steps=n, phases=ph)}, dry=False)
    assert "| time/rollout | 3 | 3 | 10 |" in md
    assert phases_from_metrics(str(tmp_path / "missing.jsonl")) == (0, {})


def test_dry_run_of_the_product_runs(dry_run):
    """The megatron learner (TP=1 under torchrun) and the TRL adapter steps, at tiny CPU settings."""
    _, rep = dry_run
    meg, trl = rep["steps"]["megatron_run"], rep["steps"]["trl_run"]
    assert meg["ok"] and meg["steps"] == 2 and all(r["learner/grad_norm"] is not None for r in meg["records"])
    assert os.path.getsize(meg["log"]) > 0  # the run's whole output, kept for a failure's cause
    assert trl["ok"] and trl["steps"] == 3 and len(trl["losses"]) == 3


def test_a_missing_package_is_reported_as_not_run(tmp_path, monkeypatch):
    import importlib.util

    import product_runs as gpu_product_runs
    from suite import report_md

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name.startswith(("megatron", "trl"))
                        else real(name, *a))
    assert gpu_product_runs.main(["megatron", "unused", str(tmp_path / "m.json")]) == 3
    assert gpu_product_runs.main(["trl", "unused", str(tmp_path / "t.json")]) == 3
    res = json.loads((tmp_path / "m.json").read_text())
    assert res == {"ok": False, "missing": "megatron-core", "why": "megatron-core is not installed"}
    md = report_md({"megatron_run": dict(ok=True, seconds=0.1, not_run="megatron-core is not installed")}, dry=False)
    assert "| megatron_run | not run: megatron-core is not installed |" in md


def test_a_failed_run_reports_its_first_traceback():
    """torchrun ends a failed run with its own summary, which names no cause (the H200 run of
    2026-11-26 reported only that): the step's reason is the rank's first traceback."""
    from product_runs import first_error
    out = ("loading\n[rank0]: Traceback (most recent call last):\n[rank0]:   File \"t.py\", line 3, in f\n"
           "[rank0]:     g()\n[rank0]: KeyError: 'x'\nlater noise\nTraceback (most recent call last):\n"
           "  File \"run.py\", line 9\ntorch.distributed.elastic.ChildFailedError: pacs_fast.train FAILED\n")
    why = first_error(out)
    assert why.startswith("Traceback") and why.endswith("KeyError: 'x'") and "ChildFailedError" not in why
    assert first_error("no traceback\njust output") == "no traceback\njust output"
    cli = ("Error: model.device=cuda needs a CUDA GPU\nTraceback (most recent call last):\n  File \"torch/distributed/"
           "run.py\", line 9\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n")
    assert first_error(cli) == "Error: model.device=cuda needs a CUDA GPU"
    assert "ChildFailedError" in first_error(cli.split("\n", 1)[1])  # only torchrun's: the tail
    long = "Traceback (most recent call last):\n" + "".join(f"  line {i}\n" for i in range(2000)) + "ValueError: end"
    assert len(first_error(long)) <= 1500 and first_error(long).endswith("ValueError: end")


def test_a_module_skipped_at_collection_keeps_its_reason():
    """The H200 run of 2026-11-27 reported gpu_tests FAILED for ``test_integrations_verl.py``, skipped
    whole because verl is not installed there: JUnit gives such a skip the message "collection
    skipped" and the reason in the element's text, which the suite now reads (that JUnit file is kept)."""
    from suite import junit_counts
    xml = os.path.join(ROOT, "bench", "results", "gpu", "20261127_h200", "1_main", "suite", "gpu_tests.xml")
    counts, skipped = junit_counts(xml)
    assert counts == dict(tests=12, failures=0, errors=0, skipped=1)
    assert len(skipped) == 1 and "verl not installed" in skipped[0] and "collection skipped" in skipped[0]
    assert junit_counts(os.path.join(ROOT, "no", "such.xml")) == (dict(tests=0, failures=0, errors=0, skipped=0), [])


def test_logprobs_keeps_the_rows_of_a_run_cut_short(tmp_path):
    """bench/gpu/logprobs.py writes its JSON after every row (a lease phase killed by its time limit kept nothing when
    it wrote once at the end): here the second shape fails to parse, after the first shape's rows were measured."""
    out = tmp_path / "lp.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu", "logprobs.py"), "--device", "cpu",
                           "--shapes", "16x8x40,16xbad", "--methods", "pacs_torch,naive", "--iters", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode != 0 and "ValueError" in proc.stderr, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and [(r["method"], r["N"]) for r in doc["rows"]] == [("pacs_torch", 16), ("naive", 16)]
    assert all(r["fwd_vs_gemm"] > 0 for r in doc["rows"]) and not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_the_pacs_loss_benchmark_killed_after_a_row_keeps_it(tmp_path):
    """bench/bench_pacs_loss.py writes its JSON after every row, before printing it: killed (as a lease phase's time
    limit kills it) once a row is printed, its file holds that row (it wrote the file once, at the end, before)."""
    out = tmp_path / "pl.json"
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "bench_pacs_loss.py"), "--device", "cpu",
                             "--shapes", "64x32,2048x2048", "--group-size", "8,16", "--repeat", "50",
                             "--out", str(out)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        for line in proc.stdout:
            if line.startswith("row "):
                break
        proc.kill()
    finally:
        proc.wait(timeout=60)
        proc.stdout.close()
    assert proc.returncode == -9  # killed, not finished
    doc = json.loads(out.read_text())
    assert doc["meta"]["device"] == "cpu" and len(doc["rows"]) >= 1
    assert doc["rows"][0]["B"] == 64 and doc["rows"][0]["torch_ms"] > 0
