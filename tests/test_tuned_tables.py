"""The measured launch tables as ``launch_config`` reads them (kernels/tuning.py), without running
the tuner (tests/test_gpu_tune.py runs its dry run): the entry measured at the nearest hidden size,
an unreadable table ignored with a warning, and the PACS loss's measured policy, from which
``launch_config`` still derives every shape's tiles."""
import itertools
import json
import os
import re

import pytest
import torch

pytest.importorskip("triton", reason="the launch configurations are computed with triton's helpers")

SHAPES = ((1024, 4096), (8192, 1024))


def _dlogits_config():
    from pacs_fast.kernels import linear_logprobs as KL
    return KL.launch_config("dlogits", N=8192, V=151936, H=4096, dtype=torch.bfloat16, arch=90)


def _pacs(kernel, b, t, arch=90, g=8, dtype=torch.float32, **kw):
    from pacs_fast.kernels import pacs_loss_launch as KPL
    return KPL.launch_config(kernel, B=b, T=t, G=g, dtype=dtype, arch=arch, **kw)


def _tiles(cfg):
    return cfg["ROWS"], cfg["BLOCK_T"], cfg["N_SPLIT"], cfg["num_warps"]


# the built-in configurations (kernels/pacs_loss_launch.py launch_config's docstring), fp32, 132 SMs
BUILTIN = {"fwd_sums": [(1, 2048, 2, 4), (2, 1024, 1, 4)], "bwd": [(1, 4096, 1, 8), (4, 1024, 1, 8)]}


def test_nearest_measurement_by_hidden_size():
    """kernels/tuning.py ``nearest``: ratio distance, the entry itself on a tie or without a hidden size
    to compare (no ``h``: the ``H<n>`` of its shape), ``by_h`` keys that are not sizes ignored."""
    from pacs_fast.kernels import tuning
    entry = {"shape": "N8192 H4096 V151936", "config": "main",
             "by_h": {"896": {"config": "small"}, "16384": {"config": "big"}, "x": {"config": "bad"}, "0": {}}}
    pick = lambda h: tuning.nearest(entry, h)["config"]  # noqa: E731
    assert [pick(h) for h in (None, 0, 64, 896, 1915, 1917, 4096, 8191, 8193, 10 ** 6)] == \
        ["main", "main", "small", "small", "small", "main", "main", "main", "big", "big"]
    assert pick(2 * 4096) == "main"  # a tie (8192 is as far from 4096 as from 16384): the entry itself
    assert tuning.nearest(dict(entry, h=16384), 12000)["config"] == "main"  # "h" wins over the shape
    assert tuning.nearest({"config": "only", "by_h": {"896": {"config": "small"}}}, 4096)["config"] == "small"
    assert tuning.nearest(None, 896) is None and tuning.nearest({"config": 1}, 896) == {"config": 1}
    # a by_h part without the field asked for (a hand-edited table) is passed over: the entry serves
    odd = {"h": 4096, "config": "main", "by_h": {"896": {"ms": 1.0}, "16384": {"config": "big"}}}
    assert tuning.nearest(odd, 896, "config")["config"] == "main" and tuning.nearest(odd, 896) == {"ms": 1.0}
    # a hand-edited "h" that is no size (negative, 0, a bool): as if absent (math.log raised "math domain error")
    for h in (-5, 0, True):
        assert tuning.nearest(dict(entry, h=h), 896)["config"] == "small"
        assert tuning.measured_h(dict(entry, h=h)) == 4096  # the shape's H instead
    # PERSISTENT is a count (programs per SM: the tuner tries 2), the flags are 0 / 1
    assert tuning.launch_value_problem("PERSISTENT", 2) is None and tuning.launch_value_problem("PINGPONG", 2)


def test_unreadable_table_is_ignored_with_a_warning(tmp_path, monkeypatch):
    from pacs_fast.kernels import tuning
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)
    want = _dlogits_config()
    (tmp_path / "sm_90.json").write_text('{"schema": 1, "arch": 90, "kernels": ')  # cut short
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    with pytest.warns(UserWarning, match="ignoring the tuned launch table"):
        assert _dlogits_config() == want
    # an entry's unknown keys and non-integers are ignored; known keys are taken
    (tmp_path / "sm_90.json").write_text(json.dumps({"schema": 1, "arch": 90, "kernels": {
        "linear_logprobs.dlogits.16": {"config": {"num_stages": 4, "BOGUS": 1, "BLOCK_N": "x"}}}}))
    os.utime(tmp_path / "sm_90.json", ns=(1, 2))  # a new stamp: re-read
    assert _dlogits_config() == dict(want, num_stages=4)


