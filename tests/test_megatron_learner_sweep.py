"""Hostile sweep of the megatron learner against the torch learner on a Qwen2.5-shaped model (fp32, CPU / gloo).

The model: GQA 4:2, QKV bias (random, so that it matters), untied head, RoPE theta 1e6, RMSNorm eps 1e-6, a
checkpoint vocabulary of 251 rows (TP=2 pads it to 252) of which 245 are real tokens (``vocab_size``: the rest never
sampled or counted). The batch: 4 groups of 4 right-padded rows of 1 to 315 tokens, with a 1-token response, rows
of only prompt, a row of one token. One ``torchrun --nproc_per_node 2`` launch (this file is its worker) runs
``MegatronLearner.update`` at TP=2 and TP=1 x DP=2 with the off-policy correction from the update's own first forward
(2 mini-batches: K = 2 optimiser steps; and 2 epochs): THD, padded and dense-mask rows, separate old log-probs,
full and selective recompute, a token budget that splits groups. Each must give the torch learner's old log-probs,
entropies, importance weights, metrics, every parameter's gradient at each optimiser step, AdamW's moments and the
updated weights (observed: 1e-6 on log-probs, 4e-8 on gradients of ~3e-2, 1e-7 on weights that moved 6e-3).
Also: the HF -> megatron -> HF round trip is bit for bit (fp32 and bf16, TP 1 and 2, QKV bias, the padded
vocabulary) and the TP pad row of the head stays 0; a token budget smaller than one row raises the same line on
every rank (it hung: one data-parallel rank raised, the other waited in a collective); RolloutBatch refuses
left-padded rows (both learners silently trained on cut rows / wrong positions).
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

MEGATRON_SKIP = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")
V_HF, V_TOK, G = 251, 245, 4
ROWS = [(5, 1), (7, 0), (1, 0), (3, 40), (12, 300), (4, 2), (9, 150), (2, 77),
        (6, 250), (11, 3), (1, 1), (8, 120), (3, 33), (5, 64), (10, 199), (2, 5)]  # (prompt, response) tokens
LEARNER = {"lr": 3e-3, "eps": 1e-3, "grad_clip": 0.5, "weight_decay": 0.01, "mini_batch_prompts": 2,
           "micro_batch_prompts": 1, "logprob_backend": "torch"}
# name: (tp, learner keys, MegatronLearner keywords, old log-probs fused into the update)
CASES = {
    "tp1_thd": (1, {"packing": "on"}, {}, True),
    "tp2_thd": (2, {"packing": "on"}, {}, True),
    "tp1_padded": (1, {"packing": "off"}, {}, True),
    "tp2_padded": (2, {"packing": "off"}, {}, True),
    "tp2_dense": (2, {"packing": "on", "packed_attention": "dense"}, {}, True),
    "tp2_separate": (2, {"packing": "on"}, {}, False),
    "tp2_full_recompute": (2, {"packing": "on"}, {"gradient_checkpointing": True, "recompute_granularity": "full"},
                           True),
    "tp2_selective": (2, {"packing": "on"}, {"gradient_checkpointing": True, "recompute_granularity": "selective"},
                      True),
    "tp2_split_budget": (2, {"packing": "auto", "max_tokens_per_micro_batch": 330}, {}, True),
    "tp2_epochs2": (2, {"packing": "on", "epochs": 2}, {}, True),
}


def _correct(rows, proximal):  # token-level truncated IS weights, no rejection (the trainer's fused case)
    from pacs_fast.algorithms.off_policy import off_policy_correction

    w, kept, _ = off_policy_correction(proximal.float().cpu(), rows.behaviour_logp.float().cpu(),
                                       rows.response_mask.cpu() > 0, is_level="token", is_cap=2.0)
    rows.is_weights, rows.kept_mask = w.to(rows.response_mask), kept.to(rows.response_mask)


def _step(lrn, spec, fused, grads_of):
    """One update of ``lrn`` (either learner) on the spec's batch; the gradients each optimiser step sees."""
    from pacs_fast.learner.base import RolloutBatch

    grads, step = [], lrn.optimizer.step
    lrn.optimizer.step = lambda *a, **k: (grads.append(grads_of()), step(*a, **k))[1]
    batch = RolloutBatch(**spec["batch"])
    batch.behaviour_logp = spec["behaviour"]
    if fused:
        metrics = lrn.update(batch, seed=3, correct=_correct)
    else:
        batch.old_logp, batch.old_entropy = lrn.compute_logprobs(batch, return_entropy=True)
        batch.ref_logp = batch.old_logp
        _correct(batch, batch.old_logp)
        metrics = lrn.update(batch, seed=3)
    return {"metrics": metrics, "old_logp": batch.old_logp, "old_entropy": batch.old_entropy,
            "is_weights": batch.is_weights, "grads": grads, "terms": lrn.last_terms}


