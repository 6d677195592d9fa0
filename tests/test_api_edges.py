"""The public ops as a researcher drops them into a stack of their own: ``torch.compile`` (no graph
break, no recompile per token count), ``create_graph=True``, ``meta`` tensors, numpy integers, arguments
on the wrong device, ``inplace_backward`` on a leaf, and the empty / boundary cases that used to warn or
print ``-0.``."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounter

import pacs_fast as pf

pytestmark = pytest.mark.usefixtures("dynamo_on")  # (torch.compile tests: tests/conftest.py)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_equals_eager(step, *inputs):
    """``step(*inputs)`` -> scalar: compiled with ``fullgraph=True`` (a graph break raises), its value and
    its gradient w.r.t. the first input equal eager's (the same ops in the same order: fp32 rounding of
    one reduction order, so 1e-6 relative)."""
    x = inputs[0]
    grads = []
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        xi = x.detach().clone().requires_grad_()
        val = fn(xi, *inputs[1:])
        val.backward()
        grads.append((val.detach(), xi.grad))
    (v0, g0), (v1, g1) = grads
    torch.testing.assert_close(v1, v0, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g1, g0, rtol=1e-6, atol=1e-6)


def test_token_logprobs_compiles_whole():
    """Its backward compared data pointers to skip a copy: dynamo cannot trace that (fullgraph raised)."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 11, generator=gen)
    labels = torch.randint(0, 11, (6,), generator=gen)

    def step(x, lab):
        logp, ent = pf.token_logprobs(x, lab, return_entropy=True, backend="torch")
        return logp.sum() + 0.1 * ent.sum()

    _compiled_equals_eager(step, logits, labels)