def test_pacs_measured_policy_stays_shape_adaptive(tmp_path, monkeypatch):
    from pacs_fast.kernels import pacs_loss_launch as KPL, tuning
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    for kernel, want in BUILTIN.items():  # no table yet: the built-in configurations
        assert [_tiles(_pacs(kernel, b, t)) for b, t in SHAPES] == want
    (tmp_path / "sm_90.json").write_text(json.dumps({"schema": 1, "arch": 90, "kernels": {
        "pacs_loss.fwd_sums.32": {"config": dict(KPL.BUILTIN_POLICY["fwd_sums"], STREAM_BYTES=32768)},
        "pacs_loss.bwd.32": {"config": dict(KPL.BUILTIN_POLICY["bwd"], PROGRAMS_PER_SM=16, num_warps=2)},
        "pacs_loss.fwd.32": {"config": dict(KPL.BUILTIN_POLICY["fwd"], GROUP_ELEMS=512, num_warps=2)}}}))
    # pass A: 32 KB per program -> 4096-element tiles (9 B per token), laid out per shape
    assert [_tiles(_pacs("fwd_sums", b, t)) for b, t in SHAPES] == [(1, 4096, 1, 4), (4, 1024, 1, 4)]
    # backward: >= 16 programs per SM -> tiles halve until the grid has 16 x 132 programs, 2 warps
    assert [_tiles(_pacs("bwd", b, t)) for b, t in SHAPES] == [(1, 1024, 4, 2), (2, 1024, 1, 2)]
    assert _tiles(_pacs("bwd", 1024, 4096, sm_count=114)) == (1, 2048, 2, 2)  # the device's own SM count
    # pass B: <= 512 elements per step (G = 64, pass A's N_SPLIT = 16), 2 warps
    got = _pacs("fwd", 64, 65536, g=64)
    assert (got["BLOCK_G"], got["BLOCK_S"], got["num_warps"]) == (64, 8, 2)
    # an explicit CONFIG override still wins, a POLICY override too; an unknown knob is an error
    monkeypatch.setitem(KPL.CONFIG, "ROWS", 8)
    monkeypatch.setitem(KPL.CONFIG, "BLOCK_T", 64)
    assert _tiles(_pacs("fwd_sums", 1024, 4096)) == (8, 64, 64, 4)
    monkeypatch.setitem(KPL.CONFIG, "ROWS", None)
    monkeypatch.setitem(KPL.CONFIG, "BLOCK_T", None)
    monkeypatch.setitem(KPL.POLICY, "fwd_sums", {"STREAM_BYTES": 16384})
    assert [_tiles(_pacs("fwd_sums", b, t)) for b, t in SHAPES] == BUILTIN["fwd_sums"]
    monkeypatch.setitem(KPL.POLICY, "fwd_sums", {"STREAM_BYTE": 1})
    with pytest.raises(ValueError, match="unknown knobs"):
        _pacs("fwd_sums", 1024, 4096)
    monkeypatch.setitem(KPL.POLICY, "fwd_sums", {})
    # no table for sm_80, none for bf16 / fp64 entries: exactly the built-in configurations
    for kernel, want in BUILTIN.items():
        assert [_tiles(_pacs(kernel, b, t, arch=80)) for b, t in SHAPES] == want
        assert _pacs(kernel, 1024, 4096, dtype=torch.float64) == _pacs(kernel, 1024, 4096, arch=None,
                                                                       dtype=torch.float64)
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)
    builtin_bf16 = [_pacs(k, b, t, dtype=torch.bfloat16) for k in KPL.KERNELS for b, t in SHAPES]
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    assert [_pacs(k, b, t, dtype=torch.bfloat16) for k in KPL.KERNELS for b, t in SHAPES] == builtin_bf16


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _builtin_keys(module, kernel, width):
    """The launch parameters an entry of ``module.kernel.width`` may set: the built-in configuration's."""
    from pacs_fast.kernels import linear_logprobs as KL, pacs_loss_launch as KPL, token_logprobs as KT
    dtype = torch.float32 if width == "32" else torch.bfloat16
    if module == "pacs_loss":
        return set(KPL.BUILTIN_POLICY[kernel])
    if module == "token_logprobs":
        return set(KT.launch_config(kernel, N=8192, V=151936, dtype=dtype, arch=None))
    return set(KL.launch_config(kernel, N=8192, V=151936, H=4096, dtype=dtype, arch=None)) | {"PINGPONG"}


