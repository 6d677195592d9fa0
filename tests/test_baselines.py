"""Baselines (PPO / GRPO / DAPO / Dr. GRPO / RLOO), KL estimators and loss aggregation vs hand-computed cases."""
import math

import pytest
import torch

from pacs_fast.algorithms import (
    LOSS_AGG_MODES,
    aggregate_loss,
    group_advantages,
    grpo_loss,
    kl_penalty,
    policy_loss,
    value_loss,
)

RATIOS = [0.5, 0.9, 1.1, 1.5, 4.0]


def _ratio_case(dtype=torch.float64):
    """Two rows with ratios RATIOS against old_logp = random offsets; advantages +1 and -1."""
    old = -torch.rand(2, 5, dtype=dtype)
    logp = (old + torch.log(torch.tensor([RATIOS, RATIOS], dtype=dtype))).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=dtype)
    return logp, old, adv


def test_ppo_clip_higher_and_dual_clip_by_hand():
    logp, old, adv = _ratio_case()
    loss, m = policy_loss(logp, old, adv, None, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    # A=+1: max(-r, -clip(r, 0.8, 1.28)) = [-0.5, -0.9, -1.1, -1.28, -1.28]
    # A=-1: max(r, clip(r)) = [0.8, 0.9, 1.1, 1.5, 4.0] -> dual clip min(., 3) = [0.8, 0.9, 1.1, 1.5, 3.0]
    per_token = [[-0.5, -0.9, -1.1, -1.28, -1.28], [0.8, 0.9, 1.1, 1.5, 3.0]]
    assert loss.item() == pytest.approx(sum(map(sum, per_token)) / 10, abs=1e-12)
    loss.backward()
    # d/dlogp = d/dr * r; zero where the clipped (or dual-clipped) branch is active
    expected = torch.tensor([[-0.5, -0.9, -1.1, 0.0, 0.0], [0.0, 0.9, 1.1, 1.5, 0.0]], dtype=torch.float64) / 10
    torch.testing.assert_close(logp.grad, expected, rtol=1e-12, atol=1e-14)
    assert m["clip_frac"].item() == pytest.approx(3 / 10)  # (1.5, 4.0 | A>0) and (0.5 | A<0)
    assert m["clip_frac_high"].item() == pytest.approx(2 / 10)
    assert m["clip_frac_low"].item() == pytest.approx(1 / 10)
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 10)
    log_r = torch.log(torch.tensor(RATIOS, dtype=torch.float64))
    assert m["ppo_kl"].item() == pytest.approx(-log_r.mean().item(), abs=1e-12)
    assert m["approx_kl"].item() == pytest.approx((torch.tensor(RATIOS) - 1 - log_r).mean().item(), abs=1e-6)
    for v in m.values():
        assert v.dim() == 0 and not v.requires_grad


def test_ppo_symmetric_clip_without_dual_clip():
    logp, old, adv = _ratio_case()
    loss, m = policy_loss(logp, old, adv, None, clip_low=0.2, clip_c=None)
    per_token = [[-0.5, -0.9, -1.1, -1.2, -1.2], [0.8, 0.9, 1.1, 1.5, 4.0]]
    assert loss.item() == pytest.approx(sum(map(sum, per_token)) / 10, abs=1e-12)
    assert m["dual_clip_frac"].item() == 0.0


def test_ppo_dual_clip_is_on_by_default_at_verls_3():
    """verl's ``clip_ratio_c`` defaults to 3.0 and is always applied: so is ours unless clip_c=None."""
    logp, old, adv = _ratio_case()
    loss, m = policy_loss(logp, old, adv, None, clip_low=0.2)
    per_token = [[-0.5, -0.9, -1.1, -1.2, -1.2], [0.8, 0.9, 1.1, 1.5, 3.0]]  # A=-1, ratio 4 -> 3
    assert loss.item() == pytest.approx(sum(map(sum, per_token)) / 10, abs=1e-12)
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 10)


def test_ppo_mask_and_aggregation_mode():
    logp, old, adv = _ratio_case()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, loss_agg_mode="seq-mean-token-mean")
    # row0 tokens: -0.5, -0.9, -1.1 ; row1 tokens: 0.8, 0.9
    assert loss.item() == pytest.approx(((-2.5 / 3) + (1.7 / 2)) / 2, abs=1e-12)
    loss.backward()
    assert (logp.grad[mask == 0] == 0).all()


