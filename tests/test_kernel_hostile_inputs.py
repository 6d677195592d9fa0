"""Hostile inputs to the log-prob ops and the kernel tooling (a sweep of 2026-11-30), each fixed at its root:

- a strided ``bias`` gave log-probs 2.3 off and a wrong bias gradient on the Triton backend (the kernels read
  it with unit stride);
- ``token_logprobs(inplace_backward=True)`` on logits whose rows share memory (an expanded view) wrote every
  row's gradient over the same elements (Triton: gradient 2.8 off; torch: an error not naming the option);
- meta tensors with ``backend="triton"`` were taken for a kernel failure that switched the kernels off for
  the process;
- ``fused_pacs_loss`` called directly after its kernel failed did not say what computes the loss instead;
- every ``KernelFallbackWarning`` pointed into torch's ``Function.apply``, not at the user's line;
- arguments no op can take (complex labels, a ``tp_group`` that is no process group, a ``chunk_bytes`` of
  inf / "64MB" / (2,), an ``ignore_index`` past int64) gave errors that did not name them;
- ``python -m pacs_fast.kernels.aot --archs sm_90`` / ``75`` / ``--modules x`` gave a traceback or "0 cases" with
  exit status 0.

The values are checked against a float64 reference in fp32 with logits of O(1): the error bound 2e-5 is
fp32 accumulation over H = 40 and V = 1003 terms (~1e-6) with a margin; a wrong result is off by O(0.1).
"""
import warnings

import pytest
import torch

from pacs_fast.kernels import dispatch
from pacs_fast.ops.linear_logprobs import linear_logprobs
from pacs_fast.ops.token_logprobs import token_logprobs

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

