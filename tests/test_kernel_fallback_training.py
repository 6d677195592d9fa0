"""The trainer on the fast kernels, as on CUDA: the built-in task trained through ``python -m pacs_fast.train``'s
``main`` with ``backend="auto"`` taking the Triton kernels (under the interpreter) for the learner's log-probs and its
PACS loss (the fused kernels; before 2026-12-05 the learner's loss always took the torch path):

- with the kernels working, step 1 (the start model, the same rollouts: one update a step) equals a run on the torch
  paths (``PACS_FAST_KERNELS=torch``) in loss and gradient norm to fp32 rounding (fp32 model);
- issue 39's "a forced failure of every fast kernel still trains (fallback, one warning)": a bf16 model, the
  dispatcher seeing a Hopper GPU, and the Gluon module not importing, the TMA forward and dz kernels, the tiled
  forward, the pointer dz kernel and the fused PACS loss's forward raising: the run finishes, each family warns once
  for the whole run (not once a step) and is tried once, and step 1 equals the torch paths' run exactly (the
  fallbacks are those paths)."""
import importlib
import math
import sys
import warnings

import pytest
from pacs_fast.kernels import dispatch
from pacs_fast.trainer.metrics import read_jsonl

pytestmark = [pytest.mark.interpret, pytest.mark.filterwarnings("ignore::UserWarning")]

GLUON = "pacs_fast.kernels.linear_logprobs_gluon"


def _break_every_fast_kernel(monkeypatch):
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_fwd as KF, linear_logprobs_tma as KT
    from pacs_fast.kernels import pacs_loss as KP
    from test_kernel_dispatch import _hopper, _spy

    _hopper(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "gluon")
    monkeypatch.setitem(K.CONFIG, "DLOGITS", "gluon")
    monkeypatch.setitem(sys.modules, GLUON, None)  # the import fails
    calls = {
        "stats_tma": _spy(monkeypatch, KT, "stats_tma", RuntimeError("no TMA forward")),
        "dlogits_tma": _spy(monkeypatch, KT, "dlogits_tma", RuntimeError("no TMA dz")),
        "stats_tiles": _spy(monkeypatch, KF, "stats_tiles", RuntimeError("no tiled forward")),
        "pacs_loss_fwd": _spy(monkeypatch, KP, "pacs_loss_fwd", RuntimeError("no PACS loss kernel")),
    }

    class Broken:
        def __getitem__(self, grid):
            raise RuntimeError("no pointer dz kernel")
    monkeypatch.setattr(K, "_dlogits_kernel", Broken())
    return calls


def _auto_takes_the_kernels(monkeypatch):
    """``backend="auto"`` (the learner's log-probs and PACS loss) takes the Triton kernels here, as on CUDA."""
    import pacs_fast.ops.backend as B
    TL = importlib.import_module("pacs_fast.ops.token_logprobs")  # (the package's attribute is the function)
    real = B.resolve_backend

    def as_on_cuda(backend, *tensors):
        if backend == "auto" and dispatch.mode() != "torch" and not any(t.is_meta for t in tensors):
            return "triton"
        return real(backend, *tensors)
    monkeypatch.setattr(B, "resolve_backend", as_on_cuda)
    monkeypatch.setattr(TL, "resolve_backend", as_on_cuda)  # (imported by name there)


def _first_step(run):
    return [r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]


def _fallbacks_of(main, common, name):
    """Runs ``main`` as run ``name``; the kernel-fallback warnings it raised (their messages)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        main(common + [f"train.run_name={name}"])
    return [str(w.message) for w in seen if issubclass(w.category, dispatch.KernelFallbackWarning)]


def _kernel_counts(monkeypatch):
    """Counts the launches of the tiled forward and of the fused PACS loss's forward (they still run)."""
    from pacs_fast.kernels import linear_logprobs_fwd as KF, pacs_loss as KP
    from test_kernel_dispatch import _spy
    return {"stats_tiles": _spy(monkeypatch, KF, "stats_tiles"), "pacs_loss_fwd": _spy(monkeypatch, KP, "pacs_loss_fwd")}


def _common(tmp_path, warm_cache, dtype):
    from test_train import TINY
    return TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.steps=2",
                   "train.save_every=2", "train.eval_every=2", "train.tensorboard=false",
                   "reward.noise_fp=0.3",  # the barely warmed-up model solves nothing: flipped labels mix the groups
                   "learner.logprob_backend=auto", f"model.dtype={dtype}",
                   "learner.mini_batch_prompts=4"]  # one update a step: step 1's figures are the start model's


def _torch_run(main, common, name, monkeypatch):
    """The torch paths throughout: the reference, and (its warm-up cached) the start model of the runs after it, so
    that the kernels below meet the learner's own calls, not the warm-up's."""
    monkeypatch.setenv(dispatch.ENV, "torch")
    dispatch.reset()
    try:
        main(common + [f"train.run_name={name}"])
    finally:
        monkeypatch.delenv(dispatch.ENV)
        dispatch.reset()


@pytest.fixture
def small_tiles(monkeypatch):
    from pacs_fast.kernels import linear_logprobs as K
    for k, v in dict(BLOCK_N=16, BLOCK_V=64, BLOCK_H=16, GROUP_N=2, num_warps=1, num_stages=1).items():
        monkeypatch.setitem(K.CONFIG, k, v)  # the interpreter's speed
    monkeypatch.delenv(dispatch.ENV, raising=False)
    dispatch.reset()
    yield
    dispatch.reset()


