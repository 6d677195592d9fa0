"""File and folder names as users give them (hostile sweep of 2026-12-07): spaces, NFC / NFD Unicode, shell-glob
characters (``[abc]``, ``*``, ``?``), ``#``, ``=`` and ``,``, a leading ``-``, ``~`` (HOME set to a temporary
folder), trailing slashes, symlinks and relative paths from another working directory, in the trainer
(``train.out_dir``, ``train.run_name``, ``data.dataset``, ``data.eval_dataset``, ``model.path``,
``warmup.cache_dir``, ``--resume``), the eval command (``--out``, ``--benchmarks``) and the experiment runner
(``--out``, an arm's name).

The promise checked (README): each such path either works (the run trains, writes its files where the README says,
and ``--resume`` given the run folder in another spelling continues it) or fails with one line naming the key, flag
or file before any model loads; nothing is overwritten.

Found and fixed (each test naming a BUG failed before its fix): a resume refused over its recorded ``train.out_dir``
(a file there now, or unwritable); a relative ``warmup.cache_dir`` recorded relative (a resume elsewhere warmed up
again); a glob under a folder whose name holds ``[`` matched nothing; ``run_name: 2024-01-01`` in a config file read as
a date; ``--benchmarks d/a,b.jsonl`` split at its comma; ``~`` left unexpanded in ``--resume``, ``--config``, eval's
``--out`` / ``--model`` and the experiment's ``--out`` (the runner wrote into ``./~``, its runs into HOME, and reported
them failed); ``--resume`` of a file inside a run said "no such run folder"; the ``--resume`` commands the messages
suggest are quoted for a shell; a symbolic link to nothing as the run folder (or above it) said "File exists";
``--resume -x`` (argparse takes ``-x`` for an option) printed argparse's usage dump in the trainer and the runner.

Two tiny runs are trained once for the module (the built-in model with its warm-up cache, and a saved tiny model on
JSONL files); the tests copy them.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import unicodedata
from pathlib import Path

import pytest
import yaml

from pacs_fast.trainer.metrics import read_jsonl

from conftest import copy_as_killed_in_checkpoint
from test_run_safety import cli
from test_train import TINY

NFD = unicodedata.normalize("NFD", "café")
HOSTILE = "[x]*?#,=é"  # glob characters, a comment sign, the override parser's '=' and a list's ','
STEPS = ["train.steps=2", "train.eval_every=2", "train.save_every=1", "train.keep_checkpoints=2", "train.plots=false"]
NAME_A = "r #1,=é [a]*?"  # run A's train.run_name (NFC)
NAME_B = f"{NFD}=1,#2"  # run B's train.run_name (NFD)


def _files(folder: Path) -> dict:
    """Every file under ``folder`` with its bytes (what 'nothing was changed' compares)."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_error_line(code, err, *needles):
    assert code == 2 and "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def no_model(monkeypatch):
    """Fails the test if a learner or an engine is built (a refusal must come before any model loads)."""
    import pacs_fast.trainer.session as session

    def refuse(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(session, "build_learner", refuse)
    monkeypatch.setattr(session, "build_engine", refuse)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The module's folder, itself named with every hostile character (a parent folder is part of each path)."""
    path = tmp_path_factory.mktemp("hostile_paths") / f"root {HOSTILE}"
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def run_a(root, warm_cache):
    """The built-in tiny model, 2 steps: ``train.out_dir=~/runs [1]*?é`` (HOME a folder of the module's), a run
    name with ``#``, ``,``, ``=``, ``é`` and glob characters, and a relative ``warmup.cache_dir`` holding glob
    characters (a copy of the session's warm-up cache, so nothing is built again). Returns ``(home, cwd, run)``."""
    home, cwd = root / "home a", root / "cwd a"
    home.mkdir()
    cwd.mkdir()
    shutil.copytree(warm_cache, cwd / "cache [c]*?")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.chdir(cwd)
        from pacs_fast.train import main
        main(TINY + STEPS + ["warmup.cache_dir=cache [c]*?", "train.out_dir=~/runs [1]*?é",
                             f"train.run_name={NAME_A}"])
    return home, cwd, home / "runs [1]*?é" / NAME_A


def _rows(n, start=0):
    return "".join(json.dumps({"problem": f"What is {i}+{i % 3}?", "answer": str(i + i % 3)}) + "\n"
                   for i in range(start, start + n))


@pytest.fixture(scope="module")
def run_b(root):
    """A saved tiny model folder (``~/models/tiny m [v2]*?#=,é``, given through a relative symlink with a trailing
    slash), a training file whose name is a glob matching a sibling file of garbage (``tr[ab]*?#, =é.jsonl`` and
    ``trax#, =é.jsonl``), a held-out file given with ``~``, a relative ``train.out_dir`` with a space and an NFD run
    name holding ``=``, ``,`` and ``#``: 2 steps. Returns ``(home, cwd, run, model)``."""
    from pacs_fast.data.tiny import make_tiny_model

    home, cwd = root / "home b", root / "cwd b"
    (cwd / "data").mkdir(parents=True)
    model = make_tiny_model(home / "models" / "tiny m [v2]*?#=,é", seed=0, hidden_size=64, num_layers=1,
                            num_heads=2, num_kv_heads=1, intermediate_size=128)
    (cwd / "model link").symlink_to(model)
    (cwd / "data" / "tr[ab]*?#, =é.jsonl").write_text(_rows(40))
    (cwd / "data" / "trax#, =é.jsonl").write_text("not json: read only if the name were taken as a glob\n")
    (home / "held out [1].jsonl").write_text(_rows(8, start=100))
    args = [a for a in TINY if not a.startswith(("data.arith", "warmup.", "model.tiny"))]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.chdir(cwd)
        from pacs_fast.train import main
        main(args + STEPS + ["model.path=model link/", "data.dataset=data/tr[ab]*?#, =é.jsonl",
                             "data.eval_dataset=~/held out [1].jsonl", "train.out_dir=out dir",
                             f"train.run_name={NAME_B}", "train.tensorboard=false"])
    return home, cwd, cwd / "out dir" / NAME_B, model


# ----------------------------------------------------------------------------------------------------- trainer
def test_hostile_names_train_where_the_readme_says(run_a, run_b):
    home, cwd, run = run_a
    for f in ("config.yaml", "metrics.jsonl", "samples.jsonl", "summary.json",
              "checkpoints/step_000002/model.safetensors"):
        assert (run / f).is_file(), f
    assert any((run / "tb").iterdir())
    assert not (cwd / "~").exists() and sorted(p.name for p in cwd.iterdir()) == ["cache [c]*?"]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["train"]["run_name"] == NAME_A
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl") if "eval/acc" in r] == [0, 2]

    home, cwd, run, model = run_b
    assert run.name == NAME_B and (run / "summary.json").is_file()  # (the NFD spelling, byte for byte)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    # the files are recorded whole (config.yaml names them wherever --resume runs from), a glob-named file as a file
    assert saved["model"]["path"] == str(cwd / "model link")
    assert saved["data"]["dataset"] == str(cwd / "data" / "tr[ab]*?#, =é.jsonl")
    assert saved["data"]["eval_dataset"] == str(home / "held out [1].jsonl")
    assert not (cwd / "~").exists()
    prompts = {r["prompt"] for r in read_jsonl(run / "samples.jsonl")}
    assert prompts and all("What is" in p for p in prompts)


def test_a_finished_run_is_found_by_every_spelling_of_its_folder(run_a, run_b, root, monkeypatch, capsys):
    home, _, run = run_a
    monkeypatch.setenv("HOME", str(home))
    elsewhere = root / "elsewhere [e]"
    elsewhere.mkdir(exist_ok=True)
    monkeypatch.chdir(elsewhere)
    links = root / "links"
    links.mkdir(exist_ok=True)
    if not (links / "run").exists():
        (links / "run").symlink_to(run)
        (links / "out").symlink_to(run.parent)
    before = _files(run)
    forms = [os.path.relpath(run), os.path.relpath(run) + "/", str(links / "run"), str(links / "run") + "/",
             os.path.relpath(links / "out" / NAME_A), str(run / "checkpoints" / "..")]
    for form in forms:
        code, out, err = cli(["--resume", form], capsys)
        assert code == 0 and "has finished its 2 steps" in out and "nothing was changed" in out, (form, out, err)
    assert _files(run) == before

    home, _, run, _ = run_b  # (its files are recorded whole: found from here, under another HOME)
    before = _files(run)
    code, out, err = cli(["--resume", os.path.relpath(run) + "/"], capsys)
    assert code == 0 and "has finished its 2 steps" in out, err
    assert _files(run) == before


def test_a_killed_run_resumes_through_a_symlink_with_a_trailing_slash_from_another_folder(run_a, root, tmp_path,
                                                                                        monkeypatch, capsys):
    home, cwd, run = run_a
    monkeypatch.setenv("HOME", str(home))
    killed = copy_as_killed_in_checkpoint(run, tmp_path / f"copies {HOSTILE}" / NAME_A, step=2)
    (tmp_path / "link").symlink_to(killed)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    original = _files(run)
    code, out, err = cli(["--resume", "../link/", f"warmup.cache_dir={cwd / 'cache [c]*?'}"], capsys)
    assert code == 0, err
    assert "resumed from" in out and (killed / "summary.json").is_file()
    steps = [r["step"] for r in read_jsonl(killed / "metrics.jsonl")]
    assert steps[-1] == 2 and (killed / "checkpoints" / "step_000002").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copies " + HOSTILE, "cwd", "link"]
    assert not any((tmp_path / "cwd").iterdir())
    assert _files(run) == original


def test_a_moved_run_resumes_in_its_new_place_and_does_not_recreate_the_old_one(run_a, tmp_path, monkeypatch,
                                                                               capsys):
    """config.yaml's ``train.out_dir`` (``~/runs [1]*?é``) names the old place: under another HOME (a run moved to
    another machine or account) the resume writes into the folder given, and makes nothing at the old place."""
    _, cwd, run = run_a
    new_home = tmp_path / "new home"
    new_home.mkdir()
    monkeypatch.setenv("HOME", str(new_home))
    monkeypatch.chdir(tmp_path)
    moved = copy_as_killed_in_checkpoint(run, tmp_path / f"moved {HOSTILE}" / NAME_A, step=2)
    code, out, err = cli(["--resume", str(moved), f"warmup.cache_dir={cwd / 'cache [c]*?'}"], capsys)
    assert code == 0, err
    assert (moved / "summary.json").is_file() and (moved / "checkpoints" / "step_000002").is_dir()
    assert not (new_home / "runs [1]*?é").exists()  # (the recorded out_dir was not made again)
    assert yaml.safe_load((moved / "config.yaml").read_text())["train"]["run_name"] == NAME_A


def test_a_resume_does_not_refuse_the_recorded_out_dir(run_b, root, tmp_path, monkeypatch, capsys):
    """BUG (found 2026-12-07): ``--resume`` validated the recorded ``train.out_dir`` as a new run's, against the
    current folder: a run started with the default relative ``train.out_dir=runs`` and resumed from a folder where
    ``runs`` is a file (or, for a non-root user, from a read-only folder; or a run moved to a machine where the
    recorded absolute out_dir cannot be written) was refused - "train.out_dir 'out dir' cannot be created: ... (from
    config.yaml, which an earlier pacs_fast accepted; a resume cannot change it: start a new run ...)" - though a
    resume writes only into the folder ``--resume`` names, and ``train.out_dir`` cannot be given to a resume."""
    _, _, run, _ = run_b
    moved = copy_as_killed_in_checkpoint(run, tmp_path / f"moved {HOSTILE}" / NAME_B, step=2)
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "out dir").write_text("a file where the recorded relative train.out_dir points\n")
    monkeypatch.chdir(tmp_path / "cwd")
    code, out, err = cli(["--resume", os.path.relpath(moved)], capsys)
    assert code == 0, err
    assert (moved / "summary.json").is_file() and (moved / "checkpoints" / "step_000002").is_dir()
    assert (tmp_path / "cwd" / "out dir").is_file()


