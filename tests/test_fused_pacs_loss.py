"""Fused grouped PACS loss (Triton, interpreter on CPU) vs two references.

1. An independent float64 reference written here as a Python loop over groups (autograd gives its
   gradient, so the kernel's hand-derived backward is checked against the chain rule).
2. The library's PyTorch reference ``pacs_fast.algorithms.pacs.pacs_loss(..., backend="torch")``.
Formulas: DESIGN.md section 1.
"""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from pacs_fast.algorithms.pacs import pacs_loss as torch_pacs_loss
from pacs_fast.ops.pacs_loss import TERM_KEYS, fused_pacs_loss

pytestmark = pytest.mark.interpret
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SCORES = ("rloo", "grpo", "dr_grpo", "naive")
WEIGHT_MODES = ("question", "none", "only_positive", "only_negative")
PROXIES = ("logratio", "mean_logp")


# --------------------------------------------------------------------------------------------
# float64 loop reference
# --------------------------------------------------------------------------------------------
def loop_reference(logp, logp_ref, mask, rewards, *, group_size, beta=1.0, score="rloo",
                   weight_mode="question", proxy="logratio", lengths=None, cu_seqlens=None):
    """float64, one group at a time. ``logp`` is float64 (may require grad); returns
    (loss, terms) with the same keys as the fused op. ``lengths``: packed rows (1-D inputs)."""
    B, G = rewards.shape[0], group_size
    R_all = rewards.double()
    if lengths is not None:
        rows = torch.split(logp, lengths)
        ref_rows = torch.split(logp_ref, lengths) if logp_ref is not None else [None] * B
        m_rows = torch.split(mask, lengths) if mask is not None else [None] * B
    else:
        rows, ref_rows, m_rows = logp.unbind(0), (logp_ref.unbind(0) if logp_ref is not None
                                                  else [None] * B), mask.unbind(0)
    r_list = []
    for i in range(B):
        x = rows[i].double()
        m = torch.ones_like(x) if m_rows[i] is None else m_rows[i].double()
        if proxy == "logratio":
            r_list.append(beta * ((x - ref_rows[i].double()) * m).sum())
        else:
            n = m.sum()
            r_list.append(beta * (x * m).sum() / n if n > 0 else (x * 0).sum())
    out = {k: [] for k in TERM_KEYS}
    for g0 in range(0, B, G):
        r = torch.stack(r_list[g0:g0 + G])
        R = R_all[g0:g0 + G]
        if score == "rloo":
            psi = torch.stack([r[i] - (r.sum() - r[i]) / (G - 1) for i in range(G)])
        elif score == "grpo":
            psi = (r - r.mean()) / (r.std(unbiased=True) + 1e-6)
        elif score == "dr_grpo":
            psi = r - r.mean()
        else:
            psi = r
        # "question": sklearn "balanced" in mixed groups; soft rewards count fractionally
        n_pos = float(R.sum())
        n_neg = G - n_pos
        w = []
        for i in range(G):
            Ri = float(R[i])
            if weight_mode == "question":
                mixed = n_pos > 0 and n_neg > 0
                w.append(Ri * G / (2 * n_pos) + (1 - Ri) * G / (2 * n_neg) if mixed else 1.0)
            elif weight_mode == "none":
                w.append(1.0)
            elif weight_mode == "only_positive":
                w.append(Ri)
            else:
                w.append(1.0 - Ri)
        w = torch.tensor(w, dtype=torch.float64)
        out["proxy"].append(r)
        out["score"].append(psi)
        out["pred_reward"].append(torch.sigmoid(psi))
        out["weight"].append(w)
        out["sample_loss"].append(w * (F.softplus(psi) - R * psi))
    terms = {k: torch.cat(v) for k, v in out.items()}
    return terms["sample_loss"].sum() / B, terms


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------
def make_inputs(B, T, *, soft=False, dtype=torch.float32, p_mask=0.25, empty_rows=(), gen=None):
    logp = (-4.0 * torch.rand(B, T, generator=gen)).to(dtype)
    logp_ref = (logp.float() + 0.3 * torch.randn(B, T, generator=gen)).clamp(max=0.0).to(dtype)
    mask = torch.rand(B, T, generator=gen) > p_mask
    for i in empty_rows:
        mask[i] = False
    if soft:
        rewards = torch.rand(B, generator=gen)
        rewards[::5] = 0.5
    else:
        rewards = (torch.rand(B, generator=gen) > 0.5).float()
    return logp, logp_ref, mask, rewards


def on_device(*tensors):
    """Inputs go to the GPU when there is one (compiled kernels), else stay on the CPU (the
    Triton interpreter, TRITON_INTERPRET=1 from conftest); references always run on the CPU."""
    out = tuple(None if t is None else t.to(DEVICE) for t in tensors)
    return out if len(out) > 1 else out[0]


