"""The fp32 LM head (``model.lm_head_fp32``): rollout-training log-prob gap of a bf16 model.

A Qwen2.5-width random model (hidden 896, 14 / 2 heads, MLP 4864, 151,936 head rows for a
151,665-id tokenizer, ``--layers`` layers, untied head) in bf16. For the head in bf16 and in
fp32 (on both sides): the engine samples ``--prompts`` x ``--n`` responses (temperature 1) with
their log-probs, the torch learner (the same bf16 weights, default settings) recomputes the
log-probs of the sampled tokens, and the table gives max / mean ``|engine - learner|`` over those
tokens. Engines: the HF engine (sharing the learner's model) and, unless ``--skip-vllm``, vLLM
(``dtype=bfloat16``, ``hf_overrides={"head_dtype": "float32"}`` when on; one process each).

Random init gives logits of O(1), far smaller than a trained model's (tens), and the bf16 head's
rounding error scales with them (2^-8 relative): ``--head-scales`` multiplies the head weight to
show both (the logits' typical largest magnitude per row is printed). The gap also holds the two
sides' different bf16 arithmetic in the decoder layers (KV-cache decoding vs the learner's
packed / shared-prefix forward), which the fp32 head does not touch; ``--layers 0`` removes them
(hidden states then depend on the token alone; the learner then runs without its shared-prefix
forward, which needs a key/value cache, and vLLM, which refuses a model without layers), leaving
the heads' share.

    OMP_NUM_THREADS=2 python bench/bench_fp32_head.py [--layers 2] [--skip-vllm]
    python bench/bench_fp32_head.py --dry-run     # the same code path at tiny widths, HF only, in seconds
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_padded_vocab import QWEN_IDS, ROWS, qwen_sized_tokenizer  # noqa: E402 (the same word-level ids)


QWEN_WIDTHS = dict(hidden_size=896, num_heads=14, num_kv_heads=2, intermediate_size=4864)
DRY_WIDTHS = dict(hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)  # --dry-run


def save_model(path: Path, layers: int, head_scale: float, tok, seed: int = 0, widths: dict = QWEN_WIDTHS) -> Path:
    """The bf16 model (untied head x ``head_scale``) and tokenizer in an HF folder."""
    from transformers import Qwen2ForCausalLM

    from pacs_fast.data.tiny import tiny_qwen2_config

    cfg = tiny_qwen2_config(ROWS, num_layers=layers, max_positions=512, tie_word_embeddings=False, **widths)
    cfg.eos_token_id, cfg.pad_token_id = tok.eos_token_id, tok.pad_token_id
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def prompts_of(count: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, QWEN_IDS, (count, length), generator=g).tolist()


def sample(engine, prompts, args):
    """``(prompts, responses[i][j], logprobs[i][j])`` of one seeded call."""
    from pacs_fast.rollout.base import SamplingParams

    out = engine.generate(prompts, SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new_tokens,
                                                  seed=args.seed, return_logprobs=True))
    return [[c.token_ids for c in cs] for cs in out], [[c.logprobs for c in cs] for cs in out]


def gap(model, tok, prompts, responses, logprobs, on: bool) -> dict:
    """max / mean |engine - learner| over the sampled tokens, and the logits' scale."""
    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.trainer.batch import build_batch

    batch = build_batch(prompts, responses, [0.0] * sum(map(len, responses)), pad_id=tok.pad_token_id,
                        logprobs=logprobs)
    # no layers: no key/value cache for the shared-prefix forward (the learner then packs or pads)
    lc = LearnerConfig(shared_prefix=model.config.num_hidden_layers > 0)
    learner = TorchLearner(model, algo=AlgoConfig(), learner=lc, vocab_size=len(tok), lm_head_fp32=on)
    with torch.no_grad():
        lp = learner.compute_logprobs(batch)
        hidden = model.model(input_ids=batch.input_ids[:4]).last_hidden_state
        logit_max = (hidden.float() @ model.lm_head.weight[:len(tok)].float().T).abs().amax(-1).median()
    d = (lp - batch.behaviour_logp)[batch.response_mask > 0].double().abs()
    return {"max": float(d.max()), "mean": float(d.mean()), "tokens": d.numel(), "logit_max": float(logit_max)}


