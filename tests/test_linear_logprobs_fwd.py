"""The GEMM-shaped forward of linear_logprobs (kernels/linear_logprobs_fwd.py) under the interpreter,
against float64: odd N, H, V with blocks forced small (many row and vocab tiles, all ragged), the
persistent launch and several vocab tiles per program, extreme logits, bf16, temperature, bias (a
whole vocab tile masked by -inf), labels at the first / last / shard-boundary ids, a vocab shard
merge, and forward + backward through the autograd op.

Tolerances are first-order worst-case rounding bounds of the computation, with u = 2^-24 (fp32 unit
roundoff) and per row c = max_j sum_k |h_k W_jk| / T + |b_j| / T (the size of the logit sums):
each logit carries at most H u c of accumulation error, the sum-exp of V terms a relative V u, the
log-sum-exp the sum of the two (the partial merge adds a few u, inside the factor 2). Entropy: a
logit error d moves H(p) by at most d * sum_j p_j |log p_j + H| (its gradient's 1-norm), and the
sum ``a`` of V terms e_j (x_j - m) errs by V u E_p|x - m|. bf16 inputs are exact in fp32 products,
so the same bounds hold against float64 of the bf16 values. A wrong merge, mask or tile is O(1) off.
"""
import math

import pytest
import torch

from pacs_fast.ops import vocab_parallel as vp
from pacs_fast.ops.linear_logprobs import _target_logit, linear_logprobs

pytestmark = [pytest.mark.interpret,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("error::pacs_fast.kernels.dispatch.KernelFallbackWarning")]  # no fallback

N, H, V = 37, 40, 203
U = 2.0 ** -24


def _blocks(monkeypatch, **kw):
    from pacs_fast.kernels import linear_logprobs as K
    cfg = dict(BLOCK_N=16, BLOCK_V=16, BLOCK_H=16, GROUP_N=2, V_TILES=1, PERSISTENT=0, num_warps=1,
               num_stages=1, FWD="tiles")
    cfg.update(kw)
    for k, v in cfg.items():
        monkeypatch.setitem(K.CONFIG, k, v)
    return K


def _inputs(dtype, scale, bias, v=V):
    hidden = torch.randn(N, H)
    hidden[1] *= 30  # a sharply peaked row
    weight = torch.randn(v, H) * scale
    b = torch.randn(v) * scale if bias else None
    if bias:
        b[16:32] = float("-inf")  # vocab tile 1 (BLOCK_V = 16) entirely masked in every row
        b[40] = float("-inf")
    cast = (lambda t: None if t is None else t.to(dtype))
    return cast(hidden), cast(weight), cast(b)


def _reference(hidden, weight, b, inv_t):
    """float64 log-sum-exp, entropy and the two bounds' ingredients per row."""
    h, w = hidden.double(), weight.double()
    x = (h @ w.T + (0 if b is None else b.double())) * inv_t
    lse = torch.logsumexp(x, 1)
    lsm = x - lse[:, None]
    p = lsm.exp()
    plogp = torch.where(p > 0, p * lsm, torch.zeros_like(p))
    ent = -plogp.sum(1)
    c = (h.abs() @ w.abs().T + (0 if b is None else b.double().abs().nan_to_num(posinf=0))) * inv_t
    cmax = torch.where(torch.isfinite(x), c, torch.zeros_like(c)).amax(1)
    sens = torch.where(p > 0, p * (lsm + ent[:, None]).abs(), torch.zeros_like(p)).sum(1)
    m = x.amax(1)
    spread = torch.where(p > 0, p * (x - m[:, None]).abs(), torch.zeros_like(p)).sum(1)
    return x, lse, ent, cmax, sens, spread


def _bounds(cmax, sens, spread, v):
    lse_tol = 2 * (H * U * cmax + v * U)
    ent_tol = 2 * (H * U * cmax * sens + v * U * (spread + 1))
    return lse_tol, ent_tol


def _check_logp(logp, x, lse, labels, lse_tol, cmax):
    """logp = target - lse: the lse bound, plus the target logit's own error (H u c, the O(N*H)
    gather-dot) and fp32 rounding of the difference; a label on a -inf bias id gives -inf."""
    ref = x.gather(1, labels[:, None]).squeeze(1) - lse
    xabs = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x)).amax(1)
    tol = lse_tol + 2 * H * U * cmax + 2 * U * (lse.abs() + xabs)
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isneginf(logp), ~finite)
    err = (logp.double() - ref).abs()[finite]
    assert (err <= tol[finite]).all(), (err / tol[finite]).max()
    return ref, tol


