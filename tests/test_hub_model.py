"""``model.path`` as a Hugging Face Hub id (``pacs_fast/config/model_files.hub_model_folder``): its snapshot
folder is what the run loads and records (the revision in its path); offline (``HF_HUB_OFFLINE=1``) it comes from
the cache, and an id that is not there is one line before anything loads. Before 2026-11-29 every hub id was
"model.path ... does not exist". A hand-made hub cache stands in for the hub (CI has no network)."""
import os
import subprocess
import sys

import pytest

from pacs_fast.config.model_files import hub_model_folder
from pacs_fast.data.tiny import make_tiny_model

from test_train import TINY

REVISION = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root):
    """The layout huggingface_hub's cache has after a download of ``acme/tiny-math`` at :data:`REVISION`."""
    repo = root / "models--acme--tiny-math"
    make_tiny_model(repo / "snapshots" / REVISION, seed=3)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return repo / "snapshots" / REVISION


@pytest.mark.parametrize("name", ["", "tiny", "./acme/tiny", "~/acme/tiny", "/acme/tiny", "acme/tiny/extra",
                                  "acme/tiny math"])
def test_only_org_slash_name_is_taken_for_a_hub_id(name):
    assert hub_model_folder(name) is None


def test_a_cached_hub_id_trains_offline_and_an_uncached_one_is_one_line(tmp_path):
    snapshot = _hub_cache(tmp_path / "hub")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "pacs_fast.train", *TINY, f"train.out_dir={tmp_path / 'runs'}", "train.steps=1",
            "train.eval_every=0", "train.run_name=r"]
    proc = subprocess.run(args + ["model.path=acme/tiny-math"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recorded = (tmp_path / "runs" / "r" / "config.yaml").read_text()
    assert f"path: {snapshot}" in recorded  # the folder it loaded, its revision in the path: a resume takes the same
    assert (tmp_path / "runs" / "r" / "checkpoints").is_dir()

    proc = subprocess.run(args[:-1] + ["train.run_name=s", "model.path=acme/not-cached"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    assert proc.stderr == ("error: model.path 'acme/not-cached' is not a folder here, nor in the Hugging Face cache "
                           "(offline: HF_HUB_OFFLINE); give a model folder, or a hub id that is cached\n")
    assert not (tmp_path / "runs" / "s").exists()
