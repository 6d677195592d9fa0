"""HFEngine's lean decode loop (``sampler="lean"``, with and without merged rows) against
``model.generate`` and independent references: greedy equality, top-p mask = transformers'
TopPLogitsWarper, sampling distribution, log-probs = a full forward, chunking / length bucketing,
reproducibility, fewer decoded rows when samples agree."""
import math
import random

import pytest
import torch

from pacs_fast.data.tiny import build_char_tokenizer, make_tiny_model
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.rollout.hf import _MIN_BUCKET_ROWS, HFEngine
from pacs_fast.rollout.sampling import row_keys, row_uniforms, sample_tokens, top_p_remove_mask


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_sampler"), seed=1)


@pytest.fixture(scope="module", params=[False, True], ids=["unmerged", "merged"])
def merge(request):
    return request.param


@pytest.fixture(scope="module")
def lean(model_dir, merge):
    return HFEngine(model_dir, batch_size=64, sampler="lean", merge_rows=merge)


@pytest.fixture(scope="module")
def peaked(model_dir, merge):
    """An engine whose next-token distributions are far from uniform (the tied embedding scaled
    up), so that temperature and top-p change them visibly."""
    eng = HFEngine(model_dir, batch_size=4096, sampler="lean", merge_rows=merge)
    name = "model.embed_tokens.weight"
    eng.sync_weights([(name, eng.model.state_dict()[name] * 2.0)])
    return eng


def _random_prompts(rng, count, lo=1, hi=12):
    return [[rng.randrange(3, 99) for _ in range(rng.randrange(lo, hi + 1))] for _ in range(count)]


# The tiny model's LM head has 128 rows for 99 tokenizer ids: the engines' distribution is over
# the first REAL rows only (padded rows masked, tests/test_padded_vocab.py).
REAL = len(build_char_tokenizer())


def _full_forward_logp(model, prompt, response):
    """log-softmax of the raw logits (real ids) at each response token, from one full forward (no cache)."""
    seq = torch.tensor([prompt + response])
    with torch.no_grad():
        logp = torch.log_softmax(model(seq).logits[0, :, :REAL].float(), -1)
    return logp[len(prompt) - 1:-1].gather(1, seq[0, len(prompt):, None]).squeeze(1)


