"""Llama 3.2 Vision (``MllamaForConditionalGeneration`` hub folders) trained on text keeps its vision model: the
causal-LM mapping of ``mllama`` is the text-only ``MllamaForCausalLM``, which dropped the vision model on load, so a
run's checkpoints were a text folder without it (41 of the 66 tensors of the tiny one here; found in the sweep of
2026-12-07). Now loaded as its wrapper (pacs_fast/causal_lm.py ``WHOLE_WRAPPERS``): the text-only forward skips the
cross-attention layers, as the text model does. Tiny: 2 text layers (the second a cross-attention layer), hidden 64,
a 1-layer vision model on 28x28 images; the character tokenizer."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from pacs_fast.data.tiny import make_tiny_model


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from transformers import MllamaConfig, MllamaForConditionalGeneration

    out = make_tiny_model(tmp_path_factory.mktemp("mllama") / "Llama-3.2-tiny-Vision")
    config = MllamaConfig(
        text_config=dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, cross_attention_layers=[1], bos_token_id=1,
                         eos_token_id=2, pad_token_id=0),
        vision_config=dict(hidden_size=32, num_hidden_layers=1, num_global_layers=1, attention_heads=2,
                           intermediate_size=64, image_size=28, patch_size=14, vision_output_dim=64,
                           intermediate_layers_indices=[0]))
    torch.manual_seed(0)
    model = MllamaForConditionalGeneration(config).float()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
    (out / "model.safetensors").unlink()
    model.save_pretrained(out)
    return out


def test_the_folder_loads_as_its_wrapper(folder):
    from transformers import AutoConfig

    from pacs_fast.causal_lm import auto_model_class

    assert auto_model_class(AutoConfig.from_pretrained(folder)).__name__ == "AutoModelForImageTextToText"


def test_a_run_keeps_the_vision_model_and_its_engine_and_learner_agree(folder, tmp_path):
    """Two steps (HF engine, defaults): engine and learner log-probs agree; the checkpoint holds every tensor of the
    input under its names, the vision model byte for byte, and reloads as the wrapper."""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from pacs_fast.train import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main([f"model.path={folder}", "train.steps=2", "rollout.n=4", "train.prompts_per_step=2",
              "rollout.max_new_tokens=8", f"train.out_dir={tmp_path}", "train.run_name=r", "train.progress=false",
              "train.eval_every=0", "train.save_every=2", "learner.lr=0.05"])
    steps = [s for s in map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines())
             if s.get("kind") == "train"]
    assert len(steps) == 2 and all(s["rollout/logprob_diff_max"] < 1e-5 for s in steps)
    ckpt = tmp_path / "r" / "checkpoints" / "step_000002"
    start, saved = load_file(folder / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert set(saved) == set(start) and len(start) == 66
    vision = [n for n in start if "vision_model" in n]
    assert vision and all(torch.equal(saved[n], start[n]) for n in vision)
    assert type(AutoModelForImageTextToText.from_pretrained(ckpt)).__name__ == "MllamaForConditionalGeneration"
