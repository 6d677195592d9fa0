"""The product on SentencePiece-shaped model folders: Mistral-7B-Instruct-v0.3 and Gemma-2-it (hostile sweep).

Earlier sweeps used byte-level BPE (Qwen2.5, Llama 3: tests/test_llama3_path_sweep.py). These tokenizers differ where
RL stacks break: ``▁`` (U+2581) for spaces with byte fallback (``<0x0A>`` for ``\\n`` in Mistral's, ``<0xE6>``...
for any character outside the vocabulary: CJK, emoji), a BOS the tokenizer adds (``add_bos_token``) AND the chat
template writes, a decoder that strips the first piece's leading space (Mistral's ``Metaspace`` prepend_scheme
"first" + ``Strip``: ``▁The`` alone decodes to "The") or keeps it (Gemma's: no prefix space), Mistral's control
tokens ``[INST]`` / ``[/INST]`` and a template that puts the system text in the last user message, Gemma's
``<end_of_turn>`` that only generation_config.json lists as a stop id and a template that raises "System role not
supported".

The folders are written as the hub's: tokenizer.json (a BPE with byte_fallback, fuse_unk, the hub's normalizer /
pre-tokenizer / decoder, the BOS post-processor), tokenizer_config.json (tokenizer_class LlamaTokenizer /
GemmaTokenizer, add_bos_token, legacy false, the chat template), special_tokens_map.json, config.json,
generation_config.json, a tiny random MistralForCausalLM / Gemma2ForCausalLM whose head rows of the stop tokens read
one hidden unit each (responses end at them, or run to the limit).
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
from test_llama3_path_sweep import _data, check_batch, check_completion, plain_prompt_cases, recording

MISTRAL_TEMPLATE = (  # Mistral-7B-Instruct-v0.3's, without the tool branches
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/"
    "assistant/...') }}{%- endif %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content']|trim + eos_token }}"
    "{%- else %}{{- raise_exception('Only user and assistant roles are supported, with the exception of an initial "
    "optional system message!') }}{%- endif %}"
    "{%- endfor %}")
GEMMA_TEMPLATE = (  # Gemma-2-it's
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")
SPECIAL = {"mistral": ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"],
           "gemma": ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]}
BOS = {"mistral": "<s>", "gemma": "<bos>"}
EOS = {"mistral": "</s>", "gemma": "<eos>"}
CORPUS = ["Step 1: add 2 and 3.\n\nStep 2: the sum is 5.\n\nThe answer is \\boxed{5} </answer>",
          "You are a helpful assistant. Please reason step by step, and put your final answer within \\boxed{}.",
          "What is 12 plus 7? <answer> The answer </answer> So user model"] * 10
G, P, MAX_NEW = 4, 2, 8
_RAW = {}


def sp_raw(kind: str):
    """The ``tokenizers`` object of a ``kind`` folder (built once): the specials first (their hub ids), the 256
    byte-fallback pieces, then BPE pieces trained here (whitespace-split, ``▁``-prefixed; Mistral's without ``\\n``:
    its newline is ``<0x0A>``); Mistral's pipeline: no normalizer, Metaspace(prepend_scheme first, split False),
    decoder Replace/ByteFallback/Fuse/Strip(left 1); Gemma's: Replace(" ", "▁") normalizer, no prefix space,
    decoder Replace/ByteFallback/Fuse; ``BOS $A`` as post-processor."""
    if kind in _RAW:
        return _RAW[kind]
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if kind == "mistral":
        norm, pre = None, pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        dec = decoders.Sequence(steps + [decoders.Strip(" ", 1, 0)])
    else:
        norm = normalizers.Replace(" ", "\u2581")
        pre = pre_tokenizers.Split(" ", behavior="merged_with_previous", invert=False)
        dec = decoders.Sequence(steps)
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    t.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=[]))
    learned = json.loads(t.to_str())["model"]
    vocab = {s: i for i, s in enumerate(SPECIAL[kind])}
    vocab.update({f"<0x{b:02X}>": len(SPECIAL[kind]) + b for b in range(256)})
    for piece in sorted(learned["vocab"], key=learned["vocab"].get):
        if not (kind == "mistral" and "\n" in piece):
            vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    merges = [m for m in merges if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]
    raw = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    raw.normalizer, raw.pre_tokenizer, raw.decoder = norm, pre, dec
    raw.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL[kind]])
    bos = BOS[kind]
    raw.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1",
                                                       special_tokens=[(bos, vocab[bos])])
    _RAW[kind] = raw
    return raw


def sp_folder(folder: Path, kind: str, *, template: bool = True, hidden: int = 64) -> Path:
    """Writes a Mistral-7B-Instruct-v0.3- or Gemma-2-it-shaped folder (module docstring)."""
    from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM

    raw = sp_raw(kind)
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    ids = {t: raw.token_to_id(t) for t in SPECIAL[kind]}
    bos, eos = BOS[kind], EOS[kind]
    cfg = {"add_bos_token": True, "add_eos_token": False, "bos_token": bos, "eos_token": eos,
           "clean_up_tokenization_spaces": False, "model_max_length": 1000000000000000019884624838656,
           "sp_model_kwargs": {}, "spaces_between_special_tokens": False, "unk_token": "<unk>",
           "added_tokens_decoder": {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                                  "single_word": False, "special": True} for t in SPECIAL[kind]}}
    if kind == "mistral":
        cfg.update(tokenizer_class="LlamaTokenizer", legacy=False, pad_token=None, use_default_system_prompt=False)
        stops = [ids["</s>"]]
        config = MistralConfig(vocab_size=raw.get_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                               max_position_embeddings=32768, rope_theta=1e6, sliding_window=None,
                               bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], tie_word_embeddings=False)
        cls, hot = MistralForCausalLM, ["</s>"]
    else:
        cfg.update(tokenizer_class="GemmaTokenizer", pad_token="<pad>", mask_token="<mask>",
                   additional_special_tokens=["<start_of_turn>", "<end_of_turn>"])
        stops = [ids["<eos>"], ids["<end_of_turn>"]]
        config = Gemma2Config(vocab_size=raw.get_vocab_size(), hidden_size=hidden, intermediate_size=2 * hidden,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                              query_pre_attn_scalar=hidden // 4, sliding_window=4096, max_position_embeddings=8192,
                              bos_token_id=ids["<bos>"], eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"])
        cls, hot = Gemma2ForCausalLM, ["<end_of_turn>", "<eos>"]
    if template:
        cfg["chat_template"] = MISTRAL_TEMPLATE if kind == "mistral" else GEMMA_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    smap = {"bos_token": bos, "eos_token": eos, "unk_token": "<unk>"}
    if kind == "gemma":
        smap.update(pad_token="<pad>", additional_special_tokens=["<start_of_turn>", "<end_of_turn>"])
    (folder / "special_tokens_map.json").write_text(json.dumps(smap))
    torch.manual_seed(0)
    model = cls(config)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        for unit, t in enumerate(hot):
            head[ids[t]] = 0.0
            head[ids[t], unit] = 4.0
    model.save_pretrained(folder)
    gen = {"bos_token_id": ids[bos], "eos_token_id": stops if len(stops) > 1 else stops[0]}
    if kind == "gemma":
        gen["pad_token_id"] = ids["<pad>"]
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{kind: (folder, AutoTokenizer)}`` for mistral, gemma and mistral-plain (no chat template)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("sp")
    out = {}
    for name, kind, template in (("mistral", "mistral", True), ("gemma", "gemma", True),
                                 ("plain", "mistral", False)):
        sp_folder(root / name, kind, template=template)
        out[name] = (root / name, AutoTokenizer.from_pretrained(root / name))
    return out


def _ids(tok, *names):
    return [tok.convert_tokens_to_ids(n) for n in names]


def test_the_folders_load_as_the_hubs_do(folders):
    """What the rest relies on: AutoTokenizer keeps the folder's pipeline (BOS from the post-processor, byte fallback
    for CJK / emoji, Mistral's ``\\n`` as ``<0x0A>``), the decoders drop (Mistral) or keep (Gemma) a first piece's
    leading space, and the templates put the system text in the user turn (Mistral) or raise (Gemma)."""
    s = "The answer is 日本 🎉 \\boxed{5}\n</answer>"
    for name, (folder, tok) in folders.items():
        kind = "gemma" if name == "gemma" else "mistral"
        assert tok.backend_tokenizer.to_str() == sp_raw(kind).to_str(), name
        ids = tok(s)["input_ids"]
        assert ids[0] == tok.bos_token_id == _ids(tok, BOS[kind])[0] and ids.count(ids[0]) == 1
        assert tok.decode(ids, skip_special_tokens=True) == s
        pieces = tok.convert_ids_to_tokens(ids)
        assert "<0xE6>" in pieces and "<0xF0>" in pieces and ("<0x0A>" in pieces) == (kind == "mistral")
        answer = _ids(tok, "\u2581answer")
        assert tok.decode(answer) == ("answer" if kind == "mistral" else " answer")
    tok = folders["gemma"][1]
    with pytest.raises(Exception, match="System role not supported"):
        tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], tokenize=False)
    tok = folders["mistral"][1]
    assert tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                   tokenize=False, add_generation_prompt=True) == "<s>[INST] S\n\nU[/INST]"


# ------------------------------------------------------------------------------------------- 1. prompts

PROBLEMS = ["What is 12 plus 7?", "  spaced\r\nout  ", f"Solve 2x=4. {INSTRUCTION}", "café 日本 🎉"]


def sp_prompt(kind: str, user: str, system: str | None) -> str:
    """The prompt text by hand: Mistral v0.3's ``<s>[INST] {system}\\n\\n{user}[/INST]`` (user untrimmed); Gemma's
    ``<bos><start_of_turn>user\\n{system}\\n\\n{user}<end_of_turn>\\n<start_of_turn>model\\n`` (trimmed)."""
    if kind == "mistral":
        return f"<s>[INST] {f'{system}{chr(10) * 2}' if system else ''}{user}[/INST]"
    content = f"{system}\n\n{user}" if system else user
    return f"<bos><start_of_turn>user\n{content.strip()}<end_of_turn>\n<start_of_turn>model\n"


def check_prompt(kind, tok, ids, text):
    """``ids`` are ``text`` (beginning with the BOS) encoded once: one BOS, first; no EOS / end of turn last."""
    raw = sp_raw(kind)
    bos = raw.token_to_id(BOS[kind])
    assert text.startswith(BOS[kind])
    assert list(ids) == [bos] + raw.encode(text[len(BOS[kind]):], add_special_tokens=False).ids
    assert list(ids).count(bos) == 1 and ids[-1] not in _ids(tok, EOS[kind], "<end_of_turn>")


@pytest.mark.parametrize("kind", ["mistral", "gemma"])
def test_chat_prompts_are_the_template_once_with_the_system_text_in_the_user_turn(folders, kind):
    """encode_prompts under every data.system_prompt / data.instruction: the hand-rendered prompt encoded once (one
    BOS, although add_bos_token is set), the system text first in the user message (Mistral's template puts it
    there itself; Gemma's raises and build_prompt puts it there), the generation prompt last (Gemma) or [/INST]."""
    _, tok = folders[kind]
    for system_prompt, instruction_setting in [("pacs", "pacs"), ("", "pacs"), ("Be brief. ", ""), ("", "")]:
        system, instruction = prompt_parts(system_prompt, instruction_setting)
        for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)):
            user = problem if not instruction or problem.rstrip().endswith(instruction) else f"{problem} {instruction}"
            check_prompt(kind, tok, ids, sp_prompt(kind, user, system))
    text = sp_prompt(kind, PROBLEMS[0], SYSTEM_PROMPT)  # the check catches the trap: encoded with the BOS added
    with pytest.raises(AssertionError):
        check_prompt(kind, tok, tok(text)["input_ids"], text)


