"""Per-device measured tables (kernels/tuning.py): an H100 and an H200 are both sm_90, so a tuner run on the
second device writes that device's own table, ``sm_90.<device>.json``, beside the first's instead of merging
into it (bench/gpu/tune_table.py ``table_to_write``); on that device its entries replace the arch table's key
by key, on any other the arch table alone is read; each file is version-gated and checked on its own; the
compile cases compile each device's view. No GPU: the device is set with ``tuning.on_device`` (or a stubbed
``torch.cuda``) as the dispatcher's ``running_device`` would find it."""
import hashlib
import itertools
import json
import os
import sys

import pytest
import torch

pytest.importorskip("triton", reason="the launch configurations are computed with triton's helpers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
_STAMPS = itertools.count(100)


def _write(path, kernels, **top):
    path.write_text(json.dumps({"schema": 1, "arch": 90, "kernels": kernels, **top}))
    stamp = next(_STAMPS)  # a new mtime each time: re-read whatever the file system's clock resolution
    os.utime(path, ns=(stamp, stamp))


def _dlogits():
    from pacs_fast.kernels import linear_logprobs as KL
    return KL.launch_config("dlogits", N=8192, V=151936, H=4096, dtype=torch.bfloat16, arch=90)


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """sm_90.json (measured on an H200: dz stages 4, forward choice "tma") and the H100's own table (dz
    stages 2 only); the built-in dz launch for comparison."""
    from pacs_fast.kernels import linear_logprobs as KL, tuning
    monkeypatch.setitem(KL.CONFIG, "FWD", None)
    monkeypatch.setitem(KL.CONFIG, "DLOGITS", None)
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)
    builtin = _dlogits()
    assert builtin["num_stages"] not in (2, 4)  # else the test could not tell the tables apart
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    _write(tmp_path / "sm_90.json", {"linear_logprobs.dlogits.16": {"config": {"num_stages": 4}},
                                     "linear_logprobs.forward.16": {"choice": "tma"}}, device=H200)
    own = tmp_path / "sm_90.nvidia_h100_80gb_hbm3.json"
    _write(own, {"linear_logprobs.dlogits.16": {"config": {"num_stages": 2}}}, device=H100)
    return tmp_path, own, builtin


def test_a_device_reads_its_own_entries_over_the_arch_table(tables):
    from pacs_fast.kernels import linear_logprobs as KL, tuning
    folder, own, builtin = tables
    assert tuning.path_for(90, str(folder), H100) == str(own)
    for device, stages in ((H100, 2), (H200, 4), (None, 4), ("NVIDIA A100-SXM4-80GB", 4)):
        with tuning.on_device(device):
            assert _dlogits() == dict(builtin, num_stages=stages), device
            # an entry the device's own table lacks comes from the arch table
            assert KL.forward_kind(90, "16") == "tma", device
            assert tuning.table_of(90, "linear_logprobs.dlogits.16") == str(own if stages == 2 else
                                                                             folder / "sm_90.json")
    assert tuning.device_tables(90) == [H100] and tuning.device_tables(80) == []
    # the tuned table's file stamps key the PACS loss's memo: the own table's stamp is part of it
    with tuning.on_device(H100):
        before = tuning.stamp(90)
        _write(own, {}, device=H100)
        assert tuning.stamp(90) != before and _dlogits() == dict(builtin, num_stages=4)


def test_a_device_table_of_another_device_or_other_versions_is_ignored_with_one_warning(tables):
    import warnings

    from pacs_fast.kernels import tuning
    folder, own, builtin = tables
    _write(own, {"linear_logprobs.dlogits.16": {"config": {"num_stages": 2}}}, device=H200)  # copied by hand
    with tuning.on_device(H100):
        with pytest.warns(UserWarning, match=r"ignoring the tuned launch table .*sm_90\.nvidia_h100_80gb_hbm3\.json: "
                                             r"it records device 'NVIDIA H200'"):
            assert _dlogits() == dict(builtin, num_stages=4)  # the arch table still serves
    _write(own, {"linear_logprobs.dlogits.16": {"config": {"num_stages": 2}}}, device=H100, triton="2.1.0")
    with tuning.on_device(H100):
        with pytest.warns(UserWarning, match=r"sm_90\.nvidia_h100_80gb_hbm3\.json: measured with Triton 2\.1\.0") as seen:
            assert _dlogits() == dict(builtin, num_stages=4)
        assert len([w for w in seen if "tuned launch table" in str(w.message)]) == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per file: later reads are silent
            assert _dlogits() == dict(builtin, num_stages=4)
            assert "Triton 2.1.0" in tuning.table_version_mismatch(90)
            with tuning.ignoring_versions():
                assert _dlogits() == dict(builtin, num_stages=2)
    with tuning.on_device(H200):
        assert tuning.table_version_mismatch(90) is None  # the H200 never reads the H100's table


