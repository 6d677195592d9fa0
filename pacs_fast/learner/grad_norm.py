"""The gradient norm the learners record and clip by, in fp32 and exact to its rounding on every device.

``torch.nn.utils.clip_grad_norm_`` takes each gradient's norm with ``torch.linalg.vector_norm``, whose CPU
kernel (torch 2.13) sums the squares of a large fp32 tensor with too little care: 3.6e-4 relative below the
float64 value for 1e7 standard normals, 4.6e-5 on a Qwen2.5-0.5B-shaped model's gradient, where the megatron
learner's norm (``torch.sum`` of the squares, a cascade sum) is within 6e-8 (a real-shape sweep of 2026-11-30
read that as a difference between the learners); it also returns bf16 gradients' norm in bf16. Here the norm
is always fp32: on the CPU the square root of summed ``torch.sum`` of squares, on a GPU ``vector_norm`` with an
fp32 accumulator (a tree reduction there, no copy of the gradient). Clipping scales the gradients by
``min(1, max_norm / (norm + 1e-6))``, as torch does, in both learners (:func:`scale_to_norm`).
"""
from __future__ import annotations

import math

import torch


def local_sq_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The sum of squares of ``grads`` (0-d fp32 tensor on their device)."""
    if grads[0].device.type == "cpu":
        return torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum()
    return torch.stack([torch.linalg.vector_norm(g.detach(), dtype=torch.float32) for g in grads]).pow(2).sum()


def scale_to_norm(grads: list[torch.Tensor], max_norm: float, total: torch.Tensor) -> None:
    """Scales ``grads`` in place by ``min(1, max_norm / (total + 1e-6))`` (nothing for ``max_norm=inf``)."""
    if math.isinf(max_norm):
        return
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef.to(g.dtype))


def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """Clips the gradients of ``params`` (an iterable of tensors; those without a gradient are left out) to a
    total L2 norm of ``max_norm`` (``inf``: no clipping) and returns the norm before clipping (0-d fp32 tensor,
    non-finite when a gradient is)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float32)
    total = local_sq_norm(grads).sqrt()
    scale_to_norm(grads, max_norm, total)
    return total