# ----------------------------------------------------------------------------- the worker (torchrun ranks)
def _megatron(spec, path, tp, lkw, mkw, **kw):
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.megatron.learner import MegatronLearner

    return MegatronLearner(path, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(
        **{**LEARNER, **lkw}, backend="megatron", tp_size=tp), temperature=0.9, horizon=spec["T"],
        vocab_size=V_TOK, **mkw, **kw)


def _worker(wd):
    import torch.distributed as dist

    from pacs_fast.learner.hf_folder import LazyHFCheckpoint
    from pacs_fast.learner.megatron.convert import export_hf_state_dict
    from pacs_fast.learner.megatron.forward import output_weight

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    spec, res = torch.load(os.path.join(wd, "inputs.pt")), {}
    for name, (tp, lkw, mkw, fused) in CASES.items():
        lrn = _megatron(spec, spec["model"], tp, lkw, mkw)
        out = _step(lrn, spec, fused, lambda: export_hf_state_dict(lrn.model, lrn.hf_config, tp_group=lrn.tp_group,
                                                                   grads=True))
        opt = lrn.state_dict()["optimizer"]
        out.update(weights=dict(lrn.export_hf_weights()), exp_avg=opt["exp_avg"], exp_avg_sq=opt["exp_avg_sq"])
        w = output_weight(lrn.model)  # the TP pad row (the last rank's last row): 0, and no gradient moved it
        pad = torch.tensor(float(w[-1].abs().max()) if tp == 2 and lrn.tp_rank == 1 else 0.0)
        dist.all_reduce(pad, op=dist.ReduceOp.MAX)
        res[name] = {**out, "pad_row": float(pad)}
        lrn.close()
    for tp in (1, 2):  # HF -> megatron shards -> HF, fp32 and bf16, bit for bit (and through save_hf's buckets)
        for dtype, path in (("float32", spec["model"]), ("bfloat16", spec["model_bf16"])):
            lrn = _megatron(spec, path, tp, {}, {}, dtype=dtype)
            folder = os.path.join(wd, f"out_tp{tp}_{dtype}")
            lrn.save_hf(folder, bucket_bytes=20_000)
            res[f"roundtrip/tp{tp}/{dtype}"] = {"exported": dict(lrn.export_hf_weights()),
                                                "saved": dict(LazyHFCheckpoint(folder).items())}
            lrn.close()
    for tp in (1, 2):  # a budget smaller than a row: every rank raises (DP=2 at TP=1: it hung)
        try:
            _step(_megatron(spec, spec["model"], tp, {"max_tokens_per_micro_batch": 200}, {}), spec, True, dict)
            err = None
        except ValueError as e:
            err = str(e)
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
        errs = [None, None]
        dist.all_gather_object(errs, err)
        res[f"budget/tp{tp}"] = errs
    if dist.get_rank() == 0:
        torch.save(res, os.path.join(wd, "results.pt"))
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the tests
def _model(wd):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=V_HF, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rope_theta=1e6,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=None, bos_token_id=None,
                      eos_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = Qwen2ForCausalLM(cfg)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "bias" in n:
                    p.normal_(0, 0.3)
                elif "norm" in n:
                    p.add_(0.2 * torch.randn_like(p))
    model.save_pretrained(wd / "model")
    model.to(torch.bfloat16).save_pretrained(wd / "model_bf16")


