"""An eval folder as a whole (sweep of 2026-12-02): its results cover every benchmark sampled there, not only the
last command's; ``report`` never writes results that lose a benchmark; a hand-edited samples line or results file
is one line naming it (a bare KeyError or a pass@k of 150% had come out); samples without their settings file, or
made with another ``n``, are refused."""
import json
import shutil

import pytest

from pacs_fast import eval as ev

from test_eval_hostile import _args, _error, _toy, model_dir  # noqa: F401  (model_dir: a fixture)


@pytest.fixture(scope="module")
def two_commands(model_dir, tmp_path_factory):
    """One folder filled one benchmark per command: alpha (3 problems), then beta (2 problems)."""
    root = tmp_path_factory.mktemp("two")
    alpha, beta = _toy(root / "alpha.jsonl", n=3), _toy(root / "beta.jsonl", n=2)
    assert ev.main(_args(model_dir, alpha, root / "run")) == 0
    assert ev.main(_args(model_dir, beta, root / "run")) == 0
    return root / "run", alpha, beta


def _copy(two_commands, tmp_path):
    shutil.copytree(two_commands[0], tmp_path / "run")
    return tmp_path / "run"


def test_results_cover_every_benchmark_sampled_in_the_folder(two_commands, tmp_path, capsys):
    """The second command's results.json had held beta only: report and compare then left alpha out silently."""
    out = _copy(two_commands, tmp_path)
    res = json.loads((out / "results.json").read_text())
    assert list(res["benchmarks"]) == ["beta", "alpha"]  # this run's first
    assert res["benchmarks"]["alpha"]["num_problems"] == 3 and res["benchmarks"]["alpha"]["complete"] is True
    assert "alpha" in (out / "table.md").read_text()
    capsys.readouterr()
    assert ev.main(["report", "--out", str(out)]) == 0
    again = json.loads((out / "results.json").read_text())
    assert set(again["benchmarks"]) == {"alpha", "beta"} and again["benchmarks"]["alpha"]["complete"] is True
    assert "warning" not in capsys.readouterr().err


