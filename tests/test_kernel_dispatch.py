"""Kernel dispatch that cannot break a run (kernels/dispatch.py, pacs_fast/ops/linear_logprobs.py), under
the Triton interpreter at tiny shapes: every fallback edge with a forced failure (Gluon import error ->
TMA, TMA compile error -> tiled, tiled error -> the torch path; a Hopper GPU simulated by monkeypatching
the architecture), each with one warning, the float64-checked result of tests/test_linear_logprobs.py's
``check`` (its tolerances) and no warning on the next call; the usability checks (shared memory, the
Triton API); ``PACS_FAST_KERNELS=safe|torch``; and no device-to-host sync in the forward + backward of
``linear_logprobs`` and the fused PACS loss (a dispatch mode that fails on every op reading a device
value on the host), with ``PACS_FAST_DEBUG_CHECKS=1`` still catching a bad label or ``cu_seqlens``.
"""
import sys
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pacs_fast.kernels import dispatch
from pacs_fast.ops.linear_logprobs import linear_logprobs

pytestmark = [pytest.mark.interpret,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")]

GLUON = "pacs_fast.kernels.linear_logprobs_gluon"


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """Small blocks (several ragged tiles), no measured table, no failure remembered, no env override."""
    from pacs_fast.kernels import linear_logprobs as K, tuning
    for k, v in dict(BLOCK_N=16, BLOCK_V=64, BLOCK_H=16, GROUP_N=2, num_warps=1, num_stages=1).items():
        monkeypatch.setitem(K.CONFIG, k, v)
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    monkeypatch.delenv(dispatch.ENV, raising=False)
    monkeypatch.delenv(dispatch.DEBUG_ENV, raising=False)
    dispatch.reset()
    yield
    dispatch.reset()


def _hopper(monkeypatch, arch=90):
    """The dispatcher and every launch_config see a GPU of ``arch`` (the tensors stay on the CPU)."""
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_launch as KLL
    monkeypatch.setattr(KLL, "device_arch", lambda d: arch)
    monkeypatch.setattr(K, "device_arch", lambda d: arch)


def _spy(monkeypatch, module, name, fail=None):
    """Counts the calls of ``module.name``; with ``fail`` each call raises it instead."""
    calls, real = [], getattr(module, name)

    def wrapped(*a, **k):
        calls.append(1)
        if fail is not None:
            raise fail
        return real(*a, **k)
    monkeypatch.setattr(module, name, wrapped)
    return calls


def _run(**kw):
    """tests/test_linear_logprobs.py ``check`` (bf16, entropy, bias, temperature: forward + backward against
    float64 with its tolerances) on the Triton backend; returns the fallback warnings it raised."""
    from test_linear_logprobs import check
    args = dict(dtype=torch.bfloat16, backend="triton", temperature=1.2, entropy=True, bias=True, v=301)
    args.update(kw)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check(**args)
    return [str(w.message) for w in seen if issubclass(w.category, dispatch.KernelFallbackWarning)]


def test_gluon_import_error_falls_back_to_tma(seed, monkeypatch):
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_tma as KT
    _hopper(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "gluon")
    monkeypatch.setitem(sys.modules, GLUON, None)  # its import raises ImportError
    tma = _spy(monkeypatch, KT, "stats_tma")
    warned = _run()
    assert len(warned) == 1 and "Gluon kernel module linear_logprobs_gluon" in warned[0], warned
    assert "ModuleNotFoundError: import of" in warned[0] and "running the TMA kernel instead" in warned[0]
    assert len(tma) == 1
    assert _run() == [] and len(tma) == 2  # the next call: straight to TMA, no warning


def test_tma_compile_error_falls_back_to_the_tiled_kernels(seed, monkeypatch):
    import triton

    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_fwd as KF, linear_logprobs_tma as KT
    _hopper(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "tma")
    monkeypatch.setitem(K.CONFIG, "DLOGITS", "tma")
    fwd = _spy(monkeypatch, KT, "stats_tma", triton.CompilationError("k.py", None, "simulated: out of resources"))
    dz = _spy(monkeypatch, KT, "dlogits_tma", RuntimeError("simulated launch failure"))
    tiles = _spy(monkeypatch, KF, "stats_tiles")
    warned = _run(chunk_bytes=(37, 128))  # three vocab chunks: the first fails, all go to the pointer kernel
    assert len(warned) == 2, warned
    assert any("TMA kernel stats_tma" in w and "CompilationError" in w for w in warned)
    assert any("TMA kernel dlogits_tma" in w and "simulated launch failure" in w for w in warned)
    assert (len(fwd), len(dz), len(tiles)) == (1, 1, 1)
    assert _run(chunk_bytes=(37, 128)) == [] and (len(fwd), len(dz), len(tiles)) == (1, 1, 2)  # not retried


def test_tiled_forward_error_falls_back_to_the_torch_path(seed, monkeypatch):
    from pacs_fast.kernels import linear_logprobs_fwd as KF
    fwd = _spy(monkeypatch, KF, "stats_tiles", RuntimeError("simulated tiled forward failure"))
    warned = _run()
    assert len(warned) == 1 and "tiled Triton kernel forward" in warned[0] and "chunked PyTorch path" in warned[0]
    assert "simulated tiled forward failure" in warned[0]
    assert _run() == [] and len(fwd) == 1  # the next call goes to the torch path at once


@pytest.mark.parametrize("triton_backward", ["chunked", "atomic"])
def test_tiled_backward_error_falls_back_to_the_torch_path(seed, monkeypatch, triton_backward):
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_bwd as KB
    mod, name = (K, "grad_bwd") if triton_backward == "atomic" else (KB, "grad_bwd_chunked")
    bwd = _spy(monkeypatch, mod, name, RuntimeError("simulated backward failure"))
    warned = _run(triton_backward=triton_backward)
    assert len(warned) == 1 and "backward" in warned[0] and "simulated backward failure" in warned[0], warned
    assert _run(triton_backward=triton_backward) == [] and len(bwd) == 1


def test_every_fast_kernel_failing_still_gives_correct_logprobs_and_gradients(seed, monkeypatch):
    """Gluon's import, both TMA kernels, the tiled forward and the pointer dz kernel all fail: the torch
    path computes forward and backward (float64-checked); one warning per family and reason, none after."""
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_fwd as KF, linear_logprobs_tma as KT
    _hopper(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "gluon")
    monkeypatch.setitem(K.CONFIG, "DLOGITS", "gluon")
    monkeypatch.setitem(sys.modules, GLUON, None)
    _spy(monkeypatch, KT, "stats_tma", RuntimeError("no TMA forward"))
    _spy(monkeypatch, KT, "dlogits_tma", RuntimeError("no TMA dz"))
    real_tiles = KF.stats_tiles
    _spy(monkeypatch, KF, "stats_tiles", RuntimeError("no tiled forward"))

    class Broken:
        def __getitem__(self, grid):
            raise RuntimeError("no pointer dz kernel")
    monkeypatch.setattr(K, "_dlogits_kernel", Broken())
    warned = _run()  # the forward's fallback makes the torch path compute the backward too
    assert len(warned) == 3, warned
    for words in (("Gluon", "import of"), ("stats_tma", "no TMA forward"), ("forward", "no tiled forward")):
        assert sum(all(w in m for w in words) for m in warned) == 1, (words, warned)
    assert _run() == []
    # and with the tiled forward working, every dz kernel failing: the torch backward
    dispatch.reset()
    monkeypatch.setattr(KF, "stats_tiles", real_tiles)
    warned = _run()
    assert len(warned) == 4, warned
    for words in (("Gluon", "import of"), ("stats_tma", "no TMA forward"), ("dlogits_tma", "no TMA dz"),
                  ("backward", "no pointer dz kernel")):
        assert sum(all(w in m for w in words) for m in warned) == 1, (words, warned)
    assert _run() == []


def test_usability_checks_shared_memory_and_api(seed, monkeypatch):
    """A launch needing more shared memory than the device has per block, or a Triton without the API a
    family needs, is not selected: the next family runs, with one warning each, and nothing is launched."""
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_fwd as KF, linear_logprobs_tma as KT
    _hopper(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "tma")
    monkeypatch.setattr(dispatch, "shared_limit", lambda device: 1024)  # below any launch's need
    tma, tiles = _spy(monkeypatch, KT, "stats_tma"), _spy(monkeypatch, KF, "stats_tiles")
    warned = _run()
    assert len(warned) == 1 and "shared memory" in warned[0] and "1024 B" in warned[0], warned
    assert (len(tma), len(tiles)) == (0, 1)
    monkeypatch.setattr(dispatch, "shared_limit", lambda device: None)
    monkeypatch.setattr(dispatch, "api_problem", lambda family: "tl.range has no flatten argument")
    warned = _run()
    assert len(warned) == 1 and "flatten" in warned[0] and (len(tma), len(tiles)) == (0, 2), warned
    assert _run() == []


def test_inputs_a_family_does_not_take_go_to_the_tiled_kernels_silently(seed, monkeypatch):
    """Gluon chosen on sm_80 / sm_100 or for fp32, TMA on sm_80: the tiled kernels, no warning, nothing of
    Gluon imported (the forward used to import the Gluon module before checking)."""
    from pacs_fast.kernels import linear_logprobs as K
    monkeypatch.setitem(sys.modules, GLUON, None)  # an import attempt would warn
    monkeypatch.setitem(K.CONFIG, "FWD", "gluon")
    for arch in (80, 100):
        _hopper(monkeypatch, arch)
        assert _run(triton_backward="atomic") == []
    _hopper(monkeypatch, 90)
    assert _run(dtype=torch.float32) == []
    _hopper(monkeypatch, 80)
    monkeypatch.setitem(K.CONFIG, "FWD", "tma")
    assert _run(triton_backward="atomic") == []


def test_environment_selects_the_kernels(seed, monkeypatch):
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_fwd as KF, linear_logprobs_tma as KT
    from pacs_fast.ops.backend import resolve_backend
    _hopper(monkeypatch)
    monkeypatch.setitem(K.CONFIG, "FWD", "tma")
    monkeypatch.setitem(K.CONFIG, "DLOGITS", "tma")
    tma, dz, tiles = _spy(monkeypatch, KT, "stats_tma"), _spy(monkeypatch, KT, "dlogits_tma"), \
        _spy(monkeypatch, KF, "stats_tiles")
    monkeypatch.setenv(dispatch.ENV, "safe")  # the portable tiled kernels only
    assert (K.forward_kind(90, "16"), K.dz_kind(90, "16")) == ("tiles", "pointer")
    assert _run() == [] and (len(tma), len(dz), len(tiles)) == (0, 0, 1)
    monkeypatch.setenv(dispatch.ENV, "torch")  # the PyTorch path, for "auto" and "triton" alike
    t = torch.zeros(2)
    assert resolve_backend("triton", t) == resolve_backend("auto", t) == "torch"
    assert _run() == [] and (len(tma), len(dz), len(tiles)) == (0, 0, 1)
    monkeypatch.setenv(dispatch.ENV, " Auto ")
    assert resolve_backend("auto", t) == "torch"  # a CPU tensor
    monkeypatch.setenv(dispatch.ENV, "fast")
    for call in (lambda: resolve_backend("auto", t), lambda: K.forward_kind(90, "16")):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value).count("\n") == 0 and "PACS_FAST_KERNELS='fast'" in str(err.value)


