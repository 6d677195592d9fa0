"""The warp-specialised Gluon kernels of linear_logprobs (kernels/linear_logprobs_gluon.py): the forward
(``CONFIG["FWD"] = "gluon"``) and the chunked backward's dz kernel (``CONFIG["DLOGITS"] = "gluon"``).

The Triton interpreter cannot run Gluon, so on this machine the tests check what surrounds the
kernel: which inputs it takes (a Hopper GPU, bf16 / fp16 rows a TMA descriptor can read), that every
other input gets the tiled forward bit for bit, and its accumulator layout. Its sm_90 compile (TMA
copies feeding wgmma, the loader / consumer register split, no spills) is checked in
tests/test_kernels_compile.py.

On a Hopper GPU (``-m gpu``) the kernel runs against float64 in a subprocess with a time limit: a
wrong mbarrier phase deadlocks instead of failing, and the limit turns that into a failure that does
not take the rest of the GPU suite with it. Bounds there follow tests/test_linear_logprobs_fwd.py
(first-order rounding of an fp32 accumulation of H exact bf16 products, u = 2^-24), with a factor 8
instead of 2 for the tensor cores' accumulation order; a wrong tile, mask or merge is O(1) off.
"""
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import draw_seed

HERE = os.path.dirname(os.path.abspath(__file__))
U = 2.0 ** -24
GPU_CHECK_TIMEOUT_S = 60  # each; normal runs: compile + checks ~20-30 s (an estimate: not yet run)


