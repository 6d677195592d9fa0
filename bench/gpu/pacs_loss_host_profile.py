"""Where a synchronised call of the fused PACS loss spends its wall time on a GPU (issue 39, item 3).

    python bench/gpu/pacs_loss_host_profile.py [--out DIR]      # on a CUDA machine (~20 s)
    TRITON_INTERPRET=1 python bench/gpu/pacs_loss_host_profile.py --device cpu --shapes 16x64 --calls 3 --rounds 2
                                                                # the plumbing on a CPU (no figure means anything)

At B=1024, T=4096 and B=8192, T=1024 (fp32, groups of 8), a ladder of synchronised wall times (median of
``--rounds`` rounds x ``--calls`` calls; the rungs alternated round by round, so a drifting clock hits them alike):

  copy            ``logp``'s bytes copied by torch: the issue's yardstick (target: the loss within 2x of it)
  torch_autograd  ``x.sum()`` forward + backward: one aten op each way and the autograd engine (on CUDA the engine
                  hands the backward to its device thread and waits): what any eager loss pays at least
  fused_no_launch the fused loss's forward + backward with its Triton kernels replaced by nothing: our Python
                  (checks, launch plans, allocations), the autograd Function and the engine, no launch
  fused_empty     the same with each kernel replaced by an empty kernel of the same signature (launched with the
                  same arguments): the above plus Triton's launcher, still no device work
  fused_fwd       the real forward alone (graph built, no backward)
  fused           the real forward + backward (what bench/bench_pacs_loss.py times)

so that ``fused_empty - fused_no_launch`` is Triton's launcher, ``fused - fused_empty`` the device time left on the
critical path, and ``fused_no_launch - torch_autograd`` ours. Then, after ``--busy-ms`` of matmuls queued on the GPU
(a step whose GPU is busy, the normal case inside a training step): ``busy_none`` (the matmuls alone), ``busy_copy``
and ``busy_fused``; ``busy_fused - busy_none`` is what the loss adds to such a step (its host time hides behind the
queue when it is shorter than the queue). Last, cProfile of 100 calls (the host's functions by their own time).

Prints a table per shape and writes ``host_ladder.json`` to ``--out`` (when given). bench/bench_pacs_loss_host.py
measures the host path on any machine, kernels stubbed; bench/bench_pacs_loss.py the device time and a CUDA graph's
replay.
"""
from __future__ import annotations

import argparse
import cProfile
import contextlib
import importlib.util
import inspect
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402

KERNELS = ("_pacs_one_pass_kernel", "_pacs_sums_kernel", "_pacs_group_kernel", "_pacs_bwd_kernel")
RUNGS = ("copy", "torch_autograd", "fused_no_launch", "fused_empty", "fused_fwd", "fused")
BUSY = ("busy_none", "busy_copy", "busy_fused")


