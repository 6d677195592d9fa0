"""DAPO's overlong reward shaping, and a PACS loss over the responses that stay in the loss.

**Soft overlong punishment** (DAPO, Yu et al. 2025, arXiv 2503.14476 eq. 13; verl's DAPO reward
manager, ``verl/workers/reward_manager/dapo.py``): a response of ``L`` tokens (EOS included, as verl
counts ``valid_response_length``) with a generation limit ``L_max`` and a buffer of ``buffer_len``
tokens gets::

    penalty = max(min(-(L - (L_max - buffer_len)) / buffer_len * penalty_factor, 0), -penalty_factor)

added to the verifier's reward: 0 up to ``L_max - buffer_len`` tokens, then falling linearly to
``-penalty_factor`` at ``L = L_max``, and ``-penalty_factor`` beyond (the paper's ``-1`` for ``|y| > L_max``;
verl's ramp has no floor, but its lengths never pass ``L_max``).

**How a shaped reward enters PACS.** PACS's reward is the *label* of a binary cross-entropy, which
must lie in ``[0, 1]`` (:mod:`pacs_fast.algorithms.pacs`; soft labels allowed), while a shaped reward can be
negative. :func:`shaped_rewards` therefore gives PACS ``clip(R + penalty, 0, 1)``: a correct response
inside the buffer becomes a soft label ``1 + penalty`` (less credible the longer it runs; at
``penalty <= -1`` it counts as wrong), and a wrong one stays 0 (it cannot be more wrong than wrong).
The baselines get ``R + penalty`` unclipped, as verl's DAPO recipe (their advantages are differences
of rewards, any real value works).

**Dropping responses from PACS's groups** (``learner.mask_truncated``): :func:`loss_over_members`
scores each group over the members it has left, the semantics the TRL adapter (which calls it) gives
TRL's ``mask_truncated_completions`` (a removed row has no label, no class weight and no
part in its group's score; a group left with fewer than ``min_members`` drops out).
"""
from __future__ import annotations

import numbers

import torch

from pacs_fast.algorithms._checks import check_real, check_tensor


def overlong_penalty(lengths: torch.Tensor, max_len: int, buffer_len: int, penalty_factor: float = 1.0
                     ) -> torch.Tensor:
    """``[B]`` DAPO penalty ``min(-(L - (max_len - buffer_len)) / buffer_len * penalty_factor, 0)``, floored at
    ``-penalty_factor`` (a length beyond ``max_len``: DAPO eq. 13's ``-1``).

    Args:
        lengths: ``[B]`` response lengths in tokens (int or float). max_len: the generation limit
            (``rollout.max_new_tokens``). buffer_len: the buffer (``0 < buffer_len <= max_len``, as verl
            asserts). penalty_factor: the penalty at ``L = max_len`` (>= 0; verl's ``penalty_factor``).
    Returns:
        ``[B]`` float tensor (float64 for float64 lengths, else float32), in ``[-penalty_factor, 0]``.
    """
    fn = "overlong_penalty"
    check_tensor(fn, "lengths", lengths, ndim=1)
    if isinstance(max_len, bool) or not isinstance(max_len, numbers.Integral) or max_len < 1:
        raise ValueError(f"{fn}: max_len must be a positive int, got {max_len!r}")
    if isinstance(buffer_len, bool) or not isinstance(buffer_len, numbers.Integral) or not 0 < buffer_len <= max_len:
        raise ValueError(f"{fn}: buffer_len must be an int in [1, max_len={max_len}], got {buffer_len!r}")
    max_len, buffer_len = int(max_len), int(buffer_len)  # numpy integers too
    penalty_factor = check_real(fn, "penalty_factor", penalty_factor, nonneg=True)
    dtype = torch.float64 if lengths.dtype == torch.float64 else torch.float32
    exceed = lengths.to(dtype) - (max_len - buffer_len)
    # + 0.0: a length at the buffer's start gives 0.0, not -0.0 (-(0) / buffer_len)
    return (-exceed / buffer_len * penalty_factor).clamp(-penalty_factor, 0.0) + 0.0


def shaped_rewards(rewards: torch.Tensor, penalty: torch.Tensor, *, label: bool) -> torch.Tensor:
    """``rewards + penalty``; clipped to ``[0, 1]`` when ``label`` (PACS's BCE label, module docstring)."""
    out = rewards + penalty.to(rewards.dtype)
    return out.clamp(0.0, 1.0) if label else out


def loss_over_members(loss_fn, valid: torch.Tensor, group_size: int, min_members: int):
    """PACS's loss of the rows ``valid`` marks, each group scored over the members it has left.

    ``loss_fn(idx, k)`` must return ``(mean loss over rows idx, terms)`` for the rows ``idx`` (whole
    groups of ``k`` members each, contiguous, in order), e.g. ``pacs_loss(logp[idx], ..., group_size=k)``.
    Groups left with fewer than ``min_members`` valid rows (2 for the rloo / grpo / dr_grpo scores) drop out.

    Returns ``(loss_sum, terms, rows)``: the *sum* of the per-row losses over the rows that remain
    (connected to the graph, 0 when none remains), ``terms`` with every ``[n]`` tensor of ``loss_fn``
    scattered back to ``[B]`` (NaN on rows that left), and the number of rows that remain.
    """
    B = valid.shape[0]
    members = valid.view(B // group_size, group_size)
    counts = members.sum(dim=1)
    total, rows, terms = None, 0, {}
    for k in sorted(set(counts.tolist())):
        if k < max(min_members, 1):
            continue
        idx = (members & (counts == k)[:, None]).reshape(-1).nonzero().squeeze(1)
        loss_k, terms_k = loss_fn(idx, k)
        total = loss_k * idx.numel() if total is None else total + loss_k * idx.numel()
        rows += idx.numel()
        for name, value in terms_k.items():
            if isinstance(value, torch.Tensor) and value.shape[:1] == (idx.numel(),):
                full = terms.setdefault(name, torch.full((B, *value.shape[1:]), float("nan"), dtype=value.dtype,
                                                         device=value.device))
                full[idx] = value.detach()
    return total, terms, rows
