"""``data.prompt_template`` / eval's ``--prompt-template``: the chat template, the plain format, or a template of the
user's own (a base model's "Zero" run: R1's template on base Qwen2.5-Math, whose tokenizer ships a chat template).

On the Qwen2.5-Math-1.5B base folder of tests/test_qwen25_math_path_sweep.py (byte-level BPE, Qwen2.5's added tokens
at their real ids, the hub's chat template, no BOS, EOS ``<|endoftext|>``) and a Llama-3-shaped tokenizer of
tests/test_llama3_path_sweep.py (a BOS its post-processor adds): ``chat`` is today's prompt id for id, ``plain`` the
plain format though the tokenizer has a template, a text of its own is that text with only ``{problem}`` /
``{instruction}`` / ``{system}`` replaced (``\\boxed{}`` kept), encoded with the tokenizer's BOS and no EOS; bad
texts are one line naming the key before any model loads (trainer and eval); R1's template opens the ``<think>``;
the warnings; and one short real ``python -m pacs_fast.train`` and ``python -m pacs_fast.eval`` with R1's template,
whose engine prompts are exactly its encoding.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import subprocess
from pathlib import Path

import pytest

from pacs_fast.config import hazard_warnings, load_config, unused_settings, validate
from pacs_fast.config.prompt_template_checks import check_prompt_template
from pacs_fast.data.prompts import INSTRUCTION, SYSTEM_PROMPT, build_prompt, encode_prompts, prompt_parts
from pacs_fast.reward.boxes import opens_think
from pacs_fast.trainer.metrics import read_jsonl
from test_llama3_path_sweep import LLAMA31_TEMPLATE, LLAMA32_DATE, _data, _raw_tokenizer
from test_qwen25_math_path_sweep import EOT, IM_START, _raw, math_folder, math_prompt, no_model_load

R1 = ("A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The "
      "Assistant first thinks about the reasoning process in the mind and then provides the User with the answer. "
      "The reasoning process is enclosed within <think> </think> and answer is enclosed within <answer> </answer> "
      "tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>.\nUser: "
      "{problem}\nAssistant: <think>")
QWEN_MATH = ("<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
             "<|im_start|>user\n{problem}<|im_end|>\n<|im_start|>assistant\n")
PROBLEMS = ["What is 12 plus 7?", "  spaced\r\nout  ", "café {instruction} {system} {x} \\boxed{}"]


def raw_ids(text: str) -> list[int]:
    """``text`` encoded by the Qwen folder's tokenizer.json backend, nothing added."""
    return _raw().encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(folder, tokenizer): Qwen2.5-Math-1.5B base as the hub has it (its chat template included)."""
    from transformers import AutoTokenizer

    folder = math_folder(tmp_path_factory.mktemp("zero") / "base", base=True)
    return folder, AutoTokenizer.from_pretrained(folder)


def llama_tokenizer(eos_too: bool = False, template: str = LLAMA31_TEMPLATE):
    """A Llama-3-shaped fast tokenizer whose post-processor adds the BOS (and the EOS after the text, ``eos_too``:
    a tokenizer with ``add_eos_token``), with ``template`` as its chat template."""
    from tokenizers import Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer.from_str(_raw_tokenizer().to_str())
    if eos_too:
        bos, eos = raw.token_to_id("<|begin_of_text|>"), raw.token_to_id("<|end_of_text|>")
        raw.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A <|end_of_text|>",
                                          special_tokens=[("<|begin_of_text|>", bos), ("<|end_of_text|>", eos)])])
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    tok.chat_template = template
    return tok


# ------------------------------------------------------------------------------------------- the formats

def test_chat_is_todays_prompt_and_plain_leaves_the_chat_template_out(base):
    """``chat`` (the default) is the chat template as before, id for id (the template's boxed system message under
    ``system=None``); ``plain`` is the plain format on the same tokenizer (which has a template), whatever
    ``use_chat_template`` says, with no special token (Qwen adds no BOS)."""
    _, tok = base
    for system, instruction in ((SYSTEM_PROMPT, INSTRUCTION), (None, None)):
        chat = encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)
        assert encode_prompts(tok, PROBLEMS, system=system, instruction=instruction, prompt_template="chat") == chat
        for problem, ids in zip(PROBLEMS, chat):
            assert ids == raw_ids(math_prompt(f"{problem} {instruction}" if instruction else problem, system))
        plain = encode_prompts(tok, PROBLEMS, system=system, instruction=instruction, prompt_template="plain")
        for problem, ids in zip(PROBLEMS, plain):
            head = f"{system}\n\n" if system else ""
            text = f"{head}User: {problem}{' ' + instruction if instruction else ''}\nAssistant:"
            assert build_prompt(tok, problem, system=system, instruction=instruction, prompt_template="plain",
                                use_chat_template=True) == text
            assert ids == raw_ids(text) and IM_START not in ids


def test_a_template_of_ones_own_replaces_only_its_placeholders(base):
    """R1's text with each problem put in as given (its own braces, a ``{instruction}`` in it, kept); Qwen2.5-Math's
    own format written as a text (``\\boxed{}`` as written, its ``<|im_start|>`` the special ids) is, id for id, what
    its chat template renders with neither system message nor instruction of ours; ``{system}`` / ``{instruction}``
    get the settings' texts (empty for none), once, not inside the texts put in."""
    _, tok = base
    system, instruction = prompt_parts("pacs", "pacs", R1)
    assert (system, instruction) == (None, None)  # (R1's names neither)
    for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction,
                                                     prompt_template=R1)):
        text = R1.split("{problem}")[0] + problem + R1.split("{problem}")[1]
        assert build_prompt(tok, problem, prompt_template=R1) == text
        assert ids == raw_ids(text) and _raw().decode(ids).endswith("\nAssistant: <think>")
    qwen = encode_prompts(tok, PROBLEMS, system=None, instruction=None, prompt_template=QWEN_MATH)
    assert qwen == encode_prompts(tok, PROBLEMS, system=None, instruction=None)  # the chat template's own format
    assert "within \\boxed{}.<|im_end|>" in build_prompt(tok, "1+1?", prompt_template=QWEN_MATH)
    assert [ids.count(IM_START) for ids in qwen] == [3] * len(PROBLEMS)
    both = "[{system}] {problem} ({instruction}) {instruction}"
    assert build_prompt(tok, "P {system}", system="S {instruction}", instruction="I {system}",
                        prompt_template=both) == "[S {instruction}] P {system} (I {system}) I {system}"
    assert build_prompt(tok, "P", system=None, instruction=None, prompt_template=both) == "[] P () "
    assert prompt_parts("Be brief.", "", both) == ("Be brief.", None)


