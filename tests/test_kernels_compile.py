"""Ahead-of-time compile checks of every Triton kernel for real GPUs, without a GPU.

One subprocess (``python -m pacs_fast.kernels.aot``, without TRITON_INTERPRET, which the test
session sets) compiles every launched ``@triton.jit`` kernel for sm_80 (A100), sm_90 (H100/H200)
and sm_100 (B200) with the launch parameters the launchers choose (``launch_config`` of each
kernel file) at the realistic shapes of issue 13 (log-probs N=8192, H=4096, V=151,936 and V/2;
PACS B=1024, T=4096 and B=8192, T=1024, G=8/16/64), in bf16 and fp32, and the default launches only
(``DEFAULT_LAUNCHES``: what the dispatcher runs there without a measured table) for sm_86 (A10), sm_89 (L4)
and sm_120 (RTX 50; shared memory 99 KB per block), each arch where the installed Triton can target it
(Triton 3.9: all six); its JSON report is shared by the tests below (compiled once per session; Triton's cache
makes a second session fast).
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

triton = pytest.importorskip("triton", reason="the compile checks need the triton package")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL_FILES = ("token_logprobs.py", "linear_logprobs.py", "linear_logprobs_fwd.py", "linear_logprobs_tma.py",
                "linear_logprobs_gluon.py", "linear_logprobs_finish.py", "linear_logprobs_bwd.py", "pacs_loss.py")

# Kernels allowed to spill: (module, function, arch, dtype) -> (largest stack bytes measured, why); a fifth
# element, a Triton minor ("3.6"), limits an entry to that Triton. Anything spilling that is not listed here
# (or spilling more than listed) fails the test.
SPILL_EXCEPTIONS = {
    # Triton 3.6.0 (torch 2.11's, the GPU image's; setup.py's tested range is 3.6-3.9), compiled on 2026-11-28:
    # three launches chosen spill-free under 3.9 spill a little; every other launch is spill-free there too.
    ("linear_logprobs_fwd", "_stats_tiles_kernel", 80, "bf16", "3.6"): (
        32, "entropy on, not persistent: 255 regs, 8 STL/LDL (3.9: 255 regs, none). 128x128 tiles compile "
            "spill-free (176 regs) but halve the reuse of each hidden tile; sm_80 has no measurement to choose by"),
    ("linear_logprobs", "_stats_fwd_kernel", 90, "fp32", "3.6"): (
        32, "entropy on: 33 STL/LDL; the fp32 correctness path of the split forward, not a default"),
    ("linear_logprobs", "_stats_fwd_kernel", 100, "fp32", "3.6"): (
        24, "entropy on: 13 STL/LDL; the fp32 correctness path of the split forward, not a default"),
}


def _spill_allowance(report, c):
    """The exception of compile case ``c``: the entry for any Triton, else the one for the report's minor."""
    key = (c["module"], c["fn"], c["arch"], c["dtype"])
    minor = ".".join(report["triton"].split(".")[:2])
    return SPILL_EXCEPTIONS.get(key) or SPILL_EXCEPTIONS.get((*key, minor))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot") / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "pacs_fast.kernels.aot", "--json", str(out), "--jobs", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"AOT compile run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    rep = json.loads(out.read_text())
    print(f"AOT compile of {len(rep['cases'])} cases: {time.time() - t0:.1f} s")
    return rep


def _launched_kernels():
    """Every ``@triton.jit`` / ``@gluon.jit`` function of the kernel files that a launcher launches
    (``name[grid]``)."""
    srcs = {f: open(os.path.join(ROOT, "kernels", f)).read() for f in KERNEL_FILES}
    launches = "\n".join(srcs.values())  # a launcher may sit in another file (linear_logprobs_bwd.py)
    found = set()
    for f, src in srcs.items():
        jit = re.findall(r"@(?:triton|gluon)\.jit\s*\ndef (\w+)", src)
        found |= {(f[:-3], name) for name in jit if re.search(rf"\b{name}\[", launches)}
    return found


