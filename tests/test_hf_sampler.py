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
from pacs_fast.rollout import sampling
from pacs_fast.rollout.sampling import row_keys, row_uniforms, sample_tokens, top_p_remove_mask

from sampling_reference import chi_square, filtered_reference, six_sigma


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_sampler"), seed=1)


@pytest.fixture(scope="module", params=[False, True], ids=["unmerged", "merged"])
def merge(request):
    return request.param


@pytest.fixture(scope="module")
def lean(model_dir, merge):
    return HFEngine(model_dir, batch_size=64, sampler="lean", merge_rows=merge)


@pytest.fixture(scope="module", params=["lean", "lean merged", "generate"])
def peaked(model_dir, request):
    """An engine of each sampler whose next-token distributions are far from uniform (the tied
    embedding scaled up), so that temperature and the filters change them visibly."""
    sampler = request.param.split()[0]
    eng = HFEngine(model_dir, batch_size=4096, sampler=sampler, merge_rows=request.param == "lean merged")
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


@pytest.mark.parametrize("top_p", [0.95, 0.8, 0.3])
def test_top_p_on_qwen_sized_rows(seed, top_p, monkeypatch):
    """On 151,936 ids, rows whose nucleus ends within their top 256 / 4,096 logits are decided from those
    (the sort costs ~10x more there), the rest by the sort; every row's mask is the rule ``drop a token when
    the mass above it is >= top_p`` (float64 from float64 softmax) and transformers' TopPLogitsWarper, except
    for tokens whose mass above lies within 1e-5 of top_p: float32 probabilities (relative error ~2e-6)
    under both, and transformers' float32 running sum over the row (off by ~1e-6). Rows: peaked (the
    candidates settle them), heavy-tailed (4,096), flat (the sort), a tie at the nucleus's edge (the sort:
    tied tokens are ordered its way), already-removed tokens."""
    from transformers import TopPLogitsWarper

    g = torch.Generator().manual_seed(seed)
    V = 151_936
    logits = torch.randn(12, V, generator=g) * torch.tensor([1.0] * 4 + [2.0] * 4 + [1.0] * 4)[:, None]
    head = torch.randint(0, V, (12, 6), generator=g)
    logits[:8].scatter_(1, head[:8], 18 + 3 * torch.randn(8, 6, generator=g))  # peaked rows; 8-11 flat
    logits[3, head[3, :2]] = 30.0  # the two most likely tied (~1/2 each): with top_p < 1/2 the edge is in the tie
    logits[5, 1000:] = float("-inf")  # removed tokens (e.g. a padded vocabulary or top-k)
    got = top_p_remove_mask(logits, top_p)
    p = logits.double().softmax(-1)
    ordered, order = p.sort(-1, descending=True)
    above = torch.empty_like(p).scatter_(1, order, ordered.cumsum(-1) - ordered)
    clear = (above - top_p).abs() > 1e-5
    theirs = torch.isinf(TopPLogitsWarper(top_p)(None, logits.clone())) & torch.isfinite(logits)
    untied = torch.ones(12, 1, dtype=torch.bool)
    untied[3] = False  # which of two tied tokens has the other above it is the sort's choice, not the rule's
    for name, ref in (("the float64 rule", above >= top_p), ("transformers", theirs)):
        wrong = (got != ref) & clear & torch.isfinite(logits) & (untied | (name == "transformers"))
        assert not wrong.any(), (name, wrong.nonzero()[:5].tolist())
    assert torch.equal(got[3], theirs[3])  # the tie at the edge: the kept one is transformers' (its sort order)
    lse = logits.logsumexp(-1, keepdim=True)
    settled, _, _ = sampling._top_p_from_candidates(logits, lse, top_p, 4096)
    assert settled[[0, 1, 2, 4, 6]].all()  # the path that skips the sort ran for peaked rows
    if top_p < 0.5:
        assert not settled[3]  # a tie at the edge goes to the sort
    assert not settled[8:].any()  # the flat rows' nucleus holds over 4,096 tokens: the sort
    peaked = [0, 1, 2, 4, 6]  # alone, they never reach the sort (it would raise), and their masks stay the same
    monkeypatch.setattr(sampling, "_top_p_sorted", lambda *a: pytest.fail("a peaked row was sorted"))
    assert torch.equal(top_p_remove_mask(logits[peaked], top_p), got[peaked])


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
    """The largest uniforms (1 - 2**-53, and 1 itself from a caller) on rows whose last tokens are filtered
    (-inf: a padded vocabulary, or top-p): the draw is the last token with probability > 0. Before, u = 1
    (one draw in 2**24 of the old float32 grid) gave the last id, a filtered one. The rows are wider than
    one block of the two-level inverse CDF, so the draw crosses blocks whose tail is filtered."""
    g = torch.Generator().manual_seed(seed)
    V = 3 * sampling._BLOCK + 17
    logits = torch.randn(64, V, generator=g) * 3
    keep = 1 + torch.randint(0, V - 1, (64,), generator=g)  # row r: tokens >= keep[r] filtered
    keep[:4] = torch.tensor([1, sampling._BLOCK, sampling._BLOCK + 1, V - 1])  # block edges
    logits[torch.arange(V)[None, :] >= keep[:, None]] = float("-inf")
    for u in (1.0, 1 - 2.0 ** -53, 2.0 ** -53, 2.0 ** -1074):  # 2**-1074: the least float64
        for temperature, top_p in ((1.0, 1.0), (0.7, 1.0), (1.0, 0.9)):
            tok = sample_tokens(logits, temperature, top_p, torch.full((64,), u, dtype=torch.float64))
            allowed = torch.isfinite(logits)
            if top_p < 1:
                allowed &= ~top_p_remove_mask(logits / temperature, top_p)
            assert allowed.gather(1, tok[:, None]).all(), (u, temperature, top_p)
            # and the draw is at its end of the distribution: what lies beyond it (before it, for the least u)
            # is below the float64 running sums' resolution (~1e-16 a step; 2**-40 ~ 1e-12 leaves room)
            probs = (logits.double() / temperature).masked_fill(~allowed, float("-inf")).softmax(1)
            beyond = torch.arange(V)[None, :] > tok[:, None] if u > 0.5 else torch.arange(V)[None, :] < tok[:, None]
            assert float(probs.masked_fill(~beyond, 0).sum(1).max()) < 2.0 ** -40, (u, temperature, top_p)


