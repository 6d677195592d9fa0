"""Runs megatron test workers one after another in one ``torchrun --nproc_per_node 2`` launch (gloo,
CPU; see tests/megatron_launch.py): ``megatron_launch_worker.py MODULE=FOLDER [MODULE=FOLDER ...]``.

Each ``tests/<MODULE>.py`` has ``run(folder)``: it reads ``folder/inputs.pt`` on the default process
group this script creates, rank 0 writes ``folder/results.pt``, and it leaves megatron's model-parallel
state destroyed and every function it spied on restored, so the next worker starts as in a fresh launch.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings

import torch
import torch.distributed as dist

warnings.filterwarnings("ignore")


def release_groups_on_destroy() -> None:
    """Makes megatron-core's ``destroy_model_parallel`` also destroy the process groups it forgets.

    It drops its references to the ~25 groups ``initialize_model_parallel`` made but destroys only its gloo
    ones: the others stay in torch's group map, each keeping its gloo transport threads (a world of two: ~50
    threads a call, each waking every few ms). Every worker and every ``MegatronLearner`` initialises and
    destroys megatron again, so by the last worker of this launch a rank had ~1,500 threads that took ~0.5
    of a core per rank while idle (measured: 2.4 s of CPU per 5 s of sleep) and slowed each worker after
    the first (the launch: ~100 s of CPU less with this). Destroying every group but the default one after
    megatron's teardown is what a fresh launch starts from, as the workers promise (module docstring).
    """
    from megatron.core import parallel_state as ps
    from torch.distributed import distributed_c10d as c10d

    real = ps.destroy_model_parallel
    if getattr(real, "_releases_groups", False):
        return

    def destroy_model_parallel(*args, **kwargs):
        real(*args, **kwargs)
        default = c10d._get_default_group()
        for group in list(c10d._world.pg_map):  # created in the same order on every rank
            if group is not default:
                dist.destroy_process_group(group)

    destroy_model_parallel._releases_groups = True
    ps.destroy_model_parallel = destroy_model_parallel


def main(pairs: list[str]) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    release_groups_on_destroy()
    for pair in pairs:
        name, folder = pair.split("=", 1)
        if dist.get_rank() == 0:
            print(f"=== {name}: {folder}", file=sys.stderr, flush=True)
        importlib.import_module(name).run(folder)
        dist.barrier()
    dist.destroy_process_group()


def run_alone(run) -> None:
    """A worker's ``run`` as the whole launch: ``torchrun --nproc_per_node 2 tests/<worker>.py --workdir F``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    release_groups_on_destroy()
    run(args.workdir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
