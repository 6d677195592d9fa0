"""Asynchronous rollouts (issue 20, items 2-3): ``torchrun --nproc_per_node R+1 -m pacs_fast.train
rollout.ranks=R rollout.max_staleness=K`` on CPU (gloo), the HF engine on its own process.

- K = 0 with one engine process: the lock-step schedule on two processes gives exactly the
  one-process run's records and weights (the engine's copy receives bit-exact weights after every
  update; the same seeds, the same prompts), a fixed reference reset on schedule included.
- K = 1: every batch is at most one update old (``rollout/staleness``, ``rollout/policy_version`` in
  every record and ``samples.jsonl`` row), the off-policy correction is on by default and measures
  the staleness; a run killed with SIGKILL (every process) after a checkpoint and resumed trains
  every step exactly once and gives the uninterrupted run's records and weights: the checkpoint kept the
  batch in flight with its completions (before 2026-12-01 it was regenerated from the checkpoint's policy,
  with staleness 0, and the steps after it differed).
"""
import signal
import subprocess
import sys
import time

import pytest
import torch

from forked_torchrun import launch_env, torchrun_command
from pacs_fast.config import load_config, validate
from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

pytestmark = [pytest.mark.distributed]

TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=8", "rollout.n=4", "rollout.eval_n=2",
        "rollout.max_new_tokens=6", "train.prompts_per_step=4", "learner.mini_batch_prompts=2",
        "learner.micro_batch_prompts=1", "warmup.steps=30", "warmup.batch_size=32", "model.tiny_hidden_size=64",
        "model.tiny_num_layers=1", "learner.lr=3e-3", "train.progress=false", "train.plots=false",
        "algo.entropy_coef=0.05", "train.eval_every=0", "train.save_every=1"]


