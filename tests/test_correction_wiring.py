"""The off-policy correction wired into the objective and the trainer (issue 20, item 1).

- With behaviour = proximal the weights are exactly 1 and nothing is rejected: the corrected loss and
  gradients are bit-identical to the uncorrected ones (PACS and GRPO).
- PACS: each sample's BCE term is multiplied by its sequence weight; a rejected row's term goes and the
  row leaves the mean's denominator, while its proxy still counts in its group's baseline. Checked
  against a hand computation in float64 (1e-12: the same sums in another order).
- GRPO: each token's clipped term is multiplied by its weight and the token-mean runs over the kept
  tokens only (hand computation at ratio 1, float64).
- The trainer: runs with ``correction.*`` on record ``correction/...`` every step; the HF engine
  shares the policy, so the weights are 1 up to float noise and nothing is truncated or rejected.
"""
import pytest
import torch

from pacs_fast.algorithms import pacs_loss
from pacs_fast.algorithms.off_policy import off_policy_correction
from pacs_fast.config import AlgoConfig, load_config
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.objective import minibatch_counts, objective


def _batch(gen, B=8, T=9, G=4, dtype=torch.float64):
    mask = torch.zeros(B, T, dtype=dtype)
    for b in range(B):
        start = int(torch.randint(0, 3, (), generator=gen))
        mask[b, start:start + int(torch.randint(2, T - start + 1, (), generator=gen))] = 1
    ids = torch.randint(3, 50, (B, T), generator=gen)
    batch = RolloutBatch(ids, torch.ones(B, T, dtype=torch.long), mask, torch.tensor([1., 0, 0, 1, 0, 1, 1, 0]),
                         group_size=G)
    batch.old_logp = (-3 * torch.rand(B, T, generator=gen, dtype=dtype)) * mask
    batch.ref_logp = batch.old_logp.clone()
    return batch


def _grads(algo, batch, logp0):
    logp = logp0.clone().requires_grad_(True)
    loss, _ = objective(algo, batch, logp, None, None, minibatch_counts(batch), horizon=9)
    loss.backward()
    return loss.detach(), logp.grad


@pytest.mark.parametrize("name", ["pacs", "grpo"])
def test_weights_of_one_change_nothing(seed, name):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)
    algo = AlgoConfig(name=name)
    logp0 = batch.old_logp + 0.1 * torch.randn(batch.old_logp.shape, generator=gen, dtype=torch.float64) * batch.response_mask
    plain = _grads(algo, batch, logp0)
    w, kept, metrics = off_policy_correction(batch.old_logp, batch.old_logp.clone(), batch.response_mask > 0,
                                             is_level="sequence", rs_level="geometric", rs_low=0.999, rs_high=1.001)
    assert torch.equal(w, batch.response_mask) and torch.equal(kept, batch.response_mask > 0)
    batch.is_weights, batch.kept_mask = w, kept.to(w.dtype)
    corrected = _grads(algo, batch, logp0)
    assert torch.equal(plain[0], corrected[0]) and torch.equal(plain[1], corrected[1])
    assert metrics["is_weight_mean"] == 1.0 and metrics["frac_rejected"] == 0.0


def test_pacs_sequence_weights_and_rejected_rows(seed):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)
    mask = batch.response_mask
    c = torch.tensor([0.5, 2.0, 1.0, 0.0, 1.5, 1.0, 0.0, 0.25], dtype=torch.float64)  # rows 3 and 6 rejected
    batch.is_weights = c[:, None] * mask
    batch.kept_mask = torch.where(c[:, None] > 0, mask, 0.0)
    algo = AlgoConfig(name="pacs", score="rloo", weight="question")
    logp0 = batch.old_logp + 0.3 * torch.randn(mask.shape, generator=gen, dtype=torch.float64) * mask
    loss, grad = _grads(algo, batch, logp0)

    logp = logp0.clone().requires_grad_(True)
    _, terms = pacs_loss(logp, batch.ref_logp, mask, batch.rewards, group_size=4, return_terms=True)
    want = (c * terms["sample_loss"]).sum() / 6  # 6 kept rows
    assert abs(float(loss - want)) <= 1e-12 * abs(float(want))
    # by hand, differentiably: r = sum over the row's response (rejected rows too), rloo score, BCE * c * w
    r = ((logp - batch.ref_logp) * mask).sum(-1).view(2, 4)
    psi = (r - (r.sum(1, keepdim=True) - r) / 3).reshape(-1)
    hand = (c * terms["weight"] * (torch.nn.functional.softplus(psi) - batch.rewards * psi)).sum() / 6
    (g_hand,) = torch.autograd.grad(hand, logp)
    assert float((grad - g_hand).abs().max()) <= 1e-12 * float(g_hand.abs().max())
    assert grad[3].abs().sum() > 0  # a rejected row still moves through its group's baseline


