"""pacs_fast's short-sequence CPU attention: the same attention as a float64 reference (forward,
backward, gradcheck), Hugging Face's masks and grouped-query heads, SDPA above its size limits,
and the same model outputs / greedy rollouts as SDPA in a real model."""
import pytest
import torch

from pacs_fast.ops import short_attention as sa


class Attn(torch.nn.Module):
    is_causal = True

    def __init__(self, groups=1):
        super().__init__()
        self.num_key_value_groups = groups


def reference(q, k, v, allowed, scale):
    """float64 softmax(q k^T scale) v with K/V heads repeated; masked scores at the lowest finite
    value (a row with no visible key averages the values, as eager attention does)."""
    r = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(r, 1), v.double().repeat_interleave(r, 1)
    s = q.double() @ k.transpose(-1, -2) * scale
    if allowed is not None:
        s = s.masked_fill(~allowed, torch.finfo(torch.float64).min)
    return (torch.softmax(s, -1) @ v).transpose(1, 2)


def inputs(gen, b, h, kvh, q, k, d=8, dtype=torch.float64, scale=1.0):
    # Hugging Face's query layout: a transposed view of [b, q, h, d]
    query = (torch.randn(b, q, h, d, generator=gen, dtype=dtype) * scale).transpose(1, 2)
    key = torch.randn(b, kvh, k, d, generator=gen, dtype=dtype) * scale
    value = torch.randn(b, kvh, k, d, generator=gen, dtype=dtype)
    return query, key, value


def padding_mask(gen, b, q, k, left=False):
    """[b, 1, q, k] bool, causal (query i at key k - q + i) with each row's keys cut to a random length.
    The first row keeps at least 2 keys: a batch where every query sees one key has a softmax of 1
    everywhere and zero query / key gradients (~0.5% of seeds at k = 6 before)."""
    n = torch.randint(1, k + 1, (b,), generator=gen)
    n[0] = max(int(n[0]), min(2, k))
    pos = torch.arange(k)
    keys = pos[None] >= (k - n)[:, None] if left else pos[None] < n[:, None]
    causal = torch.ones(q, k, dtype=torch.bool).tril(k - q)
    return (causal[None] & keys[:, None, :])[:, None]


@pytest.mark.parametrize("h, kvh, q, k, mask", [
    (4, 2, 5, 5, "none"), (4, 2, 1, 7, "none"), (4, 4, 3, 9, "none"), (6, 2, 6, 6, "right"),
    (4, 1, 4, 11, "right"), (4, 2, 7, 7, "left"), (2, 2, 1, 13, "left")])
