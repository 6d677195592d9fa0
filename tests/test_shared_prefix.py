"""Shared-prefix forward: each group's longest common prefix (prompt and shared response start)
once, the rest of each row on the cached prefix. Same log-probs, entropies, values and gradients as
the plain forward (float64), and a plain fallback whenever the batch does not fit."""
import copy
import random

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner import TorchLearner
from pacs_fast.learner.shared_prefix import split_groups
from pacs_fast.trainer.batch import build_batch


@pytest.fixture(scope="module", autouse=True)
def float64_throughout():
    """Hugging Face's Qwen2 computes RoPE's cos/sin and RMSNorm in float32 even in a float64 model;
    float32 ``cos`` rounds differently with the tensor's shape (vector loop vs tail), so the two
    paths would agree only to ~1e-7. These tests run both in the model's dtype, so that the paths
    must agree to float64 rounding."""
    from transformers.models.qwen2 import modeling_qwen2 as qwen2

    def rotary(self, x, position_ids):
        freqs = position_ids[..., None].to(x.dtype) * self.inv_freq.to(device=x.device, dtype=x.dtype)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    def rms_norm(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(qwen2.Qwen2RotaryEmbedding, "forward", rotary)
        mp.setattr(qwen2.Qwen2RMSNorm, "forward", rms_norm)
        yield


@pytest.fixture(scope="module")
def model64(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from pacs_fast.data.tiny import make_tiny_model
    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=1, hidden_size=64, num_layers=2, num_heads=2,
                           num_kv_heads=1, intermediate_size=96)
    return AutoModelForCausalLM.from_pretrained(path).double()


def random_batch(rng, groups, G, vocab=90, empty=False, longest=9, shared_start=0, copies=0.0):
    """Random groups; each group's responses start with the same ``shared_start`` tokens (cut to
    their length) and each response is a copy of its group's first one with probability ``copies``."""
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(1, 7))] for _ in range(groups)]
    responses = []
    for g in range(groups):
        start = [rng.randrange(3, vocab) for _ in range(shared_start)]
        # the first group's rows all keep the shared start, so the prefix reaches into a response in
        # every draw (elsewhere an empty or cut row may stop it at the prompt)
        low = max(shared_start, 1) if g == 0 and shared_start else (0 if empty else 1)
        rows = [(start + [rng.randrange(3, vocab) for _ in range(longest)])[:rng.randint(low, longest)]
                for _ in range(G)]
        responses.append([list(rows[0]) if i and rng.random() < copies else r for i, r in enumerate(rows)])
    return build_batch(prompts, responses, [float(rng.random() < 0.5) for _ in range(groups * G)], pad_id=0)


def learner_for(model, shared, algo="ppo", attn="sdpa", packing="off"):
    """packing="off": the shared-prefix forward against padded whole rows (learner.packing=auto could
    replace either with packed rows; tests/test_packing.py checks those)."""
    model = copy.deepcopy(model)
    model.set_attn_implementation(attn)
    return TorchLearner(model, algo=AlgoConfig(name=algo),
                        learner=LearnerConfig(shared_prefix=shared, packing=packing), temperature=0.7, horizon=9)


