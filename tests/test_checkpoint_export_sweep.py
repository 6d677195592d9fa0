"""Checkpoints and the Hugging Face folder a run writes, on Qwen2.5-shaped models (hostile sweep of 2026-12-06).

The models: Qwen2's architecture with Qwen2.5's head layout (14 query / 2 key-value heads, Q/K/V biases, RoPE theta
1e6) in 2 layers, a 0.5B-like one with tied embeddings and a 7B-like one with an untied head, both with a vocabulary
padded past the tokenizer as Qwen2.5's is (config ``vocab_size`` 411 against 374 tokenizer ids), saved in bf16 beside
a byte-level BPE tokenizer with Qwen2.5's special tokens and ChatML template (tests/test_data_path_sweep.py). Every
check compares with what transformers itself loads (``AutoModelForCausalLM.from_pretrained``), the safetensors files'
own headers, or an uninterrupted run.

Checked and found right: a bf16 learner with fp32 masters writes the model's bf16 weights (the masters rounded once,
not the masters nor the input's), labelled bf16, which transformers reloads bit for bit; a tied head is stored once
and reloads tied, an untied one stored and reloaded untied; the padded vocabulary rows travel; the shard index names
exactly the tensors of each file and their total bytes; the trainer's checkpoint keeps every key of the input's
config.json (only the dtype written added), its tokenizer files, chat template and generation_config.json byte for
byte; a run stopped after step 2 and resumed ends at the uninterrupted run's weights, fp32 masters, AdamW moments and
learning rate (a cosine schedule) bit for bit; the megatron conversion at TP=2 of this head layout (7 query heads and 1
key-value head a rank, an odd vocabulary padded by one row) gives back every tensor, and its HF folder writer the
model's tensors, bf16-labelled.

Found and fixed (each case below failed before its fix):
- A model folder whose config.json has no ``architectures`` (written by ``config.save_pretrained`` alone, as conversion
  scripts do) trains (transformers picks the class by ``model_type``), but its checkpoints had none either: vLLM
  refuses such a folder ("No model architectures are specified"), so the run's output could not be served. Both
  learners' HF folders now name the class (:func:`pacs_fast.learner.hf_folder.save_config`).
- ``model.path`` (and the eval CLI's ``--model``) at a folder whose weights file is a symbolic link to nothing (a
  Hugging Face cache snapshot copied with ``cp -r``, its links to ``../../blobs`` broken; a deleted blob): a
  FileNotFoundError traceback from the folder's check; a broken config.json link was "has no config.json". Now one
  line naming the link and where it points.
- A checkpoint weights file overwritten in place at the size it was written (a zeroed block: its header unreadable)
  passed the manifest check: ``--resume`` loaded the model first and only then found it; with no older checkpoint the
  refusal came after the model load. The manifest check now reads each weights file's header (a few bytes).
- The torch learner's ``load_hf_weights`` (a resume's) took weights that left out one of the policy's tensors, copied
  the rest and kept ``model.path``'s value for that one without a word (the megatron learner's converter refused
  them); now refused, nothing copied.
"""
from __future__ import annotations

import json
import os
import shutil
import types

import pytest
import torch

from pacs_fast.learner import hf_folder

from test_data_path_sweep import qwen_chatml_tokenizer
from test_run_safety import cli

RUN = ["rollout.n=4", "rollout.eval_n=1", "rollout.max_new_tokens=8", "train.prompts_per_step=2",
       "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.tensorboard=false", "train.plots=false",
       "data.eval_size=4", "learner.lr=1e-3", "reward.fn=test_reinforce_pp:even_length", "train.progress=false",
       "train.eval_every=0", "train.save_every=1", "model.dtype=bfloat16", "learner.lr_schedule=cosine",
       "learner.lr_warmup_steps=1"]
PAD_ROWS = 37  # config vocab_size past the tokenizer's ids, as Qwen2.5's 151,936 rows for 151,665 ids


