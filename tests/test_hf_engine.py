"""HFEngine on the tiny model: counts, seeding, EOS cut, log-probs, padding, weight sync, under both
samplers ("lean" decode loop and "generate"). Lean-specific checks: tests/test_hf_sampler.py."""
import pytest
import torch

from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.rollout.base import Completion, RolloutEngine, SamplingParams
from pacs_fast.rollout.hf import SAMPLERS, HFEngine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module", params=SAMPLERS)
def engine(model_dir, request):
    return HFEngine(model_dir, batch_size=8, sampler=request.param)


def _prompts(engine, texts):
    return [engine.tokenizer(t)["input_ids"] for t in texts]


def test_counts_shapes_and_logprobs(engine, seed):
    prompts = _prompts(engine, ["1+1=", "hello, world", "x"])
    out = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=seed,
                                                  return_logprobs=True))
    assert isinstance(engine, RolloutEngine)
    assert len(out) == 3 and all(len(o) == 3 for o in out)
    for prompt, comps in zip(prompts, out):
        for j, c in enumerate(comps):
            assert isinstance(c, Completion) and 1 <= len(c.token_ids) <= 12
            assert c.finish_reason in ("stop", "length")
            assert len(c.logprobs) == len(c.token_ids) and max(c.logprobs) <= 0
            if j:
                continue
            # log-probs of the sampled tokens under the unscaled logits = a full forward pass
            seq = torch.tensor([prompt + c.token_ids])
            with torch.no_grad():
                logp = torch.log_softmax(engine.model(seq).logits[0, :, :len(engine.tokenizer)].float(), -1)
            ref = logp[len(prompt) - 1:-1].gather(1, seq[0, len(prompt):, None]).squeeze(1)
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-4, rtol=1e-4)
    no_lp = engine.generate(prompts[:1], SamplingParams(n=2, max_new_tokens=4, seed=seed))
    assert no_lp[0][0].logprobs is None


def test_seeded_reproducibility(engine, seed):
    prompts = _prompts(engine, ["abc", "2*3="])
    params = SamplingParams(n=4, temperature=1.0, top_p=0.9, max_new_tokens=10, seed=seed)
    state = torch.get_rng_state()
    a = engine.generate(prompts, params)
    assert torch.equal(state, torch.get_rng_state())  # the caller's RNG is untouched
    b = engine.generate(prompts, params)
    c = engine.generate(prompts, SamplingParams(n=4, temperature=1.0, top_p=0.9, max_new_tokens=10,
                                                seed=seed + 1))
    ids = lambda out: [x.token_ids for o in out for x in o]  # noqa: E731
    assert ids(a) == ids(b)
    assert ids(a) != ids(c)
    assert len(set(map(tuple, ids(a)))) > 1  # samples differ from each other


def test_greedy_and_left_padding(engine):
    """temperature 0 is greedy: all n samples agree, and a prompt's output does not depend on the
    longer prompts it is padded against."""
    short, long = _prompts(engine, ["7+", "a much longer prompt than the other one"])
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    alone = engine.generate([short], params)[0]
    together = engine.generate([long, short], params)[1]
    assert alone[0].token_ids == alone[1].token_ids == together[0].token_ids


def _eos_heavy(engine, scale=40.0):
    """Weights that make EOS likely: the (tied) output row of EOS scaled up."""
    name = "model.embed_tokens.weight"
    w = engine.model.state_dict()[name].clone()
    w[engine.eos_ids[0]] *= scale
    return name, w


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_eos_cut_and_finish_reason(model_dir, seed, sampler):
    eng = HFEngine(model_dir, batch_size=16, sampler=sampler)
    eng.sync_weights([_eos_heavy(eng)])
    out = eng.generate(_prompts(eng, ["q1", "q2"]), SamplingParams(n=8, temperature=1.0, max_new_tokens=16,
                                                                   seed=seed, return_logprobs=True))
    comps = [c for o in out for c in o]
    eos = set(eng.eos_ids)
    stops = [c for c in comps if c.finish_reason == "stop"]
    assert stops, "the EOS-heavy model never stopped"
    for c in comps:
        hits = [i for i, t in enumerate(c.token_ids) if t in eos]
        if c.finish_reason == "stop":
            assert hits == [len(c.token_ids) - 1]  # cut right after the first EOS, EOS kept
        else:
            assert not hits and len(c.token_ids) == 16
        assert len(c.logprobs) == len(c.token_ids)
    assert any(len(c.token_ids) < 16 for c in stops)