# ---- no device-to-host sync on the hot path -------------------------------------------------------

class NoHostSync(TorchDispatchMode):
    """Fails on every op that reads device values on the host: ``.item()``, ``bool()``, ``int()``,
    ``float()`` of a tensor and a tensor in an ``if`` (all ``aten._local_scalar_dense``), and the ops whose
    output size depends on the values (``nonzero``, indexing with a bool mask, ``masked_select``,
    ``unique``). (``.tolist()`` / ``.cpu()`` of a CUDA tensor copy it to the CPU, an ``aten._to_copy``
    this catches too; on CPU tensors they dispatch nothing.)"""
    SYNCS = ("aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::masked_select", "aten::_unique",
             "aten::unique", "aten::equal", "aten::is_nonzero")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        kwargs = kwargs or {}
        bool_index = name.startswith(("aten::index", "aten::_index_put")) and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool for a in args if isinstance(a, (list, tuple))
            for t in a)
        to_host = name == "aten::_to_copy" and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu" \
            and torch.device(kwargs.get("device") or args[0].device).type == "cpu"
        if name.startswith(self.SYNCS) or bool_index or to_host:
            raise AssertionError(f"device-to-host sync on the hot path: {func}")
        return func(*args, **kwargs)


def test_the_mode_catches_a_sync():
    x = torch.ones(3)
    for read in (lambda: x.sum().item(), lambda: bool(x.any()), lambda: int(x[0]), lambda: float(x[1]),
                 lambda: 1 if x.any() else 0, lambda: x.nonzero(), lambda: x[x > 0], lambda: x.masked_select(x > 0)):
        with pytest.raises(AssertionError, match="device-to-host sync"), NoHostSync():
            read()


