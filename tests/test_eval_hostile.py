"""``python -m pacs_fast.eval`` under hostile use (sweep of 2026-12-01): an ``--overwrite`` that fails its checks
loses no sample, ``compare`` never writes over its inputs, ``report`` says when a run did not finish and waits for
a live one, a gold answer that is an object is named, the verifier's flags are idle with ``--reward-fn``, a
folder of two datasets and repeated ids are named, and Ctrl-C / SIGTERM end with one line."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from pacs_fast import eval as ev
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.evaluation.results import read_samples
from pacs_fast.rollout.hf import HFEngine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


def _toy(path, n=4, **extra):
    rows = [{"id": f"q{i}", "problem": f"{i}+{i}=", "answer": str(2 * i), **extra} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _args(model_dir, data, out, *extra):
    return ["--model", str(model_dir), "--benchmarks", str(data), "--n", "2", "--max-tokens", "4", "--engine", "hf",
            "--out", str(out), "--no-progress", "--samples-per-call", "2", "--scorer-workers", "1", *extra]


@pytest.fixture(scope="module")
def finished(model_dir, tmp_path_factory):
    """A finished eval of 4 toy problems."""
    root = tmp_path_factory.mktemp("finished")
    data = _toy(root / "toy.jsonl")
    assert ev.main(_args(model_dir, data, root / "run")) == 0
    return root / "run", data


def _copy(finished, tmp_path):
    run, data = finished
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run", data


def _error(capsys, *needles):
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def test_an_overwrite_that_fails_its_checks_keeps_the_samples(finished, model_dir, tmp_path, capsys, monkeypatch):
    """--overwrite deleted the asked benchmarks' samples before the model folder (no weights) or a second
    benchmark's prompt length was checked: the run failed, and hours of samples were gone."""
    out, data = _copy(finished, tmp_path)
    kept = (out / "samples_toy.jsonl").read_bytes()
    settings = (out / "run_config.json").read_bytes()
    noweights = tmp_path / "noweights"
    shutil.copytree(model_dir, noweights, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    capsys.readouterr()
    args = _args(model_dir, data, out, "--overwrite")
    assert ev.main(["--model", str(noweights), *args[2:]]) == 2
    _error(capsys, f"--model {noweights} has no weights file (*.safetensors or *.bin)")
    # a second benchmark whose prompt does not fit: refused once the tokenizer loaded, before anything is deleted
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"id": "x", "problem": "1+" * 200 + "1=", "answer": "201"}) + "\n")
    monkeypatch.setattr(ev, "engine_context", lambda args, name, sizes: 150)
    assert ev.main(_args(model_dir, f"{data},{long}", out, "--overwrite")) == 2
    _error(capsys, "long: 1 of 1 prompts do not fit")
    assert (out / "samples_toy.jsonl").read_bytes() == kept and (out / "run_config.json").read_bytes() == settings
    # the engine failing to load: nothing deleted either; one that loads starts afresh
    monkeypatch.undo()

    def broken(*a, **kw):
        raise OSError("the engine could not load")

    monkeypatch.setattr(ev, "_make_engine", broken)
    assert ev.main(_args(model_dir, data, out, "--overwrite", "--seed", "3")) == 2
    assert (out / "samples_toy.jsonl").read_bytes() == kept and (out / "run_config.json").read_bytes() == settings
    monkeypatch.undo()
    assert ev.main(_args(model_dir, data, out, "--overwrite", "--seed", "3")) == 0
    assert json.loads((out / "run_config.json").read_text())["seed"] == 3
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0, 1, 2, 3]


def test_compare_never_writes_over_its_inputs(finished, tmp_path, capsys):
    out, _ = _copy(finished, tmp_path)
    before = (out / "results.json").read_bytes()
    capsys.readouterr()
    assert ev.main(["compare", str(out), str(out), "--out", str(tmp_path / "p.png"), "--table",
                    str(out / "results.json")]) == 2
    _error(capsys, f"--table {out / 'results.json'} is one of the results files compared")
    assert ev.main(["compare", str(out / "results.json"), "--out", str(out / "results.json")]) == 2
    _error(capsys, "--out", "is one of the results files compared")
    assert ev.main(["compare", str(out), "--out", str(tmp_path / "p.png"), "--table", str(tmp_path / "p.png")]) == 2
    _error(capsys, "the table would replace the plot")
    assert (out / "results.json").read_bytes() == before
    assert ev.main(["compare", str(out), "--out", str(tmp_path / "p.png"), "--table", str(tmp_path / "t.md")]) == 0


