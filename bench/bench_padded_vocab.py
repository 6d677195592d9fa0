"""Padded vocabulary rows (issue 17, item 9): how often they are sampled and what masking costs.

A Qwen2.5-0.5B-shaped random model cut to ``--layers`` layers (hidden 896, 14 heads / 2 KV heads,
MLP 4864, 151,936 tied vocabulary rows) with one of two tokenizers:

- ``bpe8k``: a byte-level BPE of ~8k entries trained here on the shipped MATH problems (as in the
  issue's report: ~95% of the head's rows are padding);
- ``qwen``: a word-level tokenizer of 151,665 ids (Qwen2.5's count; 271 padded rows).

For each: the fraction of sampled ids ``>= len(tokenizer)`` without and with the mask, and the
time per sampled token, for the HF engine (lean sampler, merged rows off so every row is decoded;
mask = logits cut to the real ids) and for vLLM (no mask / ``allowed_token_ids`` / the logits hook
the engine uses). Timings: the fastest of ``--repeats`` calls per variant after a warm-up round, the variants
interleaved (the CPU may be shared with other work: the minimum and the interleaving resist that).

    OMP_NUM_THREADS=2 python bench/bench_padded_vocab.py [--skip-vllm] [--layers 1]
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROWS = 151_936
QWEN_IDS = 151_665


def bpe_tokenizer(size: int):
    """A byte-level BPE (GPT-2 / Qwen style pre-tokenizer) trained on MATH problem texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from pacs_fast.data.datasets import shipped_path

    # the package's copy (byte-identical to ../shared/data's), found from any checkout or install: the corpus
    # was a synthetic fallback, silently, where ../shared was not beside the checkout
    with gzip.open(shipped_path("math_train"), "rt") as f:
        texts = [json.loads(line)["problem"] for line in f]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def qwen_sized_tokenizer():
    """A word-level tokenizer with Qwen2.5's 151,665 ids (the ids are what matters here)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, "<unk>": 1}
    vocab.update({f"w{i}": i for i in range(2, QWEN_IDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   unk_token="<unk>")


def save_model(path: Path, layers: int, tokenizer, seed: int = 0) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=ROWS, hidden_size=896, intermediate_size=4864, num_hidden_layers=layers,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096,
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                      torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def prompts_of(real: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, real, (count, length), generator=g).tolist()


def run_interleaved(engine, variants, prompts, params, repeats: int) -> dict:
    """``{label: (seconds per sampled token of the fastest call, sampled ids of the last call)}``.
    ``variants``: ``(label, set_up)`` pairs; every repeat runs each variant once, in turn, so a
    change in the machine's load hits all of them alike (the CPU may be shared)."""
    from dataclasses import replace

    best = {label: (float("inf"), None) for label, _ in variants}
    for r in range(repeats + 1):  # the first round warms up
        for label, set_up in variants:
            set_up()
            t0 = time.perf_counter()
            out = engine.generate(prompts, replace(params, seed=params.seed + r))
            sec = time.perf_counter() - t0
            ids = torch.tensor([t for cs in out for c in cs for t in c.token_ids])
            if r and sec / ids.numel() < best[label][0]:
                best[label] = (sec / ids.numel(), ids)
            elif not r:
                best[label] = (float("inf"), ids)
    return best


def _unhook_padded_rows(worker) -> int:
    """Runs inside the vLLM worker: removes the engine's padded-row hooks (the unmasked baseline)."""
    count = 0
    for m in worker.model_runner.get_model().modules():
        hook = getattr(m, "_pacs_fast_vocab_hook", None)
        if hook is not None:
            hook.remove()
            m._pacs_fast_vocab_hook = None
            count += 1
    return count


