"""The product on a Magistral-Small (mistralai/Magistral-Small-2507 / 2509)-shaped folder (hostile sweep).

Magistral is Mistral's reasoning model on the tekken tokenizer: its responses think inside ``[THINK] ... [/THINK]``,
which in 2507 / 2509 are tekken control tokens (special: a decode that skips special tokens drops them), then
answer. Tekken's 1,000 control tokens hold ids 0..999 (<unk> 0, <s> 1, </s> 2, [INST] 3, [/INST] 4, <pad> 11,
[SYSTEM_PROMPT] 17, [/SYSTEM_PROMPT] 18, [THINK] 34, [/THINK] 35, the rest ``<SPECIAL_i>``), the ordinary tokens
follow. The hub's chat template (2507 / 2509, without its tool and image branches) writes ``<s>``, then
``[SYSTEM_PROMPT]`` + the system message + ``[/SYSTEM_PROMPT]`` (with none given, its default: "First draft your
thinking process (inner monologue) ... [THINK]Your thoughts or/and draft ...[/THINK]Here, provide a self-contained
response." -- no answer format: it asks for no ``\\boxed{}``), then ``[INST]user[/INST]``; the model writes the
rest, ending with ``</s>``. tokenizer_config: ``LlamaTokenizerFast``, add_bos_token (a TemplateProcessing
post-processor adds ``<s>``), pad ``<pad>``.

The folder: a byte-level BPE on tekken's split regex, the 1,000 control tokens at ids 0..999 in its vocabulary
(special added tokens), the ordinary ids after; tokenizer_config / special_tokens_map / generation_config as the
hub's; Magistral-Small-2507's text config.json (``MistralForCausalLM``, 128k positions, rope_theta 1e9, head_dim
128, no sliding window) at tiny widths, a random model whose ``</s>`` head row reads one hidden unit.

Checked (short real runs in this process, engine calls / learner batches / old log-probs / samples recorded):
prompts are the template rendered once (one ``<s>``, first; the paper's system prompt in ``[SYSTEM_PROMPT]`` or,
under ``data.system_prompt=''``, the template's default, which asks no format: the instruction once and no
warning); responses stop at ``</s>`` kept once or run to the limit; the learner's masks are each response with its
stop; its log-probs equal an eager forward of the step's policy row by row (1e-5, fp32); ``--resume`` after step 1
gives the uninterrupted run's records, samples and weights bit for bit; eval under both extractions.

Found and fixed (/work/notes/magistral_fix_1.diff): the engines' texts (HF engine ``_completions``, vLLM's
re-decode, stop strings' window) were decoded with ``skip_special_tokens=True``, which drops Magistral's
``[THINK]`` / ``[/THINK]``: ``[THINK]maybe \\boxed{6}.[/THINK]So \\boxed{5}`` read ``maybe \\boxed{6}.So
\\boxed{5}``, and ``extraction=boxed`` read both boxes (a hedge: the right final answer paid 0) and a response cut
inside its thinking with the right draft box paid 1. The texts now keep those two tokens (as vLLM's own Mistral
tokenizer decodes them: pacs_fast/rollout/base.py ``decode_texts``), and ``boxed`` reads them as ``<think>`` /
``</think>`` (pacs_fast/reward/boxes.py ``answer_part``): 1 and 0, trainer and eval. vLLM's own text of a response it
cut at a stop string (kept as it was) still lacked them: now the ids' decode up to the string's end.

Seen, not changed: under the default ``reference`` extraction the cut response's draft box pays 1 (README "Unstated
answers pay under the reference"), as R1's and gpt-oss's do. The paper's system prompt (``data.system_prompt``'s
default) replaces the template's default system message, so a Magistral run under it is never told the
``[THINK]`` format its RL used (a response without thinking is then read whole). Magistral-Small-2509 ships as
``Mistral3ForConditionalGeneration`` (a vision encoder beside this text model): only the text model is covered.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest
import torch

from pacs_fast.data.prompts import INSTRUCTION, SYSTEM_PROMPT, encode_prompts, prompt_parts
from pacs_fast.trainer.metrics import read_jsonl
from test_llama3_path_sweep import _data, check_batch, check_completion
from test_qwen3_moe_path_sweep import old_logprobs, response_gap
from test_qwen3_path_sweep import forced_completion, recording

BOS, EOS, PAD, INST, INST_END, SYS, SYS_END, THINK, THINK_END = 1, 2, 11, 3, 4, 17, 18, 34, 35
CONTROL = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]", 5: "[AVAILABLE_TOOLS]", 6: "[/AVAILABLE_TOOLS]",
           7: "[TOOL_RESULTS]", 8: "[/TOOL_RESULTS]", 9: "[TOOL_CALLS]", 10: "[IMG]", 11: "<pad>", 12: "[IMG_BREAK]",
           13: "[IMG_END]", 14: "[PREFIX]", 15: "[MIDDLE]", 16: "[SUFFIX]", 17: "[SYSTEM_PROMPT]",
           18: "[/SYSTEM_PROMPT]", 19: "[TOOL_CONTENT]", 32: "[ARGS]", 33: "[CALL_ID]", 34: "[THINK]", 35: "[/THINK]"}
NUM_CONTROL = 1000
DEFAULT_SYSTEM = (  # Magistral-Small-2507 / 2509's default system message (its chat template's)
    "First draft your thinking process (inner monologue) until you arrive at a response. Format your response using "
    "Markdown, and use LaTeX for any mathematical equations. Write both your thoughts and the response in the same "
    "language as the input.\n\nYour thinking process must follow the template below:[THINK]Your thoughts or/and "
    "draft, like working through an exercise on scratch paper. Be as casual and as long as you want until you are "
    "confident to generate the response. Use the same language as the input.[/THINK]Here, provide a self-contained "
    "response.")
MAGISTRAL_TEMPLATE = (  # the hub's (2507 / 2509) without its tool-calling and image branches
    "{%- set default_system_message = " + json.dumps(DEFAULT_SYSTEM) + " %}\n"
    "{{- bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '[SYSTEM_PROMPT]' + messages[0]['content'] + '[/SYSTEM_PROMPT]' }}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "    {%- if default_system_message != '' %}\n"
    "        {{- '[SYSTEM_PROMPT]' + default_system_message + '[/SYSTEM_PROMPT]' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {{- '[INST]' + message['content'] + '[/INST]' }}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- message['content'] + eos_token }}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('Only user, system and assistant roles are supported!') }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n")
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
                r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["Okay, maybe \\boxed{5}.\n\nSo the sum is \\boxed{5}", "What is 12 plus 7? hmm café 日本",
          "Please reason step by step, and put your final answer within \\boxed{}.", DEFAULT_SYSTEM,
          "You are a helpful assistant. So \\boxed{19}!"] * 10
G, P, MAX_NEW = 4, 2, 24
HUB_CONFIG = {  # Magistral-Small-2507's config.json, widths cut down below
    "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": BOS, "eos_token_id": EOS,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120, "initializer_range": 0.02,
    "intermediate_size": 32768, "max_position_embeddings": 131072, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000000.0, "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.53.1", "use_cache": True, "vocab_size": 131072}

_RAW = {}


def _raw(control: dict | None = None):
    """tokenizer.json's object (built once a ``control``): the control tokens at 0..999 of the BPE's vocabulary
    (``control``'s names, default :data:`CONTROL`'s; the others ``<SPECIAL_i>``), then the BPE."""
    control = CONTROL if control is None else control
    key = tuple(sorted(control.items()))
    if key not in _RAW:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

        def pre():
            return pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(TEKKEN_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])

        small = Tokenizer(models.BPE())
        small.pre_tokenizer = pre()
        small.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=420, special_tokens=[],
                                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        model = json.loads(small.to_str())["model"]
        controls = [control.get(i, f"<SPECIAL_{i}>") for i in range(NUM_CONTROL)]
        vocab = {c: i for i, c in enumerate(controls)}
        vocab.update({t: i + NUM_CONTROL for t, i in model["vocab"].items()})
        raw = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m) for m in model["merges"]], fuse_unk=False,
                                   byte_fallback=False))
        raw.pre_tokenizer, raw.decoder = pre(), decoders.ByteLevel()
        raw.add_special_tokens([AddedToken(c, special=True, normalized=False) for c in controls])
        raw.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", BOS)])
        assert [raw.token_to_id(c) for c in controls] == list(range(NUM_CONTROL))
        _RAW[key] = raw
    return _RAW[key]


def magistral_folder(path: Path) -> Path:
    from transformers import MistralConfig, MistralForCausalLM

    raw = _raw()
    path.mkdir(parents=True, exist_ok=True)
    raw.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": True, "add_eos_token": False, "add_prefix_space": None, "bos_token": "<s>",
         "clean_up_tokenization_spaces": False, "eos_token": "</s>", "legacy": True,
         "model_max_length": 1000000000000000019884624838656, "pad_token": "<pad>", "unk_token": "<unk>",
         "tokenizer_class": "LlamaTokenizerFast", "chat_template": MAGISTRAL_TEMPLATE,
         "added_tokens_decoder": {str(i): {"content": CONTROL.get(i, f"<SPECIAL_{i}>"), "lstrip": False,
                                           "normalized": False, "rstrip": False, "single_word": False,
                                           "special": True} for i in range(NUM_CONTROL)}}, indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}))
    config = {**HUB_CONFIG, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2, "torch_dtype": "float32",
              "vocab_size": raw.get_vocab_size()}
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**config))
    with torch.no_grad():  # </s> reads one hidden unit: responses end at it, or run to the limit
        model.lm_head.weight[EOS] = 0.0
        model.lm_head.weight[EOS, 0] = 4.0
    model.save_pretrained(path)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps(
        {"_from_model_config": True, "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
         "transformers_version": "4.53.1"}, indent=2))
    return path


@pytest.fixture(scope="module")
def magistral(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = magistral_folder(tmp_path_factory.mktemp("magistral") / "Magistral-Small-2507")
    return folder, AutoTokenizer.from_pretrained(folder)


def magistral_prompt(user: str, system: str | None) -> str:
    return f"<s>[SYSTEM_PROMPT]{system or DEFAULT_SYSTEM}[/SYSTEM_PROMPT][INST]{user}[/INST]"


def check_prompt(tok, ids, text):
    """``ids`` are ``text`` encoded once: one <s>, first; ``[/INST]`` last; no </s>."""
    assert text.startswith("<s>") and text.endswith("[/INST]")
    assert list(ids) == [BOS] + _raw().encode(text[3:], add_special_tokens=False).ids
    assert list(ids).count(BOS) == 1 and EOS not in ids and ids[-1] == INST_END


# ------------------------------------------------------------------------------------------- the folder

def test_the_folder_loads_as_magistral_small_does(magistral):
    """The control tokens at their tekken ids, all special ([THINK] / [/THINK] too: a decode skipping special
    tokens drops them), <s> from the post-processor on every encode, the template writes it too (encoded with
    special tokens: <s> twice), its default system message carries the [THINK] format and asks no answer format."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.data.prompts import template_format_request

    folder, tok = magistral
    names = {"<s>": BOS, "</s>": EOS, "<pad>": PAD, "[INST]": INST, "[/INST]": INST_END, "[SYSTEM_PROMPT]": SYS,
             "[/SYSTEM_PROMPT]": SYS_END, "[THINK]": THINK, "[/THINK]": THINK_END}
    assert {n: tok.convert_tokens_to_ids(n) for n in names} == names
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS, EOS, PAD)
    assert tok("12 plus 7")["input_ids"][0] == BOS and tok.convert_ids_to_tokens(1000)[0] != "<"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == magistral_prompt("hi", None) and tok(text)["input_ids"][:2] == [BOS, BOS]
    ids = tok.encode("[THINK]a[/THINK]b", add_special_tokens=False)
    assert ids[0] == THINK and THINK_END in ids and tok.decode(ids, skip_special_tokens=True) == "ab"
    assert template_format_request(tok, None, INSTRUCTION) is None
    model = AutoModelForCausalLM.from_pretrained(folder)
    c = model.config
    assert (type(model).__name__, c.max_position_embeddings, c.rope_parameters["rope_theta"], c.head_dim,
            c.sliding_window) == ("MistralForCausalLM", 131072, 1e9, 16, None)


