"""Every process of a torchrun launch checks in once its settings resolve, before any process group forms.

A process that fails before the processes have connected (a file its node lacks, another command line) used to
leave the others waiting in ``init_process_group`` until its timeout (30 minutes): they cannot know. Here each
process, its settings resolved, adds itself to a count in torchrun's own store (its agent hosts it,
``TORCHELASTIC_USE_AGENT_STORE``, so it is there whichever worker failed) and waits until the count is the
launch's size; one that fails first posts its message there (:func:`report_failure`), and the waiting ones stop
with it (:class:`PeerFailed`) instead of waiting. Under any other launcher, or when the store cannot be reached,
nothing is checked (as before). Keys are per restart attempt of the launch.
"""
from __future__ import annotations

import datetime
import os
import time

POLL_S = 0.2
CONNECT_TIMEOUT = datetime.timedelta(seconds=60)


class PeerFailed(RuntimeError):
    """Another process of the launch failed before the launch connected: ``rank`` and its ``message``."""

    def __init__(self, rank: str, message: str):
        self.rank, self.message = rank, message
        super().__init__(f"rank {rank} could not start: {message}")


def _store():
    """The launch's check-in store (a ``PrefixStore`` over torchrun's agent store), or None (no torchrun agent
    store, a single process, or it cannot be reached)."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true" or int(env.get("WORLD_SIZE", "1") or 1) < 2:
        return None
    try:
        import torch.distributed as dist

        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]), is_master=False,
                              timeout=CONNECT_TIMEOUT)
        return dist.PrefixStore(f"pacs_fast/checkin/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    except Exception:  # noqa: BLE001 - no check-in rather than a new way to fail
        return None


def report_failure(message: str, store=None) -> None:
    """Posts this process's failure (``RANK``, ``message``) for the others waiting in :func:`wait_for_peers`;
    best effort."""
    store = store if store is not None else _store()
    if store is None:
        return
    try:
        store.set("failed", f"{os.environ.get('RANK', '0')}\n{message}")
    except Exception:  # noqa: BLE001
        pass


def wait_for_peers(store=None, *, world: int | None = None) -> None:
    """Counts this process in and returns when all ``world`` (``WORLD_SIZE``) have checked in; raises
    :class:`PeerFailed` as soon as one has posted a failure. Returns at once without a store."""
    store = store if store is not None else _store()
    if store is None:
        return
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    try:
        store.add("arrived", 1)
        while store.add("arrived", 0) < world:
            if store.check(["failed"]):
                break
            time.sleep(POLL_S)
        if not store.check(["failed"]):
            return
        rank, _, message = store.get("failed").decode("utf-8", "replace").partition("\n")
    except Exception:  # noqa: BLE001 - the store went away: the process group's own wait follows, as before
        return
    raise PeerFailed(rank, message)
