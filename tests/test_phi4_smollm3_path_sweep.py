"""The product on two model shapes users bring: Phi-4-mini-instruct / Phi-4-mini-reasoning and SmolLM3-3B (hostile
sweep of 2026-12-07).

Phi-4-mini: model_type phi3 (fused ``qkv_proj`` / ``gate_up_proj``, ``partial_rotary_factor`` 0.75, longrope whose
short and long factors switch at ``original_max_position_embeddings`` 4,096 of 131,072, ``sliding_window`` 262,144),
a head tied to the embedding (200,064 rows for 200,029 ids, no ``lm_head.weight`` in the files), a byte-level BPE on
o200k's split whose ``<|endoftext|>`` is BOS, EOS, pad and UNK and which the template never writes, ``<|end|>`` the
end of turn, generation_config.json's EOS [``<|end|>``, ``<|endoftext|>``]. Phi-4-mini-reasoning: the same under its
template, which writes its own system text ("Your name is Phi, ...") and ours after it; its think blocks are text.
SmolLM3-3B: model_type smollm3, no RoPE on every 4th layer (``no_rope_layers``), a tied head, Llama 3's BPE with
``<|im_end|>`` the EOS and ``<|finetune_right_pad_id|>`` the pad, ``<think>`` / ``</think>`` added tokens not marked
special, its chat template simplified (:data:`SMOLLM3_TEMPLATE`: tools and /system_override left out; the thinking
flags, the dated metadata block and the empty think block of /no_think as the hub's). The folders here are those,
tiny (hidden 64: heads of 16 rotating 12 dims; SmolLM3 with 4 layers, the 4th without RoPE).

Checked against references built here (the templates rendered by hand and encoded by the ``tokenizers`` backend, the
models' own unpadded forwards, the input folders' tensor names and config keys), with every engine ``generate`` call,
the learner's batches, ``samples.jsonl``, ``metrics.jsonl`` and the checkpoints recorded from short real runs of
``python -m pacs_fast.train`` (HF engine, torch learner) and ``python -m pacs_fast.eval --engine hf``.

No bug in: the prompts (the template once, no BOS; the reasoning template's system text first; SmolLM3 under
``data.chat_template_kwargs={enable_thinking: false}`` and under a system text of /no_think or /think alone); both Phi
stops in both HF samplers (kept once, counted, not in the texts; the pad, ``<|endoftext|>``, is a stop); the masks;
the samples files; the engine's and the learner's padded and packed log-probs are the models' own (Phi-3's partial
rotary and longrope's short factors, SmolLM3's NoPE layer), the shared-prefix forward's too wherever it runs; tied
checkpoints (no ``lm_head.weight`` written, the hub's config keys kept, reloaded equal, the layers trained);
``reward.extraction=boxed`` reads the box after ``</think>``, which the texts keep; ``learner.backend=megatron`` on
phi3 and smollm3 is refused in one line before anything loads (its builder takes qwen2 / qwen3 / llama:
``check_megatron_model``); ``rollout.engine=vllm`` on SmolLM3 too (vLLM 0.32 runs it through its Transformers
backend). Each check was shown to catch its fault, injected for the purpose: a prompt ending with the EOS, the
template's variables dropped, generation_config.json's stops ignored, texts with special tokens, a loss mask without
the stop token, a tied head written as ``lm_head.weight``, the checkpoint's config.json as transformers 5 writes it,
boxes read inside ``<think>``, the megatron and vLLM checks removed, shared-prefix position ids off by one, packed
position ids all 0, RoPE on SmolLM3's 4th layer.

Found and fixed (each test below failed before its fix):
- longrope is chosen per forward call (transformers' ``longrope_frequency_update``: the call's largest position
  against original_max_position_embeddings): a response that crosses it is sampled by the HF engine with its late
  tokens rotated by the long factors beside a cache rotated by the short ones, and learned with the long factors
  throughout; a micro-batch with one long row turns its short rows long. The run's own ``rollout/logprob_diff_max``
  read 2.3-2.8 nats (Phi-4-mini-reasoning's responses past ~3,600 tokens after a 500-token prompt cross 4,096).
  vLLM decides once per engine (long when max_model_len > 4,096: its default on GPU, 131,072), so every shorter row
  differs from the learner's. Now the factors are pinned for the run's context as vLLM picks them
  (pacs_fast/causal_lm.py ``pin_longrope``; a GPU vLLM engine of a longrope model gets the run's max_model_len);
- Phi-4-mini's ``sliding_window`` 262,144 exceeds its 131,072 positions and never binds, but keeps the torch learner
  off its shared-prefix forward (the default) for every Phi-4-mini / Phi-3.5-mini run: a window past the
  positions is none now;
- ``data.system_prompt='... /no_think'`` (SmolLM3's own way to switch thinking off): its template removes the flag
  from the system text, the prompt builder then takes the template for one without a system turn and moves the text
  into the user turn: thinking stayed on (a template that takes a system turn is trusted with it now);
- a system text that mentions ``<think>`` (``--system-prompt 'Always begin your reply with <think>.'``) reads as a
  prompt that opens a think block: under ``extraction=boxed`` a right answer without a think block scored 0 (the
  template alone is read now, in the trainer and eval).
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest
import torch

from pacs_fast.data.prompts import INSTRUCTION, SYSTEM_PROMPT, encode_prompts, prompt_parts
from pacs_fast.trainer.metrics import read_jsonl
from test_gemma3_olmo2_path_sweep import TRAIN, _problem, forcer, own_logprobs, run_logprob_gaps
from test_hostile_inputs import cli
from test_llama3_path_sweep import _data, check_batch, check_completion, clock, recording

HAS_VLLM = importlib.util.find_spec("vllm") is not None

PHI4_TEMPLATE = (  # Phi-4-mini-instruct's (tokenizer_config.json)
    "{% for message in messages %}{% if message['role'] == 'system' and 'tools' in message and message['tools'] is "
    "not none %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|tool|>' + message['tools'] + '<|/tool|>' + "
    "'<|end|>' }}{% else %}{{ '<|' + message['role'] + '|>' + message['content'] + '<|end|>' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% else %}{{ eos_token }}{% endif %}")
PHI4_REASONING_TEMPLATE = (  # Phi-4-mini-reasoning's: its own system text first, ours after a space
    "{{ '<|system|>Your name is Phi, an AI math expert developed by Microsoft.' }}{% for message in messages %}"
    "{% if message['role'] == 'system' %} {{ message['content'] }}{% if 'tools' in message and message['tools'] is "
    "not none %}{{ '<|tool|>' + message['tools'] + '<|/tool|>' }}{% endif %}{% endif %}{% endfor %}{{ '<|end|>' }}"
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ '<|' + message['role'] + '|>' + "
    "message['content'] + '<|end|>' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}"
    "{% else %}{{ eos_token }}{% endif %}")
PHI_NAME = "Your name is Phi, an AI math expert developed by Microsoft."
# SmolLM3-3B's chat_template.jinja, simplified: the tool branches and /system_override left out; the thinking flags
# (enable_thinking, /think and /no_think in the system text, removed from it), the metadata block with the clock
# (strftime_now, which date_string does not set), the default instructions and the empty think block the generation
# prompt gets in /no_think mode as the hub's
SMOLLM3_TEMPLATE = (
    "{%- if enable_thinking is not defined -%}{%- set enable_thinking = true -%}{%- endif -%}"
    "{%- if enable_thinking -%}{%- set reasoning_mode = \"/think\" -%}{%- else -%}"
    "{%- set reasoning_mode = \"/no_think\" -%}{%- endif -%}"
    "{{- \"<|im_start|>system\\n\" -}}"
    "{%- if messages[0].role == \"system\" -%}"
    "{%- set system_message = messages[0].content -%}"
    "{%- if \"/no_think\" in system_message -%}{%- set reasoning_mode = \"/no_think\" -%}"
    "{%- elif \"/think\" in system_message -%}{%- set reasoning_mode = \"/think\" -%}{%- endif -%}"
    "{%- set custom_instructions = system_message.replace(\"/no_think\", \"\").replace(\"/think\", \"\").rstrip() -%}"
    "{%- endif -%}"
    "{{- \"## Metadata\\n\\n\" -}}"
    "{{- \"Knowledge Cutoff Date: June 2025\\n\" -}}"
    "{%- set today = strftime_now(\"%d %B %Y\") -%}"
    "{{- \"Today Date: \" ~ today ~ \"\\n\" -}}"
    "{{- \"Reasoning Mode: \" + reasoning_mode + \"\\n\\n\" -}}"
    "{{- \"## Custom Instructions\\n\\n\" -}}"
    "{%- if custom_instructions -%}{{- custom_instructions + \"\\n\\n\" -}}"
    "{%- elif reasoning_mode == \"/think\" -%}"
    "{{- \"You are a helpful AI assistant named SmolLM, trained by Hugging Face. Your role as an assistant involves "
    "thoroughly exploring questions through a systematic thinking process before providing the final precise and "
    "accurate solutions. Please structure your response into two main sections: Thought and Solution using the "
    "specified format: <think> Thought section </think> Solution section.\\n\\n\" -}}"
    "{%- else -%}{{- \"You are a helpful AI assistant named SmolLM, trained by Hugging Face.\\n\\n\" -}}{%- endif -%}"
    "{{- \"<|im_end|>\\n\" -}}"
    "{%- for message in messages -%}"
    "{%- set content = message.content if message.content is string else \"\" -%}"
    "{%- if message.role == \"user\" -%}"
    "{{ \"<|im_start|>\" + message.role + \"\\n\"  + content + \"<|im_end|>\\n\" }}"
    "{%- elif message.role == \"assistant\" -%}"
    "{%- if reasoning_mode == \"/think\" -%}"
    "{{ \"<|im_start|>assistant\\n\" + content.lstrip(\"\\n\") + \"<|im_end|>\\n\" }}"
    "{%- else -%}"
    "{{ \"<|im_start|>assistant\\n\" + \"<think>\\n\\n</think>\\n\" + content.lstrip(\"\\n\") + \"<|im_end|>\\n\" }}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{%- if reasoning_mode == \"/think\" -%}{{ \"<|im_start|>assistant\\n\" }}"
    "{%- else -%}{{ \"<|im_start|>assistant\\n\" + \"<think>\\n\\n</think>\\n\" }}{%- endif -%}"
    "{%- endif -%}")
CORPUS = ["Step 1: add 2 and 3.\n\nStep 2: the sum is 5.\n\nSo \\boxed{5}! <think> a draft </think>",
          "You are a helpful assistant. Please reason step by step, and put your final answer within \\boxed{}.",
          "What is 12 plus 7? system user assistant Metadata Knowledge Cutoff Date: June 2025 Today Reasoning Mode",
          "Your name is Phi, an AI math expert developed by Microsoft. Custom Instructions /no_think /think"] * 10
O200K_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
               r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Phi-4-mini's, in their order after the ordinary ids (199999 <|endoftext|>, 200018.. <|endofprompt|> <|assistant|>
# <|end|> <|user|> <|system|> <|tool|> <|/tool|>), two of its dummies for the 18 between
PHI4_SPECIAL = ["<|endoftext|>", "<|dummy_id_0|>", "<|dummy_id_1|>", "<|endofprompt|>", "<|assistant|>", "<|end|>",
                "<|user|>", "<|system|>", "<|tool|>", "<|/tool|>"]
# SmolLM3's (Llama 3's ids 128000..: <think> / </think> in two reserved places, added tokens not marked special)
SMOL_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<think>", "</think>", "<|finetune_right_pad_id|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
                "<|im_start|>", "<|im_end|>"]
SMOL_NOT_SPECIAL = ("<think>", "</think>")
G, P, MAX_NEW = 4, 2, 8
PROBLEMS = ["What is 12 plus 7?", "  spaced\r\nout  ", f"Solve 2x=4. {INSTRUCTION}", "café 日本 🎉 /think"]
_RAW = {}


def _bpe(name, split, special, not_special=()):
    """A byte-level BPE (built once) on ``split`` (the pre-tokenizer's regex), the ``special`` tokens added after the
    ordinary ids (those in ``not_special`` as added tokens not marked special), no BOS added on encode."""
    if name in _RAW:
        return _RAW[name]
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=[],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    raw.add_tokens([AddedToken(t, special=t not in not_special, normalized=False) for t in special])
    raw.post_processor = processors.ByteLevel(trim_offsets=False)
    _RAW[name] = raw
    return raw


def phi4_raw():
    return _bpe("phi4", O200K_SPLIT, PHI4_SPECIAL)


def smol_raw():
    return _bpe("smol", LLAMA3_SPLIT, SMOL_SPECIAL, SMOL_NOT_SPECIAL)


def _decoder_entries(raw, names, not_special=()):
    return {str(raw.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": t not in not_special} for t in names}


def _randomize(model, hot):
    """Weights large enough that the positions matter; ``hot``: ``{token id: hidden unit}``, the head rows that read
    one unit each (the stops: responses end at them, or run to the limit)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        head = model.get_output_embeddings().weight
        for i, unit in hot.items():
            head[i] = 0.0
            head[i, unit] = 4.0


def phi4_folder(folder: Path, *, reasoning: bool = False, hidden: int = 64, heads: int = 4) -> Path:
    """A Phi-4-mini-instruct-shaped folder (Phi-4-mini-reasoning's with ``reasoning``): the hub's config.json
    (Phi3ForCausalLM, transformers-4.45 keys: partial_rotary_factor 0.75, longrope factors for the 12 rotary dims of
    a head of 16, original_max_position_embeddings 4096 of 131072, sliding_window 262144, a tied head of rows past the
    tokenizer's ids, BOS = EOS = pad = <|endoftext|>), generation_config.json (EOS [<|end|>, <|endoftext|>]),
    tokenizer files (GPT2Tokenizer, no BOS added, the template in tokenizer_config.json), fp32 weights without
    ``lm_head.weight``. The head rows of <|end|> and <|endoftext|> read one hidden unit each."""
    from transformers import Phi3Config, Phi3ForCausalLM

    raw = phi4_raw()
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    ids = {t: raw.token_to_id(t) for t in PHI4_SPECIAL}
    eot, end = ids["<|endoftext|>"], ids["<|end|>"]
    tcfg = {"add_bos_token": False, "add_eos_token": False, "add_prefix_space": False, "bos_token": "<|endoftext|>",
            "chat_template": PHI4_REASONING_TEMPLATE if reasoning else PHI4_TEMPLATE,
            "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "model_max_length": 131072,
            "pad_token": "<|endoftext|>", "tokenizer_class": "GPT2Tokenizer", "unk_token": "<|endoftext|>",
            "added_tokens_decoder": _decoder_entries(raw, PHI4_SPECIAL)}
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>"}))
    rotary = int(hidden // heads * 0.75) // 2
    config = {"architectures": ["Phi3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": eot, "embd_pdrop": 0.0, "eos_token_id": eot, "full_attn_mod": 1, "hidden_act": "silu",
              "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": 2 * hidden,
              "interpolate_factor": 1, "lm_head_bias": False, "max_position_embeddings": 131072, "mlp_bias": False,
              "model_type": "phi3", "num_attention_heads": heads, "num_hidden_layers": 2,
              "num_key_value_heads": heads // 2, "original_max_position_embeddings": 4096, "pad_token_id": eot,
              "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
              "rope_scaling": {"long_factor": [1.0 + 3 * i for i in range(rotary)],
                               "short_factor": [1.0 + 0.5 * i for i in range(rotary)], "type": "longrope"},
              "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": True,
              "torch_dtype": "float32", "transformers_version": "4.45.0", "use_cache": True,
              "vocab_size": raw.get_vocab_size() + 35}
    torch.manual_seed(0)
    model = Phi3ForCausalLM(Phi3Config(**copy.deepcopy(config))).float()  # (transformers 5 edits its input)
    _randomize(model, {end: 0, eot: 1})
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eot, "eos_token_id": [end, eot], "pad_token_id": eot, "transformers_version": "4.45.0"},
        indent=2))
    return folder


