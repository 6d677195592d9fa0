"""Measured launch tables: ``kernels/tuned/sm_<arch>.json``, written by ``bench/gpu_tune.py``.

Precedence in every ``launch_config`` that reads them (kernels/linear_logprobs.py,
kernels/token_logprobs.py, kernels/pacs_loss.py): an explicit ``CONFIG`` override of the kernel file
wins, then a measured entry of this table, then the built-in per-arch table (chosen from the compile
model). The PACS loss's entries hold its shape-independent launch policy (``pacs_loss.launch_policy``:
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
"""
from __future__ import annotations

import json
import os
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


def apply(cfg: dict, module: str, kernel: str, arch: int | None, width: str) -> dict:
    """``cfg`` (the built-in configuration) updated with the measured entry, if any."""
    entry = load(arch).get(entry_key(module, kernel, width))
    if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
        return cfg
    out = dict(cfg)
    for k, v in entry["config"].items():
        if k in out and isinstance(v, (int, bool)):
            out[k] = int(v)
    return out


def choice(key: str, arch: int | None, allowed) -> str | None:
    """The measured choice ``key`` of ``sm_<arch>.json`` (None when absent; one warning and None
    when it names something not in ``allowed``, e.g. a kernel this version no longer has)."""
    entry = load(arch).get(key)
    picked = entry.get("choice") if isinstance(entry, dict) else None
    if picked is None or picked in allowed:
        return picked
    warnings.warn(f"ignoring the measured choice {key} = {picked!r} of {path_for(arch)}: not one of {tuple(allowed)}",
                  stacklevel=3)
    return None