@pytest.mark.parametrize("chunk", [None, (8, 4)], ids=["one_tile", "tiles"])
@pytest.mark.parametrize("op", ["linear_logprobs", "token_logprobs"])
def test_the_log_prob_ops_do_not_recompile_per_token_count(op, chunk, seed):
    """RL batches change their token count every step. A ``range`` over the (symbolic) count pinned it: each
    new count compiled again until dynamo's recompile limit (8) left the op eager. With several row tiles (a
    micro-batch past ~260 tokens at V = 32k; forced here by an [8, 4] tile) dynamo traced the tile loop, whose
    trip count is the token count's: it now runs as an opaque custom op. Values and gradients equal eager's
    (the same tile loop in both: 1e-6 relative covers the GEMM's reduction order)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(11, 6, generator=gen, requires_grad=True)
    counter = CompileCounter()

    def loss(h, lab):
        if op == "token_logprobs":
            logp, ent = pf.token_logprobs(h @ w.t(), lab, backend="torch", chunk_bytes=chunk, return_entropy=True)
        else:
            logp, ent = pf.linear_logprobs(h, w, lab, backend="torch", chunk_bytes=chunk, return_entropy=True)
        return logp.sum() - 0.3 * ent.sum()

    step = torch.compile(loss, backend=counter, fullgraph=True)
    for n in range(40, 47):
        h = torch.randn(n, 6, generator=gen)
        lab = torch.randint(0, 11, (n,), generator=gen)
        lab[3] = -100  # an ignored row
        got = []
        for fn in (loss, step):
            hi = h.clone().requires_grad_()
            val = fn(hi, lab)
            got.append((val.detach(), *torch.autograd.grad(val, [hi, w])))
        for a, b in zip(got[0], got[1]):
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    # the first count, then one dynamic-shape graph for all the others
    assert counter.frame_count <= 2, counter.frame_count


def test_packed_pacs_loss_compiles_whole_and_runs_on_meta():
    """The packed layout checked ``cu_seqlens`` with a host read: a graph break (fullgraph raised) and
    ``.item()`` on meta tensors. The check runs eagerly on CPU (below) and is skipped while tracing."""
    cu = torch.tensor([0, 3, 8, 9, 13])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])
    gen = torch.Generator().manual_seed(1)
    logp, ref = -torch.rand(13, generator=gen), -torch.rand(13, generator=gen)

    def step(lp, rf):
        return pf.pacs_loss(lp, rf, None, rewards, group_size=2, cu_seqlens=cu)

    _compiled_equals_eager(step, logp, ref)
    meta = pf.pacs_loss(logp.to("meta").requires_grad_(), ref.to("meta"), None, rewards.to("meta"),
                        group_size=2, cu_seqlens=cu.to("meta"))
    assert meta.device.type == "meta" and meta.shape == ()
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):  # eager CPU: still checked
        pf.pacs_loss(logp, ref, None, rewards, group_size=2, cu_seqlens=torch.tensor([0, 3, 2, 9, 13]))


@pytest.mark.parametrize("name", ["pacs_loss", "policy_loss", "gspo_policy_loss", "cispo_policy_loss"])
def test_the_losses_compile_whole(name):
    gen = torch.Generator().manual_seed(5)
    old, ref = -torch.rand(4, 6, generator=gen), -torch.rand(4, 6, generator=gen)
    mask = torch.rand(4, 6, generator=gen) > 0.3
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = pf.group_advantages(rewards, 2)
    loss = getattr(pf, name)

    def step(logp, old_logp):
        if name == "pacs_loss":
            return loss(logp, ref, mask, rewards, group_size=2)
        return loss(logp, old_logp, adv, mask)[0]  # (loss, metrics)

    _compiled_equals_eager(step, old + 0.05 * torch.randn(4, 6, generator=gen), old)


@pytest.mark.parametrize("op", ["token_logprobs", "linear_logprobs", "fused_pacs_loss"])
def test_a_second_order_backward_says_why_it_cannot(op):
    """These backwards are not differentiable (they write into buffers, or run a kernel). A
    ``create_graph=True`` backward failed inside an ``out=`` op ("functions with out=... arguments don't
    support automatic differentiation"), or, for the fused loss (``once_differentiable``), returned a
    gradient cut from the graph: a Hessian of zeros, silently. Now one RuntimeError names the op; first-order
    gradients are unchanged (checked against float64)."""
    gen = torch.Generator().manual_seed(4)
    h = torch.randn(4, 3, generator=gen, requires_grad=True)
    w = torch.randn(5, 3, generator=gen)
    lab = torch.randint(0, 5, (4,), generator=gen)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    ref_logp = -torch.rand(4, 5, generator=gen)

    def f(x):
        if op == "token_logprobs":
            return pf.token_logprobs(x @ w.t(), lab).sum()
        if op == "linear_logprobs":
            return pf.linear_logprobs(x, w, lab).sum()
        return pf.pacs_loss(torch.log_softmax(x @ w.t(), -1), ref_logp, None, rewards, group_size=2,
                            backend="triton" if op == "fused_pacs_loss" else "torch")

    def f64(x):
        if op != "fused_pacs_loss":
            return torch.log_softmax(x @ w.double().t(), -1).gather(1, lab[:, None]).sum()
        return pf.pacs_loss(torch.log_softmax(x @ w.double().t(), -1), ref_logp.double(), None, rewards, group_size=2)

    (g,) = torch.autograd.grad(f(h), h)
    hd = h.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(f64(hd), hd)
    torch.testing.assert_close(g.double(), ref, rtol=1e-5, atol=1e-6)  # fp32 softmax of O(1) logits
    with pytest.raises(RuntimeError, match="differentiable once: its backward cannot run with create_graph=True"):
        torch.autograd.grad(f(h), h, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.functional.hessian(f, h.detach())
    assert torch.autograd.functional.hessian(f64, h.detach().double()).abs().max() > 1e-3  # there is one to lose


def test_inplace_backward_refuses_a_leaf():
    """It wrote the gradient over a parameter's values (and aliased ``p.grad`` to ``p``)."""
    p = torch.nn.Parameter(torch.randn(4, 5))
    before = p.detach().clone()
    lab = torch.tensor([0, 1, 2, 3])
    for logits in (p, p[:, :5]):  # the leaf, and a view of it
        with pytest.raises(ValueError, match="inplace_backward=True .* leaf"):
            pf.token_logprobs(logits, lab, inplace_backward=True)
    assert torch.equal(p.detach(), before)
    x = p * 1  # computed in the graph: allowed, its storage takes the gradient
    pf.token_logprobs(x, lab, inplace_backward=True).sum().backward()
    assert torch.equal(p.detach(), before) and p.grad is not None and p.grad.data_ptr() != p.data_ptr()


def test_numpy_integer_group_size_reaches_the_fused_kernel():
    """``pacs_loss`` took ``np.int64`` but forwarded it unconverted: the fused kernel's ``int`` check refused
    it (the interpreter runs the kernel here; on CUDA ``backend='auto'`` takes it)."""
    gen = torch.Generator().manual_seed(2)
    logp = (-torch.rand(8, 5, generator=gen)).requires_grad_()
    ref, rewards = -torch.rand(8, 5, generator=gen), (torch.rand(8, generator=gen) > 0.5).float()
    a = pf.pacs_loss(logp, ref, None, rewards, group_size=np.int64(4), backend="torch")
    b = pf.pacs_loss(logp, ref, None, rewards, group_size=np.int64(4), backend="triton")
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fn", ["policy_loss", "gspo_policy_loss", "cispo_policy_loss"])
@pytest.mark.parametrize("arg", ["old_logp", "advantages", "mask", "token_weights"])
def test_an_argument_on_another_device_is_named(fn, arg):
    """These raised torch's "Tensor on device meta is not on the expected device cpu!", naming neither the
    function nor the argument (``meta`` stands in for a GPU here)."""
    gen = torch.Generator().manual_seed(3)
    kw = dict(logp=-torch.rand(4, 3, generator=gen, requires_grad=True), old_logp=-torch.rand(4, 3, generator=gen),
              advantages=torch.randn(4, generator=gen), mask=torch.ones(4, 3, dtype=torch.bool),
              token_weights=torch.ones(4, 3))
    kw[arg] = kw[arg].to("meta")
    loss = getattr(pf, fn)
    with pytest.raises(ValueError, match=rf"^{fn}: {arg} is on meta but logp is on cpu$"):
        loss(kw.pop("logp"), kw.pop("old_logp"), kw.pop("advantages"), kw.pop("mask"), **kw)


def test_boundary_values_of_the_small_helpers():
    # a length at the buffer's start: +0.0 (it was -0.0, printed "-0."); numpy integers as for group_size
    pen = pf.overlong_penalty(torch.tensor([90, 95, 100]), np.int64(100), np.int32(10))
    assert pen.tolist() == [0.0, -0.5, -1.0] and not bool(torch.signbit(pen[0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # std() over no groups warned "degrees of freedom is <= 0"
        for mode in ("grpo", "rloo", "dr_grpo"):
            out = pf.group_advantages(torch.zeros(0), 4, mode=mode)
            assert out.shape == (0,) and out.dtype == torch.float32
    with pytest.raises(ValueError, match=r"clip_c .* must be > 1 \(None turns it off\)"):
        pf.policy_loss(-torch.rand(2, 3), -torch.rand(2, 3), torch.randn(2), None, clip_c=0)


@pytest.mark.interpret
def test_the_triton_path_under_torch_compile_runs_its_kernels_outside_the_graph(monkeypatch):
    """Dynamo traced into the Triton launchers; an error of that tracing was taken for a kernel failure: one
    fallback warning, and the Triton path off for the rest of the process. Now the graph breaks at the op and
    the kernels run as in eager mode (here under the interpreter): equal results, no warning, nothing marked
    broken, and the kernels did run."""
    from pacs_fast.kernels import dispatch
    from pacs_fast.kernels import linear_logprobs as KL
    from pacs_fast.kernels import pacs_loss as KP
    from pacs_fast.kernels import token_logprobs as KT
    from test_kernel_dispatch import _spy

    dispatch.reset()
    calls = {name: _spy(monkeypatch, mod, fn) for name, mod, fn in
             (("linear", KL, "stats_fwd"), ("token", KT, "stats_fwd"), ("pacs", KP, "pacs_loss_fwd"))}
    gen = torch.Generator().manual_seed(6)
    h, w = torch.randn(12, 16, generator=gen), torch.randn(50, 16, generator=gen)
    lab = torch.randint(0, 50, (12,), generator=gen)
    ref = -torch.rand(4, 3, generator=gen)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])

    def step(x):
        lp, ent = pf.linear_logprobs(x, w, lab, backend="triton", return_entropy=True)
        lp2 = pf.token_logprobs(x @ w.t(), lab, backend="triton")
        pl = pf.pacs_loss(lp.view(4, 3), ref, None, rewards, group_size=2, backend="triton")
        return pl + 0.1 * ent.sum() + 0.01 * lp2.sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error", dispatch.KernelFallbackWarning)
        _compiled_equals_eager_breaking(step, h)
    assert not dispatch._broken
    assert all(len(c) >= 2 for c in calls.values()), {k: len(c) for k, c in calls.items()}  # eager + compiled
    dispatch.reset()


def _compiled_equals_eager_breaking(step, x):
    out = []
    for fn in (step, torch.compile(step, backend="aot_eager")):
        xi = x.detach().clone().requires_grad_()
        val = fn(xi)
        val.backward()
        out.append((val.detach(), xi.grad))
    (v0, g0), (v1, g1) = out
    assert torch.equal(v1, v0) and torch.equal(g1, g0)  # the same kernels on the same inputs


def test_importing_the_ops_does_not_load_dynamo():
    """``torch.compiler.disable`` (the graph break of the Triton path above) imports ``torch._dynamo``,
    ~1 s of CPU: made on the first call under ``torch.compile``, not when ``pacs_fast.ops`` is imported,
    so a process that never compiles (a script using the loss, a command line that stops at a config
    error) does not pay for it."""
    import subprocess
    import sys

    probe = "import sys, pacs_fast.ops, pacs_fast.train; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False"]
