"""Data pipeline truth sweep (hostile, 2026-12-06): the SET of problems a run trains and evaluates on, checked
against the files themselves (read here with json / gzip / pyarrow, not with pacs_fast's reader).

Short runs on a Qwen2.5-shaped model folder (byte-level BPE, ChatML template: tests/test_data_path_sweep.py) train in
this process with the engine's ``generate`` recorded (tests/test_metrics_truth_sweep.py's ``run_recorded``), on a
``.jsonl.gz`` file of hostile rows (unicode, U+2028 / NEL, CRLF, tabs, leading and trailing white space, a ~2,000
token row, numbers as answers, a problem repeated with white-space variants, fields named by
``data.problem_key`` / ``data.answer_key``). From the recorded prompts (decoded, and as token ids) and
``samples.jsonl``:
- every prompt is a file row's problem, exactly as the file has it, in the chat template, and its gold answer the
  row's (numbers as their text);
- the held-out split is distinct problems, disjoint from training (white space aside, as README promises: every
  copy of a held-out problem stays out of training), the same for another ``train.seed``, across a ``--resume``
  and on both ranks of two data-parallel groups; no file row is lost besides those copies;
- each epoch draws every training row exactly once (``train.prompts_per_step`` not dividing the set, 3 epochs,
  a fresh order each epoch), ``data/epoch`` the epoch of the step's last prompt; also with dynamic sampling
  (``rollout.filter_groups``: the extra rounds' prompts count as drawn), after a ``--resume`` mid-epoch (the
  uninterrupted run's rows), and over two data-parallel ranks (torchrun, this file as the ranks' script: their
  shares make up each step);
- the formats README names (``.jsonl``, ``.jsonl.gz``, ``.json`` list / lines, ``.json.gz``, parquet with a dotted
  key, Arrow, a folder and a glob of shards) give the rows as the file has them; ``data.eval_dataset`` holds out
  its first ``data.eval_size`` rows and trains on every row of ``data.dataset``;
- the shipped training sets against the shipped benchmarks: no exact or white-space-normalised overlap (the
  counts PROVENANCE.md states), and every shipped row loads as the file has it.

Found and fixed:
- ``data.shuffle=false`` trained the held-out split's training rows in the split's random order, not the file's
  (a curriculum sorted by difficulty was shuffled once, without a word): they now keep the file's order
  (pacs_fast/trainer/problems.py; a run started before the fix resumes with the order it started with).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
import zlib
from collections import Counter
from pathlib import Path

import pytest

from pacs_fast.trainer.metrics import read_jsonl

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
SYSTEM = "You are a helpful assistant."
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
P = 4  # train.prompts_per_step (does not divide the training set)

LONG = "Long row: " + " ".join(f"w{i} lorem ipsum dolor sit amet" for i in range(60)) + " -- what is 1/2?"
# (problem, the answer as the file holds it, the gold text the run must score against)
HOSTILE = [
    ("Ünïcödé: ∑_{k=1}^{3} k² = ? 🙂 日本語 العربية", "6", "6"),
    ("Line one\u2028line two\u0085and NEL: what is 2+2?", 4, "4"),
    ("  leading and trailing spaces,\ttab  ", " 12 ", "12"),
    ("CRLF\r\ninside\r\nthe text: 3 x 9?", 27.0, "27"),
    ("Tiny: what is 10^-5?", 1e-5, "0.00001"),
    ("Combining e\u0301 vs \u00e9 and ZWJ 👩\u200d💻: simplify x*x", "x^2", "x^2"),
    (LONG, "\\frac{1}{2}", "\\frac{1}{2}"),
    ("Negative: 3 - 10?", -7, "-7"),
    ("Big: 10^20?", 10 ** 20, "100000000000000000000"),
    ("Half of one?", 0.5, "0.5"),
    ("What is 5+5?", "10", "10"),
    ("What is 5+5?", "10", "10"),  # an exact copy
    ("What  is 5+5? ", "10", "10"),  # the same problem, white space aside
    ("What is\n5+5?", "10", "10"),
] + [(f"Item {i}: what is {i} + {i}?", 2 * i, str(2 * i)) for i in range(12)]


def _norm(text: str) -> str:
    return " ".join(unicodedata.normalize("NFC", text).split())


def _write_gz(path: Path, rows: list[dict]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path


def _file_rows(path: Path) -> list[dict]:
    """The rows as the file holds them (independent of pacs_fast's reader)."""
    with gzip.open(path, "rb") as f:
        return [json.loads(line) for line in f.read().decode("utf-8").split("\n") if line.strip()]


def user_score(problems, responses, answers):
    """A user reward for dynamic sampling: the groups of half the answers are all 0 (filtered out), the others'
    rewards a bit of the response's checksum (mostly mixed)."""
    return [0.0 if zlib.crc32(a.encode()) % 2 == 0 else float(zlib.crc32(r.encode()) % 2)
            for r, a in zip(responses, answers)]


# ------------------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The model folder, the data file and what the runs should see: each row's prompt (the template's text, and its
    token ids by the folder's own tokenizer, whose NFC normaliser is Qwen2.5's) and gold answer."""
    from transformers import AutoTokenizer

    from test_data_path_sweep import qwen_chatml_folder

    tmp = tmp_path_factory.mktemp("truth")
    qwen_chatml_folder(tmp / "m", num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
    tok = AutoTokenizer.from_pretrained(tmp / "m")  # (what the run loads)
    data = _write_gz(tmp / "hostile.jsonl.gz", [{"qid": f"h{i}", "q": q, "a": a, "source": "sweep"}
                                                 for i, (q, a, _) in enumerate(HOSTILE)])
    rows = _file_rows(data)
    assert [r["q"] for r in rows] == [q for q, _, _ in HOSTILE]  # (the file holds the text as written)
    texts = [tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": f"{r['q']} {INSTRUCTION}"}],
                                     tokenize=False, add_generation_prompt=True) for r in rows]
    prompts = [tuple(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert len(set(prompts)) == len(rows) - 1  # (two rows are exact copies; the white-space variants differ)
    return {"tmp": tmp, "tok": tok, "model": tmp / "m", "data": data, "rows": rows, "prompts": prompts,
            "texts": texts, "golds": [g for _, _, g in HOSTILE]}


def _common(w, *more):
    return [f"model.path={w['model']}", f"data.dataset={w['data']}", "data.problem_key=q", "data.answer_key=a",
            "data.eval_size=5", "data.max_prompt_tokens=3500", "rollout.n=2", "rollout.eval_n=1",
            "rollout.max_new_tokens=2", f"train.prompts_per_step={P}", f"learner.mini_batch_prompts={P}",
            f"learner.micro_batch_prompts={P}", "train.progress=false", "train.tensorboard=false",
            "train.plots=false", "train.eval_every=0", f"train.log_samples={P * 4}", *more]


@pytest.fixture(scope="module")
def main_run(world):
    """3 epochs and a bit (16 steps of 4 from ~21 training rows), checkpoints at 7, 14 and 16."""
    from test_metrics_truth_sweep import run_recorded
    return run_recorded(world["tmp"], "main", _common(world, "train.steps=16", "train.save_every=7",
                                                      "train.keep_checkpoints=10", "train.seed=1",
                                                      f"train.out_dir={world['tmp']}"))


class View:
    """A recorded run as the data it drew: each call's prompts (token ids) as file rows."""

    def __init__(self, w, rec):
        self.w, self.rec = w, rec
        self.by_prompt: dict[tuple, list[int]] = {}
        for i, p in enumerate(w["prompts"]):
            self.by_prompt.setdefault(p, []).append(i)

    def ids(self, calls) -> list[list[tuple]]:
        out = []
        for prompts, _, _ in calls:
            ids = [tuple(p) for p in prompts]
            for p in ids:
                assert p in self.by_prompt, f"a prompt that is no file row's: {self.w['tok'].decode(p)!r}"
            out.append(ids)
        return out

    def drawn(self) -> list[tuple]:
        return [t for call in self.ids(self.rec.train_calls()) for t in call]

    def held_out(self) -> list[tuple]:
        calls = self.ids(self.rec.eval_calls())
        assert calls and all(c == calls[0] for c in calls), "every evaluation is of one held-out set"
        return calls[0]

    def keys(self, prompts) -> set[str]:
        return {_norm(self.w["rows"][self.by_prompt[p][0]]["q"]) for p in prompts}

    def expected_training(self, held: list[tuple]) -> Counter:
        """Every file row whose problem (white space aside) is not held out: once each."""
        gone = self.keys(held)
        return Counter(p for p, r in zip(self.w["prompts"], self.w["rows"]) if _norm(r["q"]) not in gone)