def test_ppo_token_level_advantages_and_kl_penalty():
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 4, generator=gen, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.05 * torch.randn(3, 4, generator=gen, dtype=torch.float64)
    ref = logp.detach() + 0.3 * torch.randn(3, 4, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 4, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 4, generator=gen) < 0.8
    mask[0, 0] = True
    base, _ = policy_loss(logp, old, adv, mask, clip_low=0.5)
    with_kl, m = policy_loss(logp, old, adv, mask, clip_low=0.5, logp_ref=ref, kl_coef=0.25, kl_estimator="k2")
    kl = aggregate_loss(0.5 * (logp - ref) ** 2, mask, "token-mean")
    torch.testing.assert_close(with_kl, base + 0.25 * kl)
    torch.testing.assert_close(m["kl"], kl.detach())
    # no clipping active (ratios ~ 1 +- 0.05 within 0.5): loss is the plain surrogate -A * ratio
    plain = (-(adv * torch.exp(logp - old)))[mask].mean()
    torch.testing.assert_close(base, plain)


def test_kl_estimators_by_hand():
    logp = torch.tensor([math.log(0.5), math.log(0.25)], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([math.log(0.25), math.log(0.5)], dtype=torch.float64)
    d = ref - logp.detach()  # [-ln 2, ln 2]
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), -d)
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), 0.5 * d**2)
    k3 = kl_penalty(logp, ref, "k3")
    torch.testing.assert_close(k3, torch.tensor([0.5 + math.log(2) - 1, 2 - math.log(2) - 1], dtype=torch.float64))
    k3.sum().backward()
    torch.testing.assert_close(logp.grad, -(torch.exp(d) - 1))  # d k3 / d logp = 1 - exp(d)
    # k3 is an unbiased estimate of KL(pi || ref): check on an exact categorical expectation
    p = torch.tensor([0.1, 0.2, 0.7], dtype=torch.float64)
    q = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)
    exact = (p * (p.log() - q.log())).sum()
    for est in ("k1", "k3"):
        assert (p * kl_penalty(p.log(), q.log(), est)).sum().item() == pytest.approx(exact.item(), rel=1e-12)


def test_k3_clamp():
    logp = torch.tensor([-40.0, -0.1, -1.0], requires_grad=True)
    ref = torch.tensor([-0.1, -40.0, -1.2])
    out = kl_penalty(logp, ref, "k3", clamp=10.0)
    # d = 39.9 -> clamped to 20 -> exp(20)-21 -> clamped to 10; d = -39.9 -> -20 -> exp(-20)+19 -> 10
    assert out[0].item() == 10.0 and out[1].item() == 10.0
    assert out[2].item() == pytest.approx(math.exp(-0.2) + 0.2 - 1, rel=1e-5)
    out.sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0] == 0 and logp.grad[1] == 0
    unclamped = kl_penalty(logp, ref, "k3")
    assert unclamped[0].item() > 1e16  # exact estimator has no bound


def _agg_case():
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)  # last row empty
    return loss_mat, mask


@pytest.mark.parametrize("mode,kw,expected", [
    ("token-mean", {}, (1 + 2 + 4) / 3),
    ("token-mean", {"global_count": 7}, (1 + 2 + 4) / 7),
    ("seq-mean-token-sum", {}, (3 + 4) / 2),
    ("seq-mean-token-mean", {}, (1.5 + 4) / 2),
    ("seq-mean-token-mean", {"global_count": 4}, (1.5 + 4) / 4),
    ("seq-mean-token-sum-norm", {}, (3 + 4) / 2 / 3),        # Dr. GRPO, verl >= 0.7.1: mean over sequences
    ("seq-mean-token-sum-norm", {"horizon": 10}, (3 + 4) / 2 / 10),
    ("seq-mean-token-sum-norm", {"horizon": 10, "global_count": 4}, (3 + 4) / 4 / 10),
    ("token-sum", {"global_count": 5}, 3 + 4),
    ("token-sum-norm", {}, (3 + 4) / 3),                     # verl <= 0.7.0: a sum over sequences / horizon
    ("token-sum-norm", {"horizon": 10}, (3 + 4) / 10),
    ("token-sum-norm", {"horizon": 10, "global_count": 5}, (3 + 4) / 10),  # ignored: a sum adds up already
])
def test_aggregation_modes_by_hand(mode, kw, expected):
    loss_mat, mask = _agg_case()
    out = aggregate_loss(loss_mat, mask, mode, **kw)
    assert out.item() == pytest.approx(expected, rel=1e-6)
    out.backward()
    assert (loss_mat.grad[~mask] == 0).all()


def test_aggregation_of_an_all_masked_batch_is_zero_with_graph():
    loss_mat = torch.randn(2, 3, requires_grad=True)
    for mode in LOSS_AGG_MODES:
        out = aggregate_loss(loss_mat, torch.zeros(2, 3, dtype=torch.bool), mode)
        assert out.item() == 0.0 and out.requires_grad
        out.backward()
        assert (loss_mat.grad == 0).all()


