"""Launch parameters of the ``linear_logprobs`` kernels, host side: ``CONFIG`` (the explicit overrides, and
which forward / dz kernel runs), the built-in per-architecture table ``ARCH_CONFIGS`` with the compile
results it was chosen from, the ping-pong launches ``PINGPONG_CONFIGS``, and ``launch_config``, which the
launchers of every variant (kernels/linear_logprobs.py, _fwd.py, _tma.py, _gluon.py, _bwd.py) and the
compile cases (kernels/aot_cases.py) call; plus the small per-input helpers they share (``device_arch``,
``num_sms``, ``descriptor_inputs``, ``_prec``, ``_upcast``, ``_cfg``). The device-side tiles they share are in
kernels/linear_logprobs_tiles.py. This module imports only torch, triton and kernels/tuning.py.
"""
from __future__ import annotations

import torch
import triton

from . import tuning

# Overrides of the launch parameters (None: ``launch_config`` decides); the tests shrink the
# blocks so that the interpreter is fast and every loop has several ragged steps.
CONFIG = {
    "BLOCK_N": None, "BLOCK_V": None, "BLOCK_H": None, "GROUP_N": None, "num_warps": None, "num_stages": None,
    "SPLITS": None, "V_TILES": None, "PERSISTENT": None,  # V_TILES: stats_tiles; PERSISTENT: stats_tiles / tma
    "FLATTEN": None, "WARP_SPECIALIZE": None,  # stats_tma only
    # stats_gluon / dlogits_gluon: 1 = their ping-pong launch (two consumer warpgroups on alternate tiles; the
    # launch's tiles from PINGPONG_CONFIGS unless the keys above name others), 0 = the cooperative one
    "PINGPONG": None,
    # which forward ``stats_fwd`` runs: "tiles", "split", "tma" or "gluon"; which dz kernel the chunked
    # backward runs: "pointer", "tma" or "gluon". None: the measured choice of the tuned table
    # (``forward_kind`` / ``dz_kind`` of kernels/linear_logprobs.py), else "tiles" / "pointer"
    "FWD": None,
    "DLOGITS": None,
    "BWD_CHUNK_BYTES": 512 << 20,  # dz buffer of the chunked backward
}
KERNELS = ("stats_fwd", "stats_tiles", "stats_tma", "stats_gluon", "grad_bwd", "dlogits", "dlogits_tma",
           "dlogits_gluon")
_TUNABLE = ("BLOCK_N", "BLOCK_V", "BLOCK_H", "GROUP_N", "V_TILES", "PERSISTENT", "FLATTEN", "WARP_SPECIALIZE",
            "PINGPONG", "num_warps", "num_stages")

