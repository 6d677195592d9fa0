"""bench/gpu/logprob_checks.py: the float64 errors bench/gpu/logprobs.py reports at the benchmarked shape (log-probs,
entropies, dh, dW), and the SM clock reader. The reference streams the vocabulary in chunks with a hand-written
gradient; here it is held against autograd in float64 on the whole [N, V] logits (with and without Gemma 2's soft
cap, the labels falling in every chunk), and shown to see a wrong gradient."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "gpu"))
import logprob_checks as LC  # noqa: E402


def _case(n=12, h=8, v=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64) * 2.0  # logits of a few units: real softmaxes
    labels = torch.randint(0, v, (n,), generator=g)
    gl, gh = torch.randn(n, generator=g), torch.randn(n, generator=g)
    return hidden, weight, labels, gl, gh


def _autograd(hidden, weight, labels, gl, gh, softcap=None):
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    z = h @ w.T
    if softcap:
        z = softcap * torch.tanh(z / softcap)
    lsm = torch.log_softmax(z, -1)
    logp = lsm.gather(1, labels[:, None]).squeeze(1)
    ent = -(lsm.exp() * lsm).sum(-1)
    ((logp * gl.double()).sum() + (ent * gh.double()).sum()).backward()
    return logp.detach(), ent.detach(), h.grad, w.grad


@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("chunk_elems", [12 * 5, 1 << 27])  # 8 vocabulary chunks of 5 columns (the last 2), or one
def test_reference_equals_autograd_in_float64(softcap, chunk_elems):
    """Exact inputs give errors at float64 rounding (<= 1e-12 against values of order 1-10); the scales are the
    reference's largest magnitudes."""
    hidden, weight, labels, gl, gh = _case()
    logp, ent, dh, dw = _autograd(hidden, weight, labels, gl, gh, softcap)
    err = LC.reference_errors(logp, ent, hidden, weight, labels, gl, gh, dh, dw, softcap=softcap,
                              chunk_elems=chunk_elems)
    for k in ("logp", "entropy", "dh", "dW"):
        assert err[k] <= 1e-12, (k, err)
    assert err["logp_scale"] == pytest.approx(float(logp.abs().max()), rel=1e-12)
    assert err["dW_scale"] == pytest.approx(float(dw.abs().max()), rel=1e-12)
    assert err["dh_scale"] == pytest.approx(float(dh.abs().max()), rel=1e-12)


def test_reference_sees_a_wrong_value_in_every_output():
    """One entry off by 1e-3 in each checked output shows as a 1e-3 error of that output (and only that one); a
    wrong soft cap shows in all of them."""
    hidden, weight, labels, gl, gh = _case(seed=1)
    logp, ent, dh, dw = _autograd(hidden, weight, labels, gl, gh)
    outs = dict(logp=logp, entropy=ent, dh=dh, dW=dw)
    for name, t in outs.items():
        bad = {k: v.clone() for k, v in outs.items()}
        bad[name].view(-1)[7] += 1e-3
        err = LC.reference_errors(bad["logp"], bad["entropy"], hidden, weight, labels, gl, gh, bad["dh"], bad["dW"],
                                  chunk_elems=12 * 5)
        assert err[name] == pytest.approx(1e-3, rel=1e-6), (name, err)
        assert all(err[k] <= 1e-12 for k in outs if k != name), (name, err)
    capped = LC.reference_errors(logp, ent, hidden, weight, labels, gl, gh, dh, dw, softcap=3.0)
    assert min(capped[k] for k in outs) > 1e-3, capped


def test_forward_only_and_no_entropy():
    hidden, weight, labels, gl, gh = _case(seed=2)
    logp, _, _, _ = _autograd(hidden, weight, labels, gl, gh)
    err = LC.reference_errors(logp, None, hidden, weight, labels, gl, gh)
    assert set(err) == {"logp", "logp_scale"} and err["logp"] <= 1e-12