# ------------------------------------------------------------------------------------------- prompts

PROBLEMS = ["What is 12 plus 7?", f"Solve 2x=4. {INSTRUCTION}", "café 日本"]


@pytest.mark.parametrize("system_prompt", ["pacs", "", "Be brief."])
def test_prompts_have_one_bos_and_the_system_message_asked_for(magistral, system_prompt):
    """The paper's system prompt / ours replace the template's default; '' leaves the default (the [THINK]
    format, no answer format: the instruction is in the prompt once)."""
    _, tok = magistral
    system, instruction = prompt_parts(system_prompt, "pacs")
    for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)):
        user = problem if problem.endswith(INSTRUCTION) else f"{problem} {INSTRUCTION}"
        check_prompt(tok, ids, magistral_prompt(user, system))
        assert tok.decode(ids).count("\\boxed{}") == 1
    text = magistral_prompt(PROBLEMS[0], system)
    with pytest.raises(AssertionError):  # (the check catches a doubled <s>)
        check_prompt(tok, tok(text)["input_ids"], text)


# ------------------------------------------------------------------------------------------- the texts, rewards

def thinking(tok, gold: int, kind: int) -> list[int]:
    """Response ids: kind 0 ``[THINK]`` a wrong draft box ``[/THINK]`` the right final box, ``</s>``; kind 1
    ``[THINK]`` the right box as a draft, cut at MAX_NEW (no ``[/THINK]``, no stop)."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    if kind == 0:
        return [THINK] + enc(f"Okay, maybe \\boxed{{{gold + 1}}}.") + [THINK_END] + enc(f"So \\boxed{{{gold}}}") + [EOS]
    ids = [THINK] + enc(f"Okay, maybe \\boxed{{{gold}}}")
    while len(ids) < MAX_NEW:
        ids += enc(" hmm")
    return ids[:MAX_NEW]


def final_text(gold: int) -> str:
    return f"[THINK]Okay, maybe \\boxed{{{gold + 1}}}.[/THINK]So \\boxed{{{gold}}}"


def test_the_engine_keeps_the_think_tokens_and_boxed_reads_the_answer_after_them(magistral):
    """Found and fixed (module docstring): the HF engine's texts dropped [THINK] / [/THINK] (special tokens), so
    ``boxed`` read the draft beside the answer (0) and a draft in unfinished thinking (1). The texts keep them, drop
    </s> and the other control tokens; ``boxed`` pays 1 and 0; ``reference`` 1 and 1 (documented)."""
    from pacs_fast.reward.boxes import answer_part, opens_think
    from pacs_fast.reward.verifier import math_reward
    from pacs_fast.rollout.hf import HFEngine
    from pacs_fast.rollout.stop_strings import StopStrings

    folder, tok = magistral
    engine = HFEngine(str(folder))
    assert (engine.eos_ids, engine.pad_id) == ([EOS], PAD)
    done, cut = thinking(tok, 5, 0), thinking(tok, 5, 1)
    comps = engine._completions(torch.tensor([done + [PAD] * 3, cut[:len(done) + 3]]), None)
    assert comps[0].text == final_text(5) and comps[0].token_ids == done and comps[0].finish_reason == "stop"
    assert comps[1].text.startswith("[THINK]Okay, maybe \\boxed{5} hmm") and "[/THINK]" not in comps[1].text
    assert answer_part(comps[0].text) == "So \\boxed{5}" and answer_part(comps[1].text) == ""
    stops = StopStrings(tok, ("So",))  # (a stop string's cut keeps them too)
    cut_at = engine._completions(torch.tensor([done + [PAD]]), None, stops=stops)[0]
    assert (cut_at.text, cut_at.finish_reason) == ("[THINK]Okay, maybe \\boxed{6}.[/THINK]So", "stop")
    assert not opens_think(magistral_prompt("hi", None))  # (the default system message's [THINK] is closed)
    assert [math_reward(c.text, "5", extraction="boxed") for c in comps] == [1.0, 0.0]
    assert [math_reward(c.text, "5", extraction="reference") for c in comps] == [1.0, 1.0]


# ------------------------------------------------------------------------------------------- runs

def forcing(engine, prompts, comps):
    tok = engine.tokenizer
    for p, cs in zip(prompts, comps):
        a, b = re.search(r"What is (\d+) plus (\d+)\?", tok.decode(p)).groups()
        for k in (0, 1):
            cs[k] = forced_completion(engine, p, thinking(tok, int(a) + int(b), k), MAX_NEW, cs[k].logprobs is not None)
    return comps


TRAIN = [f"rollout.n={G}", "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}",
         "train.steps=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.progress=false",
         "train.plots=false", "train.tensorboard=false", f"train.log_samples={P * G}", "train.save_every=1",
         "train.eval_every=0", "data.eval_size=2"]


def train(folder, args, out_dir, name, resume: Path | None = None) -> dict:
    from pacs_fast.train import main

    text = io.StringIO()
    with recording(forcing) as (calls, batches, learners), old_logprobs() as olds, \
            contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main(["--resume", str(resume)] if resume else
             [f"model.path={folder}", *TRAIN, *args, f"train.out_dir={out_dir}", f"train.run_name={name}"])
    return dict(folder=folder, run=resume or out_dir / name, calls=calls, batches=batches, olds=olds,
                output=text.getvalue())


@pytest.fixture(scope="module")
def runs(magistral, tmp_path_factory):
    """2 steps each: ``paper`` (the paper's system prompt, extraction boxed), ``template`` (``data.system_prompt=``,
    the default reference extraction)."""
    folder, _ = magistral
    tmp = tmp_path_factory.mktemp("runs")
    data = _data(tmp / "train.jsonl", n=20)
    return {"paper": (train(folder, [f"data.dataset={data}", "reward.extraction=boxed"], tmp, "paper"), SYSTEM_PROMPT),
            "template": (train(folder, [f"data.dataset={data}", "data.system_prompt="], tmp, "template"), None)}


def row_refs(model, batch) -> list[torch.Tensor]:
    out = []
    for r in range(len(batch["input_ids"])):
        length = int(batch["attention_mask"][r].sum())
        ids, start = batch["input_ids"][r, :length], int(batch["response_mask"][r].nonzero()[0])
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0, :-1]
        ref = torch.full((length - 1,), float("nan"), dtype=torch.float64)
        ref[start - 1:] = logits.float().log_softmax(-1).gather(1, ids[1:, None])[start - 1:, 0].double()
        out.append(ref)
    return out


@pytest.mark.parametrize("name", ["paper", "template"])
def test_a_training_run_prompts_stops_masks_scores_and_logprobs(magistral, runs, name):
    """Every engine call: the template rendered once (one <s>; the system message asked for), responses stop at
    </s> once or run to the limit; the learner's masks are each response with its stop; samples.jsonl keeps
    [THINK] / [/THINK]; the final answer pays 1 over a wrong draft, the cut thinking 0 under boxed, 1 under
    reference; the learner's log-probs and the engine's equal an eager forward of the step's policy (1e-5)."""
    from transformers import AutoModelForCausalLM

    run, system = runs[name]
    _, tok = magistral
    assert "Traceback" not in run["output"] and "warning:" not in run["output"], run["output"]
    train_calls = [c for c in run["calls"] if c[1].return_logprobs]
    assert len(train_calls) == len(run["batches"]) == len(run["olds"]) == 2
    for prompts, params, comps in run["calls"]:
        for p, cs in zip(prompts, comps):
            user = re.search(r"What is \d+ plus \d+\?", tok.decode(p)).group(0) + f" {INSTRUCTION}"
            check_prompt(tok, p, magistral_prompt(user, system))
            for c in cs:
                check_completion(c, {EOS}, params.max_new_tokens)
                assert "</s>" not in c.text and "<pad>" not in c.text
    samples = [s for s in read_jsonl(run["run"] / "samples.jsonl") if "row" in s]
    for step, ((prompts, _, comps), batch, old) in enumerate(zip(train_calls, run["batches"], run["olds"]), 1):
        check_batch(batch, prompts, comps)
        flat = [c for cs in comps for c in cs]
        rows = [s for s in samples if s["step"] == step]
        assert [(s["response"], s["response_tokens"]) for s in rows] == [(c.text, len(c.token_ids)) for c in flat]
        for s0, s1 in zip(rows[::G], rows[1::G]):
            gold = int(s0["answer"])
            assert (s0["response"], s0["reward"], s0["finish_reason"]) == (final_text(gold), 1.0, "stop")
            assert s1["response"].startswith("[THINK]") and s1["finish_reason"] == "length"
            assert s1["reward"] == (0.0 if name == "paper" else 1.0), s1
        path = run["folder"] if step == 1 else run["run"] / "checkpoints" / f"step_{step - 1:06d}"
        refs = row_refs(AutoModelForCausalLM.from_pretrained(path).eval(), batch)
        assert response_gap(old, batch, refs) < 1e-5, step
        for r, (c, ref) in enumerate(zip(flat, refs)):
            start = int(batch["response_mask"][r].nonzero()[0]) - 1
            engine = torch.tensor(c.logprobs, dtype=torch.float64)
            assert (engine - ref[start:start + len(c.token_ids)]).abs().max() < 1e-5, (step, r)


