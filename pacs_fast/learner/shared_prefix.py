"""Shared-prefix forward: each group's prompt runs once, its ``G`` responses on top of it.

The ``G`` rows of a group repeat one prompt, so a plain forward computes every prompt token ``G``
times (and backpropagates through it ``G`` times). Here the prompts of the micro-batch run once
(``[g, P]``, right-padded like the plain
forward's rows, so that no query row is fully masked), their key/value cache is repeated ``G`` times along the batch
(``repeat_interleave``: its backward sums the ``G`` rows' gradients into the one prompt pass) and
the responses run on top of it (``[g*G, R]``, right-padded, position ids continuing the prompt).
The hidden states are the plain forward's up to float rounding: the same causal attention over
the same tokens at the same positions. Compute and activation memory for the prompt drop by
``(G - 1) / G``; the saving in a step is the prompt's share of the tokens times that.

Works with any Hugging Face decoder that takes ``past_key_values`` / ``position_ids`` /
``attention_mask`` (Qwen2, Llama, Mistral, ...). :func:`split_groups` returns ``None`` when the
batch does not fit (a group whose rows do not share their prompt, a row whose response starts at
position 0, ``G == 1``): the caller then runs the plain forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefixLayout:
    """How a ``[b, T]`` right-padded batch of ``g`` groups splits into prompts and responses.

    prompt_ids / prompt_mask: ``[g, P]`` int64, right-padded prompts (the shared prefix of each group).
    prompt_len: ``[b]`` int64, each row's prefix length ``p`` (its group's).
    response_ids / response_attn: ``[b, R]`` int64, tokens ``p .. p+R-1`` of each row (0 past its end)
        and 1 on its real tokens.
    response_cols: ``[b, R]`` int64, the columns ``p .. p+R-1`` of those tokens in the ``[b, T]`` layout
        (also their position ids).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    prompt_len: torch.Tensor
    response_ids: torch.Tensor
    response_attn: torch.Tensor
    response_cols: torch.Tensor


def split_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_mask: torch.Tensor,
                 group_size: int) -> PrefixLayout | None:
    """The layout of a batch whose rows ``[kG, (k+1)G)`` share a prompt, or ``None``.

    A group's prefix is everything before the first response token of any of its rows (a row with
    no response token counts with its full length); every row of the group must hold the same
    tokens there, and the prefix must be at least one token long.
    """
    b, T = input_ids.shape
    G = int(group_size)
    if G < 2 or b % G:
        return None
    g = b // G
    lengths = attention_mask.sum(-1).long()
    if bool((attention_mask != (torch.arange(T, device=input_ids.device) < lengths[:, None])).any()):
        return None  # not right-padded
    has_resp = response_mask.sum(-1) > 0
    first = torch.where(has_resp, (response_mask > 0).float().argmax(-1), lengths)
    p_group = first.view(g, G).min(-1).values                        # [g]
    if bool((p_group < 1).any()):
        return None
    P = int(p_group.max())
    pos = torch.arange(P, device=input_ids.device)
    ids_g = input_ids[:, :P].view(g, G, P)
    in_prefix = (pos < p_group[:, None])[:, None, :]                  # [g, 1, P]
    if bool(((ids_g != ids_g[:, :1]) & in_prefix).any()):
        return None  # rows of a group differ within the prefix
    prompt_mask = (pos[None, :] < p_group[:, None]).long()          # right-padded, as the rows are
    prompt_ids = ids_g[:, 0] * prompt_mask
    prompt_len = p_group.repeat_interleave(G)                          # [b]
    rlen = lengths - prompt_len
    R = max(int(rlen.max()), 1)
    cols = prompt_len[:, None] + torch.arange(R, device=input_ids.device)  # [b, R]
    response_attn = (torch.arange(R, device=input_ids.device)[None, :] < rlen[:, None]).long()
    response_ids = input_ids.gather(1, cols.clamp(max=T - 1)) * response_attn
    return PrefixLayout(prompt_ids, prompt_mask, prompt_len, response_ids, response_attn, cols)


def shared_prefix_hidden(decoder, layout: PrefixLayout, group_size: int) -> torch.Tensor:
    """``[b, R, H]`` final hidden states that *predict* response-part tokens: entry ``j`` of row
    ``i`` predicts token ``prompt_len[i] + j`` (the plain forward's position ``prompt_len[i] + j - 1``).

    ``decoder`` is the transformer body (``model.model``); differentiable.
    """
    from transformers import DynamicCache

    G = int(group_size)
    g, P = layout.prompt_ids.shape
    ppos = torch.arange(P, device=layout.prompt_ids.device).expand(g, P)
    # the model's config gives the cache its layer types (sliding-window layers where the model has them)
    cache = DynamicCache(config=getattr(decoder, "config", None))
    out = decoder(input_ids=layout.prompt_ids, attention_mask=layout.prompt_mask, position_ids=ppos,
                  past_key_values=cache, use_cache=True)
    cache = out.past_key_values
    if cache is None or cache.get_seq_length() == 0:
        raise RuntimeError("shared_prefix_hidden: the decoder returned no key/value cache (is gradient "
                           "checkpointing on? it switches the cache off)")
    p_group = layout.prompt_len[::G]
    last = out.last_hidden_state[torch.arange(g, device=p_group.device), p_group - 1]  # [g, H]
    last_prompt = last[:, None].repeat_interleave(G, 0)                                 # [b, 1, H]
    R = layout.response_ids.shape[1]
    if R == 1:  # every response is one token long: it is predicted by the prompt's last state
        return last_prompt
    # The last response-part column is only ever a label: feed columns 0 .. R-2.
    cache.batch_repeat_interleave(G)
    rpos = layout.response_cols[:, :-1]
    attn = torch.cat([layout.prompt_mask.repeat_interleave(G, 0), layout.response_attn[:, :-1]], dim=1)
    hr = decoder(input_ids=layout.response_ids[:, :-1], attention_mask=attn, position_ids=rpos,
                 past_key_values=cache, use_cache=True).last_hidden_state      # [b, R-1, H]
    return torch.cat([last_prompt, hr], dim=1)


def response_selection(layout: PrefixLayout, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sel, cols)``: ``sel [b, R]`` bool, the response-part entries that are trained tokens
    (``response_mask`` at their position); ``cols [b, R]`` their column in the ``[b, T]`` layout."""
    T = response_mask.shape[1]
    cols = layout.response_cols
    sel = (response_mask.gather(1, cols.clamp(max=T - 1)) > 0) & (layout.response_attn > 0)
    return sel, cols


def scatter_to_rows(x: torch.Tensor, sel: torch.Tensor, cols: torch.Tensor, T: int) -> torch.Tensor:
    """``[b, T]`` tensor with the values ``x [n]`` (one per True of ``sel``) at ``cols[sel]``, 0
    elsewhere. Differentiable in ``x``."""
    b, R = sel.shape
    part = x.new_zeros(b, R).masked_scatter(sel, x)
    return x.new_zeros(b, T + R).scatter(1, cols, part)[:, :T]
