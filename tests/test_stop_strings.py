"""Stop strings (pacs_fast/rollout/stop_strings.py; ``rollout.stop``, ``pacs_fast.eval --stop``).

What must hold, as vLLM's ``stop`` with ``include_stop_str_in_output=True`` (checked against vLLM in
tests/test_vllm_engine.py): a response ends at the first token after which its decoded text holds a stop string,
its text ends just after the earliest-ending string, its finish reason is "stop". An engine with stop strings
samples exactly the tokens the engine without them samples, up to that cut (the draws are keyed by row and
step), and stops decoding a row once it holds one. Everything is compared with :func:`cut_by_hand`, a scan of
every prefix's decode, on a character tokenizer and on a byte-level BPE one (Qwen2.5's kind: multi-byte
characters span several tokens; its pad id is its EOS id).
"""
from __future__ import annotations

import dataclasses
import inspect
import random

import pytest
import torch

from pacs_fast.config import load_config, validate
from pacs_fast.config.stop_string_checks import check_stop_strings
from pacs_fast.data.tiny import build_char_tokenizer, make_tiny_model
from pacs_fast.rollout.base import Completion, SamplingParams
from pacs_fast.rollout.hf import HFEngine
from pacs_fast.rollout.stop_strings import StopStrings
from test_step_credit import bpe_tokenizer

# Pieces of realistic responses for the BPE tokenizer (multi-byte characters, a tag, paragraph breaks).
PIECES = ["Step 1: add 2 and 3.", "\n\n", "café", "日本", " ∑ ", "<answer>", "5", "</answer>", "Answer: 5",
          " the sum"]


