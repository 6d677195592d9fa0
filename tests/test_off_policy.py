"""Truncated / masked IS (pacs_fast.algorithms.off_policy) against hand computations on fixed log-probs,
and the decoupled-IS identity on an enumerable policy: E_mu[w * grad log pi * A] == E_pi[grad log pi * A]."""
import math

import pytest
import torch

from pacs_fast.algorithms.aggregation import LOSS_AGG_MODES, aggregate_loss
from pacs_fast.algorithms.off_policy import log_ratios, off_policy_correction, rejection_mask, truncated_is_weights

# two sequences, 3 positions; row 1 has 2 response tokens. log-ratios: row0 = [log 3, log 0.5, 0],
# row1 = [log 0.25, log 1.5, (pad)]
PROX = torch.tensor([[math.log(0.3), math.log(0.2), math.log(0.5)], [math.log(0.1), math.log(0.6), 0.0]],
                    dtype=torch.float64)
BEHAV = torch.tensor([[math.log(0.1), math.log(0.4), math.log(0.5)], [math.log(0.4), math.log(0.4), -7.0]],
                     dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_log_ratios_by_hand():
    tok, seq = log_ratios(PROX, BEHAV, MASK)
    want = torch.tensor([[math.log(3), math.log(0.5), 0.0], [math.log(0.25), math.log(1.5), 0.0]], dtype=torch.float64)
    torch.testing.assert_close(tok, want)
    torch.testing.assert_close(seq, torch.tensor([math.log(1.5), math.log(0.375)], dtype=torch.float64))


def test_truncated_token_and_sequence_by_hand():
    tok, _ = log_ratios(PROX, BEHAV, MASK)
    w = truncated_is_weights(tok, MASK, "token", 2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0], [0.25, 1.5, 0.0]], dtype=torch.float64))
    w = truncated_is_weights(tok, MASK, "sequence", 1.2)
    torch.testing.assert_close(w, torch.tensor([[1.2, 1.2, 1.2], [0.375, 0.375, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("level,kept", [
    ("token", [[False, True, True], [False, True, False]]),       # 3 > 2 and 0.25 < 0.5 rejected
    ("sequence", [[True, True, True], [False, False, False]]),   # 1.5 kept, 0.375 rejected
    ("geometric", [[True, True, True], [True, True, False]]),    # 1.5^(1/3), 0.375^(1/2)=0.61 kept
])
def test_rejection_levels_by_hand(level, kept):
    tok, _ = log_ratios(PROX, BEHAV, MASK)
    torch.testing.assert_close(rejection_mask(tok, MASK, level, 0.5, 2.0), torch.tensor(kept))


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_rejected_tokens_leave_the_denominator(mode):
    loss = torch.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]], dtype=torch.float64)
    w, kept, _ = off_policy_correction(PROX, BEHAV, MASK, is_level="token", is_cap=2.0, rs_level="token",
                                       rs_low=0.5, rs_high=2.0)
    got = aggregate_loss(loss * w, kept, mode)
    # by hand: kept tokens (0,1),(0,2),(1,1) with weights 0.5, 1, 1.5 -> weighted losses 1, 4, 24
    lw = torch.tensor([[0.0, 1.0, 4.0], [0.0, 24.0, 0.0]], dtype=torch.float64)
    hand = {"token-mean": 29 / 3, "seq-mean-token-sum": (5 + 24) / 2, "seq-mean-token-mean": (5 / 2 + 24) / 2,
            "seq-mean-token-sum-norm": (5 + 24) / 2 / 3, "token-sum": 29.0, "token-sum-norm": 29 / 3}[mode]
    assert float(got) == pytest.approx(hand, rel=1e-12)
    assert float(aggregate_loss(lw, kept, mode)) == pytest.approx(hand, rel=1e-12)


@pytest.mark.parametrize("is_level", ["token", "sequence"])
@pytest.mark.parametrize("rs_level", ["none", "token", "sequence", "geometric"])
def test_on_policy_is_identity(is_level, rs_level):
    w, kept, met = off_policy_correction(PROX, PROX.clone(), MASK, is_level=is_level, rs_level=rs_level)
    assert torch.equal(w, MASK.to(w.dtype)) and torch.equal(kept, MASK.bool())
    assert met["kl_k1"] == 0.0 and met["kl_k3"] == 0.0 and met["frac_rejected"] == 0.0
    for cap in (1.0, 0.5):  # on-policy weights are 1: a cap <= 1 truncates nothing, and "none" never does
        _, _, low = off_policy_correction(PROX, PROX.clone(), MASK, is_level=is_level, is_cap=cap, rs_level=rs_level)
        assert low["frac_truncated"] == (0.0 if is_level == "none" or cap == 1.0 else 1.0), (cap, low)


def test_metrics_by_hand():
    _, _, met = off_policy_correction(PROX, BEHAV, MASK, is_level="token", is_cap=2.0, rs_level="token")
    lr = [math.log(3), math.log(0.5), 0.0, math.log(0.25), math.log(1.5)]
    assert met["is_weight_mean"] == pytest.approx((2 + 0.5 + 1 + 0.25 + 1.5) / 5)
    assert met["is_weight_max"] == 2.0 and met["frac_truncated"] == pytest.approx(0.2)
    assert met["frac_rejected"] == pytest.approx(0.4)
    assert met["kl_k1"] == pytest.approx(-sum(lr) / 5)
    assert met["kl_k3"] == pytest.approx(sum(math.exp(x) - 1 - x for x in lr) / 5)


def test_bad_arguments_name_the_key():
    tok, _ = log_ratios(PROX, BEHAV, MASK)
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(tok, MASK, "token", 0.0)
    with pytest.raises(ValueError, match="low must be < high"):
        rejection_mask(tok, MASK, "token", 2.0, 0.5)
    with pytest.raises(ValueError, match="level"):
        rejection_mask(tok, MASK, "bogus")


def test_enumerable_policy_sequence_is_recovers_on_policy_gradient():
    """Two-token sequences over a 3-token vocabulary (9 sequences, enumerated exactly, float64).
    The sequence-level IS weight pi/mu (no cap reached) makes E_mu[w * A(y) * grad log pi(y)] equal
    E_pi[A(y) * grad log pi(y)] -- the GRPO/REINFORCE surrogate's gradient. Exact up to float64 rounding."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    mu_logits = logits.detach() + 0.3 * torch.randn(2, 3, generator=g, dtype=torch.float64)
    reward = torch.randn(3, 3, generator=g, dtype=torch.float64)
    ys = [(a, b) for a in range(3) for b in range(3)]
    lp = torch.log_softmax(logits, -1)
    mu = torch.log_softmax(mu_logits, -1)
    seq_lp = torch.stack([lp[0, a] + lp[1, b] for a, b in ys])
    tok_p = torch.stack([torch.stack([lp[0, a], lp[1, b]]) for a, b in ys])
    tok_mu = torch.stack([torch.stack([mu[0, a], mu[1, b]]) for a, b in ys])
    r = torch.stack([reward[a, b] for a, b in ys])
    on = torch.autograd.grad((seq_lp.exp().detach() * r * seq_lp).sum(), logits, retain_graph=True)[0]
    w, _, _ = off_policy_correction(tok_p.detach(), tok_mu, torch.ones(9, 2), is_level="sequence", is_cap=1e9)
    q = (tok_mu.sum(-1)).exp()  # behaviour probabilities of the 9 sequences
    off = torch.autograd.grad((q * w[:, 0] * r * seq_lp).sum(), logits)[0]
    torch.testing.assert_close(off, on, rtol=1e-12, atol=1e-14)


def test_build_batch_places_behaviour_logp_on_the_response():
    from pacs_fast.trainer.batch import build_batch
    b = build_batch([[5, 6], [7]], [[[1, 2], [3]], [[4, 4, 4], []]], [1.0, 0.0, 1.0, 0.0], pad_id=0,
                    logprobs=[[[-0.1, -0.2], [-0.3]], [[-0.4, -0.5, -0.6], []]])
    want = torch.tensor([[0, 0, -0.1, -0.2], [0, 0, -0.3, 0], [0, -0.4, -0.5, -0.6], [0, 0, 0, 0]])
    torch.testing.assert_close(b.behaviour_logp, want)
    assert torch.equal(b.behaviour_logp != 0, b.response_mask.bool())
    assert build_batch([[5]], [[[1]]], [1.0], pad_id=0).behaviour_logp is None
    with pytest.raises(ValueError, match="logprobs"):
        build_batch([[5]], [[[1, 2]]], [1.0], pad_id=0, logprobs=[[[-0.1]]])


@pytest.mark.parametrize("score,weight", [("naive", "none"), ("rloo", "question")])
def test_enumerable_policy_pacs_identity(score, weight):
    """PACS with a stale sampler mu: psi's reference is the proximal policy pi_old (= the learner before
    the update, here theta itself), and the BCE of the group is weighted by the importance ratio of what
    it depends on. With score=naive and weight=none each row's BCE depends on its own sequence only, so
    the per-sequence weight pi_old(y_i)/mu(y_i) is exact; with the group-relative score (rloo) and the
    question weight a row's term depends on the whole group, so the exact weight is the group's product
    of sequence ratios (docs/OFF_POLICY.md). Groups of G = 2 over 9 sequences: 81 groups enumerated,
    float64, so the identity holds to rounding."""
    from pacs_fast.algorithms.pacs import pacs_loss
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 3, generator=g, dtype=torch.float64, requires_grad=True)
    mu_logits = logits.detach() + 0.4 * torch.randn(2, 3, generator=g, dtype=torch.float64)
    reward = (torch.rand(3, 3, generator=g) > 0.5).to(torch.float64)
    ys = [(a, b) for a in range(3) for b in range(3)]
    lp, mu = torch.log_softmax(logits, -1), torch.log_softmax(mu_logits, -1)
    tok = torch.stack([torch.stack([lp[0, a], lp[1, b]]) for a, b in ys])        # [9, 2] differentiable
    tok_mu = torch.stack([torch.stack([mu[0, a], mu[1, b]]) for a, b in ys])
    r = torch.stack([reward[a, b] for a, b in ys])
    ones = torch.ones(2, 2, dtype=torch.float64)
    on = off = 0.0
    for i in range(9):
        for j in range(9):
            rows = [i, j]
            loss = pacs_loss(tok[rows], tok[rows].detach(), ones, r[rows], group_size=2, score=score,
                             weight_mode=weight)
            p_old = tok[rows].detach().sum(-1).exp()
            q = tok_mu[rows].sum(-1).exp()
            on = on + p_old.prod() * loss
            w, _, _ = off_policy_correction(tok[rows].detach(), tok_mu[rows], ones, is_level="sequence", is_cap=1e9)
            if score == "naive":  # per-row weights on per-row BCE terms (pacs_loss is the mean of the rows)
                per_row = torch.stack([pacs_loss(tok[[k]], tok[[k]].detach(), ones[:1], r[[k]], group_size=1,
                                                 score="naive", weight_mode="none") for k in rows])
                off = off + q.prod() * (w[:, 0] * per_row).mean()
            else:
                off = off + q.prod() * w[:, 0].prod() * loss
    g_on = torch.autograd.grad(on, logits, retain_graph=True)[0]
    g_off = torch.autograd.grad(off, logits)[0]
    assert g_on.abs().max() > 1e-3  # the identity is not 0 == 0
    torch.testing.assert_close(g_off, g_on, rtol=1e-10, atol=1e-12)
