"""The persistent TMA kernels of linear_logprobs (kernels/linear_logprobs_tma.py): the forward
(``CONFIG["FWD"] = "tma"``) under the interpreter against float64, with the bounds and inputs of
tests/test_linear_logprobs_fwd.py (same partial contract as the tiled forward): odd N and V, an H
(40) that is not a multiple of BLOCK_H (16), so the last K step reads the descriptor's zero fill;
several tiles per persistent program; extreme logits; bias with a whole vocab tile at -inf;
temperature; and forward + backward through the op. Inputs a TMA descriptor cannot take (fp32, a
row stride that is not 16-byte aligned) fall back to the tiled forward. Its sm_90 / sm_100 compile
(TMA copies feeding wgmma / tcgen05, no spills) is checked in tests/test_kernels_compile.py. The
backward's dz kernel (``CONFIG["DLOGITS"] = "tma"``) runs inside the chunked backward under
tests/test_linear_logprobs.py's float64 checks (one chunk, vocab chunks, rows and vocab chunked).
"""
import math

import pytest
import torch

from pacs_fast.ops import vocab_parallel as vp
from test_linear_logprobs_fwd import H, N, V, _blocks, _bounds, _inputs, _reference

pytestmark = [pytest.mark.interpret,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("error::pacs_fast.kernels.dispatch.KernelFallbackWarning")]  # no fallback


def _tma(monkeypatch, **kw):
    return _blocks(monkeypatch, FWD="tma", DLOGITS="tma", **kw)


