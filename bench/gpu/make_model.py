"""Save a random-weight model shaped like Qwen2.5-0.5B (no download) for the GPU suite's PACS run.

Shape (Qwen2.5-0.5B's config.json): hidden 896, intermediate 4,864, 24 layers, 14 attention heads,
2 key/value heads (head size 64), vocabulary 151,936, tied embeddings, RoPE theta 1e6. The
tokenizer is pacs_fast's character tokenizer (the built-in arithmetic task needs no other), so
the vocabulary rows past its ~100 tokens are padding rows, as in every Qwen checkpoint.

    python bench/gpu/make_model.py OUT_DIR [--tiny]    # --tiny: a 2-layer hidden-128 model (CPU dry run)
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
TINY = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=512, rope_theta=10000.0,
            rms_norm_eps=1e-6, tie_word_embeddings=True)


def make(out: str, tiny: bool = False, seed: int = 0, dtype: str = "bfloat16") -> str:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from pacs_fast.data.tiny import build_char_tokenizer

    tok = build_char_tokenizer()
    shape = TINY if tiny else QWEN25_05B
    cfg = Qwen2Config(**shape, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, attention_dropout=0.0,
                      torch_dtype="float32" if tiny else dtype)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    if not tiny:
        model = model.to(getattr(torch, dtype))
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.bos_token_id = tok.bos_token_id
    tmp = out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"saved {'tiny' if tiny else 'Qwen2.5-0.5B-shaped'} random model ({n_params / 1e6:.0f} M parameters) to {out}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    make(args.out, args.tiny, args.seed)


if __name__ == "__main__":
    main()
