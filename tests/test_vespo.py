"""VESPO (``algo.name=vespo``, pacs_fast/algorithms/vespo.py) against the installed TRL's ``get_gamma_weights`` and
its ``loss_type="vespo"`` terms in float64 (values and gradients, masked tokens, the off-policy weights folded into
the sequence weight), by hand (phi(1) = 1 on-policy, the Gamma shape's peak), the trainer's objective (GRPO's
advantages, the entropy selection multiplying, micro-batches summing to the mini-batch), LUSPO as the ``luspo``
preset (GSPO summed over each sequence's tokens, TRL's ``loss_type="luspo"``), the config and a 2-step run."""
from __future__ import annotations

import math

import pytest
import torch

from pacs_fast.algorithms.vespo import VESPO_SHAPE, gamma_weights, vespo_policy_loss

from loss_mode_checks import assert_objective_equals, assert_refused_before_loading, assert_two_step_run, unused_keys
from test_sequence_losses import TINY, _grad, _inputs, _micro

EXACT = dict(rtol=1e-12, atol=1e-14)


def _trl():
    return pytest.importorskip("trl.trainer.grpo_trainer", reason="trl is not installed").GRPOTrainer


def _trl_vespo(logp, old, adv, mask, is_ratio, shape):
    """TRL's loss_type="vespo" terms and its "dapo" aggregation (one process, no accumulation)."""
    k_pos, lambda_pos, k_neg, lambda_neg = shape
    phi = _trl().get_gamma_weights(advantages=adv[:, None], log_ratio_per_token=logp - old, mask=mask,
                                   importance_sampling_ratio=is_ratio, k_pos=k_pos, lambda_pos=lambda_pos,
                                   k_neg=k_neg, lambda_neg=lambda_neg)
    per_token = -phi * adv[:, None] * logp
    return (per_token * mask).sum() / mask.sum()


@pytest.mark.parametrize("shape", [VESPO_SHAPE, (1.0, 0.5, 4.0, 6.0)])
def test_vespo_equals_trl(seed, shape):
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _inputs(gen, row_shift=0.3, token_noise=0.2)
    k_pos, lambda_pos, k_neg, lambda_neg = shape
    kw = dict(k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg, lambda_neg=lambda_neg)
    for weights in (None, w):
        ratio = None if weights is None else torch.where(mask > 0, weights, 1.0)  # TRL's ratio is 1 off the tokens
        ref, g_ref, _ = _grad(lambda x: _trl_vespo(x, old, adv, mask, ratio, shape), logp)
        ours, g, m = _grad(vespo_policy_loss, logp, old, adv, mask, is_weights=weights, **kw)
        torch.testing.assert_close(ours, ref, **EXACT)
        torch.testing.assert_close(g, g_ref, **EXACT)
        assert float(g[mask == 0].abs().max()) == 0.0
        phi = gamma_weights(logp - old, adv[:, None].expand_as(logp), mask, is_weights=weights, **kw)
        assert 0 < float(m["phi_seq_mean"]) and len({round(float(p), 9) for p in phi[mask.sum(-1) > 0]}) > 2
    # by hand: on-policy every sequence weighs phi(1) = 1 (the plain policy gradient -A / count); a sequence at the
    # Gamma's peak w = k / lambda weighs (k / lambda)^k e^(lambda - k), more than 1
    _, g0, m0 = _grad(vespo_policy_loss, old.clone(), old, adv, mask, **kw)
    torch.testing.assert_close(g0, torch.where(mask > 0, -adv[:, None].expand_as(old), 0.0) / mask.sum(), **EXACT)
    assert float(m0["phi_seq_mean"]) == pytest.approx(1.0, abs=1e-12)
    peak = torch.full((1, 1), math.log(k_pos / lambda_pos), dtype=torch.float64)
    got = gamma_weights(peak, torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.float64), **kw)
    assert float(got) == pytest.approx((k_pos / lambda_pos) ** k_pos * math.exp(lambda_pos - k_pos), rel=1e-12)


def test_the_correction_weights_enter_the_sequence_weight_not_the_terms(seed):
    """w = prod(ratio) * prod(is_weight): a sequence whose correction weights multiply to 1 trains as without
    them; token_weights (a 0/1 selection) multiply the terms."""
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, _ = _inputs(gen, row_shift=0.3, token_noise=0.2)
    n = mask.sum(-1, keepdim=True).clamp(min=1)
    tilt = torch.where(mask > 0, torch.exp(0.5 * (torch.arange(logp.shape[1]) - (n - 1) / 2) / n), 1.0)
    tilt = torch.where(mask > 0, tilt / torch.exp((torch.log(tilt) * mask).sum(-1, keepdim=True) / n), 1.0)
    torch.testing.assert_close((torch.log(tilt) * mask).sum(-1), torch.zeros(len(mask), dtype=torch.float64),
                               atol=1e-12, rtol=0)
    plain = vespo_policy_loss(logp, old, adv, mask)[0]
    torch.testing.assert_close(vespo_policy_loss(logp, old, adv, mask, is_weights=tilt)[0], plain, **EXACT)
    keep = (torch.rand(logp.shape, generator=gen) < 0.5).double() * mask
    _, g = _grad(vespo_policy_loss, logp, old, adv, mask, token_weights=keep)[:2]
    assert float(g[(keep == 0)].abs().max()) == 0.0 and float(g[keep > 0].abs().max()) > 0