def vllm_child(folder: str, on: bool, args) -> dict:
    """In this (child) process: a bf16 vLLM engine on ``folder``, then the learner's gap."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs_fast.rollout.vllm_engine import VLLMEngine

    tok = AutoTokenizer.from_pretrained(folder)
    prompts = prompts_of(args.prompts, args.prompt_len)
    eng = VLLMEngine(folder, seed=0, dtype="bfloat16", max_model_len=512, cpu_kv_cache_bytes=256 << 20,
                     vocab_size=len(tok), lm_head_fp32=on)
    responses, logprobs = sample(eng, prompts, args)
    eng.close()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    return gap(model, tok, prompts, responses, logprobs, on)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--head-scales", default="1,8")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--dry-run", action="store_true",
                    help="check the code path in seconds: hidden 64 (2 / 1 heads, MLP 128; the head keeps its 151,936 "
                         "rows), head scale 1, 1 prompt x n=2, 4 new tokens, no vLLM; the numbers mean nothing")
    ap.add_argument("--vllm-child", nargs=2, metavar=("FOLDER", "ON"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dry_run:
        args.head_scales, args.prompts, args.n, args.prompt_len, args.new_tokens = "1", 1, 2, 4, 4
        args.skip_vllm = True
    if args.vllm_child:
        print("RESULT", json.dumps(vllm_child(args.vllm_child[0], args.vllm_child[1] == "1", args)))
        return 0

    from transformers import AutoModelForCausalLM

    from pacs_fast.rollout.hf import HFEngine

    tok = qwen_sized_tokenizer()
    prompts = prompts_of(args.prompts, args.prompt_len)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for scale in map(float, args.head_scales.split(",")):
            folder = save_model(Path(tmp) / f"s{scale:g}", args.layers, scale, tok,
                                widths=DRY_WIDTHS if args.dry_run else QWEN_WIDTHS)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
            for on in (False, True):
                responses, logprobs = sample(HFEngine(model, tok, batch_size=64, lm_head_fp32=on), prompts, args)
                rows.append((scale, "HF", on, gap(model, tok, prompts, responses, logprobs, on)))
                print(rows[-1], file=sys.stderr)
            del model
            # vLLM needs a layer with a key/value cache ("HybridKVCacheCoordinator requires at least one
            # cacheable group" with none)
            for on in ([] if args.skip_vllm or args.layers == 0 else (False, True)):
                env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TORCH_COMPILE_DISABLE="1")
                cmd = [sys.executable, __file__, "--vllm-child", str(folder), str(int(on))] + [
                    f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                    if k in ("prompts", "n", "prompt_len", "new_tokens", "seed")]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                if proc.returncode:
                    print(proc.stderr[-3000:], file=sys.stderr)
                    raise SystemExit(f"vLLM child failed (head fp32={on})")
                rows.append((scale, "vLLM", on, json.loads(proc.stdout.split("RESULT ", 1)[1])))
                print(rows[-1], file=sys.stderr)
    kind = "tiny (--dry-run)" if args.dry_run else "Qwen2.5-width"
    print(f"\nbf16 {kind} random model, {args.layers} layer(s), {ROWS} head rows ({QWEN_IDS} ids), untied head; "
          f"{args.prompts} prompts x n={args.n}, {args.new_tokens} new tokens, T=1; torch learner with "
          f"default settings; torch threads {torch.get_num_threads()}\n")
    print("| head scale | typical max \\|logit\\| | engine | head | max \\|engine - learner\\| | "
          "mean \\|engine - learner\\| | tokens |")
    print("|---:|---:|---|---|---:|---:|---:|")
    for scale, engine, on, r in rows:
        print(f"| {scale:g} | {r['logit_max']:.1f} | {engine} | {'fp32' if on else 'bf16'} | {r['max']:.2e} | "
              f"{r['mean']:.2e} | {r['tokens']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
