"""Settings that have no effect in a run are named in a warning (``pacs_fast/config/unused.py``).

The warnings must be true: every algorithm key they call idle is changed and the training objective
(loss and gradient, float64) must not move by a single bit; keys they do not flag must move it
(so the check could fail). The run prints them once, on the main process.
"""
from pathlib import Path

import pytest
import torch

from pacs_fast.config import AlgoConfig, Config, load_config
from pacs_fast.config.unused import unused_settings
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.objective import minibatch_counts, objective

# a value other than the default for every key of the algo section the objective could read
CHANGED = {"beta": 0.5, "proxy": "mean_logp", "score": "naive", "weight": "none", "clip_low": 0.1,
           "clip_high": 0.28, "clip_c": 0.0, "kl_coef": 0.05, "vf_coef": 1.0, "value_clip": 0.0,
           "loss_agg": "token-sum", "noise_rho0": 0.1, "noise_rho1": 0.2, "lam": 0.9}
# the keys each algorithm's objective reads (checked to move it): the complement must be flagged
READ = {"pacs": {"beta", "proxy", "score", "weight"},
        "grpo": {"clip_low", "clip_high", "clip_c", "kl_coef", "loss_agg"},
        "ppo": {"clip_low", "clip_high", "clip_c", "kl_coef", "loss_agg", "vf_coef", "value_clip"}}
READ["rloo"] = READ["dr_grpo"] = READ["grpo"]


def _batch(gen, ppo: bool, B=8, T=9, G=4):
    mask = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        start = int(torch.randint(0, 3, (), generator=gen))
        mask[b, start:start + int(torch.randint(2, T - start + 1, (), generator=gen))] = 1
    batch = RolloutBatch(torch.randint(3, 50, (B, T), generator=gen), torch.ones(B, T, dtype=torch.long), mask,
                         torch.tensor([1., 0, 0, 0, 0, 1, 1, 0], dtype=torch.float64), group_size=G)
    batch.old_logp = (-3 * torch.rand(B, T, generator=gen, dtype=torch.float64)) * mask
    batch.ref_logp = batch.old_logp - 0.3 * torch.rand(B, T, generator=gen, dtype=torch.float64) * mask
    if ppo:
        batch.advantages = torch.randn(B, T, generator=gen, dtype=torch.float64) * mask
        batch.old_values = torch.randn(B, T, generator=gen, dtype=torch.float64) * mask
        batch.returns = torch.randn(B, T, generator=gen, dtype=torch.float64) * mask
    return batch


def _objective(algo, batch, logp0, values0):
    logp = logp0.clone().requires_grad_(True)
    values = None if values0 is None else values0.clone().requires_grad_(True)
    loss, _ = objective(algo, batch, logp, None, values, minibatch_counts(batch), horizon=9)
    loss.backward()
    return [loss.detach(), logp.grad] + ([] if values is None else [values.grad])


@pytest.mark.parametrize("name", ["pacs", "grpo", "rloo", "dr_grpo", "ppo"])
def test_flagged_algorithm_keys_leave_the_objective_unchanged(seed, name):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen, ppo=name == "ppo")
    mask = batch.response_mask
    logp0 = batch.old_logp + 0.6 * torch.randn(mask.shape, generator=gen, dtype=torch.float64) * mask
    logp0[1] = batch.old_logp[1] + 1.5 * mask[1]  # ratio e^1.5 > clip_c = 3 on a row with reward 0: the dual clip binds
    # the ratio clips bind whatever the draw (a draw with no ratio past 1.2 on a positive advantage left
    # clip_high=0.28 idle, CI seed 204539824): e^0.3 = 1.35 > 1 + 0.28 on row 0 (reward 1, advantage > 0),
    # e^-0.3 = 0.74 < 1 - 0.2 on row 2 (reward 0 in the same group, advantage < 0)
    logp0[0] = batch.old_logp[0] + 0.3 * mask[0]
    logp0[2] = batch.old_logp[2] - 0.3 * mask[2]
    if name == "ppo":
        batch.advantages[1] = -batch.advantages[1].abs()
        batch.advantages[0] = batch.advantages[0].abs()
        batch.advantages[2] = -batch.advantages[2].abs()
    values0 = batch.old_values + 0.5 * torch.randn(mask.shape, generator=gen, dtype=torch.float64) * mask \
        if name == "ppo" else None
    base = _objective(AlgoConfig(name=name), batch, logp0, values0)
    for key, value in CHANGED.items():
        cfg = Config(algo=AlgoConfig(name=name, **{key: value}))
        flagged = any(line.startswith(f"algo.{key}=") for line in unused_settings(cfg))
        # lam is PPO's GAE (pacs_fast/trainer/step.py), never the objective's
        assert flagged == (key not in READ[name] and not (key == "lam" and name == "ppo")), (name, key)
        changed = _objective(cfg.algo, batch, logp0, values0)
        same = all(torch.equal(a, b) for a, b in zip(base, changed))
        assert same == (flagged or key == "lam"), (name, key, value, "flagged" if flagged else "not flagged")