def test_row_uniforms_stay_inside_the_unit_interval():
    """The map from the hash's 52 bits to (0, 1): exact float64 values strictly inside, the least 2**-53,
    the largest 1 - 2**-53, symmetric about 1/2, no two values alike; row_uniforms lie on that grid, and
    every bit of the 64-bit seed moves them (the old 32-bit key gave at most 2**32 values)."""
    top = 2 ** 52 - 1
    g = torch.Generator().manual_seed(0)
    k = torch.cat([torch.arange(4), top - torch.arange(4), torch.randint(0, 2 ** 62, (4096,), generator=g) >> 10])
    u = sampling.unit_interval(k)
    assert u.dtype == torch.float64 and float(u.min()) > 0 and float(u.max()) < 1
    assert float(u[0]) == 2.0 ** -53 and float(u[4]) == 1 - 2.0 ** -53
    assert torch.equal(sampling.unit_interval(top - k) + u, torch.ones_like(u))  # 1 - u, exactly
    assert torch.equal(((u * 2.0 ** 53 - 1) / 2).long(), k)  # exact: every k has its own value
    assert float(row_uniforms(row_keys([4263220347 + 10543]), 0)) < 1  # drew 1.0 on the first grid
    seeds = [2 ** 40 + 12345, 2 ** 40 + 12345 + 2 ** 32, 7, 7 + 2 ** 63]  # equal low 32 bits, pairwise
    u = row_uniforms(row_keys(seeds), 3)
    assert u.dtype == torch.float64 and u.unique().numel() == 4
    assert torch.equal((u * 2.0 ** 53 - 1) % 2, torch.zeros_like(u))  # on the grid: (2k + 1) / 2**53