def test_plain_prompts_get_one_bos_and_no_eos(folders):
    """No chat template (Mistral's tokenizer): the plain format, the tokenizer's BOS once, nothing after
    "Assistant:"."""
    _, tok = folders["plain"]
    for ids, text in plain_prompt_cases(tok, PROBLEMS, "<s>"):
        check_prompt("mistral", tok, ids, text)


def test_the_system_role_notes_and_stop_warnings(folders):
    """takes_system_message: Mistral's template takes it (no note), Gemma's not; prompt_warnings says nothing for
    either (Gemma's <end_of_turn> is a stop through generation_config.json), and names <end_of_turn> for a Gemma
    folder whose generation config lists only <eos>."""
    from pacs_fast.data.prompts import prompt_warnings, takes_system_message
    from pacs_fast.rollout.base import folder_stop_ids

    assert takes_system_message(folders["mistral"][1]) and not takes_system_message(folders["gemma"][1])
    for kind in ("mistral", "gemma"):
        folder, tok = folders[kind]
        assert prompt_warnings(tok, ["1+1?"], folder_stop_ids(folder, tok)) == [], kind
    folder, tok = folders["gemma"]
    eos, eot = _ids(tok, "<eos>", "<end_of_turn>")
    assert sorted(folder_stop_ids(folder, tok)) == sorted([eos, eot])
    lines = prompt_warnings(tok, ["1+1?"], [eos])
    assert len(lines) == 1 and f"'<end_of_turn>' (id {eot}), which is not a stop token" in lines[0], lines


