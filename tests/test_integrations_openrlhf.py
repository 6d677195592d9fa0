"""The OpenRLHF adapter (pacs_fast.integrations.openrlhf), tested against SIGNATURES COPIED from
openrlhf 0.11.2 into tests/fixtures/openrlhf_0_11_2_signatures.py, not against the installed
package: ``openrlhf.models`` imports DeepSpeed and flash-attn, which do not install on this CPU
machine (flash-attn's build needs CUDA). The tests check that PACSPolicyLoss can be called exactly
as OpenRLHF's PPOActor calls PolicyLoss (same parameters, same 5-tuple), and that its loss equals
pacs_fast.pacs_loss in float64.
"""
from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pacs_fast.algorithms.pacs import pacs_loss
from pacs_fast.integrations.openrlhf import PACSPolicyLoss, check_args, pacs_advantages

TOL = 1e-10  # float64 on both sides, same formulas: only summation-order rounding (~1e-15)


def _fixture():
    path = Path(__file__).parent / "fixtures" / "openrlhf_0_11_2_signatures.py"
    spec = importlib.util.spec_from_file_location("openrlhf_0_11_2_signatures", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _experiences(P, n, A, seed, per_exp):
    """OpenRLHF-shaped experiences: samples prompt-major (index p*n + j), split into chunks of
    ``per_exp`` samples as the rollout micro-batches produce them."""
    g = torch.Generator().manual_seed(seed)
    B = P * n
    lengths = torch.randint(1, A + 1, (B,), generator=g)
    mask = torch.arange(A)[None, :] < lengths[:, None]
    R = (torch.rand(B, generator=g) < 0.5).double()
    exps = [SimpleNamespace(rewards=R[s:s + per_exp].float(), index=list(range(s, min(s + per_exp, B))),
                            action_mask=mask[s:s + per_exp], advantages=None, returns=None)
            for s in range(0, B, per_exp)]
    logp = (-3 * torch.rand(B, A, generator=g, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(B, A, generator=g, dtype=torch.float64)
    return exps, R, mask, logp, old


def test_forward_signature_matches_openrlhf_policy_loss():
    ref = inspect.signature(_fixture().PolicyLoss.forward)
    ours = inspect.signature(PACSPolicyLoss.forward)
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == \
           [(p.name, p.kind, p.default) for p in ref.parameters.values()]
    assert inspect.signature(pacs_advantages).parameters["experiences"]


@pytest.mark.parametrize("score", ["rloo", "grpo", "dr_grpo", "naive"])
@pytest.mark.parametrize("P,n,A,seed", [(2, 4, 6, 0), (3, 5, 7, 1)])
def test_loss_equals_pacs_loss_float64(score, P, n, A, seed):
    exps, R, mask, logp, old = _experiences(P, n, A, seed, per_exp=3)
    pacs_advantages(exps, n)
    adv = torch.cat([e.advantages for e in exps])
    loss_fn = PACSPolicyLoss(group_size=n, score=score, beta=0.8)
    # called exactly as PPOActor.training_step calls PolicyLoss (loss_batch_info keywords)
    out = loss_fn(logp, old, adv, action_mask=mask, rollout_log_probs=None,
                  dp_size=1, batch_num_tokens=None, global_batch_size=None)
    assert len(out) == len(_fixture().POLICY_LOSS_RETURNS)
    loss, clip_ratio, ppo_kl, vllm_kl, is_filter_ratio = out
    assert vllm_kl is None and is_filter_ratio is None and float(clip_ratio) == 0.0
    (grad,) = torch.autograd.grad(loss, logp)
    x = logp.detach().clone().requires_grad_()
    ref = pacs_loss(x, old, mask, R, group_size=n, score=score, beta=0.8)
    (ref_grad,) = torch.autograd.grad(ref, x)
    assert abs(float(loss.detach()) - float(ref.detach())) <= TOL
    assert float((grad - ref_grad).abs().max()) <= TOL
    expected_kl = float(((old - logp.detach()) * mask).sum() / mask.sum())
    assert abs(float(ppo_kl) - expected_kl) <= TOL
    assert {"pacs/psi_mean", "pacs/brier", "pacs/loss"} <= set(loss_fn.last_metrics)


def test_global_batch_size_scales_like_per_sample_mode():
    exps, R, mask, logp, old = _experiences(2, 4, 5, 2, per_exp=8)
    pacs_advantages(exps, 4)
    adv = exps[0].advantages
    fn = PACSPolicyLoss(group_size=4)
    plain = fn(logp, old, adv, action_mask=mask)[0]
    scaled = fn(logp, old, adv, action_mask=mask, dp_size=4, global_batch_size=64)[0]
    assert abs(float(scaled.detach()) - float(plain.detach()) * 8 / 64 * 4) <= TOL
    # the metric is the micro-batch's mean loss whatever the scaling (it was the scaled value)
    assert fn.last_metrics["pacs/loss"] == pytest.approx(float(plain.detach()), abs=TOL)


@pytest.mark.parametrize("beta", [0.0, -1.0, float("inf"), None])
def test_a_beta_that_cannot_train_is_refused(beta):
    with pytest.raises(ValueError, match=r"^PACSPolicyLoss: beta must be a finite number > 0"):
        PACSPolicyLoss(group_size=4, beta=beta)


def test_a_group_of_one_with_a_group_score_is_refused_when_built():
    """It was accepted and failed at the first update, in pacs_loss's words (after the rollouts)."""
    with pytest.raises(ValueError, match=r"^PACSPolicyLoss: group_size=1 \(n_samples_per_prompt\) is not allowed "
                                         r"with score='rloo'"):
        PACSPolicyLoss(group_size=1)
    PACSPolicyLoss(group_size=1, score="naive")  # a score of the response alone takes groups of one


def test_a_call_without_action_mask_names_it():
    exps, R, mask, logp, old = _experiences(2, 4, 5, 2, per_exp=8)
    pacs_advantages(exps, 4)
    with pytest.raises(ValueError, match=r"^PACSPolicyLoss needs action_mask"):
        PACSPolicyLoss(group_size=4)(logp, old, exps[0].advantages)
    exps[0].action_mask = None
    with pytest.raises(ValueError, match=r"^pacs_advantages: experience.action_mask is None"):
        pacs_advantages(exps, 4)


def test_shuffled_replay_buffer_gives_a_clear_error():
    exps, R, mask, logp, old = _experiences(2, 4, 5, 3, per_exp=8)
    pacs_advantages(exps, 4)
    adv = exps[0].advantages
    perm = torch.tensor([5, 1, 2, 3, 4, 0, 6, 7])  # rows 0 and 5 trade groups, as a shuffle does
    fn = PACSPolicyLoss(group_size=4)
    with pytest.raises(ValueError, match="replay buffer not shuffled"):
        fn(logp[perm], old[perm], adv[perm], action_mask=mask[perm])
    with pytest.raises(ValueError, match="whole groups of 4"):
        fn(logp[:6], old[:6], adv[:6], action_mask=mask[:6])
    with pytest.raises(ValueError, match="advantages from pacs_advantages"):
        fn(logp, old, adv - 0.5 * mask, action_mask=mask)  # an ordinary (centred) advantage


def test_check_args_names_the_settings():
    ok = SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=8),
                         train=SimpleNamespace(micro_batch_size=16, dynamic_batch_enable=False),
                         ds=SimpleNamespace(packing_samples=False),
                         algo=SimpleNamespace(kl=SimpleNamespace(init_coef=0.0, use_loss=False)))
    check_args(ok)
    ok.train.micro_batch_size = 12
    ok.algo.kl.init_coef = 0.01
    with pytest.raises(ValueError) as e:
        check_args(ok)
    assert "train.micro_batch_size (12)" in str(e.value) and "algo.kl.init_coef" in str(e.value)
    ok.train.micro_batch_size, ok.algo.kl.init_coef = 16, 0.0
    # vLLM IS correction: not applied by PACS (0.11.2's switch, cli/train_ppo_ray.py; there was no
    # is_correction_enable, which the check read, so it passed)
    ok.algo.advantage = SimpleNamespace(is_correction_level="token")
    with pytest.raises(ValueError, match="algo.advantage.is_correction_level must be off"):
        check_args(ok)
    ok.algo.advantage.is_correction_level = "off"
    check_args(ok)
    # a missing count read as 1: "must be >= 2 (got 1)" for a user who set 8 in an older release's flat args
    with pytest.raises(ValueError, match=r"the args hold no rollout.n_samples_per_prompt \(check_args reads OpenRLHF "
                                         r"0.11.2's nested args, these look like an older release's flat ones\)"):
        check_args(SimpleNamespace(n_samples_per_prompt=8, micro_train_batch_size=6))
    with pytest.raises(ValueError, match=r"the args hold no train.micro_batch_size \(check_args reads"):
        check_args(SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=8)))


