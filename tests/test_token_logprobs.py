"""token_logprobs: forward and backward against a float64 reference, both backends.

The Triton kernels run under TRITON_INTERPRET=1 on CPU tensors (tests/conftest.py); block sizes
are shrunk so that every kernel loops over several vocab blocks and splits on small shapes.
"""
import math

import numpy as np
import pytest
import torch

from pacs_fast.ops.token_logprobs import token_logprobs

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.usefixtures("dynamo_on")]  # (torch.compile tests: tests/conftest.py)

V = 1003  # odd vocabulary: no block divides it
N = 37    # no block divides it either


@pytest.fixture
def small_blocks(monkeypatch):
    from pacs_fast.kernels import token_logprobs as K
    monkeypatch.setitem(K.CONFIG, "BLOCK_V", 256)
    monkeypatch.setitem(K.CONFIG, "BLOCK_V_BWD", 256)
    monkeypatch.setitem(K.CONFIG, "SPLITS", 3)
    monkeypatch.setitem(K.CONFIG, "num_warps", 1)


def reference(logits, labels, temperature=1.0, ignore_index=-100):
    """float64 logp and entropy (autograd-differentiable), 0 on ignored rows."""
    x = logits.double() / temperature
    lsm = torch.log_softmax(x, -1)
    valid = labels != ignore_index
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    logp = lsm.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    p = lsm.exp()
    ent = -(p * torch.where(p > 0, lsm, torch.zeros_like(lsm))).sum(-1)
    zero = torch.zeros((), dtype=torch.float64)
    return torch.where(valid, logp, zero), torch.where(valid, ent, zero)


def make_inputs(dtype, n=N, v=V, extreme=True, frac_ignored=0.2):
    logits = torch.randn(n, v) * 4
    if extreme:  # a few rows with |logits| up to 1e4 (and a peaked distribution)
        logits[1] *= 2500.0
        logits[2] = torch.randn(v) * 1e4
        logits[3, 7] = 1e4
    logits = logits.to(dtype)
    labels = torch.randint(0, v, (n,))
    ignored = torch.rand(n) < frac_ignored
    ignored[0] = True
    labels[ignored] = -100
    return logits, labels


def check(logits, labels, backend, temperature, entropy, *, chunk_bytes=None, inplace=False):
    gl = torch.randn(labels.shape)
    gh = torch.randn(labels.shape)
    x = logits.clone().requires_grad_()
    kw = dict(temperature=temperature, return_entropy=entropy, backend=backend)
    if backend == "torch":
        kw["chunk_bytes"] = chunk_bytes
    out = token_logprobs(x if not inplace else x * 1, labels, inplace_backward=inplace, **kw)
    logp, ent = out if entropy else (out, None)
    assert logp.dtype == torch.float32 and logp.shape == labels.shape
    loss = (logp * gl).sum() + ((ent * gh).sum() if entropy else 0)
    loss.backward()
    xr = logits.double().requires_grad_()
    rl, re = reference(xr, labels, temperature)
    (rl * gl.double() + (re * gh.double() if entropy else 0)).sum().backward()

    # fp32 accumulation: errors scale with the row's largest |x| (lse of a 1e4-row is ~1e4)
    scale = 1 + (logits.double().abs().amax(-1) / temperature)
    tol = 2e-6 * scale
    assert ((logp.double() - rl.detach()).abs() <= tol).all()
    if entropy:
        assert ((ent.double() - re.detach()).abs() <= tol * 4).all()
    g, gr = x.grad.double(), xr.grad
    assert x.grad.dtype == logits.dtype
    eps = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[logits.dtype]
    # per-row bound: output rounding (eps * |g|) plus fp32 error of p on large-|x| rows
    gtol = eps * gr.abs().amax(-1, keepdim=True) + 1e-6 * scale.unsqueeze(-1) * (gl.abs() + gh.abs()).unsqueeze(-1)
    assert ((g - gr).abs() <= gtol * 4).all(), (g - gr).abs().max()
    ignored = labels == -100
    assert (logp[ignored] == 0).all() and (x.grad[ignored] == 0).all()
    return (logp.double() - rl).abs().max().item(), (g - gr).abs().max().item()


CASES = [  # dtype, temperature, entropy
    (torch.float32, 1.0, True),
    (torch.float32, 0.7, False),
    (torch.bfloat16, 1.3, True),
    (torch.float16, 1.0, True),
]


@pytest.mark.parametrize("dtype,temperature,entropy", CASES)
@pytest.mark.parametrize("chunk_bytes", [None, 4 * 2 * 16 * 300])  # whole rows / vocab-chunked
def test_torch_backend_matches_float64(seed, dtype, temperature, entropy, chunk_bytes):
    logits, labels = make_inputs(dtype)
    check(logits, labels, "torch", temperature, entropy, chunk_bytes=chunk_bytes)


