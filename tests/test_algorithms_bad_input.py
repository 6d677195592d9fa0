"""Bad input to the algorithm functions: ValueError naming the argument."""
import pytest
import torch

from pacs_fast.algorithms import (
    aggregate_loss,
    class_balanced_weights,
    gae,
    group_advantages,
    group_scores,
    grpo_loss,
    kl_penalty,
    pacs_loss,
    policy_loss,
    reward_proxy,
    value_loss,
)

B, T = 4, 3


def _ok():
    return -torch.rand(B, T), -torch.rand(B, T), torch.ones(B, T, dtype=torch.bool), torch.tensor([1.0, 0, 0, 1])


def _pacs(**over):
    logp, ref, mask, rewards = _ok()
    args = dict(logp=logp, logp_ref=ref, mask=mask, rewards=rewards)
    kw = dict(group_size=2)
    for k, v in over.items():
        (args if k in args else kw)[k] = v
    return pacs_loss(args["logp"], args["logp_ref"], args["mask"], args["rewards"], **kw)


@pytest.mark.parametrize("over,match", [
    (dict(group_size=3), "group_size"),
    (dict(group_size=0), "group_size"),
    (dict(group_size=2.0), "group_size"),
    (dict(group_size=1, score="rloo"), "group_size=1 .*rloo"),
    (dict(group_size=1, score="grpo"), "group_size=1 .*grpo"),
    (dict(group_size=1, score="dr_grpo"), "group_size=1 .*dr_grpo"),  # psi = r - mean = 0: no gradient, ever
    (dict(score="ppo"), "score"),
    (dict(weight_mode="balanced"), "weight_mode"),
    (dict(proxy="logp"), "proxy"),
    (dict(backend="cuda"), "backend"),
    (dict(beta=float("nan")), "beta"),
    (dict(beta="1"), "beta"),
    (dict(logp_ref=-torch.rand(B, T + 1)), "logp_ref"),
    (dict(logp_ref=None), "logp_ref"),
    (dict(mask=torch.ones(B, T + 1)), "mask"),
    (dict(rewards=torch.ones(B + 2)), "rewards"),
    (dict(rewards=torch.ones(B, 1)), "rewards"),
    (dict(logp=-torch.rand(B * T)), "logp"),
    (dict(logp=torch.zeros(B, T, dtype=torch.long)), "logp"),
    (dict(logp=[[0.0] * T] * B), "logp"),
    (dict(cu_seqlens=torch.tensor([0, 3, 6, 9, 12])), "logp"),  # packed needs 1-D logp
])
def test_pacs_loss_bad_input(over, match):
    with pytest.raises(ValueError, match=match):
        _pacs(**over)


def test_pacs_loss_group_size_one_allowed_for_naive():
    assert torch.isfinite(_pacs(group_size=1, score="naive"))


@pytest.mark.parametrize("cu,match", [
    (torch.tensor([0, 4, 8, 12]), "rewards"),  # B = 3 sequences but 4 rewards
    (torch.tensor([1, 3, 6, 9, 12]), "cu_seqlens"),
    (torch.tensor([0, 3, 6, 9, 11]), "cu_seqlens"),
    (torch.tensor([0, 6, 3, 9, 12]), "cu_seqlens"),
    (torch.tensor([0.0, 3, 6, 9, 12]), "cu_seqlens"),
    (torch.tensor([[0, 3, 6, 9, 12]]), "cu_seqlens"),
])
def test_pacs_loss_bad_cu_seqlens(cu, match):
    logp = -torch.rand(12)
    with pytest.raises(ValueError, match=match):
        pacs_loss(logp, logp, None, torch.tensor([1.0, 0, 0, 1]), group_size=2, cu_seqlens=cu)


def test_pacs_pieces_bad_input():
    logp, ref, mask, rewards = _ok()
    with pytest.raises(ValueError, match="proxy"):
        reward_proxy(logp, ref, mask, proxy="ratio")
    with pytest.raises(ValueError, match="logp_ref"):
        reward_proxy(logp, ref[:, :2], mask)
    with pytest.raises(ValueError, match="score"):
        group_scores(torch.zeros(4), 2, "z")
    with pytest.raises(ValueError, match="group_size"):
        group_scores(torch.zeros(4), 3)
    with pytest.raises(ValueError, match="group_size=1"):
        group_scores(torch.zeros(4), 1, "rloo")
    with pytest.raises(ValueError, match="proxy"):
        group_scores(torch.zeros(4, 1), 2)
    with pytest.raises(ValueError, match="weight_mode"):
        class_balanced_weights(rewards, 2, "balanced")
    with pytest.raises(ValueError, match="group_size"):
        class_balanced_weights(rewards, 3)


