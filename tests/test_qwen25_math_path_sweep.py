"""The product on Qwen2.5-Math-1.5B / 7B folders as RLVR users bring them (hostile sweep of 2026-12-07).

Qwen2.5-Math-1.5B / -7B are the most common RLVR base models (SimpleRL-Zoo, Oat-Zero / understand-r1-zero, PRIME,
DeepScaleR-style runs). Where they differ from the Qwen2.5 / Qwen3 folders of the other sweeps: a context of 4,096
tokens (``max_position_embeddings``; ``rope_theta`` 10,000; a ``sliding_window`` of 4,096 that
``use_sliding_window: false`` leaves unused, with ``max_window_layers`` 21 of 28 in the 1.5B), and a chat template
(Qwen2.5's with one change, verbatim below: reconstructed from a print of Qwen/Qwen2.5-Math-1.5B's
``tokenizer.chat_template`` in a stored notebook, compared with two other stored copies) whose DEFAULT SYSTEM MESSAGE
is the boxed instruction "Please reason step by step, and put your final answer within \\boxed{}.", the paper's
INSTRUCTION word for word. The base model's EOS is ``<|endoftext|>`` (its generation config's one stop id) under that
template, whose turns end with ``<|im_end|>``; the Instruct model's generation config lists both. The 1.5B ties its
head (151,936 rows for 151,665 token ids), the 7B does not (152,064 rows).

The folders, written as the hub's are: the Qwen3 sweep's byte-level BPE (Qwen2's split regex, NFC) with Qwen2.5's 22
added tokens at their real ids (``<|endoftext|>`` 151643, ``<|im_start|>`` 151644, ``<|im_end|>`` 151645 ..
``<|file_sep|>`` 151664), tokenizer_config.json (``Qwen2Tokenizer``, the template, no BOS, pad ``<|endoftext|>``,
EOS ``<|im_end|>`` / ``<|endoftext|>``), config.json (the 1.5B's keys and values at hidden 64, FFN 128, 2 layers,
``max_window_layers`` 1, 2 heads of 32, 1 KV head, tied, fp32) and generation_config.json (base: eos 151643;
Instruct: eos [151645, 151643], pad 151643; its sampling values as Qwen2.5-Instruct's, from memory: they matter to
nothing here). The tied rows of ``<|im_end|>``, ``<|endoftext|>`` and the last padded row read one hidden unit
each, so responses end at either stop id or run on, and a padded row not cut would be drawn.

Checked against references built here (the template rendered by hand and encoded by tokenizer.json's backend, eager
unpadded forwards of the checkpoints), with engine calls, learner batches, samples.jsonl / metrics.jsonl and
checkpoints recorded from short real runs of ``python -m pacs_fast.train`` (HF engine: the base folder in
Qwen2.5-Math's own format, ``data.system_prompt='' data.instruction=''``, packed rows; the Instruct folder in the
paper's, padded rows; vLLM-CPU once on the base folder), a ``--resume`` and ``python -m pacs_fast.eval --engine hf``
on the trained checkpoint:

1. Context. Both engines hold the 4,096 (the HF engine's ``max_model_len``, from the folder or the trainer's live
   model; vLLM's derived ``max_model_len``, the tokenizer's 131,072 notwithstanding; the trainer's vLLM-CPU engine
   sized within it at ``rollout.max_new_tokens=5000``): no response passes it, those cut there end ``length`` at
   exactly 4,096, a prompt that fills it is refused. The trainer: a prompt of 4,096 tokens is one line, exit 2,
   before any model loads; ``rollout.max_new_tokens`` past the context is the documented warning (responses end at
   the context). Eval: ``--max-tokens 5000`` the same warning, a prompt that fills the context one line, exit 2,
   before the model loads. ``data.max_prompt_tokens + rollout.max_new_tokens`` over 4,096 with prompts that leave
   room says nothing (no row reaches the context), as documented.
2. Prompts: the paper's system text replaces the template's boxed one (the instruction once); ``''`` keeps the
   template's; both ``''`` give Qwen2.5-Math's own format; no BOS, rendered once.
3. The base model under its template: the warning line (once; none for Instruct), <|endoftext|> alone stops it
   (<|im_end|> inside its responses, dropped from texts), masks exact; the Instruct folder stops at both.
4. Learner: packed (varlen) and padded rows, with and without the shared-prefix forward, give the HF engine's
   log-probs and an eager forward's to 1e-5 (fp32; a learner over all 151,936 rows misses); the tied head trained
   and saved as ``save_pretrained`` writes it (no ``lm_head.weight``), loaded back exactly; ``--resume`` after step 1
   bit-exact (samples, records, weights); the memory check's parameter count 1.54B (tied) / 7.62B (untied).
5. Eval on the trained checkpoint: pass@k (the unbiased estimator) and maj@k (disjoint blocks, ties the share
   right) read right from forced samples.
No bug in those paths beyond the two below.

Found and fixed (each test failed before its fix, shown by reverting the library change):
- ``data.system_prompt=''`` (eval: ``--system-prompt ''``) with the default instruction sent the boxed instruction
  twice (the template's system message and ours after the problem) without a word, where problems asking for a
  format are a warning: now one warning line, trainer and eval
  (pacs_fast/data/prompts.py ``template_format_request``; trainer/problems.py ``encode``; evaluation/prompt_fit.py);
- the memory check sized rows of ``data.max_prompt_tokens + rollout.max_new_tokens`` tokens past the model's
  context, which no row reaches: at ``rollout.max_new_tokens=8192`` Qwen2.5-Math's groups were counted at 8,704
  tokens a row, the learner's activations and the HF engine's KV cache about twice their most
  (pacs_fast/trainer/engine_memory.py ``row_limits``).
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
from test_llama3_path_sweep import _data, check_batch, check_completion
from test_qwen3_path_sweep import ADDED as QWEN3_ADDED, CORPUS, byte_level_bpe

HAS_VLLM = importlib.util.find_spec("vllm") is not None

# Qwen2.5-Math-1.5B's / -7B's (base and Instruct) chat template, as their tokenizer_config.json holds it: Qwen2.5's
# with the boxed instruction as its default system message (the tools branch writes it too)
MATH_DEFAULT_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
QWEN25_MATH_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'Please reason step by step, and put your final answer within \\\\boxed{}.' }}\n"
    "    {%- endif %}\n"
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are '
    'provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within '
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nPlease reason step by step, and put your final answer within \\\\boxed{}."
    "<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == '
    '"assistant" and not message.tool_calls) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n")
QWEN25_MATH_TEMPLATE_SHA256 = "c564d12c9977b8942423753b0c409a11f50142508ced170e9fe1c2f5b803cf70"  # (2,513 characters)
ADDED = QWEN3_ADDED[:22]  # Qwen2.5's added tokens, <|endoftext|> 151643 .. <|file_sep|> 151664
EOT, IM_START, IM_END = 151643, 151644, 151645
TOKENS, ROWS, ROWS_7B = 151665, 151936, 152064  # len(tokenizer); the LM head's rows: 1.5B, 7B
PADDED_HOT = ROWS - 1
CONTEXT = 4096  # max_position_embeddings (and sliding_window, unused: use_sliding_window false)
HOT = 6.0
G, P, MAX_NEW = 4, 2, 12

# the real configs' keys (config.json of Qwen/Qwen2.5-Math-1.5B and -7B), widths as the hub's
REAL_1_5B = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": EOT,
             "eos_token_id": EOT, "hidden_act": "silu", "hidden_size": 1536, "initializer_range": 0.02,
             "intermediate_size": 8960, "max_position_embeddings": CONTEXT, "max_window_layers": 21,
             "model_type": "qwen2", "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
             "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": True,
             "torch_dtype": "bfloat16", "transformers_version": "4.37.0", "use_cache": True, "use_mrope": False,
             "use_sliding_window": False, "vocab_size": ROWS}
REAL_7B = {**REAL_1_5B, "hidden_size": 3584, "intermediate_size": 18944, "max_window_layers": 28,
           "num_attention_heads": 28, "num_key_value_heads": 4, "tie_word_embeddings": False, "vocab_size": ROWS_7B}
# the tiny folders': 1.5B's keys, hidden 64, FFN 128, 2 layers (max_window_layers 1: a mix, were the window on), 2
# heads of 32 (vLLM's CPU attention takes no head of 16), 1 KV head, fp32 (bf16 would blur the log-prob references)
TINY = {**REAL_1_5B, "hidden_size": 64, "intermediate_size": 128, "max_window_layers": 1, "num_attention_heads": 2,
        "num_hidden_layers": 2, "num_key_value_heads": 1, "torch_dtype": "float32"}
GENERATION = {"base": {"bos_token_id": EOT, "do_sample": False, "eos_token_id": EOT, "max_new_tokens": 2048},
              "inst": {"bos_token_id": EOT, "pad_token_id": EOT, "do_sample": True, "eos_token_id": [IM_END, EOT],
                       "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20}}

_RAW = []


def _raw():
    """tokenizer.json's backend (built once), as the Qwen3 sweep's with Qwen2.5's 22 added tokens."""
    if not _RAW:
        _RAW.append(byte_level_bpe(CORPUS + [MATH_DEFAULT_SYSTEM] * 5, ADDED))
    return _RAW[0]


