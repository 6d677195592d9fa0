"""Turning rollouts into tensors: right-padded ``prompt + response`` rows, grouped by prompt."""
from __future__ import annotations

import itertools

import torch

from pacs_fast.learner.base import RolloutBatch


def build_batch(prompt_ids: list[list[int]], responses: list[list[list[int]]], rewards: list[float], *,
                pad_id: int, logprobs: list[list[list[float]]] | None = None) -> RolloutBatch:
    """A :class:`RolloutBatch` from ``responses[i][j]`` (token ids of sample j of prompt i).

    Rows are ``prompt_ids[i] + responses[i][j]`` in prompt-major order (groups contiguous),
    right-padded with ``pad_id``; ``rewards`` is flat in the same order. An empty response keeps
    a row with no response token (it trains nothing but counts in its group).
    ``logprobs[i][j]``: the engine's per-token log-probs of ``responses[i][j]`` (``Completion.logprobs``),
    one per token; given, they become ``behaviour_logp`` ([B, T] fp32, 0 off the response).
    """
    if len(prompt_ids) != len(responses):
        raise ValueError(f"prompt_ids has {len(prompt_ids)} prompts but responses has {len(responses)}")
    G = len(responses[0]) if responses else 0
    if G == 0 or any(len(r) != G for r in responses):
        raise ValueError("every prompt needs the same number (>= 1) of responses")
    rows, resp_start = [], []
    for p, group in zip(prompt_ids, responses):
        for r in group:
            rows.append(list(p) + list(r))
            resp_start.append(len(p))
    if len(rewards) != len(rows):
        raise ValueError(f"rewards has {len(rewards)} entries but there are {len(rows)} responses")
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    T = int(lengths.max())
    cols = torch.arange(T)
    attn = cols < lengths[:, None]                       # True positions, row-major = the rows' order
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    ids[attn] = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=torch.long)
    resp = (cols >= torch.tensor(resp_start)[:, None]) & attn
    behaviour = None
    if logprobs is not None:
        flat = [lp for group in logprobs for lp in group]
        if len(flat) != len(rows) or any(len(lp) != len(r) for lp, r in
                                         zip(flat, itertools.chain.from_iterable(responses))):
            raise ValueError("logprobs must hold one log-prob per response token, shaped like responses")
        behaviour = torch.zeros(len(rows), T, dtype=torch.float32)
        behaviour[resp] = torch.tensor(list(itertools.chain.from_iterable(flat)), dtype=torch.float32)
    return RolloutBatch(input_ids=ids, attention_mask=attn.long(), response_mask=resp.float(),
                        rewards=torch.tensor(rewards, dtype=torch.float32), group_size=G,
                        behaviour_logp=behaviour)


def engine_logprobs(comps) -> list[list[list[float]]] | None:
    """``Completion.logprobs`` of every completion (``comps[i][j]``), or None when any is missing or
    does not hold one log-prob per token."""
    if any(c.logprobs is None or len(c.logprobs) != len(c.token_ids) for cs in comps for c in cs):
        return None
    return [[c.logprobs for c in cs] for cs in comps]


def outcome_token_rewards(batch: RolloutBatch) -> torch.Tensor:
    """``[B, T]``: each row's reward on its last response token (PPO's per-token rewards)."""
    mask = batch.response_mask
    T = mask.shape[1]
    last = torch.where(mask > 0, torch.arange(T).expand_as(mask), -1).max(dim=1).values
    out = torch.zeros_like(mask)
    has = last >= 0
    out[has, last[has]] = batch.rewards[has]
    return out


def response_values(prompt_ids: list[list[int]], values: list[list[list[float]]], shape) -> torch.Tensor:
    """``[B, T]`` float32 tensor holding ``values[i][j][k]`` (e.g. the rollout engine's log-prob of
    response token k of sample j of prompt i) at that token's position in the :func:`build_batch`
    layout (``len(prompt_ids[i]) + k`` in row ``i * G + j``), 0 elsewhere."""
    B, T = tuple(shape)
    starts, counts, flat = [], [], []
    for p, group in zip(prompt_ids, values):
        for v in group:
            starts.append(len(p))
            counts.append(len(v))
            flat.extend(v)
    if len(starts) != B:
        raise ValueError(f"values cover {len(starts)} rows but the batch has {B}")
    start = torch.tensor(starts, dtype=torch.long)[:, None]
    end = start + torch.tensor(counts, dtype=torch.long)[:, None]
    if bool((end > T).any()):
        raise ValueError(f"values run past the batch width {T}")
    cols = torch.arange(T)
    out = torch.zeros((B, T), dtype=torch.float32)
    out[(cols >= start) & (cols < end)] = torch.tensor(flat, dtype=torch.float32)
    return out
