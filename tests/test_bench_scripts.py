"""The CPU benchmark scripts under bench/ (not bench/gpu/, which tests of its own cover) run their smallest path here,
each in a subprocess as a user runs it, so that they do not rot: a stale import or API after a refactor, a crash, a
table whose rows or columns changed. Asserted: the printed table's rows and columns, numbers finite and positive, the
JSON a script writes, and what a script's own figures say (the fp32 head closes the head's gap, TP=2 equals TP=1,
sequence parallelism keeps fewer activations). Never a wall-clock limit: the timings are noise on a shared machine.

Two scripts launch two megatron processes under torchrun (~10-16 s each, marked ``distributed``); the others that
need torchrun or vLLM (bench_async.py, bench_megatron_learner.py, bench_scaleout.py; bench_rollout.py's and
bench_fp32_head.py's vLLM engine) are checked through their argument checks or their CPU path only, as each test
says. bench_setup.sh installs the locked set twice (minutes, the package index): its usage and what it reads."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import requires_megatron

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def run(script: str, *args: str, timeout: int = 300, rc: int = 0) -> str:
    """``python bench/<script> args`` from the repository root, 1 thread; its stdout (stderr when ``rc`` != 0)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == rc, f"{script} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout if rc == 0 else proc.stderr


def table(out: str, first: str) -> list[dict[str, str]]:
    """The markdown table of ``out`` whose header starts with the cell ``first``: its rows as dicts by column."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"| {first} |"))
    cols = [c.strip() for c in lines[start].strip().strip("|").split(" | ")]
    assert set(lines[start + 1]) <= set("|-: "), lines[start + 1]
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        cells = [c.strip() for c in ln.strip().strip("|").split(" | ")]
        assert len(cells) == len(cols), (cols, cells)
        rows.append(dict(zip(cols, cells)))
    return rows


def num(cell: str) -> float:
    """A table cell as a number (``1,234``, ``12.5%``, ``1.07x``), checked finite."""
    x = float(cell.replace(",", "").rstrip("%x"))
    assert math.isfinite(x), cell
    return x


def test_verifier_unstated_pays_no_gsm8k_solution_under_boxed():
    rows = table(run("bench_verifier_unstated.py", "--limit", "20"), "set")
    assert [r["set"] for r in rows] == ["gsm8k_train", "math_train"]
    for r in rows:
        assert num(r["solutions"]) == 20
        assert 0 <= num(r["paid, reference"]) <= 100 and 0 <= num(r["paid, boxed"]) <= 100
    assert num(rows[0]["paid, boxed"]) == 0  # gsm8k's solutions box nothing: "boxed" reads no answer in them


def test_code_reward_times_every_layout():
    out = run("bench_code_reward.py", "--repeats", "1", "--batch", "2")
    rows = table(out, "layout")
    assert [r["layout"] for r in rows] == ["stdio", "call", "asserts"]
    workers = next(c for c in rows[0] if c.endswith("workers (s)"))
    for r in rows:
        assert num(r["1 test (ms)"]) > 0 and num(r["20 tests (ms)"]) > 0
        assert num(r["batch of 2 x 5 tests, 1 worker (s)"]) > 0 and num(r[workers]) > 0


def test_sampling_rows_and_nucleus_sizes():
    rows = table(run("bench_sampling.py", "--rows", "2", "--repeats", "1"), "rows (2 x 151,936)")
    assert [(r["rows (2 x 151,936)"], r["top_p"]) for r in rows] == [
        (k, p) for k in ("peaked", "light tail", "flat") for p in ("0.95", "0.8")]
    for r in rows:
        for col in ("top-p, sorted (ms)", "top-p, candidates (ms)", "sample_tokens (ms)"):
            assert num(r[col]) > 0
        assert num(r["nucleus (median tokens)"]) >= 1
    assert all(num(r["nucleus (median tokens)"]) <= 8 for r in rows[:4])  # a head of 8 tokens holds the mass
    assert num(rows[4]["nucleus (median tokens)"]) > 4096  # flat at 0.95: the candidates' worst case


def test_attention_prints_every_case_and_the_ratio():
    out = run("bench_attention.py", "--batch", "2", "--lengths", "8,16", "--repeat", "1", "--threads", "1")
    rows = [ln.rsplit(None, 3) for ln in out.splitlines() if " L=" in ln]
    assert [r[0] for r in rows] == [f"{k} L={L}" for L in (8, 16)
                                    for k in ("prefill fwd", "prefill fwd+bwd", "decode fwd")]
    for _, sdpa, short, ratio in rows:
        assert float(sdpa) > 0 and float(short) > 0
        assert float(ratio) == pytest.approx(float(short) / float(sdpa), rel=0.05, abs=0.01)


def test_packed_attention_writes_its_rows(tmp_path):
    path = tmp_path / "r.json"
    out = run("bench_packed_attention.py", "--lengths", "8", "--rounds", "1", "--out", str(path))
    assert "dense/varlen" in out
    res = json.loads(path.read_text())
    assert res["rounds"] == 1 and len(res["rows"]) == 1
    row = res["rows"][0]
    assert row["longest"] == 8 and row["tokens"] > 8
    for k in ("dense_cpu_s", "dense_wall_s", "varlen_cpu_s", "varlen_wall_s"):
        assert math.isfinite(row[k]) and row[k] > 0
    assert row["speedup_cpu"] == pytest.approx(row["dense_cpu_s"] / row["varlen_cpu_s"])


def test_logprobs_errors_against_float64_and_the_json(tmp_path):
    path = tmp_path / "lp.json"
    out = run("bench_logprobs.py", "--shapes", "256x32x512", "--methods", "naive,pacs_torch", "--repeat", "1",
              "--threads", "1", "--out", str(path))
    rows = table(out, "method")
    assert [r["method"] for r in rows] == ["naive", "pacs_torch"]
    # (pacs_torch's workspace ratio at this tiny shape: 0.000 (CI once) to ~1.2 (the tiles outweigh [256, 512] logits))
    assert num(rows[0]["time x naive"]) == 1.0 and num(rows[0]["workspace x naive"]) == 1.0
    assert num(rows[1]["time x naive"]) > 0 and num(rows[1]["workspace x naive"]) >= 0
    res = json.loads(path.read_text())
    assert res["meta"]["threads"] == 1 and set(res["meta"]["descriptions"]) >= {"naive", "pacs_torch"}
    for r in res["rows"]:
        assert (r["N"], r["H"], r["V"]) == (256, 32, 512) and "unavailable" not in r
        assert r["time_s"] > 0 and r["workspace_gb"] >= 0
        assert set(r["max_err"]) == {"logp", "ent", "dh", "dw"}  # both with entropy
        assert max(r["max_err"].values()) < 1e-4, r["max_err"]  # fp32 against the float64 reference


def test_fp32_head_closes_the_heads_gap():
    """``--dry-run --layers 0``: tiny widths, the HF engine only (vLLM refuses a model without layers; its engine is
    not run here). Without decoder layers the gap left is the heads': the fp32 head takes it to fp32 rounding."""
    rows = table(run("bench_fp32_head.py", "--dry-run", "--layers", "0", timeout=300), "head scale")
    assert [(r["engine"], r["head"]) for r in rows] == [("HF", "bf16"), ("HF", "fp32")]
    bf16, fp32 = rows
    assert num(bf16["tokens"]) == num(fp32["tokens"]) == 8  # 1 prompt x n=2 x 4 new tokens
    assert num(fp32["max \\|engine - learner\\|"]) < 1e-4
    assert num(fp32["mean \\|engine - learner\\|"]) < num(bf16["mean \\|engine - learner\\|"])