def test_baselines_bad_input():
    logp, ref, mask, rewards = _ok()
    adv = torch.randn(B)
    with pytest.raises(ValueError, match="old_logp"):
        policy_loss(logp, ref[:, :2], adv, mask)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, ref, torch.randn(B + 1), mask)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, ref, torch.randn(B, T + 1), mask)
    with pytest.raises(ValueError, match="mask"):
        policy_loss(logp, ref, adv, mask[:, :2])
    with pytest.raises(ValueError, match="loss_agg_mode"):
        policy_loss(logp, ref, adv, mask, loss_agg_mode="sum")
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss(logp, ref, adv, mask, clip_c=0.9)
    with pytest.raises(ValueError, match="clip_low"):
        policy_loss(logp, ref, adv, mask, clip_low=1.5)
    with pytest.raises(ValueError, match="clip_high"):
        policy_loss(logp, ref, adv, mask, clip_high=-0.1)
    with pytest.raises(ValueError, match="logp_ref"):
        policy_loss(logp, ref, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_estimator"):
        policy_loss(logp, ref, adv, mask, kl_estimator="k4")
    bad = logp.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="old_logp contains NaN"):
        policy_loss(logp, bad, adv, mask, check_finite=True)
    with pytest.raises(ValueError, match="group_size"):
        grpo_loss(logp, ref, mask, rewards, group_size=3)
    with pytest.raises(ValueError, match="mode"):
        grpo_loss(logp, ref, mask, rewards, group_size=2, advantage="ppo")
    with pytest.raises(ValueError, match="rewards"):
        grpo_loss(logp, ref, mask, torch.ones(B + 2), group_size=2)
    # a group of one response has no baseline: the advantage is R (verl; tests/test_verl_semantics.py)
    for mode in ("grpo", "rloo", "dr_grpo"):
        assert torch.isfinite(group_advantages(rewards, 1, mode)).all()
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(logp, ref, "kl")
    with pytest.raises(ValueError, match="clamp"):
        kl_penalty(logp, ref, "k1", clamp=10.0)
    with pytest.raises(ValueError, match="logp_ref"):
        kl_penalty(logp, ref[:2])
    with pytest.raises(ValueError, match="mode"):
        aggregate_loss(logp, mask, "mean")
    with pytest.raises(ValueError, match="horizon"):
        aggregate_loss(logp, mask, "seq-mean-token-sum-norm", horizon=0)
    with pytest.raises(ValueError, match="loss_mat"):
        aggregate_loss(logp[0], mask[0])
    with pytest.raises(ValueError, match="returns"):
        value_loss(logp, ref, ref[:, :1], mask)
    with pytest.raises(ValueError, match="clip_range"):
        value_loss(logp, ref, ref, mask, clip_range=-1.0)
    with pytest.raises(ValueError, match="values"):
        gae(logp, logp[:, :2], mask)
    with pytest.raises(ValueError, match="gamma"):
        gae(logp, logp, mask, gamma=1.5)
    with pytest.raises(ValueError, match="mask"):
        gae(logp, logp, mask[:2])


def test_eps_zero_never_gives_nan_for_a_group_of_equal_values():
    """eps = 0 was accepted and an all-correct group (std 0) gave 0 / 0: NaN advantages and a NaN grpo_loss
    (algorithms sweep). Advantages take 0 there, as with eps > 0; the differentiable PACS score refuses 0
    (its gradient at equal proxies, every on-policy first step, is 1/eps)."""
    from pacs_fast.algorithms import grpo_loss, group_advantages, group_scores

    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    adv = group_advantages(rewards, 4, "grpo", eps=0.0)
    assert torch.equal(adv[:4], torch.zeros(4))
    torch.testing.assert_close(adv[4:], (rewards[4:] - 0.5) / rewards[4:].std(), rtol=0, atol=0)
    logp = -torch.rand(8, 3, requires_grad=True)
    loss, _ = grpo_loss(logp, logp.detach(), None, rewards, group_size=4, eps=0.0)
    assert torch.isfinite(loss)
    with pytest.raises(ValueError, match=r"^group_scores: eps must be > 0, got 0.0"):
        group_scores(torch.zeros(4), 4, "grpo", eps=0.0)