def test_the_loss_refuses_rollout_log_probs_it_would_ignore():
    exps, R, mask, logp, old = _experiences(2, 4, 3, 4, per_exp=8)
    pacs_advantages(exps, 4)
    fn = PACSPolicyLoss(group_size=4)
    fn(logp, old, exps[0].advantages, action_mask=mask)
    with pytest.raises(ValueError, match="rollout_log_probs: OpenRLHF's importance-sampling correction is on"):
        fn(logp, old, exps[0].advantages, action_mask=mask, rollout_log_probs=old)


def test_rewards_as_python_lists_and_a_reward_just_above_one():
    exps, R, mask, logp, old = _experiences(2, 4, 3, 4, per_exp=8)
    want = [e.rewards.clone() for e in exps]
    exps_list, *_ = _experiences(2, 4, 3, 4, per_exp=8)
    for e in exps_list:
        e.rewards = [bool(x) for x in e.rewards.tolist()]  # AttributeError: 'bool' object has no attribute 'all'
    pacs_advantages(exps, 4)
    pacs_advantages(exps_list, 4)
    assert all(torch.equal(a.advantages, b.advantages) for a, b in zip(exps, exps_list))
    assert [e.rewards for e in exps] and all(torch.equal(w, e.rewards) for w, e in zip(want, exps))
    exps[0].rewards = exps[0].rewards * 0 + torch.tensor(1.0000001, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"max 1\.0000001192092896"):  # ".4g" printed it as 1
        pacs_advantages(exps, 4)