def run_fused(logp, logp_ref, mask, rewards, **kw):
    """Fused loss, terms and d loss / d logp, returned on the CPU."""
    if kw.get("cu_seqlens") is not None:
        kw = dict(kw, cu_seqlens=on_device(kw["cu_seqlens"]))
    x = on_device(logp.detach()).clone().requires_grad_(True)
    loss, terms = fused_pacs_loss(x, *on_device(logp_ref, mask, rewards), return_terms=True, **kw)
    loss.backward()
    return loss.detach().cpu(), {k: v.cpu() for k, v in terms.items()}, x.grad.cpu()


def run_loop(logp, logp_ref, mask, rewards, **kw):
    x = logp.detach().double().requires_grad_(True)
    loss, terms = loop_reference(x, logp_ref, mask, rewards, **kw)
    loss.backward()
    return loss.detach(), {k: v.detach() for k, v in terms.items()}, x.grad


def grpo_grad_slack(want_terms, rewards, mask, *, group_size, beta=1.0, proxy="logratio",
                    lengths=None, cu_seqlens=None, **_):
    """Per-token fp32 error allowance for the GRPO gradient.

    ``dL/dr_k = (g_k - mean g)/den - (sum_i g_i d_i)/den^2 * d_k/((G-1) std)`` cancels almost
    exactly (for G = 2 the score is +-1/sqrt(2) whatever r is), so the fp32 rounding of ``r``
    (~1e-7 |r|) shows up amplified by ``|r| / std``. Each fp32 result is within the size of the
    two cancelling terms times ``2e-6 (1 + max|r| / den)`` of the exact gradient; two fp32
    results (fused vs torch) are compared, so they may differ by twice that (one seed had the
    fused gradient at 0.91x and the torch one at -0.47x of it). A wrong formula is off by O(1)
    of the cancelling terms, ~1e5x the allowance.
    """
    G = group_size
    r = want_terms["proxy"].double().view(-1, G)
    B = r.numel()
    g = (want_terms["weight"].double() * (want_terms["pred_reward"].double() - rewards.double())
         / B).view(-1, G)
    d = r - r.mean(1, keepdim=True)
    std = r.std(1, keepdim=True)
    den = std + 1e-6
    t1 = (g - g.mean(1, keepdim=True)).abs() / den
    t2 = (g * d).sum(1, keepdim=True).abs() / den**2 * d.abs() / ((G - 1) * std.clamp(min=1e-30))
    amp = 1 + r.abs().amax(1, keepdim=True) / den
    row = (2 * 2e-6 * abs(beta) * (t1 + t2) * amp).reshape(-1)
    return _row_slack_to_tokens(row, mask, proxy, lengths, cu_seqlens)


def _row_slack_to_tokens(row, mask, proxy, lengths, cu_seqlens=None):
    """A per-row allowance on ``dL/dr_i`` as one on ``dL/dlogp`` (``dr_i/dlogp_t`` is ``beta m_t``, or
    ``beta m_t / n_i`` for the mean_logp proxy; ``beta`` is already in ``row``). Packed rows: ``lengths``
    or ``cu_seqlens``."""
    B = row.numel()
    if lengths is None and cu_seqlens is not None:
        lengths = torch.diff(torch.as_tensor(cu_seqlens).cpu())
    if lengths is None:
        m = torch.ones(B, 1, dtype=torch.float64) if mask is None else (mask != 0).double()
        if proxy == "mean_logp":
            row = row / m.sum(1).clamp(min=1)
        return row[:, None] * m
    lengths = torch.as_tensor(lengths)
    m = torch.ones(int(lengths.sum()), dtype=torch.float64) if mask is None else (mask != 0).double()
    if proxy == "mean_logp":
        n = torch.stack([c.sum() for c in torch.split(m, lengths.tolist())])
        row = row / n.clamp(min=1)
    return row.repeat_interleave(lengths) * m