def test_report_names_an_unfinished_run_and_waits_for_a_live_one(finished, tmp_path, capsys):
    from pacs_fast.trainer.run_folder import RunLock

    out, _ = _copy(finished, tmp_path)
    lines = (out / "samples_toy.jsonl").read_text().splitlines(keepends=True)
    (out / "samples_toy.jsonl").write_text("".join(lines[:2]))  # a run stopped after 2 of its 4 problems ...
    capsys.readouterr()
    assert ev.main(["report", "--out", str(out)]) == 0  # ... with its results.json: the benchmark is short
    err = capsys.readouterr().err
    assert "toy: 2 of the 4 problems its run asked for are sampled (the run did not finish)" in err, err
    (out / "results.json").unlink()  # ... killed before its first results.json: report cannot know the count
    assert ev.main(["report", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"{out} has no results.json, which a finished run writes" in err and "(toy: 2)" in err, err
    assert ev.main(["report", "--out", str(out)]) == 0  # (a complete results.json with the counts: no warning)
    lock = RunLock(out, new=False, what="--out")  # an eval writing into it
    try:
        before = (out / "results.json").read_bytes()
        assert ev.main(["report", "--out", str(out)]) == 2
        _error(capsys, "is in use by another run", "report after it ends")
        assert (out / "results.json").read_bytes() == before
    finally:
        lock.release()
    assert ev.main(["report", "--out", str(out), "--k", "8"]) == 2
    err = _error(capsys, "--k 8 is larger than the 2 samples per problem of toy", "lower --k")
    assert "raise --n" not in err


def test_a_gold_answer_that_is_an_object_is_named(tmp_path, capsys):
    """verl's reward_model column read whole: the gold was the JSON text of the object, which \\boxed{<text>}
    matches, so the check passed and every response scored 0. The warning names the dotted field to read."""
    from pacs_fast.evaluation.args import load_benchmarks
    from pacs_fast.evaluation.parser import run_parser
    from pacs_fast.reward.gold_check import unmatchable_golds

    rows = [{"prompt": f"{i}+{i}=", "reward_model": {"ground_truth": str(2 * i), "style": "rule"}} for i in range(3)]
    data = tmp_path / "verl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = run_parser().parse_args(["--model", "m", "--problem-field", "prompt", "--answer-field", "reward_model"])
    capsys.readouterr()
    load_benchmarks(str(data), args)
    err = capsys.readouterr().err
    assert "3 of 3 gold answers cannot be matched by the verifier" in err, err
    assert "read its answer with a dotted name, --answer-field reward_model.ground_truth" in err, err
    args.answer_field = "reward_model.ground_truth"
    sets, _ = load_benchmarks(str(data), args)
    assert [p.answer for p in sets["verl"]] == ["0", "2", "4"] and not capsys.readouterr().err
    assert unmatchable_golds(['{"answer": "1"}', "[1, 2]", "{1, 2}"]) == [0]  # a set in LaTeX is an answer


def test_the_trainer_names_the_dotted_field_of_an_object_answer(tmp_path):
    from pacs_fast.config import load_config
    from pacs_fast.trainer.problems import check_gold_answers

    rows = [{"problem": f"{i}+{i}=", "reward_model": {"ground_truth": str(2 * i)}} for i in range(3)]
    data = tmp_path / "verl.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"data.dataset={data}", "data.answer_key=reward_model"])
    texts = [{"problem": r["problem"], "answer": json.dumps(r["reward_model"])} for r in rows]
    with pytest.raises(ValueError, match=r"read its answer with a dotted name, data.answer_key=reward_model"
                                         r".ground_truth"):
        check_gold_answers(cfg, texts, texts, print)


def test_the_verifiers_flags_are_idle_with_a_reward_fn(finished, model_dir, tmp_path, capsys, monkeypatch):
    """--extraction with a --reward-fn that leaves the verifier out: named as having no effect, not recorded as a
    setting (a rerun without it was refused: 'extraction differ')."""
    (tmp_path / "ones_rf.py").write_text("def ones(problems, responses, answers):\n    return [1.0] * len(responses)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = _toy(tmp_path / "toy.jsonl", n=2)
    out = tmp_path / "run"
    capsys.readouterr()
    assert ev.main(_args(model_dir, data, out, "--reward-fn", "ones_rf:ones", "--extraction", "boxed",
                         "--time-limit", "3")) == 0
    err = capsys.readouterr().err
    assert "warning: --extraction boxed has no effect with --reward-fn ones_rf:ones" in err, err
    assert "warning: --time-limit 3.0 has no effect" in err, err
    assert json.loads((out / "run_config.json").read_text())["extraction"] == "reference"
    assert ev.main(_args(model_dir, data, out, "--reward-fn", "ones_rf:ones")) == 0  # the same run: resumes
    # a folder recorded with the extraction before (the verifier left out) resumes too
    cfg = json.loads((out / "run_config.json").read_text())
    (out / "run_config.json").write_text(json.dumps({**cfg, "extraction": "boxed"}))
    assert ev.main(_args(model_dir, data, out, "--reward-fn", "ones_rf:ones")) == 0
    # with the verifier in the mix the extraction is read, and its change refused
    mix = ["--reward-fn", "verifier,ones_rf:ones"]
    assert ev.main(_args(model_dir, data, tmp_path / "mix", *mix)) == 0
    capsys.readouterr()
    assert ev.main(_args(model_dir, data, tmp_path / "mix", *mix, "--extraction", "boxed")) == 2
    _error(capsys, "extraction differ")


def test_a_folder_of_two_datasets_and_repeated_ids_are_named(tmp_path, capsys):
    from pacs_fast.evaluation.args import load_benchmarks
    from pacs_fast.evaluation.parser import run_parser

    folder = tmp_path / "mixed"
    folder.mkdir()
    _toy(folder / "gsm_hard.jsonl", n=2)
    _toy(folder / "svamp.jsonl", n=3)
    shards = tmp_path / "sharded"
    shards.mkdir()
    _toy(shards / "data-00000-of-00002.jsonl", n=2)
    row = {"id": "z", "problem": "1+1=", "answer": "2"}
    (shards / "data-00001-of-00002.jsonl").write_text(json.dumps(row) + "\n")
    args = run_parser().parse_args(["--model", "m"])
    capsys.readouterr()
    sets, _ = load_benchmarks(f"{folder},{shards}", args)
    err = capsys.readouterr().err
    assert len(sets["mixed"]) == 5 and len(sets["sharded"]) == 3
    assert ("--benchmarks " + str(folder) + ": its 2 files (gsm_hard.jsonl, svamp.jsonl) are not named as shards "
            "of one set, and are evaluated as one benchmark, mixed") in err, err
    assert "2 problems repeat another's id (e.g. 'q0')" in err and str(shards) + ":" not in err, err


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_eval_ends_with_one_line_and_resumes(model_dir, tmp_path, sig, code):
    """Ctrl-C printed a ~40-line traceback from the sampler, SIGTERM ended silently: now one line saying how to
    resume, 128 + the signal, and the finished calls' samples kept."""
    data = _toy(tmp_path / "toy.jsonl", n=40)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pacs_fast.eval", *_args(model_dir, data, out, "--max-tokens", "8")]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    samples = out / "samples_toy.jsonl"
    try:
        for _ in range(600):  # until the first calls' samples are written
            if samples.exists() and samples.stat().st_size > 0:
                break
            if proc.poll() is not None:
                break
            subprocess.run(["sleep", "0.1"])
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err and err.rstrip().splitlines()[-1].startswith(
        f"stopped by {signal.Signals(sig).name}: the samples of every finished engine call are kept"), err
    done = read_samples(samples)
    assert 0 < len(done) < 40


def test_the_tables_k_are_in_results_json_too(tmp_path):
    """--table-k 4 beside --k 1,2: table.md showed pass@4 (recomputed from the counts), results.json had none."""
    rec = {"benchmark": "toy", "index": 0, "id": "0", "answer": "1", "n": 4, "scores": [1.0, 0.0, 0.0, 0.0]}
    (tmp_path / "samples_toy.jsonl").write_text(json.dumps(rec) + "\n")
    assert ev.main(["report", "--out", str(tmp_path), "--k", "1,2", "--table-k", "4,8"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["toy"]
    assert res["ks"] == [1, 2, 4] and res["pass_at_k"]["4"] == 1.0 and res["pass_at_k"]["1"] == pytest.approx(0.25)
    assert "| 100.00 |" in (tmp_path / "table.md").read_text()


def test_an_absurd_n_is_refused_before_anything(tmp_path, capsys):
    """--n 100000000000 ran out of memory after 20 GB with no message (and left --out behind)."""
    for n in ("100000000000", "toy=65537", "65537"):
        assert ev.main(["--model", "m", "--n", n, "--out", str(tmp_path / "run")]) == 2
        _error(capsys, "1 <= N <= 65,536")
    assert not (tmp_path / "run").exists()


def test_a_settings_refusal_names_the_values(finished, model_dir, tmp_path, capsys):
    """The refusal named the settings that differ, not their values: which seed made the samples?"""
    out, data = _copy(finished, tmp_path)
    capsys.readouterr()
    assert ev.main(_args(model_dir, data, out, "--seed", "3", "--temperature", "0.9")) == 2
    _error(capsys, "(temperature, seed differ: temperature 0.6 there, 0.9 here; seed 0 there, 3 here; see ")
