"""bench/gpu/learner.py (issue 38, item 5): its dry run on the CPU (tiny shape, tiny lengths, selective recompute)
writes the JSON and the table, one row per learner x length, the megatron THD row included (in a subprocess: the
megatron learner initialises torch.distributed and megatron's parallel state in its process); its memory
plan for the real shapes on an 80 GiB GPU is what the GPU run will do."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench():
    spec = importlib.util.spec_from_file_location("gpu_learner_bench", ROOT / "bench" / "gpu" / "learner.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core (the megatron row)")
def test_dry_run_writes_rows_for_every_learner(tmp_path):
    mod = bench()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "learner.py"), "--out", str(tmp_path),
                           "--dry-run", "--lengths", "4k,mix", "--recompute", "selective"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "learner.json").read_text())
    rows = data["rows"]
    # the rows of the targets first (4k packed, the mix packed and padded, ...), then the rest
    want = [(n, s) for s, n in mod.row_order(["4k", "mix"], list(mod.LEARNERS))]
    assert [(r["learner"], r["spec"]) for r in rows] == want and len(want) == 2 * len(mod.LEARNERS)
    assert want[:5] == [("torch packed varlen", "4k"), ("megatron packed THD", "4k"), ("torch packed varlen", "mix"),
                        ("torch padded + SDPA", "mix"), ("megatron packed THD", "mix")]
    for r in rows:
        assert {"hidden", "response_tokens", "tokens"} <= set(r) and "not_run" not in r, r
        assert r["gradient_checkpointing"] == "selective"  # (--recompute: each learner's selective path ran)
        assert r["recompute"] == ("selective: mlp" if r["learner"].startswith("megatron") else
                                  "activation recompute: selective (the MLP of 2 decoder layers)"), r
        assert r["tokens_per_s"] > 0 and r["mfu"] is None and r["peak_gb"] is None and r["flops"] > 0
        # the timed update's own forward/* counts (update() clears the learner's counter after reporting them)
        assert r["forwards"]["packed" if "packed" in r["learner"] else "padded"] >= 1, r
        # which packed-attention kernel answered (on the GPU: a fallback from varlen_attn would show here)
        want = {"sdpa"} if "varlen" in r["learner"] or r["learner"].startswith("megatron packed THD") else set()
        # the fused rows ran with every norm (torch) and MLP of the 2-layer model fused (dry run: the ops' twins)
        fused = {"rms_norm": 0 if r["learner"].startswith("megatron") else 5, "swiglu": 2}
        assert r.get("fused_layers") == (fused if "Liger" in r["learner"] else None), r
        assert set(r["attention_kernels"]) == want and all(n > 0 for n in r["attention_kernels"].values()), r
    assert (tmp_path / "model_2_64" / "config.json").is_file()  # the megatron learner's copy of the weights
    assert "FLOPs = 6*P_layers*T" in (tmp_path / "learner.md").read_text()


def test_the_rows_of_the_targets_come_first_and_name_real_learners_and_lengths():
    mod = bench()
    specs = "4k,mix,16k,32k,1k".split(",")
    assert all(name in mod.LEARNERS and spec in specs for spec, name in mod.FIRST)  # (a typo would drop a row)
    order = mod.row_order(specs, list(mod.LEARNERS))
    assert order[:len(mod.FIRST)] == mod.FIRST and sorted(order) == sorted({(s, n) for s in specs
                                                                            for n in mod.LEARNERS})


def test_dry_run_at_a_budget_under_one_group(tmp_path):
    """A token budget of one row (the dry run's 4k: rows of 8 + 4 tokens, groups of 2): every group trains a few
    rows at a time (learner.split_groups=auto), which the row and the table say."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "learner.py"), "--out", str(tmp_path),
                           "--dry-run", "--lengths", "4k", "--learners", "torch packed varlen", "--recompute", "off",
                           "--token-budgets", "12"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads((tmp_path / "learner.json").read_text())["rows"]
    assert row["token_budget"] == 12 and row["split_groups"] == 8 and row["tokens_per_s"] > 0  # all 8 groups
    assert "12 (8 groups by rows)" in (tmp_path / "learner.md").read_text()


def test_memory_plan_for_the_real_shapes():
    """The bench plans with the product's memory model (fp32 masters, AdamW, the tied head's gradient: on the first
    H200 run its own estimate left 15 GiB out and rows peaked at 121-136 GiB of 140), the least recompute at which a
    group fits, the largest budget within 80% of the device (under one group where none fits); padded rows count
    their padded token slots."""
    mod = bench()
    from pacs_fast.learner.flops import shape_of
    from pacs_fast.trainer.memory_model import learner_memory

    h100 = 80 * 2**30
    big = shape_of(mod._config(mod.SHAPES["qwen2.5-1.5b"], 151936), 2)
    packed, dense, padded = "torch packed varlen", "torch packed dense", "torch padded + SDPA"

    def plan(spec, name=packed, mem=h100, levels=mod.RECOMPUTE):
        return mod.plan(big, *mod.lengths_for(spec, 0, False), 256, mem, name, levels)

    ckpt, budget, pred, why = plan("4k")
    assert not ckpt and why is None and budget >= 2 * (256 + 4096) and pred <= 0.8 * h100
    cfg = mod.memory_config(packed, False, 256, 4096, 2)
    assert pred == learner_memory(cfg, big, tokens=budget)["total"]  # the product's prediction, as the trainer's
    assert learner_memory(cfg, big, tokens=budget + 64)["total"] > 0.8 * h100  # the largest budget that fits
    ckpt, budget, pred, why = plan("32k")
    assert ckpt == "full" and why is None and budget >= 2 * (256 + 32768)
    # the least recompute that fits: each layer's MLP at 16k on an H100, and at 32k on an H200 (141 GiB)
    assert plan("16k")[0] == "selective"
    assert plan("32k", mem=141 * 2**30)[0] == "selective"
    # after running out of memory with one level, the next
    assert plan("4k", levels=("selective", "full"))[0] == "selective"
    assert plan("16k", levels=("full",))[0] == "full"
    assert plan("32k", dense)[3].startswith("not run: one row of 33,024 tokens")  # its [S, S] masks: ~100 GiB
    # where no group fits, a budget under one (its groups train a few rows at a time) as long as one row fits
    ckpt, budget, pred, why = plan("32k", mem=45 * 2**30)
    assert why is None and ckpt == "full" and 256 + 32768 <= budget < 2 * (256 + 32768) and pred <= 0.8 * 45 * 2**30
    assert plan("32k", mem=40 * 2**30)[3].startswith("not run: one row of 33,024 tokens needs 33 GiB")
    assert plan("4k", dense)[3] is None
    # padded rows (learner.packing=off) count rows x their longest: the long-tailed mix is ~2.5x its real tokens
    lengths, G = mod.lengths_for("mix", 0, False)
    slots, real = mod.group_costs(lengths, G, 256, True), mod.group_costs(lengths, G, 256, False)
    assert sum(slots) > 2 * sum(real) and all(s == G * (256 + max(lengths[i * G:(i + 1) * G]))
                                              for i, s in enumerate(slots))
    ckpt, budget, _, why = plan("mix", padded, mem=141 * 2**30)
    assert why is None and ckpt == "selective" and budget >= max(slots)
    assert plan("mix", packed, mem=141 * 2**30)[0] is False
    # a given budget (the memory curve) is taken as it is, the prediction growing with it
    preds = [mod.plan(big, *mod.lengths_for("4k", 0, False), 256, h100, packed, ("selective",), budget=b)[2]
             for b in (8704, 17408, 34816)]
    assert preds[0] < preds[1] < preds[2]

def test_profile_shares_attribute_kernels_by_their_ops_and_list_the_longest():
    """The shares, the device time and the longest kernels of a profile (fake events: the profiler needs a GPU):
    a kernel goes to the category of the nearest op above it that names one, else of its own name, else other."""
    from types import SimpleNamespace as NS

    mod = bench()

    def kernel(name, us):
        return NS(name=name, duration=us, device_type="cuda", time_range=NS(elapsed_us=lambda: us), kernels=[])

    k_attn, k_gemm, k_adam, k_free = (kernel("flash_fwd", 30.0), kernel("sm90_gemm", 50.0),
                                      kernel("multi_tensor_apply", 10.0), kernel("elementwise", 10.0))
    update = NS(name="bench.update", cpu_parent=None, device_type="cpu", kernels=[])
    attn = NS(name="torch.nn.attention.varlen_attn", cpu_parent=update, device_type="cpu", kernels=[k_attn])
    mm = NS(name="aten::mm", cpu_parent=update, device_type="cpu", kernels=[k_gemm])
    step = NS(name="Optimizer.step#AdamW.step", cpu_parent=None, device_type="cpu", kernels=[])
    foreach = NS(name="aten::_foreach_add_", cpu_parent=step, device_type="cpu", kernels=[k_adam])
    # a kernel no op launched (cuDNN's attention runs through the driver API) goes by its own name
    k_cudnn = kernel("cudnn_generated_fort_native_sdpa_sm90_flash_bprop", 20.0)
    out = mod.shares_of([update, attn, mm, step, foreach, k_attn, k_gemm, k_adam, k_free, k_cudnn], "cpu", "cuda")
    assert out["attention"] == pytest.approx(50 / 120) and out["optimizer"] == pytest.approx(10 / 120)
    assert out["lm_head+loss"] == 0.0
    # the GEMM (its op names nothing) and the elementwise kernel no op launched
    assert out["other"] == pytest.approx(60 / 120)
    assert out["device_s"] == pytest.approx(120e-6)
    assert out["top_kernels"] == [["sm90_gemm", 5e-05], ["flash_fwd", 3e-05], [k_cudnn.name, 2e-05],
                                  ["multi_tensor_apply", 1e-05], ["elementwise", 1e-05]]


def test_the_memory_model_against_the_h200_peaks():
    """The product's memory model (what the trainer checks before loading) at each measured row's budget, recompute,
    learner and fused layers, against the peaks measured on an H200 on 2026-11-29 (bench/results/gpu/20261129_h200,
    Qwen2.5-1.5B shape, bf16, 32 rows): every one within -10% / +11% (the largest: packed varlen at 32k with
    selective recompute, +10.5%, whose repeated key / value heads torch 2.11 kept; the dense mix +8.4%). Before the
    megatron and fused-layer terms of 2026-11-29 the megatron rows were up to 14% over and the fused rows 26% under."""
    import json
    import os

    mod = bench()
    from pacs_fast.learner.flops import shape_of
    from pacs_fast.trainer.memory_model import learner_memory

    folder = os.path.join(os.path.dirname(__file__), "..", "bench", "results", "gpu", "20261129_h200")
    shape = shape_of(mod._config(mod.SHAPES["qwen2.5-1.5b"], 151936), 2)
    ratios = {}
    for name in ("learner.json", "learner_padded_mix.json", "learner_mix_same_run.json",
                 "learner_curve_liger_selective.json"):
        with open(os.path.join(folder, name)) as f:
            for r in json.load(f)["rows"]:
                if "not_run" in r or r["shape"] != "qwen2.5-1.5b":
                    continue
                lengths, G = mod.lengths_for(r["spec"], 0, False)
                cfg = mod.memory_config(r["learner"], r["gradient_checkpointing"], 256, max(lengths), G)
                model = learner_memory(cfg, shape, tokens=r["token_budget"])["total"] / 2**30
                ratios[(name, r["learner"], r["spec"])] = r["peak_gb"] / model
    assert len(ratios) == 32
    assert all(0.90 <= x <= 1.11 for x in ratios.values()), {k: round(v, 3) for k, v in ratios.items()}


def test_token_budgets_are_positive_integers():
    """--token-budgets: 0 would mean no budget to the learner while the prediction counts no activations (a sweep
    found a false point on the memory curve), a fraction a bare traceback: argparse errors naming the option."""
    mod = bench()
    import learner_args  # (bench/gpu/: on the path once bench() loaded learner.py)
    assert learner_args.budgets_arg("8704, 17408") == [8704, 17408] and learner_args.budgets_arg("") == []
    for bad in ("0", "-3", "1.5", "10,x"):
        with pytest.raises(SystemExit):
            mod.main(["--out", "/tmp/unused", "--dry-run", "--token-budgets", bad])


def test_bad_arguments_are_refused_by_the_parser():
    """--lengths, --learners, --shapes, --steps and --budget-s are checked before any row (a sweep: `0k` ended in a
    ZeroDivisionError, `-4k` timed an 8-token row, an unknown learner became a failed row and the run went on, `nan`
    seconds ran rows without a model); names may have spaces after the commas."""
    mod = bench()
    ok = ["--out", "/tmp/unused", "--dry-run", "--check-args"]
    assert mod.main(ok + ["--learners", "torch packed varlen, torch padded + SDPA", "--lengths", "4k, mix,300"]) == 0
    import learner_args  # (bench/gpu/: on the path once bench() loaded learner.py)
    assert learner_args.lengths_arg("4k, mix,300") == ["4k", "mix", "300"]
    assert learner_args.names_arg(mod.LEARNERS, "learners")("torch packed varlen, torch padded + SDPA") == [
        "torch packed varlen", "torch padded + SDPA"]
    for bad in (["--lengths", "0k"], ["--lengths", "-4k"], ["--lengths", "4x"], ["--lengths", ""],
                ["--learners", "torch packed"], ["--shapes", "qwen3"], ["--steps", "0"], ["--steps", "-1"],
                ["--budget-s", "nan"], ["--budget-s", "inf"], ["--budget-s", "0"], ["--budget-s", "-5"]):
        with pytest.raises(SystemExit) as e:
            mod.main(ok + bad)
        assert e.value.code == 2, bad
    # the lease script's check: learner_args.py alone, the same verdicts without importing torch (~1.5 s a call)
    script = os.path.join(os.path.dirname(mod.__file__), "learner_args.py")
    probe = ("import runpy, sys; sys.argv = sys.argv[1:]\ntry:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
             "finally:\n    print('torch imported' if 'torch' in sys.modules else 'no torch')")
    for args, rc in ((["--lengths", "4k, mix,300", "--learners", "torch packed varlen"], 0), (["--lengths", "0k"], 2),
                     (["--learners", "torch packed"], 2)):
        proc = subprocess.run([sys.executable, "-c", probe, script, "--out", "/tmp/unused", *args],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == rc and proc.stdout.strip() == "no torch", (args, proc.stdout, proc.stderr[-500:])


def test_the_lease_refuses_bad_learner_settings_before_its_first_phase(tmp_path):
    """bench/gpu/lease.sh learner: LEARNER_BUDGET_S and LEARNER_ARGS are checked before the first phase, exit 2 (a
    sweep: an unbalanced quote printed a syntax error and ran the whole default benchmark, exit 0; `$(...)` ran;
    LEARNER_BUDGET_S=-100 became an invalid `timeout` and the script said done)."""
    import os
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..")
    marker = tmp_path / "ran"
    for env in ({"LEARNER_BUDGET_S": "abc"}, {"LEARNER_BUDGET_S": "-100"}, {"LEARNER_BUDGET_S": "0"},
                {"LEARNER_ARGS": '--dry-run --learners "torch packed varlen'},
                {"LEARNER_ARGS": f"--dry-run $(touch {marker})"},
                {"LEARNER_ARGS": "--dry-run --learners 'torch packed'"}):
        proc = subprocess.run(["bash", "bench/gpu/lease.sh", str(tmp_path / "out"), "learner"], cwd=root,
                              env={**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path), **env},
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (env, proc.stdout[-500:], proc.stderr[-1000:])
        assert "==" not in proc.stdout, env  # no phase started
        assert "bench/gpu/lease.sh: " in proc.stderr, env
    assert not marker.exists()  # the arguments are split as a shell would, never run

    def settings(args):  # LEASE_CHECK_ONLY: the check alone, the arguments it passes printed
        return subprocess.run(["bash", "bench/gpu/lease.sh", str(tmp_path / "out"), "learner"], cwd=root,
                              env={**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path),
                                   "LEASE_CHECK_ONLY": "1", "LEARNER_BUDGET_S": "200", "LEARNER_ARGS": args},
                              capture_output=True, text=True, timeout=120)
    ok = settings('--dry-run --learners "torch packed varlen, torch padded + SDPA" --lengths 4k')
    assert ok.returncode == 0, ok.stderr[-1000:]
    lines = ok.stdout.splitlines()
    assert lines[:6] == ["learner budget: 200 s", "learner argument: [--dry-run]", "learner argument: [--learners]",
                         "learner argument: [torch packed varlen, torch padded + SDPA]",
                         "learner argument: [--lengths]", "learner argument: [4k]"]
    assert [line.split(":")[0] for line in lines[6:9]] == ["== learner_tests", "== learner", "== targets"]
    assert re.fullmatch(r"== done after \d+ s", lines[9]) and len(lines) == 10, lines[9:]  # (0 s, 1 s under load)
    assert lines[7].endswith("--budget-s 200 --dry-run --learners torch packed varlen, torch padded + SDPA --lengths 4k")
    assert settings("").stdout.splitlines()[1] == "learner arguments: (none)"
    empty = settings('--dry-run --lengths ""')  # a last empty argument reaches the parser (which refuses it)
    assert empty.returncode == 2 and "no length given" in empty.stderr, empty.stderr[-1000:]


@pytest.fixture(scope="module")
def lease_checks(tmp_path_factory):
    """``mode -> (TMPDIR, kernels/tuned/ before, the completed check run)``: each mode's plain
    ``LEASE_CHECK_ONLY=1`` run of bench/gpu/lease.sh, made once for the module (each run starts python twice or more,
    ~1.5 s of CPU each: importing torch) and read by both tests that need the same run."""
    import os
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..")
    cache = {}

    def check(mode):
        if mode not in cache:
            tmp = tmp_path_factory.mktemp(f"lease_{mode}")
            env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp), "LEASE_CHECK_ONLY": "1"}
            before = sorted(os.listdir(os.path.join(root, "kernels", "tuned")))
            proc = subprocess.run(["bash", "bench/gpu/lease.sh", str(tmp / "out"), mode], cwd=root, env=env,
                                  capture_output=True, text=True, timeout=120)
            cache[mode] = (tmp, before, proc)
        return cache[mode]
    return check


