"""CPU compatibility for megatron-core 0.16 (used only when no CUDA GPU is present).

megatron-core assumes a GPU in a few hard-coded places; these are the only redirections this
project makes, all in this module, all applied by :func:`apply_cpu_compat`, which does nothing
when ``torch.cuda.is_available()``:

1. ``torch.cuda.current_device()`` returns ``torch.device("cpu")``. megatron allocates its
   communication and workspace buffers with ``device=torch.cuda.current_device()`` (tensor-parallel
   mappings, layers, attention, rotary embeddings); on a CPU-only torch the call raises, so no
   other code can rely on it — redirecting it makes those buffers CPU tensors that gloo can reduce.
2. megatron's model-parallel RNG tracker (``tensor_parallel.get_cuda_rng_tracker``) saves and
   restores the *CUDA* generator around dropout. On CPU it is replaced by megatron's own no-op
   "inference" tracker (its ``fork()`` is a null context). Dropout is 0 in this project's models
   (exact TP parity needs it), so no random stream is consumed inside the tracker anyway.
3. megatron's activation recomputation (``tensor_parallel.checkpoint``, used with
   ``gradient_checkpointing``) saves and restores the "CUDA" RNG state through
   ``tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state``; on CPU these read and
   write the CPU generator's state (the generator the recomputed ops actually use).

The learner uses plain ``torch.optim.AdamW`` on the local shards on CPU (with the tensor-parallel
aware gradient norm of :mod:`pacs_fast.learner.megatron.learner`), so megatron's optimizer, its
``device="cuda"`` tensors and its fp32 grad-clip CUDA type assertion are not needed here.
"""
from __future__ import annotations

import torch

_APPLIED = False
_ORIGINAL_CURRENT_DEVICE = torch.cuda.current_device
_ORIGINAL_RNG_FUNCS: dict = {}


def cpu_compat_needed() -> bool:
    """True when there is no usable CUDA device (the redirections are needed)."""
    return not torch.cuda.is_available()


def _cpu_current_device() -> torch.device:
    return torch.device("cpu")


def _cpu_get_rng_state(device=None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state: torch.Tensor, device=None, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def apply_cpu_compat() -> bool:
    """Apply the redirections above if no GPU is present; idempotent.

    Call it after ``torch.distributed`` and megatron's ``parallel_state`` are set up (or before:
    the order does not matter) and before building a model. Returns True when applied.
    """
    global _APPLIED
    if not cpu_compat_needed():
        return False
    if _APPLIED:
        return True
    torch.cuda.current_device = _cpu_current_device
    from megatron.core.tensor_parallel import random as mcore_random

    mcore_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    _ORIGINAL_RNG_FUNCS.update(get=mcore_random._get_cuda_rng_state, set=mcore_random._set_cuda_rng_state)
    mcore_random._get_cuda_rng_state = _cpu_get_rng_state
    mcore_random._set_cuda_rng_state = _cpu_set_rng_state
    _APPLIED = True
    return True


def undo_cpu_compat() -> None:
    """Undo :func:`apply_cpu_compat` (original functions, a fresh default megatron RNG tracker)."""
    global _APPLIED
    if not _APPLIED:
        return
    torch.cuda.current_device = _ORIGINAL_CURRENT_DEVICE
    from megatron.core.tensor_parallel import random as mcore_random

    mcore_random.initialize_rng_tracker(force_reset=True)
    mcore_random._get_cuda_rng_state = _ORIGINAL_RNG_FUNCS["get"]
    mcore_random._set_cuda_rng_state = _ORIGINAL_RNG_FUNCS["set"]
    _APPLIED = False
