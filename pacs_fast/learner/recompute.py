"""Selective activation recompute for the torch learner's Hugging Face model
(``model.gradient_checkpointing=true model.recompute_granularity=selective``).

Full recompute (``model.recompute_granularity=full``, Hugging Face's ``gradient_checkpointing_enable``) keeps each
decoder layer's input and runs the whole layer again in the backward. Selective keeps the attention's
activations and runs only each layer's MLP again (``torch.utils.checkpoint``, non-reentrant): the MLP holds
most of a layer's activations (gate, up, SiLU and product, ``8 F`` bytes a token in bf16 against ``~19 H`` for
the rest of the layer: 71% at the Qwen2.5-1.5B shape, F = 5.8 H), while at long responses the attention holds
much of the compute (causal, ``2 Hq s`` forward FLOPs a token and layer: at s = 32k as much as all the layer's
matmuls at that shape), which full recompute repeats and selective does not. The megatron learner gets the same
choice from megatron itself (``recompute_granularity="selective", recompute_modules=["mlp"]``; megatron's own
default, the core attention, saves nothing with a flash / varlen kernel, which never keeps the ``S x S`` scores;
the megatron learner's padded or dense-mask forward, ``learner.packing=off`` or ``packed_attention=dense``, does
keep them: use ``full`` there).

Unlike full recompute, the key/value cache stays on, so the shared-prefix forward still runs. The wrapper
is installed per model instance over whatever forward the MLP has then (its own, or the fused one of
``learner.fused_layers``, installed first); a deep copy (the reference model) keeps it bound to its own
modules; parameters and ``state_dict`` are unchanged.
"""
from __future__ import annotations

import types

import torch
from torch.utils.checkpoint import checkpoint

from pacs_fast.config.schema import RECOMPUTE_GRANULARITIES as GRANULARITIES


def _recomputed_forward(self, hidden_states, *args, **kwargs):
    if not torch.is_grad_enabled():  # no backward to recompute for
        return self._forward_to_recompute(hidden_states, *args, **kwargs)
    return checkpoint(self._forward_to_recompute, hidden_states, *args, use_reentrant=False, **kwargs)


def recompute_mlps(model: torch.nn.Module) -> int:
    """Makes every decoder layer's ``mlp`` submodule of ``model`` recompute its forward in the backward.
    Returns how many modules were wrapped (0 when none is named ``mlp``); idempotent."""
    n = 0
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] != "mlp" or "_forward_to_recompute" in module.__dict__:
            continue
        module._forward_to_recompute = module.forward  # (bound: its own, or the fused one)
        module.forward = types.MethodType(_recomputed_forward, module)
        n += 1
    return n


def undo_recompute(model: torch.nn.Module) -> int:
    """Gives every module :func:`recompute_mlps` wrapped the forward it had before (its own, or a fused one);
    returns how many."""
    n = 0
    for module in model.modules():
        inner = module.__dict__.pop("_forward_to_recompute", None)
        if inner is None:
            continue
        if getattr(inner, "__func__", None) is type(module).forward:
            module.__dict__.pop("forward", None)
        else:
            module.forward = inner
        n += 1
    return n


def apply_recompute(model: torch.nn.Module, enabled: bool, granularity: str) -> str | None:
    """``model.gradient_checkpointing`` / ``model.recompute_granularity`` on a loaded Hugging Face model;
    returns the line a run prints (None when off). ``selective`` on a model without ``mlp`` submodules is a
    ValueError naming the key."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"model.recompute_granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}")
    if not enabled:
        return None
    if granularity == "full":
        model.gradient_checkpointing_enable()
        return "activation recompute: full (every decoder layer)"
    n = recompute_mlps(model)
    if not n:
        raise ValueError(f"model.recompute_granularity=selective: {type(model).__name__} has no decoder-layer "
                         "submodule named mlp; use model.recompute_granularity=full")
    return f"activation recompute: selective (the MLP of {n} decoder layers)"
