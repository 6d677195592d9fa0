"""``algo.reset_every`` for a baseline's KL reference (ProRL's reference reset) and ``algo.reset_mix`` (TRL's
``sync_ref_model`` soft update: reference <- mix * policy + (1 - mix) * reference), in both learners
(pacs_fast/learner/reference.py).

- ``mix_into`` is the float64 formula, rounded once into the reference's dtype (bf16 included), and refuses a
  mismatched pair before it changes anything.
- The torch learner's reference after a mixed reset is the mix of the two models it held, weight by weight;
  megatron's in one process as well; LoRA adapters refuse a mix (a mix of two adapter pairs is not a mix of
  their products).
- A GRPO run with ``algo.kl_coef`` resets its reference: the step after a hard reset has KL 0 (a run without the
  reset does not), and a run resumed after a mixed reset equals the uninterrupted one (the mixed reference is in
  the checkpoint).
- Settings it cannot take are one line naming the key; the mix and the optimiser reset are named unused without
  ``algo.reset_every``.
"""

import pytest
import torch

from pacs_fast.config import load_config, unused_settings, validate
from pacs_fast.learner.reference import mix_into

from one_process import run_python, write_learner_spec
from test_learner import fresh, make_learner, prepare, random_batch, tiny  # noqa: F401  (fixture)
from test_run_safety import cache, cli  # noqa: F401  (fixture)
from test_train import TINY


def _named(*tensors):
    return [(f"w{i}", t) for i, t in enumerate(tensors)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("mix", [1.0, 0.6, 0.01])
def test_mix_into_is_the_formula_rounded_once(seed, dtype, mix):
    gen = torch.Generator().manual_seed(seed)
    ref = [torch.randn(37, 5, generator=gen, dtype=torch.float64) * 3, torch.randn(11, generator=gen,
                                                                                     dtype=torch.float64)]
    pol = [r + torch.randn(r.shape, generator=gen, dtype=torch.float64) * 1e-2 for r in ref]
    ref_t, pol_t = [r.to(dtype) for r in ref], [p.to(dtype) for p in pol]
    want = [(mix * p.double() + (1 - mix) * r.double()) for r, p in zip(ref_t, pol_t)]
    mix_into(_named(*ref_t), _named(*pol_t), mix)
    for got, w, r, p in zip(ref_t, want, ref, pol_t):
        assert got.dtype == dtype
        if mix == 1.0:
            assert torch.equal(got, p)  # a hard reset is a copy, bit for bit
            continue
        # the lerp in float32 (float64 for float64) errs by a few ulp of its inputs' size; a bf16 reference then
        # rounds once, by at most half its ulp (eps / 2 of the result's size)
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        slack = 4 * torch.finfo(wide).eps * torch.maximum(r.abs(), p.double().abs())
        if dtype == torch.bfloat16:
            slack = slack + 0.5 * torch.finfo(dtype).eps * w.abs()
        assert ((got.double() - w).abs() <= slack).all(), (got.double() - w).abs().max()
    if dtype == torch.bfloat16 and mix == 0.01:
        # bf16's steps near 3 are 0.0156: moving by 1 % of a 1e-2 gap stays put where a bf16 lerp would jump a
        # whole step; the float32 mix rounds to the nearer of the two
        assert torch.equal(ref_t[0], want[0].to(dtype))


def test_mix_into_refuses_a_mismatch_before_it_changes_anything():
    a, b = torch.zeros(3), torch.zeros(4)
    keep = a.clone()
    with pytest.raises(ValueError, match="does not match"):
        mix_into([("x", a), ("y", b)], [("x", torch.ones(3)), ("y", torch.ones(5))], 0.5)
    assert torch.equal(a, keep)  # the first pair matched, but nothing moved
    with pytest.raises(ValueError, match="does not match"):
        mix_into([("x", a)], [("z", torch.ones(3))], 0.5)
    with pytest.raises(ValueError):  # one model has a tensor more
        mix_into([("x", a)], [("x", torch.ones(3)), ("y", b)], 0.5)
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="mix must be in"):
            mix_into([("x", a)], [("x", torch.ones(3))], bad)


