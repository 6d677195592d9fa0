"""Packed-row attention on one GPU: the varlen kernel against long sequences split off to SDPA (issue 38).

    python bench/gpu/attention.py --out OUT_DIR [--rounds 5]
    python bench/gpu/attention.py --out OUT_DIR --dry-run      # CPU, tiny rows, seconds (CI)

One packed row of Qwen2.5-1.5B attention (12 query / 2 key-value heads, head dim 128, bf16) through
``pacs_fast.ops.varlen_attention.attend``, forward + backward, at four layouts of ~32-64k tokens: rows of 1k, 4k
or 32k tokens, and a long-tailed mix (lognormal, median 1k, cap 16k). Methods: ``varlen`` (every sequence through
the varlen kernel: ``PACS_FAST_VARLEN_LONG=0``), ``split >= T`` (sequences of at least T tokens through SDPA's
causal kernel, one call per length, the rest through the varlen kernel; pacs_fast/ops/varlen_split.py),
``split views >= 4096`` (the same split cut into views instead of gathered: :func:`split_views`, a candidate),
``sdpa groups`` (every length group through SDPA) and ``flex`` (compiled ``flex_attention`` with a document mask;
its compile falls in the warm-up). Wall time of a synchronised call (host included: a split
into many short calls is launch-bound), the methods alternated round by round, medians; each output checked
against ``varlen``'s. Writes OUT/attention.json and OUT/attention.md. ``--dry-run``: rows of 8-64 tokens, fp32,
the CPU path standing in for the varlen kernel (checks the plumbing, never speed; ``flex`` has no backward on the
CPU and falls back to ``sdpa``, which its row names).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402

THRESHOLDS = (1024, 2048, 4096, 8192)


def layouts(dry: bool) -> dict:
    k = 8 if dry else 1024
    gen = torch.Generator().manual_seed(0)
    med, cap, n = (16, 64, 16) if dry else (1024, 16384, 48)
    mix = torch.exp(math.log(med) + torch.randn(n, generator=gen)).round().clamp(1, cap).long().tolist()
    return {"1k": [k] * 32, "4k": [4 * k] * 8, "32k": [32 * k] * 2, "mix": mix}


def split_views(va, q, k, v, lengths, long, scale, cache):
    """A candidate for :func:`pacs_fast.ops.varlen_attention._split` that moves fewer bytes (measured here before
    it replaces it): the row cut into runs of consecutive sequences with one ``split`` (views; its backward one
    ``cat``), a run of equal-length long ones through ``causal_rows`` as one batch (a view), a run of short ones
    through the varlen kernel (its own boundaries, cached), the outputs joined with one ``cat``. The product's
    version gathers the short sequences (``index_select``) and scatters the outputs (``index_copy``)."""
    key = (tuple(lengths), long)
    if key not in cache:
        segs, i = [], 0
        while i < len(lengths):
            j, n = i, lengths[i]
            if n >= long:
                while j < len(lengths) and lengths[j] == n:
                    j += 1
                segs.append((n * (j - i), (n, j - i), None))
            else:
                while j < len(lengths) and lengths[j] < long:
                    j += 1
                segs.append((sum(lengths[i:j]), None, (va.cu_seqlens(lengths[i:j], q.device), max(lengths[i:j]))))
            i = j
        cache[key] = segs
    segs = cache[key]
    h, d = q.shape[1:]
    outs = []
    for (tokens, run, short), qq, kk, vv in zip(segs, *(x.split([t for t, _, _ in segs]) for x in (q, k, v))):
        if run is not None:
            n, m = run
            qg, kg, vg = (x.view(m, n, x.shape[1], d).transpose(1, 2) for x in (qq, kk, vv))
            outs.append(va.causal_rows(qg, kg, vg, scale).reshape(tokens, h, d))
            va.KERNEL_CALLS["sdpa_long"] += 1
        else:
            outs.append(va._run(qq, kk, vv, short[0], short[1], scale, "varlen_attn"))
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args(argv)
    from pacs_fast.ops import varlen_attention as va
    from pacs_fast.ops import varlen_split

    dry = args.dry_run
    device, dtype = ("cpu", torch.float32) if dry else ("cuda", torch.bfloat16)
    if not dry and not torch.cuda.is_available():
        print("bench/gpu/attention.py: no CUDA device (use --dry-run on CPU)", file=sys.stderr)
        return 2
    if dry:  # the CPU path stands in for the varlen kernel
        va._KERNELS["varlen_attn"] = va._sdpa_groups
    h, kvh, d = (4, 2, 16) if dry else (12, 2, 128)
    thresholds = tuple(t // 128 for t in THRESHOLDS) if dry else THRESHOLDS
    methods = {"varlen": ("varlen_attn", 0), **{f"split >= {t}": ("varlen_attn", t) for t in thresholds},
               f"split views >= {thresholds[2]}": ("views", thresholds[2]), "sdpa groups": ("sdpa", 0),
               "flex": ("flex", 0)}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    for name, lengths in layouts(dry).items():
        N = sum(lengths)
        gen = torch.Generator().manual_seed(1)
        q, k, v = (torch.randn(N, x, d, generator=gen).to(device, dtype).requires_grad_() for x in (h, kvh, kvh))
        g = torch.randn(N, h, d, generator=gen).to(device, dtype)
        cu = va.cu_seqlens(lengths, device)
        cache = {}

        def call(backend, long):
            os.environ[varlen_split.LONG_ENV] = str(long)
            va.KERNEL_CALLS.clear()
            if backend == "views":
                out = split_views(va, q, k, v, lengths, long, d ** -0.5, cache)
            else:
                out = va.attend(q, k, v, cu, max(lengths), backend=backend, lengths=lengths)
            grads = torch.autograd.grad(out, (q, k, v), g)
            return out, grads, dict(va.KERNEL_CALLS)

        ref, calls, times, first, failed = None, {}, {m: [] for m in methods}, {}, {}
        for m, (backend, long) in methods.items():  # warm-up (and the outputs checked against varlen's)
            sync()
            t0 = time.perf_counter()
            try:
                out, grads, calls[m] = call(backend, long)
            except Exception as e:  # noqa: BLE001 - a method that cannot run here (flex's compile, OOM): its row says
                if m == "varlen":  # why, the others are timed (the baseline must run)
                    raise
                failed[m] = f"{type(e).__name__}: {str(e)[:200]}"
                if device == "cuda":
                    torch.cuda.empty_cache()
                continue
            sync()
            first[m] = time.perf_counter() - t0  # flex: its compilation (torch.compile) on the first layout
            ref = ref if ref is not None else (out, grads)
            pairs = [(a.detach().float(), b.detach().float()) for a, b in zip((out, *grads), (ref[0], *ref[1]))]
            err = max(float((a - b).abs().max() / b.abs().max()) for a, b in pairs)
            calls[m] = {"kernels": calls[m], "max_rel_diff_vs_varlen": err, "first_call_s": first[m]}
        for _ in range(1 if dry else args.rounds):
            for m, (backend, long) in methods.items():
                if m in failed:
                    continue
                sync()
                t0 = time.perf_counter()
                call(backend, long)
                sync()
                times[m].append(time.perf_counter() - t0)
        base = statistics.median(times["varlen"])
        for m in methods:
            if m in failed:
                rows.append({"layout": name, "tokens": N, "sequences": len(lengths), "longest": max(lengths),
                             "method": m, "error": failed[m]})
                print(f"{name:4s} {m:20s} failed: {failed[m]}", flush=True)
                continue
            ms = statistics.median(times[m]) * 1e3
            rows.append({"layout": name, "tokens": N, "sequences": len(lengths), "longest": max(lengths), "method": m,
                         "ms": ms, "vs_varlen": ms / (base * 1e3), "samples_ms": [t * 1e3 for t in times[m]],
                         **calls[m]})
            print(f"{name:4s} {m:20s} {ms:9.3f} ms  {ms / (base * 1e3):5.2f}x varlen  {calls[m]}", flush=True)
        del q, k, v, g
        write(args.out, rows, "CPU (dry run)" if dry else torch.cuda.get_device_name(), (h, kvh, d), dtype)
    os.environ.pop(varlen_split.LONG_ENV, None)
    return 0


def write(out: str, rows: list, dev: str, heads: tuple, dtype) -> None:
    """``attention.json`` and ``attention.md`` in ``out``, atomically, after every layout (a run cut off by its
    time limit keeps the layouts it finished)."""
    os.makedirs(out, exist_ok=True)
    meta = {"device": dev, "torch": torch.__version__, "heads": list(heads), "dtype": str(dtype)}
    lines = [f"# Packed-row attention, forward + backward ({dev}, torch {torch.__version__}, {heads[0]} / {heads[1]} "
             f"heads, d {heads[2]}, {dtype})", "",
             "| layout | tokens | method | ms (median, synchronised) | x varlen | first call s | calls |",
             "|---|---:|---|---:|---:|---:|---|"]
    lines += [f"| {r['layout']} | {r['tokens']:,} | {r['method']} | failed | | | {r['error']} |" if "error" in r else
              f"| {r['layout']} | {r['tokens']:,} | {r['method']} | {r['ms']:.3f} | {r['vs_varlen']:.2f} | "
              f"{r['first_call_s']:.2f} | {', '.join(f'{k} {v}' for k, v in sorted(r['kernels'].items()))} |"
              for r in rows]
    from pacs_fast.files import write_text_atomic
    write_text_atomic(os.path.join(out, "attention.json"), json.dumps({"meta": meta, "rows": rows}, indent=1))
    write_text_atomic(os.path.join(out, "attention.md"), "\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