def emitted_by_hand(tok, ids: list[int]) -> str:
    """The text vLLM's incremental detokenizer has emitted after ``ids``: the decode of the longest start of
    ``ids`` whose decode does not end in an incomplete character (U+FFFD)."""
    for j in range(len(ids), -1, -1):
        text = tok.decode(ids[:j], skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            return text
    return ""


def cut_by_hand(tok, ids: list[int], stop) -> tuple[int, str] | None:
    """The reference: the first k whose emitted text holds a stop string, and that text cut after the
    earliest-ending one (every prefix decoded)."""
    for k in range(1, len(ids) + 1):
        text = emitted_by_hand(tok, ids[:k])
        ends = [text.find(s) + len(s) for s in stop if s in text]
        if ends:
            return k, text[:min(ends)]
    return None


def expected(tok, comps: list[list[Completion]], stop) -> list[list[tuple]]:
    """``comps`` (sampled without stop strings) as ``(token_ids, text, finish_reason)`` cut by hand."""
    out = []
    for cs in comps:
        row = []
        for c in cs:
            cut = cut_by_hand(tok, c.token_ids, stop)
            row.append((c.token_ids, c.text, c.finish_reason) if cut is None else
                       (c.token_ids[:cut[0]], cut[1], "stop"))
        out.append(row)
    return out


def stops_from(texts: list[str], rng: random.Random, count: int) -> list[str]:
    """``count`` distinct substrings (1-4 characters, no replacement character) of ``texts``."""
    out: list[str] = []
    for _ in range(200):
        text = rng.choice(texts)
        if not text:
            continue
        a = rng.randrange(len(text))
        s = text[a:a + rng.randint(1, 4)]
        if s and "\ufffd" not in s and s not in out:
            out.append(s)
        if len(out) == count:
            break
    return out


def random_responses(tok, rng: random.Random, rows: int) -> list[list[int]]:
    """Half realistic text (PIECES joined and encoded), half random ids (bytes that may not form characters)."""
    out = []
    for r in range(rows):
        if r % 2:
            out.append([rng.randrange(3, len(tok)) for _ in range(rng.randint(1, 30))])
        else:
            out.append(tok.encode("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8)))))
    return out


TOKENIZERS = {"char": build_char_tokenizer, "bpe": bpe_tokenizer}


@pytest.mark.parametrize("kind", list(TOKENIZERS))
def test_cut_equals_the_scan_of_every_prefix(kind, seed):
    tok, rng = TOKENIZERS[kind](), random.Random(seed)
    responses = random_responses(tok, rng, 60)
    texts = [tok.decode(ids, skip_special_tokens=True) for ids in responses]
    found = 0
    for ids in responses:
        stop = tuple(stops_from(texts, rng, rng.randint(1, 3))) + ("</answer>", "\n\n")[:rng.randint(0, 2)]
        matcher = StopStrings(tok, stop)
        got = matcher.cut(ids)
        assert got == cut_by_hand(tok, ids, stop), (ids, stop)
        found += got is not None
        if got is not None:
            assert any(got[1].endswith(s) for s in stop)
    assert found >= 10  # (stops drawn from the responses' own text: most hold one)


class ByteTokens:
    """A byte-level tokenizer of four tokens, as Qwen2.5's vocabulary has them for CJK text: ``'>'`` glued to the
    first byte of 日, then its last two bytes."""
    pieces = [b"<answer>5</answer", b">\xe6", b"\x97\xa5", b" more"]
    pad_token_id = 0

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=None):
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")

    def batch_decode(self, rows, skip_special_tokens=True, clean_up_tokenization_spaces=None):
        return [self.decode(r) for r in rows]


def test_a_string_completed_by_a_token_that_ends_mid_character_fires_when_the_character_completes():
    # vLLM's detokenizer holds back '>\xe6' (it decodes to '>' + U+FFFD) until 日 completes: "</answer>" fires at
    # the third token, not the second (the HF engine had ended such responses one token before vLLM)
    tok, stop = ByteTokens(), ("</answer>",)
    matcher = StopStrings(tok, stop)
    assert matcher.cut([0, 1, 2, 3]) == cut_by_hand(tok, [0, 1, 2, 3], stop) == (3, "<answer>5</answer>")
    tokens = torch.tensor([[0, 1, 2, 3]])
    assert [bool(matcher.hits(tokens[:, :t])) for t in (1, 2, 3, 4)] == [False, False, True, True]
    assert matcher.cut([0, 1]) is None  # (ending there, vLLM never emits the held-back '>': no stop, as there)


@pytest.mark.parametrize("kind,check_every", [("char", 1), ("bpe", 1), ("bpe", 4)])
def test_hits_find_each_row_when_its_stop_completes(kind, check_every, seed):
    # a decode loop's use: every check_every tokens, the rows not yet stopped; a row is found at the first check
    # at or after the token completing its stop string (not before), whatever the window decoded
    tok, rng = TOKENIZERS[kind](), random.Random(seed)
    responses = random_responses(tok, rng, 24)
    stop = tuple(stops_from([tok.decode(r, skip_special_tokens=True) for r in responses], rng, 2))
    width = max(len(r) for r in responses)
    tokens = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in responses])
    first = [c[0] if (c := cut_by_hand(tok, r, stop)) is not None else width + 1 for r in responses]
    matcher = StopStrings(tok, stop, check_every)
    found = torch.zeros(len(responses), dtype=torch.bool)
    order = torch.randperm(len(responses), generator=torch.Generator().manual_seed(seed))
    for t in range(check_every, width + 1, check_every):
        hits = matcher.hits(tokens, found, upto=t)  # (the loop's buffer: the first t tokens are the response so far)
        assert hits.tolist() == [not f and k <= t for f, k in zip(found.tolist(), first)], t
        assert torch.equal(matcher.hits(tokens[:, :t], found), hits)
        assert torch.equal(matcher.hits(tokens, found[order], upto=t, rows=order), hits[order])  # (a compacted batch)
        found |= hits
    assert found.any()