def test_inverse_cdf_resolves_every_token():
    """On Qwen's vocabulary (151,936 ids) with a peaked row (one token near 1, the rest 1e-14 to 1e-7 each:
    below a float32 running sum's spacing near 1, 6e-8), each probed token's interval of u, found by
    bisection on the float64 uniforms, is its float64 probability to 2e-5 of it plus 2**-50. Why: float32
    softmax rounds ``logit - logsumexp`` (~26 here) to ~2e-6, a relative error of that size in every
    probability (the float32 log-probs the engine reports have it too), and the float32 block sums add ~1e-7;
    the absolute 2**-50 is the float64 grid of u near 1/2 (2**-53) at both ends of an interval, twice.
    The old float32 running sum gave such tokens an interval of 0 or ~6e-8 (relative errors >= 1)."""
    g = torch.Generator().manual_seed(1)
    V, probes = 151_936, 48
    logits = torch.randn(V, generator=g) * 2
    logits[77_777] = 26.0  # the head: ~1 - 2e-4
    # probes: ids spread over the vocabulary (some in the head's block), the first and last ids, the
    # head, and ids just around the head
    ids = torch.cat([torch.randint(0, V, (probes - 6,), generator=g),
                     torch.tensor([0, V - 1, 77_777, 77_776, 77_778, 77_777 - 77_777 % sampling._BLOCK])])
    rows = logits.expand(probes, V).contiguous()
    p = logits.double().softmax(0)
    assert float(p[ids].min()) < 1e-9  # the probes include tokens a float32 running sum cannot resolve

    def first_u_reaching(target: torch.Tensor) -> torch.Tensor:
        """Least u (to 2**-60) whose draw is >= target, per row (the draw is non-decreasing in u)."""
        lo, hi = torch.zeros(probes, dtype=torch.float64), torch.ones(probes, dtype=torch.float64)
        for _ in range(60):
            mid = (lo + hi) / 2
            up = sample_tokens(rows, 1.0, 1.0, mid) >= target
            hi, lo = torch.where(up, mid, hi), torch.where(up, lo, mid)
        return hi

    width = first_u_reaching(ids + 1) - first_u_reaching(ids)  # the measure of u drawing ids
    width[ids == V - 1] = 1 - first_u_reaching(ids)[ids == V - 1]  # no id V: its end is u = 1
    excess = (width - p[ids]).abs() - (2e-5 * p[ids] + 2.0 ** -50)
    worst = int(excess.argmax())
    assert float(excess.max()) <= 0, (int(ids[worst]), float(p[ids][worst]), float(width[worst]))


@pytest.mark.parametrize("temperature,top_p,top_k,min_p", [
    (0.5, 1.0, 0, 0.0), (1.3, 1.0, 0, 0.0), (1.0, 0.8, 0, 0.0), (1.0, 1.0, 4, 0.0), (1.3, 1.0, 0, 0.1),
    (1.3, 0.7, 0, 0.1), (1.0, 0.9, 6, 0.0)])