@pytest.mark.interpret
@pytest.mark.parametrize("dtype,temperature,entropy", CASES[:3])
def test_triton_kernels_match_float64(seed, small_blocks, dtype, temperature, entropy):
    logits, labels = make_inputs(dtype)
    check(logits, labels, "triton", temperature, entropy)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.interpret)])
def test_inplace_backward_writes_gradient_into_logits(seed, small_blocks, backend):
    logits, labels = make_inputs(torch.float32, n=9, v=301, extreme=False)
    gl, gh = torch.randn(9), torch.randn(9)
    buf = logits.clone().requires_grad_()
    work = buf * 1.0  # non-leaf: its storage may be overwritten
    logp, ent = token_logprobs(work, labels, return_entropy=True, inplace_backward=True, backend=backend,
                               temperature=0.9)
    ptr = work.data_ptr()
    grads = torch.autograd.grad((logp * gl + ent * gh).sum(), work)
    x = logits.clone().requires_grad_()
    logp2, ent2 = token_logprobs(x, labels, return_entropy=True, backend=backend, temperature=0.9)
    (logp2 * gl + ent2 * gh).sum().backward()
    assert grads[0].data_ptr() == ptr
    torch.testing.assert_close(grads[0], x.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.interpret)])
def test_leading_shape_and_only_entropy_gradient(seed, small_blocks, backend):
    logits = torch.randn(2, 3, 50, requires_grad=True)
    labels = torch.randint(0, 50, (2, 3))
    logp, ent = token_logprobs(logits, labels, return_entropy=True, backend=backend)
    assert logp.shape == (2, 3) and ent.shape == (2, 3)
    ent.sum().backward()  # only the entropy feeds the loss: g_logp is None
    xr = logits.detach().double().requires_grad_()
    reference(xr.view(6, 50), labels.view(6))[1].sum().backward()
    torch.testing.assert_close(logits.grad.double(), xr.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.interpret)])
