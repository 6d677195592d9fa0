"""Issue 39's "a forced failure of every fast kernel still trains (fallback, one warning)", the cases
tests/test_kernel_fallback_training.py does not train through: the trainer (``pacs_fast.train``'s ``main``, the torch
learner, ``backend="auto"`` taking the Triton kernels under the interpreter, as on CUDA) with

- ``PACS_FAST_KERNELS=safe`` on a simulated Hopper whose ``CONFIG`` asks for Gluon: the tiled kernels only, nothing
  of Gluon or TMA imported or launched, no warning;
- each log-prob family failing on its own, at import, compile or launch: the Gluon forward and dz kernels at compile
  / launch (-> TMA), the TMA module at import (-> tiled), the tiled kernels' module at import (-> the torch path);
- the PACS loss's backward kernel failing (-> its torch twin, in the backward) and its kernel module failing at
  import (-> the torch path; the run had failed: pacs_fast/algorithms/pacs.py imported them outside its fallback);
- a failure that first appears in step 2 (as a launch error for a shape not seen before would), after a good step 1:
  the tiled forward, the pointer dz kernel on the second row chunk of a backward (its first chunk already written),
  the PACS loss's forward and backward: step 1 equals the working kernels' run bit for bit, step 2 equals it to fp32
  rounding (the fallback is another summation order of the same fp32 arithmetic), so no half-applied gradient.

Tolerances: fp32 model, the torch paths against the kernels: the same fp32 products summed in other orders, a few
fp32 roundings of each term: rel 1e-5 on the loss and the gradient norm. bf16 model: the forward's values are those
of fp32 products of exact bf16 values (rel 1e-5 on the loss), but the Triton backward rounds ``dz`` to bf16 before
its two GEMMs where the torch path keeps fp32: a relative error up to 2**-9 per ``dz`` entry, and the gradients
reach the parameters in bf16 (one more rounding each, and the bf16 model's backward rounds every activation
gradient): rel 2**-7 on the gradient norm (two bf16 ulps; measured 2.6e-3).
"""
import math
import sys
import warnings

import pytest
from pacs_fast.kernels import dispatch

from test_kernel_dispatch import _hopper, _spy
from test_kernel_fallback_training import _auto_takes_the_kernels, _common, _fallbacks_of, _first_step, _torch_run

pytestmark = [pytest.mark.interpret, pytest.mark.filterwarnings("ignore::UserWarning")]

K_PKG = "pacs_fast.kernels"


def _unimportable(monkeypatch, name):
    """``pacs_fast.kernels.<name>`` fails to import from now on (as a module whose import raises would)."""
    import pacs_fast.kernels as pkg
    monkeypatch.setitem(sys.modules, f"{K_PKG}.{name}", None)
    if hasattr(pkg, name):
        monkeypatch.delattr(pkg, name)


@pytest.fixture(scope="module")
def refs(tmp_path_factory, warm_cache):
    """The torch paths' runs, fp32 and bf16 (also the warm-up cache of every run after them)."""
    from pacs_fast.train import main
    out = tmp_path_factory.mktemp("torch_refs")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(dispatch.ENV, raising=False)
        for dtype in ("float32", "bfloat16"):
            _torch_run(main, _common(out, warm_cache, dtype), f"torch_{dtype}", mp)
    return {d: _first_step(out / f"torch_{d}") for d in ("float32", "bfloat16")}


def _on_the_kernels(mp, tmp_path):
    """Small tiles (the interpreter's speed), no measured table, nothing remembered, ``auto`` taking the kernels."""
    from pacs_fast.kernels import linear_logprobs as K, tuning
    for k, v in dict(BLOCK_N=16, BLOCK_V=64, BLOCK_H=16, GROUP_N=2, num_warps=1, num_stages=1).items():
        mp.setitem(K.CONFIG, k, v)
    mp.setattr(tuning, "TUNED_DIR", str(tmp_path))
    mp.delenv(dispatch.ENV, raising=False)
    dispatch.reset()
    _auto_takes_the_kernels(mp)


