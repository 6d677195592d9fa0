"""The data and prompt path as a user hits it, on a Qwen2.5-shaped model (hostile sweep of 2026-12-06).

The model: a byte-level BPE tokenizer with Qwen2.5's special tokens and chat template (tests/test_rollout_path_sweep.py)
and a tiny random Qwen2 model saved beside it, so that the command line checks the folder as a real one.

Found and fixed (each case below failed before its fix):
- ``data.problem_key`` naming the answer's field (``answer``, or both keys alike) put every row's gold answer in its
  prompt without a word; a question field holding a worked solution (``data.problem_key=solution``: MATH's
  ``\\boxed{..}``, GSM8K's ``#### 72``) did too. The first is refused, the second a warning.
- An empty ``data.eval_dataset`` failed after the tokenizer loaded as "the held-out set: no prompt fits
  data.max_prompt_tokens=512"; a file whose rows all repeat held-out problems as "data.dataset: no prompt fits".
- The held-out split of a file that repeats problems held a problem once per copy drawn (100 problems x 8 rows: 128
  held-out rows of 74 problems, eval/acc counting some twice) and left 518 training rows out, both without a word.
- Chat-message problems (verl's ``prompt`` column): a row's own system message was replaced by ``data.system_prompt``
  and the turns before the last user message (a conversation, few-shot examples) were dropped, without a word.
- Problems that carry their own answer-format request (DeepScaleR's / verl's "within \\boxed{}.", verl GSM8K's
  'after "####"', DAPO's "Answer: $Answer") got the paper's instruction as well, without a word.
- The plain prompt format (no chat template) ended every prompt with EOS under a tokenizer that appends one
  (``add_eos_token=True``, a ``$A </s>`` post-processor).
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from pacs_fast.config import load_config
from pacs_fast.data.datasets import load_dataset
from pacs_fast.data.prompts import INSTRUCTION, encode_prompts
from pacs_fast.trainer.problems import data_warnings, encode, load_problems

from test_rollout_path_sweep import CORPUS, QWEN25_TEMPLATE
from test_run_safety import cli

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"  # (CI: ../shared beside the checkout)


def _bpe(special, post=None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if post:
        raw.post_processor = post(raw)
    return raw


_QWEN_TOKENIZER_FOLDER = []  # (the per-process folder qwen_chatml_tokenizer reloads: a TemporaryDirectory)


def qwen_chatml_tokenizer():
    """``(tokenizer, <|im_end|> id, <|endoftext|> id)``: byte-level BPE with Qwen2.5's special tokens and ChatML
    template, EOS <|im_end|>, pad <|endoftext|> (the sweeps' Qwen2.5-shaped models), as the product loads it.

    Built in memory once per process, saved beside a qwen2 ``config.json`` and reloaded with ``AutoTokenizer`` on
    each call (a fresh object): transformers >= 5 loads the tokenizer of every qwen2 folder as ``Qwen2Tokenizer``,
    which keeps the saved vocabulary and merges but puts Qwen2's own normaliser (NFC) and pre-tokenizer (Qwen2's
    split regex: digits one by one, no space before a number) in place of the saved ones, and ``<|endoftext|>`` as
    the unknown token. The in-memory ``PreTrainedTokenizerFast`` encoded some texts otherwise (" 12", "e\u0301"):
    ``test_the_qwen_helper_tokenizer_encodes_as_the_folder_the_product_loads``."""
    import tempfile

    from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config

    if not _QWEN_TOKENIZER_FOLDER:
        folder = tempfile.TemporaryDirectory(prefix="qwen_chatml_tokenizer_")
        tok = PreTrainedTokenizerFast(tokenizer_object=_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]),
                                      eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                      additional_special_tokens=["<|im_start|>", "<|im_end|>"])
        tok.chat_template = QWEN25_TEMPLATE
        tok.save_pretrained(folder.name)
        Qwen2Config(vocab_size=len(tok)).save_pretrained(folder.name)  # (model_type qwen2: AutoTokenizer's class)
        _QWEN_TOKENIZER_FOLDER.append(folder)
    tok = AutoTokenizer.from_pretrained(_QWEN_TOKENIZER_FOLDER[0].name)
    return tok, tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")


def qwen_chatml_folder(folder, *, dtype=None, **config):
    """Writes a random Qwen2 model (width 64, FFN 128, ``config`` on top) with :func:`qwen_chatml_tokenizer` into
    ``folder``: EOS <|im_end|>, pad <|endoftext|>, both stop ids in its generation config, saved in ``dtype``
    (None: fp32). Returns the tokenizer."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok, im_end, eot = qwen_chatml_tokenizer()
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**{"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128,
                                            "max_position_embeddings": 4096, **config},
                                         eos_token_id=im_end, pad_token_id=eot))
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot)
    (model.to(dtype) if dtype is not None else model).save_pretrained(folder)
    return tok


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    """A Qwen2.5-shaped model folder: BPE tokenizer, ChatML template, EOS <|im_end|>, pad <|endoftext|>."""
    folder = tmp_path_factory.mktemp("qwen") / "m"
    tok = qwen_chatml_folder(folder, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    return folder, tok


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cfg(*overrides):
    return load_config(None, list(overrides))


TOY = [{"id": f"q{i}", "problem": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(15)]


def test_the_answer_field_given_as_the_problem_is_refused(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{**r, "solution": f"{r['problem']} = {r['answer']}"} for r in TOY])
    with pytest.raises(ValueError, match=r"^the problem and its gold answer are both read from field 'answer' "
                                         r"\(problem_field= / answer_field= / id_field=\): every prompt would hold"):
        load_dataset(path, problem_field="answer")
    for keys in (["data.problem_key=answer"], ["data.problem_key=solution", "data.answer_key=solution"]):
        with pytest.raises(ValueError, match=r"both read from field '(answer|solution)' \(data.problem_key= / "
                                             r"data.answer_key=\)"):
            load_problems(_cfg(f"data.dataset={path}", *keys))


def test_the_eval_command_refuses_it_too(tmp_path):
    import argparse

    from pacs_fast.evaluation.args import UsageError, load_benchmarks

    path = _jsonl(tmp_path / "mine.jsonl", TOY)
    args = argparse.Namespace(problem_field="answer", answer_field="answer", limit=None, extraction="boxed",
                              time_limit=5.0)
    with pytest.raises(UsageError, match=r"both read from field 'answer' \(--problem-field / --answer-field\)"):
        load_benchmarks(str(path), args)


@pytest.mark.parametrize("field,text", [
    ("solution", "So $x = {a}$, and the answer is $\\boxed{{{a}}}$."),   # MATH's solution field
    ("solution", "They sold {a} clips.\n#### {a}"),                       # GSM8K's
])
def test_a_question_field_that_states_the_answer_is_a_warning(tmp_path, field, text):
    rows = [{**r, field: text.format(a=r["answer"])} for r in TOY]
    cfg = _cfg(f"data.dataset={_jsonl(tmp_path / 'd.jsonl', rows)}", f"data.problem_key={field}", "data.eval_size=3",
               "train.prompts_per_step=4")
    lines = data_warnings(cfg, *load_problems(cfg))
    assert len(lines) == 1 and lines[0].startswith("15 of the 15 problems state their own gold answer"), lines
    assert lines[0].endswith("is data.problem_key=solution the question field?")
    cfg = _cfg(f"data.dataset={_jsonl(tmp_path / 'd.jsonl', rows)}", "data.eval_size=3", "train.prompts_per_step=4")
    assert data_warnings(cfg, *load_problems(cfg)) == []  # the question field: no line
    near = [{**r, "problem": f"Is it \\boxed{{{r['answer']}0}} or #### {r['answer']}7?"} for r in TOY]
    cfg = _cfg(f"data.dataset={_jsonl(tmp_path / 'n.jsonl', near)}", "data.eval_size=3", "train.prompts_per_step=4")
    assert data_warnings(cfg, *load_problems(cfg)) == []  # (12 is not \boxed{120}, nor #### 127)


@pytest.mark.parametrize("case", ["empty eval_dataset", "every row a held-out problem"])
def test_an_empty_eval_dataset_or_nothing_left_to_train_is_named_before_the_model(qwen, tmp_path, capsys,
                                                                                   monkeypatch, case):
    from pacs_fast.trainer import session

    folder, _ = qwen
    monkeypatch.setattr(session, "find_model", lambda *a, **k: pytest.fail("a model was looked for"))
    common = [f"model.path={folder}", f"train.out_dir={tmp_path / 'runs'}", "train.progress=false"]
    if case == "empty eval_dataset":
        (tmp_path / "empty.jsonl").write_text("\n\n")
        code, out, err = cli(common + [f"data.dataset={_jsonl(tmp_path / 'train.jsonl', TOY)}",
                                       f"data.eval_dataset={tmp_path / 'empty.jsonl'}"], capsys)
        assert code == 2 and err == f"error: data.eval_dataset '{tmp_path / 'empty.jsonl'}' has no rows\n", err
    else:
        same = _jsonl(tmp_path / "same.jsonl", [{"problem": "What is 1+1?", "answer": "2"}] * 10)
        code, out, err = cli(common + [f"data.dataset={same}"], capsys)
        assert code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"error: data.dataset '{same}': each of its 10 rows repeats a problem of the held-out "
                              f"split (1 distinct)"), err


