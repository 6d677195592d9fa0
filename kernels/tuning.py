"""Measured launch tables: ``kernels/tuned/sm_<arch>.json``, written by ``bench/gpu/tune.py``.

Precedence in every ``launch_config`` that reads them (kernels/linear_logprobs_launch.py,
kernels/token_logprobs.py, kernels/pacs_loss_launch.py): an explicit ``CONFIG`` override of the kernel file
wins, then a measured entry of this table, then the built-in per-arch table (chosen from the compile
model). The PACS loss's entries hold its shape-independent launch policy (``pacs_loss_launch.launch_policy``:
bytes per program, programs per SM, warps, stages), from which its ``launch_config`` still derives
every shape's tiles.

File format (one per compute capability, and one per device where two devices of it were measured)::

    {"schema": 1, "arch": 90, "device": "NVIDIA H100 80GB HBM3", "triton": "3.9.0", "torch": "2.13.0+cu130",
     "dry_run": false,
     "kernels": {"linear_logprobs.stats_tiles.16": {"config": {"BLOCK_N": 128, ...}, "ms": ..., ...}}}

keyed by ``"<kernel file>.<launch_config name>.<16 | 32>"`` (16: bf16 / fp16, 32: fp32). Only the
keys the built-in configuration has are taken from an entry, as ints; the rest of the entry is the
tuner's record (times, shape, candidates). Entries of another kind hold a measured kernel *choice*
(``"linear_logprobs.forward.16": {"choice": "gluon", "ms": {...}}``: which of several kernels doing
the same job ran fastest, timed in alternation in one run; ``choice`` reads them). ``TUNED_DIR`` (or ``$PACS_FAST_TUNED_DIR``) points
elsewhere; a file that does not parse is ignored with one warning.

Versions: a table records the Triton, torch and device it was measured with (``"triton"``, ``"torch"``,
``"device"``; bench/gpu/tune_table.py writes them). Launch parameters and kernel choices measured under one
Triton (or torch) need not hold, or even compile spill-free, under another, so a table whose recorded
Triton or torch major.minor differs from the running ones is not used: one warning line names the
mismatch and the built-in choices serve (``version_mismatch``). A table that records no versions (a
hand-written one) is read. ``IGNORE_VERSIONS`` (``ignoring_versions()``) reads tables whatever they record:
the compile cases (kernels/aot_cases.py) compile a table's launches under CI's Triton that way, beside the
built-in ones the running Triton would get. This module imports only the standard library (triton and
torch for their versions, at call time).

Per device: the H100 and the H200 are both sm_90 but differ in bandwidth and clocks. ``sm_<arch>.json`` is
read on every device of that arch; a device that was measured after another (bench/gpu/tune_table.py: the
arch's table records another device) gets its own table, ``sm_<arch>.<device_slug>.json`` (``"NVIDIA H100
80GB HBM3"`` -> ``sm_90.nvidia_h100_80gb_hbm3.json``), whose entries replace the arch table's key by key on
that device (``running_device``: the current CUDA device's name); the arch table's other entries still
serve there. Each file is version-gated on its own. The compile cases compile every device's view
(``device_tables``, ``on_device``).

Per hidden size: an entry measured at hidden size ``"h"`` (else the ``H<n>`` of its ``"shape"``) may
hold ``"by_h": {"896": {"config": {...}, ...}}`` (a choice entry: ``{"896": {"choice": "gluon", ...}}``),
the winners re-timed at other hidden sizes (bench/gpu/tune.py ``--also-h``). A launch at hidden size
``H`` takes the measurement whose hidden size is nearest to ``H`` in ratio (a K loop of a similar
length), the entry itself when it has no ``by_h`` or ``H`` is not given.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import numbers
import os
import re
import warnings

from .caller import stacklevel

SCHEMA = 1
# None: $PACS_FAST_TUNED_DIR, else the tuned/ folder beside this file
TUNED_DIR: str | None = None
# True: tables are read whatever Triton / torch they were measured with (the compile cases' second view)
IGNORE_VERSIONS = False
VERSIONED = ("triton", "torch")  # the packages whose major.minor a table must share with the running ones
# None: the running CUDA device (``running_device``); a name: read tables as on that device; "": no device
DEVICE: str | None = None
_cache: dict = {}  # path -> (mtime_ns, parsed table, version mismatch)
_merged: dict = {}  # own table's path -> (stamp, its entries over sm_<arch>.json's)
_devices: dict = {}  # arch -> the running CUDA device's name (None: none of that arch)
_paths: dict = {}  # (arch, device, TUNED_DIR, $PACS_FAST_TUNED_DIR) -> (sm_<arch>.json, the device's own table)
_warned: set = set()
# Launch values a kernel can take: blocks and warps are powers of two, counts >= 1, flags >= 0. A grid of
# 0 programs launches nothing (outputs of torch.empty come back as they were) and GROUP_N = 0 divides by
# zero on the device, so a value outside these is never launched.
_POW2 = ("BLOCK_N", "BLOCK_V", "BLOCK_H", "BLOCK_V_BWD", "BLOCK_T", "BLOCK_S", "num_warps", "num_warps_large",
         "MAX_BLOCK_G")
_AT_LEAST_1 = ("GROUP_N", "V_TILES", "SPLITS", "ROWS", "N_SPLIT", "num_stages", "BWD_CHUNK_BYTES",
               "STREAM_BYTES", "PROGRAMS_PER_SM", "MAX_TILE", "GROUP_ELEMS", "MAX_GROUP_BYTES")
_AT_LEAST_0 = ("PERSISTENT", "FLATTEN", "WARP_SPECIALIZE", "PINGPONG", "ONE_PASS")


class LaunchConfigError(ValueError):
    """A launch value the user set (a kernel file's ``CONFIG`` / ``POLICY``, a kernel choice) that no kernel
    can take: raised to the caller, never taken for a kernel failure (which would fall back and switch the
    kernel off for the process, hiding the typo)."""


# Upper bounds no launch comes near (a hand-edited 2**40 block overflowed int32 in the launch, and the failure
# switched the kernel off for the process): a block's side <= 2**16 (Triton's tensors hold <= 2**20 elements),
# <= 32 warps (1,024 threads), <= 16 stages, flags 0 / 1 (PERSISTENT is a count: programs per SM, 0 = a grid
# over the tiles); other counts <= 2**20, byte budgets <= 2**40.
_MOST = {**dict.fromkeys(_POW2, 1 << 16), "num_warps": 32, "num_warps_large": 32, "num_stages": 16,
         "FLATTEN": 1, "WARP_SPECIALIZE": 1, "PINGPONG": 1, "ONE_PASS": 1, "MAX_BLOCK_G": 1024, "PERSISTENT": 64,
         "BWD_CHUNK_BYTES": 1 << 40, "MAX_GROUP_BYTES": 1 << 40}


def launch_value_problem(key: str, value) -> str | None:
    """Why ``value`` cannot be launch parameter ``key`` (None: it can; keys without a rule: any int)."""
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, int):
        return f"not an int ({type(value).__name__})"
    most = _MOST.get(key, 1 << 20)
    if key in _POW2 and (value < 1 or value & (value - 1) or value > most):
        return f"not a power of two in [1, {most}]"
    if key in _AT_LEAST_1 and not 1 <= value <= most:
        return f"not in [1, {most}]"
    if key in _AT_LEAST_0 and not 0 <= value <= most:
        return f"not in [0, {most}]"
    return None


def override(key: str, value, where: str = "CONFIG") -> int:
    """An explicit override ``where[key] = value`` as an int; a ``LaunchConfigError`` naming it when no
    kernel can take it (a float, a string, 0 or a negative count, a block that is no power of two)."""
    if isinstance(value, numbers.Integral):
        value = int(value)
    problem = launch_value_problem(key, value)
    if problem:
        raise LaunchConfigError(f"{where}[{key!r}] = {value!r}: {problem}")
    return value


def tuned_dir() -> str:
    env = os.environ.get("PACS_FAST_TUNED_DIR")
    if not TUNED_DIR and env and not os.path.isdir(env) and ("dir", env) not in _warned:
        _warned.add(("dir", env))
        warnings.warn(f"PACS_FAST_TUNED_DIR={env!r} is not a folder: no measured launch table is read", stacklevel=stacklevel())
    return TUNED_DIR or env or os.path.join(os.path.dirname(__file__), "tuned")


def device_slug(name) -> str:
    """A device's part of its own table's file name: ``"nvidia_h100_80gb_hbm3"`` for ``"NVIDIA H100 80GB HBM3"``."""
    return re.sub(r"[^a-z0-9]+", "_", str(name).lower()).strip("_")


def path_for(arch: int, folder: str | None = None, device: str | None = None) -> str:
    """``sm_<arch>.json`` in ``folder`` (default ``tuned_dir()``); with ``device``, that device's own table
    ``sm_<arch>.<device_slug>.json``."""
    name = f"sm_{arch}.{device_slug(device)}.json" if device else f"sm_{arch}.json"
    return os.path.join(folder or tuned_dir(), name)


def entry_key(module: str, kernel: str, width: str) -> str:
    return f"{module}.{kernel}.{width}"


def running_device(arch: int | None) -> str | None:
    """The device whose own table is read for ``arch``: ``DEVICE`` when set (``""``: none), else the current
    CUDA device's name where its compute capability is ``arch`` (looked up once per arch, and only once CUDA
    is initialised, as it is where a kernel launches: never initialised here); None without one (a CPU, the
    compile cases)."""
    if DEVICE is not None:
        return DEVICE or None
    if arch in _devices:
        return _devices[arch]
    try:
        import torch
        if not torch.cuda.is_initialized():
            return None
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        name = torch.cuda.get_device_name(index) if 10 * major + minor == arch else None
    except Exception:  # no usable CUDA: no device table
        name = None
    _devices[arch] = name
    return name


@contextlib.contextmanager
def on_device(name: str | None):
    """Within: tables are read as on device ``name`` (its own table over ``sm_<arch>.json``; None or
    ``""``: ``sm_<arch>.json`` alone), whatever runs here (the compile cases, tests)."""
    global DEVICE
    saved, DEVICE = DEVICE, name or ""
    try:
        yield
    finally:
        DEVICE = saved


def device_tables(arch: int) -> list[str]:
    """The devices with their own table for ``arch`` in ``tuned_dir()`` (the names they record, sorted; a
    file that does not parse or records another device than its name says is left out here and ignored,
    with a warning, where it would be read)."""
    folder, out = tuned_dir(), []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        hit = re.fullmatch(rf"sm_{arch}\.([a-z0-9_]+)\.json", name)
        if not hit:
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                device = json.load(f).get("device")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(device, str) and device_slug(device) == hit.group(1):
            out.append(device)
    return out


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def stamp(arch: int | None):
    """What identifies the tables ``load(arch)`` reads now: ``(path, mtime_ns, own_path, own_mtime_ns,
    IGNORE_VERSIONS)`` (``own``: the running device's own table, None without a device; an mtime is None
    when the file is absent); None for arch None (a cache key for launch configurations derived from them)."""
    if arch is None:
        return None
    device = running_device(arch)
    where = (arch, device, TUNED_DIR, os.environ.get("PACS_FAST_TUNED_DIR"))  # the launchers ask on every call:
    paths = _paths.get(where)  # the two paths are built once (the file stamps are read each time)
    if paths is None:
        paths = _paths[where] = (path_for(arch), path_for(arch, device=device) if device else None)
    path, own = paths
    return path, _mtime(path), own, _mtime(own) if own else None, IGNORE_VERSIONS


def load(arch: int | None) -> dict:
    """The measured entries for ``arch``: the ``kernels`` of ``sm_<arch>.json``, with those of the running
    device's own table (``sm_<arch>.<device>.json``, written where another device measured the first)
    taking their place key by key. A table absent, unreadable or measured with another Triton / torch
    major.minor (``version_mismatch``; one warning each) gives nothing; {} for arch None. Re-read when a
    file changes."""
    if arch is None:
        return {}
    path, mtime, own, own_mtime, ignoring = stamp(arch)
    shared = _kernels(path, mtime, arch, None)
    if own_mtime is None:
        return shared
    mine = _kernels(own, own_mtime, arch, running_device(arch))
    key = (path, mtime, own, own_mtime, ignoring)
    if _merged.get(own, (None,))[0] != key:
        _merged[own] = (key, {**shared, **mine})
    return _merged[own][1]


def _kernels(path: str, mtime: int | None, arch: int, device: str | None) -> dict:
    """The ``kernels`` of one table file (``device``: the device its name and content must record)."""
    if mtime is None:
        return {}
    hit = _cache.get(path)
    if hit is None or hit[0] != mtime:
        try:
            with open(path) as f:
                data = json.load(f)
            if not isinstance(data, dict):
                raise ValueError(f"not a JSON object ({type(data).__name__})")
            if data.get("schema") != SCHEMA or data.get("arch") != arch:
                raise ValueError(f"schema {data.get('schema')!r}, arch {data.get('arch')!r} "
                                 f"(expected {SCHEMA}, {arch})")
            if not isinstance(data.get("kernels"), dict):
                raise ValueError(f"its \"kernels\" is not an object ({type(data.get('kernels')).__name__})")
            if device is not None and device_slug(data.get("device") or "") != device_slug(device):
                raise ValueError(f"it records device {data.get('device')!r}, its name {device!r}")
        except (OSError, ValueError) as e:
            warnings.warn(f"ignoring the tuned launch table {path}: {e}", stacklevel=stacklevel())
            data = {"kernels": {}}
        hit = _cache[path] = (mtime, data, version_mismatch(data))
    why = None if IGNORE_VERSIONS else hit[2]
    if why is None:
        return hit[1]["kernels"]
    if (path, mtime) not in _warned:
        _warned.add((path, mtime))
        warnings.warn(f"ignoring the tuned launch table {path}: {why}; using the built-in launch choices "
                      f"(re-measure with bench/gpu/tune.py of the source repository under this Triton)",
                      stacklevel=stacklevel())
    return {}


def table_of(arch: int, key: str) -> str:
    """The file whose entry ``key`` ``load(arch)`` returns (the device's own table first; for messages)."""
    path, _, own, own_mtime, _ = stamp(arch)
    if own_mtime is not None and key in _kernels(own, own_mtime, arch, running_device(arch)):
        return own
    return path


def running_versions() -> dict:
    """``{"triton": ..., "torch": ...}``: the running packages' ``__version__`` (None when not importable)."""
    out = {}
    for name in VERSIONED:
        try:
            out[name] = str(importlib.import_module(name).__version__)
        except Exception:  # not installed (a table is then not usable anyway)
            out[name] = None
    return out


def major_minor(version) -> tuple[int, int] | None:
    """``(3, 6)`` for ``"3.6.0"`` / ``"3.6.0+git..."``, ``(2, 11)`` for ``"2.11.0+cu130"``; None if unparsable."""
    hit = re.match(r"\s*(\d+)\.(\d+)", str(version)) if version is not None else None
    return (int(hit.group(1)), int(hit.group(2))) if hit else None


def version_mismatch(data: dict, running: dict | None = None) -> str | None:
    """Why a table (the parsed JSON) does not fit the running Triton / torch (None: it does): a recorded
    version whose major.minor differs from the running one's. Versions the table does not record are not
    compared (hand-written tables)."""
    running = running_versions() if running is None else running
    bad = [f"{name.capitalize() if name == 'triton' else name} {data[name]} (running {running.get(name)})"
           for name in VERSIONED
           if data.get(name) is not None and major_minor(data[name]) != major_minor(running.get(name))]
    return ("measured with " + ", ".join(bad)) if bad else None


@contextlib.contextmanager
def ignoring_versions(on: bool = True):
    """Within: tables are read whatever Triton / torch they record (``IGNORE_VERSIONS``)."""
    global IGNORE_VERSIONS
    saved, IGNORE_VERSIONS = IGNORE_VERSIONS, on
    try:
        yield
    finally:
        IGNORE_VERSIONS = saved


def table_version_mismatch(arch: int | None) -> str | None:
    """``version_mismatch`` of the tables ``load(arch)`` reads (``sm_<arch>.json``, then the running
    device's own) against the running versions: the first that does not fit (None when absent, unreadable
    or fitting); no warning."""
    with ignoring_versions():
        load(arch)
    if arch is None:
        return None
    path, mtime, own, own_mtime, _ = stamp(arch)
    for p, m in ((path, mtime), (own, own_mtime)):
        hit = _cache.get(p) if m is not None else None
        if hit is not None and hit[0] == m and hit[2]:
            return hit[2]
    return None


def measured_h(entry: dict) -> int | None:
    """The hidden size an entry was measured at: its ``"h"``, else the ``H<n>`` of its ``"shape"``."""
    h = entry.get("h")
    if isinstance(h, int) and not isinstance(h, bool) and h > 0:
        return h
    hit = re.search(r"\bH(\d+)\b", str(entry.get("shape", "")))
    return int(hit.group(1)) if hit else None


def nearest(entry, h: int | None, field: str | None = None):
    """The part of ``entry`` measured nearest to hidden size ``h`` (ratio distance; ties: the
    entry itself): the entry, or one of its ``by_h`` values (with ``field``: only one holding it)."""
    by_h = entry.get("by_h") if isinstance(entry, dict) else None
    if h is None or h <= 0 or not isinstance(by_h, dict):
        return entry
    own = measured_h(entry)
    best, dist = entry, abs(math.log(h / own)) if own else math.inf
    for key, sub in sorted(by_h.items()):
        if isinstance(sub, dict) and (field is None or field in sub) and str(key).isdigit() and int(key) > 0 \
                and abs(math.log(h / int(key))) < dist:
            best, dist = sub, abs(math.log(h / int(key)))
    return best


def hidden_sizes(arch: int | None, module: str = "linear_logprobs") -> list[int]:
    """The hidden sizes of the ``by_h`` measurements of ``module``'s entries in ``sm_<arch>.json``
    (sorted; [] without a table): the compile test compiles the launches chosen at each."""
    out = set()
    for key, entry in load(arch).items():
        if key.startswith(module + ".") and isinstance(entry, dict) and isinstance(entry.get("by_h"), dict):
            out.update(int(k) for k in entry["by_h"] if str(k).isdigit() and int(k) > 0)
    return sorted(out)


def apply(cfg: dict, module: str, kernel: str, arch: int | None, width: str, h: int | None = None) -> dict:
    """``cfg`` (the built-in configuration) updated with the measured entry, if any (at hidden size
    ``h``: the entry's measurement nearest to it, ``nearest``)."""
    entry = nearest(load(arch).get(entry_key(module, kernel, width)), h, "config")
    if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
        return cfg
    out = dict(cfg)
    for k, v in entry["config"].items():
        if k in out and isinstance(v, (int, bool)):
            problem = launch_value_problem(k, v)
            if problem is None:
                out[k] = int(v)
                continue
            path = table_of(arch, entry_key(module, kernel, width))
            if (path, module, kernel, k, v) not in _warned:
                _warned.add((path, module, kernel, k, v))
                warnings.warn(f"ignoring {entry_key(module, kernel, width)} {k} = {v!r} of the tuned launch table "
                              f"{path}: {problem}; the built-in value serves", stacklevel=stacklevel())
    return out


def choice(key: str, arch: int | None, allowed, h: int | None = None) -> str | None:
    """The measured choice ``key`` of ``sm_<arch>.json`` (at hidden size ``h``: the measurement nearest
    to it; None when absent; one warning and None when it names something not in ``allowed``, e.g. a
    kernel this version no longer has)."""
    entry = nearest(load(arch).get(key), h, "choice")
    picked = entry.get("choice") if isinstance(entry, dict) else None
    if picked is None or picked in allowed:
        return picked
    path = table_of(arch, key)
    if (path, key, repr(picked)) not in _warned:  # once, not on every launch
        _warned.add((path, key, repr(picked)))
        warnings.warn(f"ignoring the measured choice {key} = {picked!r} of {path}: not one of "
                      f"{tuple(allowed)}", stacklevel=stacklevel())
    return None