def _qwen_config(tok, *, tied: bool, im_end: int, eot: int):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=len(tok) + PAD_ROWS, hidden_size=14 * 8, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=512, rope_theta=1e6,
                       rms_norm_eps=1e-6, tie_word_embeddings=tied, eos_token_id=im_end, pad_token_id=eot,
                       dtype="bfloat16")


def _qwen_folder(folder, *, tied: bool, architectures: bool = True):
    """A Qwen2.5-shaped bf16 model folder (random weights: N(0, 0.02), biases too, so every tensor matters)."""
    from transformers import GenerationConfig, Qwen2ForCausalLM

    tok, im_end, eot = qwen_chatml_tokenizer()
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_qwen_config(tok, tied=tied, im_end=im_end, eot=eot)).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot, do_sample=True,
                                               temperature=0.7, top_p=0.8)
    model.save_pretrained(folder)
    if not architectures:  # (as a config written by config.save_pretrained alone)
        config = json.loads((folder / "config.json").read_text())
        del config["architectures"]
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder, tok


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """``{"tied": (folder, tokenizer), "untied": ..., "data": jsonl}``."""
    root = tmp_path_factory.mktemp("ckpt_sweep")
    out = {kind: _qwen_folder(root / kind, tied=kind == "tied") for kind in ("tied", "untied")}
    out["data"] = root / "d.jsonl"
    out["data"].write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i}+{i}?", "answer": str(2 * i)})
                                   + "\n" for i in range(40)))
    return out


def _learner(folder, tok, *, dtype=torch.bfloat16):
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.torch_learner import TorchLearner

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return TorchLearner(model, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(), temperature=1.0, horizon=4,
                        vocab_size=len(tok))


def _headers(folder) -> dict[str, dict]:
    """``{file: {tensor: (dtype, shape)}}`` read from each weights file's own header."""
    from safetensors import safe_open

    out = {}
    for f in hf_folder.checkpoint_weight_files(folder):
        with safe_open(str(f), framework="pt") as h:
            out[f.name] = {n: (h.get_slice(n).get_dtype(), tuple(h.get_slice(n).get_shape())) for n in h.keys()}
    return out


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_a_bf16_learner_with_masters_writes_its_rounded_weights_that_transformers_reloads_exactly(qwen, tmp_path,
                                                                                                  kind):
    from transformers import AutoModelForCausalLM

    folder, tok = qwen[kind]
    learner = _learner(folder, tok)
    assert learner.master is not None and learner.master.active
    with torch.no_grad():  # an update of a tenth of a bf16 step: the masters keep it, the model holds them rounded
        gen = torch.Generator().manual_seed(1)
        for m in learner.master.masters:
            m.add_(torch.randn(m.shape, generator=gen) * 2e-4)
    learner.master.copy_to_model()
    model = learner.model
    want = {n: t.clone() for n, t in model.state_dict().items()}
    assert any(not torch.equal(m.to(torch.bfloat16).float(), m) for m in learner.master.masters)  # (digits bf16 drops)
    layer = sum(t.numel() * t.element_size() for n, t in want.items() if n.startswith("model.layers.0."))
    out = tmp_path / "hf"
    learner.save_hf(out, bucket_bytes=layer)  # (shards of about a layer: the index's layout)

    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"] is (kind == "tied")
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["vocab_size"] == len(tok) + PAD_ROWS
    headers = _headers(out)
    index = json.loads((out / hf_folder.INDEX_NAME).read_text())
    assert len(headers) >= 3 and index["weight_map"] == {n: f for f, names in headers.items() for n in names}
    stored = {n: v for names in headers.values() for n, v in names.items()}
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for n, t in want.items()
                                                  if n in stored)
    assert ("lm_head.weight" in stored) is (kind == "untied")  # (tied: once, as save_pretrained writes it)
    assert {dtype for dtype, _ in stored.values()} == {"BF16"}
    assert stored["model.embed_tokens.weight"][1] == (len(tok) + PAD_ROWS, 14 * 8)  # the padded rows travel

    back = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert back.dtype == torch.bfloat16 and back.config.tie_word_embeddings is (kind == "tied")
    assert (back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()) is (kind == "tied")
    got = back.state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    assert not torch.equal(got["model.embed_tokens.weight"][len(tok):], torch.zeros_like(want["model.embed_tokens."
                                                                                              "weight"][len(tok):]))


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_weights_without_one_of_the_policys_tensors_are_refused_not_half_loaded(qwen, kind):
    """The torch learner's ``load_hf_weights`` (a resume's) refuses weights that leave out one of the policy's
    tensors, as the megatron learner's converter does: it had copied the others and kept ``model.path``'s value for
    the one left out, without a word. A tied head is not asked for (it is its embedding's storage)."""
    folder, tok = qwen[kind]
    learner = _learner(folder, tok, dtype=torch.float32)
    weights = {n: t.clone() + 1.0 for n, t in learner.export_hf_weights()}
    assert ("lm_head.weight" in weights) is (kind == "untied")
    before = {n: t.clone() for n, t in learner.model.state_dict().items()}
    norm = "model.layers.1.post_attention_layernorm.weight"
    partial = {n: t for n, t in weights.items() if n != norm}
    with pytest.raises(ValueError, match=r"1 of the policy's tensors are not in the weights given.*" + norm):
        learner.load_hf_weights(partial.items())
    after = learner.model.state_dict()
    assert all(torch.equal(after[n], before[n]) for n in before)  # nothing copied
    learner.load_hf_weights(weights.items())  # every tensor (a tied head through its embedding): loads
    after = learner.model.state_dict()
    assert all(torch.equal(after[n], before[n] + 1.0) for n in weights)
    assert torch.equal(after["lm_head.weight"], after["model.embed_tokens.weight"]) is (kind == "tied")