def smollm3_folder(folder: Path, *, hidden: int = 64, heads: int = 4) -> Path:
    """A SmolLM3-3B-shaped folder: config.json (SmolLM3ForCausalLM, 4 layers of which the 4th has no RoPE:
    ``no_rope_layers`` [1, 1, 1, 0] as the hub's every 4th of 36, GQA, rope_theta 5e6, a tied head, no sliding window,
    EOS <|im_end|>, pad <|finetune_right_pad_id|>), generation_config.json, tokenizer files (Llama 3's byte-level BPE,
    no BOS added, <|im_end|> the EOS, <think> / </think> added tokens not marked special, the template of
    :data:`SMOLLM3_TEMPLATE` in tokenizer_config.json). The head row of <|im_end|> reads one hidden unit."""
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    raw = smol_raw()
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    ids = {t: raw.token_to_id(t) for t in SMOL_SPECIAL}
    bos, eos, pad = ids["<|begin_of_text|>"], ids["<|im_end|>"], ids["<|finetune_right_pad_id|>"]
    tcfg = {"add_prefix_space": False, "bos_token": "<|begin_of_text|>", "chat_template": SMOLLM3_TEMPLATE,
            "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "model_max_length": 131072,
            "pad_token": "<|finetune_right_pad_id|>", "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": _decoder_entries(raw, SMOL_SPECIAL, SMOL_NOT_SPECIAL)}
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>", "pad_token": "<|finetune_right_pad_id|>"}))
    config = {"architectures": ["SmolLM3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": bos, "eos_token_id": eos, "hidden_act": "silu", "hidden_size": hidden,
              "initializer_range": 0.02, "intermediate_size": 2 * hidden, "max_position_embeddings": 65536,
              "max_window_layers": 4, "mlp_bias": False, "model_type": "smollm3", "no_rope_layer_interval": 4,
              "no_rope_layers": [1, 1, 1, 0], "num_attention_heads": heads, "num_hidden_layers": 4,
              "num_key_value_heads": heads // 2, "pad_token_id": pad, "pretraining_tp": 2, "rms_norm_eps": 1e-06,
              "rope_scaling": None, "rope_theta": 5000000.0, "sliding_window": None, "tie_word_embeddings": True,
              "torch_dtype": "float32", "transformers_version": "4.54.0.dev0", "use_cache": False,
              "use_sliding_window": False, "vocab_size": raw.get_vocab_size()}
    torch.manual_seed(0)
    model = SmolLM3ForCausalLM(SmolLM3Config(**copy.deepcopy(config))).float()
    _randomize(model, {eos: 0})
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad, "transformers_version": "4.54.0.dev0"},
        indent=2))
    return folder