def test_rollout_hf_engines():
    """The HF engines only (``--skip-vllm``): vLLM's start costs ~10 s here."""
    out = run("bench_rollout.py", "--skip-vllm", "--prompts", "2", "--n", "2", "--max-new-tokens", "4",
              "--prompt-len", "8", "--repeats", "1")
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split() == ["engine", "tokens", "seconds", "tokens/s"])
    rows = [ln.rsplit(None, 3) for ln in lines[start + 1:start + 6]]
    assert [r[0] for r in rows] == ["hf lean", "hf lean-unmerged", "hf merged-sdpa", "hf unmerged-short",
                                    "hf generate"]
    for _, tokens, seconds, rate in rows:
        assert 0 < int(tokens) <= 2 * 2 * 4 and float(rate) > 0
    assert "params=0.41M" in out and "vLLM start" not in out


def test_checkpoint_memory_dry_run_measures_every_operation():
    out = run("bench_checkpoint_memory.py", "--dry-run")
    rows = table(out, "operation")
    ops = [r["operation"] for r in rows]
    assert ops == ["save_hf, default shard size", "save_hf, 64 KiB buckets",
                   "load_state, a CPU learner: learner.pt read whole",
                   "load_state, parameters off the CPU: learner.pt memory-mapped",
                   "resume's weights, torch learner: one model.safetensors",
                   "resume's weights, torch learner: 64 KiB shards",
                   "resume's weights, megatron learner (TP 1): one model.safetensors"]
    for r in rows:
        assert num(r["peak RSS growth (MiB)"]) >= 0 and num(r["seconds"]) >= 0
    assert rows[0]["notes"] == "1 file(s)" and int(rows[1]["notes"].split()[0]) > 1  # the small shards split


