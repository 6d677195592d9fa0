"""``python -m pacs_fast.eval``: pass@k from samples, end to end on the tiny model, resume, compare."""
import json
import random
from math import comb

import pytest

from pacs_fast import eval as ev
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.evaluation.results import default_ks, default_n, read_samples
from pacs_fast.rollout.hf import HFEngine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture
def dataset(tmp_path):
    rows = [{"id": f"q{i}", "problem": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)]
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _hand_pass_at_k(n, cs, k):
    return sum(1 - comb(n - c, k) / comb(n, k) for c in cs) / len(cs)


def test_paper_defaults():
    assert default_n("math500") == 32 and default_n("aime2025") == 512 and default_n("amc23") == 512
    assert default_ks(512) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert default_ks(32) == [1, 2, 4, 8, 16, 32]
    args = ev._run_parser().parse_args(["--model", "m"])
    assert (args.temperature, args.top_p, args.max_tokens) == (0.6, 0.95, 4096)
    assert args.benchmarks == "math500,amc23,aime2024,aime2025"


def test_report_from_fixed_samples_equals_hand_computation(tmp_path, seed, capsys):
    rng = random.Random(seed)
    n = 8
    recs = []
    for i in range(6):
        scores = [float(rng.random() < rng.random()) for _ in range(n)]
        recs.append({"benchmark": "amc23", "index": i, "id": str(i), "answer": "1", "n": n,
                     "scores": scores, "statuses": ["ok"] * n, "finish_reasons": ["stop"] * n,
                     "num_tokens": [5] * n, "responses": ["x"] * n})
    rng.shuffle(recs)  # order in the file does not matter
    (tmp_path / "samples_amc23.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert ev.main(["report", "--out", str(tmp_path), "--k", "1,2,3,8", "--table-k", "1,3"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["amc23"]
    cs = [int(sum(r["scores"])) for r in sorted(recs, key=lambda r: r["index"])]
    assert res["correct_counts"] == cs and res["n"] == n and res["num_problems"] == 6
    for k in (1, 2, 3, 8):
        assert res["pass_at_k"][str(k)] == pytest.approx(_hand_pass_at_k(n, cs, k), abs=1e-12)
    table = (tmp_path / "table.md").read_text()
    assert f"{100 * _hand_pass_at_k(n, cs, 3):.2f}" in table and "AMC23 pass@3" in table
    assert table in capsys.readouterr().out
    assert (tmp_path / "pass_at_k.png").stat().st_size > 1000


def _run_args(model_dir, dataset, out, *extra):
    return ["--model", str(model_dir), "--benchmarks", str(dataset), "--n", "2", "--max-tokens", "6",
            "--engine", "hf", "--out", str(out), "--no-progress", "--samples-per-call", "2", *extra]


def test_end_to_end_tiny_model(model_dir, tmp_path, capsys):
    rows = [{"id": f"q{i}", "problem": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, data, out, "--limit", "2", "--scorer-workers", "1",
                             "--label", "tiny")) == 0
    res = json.loads((out / "results.json").read_text())
    toy = res["benchmarks"]["toy"]
    assert toy["num_problems"] == 2 and toy["n"] == 2 and toy["ks"] == [1, 2] and toy["complete"]
    assert sum(toy["status_counts"].values()) == 4 and res["label"] == "tiny"
    recs = read_samples(out / "samples_toy.jsonl")
    assert sorted(recs) == [0, 1] and [recs[i]["id"] for i in (0, 1)] == ["q0", "q1"]
    assert all(len(r["responses"]) == 2 and all(t <= 6 for t in r["num_tokens"]) for r in recs.values())
    assert (out / "table.md").read_text().startswith("| Model | toy pass@1 | toy pass@2 |")
    assert (out / "pass_at_k.png").exists()
    settings = json.loads((out / "run_config.json").read_text())
    assert settings["temperature"] == 0.6 and settings["n"] == {"toy": 2}
    # another run with other settings into the same folder is refused
    with pytest.raises(SystemExit, match="temperature"):
        ev.main(_run_args(model_dir, data, out, "--temperature", "1.0"))


def test_resume_after_interruption(model_dir, dataset, tmp_path, monkeypatch):
    calls = []
    real = HFEngine.generate

    def counting(self, prompts, params):
        calls.append(len(prompts))
        return real(self, prompts, params)

    monkeypatch.setattr(HFEngine, "generate", counting)
    out = tmp_path / "run"
    common = ("--scorer-workers", "0")  # inline scoring keeps this test light
    ev.main(_run_args(model_dir, dataset, out, "--limit", "1", *common))  # "interrupted" after 1 problem
    first = read_samples(out / "samples_toy.jsonl")[0]
    assert calls == [1]
    ev.main(_run_args(model_dir, dataset, out, "--limit", "3", *common))
    assert calls == [1, 1, 1]  # problems 1 and 2 only
    recs = read_samples(out / "samples_toy.jsonl")
    assert sorted(recs) == [0, 1, 2] and recs[0] == first
    # a write cut short in the middle of the last line: that problem alone is generated again
    path = out / "samples_toy.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - 25])
    assert sorted(read_samples(path)) == [0, 1]
    ev.main(_run_args(model_dir, dataset, out, "--limit", "3", *common))
    assert calls == [1, 1, 1, 1]
    recs = read_samples(path)
    assert sorted(recs) == [0, 1, 2] and recs[0] == first
    assert path.read_text().count("\n") == 3  # the broken tail was cut off, not left in the file
    # a complete run does not even load the model
    ev.main(_run_args(model_dir, dataset, out, "--limit", "3", *common))
    assert calls == [1, 1, 1, 1]
    res = json.loads((out / "results.json").read_text())
    assert res["limit"] == 3  # 3 of the 4 problems were asked for, and all 3 are done
    assert res["benchmarks"]["toy"]["num_problems"] == 3 and res["benchmarks"]["toy"]["complete"]


def test_compare_two_results(tmp_path, capsys):
    files = []
    for label, cs in (("base", [0, 1, 2]), ("pacs", [2, 3, 4])):
        res = {"label": label, "benchmarks": {"aime2024": {
            "n": 4, "pass_at_k": {str(k): _hand_pass_at_k(4, cs, k) for k in (1, 2, 4)},
            "correct_counts": cs}}}
        files.append(tmp_path / f"{label}.json")
        files[-1].write_text(json.dumps(res))
    png, md = tmp_path / "plot.png", tmp_path / "t.md"
    assert ev.main(["compare", *map(str, files), "--out", str(png), "--table", str(md)]) == 0
    table = md.read_text().splitlines()
    assert table[0] == "| Model | AIME 2024 pass@1 | AIME 2024 pass@4 | Avg. pass@1 |"
    assert table[2].startswith("| base |") and table[3].startswith("| pacs |")
    assert f"**{100 * _hand_pass_at_k(4, [2, 3, 4], 1):.2f}**" in table[3]
    assert png.stat().st_size > 1000
    with pytest.raises(SystemExit, match="labels"):
        ev.main(["compare", *map(str, files), "--out", str(png), "--labels", "a"])


def test_bad_arguments(tmp_path):
    with pytest.raises(SystemExit):
        ev.main(["--model", "m", "--n", "0"])
    with pytest.raises(SystemExit, match="unknown benchmark"):
        ev.main(["--model", "m", "--benchmarks", "aime1999", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="no samples"):
        ev.main(["report", "--out", str(tmp_path)])