# =========================================================================================== shared helpers

def learner_run(model, batch, vocab, packing, shared):
    """``(largest |learner - own| over the response tokens, the learner's forwards)``: the torch learner at
    ``model``'s weights under ``learner.packing`` / ``learner.shared_prefix`` on ``batch`` (a recorded batch), against
    ``model``'s own forward of each row alone (:func:`own_logprobs`); ``forwards`` counts the kinds that ran (packed,
    shared_prefix, padded), so that a check cannot pass on a path it did not take."""
    refs = own_logprobs(model, batch, vocab)
    got, forwards = learner_logprobs(model, batch, vocab, packing, shared)
    gap = 0.0
    for r, ref in enumerate(refs):
        resp = batch["response_mask"][r, 1:len(ref) + 1] > 0
        gap = max(gap, float((got[r, 1:len(ref) + 1][resp].double() - ref[resp]).abs().max()))
    return gap, forwards


def learner_logprobs(model, batch, vocab, packing="off", shared=False):
    """The torch learner's ``compute_logprobs`` of ``batch`` at ``model``'s weights, and the forwards that ran."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.torch_learner import TorchLearner

    cfg = load_config(None, [f"learner.packing={packing}", f"learner.shared_prefix={str(shared).lower()}"])
    rb = RolloutBatch(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      response_mask=batch["response_mask"], rewards=torch.zeros(len(batch["input_ids"])), group_size=G)
    learner = TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=1.0, vocab_size=vocab)
    got = learner.compute_logprobs(rb)
    return got, {k: v for k, v in learner.forwards.items() if k in ("packed", "shared_prefix", "padded") and v}


def body_forcer(bodies, stop_names):
    """A ``recording`` force: sample ``j`` of prompt ``i`` becomes ``bodies[j](gold)`` then stop token ``i + j`` (of
    ``stop_names``, in turn), then a token past it (cut by the engine's own ``_completions``, which decodes the text),
    with the policy's log-probs of it over the tokenizer's ids."""
    def force(engine, prompts, comps):
        tok = engine.tokenizer
        stops = tok.convert_tokens_to_ids(list(stop_names))
        for i, (p, cs) in enumerate(zip(prompts, comps)):
            a, b = re.search(r"What is (\d+) plus (\d+)\?", tok.decode(p)).groups()
            for j, body in enumerate(bodies):
                ids = tok.encode(body(int(a) + int(b)), add_special_tokens=False) + [stops[(i + j) % len(stops)]]
                with torch.no_grad():
                    logits = engine.model(input_ids=torch.tensor([list(p) + ids])).logits[0, len(p) - 1:-1, :len(tok)]
                lps = logits.float().log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
                asked = cs[j].logprobs is not None  # (an evaluation's call asks for none)
                cs[j] = engine._completions(torch.tensor([ids + [17]]), torch.cat([lps, torch.zeros(1)])[None])[0]
                if not asked:
                    cs[j].logprobs = None
        return comps
    return force


def _runs(folder, tmp, force, *, train_extra=(), eval_extra=None):
    """``python -m pacs_fast.train`` (2 steps, two groups a micro-batch; ``train_extra`` settings) and, unless
    ``eval_extra`` is None, ``python -m pacs_fast.eval --engine hf`` (3 problems x 4; ``eval_extra`` flags), in this
    process, every engine call and learner batch recorded, ``force`` applied (to every call of the eval)."""
    from pacs_fast import eval as ev
    from pacs_fast.train import main

    out = {}
    text = io.StringIO()
    with recording(force) as (calls, batches), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main([f"model.path={folder}", f"data.dataset={_data(tmp / 'train.jsonl')}", *TRAIN, *train_extra,
              f"train.out_dir={tmp}", "train.run_name=r"])
    out["train"] = (calls, batches, text.getvalue(), tmp / "r")
    if eval_extra is not None:
        text = io.StringIO()
        with recording(force, every_call=True) as (calls, _), contextlib.redirect_stdout(text), \
                contextlib.redirect_stderr(text):
            code = ev.main(["--model", str(folder), "--benchmarks", str(_data(tmp / "toy.jsonl", n=3, offset=50)),
                            "--n", "4", "--max-tokens", str(MAX_NEW), "--engine", "hf", "--out", str(tmp / "ev"),
                            "--no-progress", "--scorer-workers", "1", *eval_extra])
        assert code == 0, text.getvalue()
        out["eval"] = (calls, None, text.getvalue(), tmp / "ev")
    return out


def tensor_names(path):
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as h:
        return sorted(h.keys())


def check_tied_checkpoint(folder, ckpt, given):
    """The step-2 checkpoint of a tied-head model: the input's tensor names (no ``lm_head.weight`` written), the
    input's config keys, the tokenizer and generation files byte for byte, the same prompt and stop ids; reloaded,
    the head is the embedding (tied), every tensor the file's, the layers trained."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs_fast.rollout.base import folder_stop_ids

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (ckpt / name).read_bytes() == (folder / name).read_bytes(), name
    assert tensor_names(ckpt / "model.safetensors") == tensor_names(folder / "model.safetensors")
    assert "lm_head.weight" not in tensor_names(ckpt / "model.safetensors")
    before, config = (json.loads((f / "config.json").read_text()) for f in (folder, ckpt))
    assert {k: config.get(k) for k in before if k != "transformers_version"} == \
        {k: v for k, v in before.items() if k != "transformers_version"}
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert encode_prompts(tok, PROBLEMS) == encode_prompts(given, PROBLEMS)
    assert folder_stop_ids(ckpt, tok) == folder_stop_ids(folder, given)
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    saved, start = load_file(ckpt / "model.safetensors"), load_file(folder / "model.safetensors")
    state = model.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items())
    assert torch.equal(model.lm_head.weight, saved["model.embed_tokens.weight"])
    changed = {k.split(".")[2] for k in saved if k.startswith("model.layers.") and not torch.equal(saved[k], start[k])}
    assert changed == {str(i) for i in range(model.config.num_hidden_layers)}, changed
    return model


