"""The Triton forward's finish (kernels/linear_logprobs_finish.py): the merge of ``[S, N]`` per-row
partials and the target logit's gather-dot in one kernel, under the interpreter, against float64.

Inputs: odd N (37, not a multiple of the 16-row block) and H (300: a full 256-wide step and a ragged
tail); S = 1, 32 (one full merge step) and 45 (a ragged second step); partials spread over +-3e3
(extreme logits: an unscaled exp would overflow fp32); rows whose partials are all empty (-inf);
a shard offset under which a third of the labels belong to another rank (target 0, no load);
bf16 and fp32 weights, bias, temperature, entropy on and off. Non-finite rows keep the torch
merge's semantics (NaN and +inf rows give NaN). The op-level float64 checks of
tests/test_linear_logprobs.py run through this kernel whenever the Triton backend is chosen.
"""
import pytest
import torch

from pacs_fast.kernels.linear_logprobs_finish import finish
from pacs_fast.ops import vocab_parallel as vp

pytestmark = pytest.mark.interpret

U = 2.0 ** -24  # fp32 unit roundoff
N, H, V = 37, 300, 53


def _partials(S, seed, empty_rows=(3, 20)):
    """fp32 ``[S, N]`` partials of random logits (each one a valid partial of some vocab block):
    each row's block maxima within 40 below a row offset anywhere in +-3e3 (extreme logits whose
    partials all count), ``s`` in [1, 9] (the block's max term is 1), ``a`` in [-(s-1)*30, 0]."""
    g = torch.Generator().manual_seed(seed)
    offset = (torch.rand(1, N, generator=g, dtype=torch.float64) - 0.5) * 6e3
    m = offset - 40.0 * torch.rand(S, N, generator=g, dtype=torch.float64)
    s = 1.0 + 8.0 * torch.rand(S, N, generator=g, dtype=torch.float64)
    a = -(s - 1.0) * 30.0 * torch.rand(S, N, generator=g, dtype=torch.float64)
    if S > 1:  # some empty partials inside otherwise full rows
        m[0, :] = float("-inf")
        s[0, :], a[0, :] = 0.0, 0.0
    for r in empty_rows:  # rows with no column at all (every partial empty)
        m[:, r] = float("-inf")
        s[:, r], a[:, r] = 0.0, 0.0
    return m.float(), s.float(), a.float()


def _merge64(m, s, a):
    """The exact merge of the (fp32-rounded) partials, in float64."""
    m, s, a = m.double(), s.double(), a.double()
    mx = m.amax(0)
    ref = torch.where(torch.isneginf(mx), torch.zeros_like(mx), mx)
    d = m - ref
    scale = torch.exp(d)
    s_m = (s * scale).sum(0)
    a_m = torch.where(scale == 0, torch.zeros_like(a), scale * (a + d * s)).sum(0)
    return mx, s_m, a_m, torch.where(scale == 0, torch.zeros_like(a), scale * (s + a.abs() + d.abs() * s)).sum(0)


def _inputs(dtype, seed, bias):
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(N, H, generator=g).to(dtype)
    weight = (3.0 * torch.randn(V, H, generator=g)).to(dtype)
    b = torch.randn(V, generator=g).to(dtype) if bias else None
    return hidden, weight, b


@pytest.mark.parametrize("S", [1, 32, 45])
@pytest.mark.parametrize("entropy", [True, False])
def test_merge_matches_float64(S, entropy):
    """Merged (m, s, a) against the float64 merge of the same fp32 partials. m is a max (exact);
    s and a are fp32 sums of S rescaled terms. Each term is off by a few roundings plus exp's
    relative error, which is the absolute error of its argument d = m_k - m (at most |d| * U, d
    within 40 here), so the bound is (S + 6 + max|d|) * U times the sum of the terms' magnitudes."""
    m, s, a = _partials(S, seed=10 + S)
    hidden, weight, _ = _inputs(torch.bfloat16, S, False)
    labels = torch.randint(0, V, (N,))
    m_k, s_k, a_k, _ = finish(m, s, a if entropy else None, hidden, weight, None, labels, 0, 1.0)
    mx, s64, a64, mag = _merge64(m, s, a)
    assert torch.equal(m_k.double(), mx)  # the max of fp32 values, exactly
    empty = torch.isneginf(mx)
    assert empty.sum() == 2 and (s_k[empty] == 0).all()
    d_max = (m.double() - torch.where(empty, 0.0, mx)).abs()
    d_max = torch.where(torch.isfinite(d_max), d_max, torch.zeros_like(d_max)).amax(0)
    bound = (S + 6 + d_max) * U * mag
    assert ((s_k.double() - s64).abs() <= bound).all(), ((s_k.double() - s64).abs() / bound).max()
    if entropy:
        assert (a_k[empty] == 0).all()
        assert ((a_k.double() - a64).abs() <= bound).all(), ((a_k.double() - a64).abs() / bound).max()
    else:
        assert a_k is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias,inv_t,v_offset", [(False, 1.0, 0), (True, 1 / 0.7, 0), (True, 1 / 1.3, 20)])