def test_every_launch_asks_for_fp_fusion():
    """Every kernel launch in the kernel files passes ``**LAUNCH_OPTIONS`` (FP fusion on, explicitly):
    Triton 3.9 warns that its default turns fusion off in 3.10, which would add ~0.5 FP32 instructions per
    logit to the epilogues (measured by compiling with TRITON_DEFAULT_FP_FUSION=0). 15 launch sites."""
    import ast
    sites, missing = 0, []
    for f in KERNEL_FILES:
        tree = ast.parse(open(os.path.join(ROOT, "kernels", f)).read())
        for node in ast.walk(tree):  # name[grid](...) and module.name[grid](...)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and \
                    re.search(r"_kernel$", ast.unparse(node.func.value)):
                sites += 1
                if not any(k.arg is None and ast.unparse(k.value) == "LAUNCH_OPTIONS" for k in node.keywords):
                    missing.append(f"{f}:{node.lineno} {ast.unparse(node.func)}")
    assert sites == 15 and not missing, (sites, missing)


def test_aot_compile_keeps_fp_fusion_when_the_default_turns_it_off(tmp_path):
    """The compile report's epilogue counts hold when Triton's default is off (as from 3.10 on): the
    same kernel compiled with TRITON_DEFAULT_FP_FUSION=0 gives the same SASS, since kernels/aot.py asks for
    fusion as the launchers do."""
    script = ("import json, sys, torch\n"
              "from pacs_fast.kernels import aot, linear_logprobs as KL\n"
              "cfg = KL.launch_config('stats_tiles', N=8192, V=151936, H=4096, dtype=torch.bfloat16, arch=90)\n"
              "r = aot.compile_case(aot.logprob_case('linear_logprobs.stats_tiles', 90, 'bf16', cfg))\n"
              "print('REPORT', json.dumps([r['error'], r['fp32_alu'], r['regs']]))")
    out = {}
    for default in ("0", "1"):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env.update(TRITON_DEFAULT_FP_FUSION=default, TRITON_CACHE_DIR=str(tmp_path / default))
        proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[default] = json.loads(proc.stdout.split("REPORT", 1)[1])
    assert out["0"][0] is None and out["0"] == out["1"], out
    assert out["0"][1]["FFMA"] > 0


def test_disassembly_is_cached_by_cubin(tmp_path, monkeypatch):
    """kernels/aot.py keeps each cubin's cuobjdump reading in Triton's cache (most of a cached compile's
    time): read once per cubin, again for another cubin, from TRITON_CACHE_DIR."""
    from pacs_fast.kernels import aot
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    read = []
    monkeypatch.setattr(aot, "_disassemble", lambda cubin: read.append(cubin) or {"regs": len(cubin)})
    assert [aot._resource_usage(c) for c in (b"cubin", b"cubin", b"other cubin")] == \
        [{"regs": 5}, {"regs": 5}, {"regs": 11}]
    assert read == [b"cubin", b"other cubin"]
    assert len(list(tmp_path.rglob("resource_usage.json"))) == 2


def _fail(rows, what):
    return f"{what}:\n" + "\n".join(f"  {r}" for r in rows)


# what aot_cases.DEFAULT_ONLY_ARCHS compile: the kernels the dispatcher runs there by default
DEFAULT_LAUNCHES = {("token_logprobs", "_stats_fwd_kernel", "bf16"), ("token_logprobs", "_grad_bwd_kernel", "bf16"),
                    ("linear_logprobs_fwd", "_stats_tiles_kernel", "bf16"),
                    ("linear_logprobs", "_dlogits_kernel", "bf16"),
                    ("linear_logprobs_finish", "_finish_kernel", "bf16"),
                    ("pacs_loss", "_pacs_sums_kernel", "fp32"), ("pacs_loss", "_pacs_bwd_kernel", "fp32"),
                    ("pacs_loss", "_pacs_group_kernel", "fp32"), ("pacs_loss", "_pacs_one_pass_kernel", "fp32")}