# Per-architecture launch parameters, keyed by (kernel, arch, "16" for bf16/fp16 or "32" for fp32);
# arch None = every architecture without its own entry (and the interpreter). Chosen from the
# ahead-of-time compile report (``python bench/gpu/compile_report.py``; table in docs/GPU.md;
# tests/test_kernels_compile.py asserts compile, shared memory, no spills and tensor-core use for
# exactly these). Candidates were compiled for sm_80/90/100 at N=8192, H=4096, V=151,936:
#
# - stats_fwd / dlogits bf16, 128x128x64, 8 warps, 3 stages: no spills on sm_80/90 (64/97 KB smem);
#   on sm_100 stats_fwd spilled 16 B at 3 stages, 0 at 2 stages (65 KB): sm_100 uses 2.
# - grad_bwd (atomic) bf16: 128x128x64 spilled 232/104/104 B (sm_80/90/100); 128x128x32 at 2 stages
#   has none (64-81 KB) and keeps the atomic traffic of 128x128 tiles (64x128x64 also spill-free,
#   but twice the dhidden atomics).
# - fp32 (IEEE FMA, no tensor cores; correctness path): 128x128x64 spilled 0.1-11 KB; stats_fwd /
#   dlogits 128x64x32 with 8 warps, 2 stages: none; grad_bwd needs 32x64x32, 4 warps, 1 stage
#   (64x64x32 still spilled 160-616 B). stats_fwd fp32 on sm_90 / sm_100: 2 stages spilled 16 / 24 B
#   once its online fold kept base-2 sums (kernels/base2.py: one more per-row value live), 1 stage none
#   (178 / 176 regs); it is the fp32 correctness path of a forward that is not the default.
# - stats_tiles (default forward) bf16 128x256x64 w8 s3: sm_90 242 regs, 0 B stack, 145 KB (s4 193 KB,
#   0 B); sm_80 255 regs, 0 B, 96 KB; sm_100 spilled 80 B (16 warps fall back to mma.sync there), so
#   sm_100 takes 128x128x64 w8 s4 (142 regs, 0 B, 129 KB). GROUP_N=16: 16 hidden row blocks (16 MB)
#   stay in L2 while a group sweeps the vocabulary, so the LM head is read from DRAM N/2048 times,
#   not N/1024 (a traffic estimate; bench/gpu/tune.py measures). fp32: as stats_fwd (0 B).
# - stats_tma (kernels/linear_logprobs_tma.py, selectable, bf16 / fp16 on sm_90+), one persistent
#   program per SM: sm_90 128x256x64 w8 s3 without FLATTEN (255 regs, 0 B stack, 145 KB; FLATTEN=1
#   spilled 64 B there, at 4 stages too; 128x128 with FLATTEN: 168 regs, no spill, left to the tuner);
#   sm_100 128x128x64 w8 s4 with FLATTEN (216 regs, 0 B). dlogits_tma (the chunked backward's dz
#   kernel, CONFIG["DLOGITS"] = "tma"): 128x128x64 w8 s4 with FLATTEN, as the measured pointer
#   dlogits (sm_90 128 regs, 161 KB; sm_100 211 regs; 128x256 spilled 40 B on sm_90). fp32 never
#   takes either (the entries exist for launch_config's sake).
# - stats_gluon (kernels/linear_logprobs_gluon.py, selectable, bf16 / fp16 on sm_90 only): 128x256x64,
#   8 consumer warps + 1 loader warp, 4 stages (Triton 3.9 and 3.6: 168 launch registers, raised to 240
#   for the consumers by setmaxnreg, loader 40; no spill; 197 KB shared; 3 stages: 148 KB). PERSISTENT:
#   programs per SM (one: 197 KB of shared memory leaves room for no second). dlogits_gluon (its dz kernel,
#   CONFIG["DLOGITS"] = "gluon"): 128x128x64, 4 stages (164 KB with the dz staging tile of the TMA store;
#   128x256 spilled 8 B, 256x128 64 B).
#   PINGPONG=1 (``PINGPONG_CONFIGS`` below; selectable, the tuner's second candidate of each): two consumer
#   warpgroups of 4 warps, each on its own tiles (alternate tiles of the program), so that one's softmax
#   epilogue runs while the other's wgmma run. Per consumer, 128 fp32 accumulator registers: stats_gluon
#   128x128x64, 6 stages (198 KB; 64x256 at 5 stages: 206 KB), dlogits_gluon 64x256x64, 4 stages (231 KB
#   with two dz staging tiles; 128x128 spilled 16 B under Triton 3.6.0, the GPU image's, none under 3.9).
#   Launch registers 168; setmaxnreg: the first consumer 256, the second 232 (CONSUMER_REGS), loader 40;
#   no spill under Triton 3.9 and 3.6.0.
#
# The numbers above were taken before the base-2 epilogues (kernels/base2.py), which need fewer
# registers; recompiled with them (Triton 3.9), several candidates that spilled no longer do:
# grad_bwd 128x128x64 on sm_90 (209 regs, was 16 B), stats_fwd sm_100 at 3 stages (was 16 B),
# stats_tiles 128x256x64 on sm_100 (254 regs, was 80 B), stats_tma with FLATTEN on sm_90 (was 64 B),
# dz tiles of 128x256: dlogits (was 480 B), dlogits_tma (was 24 B), dlogits_gluon at 3 stages (was 8 B,
# 209 KB). The choices above stay until a GPU times the new candidates (bench/gpu/tune.py sweeps them).
# Under Triton 3.6.0 (torch 2.11's) three of them spill a little (tests/test_kernels_compile.py,
# SPILL_EXCEPTIONS): stats_tiles sm_80 bf16 with entropy (32 B; 128x128 tiles would not) and the fp32
# stats_fwd on sm_90 / sm_100 with entropy (32 / 24 B).
_BF16 = dict(BLOCK_N=128, BLOCK_V=128, BLOCK_H=64, GROUP_N=8, num_warps=8, num_stages=3)
_FP32 = dict(BLOCK_N=128, BLOCK_V=64, BLOCK_H=32, GROUP_N=8, num_warps=8, num_stages=2)
_TILES16 = dict(_BF16, BLOCK_V=256, GROUP_N=16, V_TILES=1, PERSISTENT=0)
_TMA16 = dict(_BF16, BLOCK_V=256, GROUP_N=16, PERSISTENT=1, FLATTEN=0, WARP_SPECIALIZE=0)
ARCH_CONFIGS = {
    ("stats_fwd", None, "16"): _BF16,
    ("stats_fwd", 100, "16"): dict(_BF16, num_stages=2),
    ("stats_fwd", None, "32"): _FP32,
    ("stats_fwd", 90, "32"): dict(_FP32, num_stages=1),
    ("stats_fwd", 100, "32"): dict(_FP32, num_stages=1),
    ("stats_tiles", None, "16"): dict(_BF16, V_TILES=1, PERSISTENT=0),
    ("stats_tiles", 80, "16"): _TILES16,
    ("stats_tiles", 90, "16"): _TILES16,
    ("stats_tiles", 100, "16"): dict(_TILES16, BLOCK_V=128, num_stages=4),
    ("stats_tiles", None, "32"): dict(_FP32, V_TILES=1, PERSISTENT=0),
    ("stats_tma", None, "16"): _TMA16,
    ("stats_tma", 100, "16"): dict(_TMA16, BLOCK_V=128, num_stages=4, FLATTEN=1),
    ("stats_tma", None, "32"): dict(_FP32, PERSISTENT=1, FLATTEN=1, WARP_SPECIALIZE=0),
    ("stats_gluon", None, "16"): dict(_BF16, BLOCK_V=256, GROUP_N=16, PERSISTENT=1, num_stages=4, PINGPONG=0),
    ("stats_gluon", None, "32"): dict(_FP32, PERSISTENT=1, PINGPONG=0),
    ("dlogits_gluon", None, "16"): dict(_BF16, num_stages=4, PERSISTENT=1, PINGPONG=0),
    ("dlogits_gluon", None, "32"): dict(_FP32, PERSISTENT=1, PINGPONG=0),
    ("dlogits_tma", None, "16"): dict(_BF16, num_stages=4, PERSISTENT=1, FLATTEN=1, WARP_SPECIALIZE=0),
    ("dlogits_tma", None, "32"): dict(_FP32, PERSISTENT=1, FLATTEN=1, WARP_SPECIALIZE=0),
    ("dlogits", None, "16"): _BF16,
    ("dlogits", None, "32"): _FP32,
    ("grad_bwd", None, "16"): dict(_BF16, BLOCK_H=32, num_stages=2),
    ("grad_bwd", None, "32"): dict(BLOCK_N=32, BLOCK_V=64, BLOCK_H=32, GROUP_N=8, num_warps=4, num_stages=1),
}

