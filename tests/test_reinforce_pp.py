"""REINFORCE++ (``algo.name=reinforce_plus_plus`` / ``reinforce_plus_plus_baseline``) as verl defines it.

References: verl ``verl/trainer/ppo/core_algos.py`` (main of 2026-11, ``compute_reinforce_plus_plus_outcome_
advantage`` and ``compute_reinforce_plus_plus_baseline_outcome_advantage``) with ``verl/utils/torch_functional.py``'s
``masked_whiten`` / ``masked_var`` (unbiased). Their loops are written out below (``_verl_*``), so the test means
something without verl installed. Tolerance: float64 inputs, our output float32 (rtol 1e-6); verl's masked means
divide by ``count + 1e-8`` (see the atol where it shows).

- Both modes equal verl's on fresh random batches (0 / 1 and soft rewards, groups of one, groups of equal rewards,
  rows of one token).
- A batch split into data-parallel shares, each whitened with the summed totals, equals the whole batch's; the
  trainer's helper sums what ``gather`` returns.
- The trainer trains on them (the learner's batch holds them), the objective refuses the algorithm without
  advantages, and the settings it cannot use are refused or warned about.
"""
from collections import defaultdict

import pytest
import torch

from pacs_fast.algorithms.reinforce_pp import reinforce_pp_advantages, reinforce_pp_totals
from pacs_fast.config import AlgoConfig, hazard_warnings, load_config, validate
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.objective import minibatch_counts, objective
from pacs_fast.trainer.step import step_reinforce_pp


def _verl_masked_mean(v, m):
    return (v * m).sum() / (m.sum() + 1e-8)


def _verl_masked_whiten(values, mask):
    mean = _verl_masked_mean(values, mask)
    centered = values - mean
    var = _verl_masked_mean(centered ** 2, mask)
    n = mask.sum()
    var = var * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def _verl_rpp(token_level_rewards, response_mask, gamma=1.0):
    returns = torch.zeros_like(token_level_rewards)
    running = 0
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]
    return _verl_masked_whiten(returns, response_mask) * response_mask


def _verl_rpp_baseline(token_level_rewards, response_mask, index):
    scores = token_level_rewards.sum(dim=-1)
    id2score, id2mean = defaultdict(list), {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx, s in id2score.items():
        id2mean[idx] = torch.tensor(0.0, dtype=scores.dtype) if len(s) == 1 else torch.mean(torch.stack(s))
    scores = scores.clone()
    for i in range(scores.shape[0]):
        scores[i] = scores[i] - id2mean[index[i]]
    scores = scores.unsqueeze(-1).tile([1, token_level_rewards.shape[-1]]) * response_mask
    return _verl_masked_whiten(scores, response_mask) * response_mask


def _batch(gen, B, T, soft):
    """Right-aligned responses as verl holds them (``[B, response_length]``), the outcome on the last token."""
    lengths = torch.randint(1, T + 1, (B,), generator=gen)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).double()
    rewards = torch.rand(B, generator=gen, dtype=torch.float64) if soft else \
        (torch.rand(B, generator=gen) < 0.5).double()
    token_rewards = torch.zeros(B, T, dtype=torch.float64)
    token_rewards[torch.arange(B), lengths - 1] = rewards
    return rewards, mask, token_rewards


