"""Shipped benchmarks, user dataset loading, prompt building."""
import gzip
import hashlib
import json
import random

import pytest

from pacs_fast.data import (BENCHMARK_SIZES, INSTRUCTION, SYSTEM_PROMPT, build_messages, build_prompt,
                            encode_prompts, load_benchmark, load_dataset, shipped_path)
from pacs_fast.data.tiny import build_char_tokenizer
from pacs_fast.reward import gold_parses


@pytest.mark.parametrize("name", sorted(BENCHMARK_SIZES))
def test_benchmark_counts_and_gold_answers_parse(name):
    problems = load_benchmark(name)
    assert len(problems) == BENCHMARK_SIZES[name]
    assert len({p.id for p in problems}) == len(problems)
    assert all(p.problem.strip() and p.answer.strip() for p in problems)
    bad = [(p.id, p.answer) for p in problems if not gold_parses(p.answer)]
    assert not bad


def test_benchmark_details():
    aime = load_benchmark("aime2025")
    assert all(0 <= int(p.answer) <= 999 for p in aime)
    assert [p.answer for p in aime[:3]] == ["70", "588", "16"]  # the official AIME 2025 I key
    amc = load_benchmark("amc23")
    assert all(p.answer.lstrip("-").isdigit() for p in amc)  # shipped as integer strings ("27", not "27.0")
    math500 = load_benchmark("math500", limit=7)
    assert len(math500) == 7 and math500[0].id.startswith("test/")
    assert "solution" in math500[0].meta and "level" in math500[0].meta


def test_shipped_files_match_provenance():
    """The shipped files are byte-identical to the copies whose hashes PROVENANCE.md records."""
    text = shipped_path("math500").with_name("PROVENANCE.md").read_text()
    for name in [*BENCHMARK_SIZES, "math_train", "gsm8k_train"]:
        digest = hashlib.sha256(shipped_path(name).read_bytes()).hexdigest()
        assert digest in text, name


def test_training_sets():
    math_train = load_dataset("math_train")
    gsm8k = load_dataset("gsm8k_train", limit=100)
    assert len(math_train) == 7496 and len(gsm8k) == 100
    assert shipped_path("gsm8k_train").name.endswith(".jsonl.gz")
    rng = random.Random()
    for p in rng.sample(math_train, 20):
        assert gold_parses(p.answer), (p.id, p.answer)


def _write_jsonl(path, rows, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


def test_user_jsonl_with_custom_fields(tmp_path):
    rows = [{"question": "1+1?", "gt": 2, "uid": "a"}, {"question": "Half of 1?", "gt": 0.5, "uid": "b",
                                                         "extra": 3},
            {"question": "Big?", "gt": 27.0, "uid": "c"}]
    for gz in (False, True):
        path = _write_jsonl(tmp_path / ("d.jsonl.gz" if gz else "d.jsonl"), rows, gz)
        ps = load_dataset(path, problem_field="question", answer_field="gt", id_field="uid")
        assert [p.id for p in ps] == ["a", "b", "c"]
        assert [p.answer for p in ps] == ["2", "0.5", "27"]
        assert ps[1].meta == {"extra": 3}
    # ids default to the row index when there is no "id" field
    ps = load_dataset(tmp_path / "d.jsonl", problem_field="question", answer_field="gt", limit=2)
    assert [p.id for p in ps] == ["0", "1"]


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".jsonl.gz"])
def test_a_byte_order_mark_opening_the_file_is_not_data(tmp_path, suffix):
    """Windows editors save UTF-8 with a BOM; the first row was refused as invalid JSON."""
    rows = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}]
    text = json.dumps(rows) if suffix == ".json" else "".join(json.dumps(r) + "\n" for r in rows)
    data = b"\xef\xbb\xbf" + text.encode()
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    assert [(p.problem, p.answer) for p in load_dataset(path)] == [("1+1?", "2"), ("2+2?", "4")]
    if suffix == ".json":  # inside the data a BOM is a character like any other
        path.write_bytes(data.replace(b"2+2", b"\xef\xbb\xbf2+2"))
        assert [p.problem for p in load_dataset(path)][1] == "\ufeff2+2?"