def test_auto_backend_takes_torch_past_the_fused_kernels_group_limit(monkeypatch):
    """backend='auto' on CUDA resolves to the fused kernel, which takes G <= 1024: G = 1030 raised 'use
    backend=torch' instead of taking it (algorithms sweep). Simulated here: auto resolves to triton."""
    import pacs_fast.ops.backend as backend_mod

    monkeypatch.setattr(backend_mod, "resolve_backend", lambda backend, *tensors: "triton")
    G = 1030
    g = torch.Generator().manual_seed(0)
    logp, ref = -torch.rand(G, 3, generator=g, dtype=torch.float64), -torch.rand(G, 3, generator=g, dtype=torch.float64)
    rewards = (torch.rand(G, generator=g) < 0.5).double()
    auto = pacs_loss(logp, ref, None, rewards, group_size=G, backend="auto")
    assert torch.equal(auto, pacs_loss(logp, ref, None, rewards, group_size=G, backend="torch"))


def test_small_integer_cu_seqlens_and_numpy_scalars_are_taken():
    """cu_seqlens of int16 / int8 / uint8 raised NotImplementedError in the torch path (segment_reduce);
    numpy's int64 group_size and float32 beta were refused as not an int / not a real number."""
    import numpy as np

    g = torch.Generator().manual_seed(1)
    logp, ref = -torch.rand(10, generator=g, dtype=torch.float64), -torch.rand(10, generator=g, dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    cu = torch.tensor([0, 3, 5, 6, 10])
    want = pacs_loss(logp, ref, None, rewards, group_size=2, beta=0.5, cu_seqlens=cu)
    for dtype in (torch.int16, torch.int8, torch.uint8, torch.int32):
        assert torch.equal(pacs_loss(logp, ref, None, rewards, group_size=2, beta=0.5, cu_seqlens=cu.to(dtype)), want)
    assert torch.equal(pacs_loss(logp, ref, None, rewards, group_size=np.int64(2), beta=np.float32(0.5),
                                 cu_seqlens=cu), want)


def test_complex_rewards_are_refused_by_the_advantages_as_by_pacs_loss():
    from pacs_fast.algorithms import group_advantages
    with pytest.raises(ValueError, match=r"^group_advantages: rewards must be real numbers, got torch.complex64"):
        group_advantages(torch.tensor([1 + 1j, 0j]), 2)
    assert torch.equal(group_advantages(torch.tensor([True, False]), 2, "dr_grpo"), torch.tensor([0.5, -0.5]))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_nan_or_inf_reward_is_never_a_zero_grpo_advantage(bad):
    """``torch.where(scale > 0, ..., 0)`` read a NaN std as "equal rewards": the group got advantage 0 and
    left training without a sign, while "rloo" / "dr_grpo" gave NaN. Now every mode gives NaN, and
    ``grpo_loss(check_finite=True)`` names the rewards (it named policy_loss's advantages, or nothing)."""
    rewards = torch.tensor([bad, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    for mode in ("grpo", "dr_grpo", "rloo"):
        adv = group_advantages(rewards, 4, mode)
        assert adv[:4].isnan().all() and adv[4:].isfinite().all(), mode
    assert torch.equal(group_advantages(torch.ones(4), 4, "grpo", eps=0.0), torch.zeros(4))  # equal: still 0
    logp, old = -torch.rand(8, 3), -torch.rand(8, 3)
    for mode in ("grpo", "rloo"):
        with pytest.raises(ValueError, match=r"^grpo_loss: rewards contains NaN or Inf"):
            grpo_loss(logp, old, None, rewards, group_size=4, advantage=mode, check_finite=True)


def test_the_value_checks_pass_over_meta_tensors():
    """A meta tensor has no values: ``check_finite=True`` raised "Tensor.item() cannot be called on meta
    tensors" (shape tracing with the checks on); now the checks pass over it and the shapes come out."""
    m = dict(device="meta")
    loss = pacs_loss(torch.randn(4, 3, **m), torch.randn(4, 3, **m), torch.ones(4, 3, **m), torch.ones(4, **m),
                     group_size=2, check_finite=True)
    assert loss.device.type == "meta" and loss.shape == ()
    loss, _ = policy_loss(torch.randn(4, 3, **m), torch.randn(4, 3, **m), torch.randn(4, **m), None,
                          check_finite=True)
    assert loss.device.type == "meta"


def test_group_scores_compute_in_fp32_for_half_inputs(seed):
    """bf16 proxies were scored in bf16 (7.6e-3 off on grpo scores near 1.8) while pacs_loss scores in fp32;
    now computed in fp32 and returned in the input's dtype: one rounding of the fp32 result."""
    proxy = torch.randn(16, dtype=torch.float64) * 3
    for score in ("rloo", "grpo", "dr_grpo"):
        got = group_scores(proxy.to(torch.bfloat16), 4, score)
        want = group_scores(proxy.to(torch.bfloat16).float(), 4, score).to(torch.bfloat16)
        assert got.dtype == torch.bfloat16 and torch.equal(got, want), score
