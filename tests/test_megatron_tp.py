"""Megatron-core tensor-parallel learner: TP=2 (and TP=1 x DP=2) vs transformers, on CPU/gloo.

tests/megatron_worker.py, on two gloo ranks in the session's one megatron launch (tests/megatron_launch.py),
computes everything on the megatron side; the tests compare it with the Hugging Face model and the PyTorch
learner on the same weights and the same fresh random batch.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import draw_seed, requires_megatron
from megatron_launch import megatron_folder

transformers = pytest.importorskip("transformers")

pytestmark = [requires_megatron, pytest.mark.megatron, pytest.mark.distributed]

G = 4          # group size
TOL = 2e-5     # fp32, tiny model: observed differences are ~1e-6


def _padded_batch(gen, B, T, *, left_pad: bool):
    """Random ids; rows with (optional) left padding, a prompt, a response, right padding."""
    ids = torch.randint(3, 127, (B, T), generator=gen)
    am = torch.zeros(B, T, dtype=torch.long)
    rm = torch.zeros(B, T)
    for b in range(B):
        lp = int(torch.randint(0, 3, (1,), generator=gen)) if left_pad else 0
        plen = int(torch.randint(2, 5, (1,), generator=gen))
        rlen = int(torch.randint(1, T - lp - plen + 1, (1,), generator=gen))
        am[b, lp:lp + plen + rlen] = 1
        rm[b, lp + plen:lp + plen + rlen] = 1
    ids = ids.masked_fill(am == 0, 0)
    return ids, am, rm


def _odd_vocab_model(path, seed) -> str:
    """Untied tiny Qwen2 with vocab 127: TP=2 pads it to 128 (the pad row must not count)."""
    from transformers import Qwen2ForCausalLM

    from pacs_fast.data.tiny import tiny_qwen2_config

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(tiny_qwen2_config(127, tie_word_embeddings=False))
    model.save_pretrained(path)
    return str(path)


def _llama_model(path, seed) -> str:
    """Tiny Llama (no QKV bias, untied, head 32, GQA 4:2)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 2)
        LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def _llama31_model(path, seed, rope_scaling=LLAMA3_ROPE) -> str:
    """Tiny Llama with Llama 3.1's RoPE scaling (theta 500,000, head 32: 7 of its 16 frequencies divided by 8, one
    smoothed); its attention weights x4 so that the rotation of those slow dimensions moves the log-probs (3.4e-4
    from the unscaled model's at these 14 positions, against parity's 2e-5: test_llama3_rope_is_seen)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_scaling=rope_scaling)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 4)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "self_attn" in name:
                    p.mul_(4)
    model.save_pretrained(path)
    return str(path)


def _qwen3_model(path, seed) -> str:
    """Tiny Qwen3 (q_norm / k_norm over a head_dim of 32 != hidden / heads = 16, no biases, tied, GQA 4:2), its
    norms' weights moved off 1 so that their gradients and the TP sum over the heads matter."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
                      rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 3)
        model = Qwen3ForCausalLM(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.add_(0.3 * torch.randn_like(p))
    model.save_pretrained(path)
    return str(path)


# Baselines through both learners (tests/megatron_worker.py baseline_step): the keys that reach the learner, which the
# megatron learner must train as the torch learner does (a key it ignored would train as if unset: the parity audit
# of 2026-12-03). Old log-probs moved off the policy's ("stale") so that the ratios are off 1 and the clips act.
_OPTIM = {"lr": 3e-3, "eps": 1e-3, "grad_clip": 0.5, "weight_decay": 0.01, "logprob_backend": "torch",
          "mini_batch_prompts": 4, "micro_batch_prompts": 2}
BASELINE_CASES = {
    "cispo_kl_entropy_truncated": {"algo": {"name": "cispo", "clip_low": 10.0, "clip_high": 0.2, "kl_coef": 0.05,
                                            "entropy_coef": 0.01}, "learner": _OPTIM, "truncated": True,
                                   "stale": True, "lr_scale": 0.5},
    "dppo_kl_is_weights": {"algo": {"name": "dppo_kl", "clip_low": 0.05, "clip_high": 0.05, "clip_c": 1e4},
                           "learner": _OPTIM, "is_weights": True, "stale": True},
    "gpg_two_epochs": {"algo": {"name": "gpg"}, "advantages": True,
                       "learner": {**_OPTIM, "epochs": 2, "mini_batch_prompts": 2, "micro_batch_prompts": 1}},
    # a budget of one row (<= 14 tokens): every group trains a few rows at a time (learner.split_groups=auto; the
    # torch learner's split equals its whole-group update: tests/test_long_groups.py)
    "pacs_split_groups": {"algo": {"name": "pacs", "entropy_coef": 0.01}, "stale": True,
                          "learner": {**_OPTIM, "max_tokens_per_micro_batch": 15}},
    # the same in one pass (a sum over rows once GRPO's advantages of the whole groups are known: long_groups.py)
    "grpo_split_groups": {"algo": {"name": "grpo", "entropy_coef": 0.01}, "stale": True,
                          "learner": {**_OPTIM, "max_tokens_per_micro_batch": 15}},
    # PPO: the value head (replicated; learner.critic_lr; GAE from its values), two mini-batches
    "ppo_value_head": {"algo": {"name": "ppo"}, "stale": True, "learner": {**_OPTIM, "critic_lr": 0.05}},
    # ... with the sharded optimiser (ZeRO-1 over DP=2 at TP=1: the value head's group sharded too)
    "ppo_sharded_optimizer": {"algo": {"name": "ppo"}, "stale": True,
                              "learner": {**_OPTIM, "critic_lr": 0.05, "distributed_optimizer": True}},
    # Qwen3 (its query / key norms, summed over the TP ranks' heads; at TP=2 with sequence parallelism)
    "pacs_qwen3": {"algo": {"name": "pacs", "entropy_coef": 0.01}, "model": "qwen3", "stale": True,
                   "learner": _OPTIM},
}


def prepare_megatron_inputs(wd: Path) -> None:
    """The worker's models and ``inputs.pt`` in ``wd`` (tests/megatron_launch.py: once per session)."""
    from pacs_fast.data.tiny import make_tiny_model

    seed = draw_seed()
    (wd / "seed.txt").write_text(str(seed))
    gen = torch.Generator().manual_seed(seed)
    models = {"tied": str(make_tiny_model(wd / "tied", seed=seed % 1000)),
              "untied": str(make_tiny_model(wd / "untied", seed=seed % 1000 + 1, tie_word_embeddings=False)),
              "odd_vocab": _odd_vocab_model(wd / "odd_vocab", seed),
              "llama": _llama_model(wd / "llama", seed),
              "qwen3": _qwen3_model(wd / "qwen3", seed),
              "llama31": _llama31_model(wd / "llama31", seed)}
    _llama31_model(wd / "llama31_unscaled", seed, rope_scaling=None)  # (the same weights without the scaling)
    B, T = 2 * G, 14
    ids, am, rm = _padded_batch(gen, B, T, left_pad=True)
    # the tiny models' pad id (0) as a real token in half the rows: Hugging Face's embedding gives its row no
    # gradient from those lookups (padding_idx), and megatron's must not either (the sweep of 2026-11-28 found
    # grad_norm 7.31 torch vs 8.39 megatron); llama has no pad id: 0 is an ordinary token there
    for b in range(0, B, 2):
        real = am[b].nonzero().flatten()
        ids[b, real[len(real) // 2]] = 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])[torch.randperm(B, generator=gen)]
    # the learner batch: 4 groups, right-padded (RolloutBatch convention)
    lids, lam, lrm = _padded_batch(gen, 4 * G, T, left_pad=False)
    lrew = (torch.rand(4 * G, generator=gen) < 0.5).float()
    learner = {
        "model": models["untied"], "temperature": 0.9, "horizon": T, "seed": seed % 997,
        "algo": {"name": "pacs", "beta": 1.0, "score": "rloo", "weight": "question", "proxy": "logratio"},
        # Adam's eps is large on purpose: with eps=1e-8 an element whose gradient is ~0 (a sum that
        # cancels) turns float-reassociation noise into an update of up to 2*lr, and a second step
        # amplifies that; eps=1e-3 bounds the amplification at lr/eps=3 while steps stay large.
        "learner": {"lr": 3e-3, "eps": 1e-3, "grad_clip": 0.5, "mini_batch_prompts": 2,
                    "micro_batch_prompts": 1, "weight_decay": 0.01, "logprob_backend": "torch"},
        "batch": {"input_ids": lids, "attention_mask": lam, "response_mask": lrm, "rewards": lrew,
                  "group_size": G},
    }
    truncated = torch.zeros(4 * G, dtype=torch.bool)
    truncated[[1, 6, 11]] = True
    baselines = {**{k: learner[k] for k in ("model", "temperature", "horizon", "seed", "batch")}, "models": models,
                 "cases": BASELINE_CASES, "noise": 0.3 * torch.randn(4 * G, T, generator=gen),
                 "is_weights": 0.5 + torch.rand(4 * G, T, generator=gen), "truncated": truncated}
    inputs = dict(models=models, variants=list(models), input_ids=ids, attention_mask=am,
                  response_mask=rm, rewards=rewards, logp_ref=-5 * torch.rand(B, T, generator=gen) * rm,
                  group_size=G, learner=learner, baselines=baselines)
    torch.save(inputs, wd / "inputs.pt")


@pytest.fixture(scope="module")
def run(request, tmp_path_factory):
    """(inputs, results, folder) of tests/megatron_worker.py, from the session's megatron launch."""
    wd = megatron_folder(request, tmp_path_factory, "test_megatron_tp.py")
    return torch.load(wd / "inputs.pt"), torch.load(wd / "results.pt"), wd


def _hf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _hf_logp(model, ids, am, temperature=1.0):
    """Reference per-token log-probs [B, T] (0 at the first valid token and padding)."""
    pos = (am.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits.float() / temperature
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.cat([lp.new_zeros(ids.shape[0], 1), lp * (am[:, 1:] * am[:, :-1])], 1)


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), (sorted(set(a) ^ set(b)))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("variant", ["tied", "untied", "odd_vocab", "llama", "qwen3", "llama31"])
def test_logp_loss_grads_match_hf_and_tp1(run, variant):
    from pacs_fast.algorithms import pacs_loss

    inputs, res, _ = run
    model = _hf(inputs["models"][variant])
    logp = _hf_logp(model, inputs["input_ids"], inputs["attention_mask"])
    loss = pacs_loss(logp, inputs["logp_ref"], inputs["response_mask"], inputs["rewards"], group_size=G)
    loss.backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    if model.config.tie_word_embeddings:
        grads.pop("lm_head.weight", None)
    tp1, tp2 = res[f"parity/tp1/{variant}"], res[f"parity/tp2/{variant}"]
    for r in (tp1, tp2):
        assert float((r["logp"] - logp.detach()).abs().max()) < TOL
        assert abs(float(r["loss"]) - float(loss.detach())) < TOL
        assert _max_diff(r["grads"], grads) < TOL
    # TP=2 vs TP=1: the same up to float reassociation
    assert float((tp1["logp"] - tp2["logp"]).abs().max()) < 1e-5
    assert _max_diff(tp1["grads"], tp2["grads"]) < 1e-5
    # the check can fail: gradients are not trivially zero
    assert max(float(g.abs().max()) for g in grads.values()) > 1e-3


@pytest.fixture(scope="module")
def torch_step(run):
    """The PyTorch learner's step on the same model, batch, config and seed."""
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.torch_learner import TorchLearner

    spec = run[0]["learner"]
    out = {}
    for tp, ref in ((2, "fixed"), (1, "rollout")):
        model = _hf(spec["model"])
        learner = TorchLearner(model, algo=AlgoConfig(**spec["algo"], ref=ref),
                               learner=LearnerConfig(**spec["learner"]), temperature=spec["temperature"],
                               horizon=spec["horizon"])
        batch = RolloutBatch(**spec["batch"])
        old = learner.compute_logprobs(batch)
        batch.old_logp = old
        batch.ref_logp = learner.compute_logprobs(batch, reference=True) if ref == "fixed" else old
        metrics = learner.update(batch, seed=spec["seed"])
        out[tp] = {"old_logp": old, "metrics": metrics, "terms": learner.last_terms,
                   "weights": dict(learner.export_hf_weights()), "optimizer": learner.optimizer,
                   "model": model}
    return out


@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "tp1_dp2"])
def test_update_equals_torch_learner(run, torch_step, tp):
    _, res, _ = run
    got, ref = res[f"learner/tp{tp}"], torch_step[tp]
    assert float((got["old_logp"] - ref["old_logp"]).abs().max()) < TOL
    assert got["metrics"]["optimizer_steps"] == ref["metrics"]["optimizer_steps"] == 2
    for k in ("loss", "grad_norm"):
        assert abs(got["metrics"][k] - ref["metrics"][k]) < 1e-4 * max(1.0, abs(ref["metrics"][k]))
    assert set(got["terms"]) == set(ref["terms"])
    for k in ref["terms"]:
        assert float((got["terms"][k] - ref["terms"][k]).abs().max()) < 1e-4
    initial = dict(_hf(run[0]["learner"]["model"]).named_parameters())
    moved = _max_diff(ref["weights"], {k: initial[k].detach() for k in ref["weights"]})
    assert moved > 1e-4  # the step did something
    assert _max_diff(got["weights"], ref["weights"]) < 1e-5
    # optimiser moments (gathered to HF names) equal torch AdamW's
    names = dict(ref["model"].named_parameters())
    exp_avg = {n: ref["optimizer"].state[p]["exp_avg"] for n, p in names.items()}
    assert _max_diff(got["exp_avg"], exp_avg) < 1e-6
    assert got["state_roundtrip"] == 0.0


def _case_model(spec: dict, case: dict) -> str:
    return spec["models"][case["model"]] if "model" in case else spec["model"]


@pytest.fixture(scope="module")
def torch_baselines(run):
    """The torch learner's :func:`megatron_worker.baseline_step` of each baseline case."""
    from megatron_worker import baseline_step

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.torch_learner import TorchLearner

    spec = run[0]["baselines"]
    return {name: baseline_step(TorchLearner(_hf(_case_model(spec, case)), algo=AlgoConfig(**case["algo"]),
                                             learner=LearnerConfig(**case["learner"]), temperature=spec["temperature"],
                                             horizon=spec["horizon"]), spec, case)
            for name, case in spec["cases"].items()}


@pytest.mark.parametrize("case", sorted(BASELINE_CASES))
@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "tp1_dp2"])
def test_baselines_train_as_in_the_torch_learner(run, torch_baselines, tp, case):
    """Every metric and the updated weights: fp32, observed <= 2e-6 relative on the metrics and 1.2e-7 on the
    weights (parity audit); the bounds are the update test's (1e-4 relative, 1e-5 absolute), a hundred times the
    float noise and ten times below the step's own change (> 1e-4, asserted)."""
    _, res, _ = run
    got, ref = res[f"baselines/tp{tp}/{case}"], torch_baselines[case]
    assert float((got["old_logp"] - ref["old_logp"]).abs().max()) < TOL
    names = {k for k in ref["metrics"] if not k.startswith("forward/")}  # (which forward ran: the learners differ)
    assert names == {k for k in got["metrics"] if not k.startswith("forward/")}
    for k in names:
        assert abs(got["metrics"][k] - ref["metrics"][k]) < 1e-4 * max(1.0, abs(ref["metrics"][k])), k
    assert (got["metrics"].get("split_groups", 0) > 0) == case.endswith("split_groups")
    initial = dict(_hf(_case_model(run[0]["baselines"], BASELINE_CASES[case])).named_parameters())
    assert _max_diff(ref["weights"], {k: initial[k].detach() for k in ref["weights"]}) > 1e-4  # the step did something
    assert _max_diff(got["weights"], ref["weights"]) < 1e-5
    if "values_after" in ref:  # PPO's value head: the same step (its values moved off their initial zeros)
        assert float(ref["values_after"].abs().max()) > 1e-3
        assert float((got["values_after"] - ref["values_after"]).abs().max()) < 1e-5


