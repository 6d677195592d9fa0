"""The verl adapter (pacs_fast.integrations.verl) against the real verl 0.9.1 registries.

CI installs verl==0.9.1 without its dependencies plus the few packages that
``verl.trainer.ppo.core_algos`` imports (scripts/setup.sh); the functions are called exactly as
verl calls them: the estimator through ``get_adv_estimator_fn("pacs")`` with verl's keyword
arguments (token_level_rewards, response_mask, index=uid, config=AlgoConfig), the loss through
``get_policy_loss_fn("pacs")`` with verl's (old_log_prob, log_prob, advantages, response_mask,
loss_agg_mode, config=ActorConfig, rollout_is_weights).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

core_algos = pytest.importorskip("verl.trainer.ppo.core_algos",
                                 reason="verl not installed (scripts/setup.sh installs verl==0.9.1)")
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

import pacs_fast.integrations.verl as pv  # noqa: E402
from pacs_fast.algorithms.pacs import pacs_loss  # noqa: E402

TOL = 1e-10  # float64 on both sides, same formulas: only summation-order rounding (~1e-15)


def _actor_config(n, micro=None, **kw):
    return ActorConfig(strategy="fsdp", rollout_n=n, ppo_micro_batch_size_per_gpu=micro or 2 * n,
                       ppo_mini_batch_size=2, **kw)


def _batch(P, n, T, seed, soft=False):
    g = torch.Generator().manual_seed(seed)
    B = P * n
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    R = torch.rand(B, generator=g, dtype=torch.float64) if soft else (torch.rand(B, generator=g) < 0.5).double()
    tlr = torch.zeros(B, T, dtype=torch.float32)
    tlr[torch.arange(B), lengths - 1] = R.float()  # verl's reward managers put R on the last token
    uid = np.repeat([f"uid-{seed}-{i}" for i in range(P)], n).astype(object)
    logp = (-3 * torch.rand(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    old = logp.detach() + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return dict(tlr=tlr, mask=mask, R=R, uid=uid, logp=logp, old=old)


def _advantages(b):
    fn = core_algos.get_adv_estimator_fn("pacs")
    return fn(token_level_rewards=b["tlr"], response_mask=b["mask"], index=b["uid"], config=AlgoConfig())


def test_registered_under_pacs():
    assert core_algos.get_adv_estimator_fn("pacs") is pv.compute_pacs_advantage
    assert core_algos.get_policy_loss_fn("pacs") is pv.compute_policy_loss_pacs


@pytest.mark.parametrize("score", ["rloo", "grpo", "dr_grpo", "naive"])
@pytest.mark.parametrize("P,n,T,seed", [(2, 4, 6, 0), (3, 5, 7, 1)])
def test_registered_loss_equals_pacs_loss_float64(score, P, n, T, seed):
    b = _batch(P, n, T, seed)
    adv, ret = _advantages(b)
    assert adv.shape == b["mask"].shape and torch.equal(adv, ret)
    name = "pacs" if score == "rloo" else f"pacs_test_{score}"
    if score != "rloo":
        pv.register_pacs_loss(name, score=score, beta=0.7)
    loss, metrics = core_algos.get_policy_loss_fn(name)(
        old_log_prob=b["old"], log_prob=b["logp"], advantages=adv, response_mask=b["mask"],
        loss_agg_mode="token-mean", config=_actor_config(n), rollout_is_weights=None)
    (grad,) = torch.autograd.grad(loss, b["logp"])
    logp = b["logp"].detach().clone().requires_grad_()
    ref = pacs_loss(logp, b["old"], b["mask"], b["R"], group_size=n, score=score,
                    beta=1.0 if score == "rloo" else 0.7)
    (ref_grad,) = torch.autograd.grad(ref, logp)
    assert loss.dtype == torch.float64
    assert abs(float(loss.detach()) - float(ref.detach())) <= TOL
    assert float((grad - ref_grad).abs().max()) <= TOL
    assert {"actor/pacs/psi_mean", "actor/pacs/brier", "actor/pacs/loss"} <= set(metrics)


def test_soft_rewards_pass_through_within_fp32_precision():
    b = _batch(2, 4, 5, 3, soft=True)
    adv, _ = _advantages(b)
    from pacs_fast.integrations._groups import decode_tagged_advantages

    R, tags = decode_tagged_advantages(adv, b["mask"], "fix")
    # R + 2*tag < 32 stored in fp32: spacing 2**-19 (~1.9e-6)
    assert float((R - b["R"]).abs().max()) <= 2 ** -19
    assert tags.tolist() == [1] * 4 + [2] * 4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_advantages_keep_0_1_rewards_and_refuse_soft_ones(dtype):
    """A stack that casts its batch to bf16 / fp16 rounds R + 2 * tag (< 32) to steps of 1/8 / 1/32: a soft
    reward 0.3 was read back as 0.25 with no word; 0/1 rewards and the tags are exact in either dtype."""
    from pacs_fast.integrations._groups import decode_tagged_advantages

    b = _batch(2, 4, 5, 3)
    adv, _ = _advantages(b)
    R, tags = decode_tagged_advantages(adv.to(dtype), b["mask"], "fix")
    assert R.tolist() == b["R"].tolist() and tags.tolist() == [1] * 4 + [2] * 4
    soft = _batch(2, 4, 5, 3, soft=True)
    adv, _ = _advantages(soft)
    with pytest.raises(ValueError, match=f"advantages arrive as {dtype}, which rounds the soft rewards"):
        decode_tagged_advantages(adv.to(dtype), soft["mask"], "fix")


def test_global_batch_info_scales_like_seq_mean():
    """The loss scales as verl's seq-mean modes; its actor/pacs/loss metric stays the micro-batch's mean
    (verl averages metrics over micro-batches: the scaled value was 4x too small with 4 of them)."""
    b = _batch(2, 4, 5, 4)
    adv, _ = _advantages(b)
    cfg = _actor_config(4)
    fn = core_algos.get_policy_loss_fn("pacs")
    plain, m_plain = fn(b["old"], b["logp"], adv, b["mask"], "token-mean", cfg, None)
    cfg.global_batch_info.update(global_batch_size=32, dp_size=2)
    scaled, m_scaled = fn(b["old"], b["logp"], adv, b["mask"], "token-mean", cfg, None)
    assert abs(float(scaled.detach()) - float(plain.detach()) * 8 / 32 * 2) <= TOL
    assert m_plain["actor/pacs/loss"] == m_scaled["actor/pacs/loss"] == pytest.approx(float(plain.detach()), abs=TOL)


@pytest.mark.parametrize("beta", [0.0, -1.0, float("nan"), True, "1"])
def test_a_beta_that_cannot_train_is_refused(beta):
    """beta scales PACS's proxy: 0 trains nothing, < 0 trains against the verifier (TRL's adapter refused
    them already; verl's registered them)."""
    with pytest.raises(ValueError, match=r"^register_pacs_loss: beta must be a finite number > 0"):
        pv.register_pacs_loss("pacs_test_bad_beta", beta=beta)
    assert pv.register_pacs_loss("pacs_test_np_beta", beta=np.float32(0.5)) is not None  # numpy scalars are numbers