def test_a_relative_warmup_cache_dir_is_recorded_whole(run_a, tmp_path, monkeypatch, capsys):
    """BUG (found 2026-12-07): a relative ``warmup.cache_dir`` stayed relative in config.yaml (the files of
    ``model.path`` / ``data.*`` are recorded whole), so ``--resume`` from another folder warmed the tiny model up
    again into a new ``<that folder>/<cache_dir>`` (20-30 s of the README's main job, and a stray folder)."""
    home, cwd, run = run_a
    assert Path(yaml.safe_load((run / "config.yaml").read_text())["warmup"]["cache_dir"]) == cwd / "cache [c]*?"
    monkeypatch.setenv("HOME", str(home))
    killed = copy_as_killed_in_checkpoint(run, tmp_path / "killed" / NAME_A, step=2)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, out, err = cli(["--resume", str(killed)], capsys)
    assert code == 0, err
    assert not any((tmp_path / "elsewhere").iterdir()) and "supervised warm-up" not in out


def test_resume_of_a_path_inside_a_run_names_the_run(run_a, tmp_path, monkeypatch, capsys, no_model):
    """A file of the run, its checkpoints folder, a checkpoint (with a trailing slash, or through a symlink):
    one line naming the run folder to resume, nothing changed.

    BUG (UX, found 2026-12-07): a file inside the run (``config.yaml``, ``metrics.jsonl``, ``checkpoints/latest``)
    said "no such run folder", and ``RUN/checkpoints`` said "(is it a run folder? a run stopped before its setup
    finished has none: run its command again)": neither named the run, and the second advised starting over."""
    from pacs_fast.trainer.run_folder import resume_command

    home, _, run = run_a
    monkeypatch.setenv("HOME", str(home))
    before = _files(run)
    link = tmp_path / "link to step 1"
    link.symlink_to(run / "checkpoints" / "step_000001")
    for inside in (run / "config.yaml", run / "metrics.jsonl", run / "checkpoints" / "latest",
                   run / "checkpoints", str(run / "checkpoints" / "step_000002") + "/", link):
        code, out, err = cli(["--resume", str(inside)], capsys)
        line = _one_error_line(code, err).replace(f"--resume {str(inside).rstrip('/')}", "", 1)
        assert resume_command(run) in line, (inside, line)  # (the run to resume, quoted, beside the path given)
    assert _files(run) == before