def check_one_line_refusal(err, code, starts, ends=None):
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(starts) and (ends is None or lines[0].endswith(ends)), err


def no_learner(monkeypatch):
    import pacs_fast.trainer.session as session

    def no_load(*args, **kwargs):
        raise AssertionError("the learner was built")

    monkeypatch.setattr(session, "build_learner", no_load)


# =========================================================================================== Phi-4-mini

@pytest.fixture(scope="module")
def phi(tmp_path_factory):
    """``{name: (folder, AutoTokenizer)}``: ``inst`` (Phi-4-mini-instruct), ``reason`` (Phi-4-mini-reasoning)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("phi4")
    return {name: (f, AutoTokenizer.from_pretrained(f)) for name, f in
            (("inst", phi4_folder(root / "inst")), ("reason", phi4_folder(root / "reason", reasoning=True)))}


def _phi_ids(tok, *names):
    return tok.convert_tokens_to_ids(list(names))


def phi4_prompt(user: str, system: str | None, reasoning: bool = False) -> str:
    """Phi-4-mini's prompt by hand: no BOS, the system turn (the reasoning variant's own text first, ours after a
    space), the user turn untrimmed, ``<|assistant|>`` last."""
    if reasoning:
        head = f"<|system|>{PHI_NAME}{f' {system}' if system else ''}<|end|>"
    else:
        head = f"<|system|>{system}<|end|>" if system else ""
    return f"{head}<|user|>{user}<|end|><|assistant|>"


def check_phi4_prompt(tok, ids, text):
    """``ids`` are ``text`` encoded once: no <|endoftext|> (its BOS, EOS and pad) anywhere, <|assistant|> last and
    once."""
    eot, assistant = _phi_ids(tok, "<|endoftext|>", "<|assistant|>")
    assert list(ids) == phi4_raw().encode(text, add_special_tokens=False).ids
    assert eot not in ids and ids[-1] == assistant and list(ids).count(assistant) == 1


def test_the_phi4_folders_load_as_the_hubs_do(phi):
    """What the rest relies on: AutoTokenizer keeps the folder's pipeline (no BOS added on encode), BOS, EOS, pad and
    UNK all <|endoftext|>; AutoModelForCausalLM builds Phi3ForCausalLM with its fused qkv_proj / gate_up_proj, a
    partial rotary of 12 of 16 dims, longrope, the head tied to the embedding (no ``lm_head.weight`` in the file)
    with rows past the tokenizer's ids; the stops are generation_config.json's [<|end|>, <|endoftext|>]."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from pacs_fast.rollout.base import folder_stop_ids

    for name, (folder, tok) in phi.items():
        eot, end = _phi_ids(tok, "<|endoftext|>", "<|end|>")
        assert tok.backend_tokenizer.to_str() == phi4_raw().to_str()
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (eot,) * 4
        assert tok("12 plus 7")["input_ids"] == phi4_raw().encode("12 plus 7").ids
        assert GenerationConfig.from_pretrained(folder).eos_token_id == [end, eot]
        assert sorted(folder_stop_ids(folder, tok)) == sorted([end, eot])
        assert "lm_head.weight" not in tensor_names(folder / "model.safetensors")
        assert tok.apply_chat_template([{"role": "system", "content": "S "}, {"role": "user", "content": " U "}],
                                       tokenize=False, add_generation_prompt=True) == \
            phi4_prompt(" U ", "S ", reasoning=name == "reason")
    model = AutoModelForCausalLM.from_pretrained(phi["inst"][0])
    attn = model.model.layers[0].self_attn
    assert type(model).__name__ == "Phi3ForCausalLM" and hasattr(attn, "qkv_proj")
    assert hasattr(model.model.layers[0].mlp, "gate_up_proj")
    assert model.config.rope_parameters["rope_type"] == "longrope" and model.model.rotary_emb.inv_freq.numel() == 6
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.lm_head.weight.shape[0] > len(phi["inst"][1])


@pytest.mark.parametrize("name", ["inst", "reason"])
def test_phi4_prompts_are_the_template_once(phi, name):
    """encode_prompts under every data.system_prompt / data.instruction: the hand-rendered prompt (no BOS; the
    reasoning variant's own system text with ours after it) encoded once; the problems' text as given (untrimmed,
    "/think" only text); no warning from the trainer's prompt checks (<|end|> ends a turn and is a stop)."""
    from pacs_fast.data.prompts import prompt_warnings
    from pacs_fast.rollout.base import folder_stop_ids

    folder, tok = phi[name]
    for system_prompt, instruction_setting in [("pacs", "pacs"), ("", "pacs"), ("Be brief. ", ""), ("", "")]:
        system, instruction = prompt_parts(system_prompt, instruction_setting)
        for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)):
            user = problem if not instruction or problem.rstrip().endswith(instruction) else f"{problem} {instruction}"
            check_phi4_prompt(tok, ids, phi4_prompt(user, system, reasoning=name == "reason"))
    assert prompt_warnings(tok, PROBLEMS, folder_stop_ids(folder, tok)) == []
    text = phi4_prompt(PROBLEMS[0], SYSTEM_PROMPT, reasoning=name == "reason")
    # (the check catches the template's other ending, the EOS after a finished turn, and a prompt missing a turn)
    for bad, want in ((tok(text.replace("<|assistant|>", "<|endoftext|>"))["input_ids"], text),
                      (phi4_raw().encode(phi4_prompt(PROBLEMS[0], None)).ids, text)):
        with pytest.raises(AssertionError):
            check_phi4_prompt(tok, bad, want)


@pytest.mark.parametrize("sampler", ["lean", "generate"])
def test_the_hf_engine_stops_at_phi4s_end_and_endoftext(phi, sampler):
    """Both samplers: responses end at <|end|> or <|endoftext|> (both seen, kept once, last) or run to the limit;
    texts without them; log-probs one a token; greedy is the model's own argmax over the tokenizer's ids up to a
    stop (the tied head's rows past them cut); the pad, <|endoftext|>, is a stop."""
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine

    folder, tok = phi["inst"]
    eot, end = _phi_ids(tok, "<|endoftext|>", "<|end|>")
    engine = HFEngine(str(folder), sampler=sampler)
    assert (sorted(engine.eos_ids), engine.pad_id, engine.vocab_cut) == (sorted([end, eot]), eot, len(tok))
    prompts = encode_prompts(tok, PROBLEMS)
    out = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=MAX_NEW, seed=3,
                                                  return_logprobs=True))
    ends = set()
    for cs in out:
        for c in cs:
            ends.add(check_completion(c, {end, eot}, MAX_NEW))
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True) and "<|" not in c.text
            assert len(c.logprobs) == len(c.token_ids)
    assert ends == {end, eot, None}, ends
    greedy = engine.generate(prompts[:2], SamplingParams(n=2, temperature=0.0, max_new_tokens=MAX_NEW))
    for p, cs in zip(prompts, greedy):
        want = []
        while len(want) < MAX_NEW and not (want and want[-1] in (end, eot)):
            with torch.no_grad():
                want.append(int(engine.model(input_ids=torch.tensor([p + want])).logits[0, -1, :len(tok)].argmax()))
        assert [c.token_ids for c in cs] == [want, want]


@pytest.fixture(scope="module")
def phi_runs(phi, tmp_path_factory):
    return _runs(phi["inst"][0], tmp_path_factory.mktemp("phi_runs"), forcer(["<|end|>", "<|endoftext|>"]),
                 eval_extra=[])


