"""One ``torchrun --nproc_per_node 2`` for every megatron worker a test session needs (issue 41).

Four test files check megatron-core on two gloo ranks, each through a worker script that reads the
``inputs.pt`` of a work folder and writes ``results.pt`` there. A launch costs ~14 s of CPU before any
work (two ranks importing torch, transformers and megatron-core, plus torchrun itself), so four launches
cost ~40 s more CPU per CI run than one.

The first of those files to need its results (:func:`megatron_folder`) prepares the folders of every
such file whose selected tests need them (each file's ``prepare_megatron_inputs(folder)``), runs their
workers one after another in one launch (``tests/megatron_launch_worker.py``), and marks the launch done;
under pytest-xdist a file lock beside the workers' temporary folders makes the other worker wait for it
and read the same folders instead of launching again. A failed launch fails every file's tests with the
launch's output (the worker that failed is named in it).
"""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import traceback
from pathlib import Path

import pytest

from forked_torchrun import MEGATRON, launch_env, torchrun_command

# test file -> (its worker module: tests/<module>.py with run(folder); the file's fixture that reads the results)
WORKERS = {
    "test_megatron_thd.py": ("megatron_thd_worker", "run"),
    "test_megatron_tp.py": ("megatron_worker", "run"),
    "test_megatron_packing.py": ("megatron_packing_worker", "run"),
    "test_fp32_lm_head.py": ("fp32_head_megatron_worker", "megatron_tp2"),
}
LAUNCHER = Path(__file__).with_name("megatron_launch_worker.py")


def _launch(files: list[str], base: Path) -> dict:
    """Prepares each file's folder under ``base`` and runs all their workers in one launch."""
    pairs = []
    for name in files:
        folder = base / name[:-3]
        folder.mkdir(parents=True)
        importlib.import_module(name[:-3]).prepare_megatron_inputs(folder)
        pairs.append(f"{WORKERS[name][0]}={folder}")
    env = launch_env()
    cmd = torchrun_command(2, str(LAUNCHER), *pairs, preload=MEGATRON)  # ranks forked, megatron-core preloaded
    # own session: on a timeout the launcher and its workers are killed together
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=400)  # under pytest.ini's 600 s per test
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        return {"ok": False, "log": f"timed out after 400 s\n{err[-6000:]}"}
    return {"ok": proc.returncode == 0, "log": f"rc={proc.returncode}\n{err[-6000:]}"}


def megatron_folder(request, tmp_path_factory, test_file: str) -> Path:
    """The work folder of ``test_file`` after the session's one megatron launch (run here if no
    process of this session ran it yet). Prints the folder's seed (replay: ``PACS_FAST_TEST_SEED``)."""
    from filelock import FileLock

    # the files whose selected tests read a worker's results (the others' workers are not run)
    files = sorted({item.path.name for item in request.session.items
                    if item.path.name in WORKERS and WORKERS[item.path.name][1] in item.fixturenames})
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # shared by the xdist workers of this session
    base, done = root / "megatron_launch", root / "megatron_launch.json"
    with FileLock(str(root / "megatron_launch.lock")):
        if not done.exists():
            try:
                state = _launch(files, base)
            except Exception:  # a preparation failed: every file's tests report it, no second try
                state = {"ok": False, "log": traceback.format_exc()}
            state["files"] = files
            done.write_text(json.dumps(state))
    state = json.loads(done.read_text())
    folder = base / test_file[:-3]
    if (folder / "seed.txt").is_file():
        print(f"seed={(folder / 'seed.txt').read_text()}")
    if not state["ok"]:
        pytest.fail(f"the megatron launch ({', '.join(state['files'])}) failed:\n{state['log']}")
    return folder
