"""Packed rows on the CPU: varlen attention (one row, cu_seqlens) vs the dense block-diagonal mask
(issue 38): the torch learner's packed forward + backward (log-probs, PACS loss, gradients), no
optimiser step.

    OMP_NUM_THREADS=1 python bench/bench_packed_attention.py            # 1 thread, a few lengths
    python bench/bench_packed_attention.py --lengths 256,1024 --rounds 5 --out r.json

A random Qwen2 model (hidden 512, 8 / 2 heads, 2 layers, 32,000-token vocabulary, fp32, the CPU
default attention 'short'); per length L one micro-batch of G=8 rows of lognormal lengths (median
L/4, capped at L, one row of L) after a 16-token prompt. The two layouts alternate round by round;
the table gives the median of the process CPU time (robust to other processes on a shared machine)
and of the wall time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def make_batch(L: int, G: int, vocab: int, seed: int):
    from pacs_fast.learner.base import RolloutBatch

    gen = torch.Generator().manual_seed(seed)
    lengths = (torch.exp(torch.log(torch.tensor(L / 4)) + torch.randn(G, generator=gen))).round().clamp(1, L)
    lengths = lengths.long().tolist()
    lengths[0] = L
    prompt = 16
    T = prompt + L
    ids = torch.randint(3, vocab, (G, T), generator=gen)
    att = torch.zeros(G, T, dtype=torch.long)
    resp = torch.zeros(G, T)
    for i, n in enumerate(lengths):
        att[i, :prompt + n], resp[i, prompt:prompt + n] = 1, 1
    batch = RolloutBatch(ids * att, att, resp, torch.randint(0, 2, (G,), generator=gen).float(), group_size=G)
    batch.old_logp = batch.ref_logp = -torch.rand(G, T, generator=gen) * resp
    return batch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="128,512,2048")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    from transformers import Qwen2ForCausalLM

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.objective import minibatch_counts, objective
    from pacs_fast.learner.packing import restores_attention
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.ops.short_attention import use_attention

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_qwen2_config(32000, hidden_size=512, num_layers=2, num_heads=8, num_kv_heads=2,
                                               intermediate_size=1408, max_positions=4096))
    use_attention(model, "short")
    algo = AlgoConfig()
    learners = {kind: TorchLearner(model, algo=algo, learner=LearnerConfig(packing="on", packed_attention=kind))
                for kind in ("dense", "varlen")}

    @restores_attention
    def step(learner, batch):
        model.zero_grad(set_to_none=True)
        logp, _, _ = learner._forward(model, batch, entropy=False, values=False)
        loss, _ = objective(algo, batch, logp, None, None, minibatch_counts(batch), horizon=4096)
        loss.backward()

    rows = []
    for L in (int(x) for x in args.lengths.split(",")):
        batch = make_batch(L, 8, 32000, seed=L)
        times = {k: {"cpu": [], "wall": []} for k in learners}
        for r in range(args.rounds + 1):
            for kind in (("dense", "varlen") if r % 2 else ("varlen", "dense")):
                c0, w0 = time.process_time(), time.perf_counter()
                step(learners[kind], batch)
                if r:  # round 0 warms up
                    times[kind]["cpu"].append(time.process_time() - c0)
                    times[kind]["wall"].append(time.perf_counter() - w0)
        row = {"longest": L, "tokens": int(batch.attention_mask.sum()) - 8, "threads": args.threads}
        for kind in learners:
            row[f"{kind}_cpu_s"] = statistics.median(times[kind]["cpu"])
            row[f"{kind}_wall_s"] = statistics.median(times[kind]["wall"])
        row["speedup_cpu"] = row["dense_cpu_s"] / row["varlen_cpu_s"]
        rows.append(row)
        print(f"L={L:6d} tokens={row['tokens']:6d}  dense {row['dense_cpu_s']:.3f} s cpu ({row['dense_wall_s']:.3f} "
              f"wall)  varlen {row['varlen_cpu_s']:.3f} s cpu ({row['varlen_wall_s']:.3f} wall)  "
              f"dense/varlen {row['speedup_cpu']:.2f}x", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "rounds": args.rounds}, f, indent=1)


if __name__ == "__main__":
    main()