def check_run(tok, which, calls, batches, output, run, prompt_of, stops, forced):
    """Every engine call: prompt ids ``prompt_of(problem)`` once; responses end at a stop of ``stops`` (each seen) or
    run to the limit; texts without special tokens. Train: the learner's rows are prompt + response with the masks on
    exactly each response and its stop; samples.jsonl keeps prompt and texts, token counts with the stop, the
    forced answers (``forced(gold) -> (text, reward)``) rewarded as given; response/* count the stops. Eval:
    samples_toy.jsonl the same."""
    from pacs_fast.evaluation.results import read_samples

    assert "warning:" not in output and "Traceback" not in output, output
    ends = set()
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            check = check_smol_prompt if "<|im_start|>" in tok.decode(p) else check_phi4_prompt
            check(tok, p, prompt_of(_problem(tok, p)))
            for c in cs:
                ends.add(check_completion(c, stops, params.max_new_tokens))
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert stops <= ends, ends
    if which == "eval":
        for r in read_samples(run / "samples_toy.jsonl").values():
            assert r["prompt"] == prompt_of(re.search(r"What is \d+ plus \d+\?", r["prompt"]).group(0))
            text, reward = forced(int(r["answer"]))
            assert (r["responses"][0], r["scores"][0]) == (text, reward)
            assert r["num_tokens"][0] == len(tok.encode(text, add_special_tokens=False)) + 1
        return
    train = [c for c in calls if c[1].return_logprobs]
    assert len(train) == len(batches) == 2
    samples = [s for s in read_jsonl(run / "samples.jsonl") if "row" in s]
    records = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    for step, ((prompts, _, comps), batch, record) in enumerate(zip(train, batches, records), 1):
        check_batch(batch, prompts, comps)
        flat = [c for cs in comps for c in cs]
        rows = [s for s in samples if s["step"] == step]
        assert [s["prompt"] for s in rows] == [tok.decode(p) for p in prompts for _ in range(G)]
        assert [(s["response"], s["response_tokens"], s["finish_reason"]) for s in rows] == \
            [(c.text, len(c.token_ids), c.finish_reason) for c in flat]
        for s in rows[::G]:
            text, reward = forced(int(s["answer"]))
            assert (s["response"], s["reward"], s["response_tokens"]) == \
                (text, reward, len(tok.encode(text, add_special_tokens=False)) + 1)
        assert record["response/tokens"] == sum(len(c.token_ids) for c in flat)
        assert record["response/stop_frac"] == pytest.approx(sum(c.finish_reason == "stop" for c in flat) / len(flat))
    bad = {k: v.clone() for k, v in batches[0].items()}  # (the check catches a mask one token short)
    bad["response_mask"] = torch.roll(bad["response_mask"], -1, dims=1)
    with pytest.raises(AssertionError):
        check_batch(bad, *train[0][::2])


@pytest.mark.parametrize("which", ["train", "eval"])
def test_a_phi4_run_sends_the_template_once_stops_at_both_and_masks_the_stop(phi, phi_runs, which):
    """``python -m pacs_fast.train`` / ``pacs_fast.eval`` on Phi-4-mini-instruct: prompts the template once (the
    paper's system turn, no BOS), responses ending at <|end|> and at <|endoftext|> (both seen) or at the limit, masks
    on exactly the response and its stop, samples and metrics counting it, the forced answers scored 1."""
    folder, tok = phi["inst"]
    calls, batches, output, run = phi_runs[which]
    check_run(tok, which, calls, batches, output, run,
              lambda problem: phi4_prompt(f"{problem} {INSTRUCTION}", SYSTEM_PROMPT), set(_phi_ids(tok, "<|end|>",
                                                                                              "<|endoftext|>")),
              lambda gold: (f"So \\boxed{{{gold}}}!", 1.0))


@pytest.fixture(scope="module")
def phi_reference(phi, phi_runs):
    from transformers import Phi3ForCausalLM

    folder, tok = phi["inst"]
    model = Phi3ForCausalLM.from_pretrained(folder).eval()
    return model, phi_runs["train"][1][0]


def test_the_phi4_engine_and_learner_give_the_models_own_log_probs(phi, phi_runs, phi_reference):
    """At the folder's weights (the first training call): the HF engine's log-prob of every sampled token, and the
    torch learner's padded and packed forwards of the run's first batch (rows of different lengths, padded with
    <|endoftext|>), are Phi3ForCausalLM's own forward of each row alone (partial rotary, longrope's short factors);
    the run's own engine-against-learner gap is float rounding."""
    _, tok = phi["inst"]
    model, batch = phi_reference
    assert len(set(batch["attention_mask"].sum(-1).tolist())) > 1  # (padding happens)
    refs = own_logprobs(model, batch, len(tok))
    prompts, _, comps = next(c for c in phi_runs["train"][0] if c[1].return_logprobs)
    r = 0
    for p, cs in zip(prompts, comps):
        for c in cs:
            ref = refs[r][len(p) - 1:len(p) - 1 + len(c.token_ids)]
            assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=1e-5, rtol=0), r
            r += 1
    for packing, kind in (("off", "padded"), ("on", "packed")):
        gap, forwards = learner_run(model, batch, len(tok), packing, False)
        assert gap < 1e-5 and set(forwards) == {kind}, (packing, gap, forwards)
    assert max(run_logprob_gaps(phi_runs["train"][3])) < 1e-4


def test_the_shared_prefix_forward_gives_phi4s_own_log_probs(phi, phi_reference, tmp_path):
    """The shared-prefix forward (each group's prompt once, the rows on its key/value cache, position ids continued)
    on Phi-3's partial rotary and longrope, on the folder without its sliding_window (which keeps the learner off
    this forward: the next test): every response token's log-prob is the model's own, and the forward ran."""
    from transformers import Phi3ForCausalLM

    folder, tok = phi["inst"]
    config = json.loads((folder / "config.json").read_text())
    assert config.pop("sliding_window") == 262144
    model = Phi3ForCausalLM.from_pretrained(folder, sliding_window=None).eval()
    assert model.config.sliding_window is None
    _, batch = phi_reference
    gap, forwards = learner_run(model, batch, len(tok), "off", True)
    assert gap < 1e-5 and set(forwards) == {"shared_prefix"}, (gap, forwards)


def test_the_learner_runs_its_shared_prefix_forward_on_phi4_mini(phi, phi_reference):
    _, tok = phi["inst"]
    model, batch = phi_reference
    gap, forwards = learner_run(model, batch, len(tok), "off", True)
    assert gap < 1e-5
    assert set(forwards) == {"shared_prefix"}, forwards


def test_the_phi4_checkpoint_keeps_its_tied_head(phi, phi_runs):
    """The step-2 checkpoint: no ``lm_head.weight`` written (the input has none: the head is the embedding), the
    hub's config keys kept (rope_scaling's three longrope fields, partial_rotary_factor,
    original_max_position_embeddings, sliding_window, tie_word_embeddings), tokenizer and generation files byte for
    byte; reloaded, the head is the trained embedding and every tensor is the file's."""
    folder, given = phi["inst"]
    ckpt = phi_runs["train"][3] / "checkpoints" / "step_000002"
    config = json.loads((ckpt / "config.json").read_text())
    assert sorted(config["rope_scaling"]) == ["long_factor", "short_factor", "type"]  # (transformers 4's check)
    model = check_tied_checkpoint(folder, ckpt, given)
    assert model.config.rope_parameters["partial_rotary_factor"] == 0.75


THINK_SYSTEM = ("Your role as an assistant involves thoroughly exploring questions through a systematic thinking "
                "process before providing the final solution. Structure your response as: <think> {Thought section} "
                "</think> {Solution section}.")


def _draft_right(gold):
    return f"<think>\nDraft: \\boxed{{{gold + 1}}}, no: {gold}.\n</think>\nSo \\boxed{{{gold}}}!"


def _draft_wrong(gold):
    return f"<think>\nSo \\boxed{{{gold}}}?\n</think>\nSo \\boxed{{{gold + 1}}}!"


