"""The product on a DeepSeek-V2-Lite(-Chat)-shaped model folder, and Moonlight-16B-A3B's (hostile sweep of 2026-12-07).

Where DeepSeek-V2-Lite differs from the Qwen3-MoE folder of tests/test_qwen3_moe_path_sweep.py: multi-head latent
attention (MLA: no q_lora, keys and values from a 512-wide latent, q/k heads of 128 + 64 rope, v heads of 128, so
q/k and v widths differ), YaRN at factor 40 whose mscale enters the attention's scale (squared, mscale_all_dim 0.707),
a dense first layer (``first_k_dense_replace`` 1), 2 shared experts beside 64 routed ones (6 a token, softmax,
greedy, not renormalised), DeepSeek's tokenizer (a BOS the tokenizer adds, <｜begin▁of▁sentence｜> 100000,
<｜end▁of▁sentence｜> 100001 the EOS and pad, 102,400 head rows) and its "User: ...\n\nAssistant:" template that
writes the BOS itself. Moonlight-16B-A3B is DeepSeek-V3's architecture (``deepseek_v3``: a sigmoid router with a
score-correction bias, ``noaux_tc``) at V2-Lite's sizes.

The folder (:data:`HUB_CONFIG`, the hub's config.json, at :data:`TINY`: hidden 64, 2 layers, the first dense, 4 heads,
MLA at a quarter of the hub's head widths, 8 experts, top-3, 2 shared, fp32), weights under the hub's names (layer 0's
``mlp.{gate,up,down}_proj``, ``mlp.shared_experts.*``, ``mlp.experts.<e>.*``; transformers' ``save_pretrained``
writes the same), a byte-level BPE tokenizer.json with DeepSeek's splits, added tokens at their ids and the BOS post
processor, DeepSeek-V2-Lite-Chat's tokenizer_config.json and generation_config.json. Short real runs in this
process, recorded: ``python -m pacs_fast.train`` 2 steps (HF engine, torch learner, ``learner.packing=on``), killed
while writing checkpoint 2 and resumed, a LoRA run (``all-linear``), ``python -m pacs_fast.eval --engine hf`` on the
trained checkpoint, a Moonlight-shaped run; the preflight's counts for both real config.json files.

Held: prompts are the template once with one BOS (no second one from the tokenizer), responses stop at the EOS kept
once or run to the limit, masks exact; packed rows of deepseek_v2 (and deepseek_v3) take the dense block-diagonal
mask, not varlen (the run says so), and are exact: the learner's log-probs, packed and padded, equal each step's
policy loaded by ``from_pretrained`` with eager attention and experts, row by row (1e-5), through MLA's unequal head
widths and YaRN's mscale, and so do the HF engine's; checkpoints hold the hub's per-expert names, model.path's set
exactly, each tensor the learner's, and load back to its log-probs; ``--resume`` is bit for bit; LoRA adapts the MLA
projections, router and experts, leaves layer 0's MLP and the shared experts bare with one warning line naming them
(all-linear and the usual list alike), and its merged checkpoint is the PEFT model; eval's prompts and scores read
right; Moonlight's router bias (a buffer) is kept bit for bit.

Found and fixed (the tests failed before the fix, by value: 15,787,753,472 parameters for 15,706,357,760; a cache of
256 elements a token for the 80 transformers fills):
1. the memory model and FLOP count read MLA as ``heads x head_dim`` attention (head_dim = hidden / heads = 128):
   DeepSeek-V2-Lite's parameters counted 15.79B for 15.71B (a count meant as a lower bound), its weights a token
   passes through 2.32B for 2.24B, the attention FLOPs 20% short (QK^T over 16 x 192, PV over 16 x 128), and the HF
   engine's KV cache 2 x 16 x 128 = 4,096 elements a layer and token where transformers 5 caches the latent and the
   rope key, 576: 7.1 times over, so the preflight refused HF-engine rollouts of DeepSeek-V2/V3 and Moonlight that
   fit. Now ``model_shape`` / ``shape_of`` carry ``mla`` (pacs_fast/config/model_files.py ``mla_of``), counted by
   ``flops.attention_params`` and ``engine_memory.kv_per_token``.

Seen, not changed: the learner's activation estimate (``activation_bytes_per_token``) still reads MLA's projections
as ``heads x head_dim`` (the LoRA count, 0.5% short, reads its own projections since 2026-12-07:
pacs_fast/config/linear_layers.py); deepseek_v2 / deepseek_v3 have no varlen path (the dense mask is exact,
O(tokens^2) memory a packed micro-batch).
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from byte_level_bpe import padded_byte_level_bpe
from conftest import copy_as_killed_in_checkpoint
from pacs_fast.data.prompts import INSTRUCTION, SYSTEM_PROMPT
from pacs_fast.trainer.metrics import deterministic_view, read_jsonl
from test_llama3_path_sweep import _data, check_completion
from test_qwen3_moe_path_sweep import (F, check_steps, ckpt, hub_tensors, learner_batch, old_logprobs, policy_of,
                                       response_gap)
from test_qwen3_moe_path_sweep import row_refs as moe_row_refs
from test_qwen3_path_sweep import MAX_NEW, TRAIN, G, _gold, forced_completion, recording

# deepseek-ai/DeepSeek-V2-Lite-Chat's config.json on the hub (its auto_map to the remote code left out: transformers
# 5 has deepseek_v2 built in)
HUB_CONFIG = {"architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
              "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
              "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
              "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
              "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16, "num_experts_per_tok": 6,
              "num_hidden_layers": 27, "num_key_value_heads": 16, "pretraining_tp": 1, "q_lora_rank": None,
              "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
              "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                               "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
              "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
              "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
              "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 102400}
# moonshotai/Moonlight-16B-A3B(-Instruct)'s config.json (DeepSeek-V3's architecture at V2-Lite's sizes: sigmoid router
# with a score-correction bias, noaux_tc, no YaRN; its auto_map left out)
MOONLIGHT_CONFIG = {**{k: v for k, v in HUB_CONFIG.items() if k not in ("rope_scaling", "transformers_version")},
                    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "bos_token_id": 163584,
                    "eos_token_id": 163586, "ep_size": 1, "intermediate_size": 11264, "max_position_embeddings": 8192,
                    "norm_topk_prob": True, "num_nextn_predict_layers": 0, "rms_norm_eps": 1e-05,
                    "rope_scaling": None, "rope_theta": 50000.0, "routed_scaling_factor": 2.446,
                    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "transformers_version": "4.46.3",
                    "vocab_size": 163840}
E, K = 8, 3  # experts, experts per token (scaled down from 64, 6); F: an expert's width (the Qwen3-MoE sweep's)
# scaled down: hidden 64, 2 layers (the first dense), 4 heads; MLA at a quarter of the hub's head widths (q/k 16 + 8,
# v 16; the latent 32), fp32 (bf16 would blur the references)
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": 128, "moe_intermediate_size": F, "n_routed_experts": E, "num_experts_per_tok": K,
        "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "torch_dtype": "float32"}
LAYERS = TINY["num_hidden_layers"]
BOS, EOS = 100000, 100001
# the hub tokenizer's first added tokens, at their ids from 100000 (the rest of its added tokens left out)
ADDED = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>"]
TOKENS, ROWS = BOS + len(ADDED), 102400
PADDED_HOT = ROWS - 1
HOT = 6.0
# DeepSeek-V2-Lite-Chat's chat template (tokenizer_config.json)
TEMPLATE = ("{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
            "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
            "{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}"
            "{{ 'Assistant: ' + message['content'] + eos_token }}{% elif message['role'] == 'system' %}"
            "{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}"
            "{{ 'Assistant:' }}{% endif %}")
# DeepSeek's pre-tokenizer splits (tokenizer.json; its letter and CJK classes shortened to \p{L} / \p{Han})
SPLITS = [r"[\r\n]", r"\s?\p{L}+", r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", r"\p{Han}+", r"\p{N}+"]
CORPUS = ["User: What is 12 plus 7? Assistant: So \\boxed{19}", f"{INSTRUCTION} {SYSTEM_PROMPT} hmm maybe",
          "café 日本 ∑ The answer is \\boxed{5}.\n\n"] * 10

_RAW = []


def _raw():
    """DeepSeek's tokenizer.json as a ``tokenizers`` object (built once): its splits, byte-level BPE trained on
    :data:`CORPUS`, unreachable fillers up to id 99999, :data:`ADDED` at 100000.., the BOS added in front."""
    if _RAW:
        return _RAW[0]
    from tokenizers import AddedToken, processors

    raw = padded_byte_level_bpe(SPLITS, CORPUS, BOS)
    raw.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in ADDED])
    raw.post_processor = processors.TemplateProcessing(single=f"{ADDED[0]}:0 $A:0", pair=f"{ADDED[0]}:0 $A:0 $B:1",
                                                       special_tokens=[(ADDED[0], BOS)])
    assert [raw.token_to_id(c) for c in ADDED] == list(range(BOS, TOKENS))
    _RAW.append(raw)
    return raw


def dsv2_config() -> dict:
    return {**HUB_CONFIG, **TINY}


def dsv2_folder(folder: Path) -> Path:
    """The folder: tokenizer.json (:func:`_raw`), DeepSeek-V2-Lite-Chat's tokenizer_config.json (LlamaTokenizerFast,
    BOS added, the chat template) and generation_config.json, :data:`HUB_CONFIG` at :data:`TINY`, fp32 weights under
    the hub's names (experts one by one). Embedding and head rows of the EOS and of the last padded row read one
    hidden unit each: responses end at the EOS or run on, and a learner that did not cut the padded rows would score
    the hot one."""
    from safetensors.torch import save_file
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    folder.mkdir(parents=True)
    _raw().save(str(folder / "tokenizer.json"))
    special = {str(BOS + i): {"content": c, "lstrip": False, "normalized": True, "rstrip": False,
                              "single_word": False, "special": True} for i, c in enumerate(ADDED)}
    tcfg = {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": special, "bos_token": ADDED[0],
            "chat_template": TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": ADDED[1],
            "legacy": True, "model_max_length": 16384, "pad_token": ADDED[1], "sp_model_kwargs": {},
            "tokenizer_class": "LlamaTokenizerFast", "unk_token": None, "use_default_system_prompt": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS, "do_sample": True, "eos_token_id": EOS, "temperature": 0.3, "top_p": 0.95,
         "transformers_version": "4.39.3"}, indent=2))
    config = dsv2_config()
    torch.manual_seed(0)
    lm = DeepseekV2ForCausalLM(DeepseekV2Config(**config))
    with torch.no_grad():
        for p in lm.parameters():  # (the init's 0.02 gives near-uniform routing: wider weights route sharply)
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        for unit, i in enumerate((EOS, PADDED_HOT)):
            for w in (lm.model.embed_tokens.weight, lm.lm_head.weight):
                w[i] = 0.0
                w[i, unit] = HOT
            lm.model.norm.weight[unit] = -1.0
    save_file(hub_tensors(lm), str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@pytest.fixture(scope="module")
def dsv2(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = dsv2_folder(tmp_path_factory.mktemp("dsv2") / "DeepSeek-V2-Lite-Chat")
    return folder, AutoTokenizer.from_pretrained(folder)


def load(path, eager: bool = False):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, **({"attn_implementation": "eager"} if eager else {}))
    if eager:
        model.set_experts_implementation("eager")
    return model.eval()


def dsv2_prompt(user: str, system: str | None) -> str:
    """The template's generation prompt, its BOS once."""
    return f"{ADDED[0]}{f'{system}{chr(10) * 2}' if system else ''}User: {user}\n\nAssistant:"


