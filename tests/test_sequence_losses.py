"""GSPO and CISPO (``algo.name=gspo|cispo``): values and gradients against verl's installed
``compute_policy_loss_gspo`` / ``compute_policy_loss_cispo`` (with its ``agg_loss``) in float64 on
fresh random inputs, masked tokens, active clip bounds, the off-policy weights, the learner's
objective (micro-batch accumulation), the config (per-algorithm clip defaults, bad values refused
before anything loads) and a 2-step run of the built-in task with each."""
from __future__ import annotations

import math

import pytest
import torch

from pacs_fast.algorithms import group_advantages
from pacs_fast.algorithms.sequence_losses import CISPO_CLIP, GSPO_CLIP, cispo_policy_loss, gspo_policy_loss

MODES = ("seq-mean-token-mean", "token-mean", "seq-mean-token-sum")
# verl's seq-mean-token-mean divides each sequence's token sum by (count + 1e-8): each sequence's mean is off
# by a relative 1e-8 / count (so the loss by up to 1e-8 x its largest per-token term, ~5 here, absolute);
# every other mode agrees to float64 rounding
TOL = {"seq-mean-token-mean": dict(rtol=1e-7, atol=1e-7), "token-mean": dict(rtol=1e-10, atol=1e-12),
       "seq-mean-token-sum": dict(rtol=1e-10, atol=1e-12)}

TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=8", "rollout.n=4", "rollout.eval_n=2",
        "rollout.max_new_tokens=6", "train.prompts_per_step=4", "learner.mini_batch_prompts=2",
        "learner.micro_batch_prompts=1", "warmup.steps=30", "warmup.batch_size=32", "model.tiny_hidden_size=64",
        "model.tiny_num_layers=1", "learner.lr=3e-3", "train.progress=false", "train.tensorboard=false",
        "train.plots=false"]


def _verl():
    ca = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl is not installed")
    from verl.workers.config import ActorConfig
    return ca, ActorConfig


def _config(ActorConfig, clip_low, clip_high):
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=8, ppo_mini_batch_size=2,
                       clip_ratio_low=clip_low, clip_ratio_high=clip_high)


