"""HFEngine's context (``max_model_len``): a response ends where prompt + response reach it, as vLLM's
does (``finish_reason`` "length"), and a prompt that fills it is refused. The HF engine generated past
``max_position_embeddings`` before (positions the model never saw; a model with learned positions
indexed past its table), so the two engines' responses differed on long prompts."""
import json
import shutil

import pytest
import torch

from pacs_fast.data.tiny import build_char_tokenizer, make_tiny_model
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.rollout.hf import HFEngine

CONTEXT = 40
# (sampler, merge_rows): the lean loop unmerged and merged, and model.generate
DECODERS = [("lean", False), ("lean", True), ("generate", None)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _prompts(tokenizer):
    # 40-token context: rooms of 28, 9, 3 and 1 tokens for a 12-token request, all in one chunk
    return [tokenizer("1+1=" * 3)["input_ids"], tokenizer("ab" * 15 + "c")["input_ids"],
            tokenizer("x" * 37)["input_ids"], tokenizer("y" * 39)["input_ids"]]


def _close(a: list[float], b: list[float]) -> bool:
    """Log-probs of the same tokens from two batches of other shapes (the capped engine's rows leave the batch
    at the context, so its later steps run smaller matrix products): equal up to the float32 rounding of those
    products, which a CPU's kernels order by shape (bit-equal on some CPUs, ~5e-7 apart on an Intel Xeon with
    AMX): 1e-5 is ~20 ulp of a log-prob near -5."""
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 for x, y in zip(a, b))


@pytest.mark.parametrize("sampler,merge", DECODERS)
@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_responses_end_at_the_context_and_equal_the_uncut_ones_up_to_it(model_dir, sampler, merge, pad_is_eos):
    capped = HFEngine(model_dir, batch_size=64, sampler=sampler, merge_rows=merge, max_model_len=CONTEXT)
    free = HFEngine(capped.model, capped.tokenizer, batch_size=64, sampler=sampler, merge_rows=merge,
                    max_model_len=10_000)
    if pad_is_eos:  # Qwen's pad <|endoftext|> is one of its EOS ids: rows past their cut are fed it
        capped.pad_id = free.pad_id = capped.eos_ids[0]
    prompts = _prompts(capped.tokenizer)
    lengths = [len(p) for p in prompts]
    assert [CONTEXT - n for n in lengths] == [28, 9, 3, 1]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=7, return_logprobs=True)
    got, ref = capped.generate(prompts, params), free.generate(prompts, params)
    eos = set(capped.eos_ids)
    cut = 0
    for n, mine, theirs in zip(lengths, got, ref):
        room = min(12, CONTEXT - n)
        for a, b in zip(mine, theirs):
            assert n + len(a.token_ids) <= CONTEXT
            if len(b.token_ids) <= room:  # the uncut response ends inside the context: the same response
                assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
                assert _close(a.logprobs, b.logprobs)
                continue
            cut += 1
            assert a.token_ids == b.token_ids[:room] and _close(a.logprobs, b.logprobs[:room])
            assert a.finish_reason == "length" and not eos & set(a.token_ids)
            assert a.text == capped.tokenizer.decode(a.token_ids, skip_special_tokens=True)
    assert cut >= 8, "the prompts with 3 and 1 tokens of room were never cut"


@pytest.mark.parametrize("sampler,merge", DECODERS)
def test_unseeded_and_greedy_calls_end_at_the_context_too(model_dir, sampler, merge):
    eng = HFEngine(model_dir, batch_size=64, sampler=sampler, merge_rows=merge, max_model_len=CONTEXT)
    prompts = _prompts(eng.tokenizer)
    for params in (SamplingParams(n=3, temperature=1.0, max_new_tokens=12),
                   SamplingParams(n=2, temperature=0.0, max_new_tokens=12)):
        for p, comps in zip(prompts, eng.generate(prompts, params)):
            for c in comps:
                assert len(p) + len(c.token_ids) <= CONTEXT and len(c.token_ids) <= 12
                if c.finish_reason == "length":
                    assert len(c.token_ids) == min(12, CONTEXT - len(p))


def test_the_context_defaults_to_the_models_positions_and_a_prompt_that_fills_it_is_refused(model_dir, tmp_path):
    eng = HFEngine(model_dir)
    assert eng.max_model_len == json.loads((model_dir / "config.json").read_text())["max_position_embeddings"] == 512
    with pytest.raises(ValueError, match=r"prompt_token_ids\[1\] has 512 tokens; max_model_len is 512"):
        eng.generate([[5] * 10, [5] * 512], SamplingParams(max_new_tokens=4))
    out = eng.generate([[5] * 511], SamplingParams(n=2, max_new_tokens=4, seed=0))  # one token of room, as vLLM
    assert [len(c.token_ids) for c in out[0]] == [1, 1]
    # a RoPE scaling (transformers 5 writes it as rope_parameters): its reach is the scaling's own, no limit
    scaled = tmp_path / "scaled"
    shutil.copytree(model_dir, scaled)
    config = json.loads((scaled / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    (scaled / "config.json").write_text(json.dumps(config))
    assert HFEngine(scaled).max_model_len is None
    assert HFEngine(model_dir, max_model_len=64).max_model_len == 64
    with pytest.raises(ValueError, match="max_model_len must be >= 2"):
        HFEngine(model_dir, max_model_len=1)


@pytest.mark.parametrize("sampler,merge", DECODERS)
def test_a_model_with_learned_positions_generates_up_to_its_table(sampler, merge):
    """GPT-2's position table has ``n_positions`` rows: a prompt near it made the decode loop index past
    the table (an IndexError); finished rows still in the batch keep their positions inside it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=24, n_embd=32, n_layer=1, n_head=2,
                                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                       pad_token_id=tok.pad_token_id)).eval()
    eng = HFEngine(model, tok, sampler=sampler, merge_rows=merge, batch_size=64)
    assert eng.max_model_len == 24
    prompts = [tok("1+2=")["input_ids"], tok("9" * 21)["input_ids"]]
    out = eng.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=10, seed=1))
    for p, comps in zip(prompts, out):
        assert all(len(p) + len(c.token_ids) <= 24 for c in comps)
    assert [len(c.token_ids) for c in out[1] if c.finish_reason == "length"] == \
        [24 - len(prompts[1])] * sum(c.finish_reason == "length" for c in out[1])
