"""Shared-prefix forward: each group's prompt once, its responses on the cached prompt. Same
log-probs, entropies, values and gradients as the plain forward (float64), and a plain fallback
whenever the batch does not fit."""
import copy
import random

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner import TorchLearner
from pacs_fast.learner.shared_prefix import split_groups
from pacs_fast.trainer.batch import build_batch


@pytest.fixture(scope="module")
def model64(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from pacs_fast.data.tiny import make_tiny_model
    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=1, hidden_size=64, num_layers=2, num_heads=2,
                           num_kv_heads=1, intermediate_size=96)
    return AutoModelForCausalLM.from_pretrained(path).double()


def random_batch(rng, groups, G, vocab=90, empty=False, longest=9):
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 7))] for _ in range(groups)]
    responses = [[[rng.randrange(3, vocab) for _ in range(rng.randint(0 if empty else 1, longest))]
                  for _ in range(G)] for _ in range(groups)]
    return build_batch(prompts, responses, [float(rng.random() < 0.5) for _ in range(groups * G)], pad_id=0)


def learner_for(model, shared, algo="ppo", attn="sdpa"):
    model = copy.deepcopy(model)
    model.set_attn_implementation(attn)
    return TorchLearner(model, algo=AlgoConfig(name=algo),
                        learner=LearnerConfig(shared_prefix=shared), temperature=0.7, horizon=9)


def assert_grads_close(want, got):
    """Hugging Face's RMSNorm computes in float32 even in a float64 model, and the shared path sums a
    prompt's G gradients before that norm's backward (the plain path after it): agreement is to
    float32 rounding, relative to each gradient's size (a wrong path is off by O(1))."""
    assert want.keys() == got.keys()
    for n in want:
        scale = float(want[n].abs().max())
        assert scale > 0, n
        assert float((want[n] - got[n]).abs().max()) <= 1e-5 * scale, n


def forward_and_grads(learner, batch):
    learner.model.zero_grad(set_to_none=True)
    learner.value_head.zero_grad(set_to_none=True)
    lp, ent, v = learner._forward(learner.model, batch, entropy=True, values=True)
    w = torch.randn(lp.shape, generator=torch.Generator().manual_seed(7), dtype=lp.dtype)
    ((lp * w).sum() + (ent * w.flip(0)).sum() + (v * w.flip(1)).sum()).backward()
    grads = {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), v.detach(), grads


def test_split_groups_rebuilds_every_row(seed):
    rng = random.Random(seed)
    for _ in range(20):
        G = rng.randint(2, 5)
        batch = random_batch(rng, rng.randint(1, 4), G, empty=True)
        lay = split_groups(batch.input_ids, batch.attention_mask, batch.response_mask, G)
        assert lay is not None
        for i in range(batch.num_rows):
            n = int(batch.attention_mask[i].sum())
            prompt = lay.prompt_ids[i // G][lay.prompt_mask[i // G] > 0]
            assert bool((lay.prompt_mask[i // G].diff() <= 0).all())  # right-padded
            resp = lay.response_ids[i][lay.response_attn[i] > 0]
            assert len(prompt) == int(lay.prompt_len[i])
            assert torch.equal(torch.cat([prompt, resp]), batch.input_ids[i, :n])


def test_split_groups_refuses_what_does_not_fit(seed):
    rng = random.Random(seed)
    batch = random_batch(rng, 3, 4)
    ids = batch.input_ids.clone()
    ids[5, 0] = (ids[5, 0] + 1) % 90 + 3  # one row's prompt differs from its group's
    assert split_groups(ids, batch.attention_mask, batch.response_mask, 4) is None
    assert split_groups(batch.input_ids, batch.attention_mask, batch.response_mask, 1) is None
    resp = batch.response_mask.clone()
    resp[2, 0] = 1.0  # a response token at position 0: no prefix
    assert split_groups(batch.input_ids, batch.attention_mask, resp, 4) is None
    left = batch.attention_mask.flip(1)  # left padding is not the batch layout
    if not torch.equal(left, batch.attention_mask):
        assert split_groups(batch.input_ids, left, batch.response_mask, 4) is None


@pytest.mark.parametrize("groups, G, empty, attn, longest", [
    (3, 4, False, "sdpa", 9), (2, 5, True, "sdpa", 9), (1, 2, False, "sdpa", 9), (4, 1, False, "sdpa", 9),
    (3, 3, True, "eager", 9), (2, 3, False, "sdpa", 1)])  # last: one-token responses (no response pass)
def test_shared_equals_plain_forward_and_backward(model64, seed, groups, G, empty, attn, longest):
    rng = random.Random(seed)
    batch = random_batch(rng, groups, G, empty=empty, longest=longest)
    if longest > 2 and rng.random() < 0.5:  # holes in the response mask (e.g. tool output that does not train)
        batch.response_mask[:, -2] = 0.0
    torch.manual_seed(seed)
    plain = learner_for(model64, shared=False, attn=attn)
    with torch.no_grad():
        plain.value_head.weight.normal_()
    shared = learner_for(model64, shared=True, attn=attn)
    shared.value_head.load_state_dict(plain.value_head.state_dict())
    a, b = forward_and_grads(plain, batch), forward_and_grads(shared, batch)
    m = batch.response_mask > 0
    for x, y in zip(a[:3], b[:3]):
        assert torch.allclose(x, y, atol=1e-10, rtol=0)
        assert (y[~m] == 0).all()
    assert float(a[0][m].abs().min()) > 0  # real log-probs, not zeros on both sides
    assert_grads_close(a[3], b[3])


def test_gradient_checkpointing_falls_back_to_plain(model64, seed):
    """Gradient checkpointing switches Hugging Face's cache off: the learner must not use the
    shared path then (it would lose the prompt) and still give the plain result."""
    rng = random.Random(seed)
    batch = random_batch(rng, 2, 3)
    want = learner_for(model64, shared=False)
    got = learner_for(model64, shared=True)
    got.model.gradient_checkpointing_enable()
    got.model.train()
    got.value_head.load_state_dict(want.value_head.state_dict())
    a, b = forward_and_grads(want, batch), forward_and_grads(got, batch)
    assert torch.allclose(a[0], b[0], atol=1e-10, rtol=0)
    assert_grads_close(a[3], b[3])