def test_tilde_in_resume_and_config_is_the_home_folder(run_a, tmp_path, monkeypatch, capsys, no_model):
    """BUG (found 2026-12-07): every path key expands ``~`` (``train.out_dir=~/runs``, ``model.path``, the data
    files), but ``--resume ~/runs/NAME`` and ``--config ~/c.yaml`` as a program receives them (``--resume=~/...``:
    the shell expands only a word's leading ``~``; or quoted, from a script or a launcher) were "no such run folder"
    and "config file '~/c.yaml' does not exist"."""
    home, _, run = run_a
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(["--resume", f"~/runs [1]*?é/{NAME_A}"], capsys)
    assert code == 0 and "has finished its 2 steps" in out, err
    (home / "c [1].yaml").write_text("train:\n  run_name: ../escape\n")  # (read: its bad value is the error)
    code, out, err = cli(["--config", "~/c [1].yaml"], capsys)
    _one_error_line(code, err, "train.run_name '../escape'")
    assert not any(tmp_path.iterdir())
    (home / "bare.yaml").write_text("train:\n  out_dir: ~\n")  # (YAML's null: the line says to quote it)
    code, out, err = cli(["--config", "~/bare.yaml"], capsys)
    _one_error_line(code, err, "train.out_dir is empty", "in a YAML file a bare ~ is null: write '~' or '~/runs' in "
                    "quotes")