def test_matches_float64_reference_forward_and_backward(seed, h, kvh, q, k, mask):
    gen = torch.Generator().manual_seed(seed)
    b = 3
    query, key, value = inputs(gen, b, h, kvh, q, k, scale=3.0)  # large scores: a peaked softmax
    allowed = None if mask == "none" else padding_mask(gen, b, q, k, left=mask == "left")
    want_allowed = torch.ones(q, k, dtype=torch.bool).tril(k - q) if allowed is None else allowed
    leaves = [t.detach().requires_grad_() for t in (query, key, value)]
    want = reference(*leaves, want_allowed, 0.3)
    got, _ = sa.short_attention(Attn(h // kvh), *leaves, allowed, scaling=0.3)
    assert got.shape == (b, q, h, 8) and got.is_contiguous()
    assert torch.isfinite(got).all()  # a left-padding row with no visible key does not give NaN
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    w = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    g_want = torch.autograd.grad((want * w).sum(), leaves)
    g_got = torch.autograd.grad((sa.short_attention(Attn(h // kvh), *leaves, allowed, scaling=0.3)[0] * w).sum(),
                                leaves)
    for a, b_ in zip(g_want, g_got):
        assert torch.allclose(a, b_, atol=1e-11, rtol=0)
        assert float(a.abs().max()) > 0


def test_values_with_their_own_head_size(seed):
    """MLA (DeepSeek-V2/V3, MiniCPM3): the values' head size (``v_head_dim``) differs from the queries' / keys'
    (``qk_nope_head_dim + qk_rope_head_dim``). The output was viewed with the queries' size: a RuntimeError in the
    first rollout of a MiniCPM3 model (``shape '[4, 4, 4, 48]' is invalid``). Same float64 tolerances as above."""
    gen = torch.Generator().manual_seed(seed)
    query, key, _ = inputs(gen, 2, 4, 2, 5, 7, d=12)
    value = torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64)
    allowed = padding_mask(gen, 2, 5, 7)
    leaves = [t.detach().requires_grad_() for t in (query, key, value)]
    got, _ = sa.short_attention(Attn(2), *leaves, allowed, scaling=0.3)
    want = reference(*leaves, allowed, 0.3)
    assert got.shape == (2, 5, 4, 8) and torch.allclose(got, want, atol=1e-12, rtol=0)
    w = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    for a, b_ in zip(torch.autograd.grad((want * w).sum(), leaves), torch.autograd.grad((got * w).sum(), leaves)):
        assert torch.allclose(a, b_, atol=1e-11, rtol=0)


def test_gradcheck(seed):
    gen = torch.Generator().manual_seed(seed)
    query, key, value = inputs(gen, 2, 4, 2, 3, 5, d=4)
    allowed = padding_mask(gen, 2, 3, 5)
    leaves = [t.detach().requires_grad_() for t in (query, key, value)]
    assert torch.autograd.gradcheck(lambda *x: sa.short_attention(Attn(2), *x, allowed, scaling=0.5)[0], leaves)
    assert torch.autograd.gradcheck(lambda *x: sa.short_attention(Attn(2), *x, None)[0], leaves)


def test_bfloat16_close_to_float64(seed):
    """bf16 inputs against the float64 attention of the same (rounded) inputs, within the error of the
    path's three bf16 roundings, each at most u = 2^-8 relative: the scores (|ds_j| <= u |s_j| moves
    the output by sum_j p_j ds_j (v_j - o), at most u max|s| sum_j p_j |v_j - o|), the probabilities
    (u sum_j p_j |v_j|) and the output (u |o|). A fixed
    3e-2 failed on a seed whose largest scores (~5) made the first term 0.03 (seed 1099593863)."""
    gen = torch.Generator().manual_seed(seed)
    query, key, value = (t.bfloat16() for t in inputs(gen, 4, 4, 2, 9, 9, d=32, dtype=torch.float32))
    allowed = padding_mask(gen, 4, 9, 9)
    scale = 32 ** -0.5
    want = reference(query, key, value, allowed, scale)  # [b, q, h, d]
    got, _ = sa.short_attention(Attn(2), query, key, value, allowed)
    assert got.dtype == torch.bfloat16
    k, v = key.double().repeat_interleave(2, 1), value.double().repeat_interleave(2, 1)
    s = query.double() @ k.transpose(-1, -2) * scale                      # [b, h, q, k]
    p = torch.softmax(s.masked_fill(~allowed, torch.finfo(torch.float64).min), -1)
    o = p @ v                                                             # [b, h, q, d]
    s_max = s.abs().masked_fill(~allowed, 0).amax(-1, keepdim=True)       # [b, h, q, 1]
    spread = (p[..., None] * (v[:, :, None] - o[:, :, :, None]).abs()).sum(-2)  # sum_j p_j |v_j - o|
    size = p @ v.abs()
    u = 2.0 ** -8  # the scores are rounded twice (matmul, then the scale), 2^-9 each
    # 1.25: second-order terms and the fp32 accumulation; 300 seeds reached 0.89 of the first-order bound
    bound = 1.25 * (u * (s_max * spread + size + o.abs())).transpose(1, 2)
    err = (got.double() - want).abs()
    assert bool((err <= bound).all()), float((err / bound).max())
    leaves = [t.bfloat16().detach().requires_grad_() for t in (query, key, value)]
    sa.short_attention(Attn(2), *leaves, allowed)[0].float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad).all() for t in leaves)


def test_large_inputs_go_to_sdpa(monkeypatch, seed):
    from transformers.integrations import sdpa_attention

    gen = torch.Generator().manual_seed(seed)
    calls = []
    real = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    small = inputs(gen, 1, 2, 2, 8, 8, dtype=torch.float32)
    sa.short_attention(Attn(), *small, None)
    assert calls == []
    big = inputs(gen, 1, 2, 2, 64, 64, dtype=torch.float32)  # 64*64 > MAX_SCORES
    out, _ = sa.short_attention(Attn(), *big, None)
    assert calls == [1]
    want = reference(*big, torch.ones(64, 64, dtype=torch.bool).tril(), 8 ** -0.5)
    assert torch.allclose(out.double(), want, atol=1e-5)
    train = [t.requires_grad_() for t in inputs(gen, 1, 2, 2, 40, 40, dtype=torch.float32)]  # > MAX_SCORES_TRAIN
    sa.short_attention(Attn(), *train, None)
    assert calls == [1, 1]
    with torch.no_grad():  # the same size without gradients stays on the matmul path
        sa.short_attention(Attn(), *train, None)
    assert calls == [1, 1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs_fast.data.tiny import make_tiny_model
    path = make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=3)
    return path, AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_use_attention_names(tiny):
    import copy
    _, model, _ = tiny
    model = copy.deepcopy(model)
    assert sa.use_attention(model, "auto") == sa.NAME == model.config._attn_implementation
    assert sa.use_attention(model, "eager") == "eager"
    with pytest.raises(ValueError, match="bogus"):
        sa.use_attention(model, "bogus")


def test_model_outputs_and_greedy_rollouts_match_sdpa(tiny, seed):
    import copy

    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine
    _, model, tok = tiny
    ref, short = copy.deepcopy(model), copy.deepcopy(model)
    sa.use_attention(ref, "sdpa")
    sa.use_attention(short, "short")
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 90, (4, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    mask[3, 5:] = 0
    with torch.no_grad():
        a, b = ref(input_ids=ids, attention_mask=mask).logits, short(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    assert torch.allclose(a[keep], b[keep], atol=1e-4)
    prompts = [tok(p)["input_ids"] for p in ["12+3=", "7+45=", "1+1=", "99+99="]]
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    got = HFEngine(short, tok, batch_size=8).generate(prompts, params)
    want = HFEngine(ref, tok, batch_size=8).generate(prompts, params)
    assert [[c.token_ids for c in cs] for cs in got] == [[c.token_ids for c in cs] for cs in want]


def test_engine_makes_one_padded_chunk_with_short_attention(tiny):
    import copy

    from pacs_fast.rollout.hf import HFEngine
    _, model, tok = tiny
    prompts = [[5] * 3] * 20 + [[6] * 4] * 20
    m = copy.deepcopy(model)
    sa.use_attention(m, "sdpa")
    assert len(HFEngine(m, tok, batch_size=1024)._lean_chunks(prompts, 8)) == 2   # one per length (160 rows each)
    sa.use_attention(m, "short")
    assert len(HFEngine(m, tok, batch_size=1024)._lean_chunks(prompts, 8)) == 1
