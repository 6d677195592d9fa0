"""The public ops inside a user's own training stack: activation checkpointing around the fused PACS loss, an
in-place gradient over logits that another op saved (the Triton path), ``inplace_backward`` under ``no_grad``,
and a kernel error whose message is empty."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import pacs_fast as pf
from pacs_fast.kernels import dispatch


@pytest.fixture(autouse=True)
def _fresh_dispatch():
    dispatch.reset()
    yield
    dispatch.reset()


@pytest.mark.interpret
def test_fused_pacs_loss_under_a_non_reentrant_checkpoint():
    """The checkpoint's recomputation stops at the forward's save_for_backward with an exception of its own:
    not a kernel failure (it had been recorded as one, and its empty message raised an IndexError)."""
    gen = torch.Generator().manual_seed(3)
    lp0, ref = -torch.rand(4, 5, generator=gen), -torch.rand(4, 5, generator=gen)
    mask, rewards = torch.rand(4, 5, generator=gen) > 0.3, torch.tensor([1.0, 0.0, 1.0, 1.0])
    grads = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", dispatch.KernelFallbackWarning)
        for wrap in (lambda f, x: f(x), lambda f, x: checkpoint(f, x, use_reentrant=False)):
            lp = lp0.clone().requires_grad_()
            wrap(lambda x: pf.fused_pacs_loss(x, ref, mask, rewards, group_size=2), lp).backward()
            grads.append(lp.grad)
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
    assert not dispatch.broken("tiles", "PACS loss forward")


@pytest.mark.interpret
def test_the_triton_in_place_gradient_is_seen_by_autograd():
    """``inplace_backward`` writes the gradient over the logits; where another op saved them (tanh's output) the
    torch path's write made autograd raise, the Triton kernel's write gave that op a wrong gradient silently."""
    z = torch.randn(6, 203, requires_grad=True)
    labels = torch.randint(0, 203, (6,))
    for backend in ("torch", "triton"):
        lp = pf.token_logprobs(torch.tanh(z), labels, inplace_backward=True, backend=backend)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            lp.sum().backward()
        x = z * 1.0  # nothing else saved: a second backward (retain_graph) would read the gradient as logits
        lp = pf.token_logprobs(x, labels, inplace_backward=True, backend=backend)
        lp.sum().backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            lp.sum().backward()


def test_inplace_backward_of_a_leaf_under_no_grad_runs():
    logits = torch.randn(5, 97, requires_grad=True)
    labels = torch.randint(0, 97, (5,))
    want = torch.log_softmax(logits.detach().double(), -1).gather(1, labels[:, None]).squeeze(1)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            got = pf.token_logprobs(logits, labels, inplace_backward=True)
        torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="leaf"):  # with grad on it is still refused
        pf.token_logprobs(logits, labels, inplace_backward=True)


@pytest.mark.interpret
def test_a_kernel_error_with_an_empty_message_falls_back():
    """A bare ``assert`` in a kernel's launcher raises an AssertionError with no message: the fallback runs."""
    from pacs_fast.kernels import token_logprobs as KT
    from test_kernel_dispatch import _spy
    assert dispatch._reason(AssertionError()) == "AssertionError"
    mp = pytest.MonkeyPatch()
    try:
        _spy(mp, KT, "stats_fwd", AssertionError())
        logits, labels = torch.randn(4, 50), torch.randint(0, 50, (4,))
        with pytest.warns(dispatch.KernelFallbackWarning, match="AssertionError"):
            got = pf.token_logprobs(logits, labels, backend="triton")
    finally:
        mp.undo()
    torch.testing.assert_close(got, pf.token_logprobs(logits, labels, backend="torch"), rtol=0, atol=0)