def math_folder(folder: Path, *, base: bool, like: Path | None = None) -> Path:
    """A Qwen2.5-Math-1.5B(-Instruct)-shaped folder (module docstring); ``like``: copy tokenizer and weights."""
    import shutil

    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    if like is not None:
        for name in ("tokenizer.json", "vocab.json", "merges.txt", "model.safetensors"):
            shutil.copyfile(like / name, folder / name)
    else:
        raw = _raw()
        raw.save(str(folder / "tokenizer.json"))
        model = json.loads(raw.to_str())["model"]
        (folder / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False))
        (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in model["merges"]))
    cfg = {"add_prefix_space": False,
           "added_tokens_decoder": {str(EOT + i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                                   "single_word": False, "special": s}
                                    for i, (c, s) in enumerate(ADDED)},
           "additional_special_tokens": [c for c, _ in ADDED[1:14]], "bos_token": None,
           "chat_template": QWEN25_MATH_TEMPLATE, "clean_up_tokenization_spaces": False,
           "eos_token": "<|endoftext|>" if base else "<|im_end|>", "errors": "replace", "model_max_length": 131072,
           "pad_token": "<|endoftext|>", "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer",
           "unk_token": None}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))
    config = {**TINY, "eos_token_id": EOT if base else IM_END}
    if like is None:
        torch.manual_seed(0)
        lm = Qwen2ForCausalLM(Qwen2Config(**config))
        with torch.no_grad():  # (tied: each row is the token's embedding and its head row)
            for unit, i in enumerate((IM_END, EOT, PADDED_HOT)):
                lm.model.embed_tokens.weight[i] = 0.0
                lm.model.embed_tokens.weight[i, unit] = HOT
                lm.model.norm.weight[unit] = -1.0
        assert lm.lm_head.weight is lm.model.embed_tokens.weight
        lm.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {**GENERATION["base" if base else "inst"], "transformers_version": "4.37.0"}, indent=2))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{"inst": (folder, tokenizer), "base": ...}``."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("qmath")
    out = {}
    for name in ("inst", "base"):
        folder = math_folder(root / name, base=name == "base", like=out["inst"][0] if out else None)
        out[name] = (folder, AutoTokenizer.from_pretrained(folder))
    return out


def decoded(ids) -> str:
    return _raw().decode(list(ids), skip_special_tokens=True)


