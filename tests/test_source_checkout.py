"""A source checkout works without installing: ``pacs_fast.kernels`` (the top-level ``kernels/``
folder, which setup.py installs under that name) is found from the checkout alone. Seen needed on
a GPU machine with its own PyTorch and no network (the GPU suite there ran from the checkout)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# drop any finder an (editable) install added, then import from the checkout only
PROBE = """
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in getattr(f, "__name__", type(f).__name__).lower()]
sys.path.insert(0, {root!r})
import pacs_fast.kernels.aot, pacs_fast.ops.pacs_loss, pacs_fast.ops.linear_logprobs
import pacs_fast
print(pacs_fast.__file__)
print(pacs_fast.kernels.__file__)
print(pacs_fast.kernels.aot.__file__)
"""


def test_kernels_import_from_a_checkout_that_is_not_installed(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT))], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    package, kernels, aot = out.stdout.split()
    assert Path(package) == ROOT / "pacs_fast" / "__init__.py"
    assert Path(kernels) == ROOT / "kernels" / "__init__.py" and Path(aot) == ROOT / "kernels" / "aot.py"


def test_a_second_checkout_on_the_path_imports_its_own_kernels(tmp_path):
    """With this tree installed editable, a second checkout (a worktree) run with PYTHONPATH=<it> imported
    its own pacs_fast but this tree's kernels, silently (kernel dispatch sweep): a developer testing a kernel
    change ran the other tree's kernels."""
    import shutil

    copy = tmp_path / "copy"
    for part in ("pacs_fast", "kernels"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "setup.py", copy / "setup.py")
    probe = "import pacs_fast.kernels.dispatch as d, pacs_fast; print(pacs_fast.__file__); print(d.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(copy)})
    assert out.returncode == 0, out.stderr[-2000:]
    package, dispatch = out.stdout.split()
    assert Path(package) == copy / "pacs_fast" / "__init__.py" and Path(dispatch) == copy / "kernels" / "dispatch.py"
