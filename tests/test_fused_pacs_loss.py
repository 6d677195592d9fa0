"""Fused grouped PACS loss (Triton, interpreter on CPU) vs two references.

1. An independent float64 reference written as a Python loop over groups (autograd gives its
   gradient, so the kernel's hand-derived backward is checked against the chain rule), in
   tests/fused_pacs_loss_checks.py with the inputs and the comparison's fp32 allowances.
2. The library's PyTorch reference ``pacs_fast.algorithms.pacs.pacs_loss(..., backend="torch")``.
Formulas: DESIGN.md section 1.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from pacs_fast.algorithms.pacs import pacs_loss as torch_pacs_loss
from pacs_fast.ops.pacs_loss import TERM_KEYS, fused_pacs_loss
from fused_pacs_loss_checks import (PROXIES, SCORES, WEIGHT_MODES, assert_close_within, assert_matches, check,
                                    grad_slack, make_inputs, on_device, run_fused, run_loop)

pytestmark = pytest.mark.interpret


# --------------------------------------------------------------------------------------------
# parity: every score x weight mode x proxy
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("score,weight_mode,proxy",
                         list(itertools.product(SCORES, WEIGHT_MODES, PROXIES)))
def test_matches_float64_loop(seed, score, weight_mode, proxy):
    B, T, G = 12, 37, 4
    logp, logp_ref, mask, rewards = make_inputs(B, T, empty_rows=(5,))
    rewards[:G] = 1.0  # one group with all-equal rewards
    beta = 0.7
    kw = dict(group_size=G, beta=beta, score=score, weight_mode=weight_mode, proxy=proxy)
    got = check(logp, logp_ref, mask, rewards, **kw)
    assert torch.all(got[2][5] == 0), "an all-masked row must get zero gradient"
    assert torch.all(got[2][~mask] == 0), "masked tokens must get zero gradient"
    assert got[1]["proxy"][5] == 0


@pytest.mark.parametrize("score,weight_mode,proxy",
                         list(itertools.product(SCORES, WEIGHT_MODES, PROXIES)))
def test_matches_torch_reference(seed, score, weight_mode, proxy):
    B, T, G = 12, 29, 3
    logp, logp_ref, mask, rewards = make_inputs(B, T, soft=True, empty_rows=(7,))
    rewards[G:2 * G] = 1.0  # a single-label group
    kw = dict(group_size=G, beta=1.3, score=score, weight_mode=weight_mode, proxy=proxy)
    got = run_fused(logp, logp_ref, mask, rewards, **kw)
    x = logp.detach().clone().requires_grad_(True)
    loss, terms = torch_pacs_loss(x, logp_ref, mask, rewards, backend="torch", return_terms=True, **kw)
    loss.backward()
    assert_matches(got, (loss.detach(), {k: terms[k].detach() for k in TERM_KEYS}, x.grad),
                   rtol=1e-5, atol=1e-6, grad_rtol=1e-4, grad_atol=1e-8,
                   ctx=dict(rewards=rewards, mask=mask, **kw))


# --------------------------------------------------------------------------------------------
# edge cases
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("G,B,T", [(2, 10, 23), (64, 128, 5), (5, 15, 1), (7, 14, 300)])
@pytest.mark.parametrize("score", ["rloo", "grpo"])
def test_group_sizes(seed, G, B, T, score):
    logp, logp_ref, mask, rewards = make_inputs(B, T)
    for proxy in PROXIES:
        kw = dict(group_size=G, score=score, proxy=proxy)
        check(logp, logp_ref, mask, rewards, **kw)


@pytest.mark.parametrize("weight_mode", WEIGHT_MODES)
def test_soft_rewards(seed, weight_mode):
    logp, logp_ref, mask, rewards = make_inputs(16, 19, soft=True)
    kw = dict(group_size=4, weight_mode=weight_mode, score="grpo")
    check(logp, logp_ref, mask, rewards, **kw)


def test_all_equal_rewards_and_zero_spread(seed):
    """Single-label groups get weight 1; equal proxies (logp == logp_ref) give psi = 0 with a
    finite GRPO gradient (std = 0: its derivative is taken as 0, like torch.std)."""
    B, T, G = 8, 11, 4
    logp, _, mask, _ = make_inputs(B, T)
    rewards = torch.tensor([1.0] * 4 + [0.0] * 4)
    for score in SCORES:
        for weight_mode in ("question", "none"):
            kw = dict(group_size=G, score=score, weight_mode=weight_mode)
            got = check(logp, logp, mask, rewards, **kw)
            assert torch.all(got[1]["weight"] == 1.0)
            assert torch.all(got[1]["score"] == 0.0) and torch.all(got[1]["proxy"] == 0.0)
            assert torch.isfinite(got[2]).all()


def test_question_weights_are_balanced(seed):
    G = 8
    logp, logp_ref, mask, _ = make_inputs(2 * G, 7)
    rewards = torch.tensor([1.0] * 2 + [0.0] * 6 + [1.0] * 8)
    _, terms, _ = run_fused(logp, logp_ref, mask, rewards, group_size=G)
    w = terms["weight"]
    torch.testing.assert_close(w[:2], torch.full((2,), G / 4.0))
    torch.testing.assert_close(w[2:8], torch.full((6,), G / 12.0))
    torch.testing.assert_close(w[8:], torch.ones(8))
    # balanced: both classes carry half of the group's total weight
    torch.testing.assert_close(w[:2].sum(), w[2:8].sum())


def test_bf16_logp(seed):
    logp, logp_ref, mask, rewards = make_inputs(12, 33, dtype=torch.bfloat16)
    for score in SCORES:
        kw = dict(group_size=3, score=score)
        got = run_fused(logp, logp_ref, mask, rewards, **kw)
        assert got[2].dtype == torch.bfloat16
        # reference on the same (bf16-valued) inputs in float64; only the grad is rounded to bf16
        assert_matches(got, run_loop(logp, logp_ref, mask, rewards, **kw),
                       grad_rtol=1e-2, grad_atol=1e-5, ctx=dict(rewards=rewards, mask=mask, **kw))


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32, torch.int64, None, "weights"])
def test_mask_dtypes(seed, mask_dtype):
    """bool / 0-1 numeric masks select; a numeric mask with other values weights the tokens
    (and its sum is the mean_logp denominator), like the torch reference; None = all tokens."""
    logp, logp_ref, mask, rewards = make_inputs(8, 13)
    if mask_dtype is None:
        mask = None
        full = torch.ones_like(logp, dtype=torch.bool)
    elif mask_dtype == "weights":
        mask = mask * (0.1 + torch.rand(mask.shape))
        full = mask
    else:
        full = mask
        mask = mask.to(mask_dtype)
    for proxy in PROXIES:
        kw = dict(group_size=4, proxy=proxy)
        check(logp, logp_ref, mask, rewards, ref_mask=full, **kw)
        got = run_fused(logp, logp_ref, mask, rewards, **kw)
        x = logp.clone().requires_grad_(True)
        loss, terms = torch_pacs_loss(x, logp_ref, mask, rewards, backend="torch", return_terms=True, **kw)
        loss.backward()
        assert_matches(got, (loss.detach(), terms, x.grad))


def test_noncontiguous_inputs(seed):
    big, big_ref, big_mask, rewards = make_inputs(8, 40)
    logp, logp_ref, mask = big[:, ::2], big_ref[:, 1::2], big_mask[:, ::2]
    kw = dict(group_size=2, score="grpo")
    check(logp, logp_ref, mask, rewards, **kw)


# --------------------------------------------------------------------------------------------
# packed / varlen
# --------------------------------------------------------------------------------------------
def _pack(logp, logp_ref, lengths):
    idx = torch.arange(logp.shape[1])[None, :] < lengths[:, None]
    return logp[idx], logp_ref[idx], idx


@pytest.mark.parametrize("proxy", PROXIES)
@pytest.mark.parametrize("score", SCORES)
def test_packed_equals_padded(seed, proxy, score):
    B, T, G = 12, 31, 4
    logp, logp_ref, _, rewards = make_inputs(B, T)
    lengths = torch.randint(0, T + 1, (B,))
    lengths[3] = 0
    lengths[4] = T
    p_logp, p_ref, pad_mask = _pack(logp, logp_ref, lengths)
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    kw = dict(group_size=G, score=score, proxy=proxy, beta=0.5)
    padded = run_fused(logp, logp_ref, pad_mask, rewards, **kw)
    packed = run_fused(p_logp, p_ref, None, rewards, cu_seqlens=cu, **kw)
    assert packed[2].shape == p_logp.shape
    # The two layouts sum a row's tokens in different chunk orders (fp32), so the proxies differ by
    # rounding (a few ulp of max|r|). Centring turns that into an absolute error of the same size on
    # psi, and grpo divides by the group's std, which multiplies it by max|r| / std: the score terms'
    # tolerance carries that factor (a wrong row or a lost chunk is off by O(|r|), far above it).
    r = padded[1]["proxy"].view(-1, G).double()
    amp = 1.0 + float(r.abs().max()) * (1.0 / float(r.std(1).min().clamp(min=1e-3)) if score == "grpo" else 1.0)
    torch.testing.assert_close(packed[0], padded[0], rtol=1e-6, atol=1e-7 * amp)
    for k in TERM_KEYS:
        torch.testing.assert_close(packed[1][k], padded[1][k], rtol=1e-6, atol=4e-7 * amp, msg=k)
    # the gradient's cancelling terms carry that rounding (see grad_slack)
    slack = grad_slack(padded[1], rewards, pad_mask, **kw)[pad_mask]
    assert_close_within("grad", packed[2], padded[2][pad_mask], 1e-6, 1e-9, slack)
    # a mask inside the packed layout, against the float64 loop reference
    p_mask = torch.rand(p_logp.shape) > 0.3
    check(p_logp, p_ref, p_mask, rewards, cu_seqlens=cu.long(), lengths=lengths.tolist(), **kw)


def test_packed_torch_reference(seed):
    B, G = 8, 4
    lengths = torch.randint(1, 20, (B,))
    total = int(lengths.sum())
    logp = -3.0 * torch.rand(total)
    logp_ref = -3.0 * torch.rand(total)
    mask = torch.rand(total) > 0.2
    rewards = (torch.rand(B) > 0.5).float()
    cu = torch.zeros(B + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(lengths, 0)
    for proxy in PROXIES:
        kw = dict(group_size=G, score="rloo", proxy=proxy, cu_seqlens=cu)
        got = run_fused(logp, logp_ref, mask, rewards, **kw)
        x = logp.clone().requires_grad_(True)
        loss, terms = torch_pacs_loss(x, logp_ref, mask, rewards, backend="torch", return_terms=True, **kw)
        loss.backward()
        assert_matches(got, (loss.detach(), terms, x.grad), ctx=dict(rewards=rewards, mask=mask, **kw))


# --------------------------------------------------------------------------------------------
# API behaviour
# --------------------------------------------------------------------------------------------
def test_plain_return_grad_flow_and_determinism(seed):
    logp, logp_ref, mask, rewards = on_device(*make_inputs(8, 17))
    x = logp.clone().requires_grad_(True)
    ref = logp_ref.clone().requires_grad_(True)
    loss = fused_pacs_loss(x, ref, mask, rewards, group_size=4)
    assert loss.dim() == 0 and loss.dtype == torch.float32 and loss.requires_grad
    (2.5 * loss).backward()
    assert ref.grad is None, "logp_ref must get no gradient"
    g_first = x.grad.clone()
    x.grad = None
    fused_pacs_loss(x, ref, mask, rewards, group_size=4).backward()
    torch.testing.assert_close(g_first, 2.5 * x.grad)  # upstream gradient is applied
    x.grad = None
    l2 = fused_pacs_loss(x, ref, mask, rewards, group_size=4)
    l2.backward()
    assert torch.equal(l2, loss) and torch.equal(2.5 * x.grad, g_first)  # bitwise repeatable
    # no grad needed: still runs
    with torch.no_grad():
        again = fused_pacs_loss(logp, logp_ref, mask, rewards, group_size=4)
    assert not again.requires_grad
    torch.testing.assert_close(again, loss.detach())


def test_mean_logp_without_ref(seed):
    logp, logp_ref, mask, rewards = make_inputs(8, 9)
    kw = dict(group_size=4, proxy="mean_logp")
    a = run_fused(logp, logp_ref, mask, rewards, **kw)
    b = run_fused(logp, None, mask, rewards, **kw)
    torch.testing.assert_close(a[0], b[0])
    torch.testing.assert_close(a[2], b[2])


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_non_finite(seed):
    logp, logp_ref, mask, rewards = on_device(*make_inputs(8, 9, p_mask=0.0))
    mask[1, 4] = False
    logp[2, 3] = float("nan")
    with pytest.raises(ValueError, match="logp"):
        fused_pacs_loss(logp, logp_ref, mask, rewards, group_size=4, check_finite=True)
    assert torch.isnan(fused_pacs_loss(logp, logp_ref, mask, rewards, group_size=4))
    ok = logp.clone()
    ok[2, 3] = -1.0
    ok[1, 4] = float("inf")  # masked out: allowed, and never reaches the loss
    fused_pacs_loss(ok, logp_ref, mask, rewards, group_size=4, check_finite=True)
    bad_ref = logp_ref.clone()
    bad_ref[0, 0] = float("-inf")
    with pytest.raises(ValueError, match="logp_ref"):
        fused_pacs_loss(ok, bad_ref, mask, rewards, group_size=4, check_finite=True)
    for bad in (float("inf"), 1.5, -0.1):
        bad_r = rewards.clone()
        bad_r[0] = bad
        with pytest.raises(ValueError, match="rewards"):
            fused_pacs_loss(ok, logp_ref, mask, bad_r, group_size=4, check_finite=True)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
@pytest.mark.parametrize("proxy", PROXIES)
def test_masked_non_finite_never_leaks(seed, mask_dtype, proxy):
    """NaN/Inf at masked-out positions (e.g. padding) change nothing; their gradient is 0."""
    logp, logp_ref, mask, rewards = make_inputs(8, 21)
    dirty, dirty_ref = logp.clone(), logp_ref.clone()
    dirty[~mask] = float("nan")
    dirty_ref[~mask] = float("-inf")
    kw = dict(group_size=4, score="grpo", proxy=proxy)
    got = run_fused(dirty, dirty_ref, mask.to(mask_dtype), rewards, **kw)
    assert torch.isfinite(got[2]).all() and torch.all(got[2][~mask] == 0)
    assert_matches(got, run_loop(logp, logp_ref, mask, rewards, **kw),
                   ctx=dict(rewards=rewards, mask=mask, **kw))


def test_float64_logp_computes_in_float64(seed):
    logp, logp_ref, mask, rewards = make_inputs(12, 25, soft=True, dtype=torch.float64)
    for score, proxy in itertools.product(SCORES, PROXIES):
        kw = dict(group_size=4, score=score, proxy=proxy, beta=0.3)
        got = run_fused(logp, logp_ref, mask, rewards, **kw)
        assert got[0].dtype == torch.float64 and got[2].dtype == torch.float64
        assert all(v.dtype == torch.float64 for v in got[1].values())
        assert_matches(got, run_loop(logp, logp_ref, mask, rewards, **kw),
                       rtol=1e-12, atol=1e-13, grad_rtol=1e-10, grad_atol=1e-15)


def test_extreme_values(seed):
    """Huge proxies: softplus / sigmoid stay finite and exact in the saturated regime."""
    logp, _, mask, rewards = make_inputs(8, 9, p_mask=0.0)
    logp_ref = logp - 50.0 * torch.randn(8, 1)
    kw = dict(group_size=4, score="naive", weight_mode="none")
    got = check(logp, logp_ref, mask, rewards, tol=dict(rtol=1e-5, atol=1e-4), **kw)
    assert torch.isfinite(got[0]) and torch.isfinite(got[2]).all()


def _bad_calls():
    logp, ref, mask, R = make_inputs(8, 5)
    cu = torch.tensor([0, 5, 10, 15, 20, 25, 30, 35, 40])
    flat = logp.reshape(-1)
    return [
        (dict(args=(logp, ref, mask, R), group_size=3), "group_size"),
        (dict(args=(logp, ref, mask, R), group_size=1, score="rloo"), "group_size"),
        (dict(args=(logp, ref, mask, R), group_size=1, score="grpo"), "group_size"),
        (dict(args=(logp, ref, mask, R), group_size=1, score="dr_grpo"), "group_size"),
        (dict(args=(logp, ref, mask, R), group_size=0), "group_size"),
        (dict(args=(logp, ref, mask, R), group_size=2.0), "group_size"),
        (dict(args=(logp, ref[:, :4], mask, R), group_size=4), "logp_ref"),
        (dict(args=(logp, None, mask, R), group_size=4), "logp_ref"),
        (dict(args=(logp, ref, mask[:, :4], R), group_size=4), "mask"),
        (dict(args=(logp, ref, mask, R[:4]), group_size=4), "rewards"),
        (dict(args=(logp, ref, mask, R[:, None]), group_size=4), "rewards"),
        (dict(args=(logp[None], ref, mask, R), group_size=4), "logp"),
        (dict(args=(logp, ref, mask, R), group_size=4, score="ppo"), "score"),
        (dict(args=(logp, ref, mask, R), group_size=4, weight_mode="balanced"), "weight_mode"),
        (dict(args=(logp, ref, mask, R), group_size=4, proxy="sum"), "proxy"),
        (dict(args=(flat, ref.reshape(-1), None, R), group_size=4, cu_seqlens=cu[:-1]), "cu_seqlens"),
        (dict(args=(flat, ref.reshape(-1), None, R), group_size=4, cu_seqlens=cu.float()), "cu_seqlens"),
        (dict(args=(flat, ref.reshape(-1), None, R), group_size=4, cu_seqlens=cu - 1), "cu_seqlens"),
        (dict(args=(flat, ref.reshape(-1), None, R), group_size=4, cu_seqlens=cu.flip(0)), "cu_seqlens"),
        (dict(args=(logp, ref, mask, R), group_size=4, cu_seqlens=cu), "logp"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_calls())))
def test_bad_input_names_argument(i, monkeypatch):
    monkeypatch.setenv("PACS_FAST_DEBUG_CHECKS", "1")  # the cu_seqlens values are checked only then (a sync)
    call, name = _bad_calls()[i]
    args = on_device(*call.pop("args"))
    if "cu_seqlens" in call:
        call["cu_seqlens"] = on_device(call["cu_seqlens"])
    with pytest.raises(ValueError, match=name):
        fused_pacs_loss(*args, **call)


def test_memoised_option_checks_refuse_what_they_refused():
    """The option checks are memoised (host time per call): a value equal to one that passed, but of another
    type, is checked on its own (``True == 1`` and ``2.0 == 2`` hash alike), and an unhashable one gets the
    check's own error, not the memo's TypeError."""
    logp, ref, mask, R = on_device(*make_inputs(8, 5))
    fused_pacs_loss(logp, ref, mask, R, group_size=2)  # passes, and is memoised
    fused_pacs_loss(logp, ref, mask, R, group_size=1, score="naive")
    for bad in (True, 2.0, [2]):
        with pytest.raises(ValueError, match="group_size must be a positive int"):
            fused_pacs_loss(logp, ref, mask, R, group_size=bad, score="naive")
    with pytest.raises(ValueError, match="beta must be a finite real number"):
        fused_pacs_loss(logp, ref, mask, R, group_size=2, beta=[1.0])
    with pytest.raises(ValueError, match="score must be one of"):
        fused_pacs_loss(logp, ref, mask, R, group_size=2, score=["rloo"])


def test_a_numpy_beta_is_taken_as_pacs_loss_takes_it():
    """``beta=np.float32(0.5)`` was refused ("must be a finite real number") while pacs_loss took it."""
    logp, ref, mask, R = on_device(*make_inputs(8, 5))
    a = fused_pacs_loss(logp, ref, mask, R, group_size=4, beta=np.float32(0.5))
    b = fused_pacs_loss(logp, ref, mask, R, group_size=4, beta=0.5)
    assert torch.equal(a, b)


def test_wrong_cu_seqlens_without_the_debug_checks_stay_in_bounds(monkeypatch):
    """Without ``PACS_FAST_DEBUG_CHECKS`` the values of ``cu_seqlens`` are not read on the host (no
    sync): a wrong one gives a wrong loss, but every span is clamped into the buffer, forward and backward
    (without the clamp these spans read outside it: the interpreter's process dies of a segfault)."""
    monkeypatch.delenv("PACS_FAST_DEBUG_CHECKS", raising=False)
    logp, ref, _, R = make_inputs(8, 5)
    flat = on_device(logp.reshape(-1).contiguous()).requires_grad_()
    good = torch.tensor([0, 5, 10, 15, 20, 25, 30, 35, 40])
    for cu in (torch.tensor([-7, 5, 10, 15, 20, 25, 30, 35, 10 ** 6]), good.flip(0)):
        loss = fused_pacs_loss(flat, on_device(ref.reshape(-1).contiguous()), None, on_device(R), group_size=4,
                               cu_seqlens=on_device(cu))
        loss.backward()
        assert flat.grad.shape == flat.shape
        flat.grad = None


def test_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    logp, ref, mask, R = make_inputs(4, 3)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        fused_pacs_loss(logp, ref, mask, R, group_size=2)


@pytest.mark.gpu
def test_large_batch_grid_cuda(seed):
    """B beyond the 65,535 limit of CUDA grid axes 1/2 (kernels launch rows/groups on axis 0)."""
    B, T, G = 70_000, 8, 2
    logp, logp_ref, mask, rewards = make_inputs(B, T)
    kw = dict(group_size=G, score="rloo")
    got = run_fused(logp, logp_ref, mask, rewards, **kw)
    n = 64  # the float64 loop on the first groups: a loss over n rows instead of B
    want = run_loop(logp[:n], logp_ref[:n], mask[:n], rewards[:n], **kw)
    for k in TERM_KEYS:
        torch.testing.assert_close(got[1][k][:n].double(), want[1][k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[2][:n].double() * B, want[2] * n, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[0].double(), got[1]["sample_loss"].double().mean(),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("B,T,G,dtype", [(1024, 4096, 8, torch.float32), (8192, 1024, 64, torch.bfloat16),
                                         (64, 20_000, 16, torch.float32)])
def test_one_pass_and_two_pass_forwards_agree_at_real_shapes_cuda(seed, monkeypatch, B, T, G, dtype):
    """The one-launch forward (a program per group) and pass A + pass B on a GPU, at the issue's shapes and at long
    rows in few groups (where the launch config takes the two passes), against the PyTorch path in float64.
    Bounds: fp32 sums of up to 20k terms of |x| <= 3 in two orders (~1e-7 relative each; 1e-5 leaves room), the
    gradient one rounding of the coefficient to the log-prob dtype; each forward deterministic run to run."""
    from pacs_fast.kernels import pacs_loss_launch as KPL
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none on this machine")
    g = torch.Generator(device="cuda").manual_seed(seed)
    logp = (-3.0 * torch.rand(B, T, device="cuda", generator=g)).to(dtype)
    ref = (logp.float() + 0.1 * torch.randn(B, T, device="cuda", generator=g)).to(dtype)
    mask = torch.rand(B, T, device="cuda", generator=g) > 0.2
    rewards = (torch.rand(B, device="cuda", generator=g) > 0.5).float()
    x = logp.double().requires_grad_()
    want = torch_pacs_loss(x, ref.double(), mask, rewards, group_size=G, backend="torch")
    want.backward()
    got = {}
    for one in (1, 0):
        monkeypatch.setitem(KPL.CONFIG, "ONE_PASS", one)
        runs = []
        for _ in range(2):
            y = logp.clone().requires_grad_()
            loss = fused_pacs_loss(y, ref, mask, rewards, group_size=G)
            loss.backward()
            runs.append((loss.detach(), y.grad))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1]), one
        got[one] = runs[0]
        torch.testing.assert_close(runs[0][0].double(), want.detach(), rtol=1e-5, atol=1e-7)
        grad_tol = 2 ** -7 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(runs[0][1].double(), x.grad.to(dtype).double(), rtol=grad_tol, atol=1e-9)
    torch.testing.assert_close(got[1][0], got[0][0], rtol=1e-5, atol=1e-7)