def math_prompt(user: str, system: str | None) -> str:
    """Qwen2.5-Math's prompt for one user message, by hand: the system turn (ours, or the template's own boxed
    instruction where we give none), the user's turn as given, the assistant header (no BOS: Qwen has none)."""
    return (f"<|im_start|>system\n{system or MATH_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def check_prompt(ids, text: str):
    """``ids`` are ``text`` encoded once by tokenizer.json's backend: nothing added, one system turn, no stop id."""
    assert list(ids) == _raw().encode(text, add_special_tokens=False).ids
    assert list(ids).count(IM_START) == 3 and ids[0] == IM_START and ids[-1] not in (EOT, IM_END)


# ------------------------------------------------------------------------------------------- the folder itself

def test_the_folder_is_qwen25_math_15b_as_the_hub_has_it(folders):
    """What the other tests rely on: the template's default system message is the boxed instruction (the paper's
    INSTRUCTION word for word); AutoTokenizer gives a Qwen2Tokenizer with Qwen2.5's 22 added tokens at their real
    ids (151,665 ids, 271 padded head rows), no BOS, EOS <|im_end|> (Instruct) / <|endoftext|> (base), pad
    <|endoftext|>; the config keeps the 4,096-token context, rope_theta 10,000 and the unused 4,096 window
    (``use_sliding_window`` false: every layer full attention, max_window_layers notwithstanding); the head is tied
    (no ``lm_head.weight`` in the file); the generation configs list the hub's stop ids."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, GenerationConfig

    assert MATH_DEFAULT_SYSTEM == INSTRUCTION
    assert hashlib.sha256(QWEN25_MATH_TEMPLATE.encode()).hexdigest() == QWEN25_MATH_TEMPLATE_SHA256
    for name, (folder, tok) in folders.items():
        assert type(tok).__name__ == "Qwen2Tokenizer" and len(tok) == TOKENS, name
        assert (tok.bos_token, tok.pad_token_id) == (None, EOT)
        assert tok.eos_token_id == (IM_END if name == "inst" else EOT)
        assert [tok.convert_tokens_to_ids(c) for c, _ in ADDED] == list(range(EOT, TOKENS))
        for text in CORPUS[:4] + [MATH_DEFAULT_SYSTEM, "a<|im_end|>b"]:
            assert tok.encode(text) == _raw().encode(text).ids
        assert GenerationConfig.from_pretrained(folder).eos_token_id == ([IM_END, EOT] if name == "inst" else EOT)
    folder, _ = folders["base"]
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in set(f.keys())
    model = AutoModelForCausalLM.from_pretrained(folder)
    c = model.config
    assert (c.model_type, c.max_position_embeddings, c.rope_parameters["rope_theta"], c.vocab_size) == \
        ("qwen2", CONTEXT, 10000.0, ROWS)
    assert c.use_sliding_window is False and set(c.layer_types) == {"full_attention"}
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_the_memory_check_counts_the_real_15b_and_7b(tmp_path):
    """The memory check's parameter count from the real configs (no weights): 1.54B with the head tied (1.5B), 7.62B
    with an untied head of 152,064 rows (7B), within the biases and norms it leaves out (a few per mille)."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.memory_model import model_params, model_shape

    for name, real, tied, want in (("1.5b", REAL_1_5B, True, 1.54e9), ("7b", REAL_7B, False, 7.62e9)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(real))
        shape = model_shape(load_config(None, [f"model.path={tmp_path / name}"]))
        assert shape["tied"] is tied and shape["vocab"] == real["vocab_size"]
        assert model_params(shape) == pytest.approx(want, rel=3e-3), name


def test_the_memory_check_sizes_rows_within_the_4096_context(tmp_path):
    """BUG (found and fixed 2026-12-07). No row of a Qwen2.5-Math run outgrows its 4,096-token context (both
    engines end responses there), yet the memory check sized rows of ``data.max_prompt_tokens +
    rollout.max_new_tokens`` tokens: at ``rollout.max_new_tokens=8192`` (a usual R1-style setting) groups of
    8 x 8,704 tokens, the learner's activations, attention scores and the HF engine's KV cache about twice what
    any row can need (a run that fits could be refused). Now (pacs_fast/trainer/engine_memory.py ``row_limits``) the
    rows are sized within the context: a run at 8,192 is sized as one at 3,584 (512 + 3,584 = 4,096), padded or
    packed; with the shared-prefix forward the largest group is a 1-token prompt and 8 responses of 4,095."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.memory_model import group_tokens, hf_engine_bytes, learner_memory, model_shape

    (tmp_path / "config.json").write_text(json.dumps(REAL_1_5B))

    def sized(new, *extra):
        cfg = load_config(None, [f"model.path={tmp_path}", "model.dtype=bfloat16", "rollout.n=8",
                                 f"rollout.max_new_tokens={new}", "learner.micro_batch_prompts=1", *extra])
        return (group_tokens(cfg), learner_memory(cfg, device="cuda")["total"],
                hf_engine_bytes(cfg, model_shape(cfg)))

    for padded in (["learner.shared_prefix=false"], ["learner.packing=on"]):
        assert sized(8192, *padded) == sized(CONTEXT - 512, *padded), padded
        assert sized(8192, *padded)[0] == 8 * CONTEXT
    assert sized(CONTEXT - 512)[0] == 512 + 8 * (CONTEXT - 512)  # (the shared prompt once)
    assert sized(8192)[0] == 1 + 8 * (CONTEXT - 1)


# ------------------------------------------------------------------------------------------- prompts

PROBLEMS = ["What is 12 plus 7?", "  spaced\r\nout  ", "café 日本 e\u0301"]


def test_prompts_are_the_template_once_with_its_system_message_replaced_or_its_own(folders):
    """encode_prompts (the trainer's and eval's prompt ids): the paper's system text replaces the template's boxed
    one (which is then nowhere in the prompt: the instruction once, after the problem); ``data.system_prompt=''``
    leaves the template's own; with ``data.instruction=''`` as well the prompt is Qwen2.5-Math's own format (the
    boxed system message, the bare problem). No BOS, the template rendered once."""
    for name in ("inst", "base"):
        _, tok = folders[name]
        for system_prompt, instruction_setting in [("pacs", "pacs"), ("", ""), ("", "pacs"), ("Be brief.", "")]:
            system, instruction = prompt_parts(system_prompt, instruction_setting)
            got = encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)
            for problem, ids in zip(PROBLEMS, got):
                user = f"{problem} {instruction}" if instruction else problem
                text = math_prompt(user, system)
                check_prompt(ids, text)
                assert tok.decode(ids).count(INSTRUCTION) == (instruction is not None) + (system is None)


def test_two_instructions_are_told_when_the_template_writes_its_own(folders, tmp_path):
    """BUG (found and fixed 2026-12-07). Qwen2.5-Math's template writes "Please reason step by step, and put your
    final answer within \\boxed{}." as its system message when we give none; ``data.system_prompt=''`` with the
    default ``data.instruction`` then sends that instruction twice (system turn and user turn), and nothing said
    so (the product warns of two instructions when the PROBLEMS ask for a format: README). The trainer's prompt
    encoding (pacs_fast/trainer/problems.py ``encode``) and eval's prompt checks now say it in one line; the
    paper's system text, ``data.instruction=''`` or a template whose default asks for nothing (Qwen2.5's) get
    none."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.problems import encode

    _, tok = folders["inst"]
    problems = [{"id": "q0", "problem": "What is 1 plus 2?", "answer": "3"}]
    for system_prompt, instruction, told in (("", "pacs", True), ("", "Show your work in \\boxed{}.", True),
                                             ("pacs", "pacs", False), ("", "", False)):
        cfg = load_config(None, [f"data.system_prompt={system_prompt}", f"data.instruction={instruction}"])
        lines = []
        encode(cfg, tok, problems, "data.dataset", lines.append)
        encode(cfg, tok, problems, "the held-out set", lines.append, held_out=True)  # (said once)
        want = [f"warning: data.system_prompt='' leaves the system message to the chat template, whose own already "
                f"asks for an answer format ({MATH_DEFAULT_SYSTEM!r}), and data.instruction={instruction} appends "
                f"{'the paper' + chr(39) + 's' if instruction == 'pacs' else 'its text'} to each problem as well: "
                f"two instructions in one prompt; set data.instruction='' to keep the template's alone"]
        assert lines == (want if told else []), (system_prompt, instruction, lines)
    # (eval's line, from its prompt checks before the model loads: test_the_context_of_4096_... below)
    from test_rollout_path_sweep import QWEN25_TEMPLATE

    qwen25 = type(tok).from_pretrained(folders["inst"][0])
    qwen25.chat_template = QWEN25_TEMPLATE  # (Qwen2.5's default system message asks for no format)
    lines = []
    encode(load_config(None, ["data.system_prompt="]), qwen25, problems, "data.dataset", lines.append)
    assert lines == []