@pytest.mark.parametrize("mode, phases", [
    ("open", ["pacs_tests", "learner_kernels_test", "pacs_loss", "host", "logprobs", "logprobs_fp32", "shapes",
              "attention", "learner", "targets"]),
    ("extra", ["curve", "grid", "targets"]),
    ("main", ["suite", "tune", "tuned_logprobs", "shapes", "targets"]), ("product", ["product", "targets"]),
    ("final", ["gluon_check", "pacs_loss_final", "logprobs_final", "gpu_tests_final", "megatron", "targets"]),
])
def test_the_lease_check_prints_every_modes_plan_and_runs_nothing(lease_checks, mode, phases):
    """LEASE_CHECK_ONLY=1 was read in learner mode only: main / product / final ran their GPU phases (main copies
    its tuned table into kernels/tuned/); `--help` took "--help" for OUT_DIR and started main mode."""
    import os
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..")
    tmp_path, before, proc = lease_checks(mode)
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path), "LEASE_CHECK_ONLY": "1"}
    assert proc.returncode == 0, proc.stderr[-1000:]
    planned = [line[3:].split(":")[0] for line in proc.stdout.splitlines() if ": limit " in line]
    assert planned == phases, proc.stdout
    assert (tmp_path / f"gpu_lease_{mode}_check").is_dir()  # its own folder: the last lease's work is kept
    assert not any((tmp_path / f"gpu_lease_{mode}_check").glob("*.log")) and not (tmp_path / "out" / "lease.tgz").exists()
    assert sorted(os.listdir(os.path.join(root, "kernels", "tuned"))) == before
    for argv, code in ((["--help"], 0), ([], 2), (["-x"], 2)):
        proc = subprocess.run(["bash", "bench/gpu/lease.sh", *argv], cwd=root, env=env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == code and "== " not in proc.stdout, (argv, proc.stdout[-300:])
    assert "bash bench/gpu/lease.sh OUT_DIR" in subprocess.run(["bash", "bench/gpu/lease.sh", "--help"], cwd=root,
                                                               env=env, capture_output=True, text=True).stdout


def test_the_open_lease_checks_its_settings_and_main_can_skip_its_suite(tmp_path):
    """open (issues 38 and 39's missing measurements in one call): a bad OPEN_TOTAL_S or LEARNER_ARGS stops it
    before its first phase; the learner phase gets what is left of OPEN_TOTAL_S and the 0.5B shape; main after it
    (MAIN_SKIP_SUITE=1) checks the Gluon kernels alone instead of running the suite again."""
    import os
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..")
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path), "LEASE_CHECK_ONLY": "1"}

    def lease(mode, **extra):
        return subprocess.run(["bash", "bench/gpu/lease.sh", str(tmp_path / "out"), mode], cwd=root,
                              env={**env, **extra}, capture_output=True, text=True, timeout=120)
    for mode, bad in (("open", {"OPEN_TOTAL_S": "9m"}), ("open", {"OPEN_TOTAL_S": "0"}),
                      ("open", {"LEARNER_ARGS": "--shapes bogus"}), ("open", {"LEARNER_ARGS": "--lengths 'x"}),
                      ("extra", {"EXTRA_TOTAL_S": "3m"}), ("extra", {"CURVE_S": "-5"})):
        proc = lease(mode, **bad)
        assert proc.returncode == 2 and "== " not in proc.stdout, (bad, proc.stdout[-500:], proc.stderr[-500:])
        assert f"{next(iter(bad))} must be" in proc.stderr or "LEARNER_ARGS" in proc.stderr, proc.stderr[-500:]
    ok = lease("open", OPEN_TOTAL_S="400", LEARNER_ARGS="--steps 2")
    assert ok.returncode == 0, ok.stderr[-1000:]
    learner = [line for line in ok.stdout.splitlines() if line.startswith("== learner:")][0]
    # 400 s less the 40 s the phase keeps, less the seconds already gone (the settings check: a second or more on a
    # loaded CI machine, where "--budget-s 360" alone had failed)
    budget = int(re.search(r"--budget-s (\d+)", learner).group(1))
    assert 350 <= budget <= 360, learner
    assert "--shapes qwen2.5-0.5b" in learner and learner.endswith("--steps 2")
    assert "learner budget" not in ok.stdout  # (LEARNER_BUDGET_S is learner mode's)
    extra = lease("extra", CURVE_S="90", EXTRA_TOTAL_S="210")  # the curve's budget, the grid the rest (of 210 s)
    curve, grid = (line for line in extra.stdout.splitlines() if line.startswith(("== curve:", "== grid:")))
    assert extra.returncode == 0 and "limit 120 s" in curve and "--budget-s 90 " in curve, extra.stdout
    assert "--token-budgets 17408,34816,66048" in curve and "65536x4096x151936" in grid
    assert 195 <= int(grid.split("limit ")[1].split(" s")[0]) <= 205, grid
    # the curve's budgets follow the GPU's memory (an H100's 79 GiB: no 66,048-token row, three points still), or
    # CURVE_BUDGETS, checked by the benchmark's parser before the first phase
    for knobs, want in (({"CURVE_GPU_GIB": "79"}, "17408,34816,52224"), ({"CURVE_GPU_GIB": "139"}, "17408,34816,66048"),
                        ({"CURVE_BUDGETS": "8704,17408", "CURVE_GPU_GIB": "79"}, "8704,17408")):
        curve = [line for line in lease("extra", **knobs).stdout.splitlines() if line.startswith("== curve:")]
        assert len(curve) == 1 and f"--token-budgets {want}" in curve[0], (knobs, curve)
    bad = lease("extra", CURVE_BUDGETS="17408,lots")
    assert bad.returncode == 2 and "== " not in bad.stdout, (bad.stdout[-500:], bad.stderr[-500:])
    skip = lease("main", MAIN_SKIP_SUITE="1")
    planned = [line[3:].split(":")[0] for line in skip.stdout.splitlines() if ": limit " in line]
    assert skip.returncode == 0, skip.stderr[-1000:]
    assert planned == ["gluon_check", "tune", "tuned_logprobs", "shapes", "grid", "targets"], skip.stdout


