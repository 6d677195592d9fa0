"""``algo.entropy_top_frac``: the baselines' policy gradient on the high-entropy ("forking") tokens only
(Beyond the 80/20 Rule, arXiv 2506.01939; TRL's ``top_entropy_quantile``).

- :func:`high_entropy_mask` against a float64 sort in Python on fresh random entropies (masked tokens, odd
  sizes, bf16, ties, no candidate): the ``ceil(frac * n)`` highest candidates, ties with the lowest kept.
- The objective: with the fraction, the loss and every gradient equal the full objective with the mask as
  token weights (exactly: the same computation), tokens left out get no policy gradient, the KL penalty
  still reaches them, and the denominator keeps every token (TRL's semantics).
- Both learners compute the entropies for it: the torch learner and the trainer record the threshold and
  the kept share; megatron (one process) gives the torch learner's threshold and share on the same batch.
"""
import math
import os

import pytest
import torch

from pacs_fast.algorithms.token_selection import high_entropy_mask
from pacs_fast.config import AlgoConfig, LearnerConfig, load_config, validate
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.objective import minibatch_counts, objective

from one_process import run_python
from test_correction_wiring import _batch


def _reference(entropy, mask, frac):
    """The kept positions by a float64 sort in Python."""
    cand = [(float(e), i) for i, (e, m) in enumerate(zip(entropy.double().flatten().tolist(), mask.flatten().tolist()))
            if m != 0]
    if not cand:
        return set(), math.nan
    k = max(1, math.ceil(round(frac * len(cand), 9)))
    threshold = sorted((e for e, _ in cand), reverse=True)[k - 1]
    return {i for e, i in cand if e >= threshold}, threshold


@pytest.mark.parametrize("frac", [1e-6, 0.2, 0.5, 0.999, 1.0])
@pytest.mark.parametrize("shape,dtype", [((7, 13), torch.float32), ((1, 1), torch.float32), ((5, 33), torch.bfloat16),
                                         ((3, 64), torch.float64)])
def test_the_mask_keeps_the_top_fraction_of_the_candidates(seed, frac, shape, dtype):
    gen = torch.Generator().manual_seed(seed)
    entropy = (torch.rand(shape, generator=gen) * 12).to(dtype)  # [0, log V] for V ~ 150k; bf16: many ties
    mask = (torch.rand(shape, generator=gen) < 0.7).float()
    mask.view(-1)[0] = 1.0  # at least one candidate
    keep, threshold = high_entropy_mask(entropy, mask, frac)
    want, want_threshold = _reference(entropy, mask, frac)
    assert keep.dtype == torch.float32 and keep.shape == mask.shape
    assert set(keep.flatten().nonzero().flatten().tolist()) == want
    assert float(threshold) == want_threshold
    n = int(mask.sum())
    assert len(want) >= min(n, math.ceil(frac * n - 1e-9))  # at least the fraction (more only on ties)
    if frac == 1.0:
        assert torch.equal(keep, mask)


def test_ties_and_no_candidates():
    entropy = torch.tensor([[1.0, 2.0, 2.0, 2.0, 0.5]])
    keep, threshold = high_entropy_mask(entropy, torch.ones(1, 5), 0.2)  # k = 1, tied with two others
    assert keep.tolist() == [[0.0, 1.0, 1.0, 1.0, 0.0]] and float(threshold) == 2.0
    keep, threshold = high_entropy_mask(entropy, torch.zeros(1, 5), 0.2)
    assert not keep.any() and math.isnan(float(threshold))
    for bad in (0.0, -0.1, 1.5, math.nan):
        with pytest.raises(ValueError, match="top_frac must be a number in"):
            high_entropy_mask(entropy, torch.ones(1, 5), bad)
    with pytest.raises(ValueError, match="differ"):
        high_entropy_mask(entropy, torch.ones(1, 4), 0.5)


