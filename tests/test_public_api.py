"""The public API resolves, and the layers import only downwards."""
import ast
from pathlib import Path

import pytest

import pacs_fast

ROOT = Path(__file__).resolve().parents[1]
# layer -> packages of pacs_fast it must not import (DESIGN.md section 2)
CLIS = ("pacs_fast.train", "pacs_fast.eval", "pacs_fast.experiment", "pacs_fast.experiment_args",
        "pacs_fast.experiment_results", "pacs_fast.integrations")
FORBIDDEN = {
    "kernels": ("pacs_fast",),
    "pacs_fast/ops": ("pacs_fast.algorithms", "pacs_fast.reward", "pacs_fast.data", "pacs_fast.rollout",
                      "pacs_fast.learner", "pacs_fast.trainer", *CLIS),
    "pacs_fast/algorithms": ("pacs_fast.reward", "pacs_fast.data", "pacs_fast.rollout", "pacs_fast.learner",
                             "pacs_fast.trainer", *CLIS),
    "pacs_fast/reward": ("pacs_fast.rollout", "pacs_fast.learner", "pacs_fast.trainer", *CLIS),
    "pacs_fast/rollout": ("pacs_fast.learner", "pacs_fast.trainer", *CLIS),
    "pacs_fast/learner": ("pacs_fast.rollout", "pacs_fast.trainer", *CLIS),
    "pacs_fast/trainer": CLIS,
    # integrations sit beside the CLIs and import downwards only
    "pacs_fast/integrations": ("pacs_fast.train", "pacs_fast.eval", "pacs_fast.experiment"),
    # the run configuration is read by every layer, so it imports none of them
    "pacs_fast/config": tuple(f"pacs_fast.{p.stem}" for p in (ROOT / "pacs_fast").iterdir()
                              if p.stem not in ("config", "__init__", "__pycache__")
                              and (p.suffix == ".py" or (p / "__init__.py").is_file())),
}


@pytest.mark.parametrize("name", pacs_fast.__all__)
def test_public_name_resolves(name):
    assert getattr(pacs_fast, name) is not None


def test_unknown_name_raises_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        pacs_fast.no_such_thing  # noqa: B018


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_higher_ones(layer):
    offenders = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for module in _imports(path):
            if any(module == bad or module.startswith(bad + ".") for bad in FORBIDDEN[layer]):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not offenders, "\n".join(offenders)


def test_cpu_paths_work_without_triton():
    """A plain install (no triton extra) can use the torch backends; asking for triton says why not."""
    import subprocess
    import sys

    code = r'''
import builtins
real = builtins.__import__
def no_triton(name, *a, **k):
    if name == "triton" or name.startswith("triton."):
        raise ImportError("triton hidden by the test")
    return real(name, *a, **k)
builtins.__import__ = no_triton
import torch, pacs_fast
h = torch.randn(5, 8, requires_grad=True); w = torch.randn(11, 8, requires_grad=True)
pacs_fast.linear_logprobs(h, w, torch.randint(0, 11, (5,))).sum().backward()
pacs_fast.token_logprobs(torch.randn(5, 11), torch.randint(0, 11, (5,)))
x = torch.randn(4, 3, requires_grad=True)
pacs_fast.pacs_loss(x, torch.randn(4, 3), None, torch.tensor([1., 0, 1, 0]), group_size=2, backend="auto").backward()
try:
    pacs_fast.pacs_loss(x, torch.randn(4, 3), None, torch.tensor([1., 0, 1, 0]), group_size=2, backend="triton")
except ValueError as e:
    assert "triton" in str(e), e
else:
    raise AssertionError("backend='triton' without triton did not raise")
print("OK")
'''
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-2000:]
