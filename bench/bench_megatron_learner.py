"""The megatron learner on long, uneven responses (issue 21): padded vs packed vs packed + token-budget
micro-batches, and optimiser memory per rank with and without the sharded optimiser.

    python bench/bench_megatron_learner.py                    # TP=1 x DP=2 (2 processes, gloo)
    python bench/bench_megatron_learner.py --tp 2 --rounds 3

Re-launches itself under ``torchrun --nproc_per_node 2``. The model and batch are those of
``bench/bench_learner.py`` (a random ~25M-parameter Qwen2: hidden 512, 4 layers, 32,000-token
vocabulary, fp32; ``--groups`` groups x G rows after a shared 24-token prompt, response lengths
lognormal, median 40, clipped to [1, 512]). One learner per mode, built once; modes alternate round
by round and each round times one ``learner.update`` (forward + backward + gradient all-reduce +
AdamW over the whole batch, one optimiser step) after an untimed one; medians. Tokens/s counts the
batch's real tokens. Optimiser bytes: the AdamW moments this rank holds (exact, not sampled).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

MODES = {
    "padded": dict(packing="off"),
    "packed": dict(packing="on"),
    "packed + token budget": dict(packing="on", max_tokens_per_micro_batch=1536),
    "packed + sharded optimiser": dict(packing="on", distributed_optimizer=True),
}


def _args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=1, choices=(1, 2))
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    if args.groups < 1 or args.groups % (2 // args.tp) or args.G < 1 or args.rounds < 1:
        ap.error("--groups: a multiple of the data-parallel size (2 at --tp 1: each rank trains whole groups); "
                 "--G and --rounds: at least 1")
    return args


def _inner(args):
    import torch
    import torch.distributed as dist
    from transformers import Qwen2ForCausalLM

    from bench_learner import make_batch  # the torch learner bench's batch (same directory)
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.megatron.learner import MegatronLearner
    from pacs_fast.learner.megatron.optimizer import state_bytes

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    path = os.path.join(args.workdir, "model")
    if rank == 0:
        torch.manual_seed(0)
        Qwen2ForCausalLM(tiny_qwen2_config(32000, hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2,
                                           intermediate_size=1408, max_positions=1024)).save_pretrained(path)
    dist.barrier()
    learners = {}
    for mode, extra in MODES.items():
        lc = LearnerConfig(mini_batch_prompts=args.groups, micro_batch_prompts=args.groups, lr=1e-5,
                           backend="megatron", tp_size=args.tp, logprob_backend="torch", **extra)
        learners[mode] = MegatronLearner(path, algo=AlgoConfig(), learner=lc, horizon=512)
    batches = [make_batch(args.groups, args.G, 32000, seed=k) for k in range(2)]
    for b in batches:
        b.old_logp = b.ref_logp = learners["padded"].compute_logprobs(b)
    times = {m: [] for m in MODES}
    for lrn in learners.values():
        lrn.update(batches[0], seed=0)  # untimed: first-touch allocations
    for r in range(args.rounds):
        for mode in (list(MODES) if r % 2 == 0 else list(MODES)[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            learners[mode].update(batches[1], seed=r)
            times[mode].append(time.perf_counter() - t0)
    opt_bytes = {}
    for mode, lrn in learners.items():
        per_rank = [None] * dist.get_world_size()
        dist.all_gather_object(per_rank, state_bytes(lrn.optimizer))
        opt_bytes[mode] = max(per_rank)
    if rank == 0:
        tokens = int(batches[1].attention_mask.sum())
        dp = dist.get_world_size() // args.tp
        print(f"megatron learner.update, TP={args.tp} x DP={dp}, {args.groups} groups x G={args.G}, {tokens} real "
              f"tokens, {args.threads} thread(s)/process, median of {args.rounds}")
        print("| mode | update (s) | tokens/s | vs padded | optimiser MB per rank (max) |")
        print("|---|---|---|---|---|")
        base = statistics.median(times["padded"])
        for mode in MODES:
            sec = statistics.median(times[mode])
            print(f"| {mode} | {sec:.2f} | {tokens / sec:,.0f} | {base / sec:.2f}x | {opt_bytes[mode] / 2**20:.1f} |")
        print(f"sharded / replicated optimiser bytes per rank: "
              f"{opt_bytes['packed + sharded optimiser'] / opt_bytes['packed']:.3f}")
    for lrn in learners.values():
        lrn.close()
        break  # one teardown of megatron's parallel state
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    a = _args()
    if "WORLD_SIZE" in os.environ:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        _inner(a)
    else:
        from torchrun_launch import launch  # (bench/ is this script's folder)
        launch(__file__, a.workdir, "bench_megatron_learner_")
