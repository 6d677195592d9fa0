"""PLACEHOLDER (naive, materialises [N, V]); replaced by the fused chunked op of issue 3."""
from __future__ import annotations

import torch


def linear_logprobs(hidden, weight, labels, *, bias=None, temperature=1.0, ignore_index=-100,
                    return_entropy=False, tp_group=None, backend="auto"):
    """logp[...] (fp32) of ``labels`` under ``softmax((hidden @ weight.T + bias) / temperature)``.

    hidden [..., H], weight [V, H], labels [...] int64. Rows with ``ignore_index`` give 0.
    Returns logp, or (logp, entropy) with ``return_entropy``.
    """
    logits = (hidden.float() @ weight.float().T)
    if bias is not None:
        logits = logits + bias.float()
    logits = logits / temperature
    lsm = torch.log_softmax(logits, dim=-1)
    valid = labels != ignore_index
    safe = torch.where(valid, labels, torch.zeros_like(labels))
    logp = lsm.gather(-1, safe.unsqueeze(-1)).squeeze(-1) * valid
    if not return_entropy:
        return logp
    ent = -(lsm.exp() * lsm).sum(-1) * valid
    return logp, ent
