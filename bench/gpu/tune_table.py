"""bench/gpu/tune.py's hook into the kernel files and its table: ``override`` (a candidate set as the
kernel file's ``CONFIG``, which ``launch_config`` lets win), ``write_table`` (the measured entries merged,
atomically, into ``sm_<arch>.json``, or into the device's own table beside another device's:
``table_to_write``) and the read-back checks that ``launch_config``, ``forward_kind`` and ``dz_kind`` then
return what was written, at the main shape and at each measured hidden size.
"""
from __future__ import annotations

import json
import os
import time

import torch

from pacs_fast.kernels import linear_logprobs as KL, token_logprobs as KT, tuning

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
MODULES = {"linear_logprobs": KL, "token_logprobs": KT}


class override:
    """Sets ``cfg`` as the kernel file's ``CONFIG`` overrides (which ``launch_config`` lets win) and
    restores the previous values on exit; ``{}`` clears them. The forward it selects: the TMA one for
    ``linear_logprobs.stats_tma``, the Gluon one for ``linear_logprobs.stats_gluon``, else the tiled one;
    the dz kernel: TMA or Gluon for ``dlogits_tma`` / ``dlogits_gluon``, else the pointer one."""

    def __init__(self, name, cfg):
        self.mod, self.kernel = name.split(".")
        self.cfg = cfg

    def __enter__(self):
        conf = MODULES[self.mod].CONFIG
        self.saved = dict(conf)
        keys = ("BLOCK_V", "BLOCK_V_BWD", "num_warps", "num_stages") if self.mod == "token_logprobs" else \
            ("BLOCK_N", "BLOCK_V", "BLOCK_H", "GROUP_N", "V_TILES", "PERSISTENT", "FLATTEN", "WARP_SPECIALIZE",
             "PINGPONG", "num_warps", "num_stages")
        for k in keys:
            conf[k] = None
        for k, v in self.cfg.items():
            if self.mod == "token_logprobs" and k == "BLOCK_V" and self.kernel == "grad_bwd":
                k = "BLOCK_V_BWD"
            if k in keys:
                conf[k] = v
        if self.mod == "linear_logprobs":
            conf["FWD"] = {"stats_tma": "tma", "stats_gluon": "gluon"}.get(self.kernel, "tiles")
            conf["DLOGITS"] = {"dlogits_tma": "tma", "dlogits_gluon": "gluon"}.get(self.kernel, "pointer")
        return self

    def __exit__(self, *exc):
        MODULES[self.mod].CONFIG.clear()
        MODULES[self.mod].CONFIG.update(self.saved)


def table_to_write(out_dir, arch, device, dry_run):
    """Where the measurements of ``device`` go: its own table ``sm_<arch>.<device>.json`` where one exists in
    ``out_dir``, or where ``sm_<arch>.json`` there records another measured device (an H100 run beside an
    H200's table: the H200's entries stay as measured, labelled as they were); else ``sm_<arch>.json``.
    A dry run always writes ``sm_<arch>.json`` (in a folder of its own)."""
    shared = tuning.path_for(arch, out_dir)
    if dry_run or not device:
        return shared
    own = tuning.path_for(arch, out_dir, device)
    if os.path.exists(own):
        return own
    if os.path.exists(shared):
        with open(shared) as f:
            data = json.load(f)
        recorded = data.get("device")
        if recorded and not data.get("dry_run") and tuning.device_slug(recorded) != tuning.device_slug(device):
            return own
    return shared


def write_table(out_dir, arch, device, results, dry_run):
    """Merges ``results`` into ``table_to_write``'s table in ``out_dir`` (other kernels' entries are kept)."""
    import triton
    os.makedirs(out_dir, exist_ok=True)
    path = table_to_write(out_dir, arch, device, dry_run)
    kernels = {}
    if os.path.exists(path):
        with open(path) as f:
            kernels = json.load(f).get("kernels", {})
    kernels.update(results)
    data = dict(schema=tuning.SCHEMA, arch=arch, device=device, triton=triton.__version__, torch=torch.__version__,
                dry_run=dry_run, created=time.strftime("%Y-%m-%d %H:%M:%S"), kernels=kernels)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


def check_choices_read_back(path, arch, results, width):
    """``forward_kind`` / ``dz_kind`` (no CONFIG override) now return the choices written, at the main
    shape's hidden size and at each of ``by_h``'s."""
    saved, saved_cfg = tuning.TUNED_DIR, {k: KL.CONFIG[k] for k in ("FWD", "DLOGITS")}
    try:
        tuning.TUNED_DIR = os.path.dirname(path)
        KL.CONFIG.update(FWD=None, DLOGITS=None)
        for job, read in (("forward", KL.forward_kind), ("dz", KL.dz_kind)):
            rec = results.get(tuning.entry_key("linear_logprobs", job, width))
            if rec is None:
                continue
            for h, want in [(rec.get("h"), rec["choice"])] + [(int(k), r["choice"]) for k, r in
                                                               rec.get("by_h", {}).items()]:
                if read(arch, width, h) != want:
                    raise SystemExit(f"linear_logprobs.{job} at H={h}: {read.__name__} gives "
                                     f"{read(arch, width, h)!r}, the table holds {want!r}")
    finally:
        tuning.TUNED_DIR = saved
        KL.CONFIG.update(saved_cfg)


def check_read_back(path, arch, results, n, h, v, dt):
    """``launch_config`` (no CONFIG override set) now returns what it returned with the winner set as
    the override (the same, up to its clamps of blocks larger than the shape), at the main shape and
    at each hidden size of the entry's ``by_h``."""
    saved = tuning.TUNED_DIR
    try:
        for key, rec in results.items():
            mod, kernel, _ = key.split(".")
            for at_h, cfg in [(h, rec["config"])] + [(int(k), r["config"]) for k, r in rec.get("by_h", {}).items()]:
                extra = {} if mod == "token_logprobs" else dict(H=at_h)

                def config():
                    return MODULES[mod].launch_config(kernel, N=n, V=v, dtype=DTYPES[dt], arch=arch, **extra)
                tuning.TUNED_DIR = os.devnull
                with override(f"{mod}.{kernel}", cfg):
                    want = config()
                tuning.TUNED_DIR = os.path.dirname(path)
                with override(f"{mod}.{kernel}", {}):
                    got = config()
                if got != want:
                    raise SystemExit(f"{key} at H={at_h}: launch_config gives {got}, the table holds {cfg}")
    finally:
        tuning.TUNED_DIR = saved
