"""The chunked Triton backward's GEMMs into fp32 (kernels/linear_logprobs_bwd.py ``_gemm_f32_``): the
first vocab chunk *writes* each row of ``dhidden`` and the first row chunk each row of ``dweight``
(no zero fill), later chunks accumulate; on a GPU whose torch has it, cuBLAS writes / accumulates
fp32 straight from bf16 (``fp32_out_gemm``), with no fp32 temporary of the product.

Checked here: the CPU fallback's values against float64; that the probe says no (and does not
raise) where the overloads are missing; and that no element of the uninitialised buffers is ever
read before it is written, by filling every ``torch.empty`` of the kernel files with NaN and
getting bit-identical, finite gradients in every chunking. The float64 checks of the whole
backward are tests/test_linear_logprobs.py's.
"""
import pytest
import torch

from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_bwd as KB
from pacs_fast.ops.linear_logprobs import linear_logprobs
from test_linear_logprobs import make_inputs

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("error::pacs_fast.kernels.dispatch.KernelFallbackWarning")]  # no fallback

U = 2.0 ** -24


def test_probe_says_no_without_the_overloads():
    """The CPU has no ``mm`` / ``addmm`` ``out_dtype`` overloads: the probe returns False."""
    assert KB.fp32_out_gemm(torch.device("cpu")) is False


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("transposed", [False, True])
def test_write_then_accumulate_matches_float64(dtype, transposed):
    """out = a1 @ b1, then out += a2 @ b2 (a transposed view as in ``dz.T @ hidden``): fp32 sums
    of k products (exact for bf16, rounded once for fp32): |err| <= (2k + 2) U sum |a b|."""
    g = torch.Generator().manual_seed(0)
    k = 70
    a1, a2 = (torch.randn(k, 33, generator=g).to(dtype) for _ in range(2))
    b1, b2 = (torch.randn(k, 17, generator=g).to(dtype) for _ in range(2))
    if not transposed:
        a1, a2 = a1.t().contiguous(), a2.t().contiguous()
    else:
        a1, a2 = a1.t(), a2.t()
    out = torch.full((33, 17), float("nan"))
    KB._gemm_f32_(out, a1, b1, accumulate=False)
    KB._gemm_f32_(out, a2, b2, accumulate=True)
    ref = a1.double() @ b1.double() + a2.double() @ b2.double()
    mag = a1.double().abs() @ b1.double().abs() + a2.double().abs() @ b2.double().abs()
    assert ((out.double() - ref).abs() <= (2 * k + 2) * U * mag).all()


class _NaNEmpty:
    """``torch`` as kernels/linear_logprobs.py sees it, but every ``empty`` comes back NaN-filled."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*shape, **kw):
        t = torch.empty(*shape, **kw)
        return t.fill_(float("nan")) if t.is_floating_point() else t


@pytest.mark.interpret
@pytest.mark.parametrize("chunk_bytes", [None, (37, 128), (8, 128)])  # one chunk / vocab / rows and vocab
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_no_uninitialised_element_is_read(monkeypatch, dtype, chunk_bytes):
    for k, v in dict(BLOCK_N=16, BLOCK_V=64, BLOCK_H=16, GROUP_N=2, num_warps=1, num_stages=1).items():
        monkeypatch.setitem(K.CONFIG, k, v)
    torch.manual_seed(1)
    hidden, weight, b, labels = make_inputs(dtype, v=301)

    def grads():
        h, w, bb = (t.clone().requires_grad_() for t in (hidden, weight, b))
        logp, ent = linear_logprobs(h, w, labels, bias=bb, return_entropy=True, backend="triton",
                                    chunk_bytes=chunk_bytes, temperature=0.8)
        (logp.sum() + 0.3 * ent.sum()).backward()
        return [t.grad for t in (h, w, bb)]

    clean = grads()
    monkeypatch.setattr(K, "torch", _NaNEmpty())
    monkeypatch.setattr(KB, "torch", _NaNEmpty())
    poisoned = grads()
    for c, p in zip(clean, poisoned):
        assert torch.isfinite(c).all()
        assert torch.equal(c, p)
