"""Errors decided by every rank together: a rank that finds a problem does not raise alone (its
peers would wait in the next collective forever); every rank raises, with the lowest failing
rank's message. Imports nothing from the rest of the package, so every layer may use it.
"""
from __future__ import annotations

import torch.distributed as dist


def collective_check(error: str | None) -> None:
    """Raises ``ValueError`` on every rank when any rank passes an ``error`` (collective over the
    default group when it has several ranks), all with the message of the lowest failing rank ``R``:
    that rank's as it is, the others' as ``"rank R: <message>"``. Without a process group (or with one
    rank) it raises ``error`` itself, if any."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if error:
            raise ValueError(error)
        return
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    bad = [(r, e) for r, e in enumerate(errors) if e]
    if bad:
        r, e = bad[0]
        raise ValueError(e if r == dist.get_rank() else f"rank {r}: {e}")