def test_grpo_token_weights_and_kept_denominator(seed):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)
    mask = batch.response_mask
    w = (0.5 + 1.5 * torch.rand(mask.shape, generator=gen, dtype=torch.float64)) * mask
    kept = mask * (torch.rand(mask.shape, generator=gen, dtype=torch.float64) > 0.3)
    batch.is_weights, batch.kept_mask = w * kept, kept
    algo = AlgoConfig(name="grpo", loss_agg="token-mean", entropy_coef=0.0, kl_coef=0.0)
    loss, grad = _grads(algo, batch, batch.old_logp.clone())  # ratio 1: the clipped term is -A
    R = batch.rewards.view(2, 4)
    A = ((R - R.mean(1, keepdim=True)) / (R.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)
    want = (-A * w * kept).sum() / kept.sum()
    assert abs(float(loss - want)) <= 1e-12 * abs(float(want))
    assert torch.allclose(grad, -A * w * kept / kept.sum(), rtol=0, atol=1e-12)  # d ratio / d logp = 1 at ratio 1
    assert minibatch_counts(batch)["tokens"] == float(kept.sum())


def test_config_refuses_token_level_for_pacs():
    from pacs_fast.config import validate

    with pytest.raises(ValueError, match=r"correction.is_level must be one of auto, none, sequence \(algo.name=pacs"):
        validate(load_config(None, ["correction.is_level=token"]))
    with pytest.raises(ValueError, match="correction.rs_low"):
        validate(load_config(None, ["algo.name=grpo", "correction.rs_low=1.2"]))
    # equal bounds satisfy 0 <= rs_low <= 1 <= rs_high: the message says what is wrong with them (issue 41)
    with pytest.raises(ValueError, match=r"correction.rs_low and correction.rs_high are both 1.0: .* rejects every "
                                         r"token with any mismatch"):
        validate(load_config(None, ["algo.name=grpo", "correction.rs_low=1", "correction.rs_high=1"]))
    validate(load_config(None, ["algo.name=grpo", "correction.is_level=token", "correction.rs_level=token"]))


TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=8", "rollout.n=4", "rollout.eval_n=2",
        "rollout.max_new_tokens=6", "train.prompts_per_step=4", "learner.mini_batch_prompts=2",
        "learner.micro_batch_prompts=1", "warmup.steps=30", "warmup.batch_size=32", "model.tiny_hidden_size=64",
        "model.tiny_num_layers=1", "learner.lr=3e-3", "train.progress=false", "train.steps=2", "train.plots=false",
        "algo.entropy_coef=0.05"]  # the entropy bonus gives a gradient even when every reward is 0


@pytest.mark.parametrize("extra", [["algo.name=grpo", "correction.is_level=token", "correction.rs_level=token"],
                                   ["correction.is_level=sequence", "correction.rs_level=geometric",
                                    "rollout.temperature=0.8"],
                                   # with PACS's noisy-label correction (its corrected BCE takes the weights)
                                   ["correction.is_level=sequence", "correction.rs_level=sequence",
                                    "algo.noise_correction=backward", "algo.noise_rho1=0.2", "reward.noise_fn=0.2"]])
def test_trainer_records_the_correction(tmp_path, extra, warm_cache):
    from pacs_fast.trainer import train
    from pacs_fast.trainer.metrics import read_jsonl

    cfg = load_config(None, TINY + extra + [f"warmup.cache_dir={warm_cache}"])
    train(cfg, tmp_path / "run")
    recs = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        # the HF engine samples with the learner's own module: mu = pi_old up to float noise
        assert abs(r["correction/is_weight_mean"] - 1) < 1e-3 and r["correction/is_weight_max"] < 1.01
        assert r["correction/frac_truncated"] == 0 and r["correction/frac_rejected"] == 0
        assert abs(r["correction/kl_k1"]) < 1e-3 and 0 <= r["correction/kl_k3"] < 1e-5
        assert r["learner/grad_norm"] > 0


def test_a_truncated_sampling_distribution_is_named_at_the_start():
    """rollout.top_p < 1 with the correction on: the weights compare untruncated distributions, so
    the run says so at its start (before: weights 1.0, nothing rejected, no word, issue 41); not
    with top_p = 1, nor without a correction."""
    from pacs_fast.trainer.correction import correction_warnings

    on = ["rollout.ranks=1", "rollout.max_staleness=1"]  # asynchronous: the correction is on by default
    lines = correction_warnings(load_config(None, on + ["rollout.top_p=0.9"]))
    assert len(lines) == 1 and "rollout.top_p=0.9 truncates the sampling distribution" in lines[0]
    assert "use rollout.top_p=1, top_k=0, min_p=0 for an exact correction" in lines[0]
    lines = correction_warnings(load_config(None, on + ["rollout.top_k=20", "rollout.min_p=0.05"]))
    assert len(lines) == 1 and "rollout.top_k=20 and rollout.min_p=0.05 truncate the sampling" in lines[0]
    assert correction_warnings(load_config(None, on)) == []
    assert correction_warnings(load_config(None, ["rollout.top_p=0.9"])) == []  # synchronous: no correction
    assert correction_warnings(load_config(None, ["rollout.top_p=0.9", "algo.name=grpo", "correction.is_level=token"]))
