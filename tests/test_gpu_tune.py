"""bench/gpu/tune.py --dry-run (no GPU): enumerates every kernel's sweep, AOT-compiles a small subset,
writes sm_90.json into a temporary folder; launch_config then reads it (kernels/tuning.py), an
explicit CONFIG override still wins, and an architecture without a table keeps the built-in
configuration. How a table is read without the tuner: tests/test_tuned_tables.py."""
import json
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton", reason="the tuner's compile filter needs the triton package")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, H, V = 8192, 4096, 151936
LOGPROB_KEYS = {"linear_logprobs.stats_tiles.16", "linear_logprobs.stats_tma.16", "linear_logprobs.stats_gluon.16",
                "linear_logprobs.dlogits.16", "linear_logprobs.dlogits_gluon.16",
                "linear_logprobs.dlogits_tma.16", "linear_logprobs.grad_bwd.16", "token_logprobs.stats_fwd.16", "token_logprobs.grad_bwd.16"}
PACS_KEYS = {"pacs_loss.fwd_sums.32", "pacs_loss.fwd.32", "pacs_loss.bwd.32"}
CHOICE_KEYS = {"linear_logprobs.forward.16", "linear_logprobs.dz.16"}  # which forward / dz kernel runs


def _tune(*args, timeout=240):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gpu", "tune.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


_REFUSALS = r'''
import contextlib, io, json, sys
sys.path.insert(0, "bench/gpu")
import tune
out = []
for argv in json.loads(sys.argv[1]):
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            tune.main(argv)
        out.append({"exit": None, "stdout": printed.getvalue()})
    except SystemExit as e:
        out.append({"exit": str(e.code), "stdout": printed.getvalue()})
print("RESULT", json.dumps(out))
'''


def _refusals(argvs):
    """``tune.main(argv)`` for each argv in one fresh process (a process each cost ~1.5 s of CPU):
    [{"exit": the SystemExit message or None, "stdout": what it printed}]."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _REFUSALS, json.dumps(argvs)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT ", 1)[1])


def _config(mod, kernel, arch):
    from pacs_fast.kernels import linear_logprobs as KL, token_logprobs as KT
    if mod == "token_logprobs":
        return KT.launch_config(kernel, N=N, V=V, dtype=torch.bfloat16, arch=arch)
    return KL.launch_config(kernel, N=N, V=V, H=H, dtype=torch.bfloat16, arch=arch)


def _import_gpu_tune(monkeypatch):
    """bench/gpu/tune.py imported in-process; it drops TRITON_INTERPRET from the environment (it compiles
    for real GPUs), which this test process keeps for every later kernel."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench", "gpu"))
    interpret = os.environ.get("TRITON_INTERPRET")
    try:
        import tune as gpu_tune
    finally:
        if interpret is not None:
            os.environ["TRITON_INTERPRET"] = interpret
    return gpu_tune


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    out = tmp_path_factory.mktemp("tuned")
    proc = _tune("--dry-run", "--out-dir", str(out), "--jobs", "2", "--also-h", "896")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "stage-1 candidates" in proc.stdout
    return out, json.loads((out / "sm_90.json").read_text())


def test_dry_run_enumerates_filters_and_writes_every_kernel(table):
    _, data = table
    assert data["schema"] == 1 and data["arch"] == 90 and data["dry_run"] is True
    assert set(data["kernels"]) == LOGPROB_KEYS | PACS_KEYS | CHOICE_KEYS
    kernels = dict(data["kernels"])  # (the fixture's table is shared with the other tests)
    for key in CHOICE_KEYS:  # untimed in a dry run: the first swept kind other than the default
        rec = kernels.pop(key)
        assert rec["ms"] is None and rec["choice"] == "tma" and set(rec["configs"]) == {
            "tiles" if key.endswith("forward.16") else "pointer", "tma", "gluon"}, (key, rec)
    for key, rec in kernels.items():
        assert rec["ms"] is None and rec["timed"] == 0, key  # nothing is timed without a GPU
        assert rec["enumerated"] > rec["compiled"] >= 2, key  # the sweep is larger than the subset compiled
    # the compile filter really filters: the atomic backward's 128x256x32 tiles spill on sm_90 (72 B)
    assert data["kernels"]["linear_logprobs.grad_bwd.16"]["compile_rejected"] >= 1
    from pacs_fast.kernels import pacs_loss_launch as KPL
    for key in PACS_KEYS:  # a policy (not tiles), other than the built-in one
        rec, kernel = data["kernels"][key], key.split(".")[1]
        assert rec["builtin"] == KPL.BUILTIN_POLICY[kernel] and set(rec["config"]) == set(rec["builtin"]), key
        assert rec["config"] != rec["builtin"] and len(rec["configs"]) == 2, key


