"""Benchmark: the host's share of the fused PACS loss's wall time, on any machine (no GPU needed).

On a GPU a synchronised forward + backward of the fused loss takes 0.5-1.1 ms against ~22 us of kernels
(bench/results/gpu/20261127_h200/): the rest is the host (our Python, autograd, Triton's launcher). This
script times the part that is ours and autograd's: the Triton kernels are replaced by stubs that
launch nothing, so what is left is argument checks, launch plans, allocations, the autograd Function and
the backward engine, per forward + backward call. Columns (microseconds per call, median of --rounds rounds
of --calls calls, the methods alternated round by round):

  fused_host   pacs_fast.ops.fused_pacs_loss forward + backward, kernels stubbed
  launches     Triton kernels one forward + backward launches (each adds Triton's launcher on a GPU)
  torch        pacs_fast.algorithms.pacs_loss(backend="torch") forward + backward (real CPU work)
  clone        logp.clone(): the cheapest op with a tensor result, for scale

Usage: python bench/bench_pacs_loss_host.py [--shapes 64x32,1024x512] [--calls 500] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


LAUNCHES = [0]  # Triton launches the stubs stood in for (each costs Triton's launcher on a GPU, not timed here)


def _stub_kernels():
    import pacs_fast.kernels.pacs_loss as KP
    import pacs_fast.ops.pacs_loss as OP

    class Stub:
        def __getitem__(self, grid):
            LAUNCHES[0] += 1
            return lambda *a, **k: None
    for name in ("_pacs_one_pass_kernel", "_pacs_sums_kernel", "_pacs_group_kernel", "_pacs_bwd_kernel"):
        setattr(KP, name, Stub())
    OP.require_triton = lambda *a: None  # CPU tensors may enter (nothing is launched)


def _per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="64x32,1024x512")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    _stub_kernels()
    from pacs_fast.algorithms import pacs_loss
    from pacs_fast.ops.pacs_loss import fused_pacs_loss
    torch.set_num_threads(1)
    print(f"{'B':>6} {'T':>6} {'fused_host_us':>14} {'launches':>9} {'torch_us':>10} {'clone_us':>9}")
    for shape in args.shapes.split(","):
        B, T = (int(v) for v in shape.split("x"))
        logp, ref = -torch.rand(B, T), -torch.rand(B, T)
        mask, rewards = torch.rand(B, T) > 0.2, (torch.rand(B) > 0.5).float()
        x = logp.clone().requires_grad_()

        def fused():
            x.grad = None  # (else every call after the first adds its gradient into x.grad: a [B, T] add)
            fused_pacs_loss(x, ref, mask, rewards, group_size=args.group_size).backward()

        def torch_path():
            x.grad = None
            pacs_loss(x, ref, mask, rewards, group_size=args.group_size, backend="torch").backward()

        def clone():
            logp.clone()
        methods = {"fused": fused, "torch": torch_path, "clone": clone}
        for fn in methods.values():  # warm-up
            _per_call(fn, 20)
        times = {k: [] for k in methods}
        for _ in range(args.rounds):
            for k, fn in methods.items():
                times[k].append(_per_call(fn, args.calls))
        med = {k: statistics.median(v) for k, v in times.items()}
        LAUNCHES[0] = 0
        fused()
        print(f"{B:>6} {T:>6} {med['fused']:>14.1f} {LAUNCHES[0]:>9} {med['torch']:>10.1f} {med['clone']:>9.1f}")


if __name__ == "__main__":
    main()