def test_user_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is the 'parquet' extra")
    import pyarrow.parquet as pq

    table = pa.table({"problem": ["What is 2+3?", "What is 7*6?"], "answer": ["5", "42"]})
    pq.write_table(table, tmp_path / "d.parquet")
    ps = load_dataset(tmp_path / "d.parquet")
    assert [(p.id, p.answer) for p in ps] == [("0", "5"), ("1", "42")]
    with pytest.raises(ValueError, match=r"d\.parquet row 1: missing field 'gt'"):
        load_dataset(tmp_path / "d.parquet", answer_field="gt")


def test_clear_errors(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"problem": "p", "answer": "1"}, {"problem": "q"}])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: missing field 'answer' \(the row has: problem\)"):
        load_dataset(path)
    path = _write_jsonl(tmp_path / "broken.jsonl", [{"problem": "p", "answer": "1"}, "{not json"])
    with pytest.raises(ValueError, match=r"broken\.jsonl:2: invalid JSON"):
        load_dataset(path)
    path = _write_jsonl(tmp_path / "empty.jsonl", [{"problem": "p", "answer": "  "}])
    with pytest.raises(ValueError, match="empty"):
        load_dataset(path)
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_dataset(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="unknown dataset name"):
        load_benchmark("aime1999")
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported"):
        load_dataset(tmp_path / "x.csv")


def test_messages_follow_the_paper():
    msgs = build_messages("What is 1+1?")
    assert msgs == [{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is 1+1? Please reason step by step, and put your final "
                                                "answer within \\boxed{}."}]
    assert build_messages("Q", system=None, instruction=None) == [{"role": "user", "content": "Q"}]


def test_plain_format_without_chat_template():
    tok = build_char_tokenizer()
    text = build_prompt(tok, "What is 1+1?")
    assert text == f"{SYSTEM_PROMPT}\n\nUser: What is 1+1? {INSTRUCTION}\nAssistant:"
    ids = encode_prompts(tok, ["What is 1+1?", "2+2?"], system=None, instruction=None)
    assert tok.decode(ids[1]) == "User: 2+2?\nAssistant:"
    with pytest.raises(ValueError, match="chat template"):
        build_prompt(tok, "x", use_chat_template=True)


def test_chat_template_is_used():
    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    text = build_prompt(tok, "Q?")
    assert text == f"<system>{SYSTEM_PROMPT}\n<user>Q? {INSTRUCTION}\n<assistant>"
    assert tok.decode(encode_prompts(tok, ["Q?"])[0]) == text
    assert build_prompt(tok, "Q?", use_chat_template=False).startswith(SYSTEM_PROMPT + "\n\nUser: ")


def test_a_template_without_a_system_role_gets_the_system_text_in_the_user_message():
    """Gemma's templates raise "System role not supported" (a jinja traceback ended the run before); the
    system text then opens the one user message, as Gemma's own templates do with it."""
    from pacs_fast.data.prompts import takes_system_message

    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}"
                         "{{ raise_exception('System role not supported') }}{% endif %}"
                         "<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<model>{% endif %}")
    assert not takes_system_message(tok)
    text = build_prompt(tok, "Q?")
    assert text == f"<user>{SYSTEM_PROMPT}\n\nQ? {INSTRUCTION}\n<model>"
    assert encode_prompts(tok, ["Q?"])[0] == tok(text, add_special_tokens=False)["input_ids"]
    assert build_prompt(tok, "Q?", system=None) == f"<user>Q? {INSTRUCTION}\n<model>"
    # a template that fails whatever it is given: one ValueError naming the template, both tries
    tok.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
    with pytest.raises(ValueError, match=r"^the tokenizer's chat template cannot render the prompt \(TemplateError: "
                                         r"Conversation roles must alternate; without a system message: "):
        build_prompt(tok, "Q?")


