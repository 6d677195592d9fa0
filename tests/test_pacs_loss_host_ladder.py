"""bench/gpu/pacs_loss_host_profile.py's wall-time ladder (issue 39 item 3), on the CPU under the interpreter: the
empty kernels take exactly the real kernels' parameters (so Triton's launcher handles the same arguments), the swaps
put the real kernels back, each rung launches what it says, and the derived columns are the differences they name.
The times themselves mean nothing here (the GPU lease measures them)."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import pacs_fast.kernels.pacs_loss as KP
from pacs_fast.ops.pacs_loss import fused_pacs_loss

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("pacs_loss_host_profile",
                                                  ROOT / "bench" / "gpu" / "pacs_loss_host_profile.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


H = _load()


def _params(kernel):
    import inspect
    return [(p.name, "constexpr" in str(p.annotation)) for p in inspect.signature(kernel.fn).parameters.values()]


def test_empty_kernels_take_the_real_kernels_parameters():
    empty = H.empty_kernels(KP)
    assert set(empty) == set(H.KERNELS)
    for name, k in empty.items():
        assert _params(k) == _params(getattr(KP, name)), name
        assert any(c for _, c in _params(k)), name  # the constexprs stay constexprs (they select the compile)


def _inputs(B=16, T=24):
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(B, T, generator=g)).requires_grad_()
    return logp, -torch.rand(B, T, generator=g), torch.rand(B, T, generator=g) > 0.3, \
        (torch.rand(B, generator=g) > 0.5).float()


def test_swaps_launch_what_they_say_and_restore_the_real_kernels():
    real = {name: getattr(KP, name) for name in H.KERNELS}
    launched = []

    class Count:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **k: launched.append(self.name)
    logp, ref, mask, r = _inputs()
    with H.kernels_swapped(KP, {n: Count(n) for n in H.KERNELS}):
        fused_pacs_loss(logp, ref, mask, r, group_size=8).backward()
    assert launched == ["_pacs_one_pass_kernel", "_pacs_bwd_kernel"]  # the real call's two launches, counted
    assert {n: getattr(KP, n) for n in H.KERNELS} == real
    with pytest.raises(RuntimeError), H.kernels_swapped(KP, {n: Count(n) for n in H.KERNELS}):
        raise RuntimeError("a rung that fails")
    assert {n: getattr(KP, n) for n in H.KERNELS} == real
    # the empty kernels run (here: interpreted) with the real arguments and write nothing
    logp.grad = None
    with H.kernels_swapped(KP, H.empty_kernels(KP)):
        fused_pacs_loss(logp, ref, mask, r, group_size=8).backward()
    assert logp.grad is not None and logp.grad.shape == logp.shape
    # and the real kernels are back: the loss equals the torch path's
    from pacs_fast.algorithms import pacs_loss
    want = pacs_loss(logp, ref, mask, r, group_size=8, backend="torch")
    assert torch.allclose(fused_pacs_loss(logp, ref, mask, r, group_size=8), want, rtol=1e-5, atol=1e-6)


def test_ladder_rows_hold_every_rung_and_their_differences():
    row = H.ladder(16, 24, "cpu", calls=2, rounds=2, busy_ms=0.1)
    for name in H.RUNGS + H.BUSY:
        assert row[f"{name}_ms"] > 0, name
        assert len(row[f"{name}_samples_ms"]) == 4, name  # rounds x calls, the warm-up round not counted
    assert row["triton_launcher_ms"] == pytest.approx(row["fused_empty_ms"] - row["fused_no_launch_ms"])
    assert row["device_on_path_ms"] == pytest.approx(row["fused_ms"] - row["fused_empty_ms"])
    assert row["busy_added_by_fused_ms"] == pytest.approx(row["busy_fused_ms"] - row["busy_none_ms"])
    assert row["fused_vs_copy"] == pytest.approx(row["fused_ms"] / row["copy_ms"])
    assert "fused / copy" in H.format_row(row)


def test_main_refuses_bad_shapes_and_writes_json(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        H.main(["--device", "cpu", "--shapes", "12x4"])  # 12 rows: not groups of 8
    assert e.value.code == 2 and "--shapes" in capsys.readouterr().err
    assert H.main(["--device", "cpu", "--shapes", "8x16", "--calls", "1", "--rounds", "1",
                   "--busy-ms", "0.1", "--profile-calls", "1", "--out", str(tmp_path)]) == 0
    import json
    rows = json.loads((tmp_path / "host_ladder.json").read_text())["rows"]
    assert [(r["B"], r["T"]) for r in rows] == [(8, 16)]
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]  # (no temporary file left)
    if not torch.cuda.is_available():
        assert H.main(["--shapes", "8x16"]) == 2  # cuda asked for, none here: a clear refusal
    sys.stdout.flush()
