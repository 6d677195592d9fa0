"""GMPO and SAPO (``algo.name=gmpo|sapo``; pacs_fast/algorithms/sequence_losses.py ``gmpo_policy_loss``,
pacs_fast/algorithms/sapo.py): values and gradients against verl's installed ``compute_policy_loss_geo_mean`` /
``compute_policy_loss_sapo`` and against the float64 formulas by hand, on fresh random inputs (masked tokens, the
off-policy weights, both clip sides active), the trainer's objective (GRPO's advantages, micro-batches summing to
the mini-batch), the config (GMPO's clip defaults, a token aggregation refused, idle keys named) and a 2-step run
of the built-in task with each."""
from __future__ import annotations

import pytest
import torch

from pacs_fast.algorithms.sapo import SAPO_TAUS, sapo_policy_loss
from pacs_fast.algorithms.sequence_losses import GMPO_CLIP, gmpo_policy_loss

from loss_mode_checks import assert_refused_before_loading, assert_two_step_run, unused_keys
from test_sequence_losses import TINY, _grad, _inputs, _micro, _verl

# verl divides each sequence's sum by (count + 1e-8): a relative 1e-8 / count of each row's term (up to ~3 here);
# the hand formulas below agree to float64 rounding
VERL_TOL = dict(rtol=1e-7, atol=1e-7)
EXACT = dict(rtol=1e-12, atol=1e-14)


def _config(clips=GMPO_CLIP, taus=SAPO_TAUS):
    _, ActorConfig = _verl()
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=8, ppo_mini_batch_size=2,
                       clip_ratio_low=clips[0], clip_ratio_high=clips[1], tau_pos=taus[0], tau_neg=taus[1])


def _nonempty(gen):
    """_inputs without its empty row: verl's geo_mean takes the plain mean over rows, empty ones included as 0
    (ours averages the sequences that have tokens, as every sequence-mean here does)."""
    logp, old, adv, mask, w = _inputs(gen, row_shift=0.3, token_noise=0.4)
    keep = mask.sum(-1) > 0
    return logp[keep], old[keep], adv[keep], mask[keep], w[keep]


@pytest.mark.parametrize("clips", [GMPO_CLIP, (0.1, 0.3)])
def test_gmpo_equals_verl_and_the_formula(seed, clips):
    ca, _ = _verl()
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _nonempty(gen)
    for weights in (None, w):
        ref, g_ref, m_ref = _grad(lambda x: ca.compute_policy_loss_geo_mean(
            old, x, adv[:, None].expand_as(x), mask, config=_config(clips), rollout_is_weights=weights), logp)
        ours, g, m = _grad(gmpo_policy_loss, logp, old, adv, mask, clip_low=clips[0], clip_high=clips[1],
                           token_weights=weights)
        torch.testing.assert_close(ours, ref, **VERL_TOL)
        torch.testing.assert_close(g, g_ref, **VERL_TOL)
        assert float(m["clip_frac_high"]) == pytest.approx(m_ref["actor/pg_clipfrac"], abs=1e-9)
        assert float(m["clip_frac_low"]) == pytest.approx(m_ref["actor/pg_clipfrac_lower"], abs=1e-9)
        assert float(m["clip_frac_high"]) > 0 and float(m["clip_frac_low"]) > 0
        # by hand: the log-ratio clipped on the side that would grow the objective, its row mean exponentiated
        lr = logp - old
        hi = torch.where(adv[:, None] > 0, lr.clamp(max=clips[1]), lr.clamp(min=-clips[0]))
        n = mask.sum(-1)
        rows = -adv * torch.exp((hi * mask).sum(-1) / n)
        if weights is not None:
            rows = rows * torch.exp((torch.log(weights + 1e-10) * mask).sum(-1) / n)
        torch.testing.assert_close(ours, rows.mean(), **EXACT)


@pytest.mark.parametrize("taus", [SAPO_TAUS, (0.5, 3.0)])
def test_sapo_equals_verl_and_the_formula(seed, taus):
    ca, _ = _verl()
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _inputs(gen, row_shift=0.3, token_noise=0.4)
    for weights in (None, w):
        ref, g_ref, _ = _grad(lambda x: ca.compute_policy_loss_sapo(
            old, x, adv[:, None].expand_as(x), mask, config=_config(taus=taus), rollout_is_weights=weights), logp)
        ours, g, m = _grad(sapo_policy_loss, logp, old, adv, mask, tau_pos=taus[0], tau_neg=taus[1],
                           token_weights=weights)
        torch.testing.assert_close(ours, ref, **VERL_TOL)
        torch.testing.assert_close(g, g_ref, **VERL_TOL)
        assert float(g[mask == 0].abs().max()) == 0.0
        # by hand: the gate's slope at the token, times -A, over each row's length, over the rows with tokens
        tau = torch.where(adv[:, None] > 0, taus[0], taus[1]).expand_as(logp)
        r = (logp - old).exp()
        s = torch.sigmoid(tau * (r - 1))
        n = mask.sum(-1, keepdim=True)
        rows = mask.sum(-1) > 0
        wt = torch.ones_like(logp) if weights is None else weights
        want_g = (-adv[:, None] * 4 * s * (1 - s) * r * wt * mask / n.clamp(min=1)) / rows.sum()
        torch.testing.assert_close(g, want_g, **EXACT)
    # on-policy the gate's slope is 1: the plain policy gradient, -A / n per token
    _, g, m = _grad(sapo_policy_loss, old.clone(), old, adv, mask)
    assert float(m["gate_mean"]) == pytest.approx(1.0, abs=1e-12)