def test_rewards_outside_unit_interval_are_refused():
    exps, *_ = _experiences(1, 4, 3, 4, per_exp=4)
    exps[0].rewards = exps[0].rewards * 0 + 1.5
    with pytest.raises(ValueError, match=r"rewards must lie in \[0, 1\]"):
        pacs_advantages(exps, 4)


@pytest.mark.parametrize("group_size", [4.7, 4.0, "4", True])
def test_a_group_size_that_is_not_an_integer_is_refused(group_size):
    """4.7 was truncated to groups of 4 without a word (``int(group_size)``)."""
    with pytest.raises(ValueError, match=r"^PACSPolicyLoss: group_size must be an integer >= 1"):
        PACSPolicyLoss(group_size=group_size)
    exps, *_ = _experiences(1, 4, 3, 5, per_exp=4)
    with pytest.raises(ValueError, match=r"^pacs_advantages: n_samples_per_prompt must be an integer >= 1"):
        pacs_advantages(exps, group_size)


def test_groups_sixteen_apart_in_one_micro_batch_are_caught():
    """The group tag was the group's index mod 16, so a micro-batch holding half of group 0 and half of
    group 16 (rows a shuffle brought together) read as one group and trained on a wrong score. With 0/1
    rewards the tag is now 1 + mod 127: they are told apart; groups 127 apart still look alike (documented)."""
    n = 2
    exps, R, mask, logp, old = _experiences(130, n, 4, 6, per_exp=260)
    pacs_advantages(exps, n)
    adv = exps[0].advantages
    fn = PACSPolicyLoss(group_size=n)
    for far in (16, 64):  # runs [group 0, group far], [group 1, group far + 1]: four split groups
        rows = torch.tensor([0, n * far, n, n * (far + 1)])
        with pytest.raises(ValueError, match="replay buffer not shuffled"):
            fn(logp[rows], old[rows], adv[rows], action_mask=mask[rows])
    rows = torch.tensor([0, n * 127, n, n * 128])  # the documented blind spot
    fn(logp[rows], old[rows], adv[rows], action_mask=mask[rows])


def test_check_args_refuses_a_count_that_is_not_an_integer():
    args = SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=4.0),
                           train=SimpleNamespace(micro_batch_size=16, dynamic_batch_enable=False))
    with pytest.raises(ValueError, match=r"^PACS in OpenRLHF: rollout.n_samples_per_prompt must be an integer"):
        check_args(args)
    args.rollout.n_samples_per_prompt, args.train.micro_batch_size = 4, 16.5
    with pytest.raises(ValueError, match=r"^PACS in OpenRLHF: train.micro_batch_size must be an integer"):
        check_args(args)