def test_greedy_lean_equals_generate(model_dir, seed, merge):
    """Token for token (and log-probs to 1e-5) on left-padded prompts of many lengths with n > 1,
    plus a run of equal-length prompts big enough to decode in its own unpadded (mask-free) chunk."""
    rng = random.Random(seed)
    n = 4
    same_len = _random_prompts(rng, _MIN_BUCKET_ROWS // n, lo=7, hi=7)
    prompts = _random_prompts(rng, 9) + same_len
    rng.shuffle(prompts)
    lean = HFEngine(model_dir, batch_size=512, sampler="lean", merge_rows=merge)
    gen = HFEngine(lean.model, lean.tokenizer, batch_size=512, sampler="generate")
    chunks = lean._lean_chunks(prompts, n)
    assert any({len(prompts[i]) for i in c} == {7} and len(c) * n >= _MIN_BUCKET_ROWS for c in chunks)
    assert any(len({len(prompts[i]) for i in c}) > 1 for c in chunks)  # and a padded chunk
    params = SamplingParams(n=n, temperature=0.0, max_new_tokens=10, return_logprobs=True)
    a, b = lean.generate(prompts, params), gen.generate(prompts, params)
    assert len(a) == len(b) == len(prompts)
    for ca, cb in zip(a, b):
        assert len(ca) == len(cb) == n
        for x, y in zip(ca, cb):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason and x.text == y.text
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("compact_fraction", [1e-9, 2.0])  # drop finished rows at once / never
def test_rows_ending_at_different_steps(model_dir, seed, monkeypatch, compact_fraction, merge):
    """Many EOS ids so rows stop at different steps while the lean loop drops finished rows from
    its batch: each response is still cut at its first EOS, and its log-probs equal a full
    forward over its own prompt + response (a row mixed up with another's cache would not)."""
    import pacs_fast.rollout.lean_decode as lean_decode

    monkeypatch.setattr(lean_decode, "_COMPACT_FRACTION", compact_fraction)
    rng = random.Random(seed)
    prompts = _random_prompts(rng, 6)
    eng = HFEngine(model_dir, batch_size=256, sampler="lean", merge_rows=merge)
    eng.eos_ids = [eng.eos_ids[0]] + rng.sample(range(3, 99), 8)
    out = eng.generate(prompts, SamplingParams(n=4, temperature=1.0, max_new_tokens=14, seed=seed,
                                               return_logprobs=True))
    eos = set(eng.eos_ids)
    assert len({len(c.token_ids) for cs in out for c in cs}) >= 3, "rows did not stop at different steps"
    for prompt, comps in zip(prompts, out):
        for c in comps:
            hits = [i for i, t in enumerate(c.token_ids) if t in eos]
            assert hits == ([len(c.token_ids) - 1] if c.finish_reason == "stop" else [])
            ref = _full_forward_logp(eng.model, prompt, c.token_ids)
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("top_p", [1.0, 0.999, 0.9, 0.5, 0.1, 1e-6, 1e-9])
def test_top_p_mask_matches_transformers(top_p, seed):
    from transformers import TopPLogitsWarper

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(64, 97, generator=g) * torch.rand(64, 1, generator=g) * 6
    logits[:4, ::3] = 0.5  # ties
    logits[4, 10:] = float("-inf")  # already-removed tokens
    ref = torch.isinf(TopPLogitsWarper(top_p)(None, logits.clone())) & ~torch.isinf(logits)
    got = top_p_remove_mask(logits, top_p) & ~torch.isinf(logits)
    assert torch.equal(got, ref)
    assert (~top_p_remove_mask(logits, top_p)).sum(-1).min() >= 1  # at least one token kept


def test_sample_tokens_greedy_and_support(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(256, 50, generator=g) * 3
    assert torch.equal(sample_tokens(logits, 0.0, 1.0), logits.argmax(-1))
    drop = top_p_remove_mask(logits / 0.8, 0.7)
    for _ in range(5):
        tok = sample_tokens(logits, 0.8, 0.7)
        assert tok.dtype == torch.long and tok.shape == (256,)
        assert not drop.gather(1, tok[:, None]).any()  # never a filtered token
    onehot = torch.full((3, 50), float("-inf"))
    onehot[torch.arange(3), torch.tensor([0, 17, 49])] = 0.0  # only one finite logit per row (edges too)
    assert sample_tokens(onehot, 1.0, 1.0).tolist() == [0, 17, 49]


def test_a_uniform_at_the_top_never_draws_a_filtered_token(seed):
    """The largest uniforms (1 - 2**-24, and 1 itself from a caller) on rows whose last tokens are filtered
    (-inf: a padded vocabulary, or top-p): the draw is the last token with probability > 0. Before, u = 1
    (one row_uniforms draw in 2**24) gave the last id, a filtered one."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(64, 40, generator=g) * 3
    keep = 1 + torch.randint(0, 39, (64,), generator=g)  # row r: tokens >= keep[r] filtered
    logits[torch.arange(40)[None, :] >= keep[:, None]] = float("-inf")
    for u in (1.0, 1 - 2.0 ** -24, 2.0 ** -149):  # 2**-149: the least float32 (a cdf never lies below it)
        for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (1.0, 0.9)):
            tok = sample_tokens(logits, temperature, top_p, torch.full((64,), u))
            allowed = torch.isfinite(logits)
            if top_p < 1:
                allowed &= ~top_p_remove_mask(logits / temperature, top_p)
            assert allowed.gather(1, tok[:, None]).all(), (u, temperature, top_p)
            # and the draw is at its end of the distribution: what lies beyond it (before it, for the least u)
            # is below float32's resolution of the cumulative probability
            probs = (logits.double() / temperature).masked_fill(~allowed, float("-inf")).softmax(1)
            beyond = torch.arange(40)[None, :] > tok[:, None] if u > 0.5 else torch.arange(40)[None, :] < tok[:, None]
            assert float(probs.masked_fill(~beyond, 0).sum(1).max()) < 2.0 ** -22, (u, temperature, top_p)


def test_row_uniforms_stay_inside_the_unit_interval(monkeypatch):
    """Every value the hash can give, mapped: strictly inside (0, 1) in float32, symmetric about 1/2, and
    the row that drew 1.0 before (CI seed 4263220347, row 10543, step 0) draws below 1."""
    assert float(row_uniforms(row_keys([4263220347 + 10543]), 0)) < 1
    from pacs_fast.rollout import sampling
    calls, real = [], sampling._mix32
    every_top_23_bits = torch.arange(0, 2 ** 32, 2 ** 9, dtype=torch.int64)
    monkeypatch.setattr(sampling, "_mix32", lambda x: calls.append(1) or (every_top_23_bits if len(calls) == 2
                                                                         else real(x)))  # the second hash
    u = row_uniforms(torch.zeros(2 ** 23, dtype=torch.int64), 0)
    assert len(calls) == 2
    assert u.dtype == torch.float32 and float(u.min()) > 0 and float(u.max()) < 1
    assert u.unique().numel() == 2 ** 23  # no two hash values share a float
    assert torch.equal(u + u.flip(0), torch.ones_like(u))


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic over bins with expected count >= 5 (the rest pooled into one bin)."""
    total = counts.sum()
    expected = probs * total
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = (((obs - exp) ** 2)[keep] / exp[keep]).sum().item()
    return stat, int(keep.sum()) - 1


@pytest.mark.parametrize("temperature,top_p", [(0.5, 1.0), (1.3, 1.0), (1.0, 0.8)])
def test_first_token_distribution(peaked, seed, temperature, top_p):
    """Empirical first-token frequencies ~ softmax(logits / T) (top-p renormalised), by a chi-square
    bound that the untempered / unfiltered distribution would fail."""
    from transformers import TopPLogitsWarper

    prompt = peaked.tokenizer("7*8=")["input_ids"]
    with torch.no_grad():
        logits = peaked.model(torch.tensor([prompt])).logits[0, -1, :REAL].float()
    scaled = logits / temperature
    if top_p < 1:
        scaled = TopPLogitsWarper(top_p)(None, scaled[None].clone())[0]
    probs = torch.softmax(scaled, -1)
    samples = 4000
    out = peaked.generate([prompt], SamplingParams(n=samples, temperature=temperature, top_p=top_p,
                                                   max_new_tokens=1, seed=seed))[0]
    first = torch.tensor([c.token_ids[0] for c in out])
    counts = torch.bincount(first, minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0  # nothing outside the nucleus
    stat, df = _chi_square(counts, probs.double())
    bound = df + 6 * math.sqrt(2 * df)  # ~6 sigma: a false alarm is practically impossible
    assert stat < bound, (stat, df)
    wrong, wdf = _chi_square(counts, torch.softmax(logits, -1).double())  # T and top-p ignored
    assert wrong > wdf + 6 * math.sqrt(2 * wdf), "the test cannot tell the target from the raw softmax"


def test_logprobs_equal_full_forward(lean, seed):
    """Recorded log-probs = log-softmax of an independent full forward's raw (T=1) logits at the
    sampled tokens, for every sample, even when sampling at another temperature / with top-p."""
    rng = random.Random(seed)
    prompts = _random_prompts(rng, 5)
    out = lean.generate(prompts, SamplingParams(n=3, temperature=0.7, top_p=0.9, max_new_tokens=9,
                                                seed=seed, return_logprobs=True))
    for prompt, comps in zip(prompts, out):
        for c in comps:
            assert len(c.logprobs) == len(c.token_ids)
            ref = _full_forward_logp(lean.model, prompt, c.token_ids)
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch_size", [1, 2, 5, 7])
def test_chunking_keeps_prompts_and_order(model_dir, lean, seed, batch_size):
    """batch_size below n and not a multiple of it: still n samples per prompt, in prompt order,
    the same greedy outputs as one big batch, and seeded calls reproducible."""
    rng = random.Random(seed)
    prompts = _random_prompts(rng, 7)
    small = HFEngine(lean.model, lean.tokenizer, batch_size=batch_size, sampler="lean", merge_rows=lean.merge_rows)
    n = 3
    assert all(len(c) == max(1, batch_size // n) for c in small._lean_chunks(prompts, n)[:-1])
    greedy = SamplingParams(n=n, temperature=0.0, max_new_tokens=6)
    ids = lambda out: [[c.token_ids for c in cs] for cs in out]  # noqa: E731
    assert ids(small.generate(prompts, greedy)) == ids(lean.generate(prompts, greedy))
    sampled = SamplingParams(n=n, temperature=1.0, max_new_tokens=6, seed=seed)
    a, b = small.generate(prompts, sampled), small.generate(prompts, sampled)
    assert [len(cs) for cs in a] == [n] * len(prompts)
    assert ids(a) == ids(b)


@pytest.mark.parametrize("sampler,merge_rows", [("lean", False), ("lean", True), ("generate", None)],
                         ids=["lean_unmerged", "lean_merged", "generate"])
def test_a_prompts_samples_do_not_depend_on_the_call(model_dir, seed, sampler, merge_rows):
    """Sample j of prompt i is seeded with s + i*n + j: a data-parallel split of the prompts (each
    share called with its first prompt's seed, as the trainer's loop does) and another batch size
    give the one-call samples token for token. Before, one generator per call made a prompt's
    samples depend on its share, and megatron with two data-parallel ranks did not reproduce the
    one-process run (issue 41)."""
    rng = random.Random(seed)
    prompts = _random_prompts(rng, 7)
    n, s = 3, seed % 2**40
    big = HFEngine(model_dir, batch_size=64, sampler=sampler, merge_rows=merge_rows)
    small = HFEngine(big.model, big.tokenizer, batch_size=4, sampler=sampler, merge_rows=merge_rows)
    params = lambda first: SamplingParams(n=n, temperature=1.0, top_p=0.95, max_new_tokens=8,  # noqa: E731
                                          seed=s + first * n, return_logprobs=True)
    ids = lambda out: [[c.token_ids for c in cs] for cs in out]  # noqa: E731
    whole = ids(big.generate(prompts, params(0)))
    assert ids(big.generate(prompts[:3], params(0))) + ids(big.generate(prompts[3:], params(3))) == whole
    assert ids(small.generate(prompts, params(0))) == whole
    assert len({tuple(t) for cs in whole for t in cs}) > len(prompts)  # the samples differ: the check can fail


def test_row_uniforms_are_uniform_and_independent(seed):
    """The lean sampler's per-row uniforms: Kolmogorov-Smirnov distance to U(0, 1) and correlations
    between neighbouring rows (consecutive seeds) and consecutive steps within ~5 standard errors."""
    rows = 20_000
    keys = row_keys([seed + r for r in range(rows)])
    u = torch.stack([row_uniforms(keys, t) for t in range(3)]).double()  # [steps, rows]
    assert bool(((u > 0) & (u < 1)).all())
    x = u.flatten().sort().values
    grid = torch.arange(1, x.numel() + 1, dtype=torch.float64) / x.numel()
    assert (x - grid).abs().max() < 2.0 / math.sqrt(x.numel())  # KS: p ~ 1e-3.5 at 1.95/sqrt(N)

    def corr(a, b):
        a, b = a - a.mean(), b - b.mean()
        return float((a * b).sum() / (a.norm() * b.norm()))
    bound = 5 / math.sqrt(rows)
    assert abs(corr(u[0, :-1], u[0, 1:])) < bound and abs(corr(u[0], u[1])) < bound and abs(corr(u[1], u[2])) < bound
    assert torch.equal(row_uniforms(row_keys([seed + 5]), 1), row_uniforms(keys[5:6], 1))  # a row's draw is its own


def test_lean_chunks_bucket_equal_lengths(lean):
    n = 8
    per = _MIN_BUCKET_ROWS // n
    prompts = [[5] * 3] * per + [[5] * 4] + [[5] * 6] * 2 + [[5] * 9] * (per + 1)
    chunks = lean._lean_chunks(prompts, n)
    assert sorted(i for c in chunks for i in c) == list(range(len(prompts)))  # a partition
    assert all(len(c) <= lean.batch_size // n for c in chunks)
    lengths = [sorted({len(prompts[i]) for i in c}) for c in chunks]
    assert [3] in lengths and [9] in lengths and [4, 6] in lengths  # small runs share a padded chunk


def test_stops_early_when_all_rows_ended(model_dir, seed, merge):
    """Every token an EOS: every row stops at its first token and the loop ends right after the
    prefill (no decode forward)."""
    eng = HFEngine(model_dir, batch_size=16, sampler="lean", merge_rows=merge)
    eng.eos_ids = list(range(eng.model.config.vocab_size))
    calls = []
    hook = eng.model.register_forward_hook(lambda *args: calls.append(1))
    try:
        out = eng.generate([[5, 6], [7]], SamplingParams(n=4, temperature=1.0, max_new_tokens=50, seed=seed,
                                                         return_logprobs=True))
    finally:
        hook.remove()
    assert len(calls) == 1  # the two prompts share one chunk: one prefill, no decode step
    for c in (c for cs in out for c in cs):
        assert len(c.token_ids) == 1 and c.finish_reason == "stop" and len(c.logprobs) == 1


def test_several_eos_ids(model_dir, seed, merge):
    """Any id of ``eos_ids`` ends a response (the first one, kept)."""
    eng = HFEngine(model_dir, batch_size=64, sampler="lean", merge_rows=merge)
    eng.eos_ids = [eng.eos_ids[0], 40, 41, 42, 43, 44]
    out = eng.generate([[9, 10, 11]], SamplingParams(n=48, temperature=1.5, max_new_tokens=30, seed=seed))[0]
    eos = set(eng.eos_ids)
    hits = 0
    for c in out:
        pos = [i for i, t in enumerate(c.token_ids) if t in eos]
        assert pos == ([len(c.token_ids) - 1] if c.finish_reason == "stop" else [])
        hits += bool(pos) and c.token_ids[-1] != eng.eos_ids[0]
    assert hits, "no response ended on an added EOS id"


def test_cache_without_repeat_is_refused(lean):
    class NoCache(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, **kwargs):
            out = self.inner(**kwargs)
            out.past_key_values = None
            return out

    eng = HFEngine(NoCache(lean.model), lean.tokenizer, sampler="lean", merge_rows=lean.merge_rows)
    with pytest.raises(RuntimeError, match="sampler='generate'"):
        eng.generate([[5, 6]], SamplingParams(n=2, max_new_tokens=3))


def test_merged_rows_decode_fewer_rows(model_dir, seed):
    """Merged: greedy decoding never splits a prompt's n rows (each forward has one row per
    prompt); sampling from a peaked model splits them only as the samples differ (fewer rows
    decoded than unmerged), and the default merges on CPU."""
    rng = random.Random(seed)
    prompts = _random_prompts(rng, 5, lo=3, hi=3)
    eng = HFEngine(model_dir, batch_size=64, sampler="lean")
    assert eng.merge_rows is None  # default: merged on CPU
    sizes = []
    hook = eng.model.register_forward_hook(lambda m, a, kw, out: sizes.append(kw["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        out = eng.generate(prompts, SamplingParams(n=6, temperature=0.0, max_new_tokens=5))
        assert sizes and max(sizes) <= len(prompts)
        assert all(len({tuple(c.token_ids) for c in cs}) == 1 for cs in out)
        name = "model.embed_tokens.weight"
        eng.sync_weights([(name, eng.model.state_dict()[name] * 4.0)])  # peaked: samples often agree
        sizes.clear()
        out = eng.generate(prompts, SamplingParams(n=6, temperature=1.0, max_new_tokens=5, seed=seed))
        distinct = sum(len({tuple(c.token_ids[:k]) for c in cs}) for cs in out for k in range(1, 5))
        assert sum(sizes[1:]) <= distinct < len(prompts) * 6 * 4  # one decoded row per distinct prefix
    finally:
        hook.remove()


@pytest.mark.gpu
def test_greedy_lean_equals_generate_cuda(model_dir, seed):
    rng = random.Random(seed)
    prompts = _random_prompts(rng, 6)
    lean = HFEngine(model_dir, batch_size=64, device="cuda", sampler="lean")
    gen = HFEngine(lean.model, lean.tokenizer, batch_size=64, sampler="generate")
    params = SamplingParams(n=2, temperature=0.0, max_new_tokens=11, return_logprobs=True)
    a, b = lean.generate(prompts, params), gen.generate(prompts, params)
    for x, y in zip((c for cs in a for c in cs), (c for cs in b for c in cs)):
        assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=1e-4)