def test_pingpong_sweep_times_the_pingpong_launch_second(tmp_path, monkeypatch):
    """``--pingpong KERNELS`` adds those Gluon kernels' ping-pong launches: the built-in one right after the
    built-in cooperative launch (so a short budget still times it), it compiles clean for sm_90 (the dry
    run's winner is the first other candidate that does), and launch_config then reads PINGPONG=1 back.
    Without the flag no candidate is a ping-pong one (a wrong mbarrier protocol hangs, so the lease script
    passes it only after the ping-pong GPU check has passed)."""
    from pacs_fast.kernels import tuning
    from pacs_fast.kernels.linear_logprobs_launch import PINGPONG_CONFIGS
    # the candidate lists, from a separate process (importing bench/gpu/tune.py here would drop TRITON_INTERPRET
    # while it imports kernel modules: their kernels would no longer run under the interpreter)
    script = ("import json, sys; sys.path.insert(0, 'bench/gpu'); import tune as g; out = {}\n"
              "for k in ('stats_gluon', 'dlogits_gluon'):\n"
              "    n = 'linear_logprobs.' + k; b = g.base_config(n, 8192, 4096, 151936, 'bf16', 90)\n"
              "    out[k] = [b, g.stage1(n, b, 'bf16', 90), g.stage1(n, b, 'bf16', 90, pingpong=True)]\n"
              "print('CANDIDATES', json.dumps(out))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lists = json.loads(proc.stdout.split("CANDIDATES", 1)[1])
    for kernel, (base, plain, pp) in lists.items():
        assert not any(c.get("PINGPONG") for c in plain) and plain[0] == base
        assert pp[:2] == [base, dict(base, **PINGPONG_CONFIGS[kernel])]
        assert all(c["num_warps"] == 4 for c in pp if c["PINGPONG"]) and len(pp) > len(plain)
    kernels = ",".join(f"linear_logprobs.{k}" for k in PINGPONG_CONFIGS)
    proc = _tune("--dry-run", "--pingpong", kernels, "--kernels", kernels, "--out-dir", str(tmp_path), "--jobs", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "sm_90.json").read_text())["kernels"]
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    for kernel, pp in PINGPONG_CONFIGS.items():
        rec = data[f"linear_logprobs.{kernel}.16"]
        assert rec["builtin"]["PINGPONG"] == 0 and rec["config"] == dict(rec["builtin"], **pp), rec
        assert rec["compile_rejected"] == 0
        assert _config("linear_logprobs", kernel, 90) == dict(rec["config"])


def test_pingpong_names_only_swept_gluon_kernels():
    """``--pingpong`` naming a kernel without a ping-pong launch, or one not swept, is a one-line error
    before anything is compiled."""
    pps = ("linear_logprobs.stats_tiles", "linear_logprobs.dlogits_gluon")
    got = _refusals([["--dry-run", "--kernels", "linear_logprobs.stats_tiles,linear_logprobs.stats_gluon",
                      "--pingpong", pp] for pp in pps])
    for pp, r in zip(pps, got):
        assert r["exit"] is not None and "stage-1" not in r["stdout"], (pp, r)
        assert r["exit"].startswith(f"--pingpong ['{pp}']"), (pp, r)


def test_launch_config_reads_the_written_table(table, monkeypatch):
    from pacs_fast.kernels import linear_logprobs as KL, tuning
    out, data = table
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)  # no table: the built-in configurations
    builtin = {k: _config(*k.split(".")[:2], 90) for k in LOGPROB_KEYS}
    monkeypatch.setattr(tuning, "TUNED_DIR", str(out))
    differs = 0
    for key in LOGPROB_KEYS:
        rec = data["kernels"][key]
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


