"""Which weight files a load of a model folder reads (pacs_fast/config/model_files.py ``safetensors_weight_files``):
transformers' choice, ``model.safetensors``, else the files ``model.safetensors.index.json`` names, for the megatron
learner's model load (``LazyHFCheckpoint(path)``), a resume (``checkpoint_weight_files``) and the weight sync's
shapes (``read_checkpoint_shapes``). Every ``*.safetensors`` of the folder was read before (or every
``model-*.safetensors`` for a resume): a published folder's adapter, draft / MTP weights or a stale shard beside the
model's either failed on unknown names or replaced a model tensor of the same name."""
import json

import pytest
import torch
from safetensors.torch import save_file

from pacs_fast.learner.hf_folder import INDEX_NAME, LazyHFCheckpoint, checkpoint_weight_files
from pacs_fast.rollout.weight_sync import read_checkpoint_shapes

MODEL = {"model.embed_tokens.weight": torch.arange(12.0).reshape(4, 3), "model.norm.weight": torch.ones(3),
         "lm_head.weight": torch.full((4, 3), 2.0)}


def _strays(folder):
    """What a published folder may hold beside its weights: a PEFT adapter (a LoRA name and one named like a model
    weight), MTP / draft weights (sorted after the shards: read last, its tensor won) and a stale third shard of an
    earlier save (named like the shards, not in the index)."""
    save_file({"model.norm.weight": torch.zeros(3), "base_model.model.lora_A.weight": torch.zeros(2, 3)},
              str(folder / "adapter_model.safetensors"))
    save_file({"model.norm.weight": torch.full((3,), 7.0)}, str(folder / "mtp.safetensors"))
    save_file({"model.norm.weight": torch.full((3,), 9.0)}, str(folder / "model-00003-of-00003.safetensors"))


def _sharded(folder):
    folder.mkdir()
    names = sorted(MODEL)
    shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
    for file, keys in shards.items():
        save_file({k: MODEL[k] for k in keys}, str(folder / file))
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": {k: f for f, ks in shards.items()
                                                                                 for k in ks}}))
    return folder


def _loaded(folder, **kw):
    ck = LazyHFCheckpoint(folder, **kw)
    return {name: ck[name] for name in ck}


def test_shards_and_their_index_load_their_tensors_only(tmp_path):
    """Shards + index + strays: the index's tensors, exactly (the old glob gave the adapter's names too and the MTP
    file's model.norm.weight, 7s; a resume's ``model-*`` glob the stale third shard's, 9s)."""
    folder = _sharded(tmp_path / "sharded")
    _strays(folder)
    want = [folder / "model-00001-of-00002.safetensors", folder / "model-00002-of-00002.safetensors"]
    assert checkpoint_weight_files(folder) == want
    for got in (_loaded(folder), _loaded(folder, files=checkpoint_weight_files(folder))):
        assert got.keys() == MODEL.keys() and all(torch.equal(got[k], MODEL[k]) for k in MODEL)
    assert read_checkpoint_shapes(folder) == {k: tuple(v.shape) for k, v in MODEL.items()}


def test_a_single_file_is_read_alone(tmp_path):
    """``model.safetensors`` with the strays (and an index transformers does not read beside it): that file alone."""
    folder = _sharded(tmp_path / "single")
    save_file(MODEL, str(folder / "model.safetensors"))
    _strays(folder)
    assert checkpoint_weight_files(folder) == [folder / "model.safetensors"]
    got = _loaded(folder)
    assert got.keys() == MODEL.keys() and all(torch.equal(got[k], MODEL[k]) for k in MODEL)
    assert read_checkpoint_shapes(folder) == {k: tuple(v.shape) for k, v in MODEL.items()}


def test_a_missing_shard_or_no_weights_file_is_one_line_naming_them(tmp_path):
    """A shard the index names, missing: an error naming the index and the shard (the old glob loaded the other
    shard's tensors without a word). Neither model.safetensors nor an index (a stray file only): transformers loads
    nothing from such a folder, and neither does this (the old glob loaded the stray as the model)."""
    from pacs_fast.trainer.checkpoint import CheckpointError, load_checkpoint

    folder = _sharded(tmp_path / "sharded")
    (folder / "model-00002-of-00002.safetensors").unlink()
    line = f"{folder / INDEX_NAME} names model-00002-of-00002.safetensors, which the folder lacks"
    for call in (lambda: checkpoint_weight_files(folder), lambda: LazyHFCheckpoint(folder)):
        with pytest.raises(FileNotFoundError) as e:
            call()
        assert str(e.value) == line
    with pytest.raises(CheckpointError, match=f"^cannot load checkpoint {folder}: {line}$"):
        load_checkpoint(folder, learner=None)  # (refused before the learner is touched)

    other = tmp_path / "other"
    other.mkdir()
    save_file(MODEL, str(other / "consolidated.safetensors"))
    with pytest.raises(FileNotFoundError, match="has neither model.safetensors nor model.safetensors.index.json"):
        LazyHFCheckpoint(other)