def test_device_tables_lists_only_files_that_name_their_device(tmp_path, monkeypatch):
    from pacs_fast.kernels import tuning
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    assert tuning.device_tables(90) == []
    _write(tmp_path / "sm_90.nvidia_h100_80gb_hbm3.json", {}, device=H100)
    _write(tmp_path / "sm_90.nvidia_h200.json", {}, device=H100)  # content and name disagree
    (tmp_path / "sm_90.nvidia_gh200.json").write_text("{")  # cut short
    (tmp_path / "sm_90.json.bak").write_text("{}")
    (tmp_path / "README.md").write_text("# tables")
    _write(tmp_path / "sm_100.nvidia_b200.json", {}, device="NVIDIA B200")
    assert tuning.device_tables(90) == [H100] and tuning.device_tables(100) == ["NVIDIA B200"]
    assert tuning.device_slug(" NVIDIA  H100 PCIe ") == "nvidia_h100_pcie"


def test_running_device_is_the_current_cuda_device_of_that_arch(monkeypatch):
    """Read from torch.cuda once CUDA is initialised (where a kernel launches), once per arch; never
    initialising CUDA itself (a CPU, or a process that will fork); ``DEVICE`` / ``on_device`` win."""
    from pacs_fast.kernels import tuning
    monkeypatch.setattr(tuning, "_devices", {})
    monkeypatch.setattr(tuning, "DEVICE", None)
    calls = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: calls.append("init") is None and initialised)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: calls.append("name") or H100)
    initialised = False
    assert tuning.running_device(90) is None and tuning._devices == {}  # not cached: CUDA may start later
    initialised = True
    assert [tuning.running_device(a) for a in (90, 80, 90, 80)] == [H100, None, H100, None]
    assert calls.count("name") == 1
    with tuning.on_device("NVIDIA H200"):
        assert tuning.running_device(90) == "NVIDIA H200"
    with tuning.on_device(None):
        assert tuning.running_device(90) is None
    assert tuning.running_device(90) == H100


def test_the_tuner_writes_a_second_device_beside_the_first(tmp_path, monkeypatch):
    """bench/gpu/tune_table.py: the first device measured writes sm_90.json; a run on another device writes
    (and then merges into) its own table and leaves the first device's file byte for byte; the first device
    merges into sm_90.json as before; a dry run writes sm_90.json."""
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench", "gpu"))
    monkeypatch.delitem(sys.modules, "tune_table", raising=False)
    from tune_table import write_table

    from pacs_fast.kernels import tuning
    entry = lambda n: {"config": {"num_stages": n}}  # noqa: E731
    key = "linear_logprobs.dlogits.16"
    shared = write_table(str(tmp_path), 90, H200, {key: entry(4)}, False)
    assert shared == str(tmp_path / "sm_90.json")
    digest = hashlib.sha256(open(shared, "rb").read()).hexdigest()
    own = write_table(str(tmp_path), 90, H100, {key: entry(2)}, False)
    assert own == str(tmp_path / "sm_90.nvidia_h100_80gb_hbm3.json")
    assert hashlib.sha256(open(shared, "rb").read()).hexdigest() == digest
    assert write_table(str(tmp_path), 90, H100, {"token_logprobs.grad_bwd.16": entry(3)}, False) == own
    data = json.load(open(own))
    assert data["device"] == H100 and set(data["kernels"]) == {key, "token_logprobs.grad_bwd.16"}
    assert write_table(str(tmp_path), 90, H200, {"linear_logprobs.grad_bwd.16": entry(5)}, False) == shared
    assert set(json.load(open(shared))["kernels"]) == {key, "linear_logprobs.grad_bwd.16"}
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    with tuning.on_device(H100):
        assert tuning.load(90)[key] == entry(2) and "linear_logprobs.grad_bwd.16" in tuning.load(90)
    dry = tmp_path / "dry"
    assert write_table(str(dry), 90, "dry run (no GPU)", {key: entry(4)}, True) == str(dry / "sm_90.json")
    # a real run after a dry run's table (same folder): sm_90.json, not a device table beside a dry run
    assert write_table(str(dry), 90, H100, {key: entry(2)}, False) == str(dry / "sm_90.json")


def test_compile_cases_compile_each_devices_launches(tables, monkeypatch):
    """kernels/aot_cases.py ``cases``: a launch only the H100's table chooses is compiled too, marked with
    the device; without device tables the cases are those of the arch table alone."""
    from pacs_fast.kernels import aot
    folder, own, builtin = tables
    marked = lambda cases: {c.key for c in cases if any("[NVIDIA H100" in s for s in c.shapes)}  # noqa: E731
    with_own = aot.cases((90,))
    assert marked(with_own)
    own.unlink()
    without = {c.key for c in aot.cases((90,))}
    assert not marked(aot.cases((90,)))
    only_h100 = {c.key for c in with_own} - without
    assert only_h100 and only_h100 <= marked(with_own)
    dz = [c for c in with_own if c.key in only_h100 and c.kernel == "dlogits"]
    assert dz and all(c.num_stages == 2 for c in dz)
