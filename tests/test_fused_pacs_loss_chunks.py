"""The fused PACS loss over several token blocks and splits per row (interpreter on CPU).

kernels/pacs_loss.py streams the tokens over a ``(row block, token split)`` grid (pass A writes
per-(row, split) partial sums, pass B reduces them per group; the backward uses the same grid).
At the default launch parameters the small shapes of tests/test_fused_pacs_loss.py fit one block
per row, so here ``CONFIG`` forces tiny tiles: T = 37 spans three 16-token blocks, a program
strides over several blocks (``N_SPLIT`` below the block count), programs lie past a row's end
(``N_SPLIT`` above it), row blocks are ragged (``ROWS`` not dividing B) and pass B reduces the
splits in several ragged steps (``BLOCK_S`` = 2). References: the float64 loop of
test_fused_pacs_loss.py and the library's PyTorch path.
"""
from __future__ import annotations

import itertools
import json
import os

import pytest
import torch
import triton

from pacs_fast.algorithms.pacs import pacs_loss as torch_pacs_loss
from pacs_fast.kernels import pacs_loss as KP, pacs_loss_launch as KPL
from fused_pacs_loss_checks import (PROXIES, SCORES, TERM_KEYS, assert_close_within, assert_matches, check,
                                    grad_slack, make_inputs, run_fused, run_loop)

pytestmark = pytest.mark.interpret

# (ROWS, BLOCK_T, N_SPLIT, ONE_PASS); N_SPLIT None: cdiv(T, BLOCK_T) from launch_config. The first three
# run pass A + pass B, "one_pass" the one-launch forward (a program per group loops over the 3 blocks)
TILINGS = {
    "block_per_program": (1, 16, None, 0),   # T=37: 3 blocks, grid (B, 3)
    "strided": (2, 16, 2, 0),                # split 0 reads blocks 0 and 2, split 1 block 1
    "past_the_end": (8, 16, 5, 0),           # 3 blocks, 5 splits: splits 3, 4 store zeros; B % 8 != 0
    "one_pass": (None, 16, None, 1),         # grid (B / G,); each program: G rows x 3 blocks of 16
}


class _GridSpy:
    """Stands in for a JITFunction: records each launch grid, then launches the real kernel."""

    def __init__(self, fn, grids):
        self.fn, self.grids = fn, grids

    def __getitem__(self, grid):
        self.grids.append(tuple(grid))
        return self.fn[grid]


@pytest.fixture(params=list(TILINGS))
def tiles(request, monkeypatch):
    """Tiny tiles for both streaming kernels and pass B; yields the recorded launch grids."""
    rows, block_t, n_split, one_pass = TILINGS[request.param]
    for k, v in dict(ROWS=rows, BLOCK_T=block_t, N_SPLIT=n_split, BLOCK_S=2, ONE_PASS=one_pass).items():
        monkeypatch.setitem(KPL.CONFIG, k, v)
    grids = {"sums": [], "bwd": [], "one": []}
    monkeypatch.setattr(KP, "_pacs_sums_kernel", _GridSpy(KP._pacs_sums_kernel, grids["sums"]))
    monkeypatch.setattr(KP, "_pacs_bwd_kernel", _GridSpy(KP._pacs_bwd_kernel, grids["bwd"]))
    monkeypatch.setattr(KP, "_pacs_one_pass_kernel", _GridSpy(KP._pacs_one_pass_kernel, grids["one"]))
    return dict(name=request.param, rows=rows, block_t=block_t, n_split=n_split, one_pass=one_pass, grids=grids)


def _assert_split_grid(tiles, B, T):
    """The launches really used several splits per row (else these tests would test nothing); the
    one-launch forward: one program per group, nothing of pass A."""
    if tiles["one_pass"]:
        assert tiles["grids"]["one"] and not tiles["grids"]["sums"] and tiles["grids"]["bwd"]
        assert triton.cdiv(T, tiles["block_t"]) >= 2  # each program loops over several token blocks
        return
    assert not tiles["grids"]["one"]
    want_split = tiles["n_split"] or triton.cdiv(T, tiles["block_t"])
    want = (triton.cdiv(B, tiles["rows"]), want_split)
    assert want[1] >= 2
    assert tiles["grids"]["sums"] and all(g == want for g in tiles["grids"]["sums"])
    assert tiles["grids"]["bwd"] and all(g == want for g in tiles["grids"]["bwd"])


def _torch_loss(x, logp_ref, mask, rewards, **kw):
    loss, terms = torch_pacs_loss(x, logp_ref, mask, rewards, backend="torch", return_terms=True, **kw)
    return loss, {k: terms[k].detach() for k in TERM_KEYS}