def test_tilde_paths_in_the_config_are_the_home_folder_and_recorded_whole(run_b, tmp_path, monkeypatch):
    from pacs_fast.config import load_config, validate
    from pacs_fast.config.dataset_files import dataset_files
    from pacs_fast.config.paths import warmup_cache_root
    from pacs_fast.trainer.run_claim import claim_run_dir
    from pacs_fast.trainer.run_folder import record_absolute_paths

    home = tmp_path / f"home {HOSTILE}"
    (home / "data").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    (home / "model [v2]").symlink_to(run_b[3])
    (home / "data" / "tr[ab].jsonl").write_text(_rows(20))
    (home / "data" / "tra.jsonl").write_text("not json\n")  # (the glob tr[ab].jsonl would match it)
    (home / "data" / "held.jsonl").write_text(_rows(8, start=100))
    cfg = load_config(None, ["model.path=~/model [v2]/", "data.dataset=~/data/tr[ab].jsonl",
                             "data.eval_dataset=~/data/*eld.jsonl", "train.out_dir=~/runs", "train.run_name=r",
                             "warmup.cache_dir=~/cache [c]"])
    validate(cfg)
    record_absolute_paths(cfg)
    assert cfg.model.path == str(home / "model [v2]") and cfg.data.dataset == str(home / "data" / "tr[ab].jsonl")
    assert claim_run_dir(cfg) == home / "runs" / "r" and warmup_cache_root(cfg) == home / "cache [c]"
    # (the held-out glob is recorded whole, the home folder's own glob characters escaped)
    assert dataset_files(cfg.data.eval_dataset) == [home / "data" / "held.jsonl"]
    assert dataset_files(cfg.data.dataset) == [home / "data" / "tr[ab].jsonl"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [home.name]


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", ".", "x/..", ".hidden", "an existing file"])
def test_run_names_that_leave_out_dir_or_name_a_file_are_one_line_before_the_model(name, tmp_path, capsys,
                                                                                  warm_cache, no_model):
    out = tmp_path / "out"
    out.mkdir()
    (out / "an existing file").write_text("x")
    code, _, err = cli(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={out}", f"train.run_name={name}"],
                       capsys)
    _one_error_line(code, err, "train.run_name" if name != "an existing file" else "is a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["an existing file"]


@pytest.mark.parametrize("out_dir, name", [("out dir", f"a b #1 {HOSTILE}"), (".", "-x")])
def test_the_resume_command_a_refusal_gives_can_be_pasted(out_dir, name, tmp_path, monkeypatch, capsys, warm_cache,
                                                         no_model):
    """BUG (UX, found 2026-12-07): the command the trainer gives (``continue it with `--resume RUN```, and the
    stop / full-disk lines) wrote the folder unquoted: pasted into a shell, ``runs/a b #1`` resumed ``runs/a`` with
    an override ``b`` (the ``#`` starts a comment), and with ``train.out_dir=.`` a run named ``-x`` got
    ``--resume -x``, which argparse refuses (a usage dump) as a missing argument."""
    import shlex

    from pacs_fast.train import parse_args

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / out_dir / name
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("")
    code, _, err = cli(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={out_dir}", f"train.run_name={name}"],
                       capsys)
    line = _one_error_line(code, err, "already exists")
    command = re.search(r"`(--resume [^`]*)`", line).group(1)
    args = parse_args(shlex.split(command, comments=True))  # (as a shell hands it on)
    assert Path(args.resume).resolve() == folder.resolve() and not args.overrides, (command, args)


def test_a_symbolic_link_to_nothing_is_one_line_naming_it(run_b, tmp_path, monkeypatch, capsys, warm_cache,
                                                          no_model):
    """A run folder, ``train.out_dir``, ``--resume`` or eval's ``--out`` that is (or lies under) a symbolic link to
    a folder that does not exist: one line naming the link and its target, before any model; nothing is created
    (the target neither). An automatic run name passes such a link by.

    BUG (UX, found 2026-12-07; fixed 2026-12-07): the trainer and eval said "cannot be written (File exists)", which
    names neither the link nor its target, and ``--resume`` said "no such run folder"."""
    from pacs_fast import eval as ev
    from pacs_fast.config import load_config, validate
    from pacs_fast.trainer.run_claim import claim_run_dir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "gone").symlink_to(tmp_path / "nowhere" / "run")
    (tmp_path / "outs").symlink_to("missing disk")
    base = TINY + [f"warmup.cache_dir={warm_cache}"]
    for args, link, target in (
            (base + ["train.out_dir=out", "train.run_name=gone"], tmp_path / "out" / "gone",
             tmp_path / "nowhere" / "run"),
            (base + ["train.out_dir=outs", "train.run_name=r"], tmp_path / "outs", "missing disk"),
            (base + [f"train.out_dir={tmp_path / 'outs' / 'deeper'}"], tmp_path / "outs", "missing disk"),
            (["--resume", "out/gone"], tmp_path / "out" / "gone", tmp_path / "nowhere" / "run")):
        code, _, err = cli(args, capsys)
        _one_error_line(code, err, f"{str(link)!r} is a symbolic link to {str(target)!r}, which does not exist")
    code = ev.main(_eval_args(run_b[3], str(_toy(tmp_path / "d" / "b.jsonl", 2)), tmp_path / "outs" / "e"))
    assert code == 2
    _one_error_line(code, capsys.readouterr().err, "--out", f"{str(tmp_path / 'outs')!r} is a symbolic link to")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "out", "outs"]
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["gone"] and not (tmp_path / "missing disk").exists()
    import types

    import pacs_fast.trainer.run_claim as run_claim

    monkeypatch.setattr(run_claim, "time", types.SimpleNamespace(strftime=lambda fmt: "20260101-000000"))
    cfg = load_config(None, ["train.out_dir=out"])
    validate(cfg)
    (tmp_path / "out" / "pacs-20260101-000000").symlink_to("nothing")
    assert claim_run_dir(cfg).name == "pacs-20260101-000000-2"


