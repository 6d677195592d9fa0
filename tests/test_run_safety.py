"""Nothing silently lost or wrong (issue 17, trainer items 1-6 and 10-13): run folders are never
overwritten, resumes check their config and fall back past a damaged checkpoint, a full disk and a
non-finite step are reported as such, every bad setting is one line with exit code 2 before any
model work, checkpoints carry the model folder's tokenizer and generation files unchanged, and a
few rollouts per step are kept with their prompt."""
import errno
import json
import shutil
from pathlib import Path

import pytest
import torch

from pacs_fast.trainer.metrics import deterministic_view, read_jsonl

from test_train import TINY

STEPS = ["train.steps=4", "train.eval_every=2", "train.save_every=2", "train.keep_checkpoints=2"]


@pytest.fixture(scope="module")
def cache(warm_cache):
    return str(warm_cache)  # the session's shared warm-up cache (conftest.py)


def cli(args, capsys):
    """``python -m pacs_fast.train ARGS`` in this process: (exit code, stdout, stderr)."""
    from pacs_fast.train import main
    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def finished(tmp_path_factory, cache):
    """A finished 4-step run (checkpoints at steps 2 and 4), copied by each test that changes it."""
    out = tmp_path_factory.mktemp("runs")
    from pacs_fast.train import main
    main(TINY + STEPS + [f"warmup.cache_dir={cache}", f"train.out_dir={out}", "train.run_name=done"])
    return out / "done"


