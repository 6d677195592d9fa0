"""A resume reads the checkpoint's weights a tensor at a time (pacs_fast/trainer/checkpoint.py ``load_checkpoint``,
pacs_fast/learner/hf_folder.py ``LazyHFCheckpoint``).

``load_checkpoint`` read ``model.safetensors`` (or every shard) whole with ``safetensors.torch.load_file`` into one
dict, then handed it to the learner: a 7B bf16 policy took 15 GB of host memory on each process of a launch (a
megatron launch of 8 on a node: every rank, though a TP rank keeps only its shards). The learner now gets a lazy
view: names and shapes checked from the headers, each tensor read as it is copied into place.
"""
import subprocess
import sys
import types

import pytest
import torch

from pacs_fast.learner import hf_folder
from pacs_fast.learner.hf_folder import LazyHFCheckpoint
from pacs_fast.trainer.checkpoint import CheckpointError, load_checkpoint, rng_state


def _learner(seed: int, *, hidden=32, layers=3, ffn=64, vocab=64, lora=False):
    import transformers

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.lora import add_lora
    from pacs_fast.learner.torch_learner import TorchLearner

    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(tiny_qwen2_config(vocab, hidden_size=hidden, num_layers=layers,
                                                            intermediate_size=ffn))
    if lora:
        torch.manual_seed(0)  # (the same base in every LoRA learner: the adapters train on model.path's)
        model = transformers.Qwen2ForCausalLM(model.config)
        add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
        with torch.no_grad():  # adapters of this seed's own (B starts at 0: the merge would be the base)
            gen = torch.Generator().manual_seed(seed)
            for n, p in model.named_parameters():
                if ".lora_" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return TorchLearner(model, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(), temperature=1.0, horizon=4)


def _checkpoint(learner, folder, bucket_bytes=None):
    """What ``load_checkpoint`` reads: the HF folder, ``learner.pt``, ``trainer_state.pt``."""
    learner.save_hf(folder, bucket_bytes=bucket_bytes)
    learner.save_state(folder, is_writer=True)
    torch.save({"step": 1, "rng": rng_state()}, folder / "trainer_state.pt")
    return folder


def _weights(learner):
    return {n: t.clone() for n, t in learner.export_hf_weights()}


# A fresh process loads it (/proc/self/clear_refs resets its peak to the present where allowed)
LOAD_PROBE = r"""
import sys, torch, transformers
from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.data.tiny import tiny_qwen2_config
from pacs_fast.learner.torch_learner import TorchLearner
from pacs_fast.trainer.checkpoint import load_checkpoint

def kib(key):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key + ":"))

folder, size = sys.argv[1], [int(x) for x in sys.argv[2:]]
torch.manual_seed(1)
model = transformers.Qwen2ForCausalLM(tiny_qwen2_config(size[0], hidden_size=size[1], num_layers=size[2],
                                                        intermediate_size=size[3]))
learner = TorchLearner(model, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(), temperature=1.0, horizon=4)
try:  # the peak reset to the present (not every kernel or container allows it: then the peak so far, construction's)
    open("/proc/self/clear_refs", "w").write("5")
    before = kib("VmRSS")
except OSError:
    before = kib("VmHWM")
load_checkpoint(folder, learner=learner)
print((kib("VmHWM") - before) * 1024, float(sum(p.detach().double().sum() for p in model.parameters())))
"""