@pytest.mark.parametrize("command, argv, flag", [
    ("train", ["--resume", "-x"], "--resume"), ("train", ["--config"], "--config"),
    ("experiment", ["--out", "-x", "--arms", "pacs"], "--out"), ("eval", ["--out", "-x"], "--out")])
def test_a_flag_given_a_value_that_starts_with_a_dash_is_one_line_saying_how(command, argv, flag, tmp_path,
                                                                             monkeypatch, capsys, no_model):
    """``--resume -x`` (a run folder named ``-x``, as the trainer may name one): argparse takes ``-x`` for an option.
    One line, exit 2, naming the flag and the way to write it, and the way works.

    BUG (UX, found 2026-12-07; fixed 2026-12-07): the trainer and the experiment runner printed argparse's usage
    dump (several lines) and no way out; eval's line gave none either."""
    import importlib

    monkeypatch.chdir(tmp_path)
    module = importlib.import_module(f"pacs_fast.{command}")
    code = 0
    try:
        code = module.main(argv)
    except SystemExit as e:
        code = e.code
    line = _one_error_line(code, capsys.readouterr().err, f"argument {flag}: expected one argument")
    assert f"write {flag}=VALUE, or ./-name for a path" in line and f"python -m pacs_fast.{command} --help" in line
    if flag == "--resume":
        from pacs_fast.train import parse_args

        assert parse_args(["--resume=-x"]).resume == "-x"  # (the way the line gives)
    assert sorted(tmp_path.iterdir()) == []


