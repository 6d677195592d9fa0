"""Megatron's sequence parallelism (``learner.sequence_parallel``) at TP=2: the activations a micro-batch keeps for
its backward, per token and rank, with and without it, against the learner memory model; and the update's time.

    python bench/bench_sequence_parallel.py                       # 2 processes, gloo, ~2 min on 2 cores
    python bench/bench_sequence_parallel.py --tokens 4096 --recompute selective
    python bench/bench_sequence_parallel.py --dry-run              # tiny widths, 64 tokens, 1 round: a quick check

Re-launches itself under ``torchrun --nproc_per_node 2``. Model: random weights of the Qwen2.5-0.5B widths (hidden
896, 14 / 2 heads, MLP 4,864) with 2 layers and a 32,000-token vocabulary (the vocabulary changes no activation
but the LM head's; fewer layers scale every per-layer term alike), fp32. Batch: one group of 4 rows of
``tokens / 4`` response tokens after a 16-token prompt, packed THD rows (the megatron learner's default).

Saved bytes: every tensor autograd keeps for the backward of one forward + PACS loss (``saved_tensors_hooks``;
each storage counted once, parameters not counted), on this rank: device-independent, what the GPU would hold
(its allocator's rounding aside); with recompute, what stays from the forward to the backward (the layer being
recomputed is held during its own backward only, not counted; nor compared with the model, which counts it). Model: :func:`pacs_fast.trainer.memory_model.activation_bytes_per_token` with
``megatron=True, tp=2`` and the same ``sequence_parallel``. Time: one ``learner.update`` (forward, backward, the
gradient reductions, AdamW), modes alternated round by round after an untimed update each, medians.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings


def _args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048, help="response tokens of the group (4 rows)")
    ap.add_argument("--recompute", default="off", choices=("off", "selective", "full"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--workdir", default="")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the code path quickly: hidden 128 (4 / 2 heads, MLP 256), a 1,024-token vocabulary, "
                         "--tokens 64, --rounds 1; the figures are not the Qwen2.5 widths'")
    args = ap.parse_args()
    if args.dry_run:
        args.tokens, args.rounds = 64, 1
    if args.tokens < 4 or args.rounds < 1:
        ap.error("--tokens: at least 4 (4 rows); --rounds: at least 1")
    return args


QWEN_SHAPE = {"vocab": 32000, "hidden": 896, "layers": 2, "heads": 14, "kv_heads": 2, "head_dim": 64,
              "intermediate": 4864, "bytes": 4}
DRY_SHAPE = {"vocab": 1024, "hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 32,
             "intermediate": 256, "bytes": 4}


def _batch(tokens: int, vocab: int):
    import torch

    from pacs_fast.learner.base import RolloutBatch

    gen = torch.Generator().manual_seed(0)
    G, prompt, n = 4, 16, tokens // 4
    ids = torch.randint(3, vocab, (G, prompt + n), generator=gen)
    ids[:, :prompt] = ids[0, :prompt]
    att = torch.ones_like(ids)
    resp = torch.zeros(G, prompt + n)
    resp[:, prompt:] = 1
    return RolloutBatch(ids, att, resp, torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=G)


def _saved_bytes(learner, batch) -> int:
    """Bytes of the tensors autograd saves for one forward + loss of ``batch`` on this rank (parameters not
    counted, each storage once)."""
    import torch

    from pacs_fast.learner.objective import minibatch_counts, objective

    params = {p.untyped_storage().data_ptr() for p in learner.model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, ent, _ = learner._logprobs(learner.model, batch, False)  # (logp, entropy, values)
        loss, _ = objective(learner.algo, batch, logp, ent, None, minibatch_counts(batch), horizon=learner.horizon)
    loss.backward()
    learner.optimizer.zero_grad(set_to_none=True)
    return sum(seen.values())


def _inner(args):
    import torch
    import torch.distributed as dist
    from transformers import Qwen2ForCausalLM

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.megatron.learner import MegatronLearner
    from pacs_fast.trainer.memory_model import activation_bytes_per_token

    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    shape = DRY_SHAPE if args.dry_run else QWEN_SHAPE
    rank, vocab = dist.get_rank(), shape["vocab"]
    path = os.path.join(args.workdir, "model")
    if rank == 0:
        torch.manual_seed(0)
        Qwen2ForCausalLM(tiny_qwen2_config(vocab, hidden_size=shape["hidden"], num_layers=shape["layers"],
                                           num_heads=shape["heads"], num_kv_heads=shape["kv_heads"],
                                           intermediate_size=shape["intermediate"], max_positions=args.tokens + 64)
                         ).save_pretrained(path)
    dist.barrier()
    recompute = args.recompute != "off"
    learners, saved, model = {}, {}, {}
    batch = _batch(args.tokens, vocab)
    modes = {"tensor parallel alone": False, "+ sequence parallel": True}
    for mode, sp in modes.items():
        lc = LearnerConfig(mini_batch_prompts=1, micro_batch_prompts=1, lr=1e-5, backend="megatron", tp_size=2,
                           logprob_backend="torch", sequence_parallel=sp)
        lrn = MegatronLearner(path, algo=AlgoConfig(), learner=lc, horizon=args.tokens,
                              gradient_checkpointing=recompute,
                              recompute_granularity=args.recompute if recompute else "full")
        learners[mode] = lrn
        batch.old_logp = batch.ref_logp = lrn.compute_logprobs(batch)
        saved[mode] = _saved_bytes(lrn, batch.to(lrn.device))
        model[mode] = activation_bytes_per_token(shape, recompute=args.recompute if recompute else False, tp=2,
                                                 megatron=True, sequence_parallel=sp)
    times = {m: [] for m in modes}
    for lrn in learners.values():
        lrn.update(batch, seed=0)  # untimed: first-touch allocations
    for r in range(args.rounds):
        for mode in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
            dist.barrier()
            t0 = time.perf_counter()
            learners[mode].update(batch, seed=r)
            times[mode].append(time.perf_counter() - t0)
    if rank == 0:
        tokens = int(batch.attention_mask.sum())
        widths = "tiny widths (--dry-run)" if args.dry_run else "Qwen2.5-0.5B widths"
        print(f"megatron learner, TP=2 over gloo, {widths} x 2 layers, fp32, {tokens} tokens packed THD, "
              f"recompute {args.recompute}, {args.threads} thread(s)/process, median of {args.rounds}")
        print("| mode | saved for backward (KiB / token / rank) | memory model (KiB / token) | measured / model "
              "| update (s) |")
        print("|---|---:|---:|---:|---:|")
        for mode in modes:  # (recompute: the layer recomputed in the backward is held then only, unseen here)
            per = saved[mode] / tokens
            vs = f"{model[mode] / 1024:.2f} | {per / model[mode]:.3f}" if not recompute else "- | -"
            print(f"| {mode} | {per / 1024:.2f} | {vs} | {statistics.median(times[mode]):.2f} |")
        a, b = (saved[m] for m in modes)
        print(f"sequence parallel / alone, saved bytes: {b / a:.3f}; update time: "
              f"{statistics.median(times['+ sequence parallel']) / statistics.median(times['tensor parallel alone']):.3f}")
    next(iter(learners.values())).close()  # one teardown of megatron's parallel state
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    a = _args()
    if "WORLD_SIZE" in os.environ:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        _inner(a)
    else:
        from torchrun_launch import launch  # (bench/ is this script's folder)

        launch(__file__, a.workdir, "bench_sequence_parallel_")