def test_sync_weights_changes_outputs_and_validates(model_dir):
    eng = HFEngine(model_dir, batch_size=8)
    prompts = _prompts(eng, ["12345"])
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    before = eng.generate(prompts, params)[0][0].token_ids
    state = {k: v.clone() for k, v in eng.model.state_dict().items()}
    with pytest.raises(ValueError, match="unknown parameter names"):
        eng.sync_weights([("model.norm.weight", torch.zeros(128)), ("nope.weight", torch.zeros(3))])
    with pytest.raises(ValueError, match="shape mismatch"):
        eng.sync_weights([("model.norm.weight", torch.zeros(128)), ("lm_head.weight", torch.zeros(3, 3))])
    # nothing was copied by the failed calls
    assert all(torch.equal(v, eng.model.state_dict()[k]) for k, v in state.items())
    g = torch.Generator().manual_seed(1)
    new = [(k, v + 0.5 * torch.randn(v.shape, generator=g, dtype=v.dtype)) for k, v in state.items()
           if k.endswith("mlp.down_proj.weight") or k == "model.embed_tokens.weight"]
    eng.sync_weights(new)
    after = eng.generate(prompts, params)[0][0].token_ids
    assert after != before
    eng.sync_weights(state.items())  # and back
    assert eng.generate(prompts, params)[0][0].token_ids == before


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_shares_a_live_module(model_dir, sampler):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.train()
    eng = HFEngine(model, batch_size=4, sampler=sampler)  # tokenizer found through config._name_or_path
    assert eng.model is model
    prompts = _prompts(eng, ["99"])
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)
    before = eng.generate(prompts, params)[0][0].token_ids
    assert model.training  # the trainer's mode is restored
    loss = model(torch.tensor([prompts[0] + before])).logits.float().logsumexp(-1).mean()
    loss.backward()  # the learner can still train the module (no inference tensors left behind)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(-1.0)  # the learner changes the weights in place
    assert eng.generate(prompts, params)[0][0].token_ids != before


def test_bad_inputs(engine):
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], SamplingParams())
    with pytest.raises(ValueError, match="model_or_path"):
        HFEngine(3)
    with pytest.raises(ValueError, match="batch_size"):
        HFEngine("x", batch_size=0)
    with pytest.raises(ValueError, match="sampler"):
        HFEngine(engine.model, engine.tokenizer, sampler="beam")


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_models_generation_defaults_do_not_reach_the_sampler(model_dir, tmp_path, sampler):
    """A model folder's generation_config.json (Qwen's sets top_k, top_p, temperature, repetition_penalty) must
    not change what the engine samples: transformers fills every setting a GenerationConfig leaves unset from it
    (min_p, typical_p, suppress_tokens, ...), and ``sampler="generate"`` had sampled with min_p 0.2 from such a
    file while its log-probs described the unfiltered distribution (a sweep of 2026-11-30). Here the file keeps
    only the most likely token (min_p 0.999) and forbids most ids: the samples must equal those drawn without
    the file, seed for seed."""
    import json
    import shutil
    import threading

    folder = tmp_path / "with_defaults"
    shutil.copytree(model_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps({
        "do_sample": True, "temperature": 0.3, "top_k": 5, "top_p": 0.5, "min_p": 0.999, "typical_p": 0.2,
        "repetition_penalty": 1.5, "no_repeat_ngram_size": 1, "suppress_tokens": list(range(3, 60))}))
    params = SamplingParams(n=6, temperature=1.0, max_new_tokens=8, seed=11, return_logprobs=True)
    outs = []
    for path in (model_dir, folder):
        engine = HFEngine(path, batch_size=8, sampler=sampler)
        outs.append(engine.generate(_prompts(engine, ["1+1=", "hello"]), params))
    plain, with_file = ([c.token_ids for cs in out for c in cs] for out in outs)
    assert len({tuple(t) for t in plain}) > 1  # (the plain samples differ: a min_p 0.999 filter would not)
    assert with_file == plain
    assert [c.logprobs for cs in outs[1] for c in cs] == [c.logprobs for cs in outs[0] for c in cs]
    # the model keeps its own settings after the calls, also when two threads generate with it at once
    threads = [threading.Thread(target=engine.generate, args=(_prompts(engine, ["1+1="]), params)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert engine.model.generation_config.min_p == 0.999 and engine.model.generation_config.top_k == 5