@pytest.mark.parametrize("G", [1, 2, 4, 8])
@pytest.mark.parametrize("soft", [False, True])
def test_both_modes_equal_verls(seed, G, soft):
    gen = torch.Generator().manual_seed(seed)
    B = G * int(torch.randint(2, 6, (), generator=gen))
    rewards, mask, token_rewards = _batch(gen, B, 13, soft)
    if B >= 2 * G:
        rewards[:G] = 1.0  # a group of equal rewards (0 after its mean, not after the whitening)
        token_rewards[torch.arange(G), mask[:G].sum(-1).long() - 1] = 1.0
    got = reinforce_pp_advantages(rewards, mask, G, baseline=False)
    want = _verl_rpp(token_rewards, mask)
    # rtol: float32 out; atol: where every value is equal verl gives ~1e-4 / tokens instead of 0 (its count + 1e-8
    # denominators leave a residue that the whitening divides by sqrt(1e-8)), ours exactly 0
    close = dict(rtol=1e-6, atol=1e-4)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), want, **close)
    index = [i // G for i in range(B)]
    got_b = reinforce_pp_advantages(rewards, mask, G, baseline=True)
    want_b = _verl_rpp_baseline(token_rewards, mask, index)
    assert torch.allclose(got_b.double(), want_b, **close)
    spread = bool(rewards.min() != rewards.max())
    varied = bool((rewards.view(-1, G).max(1).values != rewards.view(-1, G).min(1).values).any()) if G > 1 else spread
    assert (float(got_b.abs().max()) > 0.1) == varied  # (every group of equal rewards: all 0, as verl's)
    assert (float(got.abs().max()) > 0.1) == spread


def test_data_parallel_shares_whiten_as_the_whole_step(seed):
    gen = torch.Generator().manual_seed(seed)
    G = 4
    rewards, mask, _ = _batch(gen, 6 * G, 17, soft=True)
    whole = reinforce_pp_advantages(rewards, mask, G, baseline=True)
    shares = [slice(0, 2 * G), slice(2 * G, 6 * G)]  # (uneven in tokens: the token-weighted statistics matter)
    totals = [reinforce_pp_totals(rewards[s], mask[s], G, baseline=True) for s in shares]
    summed = tuple(sum(t[i] for t in totals) for i in range(3))
    parts = torch.cat([reinforce_pp_advantages(rewards[s], mask[s], G, baseline=True, totals=summed) for s in shares])
    assert torch.allclose(parts, whole, rtol=1e-6, atol=1e-7)
    alone = reinforce_pp_advantages(rewards[shares[0]], mask[shares[0]], G, baseline=True)
    assert not torch.allclose(alone, whole[shares[0]], rtol=1e-3, atol=1e-3)  # (a share's own statistics differ)
    # the trainer's helper: every group's totals from gather (World.gather_dp), summed
    batches = [RolloutBatch(torch.zeros(mask[s].shape, dtype=torch.long), torch.ones(mask[s].shape, dtype=torch.long),
                            mask[s].float(), rewards[s].float(), group_size=G) for s in shares]
    mine = [reinforce_pp_totals(b.rewards, b.response_mask, G, baseline=True) for b in batches]
    got = torch.cat([step_reinforce_pp("reinforce_plus_plus_baseline", b, gather=lambda _: mine) for b in batches])
    assert torch.allclose(got, reinforce_pp_advantages(rewards.float(), mask, G, baseline=True), rtol=1e-6, atol=1e-6)


def test_rows_left_out_of_the_loss_leave_the_statistics(seed):
    """learner.mask_truncated: truncated rows leave the loss, and the whitening's statistics with them, so the
    advantages that train have token mean 0 (with them in, one row left of 16 trained at 3.4 sigma)."""
    gen = torch.Generator().manual_seed(seed)
    G = 4
    rewards, mask, _ = _batch(gen, 4 * G, 11, soft=True)
    truncated = torch.rand(4 * G, generator=gen) < 0.6
    truncated[0], truncated[1] = False, True
    batch = RolloutBatch(torch.zeros(mask.shape, dtype=torch.long), torch.ones(mask.shape, dtype=torch.long),
                         mask.float(), rewards.float(), group_size=G)
    batch.truncated = truncated
    adv = step_reinforce_pp("reinforce_plus_plus_baseline", batch)
    kept = mask * (~truncated).double()[:, None]
    want = reinforce_pp_advantages(rewards.float(), mask, G, baseline=True,
                                   totals=reinforce_pp_totals(rewards.float(), kept, G, baseline=True))
    assert torch.equal(adv, want)
    assert abs(float((adv.double() * kept).sum() / kept.sum())) < 1e-6  # zero-mean over the tokens that train
    batch.truncated = None
    assert not torch.allclose(step_reinforce_pp("reinforce_plus_plus_baseline", batch), adv)


def test_edges():
    mask = torch.zeros(2, 3)
    assert not reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask, 2).any()  # no response token
    one = torch.tensor([[1.0, 0.0]])
    assert reinforce_pp_advantages(torch.tensor([0.7]), one, 1, baseline=False).tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError, match="not divisible by group_size"):
        reinforce_pp_advantages(torch.ones(3), torch.ones(3, 2), 2)
    with pytest.raises(ValueError, match="mask has 2 rows for 3 rewards"):
        reinforce_pp_advantages(torch.ones(3), torch.ones(2, 2), 1)