# ------------------------------------------------------------------------------------------- runs, recorded

def _gold(tok, prompt_ids) -> int:
    a, b = re.search(r"What is (\d+) plus (\d+)\?", tok.decode(prompt_ids)).groups()
    return int(a) + int(b)


def forced_ids(tok, stop: int, text: str | None, max_new: int) -> list[int]:
    """``text`` then ``stop`` (``text`` None: an ``<|im_end|>`` then " hmm" to ``max_new``, no stop)."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    if text is not None:
        return enc(text) + [stop]
    ids = enc("So \\boxed{0}") + [IM_END]
    while len(ids) < max_new:
        ids += enc(" hmm")
    return ids[:max_new]


def forcing(answers):
    """A ``force`` for the Qwen3 sweep's ``recording``: sample k of each prompt replaced by ``answers(gold, k)``
    (a text, ended with the engine's first stop id; None: a response cut at the limit holding <|im_end|>; a
    missing k: the engine's own), cut and decoded by the engine's ``_completions``, with the policy's log-probs over
    the real ids (as the engines give them)."""
    def force(engine, prompts, comps):
        tok = engine.tokenizer
        for p, cs in zip(prompts, comps):
            gold = _gold(tok, p)
            for k, c in enumerate(cs):
                text = answers(gold, k)
                if text is False:
                    continue
                ids = forced_ids(tok, engine.eos_ids[0], text, MAX_NEW)
                with torch.no_grad():
                    logits = engine.model(input_ids=torch.tensor([list(p) + ids])).logits[0, len(p) - 1:-1, :TOKENS]
                lps = logits.float().log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
                asked = c.logprobs is not None
                row = ids + [engine.pad_id] * (len(ids) < MAX_NEW)
                cs[k] = engine._completions(torch.tensor([row]), torch.cat([lps, torch.zeros(len(row) - len(ids))])
                                            [None])[0]
                if not asked:
                    cs[k].logprobs = None
        return comps
    return force


def right_or_cut(gold, k):
    return f"So \\boxed{{{gold}}}" if k == 0 else None if k == 1 else False


TRAIN = [f"rollout.n={G}", "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}",
         "train.steps=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.progress=false",
         "train.plots=false", "train.tensorboard=false", f"train.log_samples={P * G}", "train.save_every=1",
         "train.eval_every=0", "data.eval_size=2", "learner.lr=0.01"]
# name -> (folder, settings, the prompts' system message (None: the template's own), their instruction)
RUNS = {"base": ("base", ["data.system_prompt=", "data.instruction=", "learner.packing=on"], None, None),
        "inst": ("inst", ["learner.packing=off"], SYSTEM_PROMPT, INSTRUCTION)}
BASE_WARNING = (f"warning: the chat template ends an assistant turn with '<|im_end|>' (id {IM_END}), which is not a "
                f"stop token (EOS of the tokenizer and generation_config.json: [{EOT}])")


def train(folder, args, out_dir=None, name=None, resume=None):
    """``python -m pacs_fast.train`` in this process, recorded (the Qwen3 sweep's ``recording``), samples 0 / 1 of
    each training prompt forced (:func:`right_or_cut`)."""
    from pacs_fast.train import main
    from test_qwen3_path_sweep import Run, recording

    text = io.StringIO()
    with recording(forcing(right_or_cut)) as (calls, batches, learners), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        main(["--resume", str(resume)] if resume else
             [f"model.path={folder}", *TRAIN, *args, f"train.out_dir={out_dir}", f"train.run_name={name}"])
    run = Run()
    run.run, run.calls, run.batches, run.learner, run.output = resume or out_dir / name, calls, batches, \
        learners[0], text.getvalue()
    return run


@pytest.fixture(scope="module")
def runs(folders, tmp_path_factory):
    """:data:`RUNS`, 2 steps each (checkpoints of step 1 and 2), HF engine, torch learner: ``base`` is
    Qwen2.5-Math-1.5B base in its own prompt format (the template's boxed system message, the bare problem) with
    packed rows; ``inst`` the Instruct folder in the paper's format, padded rows."""
    tmp = tmp_path_factory.mktemp("runs")
    data = _data(tmp / "train.jsonl", n=20)
    out = {}
    for name, (which, extra, system, instruction) in RUNS.items():
        folder, tok = folders[which]
        run = out[name] = train(folder, [f"data.dataset={data}", *extra], tmp, name)
        run.folder, run.tok, run.system, run.instruction = folder, tok, system, instruction
        run.stops = {EOT} if which == "base" else {IM_END, EOT}
    return out


def ckpt(run, step: int) -> Path:
    return run.run / "checkpoints" / f"step_{step:06d}"


@pytest.mark.parametrize("name", list(RUNS))
def test_a_training_run_prompts_stops_masks_samples_and_rewards(runs, name):
    """Every engine call: prompt ids the template once (base: its boxed system message and the bare problem, no
    two-instruction line; inst: the paper's system text replacing it, the instruction once); responses end at a
    stop id kept once or run to the limit, never a padded-row id, texts tokenizer.json's decode without special
    tokens. The base model (EOS <|endoftext|> alone, the generation config's one id) is warned of once: under its
    template <|im_end|> stops nothing (the cut sample holds one, inside its response, dropped from the text: seen);
    the Instruct run has no warning. The learner's rows mask exactly each response with its stop token;
    samples.jsonl and rewards (the right box 1, the cut one 0); the engine's and learner's log-probs agree in both
    steps, packed and padded (the run's max over every token under 1e-4; per token to 1e-5: the learner test)."""
    run = runs[name]
    tok = run.tok
    assert "Traceback" not in run.output
    warnings = [line for line in run.output.splitlines() if "warning:" in line]
    assert len(warnings) == (name == "base") and all(w.startswith(BASE_WARNING) for w in warnings), warnings
    train_calls = run.train_calls()
    assert len(train_calls) == len(run.batches) == 2 and len(run.calls) > 2
    ends, inner = set(), set()
    for prompts, params, comps in run.calls:
        for p, cs in zip(prompts, comps):
            problem = re.search(r"What is \d+ plus \d+\?", tok.decode(p)).group(0)
            check_prompt(p, math_prompt(f"{problem} {run.instruction}" if run.instruction else problem, run.system))
            for c in cs:
                ends.add(check_completion(c, run.stops, params.max_new_tokens))
                inner |= set(c.token_ids[:-1])
                assert max(c.token_ids) < TOKENS and c.text == decoded(c.token_ids) and "<|im_end|>" not in c.text
    assert run.stops | {None} <= ends and (IM_END in inner) == (name == "base"), ends
    samples = [s for s in read_jsonl(run.run / "samples.jsonl") if "row" in s]
    records = [r for r in read_jsonl(run.run / "metrics.jsonl") if r["kind"] == "train"]
    for step, ((prompts, _, comps), batch, record) in enumerate(zip(train_calls, run.batches, records), 1):
        check_batch(batch, prompts, comps)
        rows = [s for s in samples if s["step"] == step]
        flat = [c for cs in comps for c in cs]
        assert [(s["response"], s["response_tokens"], s["finish_reason"]) for s in rows] == \
            [(c.text, len(c.token_ids), c.finish_reason) for c in flat]
        for s0, s1 in zip(rows[::G], rows[1::G]):
            assert (s0["reward"], s1["reward"], s0["response"]) == (1.0, 0.0, f"So \\boxed{{{s0['answer']}}}")
        assert record["response/tokens"] == sum(len(c.token_ids) for c in flat)
        assert 0 <= record["rollout/logprob_diff_max"] < 1e-4, record["rollout/logprob_diff_max"]  # (fp32, max)


# ------------------------------------------------------------------------------------------- the learner

def test_the_learner_scores_packed_and_padded_rows_as_the_engine_and_an_eager_forward(runs):
    """Step 2's batch of the base run (the rollouts of checkpoint 1's policy) through the torch learner as the
    trainer builds it, packed (varlen attention) and padded, with and without the shared-prefix forward: each
    response token's log-prob (fp32) is the HF engine's for it (recorded in the run, 1e-5) and an unpadded eager
    forward's of its row alone over the tokenizer's ids (1e-5). A learner over all 151,936 rows misses both (the
    hot padded row)."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.trainer.build import set_attention

    run = runs["base"]
    b = run.batches[1]
    _, _, comps = run.train_calls()[1]
    engine = [torch.tensor(c.logprobs, dtype=torch.float64) for cs in comps for c in cs]
    batch = RolloutBatch(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                         response_mask=b["response_mask"], rewards=torch.zeros(len(b["input_ids"])), group_size=G)
    eager = AutoModelForCausalLM.from_pretrained(ckpt(run, 1), attn_implementation="eager").eval()
    refs = []
    for r in range(len(b["input_ids"])):
        ids = b["input_ids"][r, :int(b["attention_mask"][r].sum())]
        with torch.no_grad():
            logp = eager(input_ids=ids[None]).logits[0, :-1, :TOKENS].double().log_softmax(-1)
        refs.append(logp.gather(1, ids[1:, None])[:, 0])

    def close(got, want_of_row):
        for r, ref in enumerate(refs):
            mask = b["response_mask"][r, 1:len(ref) + 1] > 0
            if not torch.allclose(got[r, 1:len(ref) + 1][mask].double(), want_of_row(r, ref, mask), atol=1e-5, rtol=0):
                return False
        return True

    for packing, shared in (("off", False), ("on", False), ("on", True)):
        cfg = load_config(None, [f"learner.packing={packing}", f"learner.shared_prefix={str(shared).lower()}"])
        model = AutoModelForCausalLM.from_pretrained(ckpt(run, 1))
        set_attention(model, cfg.model.attention)
        learner = TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=1.0, vocab_size=TOKENS)
        got = learner.compute_logprobs(batch)
        assert close(got, lambda r, ref, mask: ref[mask]), (packing, shared)
        assert close(got, lambda r, ref, mask: engine[r]), (packing, shared)
    wide = TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=1.0, vocab_size=None)
    assert not close(wide.compute_logprobs(batch), lambda r, ref, mask: ref[mask])


# ------------------------------------------------------------------------------------------- checkpoints, resume

def test_the_checkpoint_is_what_save_pretrained_writes_and_loads_back_exactly(runs, tmp_path):
    """Both runs' last checkpoints: the tensors transformers' ``save_pretrained`` writes for the learner's live
    model (tied: no ``lm_head.weight``, as the hub's 1.5B), value for value, moved from the start; the config keeps
    the context (4,096), rope_theta, ``use_sliding_window`` false, the tied head and the folder's stop id; the
    tokenizer and generation files are the input's byte for byte; it loads back as the same model (the head still
    the embedding) and an HF engine on it has the folder's stop ids and cut."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from pacs_fast.rollout.hf import HFEngine

    for name, run in runs.items():
        last = ckpt(run, 2)
        run.learner.model.save_pretrained(tmp_path / name)
        mine, theirs = load_file(str(last / "model.safetensors")), load_file(str(tmp_path / name / "model.safetensors"))
        assert mine.keys() == theirs.keys() and "lm_head.weight" not in mine, name
        assert all(torch.equal(mine[k], theirs[k]) for k in mine), name
        start = load_file(str(run.folder / "model.safetensors"))
        assert (mine["model.embed_tokens.weight"] - start["model.embed_tokens.weight"]).abs().max() > 0
        for file in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "generation_config.json"):
            assert (last / file).read_bytes() == (run.folder / file).read_bytes(), file
        config = json.loads((last / "config.json").read_text())
        assert (config["max_position_embeddings"], config["rope_theta"], config["use_sliding_window"],
                config["tie_word_embeddings"], config["eos_token_id"]) == \
            (CONTEXT, 10000.0, False, True, EOT if name == "base" else IM_END)
        model = AutoModelForCausalLM.from_pretrained(last)
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        assert all(torch.equal(t, mine[k]) for k, t in model.state_dict().items() if k != "lm_head.weight")
        engine = HFEngine(model, run.tok)
        assert (engine.eos_ids, engine.pad_id, engine.vocab_cut, engine.max_model_len) == \
            (sorted(run.stops, reverse=True), EOT, TOKENS, CONTEXT)


def test_resume_after_step_1_is_bit_exact(runs, tmp_path):
    """The base run killed while writing checkpoint 2, then ``--resume``: step 2 redone from checkpoint 1 gives the
    uninterrupted run's samples, records (timings aside) and checkpoint 2, tensor for tensor (the tied embedding
    included)."""
    from safetensors.torch import load_file

    from conftest import copy_as_killed_in_checkpoint
    from pacs_fast.trainer.metrics import deterministic_view

    full = runs["base"]
    dest = copy_as_killed_in_checkpoint(full.run, tmp_path / "base", step=2)
    resumed = train(None, [], resume=dest)
    assert "Traceback" not in resumed.output and len(resumed.batches) == 1
    assert read_jsonl(full.run / "samples.jsonl") == read_jsonl(dest / "samples.jsonl")
    assert deterministic_view(read_jsonl(full.run / "metrics.jsonl")) == \
        deterministic_view(read_jsonl(dest / "metrics.jsonl"))
    a, b = (load_file(str(ckpt(r, 2) / "model.safetensors")) for r in (full, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------------- the 4,096-token context

def _long_problem(tok, tokens: int) -> str:
    """A problem whose prompt (Qwen2.5-Math's own format) has exactly ``tokens`` tokens."""
    def length(t):
        return len(encode_prompts(tok, [t], system=None, instruction=None)[0])

    text = "What is 1 plus 2?"
    step = length(text + " hmm" * 100) - length(text)
    text += " hmm" * ((tokens - length(text)) * 100 // step)
    while length(text) < tokens:
        text += " hmm"
    assert len(encode_prompts(tok, [text], system=None, instruction=None)[0]) == tokens
    return text


@contextlib.contextmanager
def no_model_load():
    """Fails any model load (the context checks come before it)."""
    from transformers import AutoModelForCausalLM

    load = AutoModelForCausalLM.__dict__["from_pretrained"]

    def refused(cls, *a, **k):
        raise AssertionError("a model was loaded")

    AutoModelForCausalLM.from_pretrained = classmethod(refused)
    try:
        yield
    finally:
        AutoModelForCausalLM.from_pretrained = load


def test_the_context_of_4096_is_an_error_or_a_documented_cut_before_the_model_loads(folders, tmp_path):
    """The hub's 4,096-token context (max_position_embeddings). The trainer: a prompt of 4,096 tokens or more
    (``data.max_prompt_tokens=8192`` keeps it) is one line, exit 2, before any model loads, naming the problem and
    the setting that drops it; with ``rollout.max_new_tokens=5000`` past the context the check warns that the
    engine ends responses there (``check_context``, what the session runs). Eval: ``--max-tokens 5000`` is the
    same warning line, a prompt that fills the context one line, exit 2, before the model loads (both with the
    two-instruction line of ``--system-prompt ''``). The HF engine (the trainer's, from the folder or the live
    model) has the 4,096-token context: no response goes past it, and those cut there end ``length`` exactly at
    it (seen); a prompt that fills it is refused."""
    from pacs_fast import eval as ev
    from pacs_fast.config import load_config
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine
    from pacs_fast.train import main
    from pacs_fast.trainer.problems import check_context

    folder, tok = folders["base"]
    long_text = _long_problem(tok, CONTEXT)
    data, held = _data(tmp_path / "d.jsonl", n=19), _data(tmp_path / "held.jsonl", n=2, offset=50)
    (tmp_path / "d.jsonl").write_text(data.read_text() + json.dumps({"id": "long", "problem": long_text,
                                                                       "answer": "3"}) + "\n")
    text = io.StringIO()
    with no_model_load(), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text), \
            pytest.raises(SystemExit) as exited:
        main([f"model.path={folder}", f"data.dataset={data}", f"data.eval_dataset={held}", "data.eval_size=2",
              "data.max_prompt_tokens=8192",
                     "rollout.max_new_tokens=5000", "data.system_prompt=", "data.instruction=",
                     f"train.out_dir={tmp_path}", "train.run_name=long"])
    assert exited.value.code == 2, text.getvalue()
    assert (f"error: data.dataset: 1 of 20 prompts do not fit the model's context of {CONTEXT} tokens "
            f"(max_position_embeddings): the longest (problem 'long') has {CONTEXT} tokens, its template included; "
            f"data.max_prompt_tokens={CONTEXT - 1} drops them") in text.getvalue(), text.getvalue()
    cfg = load_config(None, ["rollout.max_new_tokens=5000"])
    lines = []
    check_context(cfg, CONTEXT, [("data.dataset", [{"id": "q", "prompt_ids": [0] * 40}])], lines.append)
    assert lines == [f"warning: data.dataset: 1 of 1 prompts leave fewer than rollout.max_new_tokens=5000 tokens of "
                     f"the model's context of {CONTEXT} (max_position_embeddings): the hf engine ends their responses "
                     f"at the context; the longest (problem 'q') has 40 tokens, its template included; "
                     f"rollout.max_new_tokens={CONTEXT - 40} or lower leaves room for every response"]
    inst, inst_tok = folders["inst"]
    (tmp_path / "short.jsonl").write_text(json.dumps({"id": "s", "problem": "What is 1 plus 2?", "answer": "3"}) + "\n")
    (tmp_path / "long.jsonl").write_text(json.dumps({"id": "l", "problem": long_text, "answer": "3"}) + "\n")
    text = io.StringIO()
    with no_model_load(), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(inst), "--benchmarks", f"{tmp_path / 'short.jsonl'},{tmp_path / 'long.jsonl'}",
                        "--n", "1", "--max-tokens", "5000", "--engine", "hf", "--out", str(tmp_path / "ev"),
                        "--no-progress", "--scorer-workers", "0", "--system-prompt", ""])
    out = text.getvalue().splitlines()
    assert code == 2 and "Traceback" not in text.getvalue(), out
    short = len(encode_prompts(inst_tok, ["What is 1 plus 2?"], system=None)[0])
    assert [line for line in out if "warning:" in line or "error:" in line] == [
        f"warning: --system-prompt '' leaves the system message to the chat template, whose own already asks for an "
        f"answer format ({MATH_DEFAULT_SYSTEM!r}), and --instruction appends one to each problem as well: two "
        f"instructions in one prompt; give --instruction '' to keep the template's alone",
        f"warning: short: 1 of 1 prompts leave fewer than --max-tokens 5000 tokens of the model's context of "
        f"{CONTEXT} tokens: the hf engine ends their responses at the context; the longest, problem 0 (id s), has "
        f"{short} prompt tokens; --max-tokens {CONTEXT - short} or lower leaves room for every response",
        "error: long: 1 of 1 prompts do not fit the hf engine's context of 4096 tokens (prompt and response), the "
        f"longest problem 0 (id l) with {len(encode_prompts(inst_tok, [long_text], system=None)[0])} prompt tokens; "
        "give a model with a longer context (max_position_embeddings), or leave the benchmark out"], out
    # the engine's cut, from the folder and on a live model
    from transformers import AutoModelForCausalLM

    near = encode_prompts(tok, [_long_problem(tok, CONTEXT - 6)], system=None, instruction=None)
    for engine in (HFEngine(str(folder)), HFEngine(AutoModelForCausalLM.from_pretrained(folder), tok)):
        assert engine.max_model_len == CONTEXT
        out = engine.generate(near, SamplingParams(n=8, temperature=1.0, max_new_tokens=16, seed=1))
        cut = 0
        for c in out[0]:
            assert len(near[0]) + len(c.token_ids) <= CONTEXT
            if c.finish_reason == "length":
                cut += 1
                assert len(near[0]) + len(c.token_ids) == CONTEXT
            else:
                assert c.token_ids[-1] == EOT
        assert cut, [c.token_ids for c in out[0]]
        with pytest.raises(ValueError, match="max_model_len is 4096"):
            engine.generate(encode_prompts(tok, [long_text], system=None, instruction=None),
                            SamplingParams(n=1, max_new_tokens=4))


# ------------------------------------------------------------------------------------------- eval

def voted(gold, k):
    """Problem A (gold % 4 == 3): gold, gold+1, gold, gold+2; problem B: gold+1, gold+1, gold, a cut response
    (its box "0", then <|im_end|> and filler: base EOS is <|endoftext|>)."""
    a = [gold, gold + 1, gold, gold + 2] if gold % 4 == 3 else [gold + 1, gold + 1, gold, None]
    return None if a[k] is None else f"So \\boxed{{{a[k]}}}"


def test_eval_of_the_trained_checkpoint_reads_pass_at_k_and_maj_at_k_right(runs, tmp_path):
    """``python -m pacs_fast.eval --engine hf --n 4`` on the base run's last checkpoint in Qwen2.5-Math's own
    format (``--system-prompt '' --instruction ''``: the template's boxed system message, the bare problem; only
    the base-model line, no two-instruction one), the 4 samples of each of 2 problems forced (:func:`voted`):
    pass@k is the unbiased estimator of the counts (2 and 1 of 4 right), maj@k the mean of the disjoint blocks'
    votes (ties the share right): maj@1 0.375, maj@2 (0.5 + 0.25) / 2, maj@4 (1 + 0) / 2; the samples file keeps
    the prompt, texts without <|im_end|>, the stop token counted, the cut response ``length``."""
    from math import comb

    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples
    from test_qwen3_path_sweep import recording

    run = runs["base"]
    data = _data(tmp_path / "toy.jsonl", n=2, offset=50)  # (golds 51 and 53)
    text = io.StringIO()
    with recording(forcing(voted), every_call=True), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(ckpt(run, 2)), "--benchmarks", str(data), "--n", "4", "--max-tokens",
                        str(MAX_NEW), "--engine", "hf", "--out", str(tmp_path / "ev"), "--no-progress",
                        "--scorer-workers", "0", "--system-prompt", "", "--instruction", ""])
    assert code == 0, text.getvalue()
    warnings = [line for line in text.getvalue().splitlines() if "warning:" in line]
    assert len(warnings) == 1 and warnings[0].startswith(BASE_WARNING), warnings
    bench = json.loads((tmp_path / "ev" / "results.json").read_text())["benchmarks"]["toy"]
    assert bench["correct_counts"] == [2, 1] and bench["ks"] == [1, 2, 4]
    for k in (1, 2, 4):
        want = sum(1 - comb(4 - c, k) / comb(4, k) for c in (2, 1)) / 2
        assert bench["pass_at_k"][str(k)] == pytest.approx(want), k
    assert bench["maj_at_k"] == pytest.approx({"1": 0.375, "2": 0.375, "4": 0.5}), bench["maj_at_k"]
    records = read_samples(tmp_path / "ev" / "samples_toy.jsonl")
    for r in records.values():
        i = 50 + r["index"]
        assert r["prompt"] == math_prompt(f"What is {i} plus {i % 7}?", None)
        assert all("<|im_end|>" not in t for t in r["responses"])
        gold = int(r["answer"])
        if gold % 4 == 1:
            assert r["finish_reasons"] == ["stop"] * 3 + ["length"] and r["num_tokens"][3] == MAX_NEW
        assert r["num_tokens"][0] == len(forced_ids(run.tok, EOT, voted(gold, 0), MAX_NEW))


