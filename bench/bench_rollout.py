"""Rollout throughput: vLLM (``VLLMEngine``) vs ``HFEngine`` (its lean decode loop as the trainer runs it,
the lean loop unmerged on SDPA, and ``model.generate``), and vLLM weight-sync time.

Both engines get the same prompts, ``n``, ``max_new_tokens``, temperature and seed; throughput is
generated (completion) tokens per second of wall time, after one warm-up call each. Weight sync
is ``VLLMEngine.sync_weights`` of the full model from a live HF model (median of ``--repeats``),
for a few bucket sizes.

    python bench/bench_rollout.py                       # the tiny model of the tests
    python bench/bench_rollout.py --hidden 512 --layers 8 --heads 8 --prompts 32 --n 8
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.rollout.base import SamplingParams


def timed_generate(engine, prompts, params, repeats):
    engine.generate(prompts[:2], params)  # warm-up
    best = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = engine.generate(prompts, params)
        dt = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for row in out for c in row)
        if best is None or tokens / dt > best[0] / best[1]:
            best = (tokens, dt)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4, help="head size = hidden / heads (vLLM CPU needs >= 32)")
    ap.add_argument("--hf-batch-size", type=int, default=128, help="rows per HF generate call")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-vllm", action="store_true")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = make_tiny_model(tmp, seed=0, hidden_size=args.hidden, num_layers=args.layers,
                               num_heads=args.heads, num_kv_heads=max(1, args.heads // 2),
                               intermediate_size=3 * args.hidden,
                               max_positions=max(512, args.prompt_len + args.max_new_tokens + 8))
        gen = torch.Generator().manual_seed(0)
        prompts = [[1] + torch.randint(3, 99, (args.prompt_len - 1,), generator=gen).tolist()
                   for _ in range(args.prompts)]
        params = SamplingParams(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=1)
        rows = []
        n_params = None
        if not args.skip_hf:
            from pacs_fast.rollout.hf import HFEngine

            from pacs_fast.ops.short_attention import use_attention

            # the trainer's engine (lean, merged rows on CPU, model.attention=auto), the lean loop
            # without merging on SDPA (the previous default), and model.generate
            for name, sampler, merge, attention in (("hf lean", "lean", None, "auto"),
                                                    ("hf lean-unmerged", "lean", False, "sdpa"),
                                                    ("hf merged-sdpa", "lean", True, "sdpa"),
                                                    ("hf unmerged-short", "lean", False, "auto"),
                                                    ("hf generate", "generate", None, "sdpa")):
                hf = HFEngine(path, batch_size=args.hf_batch_size, sampler=sampler, merge_rows=merge)
                use_attention(hf.model, attention)
                n_params = sum(p.numel() for p in hf.model.parameters())
                tokens, dt = timed_generate(hf, prompts, params, args.repeats)
                rows.append((name, tokens, dt))
                del hf

        start_s, sync_rows = None, []
        if not args.skip_vllm:
            from transformers import AutoModelForCausalLM

            from pacs_fast.rollout.vllm_engine import VLLMEngine

            t0 = time.perf_counter()
            engine = VLLMEngine(path, seed=0, cpu_kv_cache_bytes=256 << 20)
            start_s = time.perf_counter() - t0
            tokens, dt = timed_generate(engine, prompts, params, args.repeats)
            rows.append(("vllm", tokens, dt))

            learner = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            n_params = n_params or sum(p.numel() for p in learner.parameters())
            for bucket in (1 << 20, 64 << 20, 1 << 30):
                times = []
                for _ in range(args.repeats):
                    engine.sync_weights(learner.named_parameters(), bucket_bytes=bucket)
                    times.append(engine.last_sync["seconds"])
                sync_rows.append((bucket, engine.last_sync["buckets"], engine.last_sync["bytes"], statistics.median(times)))
            engine.close()

    print(f"\nmodel: hidden={args.hidden} layers={args.layers} heads={args.heads} params={n_params / 1e6:.2f}M fp32; "
          f"threads={torch.get_num_threads()}" + (f"; vLLM start {start_s:.1f} s" if start_s is not None else ""))
    print(f"workload: {args.prompts} prompts x n={args.n}, prompt {args.prompt_len} tokens, "
          f"max_new_tokens={args.max_new_tokens}, temperature={args.temperature}\n")
    print(f"{'engine':<18}{'tokens':>10}{'seconds':>10}{'tokens/s':>12}")
    for name, tokens, dt in rows:
        print(f"{name:<18}{tokens:>10}{dt:>10.2f}{tokens / dt:>12.0f}")
    print(f"\n{'sync bucket':<14}{'buckets':>10}{'MB':>10}{'seconds':>12}")
    for bucket, nb, nbytes, sec in sync_rows:
        print(f"{bucket / 2**20:>10.0f} MiB{nb:>10}{nbytes / 1e6:>10.1f}{sec:>12.4f}")


if __name__ == "__main__":
    main()