# ------------------------------------------------------------------------------------------- 2. response text

def _engine(folders, kind, cache={}):
    from pacs_fast.rollout.hf import HFEngine

    if kind not in cache:
        cache[kind] = HFEngine(str(folders[kind][0]))
    return cache[kind]


def _rows(engine, seqs):
    width = max(map(len, seqs))
    return torch.tensor([s + [engine.pad_id] * (width - len(s)) for s in seqs])


@pytest.mark.parametrize("kind", ["mistral", "gemma"])
def test_the_response_text_is_the_decode_of_its_ids_and_the_verifier_scores_it(folders, kind):
    """``▁The ▁answer ▁is ▁\\boxed{5}`` + EOS: the engine's text is the decode of the response ids alone, so under
    Mistral's decoder it has NO leading space ("The answer...") where the whole sequence's decode minus the prompt's
    has one (" The answer..."; vLLM's incremental detokenizer's text); Gemma's decoder keeps it. The verifier scores
    both 1; a reward that anchors at the start (``^The``) sees Mistral's text as the HF engine gives it."""
    from pacs_fast.reward.verifier import math_reward

    folder, tok = folders[kind]
    engine = _engine(folders, kind)
    prompt = encode_prompts(tok, ["What is 2 plus 3?"])[0]
    body = _ids(tok, "\u2581The", "\u2581answer", "\u2581is", "\u2581\\boxed{5}")
    eos = _ids(tok, EOS[kind])[0]
    (c,) = engine._completions(_rows(engine, [body + [eos, 7, 8]]), None)
    assert (c.token_ids, c.finish_reason) == (body + [eos], "stop")
    whole = tok.decode(prompt + c.token_ids, skip_special_tokens=True)
    in_context = whole[len(tok.decode(prompt, skip_special_tokens=True)):]
    assert in_context == " The answer is \\boxed{5}"
    assert c.text == ("The answer is \\boxed{5}" if kind == "mistral" else in_context)
    assert math_reward(c.text, "5") == 1.0 and math_reward(in_context, "5") == 1.0 and math_reward(c.text, "4") == 0