def test_the_learner_on_the_kernels_equals_the_torch_paths(tmp_path, warm_cache, monkeypatch, small_tiles):
    from pacs_fast.train import main
    common = _common(tmp_path, warm_cache, "float32")
    _torch_run(main, common, "torch", monkeypatch)
    _auto_takes_the_kernels(monkeypatch)
    ran = _kernel_counts(monkeypatch)
    assert _fallbacks_of(main, common, "kernels") == []
    assert len(ran["stats_tiles"]) >= 8 and len(ran["pacs_loss_fwd"]) >= 8  # (4 micro-batches a step, 2 steps)
    ref, kernels = _first_step(tmp_path / "torch"), _first_step(tmp_path / "kernels")
    assert ref[0]["learner/grad_norm"] > 0  # (mixed groups: a gradient to compare)
    # fp32 throughout; the kernels and the torch paths sum in other orders: a few fp32 roundings of each term
    assert kernels[0]["learner/loss"] == pytest.approx(ref[0]["learner/loss"], rel=1e-5, abs=1e-6)
    assert kernels[0]["learner/grad_norm"] == pytest.approx(ref[0]["learner/grad_norm"], rel=1e-5)


def test_a_run_trains_through_every_fast_kernel_failing(tmp_path, warm_cache, monkeypatch, small_tiles):
    from pacs_fast.train import main
    common = _common(tmp_path, warm_cache, "bfloat16")  # (bf16: what the Gluon and TMA kernels take)
    _torch_run(main, common, "torch", monkeypatch)
    _auto_takes_the_kernels(monkeypatch)
    calls = _break_every_fast_kernel(monkeypatch)
    fell_back = _fallbacks_of(main, common, "broken")
    for words in (("Gluon", "import of"), ("stats_tma", "no TMA forward"), ("forward", "no tiled forward"),
                  ("PACS loss forward", "no PACS loss kernel")):
        assert sum(all(w in m for w in words) for m in fell_back) == 1, (words, fell_back)
    assert len(fell_back) == 4, fell_back  # (the torch forward computes its own backward: no dz kernel was tried)
    # each failing kernel was tried once in the run, then never again
    assert calls["stats_tma"] == [1] and calls["stats_tiles"] == [1] and calls["pacs_loss_fwd"] == [1]
    assert calls["dlogits_tma"] == []
    ref, broken = _first_step(tmp_path / "torch"), _first_step(tmp_path / "broken")
    assert len(broken) == 2 and all(math.isfinite(r["learner/loss"]) for r in broken)
    assert ref[0]["learner/grad_norm"] > 0
    assert broken[0]["learner/loss"] == ref[0]["learner/loss"]  # the fallbacks are the torch paths
    assert broken[0]["learner/grad_norm"] == ref[0]["learner/grad_norm"]


def test_a_failing_dz_kernel_alone_falls_back_in_the_backward(tmp_path, warm_cache, monkeypatch, small_tiles):
    """The tiled forward working and the pointer dz kernel failing (the CPU's dz kernel): the backward takes the
    torch path with one warning, and the run trains on."""
    from pacs_fast.kernels import linear_logprobs as K
    from pacs_fast.train import main
    common = _common(tmp_path, warm_cache, "float32")
    _torch_run(main, common, "torch", monkeypatch)
    _auto_takes_the_kernels(monkeypatch)
    tried = []

    class Broken:
        def __getitem__(self, grid):
            tried.append(1)
            raise RuntimeError("no pointer dz kernel")
    monkeypatch.setattr(K, "_dlogits_kernel", Broken())
    fell_back = _fallbacks_of(main, common, "dz")
    assert len(fell_back) == 1 and "no pointer dz kernel" in fell_back[0] and "backward" in fell_back[0], fell_back
    assert tried == [1]
    ref, dz = _first_step(tmp_path / "torch"), _first_step(tmp_path / "dz")
    assert len(dz) == 2
    assert dz[0]["learner/loss"] == pytest.approx(ref[0]["learner/loss"], rel=1e-5, abs=1e-6)
    assert dz[0]["learner/grad_norm"] == pytest.approx(ref[0]["learner/grad_norm"], rel=1e-5)


@pytest.mark.gpu
def test_the_learner_on_the_gpu_kernels_equals_the_torch_paths_cuda(tmp_path, warm_cache, monkeypatch):
    """On a GPU, with nothing patched: ``auto`` takes the compiled kernels for the learner's log-probs and PACS
    loss (counted), the run warns of no fallback, and step 1's gradient norm equals the torch paths' run (fp32
    model; the kernels' fp32 products are IEEE, not TF32: the sums' order is what differs)."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU; none on this machine")
    from pacs_fast.kernels import linear_logprobs as K, pacs_loss as KP
    from pacs_fast.train import main
    from test_kernel_dispatch import _spy
    monkeypatch.delenv(dispatch.ENV, raising=False)
    common = _common(tmp_path, warm_cache, "float32") + ["model.device=cuda"]
    _torch_run(main, common, "torch", monkeypatch)
    ran = {"stats_fwd": _spy(monkeypatch, K, "stats_fwd"), "pacs_loss_fwd": _spy(monkeypatch, KP, "pacs_loss_fwd")}
    dispatch.reset()
    assert _fallbacks_of(main, common, "kernels") == []
    assert len(ran["stats_fwd"]) >= 8 and len(ran["pacs_loss_fwd"]) >= 8
    ref, kernels = _first_step(tmp_path / "torch"), _first_step(tmp_path / "kernels")
    assert ref[0]["learner/grad_norm"] > 0
    assert kernels[0]["learner/grad_norm"] == pytest.approx(ref[0]["learner/grad_norm"], rel=1e-4)
