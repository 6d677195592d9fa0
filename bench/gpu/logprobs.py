"""GPU benchmark of the fused log-prob kernels: time, achieved TFLOP/s, workspace, error.

Run on a CUDA machine (first measured on an H100: bench/results/gpu/20261124_h100/):

    python bench/gpu/logprobs.py                                  # N=8192, H=4096, V=151936, bf16
    python bench/gpu/logprobs.py --shapes 4096x896x151936,8192x4096x151936 --dtype bf16
    python bench/gpu/logprobs.py --device cpu --shapes 64x64x1000  # smoke test of the script

Methods: ``pacs_triton`` (the default: the GEMM-shaped tiled forward kernel, chunked GEMM backward: a
Triton dz chunk + two cuBLAS GEMMs per vocab chunk; where the tuned table holds a measured kernel choice,
the kernels it names; each row records its ``forward_kind`` / ``dz_kind``), ``pacs_triton_tiles`` (the
tiled forward and the pointer dz kernel whatever the table says), ``pacs_triton_split`` (the same with the
earlier split forward, ``CONFIG["FWD"] = "split"``, for comparison), ``pacs_triton_tma`` (the persistent
TMA kernels, ``CONFIG["FWD"] = "tma"`` and ``CONFIG["DLOGITS"] = "tma"``, kernels/linear_logprobs_tma.py;
on a GPU before sm_90 they fall back to the tiled forward and the pointer dz kernel), ``pacs_triton_gluon`` (the
warp-specialised Gluon kernels, ``CONFIG["FWD"] = "gluon"`` and ``CONFIG["DLOGITS"] = "gluon"``,
kernels/linear_logprobs_gluon.py: the forward and the chunked backward's dz kernel; Hopper only, elsewhere
the tiled forward and the pointer dz kernel; ``pacs_triton_gluon_fwd`` / ``_dz``: one of the two;
``pacs_triton_gluon_pp``: both with their ping-pong launches (``PINGPONG_CONFIGS``); not in the
default list: bench/gpu/lease.sh adds them once their float64 checks have passed on the GPU, since a broken
mbarrier protocol hangs instead of failing), ``pacs_triton_atomic`` (the default forward, the one-pass
atomic backward kernel), ``pacs_triton_upcast`` (the learner's ``model.lm_head_fp32``: bf16 inputs through the
fp32 kernels, ``upcast=True``; not in the default list), ``pacs_torch`` (the chunked torch backend on cuBLAS),
``naive`` (matmul -> log_softmax -> gather, entropy; skipped when [N, V] would not fit),
``liger_flce`` (Liger fused linear cross-entropy, loss only, no entropy) when installed, ``cce`` / ``cce_exact``
(Apple's cut-cross-entropy, loss only: with its default gradient filter ``filter_eps="high"``, which skips the
gradient of logits whose probability is negligible, or with none; a 22 KB wheel, bench/gpu/wheels.sh) when
installed. A method name ending in
``_softcap`` (``pacs_triton_softcap``, ``pacs_torch_softcap``; not in the default list) runs it with Gemma 2's
soft-capped logits (``softcap=30``: the tiled kernels with their 64-wide capped launches, or the torch path), its
error against the capped float64 reference, e.g. ``--shapes 8192x2304x256000 --methods
pacs_triton,pacs_triton_softcap,pacs_torch_softcap`` (Gemma 2 2B's head).

FLOPs counted per call: forward ``2*N*H*V`` (one GEMM); forward+backward ``8*N*H*V`` for
methods that recompute logits in the backward (pacs_*: logits, recompute, dhidden, dweight) and
``6*N*H*V`` for naive and Liger FLCE (no recompute); the table reports TFLOP/s on the *useful*
``6*N*H*V`` too, so methods are comparable. Time: median of ``--iters`` CUDA-event timed calls
after warm-up. Workspace: ``torch.cuda.max_memory_allocated`` during one forward+backward minus
memory allocated before it minus the returned gradients. Error (``max_err``): max |method - float64 reference|
of the log-probs, the entropies and both gradients (``dh``, ``dW``) of the benchmark's loss, over every row and
column at the benchmarked shape, i.e. of exactly the launches timed (bench/gpu/logprob_checks.py; each with
``*_scale``, the reference's largest magnitude, for the relative error; ~1-2 s of float64 GEMMs per method at the
main shape on an H200). Each row also keeps the raw samples of every timing (``samples_ms``: the method's and its
adjacent floors') and the SM clock read before and after each timing (``sm_clock_mhz``: NVML or nvidia-smi;
None where neither answers), and its ratios to the shape's shared floors beside the adjacent ones
(``fwd_vs_shared_gemm``, ``fwd_bwd_vs_shared_4gemm``): every method against the same milliseconds.

Floors, measured in the same run at each shape (:func:`gemm_floor`): ``torch.matmul`` for the
forward's one GEMM and for the four GEMMs of a recomputing forward + backward. Every method's row
carries ``fwd_vs_gemm`` (forward time / one GEMM) and ``fwd_bwd_vs_4gemm`` (forward + backward / four
GEMMs); issue 22's targets are <= 1.10 for both at N=8192, H=4096, V=151,936, bf16. The ratios use
the floor timed in alternation with the method (GEMM, method, GEMM, method, ...: medians of each,
``gemm_fwd_ms_adjacent`` / ``gemm4_ms_adjacent``): on the first H200 run the same forward measured
16.9 and 18.5 ms depending on where in the run it was timed, against one floor measured at the start.

``--profile`` adds, per ``pacs_triton*`` method, its device time per kernel from the CUDA profiler
(``fwd_kernels``, ``fwd_bwd_kernels``: the tile kernels against the merge, the cuBLAS GEMMs and the
glue), the breakdown the first H200 run needed a hand-written profile for.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from cuda_profile import device_events  # noqa: E402
from logprob_checks import format_errors, reference_errors, sm_clock_mhz  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _inputs(n, h, v, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g)).to(device=device, dtype=dtype)
    weight = (torch.randn(v, h, generator=g) / h ** 0.5 * 2).to(device=device, dtype=dtype)
    labels = torch.randint(0, v, (n,), generator=g).to(device)
    gl = torch.randn(n, generator=g).to(device)
    gh = torch.randn(n, generator=g).to(device)
    return hidden, weight, labels, gl, gh


def _method(name):
    cap = SOFTCAP if name.endswith("_softcap") else None  # Gemma 2's soft-capped logits
    base = name.removesuffix("_softcap")
    if base == "pacs_torch" or base.startswith("pacs_triton") and (base in KERNEL_CHOICES or base in (
            "pacs_triton", "pacs_triton_atomic", "pacs_triton_upcast")):
        from pacs_fast.ops.linear_logprobs import linear_logprobs
        backend = base.split("_")[1]
        bwd = "atomic" if base.endswith("atomic") else "chunked"
        upcast = base == "pacs_triton_upcast"  # the learner's model.lm_head_fp32: bf16 inputs, fp32 kernels

        def fwd(h, w, y):  # the forward / dz kernel choices are set around the whole case (bench_case)
            return linear_logprobs(h, w, y, return_entropy=True, backend=backend, triton_backward=bwd, softcap=cap,
                                   upcast=upcast)
        return fwd, True
    if name in ("cce", "cce_exact"):  # Apple's cut-cross-entropy (loss only): its default gradient filter, or none
        from cut_cross_entropy import linear_cross_entropy
        eps = "high" if name == "cce" else None

        def fwd(h, w, y):
            return -linear_cross_entropy(h, w, y, reduction="sum", filter_eps=eps), None
        return fwd, False
    if name == "naive":
        def fwd(h, w, y):
            lsm = torch.log_softmax((h @ w.T).float(), -1)
            return lsm.gather(1, y[:, None]).squeeze(1), -(lsm.exp() * lsm).sum(-1)
        return fwd, False
    if name == "liger_flce":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        loss = LigerFusedLinearCrossEntropyLoss(reduction="sum")

        def fwd(h, w, y):
            return -loss(w, h, y), None
        return fwd, False
    raise ValueError(name)


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _event_time(fn, device):
    """Seconds of one ``fn()``: CUDA events around it (synchronised), else the host clock."""
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / 1e3


def _time(fn, iters, device):
    """The seconds of ``iters`` calls of ``fn`` (the raw samples; callers take the median)."""
    return [_event_time(fn, device) for _ in range(iters)]


def _time_alternating(fa, fb, iters, device):
    """The seconds of ``fa`` and ``fb`` timed in alternation (a, b, a, b, ...; raw samples, callers take the
    medians): a clock or power state that drifts during the run moves both alike, so their ratio stays fair."""
    ta, tb = [], []
    for _ in range(iters):
        ta.append(_event_time(fa, device))
        tb.append(_event_time(fb, device))
    return ta, tb


def _clocked(timing, device):
    """``timing()``'s result and the SM clock (MHz) read before and after it (``[before, after]``; None
    entries off-GPU or where no reader answers: bench/gpu/logprob_checks.py)."""
    before = sm_clock_mhz() if device == "cuda" else None
    result = timing()
    return result, [before, sm_clock_mhz() if device == "cuda" else None]


def _ms(samples):
    return [round(t * 1e3, 4) for t in samples]


def kernel_shares(events, top: int = 8) -> list[dict]:
    """``[{"kernel", "us", "share"}]`` from ``(name, microseconds)`` pairs: durations summed per name,
    the ``top`` largest first, the rest as one ``"(other)"`` row; shares of the total."""
    per: dict[str, float] = {}
    for name, us in events:
        per[name] = per.get(name, 0.0) + us
    total = sum(per.values()) or 1.0
    ranked = sorted(per.items(), key=lambda kv: -kv[1])
    rows = [{"kernel": k[:80], "us": round(v, 1), "share": round(v / total, 4)} for k, v in ranked[:top]]
    rest = sum(v for _, v in ranked[top:])
    if rest:
        rows.append({"kernel": "(other)", "us": round(rest, 1), "share": round(rest / total, 4)})
    return rows


def kernel_breakdown(fn, calls: int = 2) -> list[dict] | None:
    """Where one ``fn()``'s device time goes: the CUDA profiler's kernel (and copy / memset) durations
    over ``calls`` calls after one warm-up, per kernel name, in microseconds per call (``kernel_shares``).
    None off-GPU or when the profiler does not work there."""
    events = device_events(fn, calls)
    return None if events is None else kernel_shares(events)


SOFTCAP = 30.0  # the ``*_softcap`` methods: Gemma 2's final_logit_softcapping (the tiled kernels / the torch path)
KERNEL_CHOICES = {"pacs_triton_split": dict(FWD="split"), "pacs_triton_tma": dict(FWD="tma", DLOGITS="tma"),
                  "pacs_triton_gluon": dict(FWD="gluon", DLOGITS="gluon"),
                  "pacs_triton_gluon_fwd": dict(FWD="gluon", DLOGITS="pointer"),
                  "pacs_triton_gluon_dz": dict(FWD="tiles", DLOGITS="gluon"),
                  "pacs_triton_gluon_pp": dict(FWD="gluon", DLOGITS="gluon", PINGPONG=1),
                  "pacs_triton_tiles": dict(FWD="tiles", DLOGITS="pointer")}


def bench_case(name, n, h, v, dtype, device, iters, floor_calls=None, profile=False):
    """One method's row; ``KERNEL_CHOICES[name]`` is set in kernels/linear_logprobs.py's ``CONFIG``
    for the whole case (forward and backward) and restored after."""
    choices = KERNEL_CHOICES.get(name.removesuffix("_softcap"), {})
    if not choices:
        return _bench_case(name, n, h, v, dtype, device, iters, floor_calls, profile)
    from pacs_fast.kernels import linear_logprobs as K
    saved = {k: K.CONFIG[k] for k in choices}
    K.CONFIG.update(choices)
    try:
        return _bench_case(name, n, h, v, dtype, device, iters, floor_calls, profile)
    finally:
        K.CONFIG.update(saved)


def _bench_case(name, n, h, v, dtype, device, iters, floor_calls=None, profile=False):
    fwd, recompute = _method(name)
    hidden, weight, labels, gl, gh = _inputs(n, h, v, dtype, device)
    hidden.requires_grad_(), weight.requires_grad_()

    def f_only():
        with torch.no_grad():
            fwd(hidden, weight, labels)

    def f_b():
        hidden.grad = weight.grad = None
        logp, ent = fwd(hidden, weight, labels)
        loss = (logp * gl).sum() if logp.dim() else logp
        if ent is not None:
            loss = loss + (ent * gh).sum()
        loss.backward()

    for _ in range(2):  # warm-up: compilation / autotuning / allocator
        f_b()
    _sync(device)
    if device == "cuda":
        hidden.grad = weight.grad = None
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        f_b()
        _sync(device)
        grads = hidden.grad.numel() * hidden.grad.element_size() + weight.grad.numel() * weight.grad.element_size()
        peak = torch.cuda.max_memory_allocated()
        workspace = peak - before - grads
    else:
        workspace = peak = float("nan")
    adjacent, samples, clocks = {}, {}, {}
    if floor_calls is None:
        samples["fwd"], clocks["fwd"] = _clocked(lambda: _time(f_only, iters, device), device)
        samples["fwd_bwd"], clocks["fwd_bwd"] = _clocked(lambda: _time(f_b, iters, device), device)
    else:  # each method's time next to the floor, alternating: the ratios do not depend on run order
        one, four = floor_calls
        (samples["gemm_fwd_adjacent"], samples["fwd"]), clocks["fwd"] = _clocked(
            lambda: _time_alternating(one, f_only, iters, device), device)
        (samples["gemm4_adjacent"], samples["fwd_bwd"]), clocks["fwd_bwd"] = _clocked(
            lambda: _time_alternating(four, f_b, iters, device), device)
        g1, g4 = statistics.median(samples["gemm_fwd_adjacent"]), statistics.median(samples["gemm4_adjacent"])
    t_f, t_fb = statistics.median(samples["fwd"]), statistics.median(samples["fwd_bwd"])
    if floor_calls is not None:
        adjacent = {"gemm_fwd_ms_adjacent": g1 * 1e3, "gemm4_ms_adjacent": g4 * 1e3,
                    "fwd_vs_gemm": t_f / g1, "fwd_bwd_vs_4gemm": t_fb / g4}
    if profile and device == "cuda":  # where the device time goes, per kernel (forward; forward + backward)
        adjacent["fwd_kernels"] = kernel_breakdown(f_only)
        adjacent["fwd_bwd_kernels"] = kernel_breakdown(f_b)
    flop = 2 * n * h * v
    # float64 errors of exactly the launches timed above: the forward and both gradients at this shape
    hidden.grad = weight.grad = None
    f_b()
    with torch.no_grad():
        logp, ent = fwd(hidden, weight, labels)
        ones = logp.dim() == 0  # a loss-only method (Liger, cut-cross-entropy): f_b's loss is sum_i logp_i
        err = reference_errors(logp, ent, hidden, weight, labels, torch.ones_like(gl) if ones else gl,
                               torch.zeros_like(gh) if ones else gh, hidden.grad, weight.grad,
                               softcap=SOFTCAP if name.endswith("_softcap") else None)
    hidden.grad = weight.grad = None
    return {"method": name, "N": n, "H": h, "V": v, "dtype": str(dtype).split(".")[-1],
            "fwd_ms": t_f * 1e3, "fwd_bwd_ms": t_fb * 1e3,
            "samples_ms": {k: _ms(x) for k, x in samples.items()}, "sm_clock_mhz": clocks,
            "fwd_tflops": flop / t_f / 1e12,
            "fwd_bwd_tflops_executed": (4 if recompute else 3) * flop / t_fb / 1e12,
            "fwd_bwd_tflops_useful": 3 * flop / t_fb / 1e12,
            "workspace_gb": workspace / 1e9, "peak_gb": peak / 1e9, "max_err": err, **adjacent,
            **_kernel_kinds(name, hidden, weight)}


def _launch_str(lc):
    """``128x256x64 w8 s3 G16`` (+ the other knobs that are set) of a launch_config dict."""
    rest = " ".join(f"{k}={v}" for k, v in lc.items() if k not in ("kernel", "BLOCK_N", "BLOCK_V", "BLOCK_H", "GROUP_N",
                                                                    "num_warps", "num_stages") and v)
    return (f"{lc['BLOCK_N']}x{lc['BLOCK_V']}x{lc['BLOCK_H']} w{lc['num_warps']} s{lc['num_stages']} "
            f"G{lc['GROUP_N']}" + (f" {rest}" if rest else ""))


def _kernel_kinds(name, hidden, weight):
    """Which forward and dz kernel a ``pacs_triton*`` method selected (``pacs_triton``: the measured
    choice of the tuned table where there is one; a kernel also falls back per input, see
    kernels/linear_logprobs.py), and their launch parameters at this shape (the tuned table's
    measurement at the nearest hidden size, where it has one)."""
    if not name.startswith("pacs_triton"):
        return {}
    from pacs_fast.kernels import linear_logprobs as K
    dtype = torch.float32 if name == "pacs_triton_upcast" else hidden.dtype  # (upcast: the fp32 kernels run)
    arch, width, h = K.device_arch(hidden.device), K._width(dtype), hidden.shape[1]
    fwd, dz = K.forward_kind(arch, width, h), K.dz_kind(arch, width, h)
    capped = name.endswith("_softcap")  # (a capped call runs the tiled kernels, with their capped launches)
    if capped:
        fwd, dz = ("split" if fwd == "split" else "tiles"), "pointer"
    kernels = {"forward": K.FORWARD_KERNEL[fwd], "dz": K.DZ_KERNEL[dz]}
    launch = {job: dict(kernel=k, **K.launch_config(k, N=hidden.shape[0], V=weight.shape[0], H=h,
                                                    dtype=dtype, arch=arch)) for job, k in kernels.items()}
    if capped:
        from pacs_fast.kernels.linear_logprobs_launch import capped_config
        launch = {job: capped_config(lc) for job, lc in launch.items()}
    return {"forward_kind": fwd, "dz_kind": dz, "launch": launch}


def gemm_floor(n, h, v, dtype, device, iters, max_bytes):
    """The floors measured in the same run: ``torch.matmul`` (cuBLAS on CUDA) for the forward's one
    GEMM (``[N, H] @ [H, V]``) and for the four GEMMs a recomputing forward + backward executes
    (logits, logits again, ``dh = dz @ W``, ``dW = dz^T @ h``), in ``dtype``. When the ``[N, V]``
    operands (two of them) would pass ``max_bytes``, the vocabulary is cut into chunks and the chunk
    times summed (``chunks`` in the result)."""
    hidden, weight, _, _, _ = _inputs(n, h, v, dtype, device, seed=1)
    chunks = max(1, int(-(-2 * n * v * hidden.element_size() // max_bytes)))
    step = -(-v // chunks)
    parts = [weight[i:i + step] for i in range(0, v, step)]
    bufs = [(torch.empty(n, w.shape[0], dtype=dtype, device=device), torch.empty(n, w.shape[0], dtype=dtype,
             device=device).normal_()) for w in parts]
    dh = torch.empty(n, h, dtype=dtype, device=device)
    dw = [torch.empty_like(w) for w in parts]

    def one():
        for w, (z, _) in zip(parts, bufs):
            torch.matmul(hidden, w.T, out=z)

    def four():
        for k, (w, (z, dz)) in enumerate(zip(parts, bufs)):
            torch.matmul(hidden, w.T, out=z)   # forward logits
            torch.matmul(hidden, w.T, out=z)   # recomputed in the backward
            torch.matmul(dz, w, out=dh)        # dh (accumulated over chunks in a real kernel)
            torch.matmul(dz.T, hidden, out=dw[k])

    for _ in range(2):
        four()
    _sync(device)
    (s1, s4), clock = _clocked(lambda: (_time(one, iters, device), _time(four, iters, device)), device)
    t1, t4 = statistics.median(s1), statistics.median(s4)
    flop = 2 * n * h * v
    return {"N": n, "H": h, "V": v, "gemm_fwd_ms": t1 * 1e3, "gemm4_ms": t4 * 1e3, "chunks": chunks,
            "gemm_tflops": flop / t1 / 1e12, "gemm4_tflops": 4 * flop / t4 / 1e12,
            "samples_ms": {"gemm_fwd": _ms(s1), "gemm4": _ms(s4)}, "sm_clock_mhz": clock}, (one, four)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="8192x4096x151936")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--methods", default="pacs_triton,pacs_triton_tma,pacs_triton_split,pacs_triton_atomic,pacs_torch,"
                                         "naive,liger_flce")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when a pacs_* method did not run (the GPU suite: never skip silently)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--naive-max-bytes", type=float, default=40e9,
                    help="skip naive when its fp32 [N, V] copies (~4 of them) exceed this")
    ap.add_argument("--profile", action="store_true",
                    help="also record each method's device time per kernel (CUDA profiler), forward and "
                         "forward + backward: the tile kernels against the glue around them")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: this script reports GPU numbers only (use --device cpu "
                         "for a smoke test of the script itself)")
    dtype = DTYPES[args.dtype]
    rows = []
    floors = []
    dev = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    out = args.out or os.path.join(HERE, "..", "results",
                                   time.strftime("gpu_logprobs_%Y%m%d_%H%M%S.json"))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    def write():  # after every row (atomically): a run cut off by its time limit keeps the rows it measured
        from pacs_fast.files import write_text_atomic
        write_text_atomic(out, json.dumps({"device": dev, "torch": torch.__version__, "floors": floors,
                                           "rows": rows}, indent=1))
    for shape in args.shapes.split(","):
        n, h, v = (int(x) for x in shape.lower().split("x"))
        floor, floor_calls = gemm_floor(n, h, v, dtype, args.device, args.iters, args.naive_max_bytes / 2)
        floors.append(floor)
        chunked = "" if floor["chunks"] == 1 else f" in {floor['chunks']} vocab chunks"
        print(f"{'floor':12s} {shape}: one GEMM {floor['gemm_fwd_ms']:.2f} ms ({floor['gemm_tflops']:.0f} TFLOP/s), "
              f"four GEMMs {floor['gemm4_ms']:.2f} ms ({floor['gemm4_tflops']:.0f} TFLOP/s){chunked}", flush=True)
        for m in args.methods.split(","):
            if m == "naive" and 4 * 4 * n * v > args.naive_max_bytes:
                rows.append({"method": m, "N": n, "H": h, "V": v, "unavailable": "[N, V] copies too large"})
            elif m.startswith("pacs_triton") and args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
                rows.append({"method": m, "N": n, "H": h, "V": v, "unavailable": "CPU without TRITON_INTERPRET=1"})
            else:
                try:
                    rows.append(bench_case(m, n, h, v, dtype, args.device, args.iters, floor_calls,
                                           profile=args.profile and m.startswith("pacs_triton")))
                except Exception as e:  # noqa: BLE001 - reported in the table
                    rows.append({"method": m, "N": n, "H": h, "V": v,
                                 "unavailable": f"{type(e).__name__}: {str(e)[:120]}"})
            r = rows[-1]
            if "unavailable" not in r:  # ratios to the shared floors of this shape (every method against the same)
                r["fwd_vs_shared_gemm"] = r["fwd_ms"] / floor["gemm_fwd_ms"]
                r["fwd_bwd_vs_shared_4gemm"] = r["fwd_bwd_ms"] / floor["gemm4_ms"]
                r.setdefault("fwd_vs_gemm", r["fwd_vs_shared_gemm"])  # (no adjacent floor: the shared one)
                r.setdefault("fwd_bwd_vs_4gemm", r["fwd_bwd_vs_shared_4gemm"])
            write()
            if "unavailable" in r:
                print(f"{m:12s} {shape}: unavailable ({r['unavailable']})", flush=True)
            else:
                near = (f" (its adjacent floors {r['gemm_fwd_ms_adjacent']:.2f} / {r['gemm4_ms_adjacent']:.2f} ms; "
                        f"shared: {r['fwd_vs_shared_gemm']:.2f}x / {r['fwd_bwd_vs_shared_4gemm']:.2f}x)"
                        if "gemm_fwd_ms_adjacent" in r else "")
                print(f"{m:12s} {shape}: fwd {r['fwd_ms']:.2f} ms = {r['fwd_vs_gemm']:.2f}x one GEMM "
                      f"({r['fwd_tflops']:.0f} TFLOP/s)  fwd+bwd {r['fwd_bwd_ms']:.2f} ms = "
                      f"{r['fwd_bwd_vs_4gemm']:.2f}x four GEMMs (executed {r['fwd_bwd_tflops_executed']:.0f}, "
                      f"useful {r['fwd_bwd_tflops_useful']:.0f} TFLOP/s){near}  workspace {r['workspace_gb']:.3f} GB  "
                      f"SM MHz {r['sm_clock_mhz']}  float64 err {format_errors(r['max_err'])}", flush=True)
                if r.get("launch"):  # which kernels ran, with which tiles (a tuned table's choice at this shape)
                    print("    " + "; ".join(f"{job} {lc['kernel']} {_launch_str(lc)}" for job, lc in r["launch"].items()),
                          flush=True)
                for part in ("fwd_kernels", "fwd_bwd_kernels"):
                    if r.get(part):
                        print(f"    {part}: " + "; ".join(f"{k['kernel'][:40]} {k['us'] / 1e3:.2f} ms "
                                                        f"({k['share']:.0%})" for k in r[part]), flush=True)
    write()
    print(f"wrote {out}")
    failed = [r["method"] for r in rows if "unavailable" in r and r["method"].startswith("pacs_")]
    if args.strict and failed:
        raise SystemExit(f"FAILED: {failed} did not run: " + "; ".join(
            r["unavailable"] for r in rows if r["method"] in failed))


if __name__ == "__main__":
    main()
