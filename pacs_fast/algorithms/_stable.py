"""Forms the losses share, arranged so that fp32 keeps the accuracy the quantity allows.

An audit of fp32 against float64 (the same inputs cast up) found textbook forms cancelling:

- ``g - mean(g)`` over a group of (nearly) equal values: :func:`centred_in_groups` (PACS's scores, the
  baselines' group advantages).
- ``softplus(psi) - y psi`` (PACS's BCE with logits) for a confident sample: at ``psi = 16, y = 1``
  softplus rounds to 16 and the loss comes out 0 (true 1.1e-7); autograd's ``sigmoid(psi) - y`` is
  34% off there. :func:`bce_with_logits` takes the linear part exactly and adds ``log1p(e^-|psi|)``.
- ``e^d - 1 - d`` (the k3 KL estimator, also logged as ``approx_kl`` and ``correction/kl_k3``) for a
  small log-ratio: ``expm1(d) - d`` keeps ``eps / |d|`` relative (100% at ``|d| = 1e-4`` in a mean over
  4k tokens) and its gradient ``(expm1(d) + 1) - 1`` as much. :func:`k3` sums the series below 1/2.
"""
from __future__ import annotations

import math

import torch

# e^d - 1 - d = d^2 (1/2! + d/3! + ... + d^15/17!): below |d| = 1/2 the first left-out term is
# 2 * 0.5^16 / 18! ~ 5e-21 of the value, under fp64's rounding
_K3_COEFFS = tuple(1.0 / math.factorial(n) for n in range(2, 18))
_K3_SERIES_BELOW = 0.5


def centred_in_groups(g: torch.Tensor) -> torch.Tensor:
    """``g [groups, G]`` minus each row's mean, taken in differences from the row's first value (the same
    value, better rounding): a row of equal values centres to exactly 0 instead of +-1 ulp noise, which
    a 1/(std + eps) then amplifies (a GRPO group of eight soft rewards 0.1: |A| up to 0.1)."""
    d = g - g[:, :1].detach()
    return d - d.mean(dim=1, keepdim=True)


def bce_with_logits(psi: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``softplus(psi) - y * psi`` elementwise (any real ``y``; PACS's per-sample loss before its weight):
    ``(1 - y) psi + log1p(e^-psi)`` for ``psi >= 0``, ``-y psi + log1p(e^psi)`` below. Its gradient is
    ``(1 - y) - q`` or ``q - y`` with ``q = e^-|psi| / (1 + e^-|psi|)`` (= ``sigmoid(psi) - y``, without the
    cancellation), and ``1/2 - y`` at ``psi = 0`` (no ``abs``, whose derivative there is 0)."""
    pos = psi >= 0
    neg_abs = torch.where(pos, -psi, psi)
    return torch.where(pos, (1.0 - y) * psi, -y * psi) + torch.log1p(torch.exp(neg_abs))


def _k3_value(d: torch.Tensor) -> torch.Tensor:
    small = d.abs() < _K3_SERIES_BELOW
    ds = torch.where(small, d, 0.0)
    # float64 takes every term; below it the first 9 (left out: 2 * 0.5^9 / 11! ~ 1e-10 of the value)
    coeffs = _K3_COEFFS if d.dtype == torch.float64 else _K3_COEFFS[:9]
    poly = torch.full_like(ds, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        poly = poly * ds + c
    dl = torch.where(small, 1.0, d)  # each branch sees only values it is finite on
    return torch.where(small, ds * ds * poly, torch.expm1(dl) - dl)


class _K3(torch.autograd.Function):
    """The value by the series; the gradient ``expm1(d)`` directly (accurate as it is), saving ``d`` alone
    instead of the series' 15 intermediates of the input's size. Twice differentiable (the backward is torch
    ops) and usable under ``torch.func`` (``setup_context``, a generated vmap rule)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(d):
        return _k3_value(d)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (d,) = ctx.saved_tensors
        return grad * torch.expm1(d)


def k3(d: torch.Tensor) -> torch.Tensor:
    """``e^d - 1 - d`` elementwise, accurate for every ``d``, and its gradient ``e^d - 1``: the series for
    ``|d| < 1/2``, ``expm1(d) - d`` above."""
    return _K3.apply(d) if d.requires_grad else _k3_value(d)