@pytest.mark.parametrize("score,proxy", list(itertools.product(SCORES, PROXIES)))
def test_split_rows_match_float64_loop(seed, tiles, score, proxy):
    B, T, G = 12, 37, 4
    logp, logp_ref, mask, rewards = make_inputs(B, T, empty_rows=(5,))
    mask[7, :20] = False  # a row whose tokens all lie in later blocks
    kw = dict(group_size=G, beta=0.7, score=score, proxy=proxy)
    got = check(logp, logp_ref, mask, rewards, **kw)
    _assert_split_grid(tiles, B, T)
    assert torch.all(got[2][~mask] == 0) and torch.all(got[2][5] == 0)
    assert got[1]["proxy"][5] == 0 and got[1]["proxy"][7] != 0


def test_split_rows_match_torch_reference_without_mask(seed, tiles):
    B, T, G = 9, 37, 3
    logp, logp_ref, _, rewards = make_inputs(B, T, soft=True)
    for score, proxy in (("grpo", "logratio"), ("rloo", "mean_logp")):
        kw = dict(group_size=G, beta=1.3, score=score, proxy=proxy)
        got = run_fused(logp, logp_ref, None, rewards, **kw)
        x = logp.clone().requires_grad_(True)
        loss, terms = _torch_loss(x, logp_ref, None, rewards, **kw)
        loss.backward()
        ones = torch.ones(B, T, dtype=torch.bool)
        assert_matches(got, (loss.detach(), terms, x.grad), rtol=1e-5, atol=1e-6, grad_rtol=1e-4,
                       grad_atol=1e-8, ctx=dict(rewards=rewards, mask=ones, **kw))
    _assert_split_grid(tiles, B, T)


def _packed(lengths, gen=None):
    total = int(sum(lengths))
    logp = -3.0 * torch.rand(total, generator=gen)
    logp_ref = (logp + 0.3 * torch.randn(total, generator=gen)).clamp(max=0.0)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
    return logp, logp_ref, cu


