"""The paper's gradient decomposition (eq. 3-6), checked exactly on a tiny enumerable policy.

Policy: for each prompt, a two-step autoregressive softmax over V = 2 tokens with token 0 = EOS.
Outputs: [EOS] (length 1) or [a, b] with a != EOS (length 2; the second position is masked for the
short output). Every joint sample of all groups is enumerated, so expectations are exact sums.

For a joint sample o (all B responses), with P(o) = prod_i pi(o_i):

    grad E_o[L(theta, o)] = E_o[ L(theta, o) * grad log P(o) ]   (ACTOR, REINFORCE term)
                          + E_o[ grad_theta L(theta, o) ]         (CRITIC)

and on a fixed sample the CRITIC term is sum_i (sigmoid(psi_i) - R_i) w_i / B * grad psi_i
= sum_k dL/dr_k * grad r_k, with dL/dr_k from the float64 reference written from the formulas.
All in float64, compared to 1e-10.
"""
import itertools

import pytest
import torch

from pacs_fast.algorithms import pacs_loss
from test_pacs_loss import reference_pacs

V, L = 2, 2
OUTPUTS = [(0,), (1, 0), (1, 1)]  # every possible response


def token_logps(theta0, theta1, out):
    """Per-token log-probs [L] (zero-padded) and mask [L] of one output under one prompt's parameters."""
    lp0 = torch.log_softmax(theta0, -1)
    vals = [lp0[out[0]]]
    if len(out) == 2:
        vals.append(torch.log_softmax(theta1[out[0]], -1)[out[1]])
    vals += [torch.zeros((), dtype=theta0.dtype)] * (L - len(vals))
    mask = torch.tensor([t < len(out) for t in range(L)])
    return torch.stack(vals), mask


def grad(out, params, retain_graph=False):
    gs = torch.autograd.grad(out, params, retain_graph=retain_graph, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for g, p in zip(gs, params)]


def enumerate_group_samples(n_prompts, G):
    per_prompt = list(itertools.product(range(len(OUTPUTS)), repeat=G))
    return list(itertools.product(per_prompt, repeat=n_prompts))


def batch_for(joint, theta0, theta1, ref0, ref1, rewards_table):
    rows, refs, masks, rewards = [], [], [], []
    for p, group in enumerate(joint):
        for k in group:
            lp, m = token_logps(theta0[p], theta1[p], OUTPUTS[k])
            lr, _ = token_logps(ref0[p], ref1[p], OUTPUTS[k])
            rows.append(lp)
            refs.append(lr)
            masks.append(m)
            rewards.append(rewards_table[p][k])
    return (torch.stack(rows), torch.stack(refs).detach(), torch.stack(masks),
            torch.tensor(rewards, dtype=torch.float64))


@pytest.mark.parametrize("score,proxy,n_prompts,G,weight_mode,beta", [
    ("rloo", "logratio", 2, 2, "question", 1.0),
    ("rloo", "logratio", 1, 3, "question", 0.7),
    ("grpo", "logratio", 1, 3, "none", 1.3),  # G=2 grpo scores are +-1/sqrt(2): flat
    ("dr_grpo", "mean_logp", 1, 3, "question", 0.9),
    ("naive", "logratio", 2, 2, "only_positive", 1.0),
    ("rloo", "mean_logp", 2, 2, "only_negative", 2.0),
])
def test_expected_gradient_equals_actor_plus_critic(seed, score, proxy, n_prompts, G, weight_mode, beta):
    gen = torch.Generator().manual_seed(seed)
    theta0 = torch.randn(n_prompts, V, generator=gen, dtype=torch.float64).requires_grad_(True)
    theta1 = torch.randn(n_prompts, V, V, generator=gen, dtype=torch.float64).requires_grad_(True)
    ref0 = torch.randn(n_prompts, V, generator=gen, dtype=torch.float64)
    ref1 = torch.randn(n_prompts, V, V, generator=gen, dtype=torch.float64)
    # per-prompt rewards of the three outputs, binary and soft mixed
    rewards_table = [[1.0, 0.0, 1.0], [0.0, 1.0, 0.25]][:n_prompts]
    params = (theta0, theta1)

    expected_loss = 0.0      # E[L], differentiable in theta through P and L
    actor_surrogate = 0.0    # sum_o P L * log P  (P, L constants): grad = E[ACTOR]
    critic_surrogate = 0.0   # sum_o P * sum_k c_k r_k  (P, c constants): grad = E[CRITIC]
    total_p = 0.0
    samples = enumerate_group_samples(n_prompts, G)
    per_sample_checked = 0
    for idx, joint in enumerate(samples):
        logp, logp_ref, mask, rewards = batch_for(joint, theta0, theta1, ref0, ref1, rewards_table)
        log_p = (logp * mask).sum()  # log P(o): masked positions hold 0
        prob = log_p.exp()
        loss = pacs_loss(logp, logp_ref, mask, rewards, group_size=G, beta=beta, score=score,
                         weight_mode=weight_mode, proxy=proxy)
        ref = reference_pacs(logp.tolist(), logp_ref.tolist(), mask.tolist(), rewards.tolist(), G, beta,
                             score, weight_mode, proxy)
        assert abs(loss.item() - ref["loss"]) < 1e-12
        # r_k written directly from its definition, so grad(c . r) is the CRITIC term
        n_tok = mask.sum(-1).double()
        if proxy == "logratio":
            r = beta * ((logp - logp_ref) * mask).sum(-1)
        else:
            r = beta * (logp * mask).sum(-1) / n_tok
        critic_sample = (torch.tensor(ref["dL_dr"], dtype=torch.float64) * r).sum()

        expected_loss = expected_loss + prob * loss
        actor_surrogate = actor_surrogate + prob.detach() * loss.detach() * log_p
        critic_surrogate = critic_surrogate + prob.detach() * critic_sample
        total_p += prob.item()

        # On a fixed sample, autograd's gradient of the loss IS the critic term.
        if idx % max(1, len(samples) // 12) == 0:
            g_loss = grad(loss, params, retain_graph=True)
            g_critic = grad(critic_sample, params, retain_graph=True)
            # grpo on a group of identical outputs: dpsi/dr ~ 1/eps amplifies rounding
            scale = max(1.0, max(map(abs, ref["dL_dpsi"])) * max(abs(j) for row in ref["jac"] for j in row))
            for a, b in zip(g_loss, g_critic):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * scale)
            per_sample_checked += 1

    assert abs(total_p - 1.0) < 1e-12  # the enumeration is complete
    assert per_sample_checked >= 6
    lhs = grad(expected_loss, params, retain_graph=True)
    actor = grad(actor_surrogate, params, retain_graph=True)
    critic = grad(critic_surrogate, params)
    for g_full, g_a, g_c in zip(lhs, actor, critic):
        torch.testing.assert_close(g_full, g_a + g_c, rtol=0, atol=1e-10)
    # both terms matter here (the identity is not satisfied trivially by one of them being zero): each
    # is >= 1e4 x the identity's tolerance, so dropping either would fail it. (Their size follows the
    # random parameters: grpo with G=2 has flat scores, and its actor term measured 7e-5 for one seed.)
    assert max(g.abs().max().item() for g in actor) > 1e-6
    assert max(g.abs().max().item() for g in critic) > 1e-6
