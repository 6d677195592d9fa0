"""``model.path`` as a Hugging Face Hub id (``pacs_fast/config/model_files.hub_model_folder``): its snapshot
folder is what the run loads and records (the revision in its path); offline (``HF_HUB_OFFLINE=1``) it comes from
the cache, and an id that is not there is one line before anything loads. Before 2026-11-29 every hub id was
"model.path ... does not exist". A hand-made hub cache stands in for the hub (CI has no network)."""
import os
import re
import subprocess
import sys

import pytest

from pacs_fast.config.model_files import hub_model_folder, hub_repo_of
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


def test_a_snapshot_folder_gives_back_its_hub_id_and_other_folders_none(tmp_path):
    """hub_repo_of inverts hub_model_folder's cache layout; any other folder (a plain model folder, a checkpoint,
    a cache folder that is not a snapshot, a repo name that is not org/name) is None (kept as the path)."""
    snapshot = _hub_cache(tmp_path / "hub")
    assert hub_repo_of(snapshot) == hub_repo_of(str(snapshot)) == ("acme/tiny-math", REVISION)
    for other in (None, "", tmp_path, snapshot.parent, snapshot.parent.parent, "/runs/r/checkpoints/step_000001",
                  f"/hub/datasets--acme--x/snapshots/{REVISION}", f"/hub/models--a--b--c/snapshots/{REVISION}",
                  f"/hub/models--tiny/snapshots/{REVISION}"):
        assert hub_repo_of(other) is None, other


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


def test_a_lora_run_from_a_hub_id_names_the_hub_model_as_its_adapters_base(tmp_path):
    """The run loads (and records) the cache's snapshot folder; its checkpoints' PEFT adapter named that folder as
    its base before 2026-12-03, a path of this machine's cache: ``AutoPeftModelForCausalLM`` (and an adapter pushed
    to the hub) could not find the base elsewhere. Now the hub id and its commit: loaded through them (offline, from
    the hand-made cache), the adapter gives the checkpoint's merged model's logits to fp32 rounding (1e-5: two
    orders of matmuls on a tiny model whose logits are O(1); the adapters moved them by more, checked)."""
    import json

    snapshot = _hub_cache(tmp_path / "hub")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "pacs_fast.train", *TINY, f"train.out_dir={tmp_path / 'runs'}", "train.steps=1",
            "train.eval_every=0", "train.run_name=r", "model.path=acme/tiny-math", "model.lora_rank=4",
            "reward.noise_fp=0.5"]  # (wrong answers rewarded at random: the random model gets some reward to learn)
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = tmp_path / "runs" / "r" / "checkpoints" / "step_000001"
    adapter = json.loads((ckpt / "adapter" / "adapter_config.json").read_text())
    assert (adapter["base_model_name_or_path"], adapter["revision"]) == ("acme/tiny-math", REVISION), adapter
    check = f"""
import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoModelForCausalLM
ids = torch.tensor([[1, 5, 9, 3, 7, 2]])
with torch.no_grad():
    peft = AutoPeftModelForCausalLM.from_pretrained({str(ckpt / 'adapter')!r}).eval()(ids).logits
    merged = AutoModelForCausalLM.from_pretrained({str(ckpt)!r})(ids).logits
    base = AutoModelForCausalLM.from_pretrained({str(snapshot)!r})(ids).logits
print(float((peft - merged).abs().max()), float((base - merged).abs().max()))
"""
    proc = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    to_merged, moved = map(float, proc.stdout.split()[-2:])
    assert to_merged < 1e-5 < moved, proc.stdout


def test_model_revision_picks_the_commit_of_a_hub_id(tmp_path, monkeypatch):
    """``model.revision`` (a commit, or a branch / tag the cache's refs name) picks the snapshot folder the run loads
    and records; it is cleared there (the folder names the commit), so the run's config.yaml resumes as it is. With a
    model folder, or without model.path, it is one line; a commit not cached offline is the hub id's one line."""
    from huggingface_hub import constants

    from pacs_fast.config import load_config
    from pacs_fast.config.paths import validate_paths

    main = _hub_cache(tmp_path / "hub")
    other = "89abcdef" * 5
    make_tiny_model(main.parent / other, seed=5)
    (main.parent.parent / "refs" / "v1").write_text(other)  # (a tag: refs/tags/v1 on the hub, refs/v1 in the cache)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    def resolved(*overrides):
        cfg = load_config(None, [f"train.out_dir={tmp_path / 'runs'}", *overrides])
        validate_paths(cfg)
        return cfg.model.path, cfg.model.revision

    assert resolved("model.path=acme/tiny-math") == (str(main), "")
    for rev in (other, "v1"):
        assert resolved("model.path=acme/tiny-math", f"model.revision={rev}") == (str(main.parent / other), "")
    assert resolved(f"model.path={main.parent / other}") == (str(main.parent / other), "")  # (the recorded run)
    for overrides, error in (
            ([f"model.path={main}", "model.revision=v1"], f"model.revision=v1: model.path '{main}' is a folder here"),
            (["model.revision=v1"], "model.revision=v1 needs a hub id model.path (org/name)"),
            (["model.path=acme/tiny-math", "model.revision=v2"],
             "model.path 'acme/tiny-math' at revision 'v2' is not a folder here, nor in the Hugging Face cache")):
        with pytest.raises(ValueError, match="^" + re.escape(error)):
            resolved(*overrides)


def test_a_hub_repository_of_bin_weights_alone_trains(tmp_path, monkeypatch, capsys):
    """A repository without safetensors (``pytorch_model.bin``: older models): ``model.path`` takes its commit's
    ``.bin`` weights as well, pinned to the commit the first download resolved, and the run trains on them.

    BUG (found 2026-12-06; fixed 2026-12-07): the trainer's download took safetensors only, so the folder had no
    weights (eval had its own fallback)."""
    import torch
    from huggingface_hub import constants
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import model_files
    from test_run_safety import cli

    snapshot = _hub_cache(tmp_path / "hub")
    model = AutoModelForCausalLM.from_pretrained(snapshot)
    for f in snapshot.glob("*.safetensors"):
        f.unlink()
    torch.save(model.state_dict(), snapshot / "pytorch_model.bin")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    calls, real = [], model_files.hub_model_folder

    def spy(name, key="model.path", revision=None, **kw):
        calls.append((revision, kw.get("bin_weights", False)))
        folder = real(name, key, revision, **kw)
        if kw.get("bin_weights"):  # (what the cache gives for that pattern; offline it holds every file alike)
            assert (folder / "pytorch_model.bin").is_file()
        return folder

    monkeypatch.setattr(model_files, "hub_model_folder", spy)
    monkeypatch.setattr("pacs_fast.config.paths.hub_model_folder", spy)
    code, _, err = cli(TINY + ["model.path=acme/tiny-math", f"train.out_dir={tmp_path / 'runs'}", "train.steps=1",
                               "train.eval_every=0", "train.run_name=r"], capsys)
    assert code in (0, None), err[-3000:]
    assert calls == [(None, False), (REVISION, True)]
    assert f"path: {snapshot}" in (tmp_path / "runs" / "r" / "config.yaml").read_text()
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "runs" / "r" / "checkpoints" / "step_000001")
    start, end = model.state_dict(), saved.state_dict()  # (one step from the .bin weights: near them; another
    moved = max((end[k].float() - start[k].float()).abs().max().item() for k in start)  # model's are far)
    assert moved < 0.05, moved