def test_the_held_out_split_holds_a_repeated_problem_once_and_says_what_left_training(tmp_path):
    rows = [{"problem": f"What is {i} times {i + 1}?", "answer": str(i * (i + 1))} for i in range(100)] * 8
    cfg = _cfg(f"data.dataset={_jsonl(tmp_path / 'rep.jsonl', rows)}")
    train, held = load_problems(cfg)
    problems = [h["problem"] for h in held]
    assert len(problems) == len(set(problems)) == 74  # (128 rows of 74 problems before)
    assert not set(problems) & {t["problem"] for t in train} and len(train) == 800 - 8 * 74
    lines = data_warnings(cfg, train, held)
    assert lines == ["the held-out split holds 74 problems (the 128 rows drawn of data.dataset's 800 repeat problems: "
                     "each is held out once, and the 518 other rows of held-out problems stay out of training), "
                     "fewer than data.eval_size=128"]
    # a file without repeats splits as it always did (a resume compares the data's digest)
    cfg = _cfg(f"data.dataset={_jsonl(tmp_path / 'toy.jsonl', TOY)}", "data.split_seed=3")
    train, held = load_problems(cfg)
    order = torch.randperm(15, generator=torch.Generator().manual_seed(3)).tolist()
    assert [h["id"] for h in held] == [TOY[i]["id"] for i in order[:3]]
    assert [t["id"] for t in train] == [TOY[i]["id"] for i in order[3:]]
    assert all("copies" not in h for h in held)