def _batch():
    T = max(p + r for p, r in ROWS) + 3
    gen = torch.Generator().manual_seed(7)
    ids, am, rm = torch.zeros(len(ROWS), T, dtype=torch.long), torch.zeros(len(ROWS), T, dtype=torch.long), \
        torch.zeros(len(ROWS), T)
    for b, (p, r) in enumerate(ROWS):
        ids[b, :p + r] = torch.randint(0, V_TOK, (p + r,), generator=gen)
        am[b, :p + r] = 1
        rm[b, p:p + r] = 1
    rewards = torch.tensor([1., 0, 0, 1, 0, 1, 1, 0, 1, 1, 0, 0, 0, 0, 1, 0])
    batch = dict(input_ids=ids, attention_mask=am, response_mask=rm, rewards=rewards, group_size=G)
    return T, batch, (-3 * torch.rand(len(ROWS), T, generator=gen)) * rm


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("megatron.core")
    from forked_torchrun import MEGATRON, launch_env, torchrun_command

    wd = tmp_path_factory.mktemp("megatron_sweep")
    _model(wd)
    T, batch, behaviour = _batch()
    spec = {"model": str(wd / "model"), "model_bf16": str(wd / "model_bf16"), "T": T, "batch": batch,
            "behaviour": behaviour}
    torch.save(spec, wd / "inputs.pt")
    proc = subprocess.Popen(torchrun_command(2, os.path.abspath(__file__), str(wd), preload=MEGATRON),
                            env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # (on a timeout the launcher and its ranks are killed together)
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        _, err = proc.communicate()
        pytest.fail(f"the launch hung (300 s):\n{err[-6000:]}")
    assert proc.returncode == 0, err[-6000:]
    return spec, torch.load(wd / "results.pt")


@pytest.fixture(scope="module")
def reference(run):
    """The torch learner's update on the same weights and batch (padded rows), one and two epochs."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.torch_learner import TorchLearner

    spec, out = run[0], {}
    for epochs in (1, 2):
        model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
        lrn = TorchLearner(model, algo=AlgoConfig(name="pacs"), temperature=0.9, horizon=spec["T"], vocab_size=V_TOK,
                           learner=LearnerConfig(**LEARNER, packing="off", epochs=epochs))
        r = _step(lrn, spec, True, lambda: {n: p.grad.clone() for n, p in model.named_parameters()})
        named = dict(model.named_parameters())
        r.update(weights={n: p.detach().clone() for n, p in named.items()},
                 **{k: {n: lrn.optimizer.state[p][k] for n, p in named.items()} for k in ("exp_avg", "exp_avg_sq")})
        out[epochs] = r
    return out


def _diff(a, b) -> float:
    if isinstance(a, dict):
        assert set(a) == set(b), set(a) ^ set(b)
        return max(_diff(a[k], b[k]) for k in a)
    return float((a.float() - b.float()).abs().max())


@pytest.mark.megatron
@pytest.mark.distributed
@MEGATRON_SKIP
@pytest.mark.parametrize("case", sorted(CASES))
def test_update_equals_the_torch_learner(run, reference, case):
    got, ref = run[1][case], reference[CASES[case][1].get("epochs", 1)]
    for k in ("old_logp", "old_entropy"):
        assert _diff(got[k], ref[k]) < 1e-5, k
    assert _diff(got["is_weights"], ref["is_weights"]) < 1e-6
    packing, m = CASES[case][1]["packing"], got["metrics"]  # the layout the case names is the one that ran
    if packing != "auto":
        ran, other = ("packed", "padded") if packing == "on" else ("padded", "packed")
        assert m[f"forward/{ran}"] > 0 and m[f"forward/{other}"] == 0, m
    names = {k for k in ref["metrics"] if not k.startswith("forward/")}
    assert names == {k for k in got["metrics"] if not k.startswith("forward/")} - {"split_groups"}
    for k in names:
        assert abs(got["metrics"][k] - ref["metrics"][k]) < 1e-5 * max(1.0, abs(ref["metrics"][k])), k
    assert len(got["grads"]) == len(ref["grads"]) == 2 * CASES[case][1].get("epochs", 1)
    for g, r in zip(got["grads"], ref["grads"]):  # every parameter (HF names), each optimiser step
        assert _diff(g, r) < 1e-6
        assert float(g["lm_head.weight"][V_TOK:].abs().max()) == 0.0  # rows past the tokenizer: never counted
    for k in ("exp_avg", "exp_avg_sq"):
        assert _diff(got[k], ref[k]) < 1e-7, k
    assert _diff(got["weights"], ref["weights"]) < 1e-6
    assert _diff(ref["weights"], _initial(run)) > 1e-3  # the update moved the weights
    for k in ref["terms"]:
        assert _diff(got["terms"][k], ref["terms"][k]) < 1e-4 * max(1.0, float(ref["terms"][k].abs().max())), k
    assert got["pad_row"] == 0.0


def _initial(run):
    from pacs_fast.learner.hf_folder import LazyHFCheckpoint

    return dict(LazyHFCheckpoint(run[0]["model"]).items())


@pytest.mark.megatron
@pytest.mark.distributed
@MEGATRON_SKIP
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_hf_round_trip_is_bit_exact(run, tp, dtype):
    from pacs_fast.learner.hf_folder import LazyHFCheckpoint

    spec = run[0]
    hf = dict(LazyHFCheckpoint(spec["model" if dtype == "float32" else "model_bf16"]).items())
    assert hf["model.layers.0.self_attn.q_proj.bias"].abs().max() > 0.1 and hf["lm_head.weight"].shape[0] == V_HF
    got = run[1][f"roundtrip/tp{tp}/{dtype}"]
    for what in ("exported", "saved"):
        assert set(got[what]) == set(hf)
        for k, v in hf.items():
            assert got[what][k].dtype == v.dtype and torch.equal(got[what][k], v), (what, k)


@pytest.mark.megatron
@pytest.mark.distributed
@MEGATRON_SKIP
@pytest.mark.parametrize("tp", [1, 2])
def test_a_budget_smaller_than_a_row_raises_on_every_rank(run, tp):
    errs = run[1][f"budget/tp{tp}"]
    assert errs[0] == errs[1] and "learner.max_tokens_per_micro_batch=200" in errs[0] and "312" in errs[0]


@pytest.mark.parametrize("bad", ["left_padded", "gap", "response_on_padding"])
def test_rollout_batch_refuses_rows_that_are_not_right_padded(bad):
    from pacs_fast.learner.base import RolloutBatch

    _, batch, _ = _batch()
    am, rm = batch["attention_mask"].clone(), batch["response_mask"].clone()
    if bad == "left_padded":  # row 5 (6 tokens) moved right by 2: groups() cut its last 2 tokens off
        am[5] = am[5].roll(2)
        rm[5] = rm[5].roll(2)
    elif bad == "gap":
        am[4, 20] = 0
    else:
        rm[3, am[3].sum()] = 1
    with pytest.raises(ValueError, match="RolloutBatch: row [345] "):
        RolloutBatch(**{**batch, "attention_mask": am, "response_mask": rm})
    RolloutBatch(**batch).groups([1, 0]).to("cpu")  # (right-padded rows pass)


def test_the_layout_is_checked_once_per_batch_not_per_sub_batch(monkeypatch):
    """The learner cuts a batch into mini-batches, data-parallel shares and micro-batches (``groups()``), moves them
    (``to()``) and edits them (``dataclasses.replace``): a part of a checked batch is not checked again."""
    import dataclasses

    import pacs_fast.learner.base as base

    calls = []
    real = base.check_right_padded
    monkeypatch.setattr(base, "check_right_padded", lambda *a: calls.append(1) or real(*a))
    _, batch, _ = _batch()
    rb = base.RolloutBatch(**batch)
    assert calls == [1] and rb.layout_checked
    part = dataclasses.replace(rb.groups([1, 0]).groups([0]).to("cpu"), group_size=1)
    assert calls == [1] and part.layout_checked
    base.RolloutBatch(**batch)  # a new batch is checked
    assert calls == [1, 1]


if __name__ == "__main__":
    _worker(sys.argv[1])
