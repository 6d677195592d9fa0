"""Ahead-of-time compilation of every kernel for real GPUs, on a machine without one.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` runs Triton's whole
pipeline (TTIR -> TTGIR -> LLVM -> PTX -> ptxas cubin) with no device present. For each case (a
kernel, the launch parameters its launcher picks through ``launch_config`` at a realistic shape,
an architecture and a dtype; kernels/aot_cases.py builds them, re-exported here) ``compile_case`` reports what the GPU compiler decided:

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
interpreter replaces the kernels by Python functions). ``bench/gpu/compile_report.py`` turns the
JSON into the table of docs/GPU.md; tests/test_kernels_compile.py asserts on it.
This module imports only triton and torch (and the kernel modules beside it).
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

import triton
import triton.language as tl

from . import LAUNCH_OPTIONS
# the cases (what is compiled, with which launch parameters), re-exported: aot.cases, aot.Case, ...
from .aot_cases import (ARCHS, DEFAULT_ONLY_ARCHS, GPU_NAMES, LOGPROB_KERNELS, LOGPROB_SHAPES,  # noqa: F401
                        PACS_GROUPS, PACS_SHAPES, SMEM_LIMIT, Case, _kernel_modules, cases, compile_key, finish_case,
                        logprob_case, pacs_access_problems, pacs_case, pacs_cases)

def _bin(tool: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)


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
    """What ``cuobjdump`` reads in ``cubin`` (:func:`_disassemble`), kept in Triton's cache beside the
    compiled kernels (``TRITON_CACHE_DIR``, default ``~/.triton/cache``): disassembling the SASS is most of a
    cached compile's time. The key is the cubin and the parser's own source, so a changed parser or
    kernel reads afresh."""
    from triton.runtime.cache import get_cache_manager

    key = hashlib.sha256(cubin + _PARSER_KEY).hexdigest()
    cache = get_cache_manager(key)
    hit = cache.get_file("resource_usage.json")
    if hit is not None:
        with open(hit) as f:
            return json.load(f)
    usage = _disassemble(cubin)
    cache.put(json.dumps(usage), "resource_usage.json", binary=False)
    return usage


def _disassemble(cubin: bytes) -> dict:
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
_PARSER_KEY = (inspect.getsource(_disassemble) + repr(FP32_ALU)).encode()


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
    row["smem_limit"] = SMEM_LIMIT.get(case.arch)
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


@triton.jit
def _target_probe(X, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    tl.store(X + cols, tl.load(X + cols) * 2)


def target_problem(arch: int) -> str | None:
    """Why the installed Triton cannot compile for ``arch`` (None: it can): a trivial kernel compiled
    through the whole pipeline (its ptxas included)."""
    try:
        compile_fn(_target_probe, dict(X="*fp32"), dict(BLOCK=128), arch, 4, 1)
    except Exception as e:  # reported in the JSON's ``skipped_archs``
        return f"{type(e).__name__}: {str(e).strip()[:300]}"
    return None


def run(archs=ARCHS, jobs: int = 1, modules=None, skipped: dict | None = None) -> list[dict]:
    """Compiles ``cases(archs)`` (only those of the kernel files in ``modules`` when given) for the archs
    the installed Triton can target (``target_problem``; the others go into ``skipped``: arch -> why)."""
    if os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes"):  # as Triton reads it
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter replaces the kernels by Python code")
    problems = {a: target_problem(a) for a in archs}
    if skipped is not None:
        skipped.update({a: p for a, p in problems.items() if p})
    archs = tuple(a for a in archs if not problems[a])
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
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])  # None under python -OO
    ap.add_argument("--json", required=True, help="write the per-case report here (atomically)")
    ap.add_argument("--archs", default=",".join(map(str, ARCHS)), help="e.g. 80,90,100 (default: every arch)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--modules", default=None, help="only these kernel files, e.g. pacs_loss,token_logprobs")
    args = ap.parse_args(argv)
    archs = tuple(a.strip().removeprefix("sm_") for a in args.archs.split(","))
    unknown = [a for a in archs if not a.isdigit() or int(a) not in ARCHS]
    if unknown or not archs:
        ap.error(f"--archs {args.archs!r}: {', '.join(map(repr, unknown))} not among the archs the cases are written "
                 f"for ({', '.join(map(str, ARCHS))})")
    archs = tuple(int(a) for a in archs)
    modules = None if args.modules is None else [m.strip() for m in args.modules.split(",")]
    known = sorted(_kernel_modules())
    if modules is not None and any(m not in known for m in modules):
        ap.error(f"--modules {args.modules!r}: {', '.join(repr(m) for m in modules if m not in known)} not among the "
                 f"kernel files ({', '.join(known)})")
    skipped = {}
    rows = run(archs, args.jobs, modules, skipped)
    report = dict(triton=triton.__version__, archs=[a for a in archs if a not in skipped], cases=rows,
                  skipped_archs={str(a): why for a, why in skipped.items()}, probe=probe_offsets(90))
    tmp = args.json + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, args.json)
    bad = [r["label"] for r in rows if r["error"]]
    print(f"{len(rows)} cases, {len(bad)} failed to compile" + (f": {bad}" if bad else "")
          + "".join(f"; sm_{a} skipped: {why}" for a, why in skipped.items()))
    if len(bad) == len(rows):  # every arch asked for skipped (this Triton cannot target it), or every case failed
        print(f"error: nothing was compiled (see {args.json})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