@pytest.mark.parametrize("mix", [1.0, 0.25])
def test_the_torch_learner_mixes_its_kl_reference(tiny, seed, mix):  # noqa: F811
    learner = make_learner(fresh(tiny, seed), algo="grpo", kl_coef=0.1)
    assert learner.ref_model is not None
    batch = prepare(learner, random_batch(seed))
    learner.update(batch, seed=0)
    ref0 = {n: p.detach().clone().double() for n, p in learner.ref_model.named_parameters()}
    pol = {n: p.detach().clone().double() for n, p in learner.model.named_parameters()}
    assert any(not torch.equal(ref0[n], pol[n]) for n in pol)
    learner.reset_reference(reset_optimizer=False, mix=mix)
    assert len(learner.optimizer.state) > 0  # reset_optimizer=False keeps AdamW's moments
    for n, p in learner.ref_model.named_parameters():
        want = mix * pol[n] + (1 - mix) * ref0[n]
        assert torch.allclose(p.double(), want, rtol=0, atol=4 * 2.0 ** -23 * want.abs().max().item()), n
    lp, ref_lp = learner.compute_logprobs(batch), learner.compute_logprobs(batch, reference=True)
    assert torch.equal(lp, ref_lp) if mix == 1.0 else not torch.equal(lp, ref_lp)


def test_lora_adapters_refuse_a_mix(tiny, seed):  # noqa: F811
    pytest.importorskip("peft", reason="PEFT is not installed (pacs_fast[lora])")
    from pacs_fast.learner.lora import add_lora

    model = fresh(tiny, seed)
    add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    learner = make_learner(model, algo="grpo", kl_coef=0.1)
    assert learner.ref_adapters is not None and learner.ref_model is None
    before = {n: t.clone() for n, t in learner.ref_adapters.items()}
    with pytest.raises(ValueError, match="LoRA adapters cannot hold"):
        learner.reset_reference(reset_optimizer=False, mix=0.5)
    assert all(torch.equal(before[n], t) for n, t in learner.ref_adapters.items())


MEGATRON_SCRIPT = r"""
import sys, torch
from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.megatron.learner import MegatronLearner
from pacs_fast.learner.megatron.setup import init_parallel
spec = torch.load(sys.argv[1] + "/spec.pt")
init_parallel(1, device="cpu")
learner = MegatronLearner(spec["model"], algo=AlgoConfig(name="grpo", kl_coef=0.1), device="cpu", horizon=12,
                          learner=LearnerConfig(lr=1e-2, mini_batch_prompts=4, micro_batch_prompts=2,
                                                logprob_backend="torch", backend="megatron", tp_size=1))
batch = RolloutBatch(**spec["batch"])
batch.old_logp = learner.compute_logprobs(batch)
batch.ref_logp = learner.compute_logprobs(batch, reference=True)
learner.update(batch, seed=1)
ref0 = [p.detach().double().clone() for p in learner.ref_model.parameters()]
pol = [p.detach().double().clone() for p in learner.model.parameters()]
learner.reset_reference(reset_optimizer=True, mix=0.25)
got = [p.detach().double() for p in learner.ref_model.parameters()]
err = max(float((g - (0.25 * p + 0.75 * r)).abs().max()) for g, p, r in zip(got, pol, ref0))
moved = sum(not torch.equal(p, r) for p, r in zip(pol, ref0))
torch.save((err, moved, len(learner.optimizer.state_dict()["state"])), sys.argv[1] + "/out.pt")
"""


@pytest.mark.megatron
@pytest.mark.timeout(300)
def test_the_megatron_learner_mixes_its_kl_reference(seed, tmp_path):
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    write_learner_spec(tmp_path, seed)
    run_python(["-c", MEGATRON_SCRIPT, tmp_path])
    err, moved, opt_state = torch.load(tmp_path / "out.pt")
    assert moved > 0  # the update moved the policy away from the reference, so the mix has something to do
    assert err < 1e-6  # float32 weights of size ~0.1: the mix is exact to a few float32 ulp
    assert opt_state == 0  # reset_optimizer=True: AdamW starts afresh


KL_RUN = TINY + ["algo.name=grpo", "algo.kl_coef=0.1", "algo.entropy_coef=0.05", "learner.mini_batch_prompts=4",
                 "reward.fn=test_reinforce_pp:even_length", "train.tensorboard=false"]


def _train_records(folder):
    from pacs_fast.trainer.metrics import read_jsonl

    return [r for r in read_jsonl(folder / "metrics.jsonl") if r["kind"] == "train"]