def _grads(algo, batch, logp0, entropy):
    logp = logp0.clone().requires_grad_(True)
    loss, metrics = objective(algo, batch, logp, entropy, None, minibatch_counts(batch), horizon=9)
    loss.backward()
    return loss.detach(), logp.grad, metrics


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "gspo", "cispo"])
def test_the_objective_is_the_full_one_weighted_by_the_mask(seed, name):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)
    mask = batch.response_mask
    entropy = torch.rand(mask.shape, generator=gen, dtype=torch.float64) * 5
    logp0 = batch.old_logp + 0.2 * torch.randn(mask.shape, generator=gen, dtype=torch.float64) * mask
    frac = 0.3
    loss, grad, metrics = _grads(AlgoConfig(name=name, entropy_top_frac=frac), batch, logp0, entropy)
    keep, threshold = high_entropy_mask(entropy, mask, frac)
    batch.is_weights = keep.double()  # the same selection as token weights, on the full objective
    want, want_grad, _ = _grads(AlgoConfig(name=name), batch, logp0, None)
    assert torch.equal(loss, want) and torch.equal(grad, want_grad)
    # the left-out tokens get no policy gradient; the kept ones do
    assert float(grad[(mask > 0) & (keep == 0)].abs().max()) == 0.0 and float(grad[keep > 0].abs().max()) > 0
    assert float(metrics["entropy_kept_frac"]) == pytest.approx(float(keep.sum() / mask.sum()))
    assert float(metrics["entropy_threshold"]) == pytest.approx(float(threshold))  # (one micro-batch: its own)
    batch.is_weights = None
    full, _, _ = _grads(AlgoConfig(name=name, entropy_top_frac=1.0), batch, logp0, None)  # 1: no entropy needed
    assert torch.equal(full, _grads(AlgoConfig(name=name), batch, logp0, None)[0])