def test_checkpoint_resumes_under_another_tp_size(run):
    _, res, _ = run
    tp2 = res["learner/tp2"]
    assert _max_diff(res["learner/tp1"]["resharded_exp_avg_sq"], tp2["exp_avg_sq"]) == 0.0


def test_reference_model_and_reset(run, torch_step):
    _, res, _ = run
    got = res["learner/tp2"]
    # The same weights in another module: the CPU GEMM may block them differently at other addresses, a
    # few float32 ulps of log-probs up to ~6 in size (ulp 4.8e-7; 1.43e-6 seen once): 1e-5 (~20 ulps),
    # ten times below the update's own change (> 1e-4, asserted below).
    same = 1e-5
    # the fixed reference still gives the initial policy's log-probs after the update ...
    assert float((got["ref_after_update"] - got["old_logp"]).abs().max()) < same
    # ... and the updated policy after a reset
    assert float((got["policy_after_update"] - got["old_logp"]).abs().max()) > 1e-4
    assert float((got["ref_after_reset"] - got["policy_after_update"]).abs().max()) < same


def test_ranks_with_different_batches_raise(run):
    _, res, _ = run
    assert "different batches" in (res["learner/tp2"]["divergence_error"] or "")


def test_a_full_disk_on_the_writer_fails_every_rank(run):
    """A full disk on rank 0 while writing the learner state or the weights: both ranks raise, rank 1 with rank 0's
    message (before, the writer raised alone and the other rank waited forever in its next collective)."""
    _, res, _ = run
    zero, one = res["learner/tp2"]["full_disk"]
    assert sum(f.endswith(".safetensors") for f in zero["files"]) > 1  # the small buckets are several files
    assert "unexpected pos" in zero["state"] and zero["state"].startswith("save_state: writing"), zero
    assert "No space left on device" in zero["weights"] and zero["weights"].startswith("save_hf: writing"), zero
    assert one["state"] == f"rank 0: {zero['state']}" and one["weights"] == f"rank 0: {zero['weights']}", one