def _epochs(drawn: list[str], n: int) -> list[list[str]]:
    return [drawn[i:i + n] for i in range(0, len(drawn), n)]


# ------------------------------------------------------------------------------------------- the set of problems

def test_every_row_reaches_the_model_as_the_file_has_it_and_the_held_out_set_is_apart(world, main_run):
    """The held-out prompts are distinct file problems; no training prompt shares a held-out problem (white space
    aside); every other file row trains (each copy of a repeated problem), with the row's own gold answer."""
    v = View(world, main_run)
    held = v.held_out()
    assert 1 <= len(held) <= 5 and len(v.keys(held)) == len(held), held
    expected = v.expected_training(held)
    drawn = v.drawn()
    assert not v.keys(drawn) & v.keys(held)
    assert set(drawn) == set(expected)  # every training row's prompt reaches the engine
    assert v.keys(drawn) | v.keys(held) == {_norm(r["q"]) for r in world["rows"]}  # no problem lost
    assert any(world["rows"][v.by_prompt[t][0]]["q"] == LONG for t in drawn + held)  # the long row fits, not dropped
    samples = [r for r in read_jsonl(main_run.run / "samples.jsonl") if "row" in r]
    assert len(samples) == 16 * P * 2
    text_of = {p: world["tok"].decode(p) for p in world["prompts"]}
    for s, p in zip(samples[::2], drawn):  # the samples file's rows are the drawn ones, with their file row's gold
        assert s["prompt"] == text_of[p]
        assert {world["golds"][i] for i in v.by_prompt[p]} == {s["answer"]}
    assert [s["answer"] for s in samples[::2]] == [s["answer"] for s in samples[1::2]]


