"""PACS at its first update after a rollout (psi = 0) is RLOO with summed token log-probs.

With ``ref`` = the rollout policy, every score is 0 before the first optimiser step of a step, so
sigma(psi_hat) = 1/2 and the BCE gradient per response is ``w_i (1/2 - R_i)``. Through the RLOO
score this gives, for PACS without class weights, the per-response coefficient
``-(beta / B) * G/(G-1) * (R_i - mean_group R)``: RLOO's advantage
``R_i - mean_{j != i} R_j = G/(G-1) (R_i - mean R)`` on the *sum* of the response's token log-probs
(verl's seq-mean-token-sum aggregation), scaled by beta. Hence, when each rollout batch gets one
optimiser step (learner.mini_batch_prompts = train.prompts_per_step, one epoch), PACS without class
weights and RLOO take gradients that differ only in the token aggregation (and a constant that
Adam removes); PACS's sigmoid "critic" acts only from the second update on. docs/EFFICACY.md uses
this to read its table. Exact identities, so checked to float64 rounding.
"""
import pytest
import torch

from pacs_fast.algorithms import grpo_loss, pacs_loss


def draw(seed, B=24, T=7, G=8):
    g = torch.Generator().manual_seed(seed)
    ref = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) < 0.8).double()
    mask[:, 0] = 1
    R = torch.randint(0, 2, (B,), generator=g).double()
    return ref, mask, R, G


@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_first_update_gradient_is_rloo_with_summed_tokens(seed, beta):
    ref, mask, R, G = draw(seed)
    a = ref.clone().requires_grad_()
    pacs_loss(a, ref, mask, R, group_size=G, beta=beta, score="rloo", weight_mode="none").backward()
    b = ref.clone().requires_grad_()
    loss, _ = grpo_loss(b, ref, mask, R, group_size=G, advantage="rloo", loss_agg_mode="seq-mean-token-sum")
    loss.backward()
    torch.testing.assert_close(a.grad, beta * b.grad, rtol=1e-12, atol=1e-15)


def test_second_update_differs(seed):
    """Once the policy has moved (psi != 0) the sigmoid weighs responses unequally: the gradient
    leaves RLOO's (which, per response, would keep its coefficient)."""
    ref, mask, R, G = draw(seed)
    moved = ref + 0.5 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    first = ref.clone().requires_grad_()
    pacs_loss(first, ref, mask, R, group_size=G, beta=1.0, score="rloo", weight_mode="none").backward()
    later = moved.clone().requires_grad_()
    pacs_loss(later, ref, mask, R, group_size=G, beta=1.0, score="rloo", weight_mode="none").backward()
    assert (later.grad - first.grad).abs().max() > 1e-3
