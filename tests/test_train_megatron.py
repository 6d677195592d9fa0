"""``torchrun --nproc_per_node 2 -m pacs_fast.train learner.backend=megatron learner.tp_size=2`` end
to end on CPU (gloo): rank 0 alone writes and prints, checkpoints are written once and load in
transformers, ``--resume`` under torchrun continues exactly as the uninterrupted run; and the
process-layout checks of :func:`pacs_fast.config.validate` fail fast with clear errors.
"""
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from conftest import copy_as_killed_in_checkpoint
from forked_torchrun import MEGATRON, launch_env, torchrun_command
from pacs_fast.config import load_config, validate
from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

HAS_MEGATRON = importlib.util.find_spec("megatron") is not None

# 4 prompts x 4 samples, 1 layer; heads 4 / kv heads 2 (hidden 128) split over tp=2.
# An entropy bonus gives a gradient even when every reward is 0, so the weights always move. A fixed
# reference, reset to the policy before step 3, is in every checkpoint: the resumed step 4 equals the
# uninterrupted one only if step 3's checkpoint restored it (a fresh start would hold the initial policy).
TINY = ["learner.backend=megatron", "learner.tp_size=2", "algo.ref=fixed", "algo.reset_every=2", "data.arith_max_digits=1", "data.eval_size=8",
        "rollout.n=4", "rollout.eval_n=2", "rollout.max_new_tokens=6", "train.prompts_per_step=4",
        "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "warmup.steps=30",
        "warmup.batch_size=32", "model.tiny_hidden_size=128", "model.tiny_num_layers=1", "learner.lr=3e-3",
        "algo.entropy_coef=0.1", "train.progress=false", "train.eval_every=1", "train.save_every=1",
        "train.plots=false", "train.seed=5"]