def test_a_checkpoint_names_its_architecture_when_the_input_config_does_not(qwen, tmp_path):
    """The torch learner's folder (``save_hf``) and the megatron writer's (``save_hf_folder``, TP=1 here: the config it
    writes is the same at any TP) both name ``Qwen2ForCausalLM``; the learner's own config is left untouched."""
    from transformers import AutoConfig

    from pacs_fast.learner.megatron.convert import hf_to_megatron
    from pacs_fast.learner.megatron.export import save_hf_folder

    folder, tok = _qwen_folder(tmp_path / "bare", tied=True, architectures=False)
    learner = _learner(folder, tok)
    assert learner.model.config.architectures is None  # (transformers loads it by model_type)
    learner.save_hf(tmp_path / "torch")
    assert json.loads((tmp_path / "torch" / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert learner.model.config.architectures is None

    cfg = AutoConfig.from_pretrained(folder)
    shards = hf_to_megatron({n: t.detach() for n, t in learner.model.state_dict().items()}, cfg)
    params = {n: torch.nn.Parameter(t) for n, t in shards.items()}
    fake = types.SimpleNamespace(named_parameters=params.items, parameters=lambda: iter(params.values()))
    save_hf_folder(fake, cfg, tmp_path / "megatron", tp_group=None, tp_size=1, is_writer=True, participates=True)
    config = json.loads((tmp_path / "megatron" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"] and config["dtype"] == "bfloat16"
    assert cfg.architectures is None


def test_the_megatron_tp2_conversion_of_qwen25s_head_layout_gives_every_tensor_back(qwen, tmp_path):
    """HF -> two TP ranks' megatron shards -> HF for 14 query / 2 key-value heads with biases (a rank: 7 query heads
    and 1 key-value head), tied and untied, an odd vocabulary (411 rows: TP=2 pads one zero row, then strips it); the
    shapes a rank infers from its own shards are the full ones; and the HF folder written from the model (TP=1: the
    gathered tensors of TP=2 are ``megatron_to_hf``'s) reloads in transformers as those tensors."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pacs_fast.learner.megatron.convert import hf_shapes, hf_to_megatron, megatron_to_hf
    from pacs_fast.learner.megatron.export import save_hf_folder

    for kind in ("tied", "untied"):
        folder, _ = qwen[kind]
        cfg = AutoConfig.from_pretrained(folder)
        state = {n: t.detach() for n, t in AutoModelForCausalLM.from_pretrained(folder, dtype="auto")
                 .state_dict().items()}
        shards = [hf_to_megatron(state, cfg, tp_size=2, tp_rank=r) for r in range(2)]
        emb = shards[0]["embedding.word_embeddings.weight"]
        assert emb.shape == ((cfg.vocab_size + 1) // 2, cfg.hidden_size) and cfg.vocab_size % 2 == 1
        assert not shards[1]["embedding.word_embeddings.weight"][-1].any()  # (the TP pad row)
        qkv = shards[0]["decoder.layers.0.self_attention.linear_qkv.weight"]
        assert qkv.shape == ((7 + 2) * 8, cfg.hidden_size)
        assert torch.equal(qkv[:56], state["model.layers.0.self_attn.q_proj.weight"][:56])  # rank 0: heads 0-6, then
        assert torch.equal(qkv[56:64], state["model.layers.0.self_attn.k_proj.weight"][:8])  # its key and value head
        back = megatron_to_hf(shards, cfg)
        want = {n: t for n, t in state.items() if not (kind == "tied" and n == "lm_head.weight")}
        assert back.keys() == want.keys() and all(torch.equal(back[n], want[n]) for n in want), kind
        assert hf_shapes({n: t.shape for n, t in shards[1].items()}, cfg, tp_size=2) == {
            n: tuple(t.shape) for n, t in want.items()}

        params = {n: torch.nn.Parameter(t) for n, t in hf_to_megatron(state, cfg).items()}
        fake = types.SimpleNamespace(named_parameters=params.items, parameters=lambda: iter(params.values()))
        out = tmp_path / kind
        save_hf_folder(fake, cfg, out, tp_group=None, tp_size=1, is_writer=True, participates=True,
                       bucket_bytes=20_000)
        assert len(_headers(out)) >= 3
        loaded = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
        assert loaded.dtype == torch.bfloat16 and loaded.config.tie_word_embeddings is (kind == "tied")
        got = loaded.state_dict()
        assert all(torch.equal(got[n], state[n]) for n in state), kind


def _run(tmp_path, qwen, *more):
    from pacs_fast.train import main

    folder, _ = qwen["untied"]
    main(RUN + [f"model.path={folder}", f"data.dataset={qwen['data']}", f"train.out_dir={tmp_path}", *more])


def test_a_runs_checkpoint_is_the_input_folder_with_trained_weights_and_resumes_exactly(qwen, tmp_path):
    """A bf16 run with fp32 masters on the 7B-like (untied) model: its checkpoint's config.json is the input's with
    the written dtype's ``torch_dtype`` added, its other files the input's byte for byte (tokenizer, ChatML template,
    generation_config.json); stopped after step 2 and resumed, step 3 ends where the uninterrupted run's does (weights,
    masters, AdamW moments, learning rate of the cosine schedule)."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from pacs_fast.trainer.metrics import read_jsonl

    folder, tok = qwen["untied"]
    _run(tmp_path, qwen, "train.steps=3", "train.run_name=full")
    _run(tmp_path, qwen, "train.steps=2", "train.run_name=cut")
    from pacs_fast.train import main
    main(["--resume", str(tmp_path / "cut"), "train.steps=3"])

    full, cut = (tmp_path / name / "checkpoints" / "step_000003" for name in ("full", "cut"))
    given, written = json.loads((folder / "config.json").read_text()), json.loads((full / "config.json").read_text())
    assert written == {**given, "torch_dtype": "bfloat16"}
    for f in folder.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            assert (full / f.name).read_bytes() == f.read_bytes(), f.name
    assert AutoTokenizer.from_pretrained(full).chat_template == tok.chat_template

    a, b = load_file(str(full / "model.safetensors")), load_file(str(cut / "model.safetensors"))
    start = load_file(str(folder / "model.safetensors"))
    assert a.keys() == b.keys() == start.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], start[n]) for n in a)  # (it trained)
    la, lb = (torch.load(c / "learner.pt", weights_only=False) for c in (full, cut))
    assert len(la["master_weights"]) == len(a) and all(
        torch.equal(x, y) for x, y in zip(la["master_weights"], lb["master_weights"]))
    oa, ob = la["optimizer"], lb["optimizer"]
    assert oa["param_groups"] == ob["param_groups"] and oa["state"].keys() == ob["state"].keys()
    assert all(torch.equal(oa["state"][i][k], ob["state"][i][k]) for i in oa["state"] for k in oa["state"][i])
    lrs = [[(r["step"], r["learner/lr"]) for r in read_jsonl(tmp_path / name / "metrics.jsonl") if r["kind"] == "train"]
           for name in ("full", "cut")]
    assert lrs[0] == lrs[1] and len({lr for _, lr in lrs[0]}) == 2