def test_train_step_phases_of_our_trainer(tmp_path):
    """Ours only (``--no-trl``): TRL's trainer adds ~15 s; the README's commands run it."""
    out = run("bench_train_step.py", "--steps", "2", "--threads", "1", "--no-trl", "warmup.steps=0",
              f"warmup.cache_dir={tmp_path}", "train.prompts_per_step=4", "data.eval_size=8")
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split() == ["phase", "ours", "(s)"])
    phases = dict(ln.split() for ln in lines[start + 1:start + 6])
    assert list(phases) == ["rollout", "reward", "logprobs", "update", "step"]
    assert all(math.isfinite(float(v)) and float(v) >= 0 for v in phases.values())
    assert float(phases["step"]) > 0 and float(phases["update"]) > 0
    assert "ratio ours/TRL" not in out


def test_setup_bench_usage_and_what_it_installs():
    """Not run: it installs the locked set twice into new venvs (minutes, from the package index). Its usage, and
    that what it reads and pins still exists: the lock, the files, the extras, the versions."""
    script = BENCH / "bench_setup.sh"
    out = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "bash bench/bench_setup.sh [WORKDIR]" in out.stdout
    bad = subprocess.run(["bash", str(script), "--nope"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "usage:" in bad.stderr
    text = script.read_text()
    for path in ("requirements/ci.lock", "requirements/nodeps.txt", "scripts/setup.sh", "scripts/check_lock.py"):
        assert path in text and (ROOT / path).is_file(), path
    lock = (ROOT / "requirements" / "ci.lock").read_text()
    for name, pin in re.findall(r'"(torch|transformers)==([\d.*]+)"', text):
        got = re.search(rf"^{name}==([\w.+]+)$", lock, re.M).group(1)
        assert re.match(re.escape(pin).replace(r"\*", r"\d+"), got), (name, pin, got)
    extras = re.search(r'-e "\.\[([\w,-]+)\]"', text).group(1).split(",")
    setup = (ROOT / "setup.py").read_text()
    assert all(f'"{e}":' in setup for e in extras), extras
    imports = re.search(r'IMPORTS="import ([^"]+)"', text).group(1)
    for mod in imports.split(", "):
        assert importlib.util.find_spec(mod.split(".")[0]) is not None, mod


def test_torchrun_launch_command_and_workdir(monkeypatch, tmp_path):
    """bench/torchrun_launch.py (the megatron benches' launcher) in this process, ``subprocess.call`` recorded: the
    command re-runs the script under torchrun with 2 processes and the caller's arguments, a temporary work folder
    exists during the run and is removed after; a folder the user gave is passed once and kept."""
    monkeypatch.syspath_prepend(str(BENCH))
    import torchrun_launch

    seen = []

    def call(cmd, env):
        workdir = cmd[cmd.index("--workdir") + 1] if "--workdir" in cmd else None
        seen.append((cmd, workdir, workdir and os.path.isdir(workdir), env["PYTHONWARNINGS"]))
        return 3

    monkeypatch.setattr(torchrun_launch.subprocess, "call", call)
    monkeypatch.setattr(sys, "argv", ["bench_x.py", "--rounds", "1"])
    with pytest.raises(SystemExit) as e:
        torchrun_launch.launch("bench_x.py", "", "bench_x_")
    assert e.value.code == 3
    cmd, workdir, existed, warnings = seen[-1]
    assert cmd[:6] == [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
                       "bench_x.py"]
    assert cmd[6:8] == ["--rounds", "1"] and existed and warnings == "ignore"
    assert os.path.basename(workdir).startswith("bench_x_") and not os.path.exists(workdir)
    monkeypatch.setattr(sys, "argv", ["bench_x.py", "--workdir", str(tmp_path)])
    with pytest.raises(SystemExit):
        torchrun_launch.launch("bench_x.py", str(tmp_path), "bench_x_")
    assert seen[-1][0].count("--workdir") == 1 and seen[-1][1] == str(tmp_path) and tmp_path.is_dir()


def test_multi_process_benches_refuse_bad_arguments_before_launching():
    """bench_megatron_learner.py, bench_megatron.py, bench_sequence_parallel.py, bench_async.py and bench_scaleout.py
    launch torchrun (and vLLM); their argument checks run before it. bench_megatron_learner.py's TP=1 x DP=2 deals
    whole groups to the two ranks (an odd ``--groups`` failed inside both ranks); bench_async.py measures steps 3..
    (fewer steps ended in a median of nothing after the runs)."""
    assert "--groups: a multiple" in run("bench_megatron_learner.py", "--groups", "3", rc=2)
    assert "--groups: a multiple of 2" in run("bench_megatron.py", "--groups", "1", rc=2)
    assert "--hidden: a multiple of 64" in run("bench_megatron.py", "--hidden", "96", rc=2)
    assert "--tokens: at least 4" in run("bench_sequence_parallel.py", "--tokens", "2", rc=2)
    assert "--steps: at least 3" in run("bench_async.py", "--steps", "2", rc=2)
    assert "--models" in run("bench_scaleout.py", "--models", "tiny,huge", rc=2)


def test_async_bench_reads_metrics_the_trainer_writes():
    """bench_async.py's runs are torchrun launches of the trainer (~12 s each; tests/test_async_rollouts.py runs that
    schedule): the records' keys its table reads must be ones the trainer writes, or a renamed metric breaks it
    only after the runs."""
    source = (BENCH / "bench_async.py").read_text()
    keys = set(re.findall(r'r\["([\w/]+)"\]', source)) - {"kind"}
    assert keys == {"time/step", "response/length", "time/rollout", "time/update", "rollout/staleness"}
    trainer = "".join(p.read_text() for p in (ROOT / "pacs_fast" / "trainer").glob("*.py"))
    for key in keys:
        assert f'"{key}"' in trainer, key


@pytest.mark.distributed
@requires_megatron
def test_megatron_tp2_equals_tp1():
    """Two processes under torchrun (megatron-core over gloo, ~10 s): parity of TP=2 against TP=1 x DP=2 on one
    model and batch. Sequence parallelism (on by default at TP=2) leaves each rank its tokens' part of the norms'
    gradients; the bench compared them unsummed (max|dgrad| 0.085 of 3.2) until it summed them as update() does."""
    out = run("bench_megatron.py", "--hidden", "64", "--layers", "1", "--vocab", "256", "--groups", "2",
              "--group-size", "2", "--seq", "16", "--reps", "1", timeout=600)
    parity = re.search(r"max\|dlogp\| (\S+)  \|dloss\| (\S+)  max\|dgrad\| (\S+) \(max\|grad\| (\S+)\)", out)
    d_logp, d_loss, d_grad, g_max = map(float, parity.groups())
    assert d_logp < 1e-5 and d_loss < 1e-5 and g_max > 0.01 and d_grad < 1e-5 * max(1.0, g_max)
    rows = table(out, "layout")
    assert [r["layout"] for r in rows] == ["TP=1 x DP=2", "TP=2 x DP=1"]
    assert all(num(r["compute_logprobs (s)"]) > 0 and num(r["update: 1 optimiser step (s)"]) > 0 for r in rows)


@pytest.mark.distributed
@requires_megatron
def test_sequence_parallel_keeps_fewer_activations():
    """Two processes under torchrun (``--dry-run``: tiny widths, 64 tokens; ~15 s). It crashed on the megatron
    learner's ``_logprobs``, which returns (logp, entropy, values) since the value head."""
    out = run("bench_sequence_parallel.py", "--dry-run", timeout=600)
    rows = table(out, "mode")
    assert [r["mode"] for r in rows] == ["tensor parallel alone", "+ sequence parallel"]
    alone, sp = (num(r["saved for backward (KiB / token / rank)"]) for r in rows)
    assert 0 < sp < alone
    for r in rows:
        assert 0.5 < num(r["measured / model"]) < 2 and num(r["update (s)"]) > 0
