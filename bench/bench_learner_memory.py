"""The learner memory estimate (``pacs_fast.trainer.memory_model.learner_memory``) against a measured peak (CPU).

    python bench/bench_learner_memory.py --model /tmp/mm/qwen          # the Qwen2.5-width trial model, fp32
    python bench/bench_learner_memory.py --model DIR --tokens 128,4096,8192 --checkpointing false,selective,true
    python bench/bench_learner_memory.py --model DIR --dtype bfloat16 --master-weights true,false
    python bench/bench_learner_memory.py --model DIR --lora-rank 0,16                 # LoRA adapters vs the whole model
    python bench/bench_learner_memory.py --model DIR --lora-rank 0,16 --ref fixed     # with a fixed reference policy

Each point runs in a fresh process: the trainer's learner (``build_learner``) on a synthetic group of 4 rows
of ``tokens / 4`` tokens (one micro-batch, padded rows), one update to allocate the AdamW moments, then a
second one measured: the resident set's peak (``VmHWM``, reset through ``/proc/self/clear_refs``) above the
resident set before the model loaded, up to the optimiser step (``backward``) and over the step (``step``),
side by side with the estimate's ``backward`` / ``step`` / ``total``. On the CPU the allocator keeps freed
activations resident, so the measured step peak grows with the tokens of the backward before it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

PROBE = r"""
import json, sys, torch
from transformers import AutoTokenizer
from pacs_fast.config import load_config
from pacs_fast.learner.base import RolloutBatch
from pacs_fast.trainer.build import build_learner
from pacs_fast.trainer.memory_model import learner_memory

def status(key):
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

path, tokens, gc, dtype, masters, lora, ref = (sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5],
                                              int(sys.argv[6]), sys.argv[7])
gc, granularity = ("true", "selective") if gc == "selective" else (gc, "full")
G, P = 4, 16
L = tokens // G
cfg = load_config(None, [f"model.path={path}", f"rollout.n={G}", f"rollout.max_new_tokens={L - P}",
                         f"data.max_prompt_tokens={P}", "train.prompts_per_step=1", "learner.mini_batch_prompts=1",
                         "learner.micro_batch_prompts=1", "algo.score=naive", f"model.gradient_checkpointing={gc}",
                         f"model.recompute_granularity={granularity}",
                         "learner.logprob_backend=torch", "learner.packing=off", "learner.shared_prefix=false",
                         f"model.dtype={dtype}", f"learner.master_weights={masters}", f"model.lora_rank={lora}",
                         f"algo.ref={ref}"])
tok = AutoTokenizer.from_pretrained(path)
rss0 = status("VmRSS")
learner, _ = build_learner(cfg, path, "cpu", tok)
vocab = len(tok)
ids = torch.randint(3, vocab, (G, L), generator=torch.Generator().manual_seed(0))
mask = torch.zeros(G, L)
mask[:, P:] = 1
batch = RolloutBatch(input_ids=ids, attention_mask=torch.ones(G, L, dtype=torch.long), response_mask=mask,
                     rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group_size=G)
if getattr(learner, "holds_reference", getattr(learner, "ref_model", None) is not None):  # (algo.ref=fixed)
    batch.ref_logp = learner.compute_logprobs(batch, reference=True)
learner.update(batch, seed=0)
peaks = {}
step = learner.optimizer.step

def measured_step(*a, **k):
    peaks["backward"] = status("VmHWM") - rss0
    reset_peak()
    out = step(*a, **k)
    peaks["step"] = status("VmHWM") - rss0
    return out

learner.optimizer.step = measured_step
reset_peak()
learner.update(batch, seed=1)
est = learner_memory(cfg, tokens=G * L, device="cpu")
print("RESULT " + json.dumps({"measured": peaks, "estimate": {k: est[k] for k in ("backward", "step", "total")}}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face model folder (with its tokenizer)")
    p.add_argument("--tokens", default="128,4096,8192", help="tokens of the measured micro-batch, comma-separated")
    p.add_argument("--checkpointing", default="false,true", help="model.gradient_checkpointing values (selective: "
                   "true with model.recompute_granularity=selective)")
    p.add_argument("--dtype", default="float32", help="model.dtype (float32 or bfloat16)")
    p.add_argument("--master-weights", default="true", help="learner.master_weights values (bfloat16: fp32 masters)")
    p.add_argument("--lora-rank", default="0", help="model.lora_rank values (0: the whole model trains)")
    p.add_argument("--ref", default="rollout", help="algo.ref values (fixed: the learner holds a reference policy)")
    a = p.parse_args()
    G = 1024 ** 3
    print(f"model.dtype={a.dtype}")
    print(f"{'ref':>7} {'lora':>4} {'tokens':>7} {'ckpt':>9} {'masters':>7} | {'est backward':>12} {'measured':>9} | "
          f"{'est step':>9} "
          f"{'measured':>9} | {'est total':>9} {'measured':>9}   (GiB)")
    for ref, lora in ((r, k) for r in a.ref.split(",") for k in a.lora_rank.split(",")):
        for mw in a.master_weights.split(","):
            for gc in a.checkpointing.split(","):
                for tokens in map(int, a.tokens.split(",")):
                    out = subprocess.run([sys.executable, "-c", PROBE, a.model, str(tokens), gc, a.dtype, mw, lora,
                                          ref],
                                         capture_output=True, text=True)
                    if out.returncode:
                        raise SystemExit(out.stderr[-3000:])
                    r = json.loads(out.stdout.split("RESULT ", 1)[1])
                    m, e = r["measured"], r["estimate"]
                    print(f"{ref:>7} {lora:>4} {tokens:>7} {gc:>9} {mw:>7} | {e['backward'] / G:12.2f} "
                          f"{m['backward'] / G:9.2f} | {e['step'] / G:9.2f} {m['step'] / G:9.2f} | "
                          f"{e['total'] / G:9.2f} {max(m.values()) / G:9.2f}")


if __name__ == "__main__":
    main()