def test_a_template_gets_the_tokenizers_bos_once_and_no_eos():
    """A Llama-3-shaped tokenizer adds a BOS (here also an EOS after the text, as ``add_eos_token`` does): a text of
    one's own is the BOS then the text, no EOS (as the plain format); one that begins with the BOS text itself gets
    no second one; ``chat`` still has the template's one BOS."""
    tok = llama_tokenizer(eos_too=True)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    plain_ids = tok("x", add_special_tokens=True)["input_ids"]
    assert plain_ids[0] == bos and plain_ids[-1] == eos  # (the tokenizer adds both)
    for template, body in ((R1, R1.replace("{problem}", "What is 1 plus 2?")),
                           ("<|begin_of_text|>Q: {problem}\nA:", "<|begin_of_text|>Q: What is 1 plus 2?\nA:")):
        ids = encode_prompts(tok, ["What is 1 plus 2?"], prompt_template=template)[0]
        assert ids.count(bos) == 1 and ids[0] == bos and eos not in ids, (template[:20], ids[:3], ids[-3:])
        assert ids == tok(body, add_special_tokens=template == R1)["input_ids"][:len(ids)]
    chat = encode_prompts(tok, ["What is 1 plus 2?"])[0]
    assert chat.count(bos) == 1 and chat[0] == bos


# ------------------------------------------------------------------------------------------- bad input, one line

BAD = {"": "does not hold {problem}", "Solve: {question}\nAnswer:": "holds {question}, which is no placeholder",
       "{problem} again {problem}": "holds {problem} 2 times", "Chat": "does not hold {problem}",
       "{Problem} {problem}": "holds {Problem}"}


