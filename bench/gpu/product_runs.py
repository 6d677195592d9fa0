"""More of the product on one GPU (issue 22 item 5), for the GPU suite:

    python bench/gpu/product_runs.py megatron MODEL OUT_JSON [--dry-run]
    python bench/gpu/product_runs.py trl MODEL OUT_JSON [--dry-run]

- ``megatron``: the megatron learner at TP=1 (one process, ``torchrun --nproc_per_node 1``) for a few
  PACS steps of ``python -m pacs_fast.train`` with the Triton log-probs (HF rollouts: a GPU image
  without network has no vLLM), packed rows on; the step records' timings.
- ``trl``: the TRL adapter (:class:`pacs_fast.integrations.trl.PACSTrainer`) for 3 steps on the model
  (bf16 on CUDA), a parity reward; the logged losses and the wall time per step.

Each writes ``OUT_JSON``: ``{"ok", "why", ...}``. A package that is missing (megatron-core, trl,
datasets: ``bash bench/gpu/wheels.sh`` brings them as wheels) gives ``ok: false`` with
``"missing": NAME``, which the suite reports as not run, not as a failure of the product.
``--dry-run``: CPU, fp32, tiny settings (checks the plumbing).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _missing(*names: str) -> str | None:
    return next((n for n in names if importlib.util.find_spec(n) is None), None)


def megatron(model: str, out: str, dry: bool) -> dict:
    miss = _missing("megatron.core" if _missing("megatron") is None else "megatron")
    if miss:
        return {"ok": False, "missing": "megatron-core", "why": "megatron-core is not installed"}
    run_root = os.path.join(os.path.dirname(out), "runs")
    steps = 2 if dry else 3
    args = [f"model.path={model}", f"train.steps={steps}", "algo.name=pacs",
            "learner.backend=megatron", "learner.tp_size=1", "learner.packing=on", "rollout.engine=hf",
            "train.eval_every=0", "train.save_every=0", "train.plots=false", "train.tensorboard=false",
            "train.progress=false", f"train.out_dir={run_root}", "train.run_name=megatron_tp1"]
    if dry:
        args += ["model.device=cpu", "model.dtype=float32", "train.prompts_per_step=2", "rollout.n=2",
                 "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2", "rollout.max_new_tokens=4",
                 "data.eval_size=2", "rollout.eval_n=1", "learner.logprob_backend=torch"]
    else:
        args += ["model.device=cuda", "model.dtype=bfloat16", "learner.logprob_backend=triton",
                 "train.prompts_per_step=16", "rollout.n=8", "learner.mini_batch_prompts=16",
                 "learner.micro_batch_prompts=8", "rollout.max_new_tokens=128", "data.eval_size=16",
                 "rollout.eval_n=1"]
    import shutil
    shutil.rmtree(os.path.join(run_root, "megatron_tp1"), ignore_errors=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "--standalone",
           "-m", "pacs_fast.train", *args]
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    log = os.path.splitext(out)[0] + ".log"  # the whole output, beside OUT_JSON (the suite packs it)
    with open(log, "w") as f:
        f.write(output)
    recs = []
    path = os.path.join(run_root, "megatron_tp1", "metrics.jsonl")
    if os.path.exists(path):
        recs = [json.loads(line) for line in open(path) if line.strip()]
    train = [r for r in recs if r.get("kind") == "train"]
    ok = proc.returncode == 0 and len(train) == steps
    keep = ("time/step", "time/rollout", "time/update", "time/logprobs", "learner/loss", "learner/grad_norm")
    return {"ok": ok, "seconds": round(time.time() - t0, 1), "steps": len(train),
            "records": [{k: r.get(k) for k in keep} for r in train], "overrides": args,
            "log": log, "why": "" if ok else f"rc {proc.returncode}, {len(train)}/{steps} steps: {first_error(output)}"}


def first_error(output: str, limit: int = 1500) -> str:
    """The cause of a failed torchrun run in ``output``: the CLI's one-line ``Error: ...`` if any,
    else the first Python traceback (up to its exception line) that is not torchrun's own (its
    closing ChildFailedError names no cause), else the output's tail."""
    lines = [re.sub(r"^\[rank\d+\]:\s?", "", ln) for ln in output.splitlines()]
    for ln in lines:
        if ln.startswith("Error: "):
            return ln[:limit]
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    for i in starts:
        end = next((j for j in range(i + 1, len(lines)) if lines[j] and not lines[j].startswith((" ", "Traceback"))),
                   len(lines) - 1)
        text = "\n".join(lines[i:end + 1])
        if "torch/distributed/run.py" in text or "ChildFailedError" in text:
            continue
        return text if len(text) <= limit else text[:300] + "\n...\n" + text[-(limit - 305):]
    return output[-limit:]


def trl(model: str, out: str, dry: bool) -> dict:
    miss = _missing("trl", "datasets")
    if miss:
        return {"ok": False, "missing": miss, "why": f"{miss} is not installed"}
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs_fast.integrations.trl import PACSConfig, PACSTrainer

    cuda = torch.cuda.is_available() and not dry
    tok = AutoTokenizer.from_pretrained(model)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16 if cuda else torch.float32)
    data = datasets.Dataset.from_list([{"prompt": f"What is {i} + {i + 1}? Answer:"} for i in range(64)])
    times, losses = [], []

    class Timed(PACSTrainer):
        def training_step(self, *a, **kw):
            t0 = time.perf_counter()
            loss = super().training_step(*a, **kw)
            times.append(time.perf_counter() - t0)
            losses.append(float(loss.detach()))
            return loss

    args = PACSConfig(output_dir=os.path.join(os.path.dirname(out), "trl"), num_generations=4 if dry else 8,
                      per_device_train_batch_size=4 if dry else 32, max_completion_length=4 if dry else 128,
                      learning_rate=1e-6, max_steps=3, logging_steps=1, report_to=[], save_strategy="no",
                      use_cpu=not cuda, bf16=cuda, seed=0, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Timed(model=policy, reward_funcs=lambda completions, **_: [float(len(c) % 2 == 0) for c in completions],
                    args=args, train_dataset=data, processing_class=tok)
    t0 = time.time()
    trainer.train()
    ok = len(losses) == 3 and all(v == v and abs(v) < 1e6 for v in losses)
    return {"ok": ok, "seconds": round(time.time() - t0, 1), "steps": len(losses), "losses": losses,
            "step_seconds": [round(t, 3) for t in times], "device": "cuda" if cuda else "cpu",
            "why": "" if ok else f"{len(losses)} steps, losses {losses}"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("megatron", "trl"))
    ap.add_argument("model")
    ap.add_argument("out_json")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    try:
        res = (megatron if a.what == "megatron" else trl)(a.model, a.out_json, a.dry_run)
    except Exception as e:  # the suite reports it; the traceback is in the step's log
        import traceback
        traceback.print_exc()
        res = {"ok": False, "why": f"{type(e).__name__}: {e}"}
    with open(a.out_json, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps({k: v for k, v in res.items() if k != "records"}))
    return 0 if res["ok"] else (3 if res.get("missing") else 1)


if __name__ == "__main__":
    sys.exit(main())
