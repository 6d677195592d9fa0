"""The lean HF sampler's sampling step on Qwen's vocabulary (151,936 ids): top-p by sorting every row
(transformers' steps) against the candidates path of ``pacs_fast.rollout.sampling.top_p_remove_mask``
(the top 256, then 4,096 logits; the sort where the nucleus is larger), and one whole ``sample_tokens``
call (two-level inverse CDF).

Rows: *peaked* (a handful of tokens at N(14, 2) logits over a N(0, 2) tail: a trained model at a typical step),
*light tail* (the same over N(0, 1)), *flat* (N(0, 3), no head: a random-weight model, the candidates'
worst case). Milliseconds, median of ``--repeats`` calls, the variants alternated.

    OMP_NUM_THREADS=2 python bench/bench_sampling.py [--rows 64] [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from pacs_fast.rollout import sampling

VOCAB = 151_936


def rows_of(kind: str, rows: int, gen: torch.Generator) -> torch.Tensor:
    spread = {"peaked": 2.0, "light tail": 1.0, "flat": 3.0}[kind]
    logits = torch.randn(rows, VOCAB, generator=gen) * spread
    if kind != "flat":
        head = torch.randint(0, VOCAB, (rows, 8), generator=gen)
        logits.scatter_(1, head, 14 + 2 * torch.randn(rows, 8, generator=gen))
    return logits


def median_ms(calls: dict, repeats: int) -> dict:
    times = {name: [] for name in calls}
    for _ in range(repeats + 1):  # alternated; the first round warms up
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t[1:]) for name, t in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    print(f"| rows ({args.rows} x {VOCAB:,}) | top_p | nucleus (median tokens) | top-p, sorted (ms) | "
          f"top-p, candidates (ms) | speed-up | sample_tokens (ms) |")
    print("|---|---|---|---|---|---|---|")
    for kind in ("peaked", "light tail", "flat"):
        logits = rows_of(kind, args.rows, gen)
        for top_p in (0.95, 0.8):
            mask = sampling.top_p_remove_mask(logits, top_p)
            kept = int((~mask).sum(1).median())
            t = median_ms({"sorted": lambda: sampling._top_p_sorted(logits, top_p),
                           "candidates": lambda: sampling.top_p_remove_mask(logits, top_p),
                           "sample": lambda: sampling.sample_tokens(logits, 1.0, top_p)}, args.repeats)
            print(f"| {kind} | {top_p} | {kept:,} | {t['sorted']:.1f} | {t['candidates']:.1f} | "
                  f"{t['sorted'] / t['candidates']:.1f}x | {t['sample']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