def test_per_hidden_size_entries_are_read_at_the_nearest_hidden_size(table, monkeypatch):
    """``--also-h 896`` adds ``by_h["896"]`` to every linear_logprobs entry (a dry run writes the built-in
    launch and the default kinds there, untimed); launch_config and the kind choices then take the H=896
    measurement for hidden sizes nearer 896 than 4096 in ratio (the crossover is sqrt(896 * 4096) ~ 1916)
    and the main one otherwise; token_logprobs (no hidden size) has none."""
    from pacs_fast.kernels import linear_logprobs as KL, tuning
    out, data = table
    monkeypatch.setattr(tuning, "TUNED_DIR", str(out))
    monkeypatch.setitem(KL.CONFIG, "FWD", None)
    monkeypatch.setitem(KL.CONFIG, "DLOGITS", None)
    visible = 0
    for key in LOGPROB_KEYS:
        rec = data["kernels"][key]
        if key.startswith("token_logprobs."):
            assert "by_h" not in rec and "h" not in rec, key
            continue
        sub = rec["by_h"]["896"]
        assert rec["h"] == 4096 and sub["h"] == 896 and sub["config"] == rec["builtin"] and sub["ms"] is None, key
        kernel = key.split(".")[1]
        for h, want in ((896, sub["config"]), (1536, sub["config"]), (2048, rec["config"]), (4096, rec["config"]),
                        (8192, rec["config"])):
            got = KL.launch_config(kernel, N=N, V=V, H=h, dtype=torch.bfloat16, arch=90)
            assert got == want, (key, h, got, want)
        visible += rec["config"] != sub["config"]
    assert visible >= 1  # some main winner differs from its H=896 entry, so the per-H read is visible
    for job, read, main, small in (("forward", KL.forward_kind, "tma", "tiles"), ("dz", KL.dz_kind, "tma", "pointer")):
        rec = data["kernels"][f"linear_logprobs.{job}.16"]
        assert rec["choice"] == main and rec["by_h"]["896"]["choice"] == small
        assert [read(90, "16", h) for h in (None, 896, 1536, 3584)] == [main, small, small, main]