def _merged(K, hidden, weight, b, inv_t):
    m, s, a = K.stats_fwd(hidden, weight, b, inv_t, True)
    return m, s, a, vp.merge_splits(m, s, a)


@pytest.mark.parametrize("dtype,scale,temperature,bias", [
    (torch.float32, 0.5, 1.0, False),
    (torch.float32, 1e3, 0.7, True),   # logits ~1e4: every row one-hot, exp underflows everywhere else
    (torch.bfloat16, 0.5, 1.3, True),
    (torch.bfloat16, 1e3, 1.0, False),
])
@pytest.mark.parametrize("persistent,v_tiles", [(0, 1), (1, 1), (0, 3), (2, 2)])
def test_tiled_stats_match_float64(seed, monkeypatch, dtype, scale, temperature, bias, persistent, v_tiles):
    K = _blocks(monkeypatch, PERSISTENT=persistent, V_TILES=v_tiles)
    hidden, weight, b = _inputs(dtype, scale, bias)
    inv_t = 1.0 / temperature
    m_p, s_p, a_p, (m, s, a) = _merged(K, hidden, weight, b, inv_t)
    n_blocks = math.ceil(V / (16 * v_tiles))
    assert m_p.shape == s_p.shape == a_p.shape == (n_blocks, N)  # one partial per vocab block
    x, lse, ent, cmax, sens, spread = _reference(hidden, weight, b, inv_t)
    lse_tol, ent_tol = _bounds(cmax, sens, spread, V)
    # the partial of each vocab block is its own max: a block whose columns are all -inf gives -inf
    blk_max = torch.stack([x[:, i * 16 * v_tiles:(i + 1) * 16 * v_tiles].amax(1) for i in range(n_blocks)])
    assert torch.equal(torch.isneginf(m_p), torch.isneginf(blk_max))
    assert bool(torch.isneginf(m_p).any()) == (bias and v_tiles == 1)  # vocab tile 1: bias all -inf
    fin = torch.isfinite(blk_max)
    assert ((m_p.double() - blk_max).abs()[fin] <= (2 * H * U * cmax).expand_as(blk_max)[fin]).all()
    two_part = m.double() + s.double().log()  # the lse contract: (m, log s), never one fp32 lse
    assert ((two_part - lse).abs() <= lse_tol).all(), ((two_part - lse).abs() / lse_tol).max()
    ent_k = s.double().log() - a.double() / s.double()
    assert ((ent_k - ent).abs() <= ent_tol).all(), ((ent_k - ent).abs() / ent_tol).max()


