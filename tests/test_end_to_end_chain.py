"""End to end: hidden -> linear_logprobs (fused LM head) -> PACS loss (fused) -> backward,
against float64 autograd through the naive chain (hidden @ W.T -> log_softmax -> gather -> formula).

Gradients reach ``hidden`` and the LM-head ``weight``; the reference policy's log-probs come from
a perturbed head and get none. Tiny shapes: H=16, V=67, 4 groups of G=3 responses.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pacs_fast.algorithms.pacs import pacs_loss
from pacs_fast.ops.linear_logprobs import linear_logprobs
from pacs_fast.ops.pacs_loss import fused_pacs_loss

pytestmark = pytest.mark.interpret
# GPU: the compiled kernels; CPU: the Triton interpreter (TRITON_INTERPRET=1 from conftest)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

H, V, G, N_GROUPS, T = 16, 67, 3, 4, 10
B = G * N_GROUPS


def naive_chain_float64(hidden, weight, labels, logp_ref, mask, rewards, *, score, proxy, beta):
    """float64 autograd reference of the whole chain (vectorised, formulas of DESIGN.md 1)."""
    logits = hidden.double() @ weight.double().T
    safe = labels.clamp(min=0)
    logp = torch.log_softmax(logits, -1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    m = mask.double()
    if proxy == "logratio":
        r = beta * ((logp - logp_ref.double()) * m).sum(-1)
    else:
        n = m.sum(-1)
        r = beta * (logp * m).sum(-1) / n.clamp(min=1)
    rg = r.view(-1, G)
    if score == "rloo":
        psi = rg - (rg.sum(1, keepdim=True) - rg) / (G - 1)
    else:  # grpo
        psi = (rg - rg.mean(1, keepdim=True)) / (rg.std(1, keepdim=True) + 1e-6)
    psi = psi.reshape(-1)
    R = rewards.double().view(-1, G)
    n_pos = R.sum(1, keepdim=True)
    n_neg = G - n_pos
    mixed = (n_pos > 0) & (n_neg > 0)
    w = torch.where(mixed, R * G / (2 * n_pos.clamp(min=1e-30)) + (1 - R) * G / (2 * n_neg.clamp(min=1e-30)),
                    torch.ones_like(R)).reshape(-1)
    return (w * (F.softplus(psi) - rewards.double() * psi)).mean()


LOSS_FNS = {
    "fused_pacs_loss": fused_pacs_loss,
    "algorithms.pacs_loss[triton]": lambda *a, **k: pacs_loss(*a, backend="triton", **k),
}


@pytest.mark.parametrize("loss_name", list(LOSS_FNS))
@pytest.mark.parametrize("lp_backend", ["auto", "triton"])
@pytest.mark.parametrize("score,proxy", [("rloo", "mean_logp"), ("grpo", "logratio")])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_chain_gradients(seed, loss_name, lp_backend, score, proxy, layout):
    loss_fn = LOSS_FNS[loss_name]
    hidden = torch.randn(B, T, H)
    weight = 0.3 * torch.randn(V, H)
    weight_ref = weight + 0.05 * torch.randn(V, H)
    labels = torch.randint(0, V, (B, T))
    prompt = torch.randint(1, 4, (B,))          # first tokens are the prompt
    length = torch.randint(4, T + 1, (B,))      # response ends, then padding
    pos = torch.arange(T)[None, :]
    mask = (pos >= prompt[:, None]) & (pos < length[:, None])
    mask[5] = False                              # a row with no response tokens
    labels = torch.where(mask, labels, torch.full_like(labels, -100))
    rewards = (torch.rand(B) > 0.5).float()
    rewards[:G] = 1.0                            # a single-label group
    beta = 0.8

    h = hidden.to(DEVICE, copy=True).requires_grad_(True)
    w = weight.to(DEVICE, copy=True).requires_grad_(True)
    d_labels, d_mask, d_rewards = labels.to(DEVICE), mask.to(DEVICE), rewards.to(DEVICE)
    with torch.no_grad():
        logp_ref = linear_logprobs(h, weight_ref.to(DEVICE), d_labels, backend=lp_backend)
    # spread the proxies inside each group: GRPO's psi = d / std amplifies fp32 rounding by
    # |r| / std, which a near-degenerate random group would turn into a flaky comparison
    offset = 0.3 * (torch.arange(B) % G).float()[:, None]
    logp_ref = logp_ref - offset.to(DEVICE)
    kw = dict(group_size=G, score=score, proxy=proxy, beta=beta)
    if layout == "padded":
        logp = linear_logprobs(h, w, d_labels, backend=lp_backend)
        loss = loss_fn(logp, logp_ref, d_mask, d_rewards, **kw)
    else:  # packed: only the first `length` positions of each row, concatenated
        keep = (pos < length[:, None]).to(DEVICE)
        cu = torch.zeros(B + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(length, 0)
        logp = linear_logprobs(h[keep], w, d_labels[keep], backend=lp_backend)
        loss = loss_fn(logp, logp_ref[keep], d_mask[keep], d_rewards, cu_seqlens=cu.to(DEVICE), **kw)
    loss.backward()
    loss, h_grad, w_grad = loss.detach().cpu(), h.grad.cpu(), w.grad.cpu()

    h64 = hidden.double().requires_grad_(True)
    w64 = weight.double().requires_grad_(True)
    with torch.no_grad():
        ref64 = torch.log_softmax(hidden.double() @ weight_ref.double().T, -1).gather(
            -1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1) - offset.double()
    want = naive_chain_float64(h64, w64, labels, ref64, mask, rewards, score=score, proxy=proxy,
                               beta=beta)
    want.backward()

    torch.testing.assert_close(loss.double(), want.detach(), rtol=1e-4, atol=1e-5)
    for name, got, ref in (("hidden", h_grad, h64.grad), ("weight", w_grad, w64.grad)):
        scale = ref.abs().max().item()
        # grpo: psi = d / std multiplies fp32 rounding of r (sums of ~T log-probs) by |r| / std,
        # so its gradients are only good to ~1e-4..1e-3 of their scale in fp32
        rel = 2e-3 if score == "grpo" else 1e-4
        torch.testing.assert_close(got.double(), ref, rtol=1e-3, atol=rel * scale,
                                   msg=lambda m, name=name: f"grad {name}: {m}")
    assert torch.all(h_grad[~mask] == 0), "prompt / padding / empty rows get no gradient"
