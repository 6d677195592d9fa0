"""Attention for short sequences on the CPU, as a Hugging Face attention implementation.

PyTorch's CPU ``scaled_dot_product_attention`` runs a blocked flash kernel whose fixed cost per
(batch, head) block dominates when sequences are a few dozen tokens long: the tiny-model RL steps
of the built-in task (prompts of ~6 tokens, responses of ~12) and one-token decode steps. For those
shapes two batched matmuls and a softmax are faster, forward and backward (autograd through
``matmul`` / ``softmax``). Grouped-query attention is done without repeating the key/value heads:
the ``h / h_kv`` query heads that share a key/value head are stacked along the query axis.

:func:`short_attention` has the signature of transformers' attention functions and takes the same
masks as its ``"sdpa"`` implementation (boolean ``[b, 1, q, k]``, True = attend, or ``None`` for plain
causal attention). Above :data:`MAX_SCORES` score entries per (batch, head), or off the CPU, or with
dropout, it calls transformers' SDPA function unchanged, so long sequences keep the flash kernel's
memory use. Masked scores get the dtype's lowest finite value, not ``-inf``: a query row with no
visible key (a left-padding position) then averages the values instead of giving NaN, as
transformers' eager attention does.

:func:`use_attention` switches a loaded model to it (``"short"``, registered under
:data:`NAME`) or to any transformers implementation name. Shapes: query ``[b, h, q, d]``, key
``[b, h_kv, k, d]``, value ``[b, h_kv, k, d_v]``; returns ``([b, q, h, d_v], None)`` in the query's dtype (the
softmax runs in float32 for half-precision inputs, else in their dtype).
"""
from __future__ import annotations

import torch

NAME = "pacs_fast_short"
# Per (batch, head), at most this many query x key entries use the matmul path without / with
# gradients (measured by bench/bench_attention.py on CPU; above them SDPA's flash kernel is faster).
MAX_SCORES = 48 * 48
MAX_SCORES_TRAIN = 32 * 32


class _MatmulAttention(torch.autograd.Function):
    """``softmax(q k^T * scale, masked) v`` for ``q [b, kvh, rq, d]``, ``k [b, kvh, k, d]``, ``v [b, kvh, k, d_v]``.

    ``allowed``: bool, broadcastable to ``[b, kvh, r, q, k]`` (``rq = r * q``), or None. Saves the
    probabilities and computes the backward with four matmuls and one softmax backward.
    """

    @staticmethod
    def forward(ctx, q, k, v, allowed, r: int, scale: float):
        b, kvh, rq, _ = q.shape
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)                 # [b, kvh, rq, k]
        if allowed is not None:
            scores.view(b, kvh, r, rq // r, -1).masked_fill_(~allowed, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
        probs = probs.to(v.dtype)
        ctx.save_for_backward(q, k, v, probs, allowed)
        ctx.scale, ctx.r = scale, r
        return torch.matmul(probs, v)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, probs, allowed = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_v = torch.matmul(probs.transpose(-1, -2), grad_out)
        grad_p = torch.matmul(grad_out, v.transpose(-1, -2))
        grad_s = torch._softmax_backward_data(grad_p, probs, -1, probs.dtype).mul_(ctx.scale)
        if allowed is not None:  # masked scores are constants (this matters in rows with no visible key)
            b, kvh, rq, _ = q.shape
            grad_s.view(b, kvh, ctx.r, rq // ctx.r, -1).masked_fill_(~allowed, 0)
        grad_q = torch.matmul(grad_s, k)
        grad_k = torch.matmul(grad_s.transpose(-1, -2), q)
        return grad_q, grad_k, grad_v, None, None, None


def short_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs):
    """``softmax(q k^T * scaling + mask) v`` by batched matmuls (see the module docstring)."""
    b, h, q, d = query.shape
    kvh, k = key.shape[1], key.shape[2]
    if not use_matmul_path(query, key, value, attention_mask, dropout and module.training):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    r = h // kvh
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        # query i sits at key position k - q + i
        allowed = torch.ones(q, k, dtype=torch.bool, device=query.device).tril(k - q) if causal and q > 1 else None
    else:
        allowed = attention_mask[:, :, None, :, :k]                           # [b, 1, 1, q, k]
    out = _MatmulAttention.apply(query.reshape(b, kvh, r * q, d), key.contiguous(), value.contiguous(), allowed, r,
                                 d ** -0.5 if scaling is None else scaling)
    # (the values' head size: MLA's (DeepSeek-V2/V3, MiniCPM3) differs from the queries' / keys')
    return out.view(b, h, q, value.shape[-1]).transpose(1, 2).contiguous(), None


def use_matmul_path(query, key, value, attention_mask, dropout) -> bool:
    """Whether :func:`short_attention` takes its matmul path for these inputs (else SDPA)."""
    q, k = query.shape[2], key.shape[2]
    training = torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad)
    return (query.device.type == "cpu" and not dropout and query.shape[1] % key.shape[1] == 0
            and (attention_mask is None or attention_mask.dtype == torch.bool)
            and q * k <= (MAX_SCORES_TRAIN if training else MAX_SCORES))


def register() -> str:
    """Registers :func:`short_attention` (with transformers' SDPA masks) under :data:`NAME`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, short_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def use_attention(model, implementation: str) -> str:
    """Sets ``model``'s attention implementation and returns the name set.

    ``implementation``: ``"short"`` (:func:`short_attention`), ``"auto"`` (``"short"`` for a model
    on the CPU, else the model's own choice, unchanged; ``"eager"`` for a model that soft-caps its attention scores)
    or a transformers name (``"sdpa"``, ``"eager"``, ``"flash_attention_2"``, ...).

    Gemma 2's ``attn_logit_softcapping`` (``cap * tanh(scores / cap)``) is applied by transformers' eager attention
    only: its SDPA (the model's own choice in transformers 5) and :func:`short_attention` left it out, 2.4 nats off
    per token at a cap of 1 (vLLM applies it); ``"short"`` is refused for such a model. So are attention sinks
    (gpt-oss's ``self_attn.sinks``: a per-head logit in each softmax's denominator), which :func:`short_attention`
    left out: 11.6 nats off on the CPU under ``auto`` (tests/test_gpt_oss_path_sweep.py); ``auto`` takes eager there.
    """
    cap = getattr(model.config.get_text_config(), "attn_logit_softcapping", None)
    sinks = any(name.endswith("self_attn.sinks") for name, _ in model.named_parameters())
    if implementation == "short" and (cap or sinks):
        why = f"soft-caps its attention scores (attn_logit_softcapping={cap})" if cap else "has attention sinks"
        raise ValueError(f"the model {why}, which short attention does not: use eager (or auto)")
    if implementation == "auto":
        on_cpu = next(model.parameters()).device.type == "cpu"
        if not on_cpu and not cap:
            return model.config._attn_implementation
        implementation = "eager" if cap or sinks else "short"
    name = register() if implementation == "short" else implementation
    model.set_attn_implementation(name)
    return name