def test_sm_clock_reader(monkeypatch):
    """None without CUDA; on a GPU NVML where pynvml imports, else nvidia-smi's answer parsed (here a stand-in),
    None when nvidia-smi is missing or answers nothing readable."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert LC.sm_clock_mhz() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(LC, "_NVML", [None])  # as where pynvml is not installed
    calls = []

    class Done:
        def __init__(self, out):
            self.stdout = out

    def run(cmd, **kw):
        calls.append(cmd)
        return Done(answer[0])
    monkeypatch.setattr(LC.subprocess, "run", run)
    monkeypatch.setattr(LC.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    answer = ["1980\n"]
    assert LC.sm_clock_mhz() == 1980 and calls[-1][:3] == ["/usr/bin/nvidia-smi", "-i", "0"]
    answer[0] = "[N/A]\n"
    assert LC.sm_clock_mhz() is None
    monkeypatch.setattr(LC.shutil, "which", lambda name: None)
    assert LC.sm_clock_mhz() is None
    monkeypatch.setattr(LC, "_NVML", [lambda index: 1755])
    assert LC.sm_clock_mhz() == 1755


def test_the_benchmark_row_carries_samples_clocks_and_float64_errors():
    """bench/gpu/logprobs.py's row on the CPU (the torch path, a small shape, floors alternating): the raw samples
    of every timing, the clocks read around them (None here), and float64 errors of all four outputs at float32
    rounding."""
    import logprobs as gpu_logprobs
    floor, calls = gpu_logprobs.gemm_floor(16, 32, 300, torch.float32, "cpu", 3, 1e9)
    assert len(floor["samples_ms"]["gemm_fwd"]) == 3 and floor["sm_clock_mhz"] == [None, None]
    row = gpu_logprobs.bench_case("pacs_torch", 16, 32, 300, torch.float32, "cpu", 3, calls)
    assert {k: len(v) for k, v in row["samples_ms"].items()} == dict(gemm_fwd_adjacent=3, fwd=3, gemm4_adjacent=3,
                                                                    fwd_bwd=3)
    assert row["fwd_ms"] == pytest.approx(sorted(row["samples_ms"]["fwd"])[1], abs=1e-3)
    assert row["sm_clock_mhz"] == {"fwd": [None, None], "fwd_bwd": [None, None]}
    for k in ("logp", "entropy", "dh", "dW"):  # float32 against float64: a few ulp of the scale
        assert row["max_err"][k] <= 1e-5 * max(1.0, row["max_err"][f"{k}_scale"]), row["max_err"]


def test_a_loss_only_method_is_checked_on_its_sum_and_its_gradients():
    """Liger's FLCE and cut-cross-entropy return the summed label log-probs only: the check compares that sum and
    the gradients of it (``gl`` = 1, ``gh`` = 0), and a gradient that skips small probabilities shows."""
    hidden, weight, labels, gl, gh = _case(seed=3)
    ones, zeros = torch.ones_like(gl), torch.zeros_like(gh)
    logp, _, dh, dw = _autograd(hidden, weight, labels, ones, zeros)
    err = LC.reference_errors(logp.sum(), None, hidden, weight, labels, ones, zeros, dh, dw, chunk_elems=12 * 5)
    assert set(err) == {"loss", "loss_scale", "dh", "dh_scale", "dW", "dW_scale"}
    assert err["loss"] <= 1e-12 and err["dh"] <= 1e-12 and err["dW"] <= 1e-12
    assert err["loss_scale"] == pytest.approx(float(logp.sum().abs()), rel=1e-12)
    p = torch.softmax(hidden @ weight.T, -1)  # d sum logp / dz = onehot - p, with the entries of p < 1e-2 dropped
    dz = -torch.where(p < 1e-2, torch.zeros_like(p), p)  # (a gradient filter's approximation)
    dz[torch.arange(len(labels)), labels] += 1.0
    assert (p < 1e-2).any()
    skipped = LC.reference_errors(logp.sum(), None, hidden, weight, labels, ones, zeros, dz @ weight, dz.T @ hidden)
    assert skipped["loss"] <= 1e-12 and skipped["dW"] > 1e-4 and skipped["dh"] > 1e-4, skipped