def assert_grads_close(want, got, attn="sdpa"):
    """Same gradients to float64 rounding, relative to each gradient's size (a wrong path is off by
    O(1)). Hugging Face's eager attention runs its softmax in float32 even in a float64 model, and
    the shared path sums a prefix's G gradients before that softmax's backward (the plain path
    after it): with it, agreement is to float32 rounding. A gradient that is zero in exact arithmetic
    (e.g. the query projections when each row has one response token) is rounding noise of the
    others: the scale is floored at 1e-6 of the largest gradient."""
    tol = 1e-5 if attn == "eager" else 1e-10
    assert want.keys() == got.keys()
    largest = max(float(g.abs().max()) for g in want.values())
    assert largest > 0
    for n in want:
        scale = max(float(want[n].abs().max()), 1e-6 * largest)
        assert float((want[n] - got[n]).abs().max()) <= tol * scale, n


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
    for _ in range(30):
        G = rng.randint(2, 5)
        batch = random_batch(rng, rng.randint(1, 4), G, empty=True, shared_start=rng.choice([0, 3]),
                             copies=rng.choice([0.0, 0.7]))
        lay = split_groups(batch.input_ids, batch.attention_mask, G)
        assert lay is not None
        for k in range(batch.num_rows // G):
            rows = [batch.input_ids[i, :int(batch.attention_mask[i].sum())].tolist() for i in range(k * G, k * G + G)]
            p = int(lay.prompt_len[k * G])
            assert all(r[:p] == rows[0][:p] for r in rows)  # a common prefix ...
            assert p == min(map(len, rows)) or len({r[p] for r in rows}) > 1  # ... and the longest one
        for i in range(batch.num_rows):
            n = int(batch.attention_mask[i].sum())
            prefix = lay.prompt_ids[i // G][lay.prompt_mask[i // G] > 0]
            assert bool((lay.prompt_mask[i // G].diff() <= 0).all())  # right-padded
            rest = lay.response_ids[i][lay.response_attn[i] > 0]
            assert len(prefix) == int(lay.prompt_len[i])
            assert torch.equal(torch.cat([prefix, rest]), batch.input_ids[i, :n])


def test_split_groups_refuses_what_does_not_fit(seed):
    rng = random.Random(seed)
    batch = random_batch(rng, 3, 4)
    ids = batch.input_ids.clone()
    ids[5, 0] = (ids[5, 0] + 1) % 90 + 3  # one row differs from its group's from the first token
    assert split_groups(ids, batch.attention_mask, 4) is None
    assert split_groups(batch.input_ids, batch.attention_mask, 1) is None
    left = batch.attention_mask.flip(1)  # left padding is not the batch layout
    if not torch.equal(left, batch.attention_mask):
        assert split_groups(batch.input_ids, left, 4) is None
    ids = batch.input_ids.clone()
    ids[5, 1] = (ids[5, 1] + 1) % 90 + 3  # rows that differ later only shorten the common prefix
    lay = split_groups(ids, batch.attention_mask, 4)
    assert lay is not None and int(lay.prompt_len[4]) == 1


@pytest.mark.parametrize("groups, G, empty, attn, longest, shared_start, copies", [
    (3, 4, False, "sdpa", 9, 0, 0.0), (2, 5, True, "sdpa", 9, 0, 0.0), (1, 2, False, "sdpa", 9, 0, 0.0),
    (4, 1, False, "sdpa", 9, 0, 0.0), (3, 3, True, "eager", 9, 0, 0.0),
    (2, 3, False, "sdpa", 1, 0, 0.0),           # one-token responses (no per-row pass)
    (3, 4, False, "sdpa", 9, 4, 0.0),           # responses share their start
    (3, 4, True, "eager", 9, 3, 0.5),           # ... and some are identical
    (2, 3, False, "sdpa", 6, 6, 1.0),           # whole groups identical (everything is prefix)
    (3, 4, False, "pacs_fast_short", 9, 2, 0.3)])
def test_shared_equals_plain_forward_and_backward(model64, seed, groups, G, empty, attn, longest, shared_start,
                                                  copies):
    rng = random.Random(seed)
    batch = random_batch(rng, groups, G, empty=empty, longest=longest, shared_start=shared_start, copies=copies)
    if longest > 2 and rng.random() < 0.5:  # holes in the response mask (e.g. tool output that does not train)
        batch.response_mask[:, -2] = 0.0
    trained = batch.response_mask[1].nonzero().squeeze(1)
    if shared_start and len(trained):  # a row that does not train some of its group's shared tokens
        batch.response_mask[1, :trained[:2].max() + 1] = 0.0
    if shared_start:  # the common prefix reaches into the responses (the path under test is taken)
        lay = split_groups(batch.input_ids, batch.attention_mask, G)
        first = (batch.response_mask + (batch.attention_mask == 0)).argmax(1)  # first response column (or end)
        assert bool((lay.prompt_len > first).any())
    if attn == "pacs_fast_short":
        from pacs_fast.ops.short_attention import register
        register()
    torch.manual_seed(seed)
    plain = learner_for(model64, shared=False, attn=attn)
    with torch.no_grad():
        plain.value_head.weight.normal_()
    shared = learner_for(model64, shared=True, attn=attn)
    shared.value_head.load_state_dict(plain.value_head.state_dict())
    a, b = forward_and_grads(plain, batch), forward_and_grads(shared, batch)
    m = batch.response_mask > 0
    atol = 1e-5 if attn == "eager" else 1e-10  # eager: float32 softmax (see assert_grads_close)
    for x, y in zip(a[:3], b[:3]):
        assert torch.allclose(x, y, atol=atol, rtol=0), float((x - y).abs().max())
        assert (y[~m] == 0).all()
    assert float(a[0][m].abs().min()) > 0  # real log-probs, not zeros on both sides
    assert_grads_close(a[3], b[3], attn)


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