def _verl(tmp_path, prompts, name="verl.parquet"):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rows = [{"prompt": p, "reward_model": {"ground_truth": str(i + 1), "style": "rule"}} for i, p in enumerate(prompts)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / name)
    return tmp_path / name


VERL_KEYS = ["data.problem_key=prompt", "data.answer_key=reward_model.ground_truth", "data.eval_size=2",
             "train.prompts_per_step=4"]


def test_a_chat_message_rows_own_system_message_is_not_replaced_without_a_word(tmp_path):
    own = "Answer in one line."
    system = [[{"role": "system", "content": own}, {"role": "user", "content": f"What is {i}+1?"}] for i in range(12)]
    path = _verl(tmp_path, system)
    with pytest.raises(ValueError, match=rf"verl.parquet row 1: field 'prompt' opens with the system message "
                                         rf"'{own}', which the prompt would replace \(the prompt's system message "
                                         rf"'You are a helpful assistant.', data.system_prompt\); set "
                                         rf"data.system_prompt to the row's text"):
        load_problems(_cfg(f"data.dataset={path}", *VERL_KEYS))
    train, held = load_problems(_cfg(f"data.dataset={path}", *VERL_KEYS, f"data.system_prompt={own}"))
    assert sorted(r["problem"] for r in train + held) == sorted(f"What is {i}+1?" for i in range(12))
    assert len(load_dataset(path, problem_field="prompt", answer_field="reward_model.ground_truth")) == 12  # (library)


