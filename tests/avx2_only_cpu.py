"""Runs this project's Python as an AVX2-only x86-64 CPU runs it, on any x86-64 machine.

QEMU's user-mode emulator (Debian's ``qemu-user``: ``qemu-x86_64``) with ``-cpu max`` runs the
interpreter on an emulated CPU whose CPUID has AVX2 and FMA but no AVX-512 and no AMX (QEMU's
software emulation implements neither), so torch's dispatcher, oneDNN and vLLM's CPU backend choose
the paths they choose on such a CPU (vLLM keeps bf16 linear weights for ``torch.nn.functional.linear``
instead of repacking them) - unlike ``ATEN_CPU_CAPABILITY`` / ``ONEDNN_MAX_CPU_ISA``, which cap two
libraries on a CPU that still reports AVX-512. It is 3-20x slower than the machine itself: for the
CPU-dependent tests, not the suite.

The emulated interpreter is a wrapper ``bin/python`` in a folder that looks like this interpreter's
virtual environment (its ``pyvenv.cfg`` and ``lib``), so that ``sys.executable`` names the wrapper and
every subprocess a test starts with ``sys.executable`` (torchrun ranks, vLLM workers) is emulated too.

    python tests/avx2_only_cpu.py -m pytest -q "tests/test_vllm_engine.py::test_bf16_engine_sync_on_this_cpu"
"""
import os
import platform
import shutil
import subprocess
import sys
import tempfile

#: the emulated CPU (QEMU's TCG ``max``: x86-64-v3, i.e. AVX2 / FMA / BMI2, no AVX-512, no AMX)
QEMU_CPU = "max"


def qemu() -> str | None:
    """The path of ``qemu-x86_64`` where it can emulate this machine's interpreter, else None."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    return shutil.which("qemu-x86_64") or shutil.which("qemu-x86_64-static")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """The instruction-set flags of this machine's first CPU (Linux's ``/proc/cpuinfo``; empty where unread)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return set(value.split())
    except OSError:
        pass
    return set()


def avx2_only_host(flags: set[str] | None = None) -> bool:
    """True on an x86-64 CPU with AVX2 and neither AVX-512 nor AMX (an AVX2-only EPYC): there the suite's own run
    of a CPU-dependent test is the AVX2-only path, which the emulation would only repeat, 3-20x slower."""
    flags = cpu_flags() if flags is None else flags
    return "avx2" in flags and "avx512f" not in flags and "amx_tile" not in flags


def emulated_python(folder: str) -> str:
    """Writes the wrapper interpreter into ``folder`` and returns its path (``folder/bin/python``)."""
    emulator = qemu()
    if emulator is None:
        raise RuntimeError("no qemu-x86_64 on this x86-64 machine: install Debian's qemu-user")
    real = os.path.realpath(sys.executable)
    os.makedirs(os.path.join(folder, "bin"), exist_ok=True)
    venv = sys.prefix != sys.base_prefix
    cfg = os.path.join(sys.prefix, "pyvenv.cfg")
    with open(os.path.join(folder, "pyvenv.cfg"), "w") as f:
        if venv and os.path.exists(cfg):
            f.write(open(cfg).read())
        else:  # a plain interpreter: its own site-packages through the base installation
            f.write(f"home = {os.path.dirname(real)}\ninclude-system-site-packages = true\n")
    if venv:
        for name in ("lib", "lib64"):
            src, dst = os.path.join(sys.prefix, name), os.path.join(folder, name)
            if os.path.exists(src) and not os.path.lexists(dst):
                os.symlink(src, dst)
    wrapper = os.path.join(folder, "bin", "python")
    tmp = wrapper + ".tmp"
    with open(tmp, "w") as f:
        f.write(f'#!/bin/sh\nexec "{emulator}" -cpu {QEMU_CPU} -0 "{wrapper}" "{real}" "$@"\n')
    os.chmod(tmp, 0o755)
    os.replace(tmp, wrapper)
    return wrapper


def main(argv: list[str]) -> int:
    if qemu() is None:
        print("avx2_only_cpu: needs qemu-x86_64 (Debian's qemu-user) on an x86-64 machine", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="avx2_only_cpu_")
    try:
        python = emulated_python(folder)
        return subprocess.call([python, *argv])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
