"""Ahead-of-time compilation of every kernel for real GPUs, on a machine without one.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` runs Triton's whole
pipeline (TTIR -> TTGIR -> LLVM -> PTX -> ptxas cubin) with no device present. For each case (a
kernel, the launch parameters its launcher picks through ``launch_config`` at a realistic shape,
an architecture and a dtype) ``compile_case`` reports what the GPU compiler decided:

- ``shared``: bytes of shared memory per block (Triton's dynamic + the cubin's static);
- ``regs`` / ``stack`` / ``spill_insts``: registers per thread, local-memory stack bytes and the
  number of local loads/stores in the SASS (``cuobjdump`` from the Triton wheel; any of
  ``stack`` > 0 or ``spill_insts`` > 0 means spilling);
- ``mma``: the tensor-core instruction of ``tl.dot`` in the PTX (``wgmma.mma_async`` on sm_90,
  ``mma.sync`` on sm_80, ``tcgen05.mma`` on sm_100), ``tf32`` whether any TF32 product appears;
- ``global_access``: the PTX global load / store instructions by width (``ld.global.v4.b32`` ...);
- ``narrow``: for each pointer-offset parameter that multiplies a row index (row strides, ``T``),
  the PTX instructions that use it in a 32-bit product (must be none: ``N * V`` passes 2^31 at
  N = 16384, V = 151,936), and ``wide``: whether it enters a 64-bit product at all.

Run ``python -m pacs_fast.kernels.aot --json out.json`` (TRITON_INTERPRET must be unset: the
interpreter replaces the kernels by Python functions). ``bench/gpu_compile_report.py`` turns the
JSON into the table of docs/GPU.md; tests/test_kernels_compile.py asserts on it.
This module imports only triton and torch (and the kernel modules beside it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

import torch
import triton
import triton.language as tl

from . import LAUNCH_OPTIONS, tuning

ARCHS = (80, 90, 100)
# per-block shared memory limits (opt-in maximum): A100 163 KB, H100/H200 227 KB, B200 227 KB
SMEM_LIMIT = {80: 163 * 1024, 90: 227 * 1024, 100: 227 * 1024}
GPU_NAMES = {80: "A100", 90: "H100/H200", 100: "B200"}
# the realistic shapes: log-probs N x H x V (and V / 2 under tensor parallel 2), PACS B x T
LOGPROB_SHAPES = (("N8192 H4096 V151936", 8192, 4096, 151936), ("N8192 H4096 V75968 (tp2)", 8192, 4096, 75968))
PACS_SHAPES = ((1024, 4096), (8192, 1024))  # issue 22's targets for the loss at memory speed
PACS_GROUPS = (8, 16, 64)
_DT = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _bin(tool: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


@dataclass
class Case:
    module: str                  # kernel file (kernels/<module>.py)
    kernel: str                  # launch_config name
    fn: str                      # @triton.jit function
    arch: int
    dtype: str                   # "bf16" / "fp32"
    shapes: list                 # realistic shapes whose launch parameters these are
    types: dict                  # runtime argument -> Triton type ("*bf16", "i32", "fp32")
    constexprs: dict
    num_warps: int
    num_stages: int
    wide_params: tuple = ()      # arguments that must only enter 64-bit products
    has_dot: bool = False
    variant: str = ""
    key: str = field(default="", repr=False)

    def label(self) -> str:
        return f"{self.module}.{self.fn}[{self.variant}] sm_{self.arch} {self.dtype}"


def compile_key(case: Case) -> str:
    """Equal for cases with identical compile inputs (whatever their shapes and labels)."""
    return json.dumps([case.module, case.fn, case.arch, case.types, case.constexprs, case.num_warps,
                       case.num_stages], sort_keys=True, default=str)


def _kernel_modules():
    from . import (linear_logprobs, linear_logprobs_finish, linear_logprobs_fwd, linear_logprobs_gluon,
                   linear_logprobs_tma, pacs_loss, token_logprobs)
    return {"token_logprobs": token_logprobs, "linear_logprobs": linear_logprobs,
            "linear_logprobs_fwd": linear_logprobs_fwd, "linear_logprobs_tma": linear_logprobs_tma,
            "linear_logprobs_gluon": linear_logprobs_gluon, "linear_logprobs_finish": linear_logprobs_finish,
            "pacs_loss": pacs_loss}


def _split(cfg: dict):
    cfg = dict(cfg)
    return cfg.pop("num_warps"), cfg.pop("num_stages"), cfg


LOGPROB_KERNELS = ("token_logprobs.stats_fwd", "token_logprobs.grad_bwd", "linear_logprobs.stats_fwd",
                   "linear_logprobs.stats_tiles", "linear_logprobs.dlogits", "linear_logprobs.grad_bwd")


def logprob_case(name: str, arch: int, dt: str, cfg: dict, shapes=("tune",)) -> Case:
    """The compile case of one launch of the log-prob kernel ``name`` (one of ``LOGPROB_KERNELS``,
    "file.launch_config name") with the launch parameters ``cfg`` (a ``launch_config`` dict), entropy
    on, no bias: what the launcher compiles. ``cases`` and bench/gpu_tune.py both build cases here."""
    nw, ns, c = _split(cfg)
    p, f32 = f"*{dt}", "*fp32"
    if name.startswith("token_logprobs."):
        c = dict(BLOCK_V=c["BLOCK_V"])
        if name.endswith("stats_fwd"):
            return Case("token_logprobs", "stats_fwd", "_stats_fwd_kernel", arch, dt, list(shapes),
                        dict(X=p, stride_x="i32", V="i32", v_per_split="i32", inv_t="fp32",
                             M_out=f32, S_out=f32, A_out=f32, N="i32"),
                        dict(ENTROPY=True, **c), nw, ns, ("stride_x",), variant="entropy")
        return Case("token_logprobs", "grad_bwd", "_grad_bwd_kernel", arch, dt, list(shapes),
                    dict(X=p, stride_x="i32", DX=p, stride_dx="i32", V="i32", inv_t="fp32",
                         LABELS="*i64", v_offset="i32", ignore_index="i32", M=f32, LOGS=f32,
                         ENT=f32, GL=f32, GH=f32),
                    dict(ENTROPY=True, **c), nw, ns, ("stride_x", "stride_dx"), variant="entropy")
    # linear_logprobs (hidden [N, H], weight [V, H]; no LM-head bias, as in Qwen)
    kernel = name.split(".")[1]
    base = dict(HAS_BIAS=False, ENTROPY=True, DOT_PREC="ieee" if dt == "fp32" else None, UPCAST=False)
    common = dict(Hd=p, stride_h="i32", W=p, stride_w="i32", B=p, N="i32", V="i32", n_h="i32")
    rowvec = dict(inv_t="fp32", LABELS="*i64", v_offset="i32", M=f32, LOGS=f32, ENT=f32, GL=f32, GH=f32)
    tile = {k: c[k] for k in ("BLOCK_N", "BLOCK_V", "BLOCK_H", "GROUP_N")}
    if kernel == "stats_fwd":
        tile.pop("GROUP_N")
        return Case("linear_logprobs", "stats_fwd", "_stats_fwd_kernel", arch, dt, list(shapes),
                    dict(common, v_per_split="i32", inv_t="fp32", M_out=f32, S_out=f32, A_out=f32),
                    dict(base, **tile), nw, ns, ("stride_h", "stride_w"), has_dot=True, variant="entropy")
    if kernel == "stats_tiles":
        persistent = c["PERSISTENT"] > 0
        return Case("linear_logprobs_fwd", "stats_tiles", "_stats_tiles_kernel", arch, dt, list(shapes),
                    dict(common, inv_t="fp32", M_out=f32, S_out=f32, A_out=f32),
                    dict(base, **tile, V_TILES=c["V_TILES"], PERSISTENT=persistent), nw, ns,
                    ("stride_h", "stride_w", "N"), has_dot=True,
                    variant="entropy" + (", persistent" if persistent else ""))
    if kernel in ("stats_tma", "dlogits_tma"):  # TMA descriptors of the hidden / weight tiles (host TensorDescriptor)
        desc = (lambda rows: f"tensordesc<{dt}[{rows}, {c['BLOCK_H']}]>")
        types = dict(Hdesc=desc(c["BLOCK_N"]), Wdesc=desc(c["BLOCK_V"]), B=p, N="i32", V="i32", n_h="i32")
        types.update(dict(inv_t="fp32", M_out=f32, S_out=f32, A_out=f32) if kernel == "stats_tma" else
                     dict(rowvec, DZ=p, stride_dz="i32"))
        return Case("linear_logprobs_tma", kernel, f"_{kernel}_kernel", arch, dt, list(shapes), types,
                    dict(base, **tile, FLATTEN=bool(c["FLATTEN"]), WARP_SPECIALIZE=bool(c["WARP_SPECIALIZE"])),
                    nw, ns, ("N",) if kernel == "stats_tma" else ("stride_dz",), has_dot=True,
                    variant="entropy, tma, persistent")
    if kernel in ("stats_gluon", "dlogits_gluon"):  # Gluon: descriptor types carry their shared layouts
        from .linear_logprobs_gluon import CONSUMER_REGS, LOADER_REGS, shared_layout
        desc = (lambda rows, cols: f"tensordesc<{dt}[{rows}, {cols}],{shared_layout([rows, cols], _DT[dt])!r}>")
        types = dict(Hdesc=desc(c["BLOCK_N"], c["BLOCK_H"]), Wdesc=desc(c["BLOCK_V"], c["BLOCK_H"]))
        if kernel == "dlogits_gluon":
            types["DZdesc"] = desc(c["BLOCK_N"], c["BLOCK_V"])
        types.update(B=p, N="i32", V="i32", n_h="i32")
        types.update(dict(inv_t="fp32", M_out=f32, S_out=f32, A_out=f32) if kernel == "stats_gluon" else rowvec)
        return Case("linear_logprobs_gluon", kernel, f"_{kernel}_kernel", arch, dt, list(shapes), types,
                    dict(HAS_BIAS=False, ENTROPY=True, GROUP_N=c["GROUP_N"], STAGES=ns, PINGPONG=bool(c["PINGPONG"]),
                         LOADER_REGS=LOADER_REGS, CONSUMER_REGS=CONSUMER_REGS, num_warps=nw),
                    nw, ns, ("N",) if kernel == "stats_gluon" else (), has_dot=True,
                    variant="entropy, tma, warp-specialised, persistent" + (", ping-pong" if c["PINGPONG"] else ""))
    if kernel == "dlogits":
        return Case("linear_logprobs", "dlogits", "_dlogits_kernel", arch, dt, list(shapes),
                    dict(common, **rowvec, DZ=p, stride_dz="i32"), dict(base, **tile), nw, ns,
                    ("stride_h", "stride_w", "stride_dz"), has_dot=True, variant="entropy")
    if kernel == "grad_bwd":
        return Case("linear_logprobs", "grad_bwd", "_grad_bwd_kernel", arch, dt, list(shapes),
                    dict(common, **rowvec, DH=f32, DW=f32, DB=f32),
                    dict(base, NEED_DW=True, NEED_DB=False, **tile), nw, ns, ("stride_h", "stride_w", "n_h"),
                    has_dot=True, variant="entropy, atomic")
    raise ValueError(f"unknown log-prob kernel {name!r}")


def finish_case(arch: int, dt: str) -> Case:
    """The forward's finish (merge of the partials + target gather-dot; fixed launch parameters,
    the same at every shape), entropy on, no bias."""
    from . import linear_logprobs_finish as F
    p, f32 = f"*{dt}", "*fp32"
    return Case("linear_logprobs_finish", "finish", "_finish_kernel", arch, dt, ["every log-prob shape"],
                dict(M=f32, S=f32, A=f32, n_split="i32", N="i32", Hd=p, stride_h="i32", W=p, stride_w="i32",
                     B=p, LABELS="*i64", v_offset="i32", V="i32", n_h="i32", inv_t="fp32",
                     M_out=f32, S_out=f32, A_out=f32, T_out=f32),
                dict(HAS_BIAS=False, ENTROPY=True, BLOCK_R=F.BLOCK_R, BLOCK_S=F.BLOCK_S, BLOCK_H=F.BLOCK_H),
                F.NUM_WARPS, 3, ("stride_h", "stride_w", "N"), variant="entropy")


def pacs_case(kernel: str, arch: int, dt: str, cfg: dict, shapes=("tune",), packed: bool = False,
              G: int = 8, score: str = "rloo") -> Case:
    """The compile case of one launch of the PACS loss kernel ``kernel`` with the launch parameters
    ``cfg`` (a ``launch_config`` dict; ``dt`` of the log-probs, pass B works on fp32 partials): bool
    mask, logp_ref, padded ``[B, T]`` or packed with int32 cu_seqlens."""
    KP = _kernel_modules()["pacs_loss"]
    nw, ns, c = _split(cfg)
    p, f32 = f"*{dt}", "*fp32"
    var = "packed" if packed else "padded"
    wide = () if packed else ("T",)  # packed: row starts come from cu_seqlens
    if kernel == "fwd_sums":
        c.pop("N_SPLIT")  # the grid's second axis, not a kernel argument
        return Case("pacs_loss", "fwd_sums", "_pacs_sums_kernel", arch, dt, list(shapes),
                    dict(logp_ptr=p, ref_ptr=p, mask_ptr="*u8", cu_ptr="*i32" if packed else p, sums_ptr=f32,
                         cnt_ptr=f32, B="i32", T="i32"),
                    dict(ACC=tl.float32, PACKED=packed, HAS_MASK=True, HAS_REF=True, **c),
                    nw, ns, wide, variant=f"{var}, masked")
    if kernel == "bwd":
        c.pop("N_SPLIT")
        return Case("pacs_loss", "bwd", "_pacs_bwd_kernel", arch, dt, list(shapes),
                    dict(grad_ptr=f32, coef_ptr=f32, mask_ptr="*u8", cu_ptr="*i32" if packed else f32,
                         dlogp_ptr=p, B="i32", T="i32"),
                    dict(PACKED=packed, HAS_MASK=True, **c), nw, ns, wide, variant=f"{var}, masked")
    if kernel == "fwd":
        return Case("pacs_loss", "fwd", "_pacs_group_kernel", arch, "fp32", list(shapes),
                    dict(sums_ptr=f32, cnt_ptr=f32, rewards_ptr=f32, proxy_ptr=f32, score_ptr=f32,
                         pred_ptr=f32, weight_ptr=f32, sample_loss_ptr=f32, coef_ptr=f32,
                         partial_ptr=f32, n_split="i32", G="i32", g_float="fp32",
                         beta_hi="fp32", beta_lo="fp32", inv_b_hi="fp32", inv_b_lo="fp32",
                         eps_hi="fp32", eps_lo="fp32"),
                    dict(ACC=tl.float32, PROXY=0, SCORE=KP.SCORES[score], WEIGHT=0, **c), nw, ns,
                    ("n_split",), variant=f"G={G}, {score}")
    raise ValueError(f"unknown PACS loss kernel {kernel!r}")


def pacs_cases(arch: int, dtypes=("bf16", "fp32"), kernels=("fwd_sums", "fwd", "bwd"), config=None) -> list[Case]:
    """The PACS loss cases at ``PACS_SHAPES``: pass A and the backward (``dtypes`` of the log-probs,
    padded; also packed at the first shape's average length in fp32); pass B on pass A's fp32
    partials at ``PACS_GROUPS`` (rloo; grpo too at 64). ``config(kernel, B=, T=, G=, dtype=)``: the
    launch parameters (default ``launch_config`` at ``arch``; bench/gpu_tune_pacs.py passes its
    candidates). Not merged (``cases`` merges identical compile inputs)."""
    KP = _kernel_modules()["pacs_loss"]
    if config is None:
        def config(kernel, **kw):
            return KP.launch_config(kernel, arch=arch, **kw)
    out = []
    for b, t in PACS_SHAPES:
        for dt in dtypes:
            for packed in (False, True) if (b, t) == PACS_SHAPES[0] and dt == "fp32" else (False,):
                for kernel in ("fwd_sums", "bwd"):
                    if kernel in kernels:
                        cfg = config(kernel, B=b, T=t, G=8 if kernel == "fwd_sums" else 1, dtype=_DT[dt])
                        out.append(pacs_case(kernel, arch, dt, cfg, [f"B{b} T{t}"], packed))
        if "fwd" in kernels:
            dt = "fp32" if "fp32" in dtypes else dtypes[0]
            for g in PACS_GROUPS:
                for score in ("rloo", "grpo") if g == PACS_GROUPS[-1] else ("rloo",):
                    cfg = config("fwd", B=b, T=t, G=g, dtype=_DT[dt])
                    out.append(pacs_case("fwd", arch, dt, cfg, [f"B{b} T{t} G{g}"], G=g, score=score))
    return out


def pacs_access_problems(row: dict) -> str | None:
    """What is wrong with the global accesses of a compiled padded PACS streaming kernel (None: all
    fine; tests/test_kernels_compile.py asserts it, bench/gpu_tune_pacs.py filters on it): tiles
    must be read with 16-byte loads (``ld.global.v4``; at least 3 in pass A: logp, logp_ref, mask)
    and no scalar load but the backward's coef[row] and grad (2); the backward's dlogp stores must
    be 16-byte. Packed rows start anywhere, so their loads are scalar (not checked)."""
    if row["module"] != "pacs_loss" or not row["variant"].startswith("padded") or row["fn"] == "_pacs_group_kernel":
        return None
    acc = row["global_access"]
    scalar = sum(n for op, n in acc.items() if op.startswith("ld.global.") and ".v" not in op)
    vec = sum(n for op, n in acc.items() if op.startswith("ld.global.v4"))
    bwd = row["fn"] == "_pacs_bwd_kernel"
    if vec < (1 if bwd else 3) or scalar > (2 if bwd else 0):
        return f"loads not 16-byte: {acc}"
    if bwd and any(op.startswith("st.global.") and ".v4" not in op for op in acc):
        return f"dlogp stores not 16-byte: {acc}"
    return None


def cases(archs=ARCHS) -> list[Case]:
    """Every kernel x arch x dtype at the realistic shapes, with the launchers' own parameters
    (``launch_config``); cases with identical compile inputs are merged (``shapes`` lists them)."""
    from .linear_logprobs_launch import PINGPONG_CONFIGS
    mods = _kernel_modules()
    out: dict[str, Case] = {}

    def add(case: Case):
        case.key = compile_key(case)
        if case.key in out:
            out[case.key].shapes.extend(case.shapes)
        else:
            out[case.key] = case

    for arch in archs:
        # the launches a measured table chose at other hidden sizes too (kernels/tuning.py ``by_h``)
        shapes = LOGPROB_SHAPES + tuple((f"N8192 H{h} V151936 (tuned)", 8192, h, 151936)
                                        for h in tuning.hidden_sizes(arch))
        for dt in ("bf16", "fp32"):
            for shape, n, h, v in shapes:
                for name in LOGPROB_KERNELS:
                    mod, kernel = name.split(".")
                    extra = {} if mod == "token_logprobs" else dict(H=h)
                    cfg = mods[mod].launch_config(kernel, N=n, V=v, dtype=_DT[dt], arch=arch, **extra)
                    add(logprob_case(name, arch, dt, cfg, [shape]))
                    if name == "linear_logprobs.stats_tiles" and dt == "bf16" and not cfg["PERSISTENT"]:
                        add(logprob_case(name, arch, dt, dict(cfg, PERSISTENT=1), [shape]))  # selectable
                if dt == "bf16" and arch >= 90:  # the selectable TMA kernels (TMA: sm_90 and later)
                    for kernel in ("stats_tma", "dlogits_tma") + (("stats_gluon", "dlogits_gluon") if arch == 90 else ()):
                        cfg = mods["linear_logprobs"].launch_config(kernel, N=n, V=v, H=h, dtype=_DT[dt], arch=arch)
                        add(logprob_case(f"linear_logprobs.{kernel}", arch, dt, cfg, [shape]))
                        if kernel in PINGPONG_CONFIGS:  # their selectable ping-pong launch
                            cfg = dict(cfg, **PINGPONG_CONFIGS[kernel])
                            add(logprob_case(f"linear_logprobs.{kernel}", arch, dt, cfg, [shape]))
            add(finish_case(arch, dt))
        for case in pacs_cases(arch):
            add(case)
    return list(out.values())


# ---- compile and inspect ------------------------------------------------------------------------

def _signature(fn, types: dict, constexprs: dict) -> dict:
    missing = [a for a in fn.arg_names if a not in types and a not in constexprs]
    if missing:
        raise ValueError(f"{fn.__name__}: no type for arguments {missing}")
    return {a: ("constexpr" if a in constexprs else types[a]) for a in fn.arg_names}


def _attrs(fn, types: dict) -> dict:
    """Runtime specialisation the launcher sees at the realistic shapes: 16-byte aligned
    pointers, strides / sizes divisible by 16 (H = 4096, V = 151,936 and 75,968, T = 4096)."""
    runtime = [a for a in fn.arg_names if a in types]
    return {(fn.arg_names.index(a),): [["tt.divisibility", 16]]
            for a in runtime if types[a].startswith("*") or a in ("stride_x", "stride_dx", "stride_h",
                                                                  "stride_w", "stride_dz", "n_h", "T")}


def compile_fn(fn, types: dict, constexprs: dict, arch: int, num_warps: int, num_stages: int):
    from triton.backends.compiler import GPUTarget
    if getattr(fn, "is_gluon", lambda: False)():  # a @gluon.jit kernel (layouts explicit; staging its own)
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    src = Source(fn, _signature(fn, types, constexprs), constexprs, _attrs(fn, types))
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages, **LAUNCH_OPTIONS})


def _resource_usage(cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
        path = f.name
    try:
        res = subprocess.run([_bin("cuobjdump"), "--dump-resource-usage", path], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run([_bin("cuobjdump"), "-sass", path], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(path)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
    if m is None:
        raise RuntimeError(f"cuobjdump printed no resource usage:\n{res}")
    regs, stack, static_shared, local = (int(x) for x in m.groups())
    spills = len(re.findall(r"\b(?:STL|LDL)(?:\.\w+)*\b", sass))
    tc = sorted(set(re.findall(r"\b(HGMMA|HMMA|UTC\w*MMA)\b", sass)))
    ops = re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)", sass, re.M)
    return dict(regs=regs, stack=stack, static_shared=static_shared, local=local, spill_insts=spills,
                sass_mma=tc, fp32_alu={k: sum(op == k for op, _ in ops) for k in FP32_ALU},
                ex2=sum(op == "MUFU" and mod.startswith(".EX2") for op, mod in ops),
                ex2_guards=len(re.findall(r"FSETP\.GEU\.AND\s[^;]*-126\b", sass)))


# the FP32 pipe's instructions of the softmax epilogues (the GEMM itself runs on tensor cores); an ex2
# "guard" is the compare that ``tl.exp`` / non-ftz ``ex2.approx.f32`` puts before MUFU.EX2 for denormals
FP32_ALU = ("FADD", "FMUL", "FFMA", "FMNMX", "FSEL", "FSETP")


def logits_per_thread(row: dict) -> int | None:
    """Logits one thread handles per tile (``[BLOCK_N, BLOCK_V]`` over the tile's threads) of a log-prob
    kernel, per vocab block of a streaming token_logprobs kernel; None for other kernels. SASS counts of
    the epilogue divided by it are instructions per logit (the epilogue is straight-line code per tile)."""
    k, threads = row["constexprs"], 32 * row["num_warps"]
    if row["module"] == "token_logprobs":
        return int(k["BLOCK_V"]) // threads
    if row["module"] == "linear_logprobs_gluon":  # ping-pong: two consumer partitions, each its own copy
        copies = 2 if k.get("PINGPONG") == "True" else 1
        return copies * row["blocks"]["Hdesc"][0] * row["blocks"]["Wdesc"][0] // threads
    if row["module"] in ("linear_logprobs", "linear_logprobs_fwd", "linear_logprobs_tma"):
        return int(k["BLOCK_N"]) * int(k["BLOCK_V"]) // threads
    return None


_MMA_PATTERNS = (r"wgmma\.mma_async\.[\w.]+", r"tcgen05\.mma\.[\w:.]+", r"mma\.sync\.aligned\.[\w.]+")


def tensor_core_instrs(ptx: str) -> list[str]:
    found = set()
    for pat in _MMA_PATTERNS:
        found.update(re.findall(pat, ptx))
    return sorted(found)


def global_access(ptx: str) -> dict:
    """PTX global loads / stores by instruction (``ld.global.v4.b32``: 16 bytes per thread,
    ``ld.global.b8``: one byte): how far the memory accesses were vectorised."""
    found = {}
    for op in re.findall(r"\b((?:ld|st)\.global(?:\.[a-z0-9]+)*)", ptx):
        found[op] = found.get(op, 0) + 1
    return found


def param_uses(ptx: str, fn_name: str, index: int) -> dict:
    """How the 32-bit scalar kernel parameter number ``index`` is used in the PTX: follows the
    registers it is loaded into (and plain copies) and sorts every instruction reading them into
    ``narrow`` (a 32-bit multiply / multiply-add / shift: the product is computed in 32 bits) and
    ``wide`` (a widening multiply ``mul.wide`` or a conversion to 64 bits, after which products
    are 64-bit)."""
    param = rf"\[{re.escape(fn_name)}_param_{index}\]"
    regs = set(re.findall(rf"ld\.param\.[usb]32\s+(%r\d+),\s*{param}", ptx))
    # loaded sign-extended straight into a 64-bit register: every product with it is 64-bit
    regs64 = set(re.findall(rf"ld\.param\.[us]32\s+(%rd\d+),\s*{param}", ptx))
    lines = ptx.splitlines()
    changed = True
    while changed:  # follow mov copies
        changed = False
        for ln in lines:
            m = re.match(r"\s*mov\.[usb]32\s+(%r\d+),\s*(%r\d+);", ln)
            if m and m.group(2) in regs and m.group(1) not in regs:
                regs.add(m.group(1))
                changed = True
    narrow, wide = [], []
    for ln in lines:
        m = re.match(r"\s*(?:@%p\d+\s+)?([a-z0-9_.]+)\s+([^;]*);", ln)
        if not m:
            continue
        op, operands = m.groups()
        srcs = [o.strip() for o in operands.split(",")[1:]]
        if any(s in regs64 for s in srcs):
            wide.append(ln.strip())
            continue
        if not any(s in regs for s in srcs):
            continue
        if re.match(r"(mul|mad)\.(lo|hi)\.[su]32|mul24|mad24|shl\.b32", op):
            narrow.append(ln.strip())
        elif re.match(r"mul\.wide\.[su]32|mad\.wide\.[su]32|cvt\.[su]64\.[su]32", op):
            wide.append(ln.strip())
    return dict(registers=sorted(regs | regs64), narrow=narrow, wide=len(wide))


def _ptx_param_index(fn, types: dict) -> dict:
    """Runtime argument -> its first PTX parameter number: a tensor descriptor of rank r
    (``tensordesc<bf16[a, b]>``, a Gluon one with its layout after the block) takes 1 + 2r of them
    (the descriptor, its shape, its strides)."""
    out, i = {}, 0
    for a in fn.arg_names:
        if a in types:
            out[a] = i
            t = types[a]
            i += 1 + 2 * (t[t.index("[") + 1:t.index("]")].count(",") + 1) if t.startswith("tensordesc") else 1
    return out


def offset_report(ptx: str, fn, types: dict, params) -> dict:
    index = _ptx_param_index(fn, types)
    return {p: param_uses(ptx, fn.__name__, index[p]) for p in params}


def compile_case(case: Case) -> dict:
    """Compiles one case; returns its report (see the module docstring). Never raises for a
    compile failure: ``error`` holds it."""
    fn = getattr(_kernel_modules()[case.module], case.fn)
    row = dict(label=case.label(), module=case.module, kernel=case.kernel, fn=case.fn, arch=case.arch,
               dtype=case.dtype, variant=case.variant, shapes=case.shapes, num_warps=case.num_warps,
               num_stages=case.num_stages, has_dot=case.has_dot,
               constexprs={k: str(v) for k, v in case.constexprs.items()}, error=None)
    t0 = time.perf_counter()
    try:
        ck = compile_fn(fn, case.types, case.constexprs, case.arch, case.num_warps, case.num_stages)
    except Exception as e:  # reported, asserted by the test
        row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        return row
    row["compile_s"] = round(time.perf_counter() - t0, 2)
    ptx = ck.asm["ptx"]
    usage = _resource_usage(ck.asm["cubin"])
    row.update(usage)
    row["shared"] = int(ck.metadata.shared) + usage["static_shared"]
    row["smem_limit"] = SMEM_LIMIT[case.arch]
    row["mma"] = tensor_core_instrs(ptx)
    row["tf32"] = bool(re.search(r"\btf32\b", ptx))
    row["tma_loads"] = len(re.findall(r"\bcp\.async\.bulk\.tensor\b", ptx))  # TMA copies (descriptor loads)
    # warp specialisation: the partitions' register budgets (``setmaxnreg.inc`` / ``.dec``)
    row["setmaxnreg"] = sorted({f"{d} {n}" for d, n in re.findall(r"setmaxnreg\.(inc|dec)\.\S+\s+(\d+)", ptx)})
    row["global_access"] = global_access(ptx)
    row["blocks"] = {a: [int(x) for x in t[t.index("[") + 1:t.index("]")].split(",")]  # descriptors' blocks
                     for a, t in case.types.items() if t.startswith("tensordesc")}
    row["offsets"] = offset_report(ptx, fn, case.types, case.wide_params)
    per = logits_per_thread(row)
    if per:  # the epilogue's cost per logit (tests/test_kernels_compile.py bounds it)
        row["alu_per_logit"] = round(sum(row["fp32_alu"].values()) / per, 2)
        row["ex2_per_logit"] = round(row["ex2"] / per, 2)
    return row


def _compile_worker(case_dict):
    return compile_case(Case(**case_dict))


def run(archs=ARCHS, jobs: int = 1, modules=None) -> list[dict]:
    """Compiles ``cases(archs)`` (only those of the kernel files in ``modules`` when given)."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter replaces the kernels by Python code")
    todo = [asdict(c) for c in cases(archs) if modules is None or c.module in modules]
    if jobs <= 1:
        return [_compile_worker(c) for c in todo]
    with ProcessPoolExecutor(jobs) as ex:
        return list(ex.map(_compile_worker, todo))


# ---- control kernels for the 64-bit offset check (tests/test_kernels_compile.py) ---------------

@triton.jit
def _offset_probe_narrow(X, stride, Y, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # int32 row * stride: overflows past 2^31 elements
    cols = tl.arange(0, BLOCK)
    tl.store(Y + cols, tl.load(X + row * stride + cols))


@triton.jit
def _offset_probe_wide(X, stride, Y, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    tl.store(Y + cols, tl.load(X + row * stride + cols))


def probe_offsets(arch: int = 90) -> dict:
    """``{"narrow": report, "wide": report}`` of the two control kernels (the checker must flag
    the first and pass the second)."""
    out = {}
    types = dict(X="*fp32", stride="i32", Y="*fp32")
    for name, fn in (("narrow", _offset_probe_narrow), ("wide", _offset_probe_wide)):
        ck = compile_fn(fn, types, dict(BLOCK=128), arch, 4, 1)
        out[name] = offset_report(ck.asm["ptx"], fn, types, ("stride",))["stride"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", required=True, help="write the per-case report here (atomically)")
    ap.add_argument("--archs", default=",".join(map(str, ARCHS)), help="e.g. 80,90,100")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--modules", default=None, help="only these kernel files, e.g. pacs_loss,token_logprobs")
    args = ap.parse_args(argv)
    archs = tuple(int(a) for a in args.archs.split(","))
    rows = run(archs, args.jobs, None if args.modules is None else args.modules.split(","))
    report = dict(triton=triton.__version__, archs=archs, cases=rows, probe=probe_offsets(90))
    tmp = args.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, args.json)
    bad = [r["label"] for r in rows if r["error"]]
    print(f"{len(rows)} cases, {len(bad)} failed to compile" + (f": {bad}" if bad else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
