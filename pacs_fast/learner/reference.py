"""Moving a fixed reference policy to the current one: a hard reset (PACS's ``algo.ref=fixed``, ProRL's
reference reset for a baseline's KL penalty) or TRL's soft update (``sync_ref_model`` with
``ref_model_mixup_alpha``): ``reference <- mix * policy + (1 - mix) * reference``, weight by weight.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch


@torch.no_grad()
def mix_into(reference: Iterable[tuple[str, torch.Tensor]], policy: Iterable[tuple[str, torch.Tensor]],
             mix: float) -> None:
    """Moves each reference tensor to ``mix * policy + (1 - mix) * reference`` in place (``mix = 1``: a copy).

    ``reference`` / ``policy``: ``(name, tensor)`` pairs of the same names, shapes and order (one model's
    ``named_parameters`` and its copy's); any dtype, the mix computed in float32 (or float64 for float64
    tensors) and rounded once into the reference's dtype, so a bf16 reference moves by ``mix`` of the gap,
    not by bf16's steps. ValueError on a mismatch (nothing is changed then) or on ``mix`` outside (0, 1].
    """
    if not 0.0 < mix <= 1.0:
        raise ValueError(f"mix_into: mix must be in (0, 1], got {mix}")
    pairs = list(zip(reference, policy, strict=True))
    for (name_ref, ref), (name, p) in pairs:
        if name_ref != name or ref.shape != p.shape:
            raise ValueError(f"mix_into: the reference's {name_ref} {tuple(ref.shape)} does not match the policy's "
                             f"{name} {tuple(p.shape)}")
    for (_, ref), (_, p) in pairs:
        if mix == 1.0 or not ref.is_floating_point():
            ref.copy_(p)
        else:
            wide = torch.float64 if ref.dtype == torch.float64 else torch.float32
            ref.copy_(torch.lerp(ref.to(wide), p.to(wide), mix))
