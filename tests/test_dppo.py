"""DPPO-Binary-TV and DPPO-Binary-KL (``algo.name=dppo_tv|dppo_kl``, pacs_fast/algorithms/dppo.py): values and
gradients against verl's installed ``compute_policy_loss_dppo_tv`` / ``_dppo_kl`` in float64 on fresh random inputs
(masked tokens, the off-policy weights, both sides of the trust region active, the ratio's truncation active or
not), the trust region and the gradient by hand, the trainer's objective (the recipe's defaults, micro-batches
summing to the mini-batch), the config (bad values refused before anything loads, idle keys named) and a 2-step
run of the built-in task with each."""
from __future__ import annotations

import math

import pytest
import torch

from pacs_fast.algorithms.dppo import DPPO_THRESHOLDS, DPPO_TRUNCATION, binary_divergence, dppo_policy_loss

from loss_mode_checks import assert_objective_equals, assert_refused_before_loading, assert_two_step_run, unused_keys
from test_sequence_losses import TINY, _grad, _inputs, _micro, _verl

MODES = ("token-mean", "seq-mean-token-sum-norm", "seq-mean-token-mean")
# verl's seq-mean-token-mean divides each sequence's sum by (count + 1e-8) (test_sequence_losses.py); the other
# modes add the same terms in the same order: float64 rounding
TOL = {"seq-mean-token-mean": dict(rtol=1e-7, atol=1e-7), "token-mean": dict(rtol=1e-12, atol=1e-14),
       "seq-mean-token-sum-norm": dict(rtol=1e-12, atol=1e-14)}
EXACT = dict(rtol=1e-12, atol=1e-14)


def _config(divergence, clips, clip_c):
    _, ActorConfig = _verl()
    from verl.workers.config import PolicyLossConfig
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=8, ppo_mini_batch_size=2,
                       clip_ratio_low=clips[0], clip_ratio_high=clips[1], clip_ratio_c=clip_c,
                       policy_loss=PolicyLossConfig(loss_mode=f"dppo_{divergence}"))


def _dppo_inputs(gen):
    """_inputs with log-ratios of +-0.4 and more, on tokens of probability 0.05 to 1: the sampled token's probability
    moves by up to ~0.3, across the thresholds of either divergence; and, whatever the draw, three tokens that leave
    the region on each side or stay in it with a large ratio: the first token of the row of the largest advantage
    goes 0.5 -> 0.9 (out for A > 0), those of two rows with A < 0 go 0.9 -> 0.5 (out for A <= 0) and 0.05 -> 0.1
    (in: a rise with A <= 0, ratio 2)."""
    logp, old, adv, mask, w = _inputs(gen, row_shift=0.3, token_noise=0.4)
    logp = logp.clamp(max=-1e-3)  # log-probs of a distribution (verl's KL is NaN above 0)
    up = int(torch.where(mask[:, 0] > 0, adv, -1e9).argmax())  # (row 3 has no token)
    down = [i for i in torch.argsort(adv).tolist() if mask[i, 0] > 0][:2]
    assert adv[up] > 0 and mask[up, 0] > 0 and all(adv[i] < 0 for i in down)
    for i, (before, after) in ((up, (0.5, 0.9)), (down[0], (0.9, 0.5)), (down[1], (0.05, 0.1))):
        old[i, 0], logp[i, 0] = math.log(before), math.log(after)
    return logp, old, adv, mask, w


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("divergence", ["tv", "kl"])
@pytest.mark.parametrize("clip_c", [DPPO_TRUNCATION, 1.2])
def test_dppo_equals_verl(seed, mode, divergence, clip_c):
    ca, _ = _verl()
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _dppo_inputs(gen)
    clips = DPPO_THRESHOLDS[divergence]
    fn = ca.compute_policy_loss_dppo_tv if divergence == "tv" else ca.compute_policy_loss_dppo_kl
    T = logp.shape[1]
    for weights in (None, w):
        ref, g_ref, m_ref = _grad(lambda x: fn(old, x, adv[:, None].expand_as(x), mask, loss_agg_mode=mode,
                                                config=_config(divergence, clips, clip_c),
                                                rollout_is_weights=weights), logp)
        ours, g, m = _grad(dppo_policy_loss, logp, old, adv, mask, divergence=divergence, clip_c=clip_c,
                           loss_agg_mode=mode, horizon=float(T), token_weights=weights)
        torch.testing.assert_close(ours, ref, **TOL[mode])
        torch.testing.assert_close(g, g_ref, **TOL[mode])
        assert float(m["clip_frac"]) == pytest.approx(m_ref["actor/pg_clipfrac"], abs=1e-9)
        assert float(m["trunc_frac"]) == pytest.approx(m_ref["actor/pg_clipfrac_lower"], abs=1e-9)
        assert float(m["clip_frac_high"]) > 0 and float(m["clip_frac_low"]) > 0  # both sides of the region act
        assert (float(m["trunc_frac"]) > 0) == (clip_c < 2)  # the truncation acts only at 1.2
        assert float(g[mask == 0].abs().max()) == 0.0


