"""The project's layering ("lower never imports higher", kernels/ at the bottom), read from the source.

Every module under ``pacs_fast/`` and ``kernels/`` (installed as ``pacs_fast.kernels``, setup.py's
``package_dir``) is parsed with ``ast``; each ``import`` / ``from ... import`` anywhere in it -- at the top,
inside functions (lazy imports), relative (``from . import x``, ``from ..ops import y``) or absolute
(``from pacs_fast.kernels import x``) -- becomes an edge to the module it loads: ``from P import n`` goes to
the submodule ``P.n`` when there is one, else to ``P`` itself. Imports under ``if TYPE_CHECKING:`` do not run
and are left out. Parent packages that Python initialises on the way are not edges (they would make every
package whose ``__init__`` imports its submodules a cycle).

Asserted: the graph has no cycle (the failure prints each one found), and ``pacs_fast.kernels``
imports nothing from the rest of ``pacs_fast`` (it is the bottom layer: Triton and torch only).
No module is imported; nothing here needs torch.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# source folder -> the package name it is installed as
PACKAGES = {"pacs_fast": "pacs_fast", "kernels": "pacs_fast.kernels"}
KERNELS = "pacs_fast.kernels"


def _module_files() -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``)."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            out[".".join([package, *parts])] = (path, is_pkg)
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) blocks."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
            if name == "TYPE_CHECKING":
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imported_names(source: str, module: str, is_pkg: bool) -> list[tuple[str, int]]:
    """Absolute names each import statement of ``source`` (module ``module``) loads, with its line:
    ``import a.b`` -> ``a.b``; ``from P import n`` -> ``P.n`` (resolved later to ``P.n`` or ``P``)."""
    tree = ast.parse(source)
    skip = _type_checking_only(tree)
    package = module if is_pkg else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            out.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names)
    return out


def _resolve(name: str, modules) -> str | None:
    """The module of ``modules`` that importing ``name`` loads: the longest dotted prefix of it that is one."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        if ".".join(parts[:k]) in modules:
            return ".".join(parts[:k])
    return None


def import_graph(files=None) -> tuple[dict[str, set[str]], dict[str, list[tuple[str, int]]]]:
    """(module -> the project modules it imports, module -> every absolute name it imports, with lines)."""
    files = _module_files() if files is None else files
    graph, raw = {}, {}
    for module, (path, is_pkg) in files.items():
        names = imported_names(path.read_text(encoding="utf-8"), module, is_pkg)
        raw[module] = names
        targets = {_resolve(n, files) for n, _ in names}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph, raw


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None (iterative depth-first search)."""
    state = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, ()))))
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Cycles of ``graph`` until none is left, each found after cutting the first edge of the one before
    (every cycle's edges are then reported at least once)."""
    graph, out = {k: set(v) for k, v in graph.items()}, []
    while (cycle := find_cycle(graph)) is not None:
        out.append(cycle)
        graph[cycle[0]].discard(cycle[1])
    return out


def kernels_violations(raw: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Imports of a ``pacs_fast.kernels`` module that reach the rest of ``pacs_fast``."""
    return [f"{module} line {line}: {name}" for module, names in sorted(raw.items()) if module.startswith(KERNELS)
            for name, line in names
            if (name == "pacs_fast" or name.startswith("pacs_fast.")) and not
            (name == KERNELS or name.startswith(KERNELS + "."))]


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "d"}, "d": set(), "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert cycles({"a": {"b", "c"}, "b": {"a"}, "c": {"a"}}) == [["a", "b", "a"], ["a", "c", "a"]]


def test_imports_are_read_in_every_form(tmp_path):
    """Relative, absolute, ``from package import submodule`` and imports inside functions all count."""
    src = ("import os\nfrom . import LAUNCH_OPTIONS, tuning\nfrom .base2 import LOG2E\n"
           "from pacs_fast.kernels import token_logprobs as KT\nfrom ..ops import vocab_parallel\n"
           "def f():\n    from .linear_logprobs_gluon import stats_gluon\n    import pacs_fast.data.tiny\n"
           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pacs_fast.trainer import loop\n")
    (tmp_path / "m.py").write_text(src)
    files = dict(_module_files(), **{"pacs_fast.kernels.m": (tmp_path / "m.py", False)})
    graph, raw = import_graph(files)
    # a kernels module reaching the rest of pacs_fast is named, with the line (the TYPE_CHECKING one is not)
    assert kernels_violations({"pacs_fast.kernels.m": raw["pacs_fast.kernels.m"]}) == [
        "pacs_fast.kernels.m line 5: pacs_fast.ops.vocab_parallel", "pacs_fast.kernels.m line 8: pacs_fast.data.tiny"]
    assert graph["pacs_fast.kernels.m"] == {"pacs_fast.kernels", "pacs_fast.kernels.tuning", "pacs_fast.kernels.base2",
                                            "pacs_fast.kernels.token_logprobs", "pacs_fast.ops.vocab_parallel",
                                            "pacs_fast.kernels.linear_logprobs_gluon", "pacs_fast.data.tiny"}
    # in a package's __init__, ``from . import m`` is its own submodule; ``from . import NAME`` in a
    # submodule is the package: both directions make a cycle
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import m\n")
    (pkg / "m.py").write_text("def f():\n    from . import NAME\n")
    graph, _ = import_graph({"p": (pkg / "__init__.py", True), "p.m": (pkg / "m.py", False)})
    assert graph == {"p": {"p.m"}, "p.m": {"p"}} and find_cycle(graph) == ["p", "p.m", "p"]


def test_the_module_graph_has_no_cycle():
    graph, _ = import_graph()
    assert len(graph) > 50 and KERNELS + ".linear_logprobs" in graph  # the tree was found and read
    assert sum(map(len, graph.values())) > 100
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in found)


def test_kernels_import_nothing_from_the_rest_of_pacs_fast():
    _, raw = import_graph()
    bad = kernels_violations(raw)
    assert not bad, "kernels/ must import only triton / torch and itself:\n  " + "\n  ".join(bad)