def test_the_objective_needs_the_steps_advantages():
    batch = RolloutBatch(torch.zeros(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long), torch.ones(4, 3),
                         torch.tensor([1.0, 0, 0, 1]), group_size=2)
    batch.old_logp = torch.zeros(4, 3)
    logp = torch.zeros(4, 3, requires_grad=True)
    algo = AlgoConfig(name="reinforce_plus_plus_baseline")
    with pytest.raises(ValueError, match="trains on batch-whitened advantages; set batch.advantages"):
        objective(algo, batch, logp, None, None, minibatch_counts(batch), horizon=3)
    batch.advantages = reinforce_pp_advantages(batch.rewards, batch.response_mask, 2)
    loss, _ = objective(algo, batch, logp, None, None, minibatch_counts(batch), horizon=3)
    loss.backward()  # at ratio 1: -A per token, token-mean
    assert torch.allclose(logp.grad, -batch.advantages / 12)


def test_settings_it_cannot_use():
    with pytest.raises(ValueError, match="whitens its rewards over the whole step; not supported"):
        validate(load_config(None, ["algo.name=reinforce_plus_plus", "algo.noise_correction=backward",
                                    "algo.noise_rho1=0.1"]))
    cfg = load_config(None, ["algo.name=reinforce_plus_plus_baseline", "rollout.filter_groups=true"])
    validate(cfg)
    assert any("REINFORCE++ whitens over the whole step" in w for w in hazard_warnings(cfg))
    validate(load_config(None, ["algo.name=reinforce_plus_plus", "rollout.n=1"]))  # no group needed


CAUGHT: list = []


def even_length(problems, responses, answers):
    return [float(len(r) % 2 == 0) for r in responses]


def test_the_trainer_trains_on_them(tmp_path, warm_cache, monkeypatch):
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.train import main
    from pacs_fast.trainer.metrics import read_jsonl

    from test_train import TINY

    update = TorchLearner.update

    def caught(self, batch, **kw):
        CAUGHT.append((batch.rewards.clone(), batch.response_mask.clone(), batch.advantages.clone()))
        return update(self, batch, **kw)

    monkeypatch.setattr(TorchLearner, "update", caught)
    CAUGHT.clear()
    main(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.run_name=r", "train.steps=2",
                 "algo.name=reinforce_plus_plus_baseline", "reward.fn=test_reinforce_pp:even_length"])
    assert len(CAUGHT) == 2
    for rewards, mask, adv in CAUGHT:
        assert torch.equal(adv, reinforce_pp_advantages(rewards, mask, 4, baseline=True))
        assert adv.abs().max() > 0 or rewards.min() == rewards.max()
    assert any(adv.abs().max() > 0 for _, _, adv in CAUGHT)
    train = [r for r in read_jsonl(tmp_path / "r" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(train) == 2 and all(r["learner/grad_norm"] >= 0 for r in train)
    assert all("learner/adv_mean" in r and r["learner/adv_abs_mean"] >= 0 for r in train)
