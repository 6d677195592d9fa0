"""Launch parameters of the grouped PACS loss kernels (kernels/pacs_loss.py): ``launch_config``
derives every shape's tiles and grid from a shape-independent launch policy (``launch_policy``:
built-in, or measured per architecture by bench/gpu/tune.py into kernels/tuned/sm_<arch>.json).
``CONFIG`` and ``POLICY`` are the explicit overrides. This module imports only triton, torch and
kernels/tuning.py.
"""
from __future__ import annotations

import copy
import functools

import torch
import triton

from . import tuning

# Overrides of the launch parameters (None: ``launch_config`` decides; policy overrides: POLICY).
# Tests shrink the tiles so that T = 37 spans several token blocks and each program strides over
# several of them. BLOCK_T / ROWS / N_SPLIT apply to the two streaming kernels (pass A and the
# backward), BLOCK_S to pass B.
CONFIG = {"BLOCK_T": None, "ROWS": None, "N_SPLIT": None, "BLOCK_S": None, "ONE_PASS": None}

KERNELS = ("fwd_one", "fwd_sums", "fwd", "bwd")

# The launch policy: shape-independent knobs from which ``launch_config`` (see there) derives each
# shape's tiles and grid; a measured entry of kernels/tuned/sm_<arch>.json replaces them for its arch
# and dtype width (tiles are never stored). Built-in: the same on every arch (plain loads / stores
# and reductions: no tensor cores, shared memory <= 9 KB).
BUILTIN_POLICY = {
    # the one-launch forward (a program per group streams its rows): where each group is at most
    # MAX_GROUP_BYTES of inputs or the groups fill half the SMs, and the group fits MAX_BLOCK_G rows
    "fwd_one": dict(STREAM_BYTES=16 * 1024, MAX_TILE=4096, MAX_GROUP_BYTES=512 * 1024, MAX_BLOCK_G=64, num_warps=8,
                    num_stages=3),
    "fwd_sums": dict(STREAM_BYTES=16 * 1024, MAX_TILE=4096, PROGRAMS_PER_SM=4, num_warps=4, num_warps_large=4,
                     num_stages=3),
    "fwd": dict(GROUP_ELEMS=2048, num_warps=4, num_stages=3),
    "bwd": dict(STREAM_BYTES=16 * 1024, MAX_TILE=4096, PROGRAMS_PER_SM=4, num_warps=4, num_warps_large=8,
                num_stages=3),
}
# Explicit overrides of the policy, per kernel (e.g. POLICY["bwd"]["STREAM_BYTES"] = 32768); they
# win over the measured table, as CONFIG's tile overrides do. bench/gpu/tune_pacs.py sets candidates here.
POLICY = {k: {} for k in KERNELS}
MIN_TILE, LARGE_TILE = 512, 4096
SM_COUNT = 132  # an H100 / H200; the launchers pass the device's own count
MAX_SPLIT = 1024  # grid axis 1 (CUDA limit 65,535); longer rows: each program strides further
_WIDTHS = {torch.float32: "32", torch.bfloat16: "16", torch.float16: "16"}  # fp64: built-in only


def launch_policy(kernel: str, dtype: torch.dtype, arch: int | None) -> dict:
    """The policy ``launch_config`` applies: ``BUILTIN_POLICY[kernel]``, updated with the measured
    entry ``pacs_loss.<kernel>.<16 | 32>`` of ``arch``'s table (kernels/tuning.py; none for fp64
    ``logp`` or arch None), then with the non-None ``POLICY[kernel]`` overrides."""
    pol = dict(BUILTIN_POLICY[kernel])
    if dtype in _WIDTHS:
        pol = tuning.apply(pol, "pacs_loss", kernel, arch, _WIDTHS[dtype])
    if set(POLICY[kernel]) - set(pol):
        raise tuning.LaunchConfigError(f"POLICY[{kernel!r}]: unknown knobs {sorted(set(POLICY[kernel]) - set(pol))}; "
                                       f"known: {sorted(pol)}")
    pol.update({k: tuning.override(k, v, f"POLICY[{kernel!r}]") for k, v in POLICY[kernel].items() if v is not None})
    return pol


def _tile(pol: dict, bytes_per_token: int) -> int:
    """Elements a streaming program reads per step: the power of two above STREAM_BYTES / bytes per token, at
    most MAX_TILE (pass A, the backward and the one-pass forward alike)."""
    return min(pol["MAX_TILE"], triton.next_power_of_2(triton.cdiv(pol["STREAM_BYTES"], bytes_per_token)))