@pytest.mark.parametrize("divergence", ["tv", "kl"])
def test_the_trust_region_and_gradient_by_hand(seed, divergence):
    """A token trains while its move in its advantage's direction stays within the threshold (TV: p - p_old;
    KL: the two Bernoulli distributions' KL, bounded only in that direction), and then with the gradient
    -A min(r, c) w / count of token-mean; outside, its gradient is exactly 0."""
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _dppo_inputs(gen)
    lo, hi = 0.1, 0.2
    _, g, m = _grad(dppo_policy_loss, logp, old, adv, mask, divergence=divergence, clip_low=lo, clip_high=hi,
                    clip_c=1.5, loss_agg_mode="token-mean", token_weights=w)
    p, q = logp.exp(), old.exp()
    A = adv[:, None].expand_as(logp)
    if divergence == "tv":
        keep = torch.where(A > 0, p - q <= hi, p - q >= -lo)
    else:
        d = q * (old - logp) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))
        torch.testing.assert_close(binary_divergence(logp, old, "kl"), d, **EXACT)
        keep = torch.where(A > 0, (d <= hi) | (p <= q), (d <= lo) | (p >= q))
    keep &= mask > 0
    assert 0 < int(keep.sum()) < int((mask > 0).sum())  # some tokens in, some out
    want = torch.where(keep, -A * (logp - old).exp().clamp(max=1.5) * w, 0.0) / mask.sum()
    torch.testing.assert_close(g, want, **EXACT)
    assert float(m["clip_frac"]) == pytest.approx(float(((~keep) & (mask > 0)).sum() / mask.sum()), abs=1e-12)
    # on-policy every token is inside and the gradient is the plain policy gradient -A w / count
    _, g0, m0 = _grad(dppo_policy_loss, old.clone(), old, adv, mask, divergence=divergence,
                      loss_agg_mode="token-mean", token_weights=w)
    torch.testing.assert_close(g0, torch.where(mask > 0, -A * w, 0.0) / mask.sum(), **EXACT)
    assert float(m0["clip_frac"]) == 0.0


def test_a_log_prob_rounded_above_zero_counts_as_certain():
    """logp = 1e-7 (a certain token's log-prob rounded up) is p = 1: a finite KL, in the region by its own move
    (verl's 1 - p < 0 gave NaN, and the token dropped out)."""
    old = torch.log(torch.tensor([[0.999, 0.6]], dtype=torch.float64))
    lp = torch.tensor([[1e-7, 1e-7]], dtype=torch.float64)
    d = binary_divergence(lp, old, "kl")
    assert torch.isfinite(d).all()
    torch.testing.assert_close(d, binary_divergence(torch.zeros_like(lp), old, "kl"), **EXACT)
    _, m = dppo_policy_loss(lp, old, torch.ones(1), None, divergence="kl", loss_agg_mode="token-mean")
    assert float(m["clip_frac"]) == pytest.approx(0.5)  # 0.999 -> 1 is inside, 0.6 -> 1 is not