def test_bad_templates_are_one_line_naming_the_key_and_latex_braces_are_fine():
    for text, why in BAD.items():
        for key, named in (("data.prompt_template", f"data.prompt_template={text[:80]!r}"),
                           ("--prompt-template", f"--prompt-template {text[:80]!r}")):
            with pytest.raises(ValueError) as e:
                check_prompt_template(text, key)
            assert str(e.value).startswith(f"{named} {why}") and "\n" not in str(e.value), str(e.value)
    for fine in ("chat", "plain", R1, QWEN_MATH, "x^{n} \\text{answer} \\frac{a}{b} {} { x } {1} {problem}"):
        assert check_prompt_template(fine, "k") == fine
    with pytest.raises(ValueError, match=r"^data\.prompt_template='Q: \{question\}' holds \{question\}"):
        validate(load_config(None, ["data.prompt_template=Q: {question}"]))


def test_the_trainer_and_eval_refuse_a_bad_template_before_any_model_loads(base, tmp_path):
    """``python -m pacs_fast.train`` (as its ``main``) with ``data.prompt_template`` lacking ``{problem}``: exit 2,
    one ``error:`` line naming the key, no model loaded, no run folder left; eval's ``--prompt-template`` likewise."""
    from pacs_fast import eval as ev
    from pacs_fast.train import main

    folder, _ = base
    data = _data(tmp_path / "d.jsonl", n=10)
    text = io.StringIO()
    with no_model_load(), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text), \
            pytest.raises(SystemExit) as exited:
        main([f"model.path={folder}", f"data.dataset={data}", "data.prompt_template=Question: {question}",
              f"train.out_dir={tmp_path}", "train.run_name=bad"])
    assert exited.value.code == 2
    errors = [line for line in text.getvalue().splitlines() if line.startswith("error:")]
    assert errors == ["error: data.prompt_template='Question: {question}' holds {question}, which is no placeholder: "
                      "a template takes {problem}, {instruction} and {system} (other braces, as \\boxed{}'s, stay "
                      "as written)"], text.getvalue()
    assert not (tmp_path / "bad").exists()
    text = io.StringIO()
    with no_model_load(), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main(["--model", str(folder), "--benchmarks", str(data), "--n", "1", "--engine", "hf",
                        "--out", str(tmp_path / "ev"), "--prompt-template", "User: {problem}{problem}"])
    assert code == 2 and text.getvalue().strip().splitlines() == [
        "error: --prompt-template 'User: {problem}{problem}' holds {problem} 2 times: it takes it once; give chat "
        "(the chat template), plain (the plain format) or a text holding {problem} once (and {instruction} / "
        "{system} where they go)"], text.getvalue()


# ------------------------------------------------------------------------------------------- what follows from it

def test_r1s_template_opens_the_think_and_plain_does_not(base):
    """What the trainer and eval read to know responses start inside ``<think>`` (the template around a neutral
    problem, pacs_fast/trainer/session.py and eval.py)."""
    _, tok = base
    assert opens_think(build_prompt(tok, "1+1?", system=None, instruction=None, prompt_template=R1)) is True
    for other in ("chat", "plain", QWEN_MATH):
        assert not opens_think(build_prompt(tok, "1+1?", system=None, instruction=None, prompt_template=other))


