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


def main(pairs: list[str]) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
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
    run(args.workdir)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