def test_defaults_and_bad_arguments():
    x = torch.zeros(4, 3)
    a, b = dppo_policy_loss(x - 0.3, x - 0.1, torch.tensor([1.0, -1.0, 1.0, -1.0]), None, divergence="tv")
    assert torch.isfinite(a)
    with pytest.raises(ValueError, match="divergence must be one of"):
        dppo_policy_loss(x, x, torch.zeros(4), None, divergence="js")
    with pytest.raises(ValueError, match="clip_c"):
        dppo_policy_loss(x, x, torch.zeros(4), None, clip_c=1.0)
    with pytest.raises(ValueError, match="clip_low"):
        dppo_policy_loss(x, x, torch.zeros(4), None, clip_low=-0.1)
    # the default thresholds are the recipe's per divergence, and a single given one is both sides
    adv = torch.ones(1)
    lp, old = torch.log(torch.tensor([[0.5, 0.7, 0.99]])), torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    # TV: 0.5 -> 0.7 moves 0.2 > 0.15, 0.9 -> 0.99 only 0.09; KL: 0.087 and 0.144, both > 0.05
    for div, frac in (("tv", 1 / 3), ("kl", 2 / 3)):
        _, m = dppo_policy_loss(lp, old, adv, None, divergence=div, loss_agg_mode="token-mean")
        assert float(m["clip_frac"]) == pytest.approx(frac)
    _, m = dppo_policy_loss(lp, old, adv, None, divergence="tv", clip_low=0.21, loss_agg_mode="token-mean")
    assert float(m["clip_frac"]) == 0.0  # 0.21 bounds A > 0 too: the move of 0.2 is inside


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_the_objective_reaches_the_loss_and_accumulates(seed, name):
    from pacs_fast.algorithms import group_advantages
    from pacs_fast.config import load_config
    from pacs_fast.learner.objective import minibatch_counts, resolve_loss_agg

    gen = torch.Generator().manual_seed(seed)
    algo = load_config(None, [f"algo.name={name}", "algo.kl_coef=0.05"]).algo
    assert resolve_loss_agg(algo) == "seq-mean-token-sum-norm"  # the recipe's
    assert (algo.clip_low, algo.clip_high, algo.clip_c) == (*DPPO_THRESHOLDS[name[-2:]], DPPO_TRUNCATION)
    given = load_config(None, [f"algo.name={name}", "algo.clip_high=0.3", "algo.clip_c=2"]).algo
    assert (given.clip_low, given.clip_high, given.clip_c) == (DPPO_THRESHOLDS[name[-2:]][0], 0.3, 2.0)
    mb = _micro(gen)
    mb.is_weights = (0.5 + torch.rand(mb.response_mask.shape, generator=gen)) * mb.response_mask
    logp = (mb.old_logp + 0.3 * torch.randn(mb.old_logp.shape, generator=gen, dtype=torch.float64)) * mb.response_mask
    counts = minibatch_counts(mb)
    adv = group_advantages(mb.rewards, 4, "grpo")
    expected, _ = dppo_policy_loss(logp, mb.old_logp, adv, mb.response_mask, divergence=name[-2:],
                                   global_count=counts["seqs"], horizon=6.0, logp_ref=mb.ref_logp, kl_coef=0.05,
                                   token_weights=mb.is_weights)
    assert_objective_equals(algo, mb, logp, expected, ("trunc_frac", "adv_mean", "kl"))


@pytest.mark.parametrize("overrides, key", [
    (["algo.name=dppo_tv", "rollout.n=1"], "rollout.n must be >= 2 for algo.name=dppo_tv"),
    (["algo.name=dppo_kl", "algo.clip_c=1"], "algo.clip_c (the dual clip; dppo_tv / dppo_kl: the ratio's "
                                             "truncation) must be > 1"),
    (["algo.name=dppo_tv", "algo.clip_high=-0.1"], "algo.clip_high"),
])
def test_bad_values_refused_before_loading(overrides, key, tmp_path, capsys):
    assert_refused_before_loading(overrides, key, tmp_path, capsys)


def test_thresholds_of_one_or_more_and_idle_keys():
    """A divergence threshold >= 1 is valid (the KL is unbounded; TV >= 1 leaves a side open), where a ratio clip's
    clip_low >= 1 is refused; DPPO reads clip_c (its truncation), so it is not named idle, SAPO's keys are."""
    from pacs_fast.config import load_config, validate

    validate(load_config(None, ["algo.name=dppo_kl", "algo.clip_low=1.5"]), world=1)
    assert unused_keys(["algo.name=dppo_tv", "algo.clip_c=50", "algo.tau_neg=2"]) == ["algo.tau_neg"]


@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)  # the session's shared warm-up cache (conftest.py)


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_two_step_run(tmp_path, cache, name):
    recs = assert_two_step_run(TINY + [f"warmup.cache_dir={cache}", f"algo.name={name}"], tmp_path,
                               ["learner/clip_frac", "learner/trunc_frac"])
    assert all(0 <= r["learner/clip_frac"] <= 1 for r in recs)
