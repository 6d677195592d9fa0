"""GPG and DRO (``algo.name=gpg|dro``, pacs_fast/algorithms/gpg.py): GPG's advantages against verl's installed
``compute_gpg_outcome_advantage`` (0/1 and soft rewards, groups of one, a step split over data-parallel shares), its
loss and DRO's against ``compute_policy_loss_gpg`` / ``_dro`` in float64 (values and gradients, masked tokens, the
off-policy weights) and by hand, the trainer's objective (GPG's step advantages, micro-batches summing to the
mini-batch), the config (DRO's beta required, bad values refused before anything loads, idle keys named) and a
2-step run of the built-in task with each."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pacs_fast.algorithms.gpg import dro_policy_loss, gpg_advantages, gpg_policy_loss, gpg_totals

from loss_mode_checks import assert_objective_equals, assert_refused_before_loading, assert_two_step_run, unused_keys
from test_sequence_losses import TINY, _grad, _inputs, _micro, _verl

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
# verl's seq-mean-token-mean divides each sequence's sum by (count + 1e-8) (test_sequence_losses.py); the other
# modes add the same terms in the same order: float64 rounding
TOL = {"seq-mean-token-mean": dict(rtol=1e-7, atol=1e-7), "token-mean": dict(rtol=1e-12, atol=1e-14),
       "seq-mean-token-sum": dict(rtol=1e-12, atol=1e-14)}
EXACT = dict(rtol=1e-12, atol=1e-14)


def _config(beta=None):
    _, ActorConfig = _verl()
    from verl.workers.config import PolicyLossConfig
    return ActorConfig(strategy="fsdp", rollout_n=4, ppo_micro_batch_size_per_gpu=8, ppo_mini_batch_size=2,
                       policy_loss=PolicyLossConfig(loss_mode="dro" if beta else "gpg", dro_beta=beta))


def _verl_gpg_advantages(rewards, group_size, T=3):
    ca, _ = _verl()
    scores = torch.zeros(len(rewards), T, dtype=torch.float64)
    scores[:, -1] = rewards  # the outcome reward on the last token, as verl's reward managers place it
    index = np.repeat(np.arange(len(rewards) // group_size), group_size)
    adv, _ = ca.compute_gpg_outcome_advantage(scores, torch.ones_like(scores), index)
    return adv[:, 0]


@pytest.mark.parametrize("group_size", [4, 1])
@pytest.mark.parametrize("soft", [False, True])
def test_gpg_advantages_equal_verl(seed, group_size, soft):
    gen = torch.Generator().manual_seed(seed)
    B = 16
    rewards = torch.randint(0, 2, (B,), generator=gen).double()
    if soft:  # shaped rewards: some negative, some exactly 0
        rewards = torch.where(rewards > 0, torch.rand(B, generator=gen, dtype=torch.float64) - 0.3, 0.0)
    rewards[:group_size] = 0.0  # a group (or a response) of zeros: its advantage is 0
    rewards[4], rewards[5] = 0.5, 0.0  # the first half has a non-zero advantage, and non-zero rewards in at most
    rewards[8:] = torch.where(rewards[8:] == 0, 1.0, rewards[8:])  # 4 of 8 responses, the second half in all 8
    ours = gpg_advantages(rewards, group_size)
    # verl's alpha = B / count_nonzero is a float32 tensor (an int over an int64 tensor): relative 6e-8
    torch.testing.assert_close(ours, _verl_gpg_advantages(rewards, group_size), rtol=2e-7, atol=1e-12)
    nonzero = int(torch.count_nonzero(rewards))
    assert 0 < nonzero < B  # alpha = B / M is not 1
    want = B / nonzero * (rewards - (rewards.view(-1, group_size).mean(1).repeat_interleave(group_size)
                                     if group_size > 1 else 0.0))
    torch.testing.assert_close(ours, want, **EXACT)
    # a step split over two data-parallel shares takes the step's counts: each share's advantages are the step's
    halves = rewards[:8], rewards[8:]
    totals = tuple(a + b for a, b in zip(gpg_totals(halves[0]), gpg_totals(halves[1])))
    torch.testing.assert_close(torch.cat([gpg_advantages(h, group_size, totals=totals) for h in halves]), ours,
                               **EXACT)
    assert not torch.allclose(gpg_advantages(halves[0], group_size), ours[:8])  # a share's own counts differ
    assert torch.equal(gpg_advantages(torch.zeros(8), 4), torch.zeros(8))  # no non-zero reward: alpha = B


@pytest.mark.parametrize("mode", MODES)
def test_gpg_and_dro_losses_equal_verl(seed, mode):
    ca, _ = _verl()
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _inputs(gen, row_shift=0.3, token_noise=0.4)
    A = adv[:, None].expand_as(logp)
    for weights in (None, w):
        ref, g_ref, _ = _grad(lambda x: ca.compute_policy_loss_gpg(old, x, A, mask, loss_agg_mode=mode,
                                                                   config=_config(), rollout_is_weights=weights),
                              logp)
        ours, g, _ = _grad(gpg_policy_loss, logp, old, adv, mask, loss_agg_mode=mode, token_weights=weights)
        torch.testing.assert_close(ours, ref, **TOL[mode])
        torch.testing.assert_close(g, g_ref, **TOL[mode])
        ref, g_ref, m_ref = _grad(lambda x: ca.compute_policy_loss_dro(
            old, x, A, mask, loss_agg_mode=mode, config=_config(0.3), rollout_is_weights=weights), logp)
        ours, g, m = _grad(dro_policy_loss, logp, old, adv, mask, beta=0.3, loss_agg_mode=mode,
                           token_weights=weights)
        torch.testing.assert_close(ours, ref, **TOL[mode])
        torch.testing.assert_close(g, g_ref, **TOL[mode])
        # verl's masked_mean divides by (count + 1e-8): relative 1e-8 / count
        assert float(m["ppo_kl"]) == pytest.approx(m_ref["actor/ppo_kl"], rel=1e-8)
        assert float(g[mask == 0].abs().max()) == 0.0


def test_gradients_by_hand(seed):
    """GPG's gradient is -A w / count, whatever the ratio (no clip); DRO's is -(A - beta (logp - old_logp)) w /
    count: the penalty pulls each token back to the rollout policy, and is 0 on-policy."""
    gen = torch.Generator().manual_seed(seed)
    logp, old, adv, mask, w = _inputs(gen, row_shift=2.0, token_noise=0.4)  # ratios far outside any clip
    A = adv[:, None].expand_as(logp)
    _, g, _ = _grad(gpg_policy_loss, logp, old, adv, mask, token_weights=w)
    torch.testing.assert_close(g, torch.where(mask > 0, -A * w, 0.0) / mask.sum(), **EXACT)
    _, g, m = _grad(dro_policy_loss, logp, old, adv, mask, beta=0.5, token_weights=w)
    torch.testing.assert_close(g, torch.where(mask > 0, -(A - 0.5 * (logp - old)) * w, 0.0) / mask.sum(), **EXACT)
    lr = torch.where(mask > 0, logp - old, 0.0)
    assert float(m["sq_log_ratio"]) == pytest.approx(float(lr.square().sum() / mask.sum()), rel=1e-12)
    _, g0, m0 = _grad(dro_policy_loss, old.clone(), old, adv, mask, beta=0.5)
    torch.testing.assert_close(g0, torch.where(mask > 0, -A, 0.0) / mask.sum(), **EXACT)
    assert float(m0["sq_log_ratio"]) == 0.0


def test_bad_arguments_are_refused():
    x = torch.zeros(4, 3)
    with pytest.raises(ValueError, match="beta must be > 0"):
        dro_policy_loss(x, x, torch.zeros(4), None, beta=0.0)
    with pytest.raises(ValueError, match="not divisible by group_size=3"):
        gpg_advantages(torch.zeros(4), 3)
    with pytest.raises(ValueError, match="rewards"):
        gpg_advantages(torch.zeros(4, 2), 2)


def test_the_objective_and_the_step_advantages(seed):
    """algo.name=gpg trains on the advantages the trainer sets over the step (step_gpg: every response token of a
    row carries the row's); without them the objective names where they come from; dro reaches its loss with
    GRPO's advantages and algo.dro_beta."""
    from pacs_fast.algorithms import group_advantages
    from pacs_fast.config import load_config
    from pacs_fast.learner.objective import minibatch_counts, objective
    from pacs_fast.trainer.step import step_gpg

    gen = torch.Generator().manual_seed(seed)
    mb = _micro(gen)
    mb.is_weights = (0.5 + torch.rand(mb.response_mask.shape, generator=gen)) * mb.response_mask
    logp = (mb.old_logp + 0.3 * torch.randn(mb.old_logp.shape, generator=gen, dtype=torch.float64)) * mb.response_mask
    counts = minibatch_counts(mb)
    common = dict(global_count=counts["tokens"], logp_ref=mb.ref_logp, kl_coef=0.05, token_weights=mb.is_weights)

    algo = load_config(None, ["algo.name=gpg", "algo.kl_coef=0.05"]).algo
    with pytest.raises(ValueError, match="pacs_fast.algorithms.gpg.gpg_advantages"):
        objective(algo, mb, logp, None, None, counts, horizon=6)
    mb.advantages = step_gpg(mb)
    adv = gpg_advantages(mb.rewards, mb.group_size)
    assert torch.equal(mb.advantages, (adv.float()[:, None] * (mb.response_mask != 0)))
    shares = [step_gpg(mb.groups([g]), lambda t: [gpg_totals(mb.rewards[:4]), gpg_totals(mb.rewards[4:])])
              for g in range(2)]  # a data-parallel group per share, the step's counts gathered
    torch.testing.assert_close(torch.cat(shares), mb.advantages)
    met = assert_objective_equals(algo, mb, logp, gpg_policy_loss(logp, mb.old_logp, mb.advantages, mb.response_mask,
                                                                  **common)[0])
    assert float(met["adv_abs_mean"]) > 0

    mb.advantages = None
    algo = load_config(None, ["algo.name=dro", "algo.dro_beta=0.2", "algo.kl_coef=0.05"]).algo
    whole, met = objective(algo, mb, logp, None, None, counts, horizon=6)
    want, _ = dro_policy_loss(logp, mb.old_logp, group_advantages(mb.rewards, 4, "grpo"), mb.response_mask,
                              beta=0.2, **common)
    torch.testing.assert_close(whole, want)
    assert "sq_log_ratio" in met


@pytest.mark.parametrize("overrides, key", [
    (["algo.name=dro"], "algo.name=dro needs algo.dro_beta > 0"),
    (["algo.name=dro", "algo.dro_beta=-1"], "algo.dro_beta"),
    (["algo.name=dro", "algo.dro_beta=0.1", "rollout.n=1"], "rollout.n must be >= 2 for algo.name=dro"),
    (["algo.name=gpg", "algo.noise_correction=backward", "algo.noise_rho0=0.1"], "gpg scales its advantages"),
    # the entropy selection multiplied DRO's whole term, its pull to the rollout policy too (sweep of 2026-12-01)
    (["algo.name=dro", "algo.dro_beta=0.1", "algo.entropy_top_frac=0.2"], "not with algo.name=dro (set "
                                                                          "algo.entropy_top_frac=1)"),
])
def test_bad_values_refused_before_loading(overrides, key, tmp_path, capsys):
    assert_refused_before_loading(overrides, key, tmp_path, capsys)


@pytest.mark.parametrize("overrides, idle", [
    (["algo.name=gpg", "algo.clip_high=0.28", "algo.clip_c=5"], ["algo.clip_c", "algo.clip_high"]),
    (["algo.name=grpo", "algo.dro_beta=0.1"], ["algo.dro_beta"]),
    (["algo.name=dro", "algo.dro_beta=0.1", "algo.clip_low=0.1"], ["algo.clip_low"]),
])
def test_idle_keys_are_named(overrides, idle):
    assert unused_keys(overrides) == sorted(idle)


def test_gpg_takes_groups_of_one():
    """GPG's advantage of a group of one is alpha R (verl's mean 0 there): rollout.n=1 is a valid run."""
    from pacs_fast.config import load_config, validate

    validate(load_config(None, ["algo.name=gpg", "rollout.n=1"]), world=1)


@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)  # the session's shared warm-up cache (conftest.py)


