"""The compile cases of kernels/aot.py: every launched kernel x architecture x dtype with the launch
parameters its launcher picks (``launch_config``) at the realistic shapes, as ``Case`` records (the
kernel, its argument types, constexprs, warps and stages), and the PACS loss's access check on a compiled
case's report. ``cases`` is what tests/test_kernels_compile.py compiles; bench/gpu/tune.py and
bench/gpu/tune_pacs.py build their candidates' cases with ``logprob_case`` / ``pacs_case``. Building a
case compiles nothing. This module imports only torch and triton (and the kernel modules beside it).
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field

import torch
import triton.language as tl

from . import tuning

ARCHS = (80, 86, 89, 90, 100, 120)
# compiled for their default launches only (what the dispatcher runs there without a measured table: the
# tiled forward, its finish, the pointer dz kernel, both token_logprobs kernels, the PACS loss's three;
# bf16 log-probs at the main shape, the fp32 loss at the first): ~1 s per case, the test's time stays modest
DEFAULT_ONLY_ARCHS = (86, 89, 120)
DEFAULT_LOGPROB_KERNELS = ("token_logprobs.stats_fwd", "token_logprobs.grad_bwd", "linear_logprobs.stats_tiles",
                           "linear_logprobs.dlogits")
# per-block shared memory limits (opt-in maximum): A100 163 KB, A10 / L4 / RTX 50 99 KB, H100/H200 and B200 227 KB
SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024, 120: 99 * 1024}
GPU_NAMES = {80: "A100", 86: "A10/A40/RTX 30", 89: "L4/L40S/RTX 40", 90: "H100/H200", 100: "B200",
             120: "RTX 50/RTX PRO 6000"}
# the realistic shapes: log-probs N x H x V (and V / 2 under tensor parallel 2), PACS B x T
LOGPROB_SHAPES = (("N8192 H4096 V151936", 8192, 4096, 151936), ("N8192 H4096 V75968 (tp2)", 8192, 4096, 75968))
PACS_SHAPES = ((1024, 4096), (8192, 1024))  # issue 22's targets for the loss at memory speed
PACS_GROUPS = (8, 16, 64)
GEMMA2_SOFTCAP = 30.0  # final_logit_softcapping of every Gemma 2 checkpoint: its capped launches are compiled too
_DT = {"bf16": torch.bfloat16, "fp32": torch.float32}


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


def logprob_case(name: str, arch: int, dt: str, cfg: dict, shapes=("tune",), softcap: float = 0.0) -> Case:
    """The compile case of one launch of the log-prob kernel ``name`` (one of ``LOGPROB_KERNELS``,
    "file.launch_config name") with the launch parameters ``cfg`` (a ``launch_config`` dict), entropy
    on, no bias: what the launcher compiles. ``cases`` and bench/gpu/tune.py both build cases here.
    ``softcap`` > 0: the soft-capped launch of a kernel that has one (Gemma 2: the tiled and split forwards,
    the pointer dz kernel, the atomic backward)."""
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
    cap = dict(SOFTCAP=float(softcap))  # (the kernels without a cap take no SOFTCAP)
    capped = ", softcap" if softcap else ""
    if kernel == "stats_fwd":
        tile.pop("GROUP_N")
        return Case("linear_logprobs", "stats_fwd", "_stats_fwd_kernel", arch, dt, list(shapes),
                    dict(common, v_per_split="i32", inv_t="fp32", M_out=f32, S_out=f32, A_out=f32),
                    dict(base, **tile, **cap), nw, ns, ("stride_h", "stride_w"), has_dot=True,
                    variant="entropy" + capped)
    if kernel == "stats_tiles":
        persistent = c["PERSISTENT"] > 0
        return Case("linear_logprobs_fwd", "stats_tiles", "_stats_tiles_kernel", arch, dt, list(shapes),
                    dict(common, inv_t="fp32", M_out=f32, S_out=f32, A_out=f32),
                    dict(base, **tile, V_TILES=c["V_TILES"], PERSISTENT=persistent, **cap), nw, ns,
                    ("stride_h", "stride_w", "N"), has_dot=True,
                    variant="entropy" + (", persistent" if persistent else "") + capped)
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
                    dict(common, **rowvec, DZ=p, stride_dz="i32"), dict(base, **tile, **cap), nw, ns,
                    ("stride_h", "stride_w", "stride_dz"), has_dot=True, variant="entropy" + capped)
    if kernel == "grad_bwd":
        return Case("linear_logprobs", "grad_bwd", "_grad_bwd_kernel", arch, dt, list(shapes),
                    dict(common, **rowvec, DH=f32, DW=f32, DB=f32),
                    dict(base, NEED_DW=True, NEED_DB=False, **tile, **cap), nw, ns, ("stride_h", "stride_w", "n_h"),
                    has_dot=True, variant="entropy, atomic" + capped)
    raise ValueError(f"unknown log-prob kernel {name!r}")


def finish_case(arch: int, dt: str, softcap: float = 0.0) -> Case:
    """The forward's finish (merge of the partials + target gather-dot; fixed launch parameters,
    the same at every shape), entropy on, no bias; ``softcap`` > 0: the target soft-capped."""
    from . import linear_logprobs_finish as F
    p, f32 = f"*{dt}", "*fp32"
    return Case("linear_logprobs_finish", "finish", "_finish_kernel", arch, dt, ["every log-prob shape"],
                dict(M=f32, S=f32, A=f32, n_split="i32", N="i32", Hd=p, stride_h="i32", W=p, stride_w="i32",
                     B=p, LABELS="*i64", v_offset="i32", V="i32", n_h="i32", inv_t="fp32",
                     M_out=f32, S_out=f32, A_out=f32, T_out=f32),
                dict(HAS_BIAS=False, ENTROPY=True, BLOCK_R=F.BLOCK_R, BLOCK_S=F.BLOCK_S, BLOCK_H=F.BLOCK_H,
                     SOFTCAP=float(softcap)),
                F.NUM_WARPS, 3, ("stride_h", "stride_w", "N"), variant="entropy" + (", softcap" if softcap else ""))


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
                    dict(logp_ptr=p, ref_ptr=p, mask_ptr="*u8", cu_ptr="*i32" if packed else p, ws_ptr=f32,
                         B="i32", T="i32"),
                    dict(ACC=tl.float32, PACKED=packed, HAS_MASK=True, HAS_REF=True, **c),
                    nw, ns, wide, variant=f"{var}, masked")
    if kernel == "bwd":
        c.pop("N_SPLIT")
        return Case("pacs_loss", "bwd", "_pacs_bwd_kernel", arch, dt, list(shapes),
                    dict(grad_ptr=f32, coef_ptr=f32, mask_ptr="*u8", cu_ptr="*i32" if packed else f32,
                         dlogp_ptr=p, B="i32", T="i32"),
                    dict(PACKED=packed, HAS_MASK=True, **c), nw, ns, wide, variant=f"{var}, masked")
    scalars = dict(G="i32", g_float="fp32", beta_hi="fp32", beta_lo="fp32", inv_b_hi="fp32", inv_b_lo="fp32",
                   eps_hi="fp32", eps_lo="fp32")
    if kernel == "fwd_one":
        if not cfg.get("ONE_PASS", 1):
            raise ValueError(f"pacs_case('fwd_one'): a launch config with ONE_PASS = 0 launches no one-pass kernel: {cfg}")
        c.pop("ONE_PASS", None)
        return Case("pacs_loss", "fwd_one", "_pacs_one_pass_kernel", arch, dt, list(shapes),
                    dict(logp_ptr=p, ref_ptr=p, mask_ptr="*u8", cu_ptr="*i32" if packed else p, rewards_ptr=f32,
                         terms_ptr=f32, coef_ptr=f32, partial_ptr=f32, B="i32", T="i32", **scalars),
                    dict(ACC=tl.float32, PACKED=packed, HAS_MASK=True, HAS_REF=True, PROXY=0,
                         SCORE=KP.SCORES[score], WEIGHT=0, **c),
                    nw, ns, wide, variant=f"{var}, masked, G={G}, {score}")
    if kernel == "fwd":
        return Case("pacs_loss", "fwd", "_pacs_group_kernel", arch, "fp32", list(shapes),
                    dict(ws_ptr=f32, rewards_ptr=f32, terms_ptr=f32, coef_ptr=f32, partial_ptr=f32,
                         B="i32", n_split="i32", G="i32", g_float="fp32",
                         beta_hi="fp32", beta_lo="fp32", inv_b_hi="fp32", inv_b_lo="fp32",
                         eps_hi="fp32", eps_lo="fp32"),
                    dict(ACC=tl.float32, PROXY=0, SCORE=KP.SCORES[score], WEIGHT=0, **c), nw, ns,
                    ("n_split",), variant=f"G={G}, {score}")
    raise ValueError(f"unknown PACS loss kernel {kernel!r}")


def pacs_cases(arch: int, dtypes=("bf16", "fp32"), kernels=("fwd_one", "fwd_sums", "fwd", "bwd"),
               config=None) -> list[Case]:
    """The PACS loss cases at ``PACS_SHAPES``: pass A and the backward (``dtypes`` of the log-probs,
    padded; also packed at the first shape's average length in fp32); pass B on pass A's fp32
    partials at ``PACS_GROUPS`` (rloo; grpo too at 64); the one-pass forward at ``PACS_GROUPS`` where its
    launch config takes it (padded in ``dtypes``, packed in fp32 at the first shape; grpo too at 64). ``config(kernel, B=, T=, G=, dtype=)``: the
    launch parameters (default ``launch_config`` at ``arch``; bench/gpu/tune_pacs.py passes its
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
        if "fwd_one" in kernels:
            for dt in dtypes:
                for packed in (False, True) if (b, t) == PACS_SHAPES[0] and dt == "fp32" else (False,):
                    for g in PACS_GROUPS:
                        for score in ("rloo", "grpo") if g == PACS_GROUPS[-1] else ("rloo",):
                            cfg = config("fwd_one", B=b, T=t, G=g, dtype=_DT[dt])
                            if cfg["ONE_PASS"]:
                                out.append(pacs_case("fwd_one", arch, dt, cfg, [f"B{b} T{t} G{g}"], packed, G=g,
                                                     score=score))
        if "fwd" in kernels:
            dt = "fp32" if "fp32" in dtypes else dtypes[0]
            for g in PACS_GROUPS:
                for score in ("rloo", "grpo") if g == PACS_GROUPS[-1] else ("rloo",):
                    cfg = config("fwd", B=b, T=t, G=g, dtype=_DT[dt])
                    out.append(pacs_case("fwd", arch, dt, cfg, [f"B{b} T{t} G{g}"], G=g, score=score))
    return out


def pacs_access_problems(row: dict) -> str | None:
    """What is wrong with the global accesses of a compiled padded PACS streaming kernel (None: all
    fine; tests/test_kernels_compile.py asserts it, bench/gpu/tune_pacs.py filters on it): tiles
    must be read with 16-byte loads (``ld.global.v4``; at least 3 in pass A: logp, logp_ref, mask)
    and no scalar load but the backward's coef[row] and grad (2); the backward's dlogp stores must
    be 16-byte. Packed rows start anywhere, so their loads are scalar (not checked)."""
    if row["module"] != "pacs_loss" or not row["variant"].startswith("padded") or row["fn"] == "_pacs_group_kernel":
        return None
    if row["fn"] == "_pacs_one_pass_kernel":  # its tiles 16-byte too; scalar: at most 3 instructions, the
        acc = row["global_access"]            # epilogue's read of the group's rewards, once after the token loop
        vec = sum(n for op, n in acc.items() if op.startswith("ld.global.v4"))
        scalar = sum(n for op, n in acc.items() if op.startswith("ld.global.") and ".v" not in op)
        return None if vec >= 3 and scalar <= 3 else f"loads not 16-byte: {acc}"
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
    (``launch_config``); cases with identical compile inputs are merged (``shapes`` lists them).
    ``DEFAULT_ONLY_ARCHS``: the default launches only. Where an arch's measured table was measured under
    another Triton / torch (kernels/tuning.py ignores it at run time), both the launches the running
    versions get (the built-in ones) and the table's (shapes marked "[table]") are compiled; so are the
    launches of each device with its own table (``tuning.device_tables``; shapes marked "[<device>]")."""
    out: dict[str, Case] = {}

    def add(case: Case):
        case.key = compile_key(case)
        if case.key in out:
            out[case.key].shapes.extend(case.shapes)
        else:
            out[case.key] = case

    for arch in archs:
        if arch in DEFAULT_ONLY_ARCHS:
            _default_cases(arch, add)
            continue
        for device in [None] + tuning.device_tables(arch):  # each device's view: its own table over the arch's
            with tuning.on_device(device):
                mark = f" [{device}]" if device else ""
                mismatch = tuning.table_version_mismatch(arch)
                with warnings.catch_warnings():
                    if mismatch:  # known: no warning that the running versions ignore the table
                        warnings.filterwarnings("ignore", message="ignoring the tuned launch table")
                    _arch_cases(arch, add, mark)
                if mismatch:
                    with tuning.ignoring_versions():
                        _arch_cases(arch, add, mark + " [table]")
    return list(out.values())


def _default_cases(arch: int, add) -> None:
    """The launches the dispatcher runs by default on ``arch`` (``DEFAULT_ONLY_ARCHS``)."""
    mods = _kernel_modules()
    shape, n, h, v = LOGPROB_SHAPES[0]
    for name in DEFAULT_LOGPROB_KERNELS:
        mod, kernel = name.split(".")
        extra = {} if mod == "token_logprobs" else dict(H=h)
        cfg = mods[mod].launch_config(kernel, N=n, V=v, dtype=torch.bfloat16, arch=arch, **extra)
        add(logprob_case(name, arch, "bf16", cfg, [shape]))
    add(finish_case(arch, "bf16"))
    b, t = PACS_SHAPES[0]
    for kernel, g in (("fwd_one", 8), ("fwd_sums", 8), ("bwd", 1), ("fwd", 8)):  # one pass or two, by the shape
        cfg = mods["pacs_loss"].launch_config(kernel, B=b, T=t, G=g, dtype=torch.float32, arch=arch)
        add(pacs_case(kernel, arch, "fp32", cfg, [f"B{b} T{t}" + (f" G{g}" if kernel.startswith("fwd") and
                                                                  kernel != "fwd_sums" else "")], G=g))


def _arch_cases(arch: int, add, mark: str) -> None:
    """Every launch of ``arch`` (shape names suffixed with ``mark``)."""
    from .linear_logprobs_launch import PINGPONG_CONFIGS, capped_config
    mods = _kernel_modules()
    # the launches a measured table chose at other hidden sizes too (kernels/tuning.py ``by_h``)
    shapes = LOGPROB_SHAPES + tuple((f"N8192 H{h} V151936 (tuned)", 8192, h, 151936)
                                    for h in tuning.hidden_sizes(arch))
    for dt in ("bf16", "fp32"):
        for shape, n, h, v in shapes:
            shape = shape + mark
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
    shape, n, h, v = LOGPROB_SHAPES[0]  # a soft-capped model's (Gemma 2) launches: the tiled kernels, capped
    for name in ("linear_logprobs.stats_tiles", "linear_logprobs.dlogits", "linear_logprobs.grad_bwd"):
        cfg = capped_config(mods["linear_logprobs"].launch_config(name.split(".")[1], N=n, V=v, H=h,
                                                                  dtype=torch.bfloat16, arch=arch))
        add(logprob_case(name, arch, "bf16", cfg, [shape + mark], softcap=GEMMA2_SOFTCAP))
    add(finish_case(arch, "bf16", softcap=GEMMA2_SOFTCAP))
    for case in pacs_cases(arch):
        if mark:
            case.shapes = [s + mark for s in case.shapes]
        add(case)
