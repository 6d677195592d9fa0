"""Benchmark: grouped PACS loss, forward + backward (d loss / d logp), on this machine.

Methods:
  torch  pacs_fast.algorithms.pacs_loss(backend="torch"): the vectorised PyTorch reference
         (masked row sums, group view, BCE; autograd backward)
  fused  pacs_fast.ops.pacs_loss.fused_pacs_loss: the fused Triton kernels (CUDA only; under
         TRITON_INTERPRET=1 on CPU the kernels run in a Python interpreter, which is a
         correctness tool, not a speed figure, so the CPU run leaves this column out)
  loop   a straightforward implementation with a Python loop over the groups (as often found in
         research code), for B <= --loop-max-b

Inputs: logp / logp_ref [B, T] (--dtype, default fp32), bool mask with response lengths drawn
uniformly in [T/4, T], 0/1 rewards, G = each of --group-size. Shapes: --shapes (BxT pairs), else
every --B x --T; with neither, CPU runs B in 256,1024,8192 x T in 512,4096 at G = 8, and
--device cuda runs issue 22's targets, B=1024, T=4096 and B=8192, T=1024 at G = 8, 16, 64. Time: best (min) of --repeat
forward+backward calls after --warmup untimed calls (CUDA: synchronised); the JSON also has
the median. "GB/s" (CUDA, fused) counts the minimum traffic:
forward reads logp, logp_ref, mask; backward reads mask and writes dlogp.
"copy_ms": the floor measured in the same run, a device copy moving that same traffic (half read,
half written); "fused_vs_copy" = fused / copy time, "copy_bw_fraction" its inverse (issue 22's
target: >= 0.5 at B=1024, T=4096 and B=8192, T=1024). These are synchronised wall-clock times: at
these sizes they are mostly the host's launch latency (Python, autograd, two or three Triton launches;
first GPU run, bench/results/gpu/20261126_h200/: ~1 ms against ~25 us of kernels).
"*_gpu_us" (CUDA): the device time per call, the sum of its kernels' durations from the CUDA
profiler (:func:`kernel_time`), for copy, torch and fused alike; "gpu_bw_fraction" = copy_gpu_us /
fused_gpu_us, the share of the copy's bandwidth the fused kernels reach on the device.
"fused_graph_ms" (CUDA, ``--no-graph`` drops it): the fused forward + backward captured once in a CUDA graph,
each replay synchronised (:func:`time_graph_replay`): what a captured step pays for the loss, without the host's
Python, autograd and Triton launches; "graph_vs_copy" its ratio to the copy (issue 39's wall-time target: <= 2).
"err": max |fused - torch| over the loss and dlogp (when both ran); "graph_err": replay against eager fused.
"fused_2pass_*": the fused loss with its forward forced to pass A + pass B (``pacs_loss_launch.CONFIG["ONE_PASS"] = 0``),
beside "fused" (the launch config's choice: the one-launch forward at these shapes), wall and device time.

Usage (prints a table, writes JSON to bench/results/pacs_loss_<device>_<time>.json):

    python bench/bench_pacs_loss.py                      # CPU: torch vs loop
    python bench/bench_pacs_loss.py --device cuda        # + the fused kernels, issue 22's shapes
    python bench/bench_pacs_loss.py --B 256,1024 --T 512 --score grpo --repeat 10
    python bench/bench_pacs_loss.py --device cuda --shapes 1024x4096 --group-size 8
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "gpu"))
from cuda_profile import device_events  # noqa: E402


def make_inputs(B, T, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    logp = (-3.0 * torch.rand(B, T, generator=g)).to(dtype)
    logp_ref = (logp.float() + 0.1 * torch.randn(B, T, generator=g)).to(dtype)
    lengths = torch.randint(max(1, T // 4), T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    rewards = (torch.rand(B, generator=g) > 0.5).float()
    return [t.to(device) for t in (logp, logp_ref, mask, rewards)]


def loop_pacs_loss(logp, logp_ref, mask, rewards, *, group_size, beta=1.0, score="rloo",
                   weight_mode="question", proxy="logratio"):
    """PACS loss with a Python loop over groups (hard 0/1 rewards; rloo / grpo; question weights)."""
    B, G = logp.shape[0], group_size
    total = logp.new_zeros((), dtype=torch.float32)
    for g0 in range(0, B, G):
        sl = slice(g0, g0 + G)
        m = mask[sl].float()
        x = logp[sl].float()
        if proxy == "logratio":
            r = beta * ((x - logp_ref[sl].float()) * m).sum(1)
        else:
            r = beta * (x * m).sum(1) / m.sum(1).clamp(min=1)
        if score == "rloo":
            psi = r - (r.sum() - r) / (G - 1)
        else:
            psi = (r - r.mean()) / (r.std() + 1e-6)
        R = rewards[sl]
        n_pos = R.sum()
        n_neg = (1 - R).sum()
        if weight_mode == "question" and n_pos > 0 and n_neg > 0:
            w = R * G / (2 * n_pos) + (1 - R) * G / (2 * n_neg)
        else:
            w = torch.ones_like(R)
        total = total + (w * (F.softplus(psi) - R * psi)).sum()
    return total / B


def get_method(name):
    if name == "torch":
        from pacs_fast.algorithms.pacs import pacs_loss
        return lambda *a, **k: pacs_loss(*a, backend="torch", **k)
    if name == "fused":
        from pacs_fast.ops.pacs_loss import fused_pacs_loss
        return fused_pacs_loss
    if name == "fused_2pass":  # the fused loss with its forward forced to pass A + pass B (A/B of the one-pass)
        from pacs_fast.kernels import pacs_loss_launch as KPL
        from pacs_fast.ops.pacs_loss import fused_pacs_loss

        def two_pass(*a, **k):
            saved, KPL.CONFIG["ONE_PASS"] = KPL.CONFIG["ONE_PASS"], 0
            try:
                return fused_pacs_loss(*a, **k)
            finally:
                KPL.CONFIG["ONE_PASS"] = saved
        return two_pass
    if name == "loop":
        return loop_pacs_loss
    raise ValueError(name)


def fwd_bwd_call(fn, inputs, kw):
    """``(once, x)``: ``once()`` runs one forward + backward of ``fn`` w.r.t. a leaf copy ``x`` of logp."""
    logp, logp_ref, mask, rewards = inputs
    x = logp.detach().clone().requires_grad_(True)

    def once():
        x.grad = None
        loss = fn(x, logp_ref, mask, rewards, **kw)
        loss.backward()
        return loss
    return once, x


def time_fwd_bwd(fn, inputs, kw, repeat, device, warmup=2):
    once, x = fwd_bwd_call(fn, inputs, kw)
    for _ in range(max(1, warmup)):  # warm-up (and Triton compile)
        loss = once()
    times = []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        once()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times), loss.detach(), x.grad.detach().clone()


def time_graph_replay(fn, inputs, kw, repeat):
    """``fn``'s forward + backward captured once in a CUDA graph (after a warm-up on a side stream), then the
    synchronised wall time of replaying it: ``(best s, median s, loss, grad)``. What a step captured in a graph
    pays for the loss: the kernels and one graph launch, none of the host's Python, autograd or Triton
    launcher (issue 39 item 3; ``tests/test_cuda_graph.py`` checks a replay equals an eager call)."""
    once, x = fwd_bwd_call(fn, inputs, kw)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            once()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = once()
    times = []
    for _ in range(repeat + 2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        graph.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times[2:]), statistics.median(times[2:]), loss.detach().clone(), x.grad.detach().clone()


def kernel_time(call, iters: int) -> float | None:
    """Device time (s) per ``call()``: the sum of the durations of the GPU kernels (and copies /
    memsets) it launches, read from the CUDA profiler (CUPTI) over ``iters`` calls after one
    warm-up, divided by ``iters``. What the call costs the GPU when the host runs ahead (a training
    step's normal case, or a CUDA graph), without the host's launch latency that the synchronised
    wall-clock columns include. None without CUDA (or a working profiler): no device-time column."""
    events = device_events(call, iters)
    us = sum(us for _, us in events) if events else 0.0
    return us * 1e-6 if us > 0 else None


def copy_buffers(traffic_bytes: int, device: str):
    """A device copy that moves ``traffic_bytes`` in all (reads half, writes half): the memory-speed
    floor of a kernel with that much minimum traffic."""
    n = max(1, traffic_bytes // 2)
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    return src, torch.empty_like(src)


def copy_floor(traffic_bytes: int, device: str, repeat: int) -> float:
    """Best synchronised wall time (s) of :func:`copy_buffers`' copy, measured in the same run."""
    src, dst = copy_buffers(traffic_bytes, device)
    times = []
    for _ in range(repeat + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times[2:])


CPU_B, CPU_T, CPU_G = "256,1024,8192", "512,4096", "8"
TARGET_SHAPES, TARGET_G = "1024x4096,8192x1024", "8,16,64"  # issue 22: >= 0.5 of the copy's bandwidth


def bench_shapes(args):
    """[(B, T)] and [G] to run (see the module docstring for the defaults)."""
    cuda = args.device == "cuda"
    if args.shapes is not None and (args.B is not None or args.T is not None):
        sys.exit("give either --shapes or --B / --T")
    if args.shapes is not None:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
    elif args.B is None and args.T is None and cuda:
        shapes = [tuple(int(v) for v in s.split("x")) for s in TARGET_SHAPES.split(",")]
    else:
        shapes = [(int(b), int(t)) for b in (args.B or CPU_B).split(",") for t in (args.T or CPU_T).split(",")]
    groups = [int(g) for g in (args.group_size or (TARGET_G if cuda else CPU_G)).split(",")]
    bad = [(B, G) for B, _ in shapes for G in groups if B % G]
    if bad:
        sys.exit(f"B must be a multiple of every G: {bad}")
    return shapes, groups


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--B", default=None, help="comma list (default: see --shapes)")
    ap.add_argument("--T", default=None, help="comma list (default: see --shapes)")
    ap.add_argument("--shapes", default=None,
                    help="BxT pairs, e.g. 1024x4096,8192x1024 (default with neither --B nor --T: "
                         f"CPU every B in {CPU_B} x T in {CPU_T}; cuda {TARGET_SHAPES})")
    ap.add_argument("--group-size", default=None,
                    help=f"comma list of G (default: CPU {CPU_G}, cuda {TARGET_G})")
    ap.add_argument("--score", default="rloo", choices=["rloo", "grpo"])
    ap.add_argument("--proxy", default="logratio", choices=["logratio", "mean_logp"])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads (CPU); 1 gives steadier numbers on a busy machine")
    ap.add_argument("--loop-max-b", type=int, default=1024)
    ap.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                    help="with --device cuda: also time the fused loss's forward + backward replayed from a CUDA "
                         "graph (fused_graph_ms, graph_vs_copy)")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/...)")
    ap.add_argument("--fused-interpreted", action="store_true",
                    help="CPU: also run the fused kernels under TRITON_INTERPRET=1 (tiny shapes; "
                         "checks the path and the error column, the time means nothing)")
    args = ap.parse_args(argv)

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device here")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.fused_interpreted and args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before pacs_fast.kernels defines its kernels
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    with_fused = args.device == "cuda" or args.fused_interpreted
    methods = ["torch", "loop"] + (["fused", "fused_2pass"] if with_fused else [])
    shapes, groups = bench_shapes(args)
    rows = []
    out = args.out or os.path.join(HERE, "results",
                                   f"pacs_loss_{args.device}_{time.strftime('%Y%m%d-%H%M%S')}.json")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    meta = dict(vars(args), torch=torch.__version__, threads=torch.get_num_threads(),
                gpu=torch.cuda.get_device_name() if args.device == "cuda" else None)

    def write():  # after every row, atomically (a run cut off by a time limit keeps the rows it finished)
        from pacs_fast.files import write_text_atomic  # (here: after TRITON_INTERPRET is set)
        write_text_atomic(out, json.dumps(dict(meta=meta, rows=rows), indent=1))
    for B, T in shapes:
        inputs = make_inputs(B, T, dtype, args.device)
        for G in groups:
            kw = dict(group_size=G, score=args.score, proxy=args.proxy)
            row = dict(B=B, T=T, G=G, tokens=int(inputs[2].sum()))
            results = {}
            for name in methods:
                if name == "loop" and B > args.loop_max_b:
                    continue
                t, t_med, loss, grad = time_fwd_bwd(get_method(name), inputs, kw, args.repeat,
                                                    args.device, args.warmup)
                results[name] = (loss, grad)
                row[f"{name}_ms"] = 1e3 * t
                row[f"{name}_median_ms"] = 1e3 * t_med
                if args.device == "cuda" and name != "loop":
                    kt = kernel_time(fwd_bwd_call(get_method(name), inputs, kw)[0], args.repeat)
                    if kt is not None:
                        row[f"{name}_gpu_us"] = 1e6 * kt
                if args.device == "cuda" and name == "fused" and args.graph:
                    g_best, g_med, g_loss, g_grad = time_graph_replay(get_method(name), inputs, kw, args.repeat)
                    row["fused_graph_ms"], row["fused_graph_median_ms"] = 1e3 * g_best, 1e3 * g_med
                    row["graph_err"] = max(float((g_loss.double() - loss.double()).abs()),
                                           float((g_grad.double() - grad.double()).abs().max()))
            elt = inputs[0].element_size()
            traffic = B * T * (2 * elt + 1) + B * T * (1 + elt)
            row["copy_ms"] = 1e3 * copy_floor(traffic, args.device, args.repeat)
            row["torch_vs_copy"] = row["torch_ms"] / row["copy_ms"]
            if args.device == "cuda":
                src, dst = copy_buffers(traffic, args.device)
                kt = kernel_time(lambda: dst.copy_(src), args.repeat)
                del src, dst
                if kt is not None:
                    row["copy_gpu_us"] = 1e6 * kt
                if "fused_gpu_us" in row and "copy_gpu_us" in row:
                    row["fused_gpu_GBps"] = traffic / (row["fused_gpu_us"] * 1e-6) / 1e9
                    row["gpu_bw_fraction"] = row["copy_gpu_us"] / row["fused_gpu_us"]
            if "fused" in results:
                row["fused_GBps"] = traffic / (row["fused_ms"] * 1e-3) / 1e9
                row["fused_vs_copy"] = row["fused_ms"] / row["copy_ms"]
                row["copy_bw_fraction"] = row["copy_ms"] / row["fused_ms"]
                row["speedup_vs_torch"] = row["torch_ms"] / row["fused_ms"]
                if "fused_graph_ms" in row:
                    row["graph_vs_copy"] = row["fused_graph_ms"] / row["copy_ms"]
                (lf, gf), (lt, gt) = results["fused"], results["torch"]
                row["err"] = max(float((lf.double() - lt.double()).abs()),
                                 float((gf.double() - gt.double()).abs().max()))
            if "loop" in results:
                row["loop_over_torch"] = row["loop_ms"] / row["torch_ms"]
            rows.append(row)
            write()
            # each row as it is done in the log too
            print("row " + json.dumps({k: (float(f"{v:.5g}") if isinstance(v, float) else v) for k, v in row.items()}),
                  flush=True)
            del results
        del inputs
        if args.device == "cuda":
            torch.cuda.empty_cache()

    cols = ["B", "T", "G", "copy_ms", "torch_ms", "torch_vs_copy", "loop_ms", "loop_over_torch", "fused_ms",
            "speedup_vs_torch", "fused_GBps", "fused_vs_copy", "copy_bw_fraction", "copy_gpu_us", "torch_gpu_us",
            "fused_gpu_us", "fused_gpu_GBps", "gpu_bw_fraction", "fused_graph_ms", "graph_vs_copy", "err",
            "graph_err", "fused_2pass_ms", "fused_2pass_gpu_us"]
    cols = [c for c in cols if any(c in r for r in rows)]
    print(f"PACS loss fwd+bwd, device={args.device}, dtype={args.dtype}, G={','.join(map(str, groups))}, "
          f"score={args.score}, proxy={args.proxy}, torch {torch.__version__}, "
          f"threads={torch.get_num_threads()}, best of {args.repeat}")
    print(" | ".join(f"{c:>16}" for c in cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "-")
            cells.append(f"{v:>16.3g}" if isinstance(v, float) else f"{v!s:>16}")
        print(" | ".join(cells))
    if args.device == "cpu" and args.fused_interpreted:
        print("fused: ran under the Triton interpreter: its time is NOT a speed figure")
    elif args.device == "cpu":
        print("fused: not timed on CPU (the Triton interpreter is a correctness tool, not a speed "
              "figure); run with --device cuda on a GPU machine")

    write()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
