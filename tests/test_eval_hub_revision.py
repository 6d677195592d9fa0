"""``python -m pacs_fast.eval --model org/name`` (a Hugging Face Hub id) evaluates one commit and records it.

Before 2026-12-07 run_config.json named a hub id by the id alone (no ``weights``, which only a folder has): a rerun
into the same ``--out`` after the hub repository got a new commit resumed, sampling from the new model and appending
to the old one's samples (pass@k mixed two models without a word). Now the id resolves to its commit's snapshot
folder in the Hugging Face cache (``pacs_fast.config.model_files.hub_model_folder``, as the trainer's ``model.path``),
which the run loads and records as ``revision``; a resume on another commit is one line before the model loads (online:
before the new commit downloads), ``--revision`` pins one. A hand-made offline cache stands in for the hub (CI has no network)."""
import json

import pytest

from pacs_fast import eval as ev
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.evaluation.results import read_samples

from test_eval_cli import _one_line_error, _run_args, dataset  # noqa: F401  (dataset: its fixture, 4 rows)
from test_hub_model import REVISION, _hub_cache

HUB_ID = "acme/tiny-math"
NEWER = "fedcba9876543210" * 2 + "fedcba98"  # the repository's next commit


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An offline Hugging Face cache holding ``acme/tiny-math`` at :data:`REVISION` (``refs/main``); its repo
    folder (``models--acme--tiny-math``)."""
    from huggingface_hub import constants

    snapshot = _hub_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # (both read when huggingface_hub is
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # imported: a download tried would wait on the network)
    return snapshot.parent.parent


def _new_commit(repo):
    """The hub repository's ``main`` moves to :data:`NEWER`, other weights (as a download after the push leaves it)."""
    make_tiny_model(repo / "snapshots" / NEWER, seed=4)
    (repo / "refs" / "main").write_text(NEWER)


@pytest.fixture
def loaded(monkeypatch):
    """The model folders the engine was built from, one per run (``args.model`` when ``_make_engine`` is called)."""
    folders, real = [], ev._make_engine

    def spy(args, *rest):
        folders.append(args.model)
        return real(args, *rest)

    monkeypatch.setattr(ev, "_make_engine", spy)
    return folders


def _settings(out):
    return json.loads((out / "run_config.json").read_text())


def test_a_hub_id_is_evaluated_from_its_commits_snapshot_and_the_commit_recorded(hub, dataset, tmp_path, loaded):
    out = tmp_path / "run"
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "1")) == 0
    assert loaded == [str(hub / "snapshots" / REVISION)]  # the recorded commit's folder is what loaded
    settings = _settings(out)
    assert (settings["model"], settings["revision"]) == (HUB_ID, REVISION)
    results = json.loads((out / "results.json").read_text())
    assert (results["model"], results["revision"], results["label"]) == (HUB_ID, REVISION, "tiny-math")
    # the same commit: a resume
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "2")) == 0
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0, 1] and _settings(out)["revision"] == REVISION
    (out / "results.json").unlink()
    assert ev.main(["report", "--out", str(out)]) == 0  # (recomputed: the revision from the settings)
    assert json.loads((out / "results.json").read_text())["revision"] == REVISION


def test_a_resume_on_another_commit_of_the_hub_id_is_refused_before_the_model_loads(hub, dataset, tmp_path, capsys,
                                                                                    monkeypatch, loaded):
    out = tmp_path / "run"
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "1")) == 0
    _new_commit(hub)
    real = ev._generate  # (the tokenizer and the engine: nothing of the model may load)
    monkeypatch.setattr(ev, "_generate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("the model loaded")))
    capsys.readouterr()
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "2")) == 2
    _one_line_error(capsys, f"holds samples made with other settings (revision differ: revision '{REVISION}' there, "
                    f"'{NEWER}' here (the hub id's commit: --revision {REVISION} resumes on the one those samples were "
                    f"drawn from)", "--overwrite to delete those samples", "another --out")
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0] and _settings(out)["revision"] == REVISION
    monkeypatch.setattr(ev, "_generate", real)
    # the old commit, pinned: the resume goes on with the model its samples came from
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "2", "--revision", REVISION)) == 0
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0, 1] and _settings(out)["revision"] == REVISION
    # --overwrite: afresh on the new commit, recorded
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "1", "--overwrite")) == 0
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0] and _settings(out)["revision"] == NEWER
    assert loaded == [str(hub / "snapshots" / c) for c in (REVISION, REVISION, NEWER)]