def test_unused_texts_and_template_variables_are_warned_of(base):
    """A non-empty ``data.instruction`` / ``data.system_prompt`` other than the default that the template does not
    name is a line each (the trainer's unused settings; eval's flags alike); ``chat_template_kwargs`` with ``plain``
    or a text of one's own, one line (both CLIs); the code reward's boxed-instruction hazard is not said where the
    template carries no instruction; a dating chat template pins no date for prompts it does not write."""
    from pacs_fast.data.prompt_date import pinned_date_kwargs
    from pacs_fast.data.prompts import template_kwargs_effect
    from pacs_fast.evaluation.args import prompt_flag_warnings

    def unused(*extra):
        return [line for line in unused_settings(load_config(None, ["data.dataset=math_train", *extra]))
                if line.startswith(("data.instruction", "data.system_prompt"))]

    r1 = f"data.prompt_template={R1}"
    assert unused(r1, "data.instruction=Think.", "data.system_prompt=Be brief.") == [
        "data.system_prompt=Be brief. has no effect with data.prompt_template, a text of its own without {system} "
        "(write {system} where the text goes)",
        "data.instruction=Think. has no effect with data.prompt_template, a text of its own without {instruction} "
        "(write {instruction} where the text goes)"]
    assert unused(r1, "data.instruction=", "data.system_prompt=") == []  # ('' is none there either)
    assert unused("data.prompt_template={system} {problem} {instruction}", "data.instruction=Think.",
                  "data.system_prompt=Be brief.") == unused("data.prompt_template=plain", "data.instruction=Think.") == []
    code = ["reward.fn=pacs_fast.reward.code_tests:pass_all", "data.dataset=math_train"]
    assert any("code_tests" in line for line in hazard_warnings(load_config(None, code)))
    assert not any("code_tests" in line for line in hazard_warnings(load_config(None, [*code, r1])))
    args = argparse.Namespace(reward_fn="", system_prompt="Be brief.", instruction="", prompt_template=R1)
    assert prompt_flag_warnings(args) == [
        "--system-prompt 'Be brief.' has no effect with --prompt-template, a text of its own without {system} "
        "(write {system} where the text goes)"]
    assert prompt_flag_warnings(argparse.Namespace(**{**vars(args), "prompt_template": "chat"})) == []
    _, tok = base
    kwargs = {"enable_thinking": False}
    assert template_kwargs_effect(tok, kwargs, "plain") == \
        "data.prompt_template is the plain format, not the chat template: they change nothing"
    assert template_kwargs_effect(tok, kwargs, R1, "--prompt-template") == \
        "--prompt-template is a text of its own, not the chat template: they change nothing"
    assert template_kwargs_effect(tok, {}, "plain") is None
    dating = llama_tokenizer(template=LLAMA31_TEMPLATE.replace(
        '{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}', LLAMA32_DATE))
    assert pinned_date_kwargs(dating, {}, "06 Dec 2026", key="k", again="a")[1] == "06 Dec 2026"  # (chat: pinned)
    for template in ("plain", R1):
        assert pinned_date_kwargs(dating, {}, "06 Dec 2026", key="k", again="a", prompt_template=template) == \
            ({}, None, None)


