"""Test-wide setup.

On a machine without CUDA the Triton kernels run under the Triton interpreter on CPU tensors;
the variable must be set before any ``@triton.jit`` function is defined, hence here, first.
"""
import contextlib
import importlib.util
import os

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if XDIST_WORKER:
    # `pytest -n 2` (the README's command): two workers share the cores, so each computes on one thread,
    # and OpenMP threads sleep soon after a parallel region (pacs_fast/openmp.py: spinning threads of two
    # processes slow each other 10-40x); set before torch loads libgomp, inherited by every subprocess
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GOMP_SPINCOUNT", "10000")
else:
    # plain `pytest` (one by one): one compute thread too. Tests that run a training and its `--resume` in this
    # process compare them bit for bit; a run on a CPU takes the cores other jobs leave it
    # (pacs_fast/openmp.py), which at 2 threads could be another count in the second run than in the first, so
    # they differed in rounding (the DeepSeek-V2 and LoRA sweeps' resume tests failed on 2 cores; a resume in a
    # process of its own, as users run it, was exact)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU; none on this machine")
# For files that only launch megatron in subprocesses: a find_spec check, not pytest.importorskip, so that
# collecting them (on every xdist worker) does not import megatron-core (~2.6 s of CPU each time).
requires_megatron = pytest.mark.skipif(importlib.util.find_spec("megatron") is None,
                                       reason="needs megatron-core")


def pytest_configure(config):
    # pytest-xdist orders its work units by their number of tests unless told not to; the order
    # pytest_collection_modifyitems gives them is the one wanted (every worker collects the same)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_terminal_summary(terminalreporter):
    # which kind of CPU this run was on (printed under -q too): the suite's time and vLLM's CPU path differ
    # between AVX-512 / AMX machines and AVX2-only ones (tests/avx2_only_cpu.py), so a CI log says which
    flags, model = set(), "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model == "unknown":
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    isa = [name for name in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if name in flags] or ["(no flags read)"]
    terminalreporter.write_line(f"cpu: {model}, {os.cpu_count()} cores, {' '.join(isa)}; "
                                f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none on this machine")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)
    if XDIST_WORKER:
        # the files with multi-process tests (the longest) first: with `--dist loadfile` the workers take
        # whole files in this order (pytest_configure), so the short ones fill in at the end instead of one
        # long file ending the run alone (every worker collects the same order, as xdist requires)
        heavy = {item.path for item in items if "distributed" in item.keywords}
        items.sort(key=lambda item: item.path not in heavy)


def draw_seed() -> int:
    """A fresh random seed, or ``$PACS_FAST_TEST_SEED`` when set (replaying a printed one). For the
    places the ``seed`` fixture cannot reach (module-scoped fixtures, GPU-check subprocesses):
    ``from conftest import draw_seed``; print what it returns."""
    given = os.environ.get("PACS_FAST_TEST_SEED")
    return int(given) if given else int.from_bytes(os.urandom(4), "little")


def copy_as_killed_in_checkpoint(run, dest, step: int):
    """A copy of the finished run folder ``run`` at ``dest``, as a SIGKILL while step ``step`` wrote its
    checkpoint leaves a run: that step's records written, its checkpoint folder not in place
    (``latest`` names step ``step - 1``), no summary. ``--resume dest`` must redo step ``step`` on."""
    import shutil

    shutil.copytree(run, dest)
    shutil.rmtree(dest / "checkpoints" / f"step_{step:06d}")
    (dest / "checkpoints" / "latest").write_text(f"step_{step - 1:06d}")
    (dest / "summary.json").unlink()
    return dest


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory):
    """One ``warmup.cache_dir`` for the whole test session, shared by the xdist workers: each distinct
    warmed-up tiny model is built once per CI run instead of once per test (2-4 s of CPU each). The
    trainer's cache is safe to share between processes (pacs_fast/trainer/warmup.py: a model is built
    under a temporary name and renamed into place). Tests of the warm-up or of its cache folder use a
    folder of their own."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the xdist workers of this session
    path = root / "warmup_cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def seed():
    """A fresh seed per test run (printed on failure) so random inputs differ between runs;
    ``PACS_FAST_TEST_SEED=<n>`` replays a printed one."""
    s = draw_seed()
    torch.manual_seed(s)
    print(f"seed={s}")
    return s


def _reopen_log_streams() -> None:
    """Log handlers set up inside a test that captured ``sys.stderr`` (``capsys``) keep that test's stream after it
    is closed: transformers' handler writes to the stream of its set-up and flushes with ``sys.stderr.flush`` bound
    then (transformers/utils/logging.py), so every later warning in the same worker printed a logging traceback ("I/O
    operation on closed file") into what the next test captured (test_vllm_architectures.py's gpt_neo case failed
    after test_config*.py and test_hf_engine.py in one process). A closed stream, or a flush bound to one, goes back
    to the current stream."""
    import logging
    import sys

    loggers = [logging.getLogger()] + [lg for lg in list(logging.Logger.manager.loggerDict.values())
                                       if isinstance(lg, logging.Logger)]
    for logger in loggers:
        for handler in logger.handlers:
            stream = getattr(handler, "stream", None)
            if stream is not None and getattr(stream, "closed", False):
                # (not setStream: it flushes the old stream, which raises once closed)
                handler.stream = sys.stdout if "stdout" in str(getattr(stream, "name", "")) else sys.stderr
            flush = vars(handler).get("flush")  # (an instance attribute: transformers' sys.stderr.flush)
            if getattr(getattr(flush, "__self__", None), "closed", False):
                del handler.flush  # StreamHandler.flush: its own stream's


@pytest.fixture(autouse=True)
def _log_streams_stay_open():
    _reopen_log_streams()
    yield
    _reopen_log_streams()


@pytest.fixture
def dynamo_on():
    """``torch.compile`` traces in this test: a vLLM engine built earlier in the same worker process (in-process on
    CPU) turned Dynamo off for the process (pacs_fast/rollout/vllm_setup.py ``set_cpu_env_defaults``), and a
    ``fullgraph=True`` test that followed one in its xdist worker failed with "Dynamo tracing is disabled". Undone
    after the test; Dynamo is not imported for a test that has not imported it."""
    import sys

    config = sys.modules.get("torch._dynamo.config")
    before = None if config is None else config.disable  # (a config module: monkeypatch cannot set its names)
    if config is not None:
        config.disable = False
    yield
    if config is not None:
        config.disable = before


@contextlib.contextmanager
def transformers_classes_restored(module_name: str):
    """The classes of transformers' module ``module_name`` as they were, after the block: vLLM's Transformers
    modeling backend (an in-process eval engine on OLMo 2, which vLLM 0.32 runs that way) decorates transformers' own
    decoder class in place (a base added, ``__init__`` replaced: it then asks for a vLLM config), so every later
    ``Olmo2Model`` of the xdist worker failed to build (tests/test_varlen_families.py, in CI)."""
    import importlib

    module = importlib.import_module(module_name)
    saved = {cls: (cls.__bases__, dict(vars(cls))) for cls in vars(module).values()
             if isinstance(cls, type) and cls.__module__ == module_name}
    try:
        yield
    finally:
        for cls, (bases, attrs) in saved.items():
            if cls.__bases__ != bases:
                cls.__bases__ = bases
            for key in [k for k in vars(cls) if k not in attrs]:
                delattr(cls, key)
            for key, value in attrs.items():
                if key not in ("__dict__", "__weakref__") and vars(cls).get(key) is not value:
                    setattr(cls, key, value)
