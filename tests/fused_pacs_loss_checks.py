"""What tests/test_fused_pacs_loss.py and tests/test_fused_pacs_loss_chunks.py check the fused
grouped PACS loss (Triton, interpreter on CPU) with: an independent float64 reference written as a
Python loop over groups (autograd gives its gradient, so the kernel's hand-derived backward is
checked against the chain rule), random inputs, and the comparison with its fp32 allowances (the
ill-conditioned GRPO score, every score's gradient). Formulas: DESIGN.md section 1.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pacs_fast.ops.pacs_loss import TERM_KEYS, fused_pacs_loss

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


def proxy_size(logp, logp_ref, mask, *, beta=1.0, proxy="logratio", lengths=None, **_):
    """Per row, what an fp32 proxy's rounding scales with (float64, ``[B]``): the sum of its terms'
    sizes, ``|beta| sum_t m_t |logp_t - logp_ref_t|`` (the mean of ``|logp_t|`` for ``mean_logp``).
    A long row whose log-ratios nearly cancel rounds to ~1e-8 of this, far more than of ``|r|``."""
    x = logp.detach().double()
    t = (x - logp_ref.double()).abs() if proxy == "logratio" else x.abs()
    m = torch.ones_like(t) if mask is None else (mask != 0).double()
    if lengths is not None:
        t, m = torch.split(t, list(lengths)), torch.split(m, list(lengths))
    out = torch.stack([(a * b).sum() for a, b in zip(t, m)])
    if proxy != "logratio":
        out = out / torch.stack([b.sum() for b in m]).clamp(min=1)
    return abs(beta) * out


def _size(r, proxy_size):
    """``proxy_size`` shaped like ``r`` (``[groups, G]``); without one, ``|r|``."""
    return r.abs() if proxy_size is None else torch.maximum(r.abs(), proxy_size.double().view_as(r))


def grpo_grad_slack(want_terms, rewards, mask, *, group_size, beta=1.0, proxy="logratio",
                    lengths=None, cu_seqlens=None, proxy_size=None, **_):
    """Per-token fp32 error allowance for the GRPO gradient.

    ``dL/dr_k = (g_k - mean g)/den - (sum_i g_i d_i)/den^2 * d_k/((G-1) std)`` cancels almost
    exactly (for G = 2 the score is +-1/sqrt(2) whatever r is), so the fp32 rounding of ``r``
    (~1e-7 of its size, :func:`proxy_size`) shows up amplified by ``size / std``. Each fp32
    result is within the size of the two cancelling terms times ``2e-6 (1 + max size / den)``
    of the exact gradient; two fp32
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
    amp = 1 + _size(r, proxy_size).amax(1, keepdim=True) / den
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
                      lengths=None, cu_seqlens=None, proxy_size=None, **_):
    """Per-token fp32 error allowance for the gradient of the linear scores (rloo, dr_grpo, naive).

    With ``psi = A r`` (rloo: ``A_ii = 1``, ``A_ij = -1/(G-1)``; dr_grpo: ``I - 1/G``; naive: ``I``) and
    ``g_j = w_j (p_j - R_j) / B`` (``p = sigmoid(psi)``), the row gradient ``dL/dr_i = sum_j A_ji g_j``
    can cancel to far below its terms: a group whose g_j are all alike (one seed gave a row of 7e-5 from
    terms of 4e-2, fused and torch each ~1.5e-8 from float64, on opposite sides), and ``p - R`` itself.
    Each fp32 result is allowed 1e-6 (~16 ulps) of the size of what it sums: ``|A_ji| w_j (p_j + |R_j|)
    / B``, plus the rounding of ``psi_j`` (~1e-7 of the proxies' sizes, :func:`proxy_size`) carried
    through ``p (1 - p)``; two fp32 results may differ by twice that. Measured over 30 seeds x 24
    cases: fused vs torch at most 0.11 of it; the gradient of another linear score is off by >= 1e4 of it.
    """
    G = group_size
    eye = torch.eye(G, dtype=torch.float64)
    A = {"rloo": eye * (1 + 1 / max(G - 1, 1)) - 1 / max(G - 1, 1), "dr_grpo": eye - 1 / G, "naive": eye}[score]
    r = want_terms["proxy"].double().view(-1, G)
    B = r.numel()
    p = want_terms["pred_reward"].double().view(-1, G)
    w = want_terms["weight"].double().view(-1, G).abs()
    g = w * (p + rewards.double().view(-1, G).abs()) / B  # p - R cancels too: p's rounding is ~|p| relative
    psi_size = _size(r, proxy_size) @ A.abs().T  # sum_k |A_jk| size_k, per row j
    dpsi = w * p * (1 - p) / B * psi_size
    row = (2 * 1e-6 * abs(beta) * ((g + dpsi) @ A.abs())).reshape(-1)  # sum_j |A_ji| (...)_j
    return _row_slack_to_tokens(row, mask, proxy, lengths, cu_seqlens)


def grpo_score_slack(want_terms, *, group_size, proxy_size=None, **_):
    """Per-row fp32 error allowance for the GRPO score and what depends on it: ``psi = d/std``
    turns the rounding of the proxies (~1e-7 of their size, :func:`proxy_size`) into ~1e-7 size / std.
    Measured over 40 seeds of the packed 300-token rows: at most 0.017 of it (with ``|r|`` in place
    of the size, one draw in CI went past it: a row of 300 tokens summing to -0.03)."""
    r = want_terms["proxy"].double().view(-1, group_size)
    size = _size(r, proxy_size)
    amp = 1 + size.amax(1, keepdim=True) / (r.std(1, keepdim=True) + 1e-6)
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
    size = proxy_size(logp, logp_ref, ref_mask, lengths=lengths, **kw)
    ctx = dict(rewards=rewards, mask=ref_mask, lengths=lengths, proxy_size=size, **kw)
    assert_matches(got, want, ctx=ctx, **(tol or {}))
    return got
