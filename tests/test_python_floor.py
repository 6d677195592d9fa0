"""setup.py declares python_requires=">=3.10" while CI runs 3.11: nothing in the package may need 3.11+.

Found on 2026-12-03: ``\\s++`` (a possessive quantifier, new in Python 3.11) in pacs_fast/reward/verifier.py made
``import pacs_fast.reward`` (so the trainer, eval, data) raise ``re.error: multiple repeat`` on 3.10. These tests
check the sources statically under CI's own interpreter (each one fails on that code), and, where a 3.10
interpreter is installed, import the package there.
"""
import ast
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([*ROOT.joinpath("pacs_fast").rglob("*.py"), *ROOT.joinpath("kernels").rglob("*.py")])
RE_FUNCTIONS = {"compile", "search", "match", "fullmatch", "sub", "subn", "findall", "finditer", "split"}

try:  # Python 3.11 renamed sre_parse / sre_constants (deprecated aliases remain)
    from re import _constants as _re_constants
    from re import _parser as _re_parser
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as _re_constants
    import sre_parse as _re_parser

# Opcodes that exist only from Python 3.11 on: ``a++`` / ``a*+`` / ``a?+`` / ``a{m,n}+`` and ``(?>...)``.
NEW_IN_311 = {getattr(_re_constants, name) for name in ("POSSESSIVE_REPEAT", "ATOMIC_GROUP")
              if hasattr(_re_constants, name)}


def _literal_patterns():
    """(file:line, pattern, flags) of every ``re.<function>("literal", ...)`` call in pacs_fast/ and kernels/."""
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                    and node.func.attr in RE_FUNCTIONS and node.args):
                continue
            pattern = node.args[0]
            if isinstance(pattern, ast.Constant) and isinstance(pattern.value, str):
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", pattern.value))
    return found


def _opcodes(parsed):
    for op, arg in parsed:
        yield op
        for value in (arg if isinstance(arg, (tuple, list)) else (arg,)):
            if isinstance(value, _re_parser.SubPattern):
                yield from _opcodes(value)
            elif isinstance(value, (tuple, list)):
                for item in value:
                    if isinstance(item, _re_parser.SubPattern):
                        yield from _opcodes(item)


def test_the_scan_sees_the_packages_regexes():
    """Guards the next test against passing on an empty scan (a moved folder, a renamed call)."""
    where = [w for w, _ in _literal_patterns()]
    assert len(where) >= 30, where
    assert any(w.startswith("pacs_fast/reward/verifier.py") for w in where), where


@pytest.mark.skipif(not NEW_IN_311, reason="this interpreter's re parser has no 3.11-only opcodes to look for")
def test_no_regex_needs_python_311():
    """No literal pattern uses a possessive quantifier or an atomic group (re.error on 3.10). Emulate one with a
    lookahead and a backreference, ``(?=(\\s+))\\1``, as pacs_fast/reward/verifier.py does."""
    bad = []
    for where, pattern in _literal_patterns():
        ops = set(_opcodes(_re_parser.parse(pattern)))
        if ops & NEW_IN_311:
            bad.append(f"{where}: {pattern!r}")
    assert not bad, "needs Python 3.11: " + "; ".join(bad)


def test_every_module_parses_as_python_310():
    """No 3.11+ syntax (``except*``, PEP 646 star-unpacking in subscripts...) in a package that declares 3.10."""
    bad = []
    for path in SOURCES:
        try:
            ast.parse(path.read_text(encoding="utf-8"), feature_version=(3, 10))
        except SyntaxError as exc:
            bad.append(f"{path.relative_to(ROOT)}:{exc.lineno}: {exc.msg}")
    assert not bad, bad


def _python310():
    """A working 3.10 interpreter, or None (a pyenv shim named python3.10 may exist and fail: run it)."""
    for candidate in (os.path.expanduser("~/.pyenv/versions/3.10.13/bin/python"), shutil.which("python3.10")):
        if candidate and os.access(candidate, os.X_OK):
            probe = subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 10)"],
                                   capture_output=True, timeout=30)
            if probe.returncode == 0:
                return candidate
    return None


PYTHON310 = _python310()


@pytest.mark.skipif(PYTHON310 is None, reason="no Python 3.10 interpreter on this machine (python3.10 or pyenv)")
def test_every_literal_regex_compiles_on_python_310():
    """The real check where a 3.10 interpreter exists: compile each literal pattern there (it needs no torch)."""
    patterns = [p for _, p in _literal_patterns()]
    code = ("import json, re, sys\npatterns = json.load(sys.stdin)\n"
            "for p in patterns:\n    re.compile(p)\nprint(len(patterns))")
    run = subprocess.run([PYTHON310, "-c", code], input=json.dumps(patterns), capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and run.stdout.split() == [str(len(patterns))], run.stderr[-2000:]

