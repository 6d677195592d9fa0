"""The HF engine's sampling as a user hits it, on a Qwen2.5-shaped model (hostile sweep of 2026-12-06).

The model: a random Qwen2 architecture with Qwen2.5-0.5B's head layout (hidden 896, 14 query heads, 2 KV heads of
64) at depth 2, an untied LM head with padded rows past the tokenizer's ids, over a byte-level BPE tokenizer with
the ChatML template, EOS ``<|im_end|>`` and the generation config's stop ids ``[<|im_end|>, <|endoftext|>]``
(``<|endoftext|>`` is also the pad id). Every sampler (lean merged / unmerged, ``generate``) is checked against
references computed here from full, unpadded forwards: the two-token joint distribution under temperature, min-p,
top-k, top-p (chi-square), greedy and the degenerate filters, each row alone against the padded batch, the EOS /
length flags, and the rollout log-probs against the learner's recomputation.

Found: nothing wrong in pacs_fast/rollout/ (these cases pass on the code as it was).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pacs_fast.rollout.base import SamplingParams
from pacs_fast.rollout.hf import HFEngine

from sampling_reference import chi_square, filtered_reference, six_sigma
from test_data_path_sweep import qwen_chatml_tokenizer

SAMPLERS = [("lean", True), ("lean", False), ("generate", None)]


@pytest.fixture(scope="module")
def qwen():
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok, im_end, eot = qwen_chatml_tokenizer()
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok) + 7, hidden_size=896, intermediate_size=512, num_hidden_layers=2, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1e6, tie_word_embeddings=False,
        eos_token_id=im_end, pad_token_id=eot)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3)  # spread-out but not flat distributions
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot)
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"])
               for q in ["1+1?", "What is 12+7? Compute x if 3x = 9. " * 3, "x"]]
    prompts.append(prompts[0][:4])  # a short prompt (no generation cue): 4 .. 100 tokens in one batch
    return model, tok, prompts, (im_end, eot)


def _logits(model, tok, ids):
    """``[len(ids), V]`` fp64 logits of one unpadded forward over the tokenizer's ids (padded head rows cut)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, :, :len(tok)].double()


FILTERS = [(0.8, 0.9, 6, 0.05), (1.3, 1.0, 4, 0.0)]


# generate (transformers' own loop and warpers, ~11 s a case) on the case that applies every filter; the lean sampler
# (ours) on both
@pytest.mark.parametrize("sampler,merge,T,top_p,top_k,min_p", [
    (sampler, merge, *f) for f in FILTERS for sampler, merge in SAMPLERS if sampler == "lean" or f == FILTERS[0]])
def test_two_token_joint_distribution(qwen, sampler, merge, T, top_p, top_k, min_p):
    """(first, second) token counts of many draws ~ p(t1) p(t2 | t1), each factor softmax(logits / T) filtered by
    transformers' own warpers in vLLM's order, from an unpadded forward of prompt (+ t1): the second step checks
    the cache, the merged rows' splits and the batch's padding (two prompts of different lengths decode together)."""
    model, tok, prompts, _ = qwen
    N = 2000 if sampler == "lean" else 300  # generate's loop is slower; 300 draws still resolve the filters
    eng = HFEngine(model, tok, sampler=sampler, merge_rows=merge, batch_size=1024)
    out = eng.generate(prompts[:2], SamplingParams(n=N, temperature=T, top_p=top_p, top_k=top_k, min_p=min_p,
                                                   max_new_tokens=2, seed=11))
    for i, p in enumerate(prompts[:2]):
        first = _logits(model, tok, p)[-1].float()
        p1 = filtered_reference(first, T, top_p, top_k, min_p).double()
        raw1 = torch.softmax(first, -1).double()
        joint = {}
        for a in p1.nonzero().flatten().tolist():
            second = _logits(model, tok, p + [a])[-1].float()
            p2 = filtered_reference(second, T, top_p, top_k, min_p).double()
            for b in range(len(tok)):
                if p2[b] > 0:
                    joint[(a, b)] = float(p1[a] * p2[b])
        keys = list(joint)
        index = {k: j for j, k in enumerate(keys)}
        counts = torch.zeros(len(keys) + 1, dtype=torch.float64)  # the last bin: a first token that ended it
        for c in out[i]:
            assert len(c.token_ids) in (1, 2)
            if len(c.token_ids) == 1:
                assert c.finish_reason == "stop" and p1[c.token_ids[0]] > 0
                counts[-1] += 1
            else:
                assert tuple(c.token_ids) in index, (c.token_ids, "outside the filtered support")
                counts[index[tuple(c.token_ids)]] += 1
        probs = torch.tensor([joint[k] for k in keys] + [0.0], dtype=torch.float64)
        eos_first = sum(float(p1[e]) for e in eng.eos_ids)  # a first-token EOS ends the response (no second token)
        probs[-1] = eos_first
        probs = probs / probs.sum()
        stat, df = chi_square(counts, probs)
        # six sigma: a false alarm is practically impossible; power: the untempered / unfiltered first token fails
        assert stat < six_sigma(df), (stat, df)
        firsts = torch.bincount(torch.tensor([c.token_ids[0] for c in out[i]]), minlength=len(tok)).double()
        wstat, wdf = chi_square(firsts, raw1)
        assert wstat > six_sigma(wdf), "the test cannot tell the named distribution from the raw softmax"