def test_committed_tables_record_what_they_were_measured_with():
    """Every kernels/tuned/sm_<arch>.json: the schema, its arch, the device, Triton and torch of the
    measurement (kernels/tuning.py does not use a table whose Triton or torch major.minor differs from the
    running ones), not a dry run, and entries that are either a launch of the built-in keys (ints within the
    loader's launch bounds) or a kernel choice the dispatcher knows (at every measured hidden size). sm_90's
    provenance (docs/GPU.md, bench/results/gpu/20261127_h200/README.md): one H200, torch 2.11.0+cu130, Triton
    3.6.0."""
    import glob

    from pacs_fast.kernels import linear_logprobs as KL, tuning
    paths = sorted(glob.glob(os.path.join(ROOT, "kernels", "tuned", "sm_*.json")))
    assert paths
    for path in paths:
        data = json.load(open(path))
        arch, slug = re.fullmatch(r"sm_(\d+)(?:\.([a-z0-9_]+))?\.json", os.path.basename(path)).groups()
        assert data["schema"] == tuning.SCHEMA and data["arch"] == int(arch) and data["dry_run"] is False, path
        assert isinstance(data["device"], str) and data["device"].startswith("NVIDIA "), path
        assert slug in (None, tuning.device_slug(data["device"])), path  # a device's own table names it
        assert all(tuning.major_minor(data[name]) for name in tuning.VERSIONED), path
        for key, entry in data["kernels"].items():
            module, kernel, width = key.split(".")
            assert width in ("16", "32") and isinstance(entry, dict), key
            parts = [entry] + list(entry.get("by_h", {}).values())
            if module == "linear_logprobs" and kernel in ("forward", "dz"):
                allowed = KL.FORWARDS if kernel == "forward" else KL.DZ_KERNELS
                assert all(p["choice"] in allowed for p in parts), key
                continue
            keys = _builtin_keys(module, kernel, width)
            for p in parts:
                assert set(p["config"]) <= keys and all(isinstance(v, int) for v in p["config"].values()), key
                # the launch bounds the loader applies (kernels/tuning.py launch_value_problem): a committed value
                # outside them would be dropped, with a warning, only where the table's versions run (the GPU)
                assert not {k: tuning.launch_value_problem(k, v) for k, v in p["config"].items()
                            if tuning.launch_value_problem(k, v)}, key
    sm90 = json.load(open(os.path.join(ROOT, "kernels", "tuned", "sm_90.json")))
    assert (sm90["device"], sm90["triton"], sm90["torch"]) == ("NVIDIA H200", "3.6.0", "2.11.0+cu130")
    readme = open(os.path.join(ROOT, "bench", "results", "gpu", "20261127_h200", "README.md")).read()
    assert "torch 2.11.0+cu130, Triton **3.6.0**" in readme and "H200" in readme


_STAMPS = itertools.count(10)


def _write(path, **fields):
    table = {"schema": 1, "arch": 90, "kernels": {
        "linear_logprobs.dlogits.16": {"config": {"num_stages": 4}},
        "linear_logprobs.forward.16": {"choice": "tma"}}}
    path.write_text(json.dumps(dict(table, **fields)))
    stamp = next(_STAMPS)  # a new mtime each time: re-read
    os.utime(path, ns=(stamp, stamp))