@pytest.mark.parametrize("kind", ["mistral", "gemma"])
def test_stop_strings_across_pieces_and_inside_byte_fallback_characters(folders, kind):
    """rollout.stop on SentencePiece pieces: "</answer>" split as ``<`` + ``/answer>`` fires at ``/answer>`` and the
    text ends with it; "🎉" (4 byte-fallback tokens) fires at the 4th, not before; "本" fires at its 3rd byte; a
    response cut by the length limit mid-character keeps the ids and decodes the partial bytes as U+FFFD."""
    from pacs_fast.rollout.base import SamplingParams

    _, tok = folders[kind]
    engine = _engine(folders, kind)
    text = "So <answer> 日本 🎉 5</answer> more text"
    ids = tok.encode(text, add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert "/answer>" in pieces and pieces[pieces.index("/answer>") - 1] == "<"
    for stop, last in (("</answer>", "/answer>"), ("🎉", "<0x89>"), ("本", "<0xAC>")):
        stops = engine._stop_strings(SamplingParams(n=1, stop=(stop,)))
        (c,) = engine._completions(_rows(engine, [ids]), None, stops=stops)
        k = pieces.index(last) + 1
        assert (c.token_ids, c.finish_reason) == (ids[:k], "stop"), stop
        assert c.text == tok.decode(ids[:k], skip_special_tokens=True) and c.text.endswith(stop), (stop, c.text)
        assert c.text == text[:text.index(stop) + len(stop)]
    k = pieces.index("<0xF0>") + 2  # the length limit inside the emoji
    (c,) = engine._completions(_rows(engine, [ids]), None, limits=[k])
    assert c.token_ids == ids[:k] and c.finish_reason == "length" and c.text.endswith("\ufffd")


# ------------------------------------------------------------------------------------------- 3. stopping

@pytest.mark.parametrize("kind", ["mistral", "gemma"])
def test_the_hf_engine_stops_at_the_folders_stop_ids(folders, kind):
    """Mistral: </s>; Gemma: <end_of_turn> (listed in generation_config.json only) and <eos>, both seen; the stop
    kept once, last; the text without special tokens and the decode of the ids."""
    from pacs_fast.rollout.base import SamplingParams

    _, tok = folders[kind]
    engine = _engine(folders, kind)
    want = set(_ids(tok, *(["</s>"] if kind == "mistral" else ["<eos>", "<end_of_turn>"])))
    assert set(engine.eos_ids) == want
    out = engine.generate(encode_prompts(tok, PROBLEMS), SamplingParams(n=8, temperature=1.0, max_new_tokens=MAX_NEW,
                                                                        seed=3, return_logprobs=True))
    ends = set()
    for cs in out:
        for c in cs:
            ends.add(check_completion(c, want, MAX_NEW))
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            assert not re.search(r"<(eos|bos|end_of_turn|start_of_turn|/?s)>|\[/?INST\]", c.text), c.text
            assert len(c.logprobs) == len(c.token_ids)
    assert want | {None} == ends, ends


# ------------------------------------------------------------------------------------------- 4/5. runs

TRAIN = [f"rollout.n={G}", "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}",
         "train.steps=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.progress=false",
         "train.plots=false", "train.tensorboard=false", f"train.log_samples={P * G}", "train.save_every=2",
         "train.eval_every=0", "data.eval_size=4"]


def _problem(tok, ids):
    return re.search(r"What is \d+ plus \d+\?", tok.decode(ids)).group(0)


@pytest.fixture(scope="module")
def gemma_runs(folders, tmp_path_factory):
    """``python -m pacs_fast.train`` (2 steps, the paper's system prompt) and ``python -m pacs_fast.eval --engine hf``
    (3 problems x 4) on the Gemma folder, in this process, every engine call and learner batch recorded."""
    from pacs_fast import eval as ev
    from pacs_fast.train import main

    tmp = tmp_path_factory.mktemp("gemma_runs")
    folder, _ = folders["gemma"]
    out = {}
    text = io.StringIO()
    with recording() as (calls, batches), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main([f"model.path={folder}", f"data.dataset={_data(tmp / 'train.jsonl')}", *TRAIN, f"train.out_dir={tmp}",
              "train.run_name=g"])
    out["train"] = (calls, batches, text.getvalue(), tmp / "g")
    text = io.StringIO()
    with recording() as (calls, _), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(folder), "--benchmarks", str(_data(tmp / "toy.jsonl", n=3, offset=50)), "--n",
                        "4", "--max-tokens", str(MAX_NEW), "--engine", "hf", "--out", str(tmp / "ev"), "--no-progress",
                        "--scorer-workers", "1"])
    assert code == 0, text.getvalue()
    out["eval"] = (calls, None, text.getvalue(), tmp / "ev")
    return out