def test_a_problem_already_ending_with_the_instruction_gets_it_once():
    tok = build_char_tokenizer()
    once = build_prompt(tok, "What is 1+1?")
    assert build_prompt(tok, f"What is 1+1? {INSTRUCTION}") == once
    assert build_prompt(tok, f"What is 1+1? {INSTRUCTION}\n") == once.replace(INSTRUCTION, INSTRUCTION + "\n")
    assert once.count(INSTRUCTION) == 1


def _chatml(tok, generation_header=True):
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                         + ("{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}" if generation_header else ""))
    return tok


def test_prompt_warnings_name_what_the_template_will_not_build_as_meant():
    """Bring-your-own-data sweep: a problem holding a chat template was wrapped in a second one, a template
    that ignores add_generation_prompt left prompts without an assistant header, and a base model's EOS
    (<|endoftext|>) is not the template's end of turn (<|im_end|>): responses ran past their turn. Each warned."""
    from pacs_fast.data.prompts import prompt_warnings

    tok = _chatml(build_char_tokenizer())
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert prompt_warnings(tok, ["What is 1+1?", "2+2?"], [end, tok.eos_token_id]) == []
    lines = prompt_warnings(tok, ["<|im_start|>user\nWhat is 1+1?<|im_end|>", "2+2?"], [end])
    assert lines == ["1 of 2 problems already hold the chat template's special tokens (e.g. '<|im_start|>'): each "
                     "is wrapped in the template again; give the problems as plain text"]
    lines = prompt_warnings(tok, ["2+2?"], [tok.eos_token_id])
    assert len(lines) == 1 and lines[0].startswith(f"the chat template ends an assistant turn with '<|im_end|>' (id {end}), "
                                                   f"which is not a stop token")
    tok = _chatml(build_char_tokenizer(), generation_header=False)
    assert prompt_warnings(tok, ["2+2?"], [end]) == [
        "the chat template adds nothing for add_generation_prompt: each prompt ends after the user's turn, with no "
        "assistant header for the model to answer after"]
    # no template (the plain format): "<s>" in a problem is encoded as the BOS token, not as its text (said since the
    # Zero-run sweep of 2026-12-07; a problem without special tokens: no line)
    assert prompt_warnings(build_char_tokenizer(), ["<s>x"], [0]) == [
        "1 of 1 problems already hold the tokenizer's special tokens (e.g. '<s>'): each is encoded as those tokens, not "
        "as its text; give the problems as plain text"]
    assert prompt_warnings(build_char_tokenizer(), ["x"], [0]) == []


def test_verl_parquet_nested_fields_and_decimal_answers(tmp_path):
    """Bring-your-own-data sweep: verl's parquet layout (``prompt`` as chat messages, the answer in
    ``reward_model.ground_truth``) could not be read, dotted field names were taken literally, and a
    parquet decimal column was refused ("got Decimal")."""
    from decimal import Decimal

    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"What is {i}+1?"}],
             "reward_model": {"ground_truth": str(i + 1), "style": "rule"}, "price": Decimal(f"{i}.50")}
            for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "verl.parquet")
    got = load_dataset(tmp_path / "verl.parquet", problem_field="prompt", answer_field="reward_model.ground_truth")
    assert [(p.problem, p.answer) for p in got] == [(f"What is {i}+1?", str(i + 1)) for i in range(3)]
    got = load_dataset(tmp_path / "verl.parquet", problem_field="prompt", answer_field="price")
    assert [p.answer for p in got] == ["0.5", "1.5", "2.5"]
    with pytest.raises(ValueError, match=r"missing field 'reward_model.truth' .*a dotted name reads a nested one"):
        load_dataset(tmp_path / "verl.parquet", problem_field="prompt", answer_field="reward_model.truth")
    path = tmp_path / "dotted.jsonl"  # a literal dotted key wins over the nested reading
    path.write_text(json.dumps({"q": "1+1?", "a.b": "2", "a": {"b": "3"}}) + "\n")
    assert load_dataset(path, problem_field="q", answer_field="a.b")[0].answer == "2"