def test_the_old_lease_path_runs_the_same_script(lease_checks):
    """bench/gpu_lease.sh (the name the project's instructions give) runs bench/gpu/lease.sh with its arguments."""
    import os
    import subprocess
    import sys

    root = os.path.join(os.path.dirname(__file__), "..")
    # bench/gpu/lease.sh's run: the module's (the same TMPDIR and OUT_DIR, so the same command lines)
    tmp_path, _, new = lease_checks("extra")
    env = {**os.environ, "PYTHON": sys.executable, "TMPDIR": str(tmp_path), "LEASE_CHECK_ONLY": "1"}
    old = subprocess.run(["bash", "bench/gpu_lease.sh", str(tmp_path / "out"), "extra"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=120)
    def plan(proc):  # each phase and its command (the grid's limit and "done after" depend on the clock)
        return [line.split(": limit")[0] + line.split(" s:", 1)[-1] for line in proc.stdout.splitlines()
                if ": limit" in line]
    assert old.returncode == new.returncode == 0 and plan(old) == plan(new) and "== curve: limit" in old.stdout
    bad = subprocess.run(["bash", "bench/gpu_lease.sh", str(tmp_path / "out"), "nope"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "mode must be" in bad.stderr
    plain = subprocess.run(["bash", "bench/gpu_lease.sh", str(tmp_path / "out")], cwd=root, env=env,
                           capture_output=True, text=True, timeout=120)  # no mode: the plan's first call
    assert plain.returncode == 0 and plain.stdout.splitlines()[1].startswith("== pacs_tests: limit"), plain.stdout[:300]