# The ping-pong launches of the Gluon kernels (kernels/linear_logprobs_gluon.py, PINGPONG=1), whole:
# CONFIG["PINGPONG"] = 1 selects them (launch_config), the tuner times them second (bench/gpu/tune.py
# --pingpong), the GPU checks and the benchmark's pacs_triton_gluon_pp run them.
PINGPONG_CONFIGS = {
    "stats_gluon": dict(BLOCK_N=128, BLOCK_V=128, BLOCK_H=64, GROUP_N=16, num_warps=4, num_stages=6, PERSISTENT=1,
                        PINGPONG=1),
    "dlogits_gluon": dict(BLOCK_N=64, BLOCK_V=256, BLOCK_H=64, GROUP_N=8, num_warps=4, num_stages=4, PERSISTENT=1,
                          PINGPONG=1),
}


def launch_config(kernel: str, *, N: int, V: int, H: int, dtype: torch.dtype, arch: int | None) -> dict:
    """Launch parameters of ``kernel`` (one of ``KERNELS``) for hidden ``[N, H]``, weight ``[V, H]``
    of ``dtype`` on compute capability ``arch`` (80, 90, 100; None off-GPU): ``BLOCK_N``,
    ``BLOCK_V``, ``BLOCK_H``, ``GROUP_N``, ``num_warps``, ``num_stages``. The launchers and the
    compile test both call this. Precedence: ``CONFIG`` entries that are not None, then (the Gluon
    kernels with ``CONFIG["PINGPONG"]`` = 1) their ping-pong launch ``PINGPONG_CONFIGS``, then a measured
    table (kernels/tuning.py, written by bench/gpu/tune.py; its measurement at the hidden size nearest
    ``H``), then the built-in table ``ARCH_CONFIGS``."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    width = _width(dtype)
    cfg = dict(ARCH_CONFIGS.get((kernel, arch, width)) or ARCH_CONFIGS[(kernel, None, width)])
    cfg = tuning.apply(cfg, "linear_logprobs", kernel, arch, width, H)
    if CONFIG["PINGPONG"] and kernel in PINGPONG_CONFIGS:  # the ping-pong launch as a whole
        cfg.update(PINGPONG_CONFIGS[kernel])
    for k in _TUNABLE:
        if k in cfg and CONFIG[k] is not None:
            cfg[k] = tuning.override(k, CONFIG[k])
    cfg["BLOCK_H"] = min(cfg["BLOCK_H"], max(16, triton.next_power_of_2(max(H, 1))))
    return cfg


def device_arch(device) -> int | None:
    """Compute capability * 10 of a CUDA device (90 for an H100), None for other devices."""
    if torch.device(device).type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def descriptor_inputs(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """bf16 / fp16 ``hidden`` and ``weight`` of one dtype, 2-D with unit stride along H, 16-byte aligned
    bases and row strides: what a TMA descriptor reads (the TMA and Gluon kernels; fp32 keeps the tiled
    kernels' IEEE products)."""
    if hidden.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != hidden.dtype:
        return False
    return all(t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
               and (t.stride(0) * t.element_size()) % 16 == 0 for t in (hidden, weight))


def num_sms(device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 elsewhere (the interpreter: a persistent
    launch there still has several programs, each looping over many tiles)."""
    if torch.device(device).type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def _cfg(kernel, hidden, weight, softcap: float = 0.0):
    """``launch_config`` of ``kernel`` for these inputs on their device (``softcap`` > 0: :func:`capped_config`)."""
    cfg = launch_config(kernel, N=hidden.shape[0], V=weight.shape[0], H=hidden.shape[1],
                        dtype=hidden.dtype, arch=device_arch(hidden.device))
    return capped_config(cfg) if softcap else cfg


CAPPED_BLOCK_V = 64  # the widest vocabulary block of a soft-capped launch


def capped_config(cfg: dict) -> dict:
    """The launch of a soft-capped call (Gemma 2): ``BLOCK_V`` at most :data:`CAPPED_BLOCK_V`. The cap keeps one
    more logits-sized tile alive (the backward's slope) and a few more per-element temporaries: compiled for sm_80 /
    sm_90 / sm_100 on 2026-12-03 (Triton 3.9), the 128 x 256 forward and dz tiles and the 128 x 128 atomic backward
    spilled (8-552 B of stack), 128 x 64 tiles do not (tests/test_kernels_compile.py). Not measured on a GPU."""
    return dict(cfg, BLOCK_V=min(cfg["BLOCK_V"], CAPPED_BLOCK_V))


def _prec(t: torch.Tensor):
    """IEEE fp32 products for fp32 inputs (TF32 would cost ~1e-3 relative error in the logits);
    the default (tensor cores) for bf16/fp16."""
    return "ieee" if t.dtype == torch.float32 else None


def _upcast(t: torch.Tensor) -> bool:
    """Triton 3.9's interpreter returns garbage for bf16 ``tl.dot``; there (only) the bf16 tiles
    are widened to fp32 after loading (same values; dz is still rounded to bf16 first)."""
    return t.device.type != "cuda" and t.dtype == torch.bfloat16


def _width(dtype: torch.dtype) -> str:
    """The tables' dtype key: "32" for fp32, "16" for bf16 / fp16."""
    return "32" if dtype == torch.float32 else "16"