@pytest.fixture
def kernels(monkeypatch, tmp_path, warm_cache, refs):
    """``run(name, dtype)`` trains on the kernels and returns (its train records, its fallback warnings)."""
    from pacs_fast.train import main
    _on_the_kernels(monkeypatch, tmp_path)

    def run(name, dtype):
        warned = _fallbacks_of(main, _common(tmp_path, warm_cache, dtype), name)
        return _first_step(tmp_path / name), warned
    yield run
    dispatch.reset()


def _same_as_torch(got, ref, bf16=False):
    assert len(got) == 2 and all(math.isfinite(r["learner/loss"]) for r in got)
    assert ref[0]["learner/grad_norm"] > 0
    assert got[0]["learner/loss"] == pytest.approx(ref[0]["learner/loss"], rel=1e-5, abs=1e-6)
    assert got[0]["learner/grad_norm"] == pytest.approx(ref[0]["learner/grad_norm"], rel=2**-7 if bf16 else 1e-5)


def _one_each(warned, *words):
    assert len(warned) == len(words), warned
    for w in words:
        assert sum(all(x in m for x in w) for m in warned) == 1, (w, warned)


def test_safe_mode_trains_on_the_tiled_kernels_only(kernels, refs, monkeypatch):
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_fwd as KF, linear_logprobs_tma as KT
    _hopper(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "gluon")
    monkeypatch.setitem(K.CONFIG, "DLOGITS", "gluon")
    monkeypatch.setitem(sys.modules, f"{K_PKG}.linear_logprobs_gluon", None)  # an import attempt would warn
    tma = [_spy(monkeypatch, KT, n) for n in ("stats_tma", "dlogits_tma")]
    tiles = _spy(monkeypatch, KF, "stats_tiles")
    monkeypatch.setenv(dispatch.ENV, "safe")
    got, warned = kernels("safe", "bfloat16")
    assert warned == [] and tma == [[], []] and len(tiles) >= 8
    _same_as_torch(got, refs["bfloat16"], bf16=True)


def test_gluon_forward_failing_to_compile_and_tma_dz_to_launch_fall_back(kernels, refs, monkeypatch):
    """The Gluon module imports, its forward fails to compile: the TMA forward runs; the TMA dz kernel fails to launch
    in the first backward: the pointer dz kernel runs. (The tiny vocabulary, 99 ids, gives dz rows a TMA store cannot
    write: the Gluon dz kernel never takes them; its failure is checked on the op below.)"""
    import triton

    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_gluon as KG, linear_logprobs_tma as KT
    _hopper(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "gluon")
    monkeypatch.setitem(K.CONFIG, "DLOGITS", "tma")
    gluon = _spy(monkeypatch, KG, "stats_gluon", triton.CompilationError("k.py", None, "simulated: no wgmma"))
    fwd, dz = _spy(monkeypatch, KT, "stats_tma"), _spy(monkeypatch, KT, "dlogits_tma", RuntimeError("no TMA dz"))
    got, warned = kernels("gluon", "bfloat16")
    _one_each(warned, ("Gluon kernel stats_gluon", "CompilationError", "TMA kernel instead"),
              ("TMA kernel dlogits_tma", "no TMA dz", "tiled Triton kernel instead"))
    assert gluon == [1] and dz == [1] and len(fwd) >= 8
    _same_as_torch(got, refs["bfloat16"], bf16=True)