@pytest.mark.parametrize("which", ["train", "eval"])
def test_a_gemma_run_sends_the_system_text_in_the_user_turn_and_stops_at_end_of_turn(folders, gemma_runs, which):
    """Every engine call of the train run and of the eval command: prompt ids the Gemma template once (one <bos>),
    the paper's system text first in the user message; responses end at <end_of_turn> or <eos> (kept once, last) or
    run to the limit; the learner's batch masks exactly each response with its stop token; the trainer's note on the
    system role is printed, without warnings."""
    from pacs_fast.trainer.metrics import read_jsonl

    _, tok = folders["gemma"]
    calls, batches, output, run = gemma_runs[which]
    assert "warning:" not in output, output
    if which == "train":
        assert "note: the chat template of model.path takes no system message" in output
    stops = set(_ids(tok, "<eos>", "<end_of_turn>"))
    ends = set()
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            check_prompt("gemma", tok, p, sp_prompt("gemma", f"{_problem(tok, p)} {INSTRUCTION}", SYSTEM_PROMPT))
            for c in cs:
                ends.add(check_completion(c, stops, params.max_new_tokens))
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert len(ends) > 1 and ends <= stops | {None}, ends
    if which == "train":
        train = [c for c in calls if c[1].return_logprobs]
        assert len(train) == len(batches) == 2
        for (prompts, _, comps), batch in zip(train, batches):
            check_batch(batch, prompts, comps)
        samples = [s for s in read_jsonl(run / "samples.jsonl") if "row" in s]
        assert all(s["prompt"].count("<bos>") == 1 and "<end_of_turn>" not in s["response"] for s in samples)
        bad = {k: v.clone() for k, v in batches[0].items()}  # (the check catches a mask one token short)
        bad["response_mask"] = torch.roll(bad["response_mask"], -1, dims=1)
        with pytest.raises(AssertionError):
            check_batch(bad, *train[0][::2])