def check_prompt(ids, text: str):
    """``ids`` are ``text`` encoded once by tokenizer.json's backend, its BOS the template's (no second one)."""
    assert list(ids) == _raw().encode(text, add_special_tokens=False).ids
    assert list(ids).count(BOS) == 1 and ids[0] == BOS and EOS not in ids


def decoded(ids) -> str:
    return _raw().decode(list(ids), skip_special_tokens=True)


def forced_ids(tok, gold: int, k: int, i: int) -> list[int]:
    """Sample ``k`` of prompt ``i``: 0 the right box (" So \\boxed{gold}", the template leaves the space after
    "Assistant:" to the model) then the EOS, 1 a wrong box cut at MAX_NEW."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    if k == 0:
        return enc(f" So \\boxed{{{gold}}}") + [EOS]
    ids = enc(f" So \\boxed{{{gold + 1}}}")
    while len(ids) < MAX_NEW:
        ids += enc(" hmm")
    return ids[:MAX_NEW]


def forcing(engine, prompts, comps):
    """A ``force`` for ``recording``: samples 0 and 1 of each prompt replaced by :func:`forced_ids`."""
    tok = engine.tokenizer
    for i, (p, cs) in enumerate(zip(prompts, comps)):
        for k in range(min(len(cs), 2)):
            cs[k] = forced_completion(engine, p, forced_ids(tok, _gold(tok, p), k, i), MAX_NEW,
                                      cs[k].logprobs is not None)
    return comps


class Run:
    def train_calls(self):
        return [c for c in self.calls if c[1].return_logprobs]


def train(folder, tok, args, out_dir, name, resume: Path | None = None) -> Run:
    """``python -m pacs_fast.train`` in this process, recorded, samples 0 / 1 of every training prompt forced."""
    from pacs_fast.train import main

    text = io.StringIO()
    with recording(forcing) as (calls, batches, learners), old_logprobs() as olds, \
            contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main(["--resume", str(resume)] if resume else
             [f"model.path={folder}", *TRAIN, *args, f"train.out_dir={out_dir}", f"train.run_name={name}"])
    run = Run()
    run.folder, run.tok, run.run, run.calls, run.batches, run.olds = \
        folder, tok, resume or out_dir / name, calls, batches, olds
    run.learner, run.output = learners[0], text.getvalue()
    return run


RUNS = {"full": ["learner.packing=on", "train.save_every=1"],
        "lora": ["learner.packing=on", "model.lora_rank=4", "train.steps=1", "train.save_every=1"]}


@pytest.fixture(scope="module")
def runs(dsv2, tmp_path_factory):
    folder, tok = dsv2
    tmp = tmp_path_factory.mktemp("runs")
    data = _data(tmp / "train.jsonl", n=20)
    return {name: train(folder, tok, [f"data.dataset={data}", *extra], tmp, name) for name, extra in RUNS.items()}


def row_refs(model, batch) -> list[torch.Tensor]:
    """:func:`test_qwen3_moe_path_sweep.row_refs` over this tokenizer's ids."""
    return moe_row_refs(model, batch, tokens=TOKENS)