def tiny_bpe_model(tok, seed: int):
    """A random Qwen2-shaped model over ``tok``'s ids (1 layer, hidden 32)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def char_folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("stop_tiny"), seed=3)


ENGINES = [("char", "lean", False), ("char", "lean", True), ("char", "generate", None),
           ("bpe", "lean", False), ("bpe", "lean", True), ("bpe", "generate", None)]


@pytest.mark.parametrize("kind,sampler,merge", ENGINES)
def test_engine_cuts_where_the_scan_does(kind, sampler, merge, char_folder, seed):
    if kind == "char":
        engine = HFEngine(char_folder, sampler=sampler, merge_rows=merge)
    else:
        tok = bpe_tokenizer()
        engine = HFEngine(tiny_bpe_model(tok, seed), tok, sampler=sampler, merge_rows=merge)
    tok, rng = engine.tokenizer, random.Random(seed)
    prompts = [tok.encode(p) for p in ("1+2=", "Step 1: add", "café 33")]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24, seed=seed % 10**6, return_logprobs=True)
    plain = engine.generate(prompts, params)
    stop = tuple(stops_from([c.text for cs in plain for c in cs], rng, 2))
    got = engine.generate(prompts, dataclasses.replace(params, stop=stop))
    want = expected(tok, plain, stop)
    assert [[(c.token_ids, c.text, c.finish_reason) for c in cs] for cs in got] == want
    assert any(c.finish_reason == "stop" and c.text.endswith(stop) for cs in got for c in cs)
    for cs, ps in zip(got, plain):
        for c, p in zip(cs, ps):
            # the same draws; the log-probs of the common tokens agree up to float rounding (the batch shrinks
            # once rows stop, which changes the summation order in the model's matmuls: ~1e-7 seen in fp32)
            assert len(c.logprobs) == len(c.token_ids)
            assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(p.logprobs[:len(c.logprobs)]), atol=1e-5)


@pytest.mark.parametrize("sampler,merge", [("lean", False), ("lean", True), ("generate", None)])
def test_rows_stop_decoding_at_their_stop_string(sampler, merge, char_folder):
    # every printable character a stop string: every row stops at its first token, so the loop runs the prefill
    # and no decode step (generate: its first step's forward only), where 24 tokens took 24 forwards
    engine = HFEngine(char_folder, sampler=sampler, merge_rows=merge)
    calls = []
    hook = engine.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    prompts = [engine.tokenizer.encode("12+3=")] * 2
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=24, seed=1)
    try:
        engine.generate(prompts, params)
        plain, calls[:] = len(calls), []
        every = tuple(chr(c) for c in range(32, 127))
        out = engine.generate(prompts, dataclasses.replace(params, stop=every))
    finally:
        hook.remove()
    assert all(len(c.token_ids) == 1 and c.finish_reason == "stop" for cs in out for c in cs)
    assert len(calls) <= 2 < plain


@pytest.mark.parametrize("stop,message", [
    ("</answer>", "must be a list of strings, got the string"),
    ([""], r"stop\[0\] must be a non-empty string"),
    (["a", 3], r"stop\[1\] must be a string, got the number 3: YAML reads an unquoted number as a number"),
    (["a", None], r"stop\[1\] must be a non-empty string, got None"),
    (["a", "a"], r"stop\[1\] repeats 'a'"),
    ({"a": 1}, "must be a list of strings, got dict"),
])
def test_bad_stop_lists_are_refused_naming_the_key(stop, message):
    with pytest.raises(ValueError, match=message):
        check_stop_strings(stop, "rollout.stop")
    cfg = load_config(None, [])
    cfg.rollout.stop = stop
    with pytest.raises(ValueError, match="rollout.stop"):
        validate(cfg, world=1)
    with pytest.raises(ValueError, match="SamplingParams.stop"):
        SamplingParams(stop=stop)


def test_override_reads_yaml_escapes_and_params_take_a_list():
    cfg = load_config(None, [r'rollout.stop=["</answer>", "\n\nQuestion:"]'])
    validate(cfg, world=1)
    assert cfg.rollout.stop == ["</answer>", "\n\nQuestion:"]
    assert SamplingParams(stop=cfg.rollout.stop).stop == ("</answer>", "\n\nQuestion:")
    assert load_config(None, ["rollout.stop=[</answer>]"]).rollout.stop == ["</answer>"]


def test_a_training_run_samples_and_evaluates_with_its_stop_strings(tmp_path, warm_cache, monkeypatch, seed):
    # the tiny model answers sums (0..18): a response holding "1" or "5" ends just after the first of them,
    # in the rollouts and in the held-out evaluation (every engine call of the run gets the stop strings)
    from pacs_fast.trainer import train
    from pacs_fast.trainer.metrics import read_jsonl
    from test_train import TINY

    stop = ("1", "5")
    calls = []
    generate = HFEngine.generate

    def recording(self, prompts, params):
        if not any(f.function == "probe_accuracy" for f in inspect.stack()):  # (the warm-up's own check samples
            calls.append(params.stop)                                        # its task's answers, no stop)
        return generate(self, prompts, params)

    monkeypatch.setattr(HFEngine, "generate", recording)
    cfg = load_config(None, TINY + [f"warmup.cache_dir={warm_cache}", "train.steps=2", "train.log_samples=16",
                                    f"train.seed={seed % 1000}", "rollout.stop=['1','5']",
                                    "rollout.max_new_tokens=6", "train.tensorboard=false"])
    train(cfg, tmp_path / "run")
    assert calls and set(calls) == {stop}
    rows = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert len(rows) == 32
    held = 0
    for r in rows:
        first = min((r["response"].find(s) + 1 for s in stop if s in r["response"]), default=None)
        if first is not None:
            held += 1
            assert len(r["response"]) == first and r["finish_reason"] == "stop", r
    assert held > 0


def test_eval_cuts_records_and_compares_its_stop_strings(char_folder, tmp_path, capsys):
    # pacs_fast.eval --stop: the responses cut as the engine cuts, the strings in run_config.json; a resume with
    # other strings is refused naming them, a settings file from before the flag existed is one without any
    import json

    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples

    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                            for i in range(4)))

    def args(out, *extra):
        return ["--model", str(char_folder), "--benchmarks", str(data), "--n", "4", "--max-tokens", "12",
                "--engine", "hf", "--out", str(out), "--no-progress", "--scorer-workers", "1", *extra]

    assert ev.main(args(tmp_path / "plain")) == 0
    plain = read_samples(tmp_path / "plain" / "samples_toy.jsonl")
    texts = [t for rec in plain.values() for t in rec["responses"]]
    stop = stops_from(texts, random.Random(0), 2)
    flags = [x for s in stop for x in ("--stop", s)]
    assert ev.main(args(tmp_path / "cut", *flags)) == 0
    cut = read_samples(tmp_path / "cut" / "samples_toy.jsonl")
    held = 0
    for i, rec in plain.items():
        for text, got, reason in zip(rec["responses"], cut[i]["responses"], cut[i]["finish_reasons"]):
            ends = [text.find(s) + len(s) for s in stop if s in text]
            held += bool(ends)
            assert got == (text[:min(ends)] if ends else text) and (reason == "stop" or not ends)
    assert held > 0
    assert json.loads((tmp_path / "cut" / "run_config.json").read_text())["stop"] == sorted(stop)
    capsys.readouterr()
    assert ev.main(args(tmp_path / "cut", *[x for s in reversed(stop) for x in ("--stop", s)])) == 0  # (order: none)
    assert ev.main(args(tmp_path / "cut", "--stop", "zz")) == 2
    err = capsys.readouterr().err
    assert f"stop {sorted(stop)!r} there, ['zz'] here" in err, err
    settings = tmp_path / "plain" / "run_config.json"  # (a folder written before --stop was recorded)
    settings.write_text(json.dumps({k: v for k, v in json.loads(settings.read_text()).items() if k != "stop"}))
    assert ev.main(args(tmp_path / "plain")) == 0
    assert ev.main(args(tmp_path / "plain", "--stop", "")) == 2
    assert "--stop[0] must be a non-empty string" in capsys.readouterr().err
    assert ev.main(args(tmp_path / "plain", "--stop=--")) == 2
    assert "--stop cannot take '--': argparse reads it as the end of the options" in capsys.readouterr().err
    # a special token never stops a response, a typed backslash-n is two characters: each a warning line
    assert ev.main(args(tmp_path / "warned", "--stop", "</s>", "--stop", "\\n")) == 0
    err = capsys.readouterr().err
    assert "warning: --stop: '</s>' holds a special token of the tokenizer" in err, err
    assert "warning: --stop: '\\\\n' holds a backslash and a letter (two characters)" in err, err


def test_the_trainer_warns_of_stop_strings_that_cannot_work(tmp_path, warm_cache, capsys):
    from pacs_fast.config.hazards import hazard_warnings
    from pacs_fast.trainer import train
    from test_train import TINY

    cfg = load_config(None, TINY + [f"warmup.cache_dir={warm_cache}", "train.steps=1", "rollout.stop=['</s>']",
                                    "train.tensorboard=false"])
    train(cfg, tmp_path / "run")
    assert "warning: rollout.stop: '</s>' holds a special token of the tokenizer" in capsys.readouterr().out
    typed = load_config(None, [r"rollout.stop=['\n\n', x]"])  # (single quotes: YAML keeps the backslashes)
    assert typed.rollout.stop == ["\\n\\n", "x"]
    said = hazard_warnings(typed)
    assert any(line.startswith("rollout.stop: '\\\\n\\\\n' holds a backslash and a letter") for line in said), said
    assert not [line for line in hazard_warnings(load_config(None, [r"rollout.stop=['\nabla', '\text{']"]))
                if "backslash" in line]  # (LaTeX commands: one backslash and lowercase letters)
    quoted = load_config(None, ['rollout.stop=["\\n\\n"]'])  # (double quotes: line breaks)
    assert quoted.rollout.stop == ["\n\n"] and not [line for line in hazard_warnings(quoted) if "backslash" in line]