def test_value_loss_clipping_by_hand():
    values = torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.full((1, 3), 0.5, dtype=torch.float64)
    returns = torch.full((1, 3), 2.0, dtype=torch.float64)
    loss, m = value_loss(values, old, returns, None, clip_range=0.2)
    # clipped values [0.7, 0.7, 0.3]; unclipped sq err [1, 0, 4]; clipped [1.69, 1.69, 2.89]
    assert loss.item() == pytest.approx(0.5 * (1.69 + 1.69 + 4.0) / 3, rel=1e-12)
    assert m["vf_clip_frac"].item() == pytest.approx(2 / 3)
    loss.backward()
    # tokens 0 and 1: the clipped branch wins and the clipped value does not move -> grad 0
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.0, (0.0 - 2.0) / 3]], dtype=torch.float64))
    unclipped, _ = value_loss(values, old, returns, None, clip_range=None)
    assert unclipped.item() == pytest.approx(0.5 * (1 + 0 + 4) / 3)


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    s = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    grpo = group_advantages(rewards, 4, "grpo")
    torch.testing.assert_close(grpo, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) / (s + 1e-6))
    torch.testing.assert_close(group_advantages(rewards, 4, "dr_grpo"), torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))
    torch.testing.assert_close(group_advantages(rewards, 4, "grpo", norm_std=False),
                               group_advantages(rewards, 4, "dr_grpo"))
    # rloo: R_i - mean of the others: 1 - 1/3, 0 - 2/3
    torch.testing.assert_close(group_advantages(rewards, 4, "rloo"),
                               torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0]))
    assert not group_advantages(rewards.requires_grad_(True), 4).requires_grad


def test_grpo_loss_is_policy_loss_with_group_advantages(seed):
    gen = torch.Generator().manual_seed(seed)
    logp = (-torch.rand(6, 5, generator=gen)).requires_grad_(True)
    old = logp.detach() + 0.2 * torch.randn(6, 5, generator=gen)
    ref = logp.detach() + 0.2 * torch.randn(6, 5, generator=gen)
    mask = torch.rand(6, 5, generator=gen) < 0.8
    rewards = (torch.rand(6, generator=gen) < 0.5).float()
    for adv_mode in ("grpo", "dr_grpo", "rloo"):
        kw = dict(clip_low=0.2, clip_high=0.28, clip_c=3.0, loss_agg_mode="seq-mean-token-sum-norm",
                  horizon=8, logp_ref=ref, kl_coef=0.01, kl_clamp=10.0)
        a, ma = grpo_loss(logp, old, mask, rewards, group_size=3, advantage=adv_mode, **kw)
        adv = group_advantages(rewards, 3, adv_mode)
        b, mb = policy_loss(logp, old, adv, mask, **kw)
        torch.testing.assert_close(a, b)
        assert set(mb) <= set(ma) and "adv_mean" in ma


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_global_count_makes_micro_batches_add_up(seed, mode):
    gen = torch.Generator().manual_seed(seed)
    loss_mat = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = torch.rand(6, 5, generator=gen) < 0.6
    mask[4] = False
    full = aggregate_loss(loss_mat, mask, mode, horizon=7)
    count = float(mask.sum()) if mode == "token-mean" else float((mask.sum(-1) > 0).sum())
    parts = sum(aggregate_loss(loss_mat[s], mask[s], mode, horizon=7, global_count=count)
                for s in (slice(0, 2), slice(2, 6)))
    torch.testing.assert_close(parts, full, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_global_count_over_data_parallel_ranks_is_divided_by_the_world_size(seed, mode):
    """DDP averages the ranks' gradients: with the documented ``global_count`` (the count over every rank
    / world) the average of the ranks' gradients is the whole batch's; the count alone gives 1/world of it."""
    gen = torch.Generator().manual_seed(seed)
    loss_mat = torch.randn(8, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(8, 5, generator=gen) < 0.6
    mask[1] = False
    (full,) = torch.autograd.grad(aggregate_loss(loss_mat, mask, mode, horizon=7), loss_mat)
    count = float(mask.sum()) if mode == "token-mean" else float((mask.sum(-1) > 0).sum())
    world = 2
    for gc, want in ((count / world, full), (count, full / world)):
        ranks = [torch.autograd.grad(aggregate_loss(loss_mat[s], mask[s], mode, horizon=7, global_count=gc),
                                     loss_mat)[0] for s in (slice(0, 4), slice(4, 8))]
        torch.testing.assert_close(sum(ranks) / world, want, rtol=1e-12, atol=1e-12)  # DDP's all-reduce mean