def test_an_empty_run_name_and_a_leading_dash_stay_inside_out_dir(tmp_path):
    from pacs_fast.config import load_config, validate
    from pacs_fast.trainer.run_claim import claim_run_dir

    for given, pattern in (("", r"pacs-\d{8}-\d{6}"), ("-x", "-x"), ("~", "~"), ("*", r"\*")):
        cfg = load_config(None, [f"train.out_dir={tmp_path}", f"train.run_name={given}"])
        validate(cfg)
        run_dir = claim_run_dir(cfg)
        assert run_dir.parent == tmp_path and re.fullmatch(pattern, run_dir.name), (given, run_dir)


def test_run_names_that_differ_in_unicode_form_or_case_are_separate_and_nothing_is_overwritten(run_b, capsys,
                                                                                              warm_cache, no_model):
    """Linux keeps NFC and NFD spellings as two names: a run named in the other form (or another case) is a run
    folder of its own, the existing run is untouched; the same spelling is refused (README), and ``--resume`` in the
    other form is one line."""
    from pacs_fast.config import load_config, validate
    from pacs_fast.trainer.run_claim import claim_run_dir

    _, cwd, run, _ = run_b
    before = _files(run)
    out = run.parent
    for other in (unicodedata.normalize("NFC", NAME_B), NAME_B.upper()):
        cfg = load_config(None, [f"train.out_dir={out}", f"train.run_name={other}"])
        validate(cfg)
        claimed = claim_run_dir(cfg)
        assert claimed != run and claimed.name == other and not claimed.exists()
    code, _, err = cli(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={out}", f"train.run_name={NAME_B}"],
                       capsys)
    _one_error_line(code, err, "already exists", "--resume")
    code, _, err = cli(["--resume", str(out / unicodedata.normalize("NFC", NAME_B))], capsys)
    _one_error_line(code, err, "no such run folder")
    assert _files(run) == before and sorted(p.name for p in out.iterdir()) == [NAME_B]


@pytest.mark.parametrize("key", ["data.dataset", "data.eval_dataset", "model.path"])
def test_a_path_in_the_other_unicode_form_is_one_line_naming_the_key(run_b, key, capsys, no_model, tmp_path):
    home, cwd, _, model = run_b
    files = {"data.dataset": cwd / "data" / "tr[ab]*?#, =é.jsonl", "data.eval_dataset": home / "held out [1].jsonl",
             "model.path": model}
    args = [f"model.path={model}", f"data.dataset={files['data.dataset']}"]
    args.append(f"{key}={unicodedata.normalize('NFD', str(files[key]))}")  # (é: the same name, spelt decomposed)
    code, _, err = cli([a for a in TINY if not a.startswith(("data.arith", "warmup.", "model.tiny"))] + args
                       + [f"train.out_dir={tmp_path}", "train.run_name=r"], capsys)
    _one_error_line(code, err, key)
    assert not any(tmp_path.iterdir())


def test_a_glob_under_a_folder_whose_name_holds_brackets(tmp_path, run_b):
    """BUG (found 2026-12-07): a glob whose folder part holds ``[`` (``/data/ds [v2]/data/train-*.jsonl``) matched
    nothing (``[v2]`` read as a character class): "neither a shipped dataset ... nor an existing file, folder or
    glob". The same glob typed relative from inside ``ds [v2]/`` worked (its working directory is escaped), and the
    refusal of the folder as a whole suggests exactly that absolute glob, which then failed."""
    from pacs_fast.config import load_config, validate
    from pacs_fast.config.dataset_files import dataset_files

    _, _, _, model = run_b
    data = tmp_path / "ds [v2]" / "data"
    data.mkdir(parents=True)
    (data / "train-00000-of-00001.jsonl").write_text(_rows(20))
    (data / "test-00000-of-00001.jsonl").write_text(_rows(8, start=100))
    with pytest.raises(ValueError, match="several splits") as refused:
        validate(load_config(None, [f"data.dataset={data}", f"model.path={model}"]))
    suggested = re.search(r"give one split's files: '([^']+)'", str(refused.value)).group(1)
    assert suggested == str(data / "test*.jsonl") or suggested == str(data / "train*.jsonl"), suggested
    for spec in (suggested, str(data / "train-*.jsonl"), str(tmp_path / "ds [v2]" / "*" / "train-*")):
        validate(load_config(None, [f"data.dataset={spec}", f"model.path={model}"]))
        assert len(dataset_files(spec)) == 1, spec