def test_gluon_dz_failing_to_launch_falls_back_to_tma(monkeypatch, tmp_path):
    """On the op (the trainer's vocabulary is too odd for the Gluon dz kernel): a Gluon dz launch error, the TMA dz
    kernel instead, the same gradients as the TMA dz kernel alone; one warning."""
    import torch

    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_gluon as KG, linear_logprobs_tma as KT
    from pacs_fast.ops.linear_logprobs import linear_logprobs
    _on_the_kernels(monkeypatch, tmp_path)
    _hopper(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    h0, w0 = torch.randn(20, 32, generator=gen).bfloat16(), torch.randn(128, 32, generator=gen).bfloat16()
    labels = torch.randint(0, 128, (20,), generator=gen)

    def grads(dlogits):
        monkeypatch.setitem(K.CONFIG, "DLOGITS", dlogits)
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        lp, ent = linear_logprobs(h, w, labels, return_entropy=True, backend="triton")
        (lp.sum() + 0.3 * ent.sum()).backward()
        return h.grad, w.grad
    want = grads("tma")
    gluon = _spy(monkeypatch, KG, "dlogits_gluon", RuntimeError("simulated Gluon launch failure"))
    tma = _spy(monkeypatch, KT, "dlogits_tma")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = grads("gluon")
    warned = [str(w.message) for w in seen if issubclass(w.category, dispatch.KernelFallbackWarning)]
    _one_each(warned, ("Gluon kernel dlogits_gluon", "simulated Gluon launch failure", "TMA kernel instead"))
    assert gluon == [1] and tma == [1]
    assert all(torch.equal(a, b) for a, b in zip(got, want))  # the same kernel wrote dz
    dispatch.reset()


def test_tma_module_failing_at_import_falls_back_to_the_tiled_kernels(kernels, refs, monkeypatch):
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_fwd as KF
    _hopper(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "tma")
    monkeypatch.setitem(K.CONFIG, "DLOGITS", "tma")
    _unimportable(monkeypatch, "linear_logprobs_tma")
    tiles = _spy(monkeypatch, KF, "stats_tiles")
    got, warned = kernels("tma_import", "bfloat16")
    _one_each(warned, ("TMA kernel module linear_logprobs_tma", "import", "tiled Triton kernel instead"))
    assert len(tiles) >= 8
    _same_as_torch(got, refs["bfloat16"], bf16=True)


def test_tiled_kernels_failing_at_import_fall_back_to_the_torch_path(kernels, refs, monkeypatch):
    _unimportable(monkeypatch, "linear_logprobs_fwd")
    got, warned = kernels("tiles_import", "float32")
    _one_each(warned, ("tiled Triton kernel forward", "linear_logprobs_fwd", "chunked PyTorch path"))
    _same_as_torch(got, refs["float32"])


def test_pacs_loss_backward_failing_falls_back_in_the_backward(kernels, refs, monkeypatch):
    from pacs_fast.kernels import pacs_loss as KP
    fwd, bwd = _spy(monkeypatch, KP, "pacs_loss_fwd"), _spy(monkeypatch, KP, "pacs_loss_bwd", RuntimeError("no bwd"))
    got, warned = kernels("pacs_bwd", "float32")
    _one_each(warned, ("PACS loss backward", "no bwd", "chunked PyTorch path"))
    assert bwd == [1] and len(fwd) >= 8  # the forward kernel still runs every micro-batch
    _same_as_torch(got, refs["float32"])


def test_pacs_loss_kernels_failing_at_import_fall_back_to_the_torch_path(kernels, refs, monkeypatch):
    monkeypatch.delitem(sys.modules, "pacs_fast.ops.pacs_loss", raising=False)  # (imported again: fails)
    _unimportable(monkeypatch, "pacs_loss")
    got, warned = kernels("pacs_import", "float32")
    _one_each(warned, ("PACS loss forward", "pacs_loss", "chunked PyTorch path"))
    _same_as_torch(got, refs["float32"])


DZ_ROWS = 8  # the dz buffer of the step-2 runs: 8 rows of the 99-id vocabulary (fp32), so 3 row chunks a backward


@pytest.fixture(scope="module")
def working(tmp_path_factory, warm_cache, refs):
    """The fp32 run on working kernels, dz in row chunks: the reference of the step-2 failures."""
    from pacs_fast.kernels import linear_logprobs as K
    from pacs_fast.train import main
    out = tmp_path_factory.mktemp("working")
    with pytest.MonkeyPatch.context() as mp:
        _on_the_kernels(mp, out)
        mp.setitem(K.CONFIG, "BWD_CHUNK_BYTES", DZ_ROWS * 99 * 4)
        assert _fallbacks_of(main, _common(out, warm_cache, "float32"), "working") == []
        dispatch.reset()
    return _first_step(out / "working")


@pytest.mark.parametrize("which", ["stats_tiles", "dlogits", "pacs_loss_fwd", "pacs_loss_bwd"])
def test_a_kernel_failing_first_in_step_2_falls_back_without_corrupting_that_step(kernels, working, monkeypatch,
                                                                                  which):
    """Step 1 on working kernels; from step 2 on one kernel raises (as a launch error of a shape first seen then
    would): the dz kernel on its second row chunk of step 2's first backward (the first chunk's dh / dW already
    written). The fallback takes that op's call over (forward, or the backward where it failed), once, with one
    warning: step 1 is the working run's bit for bit, step 2 equals it to fp32 rounding (no part of the step's
    gradient lost or counted twice)."""
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_fwd as KF, pacs_loss as KP
    from pacs_fast.learner.torch_learner import TorchLearner
    monkeypatch.setitem(K.CONFIG, "BWD_CHUNK_BYTES", DZ_ROWS * 99 * 4)
    step, real_update = [0], TorchLearner.update

    def update(self, *a, **k):
        step[0] += 1
        return real_update(self, *a, **k)
    monkeypatch.setattr(TorchLearner, "update", update)
    tried = []
    if which == "dlogits":
        from pacs_fast.kernels import linear_logprobs_bwd as KB
        real_dz, backwards = K._dlogits_kernel, _spy(monkeypatch, KB, "grad_bwd_chunked")

        class FailsInStep2:
            def __getitem__(self, grid):
                if step[0] >= 2:
                    tried.append(len(backwards))  # (which backward launches it)
                    if len(tried) >= 2:  # the second row chunk
                        raise RuntimeError(f"simulated {which} failure in step 2")
                return real_dz[grid]
        monkeypatch.setattr(K, "_dlogits_kernel", FailsInStep2())
    else:
        mod = KF if which == "stats_tiles" else KP
        real = getattr(mod, which)

        def fails_in_step2(*a, **k):
            if step[0] >= 2:
                tried.append(1)
                raise RuntimeError(f"simulated {which} failure in step 2")
            return real(*a, **k)
        monkeypatch.setattr(mod, which, fails_in_step2)
    got, warned = kernels("step2", "float32")
    name = {"stats_tiles": "tiled Triton kernel forward", "dlogits": "tiled Triton kernel dlogits",
            "pacs_loss_fwd": "PACS loss forward", "pacs_loss_bwd": "PACS loss backward"}[which]
    _one_each(warned, (name, f"simulated {which} failure in step 2", "chunked PyTorch path"))
    assert step[0] == 2 and len(tried) == (2 if which == "dlogits" else 1)
    if which == "dlogits":  # the chunks of one backward: its first chunk written, its second failing
        assert tried[0] == tried[1]
    figures = [{k: v for k, v in r.items() if k.startswith(("learner/", "reward/"))} for r in (got[0], working[0])]
    assert len(got) == 2 and "learner/grad_norm" in figures[0]
    assert figures[0] == figures[1]  # step 1: the same kernels, the same figures
    assert working[1]["learner/grad_norm"] > 0
    assert got[1]["learner/loss"] == pytest.approx(working[1]["learner/loss"], rel=1e-5, abs=1e-6)
    assert got[1]["learner/grad_norm"] == pytest.approx(working[1]["learner/grad_norm"], rel=1e-5)
