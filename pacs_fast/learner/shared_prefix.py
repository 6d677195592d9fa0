"""Shared-prefix forward: the part a group's rows have in common runs once, the rest per row.

The ``G`` rows of a group repeat one prompt, and sampled responses often start alike too (a
fixed answer format, a common first step, or outright identical answers), so a plain forward
computes every token of the group's common prefix ``G`` times (and backpropagates through it
``G`` times). Here the longest common prefix of each group's rows (prompt and shared start of the
responses, ``p`` tokens) runs once (``[g, P]``, right-padded like the plain forward's rows, so
that no query row is fully masked), its key/value cache is repeated ``G`` times along the batch
(``repeat_interleave``: its backward sums the ``G`` rows' gradients into the one prefix pass) and
each row's remaining tokens run on top of it (``[g*G, R]``, right-padded, position ids
continuing the prefix). A token inside the common prefix has the same context, label and hidden
state in every row of its group, so its log-prob (entropy, value) is computed once per group and
handed to each row whose response mask holds it. The results are the plain forward's up to float
rounding: the same causal attention over the same tokens at the same positions. Compute and
activation memory for the common prefix drop by ``(G - 1) / G``; the saving in a step is the
common prefix's share of the tokens times that.

Works with any Hugging Face decoder that takes ``past_key_values`` / ``position_ids`` /
``attention_mask`` (Qwen2, Llama, Mistral, ...). :func:`split_groups` returns ``None`` when the
batch does not fit (a group whose rows differ from their first token, ``G == 1``, a batch that is
not right-padded): the caller then runs the plain forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefixLayout:
    """How a ``[b, T]`` right-padded batch of ``g`` groups splits into common prefixes and the rest.

    prompt_ids / prompt_mask: ``[g, P]`` int64, each group's right-padded common prefix (the name
        is historical: the prompt and any response tokens all rows of the group share).
    prompt_len: ``[b]`` int64, each row's common-prefix length ``p`` (its group's).
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


def split_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, group_size: int) -> PrefixLayout | None:
    """The layout of a batch whose rows ``[kG, (k+1)G)`` form groups, or ``None``.

    A group's common prefix is its rows' longest common prefix (no longer than its shortest row);
    it must be at least one token long. Which of its tokens train is :func:`select_trained`'s business.
    """
    b, T = input_ids.shape
    G = int(group_size)
    if G < 2 or b % G or T == 0:
        return None
    g = b // G
    dev = input_ids.device
    lengths = attention_mask.sum(-1).long()
    pos = torch.arange(T, device=dev)
    if bool((attention_mask != (pos < lengths[:, None])).any()):
        return None  # not right-padded
    p_group = common_prefix_lengths(input_ids, lengths, G)
    if bool((p_group < 1).any()):
        return None
    ids_g = input_ids.view(g, G, T)
    P = int(p_group.max())
    prompt_mask = (pos[None, :P] < p_group[:, None]).long()               # right-padded, as the rows are
    prompt_ids = ids_g[:, 0, :P] * prompt_mask
    prompt_len = p_group.repeat_interleave(G)                              # [b]
    rlen = lengths - prompt_len
    R = max(int(rlen.max()), 1)
    cols = prompt_len[:, None] + torch.arange(R, device=dev)              # [b, R]
    response_attn = (torch.arange(R, device=dev)[None, :] < rlen[:, None]).long()
    response_ids = input_ids.gather(1, cols.clamp(max=T - 1)) * response_attn
    return PrefixLayout(prompt_ids, prompt_mask, prompt_len, response_ids, response_attn, cols)