def empty_kernels(module) -> dict:
    """``{name: an empty @triton.jit kernel with the parameters of module.name}`` for each of :data:`KERNELS`:
    launched with the same arguments, it costs Triton's launcher the same argument handling and no device work.
    Written to a temporary file and imported (Triton reads a kernel's source)."""
    lines = ["import triton", "import triton.language as tl", ""]
    for name in KERNELS:
        params = inspect.signature(getattr(module, name).fn).parameters.values()  # (JIT or interpreted alike)
        args = ", ".join(p.name + (": tl.constexpr" if "constexpr" in str(p.annotation) else "") for p in params)
        lines += ["@triton.jit", f"def {name}({args}):", "    pass", ""]
    folder = tempfile.mkdtemp(prefix="pacs_empty_kernels_")
    path = os.path.join(folder, "pacs_empty_kernels.py")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    spec = importlib.util.spec_from_file_location("pacs_empty_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {name: getattr(mod, name) for name in KERNELS}


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *a, **k: None


@contextlib.contextmanager
def kernels_swapped(module, replacement: dict):
    """The PACS loss's kernels replaced by ``replacement`` (name -> kernel) for the block."""
    saved = {name: getattr(module, name) for name in KERNELS}
    try:
        for name, k in replacement.items():
            setattr(module, name, k)
        yield
    finally:
        for name, k in saved.items():
            setattr(module, name, k)


def loss_inputs(B: int, T: int, device: str):
    """``(logp [B, T] requiring grad, logp_ref, a float mask, 0/1 rewards [B])``, fp32, seeded."""
    g = torch.Generator(device=device).manual_seed(0)
    logp = (-torch.rand(B, T, device=device, generator=g)).requires_grad_()
    ref = -torch.rand(B, T, device=device, generator=g)
    mask = (torch.rand(B, T, device=device, generator=g) > 0.2).float()
    return logp, ref, mask, (torch.rand(B, device=device, generator=g) > 0.5).float()


def ladder(B: int, T: int, device: str, calls: int, rounds: int, busy_ms: float) -> dict:
    """Median synchronised wall time (ms) of each rung of the module docstring at ``B x T`` on ``device``."""
    import pacs_fast.kernels.pacs_loss as KP
    from pacs_fast.ops.pacs_loss import fused_pacs_loss

    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    logp, ref, mask, r = loss_inputs(B, T, device)
    dst = torch.empty_like(logp)
    x = torch.zeros(B, T, device=device, requires_grad=True)
    n = 4096 if cuda else 64
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16 if cuda else torch.float32)

    def fwd_bwd():
        fused_pacs_loss(logp, ref, mask, r, group_size=8).backward()
        logp.grad = None

    def fwd():
        fused_pacs_loss(logp, ref, mask, r, group_size=8)

    def torch_autograd():
        x.sum().backward()
        x.grad = None

    def copy():
        dst.copy_(logp.detach())

    empty = empty_kernels(KP)
    nothing = {name: _NoLaunch() for name in KERNELS}
    calls_of = {
        "copy": (copy, None), "torch_autograd": (torch_autograd, None), "fused_no_launch": (fwd_bwd, nothing),
        "fused_empty": (fwd_bwd, empty), "fused_fwd": (fwd, None), "fused": (fwd_bwd, None),
    }
    # the queued work: matmuls of a fixed size, as many as take about busy_ms (timed once)
    a @ a  # (the first call sets the library up)
    sync()
    t0 = time.perf_counter()
    for _ in range(4):
        a @ a
    sync()
    per = max((time.perf_counter() - t0) / 4, 1e-6)
    n_mm = max(1, round(busy_ms * 1e-3 / per))

    def queue():
        for _ in range(n_mm):
            a @ a
    busy_of = {"busy_none": lambda: None, "busy_copy": copy, "busy_fused": fwd_bwd}

    samples = {k: [] for k in RUNGS + BUSY}
    for rnd in range(rounds + 1):  # round 0 warms every rung up (compiles, caches), untimed
        for name in RUNGS:
            fn, swap = calls_of[name]
            with kernels_swapped(KP, swap) if swap else contextlib.nullcontext():
                for _ in range(calls if rnd else 2):
                    sync()
                    t0 = time.perf_counter()
                    fn()
                    sync()
                    if rnd:
                        samples[name].append(time.perf_counter() - t0)
        for name in BUSY:
            for _ in range(calls if rnd else 1):
                sync()
                t0 = time.perf_counter()
                queue()
                busy_of[name]()
                sync()
                if rnd:
                    samples[name].append(time.perf_counter() - t0)
    row = {"B": B, "T": T, "device": device, "calls": calls, "rounds": rounds, "busy_matmuls": n_mm,
           "busy_matmul_n": n}
    for name, s in samples.items():
        row[f"{name}_ms"] = 1e3 * statistics.median(s)
        row[f"{name}_samples_ms"] = [round(1e3 * v, 4) for v in s]
    row["triton_launcher_ms"] = row["fused_empty_ms"] - row["fused_no_launch_ms"]
    row["device_on_path_ms"] = row["fused_ms"] - row["fused_empty_ms"]
    row["ours_over_autograd_ms"] = row["fused_no_launch_ms"] - row["torch_autograd_ms"]
    row["fused_vs_copy"] = row["fused_ms"] / row["copy_ms"]
    row["busy_added_by_fused_ms"] = row["busy_fused_ms"] - row["busy_none_ms"]
    row["busy_added_by_copy_ms"] = row["busy_copy_ms"] - row["busy_none_ms"]
    return row