@pytest.mark.parametrize("backend,triton_backward", [("torch", "chunked"), ("triton", "chunked"),
                                                      ("triton", "atomic")])
def test_linear_logprobs_makes_no_host_sync(seed, backend, triton_backward):
    """Forward + backward with ignored rows, a bias and entropy, under ``NoHostSync``; the values equal
    those of a call outside it (an out-of-range label is NaN for its row, not a host-side check)."""
    n, h, v = 20, 16, 150
    hidden, weight, bias = torch.randn(n, h), torch.randn(v, h) * 0.3, torch.randn(v)
    labels = torch.randint(0, v, (n,))
    labels[::3] = -100
    labels[4] = v  # out of range
    out = []
    for mode in (NoHostSync, warnings.catch_warnings):
        leaves = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
        with mode():
            logp, ent = linear_logprobs(leaves[0], leaves[1], labels, bias=leaves[2], return_entropy=True,
                                        backend=backend, triton_backward=triton_backward, temperature=0.8)
            keep = torch.arange(n) != 4  # (boolean indexing would be a sync: where)
            (torch.where(keep, logp + 0.5 * ent, 0.0).sum()).backward()
        out.append([logp, ent] + [t.grad for t in leaves])
    for a, b in zip(*out):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    logp, ent = out[0][:2]
    assert logp[4].isnan() and ent[4].isnan() and (logp[::3] == 0).all() and logp[keep].isfinite().all()
    assert (out[0][2][::3] == 0).all() and (out[0][2][4] == 0).all()