def test_a_conversation_before_the_question_is_refused_an_sft_rows_answer_is_left_out(tmp_path):
    shots = [[{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"},
              {"role": "user", "content": f"What is {i}+1?"}] for i in range(12)]  # few-shot turns
    with pytest.raises(ValueError, match=r"row 1: field 'prompt' holds a conversation \(roles: user, assistant, "
                                         r"user\): the prompt is built from its last user message alone"):
        load_dataset(_verl(tmp_path, shots, "shots.parquet"), problem_field="prompt",
                     answer_field="reward_model.ground_truth")
    # an SFT row (the question, then its worked answer): the question alone, the answer not in the prompt
    sft = [[{"role": "user", "content": f"What is {i}+1?"}, {"role": "assistant", "content": f"\\boxed{{{i + 1}}}"}]
           for i in range(12)]
    got = load_dataset(_verl(tmp_path, sft, "sft.parquet"), problem_field="prompt",
                       answer_field="reward_model.ground_truth")
    assert [p.problem for p in got] == [f"What is {i}+1?" for i in range(12)]


def test_a_columns_oriented_json_names_what_it_found(tmp_path):
    (tmp_path / "cols.json").write_text(json.dumps({"problem": {"0": "a"}, "answer": {"0": "1"}}))  # pandas' default
    with pytest.raises(ValueError, match=r"cols.json row 1: field 'problem' must be a non-empty string, got dict"):
        load_dataset(tmp_path / "cols.json")


@pytest.mark.parametrize("request_text", ["Let's think step by step and output the final answer within \\boxed{}.",
                                          "Let's think step by step and output the final answer after \"####\".",
                                          "The last line of your response should be of the form Answer: $Answer"])
def test_problems_that_ask_for_their_own_format_get_a_line_under_an_instruction(tmp_path, request_text):
    rows = [{**r, "problem": f"{r['problem']} {request_text}"} for r in TOY]
    path = _jsonl(tmp_path / "d.jsonl", rows)
    cfg = _cfg(f"data.dataset={path}", "data.eval_size=3", "train.prompts_per_step=4")
    lines = data_warnings(cfg, *load_problems(cfg))
    assert len(lines) == 1 and lines[0].startswith("15 of the 15 problems already ask for an answer format"), lines
    assert "data.instruction=pacs appends the paper's to each as well" in lines[0]
    cfg = _cfg(f"data.dataset={path}", "data.eval_size=3", "train.prompts_per_step=4", "data.instruction=")
    assert data_warnings(cfg, *load_problems(cfg)) == []
    ours = _jsonl(tmp_path / "ours.jsonl", [{**r, "problem": f"{r['problem']} {INSTRUCTION}"} for r in TOY])
    cfg = _cfg(f"data.dataset={ours}", "data.eval_size=3", "train.prompts_per_step=4")  # (given once: user_text)
    assert data_warnings(cfg, *load_problems(cfg)) == []


def test_the_plain_format_ends_on_the_assistant_cue_not_on_eos():
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    def bos_eos(raw):
        bos, eos = raw.token_to_id("<s>"), raw.token_to_id("</s>")
        return processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", bos), ("</s>", eos)])

    tok = PreTrainedTokenizerFast(tokenizer_object=_bpe(["<s>", "</s>"], bos_eos), bos_token="<s>", eos_token="</s>")
    ids = encode_prompts(tok, ["1+1?", "What is 12+7?"])
    for problem, got in zip(["1+1?", "What is 12+7?"], ids):
        text = f"You are a helpful assistant.\n\nUser: {problem} {INSTRUCTION}\nAssistant:"
        assert got == [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]  # (it ended with </s>)


# Texts on which the in-memory tokenizer once encoded otherwise than the folder the product loads: decomposed and
# compatibility characters (no NFC), a space before a number (GPT-2's `` ?\p{N}+`` kept " 12" as one token; Qwen2's
# split regex takes digits one by one), and the rest of what the two pre-tokenizers cut differently.
HOSTILE_TEXTS = [
    "e\u0301", "cafe\u0301 nai\u0308ve", "A\u030a \u212b \u2126 n\u0303 a\u0300\u0301\u0302", "\u1e9b\u0323",
    "What is 12+7? Compute the value of x if 3x = 9.", "Step 12: 3.14159 1,000,000 \\boxed{5}.", " 2026",
    "12345678901234",
    "\uff46\uff55\uff4c\uff4c \uff21\uff22\uff23\uff11\uff12\uff13 \ufb01sh x\u00b2 \u2160 \u2460",
    "\u0661\u0662\u0663 \u0967\u0968",
    "caf\u00e9 \u65e5\u672c \u2211 \u4e2d\u6587\uff0c\u4f60\u597d \ud55c\uad6d\uc5b4",
    "\U0001F600\U0001F44D\U0001F3FD \U0001F468\u200d\U0001F469\u200d\U0001F467",
    "a   b\t\tc\n\n\nd", "\r\n", "line1\r\nline2\r\n", "  \r\n  ", " \n \n", "\u00a0nbsp \u3000ideo \u200b\u200d",
    "don't I'll we've DON'T I'M they'RE", "(word \"Step $x {answer} -the #### 72 :sum",
    "<|im_end|>", "a<|im_end|>b", "x <|im_start|>user\nhi<|im_end|>\n", "<|endoftext|> <|endoftext|>",
    "```python\nprint(1)\n```", "",
]


def test_the_qwen_helper_tokenizer_encodes_as_the_folder_the_product_loads(qwen):
    """``qwen_chatml_tokenizer()`` is what ``AutoTokenizer`` loads from a ``qwen_chatml_folder`` (transformers >= 5
    loads a qwen2 folder's tokenizer as ``Qwen2Tokenizer``: NFC and Qwen2's split regex in place of the saved
    normaliser and pre-tokenizer): the same ids on hostile texts, alone and batched, the same chat template output,
    the same special tokens (it was a ``PreTrainedTokenizerFast`` that encoded " 12" and "e\u0301" otherwise)."""
    from transformers import AutoTokenizer

    folder, _ = qwen
    tok, im_end, eot = qwen_chatml_tokenizer()
    loaded = AutoTokenizer.from_pretrained(folder)
    for text in HOSTILE_TEXTS:
        for special in (True, False):
            assert tok.encode(text, add_special_tokens=special) == loaded.encode(text, add_special_tokens=special), \
                (text, tok.convert_ids_to_tokens(tok.encode(text)), loaded.convert_ids_to_tokens(loaded.encode(text)))
    assert tok(HOSTILE_TEXTS, padding=True)["input_ids"] == loaded(HOSTILE_TEXTS, padding=True)["input_ids"]
    ids = loaded(HOSTILE_TEXTS)["input_ids"]
    for skip in (True, False):
        assert tok.batch_decode(ids, skip_special_tokens=skip) == loaded.batch_decode(ids, skip_special_tokens=skip)
    for system in ([], [{"role": "system", "content": "Sys \u00e9 12"}]):
        chats = [system + [{"role": "user", "content": t}] for t in HOSTILE_TEXTS]
        chats.append(system + [{"role": "user", "content": "What is 12+7?"}, {"role": "assistant", "content": " 19"},
                               {"role": "user", "content": "e\u0301 3x = 9"}])
        for gen in (True, False):
            for chat in chats:
                assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen) == \
                    loaded.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
                assert tok.apply_chat_template(chat, add_generation_prompt=gen, return_dict=True)["input_ids"] == \
                    loaded.apply_chat_template(chat, add_generation_prompt=gen, return_dict=True)["input_ids"], chat
    assert type(tok) is type(loaded) and tok.backend_tokenizer.to_str() == loaded.backend_tokenizer.to_str()
    assert (tok.special_tokens_map, tok.all_special_ids, len(tok)) == \
        (loaded.special_tokens_map, loaded.all_special_ids, len(loaded))
    assert (im_end, eot) == (loaded.eos_token_id, loaded.pad_token_id) == \
        (loaded.convert_tokens_to_ids("<|im_end|>"), loaded.convert_tokens_to_ids("<|endoftext|>"))
    assert tok.chat_template == loaded.chat_template == QWEN25_TEMPLATE