@pytest.fixture(scope="module")
def reason_runs(phi, tmp_path_factory):
    """Phi-4-mini-reasoning under the system text asking for a think block, reward.extraction=boxed (eval
    --extraction boxed): sample 0 of each prompt thinks a wrong box and answers right, sample 1 thinks the right box
    and answers wrong."""
    return _runs(phi["reason"][0], tmp_path_factory.mktemp("reason_runs"),
                 body_forcer([_draft_right, _draft_wrong], ["<|end|>", "<|endoftext|>"]),
                 train_extra=["reward.extraction=boxed", f"data.system_prompt={THINK_SYSTEM}"],
                 eval_extra=["--extraction", "boxed", "--system-prompt", THINK_SYSTEM])


@pytest.mark.parametrize("which", ["train", "eval"])
def test_phi4_reasoning_think_blocks_are_kept_and_only_the_answer_after_them_is_read(phi, reason_runs, which):
    """The think blocks are text (<think> is no special token of Phi-4-mini's): the engine's texts and the samples
    files keep them; under reward.extraction=boxed the verifier reads only the box after </think>: the right answer
    after a wrong draft scores 1, a wrong answer after the right draft 0 (the reference extraction reads both boxes).
    Prompts are the reasoning template once (Phi's system text, then ours)."""
    from pacs_fast.evaluation.results import read_samples
    from pacs_fast.reward.verifier import math_reward

    _, tok = phi["reason"]
    calls, batches, output, run = reason_runs[which]
    check_run(tok, which, calls, batches, output, run,
              lambda problem: phi4_prompt(f"{problem} {INSTRUCTION}", THINK_SYSTEM, reasoning=True),
              set(_phi_ids(tok, "<|end|>", "<|endoftext|>")), lambda gold: (_draft_right(gold), 1.0))
    if which == "eval":
        rows = [(r["responses"][1], r["scores"][1], r["answer"]) for r in read_samples(run / "samples_toy.jsonl")
                .values()]
    else:
        rows = [(s["response"], s["reward"], s["answer"]) for s in read_jsonl(run / "samples.jsonl")
                if "row" in s and s["row"] % G == 1]
    assert rows and all((text, reward) == (_draft_wrong(int(gold)), 0.0) for text, reward, gold in rows), rows
    # (what the kept tags decide: without them, as a tokenizer marking <think> special would decode, both boxes count)
    untagged = _draft_right(7).replace("<think>", "").replace("</think>", "")
    assert math_reward(_draft_right(7), "7", extraction="boxed") == 1.0 and \
        math_reward(untagged, "7", extraction="boxed") == 0.0


def test_a_system_text_that_mentions_think_opens_no_think_block(phi, tmp_path):
    """``pacs_fast.eval --extraction boxed --system-prompt 'Always begin your reply with <think>.'`` on
    Phi-4-mini-reasoning (whose template opens no think block): a response ``So \\boxed{<gold>}!`` scores 1."""
    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples

    folder, _ = phi["reason"]
    text = io.StringIO()
    with recording(body_forcer([lambda gold: f"So \\boxed{{{gold}}}!"], ["<|end|>"]), every_call=True), \
            contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(folder), "--benchmarks", str(_data(tmp_path / "toy.jsonl", n=1)), "--n", "1",
                        "--max-tokens", "4", "--engine", "hf", "--out", str(tmp_path / "ev"), "--no-progress",
                        "--scorer-workers", "1", "--extraction", "boxed", "--system-prompt",
                        "Always begin your reply with <think>."])
    assert code == 0, text.getvalue()
    (r,) = read_samples(tmp_path / "ev" / "samples_toy.jsonl").values()
    assert "<think>" in r["prompt"] and r["prompt"].endswith("<|assistant|>")  # (the template opens nothing)
    assert r["responses"] == [f"So \\boxed{{{r['answer']}}}!"]
    assert r["scores"] == [1.0], r


@pytest.fixture(scope="module")
def crossing(tmp_path_factory):
    """A train run (2 steps) on the Phi-4-mini folder scaled to its prompts: original_max_position_embeddings 48 of
    1,536 (4,096 of 131,072 on the hub: 32x either way), so that the ~46-token prompts start below it and their
    responses cross it, as a Phi-4-mini(-reasoning) response past ~3,600 tokens after a 500-token prompt crosses
    4,096."""
    from transformers import AutoTokenizer

    tmp = tmp_path_factory.mktemp("crossing")
    folder = phi4_folder(tmp / "phi")
    config = json.loads((folder / "config.json").read_text())
    config.update(original_max_position_embeddings=48, max_position_embeddings=48 * 32)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder, AutoTokenizer.from_pretrained(folder), _runs(folder, tmp, forcer(["<|end|>", "<|endoftext|>"]))


def test_phi4_rows_cross_original_max_position_embeddings(crossing):
    """The setting of the next two tests: prompts shorter than original_max_position_embeddings, rows longer."""
    _, _, runs = crossing
    calls, batches, _, _ = runs["train"]
    prompts = [p for c in calls if c[1].return_logprobs for p in c[0]]
    assert max(map(len, prompts)) < 48 < max(int(b["attention_mask"].sum(-1).max()) for b in batches)


def test_phi4_mini_responses_crossing_original_max_position_embeddings_are_learned_as_sampled(crossing):
    _, _, runs = crossing
    assert max(run_logprob_gaps(runs["train"][3])) < 1e-4


@pytest.mark.parametrize("packing", ["off", "on"])
def test_a_phi4_mini_rows_log_probs_do_not_depend_on_the_rows_beside_it(crossing, packing):
    """The crossing run's first batch with its second group cut to one response token a row (rows of <= 48 tokens)
    beside the first group (a forced answer: 54 tokens): the log-probs of the short group in that micro-batch and
    alone, from the learner the trainer builds for the run's settings (build_learner)."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.trainer.build import build_learner

    folder, tok, runs = crossing
    b = {k: v.clone() for k, v in runs["train"][1][0].items()}
    short = torch.arange(G, 2 * G)
    ends = b["response_mask"][short].argmax(-1) + 1  # (one response token a row)
    keep = torch.arange(b["input_ids"].shape[1])[None, :] < ends[:, None]
    for k in ("attention_mask", "response_mask"):
        b[k][short] = b[k][short] * keep
    b["input_ids"][short] = torch.where(keep, b["input_ids"][short], tok.pad_token_id)
    lengths = b["attention_mask"].sum(-1)
    assert int(lengths[short].max()) <= 48 < int(lengths[:G].max())
    cfg = load_config(None, [f"model.path={folder}", *TRAIN, f"learner.packing={packing}"])
    learner, _ = build_learner(cfg, folder, "cpu", tok)

    def logprobs(rows):
        return learner.compute_logprobs(RolloutBatch(
            input_ids=b["input_ids"][rows], attention_mask=b["attention_mask"][rows],
            response_mask=b["response_mask"][rows], rewards=torch.zeros(len(rows)), group_size=G))

    together, alone = logprobs(torch.arange(2 * G)), logprobs(short)
    m = b["response_mask"][short] > 0
    assert torch.allclose(together[short][m], alone[m], atol=1e-5, rtol=0)


def _eval(folder, bench, out, *extra):
    from pacs_fast import eval as ev

    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(folder), "--benchmarks", str(bench), "--n", "2", "--engine", "hf",
                        "--out", str(out), "--no-progress", "--scorer-workers", "1", *extra])
    return code, text.getvalue()


def test_eval_samples_a_phi4_mini_row_crossing_the_threshold_with_one_set_of_factors(crossing, tmp_path, monkeypatch):
    """``pacs_fast.eval --engine hf`` on the crossing folder (~46-token prompts, original_max_position_embeddings 48):
    every forward of every call rotates with the long factors, as the trainer's engine and vLLM do for a context past
    the threshold. The eval's engine had been left to transformers' per-call choice: the prompt's forward and the
    first decode steps rotated with the short factors, the steps past 48 with the long ones beside that cache."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from pacs_fast.evaluation.settings import SETTINGS_FILE
    from pacs_fast.rollout import hf

    folder, _, _ = crossing
    used, generate = [], hf.HFEngine.generate

    def watched(self, *args, **kwargs):  # the inverse frequencies each rotary forward of the call used
        mods = [m for m in self.model.modules() if getattr(m, "rope_type", None) == "longrope"]
        def seen(m, args, kwargs, out):  # (the rotary's inputs: hidden states, position ids)
            positions = args[1] if len(args) > 1 else kwargs["position_ids"]
            used.append((m.config, m.inv_freq.clone(), int(positions.max())))

        hooks = [m.register_forward_hook(seen, with_kwargs=True) for m in mods]
        try:
            return generate(self, *args, **kwargs)
        finally:
            for h in hooks:
                h.remove()

    monkeypatch.setattr(hf.HFEngine, "generate", watched)
    code, out = _eval(folder, _data(tmp_path / "toy.jsonl", n=2, offset=50), tmp_path / "ev", "--max-tokens", "8")
    assert code == 0, out
    config = used[0][0]
    long = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"), seq_len=49)[0]
    short = ROPE_INIT_FUNCTIONS["longrope"](config, torch.device("cpu"), seq_len=48)[0]
    assert not torch.equal(long, short)
    assert used[0][2] < 48 <= max(p for _, _, p in used), [p for _, _, p in used]  # (prompts below, rows past it)
    assert all(torch.equal(f, long) for _, f, _ in used), [torch.equal(f, short) for _, f, _ in used]
    assert json.loads((tmp_path / "ev" / SETTINGS_FILE).read_text())["rope_factors"] == "long"


