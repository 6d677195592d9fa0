"""pacs_fast as a user installs it (``pip install <sdist or wheel>``), not the editable checkout the rest of the
suite runs: what the sdist and the wheel built from it hold, the dependency range a plain ``pip install``
resolves, and code that found its files through the checkout. Builds offline (``--no-index``, no build
isolation: the running environment's setuptools), in a copy of the tree, so the checkout gets no build/ or
egg-info; ~5 s."""
import ast
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("setup.py", "README.md", "MANIFEST.in", "pacs_fast", "kernels", "tests")


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(sdist member names without the top folder, names in the wheel pip builds from that sdist)."""
    pytest.importorskip("setuptools")
    tmp = tmp_path_factory.mktemp("dist")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif (ROOT / name).is_file():
            shutil.copy(ROOT / name, src / name)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run = dict(capture_output=True, text=True, timeout=300, env=env)
    out = subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp / "dist")], cwd=src, **run)
    assert out.returncode == 0, out.stderr[-3000:]
    (sdist,) = (tmp / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as t:
        sdist_names = {m.name.split("/", 1)[1] for m in t.getmembers() if m.isfile() and "/" in m.name}
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          str(sdist), "-w", str(tmp / "wheel")], cwd=tmp, **run)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        wheel_names = set(z.namelist())
    return sdist_names, wheel_names


def test_the_wheel_built_from_the_sdist_holds_every_module_and_data_file(built):
    """Every file of pacs_fast/ (the shipped benchmarks and training sets included) and of kernels/ (installed
    as pacs_fast.kernels: package_dir; the measured launch tables kernels/tuned/*.json as package_data), and
    nothing else beside the dist-info: a new data folder or kernel file that setup.py does not list fails here."""
    _, wheel = built
    expected = {"pacs_fast/" + f for f in _files(ROOT / "pacs_fast")}
    expected |= {"pacs_fast/kernels/" + f for f in _files(ROOT / "kernels")}
    got = {n for n in wheel if ".dist-info/" not in n}
    assert not expected - got, f"missing from the wheel: {sorted(expected - got)}"
    assert not got - expected, f"in the wheel but not in pacs_fast/ or kernels/: {sorted(got - expected)}"
    assert any(n.startswith("pacs_fast/kernels/tuned/") and n.endswith(".json") for n in got)


def test_the_sdist_holds_no_partial_test_suite(built):
    """setuptools' defaults put tests/test_*.py into the sdist without tests/conftest.py and the helper modules
    and fixtures they import: a suite that cannot run from it (MANIFEST.in prunes tests/)."""
    sdist, _ = built
    assert (ROOT / "tests" / "conftest.py").is_file()  # the copy the sdist was built from had tests/
    assert not [n for n in sdist if n.startswith("tests/")]
    assert {"setup.py", "README.md", "pacs_fast/__init__.py", "kernels/__init__.py"} <= sdist


def _install_requires() -> dict[str, Requirement]:
    for node in ast.walk(ast.parse((ROOT / "setup.py").read_text())):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return {Requirement(r).name: Requirement(r) for r in ast.literal_eval(node.value)}
    raise AssertionError("setup.py has no install_requires")


def test_a_plain_install_cannot_resolve_an_untested_transformers():
    """With ``transformers>=4.56`` a fresh ``pip install pacs_fast`` resolved 5.24.0 (2026-12-03), a release
    CI never ran (the lock: 5.19) that deprecates the ``past_key_values`` argument the HF engine and the
    shared-prefix learner pass (removed in 5.40). The lock's own version must stay inside (test_lock.py)."""
    spec = _install_requires()["transformers"].specifier
    assert not spec.contains("5.24.0") and not spec.contains("5.40.0"), spec
    assert spec.contains("5.19.0") and spec.contains("4.57.6"), spec  # CI's, and a 2-step run of the built-in task


def test_no_code_reads_the_checkouts_sibling_shared_folder():
    """scripts/recipes_trial/make_model.py read ../shared/data beside the checkout (FileNotFoundError from any
    other copy or an installed package) and bench/bench_padded_vocab.py fell back to a synthetic corpus there,
    silently; both files ship in the package (pacs_fast.data.datasets.shipped_path)."""
    offenders = []
    for folder in ("pacs_fast", "kernels", "scripts", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if '"shared" / "data"' in text or "shared/data/" in text:
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_the_verl_adapter_names_what_is_missing_without_a_repository_path():
    """An installed pacs_fast has no docs/: the error pointed there for the packages verl's core_algos needs."""
    probe = ("import sys; sys.modules['verl'] = None\n"
             "try:\n    import pacs_fast.integrations.verl\n"
             "except ImportError as e:\n    print(e.__cause__); print(e)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    cause, message = out.stdout.strip().split("\n")
    assert message.startswith("pacs_fast.integrations.verl needs verl's core_algos"), message
    assert "docs/" not in message and cause in message and "ray" in message, message


OO_PROBE = """
import importlib.util, runpy, sys
for name in ("pacs_fast.train", "pacs_fast.eval", "pacs_fast.experiment", "pacs_fast.kernels.aot"):
    if name.endswith(".aot") and importlib.util.find_spec("triton") is None:
        continue
    sys.argv = [name, "--help"]
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        assert e.code in (0, None), (name, e.code)
"""


def test_the_command_line_entry_points_start_under_python_OO():
    """``python -OO`` (or PYTHONOPTIMIZE=2 in a deployment image) strips docstrings: the experiment runner
    and the AOT compiler built their --help description from ``__doc__`` and died with an AttributeError."""
    out = subprocess.run([sys.executable, "-OO", "-c", OO_PROBE], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("usage: ") >= 3, out.stdout[-2000:]


def test_a_parquet_dataset_without_pyarrow_is_a_setup_error(tmp_path, monkeypatch):
    """Installed without the parquet extra, ``python -m pacs_fast.train data.dataset=x.parquet`` ended in a
    traceback and exit 1 (the ImportError passed the trainer's setup errors, which take ValueErrors); eval's
    CLI already printed the one line. The trainer's ``load_problems`` now raises it as a ValueError."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.problems import load_problems

    (tmp_path / "d.parquet").write_bytes(b"PAR1")  # never read: the import fails first
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    cfg = load_config(None, [f"data.dataset={tmp_path / 'd.parquet'}"])
    with pytest.raises(ValueError, match=r"needs pyarrow: pip install 'pacs_fast\[parquet\]'"):
        load_problems(cfg)
