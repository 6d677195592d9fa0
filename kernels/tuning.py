"""Measured launch tables: ``kernels/tuned/sm_<arch>.json``, written by ``bench/gpu/tune.py``.

Precedence in every ``launch_config`` that reads them (kernels/linear_logprobs_launch.py,
kernels/token_logprobs.py, kernels/pacs_loss_launch.py): an explicit ``CONFIG`` override of the kernel file
wins, then a measured entry of this table, then the built-in per-arch table (chosen from the compile
model). The PACS loss's entries hold its shape-independent launch policy (``pacs_loss_launch.launch_policy``:
bytes per program, programs per SM, warps, stages), from which its ``launch_config`` still derives
every shape's tiles.

File format (one per compute capability)::

    {"schema": 1, "arch": 90, "device": "NVIDIA H100 80GB HBM3", "triton": "3.9.0", "dry_run": false,
     "kernels": {"linear_logprobs.stats_tiles.16": {"config": {"BLOCK_N": 128, ...}, "ms": ..., ...}}}

keyed by ``"<kernel file>.<launch_config name>.<16 | 32>"`` (16: bf16 / fp16, 32: fp32). Only the
keys the built-in configuration has are taken from an entry, as ints; the rest of the entry is the
tuner's record (times, shape, candidates). Entries of another kind hold a measured kernel *choice*
(``"linear_logprobs.forward.16": {"choice": "gluon", "ms": {...}}``: which of several kernels doing
the same job ran fastest, timed in alternation in one run; ``choice`` reads them). ``TUNED_DIR`` (or ``$PACS_FAST_TUNED_DIR``) points
elsewhere; a file that does not parse is ignored with one warning. This module imports only the
standard library.

Per hidden size: an entry measured at hidden size ``"h"`` (else the ``H<n>`` of its ``"shape"``) may
hold ``"by_h": {"896": {"config": {...}, ...}}`` (a choice entry: ``{"896": {"choice": "gluon", ...}}``),
the winners re-timed at other hidden sizes (bench/gpu/tune.py ``--also-h``). A launch at hidden size
``H`` takes the measurement whose hidden size is nearest to ``H`` in ratio (a K loop of a similar
length), the entry itself when it has no ``by_h`` or ``H`` is not given.
"""
from __future__ import annotations

import json
import math
import os
import re
import warnings

SCHEMA = 1
# None: $PACS_FAST_TUNED_DIR, else the tuned/ folder beside this file
TUNED_DIR: str | None = None
_cache: dict = {}


def tuned_dir() -> str:
    return TUNED_DIR or os.environ.get("PACS_FAST_TUNED_DIR") or os.path.join(os.path.dirname(__file__), "tuned")


def path_for(arch: int, folder: str | None = None) -> str:
    return os.path.join(folder or tuned_dir(), f"sm_{arch}.json")


def entry_key(module: str, kernel: str, width: str) -> str:
    return f"{module}.{kernel}.{width}"


def stamp(arch: int | None):
    """What identifies the table ``load(arch)`` returns now: ``(path, mtime_ns)``, ``(path, None)``
    when absent, None for arch None (a cache key for launch configurations derived from it)."""
    if arch is None:
        return None
    path = path_for(arch)
    try:
        return path, os.stat(path).st_mtime_ns
    except OSError:
        return path, None


def load(arch: int | None) -> dict:
    """The ``kernels`` mapping of ``sm_<arch>.json`` ({} when absent, unreadable, or arch None),
    re-read when the file changes."""
    if arch is None:
        return {}
    path, mtime = stamp(arch)
    if mtime is None:
        return {}
    hit = _cache.get(path)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    try:
        with open(path) as f:
            data = json.load(f)
        if data.get("schema") != SCHEMA or data.get("arch") != arch or not isinstance(data.get("kernels"), dict):
            raise ValueError(f"schema {data.get('schema')!r}, arch {data.get('arch')!r}")
        table = data["kernels"]
    except (OSError, ValueError) as e:
        warnings.warn(f"ignoring the tuned launch table {path}: {e}", stacklevel=3)
        table = {}
    _cache[path] = (mtime, table)
    return table


def measured_h(entry: dict) -> int | None:
    """The hidden size an entry was measured at: its ``"h"``, else the ``H<n>`` of its ``"shape"``."""
    if isinstance(entry.get("h"), int):
        return entry["h"]
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
            out[k] = int(v)
    return out


def choice(key: str, arch: int | None, allowed, h: int | None = None) -> str | None:
    """The measured choice ``key`` of ``sm_<arch>.json`` (at hidden size ``h``: the measurement nearest
    to it; None when absent; one warning and None when it names something not in ``allowed``, e.g. a
    kernel this version no longer has)."""
    entry = nearest(load(arch).get(key), h, "choice")
    picked = entry.get("choice") if isinstance(entry, dict) else None
    if picked is None or picked in allowed:
        return picked
    warnings.warn(f"ignoring the measured choice {key} = {picked!r} of {path_for(arch)}: not one of {tuple(allowed)}",
                  stacklevel=3)
    return None
