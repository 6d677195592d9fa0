"""Process setup for the megatron learner: ``torch.distributed`` + megatron's parallel state
(:func:`init_parallel`, torn down by :func:`release_parallel`), the tensor-parallel aware gradient norm (:func:`tp_grad_norm`), and the
ranks' joint non-finite check (:func:`raise_if_non_finite`).

Rank layout (megatron's default order, tensor-parallel innermost): global rank
``r = dp_rank * tp_size + tp_rank``; the TP groups are consecutive ranks. vLLM's external-launcher
layout is the same (see :mod:`pacs_fast.rollout.parallel_engines`).
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

# the lazy view of an HF folder's weights, here since the megatron learner was its only reader (now the trainer's
# resume too: pacs_fast.learner.hf_folder)
from pacs_fast.learner.hf_folder import LazyHFCheckpoint  # noqa: F401


# ----------------------------------------------------------------------------- setup helpers
def init_parallel(tp_size: int, *, device: str = "auto") -> torch.device:
    """Initialise ``torch.distributed`` (from torchrun's env, or a 1-process group) and megatron's
    model-parallel state with ``tp_size``; returns this rank's device.

    gloo on CPU, NCCL on CUDA. An existing megatron state must have the same ``tp_size``.
    """
    import warnings

    with warnings.catch_warnings():  # the import announces that TE / Apex are absent (expected)
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
        from megatron.core import parallel_state as ps
        import megatron.core.models.gpt  # noqa: F401

    from pacs_fast.learner.megatron.cpu_compat import apply_cpu_compat

    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} but CUDA is not available")
    if not use_cuda and torch.cuda.is_available():
        raise ValueError(f"device={device!r}: the megatron learner runs on the GPU when one is present "
                         "(its CPU path is only for machines without one); use device='auto'")
    if not dist.is_initialized():
        # plain `python -m pacs_fast.train` (or a second run in the same process): one process, its group on an
        # in-process store (no port to probe and bind later, which another process may take in between)
        alone = "MASTER_ADDR" not in os.environ and os.environ.get("WORLD_SIZE", "1") == "1"
        if alone:
            os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if use_cuda else "gloo",
                                **(dict(store=dist.HashStore(), rank=0, world_size=1) if alone else {}))
    world = dist.get_world_size()
    if tp_size < 1 or world % tp_size:
        raise ValueError(f"learner.tp_size={tp_size} must divide the number of processes ({world})")
    if ps.model_parallel_is_initialized():
        if ps.get_tensor_model_parallel_world_size() != tp_size:
            raise ValueError(f"megatron is already initialised with tp={ps.get_tensor_model_parallel_world_size()}"
                             f", not learner.tp_size={tp_size}")
    else:
        before = set(_groups())
        ps.initialize_model_parallel(tensor_model_parallel_size=tp_size, create_gloo_process_groups=False)
        _MEGATRON_GROUPS[:] = [g for g in _groups() if g not in before]
    if not use_cuda:
        apply_cpu_compat()
    else:
        _seed_model_parallel_rng()
    return torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")


# the process groups megatron's initialize_model_parallel made in init_parallel (release_parallel destroys them)
_MEGATRON_GROUPS: list = []


def _groups() -> list:
    """Every process group torch.distributed holds (none known where its private map is absent)."""
    from torch.distributed import distributed_c10d as c10d

    return list(getattr(getattr(c10d, "_world", None), "pg_map", {}))


def release_parallel() -> None:
    """Tears megatron's model-parallel state down and destroys the process groups :func:`init_parallel` had it make
    (the default group is kept). megatron-core's ``destroy_model_parallel`` drops its references to them but
    destroys only its gloo ones: the rest stayed in torch's map with their transport threads, so each learner made and
    closed in one process left ~25 groups (~50 threads at two ranks, each waking every few ms: a test launch that made
    several reached ~1,500 threads a rank, half a core idle)."""
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
    alive = set(_groups())
    for group in _MEGATRON_GROUPS:  # (created in the same order on every rank; a local shutdown each)
        if group in alive:
            dist.destroy_process_group(group)
    _MEGATRON_GROUPS.clear()


def _seed_model_parallel_rng(seed: int = 0) -> None:
    """On CUDA, megatron's attention forks its model-parallel RNG stream around dropout, and raises
    ("cuda rng state model-parallel-rng is not added") unless ``model_parallel_cuda_manual_seed``
    ran (the first H200 run of the megatron learner, 2026-11-26). Seeded here unless the caller's
    tracker already holds the stream; the CUDA default generator's state is restored (megatron's
    call re-seeds it), so nothing else's random stream moves. Dropout is 0 in this project's
    models: the stream's values are never drawn."""
    from megatron.core import tensor_parallel
    from megatron.core.tensor_parallel import random as mcore_random

    if mcore_random._MODEL_PARALLEL_RNG_TRACKER_NAME in tensor_parallel.get_cuda_rng_tracker().get_states():
        return
    state = torch.cuda.get_rng_state()
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    torch.cuda.set_rng_state(state)


def tp_grad_norm(params, tp_group) -> torch.Tensor:
    """Global L2 norm of the gradients of a tensor-parallel model (fp32 0-d tensor).

    Sharded parameters (megatron's ``tensor_model_parallel`` attribute) contribute their local
    shard on every rank; replicated ones are counted on TP rank 0 only; then one SUM all-reduce.
    """
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    from pacs_fast.learner.grad_norm import local_sq_norm

    grads = [p.grad for p in params if p.grad is not None and param_is_not_tensor_parallel_duplicate(p)]
    sq = local_sq_norm(grads) if grads else torch.zeros((), dtype=torch.float32, device=params[0].device)
    if tp_group is not None and dist.get_world_size(tp_group) > 1:
        dist.all_reduce(sq, group=tp_group)
    return sq.sqrt()


def raise_if_non_finite(steps: int, loss: float, grad_norm: float, optimizer, device) -> None:
    """``NonFiniteError`` on every rank when any rank saw a non-finite loss or gradient norm (one MAX
    all-reduce over the world, so the ranks decide together and none is left waiting); the
    optimiser's gradients are dropped first."""
    import math

    from pacs_fast.learner.base import NonFiniteError

    flags = torch.tensor([float(not math.isfinite(loss)), float(not math.isfinite(grad_norm))], device=device)
    if dist.get_world_size() > 1:
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    if flags.any():
        optimizer.zero_grad(set_to_none=True)
        what = ", ".join(f"{k}={v}" if not math.isfinite(v) else f"{k} (on another rank)"
                         for k, v, f in (("loss", loss, flags[0]), ("grad_norm", grad_norm, flags[1])) if f)
        raise NonFiniteError(steps, what)