def test_a_baseline_resets_its_kl_reference(tmp_path, cache, capsys):  # noqa: F811
    # one mini-batch per step: its KL is measured before the step's update, so after a hard reset it is 0
    common = KL_RUN + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.steps=3"]
    code, _, err = cli(common + ["algo.reset_every=2", "train.run_name=reset"], capsys)
    assert code == 0, err
    code, _, err = cli(common + ["train.run_name=kept"], capsys)
    assert code == 0, err
    reset, kept = ([r["learner/kl"] for r in _train_records(tmp_path / n)] for n in ("reset", "kept"))
    assert reset[0] == kept[0] == 0.0  # the reference is the initial policy at step 1
    assert reset[1] == kept[1] > 0  # the same run up to the reset
    assert reset[2] == 0.0 < kept[2]  # reset before step 3 (ProRL); without it the policy stays one step away


def test_a_run_resumed_after_a_mixed_reset_equals_the_uninterrupted_one(tmp_path, cache, capsys):  # noqa: F811
    from safetensors.torch import load_file

    from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

    common = KL_RUN + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "algo.reset_every=2",
                       "algo.reset_mix=0.5", "algo.reset_optimizer=false", "train.save_every=1"]
    code, _, err = cli(common + ["train.steps=4", "train.run_name=full"], capsys)
    assert code == 0, err
    code, _, err = cli(common + ["train.steps=3", "train.run_name=split"], capsys)
    assert code == 0, err
    code, _, err = cli(["--resume", str(tmp_path / "split"), "train.steps=4"], capsys)
    assert code == 0, err
    full = _train_records(tmp_path / "full")
    assert 0 < full[2]["learner/kl"] < full[1]["learner/kl"]  # half-way back to the policy: smaller, not 0
    a, b = (deterministic_view(read_jsonl(tmp_path / n / "metrics.jsonl")) for n in ("full", "split"))
    # (the split run also evaluated at its end, step 3) step 4 trained against the mixed reference the step-3
    # checkpoint held: its KL, and the weights it ended with, are the uninterrupted run's
    assert [r for r in a if r["kind"] == "train"] == [r for r in b if r["kind"] == "train"]
    assert [r for r in a if r["step"] == 4] == [r for r in b if r["step"] == 4]
    wa, wb = (load_file(str(tmp_path / n / "checkpoints" / "step_000004" / "model.safetensors"))
              for n in ("full", "split"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("args, message", [
    (["algo.name=grpo", "algo.reset_every=2"], "algo.reset_every=2 resets the KL penalty's reference and needs "
                                               "algo.kl_coef > 0"),
    (["algo.reset_every=2"], "needs algo.ref=fixed"),
    (["algo.ref=fixed", "algo.reset_every=2", "algo.reset_mix=0"], "algo.reset_mix must be in (0, 1]"),
    (["algo.ref=fixed", "algo.reset_every=2", "algo.reset_mix=1.5"], "algo.reset_mix must be in (0, 1]"),
    (["algo.ref=fixed", "algo.reset_every=2", "algo.reset_mix=nan"], "algo.reset_mix must be a finite number"),
    (["algo.name=grpo", "algo.kl_coef=0.1", "algo.reset_every=2", "algo.reset_mix=0.5", "model.lora_rank=4"],
     "algo.reset_mix=0.5 mixes whole weights, which LoRA adapters cannot hold"),
])
def test_settings_it_cannot_take_are_one_line(args, message):
    cfg = load_config(None, args)
    with pytest.raises(ValueError) as e:
        validate(cfg, world=1)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("args, idle", [
    (["algo.reset_mix=0.5"], ["algo.reset_mix"]),
    (["algo.name=grpo", "algo.reset_optimizer=false"], ["algo.reset_optimizer"]),
    (["algo.name=grpo", "algo.kl_coef=0.1", "algo.reset_every=3", "algo.reset_mix=0.6",
      "algo.reset_optimizer=false"], []),
    (["algo.ref=fixed", "algo.reset_every=3", "algo.reset_mix=0.6"], []),
])
def test_the_mix_is_named_unused_without_a_reset(args, idle):
    cfg = load_config(None, args)
    validate(cfg, world=1)
    named = [line.split("=")[0] for line in unused_settings(cfg)]
    assert [k for k in named if k.startswith("algo.reset")] == idle


def test_a_reset_the_run_never_reaches_is_a_warning():
    from pacs_fast.config.hazards import hazard_warnings

    lines = hazard_warnings(load_config(None, ["algo.name=grpo", "algo.kl_coef=0.1", "algo.reset_every=5",
                                               "train.steps=5"]))
    assert any("algo.reset_every=5 with train.steps=5: the first reset would come before step 6" in x for x in lines)
    assert not [x for x in hazard_warnings(load_config(None, ["algo.name=grpo", "algo.kl_coef=0.1",
                                                              "algo.reset_every=4", "train.steps=5"]))
                if "reset_every" in x]