@pytest.mark.parametrize("proxy", PROXIES)
@pytest.mark.parametrize("with_mask", [True, False])
def test_packed_rows_of_very_different_lengths(seed, tiles, proxy, with_mask):
    """Rows of 0, 1, 5 and 300 tokens: with BLOCK_T = 16 the 300-token row has 19 blocks, more
    than the splits sized from the average length, so its programs stride; the empty row's
    programs store zeros."""
    lengths = [0, 1, 5, 300, 17, 0, 64, 33]
    B, G = len(lengths), 4
    logp, logp_ref, cu = _packed(lengths)
    mask = (torch.rand(logp.shape) > 0.3) if with_mask else None
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    for score in ("rloo", "grpo"):
        kw = dict(group_size=G, score=score, proxy=proxy, beta=0.5, cu_seqlens=cu)
        got = check(logp, logp_ref, mask, rewards, lengths=lengths, **kw)
        assert got[1]["proxy"][0] == 0 and got[1]["proxy"][5] == 0
        assert got[2].shape == logp.shape
    if tiles["one_pass"]:  # a program per group: the 300-token row's program loops over its 19 blocks
        assert tiles["grids"]["one"][-1] == (B // G,) and not tiles["grids"]["sums"]
        return
    avg_split = tiles["n_split"] or triton.cdiv(int(sum(lengths)) // B, tiles["block_t"])
    assert tiles["grids"]["sums"][-1] == (triton.cdiv(B, tiles["rows"]), avg_split)
    assert avg_split < triton.cdiv(300, tiles["block_t"])  # the long row needs several rounds


def test_packed_equals_padded_split_rows(seed, tiles):
    """Packed rows and the same rows padded (mask = positions < length) give the same result."""
    lengths = torch.tensor([0, 1, 5, 37, 20, 37, 3, 36])
    B, T, G = 8, 37, 4
    logp, logp_ref, _, rewards = make_inputs(B, T)
    pad_mask = torch.arange(T)[None, :] < lengths[:, None]
    cu = torch.zeros(B + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lengths, 0)
    kw = dict(group_size=G, score="dr_grpo", proxy="logratio")
    padded = run_fused(logp, logp_ref, pad_mask, rewards, **kw)
    packed = run_fused(logp[pad_mask], logp_ref[pad_mask], None, rewards, cu_seqlens=cu, **kw)
    # the two layouts sum different tilings of the same tokens: fp32 rounding only, a few ulp of max|r|
    # in every proxy, which centring leaves as an absolute error on psi (as in test_packed_equals_padded)
    amp = 1.0 + float(padded[1]["proxy"].abs().max())
    torch.testing.assert_close(packed[0], padded[0], rtol=1e-6, atol=1e-7 * amp)
    for k in TERM_KEYS:
        torch.testing.assert_close(packed[1][k], padded[1][k], rtol=1e-6, atol=4e-7 * amp, msg=k)
    slack = grad_slack(padded[1], rewards, pad_mask, **kw)[pad_mask]  # dr_grpo's gradient cancels
    assert_close_within("grad", packed[2], padded[2][pad_mask], 1e-6, 1e-9, slack)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_masked_non_finite_in_a_later_block_never_leaks(seed, tiles, mask_dtype):
    B, T, G = 8, 37, 4
    logp, logp_ref, mask, rewards = make_inputs(B, T, p_mask=0.0)
    mask[:, [20, 33, 36]] = False  # positions in blocks 1 and 2 (BLOCK_T = 16)
    dirty, dirty_ref = logp.clone(), logp_ref.clone()
    dirty[:, 20] = float("nan")
    dirty[:, 36] = float("inf")
    dirty_ref[:, 33] = float("-inf")
    kw = dict(group_size=G, score="grpo", proxy="mean_logp")
    got = run_fused(dirty, dirty_ref, mask.to(mask_dtype), rewards, **kw)
    assert torch.isfinite(got[0]) and torch.isfinite(got[2]).all()
    assert torch.all(got[2][~mask] == 0)
    assert_matches(got, run_loop(logp, logp_ref, mask, rewards, **kw),
                   ctx=dict(rewards=rewards, mask=mask, **kw))
    # control: the same Inf at an unmasked position of the last block does reach the loss
    mask[3, 36] = True
    bad = run_fused(dirty, dirty_ref, mask.to(mask_dtype), rewards, **kw)
    assert torch.isnan(bad[0]) and torch.isinf(bad[1]["proxy"][3])
    assert torch.isfinite(bad[1]["proxy"][4:]).all()  # other groups unaffected


def test_float64_split_rows_match_the_loop_to_1e12(seed, tiles):
    B, T, G = 12, 37, 4
    logp, logp_ref, mask, rewards = make_inputs(B, T, soft=True, dtype=torch.float64)
    for score, proxy in itertools.product(SCORES, PROXIES):
        kw = dict(group_size=G, score=score, proxy=proxy, beta=0.3)
        got = run_fused(logp, logp_ref, mask, rewards, **kw)
        assert got[0].dtype == torch.float64 and got[2].dtype == torch.float64
        # fp64 accumulation of <= 37 terms: errors ~1e-16 relative; 1e-12 leaves room for grpo's
        # 1/std amplification and nothing for an fp32 rounding anywhere (~1e-7)
        assert_matches(got, run_loop(logp, logp_ref, mask, rewards, **kw),
                       rtol=1e-12, atol=1e-13, grad_rtol=1e-10, grad_atol=1e-15)
    _assert_split_grid(tiles, B, T)


def test_float64_packed_split_rows(seed, tiles):
    lengths = [0, 1, 5, 300]
    logp, logp_ref, cu = _packed(lengths)
    logp, logp_ref = logp.double(), logp_ref.double()
    mask = torch.rand(logp.shape) > 0.2
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0], dtype=torch.float64)
    kw = dict(group_size=2, score="rloo", proxy="logratio", cu_seqlens=cu)
    got = run_fused(logp, logp_ref, mask, rewards, **kw)
    assert_matches(got, run_loop(logp, logp_ref, mask, rewards, lengths=lengths, **kw),
                   rtol=1e-12, atol=1e-13, grad_rtol=1e-10, grad_atol=1e-15)


def test_bf16_split_rows(seed, tiles):
    B, T, G = 12, 37, 3
    logp, logp_ref, mask, rewards = make_inputs(B, T, dtype=torch.bfloat16)
    for score in ("rloo", "grpo", "naive"):
        kw = dict(group_size=G, score=score)
        got = run_fused(logp, logp_ref, mask, rewards, **kw)
        assert got[2].dtype == torch.bfloat16 and got[0].dtype == torch.float32
        # inputs are bf16-valued in both; sums in fp32 vs fp64 (as in test_bf16_logp), and only
        # the gradient is rounded to bf16 (relative 2**-8 = 3.9e-3 < 1e-2)
        assert_matches(got, run_loop(logp, logp_ref, mask, rewards, **kw), grad_rtol=1e-2,
                       grad_atol=1e-5, ctx=dict(rewards=rewards, mask=mask, **kw))
    _assert_split_grid(tiles, B, T)


