"""PPO's value head in the megatron learner (``algo.name=ppo``): ``Linear(H, 1)`` on the final hidden states, as
the torch learner's (:class:`~pacs_fast.learner.torch_learner.TorchLearner`).

Its place in a tensor-parallel model: the hidden states that reach it are the whole sequence's on every TP rank
(gathered under sequence parallelism), so the head is replicated, computes the same values on every rank and gets
the same gradient there (no TP reduction; the data-parallel one sums it with the rest). It is in float32 at least
and starts at zero (values 0: GAE's advantages are the returns at the first step), trains at ``learner.critic_lr``
(its own AdamW parameter group) and is counted once in the gradient norm. Checkpoints: the per-rank shard files
keep its weights (:mod:`.state`); the full HF-named state keeps them and their moments under :data:`NAMES`.
"""
from __future__ import annotations

import torch

# the head's parameters in a full state (not Hugging Face weights: the policy's checkpoint folder has none)
NAMES = ("value_head.weight", "value_head.bias")


def make_value_head(hidden_size: int, device, dtype=torch.float32) -> torch.nn.Linear:
    """``Linear(hidden_size, 1)`` with zero weights and bias on ``device`` in ``dtype`` promoted to float32 at least,
    its parameters marked replicated for megatron (``tensor_model_parallel = False``: counted once in the norm)."""
    from megatron.core.tensor_parallel import set_defaults_if_not_set_tensor_model_parallel_attributes

    head = torch.nn.Linear(hidden_size, 1).to(device, dtype=torch.promote_types(dtype, torch.float32))
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    for p in head.parameters():
        set_defaults_if_not_set_tensor_model_parallel_attributes(p)
    return head