def test_a_date_named_run_in_a_config_file(tmp_path):
    """BUG (found 2026-12-07): ``run_name: 2024-01-01`` in a YAML config (a run named by its date) was refused,
    "config key 'train.run_name' expects str, got datetime.date(2024, 1, 1)", while the same override
    (``train.run_name=2024-01-01``) was the name, and ``run_name: 040`` keeps its text in a file."""
    from pacs_fast.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("train:\n  run_name: 2024-01-01\n  out_dir: runs/2024-01-01 10:00\n"
                    "data:\n  eval_dataset: 2024-12-07\n")
    cfg = load_config(path)
    assert cfg.train.run_name == "2024-01-01" and cfg.data.eval_dataset == "2024-12-07"
    assert cfg.train.out_dir == "runs/2024-01-01 10:00"
    assert load_config(None, ["train.run_name=2024-01-01"]).train.run_name == "2024-01-01"


# -------------------------------------------------------------------------------------------------------- eval
def _eval_args(model, bench, out, *extra):
    return ["--model", str(model), "--benchmarks", bench, "--n", "2", "--max-tokens", "4", "--engine", "hf",
            "--out", str(out), "--no-progress", "--samples-per-call", "2", "--scorer-workers", "1", *extra]


def _toy(path, n):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": f"q{i}", "problem": f"{i}+{i}=", "answer": str(2 * i)}) + "\n"
                            for i in range(n)))
    return path


def test_eval_out_and_a_benchmark_named_like_a_glob(run_b, tmp_path, capsys):
    """``--out`` with spaces, glob characters, ``#``, ``,``, ``=`` and NFD; a benchmark file ``h[1].jsonl`` beside
    ``h1.jsonl`` (which its name, as a glob, matches): the file itself is read, and the same command resumes."""
    from pacs_fast import eval as ev
    from pacs_fast.evaluation.results import read_samples

    model = run_b[3]
    bench = _toy(tmp_path / "d" / "h[1].jsonl", 4)
    _toy(tmp_path / "d" / "h1.jsonl", 3)
    out = tmp_path / f"eval out {HOSTILE} {NFD}"
    assert ev.main(_eval_args(model, str(bench), out)) == 0, capsys.readouterr().err
    samples = out / "samples_h[1].jsonl"
    assert len(read_samples(samples)) == 4
    before = samples.read_bytes()
    assert ev.main(_eval_args(model, str(bench), out)) == 0  # (resumed: nothing sampled again)
    assert samples.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", out.name]


def test_eval_benchmarks_naming_a_file_with_a_comma(run_b, tmp_path, capsys):
    """BUG (found 2026-12-07): ``--benchmarks`` is split on commas, so an existing file ``d/a,b.jsonl`` was taken as
    ``d/a`` and ``b.jsonl``: "--benchmarks .../d/a: no such dataset file, folder or glob", which names neither the
    file nor the comma (and a comma cannot be escaped). It must work, or be one line naming the file and the
    comma."""
    from pacs_fast import eval as ev

    bench = _toy(tmp_path / "d" / "a,b.jsonl", 4)
    code = ev.main(_eval_args(run_b[3], str(bench), tmp_path / "out"))
    err = capsys.readouterr().err
    if code == 0:
        assert (tmp_path / "out" / "samples_a,b.jsonl").is_file()
    else:
        line = _one_error_line(code, err)
        assert "a,b.jsonl" in line and "comma" in line, line


def test_eval_benchmarks_glob_under_a_folder_whose_name_holds_brackets(run_b, tmp_path, capsys):
    """BUG (found 2026-12-07), as the trainer's ``data.dataset``: ``--benchmarks '/x/aime [v2]/data/test-*.jsonl'``
    was "no such dataset file, folder or glob"."""
    from pacs_fast import eval as ev

    _toy(tmp_path / "aime [v2]" / "data" / "test-00000-of-00001.jsonl", 3)
    code = ev.main(_eval_args(run_b[3], str(tmp_path / "aime [v2]" / "data" / "test-*.jsonl"), tmp_path / "out"))
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "samples_aime [v2].jsonl").is_file()