def test_split_rows_are_deterministic(tiles):
    logp, logp_ref, mask, rewards = make_inputs(16, 37, gen=torch.Generator().manual_seed(3))
    kw = dict(group_size=8, score="grpo")
    a = run_fused(logp, logp_ref, mask, rewards, **kw)
    b = run_fused(logp, logp_ref, mask, rewards, **kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    assert all(torch.equal(a[1][k], b[1][k]) for k in TERM_KEYS)


def test_tilings_agree_with_one_block_per_row(seed, monkeypatch):
    """Every tiling of the same inputs gives the same result as the default one (rounding only)."""
    B, T, G = 12, 37, 4
    logp, logp_ref, mask, rewards = make_inputs(B, T)
    kw = dict(group_size=G, score="rloo", proxy="mean_logp")
    base = run_fused(logp, logp_ref, mask, rewards, **kw)
    for rows, block_t, n_split, one_pass in TILINGS.values():
        for k, v in dict(ROWS=rows, BLOCK_T=block_t, N_SPLIT=n_split, BLOCK_S=2, ONE_PASS=one_pass).items():
            monkeypatch.setitem(KPL.CONFIG, k, v)
        got = run_fused(logp, logp_ref, mask, rewards, **kw)
        # fp32 sums of <= 37 terms of size <= 4 in a different order: |diff| ~ 37 * 4 * 6e-8
        torch.testing.assert_close(got[0], base[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got[1]["proxy"], base[1]["proxy"], rtol=1e-6, atol=1e-5)
        assert_close_within("grad", got[2], base[2], 1e-5, 1e-9, grad_slack(base[1], rewards, mask, **kw))


# ---- grid sizing at the shapes (pure Python: what a GPU launch would get) ---------------

@pytest.fixture
def builtin_policy(monkeypatch):
    """The built-in launch policy (a measured one in kernels/tuned/ moves these numbers on purpose)."""
    from pacs_fast.kernels import tuning
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)


@pytest.mark.parametrize("B,T", [(1024, 4096), (8192, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("kernel", ["fwd_sums", "bwd"])
def test_streaming_grid_fills_the_gpu(B, T, dtype, kernel, builtin_policy):
    """>= 4 programs per SM of a 132-SM GPU, each moving >= 8 KB, every token covered once."""
    cfg = KPL.launch_config(kernel, B=B, T=T, G=8, dtype=dtype, arch=90)
    elt = torch.empty((), dtype=dtype).element_size()
    per_token = 2 * elt + 1 if kernel == "fwd_sums" else elt + 1
    programs = triton.cdiv(B, cfg["ROWS"]) * cfg["N_SPLIT"]
    assert programs >= 4 * 132, cfg
    assert cfg["ROWS"] * cfg["BLOCK_T"] * per_token >= 8 * 1024, cfg
    assert cfg["N_SPLIT"] * cfg["BLOCK_T"] >= T and (cfg["N_SPLIT"] - 1) * cfg["BLOCK_T"] < T, cfg
    assert cfg["ROWS"] * cfg["BLOCK_T"] <= 4096 and cfg["N_SPLIT"] <= 65535


@pytest.mark.parametrize("G", [1, 2, 8, 16, 64, 1024])
def test_group_pass_tile(G, builtin_policy):
    cfg = KPL.launch_config("fwd", B=8192, T=1024, G=G, dtype=torch.float32, arch=90)
    assert cfg["BLOCK_G"] >= G and cfg["BLOCK_G"] * cfg["BLOCK_S"] <= 2048 and cfg["BLOCK_S"] >= 2


@pytest.mark.parametrize("B,T,G,dtype,one", [
    (1024, 4096, 8, torch.float32, 1),     # 128 groups of 295 KB: both rules
    (8192, 1024, 8, torch.float32, 1),     # 1,024 groups
    (8192, 1024, 64, torch.bfloat16, 1),   # BLOCK_G = 64, the most the one-pass kernel takes
    (64, 512, 16, torch.float64, 1),       # 4 groups of 139 KB: small enough for one program each
    (16, 32768, 16, torch.float32, 0),     # one group of 4.7 MB: one program would stream it alone
    (8192, 1024, 128, torch.float32, 0),   # BLOCK_G = 128 > MAX_BLOCK_G
    (8192, 1024, 1024, torch.float32, 0),
])
def test_one_pass_where_each_group_is_small_or_the_groups_fill_the_gpu(B, T, G, dtype, one, builtin_policy):
    """The one-launch forward (a program per group; one launch fewer on the host) where a group is at most
    512 KB of inputs or there are >= 66 groups (half of 132 SMs), and G <= 64; else pass A + pass B."""
    cfg = KPL.launch_config("fwd_one", B=B, T=T, G=G, dtype=dtype, arch=90, sm_count=132)
    assert cfg["ONE_PASS"] == one, cfg
    elt = torch.empty((), dtype=dtype).element_size()
    if one:  # its tile: about 16 KB of inputs per step (the power of two above 16 KB / bytes per token)
        assert cfg["BLOCK_G"] >= G and cfg["BLOCK_G"] * cfg["BLOCK_T"] * (2 * elt + 1) <= 2 * 16 * 1024, cfg
        assert 16 <= cfg["BLOCK_T"] <= triton.next_power_of_2(T)


def test_one_pass_override_and_its_bad_values(builtin_policy, monkeypatch):
    from pacs_fast.kernels import tuning
    kw = dict(B=16, T=32768, G=16, dtype=torch.float32, arch=90, sm_count=132)
    assert KPL.launch_config("fwd_one", **kw)["ONE_PASS"] == 0
    monkeypatch.setitem(KPL.CONFIG, "ONE_PASS", 1)
    assert KPL.launch_config("fwd_one", **kw)["ONE_PASS"] == 1
    for bad in (2, -1, "yes", 0.5):
        monkeypatch.setitem(KPL.CONFIG, "ONE_PASS", bad)
        with pytest.raises(tuning.LaunchConfigError, match="ONE_PASS"):
            KPL.launch_config("fwd_one", **kw)
    monkeypatch.setitem(KPL.CONFIG, "ONE_PASS", None)
    monkeypatch.setitem(KPL.POLICY, "fwd_one", {"MAX_GROUP_BYTES": 8 << 20})  # 4.7 MB groups now pass
    assert KPL.launch_config("fwd_one", **kw)["ONE_PASS"] == 1
    monkeypatch.setitem(KPL.POLICY, "fwd_one", {"MAX_BLOCK_G": 48})
    with pytest.raises(tuning.LaunchConfigError, match="MAX_BLOCK_G"):
        KPL.launch_config("fwd_one", **kw)


def test_launch_config_memo_follows_every_input(builtin_policy, monkeypatch, tmp_path):
    """launch_config is memoised (host time on every call); the memo must never return a stale
    answer when an override, the policy, the tuned table or a module knob changes."""
    from pacs_fast.kernels import tuning
    kw = dict(B=1024, T=4096, G=8, dtype=torch.float32, arch=90, sm_count=132)
    base = KPL.launch_config("bwd", **kw)
    base["ROWS"] = -1  # a caller mutating its copy does not reach the memo
    assert KPL.launch_config("bwd", **kw)["ROWS"] > 0
    monkeypatch.setitem(KPL.CONFIG, "BLOCK_T", 256)
    assert KPL.launch_config("bwd", **kw)["BLOCK_T"] == 256
    monkeypatch.setitem(KPL.CONFIG, "BLOCK_T", None)
    monkeypatch.setitem(KPL.POLICY, "bwd", {"num_warps_large": 2, "num_warps": 2})
    assert KPL.launch_config("bwd", **kw)["num_warps"] == 2
    monkeypatch.setitem(KPL.POLICY, "bwd", {})
    assert KPL.launch_config("fwd_sums", **kw)["N_SPLIT"] == 2  # fp32 pass A: 2048-token tiles, T = 4096
    monkeypatch.setattr(KPL, "MAX_SPLIT", 1)
    assert KPL.launch_config("fwd_sums", **kw)["N_SPLIT"] == 1
    monkeypatch.setattr(KPL, "MAX_SPLIT", 1024)
    # a measured table appears, then changes: each read follows the file
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    table = {"schema": tuning.SCHEMA, "arch": 90, "kernels": {
        "pacs_loss.bwd.32": {"config": dict(KPL.BUILTIN_POLICY["bwd"], num_warps=1, num_warps_large=1)}}}
    (tmp_path / "sm_90.json").write_text(json.dumps(table))
    assert KPL.launch_config("bwd", **kw)["num_warps"] == 1
    table["kernels"]["pacs_loss.bwd.32"]["config"].update(num_warps=16, num_warps_large=16)
    path = tmp_path / "sm_90.json"
    path.write_text(json.dumps(table))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # a distinct stamp
    assert KPL.launch_config("bwd", **kw)["num_warps"] == 16