def copy_run(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copytree(src, dst)
    return dst


def test_reusing_a_run_name_is_refused_and_nothing_is_touched(finished, tmp_path, capsys, cache):
    run = copy_run(finished, tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, _, err = cli(TINY + STEPS + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=done"],
                       capsys)
    assert code == 2 and "already exists" in err and f"--resume {run}" in err and err.count("\n") == 1
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_automatic_names_never_collide(tmp_path):
    from pacs_fast.config import load_config
    from pacs_fast.trainer.run_claim import claim_run_dir
    cfg = load_config(None, [f"train.out_dir={tmp_path}"])
    first = claim_run_dir(cfg)
    first.mkdir(parents=True)
    (first / "config.yaml").write_text("{}")
    second = claim_run_dir(cfg)
    assert second != first and second.name.startswith(first.name)


def test_automatic_names_chosen_in_one_second_both_run(tmp_path):
    """Two runs without train.run_name started within one second chose one name before either held its lock;
    the second was refused ("in use by another run ... choose another train.run_name", a name the user never
    chose; concurrency sweep, 2026-11-29). The later claim takes the next free suffix; a given name is refused."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.run_claim import RunFolderTaken, claim_run_dir
    from pacs_fast.trainer.run_folder import claim_run_folder
    cfg = load_config(None, [f"train.out_dir={tmp_path}"])
    name = claim_run_dir(cfg)
    assert claim_run_dir(cfg) == name  # both runs' choice, before either claims it
    first = claim_run_folder(name, new=True, automatic=True)
    second = claim_run_folder(name, new=True, automatic=True)  # the first holds its lock, nothing written yet
    (tmp_path / f"{name.name}-3").mkdir()
    (tmp_path / f"{name.name}-3" / "config.yaml").write_text("{}")  # another run's folder, finished
    third = claim_run_folder(name, new=True, automatic=True)
    assert [f.path.name for f in (first, second, third)] == [name.name, f"{name.name}-2", f"{name.name}-4"]
    with pytest.raises(RunFolderTaken, match="is in use by another run"):
        claim_run_folder(name, new=True, automatic=False)  # a name the user gave is never changed
    for folder in (first, second, third):
        folder.lock.release()


def test_resume_of_a_finished_run_keeps_its_results(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    summary = json.loads((run / "summary.json").read_text())
    records = read_jsonl(run / "metrics.jsonl")
    code, _, err = cli(["--resume", str(run)], capsys)
    assert code == 0, err
    again = json.loads((run / "summary.json").read_text())
    final_eval = [r for r in records if r["kind"] == "eval"][-1]
    assert again["acc_after"] == summary["acc_after"] == final_eval["eval/acc"]
    assert again["acc_before"] == summary["acc_before"] and again["final_eval_step"] == 4
    assert deterministic_view(read_jsonl(run / "metrics.jsonl")) == deterministic_view(records)
    raw = read_jsonl(run / "metrics.jsonl", raw=True)  # nothing to do: not even a resume marker is appended
    assert raw == records and again == summary  # (the no-op session's wall time is not added either)


@pytest.mark.parametrize("damage, match", [
    ("cut", "unreadable or cut"),
    ("edited", "differs from the config stored in step_000004"),
    ("unsafe_override", "algo.beta cannot change in a resumed run"),
])
def test_resume_refuses_a_cut_or_changed_config(finished, tmp_path, capsys, damage, match):
    run = copy_run(finished, tmp_path)
    cfg = run / "config.yaml"
    args = ["--resume", str(run)]
    if damage == "cut":
        cfg.write_text(cfg.read_text()[: len(cfg.read_text()) // 3] + "\n  - [")
    elif damage == "edited":  # a key a resume cannot change (the safe ones, e.g. train.steps, are overrides)
        assert "  beta: 1.0\n" in cfg.read_text()
        cfg.write_text(cfg.read_text().replace("  beta: 1.0\n", "  beta: 2.0\n", 1))
    else:
        args.append("algo.beta=2.0")
    code, _, err = cli(args, capsys)
    assert code == 2 and match in err and err.count("\n") == 1, err


@pytest.mark.parametrize("what", ["folder", "metrics.jsonl"])
def test_resume_of_a_run_it_cannot_write_is_one_line_before_the_model_loads(finished, tmp_path, capsys, monkeypatch,
                                                                           what):
    """A read-only run folder (or its metrics.jsonl) had loaded the model on --resume, printed "resumed from ...", then
    stopped on a PermissionError traceback: one line naming it, exit 2, nothing loaded. (Made read-only here by
    refusing the writes, since root writes through permission bits.)"""
    import os
    import tempfile

    run = copy_run(finished, tmp_path)
    if what == "folder":
        def refuse(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == run:
                raise PermissionError(errno.EROFS, "Read-only file system")
            return real_mkdtemp(*args, dir=dir, **kwargs)
        real_mkdtemp = tempfile.mkdtemp
        monkeypatch.setattr(tempfile, "mkdtemp", refuse)
    else:
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p).name == what and mode & os.W_OK
                            else real_access(p, mode, **kw))
    code, out, err = cli(["--resume", str(run), "train.steps=6"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert ("the run folder is not writable (Read-only file system)" if what == "folder" else
            "metrics.jsonl is not writable") in err, err
    assert "resumed from" not in out


def _store_in_config(run, old: str, new: str):
    """``run``'s config.yaml and its last checkpoint's copy with ``old`` replaced by ``new``, as a run made so
    would have stored them (the checkpoint's manifest follows); returns the checkpoint folder."""
    ckpt = run / "checkpoints" / "step_000004"
    for f in (run / "config.yaml", ckpt / "config.yaml"):
        text = f.read_text()
        assert old in text
        f.write_text(text.replace(old, new, 1))
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["config.yaml"] = (ckpt / "config.yaml").stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    return ckpt


def test_a_stored_value_this_version_refuses_names_its_source_and_the_way_on(finished, tmp_path, capsys):
    """An older pacs_fast took rollout.temperature=0.005; this one refuses it, and a resume of such a run
    said only 'rollout.temperature must be in [0.01, inf)', a value the user never typed and cannot change
    (a sweep of runs made by older versions)."""
    run = copy_run(finished, tmp_path)
    ckpt = _store_in_config(run, "  temperature: 1.0\n", "  temperature: 0.005\n")
    code, _, err = cli(["--resume", str(run)], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "rollout.temperature must be" in err and f"(from {run / 'config.yaml'}, which an earlier pacs_fast" in err
    assert f"model.path={ckpt}" in err, err


def test_a_resume_may_change_activation_recompute(finished, tmp_path, capsys):
    """Recompute gives the same values bit for bit (tests/test_recompute.py); it is the way on after running out of
    memory, and a resume refused it as 'would not continue the same training' (sweep of 2026-11-29)."""
    run = copy_run(finished, tmp_path)
    code, _, err = cli(["--resume", str(run), "model.gradient_checkpointing=true",
                        "model.recompute_granularity=selective"], capsys)
    assert code == 0, err
    text = (run / "config.yaml").read_text()
    assert "gradient_checkpointing: true" in text and "recompute_granularity: selective" in text


def test_a_resume_under_another_launch_says_which_launch_the_run_needs(finished, tmp_path, capsys):
    """A run made for two processes (here: rollout.ranks=1, one engine rank and one learner rank) resumed in one
    process said the stored value was one 'an earlier pacs_fast accepted' and to start a new run (sweep of
    2026-11-29: a TP=2 run resumed without torchrun); it names the launch the run needs."""
    run = copy_run(finished, tmp_path)
    ckpt = _store_in_config(run, "  ranks: 0\n", "  ranks: 1\n")
    code, _, err = cli(["--resume", str(run)], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "rollout.ranks=1 needs more than 1 processes" in err and "earlier pacs_fast" not in err, err
    # the checkpoint's data-parallel groups (1) x learner.tp_size (1) + rollout.ranks (1): what it ran with
    assert (f"(from {run / 'config.yaml'}: it ran with 2 processes, e.g. python -m torch.distributed.run "
            f"--nproc_per_node 2 -m pacs_fast.train --resume {run})") in err, err
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    del state["data_parallel"]  # a checkpoint that does not record it: the smallest launch its settings allow
    torch.save(state, ckpt / "trainer_state.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["trainer_state.pt"] = (ckpt / "trainer_state.pt").stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = cli(["--resume", str(run)], capsys)
    assert code == 2 and "the smallest its settings allow is 2 processes, e.g. python -m torch.distributed.run" in err


def test_a_run_from_another_runs_checkpoint_writes_checkpoints_it_can_resume(finished, tmp_path, capsys):
    """model.path = an earlier run's step_N (a second stage): the old manifest.json, trainer_state.json and
    config.yaml were copied in as model files, the new manifest listed the old one's size, and no checkpoint
    of the new run could ever be resumed (the real-shape sweep)."""
    from pacs_fast.trainer.checkpoint import problem_of

    source = finished / "checkpoints" / "step_000004"
    args = [a for a in TINY if not a.startswith(("warmup.", "model.tiny"))]
    code, _, err = cli(args + [f"model.path={source}", "train.steps=2", "train.save_every=1", f"train.out_dir={tmp_path}",
                               "train.run_name=stage2"], capsys)
    assert code == 0, err
    for step in (1, 2):
        ckpt = tmp_path / "stage2" / "checkpoints" / f"step_{step:06d}"
        assert problem_of(ckpt) is None
        assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == step
        assert "steps: 2" in (ckpt / "config.yaml").read_text()
    code, out, err = cli(["--resume", str(tmp_path / "stage2"), "train.steps=3"], capsys)
    assert code == 0 and "(step 2)" in out, err
    assert [r["step"] for r in read_jsonl(tmp_path / "stage2" / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 3]


def test_a_resume_on_another_number_of_data_parallel_groups_says_it_trains_otherwise(finished, tmp_path, capsys):
    """A checkpoint records its data-parallel groups; resumed on another number with several mini-batches per
    step (each group draws from its own share), the run warns that the steps that follow differ (a sweep of
    2026-11-29: 2 -> 1 process, 18 values of steps 3-4 differed, without a word)."""
    run = copy_run(finished, tmp_path)
    import torch

    ckpt = run / "checkpoints" / "step_000004"
    assert json.loads((ckpt / "trainer_state.json").read_text())["data_parallel"] == 1
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    torch.save({**state, "data_parallel": 2}, ckpt / "trainer_state.pt")  # as if trained on two groups
    manifest = json.loads((ckpt / "manifest.json").read_text())  # (it holds every file's size)
    manifest["files"]["trainer_state.pt"] = (ckpt / "trainer_state.pt").stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = cli(["--resume", str(run), "train.steps=5"], capsys)
    assert code == 0, err
    assert ("warning: the run trained on 2 data-parallel groups and resumes on 1: with learner.mini_batch_prompts=2 "
            "< train.prompts_per_step=4 each group draws its mini-batches from its own share") in out, out
    from pacs_fast.config import load_config
    from pacs_fast.trainer.session import layout_change_warning
    one_step = load_config(None, ["train.prompts_per_step=4", "learner.mini_batch_prompts=4"])
    assert layout_change_warning(one_step, 2, 1) is None  # one optimiser step per step: the same training
    assert layout_change_warning(one_step, None, 1) is None  # a checkpoint from before the key
    assert "rollout.filter_groups=true" in layout_change_warning(
        load_config(None, ["train.prompts_per_step=4", "learner.mini_batch_prompts=4", "rollout.filter_groups=true"]),
        1, 2)


def test_a_checkpoint_whose_manifest_lists_itself_resumes(finished, tmp_path, capsys):
    """Second-stage runs written before 56e09eb (2026-11-28) listed the copied-in manifest.json, with the old
    one's size, in their own manifest: every such checkpoint was refused as 'truncated or changed' (a sweep of
    runs made by older versions). A manifest cannot vouch for its own size: that entry is not checked."""
    from pacs_fast.trainer.checkpoint import problem_of

    run = copy_run(finished, tmp_path)
    ckpt = run / "checkpoints" / "step_000004"
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["manifest.json"] = (ckpt / "manifest.json").stat().st_size + 24
    (ckpt / "manifest.json").write_text(json.dumps(manifest, indent=1))
    assert problem_of(ckpt) is None
    code, out, err = cli(["--resume", str(run), "train.steps=5"], capsys)
    assert code == 0 and "(step 4)" in out and "truncated" not in out + err, err


def test_resume_accepts_a_safe_override_and_continues(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    # (overrides on both sides of --resume: argparse's plain parse took the first run only, then refused the
    # other, "unrecognized arguments", naming a valid key)
    code, _, err = cli(["train.steps=5", "--resume", str(run), "train.threads=1"], capsys)
    assert code == 0, err
    steps = [r["step"] for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4, 5]
    # the summary's wall time is the run's: the resumed checkpoint's (steps 1-4) plus this session's
    before = json.loads((run / "checkpoints" / "step_000004" / "trainer_state.json").read_text())["wall_time_s"]
    first = json.loads((finished / "summary.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < before < first["wall_time_s"] and 0 < summary["session_wall_time_s"] < summary["wall_time_s"]
    assert summary["wall_time_s"] == pytest.approx(before + summary["session_wall_time_s"], rel=1e-9)
    assert first["wall_time_s"] == first["session_wall_time_s"]
    from pacs_fast.code_version import code_version  # the same code wrote and resumed it: no note, one version
    assert summary["code_versions"] == first["code_versions"] == [code_version()]
    assert "note: the checkpoint was written by" not in err


def _rewrite_trainer_state(ckpt: Path, **changes) -> None:
    """Edits a checkpoint's trainer_state.pt (None: drop the key), keeping its manifest true."""
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    for key, value in changes.items():
        state.pop(key, None) if value is None else state.__setitem__(key, value)
    torch.save(state, ckpt / "trainer_state.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["trainer_state.pt"] = (ckpt / "trainer_state.pt").stat().st_size
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("written_by", ["unrecorded", "0.0.9+gdeadbeef0000"])
def test_a_resume_under_other_code_says_so_and_the_summary_lists_the_versions(finished, tmp_path, capsys,
                                                                               written_by):
    """A run from an older pacs_fast resumed under a newer one diverged from the older code's own resume from
    its third step with no word (its sampler had changed; a sweep of runs made by older versions); checkpoints
    recorded no version, and one without wall_time_s was counted as 0 s of earlier sessions."""
    from pacs_fast.code_version import code_version

    run = copy_run(finished, tmp_path)
    old = dict(code_versions=None, wall_time_s=None) if written_by == "unrecorded" else \
        dict(code_versions=[written_by])
    _rewrite_trainer_state(run / "checkpoints" / "step_000004", **old)
    code, out, err = cli(["--resume", str(run), "train.steps=5"], capsys)
    assert code == 0, err
    was = ("a pacs_fast that did not record its version (before 2026-11-29)" if written_by == "unrecorded"
           else f"pacs_fast {written_by}")
    assert f"note: the checkpoint was written by {was} and the run continues under {code_version()}" in out + err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["code_versions"] == [written_by, code_version()]
    ckpt = json.loads((run / "checkpoints" / "step_000005" / "trainer_state.json").read_text())
    assert ckpt["code_versions"] == [written_by, code_version()]
    if written_by == "unrecorded":  # unknown, not 0 s: the summary says so, and so does the next checkpoint
        assert summary["wall_time_s"] is None and ckpt["wall_time_s"] is None
        assert "(the earlier sessions' was not recorded)" in out
    else:
        assert summary["wall_time_s"] > summary["session_wall_time_s"] > 0


def test_a_truncated_latest_checkpoint_falls_back_to_the_older_one(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    weights = run / "checkpoints" / "step_000004" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    (run / "checkpoints" / ".tmp-step_000006").mkdir()  # a kill while writing
    code, out, err = cli(["--resume", str(run)], capsys)
    assert code == 0, err
    assert f"skipping checkpoint step_000004: {weights} is truncated" in out
    assert "resumed from" in out and "step_000002 (step 2)" in out
    assert not list((run / "checkpoints").glob(".tmp-*"))
    # steps 3 and 4 ran again from step 2 and give the same records as the first time
    assert deterministic_view(read_jsonl(run / "metrics.jsonl")) == \
        deterministic_view(read_jsonl(finished / "metrics.jsonl"))


@pytest.mark.parametrize("writer", ["torch.save", "safetensors"])
def test_a_full_disk_is_reported_and_the_last_good_checkpoint_kept(tmp_path, capsys, cache, monkeypatch, writer):
    import pacs_fast.trainer.checkpoint as ckpt
    from safetensors import SafetensorError

    from pacs_fast.learner import TorchLearner
    real_save, real_hf, calls = torch.save, TorchLearner.save_hf, []

    def save(obj, f, *a, **kw):  # the second checkpoint's learner state hits a full disk
        calls.append(1)
        if len(calls) >= 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *a, **kw)

    def save_hf(self, path):  # the second checkpoint's weights do: safetensors raises its own error type,
        calls.append(1)  # not an OSError (the megatron learner's writer; it escaped as a traceback)
        if len(calls) >= 2:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real_hf(self, path)

    if writer == "torch.save":
        monkeypatch.setattr(ckpt.torch, "save", save)
    else:
        monkeypatch.setattr(TorchLearner, "save_hf", save_hf)
    code, _, err = cli(TINY + STEPS + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r"],
                       capsys)
    monkeypatch.setattr(ckpt.torch, "save", real_save)
    monkeypatch.setattr(TorchLearner, "save_hf", real_hf)
    root = tmp_path / "r" / "checkpoints"
    assert code == 1 and "No space left on device" in err and "step_000002 is intact" in err, err
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002"]
    assert ckpt.problem_of(root / "step_000002") is None


def test_a_full_disk_while_logging_is_one_line_and_the_run_resumes(finished, tmp_path, capsys, cache, monkeypatch):
    from pacs_fast.trainer.metrics import MetricsLogger
    real_log = MetricsLogger.log

    def log(self, kind, step, values):  # the disk fills as step 3's record is appended; a write on an
        if kind == "train" and step == 3:  # open file reports no file name, so the message names the run
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_log(self, kind, step, values)

    monkeypatch.setattr(MetricsLogger, "log", log)
    args = TINY + STEPS + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r"]
    code, _, err = cli(args, capsys)
    monkeypatch.setattr(MetricsLogger, "log", real_log)
    run = tmp_path / "r"
    errors = [line for line in err.splitlines() if "error" in line.lower()]  # no traceback, one line
    assert code == 1 and len(errors) == 1 and errors[0].startswith("error: "), err
    assert f"no space left on device writing into {run};" in errors[0] and f"--resume {run}" in errors[0]
    code, _, err = cli(["--resume", str(run)], capsys)  # space freed: steps 3 and 4 run again from step 2
    assert code == 0, err
    assert deterministic_view(read_jsonl(run / "metrics.jsonl")) == \
        deterministic_view(read_jsonl(finished / "metrics.jsonl"))


def test_a_non_finite_gradient_stops_the_run_before_the_step(tmp_path, capsys, cache, monkeypatch):
    import pacs_fast.learner.torch_learner as tl
    real, calls = tl.objective, []

    def objective(*a, **kw):  # the loss turns NaN from step 3 on (4 micro-batches a step)
        loss, met = real(*a, **kw)
        calls.append(1)
        return (loss * float("nan") if len(calls) > 8 else loss), met

    monkeypatch.setattr(tl, "objective", objective)
    code, _, err = cli(TINY + STEPS + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r"],
                       capsys)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 1 and len(errors) == 1 and "step 3:" in errors[0] and "non-finite loss=nan" in errors[0], err
    assert "Traceback" not in err
    root = tmp_path / "r" / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002"]
    from safetensors.torch import load_file
    assert all(torch.isfinite(t).all() for t in load_file(str(root / "step_000002" / "model.safetensors")).values())


def hf_folder(tmp_path: Path) -> Path:
    """A tiny HF model folder with its own generation_config.json (two stop ids) and tokenizer."""
    from pacs_fast.data.tiny import build_char_tokenizer, make_tiny_model
    folder = make_tiny_model(tmp_path / "model", hidden_size=64, num_layers=1)
    tok = build_char_tokenizer()
    gen = {"eos_token_id": [tok.eos_token_id, tok.pad_token_id], "do_sample": True, "temperature": 0.7}
    (folder / "generation_config.json").write_text(json.dumps(gen))
    return folder


@pytest.mark.parametrize("case, match", [
    ("lr_inf", "learner.lr must be a finite number, got inf"),
    ("beta_nan", "algo.beta must be a finite number, got nan"),
    ("clip_nan", "learner.grad_clip must be a finite number, got nan"),
    ("temperature_nan", "rollout.temperature must be a finite number, got nan"),
    ("betas_text", "learner.betas must be two numbers in [0, 1)"),
    ("threads", "train.threads must be >= 0"),
    ("workers", "train.reward_workers must be >= 0"),
    ("attention", "model.attention must be one of"),
    ("triton", "learner.logprob_backend=triton (compiled Triton kernels) needs a CUDA GPU"),
    ("model_file", "is a file; give the Hugging Face model folder"),
    ("model_empty", "has no config.json"),
    ("model_no_weights", "has no weights file (*.safetensors or *.bin): copy the model's weights into that folder"),
    ("out_dir_file", "train.out_dir"),
    ("run_name_escape", "train.run_name '../x' must be a plain folder name"),
    ("yaml", "YAML syntax error"),
    ("three_rows", "too few to hold out an evaluation split"),
    ("seed_huge", "train.seed must be in 0..4294967295, got 99999999999999999999"),  # was a traceback after the
    ("seed_2_62", "train.seed must be in 0..4294967295"),                            # model had loaded
    ("warmup_seed_huge", "warmup.seed must be in 0..4294967295 (or -1 = train.seed)"),
    ("arith_seed_negative", "data.arith_seed must be in 0..4294967295, got -3"),
])
def test_bad_settings_are_one_line_errors_before_any_model_work(tmp_path, capsys, case, match, monkeypatch):
    monkeypatch.setattr("pacs_fast.trainer.build.build_learner", lambda *a, **k: pytest.fail("model work started"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "bad.yaml").write_text("algo:\n  beta: [1\n")
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')  # (a config transformers can build)
    (model / "tokenizer.json").write_text("{}")
    (model / "pytorch_model.bin").write_bytes(b"")  # (a weights file is checked present)
    shutil.copytree(model, tmp_path / "noweights", ignore=shutil.ignore_patterns("*.bin"))
    three = tmp_path / "three.jsonl"
    three.write_text("".join(json.dumps({"problem": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(3)))
    args = {
        "lr_inf": ["learner.lr=inf"], "beta_nan": ["algo.beta=nan"], "clip_nan": ["learner.grad_clip=.nan"],
        "temperature_nan": ["rollout.temperature=nan"], "betas_text": ["learner.betas=[a,b]"],
        "threads": ["train.threads=-1"], "workers": ["train.reward_workers=-1"], "attention": ["model.attention=bogus"],
        "triton": ["learner.logprob_backend=triton"], "model_file": [f"model.path={tmp_path / 'file'}"],
        "model_empty": [f"model.path={tmp_path / 'empty'}"], "out_dir_file": [f"train.out_dir={tmp_path / 'file'}"],
        "model_no_weights": [f"model.path={tmp_path / 'noweights'}"],
        "run_name_escape": ["train.run_name=../x"], "yaml": ["--config", str(tmp_path / "bad.yaml")],
        "three_rows": [f"data.dataset={three}", f"model.path={model}"],
        "seed_huge": ["train.seed=99999999999999999999"], "seed_2_62": [f"train.seed={2**62}"],
        "warmup_seed_huge": ["warmup.seed=99999999999999999999"], "arith_seed_negative": ["data.arith_seed=-3"],
    }[case]
    if torch.cuda.is_available() and case == "triton":
        pytest.skip("this machine has CUDA: the triton backend is valid here")
    if case != "out_dir_file":
        args = args + [f"train.out_dir={tmp_path / 'runs'}"]
    code, _, err = cli(args, capsys)
    assert code == 2 and match in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "x").exists()


def test_shipped_dataset_names_are_accepted(tmp_path):
    from pacs_fast.config import SHIPPED_DATASETS, load_config, validate
    from pacs_fast.data.datasets import available_datasets
    assert sorted(SHIPPED_DATASETS) == sorted(available_datasets())
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')  # (a config transformers can build)
    (model / "tokenizer.json").write_text("{}")
    (model / "pytorch_model.bin").write_bytes(b"")  # (a weights file is checked present)
    validate(load_config(None, ["data.dataset=math_train", "data.eval_dataset=math500", f"model.path={model}"]))
    with pytest.raises(ValueError, match="neither a shipped dataset"):
        validate(load_config(None, ["data.dataset=math_trian", f"model.path={model}"]))


def test_checkpoints_carry_generation_config_and_tokenizer_unchanged_and_samples_keep_prompts(tmp_path, capsys):
    model = hf_folder(tmp_path)
    # config.json as released checkpoints have it (transformers 4's keys): transformers 5 wrote the checkpoint's
    # with rope_parameters only, which a transformers-4 loader read as rope_theta 10,000 (the real-shape sweep)
    legacy = json.loads((model / "config.json").read_text())
    legacy.pop("rope_parameters", None)
    legacy.update(rope_theta=20000.0, torch_dtype="bfloat16")
    (model / "config.json").write_text(json.dumps(legacy))
    data = tmp_path / "d.jsonl"
    rows = [{"problem": f"{i}+{i}", "answer": str(2 * i)} for i in range(20)]
    rows += [{"problem": "1+" * 40 + "1", "answer": "41"} for _ in range(5)]  # 20% too long
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    from transformers import AutoTokenizer

    from pacs_fast.data.prompts import encode_prompts
    limit = len(encode_prompts(AutoTokenizer.from_pretrained(model), ["19+19"])[0]) + 10
    args = [a for a in TINY if not a.startswith(("data.arith", "warmup.", "model.tiny"))]
    code, out, err = cli(args + ["train.steps=1", f"model.path={model}", f"data.dataset={data}", "data.eval_size=4",
                                 f"data.max_prompt_tokens={limit}", f"train.out_dir={tmp_path}", "train.run_name=r",
                                 "train.log_samples=3"], capsys)
    assert code == 0, err
    import re
    dropped, total = map(int, re.search(r"warning: data.dataset: dropped (\d+) of (\d+) prompts", out).groups())
    assert dropped >= 2 and total == 21  # 25 rows, 4 held out; at least 2 of the 5 long ones are in training
    ckpt = tmp_path / "r" / "checkpoints" / "step_000001"
    for f in model.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            assert (ckpt / f.name).read_bytes() == f.read_bytes(), f.name
    from transformers import AutoConfig, GenerationConfig
    assert GenerationConfig.from_pretrained(ckpt).eos_token_id == json.loads(
        (model / "generation_config.json").read_text())["eos_token_id"]
    saved = json.loads((ckpt / "config.json").read_text())
    assert saved["rope_theta"] == 20000.0 and saved["torch_dtype"] == saved["dtype"] == "float32", saved
    assert AutoConfig.from_pretrained(ckpt).rope_parameters == AutoConfig.from_pretrained(model).rope_parameters
    first_eval = read_jsonl(tmp_path / "r" / "metrics.jsonl")[0]
    assert first_eval["data/dropped_train_prompts"] == pytest.approx(dropped / total)
    samples = read_jsonl(tmp_path / "r" / "samples.jsonl", raw=True)
    assert len(samples) == 3 and all(s["step"] == 1 for s in samples)
    for s in samples:
        assert "+" in s["prompt"] and len(s["prompt"]) > 40  # the full prompt text, not only the problem
        assert {"response", "reward", "answer", "psi", "pred_reward"} <= set(s)
        assert 0 < s["pred_reward"] < 1


def test_a_killed_warm_ups_temporary_folder_is_removed_and_a_live_ones_kept(tmp_path):
    """Item 4: a warm-up killed mid-write leaves its temporary folder in the model cache; the next run removes it
    when its builder is gone, and leaves a folder another running process is writing. Older temporaries
    (``.tmp-<name>-<pid>``, before the builds' locks) go by their process id, as they did."""
    import fcntl
    import os
    import subprocess
    import sys

    from pacs_fast.folder_build import remove_dead_builds
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    old_dead, old_live = tmp_path / f".tmp-abc-{gone.pid}", tmp_path / f".tmp-abc-{os.getpid()}"
    dead, live = tmp_path / ".build-abc-0dead", tmp_path / ".build-abc-1live"
    for folder in (old_dead, old_live, dead, live):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
    (tmp_path / ".build-abc-0dead.lock").touch()  # its builder was killed: nobody holds the lock
    fd = os.open(tmp_path / ".build-abc-1live.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live builder (this process)
    try:
        assert sorted(remove_dead_builds(tmp_path)) == sorted([dead, old_dead])
    finally:
        os.close(fd)
    assert not dead.exists() and not (tmp_path / ".build-abc-0dead.lock").exists() and not old_dead.exists()
    assert live.is_dir() and old_live.is_dir()


def test_a_builder_in_another_pid_namespace_is_seen_alive(tmp_path):
    """A container's builder has another process id (pid 1 is alive everywhere, its own pid may be free here):
    the temporary's lock, held by the kernel for whichever process took it, tells. Before the locks, a run in
    one container removed the folder another container was writing; the model renamed into the cache then had
    no tokenizer, and every later run failed with "no prompt fits" (concurrency sweep, 2026-11-29). Here the
    builder is a child process that holds the lock and reports a process id that does not exist."""
    import subprocess
    import sys

    from pacs_fast.folder_build import building_now, remove_dead_builds
    from pacs_fast.trainer.warmup import MODEL_FILES
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from pacs_fast.folder_build import build_folder\n"
        f"with build_folder({str(tmp_path / 'key')!r}) as tmp:\n"
        "    print(tmp.name, flush=True)\n"
        "    sys.stdin.readline()  # the test's go\n"
        f"    for name in {MODEL_FILES!r}:\n"
        "        (tmp / name).write_text('x')\n")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        name = child.stdout.readline().strip()
        assert name.startswith(".build-key-")
        assert building_now(tmp_path, "key")
        assert remove_dead_builds(tmp_path) == [] and (tmp_path / name).is_dir()
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
    assert sorted(p.name for p in (tmp_path / "key").iterdir()) == sorted(MODEL_FILES)  # whole, renamed in
    assert [p.name for p in tmp_path.iterdir()] == ["key"] and not building_now(tmp_path, "key")


def test_the_warm_up_removes_a_killed_warm_ups_folder_where_it_writes(tmp_path):
    """The warm-up writes ``<cache>/warmup/.build-<key>-<token>``; the clean-up looked in ``<cache>`` only, so a
    killed warm-up's folder stayed for good (hostile sweep, 2026-11-28)."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.warmup import MODEL_FILES, default_model, warmup_key
    cfg = load_config(None, [f"warmup.cache_dir={tmp_path}"])
    final = tmp_path / "warmup" / warmup_key(cfg)
    final.mkdir(parents=True)
    for name in MODEL_FILES:
        (final / name).write_bytes(b"cached")  # the cached model: nothing is built
    dead = tmp_path / "warmup" / f".build-{final.name}-0dead"
    dead.mkdir()
    (dead.parent / (dead.name + ".lock")).touch()
    assert default_model(cfg, [], log=lambda text: None) == final
    assert not dead.exists() and final.is_dir()


def test_an_incomplete_cached_model_is_built_again(tmp_path):
    """A model folder in the cache without its tokenizer (renamed there by a build another process had emptied,
    before the builds' locks) made every later run fail with "no prompt fits data.max_prompt_tokens": it is
    built again, with one warning."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.warmup import MODEL_FILES, default_model, warmup_key
    cfg = load_config(None, [f"warmup.cache_dir={tmp_path}", "warmup.steps=0", "model.tiny_hidden_size=32",
                             "model.tiny_num_layers=1"])
    final = tmp_path / "warmup" / warmup_key(cfg)
    final.mkdir(parents=True)
    (final / "model.safetensors").write_bytes(b"weights without a tokenizer")
    said = []
    assert default_model(cfg, [], log=said.append) == final
    assert all((final / name).is_file() for name in MODEL_FILES)
    assert [line for line in said if line.startswith("warning:")] == [
        f"warning: the cached warmed-up model {final} lacks one of {', '.join(MODEL_FILES)}: built again"]


def _drop_checkpoint(run: Path, step: int) -> None:
    """As if the run had been killed before writing checkpoint ``step``."""
    shutil.rmtree(run / "checkpoints" / f"step_{step:06d}")
    (run / "checkpoints" / "latest").write_text("step_000002\n")


def test_resume_with_nothing_left_to_train_reports_the_checkpoints_model(finished, tmp_path, capsys):
    """``--resume train.steps=S`` where S is the checkpoint's step and the last evaluation is older
    (here: step 2's evaluation removed, as with ``train.eval_every=0``): the checkpoint's model is
    evaluated and the summary reports it. Before, nothing ran and the summary's ``acc_after`` was the
    step-0 accuracy of a model that had trained (issue 41)."""
    run = copy_run(finished, tmp_path)
    _drop_checkpoint(run, 4)
    step2 = next(r for r in read_jsonl(run / "metrics.jsonl") if r["kind"] == "eval" and r["step"] == 2)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "metrics.jsonl").write_text("".join(x for x in lines if not ('"eval"' in x and '"step": 2,' in x)))
    code, out, err = cli(["--resume", str(run), "train.steps=2"], capsys)
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval_step"] == 2 and summary["steps"] == 2
    assert summary["acc_after"] == step2["eval/acc"] and "step 2: held-out accuracy" in out


def test_resume_of_a_checkpoint_folder_is_refused_and_names_the_run(finished, tmp_path, capsys):
    """A checkpoint holds a copy of ``config.yaml``; taken for a run folder, it was "resumed" from step 0
    inside the checkpoint (its own metrics, samples and nested checkpoints written there)."""
    run = copy_run(finished, tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, _, err = cli(["--resume", str(run / "checkpoints" / "step_000004"), "train.steps=6"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "is a checkpoint of the run in" in err and err.rstrip().endswith(f"--resume {run.resolve()}"), err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_resume_below_the_checkpoints_step_is_refused(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    code, _, err = cli(["--resume", str(run), "train.steps=1"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "train.steps=1 is below the step of its checkpoint step_000004 (4)" in err
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_resumed_run_supersedes_its_redone_samples(finished, tmp_path, capsys):
    """Killed after checkpoint 2 with steps 3-4 already logged: the resumed run redoes them, and
    ``samples.jsonl`` (read as the metrics are) holds each step's rows once, equal to the
    uninterrupted run's; the file is append-only (a resume marker, the old rows kept)."""
    run = copy_run(finished, tmp_path)
    _drop_checkpoint(run, 4)
    code, _, err = cli(["--resume", str(run)], capsys)
    assert code == 0, err
    rows, want = read_jsonl(run / "samples.jsonl"), read_jsonl(finished / "samples.jsonl")
    assert [r["step"] for r in rows] == [r["step"] for r in want] and len({r["step"] for r in rows}) == 4
    assert [(r["prompt"], r["response"], r["reward"]) for r in rows] == \
        [(r["prompt"], r["response"], r["reward"]) for r in want]
    raw = read_jsonl(run / "samples.jsonl", raw=True)
    assert {"kind": "resume", "step": 2} in raw and len(raw) == len(want) + 1 + sum(r["step"] > 2 for r in want)


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_step_0(finished, tmp_path, capsys):
    """A run that stopped before its first checkpoint was a dead end (its name refused, ``--resume``
    failing after loading the model): ``--resume`` now starts it again from step 0 in its folder,
    earlier records superseded, and it equals the uninterrupted run."""
    run = copy_run(finished, tmp_path)
    shutil.rmtree(run / "checkpoints")
    (run / "summary.json").unlink()
    code, out, err = cli(["--resume", str(run)], capsys)
    assert code == 0, err
    assert "has no checkpoint yet: starting it again from step 0" in out
    assert deterministic_view(read_jsonl(run / "metrics.jsonl")) == \
        deterministic_view(read_jsonl(finished / "metrics.jsonl"))
    assert {"kind": "resume", "step": -1} in read_jsonl(run / "metrics.jsonl", raw=True)
    assert json.loads((run / "summary.json").read_text())["final_eval_step"] == 4


def test_a_stop_right_after_the_last_save_is_settled_by_the_resume(finished, tmp_path, capsys):
    """Ctrl-C between checkpoint step 4's rename and its 'latest' / pruning left latest at step 2 and three
    checkpoints for keep_checkpoints=2, and a resume with nothing left to train saved nothing, so they stayed
    so for good (a next stage reading checkpoints/latest got the older model; interrupt sweep). The resume
    now points latest at the checkpoint it resumed from and prunes the older ones."""
    run = copy_run(finished, tmp_path)
    root = run / "checkpoints"
    shutil.copytree(root / "step_000002", root / "step_000001")  # an older one the save had not pruned yet
    (root / "latest").write_text("step_000002\n")
    code, _, err = cli(["--resume", str(run)], capsys)
    assert code == 0, err
    assert (root / "latest").read_text() == "step_000004\n"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000002", "step_000004"]


def test_read_jsonl_keeps_the_asked_keys_and_splits_at_newlines_only(tmp_path):
    """finish() read every key of metrics.jsonl and every sample's prompt and response to draw a few curves and
    two floats a sample (+0.65 GB at the end of a 100k-step run; a sweep of long runs): ``keys`` keeps what
    is asked. A response holding U+2028 (written with ensure_ascii=False) was cut there by str.splitlines, and
    its row skipped as unreadable."""
    path = tmp_path / "samples.jsonl"
    rows = [{"kind": "sample", "step": 1, "response": "a\u2028b", "reward": 1.0, "pred_reward": 0.7},
            {"kind": "sample", "step": 2, "response": "c", "reward": 0.0, "pred_reward": 0.4},
            {"kind": "resume", "step": 1},
            {"kind": "sample", "step": 2, "response": "d\u2029", "reward": 1.0, "pred_reward": 0.6}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) + '{"kind": "sam', encoding="utf-8")
    assert [r["response"] for r in read_jsonl(path)] == ["a\u2028b", "d\u2029"]  # the redone step 2 once
    assert read_jsonl(path, keys=("reward", "pred_reward")) == [
        {"kind": "sample", "step": 1, "reward": 1.0, "pred_reward": 0.7},
        {"kind": "sample", "step": 2, "reward": 1.0, "pred_reward": 0.6}]
    assert len(read_jsonl(path, raw=True)) == 4


def test_read_jsonl_reads_a_hand_edited_file_without_crashing(tmp_path):
    """A resume marker without a step (or with a string one) and a record whose step is not a number, as a hand
    edit leaves them: read_jsonl had raised KeyError / TypeError (every reader of the run, the experiment report
    and the plots with it). Such a marker is skipped as an unreadable line; such a record is kept as written."""
    path = tmp_path / "metrics.jsonl"
    rows = [{"kind": "train", "step": 1}, {"kind": "train", "step": 2}, {"kind": "resume"},
            {"kind": "resume", "step": "1"}, {"kind": "note", "step": "x"}, {"kind": "resume", "step": 1},
            {"kind": "train", "step": 2, "redone": True}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_jsonl(path) == [{"kind": "train", "step": 1}, {"kind": "note", "step": "x"},
                                {"kind": "train", "step": 2, "redone": True}]


def test_a_run_killed_while_writing_its_config_leaves_a_folder_a_new_run_takes(tmp_path, capsys, cache):
    """SIGKILL (or the OOM killer) while ``config.yaml`` was written left ``.config.yaml.tmp-PID`` beside the
    lock: the same command said "already exists: --resume", and --resume said "no config.yaml: run its command
    again" (kill sweep). A folder holding only the lock and temporaries of atomic writes is now empty to a new
    run, which removes them; anything else in it still refuses."""
    from pacs_fast.trainer.run_claim import check_new_run_dir

    run = tmp_path / "r1"
    run.mkdir()
    (run / ".run.lock").write_text("123\n")
    (run / ".config.yaml.tmp-123").write_text("algo:\n")
    check_new_run_dir(run)
    code, _, err = cli(TINY + ["train.steps=1", f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}",
                                 "train.run_name=r1"], capsys)
    assert code == 0, err
    assert (run / "config.yaml").is_file() and not list(run.glob(".*.tmp-*"))
    (tmp_path / "r2").mkdir()
    (tmp_path / "r2" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="already exists"):
        check_new_run_dir(tmp_path / "r2")


def test_a_resume_removes_every_temporary_a_killed_run_left(finished, tmp_path, capsys):
    """Kills between a checkpoint's rename and ``latest``, during the summary or a plot left
    ``checkpoints/.latest.tmp-PID``, ``.summary.json.tmp-PID``, ``plots/.curves.png.tmp-PID`` for good (only
    ``checkpoints/.tmp-*`` folders were removed). A resume, holding the run's lock, removes them all; the files
    they were written for stay."""
    run = copy_run(finished, tmp_path)
    (run / "plots").mkdir(exist_ok=True)
    left = [run / "checkpoints" / ".latest.tmp-4242", run / ".summary.json.tmp-4243",
            run / "plots" / ".curves.png.tmp-4244", run / "checkpoints" / "step_000004" / ".manifest.json.tmp-1"]
    for p in left:
        p.write_text("cut")
    (run / "checkpoints" / ".tmp-step_000006").mkdir()
    keep = [run / "summary.json", run / "checkpoints" / "latest", run / "config.yaml"]
    code, _, err = cli(["--resume", str(run)], capsys)
    assert code == 0, err
    assert not any(p.exists() for p in left) and not (run / "checkpoints" / ".tmp-step_000006").exists()
    assert all(p.is_file() for p in keep)


def test_the_asynchronous_layouts_roles_print_a_launch_wide_line_once(monkeypatch, capsys):
    """The asynchronous layout gives each role its own RANK / WORLD_SIZE (roles.py): the engine (launch rank 0) and
    the learner (launch rank 1, role rank 0) both printed 'stopped by SIGTERM', and a learner whose engine died
    (its role's WORLD_SIZE 1) raised gloo's traceback instead of the one line (kill sweep). The launch's rank and
    size are read now."""
    import signal

    from pacs_fast import train as tr

    monkeypatch.setattr(tr.time, "sleep", lambda s: None)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    for launch_rank, printed in (("1", False), ("0", True)):
        monkeypatch.setenv("PACS_FAST_LAUNCH_RANK", launch_rank)
        monkeypatch.setenv("PACS_FAST_LAUNCH_WORLD_SIZE", "2")
        with pytest.raises(SystemExit) as e:
            tr.stopped(signal.SIGTERM, Path("/nowhere"))
        assert e.value.code == 143 and ("stopped by SIGTERM" in capsys.readouterr().err) == printed
        with pytest.raises(SystemExit):
            tr.fail("a launch-wide stop", 2)
        assert ("error: a launch-wide stop" in capsys.readouterr().err) == printed
    assert tr.peer_lost(RuntimeError("[gloo] Connection reset by peer"))
    monkeypatch.delenv("PACS_FAST_LAUNCH_WORLD_SIZE")
    assert not tr.peer_lost(RuntimeError("[gloo] Connection reset by peer"))  # one process: no peer to lose


def test_a_resume_with_another_thread_count_says_so_and_keys_that_name_folders(finished, tmp_path, capsys):
    """train.threads was accepted on --resume without a word although on a CPU the later steps round otherwise
    (weights 1.2e-7 apart; kill sweep): the checkpoint records the run's count and a resume with another warns,
    naming it. warmup.cache_dir (entries keyed by content) may change; train.out_dir / train.run_name say that
    --resume names the folder, not 'it would not continue the same training'."""
    from pacs_fast.trainer.session import thread_change_warning

    run = copy_run(finished, tmp_path)
    recorded = json.loads((run / "checkpoints" / "step_000004" / "trainer_state.json").read_text())["torch_threads"]
    assert recorded >= 1
    other = 1 if recorded != 1 else 2
    code, out, err = cli(["--resume", str(run), "train.steps=5", f"train.threads={other}",
                          f"warmup.cache_dir={tmp_path / 'elsewhere'}"], capsys)
    assert code == 0, err
    want = thread_change_warning(recorded, other, "cpu")
    assert f"warning: {want}" in out + err and f"train.threads={recorded} continues it exactly" in want
    assert thread_change_warning(recorded, recorded, "cpu") is None and thread_change_warning(2, 1, "cuda") is None
    code, _, err = cli(["--resume", str(run), "train.run_name=other"], capsys)
    assert code == 2 and "train.run_name names the run folder, which --resume gives" in err
    code, _, err = cli(["--resume", str(run), f"train.out_dir={tmp_path / 'x'}"], capsys)
    assert code == 2 and "train.out_dir names the run folder, which --resume gives" in err
