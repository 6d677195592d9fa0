"""Argument checks shared by the algorithm functions.

Every check raises ``ValueError`` whose message starts with the function name and names the
offending argument. Shape/dtype/option checks never synchronise with the device; value checks
(NaN/Inf, reward range) do, which is why they only run when the caller asks for them.
"""
from __future__ import annotations

import numbers
from typing import Sequence

import torch


def check_choice(fn: str, arg: str, value, options: Sequence[str]) -> None:
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{fn}: {arg} must be one of {tuple(options)}, got {value!r}")


def check_tensor(fn: str, arg: str, t, *, ndim: int | Sequence[int] | None = None,
                 floating: bool = False) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{fn}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            raise ValueError(f"{fn}: {arg} must have {' or '.join(map(str, allowed))} dimension(s), "
                             f"got shape {tuple(t.shape)}")
    if floating and not t.is_floating_point():
        raise ValueError(f"{fn}: {arg} must be a floating-point tensor, got {t.dtype}")


def check_same_shape(fn: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    """``t`` has ``ref``'s shape and sits on its device."""
    if t.shape != ref.shape:
        raise ValueError(f"{fn}: {arg} has shape {tuple(t.shape)} but {ref_arg} has shape "
                         f"{tuple(ref.shape)}; they must match")
    check_same_device(fn, arg, t, ref_arg, ref)


def check_same_device(fn: str, arg: str, t: torch.Tensor, ref_arg: str, ref: torch.Tensor) -> None:
    if t.device != ref.device:
        raise ValueError(f"{fn}: {arg} is on {t.device} but {ref_arg} is on {ref.device}")


def check_mask(fn: str, mask, like: torch.Tensor, like_arg: str) -> None:
    """A mask is bool or numeric (0/1), with the shape of ``like``."""
    check_tensor(fn, "mask", mask)
    if mask.is_complex():
        raise ValueError(f"{fn}: mask must be bool or real, got {mask.dtype}")
    check_same_shape(fn, "mask", mask, like_arg, like)


def check_count(fn: str, arg: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``: an integer (numpy integers too), never a float truncated or a bool;
    else a ValueError naming ``fn`` and ``arg``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{fn}: {arg} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_group_size(fn: str, group_size, batch: int, batch_arg: str) -> int:
    group_size = check_count(fn, "group_size", group_size)
    if batch % group_size != 0:
        raise ValueError(f"{fn}: batch size {batch} (from {batch_arg}) is not divisible by "
                         f"group_size={group_size}; groups are contiguous rows of equal size")
    return group_size


def check_real(fn: str, arg: str, value, *, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy scalars are Real too
        raise ValueError(f"{fn}: {arg} must be a real number, got {value!r}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{fn}: {arg} must be finite, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{fn}: {arg} must be > 0, got {value!r}")
    if nonneg and value < 0:
        raise ValueError(f"{fn}: {arg} must be >= 0, got {value!r}")
    return value


def check_finite_values(fn: str, arg: str, t: torch.Tensor, where: torch.Tensor | None = None) -> None:
    """Raises if ``t`` holds NaN/Inf (only at positions where ``where`` is true, if given)."""
    if not t.is_floating_point() or t.device.type == "meta":  # a meta tensor has no values to check
        return
    bad = ~torch.isfinite(t)
    if where is not None:
        bad = bad & where
    if bool(bad.any()):
        raise ValueError(f"{fn}: {arg} contains NaN or Inf" + (" at unmasked positions" if where is not None else ""))


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """fp32 for half/bf16/fp32 inputs, fp64 for fp64 inputs."""
    return torch.promote_types(t.dtype, torch.float32)


def mask_select(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """``x * mask`` that never lets values at masked-out positions (even NaN/Inf) through.

    Bool masks select; numeric masks multiply (0/1 masks select, other values act as weights).
    Gradients at masked-out positions are exactly zero.
    """
    if mask is None:
        return x
    if mask.dtype == torch.bool:
        return torch.where(mask, x, 0.0)
    return torch.where(mask != 0, x * mask.to(x.dtype), 0.0)


def zero_masked(x: torch.Tensor | None, keep: torch.Tensor | None) -> torch.Tensor | None:
    """``x`` with 0 at the positions ``keep`` (bool, broadcastable) leaves out: whatever stands there
    (padding's NaN / Inf included) then never enters a product, so neither the loss nor a gradient
    sees it (``0 * NaN`` in a backward is NaN). None passes through."""
    if x is None or keep is None:
        return x
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype, device=x.device))


def mask_nonzero(mask: torch.Tensor | None) -> torch.Tensor | None:
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask != 0
