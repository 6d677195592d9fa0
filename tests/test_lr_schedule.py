"""``learner.lr_schedule`` / ``learner.lr_warmup_steps`` / ``learner.min_lr_ratio``: the learning rate of each
training step (pacs_fast/learner/lr_schedule.py).

- The factor is Hugging Face's schedulers' (linear, cosine with a floor) at the step before, and the warm-up's
  step ``s`` trains at ``s / W`` (theirs gives its first step 0).
- Both learners train at the rate they are given: at 0 an update leaves every weight as it was (AdamW's decoupled
  weight decay is scaled by the rate too), PPO's value head included; megatron in one process as well.
- A run records ``learner/lr`` per step, and a resumed run uses the uninterrupted run's rates (records and
  weights equal): the rate is a function of the step.
- Settings it cannot take are one line; the floor is named unused without a decay; a warm-up longer than the
  run is a warning.
"""

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig, load_config, unused_settings, validate
from pacs_fast.config.hazards import hazard_warnings
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.lr_schedule import lr_scale

from one_process import run_python, write_learner_spec
from test_entropy_selection import _learner_batch
from test_run_safety import cache, cli  # noqa: F401  (fixture)
from test_train import TINY


@pytest.mark.parametrize("warmup", [0, 3])
@pytest.mark.parametrize("min_ratio", [0.0, 0.1])
def test_the_factor_is_hugging_faces_schedule_a_step_later(warmup, min_ratio):
    from transformers.optimization import (get_cosine_with_min_lr_schedule_with_warmup,
                                           get_linear_schedule_with_warmup)

    total = 11
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cosine = get_cosine_with_min_lr_schedule_with_warmup(opt, warmup, total, min_lr_rate=min_ratio).lr_lambdas[0]
    linear = get_linear_schedule_with_warmup(opt, warmup, total).lr_lambdas[0]
    for s in range(1, total + 1):
        want_cos = s / warmup if s <= warmup else cosine(s - 1)
        assert lr_scale(s, total=total, warmup=warmup, schedule="cosine", min_ratio=min_ratio) == \
            pytest.approx(want_cos, abs=1e-12)
        want_lin = s / warmup if s <= warmup else min_ratio + (1 - min_ratio) * linear(s - 1)
        assert lr_scale(s, total=total, warmup=warmup, schedule="linear", min_ratio=min_ratio) == \
            pytest.approx(want_lin, abs=1e-12)
        assert lr_scale(s, total=total, warmup=warmup) == (s / warmup if s <= warmup else 1.0)
    assert lr_scale(warmup + 1, total=total, warmup=warmup, schedule="cosine") == 1.0  # the peak right after
    assert lr_scale(1, total=total, warmup=warmup, schedule="linear") > 0  # no step without an update


def _torch_learner(path, name="grpo", lr=1e-2):
    from pacs_fast.learner.torch_learner import TorchLearner
    from transformers import AutoModelForCausalLM

    return TorchLearner(AutoModelForCausalLM.from_pretrained(path), algo=AlgoConfig(name=name), horizon=12,
                        learner=LearnerConfig(lr=lr, critic_lr=lr, mini_batch_prompts=4, micro_batch_prompts=2,
                                              logprob_backend="torch", weight_decay=0.1))


def _prepared(learner, spec):
    batch = RolloutBatch(**spec)
    batch.old_logp = learner.compute_logprobs(batch)
    batch.ref_logp = batch.old_logp
    if learner.value_head is not None:
        from pacs_fast.algorithms import gae
        batch.old_values = learner.compute_values(batch)
        rewards = torch.zeros_like(batch.response_mask)
        rewards[torch.arange(len(rewards)), batch.response_mask.cumsum(1).argmax(1)] = batch.rewards
        batch.advantages, batch.returns = gae(rewards, batch.old_values, batch.response_mask, gamma=1.0, lam=0.95)
    return batch


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_the_torch_learner_trains_at_the_rate_it_is_given(seed, tmp_path, name):
    from pacs_fast.data.tiny import make_tiny_model

    gen = torch.Generator().manual_seed(seed)
    spec = _learner_batch(gen)
    spec["rewards"] = torch.tensor([1.0, 0.0] * 8)  # (mixed groups: every advantage would be 0 otherwise)
    path = make_tiny_model(tmp_path / "m", seed=seed % 1000)
    learner = _torch_learner(path, name)
    params = lambda: [p.detach().clone() for p in learner._params()]  # noqa: E731
    before = params()
    assert learner.set_lr_scale(0.0) == 0.0
    learner.update(_prepared(learner, spec), seed=1)
    assert all(torch.equal(a, b) for a, b in zip(before, params()))  # (the value head's too, for ppo)
    assert learner.set_lr_scale(0.5) == pytest.approx(5e-3)
    assert [g["lr"] for g in learner.optimizer.param_groups] == [5e-3] * (2 if name == "ppo" else 1)
    learner.update(_prepared(learner, spec), seed=1)
    moved = [not torch.equal(a, b) for a, b in zip(before, params())]
    assert all(moved[-2:]) if name == "ppo" else any(moved)