def common_prefix_lengths(input_ids: torch.Tensor, lengths: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[g]`` int64: the length of the longest common prefix of each group's rows (``input_ids
    [g*G, T]`` right-padded, ``lengths [g*G]`` their real lengths); at most the group's shortest row."""
    b, T = input_ids.shape
    G = int(group_size)
    ids_g = input_ids.view(b // G, G, T)
    shortest = lengths.view(b // G, G).min(-1).values
    pos = torch.arange(T, device=input_ids.device)
    differs = (ids_g != ids_g[:, :1]).any(1) | (pos >= shortest[:, None])  # [g, T]
    return torch.where(differs.any(-1), differs.int().argmax(-1), shortest)


def shared_prefix_hidden(decoder, layout: PrefixLayout, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(prefix [g, P, H], rest [b, R, H])`` final hidden states; differentiable.

    ``prefix[k, j]`` is the hidden state of group ``k`` at position ``j`` (it predicts token
    ``j + 1``); ``rest[i, j]`` predicts token ``prompt_len[i] + j`` of row ``i`` (the plain
    forward's position ``prompt_len[i] + j - 1``; entry 0 is its group's last prefix state).
    ``decoder`` is the transformer body (``model.model``).
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
    prefix = out.last_hidden_state
    p_group = layout.prompt_len[::G]
    last = prefix[torch.arange(g, device=p_group.device), p_group - 1]     # [g, H]
    last_prefix = last[:, None].repeat_interleave(G, 0)                    # [b, 1, H]
    R = layout.response_ids.shape[1]
    if R == 1:  # every row ends at most one token after its prefix: no per-row pass
        return prefix, last_prefix
    # The last column of the rest is only ever a label: feed columns 0 .. R-2.
    cache.batch_repeat_interleave(G)
    rpos = layout.response_cols[:, :-1]
    attn = torch.cat([layout.prompt_mask.repeat_interleave(G, 0), layout.response_attn[:, :-1]], dim=1)
    hr = decoder(input_ids=layout.response_ids[:, :-1], attention_mask=attn, position_ids=rpos,
                 past_key_values=cache, use_cache=True).last_hidden_state      # [b, R-1, H]
    return prefix, torch.cat([last_prefix, hr], dim=1)


@dataclass
class Selection:
    """Which hidden states give the trained tokens of a batch, and where their results go.

    prefix: ``[g, P-1]`` bool, prefix states ``j`` whose token ``j + 1`` lies inside the common
        prefix and is trained in at least one row of the group (computed once per group).
    prefix_rows: ``[b, P-1]`` float, 1 where row ``i`` trains that token (column ``j + 1``).
    rest: ``[b, R]`` bool, entries of the rest that are trained tokens; rest_cols: their columns.
    """

    prefix: torch.Tensor
    prefix_rows: torch.Tensor
    rest: torch.Tensor
    rest_cols: torch.Tensor


def select_trained(layout: PrefixLayout, response_mask: torch.Tensor, group_size: int) -> Selection:
    """The :class:`Selection` of the trained tokens (``response_mask > 0``) of a batch."""
    G = int(group_size)
    b, T = response_mask.shape
    g, P = layout.prompt_ids.shape
    cols = layout.response_cols
    rest = (response_mask.gather(1, cols.clamp(max=T - 1)) > 0) & (layout.response_attn > 0)
    inside = torch.arange(1, P, device=response_mask.device)[None, :] < layout.prompt_len[:, None]  # [b, P-1]
    prefix_rows = (response_mask[:, 1:P] > 0) & inside
    prefix = prefix_rows.view(g, G, P - 1).any(1)
    return Selection(prefix, prefix_rows.to(response_mask.dtype), rest, cols)


def trained_states(prefix: torch.Tensor, rest: torch.Tensor, layout: PrefixLayout, sel: Selection):
    """``(h [n, H], labels [n])``: the hidden states and target tokens of the trained tokens, the
    group-level ones (``sel.prefix``) first, then the per-row ones (``sel.rest``)."""
    h = torch.cat([prefix[:, :-1][sel.prefix], rest[sel.rest]])
    labels = torch.cat([layout.prompt_ids[:, 1:][sel.prefix], layout.response_ids[sel.rest]])
    return h, labels


def scatter_to_rows(x: torch.Tensor, sel: Selection, T: int) -> torch.Tensor:
    """``[b, T]`` tensor with the values ``x [n]`` (in :func:`trained_states` order) in every row
    that trains their token, 0 elsewhere. Differentiable in ``x`` (a group-level value's gradient
    is the sum over the rows that use it)."""
    g, P1 = sel.prefix.shape
    b, R = sel.rest.shape
    n_prefix = int(sel.prefix.sum())
    part = x.new_zeros(b, R).masked_scatter(sel.rest, x[n_prefix:])
    out = x.new_zeros(b, T + R).scatter(1, sel.rest_cols, part)[:, :T]
    if n_prefix:
        grid = x.new_zeros(g, P1).masked_scatter(sel.prefix, x[:n_prefix])
        rows = grid.repeat_interleave(b // g, 0) * sel.prefix_rows.to(x.dtype)     # columns 1 .. P-1
        out = out + torch.nn.functional.pad(rows, (1, T - P1 - 1))
    return out