def test_every_launched_kernel_compiles_for_every_arch_and_dtype(report):
    from pacs_fast.kernels import aot
    errors = [(c["label"], c["error"]) for c in report["cases"] if c["error"]]
    assert not errors, _fail(errors, "compile failures")
    covered = {(c["module"], c["fn"], c["arch"], c["dtype"]) for c in report["cases"]}
    kernels = _launched_kernels()
    assert len(kernels) == 15, kernels  # 2 token, 9 linear, 4 PACS: a new kernel must be added to aot.cases
    # every arch compiled, or skipped with the reason (the installed Triton cannot target it); Triton 3.9: none
    assert sorted(report["archs"] + [int(a) for a in report["skipped_archs"]]) == sorted(aot.ARCHS), report["archs"]
    if triton.__version__.startswith("3.9"):
        assert not report["skipped_archs"], report["skipped_archs"]
    for arch in set(report["archs"]) & set(aot.DEFAULT_ONLY_ARCHS):  # the default launches only
        got = {(c["module"], c["fn"], c["dtype"]) for c in report["cases"] if c["arch"] == arch}
        assert got == DEFAULT_LAUNCHES, (arch, got ^ DEFAULT_LAUNCHES)
    for module, fn in kernels:
        tma = module.endswith(("_tma", "_gluon"))
        dtypes = ("fp32",) if module == "pacs_loss" else ("bf16",) if tma else ("bf16", "fp32")
        for arch in set(report["archs"]) - set(aot.DEFAULT_ONLY_ARCHS):
            if tma and arch < 90:  # TMA exists from sm_90 on; the launcher falls back
                continue
            if module.endswith("_gluon") and arch != 90:  # wgmma: Hopper only; the launcher falls back
                continue
            for dt in dtypes:
                assert (module, fn, arch, dt) in covered, f"{module}.{fn} sm_{arch} {dt} not compiled"
    assert set(report["archs"]) >= {80, 90}


def test_shared_memory_within_the_per_block_limit(report):
    over = [(c["label"], c["shared"], c["smem_limit"]) for c in report["cases"] if c["shared"] > c["smem_limit"]]
    assert not over, _fail(over, "shared memory over the limit (label, bytes, limit)")


def test_no_register_spills(report):
    bad = []
    for c in report["cases"]:
        spilled = c["stack"] > 0 or c["spill_insts"] > 0 or c["local"] > 0
        allowed = _spill_allowance(report, c)
        if spilled and (allowed is None or c["stack"] > allowed[0]):
            bad.append((c["label"], f"regs {c['regs']} stack {c['stack']} B, {c['spill_insts']} STL/LDL"))
    assert not bad, _fail(bad, "register spills (add a measured exception to SPILL_EXCEPTIONS only with a reason)")


TENSOR_CORE = {80: "mma.sync.aligned", 86: "mma.sync.aligned", 89: "mma.sync.aligned", 90: "wgmma.mma_async",
               100: "tcgen05.mma", 120: "mma.sync.aligned"}


def test_bf16_dot_lowers_to_tensor_cores(report):
    bad = []
    for c in report["cases"]:
        if c["has_dot"] and c["dtype"] == "bf16":
            want = TENSOR_CORE[c["arch"]]
            ok = any(m.startswith(want) for m in c["mma"])
            if c["arch"] != 100:  # the PTX instruction names the operand type
                ok = ok and any(m.startswith(want) and "bf16" in m for m in c["mma"])
            if not ok:
                bad.append((c["label"], c["mma"]))
        elif not c["has_dot"] and c["mma"]:
            bad.append((c["label"], "tensor-core instruction in a kernel without tl.dot", c["mma"]))
    assert not bad, _fail(bad, "tensor-core lowering")


def test_fp32_dot_is_ieee_as_documented(report):
    """kernels/linear_logprobs.py: fp32 inputs use IEEE fp32 products (input_precision="ieee"), not
    TF32: no tensor-core instruction and no tf32 operand in the PTX."""
    bad = [(c["label"], c["mma"], c["tf32"]) for c in report["cases"]
           if c["has_dot"] and c["dtype"] == "fp32" and (c["mma"] or c["tf32"])]
    assert not bad, _fail(bad, "fp32 tl.dot not IEEE")
    src = open(os.path.join(ROOT, "kernels", "linear_logprobs.py")).read()
    assert "IEEE fp32 products" in src
    assert {c["fn"] for c in report["cases"] if c["has_dot"] and c["dtype"] == "fp32"} >= {"_stats_tiles_kernel"}


