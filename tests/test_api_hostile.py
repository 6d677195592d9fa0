"""The public Python API under hostile input (sweep of 2026-12-01; ~200 calls, every value and gradient equal to a
float64 reference): what it found. ``gae`` on an empty batch; a NaN entropy in ``high_entropy_mask`` (dropped, which
hid the NaN from the loss); ``pacs_loss(check_finite=True)`` on ``sample_weights``; complex rewards in
``gpg_advantages``; ``pass_at_k`` of nothing; the verifier's ``time_limit``; verl's ``rollout.n`` of 2.5 or "four";
TRL's ``num_generations`` of 0, None or 2.0; an integer bias in ``linear_logprobs``."""
import math

import numpy as np
import pytest
import torch

import pacs_fast as pf


@pytest.mark.parametrize("shape", [(3, 0), (0, 4), (0, 0)])
def test_gae_of_an_empty_batch_is_empty(shape):
    adv, ret = pf.gae(torch.zeros(shape), torch.zeros(shape), None)  # (whiten=True: argmax of nothing had raised)
    assert adv.shape == ret.shape == shape


def test_a_nan_entropy_is_kept_so_that_it_reaches_the_loss(seed):
    e = torch.rand(4, 8)
    e[0, 0] = float("nan")
    keep, threshold = pf.high_entropy_mask(e, torch.ones(4, 8), 0.2)
    # ceil(0.2 x 32) = 7 kept: the NaN (the largest, as kthvalue orders it) and the 6 highest others
    assert keep.sum() == 7 and keep[0, 0] == 1 and torch.isfinite(threshold)
    assert torch.equal(keep.flatten()[1:] == 1, e.flatten()[1:] >= threshold)
    keep, threshold = pf.high_entropy_mask(torch.tensor([[float("nan"), 0.1, 0.2, 0.3]]), torch.ones(1, 4), 0.25)
    assert keep.tolist() == [[1.0, 0.0, 0.0, 0.0]] and threshold.isnan()  # (a NaN threshold had kept nothing)
    terms = torch.tensor([[1.0, 2.0, 3.0, 4.0]]) * torch.tensor([[float("nan"), 1.0, 1.0, 1.0]])
    assert (terms * keep).sum().isnan()  # the NaN shows in a loss built on the mask
    for bad in (None, "0.2", True, [0.2]):
        with pytest.raises(ValueError, match="top_frac must be a number in"):
            pf.high_entropy_mask(e, torch.ones(4, 8), bad)
    with pytest.raises(ValueError, match="entropy and mask must be tensors"):
        pf.high_entropy_mask(e.tolist(), torch.ones(4, 8), 0.2)


def test_pacs_loss_checks_sample_weights_when_asked(seed):
    logp = -torch.rand(4, 5)
    args = (logp, logp.detach() - 0.1, torch.ones(4, 5), torch.tensor([1.0, 0.0, 1.0, 0.0]))
    for weights, match in ((torch.tensor([1.0, float("nan"), 1.0, 1.0]), "sample_weights"),
                           (torch.tensor([1.0, -0.5, 1.0, 1.0]), "sample_weights must be >= 0")):
        with pytest.raises(ValueError, match=match):
            pf.pacs_loss(*args, group_size=2, sample_weights=weights, check_finite=True)
        assert pf.pacs_loss(*args, group_size=2, sample_weights=weights).numel() == 1  # (unchecked by default)


def test_small_public_functions_refuse_what_they_cannot_mean():
    with pytest.raises(ValueError, match="gpg_advantages: rewards must be real numbers"):
        pf.gpg_advantages(torch.tensor([1 + 1j, 0j]), 2)
    assert pf.pass_at_k([], [], 1).shape == (0,)
    from pacs_fast.reward.verifier import check_time_limit, score_item
    for bad in ("a", float("nan"), -1, True):
        with pytest.raises(ValueError, match="time_limit must be"):
            check_time_limit(bad)
    assert check_time_limit(0) == 0 and check_time_limit(np.float32(2.5)) == 2.5
    assert score_item(r"\boxed{4}", "4", 0).score == 1.0  # (0: no limit)
    hidden, weight, labels = torch.randn(3, 8), torch.randn(11, 8), torch.tensor([0, 5, 10])
    with pytest.raises(ValueError, match="bias must be a floating-point tensor, got torch.int64"):
        pf.linear_logprobs(hidden, weight, labels, bias=torch.zeros(11, dtype=torch.long), backend="torch")
    ok = pf.linear_logprobs(hidden, weight, labels, bias=torch.zeros(11), backend="torch")
    assert math.isclose(float(ok.sum()), float(pf.linear_logprobs(hidden, weight, labels, backend="torch").sum()))


@pytest.mark.parametrize("n", [2.5, "four", True])
def test_verl_rollout_n_must_be_a_whole_number(n):
    from omegaconf import OmegaConf

    from pacs_fast.integrations import verl as pv

    config = OmegaConf.create({
        "algorithm": {"adv_estimator": "pacs", "use_kl_in_reward": False},
        "actor_rollout_ref": {"rollout": {"n": n}, "actor": {
            "policy_loss": {"loss_mode": "pacs"}, "shuffle": False, "use_dynamic_bsz": False,
            "ppo_micro_batch_size_per_gpu": 16}},
        "trainer": {"balance_batch": False}})
    with pytest.raises(ValueError, match=f"actor_rollout_ref.rollout.n must be a whole number, got {n!r}"):
        pv.check_config(config)  # (2.5 had been truncated to 2 and passed)
    pv.check_config(OmegaConf.merge(config, {"actor_rollout_ref": {"rollout": {"n": 8.0}}}))


@pytest.mark.parametrize("n", [0, None, 2.0, -4])
def test_trl_num_generations_must_be_a_whole_number(tmp_path, n):
    from pacs_fast.integrations.trl import PACSConfig

    with pytest.raises(ValueError, match=f"PACSConfig: num_generations must be a whole number >= 1 .*got {n!r}"):
        PACSConfig(output_dir=str(tmp_path), num_generations=n, per_device_train_batch_size=8, use_cpu=True,
                   report_to=[])


def test_numbers_of_other_types_are_taken_where_they_mean_a_number():
    e, m = torch.rand(2, 5), torch.ones(2, 5)
    want = pf.high_entropy_mask(e, m, 0.5)[0]
    for frac in (np.float32(0.5), torch.tensor(0.5)):  # (both were taken before the type check; still are)
        assert torch.equal(pf.high_entropy_mask(e, m, frac)[0], want)
    from omegaconf import OmegaConf

    from pacs_fast.integrations import verl as pv
    for n in (float("inf"), "1e400"):  # (int() of them had raised OverflowError)
        with pytest.raises(ValueError, match="rollout.n must be a whole number"):
            pv.check_config(OmegaConf.create({"actor_rollout_ref": {"rollout": {"n": n}}}))