def test_uids_of_another_shape_and_rows_without_a_response_are_one_clear_line():
    b = _batch(2, 4, 5, 8)
    est = core_algos.get_adv_estimator_fn("pacs")
    for uid in (np.stack([b["uid"], b["uid"]], axis=1), b["uid"][:6]):
        with pytest.raises(ValueError, match=r"uids \(data.non_tensor_batch\['uid'\]\) must be one hashable id per "
                                             r"row, shape \[8\]; got shape"):
            est(token_level_rewards=b["tlr"], response_mask=b["mask"], index=uid, config=AlgoConfig())
    adv, _ = _advantages(b)
    mask = b["mask"].clone()
    mask[5] = 0
    with pytest.raises(ValueError, match=r"^PACS: row 5 of the micro-batch has no response token in its mask"):
        core_algos.get_policy_loss_fn("pacs")(b["old"], b["logp"], adv, mask, "token-mean", _actor_config(4), None)


def test_split_or_shuffled_groups_give_a_clear_error():
    b = _batch(2, 4, 5, 5)
    adv, _ = _advantages(b)
    fn = core_algos.get_policy_loss_fn("pacs")
    perm = torch.tensor([0, 1, 2, 4, 3, 5, 6, 7])  # one row swapped between groups
    with pytest.raises(ValueError, match="trainer.balance_batch=False"):
        fn(b["old"][perm], b["logp"][perm], adv[perm], b["mask"][perm], "token-mean", _actor_config(4), None)
    with pytest.raises(ValueError, match="whole groups of 4"):
        fn(b["old"][:6], b["logp"][:6], adv[:6], b["mask"][:6], "token-mean", _actor_config(4), None)
    # an ordinary advantage (not written by the "pacs" estimator) is refused
    with pytest.raises(ValueError, match="adv_estimator=pacs"):
        fn(b["old"], b["logp"], -adv, b["mask"], "token-mean", _actor_config(4), None)
    # verl's own GRPO advantages of a group whose responses were all right are all 0: they were read as group 0
    # with rewards 0, and one such group in a micro-batch trained with its labels flipped
    tlr = torch.zeros(4, 5)
    tlr[:, -1] = 1.0
    grpo, _ = core_algos.compute_grpo_outcome_advantage(token_level_rewards=tlr, response_mask=torch.ones(4, 5),
                                                        index=np.array(["u"] * 4, dtype=object))
    assert float(grpo.abs().max()) == 0.0
    with pytest.raises(ValueError, match="adv_estimator=pacs"):
        fn(b["old"][:4], b["logp"][:4], grpo, torch.ones(4, 5), "token-mean", _actor_config(4), None)