def test_huge_finite_mask_values(seed, small_blocks, backend):
    """Logits masked with -1e30 / about finfo.min instead of -inf (a row masked in full but for its
    target, a block of columns, the last columns), with a temperature: the float64 reference's values,
    finite gradients, none on the masked entries (kernels/base2.py bounds its rounding correction for
    such magnitudes; finfo.min / 0.6 is -inf in fp32; at T = 0.6 the rounding residue of
    fp32(-1e30 / T) is +4e22, whose exp2 would overflow)."""
    n, v = 6, 600
    logits = torch.randn(n, v) * 3
    logits[2, :] = -1e30
    logits[2, 7] = 1.0
    logits[:, 256:560] = -1e30  # the whole second split (256-wide: SPLITS = 3, BLOCK_V = 256 here) and more
    logits[:, 593:] = -3.4e38
    labels = torch.randint(0, 256, (n,))
    labels[2] = 7
    x = logits.clone().requires_grad_()
    lp, en = token_logprobs(x, labels, return_entropy=True, backend=backend, temperature=0.6)
    (lp.sum() + 0.5 * en.sum()).backward()
    rl, re = reference(logits, labels, 0.6)
    # logits ~3 / 0.6 put logp near -25: fp32 resolves it to ~2e-6, hence the relative part
    torch.testing.assert_close(lp.double(), rl, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(en.double(), re, rtol=2e-6, atol=2e-6)
    assert torch.isfinite(x.grad).all() and not x.grad[:, 256:560].any() and not x.grad[:, 593:].any()


def _fma_rounds_once() -> bool:
    """Whether ``tl.fma`` rounds once where these kernels run. On a GPU it is ``fma.rn.f32``; Triton 3.9's
    interpreter emulates that, Triton 3.6's computes ``x * y + z`` in float32 (two roundings). Probe:
    (1 + 2^-12)^2 - (1 + 2^-11) is 2^-24 exactly, 0 after rounding the product to float32."""
    import triton
    import triton.language as tl

    @triton.jit
    def probe(X, Y, Z, OUT):
        tl.store(OUT, tl.fma(tl.load(X), tl.load(Y), tl.load(Z)))

    x = torch.tensor([1 + 2.0 ** -12])
    out = torch.zeros(1)
    probe[(1,)](x, x, torch.tensor([-(1 + 2.0 ** -11)]), out)
    return out.item() == 2.0 ** -24


@pytest.mark.parametrize("backend,temperature", [("torch", 1.0), pytest.param("triton", 1.0, marks=pytest.mark.interpret),
                                                 pytest.param("triton", 0.7, marks=pytest.mark.interpret)])
@pytest.mark.parametrize("chunk_bytes", [None, 4 * 2 * 8 * 64])  # whole rows / vocab-chunked (torch)
def test_logits_in_the_hundreds_give_fp32_autograd_exact_gradients(seed, small_blocks, backend, chunk_bytes,
                                                                  temperature):
    """Logits ~300 with entropy: the backward gets lse as (m, log s), never one fp32 m + log s
    (rounded to ulp(300) = 3e-5, which gave ~1.5e-5 relative gradient error); measured here <= 2.2e-7
    of the largest entry over 20 draws, plain fp32 autograd <= 2.5e-7. Bound 1e-6. With a temperature
    the Triton kernels fold it into the FMA that subtracts the max (kernels/base2.py) instead of
    rounding ``logits * inv_t`` to ulp(430) first: that rounding gave 5.9e-6 at T = 0.7, as it does in
    the torch path (which divides the logits first, as the frameworks do; not held to this bound), and
    as it does under the interpreters of Triton 3.6 and 3.7.1 (PyPI torch 2.13's), whose fma rounds the product
    first. There the bound is that rounding's: each scaled logit ~430 moves by up to ulp(430) / 2, so log p by up
    to ulp(430) = 3.05e-5, relative to the largest gradient entry; measured 2.7e-6 (3.6), 1.72e-5 (3.7.1, seed
    2292664865, over the old fixed 1e-5), 1.3e-5 at most over 400 seeds emulating it in torch (scale, then the
    kernel)."""
    n, v = 8, 200
    logits = 300 + torch.randn(n, v) * 2
    labels = torch.randint(0, v, (n,))
    gl, gh = torch.randn(n), torch.randn(n)
    x = logits.clone().requires_grad_()
    kw = dict(chunk_bytes=chunk_bytes) if backend == "torch" else {}
    lp, en = token_logprobs(x, labels, return_entropy=True, backend=backend, temperature=temperature, **kw)
    ((lp * gl).sum() + (en * gh).sum()).backward()
    xd = logits.double().requires_grad_()
    rl, re = reference(xd / temperature, labels)
    ((rl * gl.double()).sum() + (re * gh.double()).sum()).backward()
    err = (x.grad.double() - xd.grad).abs().max().item()
    scaled_max = (logits / temperature).abs().max().item()
    ulp = 2.0 ** (math.floor(math.log2(scaled_max)) - 23)  # float32 spacing at the largest scaled logit
    bound = 1e-6 if temperature == 1.0 or _fma_rounds_once() else ulp
    assert err <= bound * xd.grad.abs().max().item(), err


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.interpret)])
def test_empty_vocabulary_is_a_clear_error_and_no_rows_is_fine(backend):
    with pytest.raises(ValueError, match=r"empty vocabulary dimension \(V = "):
        token_logprobs(torch.randn(4, 0), torch.zeros(4, dtype=torch.long), backend=backend)
    x = torch.randn(0, 50, requires_grad=True)
    lp, en = token_logprobs(x, torch.zeros(0, dtype=torch.long), return_entropy=True, backend=backend)
    assert lp.shape == (0,) and en.shape == (0,)
    (lp.sum() + en.sum()).backward()
    assert x.grad.shape == (0, 50)


def test_gradcheck_float64_torch_backend(seed):
    x = torch.randn(6, 23, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 23, (6,))
    y[2] = -100
    for tile in [None, (4, 5)]:
        def f(x):
            return token_logprobs(x, y, temperature=0.8, return_entropy=True, backend="torch", chunk_bytes=tile)
        assert torch.autograd.gradcheck(f, (x,))


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=pytest.mark.interpret)])
def test_non_finite_logits(seed, small_blocks, backend):
    """Documented: -inf entries are fine (p = 0), NaN / +inf / all -inf rows give NaN, ignored
    rows give 0 and zero gradient whatever they hold."""
    v = 300
    x = torch.randn(6, v)
    x[0, ::3] = float("-inf")   # masked vocabulary: finite results
    x[1, 5] = float("nan")
    x[2, 9] = float("inf")
    x[3] = float("-inf")
    x[4, 10] = float("nan")     # ignored row
    y = torch.randint(0, v, (6,))
    y[0] = 1                    # x[0, 1] is finite
    y[4] = -100
    x[5, y[5]] = float("-inf")  # target has probability 0
    xg = x.clone().requires_grad_()
    logp, ent = token_logprobs(xg, y, return_entropy=True, backend=backend)
    (logp.nan_to_num(0, 0, 0).sum() + ent.nan_to_num(0, 0, 0).sum()).backward()
    ref_l, ref_e = reference(x[0:1], y[0:1])
    assert torch.isfinite(logp[0]) and torch.isfinite(ent[0])
    assert abs(logp[0].item() - ref_l.item()) < 1e-5 and abs(ent[0].item() - ref_e.item()) < 1e-5
    assert torch.isfinite(xg.grad[0]).all() and (xg.grad[0, ::3] == 0).all()
    for r in (1, 2, 3):
        assert math.isnan(logp[r].item()) and math.isnan(ent[r].item())
    assert logp[4].item() == 0 and ent[4].item() == 0 and (xg.grad[4] == 0).all()
    assert logp[5].item() == float("-inf") and torch.isfinite(ent[5])