def test_tune_at_times_the_finalists_at_another_hidden_size():
    """bench/gpu/tune_shapes.py with the GPU replaced: per kernel, the four fastest distinct configurations
    of its main sweep that matched (never one with ms inf), the built-in one and the ping-pong built-in
    are timed at the new hidden size whatever the budget, then the main sweep's other matching ones
    while the budget lasts; the fastest there becomes ``by_h`` (here one that was only sixth at the
    main shape); the kinds are chosen again among the H winners."""
    import types
    sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
    try:
        import tune_shapes as S
    finally:
        sys.path.pop(0)
    from pacs_fast.kernels.linear_logprobs_launch import PINGPONG_CONFIGS
    base = dict(BLOCK_N=128, GROUP_N=8, PINGPONG=0)
    pp = dict(base, **PINGPONG_CONFIGS["stats_gluon"])
    c = [dict(base, GROUP_N=g) for g in (1, 2, 3, 4, 5, 6)]
    timed = {"linear_logprobs.stats_gluon": [(base, 9.0, 0), (pp, 8.0, 0), (c[0], 1.0, 0), (c[1], float("inf"), 0),
                                             (c[2], 3.0, 0), (c[0], 2.0, 0), (c[3], 4.0, 0), (c[4], 5.0, 0),
                                             (c[5], 6.0, 0)],
             "linear_logprobs.stats_tiles": [(base, 2.0, 0), (c[0], 1.0, 0)]}
    assert S.finalists(timed["linear_logprobs.stats_gluon"], base, pp) == [c[0], c[2], c[3], c[4], base, pp, c[5]]
    assert S.finalists([(c[0], 1.0, 0), (pp, float("inf"), 0)], base, pp) == [c[0], base]
    at_h = {"linear_logprobs.stats_gluon": {json.dumps(pp): 0.5, json.dumps(c[0]): 0.7, json.dumps(c[5]): 0.4},
            "linear_logprobs.stats_tiles": {json.dumps(base): 0.6}}
    swept, chosen = {}, []

    def sweep_head_first(name, runner, cands, head, ref, deadline, iters, tol, log):
        swept[name] = (cands, head)
        return [(cfg, at_h[name].get(json.dumps(cfg), 9.9), 0.0) for cfg in cands]

    def choose(job, kinds, results, runners, width, iters, shape, dry_run, log):
        chosen.append((job, shape["h"], {k: r["config"] for k, r in results.items()}))
        return {"choice": "gluon", "ms": {}}
    g = types.SimpleNamespace(make_runners=lambda n, h, v, dt, dev: {k: (lambda: None, None) for k in timed},
                              DTYPES={"bf16": None}, PINGPONG_CONFIGS=PINGPONG_CONFIGS, sweep_head_first=sweep_head_first,
                              choose=choose,
                              CHOICES={"forward": {"linear_logprobs.stats_tiles": "tiles",
                                                   "linear_logprobs.stats_gluon": "gluon"}, "dz": {}},
                              _short=str)
    results = {f"{k}.16": {"builtin": base, "config": c[0]} for k in timed}
    results["linear_logprobs.forward.16"] = {"choice": "tiles"}
    S.tune_at(g, 896, list(timed), timed, results, n=8, v=16, dt="bf16", width="16", iters=1, tol=0.1,
              budget_s=10, dry_run=False, log=lambda m: None)
    # the first six (four finalists, the built-in and ping-pong launches) whatever the budget
    assert swept["linear_logprobs.stats_gluon"] == ([c[0], c[2], c[3], c[4], base, pp, c[5]], 6)
    assert swept["linear_logprobs.stats_tiles"] == ([c[0], base], 6)  # no ping-pong launch swept
    sub = results["linear_logprobs.stats_gluon.16"]["by_h"]["896"]
    assert (sub["config"], sub["ms"], sub["builtin_ms"], sub["main_config_ms"]) == (c[5], 0.4, 9.9, 0.7)
    assert results["linear_logprobs.stats_tiles.16"]["by_h"]["896"]["config"] == base
    assert chosen == [("forward", 896, {"linear_logprobs.stats_gluon.16": c[5],
                                        "linear_logprobs.stats_tiles.16": base})]
    assert results["linear_logprobs.forward.16"]["by_h"]["896"] == {"choice": "gluon", "ms": {}, "h": 896}


def test_also_h_rejects_bad_sizes_before_compiling():
    bads = ("896,abc", "900", "4096", "-896")
    got = _refusals([["--dry-run", "--kernels", "linear_logprobs.stats_tiles", "--also-h", bad] for bad in bads])
    for bad, r in zip(bads, got):
        assert r["exit"] is not None and "stage-1" not in r["stdout"], (bad, r)
        assert r["exit"].startswith("--also-h"), (bad, r)


def test_kernel_choice_reads_the_measured_table(table, tmp_path, monkeypatch):
    """With no CONFIG choice, ``forward_kind`` / ``dz_kind`` take the table's measured choice for that
    architecture and width (else "tiles" / "pointer"); CONFIG wins; a choice this version does not
    have is ignored with a warning."""
    from pacs_fast.kernels import linear_logprobs as KL, tuning
    out, _ = table
    monkeypatch.setitem(KL.CONFIG, "FWD", None)
    monkeypatch.setitem(KL.CONFIG, "DLOGITS", None)
    monkeypatch.setattr(tuning, "TUNED_DIR", str(out))
    assert (KL.forward_kind(90, "16"), KL.dz_kind(90, "16")) == ("tma", "tma")
    assert (KL.forward_kind(90, "32"), KL.dz_kind(90, "32")) == ("tiles", "pointer")  # no fp32 choice
    assert (KL.forward_kind(80, "16"), KL.dz_kind(None, "16")) == ("tiles", "pointer")  # no table / no GPU
    monkeypatch.setitem(KL.CONFIG, "FWD", "gluon")
    monkeypatch.setitem(KL.CONFIG, "DLOGITS", "pointer")
    assert (KL.forward_kind(90, "16"), KL.dz_kind(90, "16")) == ("gluon", "pointer")
    monkeypatch.setitem(KL.CONFIG, "FWD", None)
    (tmp_path / "sm_90.json").write_text(json.dumps({"schema": 1, "arch": 90, "kernels": {
        "linear_logprobs.forward.16": {"choice": "cute"}}}))
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    with pytest.warns(UserWarning, match="ignoring the measured choice linear_logprobs.forward.16"):
        assert KL.forward_kind(90, "16") == "tiles"
    monkeypatch.setitem(KL.CONFIG, "FWD", "cute")
    with pytest.raises(ValueError, match="CONFIG\\['FWD'\\]"):
        KL.forward_kind(90, "16")