def test_target_logit_matches_float64(dtype, bias, inv_t, v_offset):
    """t_i = (h_i . W[y_i - off] + b) * inv_t in fp32 sums of exact products (bf16 x bf16 is exact
    in fp32; fp32 x fp32 rounds once): |t - t64| <= (H + 3) * U * (sum_k |h w| + |b|) * inv_t.
    Labels outside this shard's [off, off + V) give exactly 0."""
    hidden, weight, b = _inputs(dtype, 7, bias)
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, V + 2 * v_offset, (N,), generator=g)  # a third beyond the shard when off=20
    m, s, a = _partials(3, seed=1)
    _, _, _, t = finish(m, s, a, hidden, weight, b, labels, v_offset, inv_t)
    local = labels - v_offset
    owned = (local >= 0) & (local < V)
    assert 0 < owned.sum() < N or v_offset == 0
    safe = torch.where(owned, local, torch.zeros_like(local))
    prod = hidden.double() * weight.double()[safe]
    b64 = b.double()[safe] if bias else torch.zeros(N, dtype=torch.float64)
    t64 = (prod.sum(1) + b64) * inv_t
    bound = (H + 3) * U * (prod.abs().sum(1) + b64.abs()) * inv_t
    assert (t[~owned] == 0).all()
    err = (t.double() - t64).abs()[owned]
    assert (err <= bound[owned]).all(), (err / bound[owned]).max()


def test_equals_the_torch_merge_and_gather_dot():
    """Against what it replaces (vocab_parallel.merge_splits + the op's gather-dot), on partials
    from a real logits matrix split into 16-column blocks, bf16 inputs: agreement to a few fp32 ulps
    of each quantity's magnitude (two summation orders of the same fp32 terms)."""
    from pacs_fast.ops.linear_logprobs import _target_logit
    hidden, weight, b = _inputs(torch.bfloat16, 11, True)
    inv_t = 1 / 0.9
    x = (hidden.float() @ weight.float().T + b.float()) * inv_t
    blocks = [x[:, i:i + 16] for i in range(0, V, 16)]
    m_p = torch.stack([blk.amax(1) for blk in blocks])
    e = [torch.exp(blk - mp[:, None]) for blk, mp in zip(blocks, m_p)]
    s_p = torch.stack([ei.sum(1) for ei in e])
    a_p = torch.stack([(ei * (blk - mp[:, None])).sum(1) for ei, blk, mp in zip(e, blocks, m_p)])
    labels = torch.randint(0, V, (N,))
    m_k, s_k, a_k, t_k = finish(m_p, s_p, a_p, hidden, weight, b, labels, 0, inv_t)
    m_t, s_t, a_t = vp.merge_splits(m_p, s_p, a_p)
    t_t = _target_logit(hidden, weight, b, labels, 0, inv_t, h_scaled=False)
    assert torch.equal(m_k, m_t)
    torch.testing.assert_close(s_k, s_t, rtol=4 * len(blocks) * U, atol=0)
    torch.testing.assert_close(a_k, a_t, rtol=0, atol=4 * len(blocks) * U * float(a_t.abs().max()))
    torch.testing.assert_close(t_k, t_t, rtol=0, atol=(H + 3) * U * float(t_t.abs().max() + 50))


def test_non_finite_rows_follow_the_torch_merge():
    """A NaN or +inf in one partial of a row makes its s NaN (as merge_splits: exp(inf - inf));
    an all-empty row is m = -inf, s = 0; the other rows are untouched."""
    m, s, a = _partials(5, seed=2, empty_rows=(4,))
    m[2, 0] = float("inf")      # a +inf logit in row 0
    s[1, 1] = float("nan")      # a NaN logit in row 1
    m[3, 2] = float("nan")      # and one whose block max came out NaN
    s[3, 2] = float("nan")
    hidden, weight, _ = _inputs(torch.bfloat16, 5, False)
    labels = torch.randint(0, V, (N,))
    m_k, s_k, a_k, _ = finish(m, s, a, hidden, weight, None, labels, 0, 1.0)
    m_t, s_t, a_t = vp.merge_splits(m, s, a)
    assert torch.isnan(s_k[:3]).all() and torch.isnan(s_t[:3]).all()
    assert torch.isneginf(m_k[4]) and s_k[4] == 0 and a_k[4] == 0
    rest = torch.ones(N, dtype=torch.bool)
    rest[:3] = False
    assert torch.isfinite(s_k[rest]).all()
    torch.testing.assert_close(s_k[rest], s_t[rest], rtol=1e-5, atol=0)


def test_zero_rows_and_strided_weight():
    hidden, weight, _ = _inputs(torch.bfloat16, 1, False)
    m, s, a = _partials(2, seed=0)
    out = finish(m[:, :0], s[:, :0], a[:, :0], hidden[:0], weight, None, torch.zeros(0, dtype=torch.long), 0, 1.0)
    assert all(t.shape == (0,) for t in out)
    with pytest.raises(ValueError, match="weight must have unit stride"):
        finish(m, s, a, hidden, weight.t().contiguous().t(), None, torch.zeros(N, dtype=torch.long), 0, 1.0)