def test_resume_after_step_1_is_bit_exact(runs, tmp_path):
    """The paper run as a SIGKILL leaves it while step 2 wrote its checkpoint, then ``--resume``: records (timings
    aside), samples and checkpoint 2's tensors equal the uninterrupted run's."""
    from safetensors.torch import load_file

    from conftest import copy_as_killed_in_checkpoint
    from pacs_fast.trainer.metrics import deterministic_view

    full, _ = runs["paper"]
    dest = copy_as_killed_in_checkpoint(full["run"], tmp_path / "paper", step=2)
    resumed = train(full["folder"], [], None, None, resume=dest)
    assert "Traceback" not in resumed["output"], resumed["output"]
    one, two = (deterministic_view(read_jsonl(r["run"] / "metrics.jsonl")) for r in (full, resumed))
    assert [r["step"] for r in two if r["kind"] == "train"] == [1, 2] and one == two
    assert read_jsonl(full["run"] / "samples.jsonl") == read_jsonl(resumed["run"] / "samples.jsonl")
    a, b = (load_file(str(r["run"] / "checkpoints" / "step_000002" / "model.safetensors")) for r in (full, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("extraction", ["boxed", "reference"])
def test_eval_keeps_the_think_tokens_and_scores_as_the_extraction_documents(magistral, tmp_path, extraction):
    """``python -m pacs_fast.eval --engine hf --system-prompt ''`` (the template's default system message), samples
    0 / 1 forced: texts keep [THINK] / [/THINK]; boxed pays 1 / 0, reference 1 / 1; no warning."""
    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples

    folder, tok = magistral
    bench = _data(tmp_path / "toy.jsonl", n=2, offset=50)
    text = io.StringIO()
    with recording(forcing, every_call=True) as (calls, _, _), contextlib.redirect_stdout(text), \
            contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(folder), "--benchmarks", str(bench), "--n", "2", "--max-tokens", str(MAX_NEW),
                        "--engine", "hf", "--out", str(tmp_path / "out"), "--no-progress", "--scorer-workers", "0",
                        "--system-prompt", "", "--extraction", extraction])
    assert code == 0 and calls and "warning:" not in text.getvalue(), text.getvalue()
    for prompts, _, _ in calls:
        for p in prompts:
            user = re.search(r"What is \d+ plus \d+\?", tok.decode(p)).group(0) + f" {INSTRUCTION}"
            check_prompt(tok, p, magistral_prompt(user, None))
    for r in read_samples(tmp_path / "out" / "samples_toy.jsonl").values():
        gold = int(r["answer"])
        assert r["responses"][0] == final_text(gold) and r["finish_reasons"] == ["stop", "length"], r
        assert r["scores"] == ([1.0, 0.0] if extraction == "boxed" else [1.0, 1.0]), r