@pytest.mark.parametrize("name, extra, metric", [("gpg", [], "learner/adv_abs_mean"),
                                                 ("dro", ["algo.dro_beta=0.1"], "learner/sq_log_ratio")])
def test_two_step_run(tmp_path, cache, name, extra, metric):
    assert_two_step_run(TINY + [f"warmup.cache_dir={cache}", f"algo.name={name}", *extra], tmp_path, [metric])


def test_step_advantage_means_count_the_rows_that_leave_the_loss(seed):
    """gpg (and REINFORCE++) logged adv_abs_mean with truncated rows (learner.mask_truncated) as 0: neither the mean
    over every row, as dppo / dro log, nor over the rows that train (sweep of 2026-12-01)."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.objective import minibatch_counts, objective
    from pacs_fast.trainer.step import step_gpg

    gen = torch.Generator().manual_seed(seed)
    mb = _micro(gen)
    mb.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0], dtype=mb.rewards.dtype)
    mb.truncated = torch.tensor([False, True, True, False, False, True, False, False])
    mb.advantages = step_gpg(mb)
    algo = load_config(None, ["algo.name=gpg"]).algo
    _, met = objective(algo, mb, mb.old_logp.clone(), None, None, minibatch_counts(mb), horizon=6)
    want = gpg_advantages(mb.rewards, 4)
    assert float(met["adv_abs_mean"]) == pytest.approx(float(want.abs().mean()), rel=1e-6)
    assert float(want[mb.truncated].abs().sum()) > 0  # the truncated rows' advantages are not 0: the check can fail


def test_the_steps_warnings_count_every_data_parallel_share():
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.trainer.step import step_shaping_counts

    class World:  # two data-parallel groups: this one's share and the other's
        dp = 2

        def gather_dp(self, mine):
            return [mine, (8, 2.0, 1)]

    batch = RolloutBatch(input_ids=torch.zeros(8, 5, dtype=torch.long), attention_mask=torch.ones(8, 5),
                         response_mask=torch.ones(8, 5), rewards=torch.zeros(8), group_size=4)
    batch.truncated = torch.ones(8, dtype=torch.bool)  # every row of this share
    rows, over, cut = step_shaping_counts(World(), batch, {"reward/overlong_frac": 1.0})
    assert (rows, over, cut) == (16, 10.0, 9)  # not "all 8 truncated, 100% penalised"
    World.dp = 1
    assert step_shaping_counts(World(), batch, {"reward/overlong_frac": 1.0}) == (8, 8.0, 8)