def test_defaults_and_shipped_configs_set_nothing_idle():
    """Every shipped config as it is; the algorithm-neutral ones (the PACS recipes, the CPU presets) under every
    algorithm too. A baseline's recipe (GRPO's, DAPO's) sets its algorithm's own clips and aggregation: under PACS
    those would be idle, as they should."""
    assert unused_settings(Config()) == []
    configs = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
    assert len(configs) >= 6
    for path in configs:
        assert unused_settings(load_config(str(path))) == [], path.name
    neutral = [path for path in configs if load_config(str(path)).algo.name == "pacs"]
    assert len(neutral) >= 4
    for name in ("pacs", "grpo", "rloo", "dr_grpo", "ppo"):
        assert unused_settings(load_config(None, [f"algo.name={name}"])) == []
        for path in neutral:
            assert unused_settings(load_config(str(path), [f"algo.name={name}"])) == [], (path.name, name)


@pytest.mark.parametrize("overrides,expected", [
    (["algo.name=grpo", "algo.score=naive"], ["algo.score=naive has no effect with algo.name=grpo"]),
    (["algo.clip_high=0.28", "algo.kl_coef=0.01"], ["algo.clip_high=0.28 has no effect with algo.name=pacs",
                                                    "algo.kl_coef=0.01 has no effect with algo.name=pacs"]),
    (["algo.name=grpo", "algo.clip_high=0.28"], []),
    (["algo.name=rloo", "algo.gamma=0.9"], ["algo.gamma=0.9 has no effect with algo.name=rloo"]),
    (["algo.name=rloo", "algo.gamma=0.9", "reward.step_rewards=m:f", "algo.credit=sum"], []),
    (["algo.name=rloo", "algo.gamma=0.9", "reward.step_rewards=m:f"], ["algo.gamma=0.9 has no effect"]),
    (["algo.name=grpo", "algo.credit=sum"], ["algo.credit=sum has no effect without reward.step_rewards"]),
    (["algo.reset_optimizer=false"], ["algo.reset_optimizer=false has no effect with algo.reset_every=0"]),
    (["algo.ref=fixed", "algo.reset_every=5", "algo.reset_optimizer=false"], []),
    (["algo.loss_agg=token-sum"], ["algo.loss_agg=token-sum has no effect with algo.name=pacs and "
                                   "algo.entropy_coef=0"]),
    (["algo.loss_agg=token-sum", "algo.entropy_coef=0.01"], []),
    (["correction.is_cap=3"], ["correction.is_cap=3.0 has no effect with correction.is_level resolving to none"]),
    (["correction.is_level=sequence", "correction.is_cap=3"], []),
    (["algo.name=ppo", "correction.is_level=token", "correction.fused=false"],
     ["correction.fused=false has no effect with algo.name=ppo"]),
    (["algo.name=grpo", "correction.is_level=token", "correction.fused=false"], []),
    (["correction.rs_high=3"], ["correction.rs_high=3.0 has no effect with correction.rs_level=none"]),
    (["rollout.gpu_memory_utilization=0.2"], ["rollout.gpu_memory_utilization=0.2 has no effect with "
                                              "rollout.engine=hf"]),
    (["rollout.engine=vllm", "rollout.gpu_memory_utilization=0.2"], []),
    (["rollout.eval_temperature=0", "rollout.eval_top_p=0.9", "rollout.eval_n=8"],
     ["rollout.eval_top_p=0.9 has no effect with rollout.eval_temperature=0",
      "rollout.eval_n=8 has no effect with rollout.eval_temperature=0"]),
    (["rollout.eval_n=8"], []),
    (["rollout.eval_temperature=0", "rollout.eval_top_k=20", "rollout.eval_min_p=0.05"],
     ["rollout.eval_top_k=20 has no effect with rollout.eval_temperature=0",
      "rollout.eval_min_p=0.05 has no effect with rollout.eval_temperature=0"]),
    (["rollout.eval_top_k=20", "rollout.eval_min_p=0.05", "rollout.top_k=20", "rollout.min_p=0.05"], []),
    (["learner.backend=megatron", "learner.shared_prefix=false"], ["learner.shared_prefix=false has no effect"]),
    (["learner.packing=off", "learner.packed_attention=varlen"],
     ["learner.packed_attention=varlen has no effect with learner.packing=off"]),
    (["learner.packing=on", "learner.packed_attention=varlen"], []),
    (["learner.split_groups=off"],
     ["learner.split_groups=off has no effect without learner.max_tokens_per_micro_batch"]),
    (["learner.split_groups=off", "learner.max_tokens_per_micro_batch=1000"], []),
    (["data.eval_dataset=math500"], ["data.eval_dataset=math500 has no effect with data.dataset=arithmetic"]),
    # found by a sweep of every key (2026-11-29): each value below changed nothing, silently
    (["reward.appeal=m:f", "reward.fn_rate=appeal"], ["reward.fn_rate=appeal has no effect with "
                                                      "algo.noise_correction=none"]),
    (["reward.appeal=m:f", "reward.fn_rate=appeal", "algo.noise_correction=backward"], []),
    (["warmup.steps=0", "warmup.lr=0.01", "warmup.seed=3"], ["warmup.lr=0.01 has no effect with warmup.steps=0"]),
    (["learner.shared_prefix=false", "model.gradient_checkpointing=true"],
     ["learner.shared_prefix=false has no effect with model.gradient_checkpointing=true"]),
    (["learner.shared_prefix=false", "learner.packing=on"],
     ["learner.shared_prefix=false has no effect with learner.packing=on"]),
    (["learner.shared_prefix=false"], []),
    (["correction.is_level=sequence", "correction.fused=false", "rollout.temperature=0.7"],
     ["correction.fused=false has no effect with rollout.temperature != 1"]),
    (["train.project=mine"], ["train.project=mine has no effect without wandb, mlflow or trackio"]),
    (["train.project=mine", "train.loggers=[mlflow]"], []),
    (["learner.backend=megatron", "rollout.engine=vllm", "model.attention=eager"],
     ["model.attention=eager has no effect with learner.backend=megatron and rollout.engine=vllm"]),
    (["learner.backend=megatron", "model.attention=eager"], []),
    (["model.attention=flash_attention_2", "learner.packed_attention=dense"],
     ["learner.packed_attention=dense has no effect with model.attention=flash_attention_2"]),
    # sweep of 2026-12-02: a buffer with a zero penalty shaped nothing, silently
    (["reward.overlong_buffer_len=4", "reward.overlong_penalty=0"],
     ["reward.overlong_buffer_len=4 has no effect with reward.overlong_penalty=0"]),
    (["reward.overlong_buffer_len=4", "reward.overlong_penalty=0.5"], []),
    (["data.dataset=math_train", "model.path=/m", "data.arith_terms=3", "warmup.steps=5"],
     ["warmup.steps=5 has no effect with model.path set", "data.arith_terms=3 has no effect with "
                                                          "data.dataset=math_train"]),
])
def test_each_rule_names_the_key_its_value_and_why(overrides, expected):
    lines = unused_settings(load_config(None, overrides))
    assert len(lines) == len(expected), lines
    for want in expected:
        assert sum(line.startswith(want) for line in lines) == 1, (want, lines)