def test_dry_run_refuses_the_repository_table_folder():
    path = os.path.join(ROOT, "kernels", "tuned", "sm_90.json")
    before = open(path, "rb").read() if os.path.exists(path) else None
    proc = _tune("--dry-run", "--out-dir", os.path.dirname(path), "--kernels", "token_logprobs.stats_fwd",
                 timeout=120)
    assert proc.returncode != 0 and "not into kernels/tuned" in proc.stderr
    assert (open(path, "rb").read() if os.path.exists(path) else None) == before  # untouched


# ---- the PACS loss: a measured policy, shape-adaptive tiles ---------------------------------------

SHAPES = ((1024, 4096), (8192, 1024))


def _pacs(kernel, b, t, arch=90, g=8, dtype=torch.float32, **kw):
    from pacs_fast.kernels import pacs_loss_launch as KPL
    return KPL.launch_config(kernel, B=b, T=t, G=g, dtype=dtype, arch=arch, **kw)


def test_pacs_launch_config_reads_the_dry_run_table(table, monkeypatch):
    from pacs_fast.kernels import pacs_loss_launch as KPL, tuning
    out, data = table
    monkeypatch.setattr(tuning, "TUNED_DIR", str(out))
    for key in PACS_KEYS:
        rec, kernel = data["kernels"][key], key.split(".")[1]
        assert KPL.launch_policy(kernel, torch.float32, 90) == rec["config"]
        assert [_pacs(kernel, b, t) for b, t in SHAPES] == rec["configs"], key
        assert KPL.launch_policy(kernel, torch.bfloat16, 90) == KPL.BUILTIN_POLICY[kernel]  # no .16 entry


def test_choose_times_the_kinds_in_alternation_and_takes_the_fastest_median(monkeypatch):
    """bench/gpu/tune.py's measured choice with the GPU timer replaced: the kinds' winners are timed
    round-robin (never one kind's rounds back to back), each under its own override (forward kind and
    configuration), the fastest median wins, a kind whose sweep matched nothing (ms inf) or that
    fails now is not chosen, and fewer than two candidates give no entry."""
    gpu_tune = _import_gpu_tune(monkeypatch)
    from pacs_fast.kernels import linear_logprobs as KL
    kinds = gpu_tune.CHOICES["forward"]
    cfg = {name: dict(BLOCK_N=64 + i) for i, name in enumerate(kinds)}
    results = {f"{name}.16": dict(config=cfg[name], ms=1.0) for name in kinds}
    order, fake = [], {"tiles": [5.0, 9.0, 5.0], "tma": [4.0, 4.5, 100.0], "gluon": [3.0]}

    def time_ms(fn, iters):
        kind, block_n = KL.CONFIG["FWD"], KL.CONFIG["BLOCK_N"]
        assert block_n == cfg[next(n for n, k in kinds.items() if k == kind)]["BLOCK_N"]  # its own config
        order.append(kind)
        if kind == "gluon":
            raise RuntimeError("launch failed")
        return fake[kind][sum(k == kind for k in order) - 1]
    monkeypatch.setattr(gpu_tune, "time_ms", time_ms)
    runners = {name: (lambda: None, None) for name in kinds}
    shape = dict(n=8, h=4, v=16, dt="bf16")
    rec = gpu_tune.choose("forward", kinds, results, runners, "16", 1, shape, False, lambda m: None)
    assert rec["choice"] == "tma" and rec["ms"]["tiles"] == 5.0 and rec["ms"]["tma"] == 4.5
    assert rec["ms"]["gluon"] == float("inf") and order == ["tiles", "tma", "gluon"] * 3
    results["linear_logprobs.stats_tma.16"]["ms"] = float("inf")  # its sweep matched nothing
    del results["linear_logprobs.stats_gluon.16"]
    assert gpu_tune.choose("forward", kinds, results, runners, "16", 1, shape, False, lambda m: None) is None
    assert KL.CONFIG["FWD"] is None and KL.CONFIG["BLOCK_N"] is None  # the overrides are undone