def sampler_micro(rows: int, real: int, repeats: int) -> list[tuple[str, float]]:
    """Fastest ms (of ``repeats``; the minimum resists other processes' load) of the sampling step
    alone on ``[rows, ROWS]`` fp32 logits: the HF sampler on all rows vs on the real ids (a view,
    and the contiguous copy the engine makes), and the vLLM hook's -inf fill of the padded columns."""
    from pacs_fast.rollout.sampling import sample_tokens

    logits = torch.randn(rows, ROWS) * 3

    steps = []
    for temp, top_p in ((1.0, 1.0), (1.0, 0.95), (0.0, 1.0)):
        steps.append((f"HF sample_tokens T={temp} top_p={top_p}, all rows",
                      lambda t=temp, p=top_p: sample_tokens(logits, t, p)))
        steps.append((f"HF sample_tokens T={temp} top_p={top_p}, real ids (contiguous copy, as the engine)",
                      lambda t=temp, p=top_p: sample_tokens(logits[:, :real].contiguous(), t, p)))
    scratch = logits.clone()
    steps.append(("vLLM hook: logits[:, real:] = -inf", lambda: scratch[:, real:].fill_(float("-inf"))))
    best = {label: float("inf") for label, _ in steps}
    for r in range(repeats + 1):  # interleaved; the first round warms up
        for label, fn in steps:
            t0 = time.perf_counter()
            fn()
            if r:
                best[label] = min(best[label], time.perf_counter() - t0)
    return [(label, 1e3 * sec) for label, sec in best.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--bpe-size", type=int, default=8192)
    ap.add_argument("--tokenizers", default="bpe8k,qwen")
    ap.add_argument("--skip-vllm", action="store_true")
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--skip-engines", action="store_true")
    ap.add_argument("--skip-hf", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    from dataclasses import replace

    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine

    micro = [] if args.skip_micro else [(name, real, sampler_micro(args.prompts * args.n, real, 10))
                                         for name, real in (("bpe8k", args.bpe_size), ("qwen", QWEN_IDS))]
    params = SamplingParams(n=args.n, temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens, seed=0)
    rows_out, per_request = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ([] if args.skip_engines else args.tokenizers.split(",")):
            tok = bpe_tokenizer(args.bpe_size) if name == "bpe8k" else qwen_sized_tokenizer()
            real = len(tok)
            path = save_model(Path(tmp) / name, args.layers, tok)
            prompts = prompts_of(real, args.prompts, args.prompt_len)
            print(f"# {name}: len(tokenizer) = {real}, head rows = {ROWS} "
                  f"({100 * (ROWS - real) / ROWS:.2f}% padded)", file=sys.stderr)
            if not args.skip_hf:
                eng = HFEngine(path, tok, batch_size=args.prompts * args.n, sampler="lean", merge_rows=False)
                cut = eng.vocab_cut
                res = run_interleaved(eng, [("none", lambda: setattr(eng, "vocab_cut", None)),
                                            ("cut logits", lambda: setattr(eng, "vocab_cut", cut))],
                                      prompts, params, args.repeats)
                for label, (sec, ids) in res.items():
                    rows_out.append((name, "HF lean", label, (ids >= real).float().mean().item(), sec, ids.numel()))
                    print(rows_out[-1], file=sys.stderr)
                eng.close()
                del eng
            if args.skip_vllm:
                continue
            from pacs_fast.rollout.vllm_engine import VLLMEngine
            from pacs_fast.rollout.vllm_worker import mask_padded_rows

            veng = VLLMEngine(path, max_model_len=512, cpu_kv_cache_bytes=256 << 20, vocab_size=ROWS)
            assert veng.vocab_size is None  # started unmasked

            def variant(allowed: bool, hook: bool):
                def set_up():
                    veng._allowed_ids = list(range(real)) if allowed else None
                    if hook:
                        assert all(veng.llm.collective_rpc(mask_padded_rows, args=(real,)))
                    else:
                        veng.llm.collective_rpc(_unhook_padded_rows)
                return set_up

            res = run_interleaved(veng, [("none", variant(False, False)),
                                         ("allowed_token_ids", variant(True, False)),
                                         ("logits hook", variant(False, True))], prompts, params, args.repeats)
            for label, (sec, ids) in res.items():
                rows_out.append((name, "vLLM", label, (ids >= real).float().mean().item(), sec, ids.numel()))
                print(rows_out[-1], file=sys.stderr)
            # per-request cost: many prompts, one new token each (allowed_token_ids is per request)
            one = replace(params, n=1, max_new_tokens=1)
            many = prompts_of(real, 32, args.prompt_len, seed=1)
            res = run_interleaved(veng, [("none", variant(False, False)),
                                         ("allowed_token_ids", variant(True, False)),
                                         ("logits hook", variant(False, True))], many, one, args.repeats)
            for label, (sec, ids) in res.items():
                per_request.append((name, label, sec))  # one token per request: seconds per request
            veng.close()
    print(f"\nQwen2.5-0.5B-shaped random model, {args.layers} layer(s), {ROWS} head rows; "
          f"{args.prompts} prompts x n={args.n}, {args.new_tokens} new tokens, T=1; "
          f"torch threads {torch.get_num_threads()}\n")
    print("| tokenizer | engine | mask | padded ids sampled | ms / sampled token | tokens |")
    print("|---|---|---|---|---|---|")
    for name, engine, label, frac, sec, count in rows_out:
        print(f"| {name} | {engine} | {label} | {100 * frac:.2f}% | {1e3 * sec:.3f} | {count} |")
    if per_request:
        print("\nvLLM, 32 requests of one new token each (the per-request cost), fastest call\n")
        print("| tokenizer | mask | ms / request |")
        print("|---|---|---|")
        for name, label, sec in per_request:
            print(f"| {name} | {label} | {1e3 * sec:.2f} |")
    if micro:
        print(f"\nSampling step alone, [{args.prompts * args.n}, {ROWS}] fp32 logits, fastest of 10, interleaved (ms)\n")
        print("| real ids | step | ms |")
        print("|---|---|---|")
        for name, real, items in micro:
            for label, ms in items:
                print(f"| {real} | {label} | {ms:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