def test_the_run_prints_them_once(tmp_path, capsys, warm_cache):
    from pacs_fast.train import main

    main(["algo.name=grpo", "algo.score=naive", "train.steps=1", "train.prompts_per_step=2", "rollout.n=2",
          "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2", "warmup.steps=0", "data.eval_size=4",
          "rollout.eval_n=1", "train.eval_every=0", "rollout.max_new_tokens=4", f"train.out_dir={tmp_path}",
          "train.run_name=r", f"warmup.cache_dir={warm_cache}", "train.progress=false", "train.plots=false",
          "train.tensorboard=false", "model.tiny_hidden_size=64", "model.tiny_num_layers=1"])
    out = capsys.readouterr()
    text = out.out + out.err
    assert text.count("warning: algo.score=naive has no effect with algo.name=grpo") == 1, text[-2000:]


@pytest.mark.parametrize("backend,dtype,idle", [("torch", "float32", False), ("torch", "bfloat16", False),
                                                ("megatron", "bfloat16", True), ("megatron", "float32", True)])
def test_model_attention_is_idle_only_for_megatron_with_vllm(backend, dtype, idle):
    """The rule sat under the float32 test for a while (review of 2026-11-29): torch + float32 + vLLM was told its
    model.attention did nothing (the torch learner uses it), megatron + bf16 + vLLM was told nothing."""
    lines = unused_settings(load_config(None, [f"learner.backend={backend}", f"model.dtype={dtype}",
                                               "rollout.engine=vllm", "model.attention=eager"]))
    assert any(x.startswith("model.attention=eager has no effect") for x in lines) == idle, lines