def test_the_readme_example_is_r1s_template_as_the_shell_and_yaml_read_it():
    """The README's "Zero" command line, run through bash as written: its data.prompt_template is R1's text."""
    from pacs_fast.config.loading import parse_override

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(\s*python -m pacs_fast\.train [^`]*data\.prompt_template[^`]*)```", readme).group(1)
    command = block.replace("python -m pacs_fast.train", "printf '%s\\0'", 1)
    args = subprocess.run(["bash", "-c", command], capture_output=True, check=True).stdout.split(b"\0")[:-1]
    given = [a.decode() for a in args if a.startswith(b"data.prompt_template=")]
    assert len(given) == 1 and parse_override(given[0]) == ("data.prompt_template", R1), given


# ------------------------------------------------------------------------------------------- real runs

@pytest.fixture(scope="module")
def zero_run(base, tmp_path_factory):
    """``python -m pacs_fast.train`` (in this process) on the base folder with R1's template: 1 step of 2 prompts x 2
    responses, every engine call recorded (the Qwen3 sweep's ``recording``)."""
    from pacs_fast.train import main
    from test_qwen3_path_sweep import recording

    folder, _ = base
    tmp = tmp_path_factory.mktemp("zero_run")
    data = _data(tmp / "train.jsonl", n=12)
    text = io.StringIO()
    with recording() as (calls, _, _), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        main([f"model.path={folder}", f"data.dataset={data}", f"data.prompt_template={R1}", "rollout.n=2",
              "rollout.eval_n=1", "rollout.max_new_tokens=4", "train.prompts_per_step=2", "train.steps=1",
              "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.progress=false",
              "train.plots=false", "train.tensorboard=false", "train.log_samples=4", "train.save_every=1",
              "train.eval_every=0", "data.eval_size=2", f"train.out_dir={tmp}", "train.run_name=zero"])
    return tmp / "zero", calls, text.getvalue()


def test_a_zero_run_sends_r1s_template_encoded_and_nothing_else(zero_run):
    """Every rollout and held-out prompt the engine got is R1's text around the problem, encoded once by
    tokenizer.json's backend: no chat-template token, no BOS (Qwen has none), no EOS; the scorer was told the
    prompts open the ``<think>``; samples.jsonl's prompt is that text; the base model's warning about its chat
    template's end of turn is not said (that template is not used), nor any other; the run keeps the template in
    its config and a ``--resume`` cannot change it."""
    from pacs_fast.trainer.run_folder import resume_config

    run, calls, output = zero_run
    assert "Traceback" not in output and not [line for line in output.splitlines() if "warning:" in line], output
    assert calls.think_open is True
    seen = set()
    for prompts, _, _ in calls:
        for ids in prompts:
            problem = re.search(r"What is \d+ plus \d+\?", _raw().decode(ids)).group(0)
            assert ids == raw_ids(R1.replace("{problem}", problem)), problem
            assert IM_START not in ids and EOT not in ids
            seen.add(problem)
    assert len(seen) >= 4 and any(c[1].return_logprobs for c in calls)  # (training and held-out prompts)
    samples = [s for s in read_jsonl(run / "samples.jsonl") if "row" in s]
    assert samples and all(s["prompt"] == R1.replace("{problem}", re.search(r"What is \d+ plus \d+\?",
                                                                              s["prompt"]).group(0)) for s in samples)
    assert load_config(str(run / "config.yaml")).data.prompt_template == R1
    with pytest.raises(ValueError, match="data.prompt_template cannot change in a resumed run"):
        resume_config(run, ["data.prompt_template=plain"])


def test_eval_with_r1s_template_records_it_and_tells_it_apart(base, tmp_path, monkeypatch):
    """``python -m pacs_fast.eval --prompt-template <R1's>`` on the base folder: the samples' prompts are R1's text
    around each problem, the verifier is told they open the ``<think>``, ``run_config.json`` records the template, a
    rerun into the folder with the chat template is refused before any model loads (its samples would mix two
    formats), and ``eval compare``'s warnings name ``prompt_template`` against a result made with the chat template
    (one from before it was recorded reads so)."""
    from pacs_fast import eval as ev
    from pacs_fast.evaluation.report import comparison_warnings
    from pacs_fast.reward.batch import BatchScorer

    told, init = [], BatchScorer.__init__

    def spy(self, *a, **k):
        told.append(k.get("think_open"))
        init(self, *a, **k)

    monkeypatch.setattr(BatchScorer, "__init__", spy)
    folder, _ = base
    data = _data(tmp_path / "toy.jsonl", n=2, offset=50)
    common = ["--model", str(folder), "--benchmarks", str(data), "--n", "2", "--max-tokens", "4", "--engine", "hf",
              "--out", str(tmp_path / "ev"), "--no-progress", "--scorer-workers", "0"]
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = ev.main([*common, "--prompt-template", R1])
    assert code == 0 and told[-1] is True, (told, text.getvalue())
    assert not [line for line in text.getvalue().splitlines() if "warning:" in line], text.getvalue()
    records = [json.loads(x) for x in (tmp_path / "ev" / "samples_toy.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in records] == [R1.replace("{problem}", f"What is {i} plus {i % 7}?") for i in (50, 51)]
    settings = json.loads((tmp_path / "ev" / "run_config.json").read_text())
    assert (settings["prompt_template"], settings["system"], settings["instruction"]) == (R1, None, None)
    text = io.StringIO()
    with no_model_load(), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        assert ev.main(common) == 2
    assert "prompt_template" in text.getvalue() and "other settings" in text.getvalue(), text.getvalue()
    mine = json.loads((tmp_path / "ev" / "results.json").read_text())
    older = json.loads(json.dumps(mine))
    older["label"] = "older"
    del older["settings"]["prompt_template"]  # (a result from before it was recorded: the chat template)
    assert [line for line in comparison_warnings([mine, older]) if "prompt_template" in line]
    assert comparison_warnings([mine, {**mine, "label": "same"}]) == []