# ------------------------------------------------------------------------------------------- vLLM

@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_vllm_takes_the_4096_context_and_a_run_on_the_base_folder_agrees_with_the_learner(folders, tmp_path):
    """vLLM derives the folder's context as the HF engine's (4,096: max_position_embeddings, the tokenizer's
    model_max_length of 131,072 notwithstanding) and runs the model (``use_sliding_window`` false with
    max_window_layers below the layer count is not the mixed-window config it refuses); the trainer's CPU engine
    and eval's are sized within it whatever ``rollout.max_new_tokens`` / ``--max-tokens`` ask. A 2-step
    ``rollout.engine=vllm`` run on the base folder (tied head, EOS <|endoftext|>): prompts the template once,
    responses stop at <|endoftext|> alone (<|im_end|> ends none), no padded-row id, masks exact, vLLM's
    log-probs the learner's in both steps (its tied head re-synced after the update)."""
    from pacs_fast.config import load_config
    from pacs_fast.rollout.vllm_engine import VLLMEngine
    from pacs_fast.rollout.vllm_setup import derived_max_model_len, unsupported_architecture
    from pacs_fast.train import main
    from pacs_fast.trainer.build import vllm_cpu_sizes
    from test_qwen3_path_sweep import recording

    folder, tok = folders["base"]
    assert derived_max_model_len(folder) == CONTEXT and unsupported_architecture(folder) is None
    cfg = load_config(None, [f"model.path={folder}", "rollout.engine=vllm", "rollout.max_new_tokens=5000"])
    assert vllm_cpu_sizes(cfg, folder)["max_model_len"] == CONTEXT
    data = _data(tmp_path / "train.jsonl", n=20)
    text = io.StringIO()
    with recording(engine_class=VLLMEngine) as (calls, batches, learners), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        main([f"model.path={folder}", f"data.dataset={data}", *TRAIN, "train.save_every=2", "rollout.engine=vllm",
              "data.system_prompt=", "data.instruction=", "algo.entropy_coef=0.1", f"train.out_dir={tmp_path}",
              "train.run_name=vllm"])
    warnings = [line for line in text.getvalue().splitlines() if "warning:" in line]
    assert len(warnings) == 1 and warnings[0].startswith(BASE_WARNING), warnings
    ends = set()
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            problem = re.search(r"What is \d+ plus \d+\?", tok.decode(p)).group(0)
            check_prompt(p, math_prompt(problem, None))
            for c in cs:
                ends.add(check_completion(c, {EOT}, params.max_new_tokens))
                assert max(c.token_ids) < TOKENS and c.text == decoded(c.token_ids)
    assert {EOT, None} <= ends, ends
    train_calls = [c for c in calls if c[1].return_logprobs]
    assert len(train_calls) == len(batches) == 2
    for (prompts, _, comps), batch in zip(train_calls, batches):
        check_batch(batch, prompts, comps)
    records = [r for r in read_jsonl(tmp_path / "vllm" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records] == [1, 2]
    assert all(0 <= r["rollout/logprob_diff_max"] < 1e-3 for r in records), records