MEGATRON_SCRIPT = r"""
import sys, torch
from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.megatron.learner import MegatronLearner
from pacs_fast.learner.megatron.setup import init_parallel
spec = torch.load(sys.argv[1] + "/spec.pt")
init_parallel(1, device="cpu")
learner = MegatronLearner(spec["model"], algo=AlgoConfig(name="grpo"), device="cpu", horizon=12,
                          learner=LearnerConfig(lr=1e-2, mini_batch_prompts=4, micro_batch_prompts=2,
                                                logprob_backend="torch", backend="megatron", tp_size=1))
moved = []
for scale in (0.0, 1.0):
    learner.set_lr_scale(scale)
    assert all(g["lr"] == 1e-2 * scale for g in learner.optimizer.param_groups)
    before = [p.detach().clone() for p in learner.model.parameters()]
    batch = RolloutBatch(**spec["batch"])
    batch.old_logp = learner.compute_logprobs(batch)
    batch.ref_logp = batch.old_logp
    learner.update(batch, seed=1)
    moved.append(sum(not torch.equal(a, p) for a, p in zip(before, learner.model.parameters())))
torch.save(moved, sys.argv[1] + "/moved.pt")
"""


@pytest.mark.megatron
@pytest.mark.timeout(300)
def test_megatron_trains_at_the_rate_it_is_given(seed, tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    write_learner_spec(tmp_path, seed)
    run_python(["-c", MEGATRON_SCRIPT, tmp_path])
    still, moved = torch.load(tmp_path / "moved.pt")
    assert still == 0 and moved > 0


def test_a_run_records_each_steps_rate_and_resumes_on_it(tmp_path, cache, capsys):  # noqa: F811
    from safetensors.torch import load_file

    from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

    common = TINY + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "learner.lr_schedule=cosine",
                     "learner.lr_warmup_steps=1", "learner.min_lr_ratio=0.1", "train.save_every=1",
                     "reward.fn=test_reinforce_pp:even_length", "train.tensorboard=false"]
    code, _, err = cli(common + ["train.steps=3", "train.run_name=full"], capsys)
    assert code == 0, err
    recs = [r for r in read_jsonl(tmp_path / "full" / "metrics.jsonl") if r["kind"] == "train"]
    want = [3e-3 * lr_scale(s, total=3, warmup=1, schedule="cosine", min_ratio=0.1) for s in (1, 2, 3)]
    assert [r["learner/lr"] for r in recs] == pytest.approx(want, rel=1e-12)
    assert want[0] == want[1] > want[2] > 0.1 * 3e-3  # warm-up step 1 of 1, the peak, then the decay
    code, _, err = cli(common + ["train.steps=2", "train.run_name=split"], capsys)
    assert code == 0, err
    code, _, err = cli(["--resume", str(tmp_path / "split"), "train.steps=3"], capsys)
    assert code == 0, err
    a, b = (deterministic_view(read_jsonl(tmp_path / n / "metrics.jsonl")) for n in ("full", "split"))
    assert [r for r in a if r["step"] == 3] == [r for r in b if r["step"] == 3]
    wa, wb = (load_file(str(tmp_path / n / "checkpoints" / "step_000003" / "model.safetensors"))
              for n in ("full", "split"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("overrides,message", [
    (["learner.lr_schedule=exponential"], "learner.lr_schedule must be one of constant, linear, cosine"),
    (["learner.lr_warmup_steps=-1"], "learner.lr_warmup_steps must be >= 0"),
    (["learner.lr_schedule=cosine", "learner.min_lr_ratio=1.5"], r"learner.min_lr_ratio must be in \[0, 1\]"),
])
def test_settings_it_cannot_take(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(load_config(None, overrides))


def test_the_floor_is_unused_without_a_decay_and_a_long_warm_up_warns():
    assert unused_settings(load_config(None, ["learner.min_lr_ratio=0.1"])) == [
        "learner.min_lr_ratio=0.1 has no effect with learner.lr_schedule=constant (the floor of a decay)"]
    assert unused_settings(load_config(None, ["learner.lr_schedule=linear", "learner.min_lr_ratio=0.1"])) == []
    lines = hazard_warnings(load_config(None, ["learner.lr_warmup_steps=10", "train.steps=5"]))
    assert any(line.startswith("learner.lr_warmup_steps=10 with train.steps=5: the run ends inside its warm-up")
               for line in lines), lines
    assert not hazard_warnings(load_config(None, ["learner.lr_warmup_steps=5", "train.steps=5"]))
