"""Long sequences of a packed row through SDPA, the short ones through the varlen kernel
(pacs_fast/ops/varlen_split.py).

On the CPU no varlen kernel runs, so the tests stand the CPU path (``_sdpa_groups``, exact per sequence) in for
``varlen_attn`` and check what the split does around it: which tokens reach the kernel, that the output and every
gradient equal the unsplit attention (float64: the same per-sequence softmax either way, up to summation order),
that the torch learner hands its host lengths down, and that a failing split falls back with one warning.
"""
import pytest
import torch

from pacs_fast.ops import varlen_attention as va
from pacs_fast.ops import varlen_split


def test_plan_groups_the_long_sequences_and_gathers_the_short_ones():
    lengths = (3, 10, 1, 10, 12, 2)
    p = varlen_split.plan(lengths, 10, torch.device("cpu"))
    assert [(n, st) for n, st, _ in p.long] == [(10, (3, 14)), (12, (24,))]
    assert p.long[1][2] is None and p.long[0][2].tolist() == list(range(3, 13)) + list(range(14, 24))
    assert p.short_index.tolist() == [0, 1, 2, 13, 36, 37] and p.short_cu.tolist() == [0, 3, 4, 6]
    assert p.short_max == 3
    assert sorted(p.where.tolist()) == list(range(sum(lengths)))  # every token once
    assert varlen_split.plan(lengths, 13, torch.device("cpu")) is None  # none that long
    assert varlen_split.plan(lengths, 0, torch.device("cpu")) is None  # 0: never
    assert varlen_split.plan((40,), 10, torch.device("cpu")) is None  # one sequence: nothing to split
    only_long = varlen_split.plan((10, 11), 10, torch.device("cpu"))
    assert only_long.short_index is None and len(only_long.long) == 2


def test_threshold_from_the_environment(monkeypatch):
    monkeypatch.delenv(varlen_split.LONG_ENV, raising=False)
    assert varlen_split.long_threshold() == varlen_split.DEFAULT_LONG
    monkeypatch.setenv(varlen_split.LONG_ENV, "0")
    assert varlen_split.long_threshold() == 0
    for bad in ("-1", "4k", "1.5"):
        monkeypatch.setenv(varlen_split.LONG_ENV, bad)
        with pytest.raises(ValueError, match=varlen_split.LONG_ENV):
            varlen_split.long_threshold()


@pytest.fixture
def fake_varlen(monkeypatch):
    """``varlen_attn`` picked and answered by the CPU path; records the tokens and longest length it was given."""
    seen = []

    def kernel(q, k, v, cu, max_len, scale):
        seen.append((q.shape[0], max_len, cu.tolist()))
        return va._sdpa_groups(q, k, v, cu, max_len, scale)

    monkeypatch.setattr(va, "pick_backend", lambda q, backend=None: backend or "varlen_attn")
    monkeypatch.setitem(va._KERNELS, "varlen_attn", kernel)
    monkeypatch.setattr(va, "_SPLIT_FAILED", [])
    monkeypatch.setattr(va, "_FAILED", set())
    va.KERNEL_CALLS.clear()
    return seen


def qkv(lengths, seed, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    N = sum(lengths)
    return [torch.randn(N, x, 16, generator=gen, dtype=dtype).requires_grad_() for x in (4, 2, 2)]


def test_split_equals_every_sequence_through_the_kernel(fake_varlen, monkeypatch, seed):
    monkeypatch.setenv(varlen_split.LONG_ENV, "40")
    lengths = [5, 40, 1, 40, 70, 17, 3]
    q, k, v = qkv(lengths, seed)
    cu = va.cu_seqlens(lengths)
    g = torch.randn(q.shape, dtype=q.dtype, generator=torch.Generator().manual_seed(seed + 1))
    got = va.attend(q, k, v, cu, max(lengths), lengths=lengths)
    gg = torch.autograd.grad(got, (q, k, v), g)
    # the kernel saw the short sequences only, as one sub-row with their own boundaries; the long ones went to SDPA
    assert fake_varlen == [(5 + 1 + 17 + 3, 17, [0, 5, 6, 23, 26])]
    assert va.KERNEL_CALLS == {"sdpa_long": 2, "varlen_attn": 1}  # lengths 40 (two, one call) and 70
    want = va.attend(q, k, v, cu, max(lengths), backend="sdpa")
    gw = torch.autograd.grad(want, (q, k, v), g)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (got, *gg), (want, *gw)):
        assert (a - b).abs().max() <= 1e-12 * b.abs().max(), name
    # a leak across a boundary would not pass: the first long sequence attending its short neighbour's keys
    leaky = va.attend(q[:45], k[:45], v[:45], va.cu_seqlens([45]), 45, backend="sdpa")
    assert (want[5:45] - leaky[5:]).abs().max() > 1e-3