def test_the_kl_penalty_and_the_denominator_keep_every_token(seed):
    gen = torch.Generator().manual_seed(seed)
    batch = _batch(gen)
    mask = batch.response_mask
    batch.ref_logp = batch.old_logp - 0.3 * torch.rand(mask.shape, generator=gen, dtype=torch.float64) * mask
    entropy = torch.rand(mask.shape, generator=gen, dtype=torch.float64)
    keep, _ = high_entropy_mask(entropy, mask, 0.25)
    loss, grad, _ = _grads(AlgoConfig(name="grpo", loss_agg="token-mean", kl_coef=0.1, entropy_top_frac=0.25),
                           batch, batch.old_logp.clone(), entropy)
    kl_only, kl_grad, _ = _grads(AlgoConfig(name="grpo", loss_agg="token-mean", kl_coef=0.1),
                                 _zero_advantages(batch), batch.old_logp.clone(), None)
    left_out = (mask > 0) & (keep == 0)
    assert torch.allclose(grad[left_out], kl_grad[left_out], rtol=0, atol=1e-15) and kl_grad[left_out].abs().max() > 0
    # at ratio 1 the policy term is -A per kept token, over all of the tokens (not the kept ones)
    R = batch.rewards.view(2, 4)
    A = ((R - R.mean(1, keepdim=True)) / (R.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)
    # (1e-7: the rewards, and so the advantages, are float32 here; the rest is float64)
    assert abs(float(loss - kl_only - (-A * keep).sum() / mask.sum())) <= 1e-7
    kept = keep > 0  # each kept token's policy gradient is -A / (all the tokens), not / (the kept ones)
    assert torch.allclose((grad - kl_grad)[kept], (-A.double() * keep / mask.sum())[kept], rtol=1e-6, atol=0)
    assert float(A.abs().min()) > 0.1


def _zero_advantages(batch):
    """``batch`` with rewards that give every group zero advantages (the KL term alone)."""
    out = RolloutBatch(batch.input_ids, batch.attention_mask, batch.response_mask, torch.zeros_like(batch.rewards),
                       group_size=batch.group_size)
    out.old_logp, out.ref_logp = batch.old_logp, batch.ref_logp
    return out


@pytest.mark.parametrize("overrides,message", [
    (["algo.entropy_top_frac=0.2"], "PACS's score sums the log-ratio of every response token"),
    (["algo.name=grpo", "algo.entropy_top_frac=0"], r"algo.entropy_top_frac must be in \(0, 1\]"),
    (["algo.name=grpo", "algo.entropy_top_frac=1.2"], r"algo.entropy_top_frac must be in \(0, 1\]"),
])
def test_the_setting_is_checked(overrides, message):
    with pytest.raises(ValueError, match=message):
        validate(load_config(None, overrides))


def _learner_batch(gen, G=4, P=4, T=12, vocab=128):
    from rollout_rows import rollout_rows

    lengths = [int(x) for x in torch.randint(14, 14 + T, (G * P,), generator=gen)]  # (prompts take up to 12)
    ids, am, rm = rollout_rows(gen, lengths, vocab, left_pad=False)
    return dict(input_ids=ids, attention_mask=am, response_mask=rm,
                rewards=(torch.rand(G * P, generator=gen) < 0.5).float(), group_size=G)


def test_the_torch_learner_computes_the_entropies_and_records_the_selection(seed, tmp_path):
    from pacs_fast.data.tiny import make_tiny_model
    from pacs_fast.learner.torch_learner import TorchLearner
    from transformers import AutoModelForCausalLM

    gen = torch.Generator().manual_seed(seed)
    spec = _learner_batch(gen)
    model = AutoModelForCausalLM.from_pretrained(make_tiny_model(tmp_path / "m", seed=seed % 1000))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = TorchLearner(model, algo=AlgoConfig(name="grpo", entropy_top_frac=0.25),
                           learner=LearnerConfig(lr=1e-2, mini_batch_prompts=4, micro_batch_prompts=2,
                                                 logprob_backend="torch"), horizon=12)
    batch = RolloutBatch(**spec)
    batch.old_logp = learner.compute_logprobs(batch)
    batch.ref_logp = batch.old_logp
    metrics = learner.update(batch, seed=1)
    n = int(batch.response_mask.sum())
    # each micro-batch keeps ceil(0.25 x its tokens) (ties: more), together about a quarter of the n tokens; the
    # fraction is averaged in float32 over the micro-batches (exactly a quarter read 0.2499999925: 1e-6 below)
    assert 0.25 - 1e-6 <= metrics["entropy_kept_frac"] <= 0.25 + 2 / n + 0.05
    assert 0 < metrics["entropy_threshold"] <= math.log(128) + 1e-4
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


MEGATRON_SCRIPT = r"""
import sys, torch
sys.path.insert(0, sys.argv[2])
from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.learner.megatron.learner import MegatronLearner
from pacs_fast.learner.megatron.setup import init_parallel
spec = torch.load(sys.argv[1] + "/spec.pt")
init_parallel(1, device="cpu")
learner = MegatronLearner(spec["model"], algo=AlgoConfig(name="grpo", entropy_top_frac=0.25), device="cpu",
                          learner=LearnerConfig(lr=1e-2, mini_batch_prompts=4, micro_batch_prompts=2,
                                                logprob_backend="torch", backend="megatron", tp_size=1),
                          horizon=12)
batch = RolloutBatch(**spec["batch"])
batch.old_logp = learner.compute_logprobs(batch)
batch.ref_logp = batch.old_logp
torch.save(learner.update(batch, seed=1), sys.argv[1] + "/metrics.pt")
"""


@pytest.mark.megatron
@pytest.mark.timeout(300)
def test_megatron_selects_as_the_torch_learner(seed, tmp_path):
    """One megatron process (no torchrun): the same threshold (a continuous function of the entropies, to
    float noise) and the same kept share (the count a fraction keeps) as the torch learner; the selected
    tokens themselves could differ at a near tie, so the weights are not compared here."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    from pacs_fast.data.tiny import make_tiny_model
    from pacs_fast.learner.torch_learner import TorchLearner
    from transformers import AutoModelForCausalLM

    gen = torch.Generator().manual_seed(seed)
    spec = {"model": str(make_tiny_model(tmp_path / "m", seed=seed % 1000, tie_word_embeddings=False)),
            "batch": _learner_batch(gen)}
    torch.save(spec, tmp_path / "spec.pt")
    run_python(["-c", MEGATRON_SCRIPT, tmp_path, os.path.dirname(__file__)])
    got = torch.load(tmp_path / "metrics.pt")
    learner = TorchLearner(AutoModelForCausalLM.from_pretrained(spec["model"]),
                           algo=AlgoConfig(name="grpo", entropy_top_frac=0.25),
                           learner=LearnerConfig(lr=1e-2, mini_batch_prompts=4, micro_batch_prompts=2,
                                                 logprob_backend="torch"), horizon=12)
    batch = RolloutBatch(**spec["batch"])
    batch.old_logp = learner.compute_logprobs(batch)
    batch.ref_logp = batch.old_logp
    want = learner.update(batch, seed=1)
    assert got["entropy_kept_frac"] == pytest.approx(want["entropy_kept_frac"], rel=1e-6)  # (float32 sums)
    assert got["entropy_threshold"] == pytest.approx(want["entropy_threshold"], rel=1e-5)
    assert got["optimizer_steps"] == want["optimizer_steps"] == 1


def test_a_run_records_the_selection(tmp_path, warm_cache):
    from pacs_fast.train import main
    from pacs_fast.trainer.metrics import read_jsonl

    from test_train import TINY

    main(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.run_name=r", "train.steps=2",
                 "algo.name=grpo", "algo.entropy_top_frac=0.2"])
    train = [r for r in read_jsonl(tmp_path / "r" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(train) == 2
    for r in train:
        assert 0.2 <= r["learner/entropy_kept_frac"] < 0.35 and r["learner/entropy_threshold"] > 0