def test_compile_cases_include_the_launches_measured_at_other_hidden_sizes(tmp_path, monkeypatch):
    """kernels/aot.py ``cases`` (what tests/test_kernels_compile.py compiles and checks) adds each hidden
    size of the table's ``by_h`` entries as a shape, so a launch chosen only at H=896 is compiled and
    checked too (spills, shared memory, tensor cores); without such entries the cases are unchanged."""
    from pacs_fast.kernels import aot, tuning
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    before = {c.key: list(c.shapes) for c in aot.cases((90,))}
    assert not any("tuned" in s for shapes in before.values() for s in shapes)
    main = _config("linear_logprobs", "stats_tiles", 90)
    small = dict(main, num_stages=2, GROUP_N=8)
    (tmp_path / "sm_90.json").write_text(json.dumps({"schema": 1, "arch": 90, "kernels": {
        "linear_logprobs.stats_tiles.16": {"h": 4096, "config": main, "by_h": {"896": {"config": small}}}}}))
    after = {c.key: c for c in aot.cases((90,))}
    new = [c for k, c in after.items() if k not in before]
    # the launch and its selectable persistent variant (cases() compiles both for the tiled forward)
    assert sorted(c.constexprs["PERSISTENT"] for c in new) == [False, True], [c.label() for c in new]
    for c in new:
        assert (c.kernel, c.num_stages, c.constexprs["GROUP_N"]) == ("stats_tiles", 2, 8)
        assert c.shapes == ["N8192 H896 V151936 (tuned)"]
    assert tuning.hidden_sizes(90) == [896] and tuning.hidden_sizes(80) == []


def test_tune_at_writes_no_entry_when_no_finalist_matches():
    """A kernel whose finalists all fail or disagree with the reference at the new hidden size gets no
    ``by_h`` entry (the main measurement keeps serving that size)."""
    import types
    sys.path.insert(0, os.path.join(ROOT, "bench", "gpu"))
    try:
        import tune_shapes as S
    finally:
        sys.path.pop(0)
    base = dict(BLOCK_N=128)
    timed = {"linear_logprobs.stats_tiles": [(base, 1.0, 0)], "linear_logprobs.dlogits": [(base, 1.0, 0)]}
    outcome = {"linear_logprobs.stats_tiles": [], "linear_logprobs.dlogits": [(base, float("inf"), 1.0)]}
    g = types.SimpleNamespace(make_runners=lambda *a: {k: (lambda: None, None) for k in timed}, DTYPES={"bf16": None},
                              PINGPONG_CONFIGS={}, sweep_head_first=lambda name, *a: outcome[name], choose=None, CHOICES={},
                              _short=str)
    results = {f"{k}.16": {"builtin": base, "config": base} for k in timed}
    added = S.tune_at(g, 896, list(timed), timed, results, n=8, v=16, dt="bf16", width="16", iters=1, tol=0.1,
                      budget_s=10, dry_run=False, log=lambda m: None)
    assert added == {} and not any("by_h" in r for r in results.values())


def test_sweep_times_the_head_whatever_the_deadline(monkeypatch):
    """``sweep_head_first``: with the deadline already past (a compile filter that used up a short share),
    the built-in launch and the built-in ping-pong one (the head) are still both timed; of the rest, only
    the one ``sweep`` always times."""
    gpu_tune = _import_gpu_tune(monkeypatch)
    from pacs_fast.kernels import linear_logprobs as KL
    timed = []

    def time_ms(fn, iters):
        timed.append(KL.CONFIG["BLOCK_N"])
        return float(KL.CONFIG["BLOCK_N"])
    monkeypatch.setattr(gpu_tune, "time_ms", time_ms)
    cands = [dict(BLOCK_N=b) for b in (1, 2, 3, 4)]
    out = gpu_tune.sweep_head_first("linear_logprobs.stats_gluon", (lambda: None, lambda o, r: 0.0), cands, 2, None,
                                    0.0, 1, 0.1, lambda m: None)
    assert timed == [1, 2, 3] and [ms for _, ms, _ in out] == [1.0, 2.0, 3.0]
    assert KL.CONFIG["BLOCK_N"] is None