def test_one_tag_range_for_every_experience_of_a_batch():
    """Experiences are encoded one by one: one of 0/1 rewards took tags mod 128 and one with a soft reward mod 16,
    so their groups could share a tag. The batch now takes one range: 1 + mod 15 as soon as one reward is soft."""
    from pacs_fast.integrations._groups import decode_tagged_advantages

    exps, R, mask, logp, old = _experiences(20, 2, 3, 7, per_exp=20)
    exps[1].rewards = exps[1].rewards * 0 + 0.5  # soft rewards in the second experience only
    pacs_advantages(exps, 2)
    tags = torch.cat([decode_tagged_advantages(e.advantages, e.action_mask, "fix")[1] for e in exps])
    assert torch.equal(tags, 1 + torch.arange(20).repeat_interleave(2) % 15)


def _ok_args(**reward):
    return SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=4),
                           train=SimpleNamespace(micro_batch_size=8), reward=SimpleNamespace(**reward))


def test_an_installed_openrlhf_of_another_version_is_refused(monkeypatch):
    """The loss returns 0.11.2's 5-tuple; 0.11.0's PolicyLoss returns 4 values and its trainer unpacks 4, so the
    supported version is exact ("0.11" had let 0.11.0 through). Not installed: nothing to check."""
    from importlib import metadata

    import pacs_fast.integrations.openrlhf as po

    assert po.SUPPORTED_OPENRLHF == "0.11.2"
    real = metadata.version
    installed = {"openrlhf": "0.11.0"}

    def version(name):
        if name != "openrlhf":
            return real(name)
        if name not in installed:
            raise metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(metadata, "version", version)
    for build in (lambda: PACSPolicyLoss(group_size=4), lambda: check_args(_ok_args())):
        with pytest.raises(ValueError, match=r"openrlhf 0\.11\.0 is installed, but the adapter supports openrlhf "
                                             r"0\.11\.2 only") as e:
            build()
        assert "\n" not in str(e.value)
    installed["openrlhf"] = "0.11.2"
    PACSPolicyLoss(group_size=4)
    check_args(_ok_args())
    del installed["openrlhf"]
    PACSPolicyLoss(group_size=4)
    check_args(_ok_args())


def test_check_args_refuses_openrlhf_0_11_0s_correction_switch():
    """0.11.0 names its vLLM correction switch algo.advantage.is_correction_enable (a store_true flag, so its args
    always hold it): args that hold it are 0.11.0's, whose loss interface the adapter does not match."""
    args = _ok_args()
    args.algo = SimpleNamespace(advantage=SimpleNamespace(is_correction_enable=False))
    with pytest.raises(ValueError, match=r"algo.advantage.is_correction_enable is OpenRLHF 0.11.0's switch \(these "
                                         r"args are 0.11.0's; the adapter supports 0.11.2"):
        check_args(args)
    args.algo.advantage = SimpleNamespace(is_correction_level="off")
    check_args(args)


@pytest.mark.parametrize("key,value", [("overlong_buffer_len", 64.0), ("overlong_buffer_len", 0.0),
                                       ("stop_properly_penalty_coef", 0.0), ("stop_properly_penalty_coef", -0.5)])
def test_check_args_refuses_length_penalties_pacs_advantages_would_drop(key, value):
    """OpenRLHF applies these penalties to experience.rewards inside compute_advantages_and_returns, which
    pacs_advantages replaces: they were accepted and never applied. Any value but the parser's default (None) turns
    them on in OpenRLHF (a coefficient of 0 zeroes the rewards of truncated samples), so any value is refused."""
    check_args(_ok_args(overlong_buffer_len=None, stop_properly_penalty_coef=None, overlong_penalty_factor=1.0))
    with pytest.raises(ValueError, match=rf"^PACS in OpenRLHF: reward.{key} must be unset \(got {value!r}: OpenRLHF "
                                         rf"applies this length penalty in compute_advantages_and_returns, which "
                                         rf"pacs_advantages replaces"):
        check_args(_ok_args(**{key: value}))
    with pytest.raises(ValueError, match=rf"reward.{key} must be unset"):  # dict args too
        check_args({"rollout": {"n_samples_per_prompt": 4}, "train": {"micro_batch_size": 8},
                    "reward": {key: value}})
