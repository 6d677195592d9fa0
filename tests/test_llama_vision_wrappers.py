"""Llama 3.2 Vision and Llama 4 hub folders (``MllamaForConditionalGeneration``, ``Llama4ForConditionalGeneration``)
trained on text (sweep of 2026-12-07). Tiny: 2 text layers, hidden 64, a 1-layer vision model on 28x28 images, the
character tokenizer; Llama 4's layers a chunked-attention layer of 8 positions and 2 experts, then its no-RoPE full
layer (Scout: chunks of 8,192 in 3 layers of 4).

Found and fixed (each test failed before its fix, checked by reverting it):
1. The causal-LM mapping of both is a text-only class (``MllamaForCausalLM``, ``Llama4ForCausalLM``), which dropped
   the vision model on load: a run's checkpoints lacked it (41 of 66 tensors, 26 of 53 here). They load as their
   wrappers (pacs_fast/causal_lm.py ``WHOLE_WRAPPERS``); Llama 4's wrapper holds a whole causal LM as its decoder,
   whose body the learner now takes (``decoder_body``).
2. Llama 4's chunked attention (a token sees its own chunk of positions alone) was ignored by packed rows and the
   shared-prefix forward: packed log-probs 0.33 nats off the model's own at a chunk of 8, silently. Such models run
   right-padded rows, one line says so (pacs_fast/learner/packing.py ``chunked_attention``), as recurrent ones do.
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from pacs_fast.data.tiny import make_tiny_model

TEXT = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
VISION = dict(hidden_size=32, num_hidden_layers=1, intermediate_size=64, image_size=28, patch_size=14)


def wrapper(kind: str):
    import transformers as T

    if kind == "mllama":
        return T.MllamaForConditionalGeneration(T.MllamaConfig(
            text_config=dict(TEXT, cross_attention_layers=[1]),
            vision_config=dict(VISION, num_global_layers=1, attention_heads=2, vision_output_dim=64,
                               intermediate_layers_indices=[0])))
    return T.Llama4ForConditionalGeneration(T.Llama4Config(
        text_config=dict(TEXT, intermediate_size_mlp=128, num_local_experts=2, head_dim=16, attention_chunk_size=8,
                         interleave_moe_layer_step=1, no_rope_layers=[1, 0]),
        vision_config=dict(VISION, num_attention_heads=2, vision_output_dim=32, projector_input_dim=32,
                           projector_output_dim=64)))


@pytest.fixture(scope="module", params=["mllama", "llama4"])
def folder(request, tmp_path_factory) -> Path:
    out = make_tiny_model(tmp_path_factory.mktemp(request.param) / f"{request.param}-tiny")
    torch.manual_seed(0)
    model = wrapper(request.param).float()
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
    """Two steps (HF engine, defaults): engine and learner log-probs agree (Llama 4 on padded rows); the checkpoint
    holds every tensor of the input under its names, the vision model byte for byte, and reloads as the wrapper."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForImageTextToText

    from pacs_fast.train import main

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main([f"model.path={folder}", "train.steps=2", "rollout.n=4", "train.prompts_per_step=2",
              "rollout.max_new_tokens=12", f"train.out_dir={tmp_path}", "train.run_name=r", "train.progress=false",
              "train.eval_every=0", "train.save_every=2", "learner.lr=0.05"])
    steps = [s for s in map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines())
             if s.get("kind") == "train"]
    assert len(steps) == 2 and all(s["rollout/logprob_diff_max"] < 1e-5 for s in steps)
    if AutoConfig.from_pretrained(folder).model_type == "llama4":
        assert all(s["learner/forward/padded"] == 1 for s in steps)
    ckpt = tmp_path / "r" / "checkpoints" / "step_000002"
    start, saved = load_file(folder / "model.safetensors"), load_file(ckpt / "model.safetensors")
    assert set(saved) == set(start)
    vision = [n for n in start if "vision_model" in n]
    assert vision and all(torch.equal(saved[n], start[n]) for n in vision)
    assert type(AutoModelForImageTextToText.from_pretrained(ckpt)).__name__.endswith("ForConditionalGeneration")


def test_llama4s_chunks_hold_in_every_learner_forward(seed):
    """Found and fixed (2): the learner's log-probs of rows crossing chunk boundaries are the model's own, with
    ``learner.packing`` on (before: 0.33 nats off) and off, the shared-prefix forward asked for or not."""
    from test_packing import prompted_batch, uneven_batch
    from test_sliding_window_forwards import alone

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.torch_learner import TorchLearner

    torch.manual_seed(1)
    model = wrapper("llama4").float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
    gen = torch.Generator().manual_seed(seed)
    for batch in (uneven_batch(gen, 2, 2, 100, [30, 12, 25, 40]), prompted_batch(gen, 2, 2, (4, 20))):
        want, m = alone(model, batch), batch.response_mask > 0
        for packing in ("on", "off", "auto"):
            for shared in (True, False):
                learner = TorchLearner(model, algo=AlgoConfig(), learner=LearnerConfig(packing=packing,
                                                                                       shared_prefix=shared))
                logp, _, _ = learner._forward(model, batch, entropy=False, values=False)
                assert (logp[m] - want[m]).abs().max() <= 1e-5, (packing, shared)
