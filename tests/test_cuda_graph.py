"""The hot path in a CUDA graph (issue 39, item 2): ``linear_logprobs``, ``token_logprobs`` and the fused PACS
loss, forward + backward, captured once and replayed on new inputs copied into the captured buffers, give
what an eager call on those inputs gives. A capture fails on any device-to-host sync (``.item()``, a
value-dependent shape), so this is also the GPU check of tests/test_kernel_dispatch.py's no-sync mode.

Bounds: the forward outputs are bitwise equal (the same kernels with the same launches on the same inputs);
the gradients within 1e-5 of their largest entry (a backward may accumulate in another order). Skipped,
with the reason, without a CUDA GPU.
"""
import pytest
import torch

pytestmark = [pytest.mark.gpu]


def _replayed_equals_eager(run, inputs, fresh):
    """Captures ``run(*inputs)`` (a tuple of tensors) after a warm-up on a side stream (kernels compile,
    one-time probes run there), copies ``fresh`` into ``inputs``, replays, and compares with ``run(*fresh)``."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(*inputs)
    for dst, src in zip(inputs, fresh):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    eager = run(*fresh)
    return captured, eager


def _check(captured, eager, n_forward):
    for i, (a, b) in enumerate(zip(captured, eager)):
        if i < n_forward:
            assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)), i
        else:
            assert float((a.float() - b.float()).abs().max()) <= 1e-5 * float(b.float().abs().max()), i
    assert any(float(g.abs().max()) > 0 for g in captured[n_forward:])


def test_linear_logprobs_forward_and_backward(seed):
    from pacs_fast.ops.linear_logprobs import linear_logprobs

    n, h, v = 1000, 512, 8192
    dev = "cuda"

    def make():
        hidden = torch.randn(n, h, device=dev, dtype=torch.bfloat16)
        weight = (torch.randn(v, h, device=dev) * 0.05).bfloat16()
        labels = torch.randint(0, v, (n,), device=dev)
        labels[::7] = -100
        return hidden, weight, labels

    def run(hidden, weight, labels):
        x, w = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
        logp, ent = linear_logprobs(x, w, labels, return_entropy=True, temperature=0.9, backend="triton")
        gx, gw = torch.autograd.grad((logp + 0.1 * ent).sum(), [x, w])
        return logp, ent, gx, gw

    captured, eager = _replayed_equals_eager(run, make(), make())
    _check(captured, eager, 2)


def test_token_logprobs_forward_and_backward(seed):
    from pacs_fast.ops.token_logprobs import token_logprobs

    n, v = 512, 32000
    dev = "cuda"

    def make():
        logits = (torch.randn(n, v, device=dev) * 3).bfloat16()
        labels = torch.randint(0, v, (n,), device=dev)
        labels[::5] = -100
        return logits, labels

    def run(logits, labels):
        x = logits.detach().requires_grad_()
        logp, ent = token_logprobs(x, labels, return_entropy=True, backend="triton")
        (gx,) = torch.autograd.grad((logp + 0.1 * ent).sum(), [x])
        return logp, ent, gx

    captured, eager = _replayed_equals_eager(run, make(), make())
    _check(captured, eager, 2)


@pytest.mark.parametrize("packed", [False, True])
def test_fused_pacs_loss_forward_and_backward(seed, packed):
    from pacs_fast.ops.pacs_loss import fused_pacs_loss

    b, t, g = 256, 1024, 8
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(seed)
    lengths = torch.randint(t // 4, t + 1, (b,), device=dev, generator=gen)
    cu = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), lengths.cumsum(0)]) if packed else None
    shape = (int(lengths.sum()),) if packed else (b, t)

    def make():
        logp = -3 * torch.rand(shape, device=dev, generator=gen)
        ref = logp + 0.1 * torch.randn(shape, device=dev, generator=gen)
        mask = torch.rand(shape, device=dev, generator=gen) > 0.1
        rewards = (torch.rand(b, device=dev, generator=gen) < 0.5).float()
        return logp, ref, mask, rewards

    def run(logp, ref, mask, rewards):
        x = logp.detach().requires_grad_()
        loss = fused_pacs_loss(x, ref, mask, rewards, group_size=g, cu_seqlens=cu)
        (gx,) = torch.autograd.grad(loss, [x])
        return loss, gx

    captured, eager = _replayed_equals_eager(run, make(), make())
    _check(captured, eager, 1)