@pytest.mark.parametrize("packed", [False, True])
def test_fused_pacs_loss_makes_no_host_sync(seed, packed):
    from pacs_fast.ops.pacs_loss import fused_pacs_loss
    b, t = 8, 13
    logp, ref = -torch.rand(b, t), -torch.rand(b, t)
    mask = torch.rand(b, t) > 0.2
    rewards = (torch.rand(b) > 0.5).float()
    kw = dict(group_size=4)
    if packed:
        lengths = torch.randint(1, t + 1, (b,))
        kw["cu_seqlens"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        keep = torch.arange(t)[None, :] < lengths[:, None]
        logp, ref, mask = logp[keep], ref[keep], mask[keep]
    x = logp.clone().requires_grad_()
    with NoHostSync():
        loss = fused_pacs_loss(x, ref, mask, rewards, **kw)
        loss.backward()
    assert loss.isfinite() and x.grad.isfinite().all()


def test_debug_checks_catch_bad_labels_and_cu_seqlens(monkeypatch):
    from pacs_fast.ops.pacs_loss import fused_pacs_loss
    h, w = torch.randn(5, 8), torch.randn(10, 8)
    labels = torch.tensor([1, 2, -100, 12, 3])
    assert linear_logprobs(h, w, labels)[3].isnan()  # no check by default: NaN for the row
    monkeypatch.setenv(dispatch.DEBUG_ENV, "1")
    for backend in ("torch", "triton"):
        with pytest.raises(ValueError, match=r"labels must be in \[0, 10\) or equal ignore_index=-100: "
                                             r"label 12 at row 3 \(PACS_FAST_DEBUG_CHECKS check\)"):
            linear_logprobs(h, w, labels, backend=backend)
    logp = -torch.rand(12)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0"):
        fused_pacs_loss(logp, logp, None, torch.tensor([1.0, 0, 0, 1]), group_size=2,
                        cu_seqlens=torch.tensor([0, 3, 6, 9, 13]))


def test_a_launch_value_no_kernel_can_take_is_raised_not_taken_for_a_kernel_failure(seed, monkeypatch):
    """CONFIG[GROUP_N] = 0 launched nothing and returned garbage; CONFIG[FWD] = 'Tiles' (a typo) was taken
    for a kernel failure: the torch path ran with a warning and the Triton path stayed off for the process,
    even once the typo was fixed (kernel dispatch sweep). Both raise LaunchConfigError (a ValueError) now,
    record nothing, and the fixed value runs the Triton kernels."""
    from pacs_fast.kernels import linear_logprobs as K, linear_logprobs_fwd as KF, tuning
    tiles = _spy(monkeypatch, KF, "stats_tiles")
    for key, value in (("GROUP_N", 0), ("FWD", "Tiles")):
        monkeypatch.setitem(K.CONFIG, key, value)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            with pytest.raises(tuning.LaunchConfigError, match=rf"CONFIG\['{key}'\]"):
                _run()
        assert not [w for w in seen if issubclass(w.category, dispatch.KernelFallbackWarning)]
        assert not dispatch._broken
    monkeypatch.setitem(K.CONFIG, "GROUP_N", 2)
    monkeypatch.setitem(K.CONFIG, "FWD", None)
    before = len(tiles)
    assert _run() == [] and len(tiles) == before + 1


def test_one_cause_breaking_every_op_is_named_for_each(seed, monkeypatch):
    """One reason, three ops: each op's fallback is announced (it was one warning for the first op, the
    token log-probs and the PACS loss then fell back silently)."""
    from pacs_fast.algorithms import pacs_loss
    from pacs_fast.kernels import linear_logprobs_fwd as KF, pacs_loss as KP, token_logprobs as KT
    from pacs_fast.ops.token_logprobs import token_logprobs
    cause = PermissionError("simulated: the Triton cache is not writable")
    for mod, name in ((KF, "stats_tiles"), (KT, "stats_fwd"), (KP, "pacs_loss_fwd")):
        _spy(monkeypatch, mod, name, cause)
    first = _run()  # (it records its own warnings)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        token_logprobs(torch.randn(6, 33), torch.randint(0, 33, (6,)), backend="triton")
        pacs_loss(-torch.rand(4, 5), -torch.rand(4, 5), None, torch.tensor([1.0, 0, 1, 1]), group_size=2,
                  backend="triton")
    warned = first + [str(w.message) for w in seen if issubclass(w.category, dispatch.KernelFallbackWarning)]
    assert len(warned) == 3 and all("not writable" in m for m in warned), warned
    assert [m.split(" failed")[0].split("kernel ")[1] for m in warned] == [
        "forward (stats_tiles + finish)", "token_logprobs forward", "PACS loss forward"]


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("ON", True), ("yes", True), ("0", False),
                                      ("false", False), ("off", False), ("no", False), ("", False)])
def test_triton_interpret_is_read_as_triton_reads_it(monkeypatch, value, on):
    """TRITON_INTERPRET=false was 'interpreter on' here and off for Triton: a fallback warning about '0 active
    drivers' instead of the one-line error for Triton on CPU tensors."""
    from pacs_fast.ops.backend import triton_interpreted
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert triton_interpreted() is on