@pytest.mark.parametrize("sampler,merge", SAMPLERS)
def test_rows_alone_equal_the_padded_batch_and_the_learner(qwen, sampler, merge):
    """Each prompt alone (its own seed ``seed + i * n``) gives the tokens, flags and log-probs of the batch of
    four prompts of 4 .. 100 tokens (left-padded); log-probs = the learner's recomputation (fp32) and an unpadded
    forward; EOS kept as the last token and only there; "length" exactly at max_new_tokens; n draws distinct;
    greedy = argmax of the unpadded forward, and the degenerate filters (top_k=1, tiny top_p, min_p near 1) = greedy."""
    from pacs_fast.config import Config
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.trainer.batch import build_batch, engine_logprobs

    model, tok, prompts, EOS = qwen
    eng = HFEngine(model, tok, sampler=sampler, merge_rows=merge, batch_size=16)
    params = SamplingParams(n=3, temperature=0.9, top_p=0.95, top_k=40, max_new_tokens=10, seed=7,
                            return_logprobs=True)
    batched = eng.generate(prompts, params)
    for i, p in enumerate(prompts):
        alone = eng.generate([p], dataclasses.replace(params, seed=7 + 3 * i))[0]
        assert [c.token_ids for c in alone] == [c.token_ids for c in batched[i]], i
        assert [c.finish_reason for c in alone] == [c.finish_reason for c in batched[i]]
        # fp32 forwards of different batch shapes: ~1e-6 apart on logits of this size
        for a, b in zip(alone, batched[i]):
            torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-5, rtol=0)
        assert len({tuple(c.token_ids) for c in batched[i]}) == 3  # n copies are distinct draws (near-flat here)
    batch = build_batch(prompts, [[c.token_ids for c in cs] for cs in batched], [0.0] * 12, pad_id=eng.pad_id,
                        logprobs=engine_logprobs(batched))
    cfg = Config()
    learner = TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=1.0,
                           vocab_size=len(tok)).compute_logprobs(batch)
    for i, p in enumerate(prompts):
        for j, c in enumerate(batched[i]):
            r, L = 3 * i + j, len(p) + len(c.token_ids)
            assert all(t not in EOS for t in c.token_ids[:-1])
            stopped = c.token_ids[-1] in EOS
            assert c.finish_reason == ("stop" if stopped else "length")
            assert stopped or len(c.token_ids) == params.max_new_tokens
            ref = _logits(model, tok, p + c.token_ids)[len(p) - 1:-1].log_softmax(-1)
            ref = ref.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
            # fp32 log-softmax of logits ~10: 1e-5 covers its rounding; a wrong token or position is off by > 0.1
            assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=1e-5, rtol=0)
            assert torch.allclose(learner[r, len(p):L].double(), ref, atol=1e-5, rtol=0)
    greedy = eng.generate(prompts, SamplingParams(n=1, temperature=0, max_new_tokens=8))
    for p, cs in zip(prompts, greedy):
        want = []
        while len(want) < 8 and not (want and want[-1] in EOS):
            want.append(int(_logits(model, tok, p + want)[-1].argmax()))
        assert cs[0].token_ids == want
    for kw in (dict(top_k=1), dict(top_p=1e-6), dict(min_p=0.999), dict(temperature=5.0, top_k=1)):
        got = eng.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=3, **kw))
        assert [[c.token_ids for c in cs] for cs in got] == [[g[0].token_ids] * 2 for g in greedy], kw


@pytest.mark.parametrize("sampler,merge", SAMPLERS)
def test_both_stop_ids_end_a_response_kept_and_counted(qwen, sampler, merge):
    """With the EOS rows of the head made likely, responses end at <|im_end|> and at <|endoftext|> (the generation
    config's second stop id, also the pad id): the stop token is the last token, counted, "stop"; a response cut
    at max_new_tokens holds no stop id and is "length" (the overlong penalty's and DAPO's truncation flag)."""
    model, tok, prompts, EOS = qwen
    saved = model.lm_head.weight.data.clone()
    try:
        with torch.no_grad():
            h = model.model(input_ids=torch.tensor([prompts[1]])).last_hidden_state[0].mean(0)
            for e in EOS:  # a logit ~5 on the prompt's mean hidden state: each stop id a few % likely at a step
                model.lm_head.weight[e] = 5 * h / h.norm() ** 2
        eng = HFEngine(model, tok, sampler=sampler, merge_rows=merge, batch_size=16)
        out = eng.generate(prompts, SamplingParams(n=8, temperature=1.0, max_new_tokens=6, seed=1,
                                                   return_logprobs=True))
        ends = {c.token_ids[-1] for cs in out for c in cs if c.finish_reason == "stop"}
        assert ends == set(EOS), ends  # the test reaches both ids
        assert any(c.finish_reason == "length" for cs in out for c in cs)
        for cs in out:
            for c in cs:
                assert len(c.logprobs) == len(c.token_ids)
                assert all(t not in EOS for t in c.token_ids[:-1])
                if c.finish_reason == "stop":
                    assert c.token_ids[-1] in EOS
                else:
                    assert len(c.token_ids) == 6 and c.token_ids[-1] not in EOS
    finally:
        model.lm_head.weight.data.copy_(saved)
