"""Benchmark: token log-probs (+ entropy) from hidden states, forward + backward, on this machine.

Each (method, shape) case runs in a fresh subprocess so that its peak memory is its own:

    workspace = peak RSS during forward+backward - RSS before it - returned gradient buffers

(the inputs exist before the baseline is taken; dhidden [N, H] and dweight [V, H] fp32 are the
gradient buffers every method must return). Peak RSS is ``ru_maxrss``
(the process high-water mark); the baseline is taken after a tiny warm-up call of the same
method (which loads libraries and thread pools) and after the inputs were created without
transients. glibc may keep freed small blocks resident, so RSS over-counts rather than
under-counts. Time: best of ``--repeat`` forward+backward calls (``time.perf_counter``).

Error: max |out - float64 reference| of logp, entropy, dhidden (on 256 random rows) and dweight
(on 512 random vocab rows, which depend on every token); the reference runs in its own
subprocess, once per shape, in float64 from the same seeded inputs.

Usage (prints a table, writes JSON to bench/results/logprobs_<time>.json):

    python bench/bench_logprobs.py                       # Qwen2.5-0.5B head, N = 2048 and 4096
    python bench/bench_logprobs.py --shapes 512x896x32000 --methods naive,pacs_torch
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

QWEN05B = (896, 151_936)
METHODS = ("naive", "pacs_torch", "pacs_torch_logp", "pacs_triton", "liger_logprob", "liger_grpo",
           "liger_flce")
DESCRIPTION = {
    "naive": "matmul -> log_softmax -> gather, entropy from log_softmax (autograd)",
    "pacs_torch": "pacs_fast.linear_logprobs backend='torch', logp + entropy",
    "pacs_torch_logp": "pacs_fast.linear_logprobs backend='torch', logp only",
    "pacs_triton": "pacs_fast.linear_logprobs backend='triton', logp + entropy (CUDA only)",
    "liger_logprob": "Liger _ChunkedSelectiveLogProbFunction (general op, logp only)",
    "liger_grpo": "LigerFusedLinearGRPOLoss (loss known in forward, grads in forward, no entropy)",
    "liger_flce": "LigerFusedLinearCrossEntropyLoss (Triton)",
}
WITH_ENTROPY = {"naive", "pacs_torch", "pacs_triton"}
ERR_ROWS, ERR_VOCAB = 256, 512


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _inputs(n, h, v, seed, device="cpu"):
    import torch
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).to(device)
    weight = (torch.randn(v, h, generator=g) * 0.05).to(device)
    labels = torch.randint(0, v, (n,), generator=g).to(device)
    gl = torch.randn(n, generator=g).to(device)
    gh = torch.randn(n, generator=g).to(device)
    rows = torch.randperm(n, generator=g)[:ERR_ROWS]
    vocab = torch.randperm(v, generator=g)[:ERR_VOCAB]
    vocab[0] = labels[0]  # include at least one target column
    return hidden, weight, labels, gl, gh, rows, vocab


def _method(name):
    """Returns ``run(hidden, weight, labels, gl, gh) -> (logp, entropy or None)``; runs backward."""
    import torch
    if name == "naive":
        def run(h, w, y, gl, gh):
            lsm = torch.log_softmax(h @ w.T, dim=-1)
            logp = lsm.gather(1, y[:, None]).squeeze(1)
            ent = -(lsm.exp() * lsm).sum(-1)
            (logp * gl + ent * gh).sum().backward()
            return logp, ent
        return run
    if name.startswith("pacs_"):
        from pacs_fast.ops.linear_logprobs import linear_logprobs
        backend = "triton" if name == "pacs_triton" else "torch"
        entropy = name != "pacs_torch_logp"

        def run(h, w, y, gl, gh):
            if entropy:
                logp, ent = linear_logprobs(h, w, y, return_entropy=True, backend=backend)
                (logp * gl + ent * gh).sum().backward()
                return logp, ent
            logp = linear_logprobs(h, w, y, backend=backend)
            (logp * gl).sum().backward()
            return logp, None
        return run
    if name == "liger_logprob":
        from liger_kernel.chunked_loss.fused_linear_ppo import _ChunkedSelectiveLogProbFunction as F

        def run(h, w, y, gl, gh):
            logp = F.apply(h, w, y, None, 1.0, 4096)
            (logp * gl).sum().backward()
            return logp, None
        return run
    if name == "liger_grpo":
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
        loss_fn = LigerFusedLinearGRPOLoss(beta=0.0, compiled=False, use_ref_model=False, chunk_size=1)

        def run(h, w, y, gl, gh):
            n = h.shape[0]
            t = min(512, n)
            b = n // t
            out = loss_fn(h.view(b, t, -1), w, y.view(b, t), torch.ones(b, t), gl.view(b, t)[:, 0])
            out[0].backward()
            return None, None
        return run
    if name == "liger_flce":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        loss_fn = LigerFusedLinearCrossEntropyLoss(reduction="sum")

        def run(h, w, y, gl, gh):
            loss_fn(w, h, y).backward()
            return None, None
        return run
    raise ValueError(f"unknown method {name!r}")


def worker(args):
    import torch
    torch.set_num_threads(args.threads)
    device = "cuda" if args.method == "pacs_triton" or args.method == "liger_flce" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"unavailable": "needs CUDA (none here)"}))
        return
    try:
        run = _method(args.method)
        # warm-up on a tiny problem with the same H (libraries, thread pools, autotuning)
        hw, ww, yw, glw, ghw, _, _ = _inputs(64, args.h, 4096, 0, device)
        hw.requires_grad_(), ww.requires_grad_()
        run(hw, ww, yw, glw, ghw)
    except Exception as e:  # noqa: BLE001 - reported in the table
        print(json.dumps({"unavailable": f"{type(e).__name__}: {str(e)[:160]}"}))
        return
    del hw, ww, yw, glw, ghw
    h, w, y, gl, gh, rows, vocab = _inputs(args.n, args.h, args.v, args.seed, device)
    h.requires_grad_(), w.requires_grad_()
    import gc
    gc.collect()
    base, peak0 = _rss(), _peak()
    times = []
    for i in range(args.repeat):
        h.grad = w.grad = None
        t0 = time.perf_counter()
        logp, ent = run(h, w, y, gl, gh)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        if i == 0:
            peak = _peak()
            grad_bytes = h.grad.numel() * h.grad.element_size() + w.grad.numel() * w.grad.element_size()
    res = {"time_s": min(times), "times_s": times, "peak_rss_gb": peak / 1e9,
           "base_rss_gb": base / 1e9, "peak_before_gb": peak0 / 1e9,
           "workspace_gb": max(peak - base - grad_bytes, 0) / 1e9}
    torch.save({"logp": None if logp is None else logp.detach()[rows].cpu(),
                "ent": None if ent is None else ent.detach()[rows].cpu(),
                "dh": h.grad[rows].cpu(), "dw": w.grad[vocab].cpu()}, args.save)
    print(json.dumps(res))


def reference(args):
    """float64 logp/entropy/dh on the sampled rows and dW on the sampled vocab rows."""
    import torch
    torch.set_num_threads(args.threads)
    h, w, y, gl, gh, rows, vocab = _inputs(args.n, args.h, args.v, args.seed)
    h, w = h.double(), w.double()
    lse = torch.empty(args.n, dtype=torch.float64)
    ent = torch.empty(args.n, dtype=torch.float64)
    for r0 in range(0, args.n, 256):  # full rows, 256 at a time: lse and entropy of every row
        x = h[r0:r0 + 256] @ w.T
        lsm = torch.log_softmax(x, -1)
        lse[r0:r0 + 256] = torch.logsumexp(x, -1)
        ent[r0:r0 + 256] = -(lsm.exp() * lsm).sum(-1)
        del x, lsm
    out = {}
    for with_ent in (True, False):
        ghe = gh if with_ent else torch.zeros_like(gh)
        # dx = gl (onehot - p) - gh p (x - lse + H)
        hr = h[rows]
        x = hr @ w.T
        p = torch.exp(x - lse[rows, None])
        dx = -p * (gl[rows, None].double() + ghe[rows, None].double() * (x - lse[rows, None] + ent[rows, None]))
        dx[torch.arange(len(rows)), y[rows]] += gl[rows].double()
        dh = dx @ w
        xv = h @ w[vocab].T  # [N, 512]: the sampled columns for every row
        pv = torch.exp(xv - lse[:, None])
        dxv = -pv * (gl[:, None].double() + ghe[:, None].double() * (xv - lse[:, None] + ent[:, None]))
        onehot = (y[:, None] == vocab[None, :]).double()
        dxv += onehot * gl[:, None].double()
        dw = dxv.T @ h
        logp = x.gather(1, y[rows, None]).squeeze(1) - lse[rows]
        out["ent" if with_ent else "logp_only"] = {"logp": logp, "ent": ent[rows], "dh": dh, "dw": dw}
    torch.save(out, args.save)
    print(json.dumps({"ok": True}))


def _errors(res_path, ref, method):
    import torch
    got = torch.load(res_path)
    r = ref["ent" if method in WITH_ENTROPY else "logp_only"]
    err = {}
    for k in ("logp", "ent", "dh", "dw"):
        if got.get(k) is not None and not (method == "liger_grpo"):
            err[k] = float((got[k].double() - r[k]).abs().max())
    return err


def _sub(argv, timeout):
    p = subprocess.run([sys.executable, __file__] + argv, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, TRITON_INTERPRET="0"))
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"unavailable": f"exit {p.returncode}: {p.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="2048x896x151936,4096x896x151936", help="NxHxV,...")
    ap.add_argument("--methods", default=",".join(m for m in METHODS))
    ap.add_argument("--naive-max-n", type=int, default=2048,
                    help="skip the naive method above this N (its fp32 [N, V] copies: 2.5 GB each at 4096)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--out", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--method", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--h", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--v", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.reference:
        return reference(args)

    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"--methods: unknown {m!r}; choose from {METHODS}")
    rows = []
    tmp = tempfile.mkdtemp(prefix="bench_logprobs_")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    import torch
    for shape in args.shapes.split(","):
        n, h, v = (int(x) for x in shape.lower().split("x"))
        ref_path = os.path.join(tmp, f"ref_{n}_{h}_{v}.pt")
        common = ["--n", str(n), "--h", str(h), "--v", str(v), "--seed", str(args.seed),
                  "--threads", str(args.threads)]
        for m in methods:
            row = {"method": m, "N": n, "H": h, "V": v}
            if m == "naive" and n > args.naive_max_n:
                row["unavailable"] = f"skipped: N > --naive-max-n={args.naive_max_n} (memory)"
                rows.append(row)
                continue
            res_path = os.path.join(tmp, f"{m}_{n}.pt")
            row.update(_sub(["--worker", "--method", m, "--repeat", str(args.repeat), "--save", res_path]
                            + common, args.timeout))
            if "unavailable" not in row:
                if not os.path.exists(ref_path):
                    r = _sub(["--reference", "--save", ref_path] + common, args.timeout)
                    if "unavailable" in r:
                        print("reference failed:", r["unavailable"], file=sys.stderr)
                if os.path.exists(ref_path):
                    row["max_err"] = _errors(res_path, torch.load(ref_path), m)
            rows.append(row)
            _print_row(row)
    _print_table(rows)
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   time.strftime("logprobs_%Y%m%d_%H%M%S.json"))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    meta = {"argv": sys.argv, "threads": args.threads, "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "load_avg": os.getloadavg(), "descriptions": DESCRIPTION}
    with open(out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"\nwrote {out}")


def _fmt_err(e):
    return " ".join(f"{k}={v:.1e}" for k, v in e.items()) if e else "-"


def _print_row(r):
    if "unavailable" in r:
        print(f"  {r['method']:16s} N={r['N']:5d}: unavailable ({r['unavailable']})", flush=True)
    else:
        print(f"  {r['method']:16s} N={r['N']:5d}: {r['time_s']:7.2f} s  workspace {r['workspace_gb']*1e3:8.1f} MB"
              f"  err {_fmt_err(r.get('max_err'))}", flush=True)


def _print_table(rows):
    print("\n| method | N | H | V | fwd+bwd s | time x naive | workspace MB | workspace x naive | max err vs fp64 |")
    print("|---|---|---|---|---|---|---|---|---|")
    naive = {}
    for r in rows:
        if r["method"] == "naive" and "unavailable" not in r:
            naive[(r["H"], r["V"])] = r
    for r in rows:
        if "unavailable" in r:
            print(f"| {r['method']} | {r['N']} | {r['H']} | {r['V']} | unavailable: {r['unavailable'][:70]} | | | | |")
            continue
        nv = naive.get((r["H"], r["V"]))
        # naive is measured at its own N; scale linearly in N for other N (both are ~linear)
        tx = wx = "-"
        if nv is not None:
            f = r["N"] / nv["N"]
            tx = f"{r['time_s'] / (nv['time_s'] * f):.2f}"
            wx = f"{r['workspace_gb'] / (nv['workspace_gb'] * f):.3f}" if nv["workspace_gb"] > 0 else "-"
        print(f"| {r['method']} | {r['N']} | {r['H']} | {r['V']} | {r['time_s']:.2f} | {tx} | "
              f"{r['workspace_gb']*1e3:.1f} | {wx} | {_fmt_err(r.get('max_err'))} |")


if __name__ == "__main__":
    main()