def test_prompts_are_encoded_a_chunk_at_a_time_with_the_same_ids(monkeypatch):
    """encode_prompts tokenises ENCODE_CHUNK prompts per call (one call over a 100k-row set held +2 GB,
    bench/bench_encode_memory.py): chunk edges change no id."""
    from pacs_fast.data import prompts

    tok = build_char_tokenizer()
    problems = [f"What is {i}+{i * 7}?" for i in range(10)]
    want = [tok(build_prompt(tok, p))["input_ids"] for p in problems]
    monkeypatch.setattr(prompts, "ENCODE_CHUNK", 3)
    calls = []
    real = type(tok).__call__
    monkeypatch.setattr(type(tok), "__call__", lambda self, texts, **k: calls.append(len(texts)) or real(self, texts, **k))
    assert encode_prompts(tok, iter(problems)) == want
    assert calls == [3, 3, 3, 1]
    assert encode_prompts(tok, []) == []


def test_the_system_prompt_and_instruction_are_settings():
    """data.system_prompt / data.instruction (eval: --system-prompt / --instruction): 'pacs' is the paper's
    text, '' none (verl data that carries its own instruction), anything else the text itself."""
    from pacs_fast.config import load_config
    from pacs_fast.config.unused import unused_settings
    from pacs_fast.data.prompts import prompt_parts
    from pacs_fast.trainer.problems import encode

    assert prompt_parts() == (SYSTEM_PROMPT, INSTRUCTION)
    assert prompt_parts("", "") == (None, None) and prompt_parts("Be brief.", "Answer:") == ("Be brief.", "Answer:")
    tok = build_char_tokenizer()
    cfg = load_config(None, ["data.dataset=math_train", "data.system_prompt=", "data.instruction=Answer in a box."])
    (got,), _ = encode(cfg, tok, [{"problem": "1+1?", "answer": "2"}], "x", print)
    assert tok.decode(got["prompt_ids"], skip_special_tokens=True) == "User: 1+1? Answer in a box.\nAssistant:"
    cfg = load_config(None, ["data.system_prompt=Be brief."])  # the built-in task has its own prompt format
    assert unused_settings(cfg) == ["data.system_prompt=Be brief. has no effect with data.dataset=arithmetic (the "
                                    "built-in task has its own prompt format)"]


def test_the_trainer_keeps_prompt_ids_as_int32_arrays_and_hands_out_lists(monkeypatch):
    """The trainer's problems hold each prompt's ids as an ``array('i')``, 4 bytes a token against ~32 for a list
    of ints (100,000 prompts of 145 tokens: 446 -> 102 MiB per rank, bench/bench_encode_memory.py), encoded a
    chunk at a time; engines, batches and decodes get lists from ``prompt_lists``, equal to encode_prompts'."""
    from array import array

    from pacs_fast.config import load_config
    from pacs_fast.data import prompts
    from pacs_fast.trainer.problems import encode, prompt_lists

    tok = build_char_tokenizer()
    problems = [{"problem": f"{i}+{i}?", "answer": str(2 * i)} for i in range(5)]
    monkeypatch.setattr(prompts, "ENCODE_CHUNK", 2)
    got, dropped = encode(load_config(None, ["data.dataset=math_train"]), tok, problems, "x", print)
    assert dropped == 0 and [p["problem"] for p in got] == [p["problem"] for p in problems]
    assert all(type(p["prompt_ids"]) is array and p["prompt_ids"].itemsize == 4 for p in got)
    lists = prompt_lists(got)
    assert lists == prompts.encode_prompts(tok, [p["problem"] for p in problems])
    assert all(type(x) is list for x in lists)
    with pytest.raises(TypeError):  # a reader that forgot prompt_lists fails instead of doing something else
        got[0]["prompt_ids"] + [1]
    builtin = [{"prompt": "1+1=", "answer": "2"}]  # the built-in task's own prompt format: the same storage
    (one,), _ = encode(load_config(None, []), tok, builtin, "x", print)
    assert list(one["prompt_ids"]) == tok.encode("1+1=", add_special_tokens=False)