def test_actor_settings_that_split_groups_are_refused():
    b = _batch(2, 4, 5, 6)
    adv, _ = _advantages(b)
    fn = core_algos.get_policy_loss_fn("pacs")
    with pytest.raises(ValueError, match="actor.shuffle must be False"):
        fn(b["old"], b["logp"], adv, b["mask"], "token-mean", _actor_config(4, shuffle=True), None)
    with pytest.raises(ValueError, match="ppo_micro_batch_size_per_gpu=6 is not a multiple of rollout.n=4"):
        fn(b["old"], b["logp"], adv, b["mask"], "token-mean", _actor_config(4, micro=6), None)
    varying = torch.ones_like(b["old"]) + torch.arange(b["old"].shape[1])[None, :] * 0.1  # (token-level weights)
    with pytest.raises(ValueError, match="rollout-correction weights vary along row"):
        fn(b["old"], b["logp"], adv, b["mask"], "token-mean", _actor_config(4), varying)


def test_estimator_refuses_non_contiguous_prompts():
    b = _batch(2, 3, 4, 7)
    uid = b["uid"][[0, 3, 1, 4, 2, 5]]
    with pytest.raises(ValueError, match="not contiguous"):
        core_algos.get_adv_estimator_fn("pacs")(token_level_rewards=b["tlr"], response_mask=b["mask"],
                                               index=uid, config=AlgoConfig())