def test_no_split_without_host_lengths_or_below_the_threshold(fake_varlen, monkeypatch):
    lengths = [5, 50, 3]
    q, k, v = qkv(lengths, 0)
    cu = va.cu_seqlens(lengths)
    monkeypatch.setenv(varlen_split.LONG_ENV, "40")
    va.attend(q, k, v, cu, 50)  # no lengths: the kernel takes the whole row
    va.attend(q, k, v, cu, 50, lengths=[5, 50, 2])  # lengths of another row (their sum differs): ignored
    monkeypatch.setenv(varlen_split.LONG_ENV, "0")
    va.attend(q, k, v, cu, 50, lengths=lengths)
    monkeypatch.setenv(varlen_split.LONG_ENV, "40")
    va.attend(q, k, v, cu, 50, lengths=lengths, backend="sdpa")  # the CPU path groups by length itself
    assert [n for n, _, _ in fake_varlen] == [58, 58, 58] and "sdpa_long" not in va.KERNEL_CALLS


def test_a_failing_split_falls_back_with_one_warning(fake_varlen, monkeypatch, capsys):
    monkeypatch.setenv(varlen_split.LONG_ENV, "40")

    def broken(*a, **k):
        raise RuntimeError("no kernel for this layout")

    monkeypatch.setattr(va, "_split", broken)
    lengths = [5, 50, 3]
    q, k, v = qkv(lengths, 1)
    cu = va.cu_seqlens(lengths)
    out = va.attend(q, k, v, cu, 50, lengths=lengths)
    va.attend(q, k, v, cu, 50, lengths=lengths)
    assert torch.equal(out, va._sdpa_groups(q, k, v, cu, 50, q.shape[-1] ** -0.5))
    assert [n for n, _, _ in fake_varlen] == [58, 58]  # whole rows through the kernel, the split not tried again
    assert capsys.readouterr().err.count("long sequences through SDPA failed") == 1


@pytest.mark.parametrize("recompute", [False, True])
def test_the_torch_learner_hands_its_lengths_down(fake_varlen, monkeypatch, seed, recompute):
    """The packed forward's host lengths reach attend() (an attribute of its cu_seqlens): with a threshold inside
    the batch's lengths the long rows go to SDPA, and log-probs and every gradient equal the unsplit forward's.
    With full recompute the recomputed layers, run by the backward outside the learner's forward, split the same
    way (a context variable would not reach them: the first version's did not)."""
    from test_varlen_attention import forward_and_grads, long_prompt_batch, small_model

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.learner.packing import restores_attention
    from pacs_fast.learner.recompute import apply_recompute
    from pacs_fast.learner.torch_learner import TorchLearner

    model = small_model().double()
    if recompute:
        apply_recompute(model, True, "full")
    batch = long_prompt_batch(torch.Generator().manual_seed(seed), [9, 120, 33, 200], 128)
    learner = TorchLearner(model, algo=AlgoConfig(), learner=LearnerConfig(packing="on", packed_attention="varlen"))
    m = batch.response_mask > 0
    out = {}
    for long in ("100", "0"):
        monkeypatch.setenv(varlen_split.LONG_ENV, long)
        va.KERNEL_CALLS.clear()
        out[long] = restores_attention(forward_and_grads)(learner, batch, AlgoConfig())
        out[long + " calls"] = dict(va.KERNEL_CALLS)
    # two layers, each: the rows of 119 and 199 fed tokens through SDPA (two lengths, two calls), the others together;
    # with recompute every layer runs again in the backward
    runs = 2 if recompute else 1
    assert out["100 calls"] == {"sdpa_long": 4 * runs, "varlen_attn": 2 * runs}
    assert out["0 calls"] == {"varlen_attn": 2 * runs}
    (lp0, e0, l0, g0), (lp1, e1, l1, g1) = out["0"], out["100"]
    assert (lp1 - lp0)[m].abs().max() <= 1e-12 and (e1 - e0)[m].abs().max() <= 1e-12 and abs(l1 - l0) <= 1e-12
    for name, grad in g0.items():
        assert (g1[name] - grad).abs().max() <= 1e-10 * grad.abs().max().clamp(min=1e-30), name


def test_the_megatron_learners_thd_boundaries_carry_their_lengths(fake_varlen, monkeypatch):
    """thd_params (the megatron learner's packed rows) hangs the host lengths on the device boundaries its core
    attention hands to attend(), which then splits (a recomputed layer gets the same PackedSeqParams)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    from pacs_fast.learner.megatron.core_attention import thd_params

    lengths = [5, 50, 3]
    params = thd_params(va.cu_seqlens(lengths), max(lengths), "cpu")
    assert getattr(params.cu_seqlens_q, va.LENGTHS_ATTR) == tuple(lengths)
    monkeypatch.setenv(varlen_split.LONG_ENV, "40")
    q, k, v = qkv(lengths, 2)
    out = va.attend(q, k, v, params.cu_seqlens_q, params.max_seqlen_q)
    assert va.KERNEL_CALLS == {"sdpa_long": 1, "varlen_attn": 1} and [n for n, _, _ in fake_varlen] == [8]
    want = va.attend(q, k, v, params.cu_seqlens_q, 50, backend="sdpa")
    assert (out - want).abs().max() <= 1e-12 * want.abs().max()
