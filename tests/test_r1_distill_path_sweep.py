"""The product on a DeepSeek-R1-Distill-Qwen-shaped model folder (hostile sweep).

R1-Distill-Qwen-1.5B (DeepScaleR's base) is a Qwen2 model with a Llama-style tokenizer_config: ``add_bos_token:
true`` and BOS ``<｜begin▁of▁sentence｜>`` (the post-processor adds it to every encode) while the chat template also
writes it; EOS ``<｜end▁of▁sentence｜>`` is ALSO the pad token; the system text (if any) follows BOS with no role
tokens; turns are ``<｜User｜>`` / ``<｜Assistant｜>``; earlier assistant turns lose everything up to ``</think>``; the
generation prompt is ``<｜Assistant｜><think>\\n`` (newer revisions), so a response is its thinking, ``</think>``, then
the answer, and a response cut inside its thinking holds no ``<think>`` of its own. ``<think>`` / ``</think>`` /
``<｜User｜>`` / ``<｜Assistant｜>`` are added tokens that are NOT special (as in the real tokenizer.json), BOS / EOS are.

The folder: a byte-level BPE on Qwen2's split regex with those added tokens after the ordinary ids, a
``TemplateProcessing`` BOS post-processor, tokenizer_config as the hub's (``LlamaTokenizerFast``, add_bos_token,
pad == eos, the template), a tiny random Qwen2ForCausalLM whose EOS head row reads one hidden unit (so responses end
at EOS or run to the limit) and a generation_config with bos / eos ids. Helpers for recording engine calls and
learner batches come from tests/test_llama3_path_sweep.py.

Found and fixed (test ``test_boxed_extraction_reads_no_answer_in_a_response_cut_inside_the_prompts_think``): under
``reward.extraction=boxed`` / ``eval --extraction boxed`` a response cut inside its thinking is documented to state no
answer (README "a reasoning model's boxes inside <think> are drafts"; reward/boxes.py answer_part), but R1's
``<think>`` is in the PROMPT, so the response text had no ``<think>`` and answer_part read all of it: a draft
``\\boxed{}`` in unfinished thinking paid 1. The scorers now read ``<think>`` + response where the prompts open it.
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
from test_llama3_path_sweep import _data, check_batch, check_completion, recording

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT, GEN = "<｜User｜>", "<｜Assistant｜>", "<｜Assistant｜><think>\n"
# (content, special) as the real tokenizer.json lists them after the ordinary ids (151643..)
ADDED = [(EOS, True), (USER, False), (ASSISTANT, False), (BOS, True), ("<|EOT|>", False), ("<think>", False),
         ("</think>", False), ("<|quad_start|>", True), ("<|quad_end|>", True)]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
R1_TEMPLATE = (  # DeepSeek-R1-Distill-Qwen's (2025-02 revision), without the tool-calling branches
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}"
    "{% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') %}"
    "{%- for message in messages %}{%- if message['role'] == 'system' %}"
    "{% set ns.system_prompt = message['content'] %}{%- endif %}{%- endfor %}"
    "{{bos_token}}{{ns.system_prompt}}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}"
    "{%- if message['role'] == 'assistant' and message['content'] is not none %}"
    "{% set content = message['content'] %}{% if '</think>' in content %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endif %}"
    "{%- endfor -%}"
    "{% if add_generation_prompt %}{{'<｜Assistant｜><think>\\n'}}{% endif %}")
CORPUS = ["Okay, so I need to add 2 and 3.\n\nWait, the sum is 5.\n</think>\n\nThe answer is \\boxed{5}",
          "café 日本 ∑ What is 12 plus 7? hmm", "Please reason step by step, and put your final answer within \\boxed{}.",
          "You are a helpful assistant. So \\boxed{19}!"] * 10
G, P, MAX_NEW = 4, 2, 24

_RAW = []


def _raw():
    if not _RAW:
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

        t = Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
        t.decoder = decoders.ByteLevel()
        t.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=[],
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        t.add_tokens([AddedToken(c, special=s, normalized=False) for c, s in ADDED])
        t.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS}:1 $B:1",
                                                         special_tokens=[(BOS, t.token_to_id(BOS))])
        _RAW.append(t)
    return _RAW[0]


def r1_folder(path: Path) -> dict:
    """Writes the folder (module docstring); returns the added tokens' ids."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    raw = _raw()
    path.mkdir(parents=True, exist_ok=True)
    raw.save(str(path / "tokenizer.json"))
    ids = {c: raw.token_to_id(c) for c, _ in ADDED}
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": True, "add_eos_token": False, "bos_token": BOS, "clean_up_tokenization_spaces": False,
         "eos_token": EOS, "legacy": True, "model_max_length": 16384, "pad_token": EOS, "sp_model_kwargs": {},
         "unk_token": None, "tokenizer_class": "LlamaTokenizerFast", "chat_template": R1_TEMPLATE,
         "added_tokens_decoder": {str(ids[c]): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                                "single_word": False, "special": s} for c, s in ADDED}},
        indent=2, ensure_ascii=False))
    config = {"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": ids[BOS],
              "eos_token_id": ids[EOS], "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
              "intermediate_size": 128, "max_position_embeddings": 131072, "max_window_layers": 2,
              "model_type": "qwen2", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-06, "rope_theta": 10000, "sliding_window": 4096, "tie_word_embeddings": False,
              "torch_dtype": "float32", "transformers_version": "4.44.0", "use_cache": True,
              "use_sliding_window": False, "vocab_size": raw.get_vocab_size()}
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**config))
    with torch.no_grad():  # EOS reads one hidden unit: responses end at it, or run to the limit
        model.lm_head.weight[ids[EOS]] = 0.0
        model.lm_head.weight[ids[EOS], 0] = 4.0
    model.save_pretrained(path)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(json.dumps(
        {"_from_model_config": True, "bos_token_id": ids[BOS], "eos_token_id": ids[EOS], "do_sample": True,
         "temperature": 0.6, "top_p": 0.95, "transformers_version": "4.39.3"}, indent=2))
    return ids