def torchrun(args, timeout=300, nproc=2, forked=True) -> str:
    """``forked``: the ranks forked from an interpreter with megatron-core imported (tests/forked_torchrun.py);
    otherwise torchrun's own fresh processes, as users start them."""
    cmd = torchrun_command(nproc, "-m", "pacs_fast.train", *args, preload=MEGATRON, forked=forked)
    proc = subprocess.run(cmd, env=launch_env(PYTHONUNBUFFERED="1"), capture_output=True, text=True,
                          timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.mark.megatron
@pytest.mark.distributed
@pytest.mark.timeout(400)
@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed")
def test_torchrun_tp2_run_checkpoints_and_resumes_exactly(tmp_path, warm_cache):
    """One uninterrupted 4-step run; a copy of its folder as a SIGKILL during step 4's checkpoint leaves
    it (step 4's records written, its checkpoint not: ``latest`` names step 3) resumes under torchrun
    and gives the same records and bit-identical weights. (Continuing a finished run for more steps,
    ``--resume RUN train.steps=N``, is checked under torchrun in tests/test_async_scaleout.py.)"""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pacs_fast.trainer.warmup import warmup_key

    common = TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={warm_cache}"]
    out = torchrun(common + ["train.steps=4", "train.run_name=full"])
    # rank 0 alone prints (the other rank would repeat every line) and writes
    assert out.count("step 0: held-out accuracy") == 1, out[-3000:]
    assert out.count("run folder") == 1
    # the layout, said once (learner.sequence_parallel, on by default at tp_size > 1)
    assert out.count("learner: tensor parallel 2 x data parallel 1, sequence parallel on") == 1, out[-3000:]
    full = tmp_path / "full"
    assert len(list(tmp_path.rglob("metrics.jsonl"))) == 1
    assert len(list((full / "tb").iterdir())) == 1
    recs = read_jsonl(full / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in recs] == [("eval", 0), *[(k, s) for s in (1, 2, 3, 4)
                                                                     for k in ("train", "eval", "checkpoint")]]
    for r in (r for r in recs if r["kind"] == "train"):
        assert r["learner/grad_norm"] > 0
        # the HF engine's rollout log-probs vs the TP=2 learner's: the same weights, float noise only
        assert 0 <= r["rollout/logprob_diff_mean"] <= r["rollout/logprob_diff_max"] < 1e-3
    assert sorted(p.name for p in (full / "checkpoints").glob("step_*")) == ["step_000003", "step_000004"]
    assert not list((full / "checkpoints").glob(".tmp-*"))

    split = copy_as_killed_in_checkpoint(full, tmp_path / "split", 4)
    out = torchrun(["--resume", str(split)], forked=False)  # fresh processes, as users launch it
    assert out.count("resumed from") == 1 and "(step 3)" in out
    a = deterministic_view(read_jsonl(full / "metrics.jsonl"))
    b = deterministic_view(read_jsonl(split / "metrics.jsonl"))
    assert [(r["kind"], r["step"]) for r in b] == [(r["kind"], r["step"]) for r in a]
    assert a == b

    # the exported checkpoint: loadable by transformers, equal to the uninterrupted run's, trained
    ckpt = split / "checkpoints" / "step_000004"
    got, want = load_file(ckpt / "model.safetensors"), load_file(full / "checkpoints" / "step_000004" /
                                                                 "model.safetensors")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    start = AutoModelForCausalLM.from_pretrained(warm_cache / "warmup" / warmup_key(load_config(None, common)),
                                                 dtype=torch.float32)
    assert model.config.hidden_size == 128
    moved = max((p - start.state_dict()[n]).abs().max().item() for n, p in model.state_dict().items())
    assert moved > 1e-4
    ids = torch.tensor([[1, 5, 6, 7]])
    assert torch.isfinite(model(ids).logits).all()


@pytest.mark.parametrize("case", ["tp_not_dividing_world", "mini_not_multiple_of_dp", "torch_multiprocess",
                                  "torch_tp", "ok_dp2"])
def test_validate_checks_the_process_layout(case):
    overrides, world, want = {
        "tp_not_dividing_world": (["learner.backend=megatron", "learner.tp_size=2"], 3, "must divide the number"),
        "mini_not_multiple_of_dp": (["learner.backend=megatron", "learner.tp_size=1", "train.prompts_per_step=6",
                                     "learner.mini_batch_prompts=3", "learner.micro_batch_prompts=1"], 2,
                                    "multiple of the data-parallel size 2"),
        "torch_multiprocess": (["learner.backend=torch"], 2, "runs in one process"),
        "torch_tp": (["learner.tp_size=2"], 1, "needs learner.backend=megatron"),
        "ok_dp2": (["learner.backend=megatron", "learner.tp_size=2", "learner.mini_batch_prompts=4",
                    "learner.micro_batch_prompts=2"], 8, None),
    }[case]
    cfg = load_config(None, overrides)
    if want is None:
        validate(cfg, world=world)
        return
    with pytest.raises(ValueError, match=want):
        validate(cfg, world=world)


def test_cli_rejects_a_bad_layout_before_any_work(tmp_path, monkeypatch, capsys):
    from pacs_fast.train import main

    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(SystemExit) as e:
        main(["learner.backend=megatron", "learner.tp_size=3", f"train.out_dir={tmp_path}"])
    assert e.value.code == 2
    assert "learner.tp_size=3 must divide the number of processes (4" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("rank", ["0", "1"])
def test_only_rank_0_prints_a_failure_and_it_exits_first(rank, monkeypatch, capsys):
    """torchrun stops every worker once one has failed: a rank 1 that exited first once had rank 0
    stopped before it printed (a CI run: no error line at all). The other ranks exit later."""
    import pacs_fast.train as cli

    slept = []
    monkeypatch.setattr(cli.time, "sleep", slept.append)
    monkeypatch.setenv("RANK", rank)
    with pytest.raises(SystemExit) as e:
        cli.fail("bad key", 2)
    assert e.value.code == 2
    if rank == "0":
        assert capsys.readouterr().err == "error: bad key\n" and slept == []
    else:
        assert capsys.readouterr().err == "" and slept == [cli.PEER_EXIT_DELAY_S] and cli.PEER_EXIT_DELAY_S >= 5


@pytest.mark.distributed
def test_a_config_error_under_torchrun_is_printed_once(tmp_path):
    """Every rank fails alike on a bad setting; only global rank 0 prints the line (it was printed
    once per rank, issue 41). Each rank exits 2; torchrun then reports the failed workers itself and
    exits 1 (its status for any failed worker), as the README says."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--standalone", "-m", "pacs_fast.train", "algo.beta=abc",
                           f"train.out_dir={tmp_path}"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.count("error: config key 'algo.beta' expects float, got 'abc'") == 1, proc.stderr[-3000:]
    assert "exitcode  : 2" in proc.stderr  # the worker's own status, in torchrun's report
    assert not list(tmp_path.iterdir())


@pytest.mark.megatron
@pytest.mark.distributed
@pytest.mark.timeout(400)
@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed")
def test_two_data_parallel_ranks_reproduce_one_process(tmp_path, warm_cache):
    """Megatron at TP=1 on two processes (two data-parallel groups, each generating and training its
    share) against the same run on one process, record for record: the same samples (rewards,
    lengths, held-out accuracy exactly; a prompt's samples are seeded by its index, not by the
    share it lands in) and the same training up to the float noise of the gradient all-reduce
    (token means weighted by each group's tokens). The HF engine once seeded one generator per
    call: step-0 held-out 0.281 vs 0.289 (issue 41). One optimiser step per step: with several,
    each group draws its part of a mini-batch from its own share (see the README)."""
    common = [a for a in TINY if not a.startswith(("learner.tp_size", "algo.ref", "algo.reset_every",
                                                    "learner.mini_batch_prompts"))] + [
        "learner.tp_size=1", "learner.mini_batch_prompts=4", "train.steps=2", "train.save_every=0", f"train.out_dir={tmp_path}",
        f"warmup.cache_dir={warm_cache}", "train.tensorboard=false", "train.log_samples=12",
        "learner.distributed_optimizer=true"]  # (the same updates, sharded over two groups; nothing to shard in one)
    idle = "warning: learner.distributed_optimizer=true has no effect with one data-parallel group"
    assert idle in torchrun(common + ["train.run_name=one"], nproc=1)
    assert idle not in torchrun(common + ["train.run_name=two"], nproc=2)
    # samples.jsonl: the step's first 12 of 16 rows, 8 of them in data-parallel group 0's share (it held only those)
    samples = [read_jsonl(tmp_path / name / "samples.jsonl", raw=True) for name in ("one", "two")]
    assert [(r["step"], r["row"]) for r in samples[0]] == [(r["step"], r["row"]) for r in samples[1]] \
        == [(step, row) for step in (1, 2) for row in range(12)]
    for a, b in zip(*samples):
        assert {k: a[k] for k in ("prompt", "response", "answer", "reward")} == \
            {k: b[k] for k in ("prompt", "response", "answer", "reward")}
        assert b["psi"] == pytest.approx(a["psi"], rel=1e-4, abs=1e-6)
    one, two = (deterministic_view(read_jsonl(tmp_path / name / "metrics.jsonl")) for name in ("one", "two"))
    assert [(r["kind"], r["step"]) for r in one] == [(r["kind"], r["step"]) for r in two]
    assert [r["kind"] for r in one].count("train") == 2
    # the layout that ran: two data-parallel groups each generated its share, against one
    assert {r["rollout/generating_ranks"] for r in two if r["kind"] == "train"} == {2}
    assert {r["rollout/generating_ranks"] for r in one if r["kind"] == "train"} == {1}
    for a, b in zip(one, two):
        exact = [k for k in a if k.startswith(("reward/", "eval/", "length/", "response/")) or k == "kind"]
        assert {k: a[k] for k in exact} == {k: b.get(k) for k in exact}, (a["kind"], a["step"])
        for k, v in a.items():
            if k.startswith("rollout/logprob_diff_"):
                # the HF engine's log-probs vs the learner's: float noise whose size depends on how each
                # layout batches its GEMMs (3.1e-6 on two ranks vs 4.2e-6 on one with ATen's AVX2
                # kernels, equal with its AVX-512 ones): bounded on both, not compared
                assert 0 <= v < 1e-3 and 0 <= b[k] < 1e-3, (k, v, b[k])
            elif k.startswith("learner/forward/"):  # how each layout ran (a group pads its own micro-batches),
                assert k != "learner/forward/token_slots" or (v > 0 and b[k] > 0), (k, v, b[k])  # not the result
            elif isinstance(v, float) and k not in exact and k != "rollout/generating_ranks":
                assert b[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k


@pytest.mark.megatron
@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core is not installed")
def test_one_process_megatron_sets_up_twice_in_one_interpreter():
    """One process, no torchrun: megatron's group is made on an in-process store (no probed port), and a second
    run in the same interpreter (a notebook, library use) makes it again; the first set-up leaves RANK /
    WORLD_SIZE in the environment, which once sent the second to env:// without MASTER_ADDR (review of
    2026-11-29)."""
    script = """
import os
import torch.distributed as dist
from megatron.core import parallel_state as ps
from pacs_fast.learner.megatron.setup import init_parallel
for attempt in range(2):
    init_parallel(1, device="cpu")
    assert dist.get_world_size() == 1 and "MASTER_PORT" not in os.environ, attempt
    ps.destroy_model_parallel()
    dist.destroy_process_group()
print("twice ok")
"""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-c", script], env={**env, "PYTHONWARNINGS": "ignore"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "twice ok" in proc.stdout, proc.stderr[-3000:]