def test_bad_arguments_are_refused():
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="loss_agg_mode must be 'seq-mean-token-mean'"):
        gmpo_policy_loss(x, x, torch.zeros(4), None, loss_agg_mode="token-mean")
    with pytest.raises(ValueError, match="loss_agg_mode must be 'seq-mean-token-mean'"):
        sapo_policy_loss(x, x, torch.zeros(4), None, loss_agg_mode="token-mean")
    with pytest.raises(ValueError, match="tau_neg must be"):
        sapo_policy_loss(x, x, torch.zeros(4), None, tau_neg=0.0)
    with pytest.raises(ValueError, match="clip_low"):
        gmpo_policy_loss(x, x, torch.zeros(4), None, clip_low=-0.1)


@pytest.mark.parametrize("name", ["gmpo", "sapo"])
def test_the_objective_reaches_the_loss_and_accumulates(seed, name):
    from pacs_fast.algorithms import group_advantages
    from pacs_fast.config import load_config
    from pacs_fast.learner.objective import minibatch_counts, objective, resolve_loss_agg

    gen = torch.Generator().manual_seed(seed)
    algo = load_config(None, [f"algo.name={name}", "algo.kl_coef=0.05", "algo.tau_neg=2"]).algo
    assert resolve_loss_agg(algo) == "seq-mean-token-mean"
    if name == "gmpo":
        assert (algo.clip_low, algo.clip_high) == GMPO_CLIP
    mb = _micro(gen)
    mb.is_weights = (0.5 + torch.rand(mb.response_mask.shape, generator=gen)) * mb.response_mask
    logp = (mb.old_logp + 0.2 * torch.randn(mb.old_logp.shape, generator=gen, dtype=torch.float64)) * mb.response_mask
    counts = minibatch_counts(mb)
    adv = group_advantages(mb.rewards, 4, "grpo")
    common = dict(global_count=counts["seqs"], logp_ref=mb.ref_logp, kl_coef=0.05, token_weights=mb.is_weights)
    expected, _ = (gmpo_policy_loss(logp, mb.old_logp, adv, mb.response_mask, **common) if name == "gmpo" else
                   sapo_policy_loss(logp, mb.old_logp, adv, mb.response_mask, tau_neg=2.0, **common))
    whole, met = objective(algo, mb, logp, None, None, counts, horizon=6)
    torch.testing.assert_close(whole, expected)
    assert "adv_mean" in met and "kl" in met and ("gate_mean" in met) == (name == "sapo")
    parts = sum(objective(algo, mb.groups([g]), logp[4 * g:4 * g + 4], None, None, counts, horizon=6)[0]
                for g in range(2))
    torch.testing.assert_close(parts, whole)


@pytest.mark.parametrize("overrides, key", [
    (["algo.name=gmpo", "algo.loss_agg=token-mean"], "algo.name=gmpo aggregates per sequence (verl's geo_mean"),
    (["algo.name=sapo", "algo.loss_agg=seq-mean-token-sum"], "algo.loss_agg must be auto or seq-mean-token-mean"),
    (["algo.name=sapo", "algo.tau_pos=0"], "algo.tau_pos must be in (0, inf)"),
    (["algo.name=gmpo", "rollout.n=1"], "rollout.n must be >= 2 for algo.name=gmpo"),
    # a 0/1 entropy mask as GMPO's geometric-mean weights zeroed every row that dropped a token (sweep)
    (["algo.name=gmpo", "algo.entropy_top_frac=0.2"], "not with algo.name=gmpo (set algo.entropy_top_frac=1)"),
])
def test_bad_values_refused_before_loading(overrides, key, tmp_path, capsys):
    assert_refused_before_loading(overrides, key, tmp_path, capsys)


@pytest.mark.parametrize("overrides, idle", [
    (["algo.name=grpo", "algo.tau_neg=2"], ["algo.tau_neg"]),
    (["algo.name=sapo", "algo.clip_high=0.28", "algo.tau_neg=2"], ["algo.clip_high"]),
    (["algo.name=gmpo", "algo.clip_c=5", "algo.clip_high=0.5"], ["algo.clip_c"]),
])
def test_idle_keys_are_named(overrides, idle):
    assert unused_keys(overrides) == sorted(idle)


@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)  # the session's shared warm-up cache (conftest.py)


@pytest.mark.parametrize("name, metric", [("gmpo", "learner/seq_ratio_mean"), ("sapo", "learner/gate_mean")])
def test_two_step_run(tmp_path, cache, name, metric):
    extra = ["algo.cov_frac=0.05", "algo.cov_low=0.001"] if "cov" in name else []
    assert_two_step_run(TINY + [f"warmup.cache_dir={cache}", f"algo.name={name}", *extra], tmp_path, [metric])


def test_gmpo_takes_a_log_space_clip_of_one_or_more():
    """GMPO's clip_low bounds the log-ratio (e^-1.5 is a ratio bound like any other): 1.5 was refused with PPO's
    "the ratio's lower bound is 1 - clip_low" (sweep); other algorithms still refuse it."""
    from pacs_fast.config import load_config, validate

    validate(load_config(None, ["algo.name=gmpo", "algo.clip_low=1.5"]), world=1)
    with pytest.raises(ValueError, match=r"algo.clip_low must be in \[0, 1\)"):
        validate(load_config(None, ["algo.name=grpo", "algo.clip_low=1.5"]), world=1)