def _zero_header(path):
    """The first bytes of ``path`` zeroed in place, its size unchanged (a lost block)."""
    with open(path, "r+b") as f:
        f.write(bytes(64))


def test_a_checkpoint_with_an_overwritten_weights_header_is_refused_before_the_model_loads(qwen, tmp_path):
    from pacs_fast.trainer.checkpoint import (CheckpointError, check_resumable, intact_checkpoints, restore_newest,
                                              save_checkpoint)
    from pacs_fast.trainer.parallel import World

    folder, tok = qwen["tied"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("train: {}\n")
    learner = _learner(folder, tok, dtype=torch.float32)
    saved = {}
    for step in (1, 2):
        with torch.no_grad():
            learner.model.model.norm.weight.add_(1.0)
        saved[step] = {n: t.clone() for n, t in learner.model.state_dict().items()}
        save_checkpoint(run, step, learner=learner, model_dir=folder, config_yaml=run / "config.yaml",
                        trainer_state={}, world=World(), keep=2)
    newest = run / "checkpoints" / "step_000002" / "model.safetensors"
    _zero_header(newest)
    assert check_resumable(run, 5) == 1  # (before: 2, found only by the load after the model's)
    assert [p.name for p in intact_checkpoints(run)] == ["step_000001"]
    lines = []
    fresh = _learner(folder, tok, dtype=torch.float32)
    path, state = restore_newest(run, learner=fresh, world=World(), log=lines.append)
    assert path.name == "step_000001" and state["step"] == 1
    assert len(lines) == 1 and str(newest) in lines[0] and "not a safetensors file" in lines[0], lines
    got = fresh.model.state_dict()
    assert all(torch.equal(got[n], saved[1][n]) for n in got)

    _zero_header(run / "checkpoints" / "step_000001" / "model.safetensors")
    with pytest.raises(ValueError, match=r"no usable checkpoint \(step_000002: .*step_000002/model.safetensors is "
                                         r"not a safetensors file"):
        check_resumable(run, 5)
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        restore_newest(run, learner=fresh, world=World(), log=lines.append)


def test_a_model_folder_with_links_to_nothing_is_one_line_naming_the_link(qwen, tmp_path, capsys):
    """A cache snapshot copied with ``cp -r`` (links to ``../../blobs`` broken): the weights file (before: a
    FileNotFoundError traceback), one shard of an index (the index's line named it missing, which held too), the
    config.json (before: "has no config.json")."""
    from pacs_fast.config.model_files import model_folder_problem

    src, _ = qwen["tied"]
    cases = {}
    for name in ("model.safetensors", "config.json"):
        folder = tmp_path / name.replace(".", "_")
        shutil.copytree(src, folder)
        (folder / name).unlink()
        os.symlink(f"../../blobs/{name}-0123abcd", folder / name)
        cases[name] = folder
    for name, folder in cases.items():
        problem = model_folder_problem(folder)
        assert problem == (f": {folder / name} is a symbolic link to ../../blobs/{name}-0123abcd, which does not "
                           f"exist: a Hugging Face cache snapshot copied without its blobs? copy the files themselves "
                           f"(cp -rL)"), problem
    code, _, err = cli([f"model.path={cases['model.safetensors']}", f"train.out_dir={tmp_path / 'runs'}"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err
    assert "model.safetensors is a symbolic link to ../../blobs/" in lines[0], lines
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
