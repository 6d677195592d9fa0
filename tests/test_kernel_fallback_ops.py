"""``token_logprobs`` and the PACS loss cannot break a run either (issue 39, items 1-2), under the Triton
interpreter at small shapes:

- a forced import / compile error in either op's forward or backward kernel runs the op's torch path
  instead: one ``KernelFallbackWarning`` naming the kernel and the error, the float64-checked result
  (tests/test_token_logprobs.py's ``check``; the PACS loss against its torch backend to 1e-6, the
  same float32 sums in another order), and no retry and no warning on the next call;
- ``token_logprobs`` forward + backward make no device-to-host sync on either backend (the dispatch mode
  of tests/test_kernel_dispatch.py): a label out of range gives NaN for its row and a zero gradient
  instead of a host-side check, which ``PACS_FAST_DEBUG_CHECKS=1`` still makes (and raises);
- the PACS loss backward's torch twin equals the kernel on padded and packed rows (bit for bit: both
  write ``grad * coef * mask`` from the same float32 values).
"""
import warnings

import pytest
import torch

from pacs_fast.kernels import dispatch
from pacs_fast.ops.token_logprobs import token_logprobs
from test_kernel_dispatch import NoHostSync, _spy

pytestmark = [pytest.mark.interpret,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Small token_logprobs blocks (several vocab blocks and splits), no failure remembered, no env override."""
    from pacs_fast.kernels import token_logprobs as K
    for k, v in dict(BLOCK_V=256, BLOCK_V_BWD=256, SPLITS=3, num_warps=1).items():
        monkeypatch.setitem(K.CONFIG, k, v)
    monkeypatch.delenv(dispatch.ENV, raising=False)
    monkeypatch.delenv(dispatch.DEBUG_ENV, raising=False)
    dispatch.reset()
    yield
    dispatch.reset()


def _fallbacks(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in seen if issubclass(w.category, dispatch.KernelFallbackWarning)]


@pytest.mark.parametrize("which", ["stats_fwd", "grad_bwd"])
def test_token_logprobs_kernel_error_runs_the_torch_path(seed, monkeypatch, which):
    import triton

    from pacs_fast.kernels import token_logprobs as K
    from test_token_logprobs import check, make_inputs
    err = triton.CompilationError("k.py", None, "simulated: out of resources") if which == "stats_fwd" \
        else RuntimeError("simulated backward failure")
    calls = _spy(monkeypatch, K, which, err)
    logits, labels = make_inputs(torch.bfloat16)
    warned = _fallbacks(lambda: check(logits, labels, "triton", 1.3, True))
    kernel = "token_logprobs forward" if which == "stats_fwd" else "token_logprobs backward"
    assert len(warned) == 1 and kernel in warned[0] and "chunked PyTorch path" in warned[0], warned
    assert ("CompilationError" if which == "stats_fwd" else "simulated backward failure") in warned[0]
    assert _fallbacks(lambda: check(logits, labels, "triton", 1.3, True)) == [] and len(calls) == 1


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_token_logprobs_makes_no_host_sync(seed, backend):
    """Forward + backward inside the mode equal the same call outside it; the out-of-range label's row is
    NaN with a zero gradient, the ignored rows 0."""
    n, v = 11, 300
    logits = torch.randn(n, v) * 3
    labels = torch.randint(0, v, (n,))
    labels[::4] = -100
    labels[5] = v  # out of range
    keep = torch.arange(n) != 5
    out = []
    for mode in (NoHostSync, warnings.catch_warnings):
        x = logits.clone().requires_grad_()
        with mode():
            logp, ent = token_logprobs(x, labels, return_entropy=True, backend=backend, temperature=0.8,
                                       chunk_bytes=4 * 4 * 100 if backend == "torch" else None)
            torch.where(keep, logp + 0.5 * ent, 0.0).sum().backward()
        out.append((logp, ent, x.grad))
    for a, b in zip(*out):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    logp, ent, grad = out[0]
    assert logp[5].isnan() and ent[5].isnan() and (grad[5] == 0).all()
    assert (logp[::4] == 0).all() and (grad[::4] == 0).all() and logp[keep].isfinite().all()
    assert (grad[1] != 0).any()


def test_token_logprobs_debug_checks_catch_a_bad_label(monkeypatch):
    x, labels = torch.randn(4, 10), torch.tensor([0, 1, -100, 10])
    assert token_logprobs(x, labels)[3].isnan() and token_logprobs(x, labels)[2] == 0
    monkeypatch.setenv(dispatch.DEBUG_ENV, "1")
    for backend in ("torch", "triton"):
        with pytest.raises(ValueError, match=r"labels must be in \[0, 10\) or equal ignore_index=-100: "
                                             r"label 10 at row 3 \(PACS_FAST_DEBUG_CHECKS check\)"):
            token_logprobs(x, labels, backend=backend)


def _pacs_case(seed, packed):
    gen = torch.Generator().manual_seed(seed)
    b, t, g = 12, 9, 4
    logp, ref = -3 * torch.rand(b, t, generator=gen), -3 * torch.rand(b, t, generator=gen)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    mask &= torch.rand(b, t, generator=gen) > 0.2
    rewards = (torch.rand(b, generator=gen) < 0.5).float()
    kw = dict(group_size=g, beta=0.7)
    if packed:
        kw["cu_seqlens"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        rows = torch.arange(t)[None, :] < lengths[:, None]
        logp, ref, mask = logp[rows], ref[rows], mask[rows]
    return logp, ref, mask, rewards, kw


def _pacs_run(logp, ref, mask, rewards, kw, backend):
    from pacs_fast.algorithms import pacs_loss
    x = logp.clone().requires_grad_()
    loss, terms = pacs_loss(x, ref, mask, rewards, backend=backend, return_terms=True, **kw)
    loss.backward()
    return loss.detach(), terms["score"], x.grad


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("which", ["pacs_loss_fwd", "pacs_loss_bwd"])
def test_pacs_loss_kernel_error_runs_the_torch_path(seed, monkeypatch, packed, which):
    from pacs_fast.kernels import pacs_loss as KP
    case = _pacs_case(seed, packed)
    want = _pacs_run(*case, backend="torch")
    calls = _spy(monkeypatch, KP, which, RuntimeError(f"simulated {which} failure"))
    got = []
    warned = _fallbacks(lambda: got.append(_pacs_run(*case, backend="triton")))
    kernel = "PACS loss forward" if which == "pacs_loss_fwd" else "PACS loss backward"
    assert len(warned) == 1 and kernel in warned[0] and f"simulated {which} failure" in warned[0], warned
    for a, b in zip(got[0], want):  # float32 sums in another order (fused kernel vs torch): 1e-6
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6)
    assert (got[0][2] != 0).any()
    assert _fallbacks(lambda: _pacs_run(*case, backend="triton")) == [] and len(calls) == 1


@pytest.mark.parametrize("packed", [False, True])
def test_pacs_loss_backward_twin_equals_the_kernel(seed, packed):
    from pacs_fast.kernels import pacs_loss as KP
    from pacs_fast.ops.pacs_loss import _torch_backward
    logp, _, mask, _, kw = _pacs_case(seed, packed)
    gen = torch.Generator().manual_seed(seed + 1)
    coef = torch.randn(12, generator=gen)
    coef[3] = float("nan")  # a masked-out position never shows a coefficient, even NaN
    mask[3 if not packed else slice(0, 0)] = False
    for m in (mask, mask.float() * 0.5, None):
        args = (torch.tensor(1.7), coef, m, kw.get("cu_seqlens"), logp.shape)
        a, b = KP.pacs_loss_bwd(*args, torch.float32), _torch_backward(*args, torch.float32)
        assert torch.equal(a.nan_to_num(9.0), b.nan_to_num(9.0))
        # bf16 output: one rounding of the same float32 value (the interpreter's cast may round the
        # other way than torch's: 1 bf16 ulp, 2**-7 relative)
        a, b = KP.pacs_loss_bwd(*args, torch.bfloat16), _torch_backward(*args, torch.bfloat16)
        assert a.dtype == b.dtype == torch.bfloat16
        assert torch.allclose(a.float().nan_to_num(9.0), b.float().nan_to_num(9.0), rtol=2**-7, atol=0)