def test_bad_arguments_are_refused():
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="lambda_pos must be > 0"):
        vespo_policy_loss(x, x, torch.zeros(4), None, lambda_pos=0.0)
    with pytest.raises(ValueError, match="k_neg must be >= 0"):
        vespo_policy_loss(x, x, torch.zeros(4), None, k_neg=-1.0)
    with pytest.raises(ValueError, match="advantages must be \\[B\\]"):
        vespo_policy_loss(x, x, torch.zeros(4, 3), None)
    with pytest.raises(ValueError, match="is_weights"):
        vespo_policy_loss(x, x, torch.zeros(4), None, is_weights=torch.ones(4, 2))


def test_the_objective_reaches_the_loss_and_accumulates(seed):
    from pacs_fast.algorithms import group_advantages
    from pacs_fast.config import load_config
    from pacs_fast.learner.objective import minibatch_counts

    gen = torch.Generator().manual_seed(seed)
    algo = load_config(None, ["algo.name=vespo", "algo.kl_coef=0.05", "algo.vespo_lambda_neg=4"]).algo
    mb = _micro(gen)
    mb.is_weights = (0.5 + torch.rand(mb.response_mask.shape, generator=gen)) * mb.response_mask
    logp = (mb.old_logp + 0.2 * torch.randn(mb.old_logp.shape, generator=gen, dtype=torch.float64)) * mb.response_mask
    counts = minibatch_counts(mb)
    adv = group_advantages(mb.rewards, 4, "grpo")
    expected, _ = vespo_policy_loss(logp, mb.old_logp, adv, mb.response_mask, lambda_neg=4.0,
                                    is_weights=mb.is_weights, global_count=counts["tokens"], logp_ref=mb.ref_logp,
                                    kl_coef=0.05)
    assert_objective_equals(algo, mb, logp, expected, ("phi_seq_mean", "kl"))


def test_luspo_is_gspo_summed_over_each_sequence(seed):
    """The luspo preset (TRL's loss_type="luspo" with importance_sampling_level="sequence"): GSPO's clipped
    sequence ratio times A on every token, summed over the sequence, averaged over the sequences."""
    from pacs_fast.config import load_config
    from pacs_fast.experiment_args import PRESETS
    from pacs_fast.learner.objective import minibatch_counts, objective

    gen = torch.Generator().manual_seed(seed)
    algo = load_config(None, PRESETS["luspo"]).algo
    mb = _micro(gen)
    logp = (mb.old_logp + 2e-4 * torch.randn(mb.old_logp.shape, generator=gen, dtype=torch.float64)) \
        * mb.response_mask
    from pacs_fast.algorithms import group_advantages

    adv = group_advantages(mb.rewards, 4, "grpo")[:, None]
    mask = mb.response_mask
    seq = ((logp - mb.old_logp) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    coef_1 = torch.exp(seq - seq.detach() + seq.detach())  # TRL: exp of the mean log-ratio, with its gradient
    coef_2 = coef_1.clamp(1 - algo.clip_low, 1 + algo.clip_high)
    per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    want = (per_token * mask).sum(-1).sum() / (mask.sum(-1) > 0).sum()  # (TRL's mean counts rows without tokens)
    whole, _ = objective(algo, mb, logp, None, None, minibatch_counts(mb), horizon=6)
    torch.testing.assert_close(whole, want)


@pytest.mark.parametrize("overrides, key", [
    (["algo.name=vespo", "algo.vespo_lambda_pos=0"], "algo.vespo_lambda_pos must be in (0, inf)"),
    (["algo.name=vespo", "algo.vespo_k_neg=-1"], "algo.vespo_k_neg"),
    (["algo.name=vespo", "rollout.n=1"], "rollout.n must be >= 2 for algo.name=vespo"),
])
def test_bad_values_refused_before_loading(overrides, key, tmp_path, capsys):
    assert_refused_before_loading(overrides, key, tmp_path, capsys)


@pytest.mark.parametrize("overrides, idle", [
    (["algo.name=grpo", "algo.vespo_k_pos=3"], ["algo.vespo_k_pos"]),
    (["algo.name=vespo", "algo.clip_high=0.28", "algo.vespo_k_pos=3"], ["algo.clip_high"]),
])
def test_idle_keys_are_named(overrides, idle):
    assert unused_keys(overrides) == sorted(idle)


@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)  # the session's shared warm-up cache (conftest.py)


def test_two_step_run(tmp_path, cache):
    assert_two_step_run(TINY + [f"warmup.cache_dir={cache}", "algo.name=vespo"], tmp_path, ["learner/phi_seq_mean"])