def test_eval_keeps_a_phi4_mini_folders_factors_and_sizes_vllm_by_them(crossing, tmp_path, monkeypatch):
    """Rows within the threshold (``--max-tokens 1``): the short factors, recorded; adding a problem whose row passes
    it to the same folder would sample it with the long ones beside samples made with the short: refused in one line
    naming the setting. vLLM on a GPU is given the context (it picks the factors by max_model_len; the model's own
    131,072 positions had made them long for every prompt)."""
    import argparse

    from pacs_fast.evaluation import engine

    folder, _, _ = crossing
    bench = _data(tmp_path / "toy.jsonl", n=2, offset=50)
    with bench.open("a") as f:  # (a third problem, past the threshold: left out by --limit 2, then asked for)
        f.write(json.dumps({"id": "long", "problem": "What is 3 plus 4? " * 4, "answer": "7"}) + "\n")
    code, out = _eval(folder, bench, tmp_path / "ev", "--max-tokens", "1", "--limit", "2")
    assert code == 0, out
    code, out = _eval(folder, bench, tmp_path / "ev", "--max-tokens", "1")
    assert code == 2 and "rope_factors" in out and len(out.strip().splitlines()) == 1, out
    args = argparse.Namespace(model=str(folder), max_model_len=None, max_tokens=1, samples_per_call=8,
                              engine="vllm", dtype="auto", device=None, system=None, instruction="pacs",
                              chat_template_kwargs=None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    sets = {"toy": [type("P", (), {"problem": "What is 3 plus 4?"})()]}
    monkeypatch.setattr(engine, "prompt_kwargs", lambda a: {})
    assert engine.rope_factors(args, sets) == {"rope_factors": "short"} and 1 < args.rope_context <= 48
    assert engine.vllm_cpu_sizes(args, sets, {"toy": [0]}, {"toy": 1}) == {"max_model_len": args.rope_context}


@pytest.mark.parametrize("name", ["phi", "smol"])
def test_the_megatron_learner_refuses_phi3_and_smollm3_in_one_line_before_it_loads(request, name, tmp_path, capsys,
                                                                                    monkeypatch):
    """learner.backend=megatron: its builder takes qwen2 / qwen3 / llama; phi3 (fused projections, partial rotary,
    longrope) and smollm3 (NoPE layers) are one line naming model.path and the model_type, before the learner is
    built (build_learner is never called), and no run folder is left."""
    no_learner(monkeypatch)
    folder = request.getfixturevalue(name)["inst"][0] if name == "phi" else request.getfixturevalue(name)[0]
    kind = "phi3" if name == "phi" else "smollm3"
    runs = tmp_path / "runs"
    code, err = cli([f"model.path={folder}", "learner.backend=megatron", f"data.dataset={_data(tmp_path / 'd.jsonl')}",
                     f"train.out_dir={runs}", "train.run_name=m"], capsys)
    check_one_line_refusal(err, code, f"error: learner.backend=megatron cannot build model.path={folder}: ",
                           f"got '{kind}'; learner.backend=torch trains it")
    assert not (runs / "m").exists()


# =========================================================================================== SmolLM3

@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """``(folder, AutoTokenizer)`` of the SmolLM3-3B-shaped folder."""
    from transformers import AutoTokenizer

    folder = smollm3_folder(tmp_path_factory.mktemp("smollm3") / "smollm3")
    return folder, AutoTokenizer.from_pretrained(folder)


TODAY = "07 December 2026"  # (the day test_llama3_path_sweep.clock(.., 7) sets)
SMOL_THINK_DEFAULT = SMOLLM3_TEMPLATE.split('{{- "You are a helpful AI assistant named SmolLM, trained by Hugging '
                                            'Face. ', 1)[1].split('" -}}', 1)[0].replace("\\n", "\n")


def smol_prompt(user: str, system: str | None, thinking: bool = True, today: str = TODAY) -> str:
    """SmolLM3's prompt by hand: the metadata with the day and the reasoning mode (enable_thinking, overridden by
    /no_think or /think in the system text, which lose them), our system text as its custom instructions (else its
    default for the mode), the user turn untrimmed, the assistant header with an empty think block in /no_think."""
    mode = "/think" if thinking else "/no_think"
    if system and "/no_think" in system:
        mode = "/no_think"
    elif system and "/think" in system:
        mode = "/think"
    custom = (system or "").replace("/no_think", "").replace("/think", "").rstrip()
    name = "You are a helpful AI assistant named SmolLM, trained by Hugging Face."
    instructions = f"{custom}\n\n" if custom else f"{name} {SMOL_THINK_DEFAULT}" if mode == "/think" else f"{name}\n\n"
    empty_think = "" if mode == "/think" else "<think>\n\n</think>\n"
    return (f"<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nToday Date: {today}\n"
            f"Reasoning Mode: {mode}\n\n## Custom Instructions\n\n{instructions}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{empty_think}")


def check_smol_prompt(tok, ids, text):
    """``ids`` are ``text`` encoded once: no BOS (the template writes none, the tokenizer adds none), three turns, no
    <|im_end|> last."""
    bos, start, end = tok.convert_tokens_to_ids(["<|begin_of_text|>", "<|im_start|>", "<|im_end|>"])
    assert list(ids) == smol_raw().encode(text, add_special_tokens=False).ids
    assert bos not in ids and list(ids).count(start) == 3 and ids[-1] != end


def test_the_smollm3_folder_loads_as_the_hubs_do(smol):
    """AutoTokenizer keeps the pipeline (no BOS on encode), EOS <|im_end|>, pad <|finetune_right_pad_id|>, <think> /
    </think> one token each and kept by a decode without special tokens; AutoModelForCausalLM builds
    SmolLM3ForCausalLM whose 4th layer has no RoPE (no_rope_layers [1, 1, 1, 0]), its head tied to the embedding
    (no ``lm_head.weight`` in the file); the only stop is <|im_end|>."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.rollout.base import folder_stop_ids

    folder, tok = smol
    end, pad, think, unthink = tok.convert_tokens_to_ids(["<|im_end|>", "<|finetune_right_pad_id|>", "<think>",
                                                          "</think>"])
    assert tok.backend_tokenizer.to_str() == smol_raw().to_str()
    assert (tok.eos_token_id, tok.pad_token_id) == (end, pad) and tok("12 plus 7")["input_ids"] == \
        smol_raw().encode("12 plus 7").ids
    ids = tok.encode("<think>\nx\n</think>\nSo", add_special_tokens=False)
    assert ids.count(think) == ids.count(unthink) == 1
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>\nSo"
    assert folder_stop_ids(folder, tok) == [end]
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == "SmolLM3ForCausalLM" and model.config.no_rope_layers == [1, 1, 1, 0]
    assert [layer.self_attn.use_rope for layer in model.model.layers] == [1, 1, 1, 0]
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" not in tensor_names(folder / "model.safetensors")


def test_smollm3_prompts_follow_its_thinking_flags(smol, monkeypatch):
    """encode_prompts (on a fixed day: the template writes the day it renders) under every data.system_prompt /
    data.instruction, with and without data.chat_template_kwargs={enable_thinking: false}: the hand-rendered prompt
    encoded once: /think and no think block by default, /no_think and the empty think block after the assistant
    header with enable_thinking false; a system text of /no_think or /think alone sets the mode (the default
    instructions then); a problem's "/think" sets nothing."""
    _, tok = smol
    with clock(monkeypatch, 7):
        for kwargs, thinking in (({}, True), ({"enable_thinking": False}, False), ({"enable_thinking": True}, True)):
            for system_prompt, instruction_setting in [("pacs", "pacs"), ("", "pacs"), ("Be brief. ", ""), ("", ""),
                                                       ("/no_think", "pacs"), ("/think", "")]:
                system, instruction = prompt_parts(system_prompt, instruction_setting)
                for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction,
                                                                 template_kwargs=kwargs)):
                    user = problem if not instruction or problem.rstrip().endswith(instruction) else \
                        f"{problem} {instruction}"
                    check_smol_prompt(tok, ids, smol_prompt(user, system, thinking))
        text = smol_prompt(PROBLEMS[0], SYSTEM_PROMPT, False)  # (the check tells the modes apart)
        with pytest.raises(AssertionError):
            check_smol_prompt(tok, encode_prompts(tok, PROBLEMS[:1], instruction=None)[0], text)