def torchrun(n: int, args, *, wait=True, timeout=300, forked=True):
    """``forked``: the ranks forked from an interpreter with torch and transformers imported
    (tests/forked_torchrun.py); otherwise torchrun's own fresh processes, as users start them."""
    cmd = torchrun_command(n, "-m", "pacs_fast.train", *args, forked=forked)
    if not wait:
        return subprocess.Popen(cmd, env=launch_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    proc = subprocess.run(cmd, env=launch_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return proc.stdout + proc.stderr


def _kill_every_process(proc) -> None:
    """SIGKILL torchrun and its workers (torch's elastic agent starts each worker in a session of its
    own, so killing torchrun's process group alone leaves them running)."""
    import psutil

    procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=60)
    psutil.wait_procs(procs[1:], timeout=60)


def _train(run):
    return [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


# dynamic sampling (rollout.filter_groups): both loops call the same generate-filter-refill round; flipped labels
# mix the groups of the barely warmed-up model, so some steps refill
FILTER = ["rollout.filter_groups=true", "rollout.max_gen_batches=3", "reward.noise_fp=0.3"]


@pytest.mark.timeout(300)
def test_lockstep_engine_process_equals_the_one_process_run(tmp_path, warm_cache):
    """In bf16 with dynamic sampling (two cases in one pair of runs, each had its own): the engine process's HF engine,
    built from the folder, samples in fp32 (its default dtype) while the one-process run's shares the learner's bf16
    model (real-shape sweep), and both loops call the same generate-filter-refill round (refills happen)."""
    from safetensors.torch import load_file

    # a fixed reference reset before step 3 (algo.reset_every): the engine-process loop resets it as the one-process one
    common = TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}", "train.steps=3",
                     "algo.ref=fixed", "algo.reset_every=2", "model.dtype=bfloat16"] + FILTER
    proc = subprocess.run([sys.executable, "-m", "pacs_fast.train", *common, "train.run_name=one"], env=launch_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    torchrun(2, common + ["train.run_name=two", "rollout.ranks=1", "rollout.max_staleness=0"])
    one = deterministic_view(read_jsonl(tmp_path / "one" / "metrics.jsonl"))
    two = deterministic_view(read_jsonl(tmp_path / "two" / "metrics.jsonl"))
    assert [(r["kind"], r["step"]) for r in one] == [(r["kind"], r["step"]) for r in two]
    for a, b in zip(one, two):
        shared = set(a) & set(b) - {"rollout/generating_ranks"}
        assert len(shared) >= len(a) - 1 and {k: a[k] for k in shared} == {k: b[k] for k in shared}
    for r in _train(tmp_path / "two"):
        assert r["rollout/staleness"] == 0 and r["rollout/policy_version"] == r["step"] - 1
        assert "correction/is_weight_mean" not in r  # correction.is_level=auto: off in lock-step
    got = load_file(tmp_path / "two" / "checkpoints" / "step_000003" / "model.safetensors")
    want = load_file(tmp_path / "one" / "checkpoints" / "step_000003" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    # refill rounds ran, in both loops alike
    assert any(r["rollout/gen_rounds"] > 1 for r in _train(tmp_path / "two"))


@pytest.mark.timeout(300)
def test_dynamic_sampling_ahead_of_the_learner_keeps_the_staleness_bound(tmp_path, warm_cache):
    """K = 1 with rollout.filter_groups: the engine generates a batch ahead while a step may take several;
    every trained group is at most one update old and each step's record says how many rounds it took. The
    batches in flight at a checkpoint are kept with it: a resume goes on as the uninterrupted run."""
    from safetensors.torch import load_file

    common = TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}", "train.steps=4",
                     "train.run_name=ds", "rollout.ranks=1", "rollout.max_staleness=1"] + FILTER
    torchrun(2, common)
    recs = _train(tmp_path / "ds")
    assert [r["step"] for r in recs] == [1, 2, 3, 4]
    for r in recs:
        assert 0 <= r["rollout/staleness_mean"] <= r["rollout/staleness"] <= 1
        assert r["rollout/prompts_drawn"] == 4 * r["rollout/gen_rounds"] and r["rollout/trained_groups"] >= 1
    # a run of 2 steps extended to 4 by --resume is the 4-step run: with dynamic sampling the producer runs ahead
    # of train.steps, and the last checkpoint kept the batches in flight with their completions
    split = tmp_path / "split"
    torchrun(2, [a for a in common if a != "train.run_name=ds"] + ["train.run_name=split", "train.steps=2"])
    kept = torch.load(split / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=False)
    assert kept["in_flight"] and all(b["comps"]["per_prompt"] and b["version"] is not None for b in kept["in_flight"])
    out = torchrun(2, ["--resume", str(split), "train.steps=4"])
    assert f"{len(kept['in_flight'])} batch(es) in flight at the step-2 checkpoint" in out
    last = {r["step"]: r for r in deterministic_view(_train(split))}
    assert list(last.values()) == deterministic_view(recs)
    got, want = (load_file(run / "checkpoints" / "step_000004" / "model.safetensors") for run in (split, tmp_path / "ds"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


@pytest.mark.timeout(400)
def test_staleness_bound_and_resume_after_sigkill(tmp_path, warm_cache):
    from safetensors.torch import load_file

    steps = 12  # ~60-200 ms a step here: after step 2's checkpoint, 10 steps (>= 0.6 s) left to kill it mid-way
    common = TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}", f"train.steps={steps}",
                     "rollout.ranks=1", "rollout.max_staleness=1", "train.log_samples=2"]
    full = tmp_path / "full"
    torchrun(2, common + ["train.run_name=full"])
    recs = _train(full)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    assert [r["rollout/staleness"] for r in recs] == [0] + [1] * (steps - 1)  # generated one update ahead
    for r in recs:
        assert r["rollout/policy_version"] == r["step"] - 1 - r["rollout/staleness"]
        assert "correction/is_weight_mean" in r and r["correction/frac_rejected"] == 0  # auto: sequence IS for PACS
    # the stale batches are off-policy (lr 3e-3 moves the policy), the first one is not
    assert recs[0]["correction/kl_k3"] < 1e-6 < max(r["correction/kl_k3"] for r in recs[1:])
    samples = read_jsonl(full / "samples.jsonl", raw=True)
    assert samples and all(s["policy_version"] == s["step"] - 1 - (s["step"] > 1) for s in samples)

    split = tmp_path / "split"  # kill -9 (every process) once a checkpoint is in place, resume
    proc = torchrun(2, common + ["train.run_name=split"], wait=False, forked=False)  # the processes users get
    deadline = time.time() + 300
    latest = split / "checkpoints" / "latest"
    while time.time() < deadline and proc.poll() is None:
        if latest.is_file() and latest.read_text().strip() >= "step_000002":
            break
        time.sleep(0.02)
    _kill_every_process(proc)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    resumed_from = int(latest.read_text().strip()[len("step_"):])
    assert resumed_from < steps
    kept = torch.load(split / "checkpoints" / f"step_{resumed_from:06d}" / "trainer_state.pt", weights_only=False)
    assert [b["index"] for b in kept["in_flight"]] == [resumed_from + 1]  # the batch requested ahead, generated
    assert kept["in_flight"][0]["comps"]["per_prompt"] == [4] * 4 and kept["in_flight"][0]["version"] == resumed_from - 1
    out = torchrun(2, ["--resume", str(split)], forked=False)
    assert "1 batch(es) in flight" in out
    recs = _train(split)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))  # every step trained once, none lost
    # the uninterrupted run's records (each step's last: the resumed run's after the checkpoint) and weights
    last = {r["step"]: r for r in deterministic_view(recs)}
    assert list(last.values()) == deterministic_view(_train(full))
    got = load_file(split / "checkpoints" / f"step_{steps:06d}" / "model.safetensors")
    want = load_file(full / "checkpoints" / f"step_{steps:06d}" / "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    # each step trained the uninterrupted run's prompts (the last rows logged for a step are the
    # resumed run's): none lost, none taken twice
    first = {run: {r["step"]: r["prompt"] for r in read_jsonl(run / "samples.jsonl") if r["row"] == 0}
             for run in (full, split)}
    assert sorted(first[split]) == list(range(1, steps + 1)) and first[split] == first[full]


@pytest.mark.parametrize("overrides,world,match", [
    (["rollout.max_staleness=1"], 1, "rollout.max_staleness=1 needs rollout.ranks >= 1"),
    (["rollout.ranks=1"], 1, r"rollout.ranks=1 needs more than 1 processes .* has 1"),
    (["rollout.ranks=1"], 3, r"rollout.ranks=1 with learner.backend=torch needs 2 processes .* has 3"),
    (["rollout.ranks=3"], 4, r"train.prompts_per_step=8 must be a multiple of the number of engines .* = 3"),
    (["rollout.ranks=3", "rollout.engine=vllm", "rollout.tp_size=2"], 4,
     "rollout.ranks=3 must be a multiple of rollout.tp_size=2"),
    (["rollout.ranks=2", "rollout.tp_size=2"], 3, "rollout.tp_size=2 needs rollout.engine=vllm"),
    # the engine first: "rollout.ranks=1 must be a multiple of rollout.tp_size=2" named the wrong fix
    (["rollout.ranks=1", "rollout.tp_size=2"], 2, "rollout.tp_size=2 needs rollout.engine=vllm"),
    (["rollout.tp_size=2"], 1, "rollout.tp_size=2 applies with rollout.ranks"),
    (["rollout.ranks=1", "learner.backend=megatron", "learner.tp_size=2"], 4,
     r"learner.tp_size=2 must divide the learner's processes \(3"),
    (["rollout.ranks=-1"], 1, "must be >= 0"),
    # a bound past the run's length asked for K + 1 batches at step 1 (1,001 for K = 1,000), never binding
    (["rollout.ranks=1", "rollout.max_staleness=5", "train.steps=4"], 2,
     r"rollout.max_staleness=5 is more than train.steps=4: the engines would generate 6 batches before step 1 "
     r"trains, 2 of them past the run's last step"),
    (["rollout.ranks=1", "rollout.tp_size=0"], 2, "rollout.tp_size must be >= 1"),
])
def test_layout_errors(overrides, world, match):
    with pytest.raises(ValueError, match=match):
        validate(load_config(None, ["train.prompts_per_step=8", "learner.mini_batch_prompts=8",
                                    "learner.micro_batch_prompts=8"] + overrides), world=world)
    validate(load_config(None, ["rollout.ranks=2", "rollout.max_staleness=2", "train.prompts_per_step=8",
                                "learner.mini_batch_prompts=8", "learner.micro_batch_prompts=8"]), world=3)
    validate(load_config(None, ["rollout.ranks=2", "rollout.engine=vllm", "rollout.tp_size=2", "train.prompts_per_step=8",
                                "learner.backend=megatron", "learner.tp_size=2", "learner.mini_batch_prompts=8",
                                "learner.micro_batch_prompts=8"]), world=6)
