"""Settings that run but train badly are named at the start of a run (``pacs_fast/config/hazards.py``).

The warning must be true: the grpo score's gradient at equal proxies (every step's first mini-batch, the
policy equal to its reference) is checked to be ~1e6 times rloo's on the same batch, and a run prints it."""
import re

import pytest
import torch

import pacs_fast as pf
from pacs_fast.config import hazard_warnings, load_config


@pytest.mark.parametrize("overrides,warned", [
    (["algo.score=grpo"], True),
    (["algo.score=grpo", "algo.ref=fixed", "algo.reset_every=5"], True),
    ([], False),  # rloo
    (["algo.score=dr_grpo"], False),
    (["algo.score=grpo", "algo.proxy=mean_logp"], False),  # not a log ratio: no step starts at equal proxies
    (["algo.name=grpo"], False),  # the baseline's advantages normalise rewards, which carry no gradient
])
def test_the_grpo_score_is_named_where_it_applies(overrides, warned):
    lines = hazard_warnings(load_config(None, overrides))
    assert bool(lines) == warned
    if warned:
        assert len(lines) == 1 and lines[0].startswith("algo.score=grpo ") and "algo.score=rloo" in lines[0]
        # every key it names exists (it once sent users to train.grad_clip, which the CLI refuses)
        from pacs_fast.config import all_keys
        named = set(re.findall(r"\b([a-z]+\.[a-z_0-9]+)\b", lines[0]))
        assert "learner.grad_clip" in named and named <= set(all_keys()), named - set(all_keys())


def test_what_it_says_holds():
    """At equal proxies (logp == logp_ref) the grpo score's gradient is (delta - 1/G) / 1e-6."""
    gen = torch.Generator().manual_seed(0)
    ref = -torch.rand(8, 6, generator=gen, dtype=torch.float64)
    rewards = torch.tensor([1.0, 0, 0, 1, 0, 1, 1, 1], dtype=torch.float64)
    grads = {}
    for score in ("rloo", "grpo"):
        logp = ref.clone().requires_grad_()
        pf.pacs_loss(logp, ref, None, rewards, group_size=4, score=score).backward()
        grads[score] = logp.grad.abs().max().item()
    assert grads["grpo"] > 1e5 * grads["rloo"] > 0, grads


def test_a_run_prints_it_once(tmp_path, capsys, warm_cache):
    from pacs_fast.train import main

    main(["algo.score=grpo", "train.steps=1", "train.prompts_per_step=2", "rollout.n=2",
          "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2", "warmup.steps=0", "data.eval_size=4",
          "rollout.eval_n=1", "train.eval_every=0", "rollout.max_new_tokens=4", f"train.out_dir={tmp_path}",
          "train.run_name=r", f"warmup.cache_dir={warm_cache}", "train.progress=false", "train.plots=false",
          "train.tensorboard=false", "model.tiny_hidden_size=64", "model.tiny_num_layers=1"])
    out = capsys.readouterr()
    assert (out.out + out.err).count("warning: algo.score=grpo divides by the std") == 1, (out.out + out.err)[-2000:]


@pytest.mark.parametrize("overrides,warned", [
    (["algo.name=gspo", "algo.clip_high=0.28"], True),  # a DAPO config's clip_high, GSPO's default clip_low 3e-4
    (["algo.name=gspo", "algo.clip_low=0.2"], True),
    (["algo.name=gspo"], False),
    (["algo.name=gspo", "algo.clip_low=0.2", "algo.clip_high=0.28"], False),  # odd for GSPO, but of one scale
    (["algo.name=grpo", "algo.clip_high=0.28"], False),
])
def test_a_lopsided_gspo_clip_range_is_named(overrides, warned):
    lines = hazard_warnings(load_config(None, overrides))
    assert bool(lines) == warned, lines
    if warned:
        assert lines[0].startswith("algo.clip_low=") and "with algo.name=gspo" in lines[0]


@pytest.mark.parametrize("per_step,mini,warned", [
    (37, None, True),   # a mini-batch of 1: 37 optimiser steps per rollout batch, silently (a sweep of 2026-11-29)
    (70, None, True),   # 14: 5 steps
    (64, None, False),  # 32: 2 steps
    (160, None, False),  # 32: 5 steps of the default size, as asked
    (37, 37, False),
])
def test_many_optimiser_steps_from_a_small_mini_batch_are_named(per_step, mini, warned):
    overrides = [f"train.prompts_per_step={per_step}"] + ([f"learner.mini_batch_prompts={mini}"] if mini else [])
    lines = [line for line in hazard_warnings(load_config(None, overrides)) if "optimiser steps" in line]
    assert bool(lines) == warned, lines
    if warned:
        assert lines[0].startswith("learner.mini_batch_prompts=") and f"e.g. {per_step} for one step" in lines[0]