N, H, V = 37, 40, 1003
TOL = 2e-5


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Small blocks (several row / vocab blocks), no failure remembered, no environment override."""
    from pacs_fast.kernels import linear_logprobs as K, token_logprobs as KT
    for k, v in dict(BLOCK_N=16, BLOCK_V=64, BLOCK_H=16, GROUP_N=2, SPLITS=3, num_warps=1, num_stages=1).items():
        monkeypatch.setitem(K.CONFIG, k, v)
    for k, v in dict(BLOCK_V=256, BLOCK_V_BWD=256, SPLITS=3, num_warps=1).items():
        monkeypatch.setitem(KT.CONFIG, k, v)
    monkeypatch.delenv(dispatch.ENV, raising=False)
    dispatch.reset()
    yield
    dispatch.reset()


def _close(got: torch.Tensor, want: torch.Tensor) -> float:
    err = (got.double() - want).abs().max().item()
    assert err <= TOL * (1 + want.abs().max().item()), err
    return err


@pytest.mark.interpret
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_strided_bias_gives_the_float64_values_and_gradients(seed, backend):
    hidden, weight = torch.randn(N, H), torch.randn(V, H) * 0.4
    labels = torch.randint(0, V, (N,))
    leaves = [t.clone().requires_grad_() for t in (hidden, weight, torch.randn(2 * V))]
    strided = leaves[2][::2]  # every other element: stride 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", dispatch.KernelFallbackWarning)  # the kernel itself, not a fallback
        logp, ent = linear_logprobs(leaves[0], leaves[1], labels, bias=strided, return_entropy=True, backend=backend)
    gl, gh = torch.randn(N), torch.randn(N)
    ((logp * gl).sum() + (ent * gh).sum()).backward()
    refs = [t.detach().double().requires_grad_() for t in (leaves[0], leaves[1], leaves[2])]
    x = refs[0] @ refs[1].T + refs[2][::2]
    lsm = torch.log_softmax(x, -1)
    rl = lsm.gather(1, labels[:, None]).squeeze(1)
    re = -(lsm.exp() * lsm).sum(-1)
    ((rl * gl.double()).sum() + (re * gh.double()).sum()).backward()
    _close(logp, rl.detach())
    _close(ent, re.detach())
    for got, want in zip(leaves, refs):
        _close(got.grad, want.grad)
    assert (leaves[2].grad[1::2] == 0).all()  # the elements the view skips get nothing


@pytest.mark.interpret
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("view", ["expanded", "overlapping"])
def test_inplace_backward_on_rows_that_share_memory(seed, backend, view):
    """Logits ``[N, V]`` expanded from one row (stride 0), or rows overlapping (row stride 7 < V): each element's
    gradient is the sum over the rows that read it."""
    base = torch.randn(N * 7 + V, requires_grad=True)
    flat = base * 3.0  # not a leaf: inplace_backward accepts it
    rows = (lambda x: x[:V].expand(N, V)) if view == "expanded" else (lambda x: x.as_strided((N, V), (7, 1)))
    labels = torch.randint(0, V, (N,))
    gl = torch.randn(N)
    logp = token_logprobs(rows(flat), labels, inplace_backward=True, backend=backend)
    (logp * gl).sum().backward()
    ref = base.detach().double().requires_grad_()
    want = torch.log_softmax(rows(ref * 3.0), -1).gather(1, labels[:, None]).squeeze(1)
    (want * gl.double()).sum().backward()
    _close(logp, want.detach())
    _close(base.grad, ref.grad)


@pytest.mark.interpret
def test_meta_tensors_do_not_switch_the_kernels_off(seed, monkeypatch):
    from pacs_fast.kernels import token_logprobs as KT
    from test_kernel_dispatch import _spy
    meta = torch.empty(N, V, device="meta")
    lab = torch.empty(N, dtype=torch.long, device="meta")
    assert token_logprobs(meta, lab, backend="triton").shape == (N,)
    h, w = torch.empty(N, H, device="meta"), torch.empty(V, H, device="meta")
    assert linear_logprobs(h, w, lab, backend="triton").shape == (N,)
    assert not dispatch._broken
    calls = _spy(monkeypatch, KT, "stats_fwd")
    logits = torch.randn(N, V)
    token_logprobs(logits, torch.randint(0, V, (N,)), backend="triton")
    assert calls == [1]  # the kernel ran


@pytest.mark.interpret
def test_fused_pacs_loss_after_its_kernel_failed_names_what_runs_instead(monkeypatch):
    import pacs_fast as pf
    from pacs_fast.kernels import pacs_loss as KP
    from test_kernel_dispatch import _spy
    _spy(monkeypatch, KP, "pacs_loss_fwd", RuntimeError("simulated"))
    args = (torch.randn(8, 6), torch.randn(8, 6), torch.ones(8, 6), torch.randint(0, 2, (8,)).float())
    for _ in range(2):  # the failing call, then one after it (the kernel is not tried again)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", dispatch.KernelFallbackWarning)
            with pytest.raises(dispatch.KernelFailed, match=r"pacs_fast\.pacs_loss \(backend='auto' or 'torch'\)"):
                pf.fused_pacs_loss(*args, group_size=4)


@pytest.mark.interpret
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_fallback_warning_points_at_the_callers_line(monkeypatch, where):
    from pacs_fast.kernels import token_logprobs as KT
    from test_kernel_dispatch import _spy
    _spy(monkeypatch, KT, "stats_fwd" if where == "forward" else "grad_bwd", RuntimeError("simulated"))
    logits = torch.randn(N, V, requires_grad=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        logp = token_logprobs(logits, torch.randint(0, V, (N,)), backend="triton")
        logp.sum().backward()
    hits = [w for w in seen if issubclass(w.category, dispatch.KernelFallbackWarning)]
    assert len(hits) == 1 and hits[0].filename == __file__, [(w.filename, w.lineno) for w in hits]


@pytest.mark.parametrize("kw, match", [
    (dict(chunk_bytes=float("inf")), "chunk_bytes must be a positive byte budget"),
    (dict(chunk_bytes="64MB"), "chunk_bytes must be a positive byte budget"),
    (dict(chunk_bytes=(2,)), "chunk_bytes must be a positive byte budget"),
    (dict(chunk_bytes=(4, 0)), "chunk_bytes must be a positive byte budget"),
    (dict(chunk_bytes=True), "chunk_bytes must be a positive byte budget"),
    (dict(tp_group="world"), "tp_group must be a torch.distributed process group or None, got str"),
    (dict(ignore_index=2**70), "ignore_index must be an integer label id within int64"),
])
@pytest.mark.parametrize("op", ["token_logprobs", "linear_logprobs"])
def test_arguments_no_op_can_take_are_named(op, kw, match):
    labels = torch.randint(0, 8, (4,))
    with pytest.raises(ValueError, match=f"{op}: {match}"):
        if op == "token_logprobs":
            token_logprobs(torch.randn(4, 8), labels, backend="torch", **kw)
        else:
            linear_logprobs(torch.randn(4, 3), torch.randn(8, 3), labels, backend="torch", **kw)


def test_complex_labels_are_refused():
    labels = torch.randint(0, 8, (4,)).to(torch.complex64)
    with pytest.raises(ValueError, match="token_logprobs: labels must be an integer tensor"):
        token_logprobs(torch.randn(4, 8), labels, backend="torch")
    with pytest.raises(ValueError, match="linear_logprobs: labels must be an integer tensor"):
        linear_logprobs(torch.randn(4, 3), torch.randn(8, 3), labels, backend="torch")


def test_valid_chunk_bytes_forms_still_run():
    logits, labels = torch.randn(6, 50), torch.randint(0, 50, (6,))
    want = token_logprobs(logits, labels, backend="torch")
    for chunk in (4096, 4096.0, (2, 16), [3, 7]):
        assert torch.allclose(token_logprobs(logits, labels, backend="torch", chunk_bytes=chunk), want, atol=1e-6)


@pytest.mark.parametrize("argv, match", [
    (["--archs", "sm_91"], "'91' not among the archs"),
    (["--archs", "75"], "'75' not among the archs"),
    (["--archs", "90,"], "'' not among the archs"),
    (["--modules", "nosuchmodule"], "'nosuchmodule' not among the kernel files"),
])
def test_the_aot_cli_names_an_arch_or_module_it_has_no_cases_for(tmp_path, capsys, argv, match):
    pytest.importorskip("triton")
    from pacs_fast.kernels import aot
    with pytest.raises(SystemExit) as e:
        aot.main(["--json", str(tmp_path / "x.json"), *argv])
    assert e.value.code == 2 and match in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