def _spy(monkeypatch, name):
    """Counts the calls of linear_logprobs_tma.``name`` (the TMA path ran, not a fallback)."""
    from pacs_fast.kernels import linear_logprobs_tma as T
    calls, real = [], getattr(T, name)
    monkeypatch.setattr(T, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("scale,temperature,bias", [(0.5, 1.3, True), (1e3, 1.0, False), (0.5, 0.7, False)])
@pytest.mark.parametrize("persistent,flatten", [(1, 0), (3, 1)])
def test_tma_stats_match_float64(seed, monkeypatch, scale, temperature, bias, persistent, flatten):
    """bf16 partials per 16-wide vocab block: each block's max, and the merged two-part lse and
    entropy, within the first-order rounding bounds of test_linear_logprobs_fwd; the grid of
    ``persistent`` x 4 programs (4 "SMs" off-GPU) strides over the 3 x 13 tiles."""
    K = _tma(monkeypatch, PERSISTENT=persistent, FLATTEN=flatten)
    launched = _spy(monkeypatch, "stats_tma")
    hidden, weight, b = _inputs(torch.bfloat16, scale, bias)
    inv_t = 1.0 / temperature
    m_p, s_p, a_p = K.stats_fwd(hidden, weight, b, inv_t, True)
    assert launched  # the TMA kernel ran, not the fallback
    n_blocks = math.ceil(V / 16)
    assert m_p.shape == s_p.shape == a_p.shape == (n_blocks, N)
    x, lse, ent, cmax, sens, spread = _reference(hidden, weight, b, inv_t)
    lse_tol, ent_tol = _bounds(cmax, sens, spread, V)
    blk_max = torch.stack([x[:, i * 16:(i + 1) * 16].amax(1) for i in range(n_blocks)])
    assert torch.equal(torch.isneginf(m_p), torch.isneginf(blk_max))
    fin = torch.isfinite(blk_max)
    assert ((m_p.double() - blk_max).abs()[fin] <= (2 * H * U_ * cmax).expand_as(blk_max)[fin]).all()
    m, s, a = vp.merge_splits(m_p, s_p, a_p)
    two_part = m.double() + s.double().log()
    assert ((two_part - lse).abs() <= lse_tol).all(), ((two_part - lse).abs() / lse_tol).max()
    ent_k = s.double().log() - a.double() / s.double()
    assert ((ent_k - ent).abs() <= ent_tol).all(), ((ent_k - ent).abs() / ent_tol).max()


U_ = 2.0 ** -24


def test_without_entropy_only_m_and_s(seed, monkeypatch):
    K = _tma(monkeypatch)
    hidden, weight, b = _inputs(torch.bfloat16, 0.5, True)
    with_ent = K.stats_fwd(hidden, weight, b, 1.0, True)
    m, s, a = K.stats_fwd(hidden, weight, b, 1.0, False)
    assert a is None and torch.equal(m, with_ent[0]) and torch.equal(s, with_ent[1])


@pytest.mark.parametrize("case", ["fp32", "unaligned rows"])
def test_inputs_a_descriptor_cannot_take_fall_back_to_the_tiled_forward(seed, monkeypatch, case):
    """Same partials as FWD="tiles" (bit for bit: the same kernel runs), and stats_tma is not called."""
    from pacs_fast.kernels import linear_logprobs_tma as T
    K = _tma(monkeypatch)
    monkeypatch.setattr(T, "stats_tma", lambda *a: pytest.fail("stats_tma ran on inputs TMA cannot take"))
    hidden, weight, b = _inputs(torch.float32 if case == "fp32" else torch.bfloat16, 0.5, True)
    if case == "unaligned rows":  # rows of 36 bf16 = 72 B: not a multiple of 16
        hidden = torch.empty(N, 36, dtype=hidden.dtype)[:, :36].copy_(hidden[:, :36])
        weight = weight[:, :36].contiguous()
        assert (hidden.stride(0) * hidden.element_size()) % 16
    assert not T.tma_usable(hidden, weight)
    got = K.stats_fwd(hidden, weight, b, 0.9, True)
    monkeypatch.setitem(K.CONFIG, "FWD", "tiles")
    want = K.stats_fwd(hidden, weight, b, 0.9, True)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("temperature,entropy,bias", [(0.7, True, False), (1.0, True, True), (1.3, False, True)])
@pytest.mark.parametrize("chunk_bytes", [None, (N, 64), (8, 64)])  # one dz chunk / vocab / rows and vocab
def test_autograd_op_with_the_tma_kernels(seed, monkeypatch, temperature, entropy, bias, chunk_bytes):
    """Forward + backward through ``linear_logprobs`` with both TMA kernels (the forward, and the dz
    kernel of the chunked backward in every chunking) under the value and gradient checks of
    tests/test_linear_logprobs.py (float64 reference, ignored rows, fp32-autograd-relative
    gradient bounds)."""
    from test_linear_logprobs import check
    _tma(monkeypatch, PERSISTENT=2)
    fwd, bwd = _spy(monkeypatch, "stats_tma"), _spy(monkeypatch, "dlogits_tma")
    check(torch.bfloat16, "triton", temperature, entropy, bias, v=V, chunk_bytes=chunk_bytes)
    assert fwd and bwd  # both TMA kernels ran
    if chunk_bytes is not None:
        assert len(bwd) > 1  # one launch per chunk


def test_dz_kernel_falls_back_and_rejects_an_unknown_choice(seed, monkeypatch):
    """fp32 inputs take the pointer dz kernel with DLOGITS="tma" (same result bit for bit); an
    unknown CONFIG["DLOGITS"] is a one-line error naming the key."""
    from pacs_fast.kernels import linear_logprobs_bwd as KB, linear_logprobs_tma as T
    K = _tma(monkeypatch)
    monkeypatch.setattr(T, "dlogits_tma", lambda *a: pytest.fail("dlogits_tma ran on fp32 inputs"))
    hidden, weight, b = _inputs(torch.float32, 0.5, True)
    n = hidden.shape[0]
    labels = torch.randint(0, V, (n,))
    m, s, a = vp.merge_splits(*K.stats_fwd(hidden, weight, b, 0.9, True))  # the rows' real statistics
    log_s = s.log()
    args = (hidden, weight, b, 0.9, labels, 0, m, log_s, log_s - a / s, torch.randn(n), torch.randn(n))
    got = KB.grad_bwd_chunked(*args, chunk_bytes=(8, 64))
    monkeypatch.setitem(K.CONFIG, "DLOGITS", None)
    want = KB.grad_bwd_chunked(*args, chunk_bytes=(8, 64))
    for g, w in zip(got, want):
        assert torch.isfinite(g).all() and torch.equal(g, w)
    monkeypatch.setitem(K.CONFIG, "DLOGITS", "cublas")
    with pytest.raises(ValueError, match="DLOGITS"):
        KB.grad_bwd_chunked(*args)