def format_row(row: dict) -> str:
    lines = [f"B={row['B']} T={row['T']} ({row['device']}; medians of {row['rounds']} x {row['calls']} "
             f"synchronised calls, ms):"]
    for name in RUNGS + BUSY:
        lines.append(f"  {name:<16} {row[name + '_ms']:9.4f}")
    lines.append(f"  Triton's launcher (fused_empty - fused_no_launch)      {row['triton_launcher_ms']:9.4f}")
    lines.append(f"  device time on the path (fused - fused_empty)          {row['device_on_path_ms']:9.4f}")
    lines.append(f"  ours beyond x.sum()'s autograd (no_launch - autograd)  {row['ours_over_autograd_ms']:9.4f}")
    lines.append(f"  fused / copy                                           {row['fused_vs_copy']:9.2f}x")
    lines.append(f"  added to a busy GPU's step ({row['busy_matmuls']} matmuls queued): fused "
                 f"{row['busy_added_by_fused_ms']:.4f}, copy {row['busy_added_by_copy_ms']:.4f}")
    return "\n".join(lines)


def profile_calls(B: int, T: int, device: str, n: int = 100) -> str:
    """cProfile of ``n`` synchronised forward + backward calls: the host's functions by their own time."""
    from pacs_fast.ops.pacs_loss import fused_pacs_loss
    logp, ref, mask, r = loss_inputs(B, T, device)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fused_pacs_loss(logp, ref, mask, r, group_size=8).backward()
        logp.grad = None
    if device == "cuda":
        torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
    return text.getvalue()[:6000]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: the plumbing only (with TRITON_INTERPRET=1; the times mean nothing)")
    ap.add_argument("--shapes", default="1024x4096,8192x1024", help="BxT pairs, comma-separated")
    ap.add_argument("--calls", type=int, default=30, help="synchronised calls per rung per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--busy-ms", type=float, default=2.0, help="matmul time queued before the busy_* rungs")
    ap.add_argument("--profile-calls", type=int, default=100, help="cProfiled calls per shape (0: none)")
    ap.add_argument("--out", default=None, help="folder for host_ladder.json")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu/pacs_loss_host_profile.py: no CUDA device (--device cpu runs the plumbing)", file=sys.stderr)
        return 2
    try:
        shapes = [tuple(int(v) for v in s.lower().split("x")) for s in args.shapes.split(",")]
        if any(len(s) != 2 or min(s) < 1 or s[0] % 8 for s in shapes):
            raise ValueError
    except ValueError:
        ap.error(f"--shapes: BxT pairs with B a multiple of 8 (groups of 8), got {args.shapes!r}")
    if min(args.calls, args.rounds) < 1:
        ap.error("--calls and --rounds must be >= 1")
    env = {"torch": torch.__version__, "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    rows = []
    for B, T in shapes:
        row = ladder(B, T, args.device, args.calls, args.rounds, args.busy_ms)
        rows.append(row)
        if args.out:  # after every shape (a run cut off by its time limit keeps the shapes it finished)
            from pacs_fast.files import write_text_atomic
            os.makedirs(args.out, exist_ok=True)
            write_text_atomic(os.path.join(args.out, "host_ladder.json"), json.dumps({"env": env, "rows": rows},
                                                                                      indent=1))
        print(format_row(row), flush=True)
        if args.profile_calls > 0:
            print(profile_calls(B, T, args.device, args.profile_calls), flush=True)
    if args.out:
        print(f"wrote {os.path.join(args.out, 'host_ladder.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