def test_qwen_prompts_are_the_template_once_with_the_generation_prompt(qwen, tmp_path):
    """No bug: the trainer's prompts on the Qwen2.5-shaped tokenizer are the template rendered once (no BOS: Qwen has
    none), with its assistant header, no answer, the problem's own white space kept; a prompt over the limit is
    dropped with a line naming the count, on either set."""
    _, tok = qwen
    rows = TOY + [{"id": "long", "problem": "What is 12+7? " * 80, "answer": "19"},
                  {"id": "ws", "problem": "  spaced\r\nout  ", "answer": "1"}]
    cfg = _cfg(f"data.dataset={_jsonl(tmp_path / 'd.jsonl', rows)}", "data.eval_dataset=" + str(tmp_path / "d.jsonl"),
               "data.eval_size=17", "data.max_prompt_tokens=200", "data.chat_template_kwargs={enable_thinking: false}")
    train, held = load_problems(cfg)
    logged = []
    kept, dropped = encode(cfg, tok, train, "data.dataset", logged.append)
    assert [p["id"] for p in kept] == [r["id"] for r in rows if r["id"] != "long"] and dropped == pytest.approx(1 / 17)
    longest = len(encode_prompts(tok, [rows[-2]["problem"]])[0])
    assert logged == [f"warning: data.dataset: dropped 1 of 17 prompts (6%) longer than data.max_prompt_tokens=200 "
                      f"tokens (the longest has {longest}, its template included)"]
    # the held-out set: one prompt dropped of 17 is a warning that says what eval/acc then is over (it was a plain
    # line under 5%: MATH-500 lost 19 of 500 to a small limit and eval/acc read as MATH-500's)
    logged.clear()
    assert len(encode(cfg, tok, held, "the held-out set", logged.append, held_out=True)[0]) == 16
    assert logged == [f"warning: the held-out set: dropped 1 of 17 prompts (6%) longer than data.max_prompt_tokens=200 "
                      f"tokens (the longest has {longest}, its template included); eval/acc is over the 16 kept, "
                      f"not the whole set: raise data.max_prompt_tokens to evaluate them all"]
    many = [{"id": f"m{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(40)]
    logged.clear()
    encode(cfg, tok, many + [rows[-2]], "the held-out set", logged.append, held_out=True)  # 1 of 41: under 5%
    assert len(logged) == 1 and logged[0].startswith("warning: the held-out set: dropped 1 of 41"), logged
    encode(cfg, tok, many + [rows[-2]], "data.dataset", logged.append)  # training: a plain line under 5%, as before
    assert logged[1].startswith("data.dataset: dropped 1 of 41"), logged
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    for p in kept:
        text = tok.decode(list(p["prompt_ids"]))
        assert text == (f"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{p['problem']} "
                        f"{INSTRUCTION}<|im_end|>\n<|im_start|>assistant\n")
        assert list(p["prompt_ids"]).count(im_start) == 3


def test_a_verl_file_trains_with_its_own_system_message_and_instruction(qwen, tmp_path, capsys):
    """A real run on the Qwen-shaped folder: verl's layout with a system message and its own format request, read as
    the settings say (data.system_prompt = the rows' text, data.instruction=''): the prompt is the template over the
    row's own messages, and no line warns."""
    folder, _ = qwen
    own = "Answer in one line."
    ask = "Let's think step by step and output the final answer within \\boxed{}."
    path = _verl(tmp_path, [[{"role": "system", "content": own}, {"role": "user", "content": f"What is {i}+1? {ask}"}]
                            for i in range(12)])
    code, out, err = cli([f"model.path={folder}", f"data.dataset={path}", *VERL_KEYS, f"data.system_prompt={own}",
                          "data.instruction=", "rollout.n=2", "rollout.eval_n=1", "rollout.max_new_tokens=2",
                          "train.prompts_per_step=2", "train.steps=1", "learner.mini_batch_prompts=2",
                          "learner.micro_batch_prompts=1", "train.progress=false", f"train.out_dir={tmp_path}",
                          "train.run_name=verl", "train.tensorboard=false", "train.save_every=0"], capsys)
    assert code == 0, err
    assert "warning" not in out + err, out + err
    rows = [json.loads(x) for x in (tmp_path / "verl" / "samples.jsonl").read_text().splitlines()]
    prompts = {r["prompt"] for r in rows if "prompt" in r}
    assert prompts and all(p.startswith(f"<|im_start|>system\n{own}<|im_end|>\n<|im_start|>user\nWhat is ") and
                           p.endswith(f"+1? {ask}<|im_end|>\n<|im_start|>assistant\n") for p in prompts), prompts


def test_hostile_files_read_the_same_rows_or_fail_in_one_line_naming_file_line_and_field(tmp_path):
    """No bug: a byte-order mark, CRLF, blank lines, gzip and parquet give the same problems; numbers become the
    verifier's text; bad bytes, a missing or null answer, a lone surrogate fail naming the file, line and field."""
    rows = [{"problem": "1+1?", "answer": 2}, {"problem": "half?", "answer": 0.5}, {"problem": "big?", "answer": 1e20},
            {"problem": "text?", "answer": " 007 "}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    want = [("1+1?", "2"), ("half?", "0.5"), ("big?", "100000000000000000000"), ("text?", "007")]
    variants = {"bom.jsonl": b"\xef\xbb\xbf" + text.encode(), "crlf.jsonl": text.replace("\n", "\r\n").encode(),
                "blank.jsonl": ("\n \n" + text.replace("\n", "\n\n")).encode(),
                "z.jsonl.gz": gzip.compress(text.encode()),
                "one.jsonl": json.dumps(rows[0]).encode()}
    for name, data in variants.items():
        (tmp_path / name).write_bytes(data)
        got = [(p.problem, p.answer) for p in load_dataset(tmp_path / name)]
        assert got == (want[:1] if name == "one.jsonl" else want), name
    bad = {"latin1.jsonl": (text.encode() + '{"problem": "caf\xe9", "answer": "1"}\n'.encode("latin-1"),
                            r"latin1.jsonl:5: not UTF-8 text"),
           "noanswer.jsonl": (text.encode() + b'{"problem": "x"}\n', r"noanswer.jsonl:5: missing field 'answer' \(the "
                                                                      r"row has: problem\)"),
           "null.jsonl": (b'{"problem": "x", "answer": null}\n', r"null.jsonl:1: field 'answer' must be a string"),
           "surrogate.jsonl": (b'{"problem": "x\\ud800", "answer": "1"}\n', r"surrogate.jsonl:1: field 'problem' "
                                                                            r"holds a lone surrogate")}
    for name, (data, message) in bad.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=message):
            load_dataset(tmp_path / name)


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared/data beside the checkout")
def test_the_shared_benchmark_files_load_through_the_config_as_the_shipped_ones():
    """No bug: /work/shared/data's files given by path hold what the shipped names hold; MATH train and MATH-500
    share no problem, and each set's split is the same by path as by name."""
    by_path = load_problems(_cfg(f"data.dataset={SHARED / 'math_train.jsonl.gz'}",
                                 f"data.eval_dataset={SHARED / 'math500.jsonl'}", "data.eval_size=500"))
    by_name = load_problems(_cfg("data.dataset=math_train", "data.eval_dataset=math500", "data.eval_size=500"))
    assert by_path == by_name and len(by_name[0]) == 7496 and len(by_name[1]) == 500
    for name in ("aime2024", "aime2025", "amc23"):
        assert [p.problem for p in load_dataset(SHARED / f"{name}.jsonl")] == [p.problem for p in load_dataset(name)]
    cfg = _cfg(f"data.dataset={SHARED / 'gsm8k_train.jsonl.gz'}", "data.eval_size=64")
    train, held = load_problems(cfg)
    assert len(held) == 64 and len(train) + len(held) == 7473 and data_warnings(cfg, train, held) == []


def _repeats_file(tmp_path):
    """10 problems x 3 rows, and a split seed whose 6 held-out rows draw two copies of a problem (so the split of
    pacs_fast before 2026-12-06, a copy per row drawn, differs from today's)."""
    rows = [{"id": f"r{k}", "problem": f"What is {k % 10} times 3?", "answer": str(3 * (k % 10))} for k in range(30)]
    path = _jsonl(tmp_path / "rep.jsonl", rows)
    for seed in range(100):
        cfg = _cfg(f"data.dataset={path}", "data.eval_size=6", f"data.split_seed={seed}")
        if len(load_problems(cfg)[1]) < 6:
            return path, seed
    pytest.fail("no split seed draws two copies")


def test_a_run_whose_held_out_split_was_drawn_per_row_resumes_with_it(tmp_path):
    from pacs_fast.trainer.problems import data_digest, resumed_problems

    path, seed = _repeats_file(tmp_path)
    cfg = _cfg(f"data.dataset={path}", "data.eval_size=6", f"data.split_seed={seed}")
    now, legacy = load_problems(cfg), load_problems(cfg, held_out_per_row=True)
    assert len(legacy[1]) == 6 > len(now[1]) and legacy[0] == now[0]  # (training is the same rows either way)
    assert resumed_problems(cfg, *now, data_digest(*legacy)) == legacy  # the checkpoint's split continues
    assert resumed_problems(cfg, *now, data_digest(*now)) == now
    assert resumed_problems(cfg, *now, "0" * 40) == now  # other data: check_same_data refuses it, as before
    assert resumed_problems(cfg, *now, None) == now


def test_the_resume_of_a_run_that_held_out_two_copies_continues(qwen, tmp_path, capsys):
    """End to end: a checkpoint whose data digest is the per-row split's (as a run started before 2026-12-06 wrote
    it) resumes, with that held-out set; another digest is still refused (the resume checks the data it continues)."""
    from pacs_fast.trainer.problems import data_digest

    folder, _ = qwen
    path, seed = _repeats_file(tmp_path)
    common = [f"model.path={folder}", f"data.dataset={path}", "data.eval_size=6", f"data.split_seed={seed}",
              "rollout.n=2", "rollout.eval_n=1", "rollout.max_new_tokens=2", "train.prompts_per_step=2",
              "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.progress=false",
              "train.tensorboard=false", "train.eval_every=0"]
    code, out, err = cli(common + ["train.steps=1", f"train.out_dir={tmp_path}", "train.run_name=rep"], capsys)
    assert code == 0, err
    run = tmp_path / "rep"
    state = run / "checkpoints" / "step_000001" / "trainer_state.json"
    now = json.loads(state.read_text())["data_sha1"]
    legacy = data_digest(*load_problems(_cfg(*common[1:4]), held_out_per_row=True))
    assert now == data_digest(*load_problems(_cfg(*common[1:4]))) != legacy
    text = state.read_text()
    for digest, expect in (("0" * 40, 2), (legacy, 0)):  # (same length: the checkpoint's manifest holds its size)
        state.write_text(text.replace(now, digest))
        code, out, err = cli(["--resume", str(run), "train.steps=2"], capsys)
        assert code == expect, err
        if expect:
            assert "the problems differ from those step_000001 trained on" in err, err
    assert json.loads((run / "checkpoints" / "step_000002" / "trainer_state.json").read_text())["data_sha1"] == legacy


def test_the_eval_command_says_what_the_trainer_says_of_a_files_prompts(tmp_path, capsys):
    """eval on a user file: a chat row's own system message that --system-prompt would replace is refused; problems
    stating their answer, or asking for their own format under an --instruction, get the trainer's warning lines."""
    import argparse

    from pacs_fast.evaluation.args import UsageError, load_benchmarks

    base = dict(answer_field="answer", limit=None, extraction="boxed", time_limit=5.0, system_prompt="pacs",
                instruction="pacs")
    chat = _jsonl(tmp_path / "chat.jsonl", [{"problem": [{"role": "system", "content": "Be brief."},
                                                         {"role": "user", "content": r["problem"]}], "answer": r["answer"]}
                                           for r in TOY])
    with pytest.raises(UsageError, match=r"opens with the system message 'Be brief.', which the prompt would replace "
                                         r".*--system-prompt"):
        load_benchmarks(str(chat), argparse.Namespace(problem_field="problem", **base))
    load_benchmarks(str(chat), argparse.Namespace(problem_field="problem", **{**base, "system_prompt": "Be brief."}))
    ask = "Output the final answer within \\boxed{}."
    rows = [{**r, "solution": f"So \\boxed{{{r['answer']}}}.", "problem": f"{r['problem']} {ask}"} for r in TOY]
    path = _jsonl(tmp_path / "mine.jsonl", rows)
    capsys.readouterr()
    load_benchmarks(str(path), argparse.Namespace(problem_field="solution", **base))
    assert "15 of 15 problems state their own gold answer" in capsys.readouterr().err
    load_benchmarks(str(path), argparse.Namespace(problem_field="problem", **base))
    err = capsys.readouterr().err
    assert "15 of 15 problems already ask for an answer format" in err and "--instruction ''" in err, err
    load_benchmarks(str(path), argparse.Namespace(problem_field="problem", **{**base, "instruction": ""}))
    assert "answer format" not in capsys.readouterr().err


def test_a_run_warns_when_its_held_out_set_loses_a_prompt(qwen, tmp_path, capsys):
    """The trainer's held-out set through the command line: one prompt over data.max_prompt_tokens of 13 is a warning
    naming what eval/acc is over (the training set's lone drop stays a plain line)."""
    folder, _ = qwen
    held = _jsonl(tmp_path / "held.jsonl", TOY[:12] + [{"id": "long", "problem": "What is 12+7? " * 80, "answer": "19"}])
    code, out, err = cli([f"model.path={folder}", f"data.dataset={_jsonl(tmp_path / 'train.jsonl', TOY)}",
                          f"data.eval_dataset={held}", "data.eval_size=13", "data.max_prompt_tokens=200",
                          "rollout.n=2", "rollout.eval_n=1", "rollout.max_new_tokens=2", "train.prompts_per_step=2",
                          "train.steps=1", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1",
                          "train.progress=false", f"train.out_dir={tmp_path}", "train.run_name=drop",
                          "train.tensorboard=false", "train.save_every=0"], capsys)
    assert code == 0, err
    assert "warning: the held-out set: dropped 1 of 13 prompts (8%)" in out + err and \
        "eval/acc is over the 12 kept, not the whole set" in out + err, out + err


def test_a_file_of_carriage_return_line_ends_is_named_as_such(tmp_path):
    """A .jsonl whose lines end in CR alone (classic Mac) read as one line: "Extra data at column 33", no why."""
    rows = ['{"problem": "1+1?", "answer": "2"}', '{"problem": "2+2?", "answer": "4"}']
    (tmp_path / "cr.jsonl").write_bytes(("\r".join(rows) + "\r").encode())
    with pytest.raises(ValueError, match=r"cr.jsonl:1: invalid JSON \(Extra data at column \d+\); its lines end in a "
                                         r"carriage return alone"):
        load_dataset(tmp_path / "cr.jsonl")
    (tmp_path / "crlf.jsonl").write_bytes(("\r\n".join(rows + ['{"problem": "3+3?", "answer": 6']) + "\r\n").encode())
    with pytest.raises(ValueError) as bad:  # CRLF with a real error: the error alone
        load_dataset(tmp_path / "crlf.jsonl")
    message = str(bad.value)[len(str(tmp_path)):]  # (the path holds the test's name)
    assert message.startswith("/crlf.jsonl:3: invalid JSON (") and "carriage" not in message, message