def tensor_names(path: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return set(f.keys())


def hub_names() -> set[str]:
    """The hub's names of the MLPs: layer 0 dense, layer 1 its router, shared experts and each routed expert."""
    parts = ("gate_proj", "up_proj", "down_proj")
    return ({f"model.layers.0.mlp.{p}.weight" for p in parts} | {"model.layers.1.mlp.gate.weight"}
            | {f"model.layers.1.mlp.shared_experts.{p}.weight" for p in parts}
            | {f"model.layers.1.mlp.experts.{e}.{p}.weight" for e in range(E) for p in parts})


# ------------------------------------------------------------------------------------------- the folder itself

def test_the_folder_is_deepseek_v2_lite_chat_scaled_down(dsv2, tmp_path):
    """What the other tests rely on: the file holds the hub's names (layer 0's dense MLP, layer 1's router, 2 shared
    experts as one MLP of twice the width, 8 experts one by one; no fused tensor); transformers 5 loads it as a
    ``DeepseekV2ForCausalLM`` with MLA at the hub's proportions (q_proj 4 x (16 + 8), the latent 32 + 8 rope,
    kv_b_proj 4 x (16 + 16), o_proj from 4 x 16: q/k and v head sizes differ), YaRN's mscale in the attention's
    scale (``0.1 x 0.707 x ln 40 + 1`` squared, the cos/sin factor 1), experts fused; transformers' own
    ``save_pretrained`` writes the same names and tensors; the tokenizer is DeepSeek's (BOS 100000 added in front,
    EOS 100001 also the pad, 102,400 head rows for 100,005 ids) and the template puts the BOS once."""
    import math

    from safetensors.torch import load_file

    folder, tok = dsv2
    names = tensor_names(folder)
    assert hub_names() <= names and not any("gate_up_proj" in n or n.endswith("experts.down_proj") for n in names)
    model = load(folder)
    c = model.config
    assert (type(model).__name__, c.model_type, c.n_routed_experts, c.num_experts_per_tok, c.n_shared_experts,
            c.first_k_dense_replace, c.q_lora_rank) == ("DeepseekV2ForCausalLM", "deepseek_v2", E, K, 2, 1, None)
    a = model.model.layers[1].self_attn
    shapes = [tuple(m.weight.shape) for m in (a.q_proj, a.kv_a_proj_with_mqa, a.kv_b_proj, a.o_proj)]
    assert shapes == [(4 * 24, 64), (32 + 8, 64), (4 * 32, 32), (64, 4 * 16)]
    mscale = 0.1 * 0.707 * math.log(40) + 1
    assert abs(a.scaling - 24 ** -0.5 * mscale ** 2) < 1e-9 and model.model.rotary_emb.attention_scaling == 1.0
    mlp = model.model.layers[1].mlp
    assert tuple(mlp.experts.gate_up_proj.shape) == (E, 2 * F, 64) and tuple(mlp.experts.down_proj.shape) == (E, 64, F)
    assert tuple(mlp.shared_experts.gate_proj.weight.shape) == (2 * F, 64)
    assert tuple(model.model.layers[0].mlp.gate_proj.weight.shape) == (128, 64)
    model.save_pretrained(tmp_path)
    written, saved = (load_file(str(f / "model.safetensors")) for f in (folder, tmp_path))
    assert written.keys() == saved.keys() == names and all(torch.equal(written[n], saved[n]) for n in names)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, len(tok), c.vocab_size) == \
        (BOS, EOS, EOS, TOKENS, ROWS)
    assert tok.encode("What is 1 plus 2?") == _raw().encode("What is 1 plus 2?").ids  # (the BOS, once)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 1 plus 2?"}], add_generation_prompt=True,
                                   tokenize=False)
    assert text == dsv2_prompt("What is 1 plus 2?", None)


