"""Host memory of a checkpoint: writing the HF folder (``save_hf``), reading ``learner.pt``, and a resume's weights.

    python bench/bench_checkpoint_memory.py                  # Qwen2.5-0.5B shape (24 layers), fp32, ~1.8 GiB
    python bench/bench_checkpoint_memory.py --layers 4       # smaller and faster
    python bench/bench_checkpoint_memory.py --dry-run        # the same code path on a tiny model, in seconds

Each measurement runs in a fresh process (peak memory is per process; ``/proc/self/clear_refs`` resets it before
the operation): a random fp32 model of Qwen2.5-0.5B's widths (hidden 896, 14 / 2 heads, FFN 4,864, vocabulary
151,936, tied head) in a :class:`~pacs_fast.learner.torch_learner.TorchLearner`, then

- ``save_hf`` at the default shard size (one file up to ~4 GB) and at 256 MiB buckets: the growth of the peak
  resident set over the save (``VmHWM``), the files written, the seconds;
- ``load_state`` of a ``learner.pt`` holding AdamW's two moments for every parameter (2x the fp32 weights; a bf16
  model's fp32 masters add 2x its weights): the growth of the peak over the load and of the anonymous resident
  memory (``RssAnon``) after it. A CPU learner reads the file whole (its tensors stay where they are loaded); a
  learner off the CPU memory-maps it (``maps_state_files``): here an optimizer whose parameters are on the meta
  device stands in for a GPU learner's (its moments are moved there without being read; on a GPU each is read
  from the mapping as it is copied). Every learner read it whole before 2026-12-03.
- the weights' load on resume (``load_checkpoint`` of the folders ``save_hf`` wrote, one file and 256 MiB shards,
  beside a fresh learner's small ``learner.pt``): into the torch learner, and into the megatron learner's
  ``load_hf_weights`` at TP 1 (one rank; its model's parameters plain CPU tensors under megatron's names, no process
  group): the growth of the peak over the load and of the anonymous resident memory after it. Before 2026-12-03
  ``load_checkpoint`` read every tensor into one dict first (and the megatron learner converted them all to its
  shards before copying any); now the learner checks names and shapes from the headers and reads a tensor at a time.

The model is on the CPU, so a save copies each bucket from the live parameters (on a GPU the copy is the
device-to-host one). Linux only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

PROBE = r"""
import json, os, sys, time
import torch, transformers
from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.torch_learner import TorchLearner

op, layers, folder, bucket = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
cfg = transformers.Qwen2Config(num_hidden_layers=layers, tie_word_embeddings=True, **json.loads(sys.argv[5]))
torch.manual_seed(0)
learner = TorchLearner(transformers.Qwen2ForCausalLM(cfg), algo=AlgoConfig(name="pacs"), learner=LearnerConfig(),
                       temperature=1.0, horizon=4)

n_params = sum(p.numel() for p in learner.model.parameters())


def kib(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":"))

if op == "megatron":  # a megatron learner's stand-in: CPU parameters under megatron's names (TP 1), nothing else
    import types
    from pacs_fast.learner.megatron.convert import hf_to_megatron
    from pacs_fast.learner.megatron.learner import MegatronLearner
    meta = {n: t.to("meta") for n, t in learner.model.state_dict().items()}
    params = {n: torch.nn.Parameter(torch.zeros_like(t, device="cpu"), requires_grad=False)
              for n, t in hf_to_megatron(meta, cfg).items()}
    del learner, meta
    learner = types.SimpleNamespace(model=types.SimpleNamespace(named_parameters=params.items), hf_config=cfg,
                                    master=None, tp_size=1, tp_rank=0, load_state=lambda folder: None)
    learner.load_hf_weights = lambda items: MegatronLearner.load_hf_weights(learner, items)
if op == "moments":  # the learner.pt a trained learner writes
    for p in learner.optimizer.param_groups[0]["params"]:
        learner.optimizer.state[p].update(step=torch.tensor(1.0), exp_avg=torch.randn_like(p),
                                          exp_avg_sq=torch.rand_like(p))
    learner.save_state(folder, is_writer=True)
    print(json.dumps({}))
    sys.exit(0)
open("/proc/self/clear_refs", "w").write("5")
rss, anon, t = kib("VmRSS"), kib("RssAnon"), time.perf_counter()
if op == "save":
    learner.save_hf(folder, bucket_bytes=bucket or None)
elif op in ("resume", "megatron"):
    from pacs_fast.trainer.checkpoint import load_checkpoint
    load_checkpoint(folder, learner=learner)
elif op == "load":
    learner.load_state(folder)
else:  # the parameters off the CPU: an optimizer over meta-device stand-ins, loaded by the learner's load_state
    import types
    from pacs_fast.learner.base import Learner
    meta = [torch.nn.Parameter(torch.empty_like(p, device="meta")) for p in learner.optimizer.param_groups[0]["params"]]
    optimizer = torch.optim.AdamW(meta)
    stand_in = types.SimpleNamespace(optimizer=optimizer, device=torch.device("meta"),
                                     load_state_dict=lambda state: optimizer.load_state_dict(state["optimizer"]))
    del learner
    open("/proc/self/clear_refs", "w").write("5")
    rss, anon, t = kib("VmRSS"), kib("RssAnon"), time.perf_counter()
    Learner.load_state(stand_in, folder)