@pytest.mark.parametrize("row, field", [({"problem": "x\\ud800y", "answer": "1"}, "problem"),
                                        ({"problem": "x", "answer": "\\udfff"}, "answer"),
                                        ({"id": "a\\ud83d", "problem": "x", "answer": "1"}, "id"),
                                        ({"problem": "x", "answer": "1", "tests": ["\\ud800"]}, "tests")])
def test_a_lone_surrogate_is_named_with_its_field(tmp_path, row, field):
    """A JSON escape of half a surrogate pair reads as Python text that UTF-8 cannot write: eval's samples file
    failed on it after the sampling (and the trainer's records alike). A whole pair (an emoji) is text."""
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"problem": "ok \\ud83d\\ude00", "answer": "2", "tests": []}).replace("\\\\", "\\") + "\n"
                    + json.dumps(row).replace("\\\\", "\\") + "\n")
    with pytest.raises(ValueError, match=rf"d.jsonl:2: field '{field}' holds a lone surrogate"):
        load_dataset(path, fields=("tests",) if field == "tests" else ())
    assert load_dataset(path, limit=1)[0].problem == "ok \U0001F600"


# Phi-3-mini's first template (April 2024): user and assistant turns only, the user's closing on the assistant's cue
PHI3_FIRST = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
              "{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}"
              "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\\n'}}{% endif %}"
              "{% endfor %}")
# Mistral-7B-Instruct-v0.1's: add_generation_prompt is not read, "[/INST]" closes the user's turn and cues the answer
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
           "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
           "{{ message['content'] + eos_token}}{% else %}"
           "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")


def test_a_template_that_drops_the_system_message_gets_it_in_the_user_message():
    """Chat-template sweep: Phi-3's first template renders no system turn and raises nothing, so the system prompt
    (data.system_prompt / eval's --system-prompt) vanished from every prompt without a word. It is folded into the
    user message as for a template that refuses one (Gemma's), and the trainer's note says so."""
    from pacs_fast.data.prompts import takes_system_message

    tok = build_char_tokenizer()
    tok.chat_template = PHI3_FIRST
    assert not takes_system_message(tok)
    text = build_prompt(tok, "Q?", system="Be brief.")
    assert text == f"{tok.bos_token}<|user|>\nBe brief.\n\nQ? {INSTRUCTION}<|end|>\n<|assistant|>\n"
    assert encode_prompts(tok, ["Q?"], system="Be brief.")[0] == tok(text, add_special_tokens=False)["input_ids"]
    assert build_prompt(tok, "Q?", system=None) == f"{tok.bos_token}<|user|>\nQ? {INSTRUCTION}<|end|>\n<|assistant|>\n"
    # a template that trims the system text (Llama 3's) still takes it
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] | trim }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    assert takes_system_message(tok)
    assert build_prompt(tok, "Q?", system=" Be brief. \n").startswith("<system>Be brief.\n")
    tok.chat_template = "{% for m in messages %}{{ m.content }{% endfor %}"  # broken: its error, not a "no system" note
    assert takes_system_message(tok)


def test_a_user_turn_that_ends_on_the_assistants_cue_is_not_a_missing_header():
    """Mistral's and Phi-3's first templates read no add_generation_prompt, yet their prompts end where the model
    answers ("[/INST]", "<|assistant|>\\n"): the "no assistant header" warning was wrong for them."""
    from pacs_fast.data.prompts import prompt_warnings

    for template in (MISTRAL, PHI3_FIRST):
        tok = build_char_tokenizer()
        tok.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|end|>", "<|assistant|>"]})
        tok.chat_template = template
        assert prompt_warnings(tok, ["2+2?"], [tok.eos_token_id, tok.convert_tokens_to_ids("<|end|>")]) == []
