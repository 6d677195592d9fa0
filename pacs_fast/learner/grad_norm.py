"""The gradient norm the learners record and clip by, exact to fp32 rounding on every device.

``torch.nn.utils.clip_grad_norm_`` takes each gradient's norm with ``torch.linalg.vector_norm``, whose CPU
kernel (torch 2.13) sums the squares of a large fp32 tensor with too little care: 3.6e-4 relative below the
float64 value for 1e7 standard normals, 4.6e-5 on a Qwen2.5-0.5B-shaped model's gradient, where the megatron
learner's norm (``torch.sum`` of the squares, a cascade sum) is within 6e-8 (a real-shape sweep of 2026-11-30
read that as a difference between the learners). On the CPU the norm is therefore the square root of summed
``torch.sum`` of squares; on a GPU torch's own (a tree reduction) is kept, as is the clipping: gradients are
scaled by ``min(1, max_norm / (norm + 1e-6))``.
"""
from __future__ import annotations

import torch


def clip_grad_norm(params, max_norm: float) -> torch.Tensor:
    """Clips the gradients of ``params`` (an iterable of tensors; those without a gradient are left out) to a
    total L2 norm of ``max_norm`` (``inf``: no clipping) and returns the norm before clipping (0-d fp32 tensor,
    non-finite when a gradient is)."""
    params = [p for p in params if p.grad is not None]
    if not params or params[0].grad.device.type != "cpu":
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    total = torch.stack([p.grad.detach().float().pow(2).sum() for p in params]).sum().sqrt()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total
