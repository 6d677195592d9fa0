"""A model folder's tensors that transformers does not load (multi-token-prediction layers: Qwen3.5's ``mtp.*``,
DeepSeek-V3's ``model.layers.61.*``) are carried unchanged into the torch learner's saves and skipped by its loads
(pacs_fast/learner/carried_tensors.py). A run on a real-shaped Qwen3.5 folder: tests/test_qwen35_path_sweep.py."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.learner.carried_tensors import carried_names, unloaded_pattern
from pacs_fast.learner.hf_folder import LazyHFCheckpoint
from test_qwen35_path_sweep import TEXT, mtp_tensors


def tiny_qwen35(folder: Path):
    """A text-only Qwen3.5 (vocabulary 128) saved in two shards as the hub shards it, the ``mtp.*`` tensors (bf16)
    in the last one, which the index names."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    keys = {k: v for k, v in TEXT.items() if k not in ("model_type", "rope_parameters")}
    config = AutoConfig.for_model("qwen3_5_text", **{**keys, "vocab_size": 128, "tie_word_embeddings": False})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    state = {n: t.contiguous() for n, t in model.state_dict().items()}
    shards = {"model-00001-of-00002.safetensors": state, "model-00002-of-00002.safetensors": mtp_tensors()}
    for name, tensors in shards.items():
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {n: f for f, ts in shards.items() for n in ts}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def learner_on(folder: Path, *, lora: bool = False):
    from transformers import AutoModelForCausalLM

    from pacs_fast.learner.torch_learner import TorchLearner

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if lora:
        pytest.importorskip("peft", reason="PEFT (the lora extra) is not installed")
        from pacs_fast.learner.lora import add_lora

        add_lora(model, rank=2, alpha=4, dropout=0.0, target_modules="all-linear")
    learner = TorchLearner(model, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(), temperature=1.0, horizon=4)
    learner.carry_from(folder)
    return learner


def read(folder: Path) -> dict:
    weights = LazyHFCheckpoint(folder)
    return {n: weights[n].clone() for n in weights}


def test_the_patterns_are_transformers_own_declarations():
    """Qwen3.5's text model declares ``^mtp.*`` (its wrapper adds the vision tower's); a Llama declares none."""
    from transformers import AutoConfig, AutoModelForCausalLM

    keys = {k: v for k, v in TEXT.items() if k not in ("model_type", "rope_parameters")}
    qwen = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3_5_text", **{**keys, "vocab_size": 128}))
    pattern = unloaded_pattern(qwen)
    assert pattern.search("mtp.layers.0.mlp.up_proj.weight") and not pattern.search("model.layers.0.mlp.up_proj.weight")
    llama = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", hidden_size=16, intermediate_size=32,
                                                                  num_hidden_layers=1, num_attention_heads=2,
                                                                  vocab_size=64))
    assert unloaded_pattern(llama) is None and carried_names(["mtp.fc.weight"], None, set()) == []


def test_a_layer_number_pattern_never_takes_a_layer_the_model_holds():
    """DeepSeek-V3 declares ``model\\.layers\\.61.*`` (its MTP layer, past the 61 it loads): carried from a folder of
    that model, but a model that holds a layer 61 of its own writes it as its own (not a second, stale copy)."""
    pattern = re.compile(r"(?:model\.layers\.61.*)")
    names = ["model.layers.60.mlp.gate.weight", "model.layers.61.enorm.weight", "model.layers.61.eh_proj.weight"]
    assert carried_names(names, pattern, {"model.layers.60", "lm_head"}) == names[1:]
    assert carried_names(names, pattern, {"model.layers.60", "model.layers.61"}) == []


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_save_carries_them_unchanged_and_a_load_skips_them(tmp_path, lora):
    """save_hf in buckets of one layer: the model's shards, then the carried tensors in shards of their own, every
    name in the index, each ``mtp.*`` byte for byte in bf16; transformers loads the folder (skipping them, as from the
    hub) to the learner's weights; the learner's own load takes the folder back; without the carried set the same
    load refuses the names (what a ``--resume`` did before)."""
    from transformers import AutoModelForCausalLM

    src = tiny_qwen35(tmp_path / "in")
    learner = learner_on(src, lora=lora)
    assert learner.carried and len(learner.carried.names) == 15
    out = tmp_path / "out"
    learner.save_hf(out, bucket_bytes=1)
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    files = sorted(set(index.values()))
    carried_files = {index[n] for n in learner.carried.names}
    model_files = {f for n, f in index.items() if n not in learner.carried.names}
    assert len(model_files) > 3 and not carried_files & model_files and max(model_files) < min(carried_files)
    saved, want = read(out), mtp_tensors()
    assert all(saved[n].dtype == torch.bfloat16 and torch.equal(saved[n], t) for n, t in want.items())
    own = dict(learner.export_hf_weights())
    assert set(saved) == set(own) | set(want)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert all(torch.equal(loaded.state_dict()[n], t) for n, t in own.items())
    learner.load_hf_weights(LazyHFCheckpoint(out).items())
    if not lora:
        learner.carried = None
        with pytest.raises(ValueError, match="unknown names"):
            learner.load_hf_weights(LazyHFCheckpoint(out).items())


def test_a_folder_without_them_writes_the_model_alone(tmp_path):
    """The same model from a folder without ``mtp.*`` (a checkpoint of another tool): nothing carried, the save is
    the model's one file as before."""
    from safetensors.torch import load_file, save_file

    src = tiny_qwen35(tmp_path / "in")
    save_file(load_file(src / "model-00001-of-00002.safetensors"), str(src / "model.safetensors"))
    learner = learner_on(src)
    assert not learner.carried
    learner.save_hf(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").glob("*.safetensors")) == ["model.safetensors"]
