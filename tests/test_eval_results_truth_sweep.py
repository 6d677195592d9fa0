"""Eval results truth sweep: every number of ``results.json``, ``table.md`` and ``eval compare`` recomputed
independently from the samples files (hostile sweep of 2026-12-06).

Real runs (the HF engine on the CPU): a tiny random char-level model and a Qwen2.5-shaped folder (byte-level BPE,
ChatML). A pilot run samples the problems first; the gold answers of the measured run are then picked from the
pilot's answers (the most common one written another way, ``4`` as ``4.0``; the rarest; one nobody gave; one the
verifier cannot parse), so that the measured run (the same problem texts, benchmark name and seed: the same
samples) has problems with every kind of count and vote. Each number is recomputed here without the library:
pass@k as ``1 - C(n-c, k) / C(n, k)`` in fractions, maj@k from the documented definition (README "Evaluate":
disjoint consecutive blocks of k, equal answers one vote, no answer no vote, ties give the correct share, a block
without a vote 0), the counts, lengths and digests, the table's cells (two decimals, the average of pass@1 over the
benchmarks: a macro average) and the compare plot's points. Adversarial vote sets go through the library's
aggregation functions directly.

Found and fixed (the case below failed before its fix):
- table.md / ``eval compare``'s table put a column's best value in bold when it lay within 0.005 (percent) of the
  best, not when it printed as the best: 12.5040% and 12.5080% printed ``**12.50**`` and ``**12.51**``, both bold
  (the lower one marked best), and 12.4951% / 12.5049% both printed 12.50 with only one bold. Bold now marks the
  cells that print as the best value (``test_bold_marks_the_best_value_as_printed``).
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from collections import Counter
from fractions import Fraction
from math import comb
from pathlib import Path

import pytest

from pacs_fast import eval as ev
from pacs_fast.data.tiny import make_tiny_model

sys.path.insert(0, str(Path(__file__).parent))
from test_data_path_sweep import qwen_chatml_folder  # noqa: E402

N_TOY, N_TWO = 8, 4
TOY_PROBLEMS = [f"What is {i}+{i}?" for i in range(8)]
TWO_PROBLEMS = [f"Compute {i} times 3." for i in range(3)]
UNPARSABLE_GOLD = "}{"  # (the verifier's gold_error: no sample can match it)


# -- independent recomputation ------------------------------------------------------------------------
def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return Fraction(1) if n - c < k else 1 - Fraction(comb(n - c, k), comb(n, k))


_NUM = re.compile(r"[+-]?\d+(\.\d+)?")
_FRAC = re.compile(r"(-?)\\frac\{(\d+)\}\{(\d+)\}")


def answer_key(a: str):
    """What makes two answers of these runs the same: a number's value (integers, decimals, ``\\frac{p}{q}``,
    ``p/q``), else the exact string."""
    a = a.strip()
    if _NUM.fullmatch(a):
        return ("num", Fraction(a))
    m = _FRAC.fullmatch(a)
    if m:
        return ("num", Fraction(int(m[2]), int(m[3])) * (-1 if m[1] else 1))
    m = re.fullmatch(r"(-?\d+)/(\d+)", a)
    if m and int(m[2]):
        return ("num", Fraction(int(m[1]), int(m[2])))
    return ("str", a)


def exact_maj_at_k(answers, scores, k: int) -> Fraction:
    """README's maj@k: classes of equal answers (None: no vote); a class is correct when more than half of its
    members (over all n) scored > 0.5; the mean over the n // k consecutive blocks of k of the block's vote (the
    share of correct classes among those tied for the most votes; no vote: 0)."""
    keys = [None if a is None else answer_key(a) for a in answers]
    members, right = Counter(), Counter()
    for key, s in zip(keys, scores):
        if key is not None:
            members[key] += 1
            right[key] += float(s) > 0.5
    ok = {key: 2 * right[key] > members[key] for key in members}
    blocks = len(answers) // k
    total = Fraction(0)
    for b in range(blocks):
        votes = Counter(key for key in keys[b * k:(b + 1) * k] if key is not None)
        if votes:
            top = max(votes.values())
            tied = [key for key, v in votes.items() if v == top]
            total += Fraction(sum(ok[key] for key in tied), len(tied))
    return total / blocks


def votes(rec: dict) -> list:
    """A record's votes: its answers, None where a response's status is not ``ok`` (README: no answer, no vote)."""
    statuses = rec.get("statuses") or ["ok"] * len(rec["answers"])
    return [a if st == "ok" else None for a, st in zip(rec["answers"], statuses)]


def read_records(path: Path) -> list[dict]:
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(recs, key=lambda r: r["index"])


def expected_benchmark(recs: list[dict], ks: list[int]) -> dict:
    """A benchmark's results as README / the results module's docstring define them, from its records."""
    n = [len(r["scores"]) for r in recs]
    c = [sum(float(s) > 0.5 for s in r["scores"]) for r in recs]
    scores = [float(s) for r in recs for s in r["scores"]]
    tokens = [t for r in recs for t in r["num_tokens"]]
    return {
        "n": n[0] if len(set(n)) == 1 else n,
        "num_problems": len(recs),
        "ks": ks,
        "pass_at_k": {str(k): sum(exact_pass_at_k(ni, ci, k) for ni, ci in zip(n, c)) / len(recs) for k in ks},
        "maj_at_k": {str(k): sum(exact_maj_at_k(votes(r), r["scores"], k) for r in recs) / len(recs)
                     for k in ks},
        "ids": [str(r["id"]) for r in recs],
        "problems_sha1": hashlib.sha1("\n".join(sorted(r["problem_sha1"] for r in recs)).encode()).hexdigest(),
        "correct_counts": c,
        "status_counts": dict(Counter(s for r in recs for s in r["statuses"])),
        "finish_reasons": dict(Counter(s for r in recs for s in r["finish_reasons"])),
        "mean_response_tokens": Fraction(sum(tokens), len(tokens)),
        "mean_score": sum(map(Fraction, scores)) / len(scores),
    }


def assert_benchmark_matches(got: dict, want: dict):
    for key in ("n", "num_problems", "ks", "ids", "problems_sha1", "correct_counts", "status_counts",
                "finish_reasons"):
        assert got[key] == want[key], key
    for key in ("mean_response_tokens", "mean_score"):
        assert got[key] == pytest.approx(float(want[key]), abs=1e-12), key
    for key in ("pass_at_k", "maj_at_k"):
        assert sorted(got[key], key=int) == sorted(want[key], key=int), key
        for k, v in want[key].items():
            assert got[key][k] == pytest.approx(float(v), abs=1e-12), (key, k)


def check_records(recs: list[dict], problems: list[str], golds: list[str], n: int, max_tokens: int):
    """Each record against the benchmark and its own samples: the problem's digest, n, num_correct, a verdict
    that says what its answer says, a status per answer, the token counts and the finish reasons."""
    assert [r["index"] for r in recs] == list(range(len(recs)))
    for r in recs:
        i = r["index"]
        assert r["problem_sha1"] == hashlib.sha1(problems[i].encode()).hexdigest()
        assert r["answer"] == golds[i] and problems[i] in r["prompt"]
        assert r["n"] == n == len(r["scores"]) == len(r["responses"]) == len(r["answers"]) == len(r["statuses"])
        assert r["num_correct"] == sum(s > 0.5 for s in r["scores"])
        for text, a, s, st, t, fin in zip(r["responses"], r["answers"], r["scores"], r["statuses"],
                                          r["num_tokens"], r["finish_reasons"]):
            assert s in (0.0, 1.0)
            if golds[i] == UNPARSABLE_GOLD:
                assert (st, a, s) == ("gold_error", None, 0.0)
                continue
            assert (st == "ok") == (a is not None), (text, a, st)
            # the verdict is the extracted answer against the gold (an answer of these runs: a number or a token;
            # math-verify reads "1%" as 0.01 and as the string "1": gold "1" pays, gold "1.0" does not)
            if "%" not in text:
                assert s == float(a is not None and answer_key(a) == answer_key(golds[i])), (text, a, golds[i], s)
            assert a is not None or s == 0.0
            assert 1 <= t <= max_tokens
            assert fin in ("stop", "length")
            if fin == "length":  # truncated: the whole budget spent, no EOS
                assert t == max_tokens


def parse_tables(text: str, keep_bold: bool = False) -> dict[tuple[str, str], str]:
    """``(row label, column header) -> cell`` over every markdown table in ``text`` (bold marks dropped unless
    ``keep_bold``)."""
    cells, headers = {}, None
    for line in text.splitlines():
        if not line.startswith("|"):
            headers = None
            continue
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        if headers is None:
            headers = parts
        elif not set(line) <= set("|-: "):
            for h, v in zip(headers[1:], parts[1:]):
                cells[(parts[0], h)] = v if keep_bold else v.replace("**", "")
    return cells


def table_ks(n: int, ks=(1, 16, 256)) -> list[int]:
    out = sorted({k for k in ks if k <= n})
    return out + [n] if any(k > n for k in ks) and n not in out else out


def stored_or_exact(br: dict, k: int):
    """pass@k as results.json stores it, else from its correct counts (exactly; the table's k beyond --k)."""
    if str(k) in br["pass_at_k"]:
        return br["pass_at_k"][str(k)]
    ns = br["n"] if isinstance(br["n"], list) else [br["n"]] * len(br["correct_counts"])
    return sum(exact_pass_at_k(n, c, k) for n, c in zip(ns, br["correct_counts"])) / len(ns)


def pct(v) -> str:
    return f"{100 * float(v):.2f}"


def check_table(text: str, rows: list[tuple[str, dict]], table_k=(1, 16, 256)):
    """Every cell of ``table.md`` (or compare's table): pass@k and maj@k per benchmark for the table's k, the best
    value of a column in bold when there are several rows, and ``Avg. pass@1``: the mean of the benchmarks' pass@1
    (the README: "an average of pass@1 over the benchmarks")."""
    cells = parse_tables(text)
    benches = sorted({b for _, res in rows for b in res})
    for label, res in rows:
        for b in benches:
            n_min = min(min(r[b]["n"]) if isinstance(r[b]["n"], list) else r[b]["n"] for _, r in rows if b in r)
            for k in table_ks(n_min, table_k):
                assert cells[(label, f"{b} pass@{k}")] == (pct(stored_or_exact(res[b], k)) if b in res else "-")
                # maj@k: a column where every result holding the benchmark has it
                if all(str(k) in r[b].get("maj_at_k", {}) for _, r in rows if b in r):
                    assert cells[(label, f"{b} maj@{k}")] == (pct(res[b]["maj_at_k"][str(k)]) if b in res else "-")
                else:
                    assert (label, f"{b} maj@{k}") not in cells
        p1 = [stored_or_exact(res[b], 1) for b in benches if b in res]
        assert cells[(label, "Avg. pass@1")] == (pct(sum(p1) / len(p1)) if len(p1) == len(benches) else "-")
    raw = parse_tables(text, keep_bold=True)
    for header in {h for _, h in cells}:  # bold: the best of its column (2 decimals), with several rows only
        col = {lab: cells[(lab, header)] for lab, _ in rows if cells.get((lab, header), "-") != "-"}
        best = max((float(v) for v in col.values()), default=None)
        for lab, v in col.items():
            bold = raw[(lab, header)].startswith("**")
            assert bold == (len(rows) > 1 and abs(float(v) - best) < 5e-3), (lab, header, raw[(lab, header)])


# -- runs ---------------------------------------------------------------------------------------------
def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_args(model, data, out, *extra, n=str(N_TOY), max_tokens="24"):
    return ["--model", str(model), "--benchmarks", ",".join(map(str, data)), "--n", n, "--max-tokens", max_tokens,
            "--engine", "hf", "--out", str(out), "--no-progress", "--scorer-workers", "1",
            "--samples-per-call", "16", *extra]


def pick_golds(pilot: list[dict]) -> list[str]:
    """Gold answers from the pilot's answers, by problem: the most common one (an integer written ``x.0``), the
    rarest, one nobody gave, and one the verifier cannot parse, in turn."""
    golds = []
    for r in pilot:
        given = Counter(a for a in r["answers"] if a is not None)
        order = [a for a, _ in sorted(given.items(), key=lambda kv: (-kv[1], r["answers"].index(kv[0])))]
        kind = r["index"] % 4
        if kind == 3:
            golds.append(UNPARSABLE_GOLD)
        elif kind == 2 or not order:
            golds.append("123457")
        elif kind == 0:
            golds.append(f"{order[0]}.0" if re.fullmatch(r"\d+", order[0]) else order[0])
        else:
            golds.append(order[-1])
    return golds


class Runs:
    pass


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("truth")
    ns = Runs()
    ns.root = root
    ns.tiny = make_tiny_model(root / "tiny", seed=0)
    ns.qwen = root / "qwen"
    qwen_chatml_folder(ns.qwen, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    ns.golds, ns.data, ns.out = {}, {}, {}
    for name, model in (("tiny", ns.tiny), ("qwen", ns.qwen)):
        pilot_toy = write_jsonl(root / f"pilot_{name}" / "toy.jsonl",
                                [{"id": f"q{i}", "problem": p, "answer": "1"} for i, p in enumerate(TOY_PROBLEMS)])
        pilot_two = write_jsonl(root / f"pilot_{name}" / "two.jsonl",
                                [{"id": f"t{i}", "problem": p, "answer": "1"} for i, p in enumerate(TWO_PROBLEMS)])
        n_spec = f"toy={N_TOY},two={N_TWO}"
        assert ev.main(run_args(model, [pilot_toy, pilot_two], root / f"pilot_{name}_out", n=n_spec)) == 0
        golds = {b: pick_golds(read_records(root / f"pilot_{name}_out" / f"samples_{b}.jsonl"))
                 for b in ("toy", "two")}
        toy = write_jsonl(root / name / "toy.jsonl", [{"id": f"q{i}", "problem": p, "answer": golds["toy"][i]}
                                                      for i, p in enumerate(TOY_PROBLEMS)])
        two = write_jsonl(root / name / "two.jsonl", [{"id": f"t{i}", "problem": p, "answer": golds["two"][i]}
                                                      for i, p in enumerate(TWO_PROBLEMS)])
        out = root / f"{name}_out"
        assert ev.main(run_args(model, [toy, two], out, "--label", name, n=n_spec)) == 0
        for b in ("toy", "two"):  # the same samples as the pilot's (the seed is the benchmark's and the problem's)
            assert [r["responses"] for r in read_records(out / f"samples_{b}.jsonl")] == \
                [r["responses"] for r in read_records(root / f"pilot_{name}_out" / f"samples_{b}.jsonl")]
        ns.golds[name], ns.data[name], ns.out[name] = golds, (toy, two), out
    return ns


@pytest.mark.parametrize("name", ["tiny", "qwen"])
def test_every_number_of_a_run_recomputed_from_its_samples(runs, name):
    out = runs.out[name]
    res = json.loads((out / "results.json").read_text())
    assert set(res["benchmarks"]) == {"toy", "two"} and res["label"] == name
    want = {}
    for b, problems, n in (("toy", TOY_PROBLEMS, N_TOY), ("two", TWO_PROBLEMS, N_TWO)):
        recs = read_records(out / f"samples_{b}.jsonl")
        check_records(recs, problems, runs.golds[name][b], n, 24)
        ks = [k for k in (1, 2, 4, 8) if k <= n]
        want[b] = expected_benchmark(recs, ks)
        got = res["benchmarks"][b]
        assert_benchmark_matches(got, want[b])
        assert got["complete"] is True and got["expected_problems"] == len(problems)
    # the runs are not trivial: correct answers, wrong majorities, truncations, gold errors
    toy = want["toy"]
    assert sum(toy["correct_counts"]) > 0 and toy["status_counts"].get("gold_error") == 2 * N_TOY
    assert toy["finish_reasons"].get("length")
    check_table((out / "table.md").read_text(), [(name, res["benchmarks"])])


def test_report_recomputes_the_same_numbers_and_reextracts_the_votes(runs, tmp_path):
    """``eval report`` on a finished run writes the same results; on records without their ``answers`` (written
    before they were kept) it extracts them from the responses again: the same maj@k."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(runs.out["qwen"], out)
    before = json.loads((out / "results.json").read_text())
    assert ev.main(["report", "--out", str(out)]) == 0
    assert json.loads((out / "results.json").read_text()) == before
    for b in ("toy", "two"):
        path = out / f"samples_{b}.jsonl"
        recs = read_records(path)
        for r in recs:
            del r["answers"]
        write_jsonl(path, recs)
    assert ev.main(["report", "--out", str(out)]) == 0
    after = json.loads((out / "results.json").read_text())
    for b in ("toy", "two"):
        assert after["benchmarks"][b]["maj_at_k"] == before["benchmarks"][b]["maj_at_k"]


def test_a_report_with_k_that_do_not_divide_n(runs, tmp_path):
    """``eval report --k`` with k that leave samples out of maj@k's blocks (n = 8: k = 3, 5, 6, 7) and past one
    benchmark's n (``two``: n = 4, its k stop at 3), ``--table-k`` beyond n (the table adds n itself)."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(runs.out["tiny"], out)
    assert ev.main(["report", "--out", str(out), "--k", "1,2,3,5,6,7,8", "--table-k", "3,5,300"]) == 0
    res = json.loads((out / "results.json").read_text())["benchmarks"]
    for b, ks in (("toy", [1, 2, 3, 5, 6, 7, 8]), ("two", [1, 2, 3])):
        recs = read_records(out / f"samples_{b}.jsonl")
        assert_benchmark_matches(res[b], expected_benchmark(recs, ks))
    check_table((out / "table.md").read_text(), [("tiny", res)], table_k=(3, 5, 300))
    cells = parse_tables((out / "table.md").read_text())
    # pass@4 of two (table-k 5 > n = 4 adds n) comes from the stored counts; maj@4 was not asked for: no column
    recs = read_records(out / "samples_two.jsonl")
    c = [sum(s > 0.5 for s in r["scores"]) for r in recs]
    assert cells[("tiny", "two pass@4")] == pct(sum(exact_pass_at_k(4, x, 4) for x in c) / len(c))
    assert ("tiny", "two maj@4") not in cells and ("tiny", "toy maj@8") in cells


def _interrupting_engine(monkeypatch, at_call: int):
    real = ev._make_engine

    def make(*a, **kw):
        name, engine = real(*a, **kw)
        generate, calls = engine.generate, [0]

        def interrupted(*ga, **gkw):
            calls[0] += 1
            if calls[0] == at_call:
                raise KeyboardInterrupt
            return generate(*ga, **gkw)

        engine.generate = interrupted
        return name, engine

    monkeypatch.setattr(ev, "_make_engine", make)


def test_an_interrupted_then_resumed_run_gives_the_uninterrupted_numbers(runs, tmp_path, monkeypatch, capsys):
    """Ctrl-C at the third engine call (toy's problems 0-3 on file), a last line cut short by the interruption,
    then the same command: results.json holds the numbers of the run that was never interrupted. Then a smaller
    --limit on the same folder covers exactly those problems (recomputed here too)."""
    toy, two = runs.data["tiny"]
    out = tmp_path / "resumed"
    args = run_args(runs.tiny, [toy, two], out, "--label", "tiny", n=f"toy={N_TOY},two={N_TWO}")
    _interrupting_engine(monkeypatch, 3)
    assert ev.main(args) == 130
    assert "stopped by" in capsys.readouterr().err and not (out / "results.json").exists()
    assert sorted(r["index"] for r in read_records(out / "samples_toy.jsonl")) == [0, 1, 2, 3]
    with open(out / "samples_toy.jsonl", "a") as f:
        f.write('{"benchmark": "toy", "index": 4, "scores": [1.0, 1.0')  # (a write the interruption cut short)
    monkeypatch.undo()
    assert ev.main(args) == 0
    assert "resuming: 4 problems already" in capsys.readouterr().err
    whole = json.loads((runs.out["tiny"] / "results.json").read_text())
    resumed = json.loads((out / "results.json").read_text())
    assert resumed["benchmarks"] == whole["benchmarks"]
    # --limit 3 on the same folder: the results cover problems 0-2 of each benchmark
    assert ev.main([*args, "--limit", "3"]) == 0
    res = json.loads((out / "results.json").read_text())
    for b, ks in (("toy", [1, 2, 4, 8]), ("two", [1, 2, 4])):
        recs = read_records(out / f"samples_{b}.jsonl")[:3]
        assert_benchmark_matches(res["benchmarks"][b], expected_benchmark(recs, ks))
        assert res["benchmarks"][b]["complete"] and res["benchmarks"][b]["expected_problems"] == 3
    assert res["limit"] == 3 and len(read_records(out / "samples_toy.jsonl")) == N_TOY  # (the others kept)
    check_table((out / "table.md").read_text(), [("tiny", res["benchmarks"])])


def test_n_of_one_greedy_and_k_past_n(runs, tmp_path, capsys):
    """--n 1: pass@1 and maj@1 only, each the share of correct samples; --k past --n, or --n 2 at temperature 0,
    refused in one line before the model loads; --temperature 0 alone samples one response a problem."""
    toy, _ = runs.data["qwen"]
    out = tmp_path / "n1"
    capsys.readouterr()
    assert ev.main(run_args(runs.qwen, [toy], out, "--k", "2", n="1")) == 2
    err = capsys.readouterr().err.splitlines()  # (the unparsable gold's warning, then the error)
    assert err[-1].startswith("error: --k 2 is larger than --n 1") and sum(e.startswith("error") for e in err) == 1
    assert ev.main(run_args(runs.qwen, [toy], out, "--temperature", "0", n="2")) == 2
    assert "greedy decoding" in capsys.readouterr().err
    assert not out.exists() or not list(out.glob("samples_*"))
    assert ev.main(run_args(runs.qwen, [toy], out, "--label", "n1", n="1")) == 0
    res = json.loads((out / "results.json").read_text())
    recs = read_records(out / "samples_toy.jsonl")
    check_records(recs, TOY_PROBLEMS, runs.golds["qwen"]["toy"], 1, 24)
    want = expected_benchmark(recs, [1])
    assert_benchmark_matches(res["benchmarks"]["toy"], want)
    check_table((out / "table.md").read_text(), [("n1", res["benchmarks"])])
    greedy = tmp_path / "greedy"
    assert ev.main(run_args(runs.qwen, [toy], greedy, "--temperature", "0", "--limit", "2", n="1")) == 0
    res = json.loads((greedy / "results.json").read_text())["benchmarks"]["toy"]
    assert res["n"] == 1 and res["ks"] == [1] and res["num_problems"] == 2
    assert_benchmark_matches(res, expected_benchmark(read_records(greedy / "samples_toy.jsonl"), [1]))


def test_compare_table_and_plot_points_against_the_results_files(runs, tmp_path, monkeypatch):
    """compare of the two models' runs and the one-sample run (toy only, n = 1, other problems): each cell of
    the table (a benchmark a result lacks is ``-``, and so is its average), the bold best of each column, and each
    point the plot draws (k, 100 pass@k) against the results files."""
    from matplotlib.axes import Axes

    one = tmp_path / "one"
    toy, _ = runs.data["qwen"]
    assert ev.main(run_args(runs.qwen, [toy], one, "--label", "n1", "--limit", "5", n="1")) == 0
    files = [runs.out["tiny"] / "results.json", runs.out["qwen"] / "results.json", one / "results.json"]
    results = [json.loads(f.read_text()) for f in files]
    drawn = []
    real_plot = Axes.plot

    def plot(ax, xs, ys, *a, **kw):
        drawn.append((ax, kw.get("label"), list(xs), list(ys)))
        return real_plot(ax, xs, ys, *a, **kw)

    monkeypatch.setattr(Axes, "plot", plot)
    table = tmp_path / "t.md"
    assert ev.main(["compare", *map(str, files), "--out", str(tmp_path / "p.png"), "--table", str(table)]) == 0
    rows = [(r["label"], r["benchmarks"]) for r in results]
    check_table(table.read_text(), rows)
    want = {(b, r["label"]): ([int(k) for k in sorted(br["pass_at_k"], key=int)],
                              [100 * br["pass_at_k"][k] for k in sorted(br["pass_at_k"], key=int)])
            for r in results for b, br in r["benchmarks"].items()}
    assert {(ax.get_title(), lab): (xs, ys) for ax, lab, xs, ys in drawn} == want
    cells = parse_tables(table.read_text())
    assert cells[("n1", "two pass@1")] == "-" and cells[("n1", "Avg. pass@1")] == "-"
    assert cells[("tiny", "toy pass@1")] != "-" and ("tiny", "toy pass@8") not in cells  # (n_min = 1)


def test_bold_marks_the_best_value_as_printed():
    """Two decimals of percent: 12.5040% and 12.5080% print 12.50 and 12.51, and both were bold (within 0.005 of
    the best); 12.49510% and 12.50490% both print 12.50, and only the second was."""
    from pacs_fast.evaluation.report import markdown_table

    def res(label, p):
        return {"label": label, "benchmarks": {"b": {"n": 4, "num_problems": 1, "correct_counts": [1],
                                                     "pass_at_k": {"1": p}}}}

    for a, b in ((0.125040, 0.125080), (0.1249510, 0.1250490), (0.3, 0.3), (0.0, 0.5)):
        rows = [("A", res("A", a)["benchmarks"]), ("B", res("B", b)["benchmarks"])]
        text = markdown_table([res("A", a), res("B", b)])
        check_table(text, rows)
    text = markdown_table([res("A", 0.125040), res("B", 0.125080)])
    assert "| A | 12.50 |" in text and "| B | **12.51** |" in text
    text = markdown_table([res("A", 0.1249510), res("B", 0.1250490)])
    assert "| A | **12.50** |" in text and "| B | **12.50** |" in text


# -- adversarial vote and score sets, through the library's aggregation functions ----------------------------------
def test_pass_at_k_is_the_exact_estimator():
    from pacs_fast.algorithms.pass_at_k import pass_at_k

    for n in (1, 2, 3, 7, 8, 32, 100, 512):
        for c in sorted({0, 1, 2, n // 3, n // 2, n - 2, n - 1, n} & set(range(n + 1))):
            for k in sorted({1, 2, 3, n // 4, n // 2, n - 1, n} & set(range(1, n + 1))):
                assert float(pass_at_k(n, c, k)) == pytest.approx(float(exact_pass_at_k(n, c, k)), abs=1e-13)


def test_maj_at_k_of_random_vote_sets_equals_the_documented_definition(seed):
    """Random answers (integers written two ways, ``2`` and ``02``; no answer), scores that disagree within a class
    (the class's majority decides, a tie is wrong), every k of every n up to 12: the library's maj@k is the
    README's, exactly."""
    import random

    from pacs_fast.evaluation.majority import problem_majority

    rng = random.Random(seed)
    same = lambda a, b: int(a) == int(b)  # noqa: E731 (integers: no math-verify)
    for _ in range(300):
        n = rng.randint(1, 12)
        answers = [rng.choice(["1", "2", "02", "3", None, None]) for _ in range(n)]
        scores = [float(rng.random() < 0.5) for _ in range(n)]
        got = problem_majority(answers, [s > 0.5 for s in scores], range(1, n + 1), same)
        for k in range(1, n + 1):
            assert got[k] == pytest.approx(float(exact_maj_at_k(answers, scores, k)), abs=1e-12), (answers, scores, k)


def test_maj_at_k_ties_empty_votes_and_equal_answers():
    from pacs_fast.evaluation.majority import problem_majority, slow_answers_skipped

    def maj(answers, correct, ks):
        return problem_majority(answers, correct, ks, slow_answers_skipped(5.0))

    # "1/2", "0.5" and "\frac{1}{2}" are one class (3 votes) against "3" (2): the README's "answers math-verify
    # calls equal are one vote"
    assert maj(["1/2", "0.5", "\\frac{1}{2}", "3", "3"], [1, 1, 1, 0, 0], [1, 5]) == {1: 0.6, 5: 1.0}
    assert maj(["3", "3", "1/2", "0.5", "\\frac{1}{2}"], [0, 0, 1, 1, 1], [5]) == {5: 1.0}
    # a tie of a right and a wrong answer: half a vote; three-way tie with one right: a third
    assert maj(["1", "2"], [1, 0], [2]) == {2: 0.5}
    assert maj(["1", "2", "3"], [0, 1, 0], [3]) == {3: pytest.approx(1 / 3)}
    # no answer is no vote: a block of no answers gives 0, a block with one answer follows it
    assert maj([None, None, None, None], [0, 0, 0, 0], [1, 2, 4]) == {1: 0.0, 2: 0.0, 4: 0.0}
    assert maj([None, "7", None, None], [0, 1, 0, 0], [1, 2, 4]) == {1: 0.25, 2: 0.5, 4: 1.0}
    # blocks of k, consecutive, the rest left out: n = 5, k = 2 -> blocks (0,1), (2,3); sample 4 is not counted
    assert maj(["1", "1", "2", "2", "1"], [1, 1, 0, 0, 1], [2]) == {2: 0.5}
    with pytest.raises(ValueError, match="k = 6 is not in"):
        maj(["1"] * 5, [1] * 5, [6])


def _rec(i, scores, answers=None, statuses=None, **extra):
    rec = {"benchmark": "b", "index": i, "id": f"p{i}", "answer": "1", "problem_sha1": f"{i:040x}",
           "n": len(scores), "scores": scores, "statuses": statuses or ["ok"] * len(scores),
           "finish_reasons": ["stop"] * len(scores), "num_tokens": [3 + j for j in range(len(scores))], **extra}
    if answers is not None:
        rec["answers"] = answers
    return rec


def test_summarize_hand_made_records():
    """Records out of order with n 4 and 6 (``n`` a list, k up to the smallest), soft scores (0.5 is not correct,
    0.75 is), a response whose status is ``timeout`` (its answer does not vote), against the definitions."""
    from pacs_fast.evaluation.results import summarize_benchmark

    recs = [_rec(1, [0.75, 0.5, 0.0, 1.0, 0.25, 1.0], ["2", "2", "3", None, "3", "2"]),
            _rec(0, [1.0, 0.0, 0.0, 1.0], ["1", "5", "5", "1"], ["ok", "ok", "timeout", "ok"]),
            _rec(2, [0.0, 0.0, 0.0, 0.0], [None, None, None, None], ["no_answer"] * 4)]
    got = summarize_benchmark(recs, None, [3], extraction="reference")
    want = expected_benchmark(sorted(recs, key=lambda r: r["index"]), [1, 2, 3, 4])
    assert got["n"] == [4, 6, 4] and got["correct_counts"] == [2, 3, 0]
    assert_benchmark_matches(got, want)
    # a record that cannot tell its answers (neither answers nor responses): no maj@k for the benchmark
    bare = [_rec(0, [1.0, 0.0]), _rec(1, [0.0, 0.0], ["4", "4"])]
    out = summarize_benchmark(bare, None, extraction="reference")
    assert "maj_at_k" not in out and out["pass_at_k"] == {"1": 0.25, "2": 0.5}
    with pytest.raises(ValueError, match="no records"):
        summarize_benchmark([], None)


def test_a_benchmark_with_no_problems_on_file(tmp_path):
    """A folder with two benchmarks, one samples file empty: the results and the table hold the other one only,
    and its average is the other's pass@1."""
    from pacs_fast.evaluation.report import markdown_table
    from pacs_fast.evaluation.results import results_from_samples

    recs = [_rec(0, [1.0, 0.0, 1.0, 1.0], ["1", "2", "1", "1"]), _rec(1, [0.0, 0.0, 0.0, 1.0], ["2", "2", "3", "1"])]
    write_jsonl(tmp_path / "samples_a.jsonl", recs)
    (tmp_path / "samples_b.jsonl").write_text("")
    res = results_from_samples(tmp_path, ["a", "b"], meta={"label": "m"})
    assert list(res["benchmarks"]) == ["a"]
    assert_benchmark_matches(res["benchmarks"]["a"], expected_benchmark(recs, [1, 2, 4]))
    check_table(markdown_table([res]), [("m", res["benchmarks"])])
    assert ev.main(["report", "--out", str(tmp_path)]) == 0
    assert list(json.loads((tmp_path / "results.json").read_text())["benchmarks"]) == ["a"]


def test_a_mix_of_rewards_recomputed(runs, tmp_path, monkeypatch):
    """``--reward-fn verifier,truth_rf:has_digit --reward-weights 0.75,0.25``: each score is the weighted sum of
    its parts, a sample is correct when it is above 0.5 (the verifier's part alone gets there), the means of the
    mix and of each part, no maj@k (no verifier answers to vote with), and the second table's cells (3 decimals)."""
    (tmp_path / "truth_rf.py").write_text("def has_digit(problems, responses, answers):\n"
                                          "    return [float(any(c.isdigit() for c in r)) for r in responses]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    toy, _ = runs.data["tiny"]
    out = tmp_path / "mix"
    assert ev.main(run_args(runs.tiny, [toy], out, "--label", "mix", "--limit", "4", "--reward-fn",
                            "verifier,truth_rf:has_digit", "--reward-weights", "0.75,0.25")) == 0
    res = json.loads((out / "results.json").read_text())["benchmarks"]["toy"]
    recs = read_records(out / "samples_toy.jsonl")
    pilot = read_records(runs.out["tiny"] / "samples_toy.jsonl")[:4]
    verifier, digit, mixed = [], [], []
    for r, p in zip(recs, pilot):
        assert r["responses"] == p["responses"] and r["score_parts"]["verifier"] == p["scores"]
        assert r["score_parts"]["has_digit"] == [float(any(c.isdigit() for c in t)) for t in r["responses"]]
        for s, v, d in zip(r["scores"], r["score_parts"]["verifier"], r["score_parts"]["has_digit"]):
            assert s == pytest.approx(0.75 * v + 0.25 * d, abs=1e-12)
        verifier += r["score_parts"]["verifier"]
        digit += r["score_parts"]["has_digit"]
        mixed += r["scores"]
        assert "answers" not in r
    assert res["correct_counts"] == [sum(v > 0.5 for v in r["score_parts"]["verifier"]) for r in recs]
    c = res["correct_counts"]
    for k in (1, 2, 4, 8):
        assert res["pass_at_k"][str(k)] == pytest.approx(float(sum(exact_pass_at_k(N_TOY, x, k) for x in c) / 4),
                                                         abs=1e-12)
    assert "maj_at_k" not in res
    assert res["mean_score"] == pytest.approx(sum(mixed) / len(mixed), abs=1e-12)
    assert res["mean_score_parts"] == pytest.approx({"verifier": sum(verifier) / len(verifier),
                                                     "has_digit": sum(digit) / len(digit)}, abs=1e-12)
    assert sum(digit) > 0
    cells = parse_tables((out / "table.md").read_text())
    assert cells[("mix", "toy (mix)")] == f"{res['mean_score']:.3f}"
    assert cells[("mix", "toy verifier")] == f"{sum(verifier) / len(verifier):.3f}"
    assert cells[("mix", "toy has_digit")] == f"{sum(digit) / len(digit):.3f}"
    assert cells[("mix", "toy pass@1")] == pct(res["pass_at_k"]["1"])
    assert not any(h.endswith(("maj@1", "maj@8")) for _, h in cells)