@pytest.fixture(scope="module")
def smol_runs(smol, tmp_path_factory):
    """``python -m pacs_fast.train`` (2 steps, data.chat_template_kwargs={enable_thinking: false}) on a fixed day,
    sample 0 of each prompt forced right."""
    with pytest.MonkeyPatch.context() as mp, clock(mp, 7):
        return _runs(smol[0], tmp_path_factory.mktemp("smol_runs"), forcer(["<|im_end|>"]),
                     train_extra=["data.chat_template_kwargs={enable_thinking: false}"])


def test_a_smollm3_run_sends_no_think_prompts_stops_at_im_end_and_masks_it(smol, smol_runs):
    """Every engine call of the run (training rollouts and the held-out evaluations): the /no_think prompt with its
    empty think block, once; responses end at <|im_end|> or at the limit; masks, samples and metrics as for Phi-4;
    no warning: the template's clock (strftime_now, which no date_string sets) is stopped at the run's first day for
    the whole run (a note says so; it had been a warning that a resume on another day renders other prompts)."""
    _, tok = smol
    calls, batches, output, run = smol_runs["train"]
    assert not [line for line in output.splitlines() if line.startswith("warning:")], output
    lines = [line for line in output.splitlines() if line.startswith("note: the chat template dates its prompts")]
    assert len(lines) == 1 and lines[0].endswith("(its clock is stopped)"), output
    check_run(tok, "train", calls, batches, output.replace(lines[0], ""), run,
              lambda problem: smol_prompt(f"{problem} {INSTRUCTION}", SYSTEM_PROMPT, thinking=False),
              {tok.convert_tokens_to_ids("<|im_end|>")}, lambda gold: (f"So \\boxed{{{gold}}}!", 1.0))
    assert len(calls) > 2  # (the held-out evaluations' calls were checked too)


def test_the_smollm3_learner_scores_each_row_as_the_model_with_its_nope_layer(smol, smol_runs):
    """The run's first batch through the torch learner at the folder's weights, padded, packed and shared-prefix
    (each seen to run): every response token's log-prob is SmolLM3ForCausalLM's own of its row alone (RoPE on
    layers 1-3, none on layer 4); a learner whose 4th layer rotated (the fault) is seen off; the run's own gap is
    float rounding."""
    from transformers import SmolLM3ForCausalLM

    folder, tok = smol
    model = SmolLM3ForCausalLM.from_pretrained(folder).eval()
    batch = smol_runs["train"][1][0]
    for packing, shared, kind in (("off", False, "padded"), ("on", False, "packed"), ("off", True, "shared_prefix")):
        gap, forwards = learner_run(model, batch, len(tok), packing, shared)
        assert gap < 1e-5 and set(forwards) == {kind}, (packing, shared, gap, forwards)
    assert max(run_logprob_gaps(smol_runs["train"][3])) < 1e-4
    wrong = SmolLM3ForCausalLM.from_pretrained(folder).eval()
    wrong.model.layers[3].self_attn.use_rope = 1
    refs, got = own_logprobs(model, batch, len(tok)), own_logprobs(wrong, batch, len(tok))
    assert max(float((a - b).abs().max()) for a, b in zip(refs, got)) > 1e-3


def test_the_smollm3_checkpoint_keeps_its_tied_head_and_nope_layers(smol, smol_runs):
    folder, given = smol
    ckpt = smol_runs["train"][3] / "checkpoints" / "step_000002"
    model = check_tied_checkpoint(folder, ckpt, given)
    assert [layer.self_attn.use_rope for layer in model.model.layers] == [1, 1, 1, 0]


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_vllm_on_smollm3_is_refused_in_one_line_before_any_model_loads(smol, tmp_path, capsys, monkeypatch):
    """``rollout.engine=vllm``: vLLM 0.32 lists SmolLM3ForCausalLM but runs it through its Transformers modeling
    backend, which patches transformers' model class in the trainer's process (the learner's first update then
    failed): one line naming model.path, before build_learner (never called), no run folder left. vLLM's own
    ModelConfig is read (no engine starts)."""
    with capsys.disabled():  # transformers' and vLLM's log handlers bind the stream of their first import
        from pacs_fast.rollout.vllm_setup import set_cpu_env_defaults

        set_cpu_env_defaults()
        import transformers  # noqa: F401
        import vllm.logger  # noqa: F401
    no_learner(monkeypatch)
    folder, _ = smol
    runs = tmp_path / "runs"
    code, err = cli([f"model.path={folder}", "rollout.engine=vllm", f"data.dataset={_data(tmp_path / 'd.jsonl')}",
                     f"train.out_dir={runs}", "train.run_name=v"], capsys)
    check_one_line_refusal(err, code, f"error: model.path={folder}: vLLM has no implementation of its architecture "
                           "SmolLM3ForCausalLM, only its Transformers modeling backend (TransformersForCausalLM)",
                           "rollout.engine=vllm cannot run it: use rollout.engine=hf")
    assert not (runs / "v").exists()


def test_a_smollm3_system_text_with_no_think_turns_thinking_off(smol, monkeypatch):
    """data.system_prompt='Be brief. /no_think' (SmolLM3's model card: /no_think in the system prompt switches the
    thinking off): the prompt is the template's with /no_think, "Be brief." as the custom instructions and the
    empty think block."""
    _, tok = smol
    system = "Be brief. /no_think"
    with clock(monkeypatch, 7):
        (ids,) = encode_prompts(tok, PROBLEMS[:1], system=system)
        assert tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": "Q"}],
                                       tokenize=False, add_generation_prompt=True) == smol_prompt("Q", system)
    check_smol_prompt(tok, ids, smol_prompt(f"{PROBLEMS[0]} {INSTRUCTION}", system))


def test_a_gpu_vllm_engine_of_a_longrope_model_gets_the_runs_context(phi, smol, monkeypatch):
    """With CUDA, vLLM sizes its engine itself, but picks a longrope model's factors by its ``max_model_len`` (long
    past original_max_position_embeddings, for every row): the engine of a Phi-4-mini gets the run's context
    (``data.max_prompt_tokens + rollout.max_new_tokens``), the one ``pin_longrope`` pins the learner's factors by;
    another model's gets nothing (vLLM's own default). vLLM's own derivation stands in (no vLLM import here)."""
    from pacs_fast.config import load_config
    from pacs_fast.rollout import vllm_setup
    from pacs_fast.trainer import build

    monkeypatch.setattr(build.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(vllm_setup, "derived_max_model_len", lambda path: 131072)
    cfg = load_config(None, ["data.max_prompt_tokens=512", "rollout.max_new_tokens=6000"])
    assert build.vllm_cpu_sizes(cfg, phi["reason"][0]) == {"max_model_len": 6512}
    assert build.vllm_cpu_sizes(cfg, smol[0]) == {}
