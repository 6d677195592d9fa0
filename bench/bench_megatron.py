"""Megatron learner on CPU/gloo: TP=2 vs TP=1 parity and step timings (2 processes).

    python bench/bench_megatron.py [--hidden 256 --layers 4 --vocab 8192 --groups 4 --group-size 4 --seq 128]

Re-launches itself under ``torchrun --nproc_per_node 2``. For TP = 1 (two data-parallel replicas)
and TP = 2 it builds the learner on the same random tiny Qwen2 model and batch, then prints

- parity: max |diff| between TP=2 and TP=1 of the per-token log-probs, the PACS loss and the
  gradients (gathered to Hugging Face names), computed on the full batch on every rank;
- timings (median of ``--reps``): ``compute_logprobs`` of the batch and one ``update`` (one
  optimiser step: forward, PACS loss, backward, gradient all-reduce, clipping, AdamW).

Both layouts use the same 2 processes, so TP=1 x DP=2 vs TP=2 x DP=1 compares the two ways of
spending them. On a shared 2-core CPU the timings are noisy: compare within one run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings


def _args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--workdir", default="")
    args = ap.parse_args()
    if args.hidden % 64:
        ap.error("--hidden: a multiple of 64 (heads of 32, split over TP=2)")
    if args.groups % 2:
        ap.error("--groups: a multiple of 2 (TP=1 x DP=2 deals whole groups to the two ranks)")
    return args


def _inner(args):
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from transformers import Qwen2ForCausalLM

    from pacs_fast.algorithms import pacs_loss
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.megatron.convert import export_hf_state_dict
    from pacs_fast.learner.megatron.learner import MegatronLearner
    from pacs_fast.learner.megatron.sequence_parallel import norm_params, reduce_norm_grads

    path = os.path.join(args.workdir, "model")
    if rank == 0:
        torch.manual_seed(0)
        cfg = tiny_qwen2_config(args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                                num_heads=args.hidden // 32, num_kv_heads=max(args.hidden // 64, 2),
                                intermediate_size=3 * args.hidden, tie_word_embeddings=False)
        Qwen2ForCausalLM(cfg).save_pretrained(path)
    dist.barrier()
    gen = torch.Generator().manual_seed(1)
    B, T = args.groups * args.group_size, args.seq
    ids = torch.randint(3, args.vocab, (B, T), generator=gen)
    am = torch.ones(B, T, dtype=torch.long)
    rm = torch.zeros(B, T)
    rm[:, T // 4:] = 1
    rewards = (torch.rand(B, generator=gen) < 0.5).float()
    batch = RolloutBatch(input_ids=ids, attention_mask=am, response_mask=rm, rewards=rewards,
                         group_size=args.group_size)
    lcfg = dict(lr=1e-5, grad_clip=1.0, mini_batch_prompts=args.groups, micro_batch_prompts=args.groups,
                logprob_backend="torch")
    results = {}
    for tp in (1, 2):
        learner = MegatronLearner(path, algo=AlgoConfig(), learner=LearnerConfig(**lcfg, tp_size=tp))
        # parity: full batch on every rank, gradients gathered to HF names
        logp = learner._logprobs(learner.model, batch, False)[0]
        loss = pacs_loss(logp, logp.detach() - 0.1, batch.response_mask, batch.rewards,
                         group_size=args.group_size)
        loss.backward()
        # at TP=2 (learner.sequence_parallel, the default) each rank holds its tokens' part of the norms'
        # gradients: summed over the TP group as update() does, or the parity line compares partial sums
        reduce_norm_grads([p.grad for p in norm_params(learner.model)], learner.tp_group)
        grads = export_hf_state_dict(learner.model, learner.hf_config, tp_group=learner.tp_group, grads=True)
        learner.optimizer.zero_grad(set_to_none=True)
        t_lp, t_up = [], []
        for _ in range(args.reps):
            dist.barrier()
            t0 = time.perf_counter()
            old = learner.compute_logprobs(batch)
            t_lp.append(time.perf_counter() - t0)
            batch.old_logp = batch.ref_logp = old
            dist.barrier()
            t0 = time.perf_counter()
            learner.update(batch, seed=0)
            t_up.append(time.perf_counter() - t0)
        results[tp] = dict(logp=logp.detach(), loss=float(loss), grads=grads,
                           logprobs_s=statistics.median(t_lp), update_s=statistics.median(t_up))
        learner.close()
        del learner
    if rank == 0:
        a, b = results[1], results[2]
        d_lp = float((a["logp"] - b["logp"]).abs().max())
        d_g = max(float((a["grads"][k] - b["grads"][k]).abs().max()) for k in a["grads"])
        g_max = max(float(g.abs().max()) for g in a["grads"].values())
        print(f"model: hidden {args.hidden}, layers {args.layers}, vocab {args.vocab}; batch {B} x {T} tokens; "
              f"fp32, {args.threads} thread(s)/process, 2 processes, gloo")
        print(f"parity TP=2 vs TP=1: max|dlogp| {d_lp:.3g}  |dloss| {abs(a['loss'] - b['loss']):.3g}  "
              f"max|dgrad| {d_g:.3g} (max|grad| {g_max:.3g})")
        print("| layout | compute_logprobs (s) | update: 1 optimiser step (s) |")
        print("|---|---|---|")
        for tp, name in ((1, "TP=1 x DP=2"), (2, "TP=2 x DP=1")):
            r = results[tp]
            print(f"| {name} | {r['logprobs_s']:.3f} | {r['update_s']:.3f} |")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    a = _args()
    if "WORLD_SIZE" in os.environ:
        _inner(a)
    else:
        from torchrun_launch import launch  # (bench/ is this script's folder)
        launch(__file__, a.workdir, "bench_megatron_")