out = {"seconds": time.perf_counter() - t, "peak_mib": (kib("VmHWM") - rss) / 1024,
       "anon_mib": (kib("RssAnon") - anon) / 1024,
       "params": n_params,
       "files": sorted(f for f in os.listdir(folder) if f.startswith("model") or f == "learner.pt")}
if op == "save":  # what else a resume reads: a fresh learner's learner.pt (no moments: ~the weights' load alone)
    from pacs_fast.trainer.checkpoint import rng_state
    learner.save_state(folder, is_writer=True)
    torch.save({"step": 1, "rng": rng_state()}, os.path.join(folder, "trainer_state.pt"))
print(json.dumps(out))
"""


QWEN_WIDTHS = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                   num_key_value_heads=2)
DRY_WIDTHS = dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)


def probe(op: str, layers: int, folder: str, bucket: int = 0, widths: dict = QWEN_WIDTHS) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, op, str(layers), folder, str(bucket), json.dumps(widths)],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"probe {op!r} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe_forked(op: str, layers: int, folder: str, bucket: int = 0, widths: dict = QWEN_WIDTHS) -> dict:
    """``--dry-run``'s :func:`probe`: PROBE in a child forked from this process, which imported torch, transformers
    and the learners once (a fresh interpreter per probe costs seconds of imports each; the child still has a
    process of its own, and PROBE resets the peak before measuring)."""
    import traceback

    import transformers

    transformers.Qwen2ForCausalLM  # noqa: B018 (a lazy import: once, before the fork)
    import pacs_fast.learner.megatron.learner  # noqa: F401 (what PROBE imports, before the fork)
    import pacs_fast.learner.torch_learner  # noqa: F401
    import pacs_fast.trainer.checkpoint  # noqa: F401

    sys.stdout.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: PROBE's stdout into the pipe
        os.close(read)
        code = 0
        try:
            os.dup2(write, 1)
            sys.argv = ["-c", op, str(layers), folder, str(bucket), json.dumps(widths)]
            exec(compile(PROBE, "<probe>", "exec"), {"__name__": "__main__"})
        except SystemExit as e:
            code = e.code or 0
        except BaseException:  # noqa: BLE001 - reported by the parent
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    if status:
        raise SystemExit(f"probe {op!r} failed (status {status})")
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--dry-run", action="store_true",
                        help="check the code path in seconds: a tiny model (vocabulary 1,024, hidden 64, 1 layer), "
                             "64 KiB shards instead of 256 MiB, each probe forked from this process instead of a "
                             "fresh interpreter; the memory figures mean nothing")
    args = parser.parse_args(argv)
    widths, shard = (DRY_WIDTHS, 64 << 10) if args.dry_run else (QWEN_WIDTHS, 256 << 20)
    if args.dry_run:
        args.layers = 1
    size = f"{shard >> 20} MiB" if shard >= 1 << 20 else f"{shard >> 10} KiB"
    probe = probe_forked if args.dry_run else globals()["probe"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, bucket in (("save_hf, default shard size", 0), (f"save_hf, {size} buckets", shard)):
            r = probe("save", args.layers, f"{tmp}/hf_{bucket}", bucket, widths)
            rows.append((label, r["peak_mib"], r["seconds"], f"{len(r['files'])} file(s)"))
        probe("moments", args.layers, f"{tmp}/state", 0, widths)
        for op, label in (("load", "load_state, a CPU learner: learner.pt read whole"),
                          ("offcpu", "load_state, parameters off the CPU: learner.pt memory-mapped")):
            r = probe(op, args.layers, f"{tmp}/state", 0, widths)
            rows.append((label, r["peak_mib"], r["seconds"], f"anonymous memory +{r['anon_mib']:,.0f} MiB"))
        for op, bucket, label in (("resume", 0, "resume's weights, torch learner: one model.safetensors"),
                                  ("resume", shard, f"resume's weights, torch learner: {size} shards"),
                                  ("megatron", 0, "resume's weights, megatron learner (TP 1): one model.safetensors")):
            r = probe(op, args.layers, f"{tmp}/hf_{bucket}", 0, widths)
            rows.append((label, r["peak_mib"], r["seconds"], f"anonymous memory +{r['anon_mib']:,.0f} MiB"))
    weights = r["params"] * 4 / 2**20
    kind = "tiny (--dry-run)" if args.dry_run else "Qwen2.5-0.5B"
    print(f"{kind} widths, {args.layers} layers, {r['params'] / 1e6:.0f}M parameters, fp32 weights "
          f"{weights:,.0f} MiB (learner.pt: 2x)\n")
    print("| operation | peak RSS growth (MiB) | seconds | notes |\n|---|---:|---:|---|")
    for label, peak, seconds, note in rows:
        print(f"| {label} | {peak:,.0f} | {seconds:.1f} | {note} |")


if __name__ == "__main__":
    main()
