"""Scale-out bench: every rank generates (colocated vLLM engine per TP group) and trains on its own
share; one step = rollout + log-probs + update + shard-local weight sync, without the trainer.

    python bench/bench_scaleout.py                         # throughput table: 1 and 2 processes
    python bench/bench_scaleout.py --checkpoint-memory     # per-rank peak of checkpoint/export (issue 17.14)
    python bench/bench_scaleout.py --models tiny --procs 1 --prompts 2 --group 2 --max-new-tokens 4 --steps 1
                                                           # the quickest throughput path (one launch, ~30 s)

Throughput: each configuration is one ``torchrun --nproc_per_node {1,2}`` launch (tp=1, dp=procs,
1 thread per process, ``OMP_NUM_THREADS=1``), on random-weight models: the built-in tiny model
(hidden 128, 2 layers) and a ~25M-parameter one (hidden 512, 8 layers, intermediate 1536). The same
global prompts and seeds in both launches (seeds by global prompt index), so both generate the same
tokens. Rollout tokens/s = all ranks' generated tokens / the slowest rank's rollout time; on a shared
machine (fewer free cores than processes) the wall clock cannot show the scaling, so the table also
gives tokens per CPU-second of the busiest rank (what the wall rate would be with one free core per
process; it includes the data-parallel engines' lock-step overhead: dummy steps, one all-reduce per
step). Sync peak
= the largest per-rank increase of peak RSS during the sync (``/proc/self/clear_refs`` resets it).

Checkpoint memory: a Qwen2.5-0.5B-shaped random model with 2 layers (hidden 896, vocabulary 151,936,
14 heads / 2 KV heads, intermediate 4,864, tied; 166M parameters) under TP=2 (2 processes) after one
update; per-rank peak RSS increase of (before) the full-gather path (``state_dict()`` gathers optimiser
moments and reference to full HF tensors on every rank, and the old ``save_hf`` all-gathered every
weight on every rank: ``export_hf_weights``) vs (after) ``save_state`` (per-rank shard files, nothing
gathered) + ``save_hf`` (gathered to rank 0 a bucket at a time).
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MODELS = {
    "tiny (built-in shape, 0.5M)": {},
    "25M": {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1536},
}


def _rss_kib(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def _reset_peak() -> int:
    Path("/proc/self/clear_refs").write_text("5")
    return _rss_kib("VmRSS")


def _launch(nproc: int, args: list[str]) -> dict:
    out = Path(tempfile.mkdtemp(prefix="bench_scaleout_")) / "result.json"
    atexit.register(shutil.rmtree, out.parent, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TORCH_COMPILE_DISABLE": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           "--standalone", __file__, "--worker", "--out", str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"worker failed:\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def _learner(path, tp, *, prompts, local=True):
    from transformers import AutoTokenizer

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.megatron.learner import MegatronLearner

    cfg = LearnerConfig(backend="megatron", tp_size=tp, lr=1e-5, mini_batch_prompts=prompts,
                        micro_batch_prompts=prompts, logprob_backend="torch")
    return MegatronLearner(path, algo=AlgoConfig(), learner=cfg, horizon=64, local_batches=local,
                           vocab_size=len(AutoTokenizer.from_pretrained(path)))


def _max(x: float) -> float:
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _sum(x: float) -> float:
    import torch.distributed as dist

    t = torch.tensor([x], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t)


def make_batch(prompts, comps, rewards, G):
    """Right-padded ``RolloutBatch`` from prompts and their G completions each (the trainer's own
    :func:`pacs_fast.trainer.batch.build_batch`, pad id 0)."""
    from pacs_fast.trainer.batch import build_batch

    assert all(len(cs) == G for cs in comps)
    return build_batch(prompts, [[c.token_ids for c in cs] for cs in comps], torch.as_tensor(rewards).tolist(),
                       pad_id=0)


def worker_throughput(a) -> dict:
    import torch.distributed as dist

    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.parallel_engines import colocated_engine_kwargs, dp_share, sync_colocated
    from pacs_fast.rollout.vllm_engine import VLLMEngine

    learner = _learner(a.model, 1, prompts=a.prompts)
    world = dist.get_world_size()
    engine = VLLMEngine(a.model, seed=0, max_model_len=256, gpu_memory_utilization=0.05,
                        **colocated_engine_kwargs(1, world, lockstep=a.lockstep))
    gen = torch.Generator().manual_seed(0)
    rows = []
    for step in range(a.steps + 1):  # step 0: warm-up, not counted
        prompts = [[1] + torch.randint(3, 60, (16,), generator=gen).tolist() for _ in range(a.prompts)]
        share, offset = dp_share(prompts, learner.dp_rank, world)
        t = {}
        t0, c0 = time.perf_counter(), time.process_time()
        comps = engine.generate(share, SamplingParams(n=a.group, max_new_tokens=a.max_new_tokens,
                                                      seed=1000 * step + offset * a.group))
        t["rollout"] = time.perf_counter() - t0
        rollout_cpu = time.process_time() - c0
        tokens = sum(len(c.token_ids) for cs in comps for c in cs)
        rewards = (torch.rand(len(share) * a.group, generator=torch.Generator().manual_seed(step)) < 0.5).float()
        batch = make_batch(share, comps, rewards, a.group)
        t0 = time.perf_counter()
        batch.old_logp = batch.ref_logp = learner.compute_logprobs(batch)
        t["logprobs"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        learner.update(batch, seed=step)
        t["update"] = time.perf_counter() - t0
        before = _reset_peak()
        t0 = time.perf_counter()
        sync_colocated(engine, learner, bucket_bytes=a.bucket_bytes)
        t["sync"] = time.perf_counter() - t0
        peak = (_rss_kib("VmHWM") - before) / 1024
        row = {k: _max(v) for k, v in t.items()}
        row["step"] = sum(row.values())
        row["tokens"] = _sum(tokens)
        row["rollout_cpu"] = _max(rollout_cpu)  # the busiest rank's CPU seconds (1 thread each)
        row["sync_peak_mib"] = _max(peak)
        if step:
            rows.append(row)
    n_params = sum(p.numel() for p in learner.model.parameters())
    out = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    out["tokens_per_s"] = out["tokens"] / out["rollout"]
    out["tokens_per_cpu_s"] = out["tokens"] / out["rollout_cpu"]  # tok/s with one free core per process
    out["params"] = _sum(n_params) / world
    return out  # the engine is not closed: under external_launcher vLLM's shutdown tears down the process group


def worker_checkpoint(a) -> dict:
    import torch.distributed as dist

    learner = _learner(a.model, 2, prompts=1, local=False)
    from pacs_fast.learner.base import RolloutBatch

    ids = torch.randint(3, 60, (2, 24), generator=torch.Generator().manual_seed(0))
    rm = torch.zeros(2, 24)
    rm[:, 8:] = 1
    batch = RolloutBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=rm,
                         rewards=torch.tensor([1.0, 0.0]), group_size=2)
    batch.old_logp = batch.ref_logp = learner.compute_logprobs(batch)
    learner.update(batch, seed=0)  # AdamW moments exist
    folder = Path(a.out).parent
    res = {}
    import gc

    def sync_side():  # what a weight sync gathers on the learner side, bucket by bucket
        for bucket in learner.iter_hf_weight_buckets(a.bucket_bytes):
            del bucket

    for name, fn in (
        ("before", lambda: (learner.state_dict(), dict(learner.export_hf_weights()))),
        ("after", lambda: (learner.save_state(folder / "state", is_writer=dist.get_rank() == 0),
                           learner.save_hf(folder / "hf", bucket_bytes=a.bucket_bytes))),
        ("sync gather", sync_side),
    ):
        gc.collect()
        dist.barrier()
        base = _reset_peak()
        t0 = time.perf_counter()
        kept = fn()
        seconds = time.perf_counter() - t0
        peaks = [None] * dist.get_world_size()
        dist.all_gather_object(peaks, (_rss_kib("VmHWM") - base) / 1024)
        del kept
        res[name] = {"peak_mib_per_rank": peaks, "seconds": _max(seconds)}
    res["params"] = sum(p.numel() for p in learner.model.parameters()) * 2  # tp=2 shards, vocab counted once
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint-memory", action="store_true", help="the issue-17.14 memory table instead")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (global)")
    ap.add_argument("--group", type=int, default=4, help="responses per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3, help="timed steps (after one warm-up step)")
    ap.add_argument("--bucket-bytes", type=int, default=64 << 20)
    ap.add_argument("--lockstep", action="store_true", help="vLLM's data parallelism (engines step together) "
                    "instead of independent engines")
    ap.add_argument("--models", default="tiny,25M", help="which models of the throughput table: tiny, 25M or both")
    ap.add_argument("--procs", default="1,2", help="processes per launch of the throughput table: 1, 2 or both "
                    "(speed-ups are against the first)")
    a = ap.parse_args()
    models = {name: kw for name, kw in MODELS.items() if name.split()[0] in a.models.split(",")}
    procs = [int(n) for n in a.procs.split(",")]
    if not models or len(models) != len(set(a.models.split(","))) or not set(procs) <= {1, 2}:
        ap.error(f"--models: from {', '.join(n.split()[0] for n in MODELS)}; --procs: from 1, 2")
    if a.steps < 1:
        ap.error("--steps: at least 1 (timed steps)")
    if a.worker:
        import torch.distributed as dist

        torch.set_num_threads(1)
        import warnings

        warnings.filterwarnings("ignore")
        res = worker_checkpoint(a) if a.checkpoint_memory else worker_throughput(a)
        if dist.get_rank() == 0:
            Path(a.out).write_text(json.dumps(res))
        dist.barrier()
        return
    from pacs_fast.data.tiny import make_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="bench_scaleout_models_"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # (the models: 2.5 GB were left behind)
    common = ["--prompts", str(a.prompts), "--group", str(a.group), "--max-new-tokens", str(a.max_new_tokens),
              "--steps", str(a.steps), "--bucket-bytes", str(a.bucket_bytes)] + (["--lockstep"] if a.lockstep else [])
    if a.checkpoint_memory:
        path = make_tiny_model(tmp / "qwen05b_2l", seed=0, hidden_size=896, num_layers=2, num_heads=14,
                               num_kv_heads=2, intermediate_size=4864)
        _patch_vocab(path, 151936)
        r = _launch(2, ["--model", str(path), "--checkpoint-memory", *common])
        print(f"Qwen2.5-0.5B-shaped, 2 layers, {r['params'] / 1e6:.0f}M parameters (shards summed), TP=2, "
              f"bucket {a.bucket_bytes >> 20} MiB")
        print("| path | peak RSS increase per rank (MiB) | time (s) |\n|---|---|---|")
        for k in ("before", "after", "sync gather"):
            print(f"| {k} | {', '.join(f'{x:.0f}' for x in r[k]['peak_mib_per_rank'])} | {r[k]['seconds']:.2f} |")
        return
    print(f"{a.prompts} prompts x {a.group} responses, <= {a.max_new_tokens} new tokens, tp=1, 1 thread per "
          f"process, mean of {a.steps} steps after a warm-up step, "
          f"{'lock-step (vLLM data parallelism)' if a.lockstep else 'independent'} engines")
    print("| model | processes | rollout tok/s (wall) | speed-up | tok per busiest-rank CPU s | speed-up | "
          "rollout s | logprobs s | update s | sync s | sync share | sync peak MiB/rank | step s |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, kw in models.items():
        path = make_tiny_model(tmp / name.split()[0], seed=0, **kw)
        one = one_cpu = None
        for nproc in procs:
            r = _launch(nproc, ["--model", str(path), *common])
            one, one_cpu = one or r["tokens_per_s"], one_cpu or r["tokens_per_cpu_s"]
            print(f"| {name} | {nproc} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / one:.2f}x | "
                  f"{r['tokens_per_cpu_s']:.0f} | {r['tokens_per_cpu_s'] / one_cpu:.2f}x | "
                  f"{r['rollout']:.2f} | {r['logprobs']:.3f} | {r['update']:.3f} | {r['sync']:.3f} | "
                  f"{r['sync'] / r['step']:.1%} | {r['sync_peak_mib']:.0f} | {r['step']:.2f} |", flush=True)


def _patch_vocab(path: Path, vocab: int) -> None:
    """Grow a saved random model's vocabulary (embedding rows) to ``vocab`` (Qwen2.5's 151,936)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.resize_token_embeddings(vocab)
    model.save_pretrained(path)


if __name__ == "__main__":
    main()
