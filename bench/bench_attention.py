"""CPU attention for short sequences: ``pacs_fast``'s matmul attention vs PyTorch SDPA (flash CPU kernel).

    python bench/bench_attention.py                 # 2 threads, fp32, forward and forward+backward
    python bench/bench_attention.py --threads 1 --heads 4 --kv-heads 2
    python bench/bench_attention.py --batch 2 --lengths 8,16 --repeat 1     # a quick check of the code path

Causal self-attention over ``[batch, heads, L, 32]`` with grouped-query heads, padded rows (a boolean
mask, as Hugging Face passes it), and one-token decode steps over an ``L``-token cache. Each cell is
the median of ``--repeat`` timings, the two implementations alternating. Prints a table (ms) and
the ratio short / sdpa; ``short_attention`` itself falls back to SDPA above ``MAX_SCORES``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from pacs_fast.ops import short_attention as sa


class _Module(torch.nn.Module):
    is_causal = True


def _case(batch, heads, kv_heads, q, k, padded, grad):
    g = torch.Generator().manual_seed(0)
    # Hugging Face's layout: the query is a transposed view of [batch, q, heads, 32]
    query = torch.randn(batch, q, heads, 32, generator=g).transpose(1, 2).requires_grad_(grad)
    key = torch.randn(batch, kv_heads, k, 32, generator=g, requires_grad=grad)
    value = torch.randn(batch, kv_heads, k, 32, generator=g, requires_grad=grad)
    mask = None
    if padded:  # right-padded rows of random lengths, causal
        lengths = torch.randint(1, k + 1, (batch,), generator=g)
        keys_ok = torch.arange(k)[None, :] < lengths[:, None]
        causal = torch.ones(q, k, dtype=torch.bool).tril(k - q)
        mask = (causal[None] & keys_ok[:, None, :])[:, None]
    return query, key, value, mask


def _time(fn, repeat):
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--lengths", default="8,12,16,24,32,48,64,128,256", help="sequence lengths L, comma-separated")
    a = ap.parse_args(argv)
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.repeat < 1 or a.heads % a.kv_heads or min(lengths) < 1:
        ap.error("--repeat >= 1, --heads a multiple of --kv-heads, --lengths >= 1")
    torch.set_num_threads(a.threads)
    from pacs_fast.trainer.allocator import keep_freed_memory
    keep_freed_memory()  # as the trainer does
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module = _Module()
    module.num_key_value_groups = a.heads // a.kv_heads
    sa.MAX_SCORES = sa.MAX_SCORES_TRAIN = 1 << 62  # time the matmul path at every size (the default switches)
    print(f"batch {a.batch}, heads {a.heads}/{a.kv_heads} (q/kv), head dim 32, {a.threads} thread(s); ms")
    print(f"{'case':<34}{'sdpa':>9}{'short':>9}{'ratio':>8}")
    for L in lengths:
        for kind, q, padded, grad in (("prefill fwd", L, True, False), ("prefill fwd+bwd", L, True, True),
                                      ("decode fwd", 1, False, False)):
            query, key, value, mask = _case(a.batch, a.heads, a.kv_heads, q, L, padded, grad)

            def run(fn):
                def go():
                    out, _ = fn(module, query, key, value, mask, scaling=32 ** -0.5)
                    if grad:
                        out.sum().backward()
                return go
            times = {"sdpa": [], "short": []}
            for _ in range(a.repeat):
                times["sdpa"].append(_time(run(sdpa_attention_forward), 1))
                times["short"].append(_time(run(sa.short_attention), 1))
            s, m = statistics.median(times["sdpa"]), statistics.median(times["short"])
            print(f"{kind + f' L={L}':<34}{s:>9.3f}{m:>9.3f}{m / s:>8.2f}")


if __name__ == "__main__":
    main()
