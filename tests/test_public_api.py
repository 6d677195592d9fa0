"""The public API resolves, and the layers import only downwards."""
import ast
from pathlib import Path

import pytest

import pacs_fast

ROOT = Path(__file__).resolve().parents[1]
# layer -> packages of pacs_fast it must not import (DESIGN.md section 2)
FORBIDDEN = {
    "kernels": ("pacs_fast",),
    "pacs_fast/ops": ("pacs_fast.algorithms", "pacs_fast.reward", "pacs_fast.data", "pacs_fast.rollout",
                      "pacs_fast.learner", "pacs_fast.trainer", "pacs_fast.train", "pacs_fast.eval"),
    "pacs_fast/algorithms": ("pacs_fast.reward", "pacs_fast.data", "pacs_fast.rollout", "pacs_fast.learner",
                             "pacs_fast.trainer", "pacs_fast.train", "pacs_fast.eval"),
    "pacs_fast/reward": ("pacs_fast.rollout", "pacs_fast.learner", "pacs_fast.trainer", "pacs_fast.train",
                         "pacs_fast.eval"),
    "pacs_fast/rollout": ("pacs_fast.learner", "pacs_fast.trainer", "pacs_fast.train", "pacs_fast.eval"),
    "pacs_fast/learner": ("pacs_fast.rollout", "pacs_fast.trainer", "pacs_fast.train", "pacs_fast.eval"),
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