def test_eval_out_with_a_tilde_is_the_home_folder(run_b, tmp_path, monkeypatch, capsys):
    """BUG (found 2026-12-07): ``--out ~/evals`` as the program receives it (``--out=~/evals``: the shell leaves that
    ``~``) wrote into a folder named ``~`` in the working directory (``rm -rf ~`` is how one removes such a folder),
    while ``--benchmarks`` expands ``~``; and ``--model ~/m`` passed the model folder's check (which expands it),
    then failed to load from the hub ("Repo id must use alphanumeric chars ... '~/m'")."""
    from pacs_fast import eval as ev

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    bench = _toy(home / "toy.jsonl", 3)
    (home / "m [1]").symlink_to(run_b[3])
    assert ev.main(_eval_args("~/m [1]", "~/toy.jsonl", "~/evals")) == 0, capsys.readouterr().err
    assert (home / "evals" / "samples_toy.jsonl").is_file() and bench.is_file()
    # eval compare's paths alike (its --out, --table and results were taken as written)
    assert ev.main(["compare", "~/evals", "--out", "~/plot.png", "--table", "~/t.md"]) == 0, capsys.readouterr().err
    assert (home / "plot.png").is_file() and (home / "t.md").is_file()
    assert not any((tmp_path / "cwd").iterdir())


# -------------------------------------------------------------------------------------------------- experiment
ARM = "café-x²_1"  # an arm name with a non-ASCII letter, a superscript digit, '-' and '_'


@pytest.fixture(scope="module")
def experiment(root, warm_cache):
    """One arm x one seed of the experiment runner's tiny run into ``$HOME/exp out [x]*?#,=é`` (given whole; HOME a
    folder of the module's), from another working directory. Returns ``(home, out, common argv, exit status)``."""
    from pacs_fast import experiment as ex

    from test_experiment import TINY as EXP_TINY

    home = root / "home exp"
    home.mkdir()
    out = home / f"exp out {HOSTILE}"
    common = ["--arm", f"{ARM}:algo.name=grpo", "--seeds", "0", f"warmup.cache_dir={warm_cache}", *EXP_TINY]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.chdir(root)
        code = ex.main(["--out", str(out), *common])
    return home, out, common, code


def test_experiment_out_with_spaces_and_an_arm_with_odd_characters(experiment, root):
    from pacs_fast import experiment as ex

    home, out, _, code = experiment
    assert code == 0
    assert (out / "runs" / ARM / "seed0" / "summary.json").is_file()
    assert f"| {ARM} | 1 |" in (out / "results.md").read_text()
    assert set(json.loads((out / "results.json").read_text())["stats"]) == {ARM}
    assert not (root / "~").exists()
    # the NFD spelling of an arm's name is refused in one line, or is the same arm (never a second folder)
    try:
        arm = ex.parse_arm(unicodedata.normalize("NFD", ARM) + ":algo.name=grpo")
    except ValueError as e:
        assert "\n" not in str(e) and "name" in str(e)
    else:
        assert arm.name == ARM


def test_experiment_out_with_a_tilde_is_the_home_folder(experiment, tmp_path, monkeypatch, capsys):
    """BUG (found 2026-12-07): ``--out ~/exp`` as the program receives it: the runner kept its lock, ``spec.json``,
    logs and tables in ``./~/exp`` while every run (``train.out_dir=~/exp/runs/ARM``, which the trainer expands)
    trained in ``$HOME/exp``; it then found no run where it looked and reported the finished run as "FAILED (exit 0)",
    exit status 1 - and a rerun started the runs again, which the trainer refused (their folders exist)."""
    from pacs_fast import experiment as ex

    home, out, common, code = experiment
    assert code == 0
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    tilde = "~/" + out.name
    results = (out / "results.md").read_text()
    assert ex.main(["--out", tilde, "--report"]) == 0, capsys.readouterr().err
    assert (out / "results.md").read_text() == results
    assert ex.main(["--out", tilde, *common]) == 0, capsys.readouterr().err
    assert "1 already done, 0 finished now, 0 failed" in capsys.readouterr().out
    assert not any(tmp_path.iterdir())
    from pacs_fast.experiment_args import parse_args  # (--config alike: it was taken as written)

    assert parse_args(["--out", tilde, "--config", "~/c.yaml"]).config == str(home / "c.yaml")
