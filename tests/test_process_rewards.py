"""PURE min-form credit assignment vs the summation form, against hand-computed values."""
import pytest
import torch

from pacs_fast.algorithms.process_rewards import (
    min_form_returns,
    process_advantages,
    softmin_transform,
    sum_form_returns,
    token_advantages,
)

# two responses to one prompt: 3 steps and 2 steps (right-padded)
R = torch.tensor([[0.9, 0.2, 0.7], [0.5, 0.8, 0.0]], dtype=torch.float64)
M = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_min_form_by_hand():
    # row 0: min(0.9,0.2,0.7)=0.2, min(0.2,0.7)=0.2, 0.7;  row 1: min(0.5,0.8)=0.5, 0.8, pad 0
    expected = torch.tensor([[0.2, 0.2, 0.7], [0.5, 0.8, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(min_form_returns(R, M), expected, rtol=0, atol=0)


def test_sum_form_by_hand():
    # gamma = 0.5; row 0: 0.9 + 0.5*0.2 + 0.25*0.7 = 1.175, 0.2 + 0.35 = 0.55, 0.7;  row 1: 0.5 + 0.4 = 0.9, 0.8
    expected = torch.tensor([[1.175, 0.55, 0.7], [0.9, 0.8, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(sum_form_returns(R, M, gamma=0.5), expected, rtol=0, atol=1e-15)
    expected1 = torch.tensor([[1.8, 0.9, 0.7], [1.3, 0.8, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(sum_form_returns(R, M), expected1, rtol=0, atol=1e-15)


def test_advantages_by_hand():
    # min form: first-step returns 0.2 and 0.5; G=2 leave-one-out baselines are the other's: 0.5, 0.2
    adv = process_advantages(R, M, 2, form="min")
    expected = torch.tensor([[0.2 - 0.5, 0.2 - 0.5, 0.7 - 0.5], [0.5 - 0.2, 0.8 - 0.2, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-15)
    adv_sum = process_advantages(R, M, 2, form="sum")
    expected_sum = torch.tensor([[1.8 - 1.3, 0.9 - 1.3, 0.7 - 1.3], [1.3 - 1.8, 0.8 - 1.8, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv_sum, expected_sum, rtol=0, atol=1e-15)
    # the hacking pattern PURE targets: one over-rated step lifts the sum-form value of a bad response
    assert adv_sum[0, 0] > 0 > adv[0, 0]


def test_softmin_transform_tends_to_min(seed):
    g = torch.Generator().manual_seed(seed)
    # distinct values at least 0.08 apart: the softmin's error is <= K e^(-gap/T) = 6 e^-80 at T = 1e-3
    r = torch.stack([torch.randperm(6, generator=g) for _ in range(4)]).double() * 0.1
    r = r + 0.02 * torch.rand(4, 6, generator=g, dtype=torch.float64)
    m = torch.ones(4, 6, dtype=torch.long)
    m[1, 4:] = 0
    exact = torch.where(m.bool(), r, torch.tensor(float("inf"), dtype=torch.float64)).min(1).values
    t = softmin_transform(r, m, temperature=1e-3)
    torch.testing.assert_close(t.sum(1), exact, rtol=0, atol=1e-6)  # T -> 0: softmin weights -> one-hot on the min
    assert (t[1, 4:] == 0).all()
    # hand value at T = 1 for [0.9, 0.2]: weights e^-0.9, e^-0.2 normalised
    w = torch.softmax(torch.tensor([-0.9, -0.2], dtype=torch.float64), 0)
    got = softmin_transform(torch.tensor([[0.9, 0.2]], dtype=torch.float64), torch.ones(1, 2), temperature=1.0)
    torch.testing.assert_close(got[0], torch.tensor([0.9, 0.2], dtype=torch.float64) * w, rtol=0, atol=1e-15)


def test_token_advantages_by_hand():
    # row 0: response occupies columns 2..7; steps end at 4, 6, 8 -> columns 2,3 | 4,5 | 6,7
    resp = torch.zeros(2, 8)
    resp[0, 2:8] = 1
    resp[1, 2:6] = 1
    ends = torch.tensor([[4, 6, 8], [3, 6, 0]])
    adv = torch.tensor([[-0.3, -0.3, 0.2], [0.3, 0.6, 0.0]], dtype=torch.float64)
    out = token_advantages(adv, ends, M, resp)
    expected = torch.tensor([[0, 0, -0.3, -0.3, -0.3, -0.3, 0.2, 0.2],
                             [0, 0, 0.3, 0.6, 0.6, 0.6, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_bad_input():
    with pytest.raises(ValueError, match="right-padded"):
        min_form_returns(R, torch.tensor([[1, 0, 1], [1, 1, 0]]))
    with pytest.raises(ValueError, match="form"):
        process_advantages(R, M, 2, form="max")
    with pytest.raises(ValueError, match="group_size"):
        process_advantages(R, M, 3)
    with pytest.raises(ValueError, match="temperature"):
        softmin_transform(R, M, temperature=0)


def test_outcome_added_to_every_step_by_hand():
    # outcome R = [1, 0], weight 0.5: returns + 0.5 R on real steps; baselines the other row's G_0
    adv = process_advantages(R, M, 2, form="min", outcome=torch.tensor([1.0, 0.0]), outcome_weight=0.5)
    expected = torch.tensor([[0.7 - 0.5, 0.7 - 0.5, 1.2 - 0.5], [0.5 - 0.7, 0.8 - 0.7, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"outcome must be \[2\]"):
        process_advantages(R, M, 2, outcome=torch.ones(3))