def _inputs(gen, *, B=12, T=9, row_shift=1e-3, token_noise=1e-3):
    """float64 [B, T] inputs: ragged masks (one empty row), per-row log-ratio shifts spread around the
    clip range, group-normalised advantages of groups of 4, and garbage at the masked positions."""
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    lengths[3] = 0
    mask = (torch.arange(T)[None] < lengths[:, None]).double()
    old = -3 * torch.rand(B, T, generator=gen, dtype=torch.float64)
    shift = row_shift * torch.linspace(-2, 2, B, dtype=torch.float64)[torch.randperm(B, generator=gen)]
    logp = old + shift[:, None] + token_noise * torch.randn(B, T, generator=gen, dtype=torch.float64)
    logp = torch.where(mask > 0, logp, -7.0)  # what sits off the response must not matter
    rewards = torch.randint(0, 2, (B,), generator=gen).double()
    adv = group_advantages(rewards, 4, "grpo")
    # both clip sides active and some rows inside: the sequences with the highest / lowest mean log-ratio
    # get A > 0 / A < 0 (clipped), the second highest A < 0 (the unclipped branch wins)
    seq = ((logp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    order = [i for i in torch.argsort(seq).tolist() if lengths[i] > 0]
    adv[order[-1]], adv[order[-2]], adv[order[0]] = 1.3, -0.7, -1.1
    weights = torch.where(mask > 0, 0.5 + torch.rand(B, T, generator=gen, dtype=torch.float64), 0.0)
    return logp, old, adv, mask, weights


def _grad(fn, logp, *args, **kw):
    x = logp.clone().requires_grad_()
    out = fn(x, *args, **kw)
    loss = out[0] if isinstance(out, tuple) else out
    (g,) = torch.autograd.grad(loss, x)
    return loss.detach(), g, (out[1] if isinstance(out, tuple) else None)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("weighted", [False, True])
def test_gspo_equals_verl(seed, mode, weighted):
    ca, ActorConfig = _verl()
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _inputs(gen)
    w = w if weighted else None
    cl, ch = GSPO_CLIP
    ref, g_ref, _ = _grad(lambda x: ca.compute_policy_loss_gspo(
        old, x, adv[:, None].expand_as(x), mask, loss_agg_mode=mode, config=_config(ActorConfig, cl, ch),
        rollout_is_weights=w), logp)
    ours, g_ours, m = _grad(gspo_policy_loss, logp, old, adv, mask, loss_agg_mode=mode, token_weights=w)
    torch.testing.assert_close(ours, ref, **TOL[mode])
    torch.testing.assert_close(g_ours, g_ref, **TOL[mode])
    assert 0 < float(m["clip_frac"]) < 1  # both sides of the bound are exercised
    assert float(m["clip_frac_high"]) > 0 and float(m["clip_frac_low"]) > 0
    assert float(g_ours[mask == 0].abs().max()) == 0.0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("clips", [CISPO_CLIP, (0.2, 0.2)])
def test_cispo_equals_verl(seed, mode, clips):
    ca, ActorConfig = _verl()
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _inputs(gen, row_shift=0.1, token_noise=0.4)
    cl, ch = clips
    for weights in (None, w):
        ref, g_ref, _ = _grad(lambda x: ca.compute_policy_loss_cispo(
            old, x, adv[:, None].expand_as(x), mask, loss_agg_mode=mode, config=_config(ActorConfig, cl, ch),
            rollout_is_weights=weights), logp)
        ours, g_ours, m = _grad(cispo_policy_loss, logp, old, adv, mask, clip_low=cl, clip_high=ch,
                                loss_agg_mode=mode, token_weights=weights)
        torch.testing.assert_close(ours, ref, **TOL[mode])
        torch.testing.assert_close(g_ours, g_ref, **TOL[mode])
        assert float(m["clip_frac_high"]) > 0  # the upper bound is active
        assert (float(m["clip_frac_low"]) > 0) == (cl < 1)  # clip_low >= 1: no lower bound at all
        assert float(g_ours[mask == 0].abs().max()) == 0.0


def test_gradients_by_hand(seed):
    """GSPO's gradient is s_i * grad logp_t inside the range and 0 where its clip is active; CISPO's is
    -sg[w] * A on every unmasked token (none is clipped out)."""
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, _ = _inputs(gen)
    _, g, _ = _grad(gspo_policy_loss, logp, old, adv, mask, loss_agg_mode="token-mean")
    n = mask.sum()
    s = (((logp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1)).exp()
    inside = (s >= 1 - GSPO_CLIP[0]) & (s <= 1 + GSPO_CLIP[1])
    active = ~inside & (((s > 1) & (adv > 0)) | ((s < 1) & (adv < 0)))
    expected = torch.where(active[:, None], 0.0, -adv[:, None] * s[:, None] / n) * mask
    torch.testing.assert_close(g, expected, rtol=1e-12, atol=1e-14)
    logp, old, adv, mask, _ = _inputs(gen, row_shift=0.1, token_noise=0.4)
    _, g, _ = _grad(cispo_policy_loss, logp, old, adv, mask, clip_low=0.2, clip_high=0.2)
    wts = (logp - old).exp().clamp(0.8, 1.2)
    torch.testing.assert_close(g, -wts * adv[:, None] * mask / mask.sum(), rtol=1e-12, atol=1e-14)


def test_bad_arguments_are_refused():
    x = torch.zeros(4, 3)
    for fn in (gspo_policy_loss, cispo_policy_loss):
        with pytest.raises(ValueError, match="clip_low"):
            fn(x, x, torch.zeros(4), None, clip_low=-0.1)
        with pytest.raises(ValueError, match="clip_high"):
            fn(x, x, torch.zeros(4), None, clip_high=float("nan"))
        with pytest.raises(ValueError, match="loss_agg_mode"):
            fn(x, x, torch.zeros(4), None, loss_agg_mode="mean")
        with pytest.raises(ValueError, match="advantages has 3 entries"):
            fn(x, x, torch.zeros(3), None)


# ----------------------------------------------------------------------------- the trainer's objective

def _micro(gen, B=8, T=6, G=4):
    from pacs_fast.learner.base import RolloutBatch
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    old = -2 * torch.rand(B, T, generator=gen, dtype=torch.float64) * mask
    return RolloutBatch(input_ids=torch.zeros(B, T, dtype=torch.long),
                        attention_mask=torch.ones(B, T, dtype=torch.long), response_mask=mask,
                        rewards=torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 1])[:B], group_size=G, old_logp=old,
                        ref_logp=old.clone())


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_objective_dispatch_weights_and_accumulation(seed, name):
    """algo.name=gspo|cispo reaches the loss with GRPO's advantages, the algorithm's own clips and
    aggregation, the k3 KL and the off-policy weights; two micro-batches sum to the mini-batch's loss."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.objective import minibatch_counts, objective, resolve_loss_agg

    gen = torch.Generator().manual_seed(seed)
    algo = load_config(None, [f"algo.name={name}", "algo.kl_coef=0.05"]).algo
    assert (algo.clip_low, algo.clip_high) == (GSPO_CLIP if name == "gspo" else CISPO_CLIP)
    agg = resolve_loss_agg(algo)
    assert agg == ("seq-mean-token-mean" if name == "gspo" else "token-mean")
    mb = _micro(gen)
    mb.is_weights = (0.5 + torch.rand(mb.response_mask.shape, generator=gen)) * mb.response_mask
    logp = (mb.old_logp + 1e-3 * torch.randn(mb.old_logp.shape, generator=gen, dtype=torch.float64)) * mb.response_mask
    counts = minibatch_counts(mb)
    fn = gspo_policy_loss if name == "gspo" else cispo_policy_loss
    expected, _ = fn(logp, mb.old_logp, group_advantages(mb.rewards, 4, "grpo"), mb.response_mask,
                     clip_low=algo.clip_low, clip_high=algo.clip_high, loss_agg_mode=agg, logp_ref=mb.ref_logp,
                     kl_coef=0.05, token_weights=mb.is_weights)
    whole, met = objective(algo, mb, logp, None, None, counts, horizon=6)
    torch.testing.assert_close(whole, expected)
    assert "adv_mean" in met and "clip_frac" in met and "kl" in met
    parts = sum(objective(algo, mb.groups([g]), logp[4 * g:4 * g + 4], None, None, counts, horizon=6)[0]
                for g in range(2))
    torch.testing.assert_close(parts, whole)


# ----------------------------------------------------------------------------- the config

@pytest.mark.parametrize("overrides, low, high", [
    (["algo.name=gspo"], 3e-4, 4e-4),
    (["algo.name=cispo"], 10.0, 0.2),
    (["algo.name=gspo", "algo.clip_high=0.001"], 3e-4, 0.001),
    (["algo.name=cispo", "algo.clip_low=0.2"], 0.2, 0.2),
    (["algo.name=grpo"], 0.2, 0.2),
])
def test_clip_defaults_follow_the_algorithm(overrides, low, high, tmp_path):
    from pacs_fast.config import load_config, save_config, validate
    from pacs_fast.config.schema import CLIP_C_DEFAULTS, CLIP_DEFAULTS
    from pacs_fast.algorithms.dppo import DPPO_THRESHOLDS, DPPO_TRUNCATION
    from pacs_fast.algorithms.sequence_losses import GMPO_CLIP
    # the config's copy of the algorithms' defaults
    assert CLIP_DEFAULTS == {"gspo": GSPO_CLIP, "cispo": CISPO_CLIP, "gmpo": GMPO_CLIP,
                             "dppo_tv": DPPO_THRESHOLDS["tv"], "dppo_kl": DPPO_THRESHOLDS["kl"]}
    assert CLIP_C_DEFAULTS == {"dppo_tv": DPPO_TRUNCATION, "dppo_kl": DPPO_TRUNCATION}
    cfg = load_config(None, overrides + [f"train.out_dir={tmp_path}"])
    assert (cfg.algo.clip_low, cfg.algo.clip_high) == (low, high)
    validate(cfg)
    save_config(cfg, tmp_path / "c.yaml")  # what the run folder records is what ran
    again = load_config(tmp_path / "c.yaml", ["algo.name=gspo"])
    assert (again.algo.clip_low, again.algo.clip_high) == (low, high)


@pytest.mark.parametrize("overrides, key", [
    (["algo.name=gspo", "algo.clip_low=-1e-4"], "algo.clip_low must be in [0, inf)"),
    (["algo.name=cispo", "algo.clip_high=-0.2"], "algo.clip_high must be in [0, inf)"),
    (["algo.name=gspo", "algo.clip_low=1.5"], "algo.clip_low must be in [0, 1)"),
    (["algo.name=grpo", "algo.clip_low=1.0"], "algo.clip_low must be in [0, 1)"),
    (["algo.name=gspo", "rollout.n=1"], "rollout.n must be >= 2 for algo.name=gspo"),
    (["algo.name=cispo", "algo.clip_low=nan"], "algo.clip_low must be a finite number"),
    (["algo.name=gsp0"], "algo.name must be one of"),
])
def test_bad_values_refused_before_loading(overrides, key, tmp_path, capsys):
    """One line naming the key, exit 2, before any model or engine loads (train.py validates first).
    The CLI's entry point in this process (a fresh interpreter per case cost ~1.4 s of CPU each); the
    command line itself: the next test."""
    from pacs_fast.train import main

    with pytest.raises(SystemExit) as e:
        main([*overrides, f"train.out_dir={tmp_path}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and key in lines[0], err
    assert not any(tmp_path.iterdir())  # nothing was created


def test_a_bad_value_on_the_command_line_exits_2_with_one_line(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "pacs_fast.train", "algo.name=gspo", "algo.clip_low=-1e-4",
                        f"train.out_dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "algo.clip_low must be in [0, inf)" in lines[0], r.stderr
    assert not any(tmp_path.iterdir())


def test_off_policy_correction_level_follows_the_objective():
    """correction.is_level=auto with asynchronous rollouts: per sequence for GSPO (its ratio and term are
    per sequence, as PACS's score), per token for CISPO (as the other baselines); off when synchronous."""
    from pacs_fast.config import is_level, load_config
    for name, level in (("gspo", "sequence"), ("cispo", "token"), ("grpo", "token"), ("pacs", "sequence")):
        assert is_level(load_config(None, [f"algo.name={name}", "rollout.ranks=1", "rollout.max_staleness=1"])) == level
        assert is_level(load_config(None, [f"algo.name={name}"])) == "none"


def test_cispo_takes_clip_low_above_one_and_help_lists_both():
    from pacs_fast.config import help_text, load_config, unused_settings, validate
    validate(load_config(None, ["algo.name=cispo", "algo.clip_low=1e6"]))
    text = help_text()
    assert "gspo" in text and "cispo" in text and "reward.overlong_buffer_len" in text
    assert "learner.mask_truncated" in text
    assert unused_settings(load_config(None, ["algo.name=gspo", "algo.clip_c=5"])) == [
        "algo.clip_c=5.0 has no effect with algo.name=gspo (PPO's dual clip; gspo has none, as in verl)"]


# ----------------------------------------------------------------------------- a run of each

@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)  # the session's shared warm-up cache (conftest.py)


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_two_step_run(tmp_path, cache, name):
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train
    from pacs_fast.trainer.metrics import read_jsonl

    cfg = load_config(None, TINY + [f"warmup.cache_dir={cache}", f"algo.name={name}", "train.steps=2",
                                    "train.eval_every=0", "train.save_every=0", "train.log_samples=2"])
    train(cfg, tmp_path / "run")
    recs = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        for key in ("learner/loss", "learner/grad_norm", "learner/pg_loss", "learner/clip_frac",
                    "learner/adv_abs_mean", "reward/mean", "entropy", "response/truncated_frac"):
            assert key in r and math.isfinite(r[key]), (key, r.get(key))
    assert ("learner/seq_ratio_mean" in recs[0]) == (name == "gspo")