def test_tiled_and_split_forwards_agree(seed, monkeypatch):
    """Same partial math, different vocab partition: the merged statistics agree to rounding."""
    hidden, weight, b = _inputs(torch.float32, 0.5, True)
    K = _blocks(monkeypatch)
    tiles = _merged(K, hidden, weight, b, 0.8)[3]
    monkeypatch.setitem(K.CONFIG, "FWD", "split")
    monkeypatch.setitem(K.CONFIG, "SPLITS", 3)
    m_p, _, _, split = _merged(K, hidden, weight, b, 0.8)
    assert m_p.shape[0] == 3  # the split forward really ran
    _, _, _, cmax, sens, spread = _reference(hidden, weight, b, 0.8)
    lse_tol, ent_tol = _bounds(cmax, sens, spread, V)
    lse = [t[0].double() + t[1].double().log() for t in (tiles, split)]
    ent = [t[1].double().log() - t[2].double() / t[1].double() for t in (tiles, split)]
    assert ((lse[0] - lse[1]).abs() <= 2 * lse_tol).all()
    assert ((ent[0] - ent[1]).abs() <= 2 * ent_tol).all()
    monkeypatch.setitem(K.CONFIG, "FWD", "bogus")
    with pytest.raises(ValueError, match="FWD"):
        K.stats_fwd(hidden, weight, b, 1.0, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vocab_shards_merge_to_the_unsharded_result(seed, monkeypatch, dtype):
    """Tensor parallelism by hand: two vocab shards (the boundary 97 is inside a vocab tile of
    the unsharded launch), each through the tiled forward and its own target logit, merged as
    ``allreduce_stats`` does (max of m, rescaled sums, target summed over the owner and the
    zero of the other rank), equal the unsharded log-probs and entropies, also for labels at
    ids 0, 96, 97 and V - 1."""
    K = _blocks(monkeypatch, PERSISTENT=1)
    hidden, weight, b = _inputs(dtype, 0.5, True)
    inv_t = 1 / 0.9
    labels = torch.randint(0, V, (N,))
    labels[:4] = torch.tensor([0, 96, 97, V - 1])
    x, lse, ent, cmax, sens, spread = _reference(hidden, weight, b, inv_t)
    lse_tol, ent_tol = _bounds(cmax, sens, spread, V)
    parts = []
    for lo, hi in ((0, 97), (97, V)):
        m, s, a = vp.merge_splits(*K.stats_fwd(hidden, weight[lo:hi], b[lo:hi], inv_t, True))
        t = _target_logit(hidden, weight[lo:hi], b[lo:hi], labels, lo, inv_t, h_scaled=False)
        parts.append((m, s, a, t))
    m, s, a = vp.merge(*parts[0][:3], *parts[1][:3])
    target = parts[0][3] + parts[1][3]
    full = vp.merge_splits(*K.stats_fwd(hidden, weight, b, inv_t, True))
    assert ((m.double() - full[0].double()).abs() <= 2 * H * U * cmax).all()  # same logits, regrouped
    _, logp, ent_k = vp.finalize(m, s, a, target, torch.ones(N, dtype=torch.bool))
    _check_logp(logp, x, lse, labels, lse_tol, cmax)
    assert ((ent_k.double() - ent).abs() <= ent_tol + 2 * U * ent.abs()).all()


@pytest.mark.parametrize("dtype,temperature,entropy,bias", [
    (torch.float32, 1.0, True, True),
    (torch.bfloat16, 0.7, True, False),
])
@pytest.mark.parametrize("persistent,v_tiles", [(0, 1), (1, 2)])
def test_autograd_op_with_the_tiled_forward(seed, monkeypatch, dtype, temperature, entropy, bias,
                                            persistent, v_tiles):
    """Forward + backward through ``linear_logprobs`` (tiled forward, chunked backward) under the
    value and gradient checks of tests/test_linear_logprobs.py (``check``: float64 reference,
    ignored rows, fp32-autograd-relative gradient bounds), at V = 203 with 16-wide vocab tiles."""
    from test_linear_logprobs import check
    _blocks(monkeypatch, PERSISTENT=persistent, V_TILES=v_tiles)
    check(dtype, "triton", temperature, entropy, bias, v=V)


def test_extreme_logits_through_the_op(seed, monkeypatch):
    """Logits ~1e4 (weights x 1e3) with labels at the first and last vocabulary ids: finite
    log-probs (0 for the argmax label, hugely negative otherwise) equal to float64 within the
    conditioning bound; the entropies are ~0 (one-hot rows)."""
    _blocks(monkeypatch, PERSISTENT=1, V_TILES=2)
    hidden, weight, b = _inputs(torch.float32, 1e3, True)
    labels = torch.randint(0, V, (N,))
    labels[:2] = torch.tensor([0, V - 1])
    x, lse, ent, cmax, sens, spread = _reference(hidden, weight, b, 1.0)
    labels[2] = int(x[2].argmax())
    logp, ent_k = linear_logprobs(hidden, weight, labels, bias=b, return_entropy=True, backend="triton")
    lse_tol, ent_tol = _bounds(cmax, sens, spread, V)
    ref, tol = _check_logp(logp, x, lse, labels, lse_tol, cmax)
    assert abs(logp[2].item()) <= tol[2]  # the argmax label: logp ~ 0
    assert ((ent_k.double() - ent).abs() <= ent_tol).all()


def test_workspace_at_the_main_shape_is_under_1_gb():
    """N=8192, V=151,936: 12 * N * cdiv(V, V_TILES * BLOCK_V) bytes of partials per arch's config."""
    import torch as t
    from pacs_fast.kernels.linear_logprobs import launch_config
    from pacs_fast.kernels.linear_logprobs_fwd import workspace_bytes
    n, v, h = 8192, 151936, 4096
    sizes = {arch: workspace_bytes(n, v, launch_config("stats_tiles", N=n, V=v, H=h, dtype=t.bfloat16, arch=arch))
             for arch in (None, 80, 90, 100)}
    assert sizes[90] == 12 * 8192 * 594 == 58_392_576  # BLOCK_V = 256: 594 vocab blocks
    assert sizes[100] == 12 * 8192 * 1187  # BLOCK_V = 128: 116.7 MB
    assert max(sizes.values()) <= 1e9 / 8  # with the merge's ~5 temporaries of the same size, < 1 GB