def test_the_eval_command_says_where_the_system_text_went(gemma_runs):
    """The trainer prints a note when the template takes no system message (Gemma's) and the system text moves into
    the user turn; the eval command builds the same prompts and now says so as well (it said nothing: found and
    fixed in this sweep)."""
    _, _, output, _ = gemma_runs["eval"]
    assert "takes no system message" in output, output


def test_the_checkpoint_keeps_the_tokenizer_and_reloads_to_the_same_prompt_ids(folders, gemma_runs):
    """The train run's step-2 checkpoint: tokenizer files and generation_config.json byte for byte the input's;
    AutoTokenizer gives the same pipeline, BOS added by the post-processor, the chat template; the same prompt ids;
    the same stop ids (<end_of_turn> from generation_config.json)."""
    from transformers import AutoTokenizer

    from pacs_fast.rollout.base import folder_stop_ids

    folder, given = folders["gemma"]
    ckpt = gemma_runs["train"][3] / "checkpoints" / "step_000002"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (ckpt / name).read_bytes() == (folder / name).read_bytes(), name
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert tok.backend_tokenizer.to_str() == sp_raw("gemma").to_str() and tok.chat_template == GEMMA_TEMPLATE
    assert tok("x")["input_ids"][0] == tok.bos_token_id == given.bos_token_id
    assert encode_prompts(tok, PROBLEMS) == encode_prompts(given, PROBLEMS)
    assert folder_stop_ids(ckpt, tok) == folder_stop_ids(folder, given)
