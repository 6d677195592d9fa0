"""The torch learner writes its Hugging Face folder a bucket of layers at a time (pacs_fast/learner/hf_folder.py).

It used to copy the whole policy into host memory and write one ``model.safetensors`` (a 7B policy in fp32: 28 GB
of host memory at each checkpoint, one 28 GB file; a 14B one passed the Hub's 50 GB file limit), unlike the
megatron learner, which wrote the transformers shard layout a bucket at a time. Both now share one writer.
"""
import json

import pytest
import torch

from pacs_fast.learner import hf_folder
from pacs_fast.trainer.metrics import read_jsonl

from test_train import TINY


def _learner(num_layers=3):
    import transformers

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.torch_learner import TorchLearner

    config = tiny_qwen2_config(64, hidden_size=32, num_layers=num_layers, intermediate_size=64)
    model = transformers.Qwen2ForCausalLM(config)
    return TorchLearner(model, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(), temperature=1.0, horizon=4)


def _weight_files(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("model"))


def test_buckets_are_consecutive_whole_units_of_at_least_the_size():
    items = [("model.embed_tokens.weight", 10), ("model.layers.0.a", 3), ("model.layers.0.b", 3),
             ("model.layers.1.a", 3), ("model.layers.1.b", 3), ("model.norm.weight", 1)]
    buckets = list(hf_folder.whole_unit_buckets(items, 5, int))
    assert [x for b in buckets for x in b] == items  # every item once, in order
    assert [[n for n, _ in b] for b in buckets] == [["model.embed_tokens.weight"],
                                                    ["model.layers.0.a", "model.layers.0.b"],
                                                    ["model.layers.1.a", "model.layers.1.b"], ["model.norm.weight"]]
    assert len(list(hf_folder.whole_unit_buckets(items, 1 << 40, int))) == 1
    with pytest.raises(ValueError, match="bucket_bytes"):
        list(hf_folder.whole_unit_buckets(items, 0, int))


def test_a_torch_learner_writes_the_transformers_shard_layout_a_bucket_at_a_time(tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    learner = _learner()
    exported = {name: t.clone() for name, t in learner.export_hf_weights()}
    layer = sum(t.numel() * t.element_size() for n, t in exported.items() if n.startswith("model.layers.0."))
    largest = max(sum(t.numel() * t.element_size() for n, t in exported.items() if n.startswith(p))
                  for p in ("model.embed_tokens", "model.layers.0.", "model.norm"))
    sizes, real = [], hf_folder.write_shard
    monkeypatch.setattr(hf_folder, "write_shard", lambda f, n, t: sizes.append(real(f, n, t)) or sizes[-1])

    out = tmp_path / "hf"
    learner.save_hf(out, bucket_bytes=layer)
    index = json.loads((out / hf_folder.INDEX_NAME).read_text())
    files = sorted(set(index["weight_map"].values()))
    n = len(files)
    assert n >= 4 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert _weight_files(out) == sorted(files + [hf_folder.INDEX_NAME])  # no single model.safetensors beside
    assert sorted(index["weight_map"]) == sorted(exported)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in exported.values())
    # each save held one bucket: at least a unit, at most the bucket size plus one whole unit
    assert len(sizes) == n and max(sizes) < layer + largest, (sizes, layer, largest)
    for f in files:
        for name, t in load_file(str(out / f)).items():
            assert index["weight_map"][name] == f and torch.equal(t, exported[name]), name
    loaded = AutoModelForCausalLM.from_pretrained(out)  # transformers reads the layout (tied head included)
    for name, t in loaded.state_dict().items():
        assert torch.equal(t, exported.get(name, exported["model.embed_tokens.weight"])), name

    # saving into the same folder leaves no weights of the earlier layout (from_pretrained prefers a
    # model.safetensors to an index; an index naming removed shards fails to load)
    learner.save_hf(out)
    assert _weight_files(out) == ["model.safetensors"]
    learner.save_hf(out, bucket_bytes=layer)
    assert _weight_files(out) == sorted(files + [hf_folder.INDEX_NAME])


def test_a_run_whose_checkpoints_are_sharded_resumes_from_them(tmp_path, monkeypatch, warm_cache):
    from pacs_fast.train import main

    monkeypatch.setattr(hf_folder, "SHARD_BYTES", 1 << 12)  # the tiny model in several files
    common = TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.save_every=1",
                     "train.eval_every=0", "train.plots=false", "train.run_name=r"]
    main(common + ["train.steps=1"])
    ckpt = tmp_path / "r" / "checkpoints" / "step_000001"
    files = _weight_files(ckpt)
    assert hf_folder.INDEX_NAME in files and len(files) > 3 and "model.safetensors" not in files
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert set(files) <= set(json.dumps(manifest).replace('"', " ").split())  # every shard is checked on load
    main(["--resume", str(tmp_path / "r"), "train.steps=2"])
    assert [r["step"] for r in read_jsonl(tmp_path / "r" / "metrics.jsonl") if r["kind"] == "checkpoint"] == [1, 2]
    assert hf_folder.INDEX_NAME in _weight_files(tmp_path / "r" / "checkpoints" / "step_000002")