def test_check_config_lists_every_bad_setting():
    from omegaconf import OmegaConf

    good = OmegaConf.create({
        "algorithm": {"adv_estimator": "pacs", "use_kl_in_reward": False},
        "actor_rollout_ref": {"rollout": {"n": 8}, "actor": {
            "policy_loss": {"loss_mode": "pacs"}, "shuffle": False, "use_dynamic_bsz": False,
            "ppo_micro_batch_size_per_gpu": 16}},
        "trainer": {"balance_batch": False}})
    pv.check_config(good)
    bad = OmegaConf.merge(good, {"trainer": {"balance_batch": True}, "algorithm": {"adv_estimator": "grpo"},
                                 "actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 12}}})
    with pytest.raises(ValueError) as e:
        pv.check_config(bad)
    msg = str(e.value)
    for key in ("trainer.balance_batch", "algorithm.adv_estimator", "ppo_micro_batch_size_per_gpu (12)"):
        assert key in msg
    # keys it passed: a KL loss to verl's reference model (added to the PACS loss), the rollout correction (refused
    # only inside the loss), and trainer.balance_batch left out (verl's default, True, reorders the batch)
    kl = OmegaConf.merge(good, {"actor_rollout_ref": {"actor": {"use_kl_loss": True}}})
    with pytest.raises(ValueError, match="use_kl_loss must be False"):
        pv.check_config(kl)
    for bad_correction in ({"rollout_is": "token", "rollout_rs": None}, {"rollout_is": None, "rollout_rs": "seq_sum_k1"},
                           {"rollout_is": "sequence", "rollout_rs": None, "bypass_mode": True}):
        corrected = OmegaConf.merge(good, {"algorithm": {"rollout_correction": bad_correction}})
        with pytest.raises(ValueError, match="algorithm.rollout_correction must be off or sequence-level"):
            pv.check_config(corrected)
    pv.check_config(OmegaConf.merge(good, {"algorithm": {"rollout_correction": {"rollout_is": "sequence",
                                                                                "rollout_rs": None}}}))
    pv.check_config(OmegaConf.merge(good, {"algorithm": {"rollout_correction": {"rollout_is": None,
                                                                                "rollout_rs": None}}}))
    no_balance = OmegaConf.create(OmegaConf.to_container(good))
    del no_balance.trainer["balance_batch"]
    with pytest.raises(ValueError, match=r"trainer.balance_batch must be False \(verl's default is True\)"):
        pv.check_config(no_balance)


@pytest.mark.parametrize("threshold", ["2.0", "0.5_2.0"], ids=["truncated", "icepop"])
def test_sequence_rollout_correction_weighs_each_samples_bce(threshold):
    """verl's own sequence-level weights (``compute_rollout_correction_weights``, rollout_is='sequence': truncated,
    or IcePop-masked to 0 outside [0.5, 2]) reach the loss as PACS's sample weights: loss and gradient equal float64
    ``pacs_loss(sample_weights=row weights)``, and differ from the unweighted loss. Token-level weights are one
    line naming the setting. (Before 2026-12-07 any weights were an error.)"""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    n = 4
    b = _batch(3, n, 7, 11)
    adv, _ = _advantages(b)
    g = torch.Generator().manual_seed(5)
    rollout = b["old"] + 0.3 * torch.randn(b["old"].shape, generator=g, dtype=torch.float64)
    weights, _ = compute_rollout_correction_weights(
        log_ratio=(b["old"] - rollout), response_mask=b["mask"], rollout_is="sequence", rollout_is_threshold=threshold)
    row = weights[torch.arange(weights.shape[0]), 0]
    assert len(set(row.tolist())) > 2 and (threshold == "2.0" or bool((row == 0).any()))
    loss, _ = core_algos.get_policy_loss_fn("pacs")(
        old_log_prob=b["old"], log_prob=b["logp"], advantages=adv, response_mask=b["mask"],
        loss_agg_mode="token-mean", config=_actor_config(n), rollout_is_weights=weights)
    (grad,) = torch.autograd.grad(loss, b["logp"])
    logp = b["logp"].detach().clone().requires_grad_()
    ref = pacs_loss(logp, b["old"], b["mask"], b["R"], group_size=n, sample_weights=row)
    (ref_grad,) = torch.autograd.grad(ref, logp)
    plain = pacs_loss(b["logp"].detach(), b["old"], b["mask"], b["R"], group_size=n)
    assert abs(float(loss.detach()) - float(ref.detach())) <= TOL and float((grad - ref_grad).abs().max()) <= TOL
    assert abs(float(loss.detach()) - float(plain)) > 1e-3
    tokens, _ = compute_rollout_correction_weights(
        log_ratio=(b["old"] - rollout), response_mask=b["mask"], rollout_is="token", rollout_is_threshold=threshold)
    with pytest.raises(ValueError, match="rollout_is='token'"):
        core_algos.get_policy_loss_fn("pacs")(
            old_log_prob=b["old"], log_prob=b["logp"], advantages=adv, response_mask=b["mask"],
            loss_agg_mode="token-mean", config=_actor_config(n), rollout_is_weights=tokens)


def test_the_adapters_pacs_metrics_are_the_trainers():
    """The adapters' ``pacs/*`` (integrations/_groups.py) mean what the trainer's do (trainer/step.py), soft rewards
    included: positives and negatives split at 0.5 as reward/acc counts (they once split at R == 1 / R == 0)."""
    from pacs_fast.integrations._groups import pacs_metrics as adapter
    from pacs_fast.trainer.step import pacs_metrics as trainer

    gen = torch.Generator().manual_seed(0)
    psi = torch.randn(12, generator=gen, dtype=torch.float64)
    R = torch.tensor([1, 0.75, 0.25, 0, 1, 0, 0.6, 0.4, 1, 1, 0, 0], dtype=torch.float64)
    ours = adapter({"score": psi, "pred_reward": torch.sigmoid(psi), "proxy": psi / 2}, R)
    theirs = trainer({"psi": psi, "pred_reward": torch.sigmoid(psi), "proxy": psi / 2, "rewards": R})
    assert set(ours) <= set(theirs) and all(ours[k] == pytest.approx(theirs[k]) for k in ours), (ours, theirs)
    assert ours["pacs/pred_reward_pos"] == pytest.approx(float(torch.sigmoid(psi)[R > 0.5].mean()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_binary_tags_run_to_127_and_read_back_exactly_in_any_dtype(dtype):
    """0/1 rewards carry 1 + the group index mod 127 (integers in [2, 256), exact in bf16): every group of 130 is
    read back with its reward and tag, groups 127 apart share a tag; soft rewards keep 1 + mod 15."""
    from pacs_fast.integrations._groups import decode_tagged_advantages, encode_tagged_advantages

    groups = torch.arange(130).repeat_interleave(2)
    R = (torch.arange(260) % 3 == 0).double()
    mask = torch.ones(260, 3, dtype=torch.bool)
    adv = encode_tagged_advantages(R, groups, mask)
    back, tags = decode_tagged_advantages(adv.to(dtype), mask, "fix")
    assert torch.equal(back, R) and torch.equal(tags, 1 + groups % 127)
    soft = R * 0.5 + 0.25
    back, tags = decode_tagged_advantages(encode_tagged_advantages(soft, groups, mask), mask, "fix")
    assert float((back - soft).abs().max()) <= 2 ** -19 and torch.equal(tags, 1 + groups % 15)
    with pytest.raises(ValueError, match="not the reward \\+ group tag"):  # a soft value above 32: not ours
        decode_tagged_advantages(torch.full((1, 3), 40.5), torch.ones(1, 3, dtype=torch.bool), "fix")


def _dp_config(train, mini, nnodes=1, gpus=8):
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "algorithm": {"adv_estimator": "pacs", "use_kl_in_reward": False},
        "data": {"train_batch_size": train},
        "actor_rollout_ref": {"rollout": {"n": 4}, "actor": {
            "policy_loss": {"loss_mode": "pacs"}, "shuffle": False, "use_dynamic_bsz": False,
            "ppo_micro_batch_size_per_gpu": 4, "ppo_mini_batch_size": mini}},
        "trainer": {"balance_batch": False, "nnodes": nnodes, "n_gpus_per_node": gpus}})


def test_check_config_wants_prompt_counts_that_are_multiples_of_the_dp_size():
    """verl asks only that the ROW counts (prompts x rollout.n) split evenly over the data-parallel ranks: 12 prompts
    x n=4 on 8 GPUs passed (6 rows a rank) and cut every third group across two ranks."""
    from omegaconf import OmegaConf

    pv.check_config(_dp_config(train=16, mini=8))
    pv.check_config(_dp_config(train=12, mini=6, nnodes=2, gpus=3))
    with pytest.raises(ValueError) as e:
        pv.check_config(_dp_config(train=12, mini=6))
    msg = str(e.value)
    assert "data.train_batch_size (12 prompts) must be a multiple of the actor's data-parallel size (8: " in msg
    assert "actor_rollout_ref.actor.ppo_mini_batch_size (6 prompts) must be a multiple of" in msg
    with pytest.raises(ValueError, match=r"^PACS in verl: actor_rollout_ref.actor.ppo_mini_batch_size \(4 prompts\) "
                                         r"must be a multiple of the actor's data-parallel size \(8: .*\): "
                                         r"verl splits the batch"):
        pv.check_config(_dp_config(train=16, mini=4))
    # model parallelism shrinks the data-parallel size: 12 prompts on 8 GPUs at TP 2 (megatron) or Ulysses 2 (FSDP)
    # split over 4 ranks, whole groups each (a multiple of the GPUs would refuse them)
    for strategy, key in (("megatron", "megatron.tensor_model_parallel_size"),
                          ("fsdp", "ulysses_sequence_parallel_size")):
        cfg = _dp_config(train=12, mini=4)
        cfg.actor_rollout_ref.actor.strategy = strategy
        OmegaConf.update(cfg, f"actor_rollout_ref.actor.{key}", 2)
        pv.check_config(cfg)
        OmegaConf.update(cfg, f"actor_rollout_ref.actor.{key}", 1)
        with pytest.raises(ValueError, match=r"multiple of the actor's data-parallel size \(8"):
            pv.check_config(cfg)
    no_gpus = _dp_config(train=12, mini=6)
    del no_gpus.trainer["nnodes"]
    pv.check_config(no_gpus)  # a config without the GPU counts: nothing to check against


def test_verls_dispatch_cuts_groups_unless_the_prompts_split_evenly_and_the_loss_names_the_rule():
    """Why the rule holds: verl's DataProto.chunk (the dispatch of update_actor) gives rank r the r-th contiguous
    equal part of the batch. 6 prompts x n=4 over 4 ranks: 6 rows a rank, and the loss on rank 0's part (group 0 and
    half of group 1) raises, naming the rule; 8 prompts: every part is whole groups."""
    from verl.protocol import DataProto

    for prompts, whole in ((6, False), (8, True)):
        b = _batch(prompts, 4, 5, 9)
        adv, _ = _advantages(b)
        data = DataProto.from_dict(tensors={"old": b["old"], "logp": b["logp"].detach(), "adv": adv,
                                            "mask": b["mask"]}, non_tensors={"uid": b["uid"]})
        parts = data.chunk(4)
        cut = [len(set(p.non_tensor_batch["uid"].tolist())) * 4 != len(p) for p in parts]
        assert cut == [not whole] * 4  # 6 prompts: every rank holds half a group at one end
        part = parts[0].batch
        fn = core_algos.get_policy_loss_fn("pacs")
        if whole:
            fn(part["old"], part["logp"], part["adv"], part["mask"], "token-mean", _actor_config(4, micro=4), None)
            continue
        with pytest.raises(ValueError, match=r"whole groups of 4.*data.train_batch_size and actor_rollout_ref.actor"
                                             r".ppo_mini_batch_size \(prompts\) multiples of the actor's "
                                             r"data-parallel size"):
            fn(part["old"], part["logp"], part["adv"], part["mask"], "token-mean", _actor_config(4, micro=4), None)


def test_the_dp_size_reads_verls_own_ulysses_key_and_skips_strategies_it_cannot_read():
    """verl 0.9 reads the Ulysses size from actor.fsdp_config (the actor-level key is deprecated, copied there when
    > 1): given there, 12 prompts on 8 GPUs at Ulysses 2 (4 ranks, whole groups) had been refused as if 8 ranks.
    torchtitan / veomni keep their model parallelism elsewhere: a data-parallel size of every GPU refused alike."""
    from omegaconf import OmegaConf

    for strategy in ("fsdp", "fsdp2"):
        cfg = _dp_config(train=12, mini=4)
        cfg.actor_rollout_ref.actor.strategy = strategy
        OmegaConf.update(cfg, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 2)
        pv.check_config(cfg)
        OmegaConf.update(cfg, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size", 1)
        with pytest.raises(ValueError, match=r"multiple of the actor's data-parallel size \(8"):
            pv.check_config(cfg)
    cfg = _dp_config(train=12, mini=4)
    cfg.actor_rollout_ref.actor.strategy = "torchtitan"
    OmegaConf.update(cfg, "actor_rollout_ref.actor.torchtitan.tensor_parallel_size", 2)
    pv.check_config(cfg)