def test_a_vllm_response_cut_at_a_stop_string_keeps_the_think_tokens(magistral, monkeypatch):
    """Found and fixed: vLLM's own text of a response it cut at a stop string is decoded without special tokens, and
    the engine kept it (only the uncut responses were decoded again): ``[THINK]`` / ``[/THINK]`` were gone from it, so
    ``boxed`` read the draft box beside the answer (0 for a right answer). The stand-in returns what vLLM returns
    (``include_stop_str_in_output``: the ids up to the token that completed the string, the text without special
    tokens up to its end); the completion's text is the HF engine's cut of the same ids."""
    from types import SimpleNamespace

    from pacs_fast.reward.verifier import math_reward
    from pacs_fast.rollout import vllm_engine
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine
    from pacs_fast.rollout.stop_strings import StopStrings
    from pacs_fast.rollout.vllm_engine import VLLMEngine

    folder, tok = magistral
    prompt = encode_prompts(tok, ["What is 2 plus 3?"])[0]
    done = thinking(tok, 5, 0)  # [THINK] ... \boxed{6}.[/THINK]So \boxed{5}</s>
    stop = "\\boxed{5}"
    k, _ = StopStrings(tok, (stop,)).cut(done)
    vllm_text = tok.decode(done[:k], skip_special_tokens=True)
    vllm_text = vllm_text[:vllm_text.find(stop) + len(stop)]
    assert "[THINK]" not in vllm_text and math_reward(vllm_text, "5", extraction="boxed") == 0.0  # (the bug's reward)
    outputs = [SimpleNamespace(prompt_token_ids=prompt, outputs=[
        SimpleNamespace(index=0, token_ids=done[:k], text=vllm_text, finish_reason="stop", stop_reason=stop,
                        logprobs=None),
        SimpleNamespace(index=1, token_ids=done, text="(vLLM's)", finish_reason="stop", stop_reason=EOS,
                        logprobs=None)])]
    monkeypatch.setattr(vllm_engine, "generate_all", lambda llm, prompts, sampling, token_ids: outputs)
    engine = object.__new__(VLLMEngine)
    engine._llm = SimpleNamespace(get_tokenizer=lambda: tok)
    engine._vllm = SimpleNamespace(SamplingParams=lambda **kw: kw, TokensPrompt=lambda **kw: kw)
    engine._asleep, engine._dead, engine.on_cpu, engine._allowed_ids, engine.max_model_len = set(), None, True, None, 256
    cut, whole = engine.generate([prompt], SamplingParams(n=2, max_new_tokens=MAX_NEW, stop=(stop,)))[0]
    hf = HFEngine(str(folder))._completions(torch.tensor([done]), None, stops=StopStrings(tok, (stop,)))[0]
    assert (cut.text, cut.token_ids) == (hf.text, hf.token_ids) == (final_text(5), done[:k])
    assert whole.text == final_text(5)  # (the uncut response: decoded again, as before)
    assert math_reward(cut.text, "5", extraction="boxed") == 1.0
