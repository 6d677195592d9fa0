"""Credit assignment for step-level (process) rewards: PURE's min-form and the usual summation form.

PURE (Cheng et al. 2025, "Stop Summation: Min-Form Credit Assignment Is All Process Reward Model
Needs for Reasoning", arXiv 2504.15275): a response is cut into ``K`` steps with rewards
``r_1..r_K`` (from a process reward model or any user function). The summation form values step
``k`` by ``G_k = sum_{j>=k} gamma^(j-k) r_j``; one over-rated step then lifts every step before it,
which the policy learns to exploit. The min-form values it by ``G_k = min_{j>=k} r_j``: a
trajectory is only as good as its worst remaining step.

PURE implements the min-form inside a sum-based pipeline by re-weighting the rewards with a softmin
over the response, ``r*_j = r_j softmax(-r / T)_j``, so that ``sum_j r*_j -> min_j r_j`` as
``T -> 0`` (:func:`softmin_transform`); the exact min-form returns are :func:`min_form_returns`.

Layout: ``step_rewards [B, K]`` float, ``step_mask [B, K]`` (1 = a real step; responses with fewer
steps are right-padded), ``step_ends [B, K]`` int (token index, in the response's columns of the
``[B, T]`` token layout, one past the last token of each step). Rows ``[kG, (k+1)G)`` answer the same
prompt. Everything is computed without gradient (advantages are targets).
"""
from __future__ import annotations

import torch

CREDIT_FORMS = ("min", "sum")


def _check(step_rewards: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    if step_rewards.dim() != 2:
        raise ValueError(f"step_rewards must be [B, K], got shape {tuple(step_rewards.shape)}")
    if tuple(step_mask.shape) != tuple(step_rewards.shape):
        raise ValueError(f"step_mask must match step_rewards {tuple(step_rewards.shape)}, "
                         f"got {tuple(step_mask.shape)}")
    m = step_mask.bool()
    if bool((m[:, 1:] & ~m[:, :-1]).any()):
        raise ValueError("step_mask must be right-padded (real steps first in every row)")
    return m


@torch.no_grad()
def min_form_returns(step_rewards: torch.Tensor, step_mask: torch.Tensor) -> torch.Tensor:
    """``G[b, k] = min_{j >= k, real} r[b, j]`` on real steps, 0 on padding. ``[B, K]``."""
    m = _check(step_rewards, step_mask)
    x = torch.where(m, step_rewards, torch.full_like(step_rewards, float("inf")))
    g = torch.flip(torch.cummin(torch.flip(x, [1]), dim=1).values, [1])
    return torch.where(m, g, torch.zeros_like(g))


@torch.no_grad()
def sum_form_returns(step_rewards: torch.Tensor, step_mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """``G[b, k] = sum_{j >= k, real} gamma^(j-k) r[b, j]`` on real steps, 0 on padding. ``[B, K]``."""
    m = _check(step_rewards, step_mask)
    r = torch.where(m, step_rewards, torch.zeros_like(step_rewards))
    out = torch.zeros_like(r)
    acc = torch.zeros_like(r[:, 0])
    for k in range(r.shape[1] - 1, -1, -1):
        acc = r[:, k] + gamma * acc
        out[:, k] = acc
    return torch.where(m, out, torch.zeros_like(out))


@torch.no_grad()
def softmin_transform(step_rewards: torch.Tensor, step_mask: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """PURE's reward transform ``r*_j = r_j * softmax(-r / T)_j`` over each row's real steps
    (0 on padding); ``sum_j r*_j`` tends to ``min_j r_j`` as ``T -> 0``. ``[B, K]``."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    m = _check(step_rewards, step_mask)
    logits = torch.where(m, -step_rewards / temperature, torch.full_like(step_rewards, float("-inf")))
    w = torch.softmax(logits, dim=1).nan_to_num(0.0)  # rows without steps: all -inf -> 0
    return torch.where(m, step_rewards * w, torch.zeros_like(step_rewards))


@torch.no_grad()
def process_advantages(step_rewards: torch.Tensor, step_mask: torch.Tensor, group_size: int, *,
                       form: str = "min", gamma: float = 1.0, outcome: torch.Tensor | None = None,
                       outcome_weight: float = 1.0) -> torch.Tensor:
    """Step advantages ``[B, K]``: the step's return (``form``: min | sum) minus a leave-one-out
    baseline, the mean first-step return ``G[., 0]`` of the other responses in the group (0 on padding).
    With ``group_size = 1`` there is no baseline (the returns themselves).

    ``outcome`` ``[B]`` (e.g. the verifier's 0/1 reward, PURE's "PRM + VR"): ``outcome_weight *
    outcome[b]`` is added to every step's return of response ``b`` (also inside the baseline), so
    a step's value is its process return plus the response's final reward."""
    if form not in CREDIT_FORMS:
        raise ValueError(f"form must be one of {', '.join(CREDIT_FORMS)}; got {form!r}")
    G = min_form_returns(step_rewards, step_mask) if form == "min" else sum_form_returns(step_rewards, step_mask, gamma)
    B = G.shape[0]
    if outcome is not None:
        if tuple(outcome.shape) != (B,):
            raise ValueError(f"outcome must be [{B}] (one per response), got {tuple(outcome.shape)}")
        G = torch.where(step_mask.bool(), G + outcome_weight * outcome.to(G.dtype)[:, None], torch.zeros_like(G))
    if group_size < 1 or B % group_size:
        raise ValueError(f"group_size={group_size} must divide the {B} rows")
    if group_size == 1:
        return G
    # the leave-one-out mean in differences from the group's first return c: near-equal returns keep their
    # digits (returns near 1 with a spread of 1e-3: 1.7e-4 of max |A| off in fp32, 4e-8 so)
    v = G[:, 0].reshape(-1, group_size)
    c = v[:, :1]
    dv = v - c
    loo = ((dv.sum(1, keepdim=True) - dv) / (group_size - 1)).reshape(-1, 1)
    shift = c.expand(-1, group_size).reshape(-1, 1)
    return torch.where(step_mask.bool(), (G - shift) - loo, torch.zeros_like(G))


@torch.no_grad()
def token_advantages(step_adv: torch.Tensor, step_ends: torch.Tensor, step_mask: torch.Tensor,
                     response_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` token advantages: the response tokens of step ``k`` (columns from the previous
    step's end, or the response start, up to ``step_ends[b, k]``) get ``step_adv[b, k]``; tokens
    past the last step's end get the last step's advantage; off-response tokens get 0."""
    B, T = response_mask.shape
    m = _check(step_adv, step_mask)
    out = torch.zeros((B, T), dtype=step_adv.dtype)
    cols = torch.arange(T)
    for b in range(B):
        n = int(m[b].sum())
        if n == 0:
            continue
        # step index of each column: number of step ends at or before it, capped at the last step
        ends = step_ends[b, :n].to(torch.long)
        idx = torch.searchsorted(ends, cols, right=True).clamp(max=n - 1)
        out[b] = step_adv[b, idx]
    return out * (response_mask > 0).to(out.dtype)