def test_first_token_distribution(peaked, seed, temperature, top_p, top_k, min_p):
    """Empirical first-token frequencies ~ softmax(logits / T) after min-p, top-k and top-p (vLLM's order;
    each filter by transformers' own warper), for each sampler, by a chi-square bound that the unfiltered
    (or untempered) distribution fails; no token outside the kept set. With min-p and top-p both, the
    order matters: transformers' (top-p, then min-p) is a different kept set here, and is never drawn from."""
    prompt = peaked.tokenizer("7*8=")["input_ids"]
    with torch.no_grad():
        logits = peaked.model(torch.tensor([prompt])).logits[0, -1, :REAL].float()
    probs = filtered_reference(logits, temperature, top_p, top_k, min_p)
    if min_p > 0 and top_p < 1:  # this case is one where the order changes the kept set
        from transformers import MinPLogitsWarper, TopPLogitsWarper
        other = MinPLogitsWarper(min_p)(None, TopPLogitsWarper(top_p)(None, (logits / temperature)[None].clone()))
        assert not torch.equal(torch.isinf(other[0]), probs == 0)
    samples = 4000
    out = peaked.generate([prompt], SamplingParams(n=samples, temperature=temperature, top_p=top_p, top_k=top_k,
                                                   min_p=min_p, max_new_tokens=1, seed=seed))[0]
    first = torch.tensor([c.token_ids[0] for c in out])
    counts = torch.bincount(first, minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0  # nothing outside the kept set
    stat, df = chi_square(counts, probs.double())
    assert stat < six_sigma(df), (stat, df)
    wrong, wdf = chi_square(counts, torch.softmax(logits, -1).double())  # T and the filters ignored
    assert wrong > six_sigma(wdf), "the test cannot tell the target from the raw softmax"
    if top_k or min_p:  # the filter changed the distribution enough for the test to see it
        unfiltered, udf = chi_square(counts, filtered_reference(logits, temperature, top_p, 0, 0.0).double())
        assert unfiltered > six_sigma(udf), "the test cannot tell the filtered from the unfiltered"


@pytest.mark.parametrize("top_k,min_p,top_p", [(1, 0.0, 1.0), (5, 0.0, 1.0), (0, 0.3, 1.0), (0, 1e-3, 0.9),
                                               (3, 0.2, 0.8), (200, 0.0, 1.0)])
def test_filters_match_transformers_in_vllm_order(seed, top_k, min_p, top_p):
    """filter_logits = transformers' MinP, TopK, TopP warpers applied one after the other (vLLM's order),
    with ties at the k-th logit and already-removed tokens; and its top-k + top-p = vLLM's own function
    (which sorts once for both), where vLLM is installed. top_k above the vocabulary is off, as in vLLM."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(64, 97, generator=g) * torch.rand(64, 1, generator=g) * 6
    logits[:4, ::3] = 0.5  # ties
    logits[4, 10:] = float("-inf")  # already-removed tokens
    got = torch.isinf(sampling.filter_logits(logits, top_p, top_k, min_p))
    ref = torch.log(_filtered_reference_rows(logits, top_p, top_k, min_p))
    assert torch.equal(got, torch.isinf(ref))
    assert (~got).sum(-1).min() >= 1
    if top_k and min_p == 0:
        vllm_sampler = pytest.importorskip("vllm.v1.sample.ops.topk_topp_sampler")
        theirs = vllm_sampler.apply_top_k_top_p_pytorch(
            logits.clone(), torch.full((64,), min(top_k, 97)), torch.full((64,), top_p) if top_p < 1 else None)
        assert torch.equal(got, torch.isinf(theirs))


def _filtered_reference_rows(logits, top_p, top_k, min_p):
    return torch.stack([filtered_reference(row, 1.0, top_p, min(top_k, row.numel()), min_p) for row in logits])


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


@pytest.mark.parametrize("merge_rows", [False, True], ids=["unmerged", "merged"])
def test_more_samples_than_the_batch_size_are_decoded_a_batch_at_a_time(model_dir, seed, merge_rows, monkeypatch):
    """--n 512 with --batch-size 64 decoded the 512 rows of a prompt as one batch (the lean sampler never split a
    prompt's samples: the eval's memory grew with n, whatever --batch-size; sweep of 2026-12-01). A prompt's rows
    are decoded batch_size at a time now, each row the same sample as in one batch (its draws are its own key's)."""
    rng = random.Random(seed)
    prompts = _random_prompts(rng, 3)
    n = 9
    big = HFEngine(model_dir, batch_size=64, sampler="lean", merge_rows=merge_rows)
    small = HFEngine(big.model, big.tokenizer, batch_size=4, sampler="lean", merge_rows=merge_rows)
    params = SamplingParams(n=n, temperature=1.0, max_new_tokens=8, seed=seed % 2**40, return_logprobs=True)
    ids = lambda out: [[c.token_ids for c in cs] for cs in out]  # noqa: E731
    whole = big.generate(prompts, params)
    name = "_merged_batch" if merge_rows else "_lean_batch"
    real, rows = getattr(HFEngine, name), []

    def spy(self, prompts_, params_, keys, limits=None):
        rows.append(len(prompts_) * params_.n)
        return real(self, prompts_, params_, keys, limits)

    monkeypatch.setattr(HFEngine, name, spy)
    parts = small.generate(prompts, params)
    assert rows == [4, 4, 1] * 3  # each prompt's 9 rows as 4 + 4 + 1
    assert ids(parts) == ids(whole) and [len(cs) for cs in parts] == [n] * 3
    # the same rows in a smaller batch: the CPU GEMM may block them otherwise, a few float32 ulps of log-probs of
    # size up to ~6 (ulp 4.8e-7): 1e-5, about 20 ulps
    for a, b in zip((c for cs in parts for c in cs), (c for cs in whole for c in cs)):
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), rtol=0, atol=1e-5)
    assert len({tuple(t) for cs in ids(whole) for t in cs}) > 3  # the samples differ: the check can fail


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


@pytest.mark.gpu
def test_sample_tokens_on_cuda_syncs_nothing_and_equals_cpu(seed):
    """The whole sampling step on CUDA (min-p, top-k, top-p by the sort there, the two-level inverse CDF)
    makes no host sync (torch's sync debug mode raises on one) and draws what the CPU draws from the same
    uniforms on 512 Qwen-sized rows (a draw could differ only where u falls within float32 rounding, ~1e-6
    of a probability, of an interval's edge: ~1e-3 over all rows)."""
    g = torch.Generator().manual_seed(seed)
    V = 151_936
    logits = torch.randn(512, V, generator=g) * 2
    logits.scatter_(1, torch.randint(0, V, (512, 8), generator=g), 14 + 2 * torch.randn(512, 8, generator=g))
    keys = row_keys([seed + r for r in range(512)])
    for temperature, top_p, top_k, min_p in ((1.0, 1.0, 0, 0.0), (0.7, 0.9, 0, 0.0), (1.0, 0.95, 50, 0.01)):
        u = row_uniforms(keys, 3)
        want = sample_tokens(logits, temperature, top_p, u, top_k, min_p)
        on_gpu, u_gpu = logits.cuda(), u.cuda()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            got = sample_tokens(on_gpu, temperature, top_p, u_gpu, top_k, min_p)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert torch.equal(got.cpu(), want), (temperature, top_p, top_k, min_p)
