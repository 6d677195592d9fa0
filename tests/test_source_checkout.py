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