def test_row_offsets_are_64_bit(report):
    """Every row stride / row length that multiplies a row index enters only 64-bit products
    (N * V = 1.2e9 at N = 8192 and 2.5e9 at N = 16384 > 2^31)."""
    bad = []
    for c in report["cases"]:
        for param, use in c["offsets"].items():
            if use["narrow"] or use["wide"] == 0:
                bad.append((c["label"], param, use))
    assert not bad, _fail(bad, "32-bit row offsets")


def test_offset_check_flags_a_32_bit_row_offset(report):
    """Control: the checker flags ``row * stride`` in int32 and passes the int64 version."""
    probe = report["probe"]
    assert probe["narrow"]["narrow"], probe["narrow"]
    assert not probe["wide"]["narrow"] and probe["wide"]["wide"] > 0, probe["wide"]


def test_pacs_padded_streams_are_vectorised(report):
    """The PACS streaming kernels read padded [B, T] tiles with 16-byte loads (``ld.global.v4``);
    a scalar load of a tile (32 per thread of 8-bit mask / 16-bit bf16 / 32-bit values) would
    multiply the load instructions per byte. Allowed scalar loads: the backward's coef[row] and
    grad (2); its dlogp stores are 16-byte. Packed rows start anywhere, so their loads are scalar
    (not checked). The check is ``aot.pacs_access_problems`` (bench/gpu/tune_pacs.py filters its
    candidates with it)."""
    from pacs_fast.kernels import aot
    bad = [(c["label"], c["shapes"], aot.pacs_access_problems(c)) for c in report["cases"]
           if aot.pacs_access_problems(c)]
    padded = [c for c in report["cases"] if c["module"] == "pacs_loss" and c["variant"].startswith("padded")]
    assert len(padded) >= 4, "no padded PACS streaming case was checked"
    assert not bad, _fail(bad, "scalar global accesses in the PACS streaming kernels")


# ---- the launchers use launch_config (run in this process, under the interpreter) -------------

class _Recorder:
    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(dict(kwargs, grid=tuple(grid)))
        return launch