def test_each_epoch_draws_every_training_row_once_and_reshuffles(world, main_run):
    """prompts_per_step=4 does not divide the training set: epoch by epoch the drawn prompts are the training rows,
    each once (the copies of a repeated problem once each), in a new order each epoch; data/epoch is the epoch of
    the step's last prompt."""
    v = View(world, main_run)
    expected = v.expected_training(v.held_out())
    n = sum(expected.values())
    assert n % P, n
    drawn = v.drawn()
    epochs = _epochs(drawn, n)
    assert len(epochs) >= 3
    for e in epochs[:-1]:
        assert Counter(e) == expected
    assert not Counter(epochs[-1]) - expected  # (the last, partial epoch: no row twice)
    assert len({tuple(e) for e in epochs[:-1]}) == len(epochs) - 1  # a fresh order every epoch
    records = [r for r in read_jsonl(main_run.run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["data/epoch"] for r in records] == [(r["step"] * P - 1) // n for r in records]


@pytest.fixture(scope="module")
def seed2_run(world):
    """Another train.seed, data.shuffle=false, 3 epochs less a bit."""
    from test_metrics_truth_sweep import run_recorded
    return run_recorded(world["tmp"], "seed2", _common(world, "train.steps=11", "train.seed=2", "data.shuffle=false",
                                                       "train.save_every=0", f"train.out_dir={world['tmp']}"))


def test_the_held_out_set_does_not_follow_train_seed(world, main_run, seed2_run):
    """train.seed changes the run, not the held-out split (data.split_seed)."""
    assert View(world, seed2_run).held_out() == View(world, main_run).held_out()


def test_data_shuffle_false_draws_the_file_order_every_epoch(world, seed2_run):
    """data.shuffle=false draws the training rows in the file's order, every epoch (it drew them in the held-out
    split's random order)."""
    v = View(world, seed2_run)
    gone = v.keys(v.held_out())
    in_file_order = [p for p, r in zip(world["prompts"], world["rows"]) if _norm(r["q"]) not in gone]
    epochs = _epochs(v.drawn(), len(in_file_order))
    assert len(epochs) == 3
    for e in epochs:
        assert e == in_file_order[:len(e)]


def test_an_unshuffled_run_started_before_the_fix_resumes_in_its_own_order(world):
    """A checkpoint's data digest of the split's order (what data.shuffle=false trained in before 2026-12-06, and
    with a problem's copies held out per row) resumes with that order; the file's order is what a new run gets."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.problems import data_digest, load_problems, resumed_problems

    cfg = load_config(None, [f"model.path={world['model']}", *_common(world)[1:5], "data.shuffle=false"])
    now = load_problems(cfg)
    assert [r["problem"] for r in now[0]] == [r["q"] for r in world["rows"]
                                              if _norm(r["q"]) not in {_norm(h["problem"]) for h in now[1]}]
    def rows(split):
        return [[(r["problem"], r["answer"]) for r in part] for part in split]

    for way in ({"split_order": True}, {"split_order": True, "held_out_per_row": True}):
        old = load_problems(cfg, **way)
        assert rows(old)[0] != rows(now)[0] and rows(resumed_problems(cfg, *now, data_digest(*old))) == rows(old)
    assert resumed_problems(cfg, *now, data_digest(*now)) == now


def test_a_resume_mid_epoch_draws_what_the_uninterrupted_run_drew(world, main_run):
    """A copy of the run stopped after its step-7 checkpoint (epoch 1, part-way) resumes: the same held-out set, and
    the uninterrupted run's prompts, rows and epochs from step 8 on."""
    from test_metrics_truth_sweep import run_recorded

    run = world["tmp"] / "resumed"
    shutil.copytree(main_run.run, run)
    for step in (14, 16):
        shutil.rmtree(run / "checkpoints" / f"step_{step:06d}")
    (run / "checkpoints" / "latest").write_text("step_000007")
    (run / "summary.json").unlink()
    rec = run_recorded(world["tmp"], "", [], resume_of=run)
    v, full = View(world, rec), View(world, main_run)
    assert v.held_out() == full.held_out()
    assert v.drawn() == full.drawn()[7 * P:]
    assert read_jsonl(run / "samples.jsonl") == read_jsonl(main_run.run / "samples.jsonl")
    a, b = ([(r["step"], r["data/epoch"]) for r in read_jsonl(p / "metrics.jsonl") if r["kind"] == "train"]
            for p in (run, main_run.run))
    assert a == b


def test_dynamic_sampling_draws_every_training_row_once_per_epoch(world):
    """rollout.filter_groups: the extra rounds' prompts (their groups kept or not) are drawn from the same epochs,
    each training row once per epoch; data/epoch is the epoch of the step's last drawn prompt."""
    from test_metrics_truth_sweep import run_recorded

    rec = run_recorded(world["tmp"], "filtered", _common(
        world, "train.steps=6", "train.seed=3", "rollout.filter_groups=true", "rollout.max_gen_batches=4",
        "rollout.n=4", "algo.name=grpo", "reward.fn=test_data_truth_sweep:user_score", "train.save_every=0",
        f"train.out_dir={world['tmp']}"))
    v = View(world, rec)
    expected = v.expected_training(v.held_out())
    n = sum(expected.values())
    drawn = v.drawn()
    records = [r for r in read_jsonl(rec.run / "metrics.jsonl") if r["kind"] == "train"]
    assert sum(r["rollout/prompts_drawn"] for r in records) == len(drawn)
    assert any(r["rollout/gen_rounds"] > 1 for r in records)
    epochs = _epochs(drawn, n)
    assert len(epochs) >= 2
    for e in epochs[:-1]:
        assert Counter(e) == expected
    assert not Counter(epochs[-1]) - expected
    total = 0
    for r in records:
        total += int(r["rollout/prompts_drawn"])
        assert r["data/epoch"] == (total - 1) // n


# ------------------------------------------------------------------------------------------- data-parallel ranks

def _rank_main(argv):  # the ranks of the torchrun launch below: each records what its engine drew, and its data
    from pacs_fast.rollout.hf import HFEngine
    from pacs_fast.train import main
    from pacs_fast.trainer import problems

    out, calls, sets = Path(argv[0]), [], {}
    original, load = HFEngine.generate, problems.load_problems

    def generate(self, prompts, params):
        calls.append({"train": params.return_logprobs, "n": params.n, "t": params.temperature,
                      "prompts": [list(p) for p in prompts]})
        return original(self, prompts, params)

    def load_problems(cfg, **kw):
        train, held = load(cfg, **kw)
        sets.update(train=[r["problem"] for r in train], held=[r["problem"] for r in held])
        return train, held

    HFEngine.generate, problems.load_problems = generate, load_problems
    import pacs_fast.trainer.session as session
    if hasattr(session, "load_problems"):
        session.load_problems = load_problems
    try:
        main(argv[1:])
    finally:
        (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({"calls": calls, "sets": sets}))


@pytest.mark.megatron
@pytest.mark.distributed
@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed")
def test_two_data_parallel_ranks_share_each_step_and_hold_out_one_set(world, main_run):
    """torchrun, 2 data-parallel groups on CPU: each rank loads the same training and held-out sets (the main run's
    held-out set), each step's prompts are rank 0's share then rank 1's, each epoch draws every training row once,
    and the held-out set is split between the ranks, whole."""
    from forked_torchrun import MEGATRON, launch_env, torchrun_command

    out = world["tmp"] / "dp"
    out.mkdir()
    args = _common(world, "learner.backend=megatron", "learner.tp_size=1", "train.steps=7", "train.seed=1",
                   "train.save_every=0", f"train.out_dir={out}", "train.run_name=r")
    cmd = torchrun_command(2, os.path.abspath(__file__), str(out), *args, preload=MEGATRON)
    proc = subprocess.run(cmd, env=launch_env(PYTHONUNBUFFERED="1", PYTHONPATH=os.path.dirname(__file__)),
                          capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["sets"] == ranks[1]["sets"] and ranks[0]["sets"]["held"]
    v = View(world, main_run)
    held_main = v.held_out()
    shares = []
    for r in ranks:
        train = [[tuple(p) for p in c["prompts"]] for c in r["calls"] if c["train"]]
        evals = [[tuple(p) for p in c["prompts"]] for c in r["calls"] if not c["train"] and c["n"] == 1
                 and c["t"] == 0]
        assert len(train) == 7 and all(len(s) == P // 2 for s in train)
        shares.append((train, evals))
    drawn = [t for a, b in zip(shares[0][0], shares[1][0]) for t in a + b]
    assert set(drawn) <= set(v.by_prompt)
    expected = v.expected_training(held_main)
    for e in _epochs(drawn, sum(expected.values()))[:-1]:
        assert Counter(e) == expected
    for e0, e1 in zip(shares[0][1], shares[1][1]):  # each evaluation: rank 0's part then rank 1's is the set
        assert e0 + e1 == held_main
    assert drawn == v.drawn()[:7 * P]  # the one-process run's draws (same seed, same data)


# ------------------------------------------------------------------------------------------- files and formats

FORMAT_ROWS = [{"id": f"f{i}", "problem": q, "answer": a} for i, (q, a, _) in enumerate(HOSTILE[:10])]
FORMAT_GOLDS = [g for _, _, g in HOSTILE[:10]]


def test_every_documented_format_gives_the_rows_as_the_file_has_them(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pacs_fast.data.datasets import load_dataset

    want = [(r["problem"], g) for r, g in zip(FORMAT_ROWS, FORMAT_GOLDS)]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in FORMAT_ROWS)
    (tmp_path / "a.jsonl").write_text(text, encoding="utf-8")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    (tmp_path / "c.json").write_text(json.dumps(FORMAT_ROWS, ensure_ascii=False), encoding="utf-8")
    (tmp_path / "d.json").write_text(text, encoding="utf-8")  # one object per line (Dataset.to_json)
    (tmp_path / "e.json.gz").write_bytes(gzip.compress(json.dumps(FORMAT_ROWS).encode()))
    for name in ("a.jsonl", "b.jsonl.gz", "c.json", "d.json", "e.json.gz"):
        got = [(p.problem, p.answer) for p in load_dataset(tmp_path / name)]
        assert got == want, name
    # parquet / Arrow: typed columns (an int answer column, a nested one read by a dotted key)
    rows = [{"question": q, "reward_model": {"ground_truth": 3 * i - 5}} for i, (q, _, _) in enumerate(HOSTILE[:10])]
    want = [(q, str(3 * i - 5)) for i, (q, _, _) in enumerate(HOSTILE[:10])]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, tmp_path / "f.parquet")
    with pa.OSFile(str(tmp_path / "g.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=3)
    shards = tmp_path / "shards" / "data"
    shards.mkdir(parents=True)
    pq.write_table(table.slice(0, 4), shards / "train-00000-of-00002.parquet")
    pq.write_table(table.slice(4), shards / "train-00001-of-00002.parquet")
    for spec in (tmp_path / "f.parquet", tmp_path / "g.arrow", tmp_path / "shards",
                 str(shards / "train-*.parquet")):
        got = [(p.problem, p.answer) for p in load_dataset(spec, problem_field="question",
                                                            answer_field="reward_model.ground_truth")]
        assert got == want, spec


def test_an_eval_dataset_holds_out_its_first_rows_and_training_keeps_every_row(tmp_path):
    """data.eval_dataset: the held-out set is its first data.eval_size rows in order; data.dataset trains whole, in
    file order (nothing held out of it), and a problem both files hold is a warning line."""
    from pacs_fast.config import load_config
    from pacs_fast.trainer.problems import data_warnings, load_problems

    train = _write_gz(tmp_path / "t.jsonl.gz", FORMAT_ROWS)
    held_rows = [{"problem": f"Held {i}?", "answer": str(i)} for i in range(8)] + [FORMAT_ROWS[3]]
    held = tmp_path / "h.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in held_rows))
    cfg = load_config(None, [f"data.dataset={train}", f"data.eval_dataset={held}", "data.eval_size=6",
                             "model.path=/x"])
    tr, ho = load_problems(cfg)
    assert [(r["problem"], r["answer"]) for r in tr] == [(r["problem"], g) for r, g in zip(FORMAT_ROWS, FORMAT_GOLDS)]
    assert [r["problem"] for r in ho] == [r["problem"] for r in held_rows[:6]]
    cfg.data.eval_size = 9
    tr, ho = load_problems(cfg)
    assert any("1 of the 9 problems of data.eval_dataset" in line and "also training problems" in line
               for line in data_warnings(cfg, tr, ho))


# (the number as the file writes it, the gold text: every digit, positional)
LONG_NUMBERS = [("0.123456789012345678901", "0.123456789012345678901"),
                ("3.14159265358979323846264338", "3.14159265358979323846264338"),
                ("123456789012345678901.5", "123456789012345678901.5"),
                ("-2.50000000000000000001E3", "-2500.00000000000000001"),
                ("1e-5", "0.00001"), ("0.1", "0.1"), ("7", "7")]


def test_a_json_number_answer_keeps_every_digit(tmp_path):
    """A JSON number answer of more significant digits than a float keeps is the gold the file writes, in each JSON
    format (it was read as a float: 0.123456789012345678901 trained and scored as 0.12345678901234568); the row's
    other fields (reward.fn_fields, meta) hold the plain floats they always did."""
    from pacs_fast.data.datasets import load_dataset

    lines = [f'{{"problem": "Digits {i}?", "answer": {lit}, "note": {lit}, "cases": [{lit}, {{"x": {lit}}}]}}'
             for i, (lit, _) in enumerate(LONG_NUMBERS)]
    text = "\n".join(lines) + "\n"
    (tmp_path / "a.jsonl").write_text(text)
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    (tmp_path / "c.json").write_text("[" + ",\n".join(lines) + "]")
    (tmp_path / "d.json").write_text(text)  # one object per line
    (tmp_path / "e.json.gz").write_bytes(gzip.compress(("[" + ",".join(lines) + "]").encode()))
    for name in ("a.jsonl", "b.jsonl.gz", "c.json", "d.json", "e.json.gz"):
        got = load_dataset(tmp_path / name, fields=["cases"])
        assert [p.answer for p in got] == [gold for _, gold in LONG_NUMBERS], name
        for p, (lit, _) in zip(got, LONG_NUMBERS):
            want = json.loads(lit)  # (Python's own reading: a float, or an int)
            assert type(p.meta["note"]) is type(want) and p.meta["note"] == want, (name, p.meta)
            assert p.fields["cases"] == [want, {"x": want}] and type(p.fields["cases"][1]["x"]) is type(want)


def test_a_problem_in_two_unicode_forms_is_one_problem(tmp_path):
    """Ten problems, each written composed (NFC) and decomposed (NFD: "e" + U+0301 for "\u00e9"), which a tokenizer
    normalising to NFC (Qwen2.5's) gives one prompt: the held-out split holds each problem once and keeps its other
    form out of training (one form was held out while the other trained, without a word), and data.eval_dataset's
    twins are named; a run started before 2026-12-07 (the two forms were two problems) resumes with its own split."""
    import unicodedata

    from pacs_fast.config import load_config
    from pacs_fast.trainer.problems import data_digest, data_warnings, load_problems, resumed_problems

    def nfc(row):
        return unicodedata.normalize("NFC", row["problem"])

    rows = []
    for k in range(10):
        q = f"Caf\u00e9 n\u00b0{k}: r\u00e9sum\u00e9 of a na\u00efve \u00c5ngstr\u00f6m, what is {k} + {k}?"
        rows += [{"problem": unicodedata.normalize(form, q), "answer": str(2 * k)} for form in ("NFC", "NFD")]
    assert all(rows[i]["problem"] != rows[i + 1]["problem"] for i in range(0, 20, 2))
    path = _write_gz(tmp_path / "twins.jsonl.gz", rows)
    cfg = load_config(None, [f"data.dataset={path}", "data.eval_size=4", "model.path=/x"])
    train, held = load_problems(cfg)
    assert 2 <= len(held) <= 4 and len({nfc(r) for r in held}) == len(held)  # (4 rows drawn: twins drawn count once)
    assert not {nfc(r) for r in held} & {nfc(r) for r in train}
    assert len(train) == 20 - 2 * len(held)
    old = load_problems(cfg, nfc_key=False)
    assert data_digest(*old) != data_digest(train, held)
    assert resumed_problems(cfg, train, held, data_digest(*old)) == old
    assert resumed_problems(cfg, train, held, data_digest(train, held)) == (train, held)
    cfg = load_config(None, [f"data.dataset={path}", f"data.eval_dataset={path}", "data.eval_size=20",
                             "model.path=/x"])
    assert any(line.startswith("10 of the 20 problems of data.eval_dataset repeat another")
               for line in data_warnings(cfg, *load_problems(cfg)))


# ------------------------------------------------------------------------------------------- the shipped data

def _shipped(name: str) -> list[dict]:
    path = SHARED / name
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rb") as f:
        return [json.loads(line) for line in f.read().decode("utf-8").split("\n") if line.strip()]


def _alnum(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.lower())


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs the shared data folder")
def test_the_shipped_training_sets_against_the_benchmarks():
    """Contamination of the shipped training sets (math_train, gsm8k_train) by the shipped benchmarks (math500,
    amc23, aime2024, aime2025): no exact or white-space-normalised problem overlap (PROVENANCE.md's counts); reduced
    to lower-case letters and digits one pair matches, math_train's train/precalculus/474 and MATH-500's
    test/precalculus/285, problems that differ in a sign. Each shipped training row loads as the file has it, and
    math_train's held-out split keeps its one problem written twice (white space aside) out of training."""
    from pacs_fast.config import load_config
    from pacs_fast.data.datasets import load_dataset
    from pacs_fast.trainer.problems import load_problems

    benches = {b: _shipped(f"{b}.jsonl") for b in ("math500", "amc23", "aime2024", "aime2025")}
    found = {}
    for t in ("math_train", "gsm8k_train"):
        rows = _shipped(f"{t}.jsonl.gz")
        assert [(p.id, p.problem, p.answer) for p in load_dataset(t)] == [
            (r["id"], r["problem"], r["answer"].strip()) for r in rows]
        for how, f in (("exact", str), ("white space", _norm), ("alnum", _alnum)):
            keys = {f(r["problem"]) for r in rows}
            for b, brows in benches.items():
                hits = [r["id"] for r in brows if f(r["problem"]) in keys]
                if hits:
                    found[(t, b, how)] = hits
    assert found == {("math_train", "math500", "alnum"): ["test/precalculus/285.json"]}, found
    math = _shipped("math_train.jsonl.gz")
    copies = Counter(_norm(r["problem"]) for r in math)
    assert len(math) == 7496 and len({r["problem"] for r in math}) == 7496 and sorted(copies.values())[-2:] == [1, 2]
    for seed in (0, 1):
        train, held = load_problems(load_config(None, ["data.dataset=math_train", f"data.split_seed={seed}",
                                                       "model.path=/x"]))
        keys = {_norm(r["problem"]) for r in held}
        assert len(keys) == len(held) == 128 and not keys & {_norm(r["problem"]) for r in train}
        assert len(train) + sum(copies[k] for k in keys) == 7496


if __name__ == "__main__":  # a rank of the data-parallel launch above
    _rank_main(sys.argv[1:])