def test_a_table_measured_under_other_versions_is_ignored_with_one_warning(tmp_path, monkeypatch):
    """The table's recorded Triton and torch must share the running ones' major.minor (a patch release or a
    local build suffix does not matter); otherwise one warning line names the mismatch, the built-in launch
    and kernel choice serve, and later reads are silent. A table recording no versions is read. The compile
    cases read every table (``ignoring_versions``)."""
    import warnings

    from pacs_fast.kernels import linear_logprobs as KL, tuning
    monkeypatch.setitem(KL.CONFIG, "FWD", None)
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)
    want = _dlogits_config()
    running = tuning.running_versions()
    (tri_maj, tri_min), (pt_maj, pt_min) = tuning.major_minor(running["triton"]), tuning.major_minor(running["torch"])
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    table = tmp_path / "sm_90.json"
    for fields in (dict(triton=f"{tri_maj}.{tri_min}.99", torch=f"{pt_maj}.{pt_min}.7+cu999", device="NVIDIA X"), {}):
        _write(table, **fields)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _dlogits_config() == dict(want, num_stages=4) and KL.forward_kind(90, "16") == "tma"
    other_torch = f"{pt_maj}.{pt_min + 1}.0"
    for fields, named in ((dict(triton="2.1.0", torch=running["torch"]), r"Triton 2\.1\.0 \(running "),
                          (dict(triton=running["triton"], torch=other_torch), rf"torch {other_torch} \(running ")):
        _write(table, **fields)
        with pytest.warns(UserWarning, match=r"ignoring the tuned launch table .*sm_90\.json: measured with "
                                             + named) as seen:
            assert _dlogits_config() == want
        assert len([w for w in seen if "tuned launch table" in str(w.message)]) == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per table: the next reads are silent
            assert _dlogits_config() == want and KL.forward_kind(90, "16") == "tiles"
            assert tuning.table_version_mismatch(90) and not tuning.table_version_mismatch(80)
            with tuning.ignoring_versions():
                assert _dlogits_config() == dict(want, num_stages=4)


def test_the_committed_table_is_ignored_where_its_versions_do_not_run():
    """sm_90.json was measured under Triton 3.6 / torch 2.11: under CI's Triton 3.9 / torch 2.13 the
    launches are the built-in ones (and kernels/aot_cases.py compiles both)."""
    from pacs_fast.kernels import tuning
    running = tuning.running_versions()
    fits = (tuning.major_minor(running["triton"]), tuning.major_minor(running["torch"])) == ((3, 6), (2, 11))
    assert bool(tuning.table_version_mismatch(90)) is not fits


def _table(tmp_path, kernels, **top):
    (tmp_path / "sm_90.json").write_text(json.dumps({"schema": 1, "arch": 90, "kernels": kernels, **top}))


@pytest.mark.parametrize("key,value", [("GROUP_N", 0), ("PERSISTENT", -1), ("BLOCK_N", 96), ("num_warps", 0),
                                       ("BLOCK_N", 2**40), ("num_warps", 64), ("GROUP_N", 2**21),
                                       ("PERSISTENT", 65)])
def test_a_table_value_no_kernel_can_take_is_ignored_with_one_warning(tmp_path, monkeypatch, key, value):
    """A hand-edited entry {"GROUP_N": 0} launched a grid of 0 programs: log-probs off by 1e29 with no
    error for the fallback to catch (kernel dispatch sweep); {"BLOCK_N": 2**40} overflowed int32 in the
    launch, and the failure switched the tiled kernels off for the process (sweep of 2026-11-30). Such a
    value is ignored, named once."""
    import warnings

    from pacs_fast.kernels import linear_logprobs as KL, tuning
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)
    want = KL.launch_config("stats_tiles", N=8192, V=151936, H=4096, dtype=torch.bfloat16, arch=90)
    _table(tmp_path, {"linear_logprobs.stats_tiles.16": {"config": {key: value, "num_stages": 2}}})
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            got = KL.launch_config("stats_tiles", N=8192, V=151936, H=4096, dtype=torch.bfloat16, arch=90)
    assert got == dict(want, num_stages=2)  # the valid value of the entry is still taken
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and f"linear_logprobs.stats_tiles.16 {key} = {value}" in msgs[0] and "sm_90.json" in msgs[0]


@pytest.mark.parametrize("text,why", [("[]", "not a JSON object (list)"), ("null", "not a JSON object (NoneType)"),
                                      ('{"schema": 1, "arch": 90, "kernels": []}', '"kernels" is not an object')])
