"""The LM head of a Hugging Face causal LM in fp32, for rollouts (``model.lm_head_fp32``).

A bf16 (fp16) head computes its logits with a bf16 GEMM whose output is rounded to bf16: a relative
error of up to 2^-8 per logit (0.06 nat on a logit of 16), while the learner's log-prob op
(:func:`pacs_fast.ops.linear_logprobs.linear_logprobs`) never rounds the logits. Inside
:func:`fp32_lm_head` the head computes ``hidden.float() @ W32.T (+ b32)`` instead, with ``W32`` an
fp32 copy of its weight: products of bf16 values are exact in fp32, so the logits carry only
fp32 accumulation error, as vLLM's ``hf_overrides={"head_dtype": "float32"}`` on the other engine.

How: the head module's ``forward`` is replaced on the instance while the context is open and
restored on exit (also on an error), so everything the model does around its head (the slicing of
``logits_to_keep``, a final soft-cap, ``generate``'s logits processors) is unchanged and the bf16
GEMM is not run. The weight is copied once per context (``V x H`` fp32, 545 MB for a Qwen2.5-0.5B
head, for the duration): open it around one generation call, not across weight updates.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from pacs_fast.causal_lm import lm_head

LOW_PRECISION = (torch.bfloat16, torch.float16)


def fp32_logits(hidden: torch.Tensor, weight32: torch.Tensor, bias32: torch.Tensor | None = None) -> torch.Tensor:
    """``[..., V]`` fp32 logits ``hidden.float() @ weight32.T + bias32`` (``hidden`` ``[..., H]``
    any float dtype; ``weight32`` ``[V, H]`` and ``bias32`` ``[V]`` fp32)."""
    return torch.nn.functional.linear(hidden.float(), weight32, bias32)


@contextlib.contextmanager
def fp32_lm_head(model) -> Iterator[None]:
    """While open, ``model``'s LM head returns fp32 logits computed from fp32 copies of its input
    and weight (see the module docstring). A head that is not bf16/fp16 is left as it is."""
    head = lm_head(model)
    if head.weight.dtype not in LOW_PRECISION:
        yield
        return
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"the fp32 LM head replaces an nn.Linear head; {type(model).__name__} has a "
                         f"{type(head).__name__}")
    with torch.no_grad():
        weight32 = head.weight.detach().float()
        bias32 = head.bias.detach().float() if head.bias is not None else None
    own = head.__dict__.get("forward")  # an instance-level forward already there (e.g. accelerate's hooks)
    head.forward = lambda hidden: fp32_logits(hidden, weight32, bias32)
    try:
        yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own