def test_a_folder_written_before_revisions_were_recorded_resumes(hub, dataset, tmp_path, capsys):
    """No ``revision`` in the settings (an eval from before): nothing to compare, the resume goes on, and the commit
    it evaluated is recorded from then on."""
    out = tmp_path / "run"
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "1")) == 0
    settings = _settings(out)
    del settings["revision"]
    (out / "run_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    _new_commit(hub)
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "2")) == 0, capsys.readouterr().err
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0, 1] and _settings(out)["revision"] == NEWER


def test_revision_needs_a_cached_commit_of_a_hub_id(hub, dataset, tmp_path, capsys, monkeypatch):
    model = tmp_path / "folder"
    make_tiny_model(model, seed=0)
    capsys.readouterr()
    monkeypatch.setattr(ev, "_generate", lambda *a, **k: (_ for _ in ()).throw(AssertionError("the model loaded")))
    assert ev.main(_run_args(model, dataset, tmp_path / "a", "--revision", REVISION)) == 2
    _one_line_error(capsys, f"--revision {REVISION}: --model {model} is a folder here")
    assert ev.main(_run_args(HUB_ID, dataset, tmp_path / "b", "--revision", NEWER)) == 2
    _one_line_error(capsys, f"--model {HUB_ID}: no such folder, and not in the Hugging Face cache at --revision "
                    f"{NEWER} (offline mode)")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_hub_repository_of_bin_weights_alone_is_evaluated(hub, dataset, tmp_path, monkeypatch, loaded):
    """A repository without safetensors (``pytorch_model.bin``, older models): its commit's ``.bin`` weights are
    fetched as well (``hub_model_folder``, the trainer's too: tests/test_hub_model.py), so eval loads it as it always
    has."""
    import torch
    from transformers import AutoModelForCausalLM

    from pacs_fast.config import model_files

    snapshot = hub / "snapshots" / REVISION
    model = AutoModelForCausalLM.from_pretrained(snapshot)
    for f in snapshot.glob("*.safetensors"):
        f.unlink()
    torch.save(model.state_dict(), snapshot / "pytorch_model.bin")
    calls, real = [], model_files.hub_model_folder

    def spy(name, key="model.path", revision=None, **kw):
        calls.append((revision, kw.get("bin_weights", False)))
        return real(name, key, revision, **kw)

    monkeypatch.setattr("pacs_fast.evaluation.settings.hub_model_folder", spy)
    monkeypatch.setattr(model_files, "hub_model_folder", spy)  # (its own second call)
    out = tmp_path / "run"
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "1")) == 0
    assert calls == [(None, False), (REVISION, True)]  # (the second download pinned to the commit the first found)
    assert loaded == [str(snapshot)] and _settings(out)["revision"] == REVISION


def test_online_a_resume_on_a_moved_hub_id_is_refused_before_anything_downloads(hub, dataset, tmp_path, capsys,
                                                                                 monkeypatch):
    """Online, a resume whose hub id moved on (its samples drawn from an older commit): one line naming both commits
    and ``--revision``, before the download (one metadata request stands in for it here: the hub's newest commit).

    BUG (found 2026-12-07; fixed 2026-12-07): the resume downloaded the new commit's files (GBs for a real model)
    and only then was refused by the settings check."""
    from pacs_fast.evaluation import settings

    out = tmp_path / "run"
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "1")) == 0
    downloads, real = [], settings.hub_model_folder

    def spy(name, key="model.path", revision=None, **kw):
        downloads.append(revision)
        return real(name, key, revision, **kw)

    monkeypatch.setattr(settings, "hub_model_folder", spy)
    monkeypatch.setattr(settings, "hub_newest_commit", lambda name: NEWER if name == HUB_ID else None, raising=False)
    capsys.readouterr()
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "2")) == 2
    _one_line_error(capsys, f"holds samples drawn from commit {REVISION} of --model {HUB_ID}, whose newest commit is "
                    f"now {NEWER}: --revision {REVISION} resumes on the one those samples were drawn from",
                    "nothing was downloaded")
    assert downloads == [] and sorted(read_samples(out / "samples_toy.jsonl")) == [0]
    # pinned, or afresh: no question asked of the hub's newest commit
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "2", "--revision", REVISION)) == 0
    assert ev.main(_run_args(HUB_ID, dataset, tmp_path / "other", "--limit", "1")) == 0
    assert downloads == [REVISION, None] and sorted(read_samples(out / "samples_toy.jsonl")) == [0, 1]
    # the hub's newest commit is the recorded one: the resume goes on
    monkeypatch.setattr(settings, "hub_newest_commit", lambda name: REVISION)
    assert ev.main(_run_args(HUB_ID, dataset, out, "--limit", "3")) == 0
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0, 1, 2]