def _spy(monkeypatch):
    from pacs_fast.kernels import linear_logprobs_gluon as G
    calls, real = [], G.stats_gluon
    monkeypatch.setattr(G, "stats_gluon", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.interpret
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_off_hopper_the_gluon_choice_runs_the_tiled_forward(seed, monkeypatch, dtype):
    """``FWD="gluon"`` where the kernel cannot run (here: no GPU; fp32 anywhere) gives the tiled
    forward's partials bit for bit, and the Gluon launcher is never called."""
    from test_linear_logprobs_fwd import _blocks, _inputs
    K = _blocks(monkeypatch)
    hidden, weight, b = _inputs(dtype, 0.5, True)
    want = K.stats_fwd(hidden, weight, b, 1 / 0.7, True)
    launched = _spy(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "gluon")
    got = K.stats_fwd(hidden, weight, b, 1 / 0.7, True)
    assert not launched
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.interpret
def test_off_hopper_the_gluon_dz_choice_runs_the_pointer_kernel(seed, monkeypatch):
    """``DLOGITS="gluon"`` off Hopper: the chunked backward's gradients equal the pointer dz kernel's
    bit for bit, and the Gluon launcher is never called."""
    from pacs_fast.kernels import linear_logprobs_bwd as KB, linear_logprobs_gluon as G
    from test_linear_logprobs_fwd import _blocks
    K = _blocks(monkeypatch)
    n, h, v = 37, 40, 203
    hidden, weight = torch.randn(n, h).bfloat16(), torch.randn(v, h).bfloat16()
    m_p, s_p, a_p = K.stats_fwd(hidden, weight, None, 1.0, True)
    from pacs_fast.ops import vocab_parallel as vp
    m, s, a = vp.merge_splits(m_p, s_p, a_p)
    args = (hidden, weight, None, 1.0, torch.randint(0, v, (n,)), 0, m, s.log(), s.log() - a / s, torch.randn(n),
            torch.randn(n))
    want = KB.grad_bwd_chunked(*args, chunk_bytes=(16, 64))
    calls = []
    monkeypatch.setattr(G, "dlogits_gluon", lambda *a, **k: calls.append(1))
    monkeypatch.setitem(K.CONFIG, "DLOGITS", "gluon")
    got = KB.grad_bwd_chunked(*args, chunk_bytes=(16, 64))
    assert not calls
    for g, w in zip(got, want):
        assert (g is None and w is None) or torch.equal(g, w)


def test_dz_usable_needs_rows_a_tma_store_writes():
    from pacs_fast.kernels import linear_logprobs_gluon as G
    buf = torch.empty(40 * 257 + 8, dtype=torch.bfloat16)
    assert G.dz_usable(buf[:40 * 256].view(40, 256))
    assert not G.dz_usable(buf[:40 * 257].view(40, 257))  # 514-byte rows
    assert not G.dz_usable(buf[1:1 + 40 * 64].view(40, 64))  # base off by 2 bytes
    assert not G.dz_usable(buf[:40 * 64].view(64, 40).t())  # vocab not the unit-stride dimension


def test_gluon_usable_needs_hopper_and_rows_a_descriptor_reads(monkeypatch):
    from pacs_fast.kernels import linear_logprobs_gluon as G
    h, w = torch.randn(8, 64).bfloat16(), torch.randn(40, 64).bfloat16()
    for arch, want in ((None, False), (80, False), (90, True), (100, False)):
        monkeypatch.setattr(G, "device_arch", lambda d, a=arch: a)
        assert G.gluon_usable(h, w) is want, arch
    monkeypatch.setattr(G, "device_arch", lambda d: 90)
    assert G.gluon_usable(h.half(), w.half())
    assert not G.gluon_usable(h.float(), w.float())  # fp32: IEEE products, the tiled forward
    assert not G.gluon_usable(h, w.half())  # mixed dtypes
    assert not G.gluon_usable(h[:, :7].contiguous(), w[:, :7].contiguous())  # 14-byte rows
    assert not G.gluon_usable(h.t().contiguous().t(), w)  # H not the unit-stride dimension
    assert not G.gluon_usable(torch.randn(8 * 64 + 1).bfloat16()[1:].view(8, 64), w)  # base off by 2 bytes


def test_accumulator_layout_keeps_each_row_inside_one_warp():
    """Warps stack along the rows (a row's max / sums reduce within a warp), the widest wgmma that
    divides the vocab block, and a clear error where a warp would get fewer than 16 rows."""
    from pacs_fast.kernels import linear_logprobs_gluon as G
    lay = G._mma_layout(128, 256, 8)
    assert list(lay.warps_per_cta) == [8, 1] and list(lay.instr_shape) == [16, 256, 16]
    assert list(G._mma_layout(64, 96, 4).instr_shape) == [16, 96, 16]
    assert list(G._mma_layout(64, 384, 4).instr_shape) == [16, 192, 16]
    with pytest.raises(ValueError, match="BLOCK_N=64"):
        G._mma_layout(64, 256, 8)
    # the ping-pong launches' 4-warp consumers (one warpgroup per tile)
    assert list(G._mma_layout(128, 128, 4).instr_shape) == [16, 128, 16]
    assert list(G._mma_layout(64, 256, 4).warps_per_cta) == [4, 1]


def test_the_pingpong_check_runs_the_pingpong_launches(monkeypatch):
    """The ping-pong GPU checks really launch PINGPONG_CONFIGS (every key of it), not the default."""
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_gluon as G
    from pacs_fast.kernels.linear_logprobs_launch import PINGPONG_CONFIGS
    monkeypatch.setitem(K.CONFIG, "PINGPONG", None)  # restored after the test
    h, w = torch.randn(8, 4096).bfloat16(), torch.randn(40, 4096).bfloat16()
    assert all(G._cfg(k, h, w)["PINGPONG"] == 0 for k in PINGPONG_CONFIGS)
    _pingpong_launches()
    for kernel, pp in PINGPONG_CONFIGS.items():
        cfg = G._cfg(kernel, h, w)
        assert {k: cfg[k] for k in pp} == pp, kernel
    # other kernels are untouched, and an explicit key still wins over the ping-pong launch
    assert "PINGPONG" not in K._cfg("stats_tiles", h, w)
    monkeypatch.setitem(K.CONFIG, "num_stages", 5)
    assert G._cfg("stats_gluon", h, w) == dict(PINGPONG_CONFIGS["stats_gluon"], num_stages=5)


@pytest.mark.interpret
def test_the_gpu_check_passes_the_tiled_forward(seed, monkeypatch):
    """The GPU check's own code (references, bounds, masks, shapes), run here on the tiled forward
    under the interpreter at small shapes with small blocks: on the GPU a failure is the kernel's."""
    from test_linear_logprobs_fwd import _blocks
    _blocks(monkeypatch, FWD=None)
    _check_partials(37, 40, 801, torch.bfloat16, 1.0, True, 0.7, dev="cpu", fwd="tiles")
    _check_partials(37, 40, 203, torch.bfloat16, 30.0, False, 1.0, dev="cpu", fwd="tiles")
    _check_op(40, 40, 300, dev="cpu", fwd="tiles")
    _check_grads(40, 40, 300, dev="cpu", fwd="tiles", dlogits="pointer", chunk=(16, 128), bias=True, temperature=0.7)


_HUNG = set()  # checks that timed out in this session


def _run_gpu_check(kernel):
    """``_gpu_check(kernel)`` on the GPU in a subprocess limited to GPU_CHECK_TIMEOUT_S (see the
    module docstring); each kernel separately, so that one that hangs does not hide the other. A
    ping-pong check is not started where the same kernel's cooperative check hung (they share the
    loader and the ring; a second hang would only spend the lease's time)."""
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        pytest.skip(f"the Gluon kernels are Hopper-only (wgmma); this GPU is sm_{major}{minor}")
    base = kernel.removesuffix("-pingpong")
    if base != kernel and base in _HUNG:
        pytest.fail(f"not run: the cooperative {base} check hung in this session")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--gpu-check", kernel], cwd=HERE, env=env,
                              capture_output=True, text=True, timeout=GPU_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        _HUNG.add(kernel)
        pytest.fail(f"the Gluon {kernel} check did not finish in {GPU_CHECK_TIMEOUT_S} s (a deadlocked "
                    f"pipeline?):\n{(e.stdout or b'')[-2000:]!r}")
    assert proc.returncode == 0 and "GLUON CHECK OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-5000:]


def test_a_hung_check_spares_the_lease_the_pingpong_one(monkeypatch):
    """A cooperative check that times out fails, and the same kernel's ping-pong check then fails
    at once without a subprocess (it would most likely hang the same way); the other kernel's runs."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(sys.modules[__name__], "_HUNG", set())
    started = []

    def run(cmd, **kw):
        started.append(cmd[-1])
        raise subprocess.TimeoutExpired(cmd, kw["timeout"])
    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(pytest.fail.Exception, match="did not finish"):
        _run_gpu_check("forward")
    with pytest.raises(pytest.fail.Exception, match="hung in this session"):
        _run_gpu_check("forward-pingpong")
    with pytest.raises(pytest.fail.Exception, match="did not finish"):
        _run_gpu_check("dz-pingpong")
    assert started == ["forward", "dz-pingpong"]


@pytest.mark.gpu
def test_gluon_forward_matches_float64_on_hopper():
    _run_gpu_check("forward")


@pytest.mark.gpu
def test_gluon_dz_kernel_matches_float64_on_hopper():
    _run_gpu_check("dz")


@pytest.mark.gpu
def test_gluon_pingpong_forward_matches_float64_on_hopper():
    """The same checks on the ping-pong launch (PINGPONG_CONFIGS: two consumer warpgroups on alternate
    tiles, whose turn barriers are what keeps their ``ready`` waits sound)."""
    _run_gpu_check("forward-pingpong")


@pytest.mark.gpu
def test_gluon_pingpong_dz_kernel_matches_float64_on_hopper():
    _run_gpu_check("dz-pingpong")


def _reference(h, w, b, inv_t, rows):
    """float64 logits of ``rows``, their log-sum-exp, entropy, and the bounds' ingredients."""
    h64, w64 = h[rows].double(), w.double()
    x = (h64 @ w64.T + (0 if b is None else b.double())) * inv_t
    lse = torch.logsumexp(x, 1)
    lsm = x - lse[:, None]
    p = lsm.exp()
    ent = -torch.where(p > 0, p * lsm, torch.zeros_like(p)).sum(1)
    c = (h64.abs() @ w64.abs().T + (0 if b is None else b.double().abs().nan_to_num(posinf=0))) * inv_t
    cmax = torch.where(torch.isfinite(x), c, torch.zeros_like(c)).amax(1)
    sens = torch.where(p > 0, p * (lsm + ent[:, None]).abs(), torch.zeros_like(p)).sum(1)
    spread = torch.where(p > 0, p * (x - x.amax(1, keepdim=True)).abs(), torch.zeros_like(p)).sum(1)
    return x, lse, ent, cmax, sens, spread


def _check_partials(n, h_dim, v, dtype, scale, bias, temperature, dev="cuda", fwd="gluon"):
    """The partials of forward ``fwd`` against float64: each vocab block's max, the merged two-part
    log-sum-exp and the entropy (``fwd="tiles"`` on CPU checks this check, see below)."""
    from pacs_fast.kernels import linear_logprobs as K
    from pacs_fast.kernels import linear_logprobs_gluon as G
    from pacs_fast.ops import vocab_parallel as vp
    hidden = torch.randn(n, h_dim, device=dev)
    hidden[1] *= 30  # a sharply peaked row
    weight = torch.randn(v, h_dim, device=dev) * scale / h_dim ** 0.5
    b = None
    if bias:
        b = torch.randn(v, device=dev) * scale
        b[256:512] = float("-inf")  # one whole 256-wide vocab block masked in every row
        b[700] = float("-inf")
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    b = None if b is None else b.to(dtype)
    inv_t = 1.0 / temperature
    assert fwd != "gluon" or G.gluon_usable(hidden, weight)
    saved = K.CONFIG["FWD"]
    K.CONFIG["FWD"] = fwd
    m_p, s_p, a_p = K.stats_fwd(hidden, weight, b, inv_t, True)
    m_q, s_q, a_q = K.stats_fwd(hidden, weight, b, inv_t, False)
    K.CONFIG["FWD"] = saved
    bv = (G._cfg("stats_gluon", hidden, weight) if fwd == "gluon" else K._cfg("stats_tiles", hidden, weight))["BLOCK_V"]
    assert m_p.shape == (math.ceil(v / bv), n) and a_q is None
    assert torch.equal(m_p, m_q) and torch.equal(s_p, s_q)  # entropy off: the same m and s
    m, s, a = vp.merge_splits(m_p, s_p, a_p)
    for r0 in range(0, n, 256):
        rows = torch.arange(r0, min(n, r0 + 256), device=dev)
        x, lse, ent, cmax, sens, spread = _reference(hidden, weight, b, inv_t, rows)
        blk = torch.stack([x[:, i * bv:(i + 1) * bv].amax(1) for i in range(m_p.shape[0])])
        got = m_p[:, rows].double()
        assert torch.equal(torch.isneginf(got), torch.isneginf(blk))
        fin = torch.isfinite(blk)
        assert ((got - blk).abs()[fin] <= (8 * h_dim * U * cmax).expand_as(blk)[fin]).all()
        lse_tol = 8 * (h_dim * U * cmax + v * U)
        ent_tol = 8 * (h_dim * U * cmax * sens + v * U * (spread + 1))
        two_part = m[rows].double() + s[rows].double().log()
        assert ((two_part - lse).abs() <= lse_tol).all(), ((two_part - lse).abs() / lse_tol).max()
        ent_k = s[rows].double().log() - a[rows].double() / s[rows].double()
        assert ((ent_k - ent).abs() <= ent_tol).all(), ((ent_k - ent).abs() / ent_tol).max()
    print(f"partials ok: N={n} H={h_dim} V={v} {dtype} scale={scale} bias={bias} T={temperature}", flush=True)


def _check_op(n=8192, h=4096, v=151936, dev="cuda", fwd="gluon"):
    """The op's forward (log-probs and entropy, bf16, 10 % ignored rows; the real shape by default)
    on 256 random rows against float64, with the bound of test_linear_logprobs.py's real-shape test."""
    from pacs_fast.kernels import linear_logprobs as K
    from pacs_fast.ops.linear_logprobs import linear_logprobs
    hidden = torch.randn(n, h, device=dev).bfloat16()
    weight = (torch.randn(v, h, device=dev) * (2 / h ** 0.5)).bfloat16()
    labels = torch.randint(0, v, (n,), device=dev)
    labels[torch.rand(n, device=dev) < 0.1] = -100
    saved = K.CONFIG["FWD"]
    K.CONFIG["FWD"] = fwd
    with torch.no_grad():
        logp, ent = linear_logprobs(hidden, weight, labels, return_entropy=True, backend="triton")
    K.CONFIG["FWD"] = saved
    rows = torch.randperm(n, device=dev)[:256]
    x = hidden[rows].double() @ weight.double().T
    lsm = torch.log_softmax(x, -1)
    ok = labels[rows] != -100
    lp_ref = lsm.gather(1, labels[rows].clamp(min=0)[:, None]).squeeze(1)
    ent_ref = -(lsm.exp() * lsm).sum(-1)
    tol = 1e-3 + 1e-5 * x.abs().amax(-1)
    assert ((logp[rows].double() - lp_ref).abs()[ok] <= tol[ok]).all()
    assert ((ent[rows].double() - ent_ref).abs()[ok] <= tol[ok]).all()
    assert (logp[labels == -100] == 0).all() and (ent[labels == -100] == 0).all()
    print(f"op ok: N={n} H={h} V={v}", flush=True)


def _check_grads(n=8192, h_dim=4096, v=151936, dev="cuda", fwd="gluon", dlogits="gluon", chunk=None, bias=False,
                 temperature=1.0):
    """Forward + backward through the op (bf16, entropy, 10 % ignored rows) with the forward ``fwd``
    and the chunked backward's dz kernel ``dlogits`` against float64: dh on every row, dW on 256
    random vocabulary rows plus every label's row, within 2e-2 of the largest entry (dz is rounded
    to bf16 before the two GEMMs, as in every bf16 LM-head backward: test_linear_logprobs.py's
    real-shape bound). ``chunk``: the backward's (rows, vocab) chunk, None for its default budget."""
    from pacs_fast.kernels import linear_logprobs as K
    from pacs_fast.ops.linear_logprobs import linear_logprobs
    hidden = torch.randn(n, h_dim, device=dev).bfloat16()
    weight = (torch.randn(v, h_dim, device=dev) * (2 / h_dim ** 0.5)).bfloat16()
    b = (torch.randn(v, device=dev) * 0.5).bfloat16() if bias else None
    labels = torch.randint(0, v, (n,), device=dev)
    labels[torch.rand(n, device=dev) < 0.1] = -100
    g_l, g_h = torch.randn(n, device=dev), torch.randn(n, device=dev)
    hh, ww = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    saved = {k: K.CONFIG[k] for k in ("FWD", "DLOGITS")}
    K.CONFIG.update(FWD=fwd, DLOGITS=dlogits)
    try:
        logp, ent = linear_logprobs(hh, ww, labels, bias=b, temperature=temperature, return_entropy=True,
                                    backend="triton", chunk_bytes=chunk)
        ((logp * g_l).sum() + (ent * g_h).sum()).backward()
    finally:
        K.CONFIG.update(saved)
    valid = labels != -100
    cols = torch.unique(torch.cat([torch.randint(0, v, (256,), device=dev), labels[valid]]))
    w64 = weight.double()
    dw_ref = torch.zeros(cols.numel(), h_dim, dtype=torch.float64, device=dev)
    dh_ref = torch.zeros(n, h_dim, dtype=torch.float64, device=dev)
    for r0 in range(0, n, 512):
        r = slice(r0, min(n, r0 + 512))
        h64 = hidden[r].double()
        x = (h64 @ w64.T + (0 if b is None else b.double())) / temperature
        lsm = torch.log_softmax(x, -1)
        p = lsm.exp()
        ent_ref = -(p * lsm).sum(-1)
        ok = valid[r]
        safe = torch.where(ok, labels[r], 0)
        gl64 = torch.where(ok, g_l[r].double(), 0.0)
        gh64 = torch.where(ok, g_h[r].double(), 0.0)
        dz = -p * (gl64[:, None] + gh64[:, None] * (lsm + ent_ref[:, None]))
        dz[torch.arange(dz.shape[0], device=dev), safe] += gl64
        dz /= temperature
        dh_ref[r] = dz @ w64
        dw_ref += dz[:, cols].T @ h64
        del x, lsm, p, dz
    err_h = (hh.grad.double() - dh_ref).abs().max().item()
    err_w = (ww.grad[cols].double() - dw_ref).abs().max().item()
    assert err_h <= 2e-2 * dh_ref.abs().max().item(), (err_h, dh_ref.abs().max().item())
    assert err_w <= 2e-2 * dw_ref.abs().max().item(), (err_w, dw_ref.abs().max().item())
    assert (hh.grad[~valid] == 0).all()
    print(f"grads ok: N={n} H={h_dim} V={v} chunk={chunk} bias={bias} T={temperature}", flush=True)


def _pingpong_launches():
    """The Gluon launchers take the ping-pong launch (``PINGPONG_CONFIGS``) from here on (this process only)."""
    from pacs_fast.kernels import linear_logprobs as K
    K.CONFIG["PINGPONG"] = 1


def _gpu_check(kernel):
    seed = draw_seed()
    print(f"seed={seed}", flush=True)
    torch.manual_seed(seed)
    if kernel.endswith("-pingpong"):
        _pingpong_launches()
        kernel = kernel[:-len("-pingpong")]
    if kernel == "forward":
        for dtype in (torch.bfloat16, torch.float16):
            _check_partials(1000, 896, 32001, dtype, 1.0, True, 0.7)  # odd N and V: ragged row and vocab tiles
            _check_partials(300, 200, 5000, dtype, 30.0, False, 1.0)  # H = 3 x 64 + 8: the descriptor's zero fill
        _check_partials(8192, 4096, 151936, torch.bfloat16, 1.0, False, 1.0)  # the real shape, every tile
        _check_op()
    else:  # the dz kernel behind the tiled forward
        # dz chunks [1000, 1024] by the Gluon kernel, the last [1000, 257] (514-byte rows) by the pointer one
        _check_grads(1000, 896, 32001, fwd="tiles", chunk=(1000, 1024), bias=True, temperature=0.7)
        _check_grads(300, 200, 5000, fwd="tiles", chunk=(128, 2048))  # row chunks; H = 3 x 64 + 8
        _check_grads(fwd="tiles")  # the real shape, the default chunking
    print("GLUON CHECK OK", flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--gpu-check"]:
    sys.path.insert(0, os.path.dirname(HERE))
    _gpu_check(sys.argv[2])