@pytest.mark.parametrize("overrides,warned", [
    (["model.dtype=bfloat16", "learner.lr=1e-6", "learner.master_weights=false"], True),  # the PACS recipe's lr
    (["model.dtype=bfloat16", "learner.lr=1e-5", "learner.backend=megatron", "learner.master_weights=false"], True),
    (["model.dtype=bfloat16", "learner.lr=1e-6"], False),  # fp32 master weights (the default)
    (["model.dtype=bfloat16", "learner.lr=1e-6", "learner.backend=megatron"], False),
    (["model.dtype=bfloat16", "learner.master_weights=false"], False),  # the default learner.lr, 1e-4
    ([], False),  # float32
])
def test_pure_bf16_training_at_a_small_learning_rate_is_named(overrides, warned):
    lines = [x for x in hazard_warnings(load_config(None, overrides)) if x.startswith("model.dtype=bfloat16 ")]
    assert bool(lines) == warned
    if warned:
        from pacs_fast.config import all_keys
        named = set(re.findall(r"\b([a-z]+\.[a-z_0-9]+)\b", lines[0]))
        assert {"learner.lr", "model.dtype"} <= named <= set(all_keys()), named


def test_a_bf16_adamw_step_at_lr_1e6_leaves_most_weights_unchanged():
    """What the bf16 warning says: AdamW on bf16 weights ~ N(0, 0.02) at lr 1e-6 moves few of them (its step is
    ~lr, under half a bf16 step of most weights); the same steps on fp32 weights move all of them."""
    gen = torch.Generator().manual_seed(0)
    w32 = torch.randn(20000, generator=gen) * 0.02
    moved = {}
    for dtype in (torch.bfloat16, torch.float32):
        w = w32.to(dtype).requires_grad_(True)
        w0 = w.detach().clone()
        opt = torch.optim.AdamW([w], lr=1e-6, weight_decay=0.0)
        for _ in range(10):
            w.grad = torch.randn(20000, generator=gen).to(dtype)
            opt.step()
        moved[dtype] = float((w.detach() != w0).float().mean())
    assert moved[torch.bfloat16] < 0.05 and moved[torch.float32] > 0.99, moved


@pytest.mark.parametrize("overrides,start", [
    (["algo.name=gspo", "algo.loss_agg=token-mean"], "algo.loss_agg=token-mean with algo.name=gspo"),
    (["algo.name=gspo", "algo.loss_agg=token-sum"], "algo.loss_agg=token-sum with algo.name=gspo"),
    (["algo.name=gspo", "algo.loss_agg=seq-mean-token-sum"], None),  # LUSPO (the README's recipe, the luspo preset)
    (["algo.name=gspo", "algo.loss_agg=seq-mean-token-sum-norm"],
     "algo.loss_agg=seq-mean-token-sum-norm with algo.name=gspo"),
    (["algo.name=gspo"], None),  # auto: seq-mean-token-mean
    (["algo.name=gspo", "algo.loss_agg=seq-mean-token-mean"], None),
    (["algo.name=grpo", "algo.loss_agg=token-mean"], None),
    (["algo.name=dr_grpo", "algo.loss_agg=seq-mean-token-mean"], "algo.loss_agg=seq-mean-token-mean with algo.name=dr_grpo"),
    (["algo.name=dr_grpo"], None),  # auto: seq-mean-token-sum-norm
    (["algo.name=dr_grpo", "algo.loss_agg=token-sum-norm"], None),
    (["algo.name=ppo", "rollout.filter_groups=true"], "rollout.filter_groups=true with algo.name=ppo"),
    (["algo.name=grpo", "rollout.filter_groups=true"], None),  # DAPO's own use
    (["rollout.filter_groups=true"], None),  # PACS (README: its weights of one-label groups)
])
def test_an_aggregation_or_filter_that_undoes_its_algorithm_is_named(overrides, start):
    """(A recipe review of 2026-11-30: these ran without a word; TRL warns of GSPO with token-level aggregation.)"""
    lines = hazard_warnings(load_config(None, overrides))
    if start is None:
        assert lines == []
    else:
        assert len(lines) == 1 and lines[0].startswith(start), lines
        from pacs_fast.config import all_keys
        named = set(re.findall(r"\b([a-z]+\.[a-z_0-9]+)\b", lines[0]))
        assert named <= set(all_keys()), named - set(all_keys())


def test_the_code_reward_with_the_math_instruction_is_named():
    """The paper's instruction asks for a boxed answer; the code reward reads a fenced code block: every response
    would score 0 without a word."""
    lines = hazard_warnings(load_config(None, ["reward.fn=pacs_fast.reward.code_tests:pass_all"]))
    assert len(lines) == 1 and "data.instruction=pacs (the default)" in lines[0] and "```python" in lines[0], lines
    assert hazard_warnings(load_config(None, ["reward.fn=pacs_fast.reward.code_tests:pass_fraction",
                                              "data.instruction=Answer with a Python program in a code block."])) == []
