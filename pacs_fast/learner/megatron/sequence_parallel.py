"""Sequence parallelism for the megatron learner (``learner.sequence_parallel``, at ``learner.tp_size`` > 1).

Tensor parallelism splits the attention heads and the MLP width, but without sequence parallelism every rank
keeps the whole ``[S, b, H]`` of what lies between them: the residual stream, both RMSNorms' inputs and
outputs, the final norm. Megatron's sequence parallelism (Korthikanti et al. 2022) splits those along the
sequence: the embedding's all-reduce becomes a reduce-scatter, each column-parallel linear all-gathers its
input (and keeps only this rank's part for the backward), each row-parallel linear reduce-scatters its output;
the same bytes on the wire as the two all-reduces per layer it replaces, and the activations between the
tensor-parallel regions divided by ``tp`` (``pacs_fast/trainer/memory_model.py`` counts them so).

What this module adds to megatron-core's own machinery (``TransformerConfig(sequence_parallel=True)``):

- :func:`rms_norm_spec`: the norms. megatron's local layer spec builds ``torch.nn.RMSNorm`` through
  ``WrappedTorchNorm``, which refuses sequence parallelism (only Transformer Engine's or Apex's norms take it).
  The norm itself is per token, so on a part of the sequence it is the same ``torch.nn.RMSNorm``; what changes
  is its weight's gradient, which on each rank sums that rank's tokens only: the weight is marked
  (:func:`mark_norms`, megatron's ``sequence_parallel`` attribute) and :func:`reduce_norm_grads` sums it over the
  ranks, as it sums the query / key norms' (Qwen3), which each rank applies to its own heads.
- :func:`pad_columns` / :func:`gather_hidden`: the sequence must split evenly, so the forward pads each row
  (padded rows, the dense mask's bins) or the packed THD row (one more sequence, of padding) to a multiple of
  ``tp`` tokens, at the end where causal attention keeps them from every real token; the final hidden states
  are gathered back to the whole sequence for the vocab-parallel LM head (whose backward already sums the
  hidden states' gradient over the ranks, :func:`pacs_fast.ops.linear_logprobs`), and the padding dropped.

Exact: the same tokens attend to the same tokens; only the order of the sums over ranks changes (float
rounding). tests/test_megatron_tp.py compares log-probs, losses, every gradient and whole updates with and
without it at TP=2 over gloo (padded, THD and dense-mask rows, odd lengths, a pad id among the tokens).
"""
from __future__ import annotations

import torch


class TorchRMSNorm:
    """Builds ``torch.nn.RMSNorm(hidden_size, eps)`` as megatron's ``WrappedTorchNorm`` does, without its refusal
    of ``config.sequence_parallel`` (only Transformer Engine's or Apex's norms take it there): on each rank's part
    of the sequence the per-token norm is the same; its weight's gradient is what changes (:func:`mark_norms`).
    Only RMSNorm (the Qwen2 / Qwen3 / Llama models :mod:`.model` builds)."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5, **_unused):
        if config.normalization != "RMSNorm":
            raise ValueError(f"only RMSNorm models, got normalization={config.normalization!r}")
        return torch.nn.RMSNorm(normalized_shape=hidden_size, eps=eps)


def rms_norm_spec(layer_spec, config):
    """The transformer block's spec for ``GPTModel``: ``layer_spec`` (megatron's local one, for every layer) with
    every norm (both of a layer's, the queries' and keys' where ``config.qk_layernorm``, the final one)
    :class:`TorchRMSNorm`."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    layer_spec.submodules.input_layernorm = TorchRMSNorm
    layer_spec.submodules.pre_mlp_layernorm = TorchRMSNorm
    if config.qk_layernorm:
        attention = layer_spec.submodules.self_attention.submodules
        attention.q_layernorm = attention.k_layernorm = TorchRMSNorm
    return TransformerBlockSubmodules(layer_specs=[layer_spec] * config.num_layers, layer_norm=TorchRMSNorm)


def mark_norms(model) -> None:
    """Marks the norm weights whose gradient each tensor-parallel rank holds a part of, for
    :func:`reduce_norm_grads`: under ``sequence_parallel`` a layer's two norms and the final norm (each rank's
    tokens; megatron's ``sequence_parallel`` attribute), and at ``tp`` > 1 the queries' and keys' norms (Qwen3's
    ``q_norm`` / ``k_norm``: one weight over the head dimension, each rank applying it to its own heads; megatron's
    ``finalize_model_grads`` sums them alike)."""
    config = model.config
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.RMSNorm):
            continue
        qk = name.endswith(("q_layernorm", "k_layernorm"))
        if qk and config.tensor_model_parallel_size > 1:
            module.weight.partial_over_tp = True
        elif not qk and config.sequence_parallel:
            module.weight.sequence_parallel = module.weight.partial_over_tp = True


