"""The parts of a Hugging Face causal LM (``*ForCausalLM``) the library reaches into: its decoder body
(hidden states without the head), its LM head, and whether its train-mode forward differs from eval.

Used by the learner (log-probs from hidden states + head), the rollout engines (the fp32 head) and the
warm-up (its SFT loss). Each raises a ValueError naming the model's class when the part is missing.
"""
from __future__ import annotations

import torch


def decoder_body(model) -> torch.nn.Module:
    """The transformer body of a ``*ForCausalLM`` (``model.model`` for Qwen2 / Llama, else
    ``get_decoder()``): called with ``input_ids`` it returns ``last_hidden_state`` ``[B, T, H]``."""
    body = getattr(model, "model", None)
    if body is None and hasattr(model, "get_decoder"):
        body = model.get_decoder()
    if body is None:
        raise ValueError(f"{type(model).__name__} has no decoder body (model.model)")
    return body


def lm_head(model) -> torch.nn.Module:
    """The model's output embedding (``get_output_embeddings()``) with a ``weight`` tensor ``[V, H]``
    (and ``bias`` ``[V]`` or None)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise ValueError(f"{type(model).__name__} has no LM head with a weight (get_output_embeddings())")
    return head


def has_active_dropout(model) -> bool:
    """Whether train-mode forwards differ from eval-mode ones: a dropout module with p > 0, or a
    config dropout probability > 0 (Hugging Face attention dropout is a config value, not a module)."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules()):
        return True
    cfg = getattr(model, "config", None)
    items = cfg.to_dict().items() if hasattr(cfg, "to_dict") else ()
    return any(("dropout" in k or "pdrop" in k) and isinstance(v, (int, float)) and not isinstance(v, bool)
               and v > 0 for k, v in items)