@pytest.mark.parametrize("arch", [None, 80, 90, 100])
def test_launchers_pass_launch_config(monkeypatch, arch):
    import torch

    from pacs_fast.kernels import linear_logprobs as KL, linear_logprobs_fwd as KLF, pacs_loss as KP, \
        pacs_loss_launch as KPL, token_logprobs as KT
    from pacs_fast.kernels import linear_logprobs_bwd as KLB, linear_logprobs_gluon as KLG, linear_logprobs_tma as KLT
    from pacs_fast.kernels import linear_logprobs_launch as KLL
    calls = []
    for mod, names in ((KT, ("_stats_fwd_kernel", "_grad_bwd_kernel")),
                       (KL, ("_stats_fwd_kernel", "_grad_bwd_kernel", "_dlogits_kernel")),
                       (KLF, ("_stats_tiles_kernel",)), (KLT, ("_stats_tma_kernel", "_dlogits_tma_kernel")),
                       (KLG, ("_stats_gluon_kernel", "_dlogits_gluon_kernel")),
                       (KP, ("_pacs_sums_kernel", "_pacs_group_kernel", "_pacs_bwd_kernel", "_pacs_one_pass_kernel"))):
        for name in names:
            monkeypatch.setattr(mod, name, _Recorder(calls))
    monkeypatch.setattr(KT, "device_arch", lambda d: arch)
    monkeypatch.setattr(KL, "device_arch", lambda d: arch)  # the dispatcher's kernel choice
    monkeypatch.setattr(KLL, "device_arch", lambda d: arch)  # every launcher's launch_config (_cfg)
    monkeypatch.setattr(KP, "_arch", lambda d: arch)

    def check(cfg, keys):
        got = calls.pop()
        for k in keys:
            assert got[k] == cfg[k], (k, got[k], cfg[k])
        return got

    n, h, v = 40, 24, 300
    x = torch.randn(n, v)
    one = torch.zeros(n)
    KT.stats_fwd(x, 1.0, True)
    check(KT.launch_config("stats_fwd", N=n, V=v, dtype=x.dtype, arch=arch), ("BLOCK_V", "num_warps", "num_stages"))
    KT.grad_bwd(x, x.clone(), 1.0, torch.zeros(n, dtype=torch.long), 0, -100, one, one, one, one, one)
    check(KT.launch_config("grad_bwd", N=n, V=v, dtype=x.dtype, arch=arch), ("BLOCK_V", "num_warps", "num_stages"))
    hid, w = torch.randn(n, h), torch.randn(v, h)
    keys = ("BLOCK_N", "BLOCK_V", "BLOCK_H", "num_warps", "num_stages")
    KL.stats_fwd(hid, w, None, 1.0, True)  # the default forward: the tiled kernel
    check(KL.launch_config("stats_tiles", N=n, V=v, H=h, dtype=hid.dtype, arch=arch),
          keys + ("GROUP_N", "V_TILES"))
    monkeypatch.setitem(KL.CONFIG, "FWD", "split")
    KL.stats_fwd(hid, w, None, 1.0, True)
    check(KL.launch_config("stats_fwd", N=n, V=v, H=h, dtype=hid.dtype, arch=arch), keys)
    monkeypatch.setitem(KL.CONFIG, "FWD", "tma")  # bf16 rows of 48 B: a TMA descriptor takes them (sm_90+)
    KL.stats_fwd(hid.bfloat16(), w.bfloat16(), None, 1.0, True)
    if arch == 80:  # no TMA before sm_90: the tiled kernel (kernels/dispatch.py ``takes``)
        check(KL.launch_config("stats_tiles", N=n, V=v, H=h, dtype=torch.bfloat16, arch=arch), keys)
    else:
        check(KL.launch_config("stats_tma", N=n, V=v, H=h, dtype=torch.bfloat16, arch=arch),
              keys + ("GROUP_N", "FLATTEN", "WARP_SPECIALIZE"))
    monkeypatch.setitem(KL.CONFIG, "FWD", "gluon")  # Hopper only: elsewhere the tiled kernel runs
    monkeypatch.setattr(KLG, "device_arch", lambda d: arch)
    KL.stats_fwd(hid.bfloat16(), w.bfloat16(), None, 1.0, True)
    if arch == 90:
        cfg = KL.launch_config("stats_gluon", N=n, V=v, H=h, dtype=torch.bfloat16, arch=arch)
        got = check(cfg, ("GROUP_N", "num_warps"))
        tiles = triton.cdiv(n, cfg["BLOCK_N"]) * triton.cdiv(v, cfg["BLOCK_V"])  # 2 or 3 (BLOCK_V 256 / 128)
        assert got["STAGES"] == cfg["num_stages"] and got["grid"] == (min(4 * cfg["PERSISTENT"], tiles),)
    else:
        check(KL.launch_config("stats_tiles", N=n, V=v, H=h, dtype=torch.bfloat16, arch=arch), keys)
    monkeypatch.setitem(KL.CONFIG, "DLOGITS", "tma")
    KLB.grad_bwd_chunked(hid.bfloat16(), w.bfloat16(), None, 1.0, torch.zeros(n, dtype=torch.long), 0, one, one,
                        one, one, one)
    if arch == 80:
        check(KL.launch_config("dlogits", N=n, V=v, H=h, dtype=torch.bfloat16, arch=arch), keys)
    else:
        check(KL.launch_config("dlogits_tma", N=n, V=v, H=h, dtype=torch.bfloat16, arch=arch),
              keys + ("GROUP_N", "FLATTEN", "WARP_SPECIALIZE"))
    # Hopper only, like the Gluon forward, and per vocab chunk whose dz rows a TMA store can write:
    # [40, 256] (512-byte rows) yes, the last [40, 44] (88-byte rows) no: the pointer kernel
    monkeypatch.setitem(KL.CONFIG, "DLOGITS", "gluon")
    KLB.grad_bwd_chunked(hid.bfloat16(), w.bfloat16(), None, 1.0, torch.zeros(n, dtype=torch.long), 0, one, one,
                        one, one, one, chunk_bytes=(n, 256))
    pointer = KL.launch_config("dlogits", N=n, V=v, H=h, dtype=torch.bfloat16, arch=arch)
    check(pointer, keys)
    if arch == 90:
        cfg = KL.launch_config("dlogits_gluon", N=n, V=v, H=h, dtype=torch.bfloat16, arch=arch)
        got = check(cfg, ("GROUP_N", "num_warps"))
        assert got["STAGES"] == cfg["num_stages"]
    else:
        check(pointer, keys)
    monkeypatch.setitem(KL.CONFIG, "DLOGITS", "pointer")
    lab = torch.zeros(n, dtype=torch.long)
    KL.grad_bwd(hid, w, None, 1.0, lab, 0, one, one, one, one, one)
    check(KL.launch_config("grad_bwd", N=n, V=v, H=h, dtype=hid.dtype, arch=arch), keys + ("GROUP_N",))
    KLB.grad_bwd_chunked(hid, w, None, 1.0, lab, 0, one, one, one, one, one)
    check(KL.launch_config("dlogits", N=n, V=v, H=h, dtype=hid.dtype, arch=arch), keys + ("GROUP_N",))
    b, t, g = 16, 50, 8
    logp = torch.randn(b, t)
    fwd = dict(group_size=g, beta=1.0, score="rloo", weight_mode="question", proxy="logratio")
    KP.pacs_loss_fwd(logp, logp, None, torch.ones(b), None, **fwd)  # the one-pass forward at this shape
    cfg = KPL.launch_config("fwd_one", B=b, T=t, G=g, dtype=logp.dtype, arch=arch)
    assert cfg["ONE_PASS"] == 1
    assert check(cfg, ("BLOCK_G", "BLOCK_T", "num_warps", "num_stages"))["grid"] == (b // g,) and not calls
    monkeypatch.setitem(KPL.CONFIG, "ONE_PASS", 0)
    KP.pacs_loss_fwd(logp, logp, None, torch.ones(b), None, **fwd)  # pass A, then pass B
    got = check(KPL.launch_config("fwd", B=b, T=t, G=g, dtype=logp.dtype, arch=arch),
                ("BLOCK_G", "BLOCK_S", "num_warps", "num_stages"))
    assert got["grid"] == (b // g,)
    for name in ("fwd_sums", "bwd"):
        if name == "bwd":
            KP.pacs_loss_bwd(torch.ones(()), torch.ones(b), None, None, (b, t), logp.dtype)
        assert len(calls) == 1, calls  # pass A's launch, then the backward's
        cfg = KPL.launch_config(name, B=b, T=t, G=g if name == "fwd_sums" else 1, dtype=logp.dtype, arch=arch)
        got = check(cfg, ("ROWS", "BLOCK_T", "num_warps", "num_stages"))
        assert got["grid"] == (triton.cdiv(b, cfg["ROWS"]), cfg["N_SPLIT"]), (name, got["grid"], cfg)


def test_tma_kernels_load_by_tma(report):
    """The selectable TMA kernels (kernels/linear_logprobs_tma.py: the forward and the chunked
    backward's dz kernel) really issue TMA copies (``cp.async.bulk.tensor``) on sm_90 and sm_100;
    every other kernel loads through pointers."""
    names = ("_stats_tma_kernel", "_dlogits_tma_kernel")
    tma = [c for c in report["cases"] if c["fn"] in names + GLUON_KERNELS]
    assert {(c["fn"], c["arch"]) for c in tma} >= {(f, a) for f in names for a in (90, 100)} | {
        (f, 90) for f in GLUON_KERNELS}
    assert all(c["tma_loads"] >= 2 for c in tma), [(c["label"], c["tma_loads"]) for c in tma]
    assert not [c["label"] for c in report["cases"] if c not in tma and c.get("tma_loads")]


GLUON_KERNELS = ("_stats_gluon_kernel", "_dlogits_gluon_kernel")


def test_gluon_kernels_are_warp_specialised(report):
    """kernels/linear_logprobs_gluon.py (the forward and the dz kernel) really splits its warps by role
    on sm_90: the loader warp's warpgroup gives registers back (``setmaxnreg.dec``) and the wgmma warps
    take them (``setmaxnreg.inc`` above the launch budget), with no spill; no other kernel is
    warp-specialised (Triton's ``warp_specialize`` flag is a no-op on sm_90, and sm_100 kernels do not
    use it here). The dz kernel writes through a TMA store (a third bulk-tensor copy). Each kernel's
    ping-pong launch (``PINGPONG_CONFIGS``) is compiled too, with both consumer partitions raised."""
    gluon = [c for c in report["cases"] if c["fn"] in GLUON_KERNELS]
    assert {c["fn"] for c in gluon} == set(GLUON_KERNELS) and all(c["arch"] == 90 for c in gluon)
    assert all(c["tma_loads"] >= 3 for c in gluon if c["fn"] == "_dlogits_gluon_kernel")
    for c in gluon:
        incs = [int(x.split()[1]) for x in c["setmaxnreg"] if x.startswith("inc")]
        decs = [int(x.split()[1]) for x in c["setmaxnreg"] if x.startswith("dec")]
        assert decs and min(decs) <= 40 and max(incs, default=0) > c["regs"], (c["label"], c["setmaxnreg"], c["regs"])
        assert any(m.startswith("wgmma.mma_async") for m in c["mma"]), c["mma"]
        # ping-pong: two consumer partitions, each raised above the launch budget (one in the cooperative launch)
        raised = len({n for n in incs if n > c["regs"]})
        assert raised == (2 if c["constexprs"]["PINGPONG"] == "True" else 1), (c["label"], c["setmaxnreg"])
    assert {c["fn"] for c in gluon if c["constexprs"]["PINGPONG"] == "True"} == set(GLUON_KERNELS)
    assert not [c["label"] for c in report["cases"] if c["fn"] not in GLUON_KERNELS and c["setmaxnreg"]]


def test_softmax_epilogues_use_exp2_without_denormal_guards(report):
    """The log-prob kernels' epilogues work in base 2 (kernels/base2.py): every ``exp`` is one
    ``MUFU.EX2`` with no denormal guard (the ``FSETP.GEU ... -126`` compare and two multiplies that
    ``tl.exp`` adds), about one per logit, and few FP32 instructions around it. Counted in the SASS:
    with ``tl.exp`` the bf16 tiles took 13-18 FP32 instructions per ex2 on sm_80 / sm_90 and one
    guard per logit; in base 2 they take 4-9 (the max, ``(y - my) c``, the sum, the entropy's clamp and
    FMA, the dz epilogue's FMAs, plus per-row work and the cross-thread reductions).
    fp32 rows are excluded from the budget: their dot is itself FFMA."""
    rows = [c for c in report["cases"] if "alu_per_logit" in c and not c.get("error")]
    assert {c["fn"] for c in rows} >= {"_stats_tiles_kernel", "_dlogits_kernel", "_stats_gluon_kernel",
                                       "_dlogits_gluon_kernel", "_stats_tma_kernel", "_stats_fwd_kernel"}
    assert not [(c["label"], c["ex2_guards"]) for c in rows if c["ex2_guards"]]
    # Gemma 2's soft-capped launches: the cap is one more ex2 per logit (tanh from exp(-2|y|/c)), a division and a
    # few multiplies (the backward's slope too): 2.0-2.12 ex2 and 14.7-21.6 FP32 instructions per logit on sm_80 /
    # sm_90 / sm_100 (2026-12-03, Triton 3.9); budget 2.3 and 24, still no denormal guard. Triton 3.6 (the GPU image's)
    # pipelines sm_100's capped dz loop into one more copy: 2.41 ex2 per logit (77 MUFU.EX2 for 64), budget 2.5 there
    older = tuple(int(x) for x in report["triton"].split(".")[:2]) < (3, 9)
    capped = [c for c in rows if "softcap" in c["variant"] and c["dtype"] != "fp32"]
    assert len(capped) >= 3 and not [(c["label"], c["alu_per_logit"], c["ex2_per_logit"]) for c in capped
                                     if not (1.9 <= c["ex2_per_logit"] <= (2.5 if older and c["arch"] >= 100 else 2.3)
                                             and c["alu_per_logit"] <= 24)]
    tc = [c for c in rows if c["dtype"] != "fp32" and "softcap" not in c["variant"]]
    heavy = [(c["label"], c["alu_per_logit"], c["ex2_per_logit"]) for c in tc
             if c["ex2"] == 0 or sum(c["fp32_alu"].values()) / c["ex2"] > 10]
    assert not heavy, _fail(heavy, "more than 10 FP32 instructions per ex2")
    # one ex2 per logit where the epilogue is one straight-line copy per tile (sm_100's TMA loops are
    # software-pipelined into several copies)
    many = [(c["label"], c["ex2_per_logit"]) for c in tc if c["arch"] < 100 and not 1 <= c["ex2_per_logit"] <= 1.3]
    assert not many, _fail(many, "not about one ex2 per logit")


def test_dispatch_shared_memory_estimate_bounds_the_compiled_launches(report):
    """kernels/dispatch.py checks a TMA / Gluon launch's shared memory against the device's before it
    selects the kernel, from its tiles (``smem_bytes``: the stage ring, the dz staging tiles, 2 KB of slack).
    Against the compiled launches (the measured table's too): never below what the compiler allocated,
    within 2 KB of it on sm_90 (sm_100's TMA dz kernel needs no layout-conversion buffer: an over-estimate
    there), and within every arch's limit, so the check never turns away a compiled launch."""
    from pacs_fast.kernels import dispatch
    rows = [c for c in report["cases"] if c["fn"] in ("_stats_tma_kernel", "_dlogits_tma_kernel") + GLUON_KERNELS]
    assert len(rows) >= 8
    for c in rows:
        k = c["constexprs"]
        if c["fn"] in GLUON_KERNELS:
            (bn, bh), (bv, _) = c["blocks"]["Hdesc"], c["blocks"]["Wdesc"]
        else:
            bn, bv, bh = (int(k[x]) for x in ("BLOCK_N", "BLOCK_V", "BLOCK_H"))
        cfg = dict(BLOCK_N=bn, BLOCK_V=bv, BLOCK_H=bh, num_stages=c["num_stages"], PINGPONG=k.get("PINGPONG") == "True")
        est = dispatch.smem_bytes(c["kernel"], cfg, 2)
        assert c["shared"] <= est <= c["smem_limit"], (c["label"], c["shared"], est)
        assert c["arch"] != 90 or est - c["shared"] <= 2048, (c["label"], c["shared"], est)


def test_the_compile_table_in_the_gpu_doc_is_this_trees(report):
    """docs/GPU.md's compile table is generated (``python bench/gpu/compile_report.py --update-doc docs/GPU.md``),
    never typed by hand, yet it had drifted from the kernels (the registers of 11 PACS group-kernel rows, found
    2026-11-30): the table of this run's compile must be the doc's."""
    import difflib
    import importlib.util

    spec = importlib.util.spec_from_file_location("compile_report", os.path.join(ROOT, "bench", "gpu", "compile_report.py"))
    cr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cr)
    doc = open(os.path.join(ROOT, "docs", "GPU.md")).read()
    written = doc[doc.index(cr.START) + len(cr.START):doc.index(cr.END)].strip()
    now = cr.table(report).strip()
    diff = "\n".join(difflib.unified_diff(written.splitlines(), now.splitlines(), "docs/GPU.md", "this tree", n=0,
                                          lineterm=""))
    assert written == now, ("refresh it: python bench/gpu/compile_report.py --update-doc docs/GPU.md\n" + diff[:3000])