def linear_grad_slack(want_terms, rewards, mask, *, group_size, beta=1.0, score="rloo", proxy="logratio",
                      lengths=None, cu_seqlens=None, **_):
    """Per-token fp32 error allowance for the gradient of the linear scores (rloo, dr_grpo, naive).

    With ``psi = A r`` (rloo: ``A_ii = 1``, ``A_ij = -1/(G-1)``; dr_grpo: ``I - 1/G``; naive: ``I``) and
    ``g_j = w_j (p_j - R_j) / B`` (``p = sigmoid(psi)``), the row gradient ``dL/dr_i = sum_j A_ji g_j``
    can cancel to far below its terms: a group whose g_j are all alike (one seed gave a row of 7e-5 from
    terms of 4e-2, fused and torch each ~1.5e-8 from float64, on opposite sides), and ``p - R`` itself.
    Each fp32 result is allowed 1e-6 (~16 ulps) of the size of what it sums: ``|A_ji| w_j (p_j + |R_j|)
    / B``, plus the rounding of ``psi_j`` (~|r| relative) carried through ``p (1 - p)``; two fp32 results
    may differ by twice that. Measured over 30 seeds x 24 cases: fused vs torch at most 0.11 of it; the
    gradient of another linear score is off by >= 1e4 of it.
    """
    G = group_size
    eye = torch.eye(G, dtype=torch.float64)
    A = {"rloo": eye * (1 + 1 / max(G - 1, 1)) - 1 / max(G - 1, 1), "dr_grpo": eye - 1 / G, "naive": eye}[score]
    r = want_terms["proxy"].double().view(-1, G)
    B = r.numel()
    p = want_terms["pred_reward"].double().view(-1, G)
    w = want_terms["weight"].double().view(-1, G).abs()
    g = w * (p + rewards.double().view(-1, G).abs()) / B  # p - R cancels too: p's rounding is ~|p| relative
    psi_size = r.abs() @ A.abs().T  # sum_k |A_jk| |r_k|, per row j
    dpsi = w * p * (1 - p) / B * psi_size
    row = (2 * 1e-6 * abs(beta) * ((g + dpsi) @ A.abs())).reshape(-1)  # sum_j |A_ji| (...)_j
    return _row_slack_to_tokens(row, mask, proxy, lengths, cu_seqlens)


def grpo_score_slack(want_terms, *, group_size, **_):
    """Per-row fp32 error allowance for the GRPO score and what depends on it: ``psi = d/std``
    turns the ~1e-7 |r| rounding of the proxies into ~1e-7 |r| / std."""
    r = want_terms["proxy"].double().view(-1, group_size)
    amp = 1 + r.abs().amax(1, keepdim=True) / (r.std(1, keepdim=True) + 1e-6)
    return (1e-6 * amp * (1 + want_terms["score"].double().view(-1, group_size).abs())).reshape(-1)


def grad_slack(want_terms, rewards, mask, *, score="rloo", **kw):
    """The fp32 allowance of two results' gradients for ``score`` (:func:`grpo_grad_slack` or
    :func:`linear_grad_slack`), per token of ``mask``'s layout."""
    if score == "grpo":
        return grpo_grad_slack(want_terms, rewards, mask, **kw)
    return linear_grad_slack(want_terms, rewards, mask, score=score, **kw)


def assert_close_within(name, a, b, rtol, atol, slack=None):
    """``|a - b| <= atol + rtol |b|``, plus ``slack`` per element where one is given."""
    a, b = a.double(), b.double()
    if slack is None:
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
        return
    excess = (a - b).abs() - (atol + rtol * b.abs() + slack)
    assert excess.max() <= 0, f"{name} off by {excess.max():.3e} beyond the fp32 allowance"


def assert_matches(got, want, *, rtol=2e-5, atol=2e-6, grad_rtol=2e-4, grad_atol=1e-7, ctx=None):
    """``ctx``: the call's inputs and options (rewards, mask, group_size, score, ...), needed to
    size the fp32 allowance of the ill-conditioned GRPO score and of every score's gradient
    (:func:`grpo_grad_slack`, :func:`linear_grad_slack`)."""
    (l1, t1, g1), (l2, t2, g2) = got, want
    assert set(t1) == set(TERM_KEYS)
    fp32 = ctx is not None and l1.dtype != torch.float64
    fp32_grpo = fp32 and ctx.get("score") == "grpo"
    row_slack = grpo_score_slack(t2, **ctx) if fp32_grpo else None
    loss_slack = None if row_slack is None else row_slack.mean()
    assert_close_within("loss", l1, l2, rtol, atol, loss_slack)
    for k in TERM_KEYS:
        assert t1[k].dtype == l1.dtype and t1[k].shape == t2[k].shape, k
        assert not t1[k].requires_grad, k
        slack = None if k in ("proxy", "weight") else row_slack
        assert_close_within(k, t1[k], t2[k], rtol, atol, slack)
    assert g1.shape == g2.shape
    assert_close_within("grad", g1, g2, grad_rtol, grad_atol, grad_slack(t2, **ctx) if fp32 else None)


def check(logp, logp_ref, mask, rewards, ref_mask=None, lengths=None, tol=None, **kw):
    """Fused vs the float64 loop reference on the same inputs; returns the fused results."""
    ref_mask = mask if ref_mask is None else ref_mask
    got = run_fused(logp, logp_ref, mask, rewards, **kw)
    want = run_loop(logp, logp_ref, ref_mask, rewards, lengths=lengths, **kw)
    assert_matches(got, want, ctx=dict(rewards=rewards, mask=ref_mask, lengths=lengths, **kw),
                   **(tol or {}))
    return got


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
def test_bad_input_names_argument(i):
    call, name = _bad_calls()[i]
    args = on_device(*call.pop("args"))
    if "cu_seqlens" in call:
        call["cu_seqlens"] = on_device(call["cu_seqlens"])
    with pytest.raises(ValueError, match=name):
        fused_pacs_loss(*args, **call)


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
