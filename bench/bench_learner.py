"""Learner throughput on long, uneven responses: padded rows vs packed rows vs packed rows with
token-budget micro-batches (the torch learner; issue 21).

    python bench/bench_learner.py                          # ~25M model, G=8, 2 threads
    python bench/bench_learner.py --groups 4 --rounds 3 --threads 2

Each measurement is a fresh process (``python bench/bench_learner.py --one MODE``), so peak memory
(max RSS) is its own; modes alternate round by round and the table gives medians. One measurement:
a random ~25M-parameter Qwen2 model (hidden 512, 4 layers, 32,000-token vocabulary, fp32), one
rollout batch of ``--groups`` groups x G responses whose lengths are lognormal (median 40, sigma 1,
clipped to [1, 512]) after a shared 24-token prompt, and ``learner.update`` (forward + backward +
AdamW step over the batch) timed after one untimed update. Tokens/s counts the real tokens
(prompt + response) of the batch. ``learner.shared_prefix=false`` in every mode, so the modes
differ only in the row layout; the default (``learner.packing=auto``, shared prefix on) and the shared-prefix
forward without packing are shown as the fifth and sixth lines. The fourth line's budget (600 tokens) is under most
groups, which then train a few rows at a time (one more forward of their rows: ``learner.split_groups``).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

MODES = {
    "padded": dict(packing="off", shared_prefix=False, max_tokens_per_micro_batch=0),
    "packed": dict(packing="on", shared_prefix=False, max_tokens_per_micro_batch=0),
    "packed + token budget": dict(packing="on", shared_prefix=False, max_tokens_per_micro_batch=1536),
    # under most groups (a row is <= 536 tokens): those train a few rows at a time (learner.split_groups=auto)
    "packed + budget under a group": dict(packing="on", shared_prefix=False, max_tokens_per_micro_batch=600),
    "auto (default: shared prefix or packed)": dict(packing="auto", shared_prefix=True, max_tokens_per_micro_batch=0),
    "shared prefix": dict(packing="off", shared_prefix=True, max_tokens_per_micro_batch=0),
}


def make_batch(groups: int, G: int, vocab: int, seed: int):
    from pacs_fast.learner.base import RolloutBatch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.exp(torch.log(torch.tensor(40.0)) + torch.randn(groups * G, generator=gen)).round()
    lengths = lengths.clamp(1, 512).long().tolist()
    prompt = 24
    T = prompt + max(lengths)
    ids = torch.zeros(groups * G, T, dtype=torch.long)
    att = torch.zeros_like(ids)
    resp = torch.zeros(groups * G, T)
    for g in range(groups):
        p = torch.randint(3, vocab, (prompt,), generator=gen)
        for j in range(G):
            i, n = g * G + j, lengths[g * G + j]
            ids[i, :prompt], ids[i, prompt:prompt + n] = p, torch.randint(3, vocab, (n,), generator=gen)
            att[i, :prompt + n], resp[i, prompt:prompt + n] = 1, 1
    rewards = torch.randint(0, 2, (groups * G,), generator=gen).float()
    return RolloutBatch(ids, att, resp, rewards, group_size=G)


def measure(mode: str, groups: int, G: int, threads: int) -> dict:
    from transformers import Qwen2ForCausalLM

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.ops.short_attention import use_attention

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(tiny_qwen2_config(32000, hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=2,
                                               intermediate_size=1408, max_positions=1024))
    use_attention(model, "short")  # the CPU default (model.attention=auto)
    params = sum(p.numel() for p in model.parameters())
    lc = LearnerConfig(mini_batch_prompts=groups, micro_batch_prompts=groups, lr=1e-5, **MODES[mode])
    learner = TorchLearner(model, algo=AlgoConfig(), learner=lc, horizon=512)
    times = []
    for k in range(2):
        batch = make_batch(groups, G, 32000, seed=k)
        t0 = time.perf_counter()
        metrics = learner.update(batch, seed=k)
        times.append(time.perf_counter() - t0)
    tokens = int(make_batch(groups, G, 32000, seed=1).attention_mask.sum())
    return {"mode": mode, "seconds": times[-1], "tokens": tokens, "params": params,
            "split_groups": metrics.get("split_groups", 0.0),
            "max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.one, a.groups, a.G, a.threads)))
        return
    modes = [m for m in a.modes.split(",") if m]
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(a.rounds):
        for m in (modes if r % 2 == 0 else modes[::-1]):  # alternate the order round by round
            out = subprocess.run([sys.executable, __file__, "--one", m, "--groups", str(a.groups), "--G", str(a.G),
                                  "--threads", str(a.threads)], capture_output=True, text=True, check=True)
            runs[m].append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = statistics.median(x["seconds"] for x in runs[modes[0]])
    first = runs[modes[0]][0]
    print(f"learner.update, {first['params'] / 1e6:.1f}M-parameter model, {a.groups} groups x G={a.G}, "
          f"{first['tokens']} real tokens, {a.threads} threads, median of {a.rounds}")
    print(f"| mode | update (s) | tokens/s | vs {modes[0]} | peak RSS (GB) | groups split |")
    print("|---|---|---|---|---|---|")
    for m in modes:
        sec = statistics.median(x["seconds"] for x in runs[m])
        rss = statistics.median(x["max_rss_gb"] for x in runs[m])
        split = runs[m][0]["split_groups"]
        print(f"| {m} | {sec:.2f} | {first['tokens'] / sec:,.0f} | {base / sec:.2f}x | {rss:.2f} | "
              f"{f'{split:g} of {a.groups}' if split else '-'} |")


if __name__ == "__main__":
    main()