# ------------------------------------------------------------------------------------------- 1. the learner

def test_the_learner_and_engine_score_each_response_as_the_models_own_eager_forward(runs):
    """Each step of the full run (``learner.packing=on``: deepseek_v2 has no varlen path, so packed rows take the
    dense block-diagonal mask, and the run says so in one line): the learner's log-prob of every response token
    equals that of the step's policy loaded by ``from_pretrained`` with eager attention and experts, each row alone
    and unpadded (1e-5), through MLA's 24-wide q/k and 16-wide v heads and YaRN's mscale; the HF engine's sampled
    log-probs too, and ``rollout/logprob_diff_max`` says so. Prompts are the template once (one BOS), responses stop
    at the EOS kept once or run to the limit, masks exact. The learner with ``learner.packing=off`` (padded rows)
    gives the same log-probs; one over all 102,400 head rows (``vocab_size=None``) does not (the hot padded row)."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.torch_learner import TorchLearner

    run = runs["full"]
    lines = [line for line in run.output.splitlines() if "warning:" in line or "Traceback" in line]
    assert not lines, run.output
    assert "packed rows use the dense block-diagonal mask (model_type=deepseek_v2" in run.output
    records = [r for r in read_jsonl(run.run / "metrics.jsonl") if r["kind"] == "train"]
    train_calls = run.train_calls()
    assert len(records) == len(train_calls) == len(run.batches) == len(run.olds) == 2
    ends = set()
    for prompts, params, comps in run.calls:
        for p, cs in zip(prompts, comps):
            problem = re.search(r"What is \d+ plus \d+\?", run.tok.decode(p)).group(0)
            check_prompt(p, dsv2_prompt(f"{problem} {INSTRUCTION}", SYSTEM_PROMPT))
            for c in cs:
                ends.add(check_completion(c, {EOS}, params.max_new_tokens))
                assert max(c.token_ids) < TOKENS and c.text == decoded(c.token_ids)
    assert {EOS, None} <= ends, ends
    check_steps(run, train_calls, records, lambda step, batch: row_refs(load(policy_of(run, step), eager=True), batch))
    b = run.batches[0]
    batch = learner_batch(b, G)
    refs = row_refs(load(run.folder, eager=True), b)
    for packing, vocab, fine in (("on", TOKENS, True), ("off", TOKENS, True), ("on", None, False)):
        cfg = load_config(None, [f"learner.packing={packing}"])
        learner = TorchLearner(load(run.folder), algo=cfg.algo, learner=cfg.learner, temperature=1.0,
                               vocab_size=vocab)
        assert (response_gap(learner.compute_logprobs(batch), b, refs) < 1e-5) == fine, (packing, vocab)


# ------------------------------------------------------------------------------------------- 2. checkpoints

def test_the_checkpoint_holds_the_hubs_names_and_loads_back_with_the_trained_log_probs(runs):
    """Checkpoint 2 of the full run is in model.path's (the hub's) layout: the same tensor names (layer 0's dense
    MLP, the shared experts, each routed expert's ``gate_proj`` / ``up_proj`` / ``down_proj``; no fused tensor), each
    equal bit for bit to the learner's live weights (the fused experts split, gate rows first); config.json keeps
    DeepSeek's MLA, MoE and YaRN keys; the tokenizer and generation files byte for byte. ``from_pretrained`` of it
    gives the learner's log-probs after step 2 (2e-5)."""
    from safetensors.torch import load_file


    run = runs["full"]
    path = ckpt(run, 2)
    assert tensor_names(path) == tensor_names(run.folder)
    written, live = load_file(str(path / "model.safetensors")), hub_tensors(run.learner.model)
    assert written.keys() == live.keys() and all(torch.equal(written[n], live[n]) for n in live)
    config = json.loads((path / "config.json").read_text())
    for key in ("architectures", "model_type", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
                "first_k_dense_replace", "moe_intermediate_size", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim", "topk_method", "norm_topk_prob", "routed_scaling_factor",
                "max_position_embeddings", "vocab_size", "tie_word_embeddings"):
        assert config[key] == dsv2_config()[key], key
    yarn = config.get("rope_scaling") or config.get("rope_parameters")
    assert (yarn.get("rope_type") or yarn.get("type"), yarn["factor"], yarn["mscale_all_dim"]) == ("yarn", 40, 0.707)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (path / name).read_bytes() == (run.folder / name).read_bytes(), name
    b = run.batches[1]
    batch = learner_batch(b, G)
    with torch.no_grad():
        got = run.learner.compute_logprobs(batch)
    # (2e-5: the trained policy's log-probs reach -13 here, fp32's rounding of them ~1e-6 an operation)
    assert response_gap(got, b, row_refs(load(path, eager=True), b)) < 2e-5
    assert response_gap(got, b, row_refs(load(run.folder, eager=True), b)) > 1e-3  # (it trained)


@pytest.fixture(scope="module")
def resumed(dsv2, runs, tmp_path_factory):
    """The full run as a SIGKILL leaves it while step 2 wrote its checkpoint, then ``--resume``, recorded."""
    folder, tok = dsv2
    dest = copy_as_killed_in_checkpoint(runs["full"].run, tmp_path_factory.mktemp("resume") / "full", step=2)
    return train(folder, tok, [], None, None, resume=dest)


def test_resume_after_step_1_gives_the_uninterrupted_runs_records_samples_and_weights(runs, resumed):
    """The resumed run redoes step 2 from checkpoint 1 (hub layout): records (timings left out), samples.jsonl and
    checkpoint 2's tensors equal the uninterrupted run's bit for bit, and its learner's old log-probs too."""
    from safetensors.torch import load_file

    full = runs["full"]
    assert "Traceback" not in resumed.output, resumed.output
    assert deterministic_view(read_jsonl(full.run / "metrics.jsonl")) == \
        deterministic_view(read_jsonl(resumed.run / "metrics.jsonl"))
    assert read_jsonl(full.run / "samples.jsonl") == read_jsonl(resumed.run / "samples.jsonl")
    a, b = (load_file(str(ckpt(r, 2) / "model.safetensors")) for r in (full, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert torch.equal(resumed.olds[0], full.olds[1])


# ------------------------------------------------------------------------------------------- 3. LoRA

BARE = [f"model.layers.{i}.mlp.{s}{p}" for i, s in ((0, ""), (1, "shared_experts."))
        for p in ("gate_proj", "up_proj", "down_proj")]
USUAL = "q_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,gate_proj,up_proj,down_proj"


def test_a_lora_runs_checkpoint_merges_the_adapters_and_leaves_the_dense_mlps_bare(runs):
    """``model.lora_rank=4`` (``all-linear``): the run warns in one line that PEFT leaves 6 linear layers bare (layer
    0's dense MLP and the shared experts: PEFT takes gate_proj / up_proj / down_proj for the fused experts); its
    checkpoint holds model.path's names (no adapter or ``base_layer`` tensor); the MLA projections, the router and
    the routed experts differ from model.path's (their adapters merged), while the bare MLPs, the embedding, head
    and norms are model.path's bit for bit; ``from_pretrained`` of it gives the learner's PEFT model's log-probs
    (1e-5), and so does PEFT's own ``PeftModel.from_pretrained(model.path, checkpoint/adapter)``."""
    from peft import PeftModel

    from pacs_fast.learner.lora import lora_layers

    run = runs["lora"]
    assert "Traceback" not in run.output, run.output
    lines = [line for line in run.output.splitlines() if "warning:" in line]
    assert len(lines) == 1 and "PEFT leaves 6 of the linear layers it names without adapters" in lines[0], lines
    assert BARE[0] in lines[0] and "shared experts" in lines[0]
    assert {"model.layers.1.mlp.experts", "model.layers.1.mlp.gate"} <= set(lora_layers(run.learner.model))
    path = ckpt(run, 1)
    names = tensor_names(path)
    assert names == tensor_names(run.folder) and not any(".lora_" in n or "base_layer" in n for n in names)
    start, merged = load(run.folder).state_dict(), load(path).state_dict()
    for layer in range(LAYERS):
        for part in ("q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            name = f"model.layers.{layer}.self_attn.{part}.weight"
            assert not torch.equal(merged[name], start[name]), name
    moved = [e for e in range(E) if not torch.equal(merged["model.layers.1.mlp.experts.down_proj"][e],
                                                    start["model.layers.1.mlp.experts.down_proj"][e])]
    assert moved and not torch.equal(merged["model.layers.1.mlp.gate.weight"], start["model.layers.1.mlp.gate.weight"])
    for name in [f"{b}.weight" for b in BARE] + ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
                                                 "model.layers.1.self_attn.kv_a_layernorm.weight"]:
        assert torch.equal(merged[name], start[name]), name
    b = run.batches[0]
    refs = row_refs(load(path, eager=True), b)
    live = torch.zeros(b["input_ids"].shape, dtype=torch.float64)
    for r, ref in enumerate(row_refs(run.learner.model, b)):
        live[r, 1:len(ref) + 1] = ref
    assert response_gap(live, b, refs) < 1e-5
    assert response_gap(live, b, row_refs(load(run.folder, eager=True), b)) > 1e-3  # (the adapters matter)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft = PeftModel.from_pretrained(load(run.folder), str(path / "adapter")).eval()
    got = torch.zeros(b["input_ids"].shape, dtype=torch.float64)
    for r, ref in enumerate(row_refs(peft, b)):
        got[r, 1:len(ref) + 1] = ref
    assert response_gap(got, b, refs) < 1e-5


def test_lora_on_deepseeks_usual_projection_list_adapts_the_experts_and_warns_of_the_bare_mlps(dsv2):
    """``model.lora_target_modules=q_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj,gate_proj,up_proj,down_proj`` (the
    usual list for DeepSeek-V2): PEFT adapts the MLA projections and the fused experts (the router left out), leaves
    the same 6 dense linear layers bare, and the preflight says so in its one line; the merge is the adapted
    model's (1e-5)."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.lora import add_lora, bare_linears, lora_layers, merged_weights
    from pacs_fast.trainer.preflight import check_lora_targets

    folder, _ = dsv2
    model, plain = load(folder), load(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        add_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=USUAL)
        lines = check_lora_targets(load_config(None, [f"model.path={folder}", "model.lora_rank=4",
                                                      f"model.lora_target_modules={USUAL}"]))
    adapted = set(lora_layers(model))
    assert "model.layers.1.mlp.experts" in adapted and "model.layers.0.self_attn.kv_b_proj" in adapted
    assert not any(n.endswith("mlp.gate") for n in adapted)
    assert sorted(bare_linears(model, USUAL)) == sorted(BARE)
    assert len(lines) == 1 and "PEFT leaves 6 of the linear layers" in lines[0], lines
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
        ids = torch.tensor([[BOS, 5, 6, 7, 8, EOS, 9, 10, 11, 12, 13]])
        want = model(ids).logits[..., :TOKENS].log_softmax(-1)
        plain.load_state_dict(merged_weights(model))
        got = plain(ids).logits[..., :TOKENS].log_softmax(-1)
    assert (got - want).abs().max() < 1e-5


# ------------------------------------------------------------------------------------------- 5. eval

@pytest.fixture(scope="module")
def evaluated(runs, tmp_path_factory):
    """``python -m pacs_fast.eval --engine hf --system-prompt ''`` (in this process) on the full run's checkpoint 2,
    3 problems x 2 samples, both forced (the right box then the EOS; a wrong box cut at the limit)."""
    from pacs_fast import eval as ev

    tmp = tmp_path_factory.mktemp("eval")
    data = _data(tmp / "toy.jsonl", n=3, offset=50)
    text = io.StringIO()
    with recording(forcing, every_call=True) as (calls, _, _), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(ckpt(runs["full"], 2)), "--benchmarks", str(data), "--n", "2",
                        "--max-tokens", str(MAX_NEW), "--engine", "hf", "--out", str(tmp / "out"), "--no-progress",
                        "--scorer-workers", "0", "--system-prompt", ""])
    assert code == 0, text.getvalue()
    return tmp / "out", calls, text.getvalue()


def test_eval_on_the_trained_checkpoint_prompts_once_and_reads_the_scores_right(runs, evaluated):
    """The eval command on the checkpoint: every prompt is the template once (one BOS, no system text), responses
    stop at the EOS kept once or run to the limit; samples file: the prompt text, texts without the EOS, token
    counts with it, the right box 1 and the wrong one 0; results.json: mean 0.5, pass@1 0.5, pass@2 1."""
    from pacs_fast.evaluation.results import read_samples

    out, calls, output = evaluated
    tok = runs["full"].tok
    warned = [line for line in output.splitlines() if "warning:" in line]  # (one: the run's system message differs)
    assert len(warned) == 1 and calls, output
    assert warned[0].startswith("warning: --system-prompt '' differs from the run's data.system_prompt pacs"), output
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            user = re.search(r"What is \d+ plus \d+\?", tok.decode(p)).group(0) + f" {INSTRUCTION}"
            check_prompt(p, dsv2_prompt(user, None))
            for c in cs:
                check_completion(c, {EOS}, params.max_new_tokens)
                assert max(c.token_ids) < TOKENS and c.text == decoded(c.token_ids)
    records = read_samples(out / "samples_toy.jsonl")
    assert len(records) == 3
    for r in records.values():
        gold, i = int(r["answer"]), 50 + r["index"]
        assert r["prompt"] == dsv2_prompt(f"What is {i} plus {i % 7}? {INSTRUCTION}", None)
        assert r["responses"][0] == f" So \\boxed{{{gold}}}"
        assert r["responses"][1].startswith(f" So \\boxed{{{gold + 1}}}")
        assert r["scores"] == [1.0, 0.0] and r["finish_reasons"] == ["stop", "length"], r
        assert r["num_tokens"] == [len(forced_ids(tok, gold, 0, 0)), MAX_NEW]
    toy = json.loads((out / "results.json").read_text())["benchmarks"]["toy"]
    assert (toy["mean_score"], toy["pass_at_k"], toy["correct_counts"]) == (0.5, {"1": 0.5, "2": 1.0}, [1, 1, 1])


# ------------------------------------------------------------------------------------------- 4. the real config

def engine_kv(folder: Path) -> float:
    """The HF engine's KV cache a token of a row, in elements, as the preflight counts it (``hf_engine_bytes`` at
    two prompt limits, fp32, the difference a row and token)."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.memory_model import engine_rows, hf_engine_bytes, model_shape

    cfgs = [load_config(None, [f"model.path={folder}", "model.dtype=float32", f"data.max_prompt_tokens={n}",
                               "rollout.max_new_tokens=64"]) for n in (64, 128)]
    a, b = (hf_engine_bytes(c, model_shape(c)) for c in cfgs)
    return (b - a) / (engine_rows(cfgs[0]) * 64 * 4)


@pytest.mark.parametrize("name", ["DeepSeek-V2-Lite-Chat", "Moonlight-16B-A3B"])
def test_the_memory_model_counts_deepseek_v2_lites_mla_and_experts(tmp_path, name):
    """Found and fixed: the preflight read MLA as ``heads x head_dim`` attention (head_dim = 2,048 / 16 = 128): the
    parameter count of the hub's config.json was 15.79B for the built model's 15.71B (its MLA layers at 16.8M
    where they hold 13.8M; the count is meant as a lower bound), the FLOP count's weights a token passes through
    2.32B for 2.24B and its attention term 20% short (QK^T over 16 x 192, PV over 16 x 128, not 2 x 16 x 128), and
    the HF engine's KV cache 2 x 16 x 128 = 4,096 elements a layer and token where transformers 5 caches MLA's
    latent and rope key, 512 + 64 = 576: 7.1 times over, which refused rollouts that fit (a LoRA run with 2,048-token
    responses on one 80 GiB GPU). Now: 15,706,357,760
    parameters (the built model's less its norms) and 2.45B a token passes through with the head (the hub's "2.4B
    activated"); 27 x 576 cache elements a token; Moonlight-16B-A3B (deepseek_v3) alike (15,960,108,544). The
    preflight's LoRA check of the real config warns of the 81 linear layers PEFT leaves bare (layer 0's MLP, the
    26 layers' shared experts)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.flops import layer_params, shape_of, update_flops
    from pacs_fast.trainer.memory_model import GiB, model_params, model_shape
    from pacs_fast.trainer.preflight import check_lora_targets, check_memory

    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HUB_CONFIG if name.startswith("DeepSeek") else MOONLIGHT_CONFIG))
    shape = model_shape(load_config(None, [f"model.path={folder}", "model.dtype=bfloat16"]))
    assert shape["moe"] == {"experts": 64, "top_k": 6, "width": 1408, "shared": 2816, "layers": 26}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    built = sum(p.numel() for p in model.parameters())
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert built == (15_706_484_224 if name.startswith("DeepSeek") else 15_960_108_544)
    assert model_params(shape) == built - norms
    active = layer_params(shape) + shape["vocab"] * shape["hidden"]
    assert (2.4e9 < active < 2.5e9) if name.startswith("DeepSeek") else (2.5e9 < active < 2.7e9), active
    assert engine_kv(folder) == 27 * 576
    assert shape_of(model.config).get("mla") == shape.get("mla") == \
        {"q_lora": 0, "kv_lora": 512, "nope": 128, "rope": 64, "v": 128}
    attention = update_flops(shape, [1000])["attention"]
    assert attention == 3 * 2 * 27 * 16 * (192 + 128) * 1000 * 1000 // 2
    # (a LoRA run with 2,048-token responses on one 80 GiB GPU: the HF engine's 512 rows had been counted at 271 GiB,
    # refused; their cache and logits take 39 GiB)
    cfg = load_config(None, [f"model.path={folder}", "model.dtype=bfloat16", "model.lora_rank=16",
                             "model.gradient_checkpointing=true", "rollout.max_new_tokens=2048"])
    check_memory(cfg, available=80 * GiB)
    with warnings.catch_warnings():  # (PEFT on the real config, on the meta device: layer 0's MLP, 26 shared experts)
        warnings.simplefilter("ignore")
        lines = check_lora_targets(cfg)
    assert len(lines) == 1 and "PEFT leaves 81 of the linear layers it names without adapters" in lines[0], lines


def test_the_tiny_folders_cache_and_weights_are_what_the_memory_and_flop_counts_say(dsv2):
    """On the tiny folder: transformers' own cache after a forward of 10 tokens holds ``kv_per_token`` elements a
    token (the latent 32 and the rope key 8 a layer), and ``layer_params`` is the sum of the matmul weights a token
    passes through (MLA's four projections, layer 0's MLP, the router, the shared experts and 3 of 8 experts)."""
    from transformers import DynamicCache

    from pacs_fast.config import load_config
    from pacs_fast.learner.flops import layer_params
    from pacs_fast.trainer.memory_model import model_shape

    folder, _ = dsv2
    shape = model_shape(load_config(None, [f"model.path={folder}"]))
    model = load(folder)
    with torch.no_grad():
        cache = model(torch.arange(10)[None], past_key_values=DynamicCache(config=model.config),
                      use_cache=True).past_key_values
    held = sum(t.numel() for layer in cache.layers for t in (layer.keys, layer.values))
    assert held == 10 * engine_kv(folder) == 10 * LAYERS * (32 + 8)
    weights = 0
    for layer in model.model.layers:
        a = layer.self_attn
        weights += sum(m.weight.numel() for m in (a.q_proj, a.kv_a_proj_with_mqa, a.kv_b_proj, a.o_proj))
    mlp = model.model.layers[1].mlp
    weights += sum(p.numel() for p in model.model.layers[0].mlp.parameters()) + mlp.gate.weight.numel()
    weights += sum(p.numel() for p in mlp.shared_experts.parameters())
    weights += K * (mlp.experts.gate_up_proj[0].numel() + mlp.experts.down_proj[0].numel())
    assert layer_params(shape) == weights


# ------------------------------------------------------------------------------------------- Moonlight (deepseek_v3)

@pytest.fixture(scope="module")
def moonlight(dsv2, tmp_path_factory):
    """:data:`MOONLIGHT_CONFIG` at :data:`TINY` (its router's score-correction bias drawn, not zero) with the DeepSeek
    folder's tokenizer files (Moonlight's own tokenizer is tiktoken remote code), weights as transformers'
    ``save_pretrained`` writes them (the hub's per-expert names); then a 2-step run (packed rows), recorded."""
    import shutil

    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    folder, tok = dsv2
    tmp = tmp_path_factory.mktemp("moonlight")
    config = {**MOONLIGHT_CONFIG, **TINY, "vocab_size": ROWS, "bos_token_id": BOS, "eos_token_id": EOS}
    torch.manual_seed(0)
    lm = DeepseekV3ForCausalLM(DeepseekV3Config(**config))
    with torch.no_grad():
        for p in lm.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        lm.model.layers[1].mlp.gate.e_score_correction_bias.normal_(0, 0.1)
    moon = tmp / "Moonlight-16B-A3B"
    lm.save_pretrained(moon)
    (moon / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(folder / name, moon / name)
    data = _data(tmp / "train.jsonl", n=20)
    return train(moon, tok, [f"data.dataset={data}", "learner.packing=on", "train.save_every=1"], tmp, "full")


def test_a_moonlight_run_keeps_the_routers_bias_and_writes_the_hubs_names(moonlight):
    """The deepseek_v3 architecture (Moonlight-16B-A3B's): packed rows take the dense mask; step 1's learner
    log-probs equal model.path's eager forward (1e-5); checkpoint 2 holds model.path's names, the router's
    ``e_score_correction_bias`` (a buffer the trainer does not train) bit for bit model.path's, every tensor the
    learner's own, and it loads back to the learner's log-probs (2e-5)."""
    from safetensors.torch import load_file


    run = moonlight
    assert "Traceback" not in run.output and "warning:" not in run.output, run.output
    assert "dense block-diagonal mask (model_type=deepseek_v3" in run.output
    b = run.batches[0]
    assert response_gap(run.olds[0], b, row_refs(load(run.folder, eager=True), b)) < 1e-5
    path = ckpt(run, 2)
    assert tensor_names(path) == tensor_names(run.folder)
    written, start = load_file(str(path / "model.safetensors")), load_file(str(run.folder / "model.safetensors"))
    bias = "model.layers.1.mlp.gate.e_score_correction_bias"
    assert torch.equal(written[bias], start[bias]) and start[bias].abs().max() > 0
    live = hub_tensors(run.learner.model)
    assert written.keys() == live.keys() and all(torch.equal(written[n], live[n]) for n in live)
    b = run.batches[1]
    batch = learner_batch(b, G)
    with torch.no_grad():
        got = run.learner.compute_logprobs(batch)
    assert response_gap(got, b, row_refs(load(path, eager=True), b)) < 2e-5