def test_a_table_of_another_shape_is_ignored_naming_the_file(tmp_path, monkeypatch, text, why):
    """A JSON list or null raised AttributeError inside every op (taken for a kernel failure, the Triton
    path then off for the process, the file never named); a list of kernels was blamed on 'schema 1, arch 90'."""
    from pacs_fast.kernels import tuning
    monkeypatch.setattr(tuning, "TUNED_DIR", os.devnull)
    want = _dlogits_config()
    (tmp_path / "sm_90.json").write_text(text)
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    import re
    with pytest.warns(UserWarning, match=re.escape(f"ignoring the tuned launch table {tmp_path / 'sm_90.json'}: ")
                      + ".*" + re.escape(why)):
        assert _dlogits_config() == want


@pytest.mark.parametrize("module,key,value,match", [
    ("linear_logprobs", "GROUP_N", 0, r"CONFIG\['GROUP_N'\] = 0: not in \[1, 1048576\]"),
    ("linear_logprobs", "GROUP_N", -1, r"CONFIG\['GROUP_N'\] = -1: not in \[1, 1048576\]"),
    ("linear_logprobs", "BLOCK_N", 2**17, r"CONFIG\['BLOCK_N'\] = 131072: not a power of two in \[1, 65536\]"),
    ("linear_logprobs", "BLOCK_N", 16.7, r"CONFIG\['BLOCK_N'\] = 16.7: not an int \(float\)"),
    ("linear_logprobs", "BLOCK_V", "64", r"CONFIG\['BLOCK_V'\] = '64': not an int \(str\)"),
    ("token_logprobs", "BLOCK_V_BWD", -64, r"CONFIG\['BLOCK_V_BWD'\] = -64: not a power of two"),
    ("pacs_loss_launch", "N_SPLIT", 0, r"CONFIG\['N_SPLIT'\] = 0: not in \[1, 1048576\]"),
])
def test_an_override_no_kernel_can_take_is_a_launch_config_error(monkeypatch, module, key, value, match):
    """CONFIG[GROUP_N] = -1 corrupted the process's memory, = 0 gave log-probs off by 8.9; 16.7 was cut to
    16 and '64' taken (kernel dispatch sweep). Now a LaunchConfigError (a ValueError) naming the key."""
    import importlib

    from pacs_fast.kernels import tuning
    mod = importlib.import_module(f"pacs_fast.kernels.{module}")
    monkeypatch.setitem(mod.CONFIG, key, value)
    with pytest.raises(tuning.LaunchConfigError, match=match):
        if module == "linear_logprobs":
            mod.launch_config("stats_tiles", N=64, V=512, H=64, dtype=torch.float32, arch=None)
        elif module == "token_logprobs":
            mod.launch_config("grad_bwd", N=64, V=512, dtype=torch.float32, arch=None)
        else:
            mod.launch_config("fwd_sums", B=16, T=64, G=4, dtype=torch.float32, arch=None)


def test_a_policy_typo_and_a_missing_tuned_dir_are_named(monkeypatch, tmp_path):
    import warnings

    from pacs_fast.kernels import pacs_loss_launch as KPL, tuning
    monkeypatch.setitem(KPL.POLICY, "bwd", {"STREAM_BYTE": 1 << 16})
    with pytest.raises(tuning.LaunchConfigError, match=r"POLICY\['bwd'\]: unknown knobs \['STREAM_BYTE'\]; known: "):
        _pacs("bwd", 64, 64, arch=None)
    missing = tmp_path / "nope"
    monkeypatch.setenv("PACS_FAST_TUNED_DIR", str(missing))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuning.tuned_dir()
        tuning.tuned_dir()
    assert [str(w.message) for w in caught] == [f"PACS_FAST_TUNED_DIR={str(missing)!r} is not a folder: no "
                                                "measured launch table is read"]


def test_an_unknown_measured_choice_warns_once_not_on_every_launch(tmp_path, monkeypatch):
    import warnings

    from pacs_fast.kernels import tuning
    _table(tmp_path, {"linear_logprobs.forward.16": {"choice": "cutlass"}})
    monkeypatch.setattr(tuning, "TUNED_DIR", str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        picks = [tuning.choice("linear_logprobs.forward.16", 90, ("tiles", "tma")) for _ in range(4)]
    assert picks == [None] * 4 and len(caught) == 1 and "'cutlass'" in str(caught[0].message)