def test_bad_arguments():
    x = torch.randn(4, 10)
    with pytest.raises(ValueError, match="labels"):
        token_logprobs(x, torch.randint(0, 10, (5,)))
    # a label out of range is not checked on the host (no device sync): NaN for its row
    # (tests/test_kernel_fallback_ops.py: PACS_FAST_DEBUG_CHECKS=1 raises)
    assert token_logprobs(x, torch.tensor([0, 1, 2, 10]))[3].isnan()
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(x, torch.zeros(4, dtype=torch.long), temperature=0)
    with pytest.raises(ValueError, match="backend"):
        token_logprobs(x, torch.zeros(4, dtype=torch.long), backend="cuda")
    # ignore_index=None raised int()'s bare TypeError; a float was truncated; every message names the op
    for bad in (None, 1.5, True):
        with pytest.raises(ValueError, match=r"^token_logprobs: ignore_index must be an integer label id"):
            token_logprobs(x, torch.zeros(4, dtype=torch.long), ignore_index=bad)
    with pytest.raises(ValueError, match=r"^token_logprobs: labels must be an integer tensor"):
        token_logprobs(x, torch.zeros(4))
    with pytest.raises(ValueError, match=r"^token_logprobs: temperature must be a finite positive number"):
        token_logprobs(x, torch.zeros(4, dtype=torch.long), temperature="1")
    labels = torch.tensor([1, -7, 2, -7])
    assert torch.equal(token_logprobs(x, labels, ignore_index=np.int64(-7)), token_logprobs(x, labels, ignore_index=-7))


@pytest.mark.gpu
def test_real_shape_bf16_on_gpu_matches_float64(seed):
    """Compiled kernels at the real shape (N=8192, V=151,936 bf16 logits, entropy, 10% ignored
    rows; N*V = 1.2e9 elements) against float64 on 256 random rows. Tolerances: logp / entropy
    1e-4 + 1e-6 |x| (fp32 accumulation); gradient 1e-2 of the largest entry (written in bf16)."""
    n, v = 8192, 151936
    dev = "cuda"
    logits = (torch.randn(n, v, device=dev) * 4).bfloat16()
    labels = torch.randint(0, v, (n,), device=dev)
    labels[torch.rand(n, device=dev) < 0.1] = -100
    gl, gh = torch.randn(n, device=dev), torch.randn(n, device=dev)
    x = logits.clone().requires_grad_()
    lp, en = token_logprobs(x, labels, return_entropy=True, backend="triton")
    ((lp * gl).sum() + (en * gh).sum()).backward()
    rows = torch.randperm(n, device=dev)[:256]
    xd = logits[rows].double().requires_grad_()
    rl, re = reference(xd, labels[rows])
    ((rl * gl[rows].double()).sum() + (re * gh[rows].double()).sum()).backward()
    xmax = xd.detach().abs().amax(-1)
    assert ((lp[rows].double() - rl.detach()).abs() <= 1e-4 + 1e-6 * xmax).all()
    assert ((en[rows].double() - re.detach()).abs() <= 1e-4 + 1e-6 * xmax).all()
    err = (x.grad[rows].double() - xd.grad).abs().max().item()
    assert err <= 1e-2 * xd.grad.abs().max().item(), err


def test_custom_op_schemas_match_their_python_signatures():
    """The four tile custom ops (token_logprobs / linear_logprobs under torch.compile) carry schemas written out
    by hand (torch 2.5 could not infer them from the annotations: setup.py's floor); a signature changed without
    its schema would register an op whose arguments no longer line up. Equal to what this torch infers."""
    import importlib

    mods = [importlib.import_module(f"pacs_fast.ops.{m}") for m in ("token_logprobs", "linear_logprobs")]
    ops = [mods[0]._tile_stats_op, mods[0]._tile_grad_op, mods[1]._tile_stats_op, mods[1]._torch_backward_op]
    for op in ops:
        written = str(op._opoverload._schema).split("(", 1)[1]
        inferred = torch.library.infer_schema(op._init_fn, mutates_args=()).split("(", 1)[1]
        assert written == inferred, op._name
