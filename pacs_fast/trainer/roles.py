"""The two roles of an asynchronous launch and their process groups.

    torchrun --nproc_per_node R+L -m pacs_fast.train rollout.ranks=R rollout.max_staleness=K ...

Processes ``0..R-1`` run rollout engines, ``R..R+L-1`` the learner. Each role gets a default process
group of its own (its *world*), so every library finds the layout it would find in a launch of that
role alone: vLLM's tensor-parallel engines (``external_launcher``) build their groups on the engines'
world, megatron-core its parallel state on the learner's, and ``RANK`` / ``WORLD_SIZE`` in the
environment are set to the role's own. A third group, the *bridge*, spans every process; it is not
registered as a default group and carries only the point-to-point messages between the learner's
first process and the engines (:mod:`pacs_fast.rollout.remote`).

All three rendezvous on torchrun's own store (``MASTER_ADDR:MASTER_PORT``, which torchrun's agent
hosts), under keys of their own. The bridge is gloo (the weights travel as CPU tensors); a role's
world is gloo on CPU and ``cpu:gloo,cuda:nccl`` with CUDA.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

_TIMEOUT = datetime.timedelta(minutes=30)


@dataclass
class Roles:
    """This process's place in an asynchronous launch (bridge ranks = torchrun ranks)."""

    role: str  # "engine" | "learner"
    rank: int  # in the bridge (= torchrun's RANK)
    bridge: dist.ProcessGroup
    engine_ranks: list[int]
    learner_ranks: list[int]

    @property
    def driver(self) -> int:
        """The bridge rank of the learner's first process (it alone talks to the engines)."""
        return self.learner_ranks[0]

    @property
    def is_driver(self) -> bool:
        return self.rank == self.driver


def _store() -> dist.Store:
    """torchrun's store (its agent hosts it; ``TORCHELASTIC_USE_AGENT_STORE``), or one that rank 0
    hosts at ``MASTER_ADDR:MASTER_PORT`` under another launcher."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(host, port, world, is_master=not agent and rank == 0, timeout=_TIMEOUT)
    return dist.PrefixStore(f"pacs_fast/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def split_launch(engine_ranks: int) -> Roles:
    """Creates the bridge and this role's world (see the module docstring) from torchrun's
    environment; ``engine_ranks`` = R. Needs ``WORLD_SIZE > R`` and no process group yet."""
    if dist.is_initialized():
        raise RuntimeError("split_launch: a process group exists already; the roles need their own")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    R = int(engine_ranks)
    if not 1 <= R < world:
        raise ValueError(f"rollout.ranks={R} needs 1 <= R < WORLD_SIZE={world}")
    store = _store()
    bridge = dist.ProcessGroupGloo(dist.PrefixStore("bridge", store), rank, world, _TIMEOUT)
    role = "engine" if rank < R else "learner"
    local, size = (rank, R) if role == "engine" else (rank - R, world - R)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    os.environ.update(RANK=str(local), WORLD_SIZE=str(size), PACS_FAST_LAUNCH_RANK=str(rank),
                      PACS_FAST_LAUNCH_WORLD_SIZE=str(world))
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", store=dist.PrefixStore(role, store),
                            rank=local, world_size=size, timeout=_TIMEOUT)
    return Roles(role=role, rank=rank, bridge=bridge, engine_ranks=list(range(R)),
                 learner_ranks=list(range(R, world)))


def close_roles() -> None:
    """Destroys this role's world if it is still there (vLLM's shutdown may have done it)."""
    if dist.is_initialized():
        dist.destroy_process_group()