def test_a_resume_holds_about_one_tensor_of_the_weights_in_host_memory(tmp_path):
    """The peak resident memory over ``load_checkpoint`` stays far below the weight file (105 MB, its largest
    tensor 3 MB, 3%; measured 4-9 MiB): 0.3x leaves room for the allocator and the small ``learner.pt``. Read whole
    (``load_file``, before), the growth was the whole file: 1.005x measured."""
    size = (2048, 512, 8, 1536)  # vocabulary, hidden, layers, FFN: 26.7M fp32 parameters, an MLP matrix the largest
    saved = _learner(0, vocab=size[0], hidden=size[1], layers=size[2], ffn=size[3])
    _checkpoint(saved, tmp_path)
    want = float(sum(p.detach().double().sum() for p in saved.model.parameters()))
    largest = max(t.numel() * t.element_size() for t in saved.model.state_dict().values())
    del saved
    weights = (tmp_path / "model.safetensors").stat().st_size
    out = subprocess.run([sys.executable, "-c", LOAD_PROBE, str(tmp_path), *map(str, size)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    grown, got = out.stdout.split()
    print(f"peak growth {int(grown) / 2**20:.1f} MiB, weight file {weights / 2**20:.1f} MiB")
    assert weights > 100e6 and largest < 0.05 * weights
    assert int(grown) < 0.3 * weights, (int(grown), weights)
    assert float(got) == want  # (the weights loaded: the fresh learner's own were of another seed)


@pytest.mark.parametrize("lora", [False, True])
def test_single_file_and_sharded_checkpoints_load_exactly(tmp_path, lora):
    """Every tensor as saved, from one ``model.safetensors`` and from shards of about one layer; a stale other
    ``*.safetensors`` in the folder (here zeros under one of the model's names) is not read. With LoRA the
    checkpoint's merged weights are compared with the merge of its adapters on the base (``check_same_merge``),
    a tensor at a time from the files."""
    saved = _learner(0, lora=lora)
    want = _weights(saved)
    single = _checkpoint(saved, tmp_path / "single")
    layer = sum(t.numel() * t.element_size() for n, t in want.items() if n.startswith("model.layers.0."))
    sharded = _checkpoint(saved, tmp_path / "sharded", bucket_bytes=layer)
    assert not (sharded / "model.safetensors").exists() and len(list(sharded.glob("model-*"))) >= 3
    from safetensors.torch import save_file

    save_file({"model.norm.weight": torch.zeros_like(want["model.norm.weight"])}, str(sharded / "stale.safetensors"))
    for folder in (single, sharded):
        fresh = _learner(1, lora=lora)
        assert not all(torch.equal(t, want[n]) for n, t in _weights(fresh).items())
        assert load_checkpoint(folder, learner=fresh)["step"] == 1
        got = _weights(fresh)
        assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want), folder.name
        assert fresh._loaded_merged is None  # (LoRA: compared, then let go)


def test_a_damaged_or_wrong_checkpoint_is_named_and_nothing_is_copied(tmp_path, monkeypatch):
    """A truncated shard: ``CheckpointError`` naming that shard (from its header, before any tensor is copied). A
    tensor of the wrong shape: refused from the headers, before any copy (no tensor data is read for the check)."""
    saved = _learner(0)
    layer = sum(t.numel() * t.element_size() for n, t in _weights(saved).items() if n.startswith("model.layers.0."))
    folder = _checkpoint(saved, tmp_path / "ck", bucket_bytes=layer)
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    fresh = _learner(1)
    before = _weights(fresh)
    with pytest.raises(CheckpointError, match=f"cannot load checkpoint file {shard}: "):
        load_checkpoint(folder, learner=fresh)
    assert all(torch.equal(t, before[n]) for n, t in _weights(fresh).items())

    shard.write_bytes(data)
    other = _learner(1, hidden=48)  # (every matrix of another shape)
    reads = []
    real = hf_folder._read_tensor
    monkeypatch.setattr(hf_folder, "_read_tensor", lambda *a: reads.append(a[-1]) or real(*a))
    with pytest.raises(CheckpointError, match="unknown names or wrong shapes"):
        load_checkpoint(folder, learner=other)
    assert reads == []
    load_checkpoint(folder, learner=fresh)  # (the same files, the right learner: loads, a tensor at a time)
    assert sorted(reads) == sorted(_weights(saved))
    assert all(torch.equal(t, _weights(saved)[n]) for n, t in _weights(fresh).items())


def test_the_megatron_conversion_checks_shapes_first_and_reads_a_tensor_at_a_time(tmp_path, monkeypatch):
    """``load_hf_into_model`` (the megatron learner's ``load_hf_weights``, resume and model load): each rank's
    shards equal ``hf_to_megatron``'s from the whole state (TP 1 and 2); a wrong shape is refused before any copy and
    any read; at most one parameter's HF tensors (q, k, v: three) are alive at once."""
    import weakref

    import transformers
    from safetensors.torch import save_file
    from transformers import Qwen2Config

    from pacs_fast.learner.megatron.convert import hf_to_megatron, load_hf_into_model

    cfg = Qwen2Config(vocab_size=130, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    state = {k: torch.randn(v.shape) for k, v in transformers.Qwen2ForCausalLM(cfg).state_dict().items()
             if k != "lm_head.weight"}
    save_file(dict(list(state.items())[:5]), str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(dict(list(state.items())[5:]), str(tmp_path / "model-00002-of-00002.safetensors"))
    hf_folder.finish_weights(tmp_path, {k: f"model-0000{1 + (i >= 5)}-of-00002.safetensors"  # (the index: the shards
                                        for i, k in enumerate(state)}, 0)                # a load reads are its)
    files = hf_folder.checkpoint_weight_files(tmp_path)
    alive, most = [], [0]
    real = hf_folder._read_tensor

    def tracked(*a):
        t = real(*a)
        alive.append(weakref.ref(t))  # (dead once dropped: CPython frees a tensor at its last reference)
        most[0] = max(most[0], sum(r() is not None for r in alive))
        return t

    monkeypatch.setattr(hf_folder, "_read_tensor", tracked)
    for tp in (1, 2):
        for rank in range(tp):
            want = hf_to_megatron(state, cfg, tp_size=tp, tp_rank=rank)
            params = {n: torch.nn.Parameter(torch.zeros_like(t)) for n, t in want.items()}
            model = types.SimpleNamespace(named_parameters=params.items)
            load_hf_into_model(model, LazyHFCheckpoint(tmp_path, files=files), cfg, tp_size=tp, tp_rank=rank)
            assert all(torch.equal(params[n], want[n]) for n in want)
    assert 1 <= most[0] <= 3
    alive.clear()
    small = Qwen2Config(**{**cfg.to_dict(), "intermediate_size": 16})  # (gate, up, down of each layer: 6 tensors)
    want = hf_to_megatron({k: torch.zeros(v.shape) for k, v in transformers.Qwen2ForCausalLM(small).state_dict()
                           .items()}, small)
    params = {n: torch.nn.Parameter(torch.zeros_like(t)) for n, t in want.items()}
    with pytest.raises(ValueError, match=r"wrong shapes of 6 HF tensor\(s\): model.layers.0.mlp.gate_proj"):
        load_hf_into_model(types.SimpleNamespace(named_parameters=params.items),
                           LazyHFCheckpoint(tmp_path, files=files), small)
    assert alive == [] and all(not p.any() for p in params.values())