def test_compile_and_sweep_compiles_in_batches_and_times_each_before_the_next(monkeypatch):
    """``compile_and_sweep`` with the compiler and the GPU clock replaced (1 s per timing): batches of
    COMPILE_BATCH x jobs candidates, each batch's survivors timed before the next batch is compiled, no
    batch started after the deadline; the built-in launch is timed though its report failed, a
    candidate whose compile failed is not; with the deadline already past, the head is still timed."""
    import types
    gpu_tune = _import_gpu_tune(monkeypatch)
    from pacs_fast.kernels import linear_logprobs as KL
    clock, batches, timed = [0.0], [], []
    monkeypatch.setattr(gpu_tune, "time", types.SimpleNamespace(time=lambda: clock[0]))

    def compile_filter(name, cands, dt, arch, jobs, pool=None):
        batches.append([c["BLOCK_N"] for c in cands])
        return [(c, {"ok": c["BLOCK_N"] not in (0, 2)}) for c in cands]

    def time_ms(fn, iters):
        timed.append(KL.CONFIG["BLOCK_N"])
        clock[0] += 1.0
        return 1.0
    monkeypatch.setattr(gpu_tune, "compile_filter", compile_filter)
    monkeypatch.setattr(gpu_tune, "time_ms", time_ms)
    monkeypatch.setattr(gpu_tune, "COMPILE_BATCH", 2)
    cands = [dict(BLOCK_N=i) for i in range(20)]
    runner = (lambda: None, lambda out, ref: 0.0)
    args = ("linear_logprobs.stats_tiles", runner, cands, 2, None)
    checked, t = gpu_tune.compile_and_sweep(*args, 5.5, "bf16", 90, 2, 1, 0.1, lambda m: None, always=cands[0])
    # batch 1: three timed by t=3; batch 2 until t=6 > 5.5 (7 compiled, not timed); no third batch
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert timed == [0, 1, 3, 4, 5, 6] and [c["BLOCK_N"] for c, _, _ in t] == timed and len(checked) == 8
    batches.clear(), timed.clear()
    clock[0] = 100.0  # the deadline long past: the head (built-in, ping-pong) and sweep's one, then stop
    gpu_tune.compile_and_sweep(*args, 5.5, "bf16", 90, 2, 1, 0.1, lambda m: None, always=cands[0])
    assert batches == [[0, 1, 2, 3]] and timed == [0, 1, 3]
    assert KL.CONFIG["BLOCK_N"] is None  # the overrides are undone


def test_table_is_written_after_every_kernel(tmp_path, monkeypatch):
    """A run killed in its second kernel (a hanging candidate, the caller's timeout) leaves the first
    kernel's measured entry in the table (written atomically after each kernel), nothing of the second."""
    gpu_tune = _import_gpu_tune(monkeypatch)
    calls = []

    def compile_filter(name, cands, dt, arch, jobs, pool=None):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt("killed while the second kernel runs")
        return [(c, dict(ok=True, regs=100, stack=0, shared=1000, error=None)) for c in cands]
    monkeypatch.setattr(gpu_tune, "compile_filter", compile_filter)
    with pytest.raises(KeyboardInterrupt):
        gpu_tune.main(["--dry-run", "--out-dir", str(tmp_path), "--jobs", "1",
                       "--kernels", "linear_logprobs.stats_tiles,linear_logprobs.dlogits"])
    kernels = json.loads((tmp_path / "sm_90.json").read_text())["kernels"]
    assert list(kernels) == ["linear_logprobs.stats_tiles.16"] and calls == ["linear_logprobs.stats_tiles",
                                                                             "linear_logprobs.dlogits"]
    assert not list(tmp_path.glob("*.tmp"))