def _stream_config(B: int, T: int, bytes_per_token: int, pol: dict, sm_count: int | None) -> dict:
    """``ROWS``, ``BLOCK_T``, ``N_SPLIT``, warps and stages of a streaming kernel over ``B`` rows of
    ``T`` tokens (the average, packed) of ``bytes_per_token``, under the policy ``pol``."""
    T = max(1, T)
    min_programs = pol["PROGRAMS_PER_SM"] * (sm_count or SM_COUNT)

    def shape(tile):
        block_t = max(16, min(tile, triton.next_power_of_2(T)))
        rows = max(1, tile // block_t)
        return rows, block_t, min(MAX_SPLIT, triton.cdiv(T, block_t))

    tile = _tile(pol, bytes_per_token)
    while tile > MIN_TILE:
        rows, block_t, n_split = shape(tile)
        if triton.cdiv(B, rows) * n_split >= min_programs:
            break
        tile //= 2
    rows, block_t, _ = shape(tile)
    cfg = dict(ROWS=rows, BLOCK_T=block_t)
    cfg.update({k: tuning.override(k, CONFIG[k]) for k in cfg if CONFIG[k] is not None})
    cfg["N_SPLIT"] = min(MAX_SPLIT, triton.cdiv(T, cfg["BLOCK_T"]))
    if CONFIG["N_SPLIT"] is not None:
        cfg["N_SPLIT"] = tuning.override("N_SPLIT", CONFIG["N_SPLIT"])
    large = cfg["ROWS"] * cfg["BLOCK_T"] >= LARGE_TILE
    return dict(cfg, num_warps=pol["num_warps_large" if large else "num_warps"], num_stages=pol["num_stages"])


def launch_config(kernel: str, *, B: int, T: int, G: int, dtype: torch.dtype, arch: int | None,
                  sm_count: int | None = None) -> dict:
    """Launch parameters of ``kernel`` for ``B`` sequences of ``T`` tokens (on average, packed) in
    groups of ``G`` (``dtype`` of ``logp``; ``arch`` = compute capability * 10 or None; ``sm_count``
    the GPU's SMs, None: SM_COUNT). The launchers and tests/test_kernels_compile.py both call this.
    ``CONFIG`` entries that are not None win; the rest is computed from ``launch_policy`` (POLICY
    overrides > measured table of ``arch`` > BUILTIN_POLICY), so a measured policy still adapts
    the tiles and grid to every shape.

    fwd_sums (pass A) and bwd: ``ROWS``, ``BLOCK_T``, ``N_SPLIT`` (the grid is ``(cdiv(B, ROWS),
    N_SPLIT)``), warps (num_warps below LARGE_TILE elements, num_warps_large from there), stages.
    The tile ``ROWS * BLOCK_T`` (each program moves about STREAM_BYTES: enough loads in flight) is
    the power of two nearest above STREAM_BYTES / bytes per token, at most MAX_TILE (pass A reads
    logp, logp_ref, a 1-byte mask: 9 B per fp32 token; the backward reads the mask and writes dlogp:
    5 B fp32), halved (down to MIN_TILE = 512) while the grid has fewer than PROGRAMS_PER_SM *
    sm_count programs; ``BLOCK_T`` = min(tile, next_pow2(T)), ``ROWS`` = tile / BLOCK_T (short rows:
    several per program), ``N_SPLIT = cdiv(T, BLOCK_T)`` (at most 1024). Built-in policy (16 KB per program,
    tiles <= 4096, 4 programs per SM): pass A 2048-element tiles in fp32, 4096 in bf16 (5 B per
    token); the backward 4096 in both. Examples (fp32, 132 SMs): B=1024, T=4096: pass A 1x2048
    tiles, grid (1024, 2); backward 1x4096, grid (1024, 1). B=8192, T=1024: pass A 2x1024, grid
    (4096, 1); backward 4x1024, grid (2048, 1). Built-in warps (compile report): pass A always 4
    (68-128 registers, no spills on sm_80/90/100; its bf16 4096-element tile with 8 warps spilled
    8 B on sm_90), the backward 8 for 4096-element tiles (29-80 registers), else 4.

    fwd (pass B, one program per group): ``BLOCK_G`` = next power of two >= G and ``BLOCK_S``
    (split columns per step, BLOCK_G * BLOCK_S <= GROUP_ELEMS = 2048 elements, at least 2); pass A's
    N_SPLIT partials per row are reduced in BLOCK_S steps.

    fwd_one (the one-launch forward, grid ``(B / G,)``): ``ONE_PASS`` (whether the launcher takes it),
    ``BLOCK_G``, ``BLOCK_T``, warps, stages (``_one_pass_config``). Built-in: 8 warps (4 spilled 16 B on
    sm_100 in fp32); fp32 G=8: 8x256 tiles. fp64 ``logp`` (references) uses the fp64-sized tiles and the
    built-in policy."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return dict(_launch_config(kernel, B, T, G, dtype, arch, sm_count, _state(arch)))


def launch_configs(kernels, *, B: int, T: int, G: int, dtype: torch.dtype, arch: int | None,
                   sm_count: int | None = None) -> tuple:
    """``launch_config`` of each of ``kernels`` (the launchers' per-call path: what it reads is keyed
    once for all of them; the dicts are the memo's own, read-only)."""
    state = _state(arch)
    return tuple(_launch_config(k, B, T, G, dtype, arch, sm_count, state) for k in kernels)


def _state(arch):
    """What ``_launch_config`` reads besides its arguments: the overrides, the module's knobs (one version
    number for them, bumped when any differs from its snapshot) and the tuned table's file stamp. Its
    results are memoised on it (the launchers ask on every forward / backward: host time at small shapes;
    bounded: packed batches give a new average T almost every step)."""
    knobs = (SM_COUNT, MIN_TILE, LARGE_TILE, MAX_SPLIT)
    snap = _snapshot[0]
    if snap is None or snap[0] != CONFIG or snap[1] != POLICY or snap[2] != BUILTIN_POLICY or snap[3] != knobs:
        _snapshot[0] = (copy.deepcopy(CONFIG), copy.deepcopy(POLICY), copy.deepcopy(BUILTIN_POLICY), knobs)
        _snapshot[1] += 1
    return _snapshot[1], tuning.stamp(arch)


_snapshot = [None, 0]  # (deep copies of CONFIG, POLICY, BUILTIN_POLICY and the knobs), their version


@functools.lru_cache(maxsize=4096)
def _launch_config(kernel, B, T, G, dtype, arch, sm_count, state) -> dict:
    """``launch_config``'s computation; ``state`` (what it reads besides its arguments) is only a key."""
    elt = dtype.itemsize
    pol = launch_policy(kernel, dtype, arch)
    if kernel == "fwd_one":
        return _one_pass_config(B, T, G, 2 * elt + 1, pol, sm_count)
    if kernel == "fwd_sums":
        return _stream_config(B, T, 2 * elt + 1, pol, sm_count)
    if kernel == "bwd":
        return _stream_config(B, T, elt + 1, pol, sm_count)
    n_split = launch_config("fwd_sums", B=B, T=T, G=G, dtype=dtype, arch=arch, sm_count=sm_count)["N_SPLIT"]
    block_g = max(triton.next_power_of_2(G), 2)
    block_s = max(2, min(triton.next_power_of_2(n_split), pol["GROUP_ELEMS"] // block_g))
    if CONFIG["BLOCK_S"] is not None:
        block_s = tuning.override("BLOCK_S", CONFIG["BLOCK_S"])
    return dict(BLOCK_G=block_g, BLOCK_S=block_s, num_warps=pol["num_warps"], num_stages=pol["num_stages"])


def _one_pass_config(B: int, T: int, G: int, bytes_per_token: int, pol: dict, sm_count: int | None) -> dict:
    """The one-launch forward's choice and tiles: ``ONE_PASS`` (1: one program per group streams the group's
    rows and finishes it, no workspace, one launch instead of two; 0: pass A + pass B), ``BLOCK_G`` (next
    power of two >= G), ``BLOCK_T`` (``BLOCK_G * BLOCK_T`` about STREAM_BYTES of inputs, at most MAX_TILE,
    at most next_pow2(T)), warps, stages. One pass where ``BLOCK_G <= MAX_BLOCK_G`` and either a group
    holds at most MAX_GROUP_BYTES of inputs (a program streams it in a few microseconds) or there are at
    least half as many groups as SMs (each SM busy); otherwise a few long groups would leave most SMs idle
    and the two passes' ``(row block, token split)`` grid is faster on the device. On the host one launch
    fewer is ~10-30 us of a 0.3-0.5 ms call (bench/gpu/pacs_loss_host_profile.py). ``CONFIG["ONE_PASS"]``
    (0 / 1) and ``CONFIG["BLOCK_T"]`` override."""
    T = max(1, T)
    block_g = max(triton.next_power_of_2(G), 2)
    groups = max(1, B // max(1, G))
    one = block_g <= pol["MAX_BLOCK_G"] and (G * T * bytes_per_token <= pol["MAX_GROUP_BYTES"]
                                             or 2 * groups >= (sm_count or SM_COUNT))
    if CONFIG["ONE_PASS"] is not None:
        one = bool(tuning.override("ONE_PASS", CONFIG["ONE_PASS"]))
    tile = _tile(pol, bytes_per_token)
    block_t = max(16, min(tile // block_g, triton.next_power_of_2(T)))
    if CONFIG["BLOCK_T"] is not None:
        block_t = tuning.override("BLOCK_T", CONFIG["BLOCK_T"])
    return dict(ONE_PASS=int(one), BLOCK_G=block_g, BLOCK_T=block_t, num_warps=pol["num_warps"],
                num_stages=pol["num_stages"])


@functools.lru_cache(maxsize=None)
def _arch(device) -> int | None:
    if torch.device(device).type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


@functools.lru_cache(maxsize=None)
def _sm_count(device) -> int | None:
    device = torch.device(device)  # a CUDA device's SMs, None for other devices
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else None
