"""GAE against a direct recursive implementation written in the test."""
import pytest
import torch

from pacs_fast.algorithms import gae
from pacs_fast.algorithms.advantages import masked_whiten


def recursive_gae(rewards, values, mask, gamma, lam):
    """Per row, over the response tokens only: A_k = delta_k + gamma*lam*A_{k+1}, V after the end = 0."""
    B, T = len(rewards), len(rewards[0])
    adv = [[0.0] * T for _ in range(B)]
    ret = [[0.0] * T for _ in range(B)]
    for i in range(B):
        steps = [t for t in range(T) if mask[i][t]]

        def a(k):
            if k == len(steps):
                return 0.0
            t = steps[k]
            v_next = values[i][steps[k + 1]] if k + 1 < len(steps) else 0.0
            delta = rewards[i][t] + gamma * v_next - values[i][t]
            return delta + gamma * lam * a(k + 1)

        for k, t in enumerate(steps):
            adv[i][t] = a(k)
            ret[i][t] = adv[i][t] + values[i][t]
    return torch.tensor(adv, dtype=torch.float64), torch.tensor(ret, dtype=torch.float64)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.7), (0.8, 1.0)])
def test_gae_matches_recursion(seed, gamma, lam):
    gen = torch.Generator().manual_seed(seed)
    B, T = 4, 9
    rewards = torch.randn(B, T, generator=gen, dtype=torch.float64)
    values = torch.randn(B, T, generator=gen, dtype=torch.float64)
    mask = torch.rand(B, T, generator=gen) < 0.7  # holes in the middle (multi-turn observation tokens)
    mask[1] = False  # an empty row
    mask[2] = True
    adv, ret = gae(rewards, values, mask, gamma=gamma, lam=lam, whiten=False)
    want_adv, want_ret = recursive_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    torch.testing.assert_close(adv, want_adv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret, want_ret, rtol=1e-12, atol=1e-12)
    assert not adv.requires_grad


def test_gae_gamma_lam_one_is_reward_to_go_minus_value(seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.zeros(3, 6)
    rewards[:, -1] = torch.rand(3, generator=gen)  # outcome reward on the last token
    values = torch.randn(3, 6, generator=gen).requires_grad_(True)
    adv, ret = gae(rewards, values, None, gamma=1.0, lam=1.0, whiten=False)
    torch.testing.assert_close(ret, rewards[:, -1:].expand(3, 6))
    torch.testing.assert_close(adv, rewards[:, -1:] - values.detach())


def test_gae_whitening(seed):
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    values = torch.randn(3, 7, generator=gen, dtype=torch.float64)
    mask = torch.rand(3, 7, generator=gen) < 0.6
    mask[0, :2] = True
    raw, ret = gae(rewards, values, mask, gamma=0.95, lam=0.9, whiten=False)
    white, ret2 = gae(rewards, values, mask, gamma=0.95, lam=0.9)
    torch.testing.assert_close(ret, ret2)
    sel = raw[mask]
    torch.testing.assert_close(white[mask], (sel - sel.mean()) / torch.sqrt(sel.var() + 1e-8))
    assert (white[~mask] == 0).all()
    torch.testing.assert_close(masked_whiten(raw, mask, shift_mean=False)[mask],
                               (sel - sel.mean()) / torch.sqrt(sel.var() + 1e-8) + sel.mean())


def test_gae_and_the_baselines_make_no_host_sync(seed):
    """GAE's whitening picked its reference entry by indexing with a 0-d tensor, an ``.item()`` on the host
    (a stall inside a PPO step, against its own comment); under ``NoHostSync`` the baselines' advantage and
    loss functions run on the device alone and give the values of a call outside it."""
    from test_kernel_dispatch import NoHostSync

    from pacs_fast.algorithms import group_advantages, grpo_loss, policy_loss

    B, T = 6, 9
    r, v = torch.randn(B, T), torch.randn(B, T)
    mask = torch.rand(B, T) < 0.7
    mask[:, 0] = True
    logp, old = -torch.rand(B, T), -torch.rand(B, T)
    rewards = (torch.rand(B) < 0.5).float()
    runs = []
    for mode in (NoHostSync, torch.no_grad):
        with mode():
            adv, ret = gae(r, v, mask, gamma=0.99, lam=0.95)
            runs.append([adv, ret, masked_whiten(r, mask), group_advantages(rewards, 3, "grpo"),
                         policy_loss(logp, old, adv, mask)[0], grpo_loss(logp, old, mask, rewards, group_size=3)[0]])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_gae_runs_on_meta_tensors():
    """(It raised "Tensor.item() cannot be called on meta tensors", the same host read.)"""
    adv, ret = gae(torch.randn(4, 6, device="meta"), torch.randn(4, 6, device="meta"),
                   torch.ones(4, 6, device="meta"))
    assert adv.shape == ret.shape == (4, 6) and adv.device.type == "meta"