def is_sequence_parallel(model) -> bool:
    """True when ``model`` (a megatron ``GPTModel``) was built with ``sequence_parallel``."""
    return bool(getattr(model.config, "sequence_parallel", False))


def tp_size_of(model) -> int:
    return int(model.config.tensor_model_parallel_size)


def pad_columns(input_ids: torch.Tensor, position_ids: torch.Tensor, blocked: torch.Tensor | None, multiple: int):
    """Rows ``[B, S]`` (ids, positions) and ``blocked [B or 1, 1, S, S]`` (True: no attention; None: causal, or
    THD) padded at the end to a multiple of ``multiple`` columns: id 0, positions continuing each row's last, each
    pad token attending to itself alone, or causally with None (no real token attends to it: it comes after them).
    Returns the three and ``S``."""
    S = input_ids.shape[1]
    pad = -S % multiple
    if pad == 0:
        return input_ids, position_ids, blocked, S
    ids = torch.cat([input_ids, input_ids.new_zeros(input_ids.shape[0], pad)], 1)
    more = position_ids[:, -1:] + torch.arange(1, pad + 1, device=position_ids.device)
    pos = torch.cat([position_ids, more], 1)
    if blocked is not None:
        n = S + pad
        grown = torch.ones(*blocked.shape[:2], n, n, dtype=torch.bool, device=blocked.device)
        grown[..., :S, :S] = blocked
        idx = torch.arange(S, n, device=blocked.device)
        grown[..., idx, idx] = False
        blocked = grown
    return ids, pos, blocked, S


def pad_thd(input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seqlens: torch.Tensor, multiple: int):
    """The packed row ``[1, t]`` (ids, positions restarting in each sequence) and its boundaries ``cu_seqlens``
    (int32 ``[n + 1]``, host) with one more sequence of padding (id 0) when ``t`` is not a multiple of
    ``multiple``. Returns the three."""
    t = input_ids.shape[1]
    pad = -t % multiple
    if pad == 0:
        return input_ids, position_ids, cu_seqlens
    ids = torch.cat([input_ids, input_ids.new_zeros(1, pad)], 1)
    pos = torch.cat([position_ids, torch.arange(pad, device=position_ids.device).view(1, pad)], 1)
    cu = torch.cat([cu_seqlens, cu_seqlens.new_tensor([t + pad])])
    return ids, pos, cu


def gather_hidden(hidden: torch.Tensor) -> torch.Tensor:
    """This rank's part ``[S / tp, b, H]`` of the decoder's output -> the whole ``[S, b, H]`` (all-gather over the
    tensor-parallel group; the backward takes this rank's part of the gradient, which the vocab-parallel LM head
    has already summed over the ranks)."""
    from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

    return gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)


def norm_params(model) -> list[torch.nn.Parameter]:
    """The parameters of ``model`` whose gradient each tensor-parallel rank holds a part of (:func:`mark_norms`:
    the norms' weights under sequence parallelism, the query / key norms' at ``tp`` > 1; none otherwise)."""
    return [p for p in model.parameters() if getattr(p, "partial_over_tp", False)]


def reduce_norm_grads(grads: list[torch.Tensor], tp_group) -> None:
    """Sums the gradients ``grads`` (:func:`norm_params`' or their fp32 masters') over the tensor-parallel group
    in place, through one flat fp32 buffer: each rank had its own tokens' or heads' part. Collective over
    ``tp_group``; nothing to do for an empty list or a group of one."""
    import torch.distributed as dist

    if not grads or tp_group is None or dist.get_world_size(tp_group) == 1:
        return
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat, group=tp_group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