def test_a_benchmark_of_an_unfinished_run_is_kept_and_named(two_commands, model_dir, tmp_path, capsys):
    """A benchmark sampled by a run that wrote no results.json (interrupted) joins the results, with a warning."""
    out = _copy(two_commands, tmp_path)
    gamma = _toy(tmp_path / "gamma.jsonl", n=2)
    lines = (out / "samples_alpha.jsonl").read_text().splitlines(keepends=True)
    (out / "samples_gamma.jsonl").write_text(lines[0].replace('"benchmark": "alpha"', '"benchmark": "gamma"'))
    capsys.readouterr()
    assert ev.main(["report", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "gamma: the folder's results.json does not say how many problems its run asked for" in err, err
    assert json.loads((out / "results.json").read_text())["benchmarks"]["gamma"]["num_problems"] == 1
    # the run that completes it: its results say nothing more of it
    assert ev.main(_args(model_dir, gamma, out)) == 0
    err = capsys.readouterr().err
    assert "warning" not in err, err
    assert json.loads((out / "results.json").read_text())["benchmarks"]["gamma"]["complete"] is True


def test_report_refuses_to_lose_a_benchmark_whose_samples_are_gone(two_commands, tmp_path, capsys):
    out = _copy(two_commands, tmp_path)
    before = (out / "results.json").read_bytes()
    (out / "samples_alpha.jsonl").unlink()
    capsys.readouterr()
    assert ev.main(["report", "--out", str(out)]) == 2
    _error(capsys, "lists alpha, whose samples file is missing or empty", "delete results.json")
    assert (out / "results.json").read_bytes() == before


def test_a_hand_edited_samples_line_is_named(two_commands, tmp_path, capsys):
    out = _copy(two_commands, tmp_path)
    path = out / "samples_alpha.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    rec = json.loads(lines[1])
    for bad, needle in ((dict(rec, scores="1"), "scores must be a non-empty list"),
                        (dict(rec, index=-1), "index -1 is not an integer >= 0"),
                        ({k: v for k, v in rec.items() if k != "index"}, "index None"),
                        (dict(rec, n=5), "n 5 is not the number of its scores (2)"), ([1, 2], "a JSON list")):
        path.write_text(lines[0] + json.dumps(bad) + "\n" + lines[2])
        capsys.readouterr()
        assert ev.main(["report", "--out", str(out)]) == 2
        _error(capsys, f"{path}:2: not a samples record", needle)


def test_a_hand_edited_results_file_is_named(two_commands, tmp_path, capsys):
    out = _copy(two_commands, tmp_path)
    res = json.loads((out / "results.json").read_text())
    for edit, needle in ((lambda r: r["benchmarks"]["alpha"]["pass_at_k"].update({"1": 1.5}), "alpha.pass_at_k"),
                         (lambda r: r["benchmarks"]["beta"].pop("correct_counts"), "beta.correct_counts"),
                         (lambda r: r["benchmarks"]["beta"].update(n=0), "beta.n is not"),
                         (lambda r: r.update(settings=[]), "settings is not an object")):
        bad = json.loads(json.dumps(res))
        edit(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        capsys.readouterr()
        assert ev.main(["compare", str(tmp_path / "bad.json"), str(out), "--out", str(tmp_path / "p.png")]) == 2
        _error(capsys, "bad.json: not a pacs_fast results file as written", needle)
        assert not (tmp_path / "p.png").exists()


def test_samples_without_their_settings_file_are_refused(two_commands, model_dir, tmp_path, capsys):
    """A folder whose run_config.json was deleted: a run with other settings had appended to its samples."""
    out = _copy(two_commands, tmp_path)
    (out / "run_config.json").unlink()
    kept = (out / "samples_alpha.jsonl").read_bytes()
    capsys.readouterr()
    assert ev.main(_args(model_dir, two_commands[1], out, "--temperature", "1.0")) == 2
    _error(capsys, "holds samples (samples_alpha.jsonl, samples_beta.jsonl) but no run_config.json")
    assert ev.main(_args(model_dir, two_commands[1], out, "--overwrite")) == 2  # beta's would stay, unknown
    _error(capsys, "samples_beta.jsonl", "--overwrite deletes only")
    assert (out / "samples_alpha.jsonl").read_bytes() == kept
    (out / "samples_beta.jsonl").unlink()
    assert ev.main(_args(model_dir, two_commands[1], out, "--overwrite")) == 0


def test_samples_made_with_another_n_are_refused(two_commands, model_dir, tmp_path, capsys):
    """run_config.json without the benchmark's n (edited, or merged by hand): a run with --n 4 had resumed its
    n = 2 records, the results mixing two n."""
    out = _copy(two_commands, tmp_path)
    cfg = json.loads((out / "run_config.json").read_text())
    del cfg["n"]["alpha"]
    (out / "run_config.json").write_text(json.dumps(cfg))
    capsys.readouterr()
    assert ev.main(_args(model_dir, two_commands[1], out, "--n", "4")) == 2  # (the last --n counts)
    _error(capsys, "problem 0 was sampled with n = 2, not 4")


def test_a_lone_surrogate_is_refused_before_the_model_loads(model_dir, tmp_path, capsys, monkeypatch):
    data = tmp_path / "s.jsonl"
    data.write_text('{"problem": "1+1=", "answer": "2"}\n{"problem": "2+2=\\ud800", "answer": "4"}\n')
    monkeypatch.setattr(ev, "_generate", lambda *a, **k: pytest.fail("sampled"))
    assert ev.main(_args(model_dir, data, tmp_path / "run")) == 2
    _error(capsys, "s.jsonl:2: field 'problem' holds a lone surrogate")
    assert not list((tmp_path / "run").glob("samples_*"))


def test_another_dataset_of_the_same_name_is_named_as_such(two_commands, model_dir, tmp_path, capsys):
    """other/alpha.jsonl resumed into a folder sampled from alpha.jsonl: the error had called it "another version"
    of the new file and offered --overwrite (which deletes the first dataset's samples)."""
    out = _copy(two_commands, tmp_path)
    other = tmp_path / "other" / "alpha.jsonl"
    other.parent.mkdir()
    other.write_text(json.dumps({"id": "z", "problem": "5*5=", "answer": "25"}) + "\n")
    capsys.readouterr()
    assert ev.main(_args(model_dir, other, out)) == 2
    line = _error(capsys, f"samples_alpha.jsonl was sampled from {two_commands[1]}, not {other}",
                  "use another --out for this one")
    assert "--overwrite" not in line
    assert json.loads((out / "run_config.json").read_text())["sources"] == {"alpha": str(two_commands[1]),
                                                                           "beta": str(two_commands[2])}


def test_small_hostile_inputs_get_one_clear_line(two_commands, model_dir, tmp_path, capsys, monkeypatch):
    """Each had a wrong or garbled answer: the last of two --n for one benchmark counted; an empty label was
    drawn; --reward-fn verifier --reward-weights 1 was told to give --reward-fn ("names 1" in the trainer's);
    compare --out a folder ended in [Errno 21]; an unwritable --out spoke of checkpoints; .hidden.jsonl was
    filed under the benchmark "" (samples_.jsonl)."""
    out, alpha = two_commands[0], two_commands[1]
    monkeypatch.setattr(ev, "_generate", lambda *a: pytest.fail("sampled"))
    assert ev.main(_args(model_dir, alpha, tmp_path / "a", "--n", "alpha=2,alpha=4")) == 2
    _error(capsys, "--n names alpha twice")
    assert ev.main(["compare", str(out), str(out), "--out", str(tmp_path / "p.png"), "--labels", "a,"]) == 2
    _error(capsys, "--labels 'a,': label 2 is empty")
    assert ev.main(["compare", str(out), "--out", str(tmp_path / "p.png"), "--labels", ""]) == 2
    _error(capsys, "--labels '': label 1 is empty")
    for fn, needle in (("verifier", "--reward-fn names one, verifier: leave --reward-weights out"),
                       ("", "--reward-fn is empty (the math verifier alone)")):
        assert ev.main(_args(model_dir, alpha, tmp_path / "b", "--reward-fn", fn, "--reward-weights", "1")) == 2
        _error(capsys, "--reward-weights weighs the components of a list in --reward-fn", needle)
    assert ev.main(["compare", str(out), "--out", str(tmp_path)]) == 2
    _error(capsys, f"--out {tmp_path} is a folder: give the path of the file to write")
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert ev.main(_args(model_dir, alpha, blocker / "run")) == 2  # (a read-only folder is writable by root)
    _error(capsys, "cannot be written", "a run writes its lock, samples and results there")
    hidden = tmp_path / ".hidden.jsonl"
    hidden.write_bytes(alpha.read_bytes())
    monkeypatch.undo()
    assert ev.main(_args(model_dir, hidden, tmp_path / "c", "--limit", "1")) == 0
    assert [p.name for p in (tmp_path / "c").glob("samples_*")] == ["samples_hidden.jsonl"]


def test_another_benchmarks_bad_samples_file_is_named_before_sampling(two_commands, model_dir, tmp_path, capsys):
    """The results cover every benchmark sampled in --out, read at the run's end: a hand-edited record in another
    benchmark's file had failed the run after all of its sampling (hours at n = 512), its results.json not written
    and every rerun failing alike. An unreadable results.json (whose counts a --limit run set) is named too."""
    out = _copy(two_commands, tmp_path)
    path = out / "samples_alpha.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(json.dumps(dict(json.loads(lines[0]), scores=None)) + "\n" + "".join(lines[1:]))
    gamma = _toy(tmp_path / "gamma.jsonl", n=2)
    capsys.readouterr()
    assert ev.main(_args(model_dir, gamma, out)) == 2
    _error(capsys, f"{path}:1: not a samples record", "fix or move that file, or use another --out")
    assert not (out / "samples_gamma.jsonl").exists()  # (refused before the model loaded)
    path.write_text("".join(lines))
    (out / "results.json").write_text("{}")
    assert ev.main(_args(model_dir, gamma, out)) == 0
    assert "results.json: not a pacs_fast results file" in capsys.readouterr().err


def test_report_leaves_out_a_k_past_one_benchmarks_n_as_a_run_does(two_commands, model_dir, tmp_path, capsys):
    """alpha sampled at n = 2, then beta at n = 4 with --k 1,2,4 into the same --out: the run left pass@4 out for
    alpha, and report --k 1,4 then refused the folder (its k checked against the smallest n)."""
    out = _copy(two_commands, tmp_path)
    beta4 = _toy(tmp_path / "beta4.jsonl", n=2)
    capsys.readouterr()
    assert ev.main(_args(model_dir, beta4, out, "--n", "beta4=4", "--k", "1,2,4")) == 0
    assert ev.main(["report", "--out", str(out), "--k", "1,4"]) == 0
    err = capsys.readouterr().err
    assert "--k 4: pass@k past a benchmark's samples per problem is left out for beta (n = 2), alpha (n = 2)" in err
    res = json.loads((out / "results.json").read_text())["benchmarks"]
    assert set(res["beta4"]["pass_at_k"]) == {"1", "4"} and set(res["alpha"]["pass_at_k"]) == {"1"}
    assert ev.main(["report", "--out", str(out), "--k", "8"]) == 2
    _error(capsys, "--k 8 is larger than the 4 samples per problem of beta4")