def test_exported_folder_loads_in_transformers(run):
    inputs, res, wd = run
    spec = inputs["learner"]
    model = _hf(wd / "hf_tp2")
    trained = _hf(spec["model"])
    trained.load_state_dict(res["learner/tp2"]["weights"], strict=True)
    b = spec["batch"]
    with torch.no_grad():
        a = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
        e = trained(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    assert torch.equal(a, e)
    # and the folder is the trained policy, not the initial one
    initial = _hf(spec["model"])
    with torch.no_grad():
        i = initial(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
    assert float((a - i).abs().max()) > 1e-4


SP_CASES = [f"{model}/{batch}/{layout}" for model in ("tied", "qwen3") for batch in ("as_drawn", "longest_cut",
                                                                                     "one_cut")
            for layout in ("off-auto", "on-varlen", "on-dense")]


@pytest.mark.parametrize("case", SP_CASES)
def test_sequence_parallel_equals_tensor_parallel_alone(run, case):
    """learner.sequence_parallel at TP=2 (tests/megatron_worker.py sequence_parallel): the same log-probs,
    entropies and gradients as TP=2 without it, padded rows, THD and the dense mask. Bounds: fp32 on the tiny
    model; with two ranks the forward's reduce-scatter adds the same two partial sums as the all-reduce did, so the
    values agree to the last bit or nearly; the norms' gradients are sums over the tokens taken in two parts
    (observed ~1e-7 of their size)."""
    r = run[1][f"sp/{case}"]
    off, on = r[False], r[True]
    # two layers' two norms and the final one (Qwen3: and each layer's query and key norms)
    assert r["norms"] == 2 * 2 + 1 + (2 * 2 if case.startswith("qwen3") else 0)
    for k in ("logp", "entropy"):
        assert float((on[k] - off[k]).abs().max()) < 1e-6, k
    scale = max(float(g.abs().max()) for g in off["grads"].values())
    assert _max_diff(on["grads"], off["grads"]) < 1e-5 * scale
    # what the check can see: without the norms' sum over the ranks their gradients are each rank's tokens' only
    unreduced = max(float((r["unreduced"][k] - off["grads"][k]).abs().max()) for k in off["grads"] if "norm" in k)
    assert unreduced > 1e-3 * scale


def test_sequence_parallel_pads_both_parities(run):
    """The batches above cover an odd and an even token count of the packed THD row and an odd and an even width
    of the padded rows (width - 1 columns run), so the padding to a multiple of tp = 2 ran and was not needed."""
    res = run[1]
    tokens = {res[f"sp/tied/{b}/off-auto"]["tokens"] % 2 for b in ("as_drawn", "longest_cut", "one_cut")}
    widths = {(res[f"sp/tied/{b}/off-auto"]["width"] - 1) % 2 for b in ("as_drawn", "longest_cut", "one_cut")}
    assert tokens == {0, 1} and widths == {0, 1}, (tokens, widths)


def test_sequence_parallel_learner_update(run):
    """A bf16 PACS update (fp32 masters) at TP=2 with and without sequence parallelism: the norms' fp32 masters
    get their gradient summed over the ranks. Adam's eps = 1 makes each step proportional to its gradient, so a
    norm trained on one rank's tokens only (half its gradient) would move ~50% off; bf16 rounds each rank's part
    of a norm's gradient before the sum (2^-8 of it), hence 2% of the largest step of each tensor."""
    res = run[1]
    off, on = res["sp/learner/False"], res["sp/learner/True"]
    assert sum(on["is_norm"]) == 5 and not any(off["is_norm"])
    assert all(d == torch.float32 for d in on["masters"])
    assert abs(on["metrics"]["loss"] - off["metrics"]["loss"]) < 1e-3 * max(abs(off["metrics"]["loss"]), 1e-3)
    for i, (a, b) in enumerate(zip(on["delta"], off["delta"])):
        big = float(b.abs().max())
        assert big > 0, i  # every tensor moved
        assert float((a - b).abs().max()) <= 0.02 * big, (i, on["is_norm"][i])


def test_llama3_rope_is_seen(run):
    """The llama31 variant's parity (above, 2e-5) can see its RoPE scaling: the same weights without it give
    log-probs 1e-4 or more away (3.4e-4 observed), and megatron's are the scaled model's."""
    inputs, res, wd = run
    args = inputs["input_ids"], inputs["attention_mask"]
    with torch.no_grad():
        scaled = _hf_logp(_hf(inputs["models"]["llama31"]), *args)
        unscaled = _hf_logp(_hf(str(wd / "llama31_unscaled")), *args)
    assert float((scaled - unscaled).abs().max()) > 1e-4
    assert float((res["parity/tp2/llama31"]["logp"] - scaled).abs().max()) < TOL