@pytest.fixture(scope="module")
def r1(tmp_path_factory):
    """``(folder, tokenizer as AutoTokenizer loads it, added-token ids)``."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("r1") / "m"
    ids = r1_folder(folder)
    return folder, AutoTokenizer.from_pretrained(folder), ids


def r1_prompt(user: str, system: str | None) -> str:
    return f"{BOS}{system or ''}{USER}{user}{GEN}"


def check_prompt(tok, ids, text):
    """``ids`` are ``text`` encoded once: ONE BOS, first; the generation prompt last; no EOS."""
    bos, eos = tok.convert_tokens_to_ids(BOS), tok.convert_tokens_to_ids(EOS)
    assert text.startswith(BOS) and text.endswith(GEN)
    assert list(ids) == [bos] + _raw().encode(text[len(BOS):], add_special_tokens=False).ids
    assert list(ids).count(bos) == 1 and eos not in ids


# ------------------------------------------------------------------------------------------- the folder

def test_the_folder_loads_as_an_r1_distill_checkpoint_does(r1):
    """BOS from the post-processor on every encode, pad == eos, the added tokens' specialness as the hub's, the
    template writes BOS itself (the trap: encoded with special tokens, BOS twice), drops earlier thinking."""
    folder, tok, ids = r1
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (BOS, EOS, EOS) and tok.pad_token_id == tok.eos_token_id
    assert tok("12 plus 7")["input_ids"][0] == ids[BOS]
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == r1_prompt("hi", None)
    assert tok(text)["input_ids"][:2] == [ids[BOS]] * 2
    chat = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "draft</think>\n\n\\boxed{1}"},
            {"role": "user", "content": "b"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == \
        f"{BOS}{USER}a{ASSISTANT}\n\n\\boxed{{1}}{EOS}{USER}b{GEN}"
    t = "x</think> \\boxed{5}"
    assert tok.decode(tok(t + EOS, add_special_tokens=False)["input_ids"], skip_special_tokens=True) == t


# ------------------------------------------------------------------------------------------- 1. prompts

PROBLEMS = ["What is 12 plus 7?", f"Solve 2x=4. {INSTRUCTION}", "café 日本"]


@pytest.mark.parametrize("system_prompt", ["pacs", "", "Be brief."])
def test_prompts_have_one_bos_and_end_with_the_open_think(r1, system_prompt):
    _, tok, _ = r1
    system, instruction = prompt_parts(system_prompt, "pacs")
    for problem, ids in zip(PROBLEMS, encode_prompts(tok, PROBLEMS, system=system, instruction=instruction)):
        user = problem if problem.endswith(INSTRUCTION) else f"{problem} {INSTRUCTION}"
        check_prompt(tok, ids, r1_prompt(user, system))
    text = r1_prompt(PROBLEMS[0], system)
    with pytest.raises(AssertionError):  # (the check catches a doubled BOS)
        check_prompt(tok, tok(text)["input_ids"], text)


# ------------------------------------------------------------------------------------------- 2/3. engine, verifier

def test_pad_equal_to_eos_keeps_the_stop_once_and_the_text_keeps_think_tags(r1):
    """HFEngine's own cut of rows padded with the EOS id: EOS kept once, ``stop``; a row of the limit without EOS is
    ``length``; texts keep </think> (non-special), drop EOS. Real generation stops at EOS or the limit."""
    from pacs_fast.rollout.base import SamplingParams
    from pacs_fast.rollout.hf import HFEngine

    folder, tok, ids = r1
    eos = ids[EOS]
    engine = HFEngine(str(folder))
    assert (engine.eos_ids, engine.pad_id) == ([eos], eos)
    body = tok.encode("Okay, 2+2.\n</think>\n\n\\boxed{4}", add_special_tokens=False)
    rows = torch.tensor([body + [eos] * 3, body + [eos, 5, 6], (body * 3)[:len(body) + 3]])
    comps = engine._completions(rows, None)
    assert [c.token_ids for c in comps] == [body + [eos], body + [eos], (body * 3)[:len(body) + 3]]
    assert [c.finish_reason for c in comps] == ["stop", "stop", "length"]
    assert comps[0].text == "Okay, 2+2.\n</think>\n\n\\boxed{4}"
    out = engine.generate(encode_prompts(tok, PROBLEMS), SamplingParams(n=6, temperature=1.0, max_new_tokens=8, seed=1))
    ends = {check_completion(c, {eos}, 8) for cs in out for c in cs}
    assert {eos, None} <= ends


DRAFT_THEN_FINAL = "Okay, maybe \\boxed{{{d}}}.\n</think>\n\nSo \\boxed{{{g}}}"


def test_the_final_answer_after_think_counts_under_both_extractions():
    """README: under ``boxed`` only boxes after the last </think> are read; under ``reference`` (math-verify on the
    whole text) the last box. Both: the final answer counts, a different draft inside the thinking does not."""
    from pacs_fast.reward.verifier import math_reward

    for ex in ("reference", "boxed"):
        assert math_reward(DRAFT_THEN_FINAL.format(d=5, g=4), "4", extraction=ex) == 1.0
        assert math_reward(DRAFT_THEN_FINAL.format(d=4, g=5), "4", extraction=ex) == 0.0
        assert math_reward("Okay \\boxed{}.\n</think>\n\n\\boxed{4}", "4", extraction=ex) == 1.0


def test_boxed_extraction_reads_no_answer_in_a_response_cut_inside_the_prompts_think():
    """Fixed BUG. R1's generation prompt opens ``<think>``; a response cut inside its thinking is documented to state
    no answer under ``boxed`` (README "boxes inside <think> are drafts"; boxes.answer_part "a response cut inside its
    thinking states no answer yet") -- it did for ``<think>draft \\boxed{4}`` but not for R1's ``draft \\boxed{4}``,
    whose <think> was in the prompt: it paid 1. Now a scorer told that the prompts open the <think>
    (``think_open``, from ``opens_think`` of a rendered prompt: the trainer's session and eval) reads ``<think>`` +
    response. (Under ``reference`` an unfinished response paying is documented; it is left as it is.)"""
    from pacs_fast.reward.batch import BatchScorer
    from pacs_fast.reward.boxes import answer_part, opens_think
    from pacs_fast.reward.verifier import math_reward

    assert math_reward("<think>\nOkay, maybe \\boxed{4} hmm let", "4", extraction="boxed") == 0.0
    assert answer_part("<think>\nOkay, maybe \\boxed{4} hmm") == ""
    assert opens_think(f"{BOS}{USER}What is 2+2?{GEN}") and not opens_think("<think>a</think>b")
    cut, done = "Okay, maybe \\boxed{4} hmm let", "Okay, maybe \\boxed{5}.\n</think>\n\n\\boxed{4}"
    with BatchScorer(0, extraction="boxed", think_open=True) as scorer:  # (R1's texts: their <think> the prompt's)
        assert scorer.score([cut, done], "4").scores == [0.0, 1.0]
    with BatchScorer(0, extraction="boxed") as scorer:  # (what it paid: the draft box in unfinished thinking)
        assert scorer.score([cut, done], "4").scores == [1.0, 1.0]
    with BatchScorer(0, extraction="reference", think_open=True) as scorer:  # (reference reads the text as it is)
        assert scorer.score([cut], "4").scores == [1.0]


# ------------------------------------------------------------------------------------------- 6. runs

def _forced_ids(tok, gold: int, kind: int) -> tuple[list[int], bool]:
    """Response ids: kind 0 a draft box (gold+1) in the thinking, </think>, the right final box, EOS; kind 1 the
    thinking with a right draft box, cut at MAX_NEW (no </think>, no EOS)."""
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    if kind == 0:
        return enc(DRAFT_THEN_FINAL.format(d=gold + 1, g=gold)) + [tok.eos_token_id], True
    ids = enc(f"Okay, maybe \\boxed{{{gold}}}")
    while len(ids) < MAX_NEW:
        ids += enc(" hmm")
    return ids[:MAX_NEW], False


def forced(engine, prompts, comps):
    """Samples 0 and 1 of each prompt replaced by :func:`_forced_ids` (then a pad, i.e. EOS, id past the end), cut and
    decoded by the engine's own ``_completions``, with the policy's log-probs."""
    tok = engine.tokenizer
    for p, cs in zip(prompts, comps):
        a, b = re.search(r"What is (\d+) plus (\d+)\?", tok.decode(p)).groups()
        for k in (0, 1):
            ids, _ = _forced_ids(tok, int(a) + int(b), k)
            with torch.no_grad():
                logits = engine.model(input_ids=torch.tensor([list(p) + ids])).logits[0, len(p) - 1:-1].float()
            lps = logits.log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            asked = cs[k].logprobs is not None
            row = torch.tensor([ids + [engine.pad_id]]) if len(ids) < MAX_NEW else torch.tensor([ids])
            lp = torch.cat([lps, torch.zeros(row.shape[1] - len(ids))])[None]
            cs[k] = engine._completions(row, lp)[0]
            if not asked:
                cs[k].logprobs = None
    return comps


TRAIN = [f"rollout.n={G}", "rollout.eval_n=2", f"rollout.max_new_tokens={MAX_NEW}", f"train.prompts_per_step={P}",
         "train.steps=2", "learner.mini_batch_prompts=2", "learner.micro_batch_prompts=1", "train.progress=false",
         "train.plots=false", "train.tensorboard=false", f"train.log_samples={P * G}", "train.save_every=2",
         "train.eval_every=0", "data.eval_size=2"]


class Run:
    pass


@pytest.fixture(scope="module")
def runs(r1, tmp_path_factory):
    """``python -m pacs_fast.train`` in-process, 2 steps, forced samples 0/1: ``default`` (the paper's system prompt,
    extraction reference), ``deepseek`` (``data.system_prompt=''``, extraction boxed, DAPO overlong shaping,
    mask_truncated)."""
    from pacs_fast.train import main

    folder, tok, _ = r1
    tmp = tmp_path_factory.mktemp("runs")
    data = _data(tmp / "train.jsonl", n=20)
    out = {}
    for name, extra, system in (
            ("default", [], SYSTEM_PROMPT),
            ("deepseek", ["data.system_prompt=", "reward.extraction=boxed", "reward.overlong_buffer_len=4",
                          "reward.overlong_penalty=1.0", "learner.mask_truncated=true"], None)):
        text = io.StringIO()
        with recording(forced) as (calls, batches), contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
            main([f"model.path={folder}", f"data.dataset={data}", *TRAIN, *extra, f"train.out_dir={tmp}",
                  f"train.run_name={name}"])
        run = out[name] = Run()
        run.folder, run.tok, run.run, run.calls, run.batches, run.system, run.output = \
            folder, tok, tmp / name, calls, batches, system, text.getvalue()
    return out


def _user(tok, ids):
    return re.search(r"What is \d+ plus \d+\?", tok.decode(ids)).group(0) + f" {INSTRUCTION}"


@pytest.mark.parametrize("name", ["default", "deepseek"])
def test_a_training_run_prompts_masks_samples_and_metrics(runs, name):
    """Every engine call: one BOS, the open <think> last, no EOS; responses stop at EOS once or run to the limit;
    the learner's rows (padded with the EOS id) mask exactly prompt+response / the response with its one EOS;
    samples.jsonl keeps <think>/</think>, drops EOS, counts it; response/* as README; the final answer after
    </think> scores 1 over a wrong draft."""
    run = runs[name]
    tok, eos = run.tok, run.tok.eos_token_id
    # (the deepseek run's tiny limit puts the cut responses past DAPO's buffer: the product says so, rightly)
    lines = [x for x in run.output.splitlines() if "warning:" in x and "overlong penalty" not in x]
    assert not lines and ("overlong penalty" in run.output) == (name == "deepseek"), run.output
    train = [c for c in run.calls if c[1].return_logprobs]
    assert len(train) == len(run.batches) == 2 and len(run.calls) > 2
    for prompts, params, comps in run.calls:
        for p, cs in zip(prompts, comps):
            check_prompt(tok, p, r1_prompt(_user(tok, p), run.system))
            for c in cs:
                check_completion(c, {eos}, params.max_new_tokens)
                assert c.text == tok.decode(c.token_ids, skip_special_tokens=True) and EOS not in c.text
    samples = [s for s in read_jsonl(run.run / "samples.jsonl") if "row" in s]
    records = [r for r in read_jsonl(run.run / "metrics.jsonl") if r["kind"] == "train"]
    for step, ((prompts, _, comps), batch, record) in enumerate(zip(train, run.batches, records), 1):
        pads = batch["input_ids"][batch["attention_mask"] == 0]
        assert pads.numel() and set(pads.tolist()) == {eos}  # (rows padded with the EOS id itself)
        check_batch(batch, prompts, comps)
        flat = [c for cs in comps for c in cs]
        rows = [s for s in samples if s["step"] == step]
        assert [(s["response"], s["response_tokens"], s["finish_reason"]) for s in rows] == \
            [(c.text, len(c.token_ids), c.finish_reason) for c in flat]
        assert all(s["prompt"].count(BOS) == 1 and s["prompt"].endswith(GEN) for s in rows)
        n = sum(len(c.token_ids) for c in flat)
        assert record["response/tokens"] == n and record["response/length"] == pytest.approx(n / len(flat))
        assert record["response/stop_frac"] == pytest.approx(sum(c.finish_reason == "stop" for c in flat) / len(flat))
        for s0, s1, cs in zip(rows[::G], rows[1::G], comps):
            gold = int(s0["answer"])
            assert (s0["response"], s0["reward"], s0["finish_reason"]) == \
                (DRAFT_THEN_FINAL.format(d=gold + 1, g=gold), 1.0, "stop")
            assert cs[0].token_ids.count(eos) == 1 and s0["response_tokens"] == len(cs[0].token_ids)
            assert "</think>" in s0["response"] and (s1["finish_reason"], s1["response_tokens"]) == ("length", MAX_NEW)
            if name == "deepseek":  # overlong shaping: the cut response is past the buffer, its trained reward 0
                assert s1["trained_reward"] == 0.0
    if name == "deepseek":
        assert all(r["response/truncated_frac"] > 0 for r in records)
    # the checks catch a response mask one token short / long (EOS left out, a pad counted)
    prompts, _, comps = train[0]
    for shift in (-1, 1):
        bad = {k: v.clone() for k, v in run.batches[0].items()}
        bad["response_mask"] = torch.roll(bad["response_mask"], shift, dims=1)
        with pytest.raises(AssertionError):
            check_batch(bad, prompts, comps)


def test_the_truncated_thinking_scores_as_the_extraction_documents(runs):
    """Sample 1 (thinking cut at the limit, a right draft box, no </think>): reference pays it (documented: an
    unfinished response can pay); boxed does not (it paid before the fix: see the verifier test above)."""
    for name, want in (("default", 1.0), ("deepseek", 0.0)):
        samples = [s for s in read_jsonl(runs[name].run / "samples.jsonl") if "row" in s]
        got = {s["reward"] for s in samples[1::G]}
        assert got == {want}, (name, got)


def test_the_checkpoint_keeps_the_tokenizer_config_and_reloads_to_the_same_prompts(runs):
    from transformers import AutoTokenizer

    from pacs_fast.rollout.base import folder_stop_ids

    run = runs["default"]
    ckpt = run.run / "checkpoints" / "step_000002"
    cfg = json.loads((ckpt / "tokenizer_config.json").read_text())
    assert cfg["add_bos_token"] is True and cfg["chat_template"] == R1_TEMPLATE
    assert (cfg["bos_token"], cfg["eos_token"], cfg["pad_token"]) == (BOS, EOS, EOS)
    tok = AutoTokenizer.from_pretrained(ckpt)
    for system in (SYSTEM_PROMPT, None):
        assert encode_prompts(tok, PROBLEMS, system=system) == encode_prompts(run.tok, PROBLEMS, system=system)
    assert tok.decode(tok.encode("a</think>b", add_special_tokens=False)) == "a</think>b"
    assert folder_stop_ids(ckpt, tok) == folder_stop_ids(run.folder, run.tok) == [tok.eos_token_id]
    gen = json.loads((ckpt / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"]) == (tok.bos_token_id, tok.eos_token_id)


@pytest.fixture(scope="module")
def evals(r1, tmp_path_factory):
    """``python -m pacs_fast.eval --engine hf --system-prompt ''`` on 3 problems x 4, samples 0/1 forced, under
    both extractions."""
    from pacs_fast import eval as ev

    folder, tok, _ = r1
    tmp = tmp_path_factory.mktemp("evals")
    data = _data(tmp / "toy.jsonl", n=3, offset=50)
    out = {}
    for ex in ("reference", "boxed"):
        text = io.StringIO()
        with recording(forced, every_call=True) as (calls, _), contextlib.redirect_stdout(text), \
                contextlib.redirect_stderr(text):
            code = ev.main(["--model", str(folder), "--benchmarks", str(data), "--n", "4", "--max-tokens",
                            str(MAX_NEW), "--engine", "hf", "--out", str(tmp / ex), "--no-progress",
                            "--scorer-workers", "1", "--system-prompt", "", "--extraction", ex])
        assert code == 0, text.getvalue()
        out[ex] = (tmp / ex, calls, text.getvalue())
    return out


@pytest.mark.parametrize("ex", ["reference", "boxed"])
def test_eval_prompts_samples_and_scores(r1, evals, ex):
    from pacs_fast.evaluation.results import read_samples

    _, tok, _ = r1
    out, calls, output = evals[ex]
    assert "warning:" not in output, output
    for prompts, params, comps in calls:
        for p, cs in zip(prompts, comps):
            check_prompt(tok, p, r1_prompt(_user(tok, p), None))
            for c in cs:
                check_completion(c, {tok.eos_token_id}, params.max_new_tokens)
    records = read_samples(out / "samples_toy.jsonl")
    assert len(records) == 3
    for r in records.values():
        assert r["prompt"].count(BOS) == 1 and r["prompt"].endswith(GEN) and SYSTEM_PROMPT not in r["prompt"]
        gold = int(r["answer"])
        assert r["responses"][0] == DRAFT_THEN_FINAL.format(d=gold + 1, g=gold) and r["scores"][0] == 1.0
        assert all(EOS not in t for t in r["responses"])
        assert r["num_tokens"][0] == len(_forced_ids(tok, gold, 0)[0])
        assert r["finish_reasons"][:2] == ["stop", "length"]
        assert r["scores"][1] == (1.0 if ex == "reference" else 0.0), (ex, r["responses"][1])
