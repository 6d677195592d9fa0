"""Samples files and pass@k results.

A run directory holds one samples file per benchmark, ``samples_<benchmark>.jsonl``, with one
line per problem, appended as soon as the problem's samples are generated and scored; ``prompt`` is
the exact text the model continued (chat template included), ``responses`` what it wrote::

    {"benchmark": "amc23", "index": 0, "id": "0", "answer": "27", "problem_sha1": "5d41402a...",
     "prompt": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>...", "n": 512,
     "num_correct": 311, "scores": [1.0, 0.0, ...], "statuses": ["ok", "no_answer", ...],
     "finish_reasons": ["stop", "length", ...], "num_tokens": [812, 4096, ...],
     "responses": ["...", ...], "answers": ["27", null, ...]}

``answers`` (when the math verifier alone scored the run; older records lack it and ``eval report`` extracts them
from ``responses``): each response's answer as the verifier reads it, null where it has none or its status is not
``ok`` -- the votes of maj@k (:mod:`pacs_fast.evaluation.majority`).

With a mix of rewards (``--reward-fn verifier,my_checks:format_score``) each record also holds each component's
rewards, ``"score_parts": {"verifier": [1.0, 0.0, ...], "format_score": [0.5, 1.0, ...]}``, and the results
their means (``mean_score_parts``) beside the mean of the mixed scores (``mean_score``).

``problem_sha1`` (:func:`problem_digest`) ties a record to the problem text it answered: a resume checks
every record against the benchmark as it is now (:func:`check_records_match`).

``results.json`` keeps, per benchmark, the per-problem correct counts (so any pass@k can be
recomputed later) next to pass@k for the chosen k, and maj@k (``maj_at_k``) for the same k where the verifier scored.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from pacs_fast.algorithms.pass_at_k import pass_at_k
from pacs_fast.config.reward_fields import fields_digest, row_fields
from pacs_fast.evaluation.majority import records_majority
from pacs_fast.reward.verifier import DEFAULT_TIME_LIMIT

PAPER_N = {"math500": 32}  # the paper samples 32 for MATH-500 and 512 for the others
PAPER_N_OTHER = 512
MAX_K = 256
# the sampling settings a settings file or a result from before they existed was made with (off)
UNRECORDED_SAMPLING = {"top_k": 0, "min_p": 0.0, "template_kwargs": {}, "stop": [], "prompt_template": "chat"}
# what results written before a setting was recorded used (the verifier's only extraction then, and the verifier;
# no fields: reward_fields is written only when given)
LEGACY_SETTINGS = {"extraction": "reference", "reward_fn": "", "reward_fields": [], "reward_weights": [],
                   **UNRECORDED_SAMPLING}


def default_n(benchmark: str) -> int:
    """The paper's samples per problem: 32 for MATH-500, 512 otherwise."""
    return PAPER_N.get(benchmark, PAPER_N_OTHER)


def default_ks(n: int, max_k: int = MAX_K) -> list[int]:
    """1, 2, 4, ..., 256, capped at ``n`` (the paper's k range)."""
    ks, k = [], 1
    while k <= min(n, max_k):
        ks.append(k)
        k *= 2
    return ks


def samples_path(out_dir: str | Path, benchmark: str) -> Path:
    return Path(out_dir) / f"samples_{benchmark}.jsonl"


def is_correct(score) -> bool:
    """Whether a response's score counts as correct in pass@k: above 0.5, as the trainer's ``reward/acc``
    and ``eval/pass@n`` count (the verifier's scores are 0 or 1; ``--reward-fn``'s may lie between)."""
    return float(score) > 0.5


def read_samples(path: str | Path, *, repair: bool = False) -> dict[int, dict[str, Any]]:
    """Problem records of a samples file, keyed by problem index.

    A last line cut short by an interruption is ignored; with ``repair=True`` the file is truncated
    to its last complete line so that appending continues cleanly. A broken line elsewhere is an
    error (naming file and line). A later record for the same index replaces an earlier one.
    """
    path = Path(path)
    if not path.exists():
        return {}
    records: dict[int, dict[str, Any]] = {}
    with open(path, "rb") as f:
        data = f.read()
    good_end = 0
    pos = 0
    line_no = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        line_no += 1
        if nl == -1:  # no newline: an interrupted final write
            break
        raw = data[pos:nl]
        if raw.strip():
            try:
                rec = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                if data.find(b"\n", nl + 1) == -1 and not data[nl + 1:].strip():
                    break  # a corrupt last line
                raise ValueError(f"{path}:{line_no}: unreadable samples record ({e})") from None
            wrong = record_error(rec)  # (a whole JSON line is no interrupted write: an edit, refused on any line)
            if wrong:
                raise ValueError(f"{path}:{line_no}: not a samples record ({wrong})")
            records[rec["index"]] = rec
        pos = nl + 1
        good_end = pos
    if repair and good_end < len(data):
        with open(path, "r+b") as f:
            f.truncate(good_end)
    return records


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def record_error(rec) -> str | None:
    """What makes ``rec`` (one parsed line of a samples file) no problem record, or None: an object with an
    ``index`` (an integer >= 0), ``scores`` (a non-empty list of finite numbers) and, where given, ``n`` (their
    number). What pass@k reads: a hand-edited line failed later with a bare KeyError or TypeError."""
    if not isinstance(rec, dict):
        return f"a JSON {type(rec).__name__}, not an object"
    if not _count(rec.get("index")):
        return f"index {rec.get('index')!r} is not an integer >= 0"
    scores = rec.get("scores")
    if not isinstance(scores, list) or not scores or not all(_real(x) for x in scores):
        return "scores must be a non-empty list of finite numbers"
    if "n" in rec and rec["n"] != len(scores):
        return f"n {rec['n']!r} is not the number of its scores ({len(scores)})"
    answers = rec.get("answers")
    if answers is not None and (not isinstance(answers, list) or len(answers) != len(scores)
                                or not all(a is None or isinstance(a, str) for a in answers)):
        return "answers must be a list of one string or null per score"
    return None


def problem_digest(problem: str) -> str:
    """SHA-1 (hex) of a problem's text, kept in its samples record (``problem_sha1``)."""
    return hashlib.sha1(problem.encode("utf-8")).hexdigest()


def check_records_match(path: str | Path, records: dict[int, dict[str, Any]], problems, source: str,
                        field_keywords: dict[str, str] | None = None, n: int | None = None,
                        sampled_from: str | None = None) -> None:
    """ValueError when a record of the samples file ``path`` answered another problem than ``problems[index]``
    now is (``source``: the benchmark entry, named in the error): an edited dataset file, or other
    ``--problem-field`` / ``--answer-field``. Compared: the id, the gold answer and the problem text
    (``problem_sha1``; records written before it existed: the problem must appear in their prompt), and with
    ``--reward-fields`` (``field_keywords``) the row's field values (``fields_sha1``: what the reward read).
    With ``n`` (this run's samples per problem), each record's number of samples too (the settings file compares
    ``n`` only where it records the benchmark's). ``sampled_from``: the dataset the folder's settings file names
    for the benchmark; another than ``source`` is named as such (two files of one name), not as an edit. Records
    past the end of ``problems`` (an earlier run with a larger ``--limit``) are not compared."""
    for i, rec in sorted(records.items()):
        if i >= len(problems):
            break
        p = problems[i]
        if n is not None and len(rec["scores"]) != n:
            raise ValueError(f"{path}: problem {i} was sampled with n = {len(rec['scores'])}, not {n} as this run "
                             f"asks (the results would mix them): give that --n, use another --out, or --overwrite "
                             f"to start afresh")
        if "problem_sha1" in rec:
            same_text = rec["problem_sha1"] == problem_digest(p.problem)
        else:
            same_text = p.problem.strip() in str(rec.get("prompt", p.problem))  # (a template may trim it)
        same_fields = not field_keywords or rec.get("fields_sha1") == fields_digest(row_fields(p.fields,
                                                                                              field_keywords))
        what = [name for name, same in (("id", str(rec.get("id")) == str(p.id)),
                                        ("answer", str(rec.get("answer")) == str(p.answer)),
                                        ("problem text", same_text), ("--reward-fields values", same_fields))
                if not same]
        if what and sampled_from and sampled_from != source:
            raise ValueError(f"{path} was sampled from {sampled_from}, not {source} (another dataset of the same "
                             f"name: its problem {i} differs); use another --out for this one")
        if what:
            raise ValueError(f"{path}: problem {i} was sampled from another version of {source} (its "
                             f"{' and '.join(what)} differ{'s' if len(what) == 1 else ''}: {source} changed since); "
                             f"use another --out, or --overwrite to start afresh")


def append_records(path: str | Path, records: list[dict[str, Any]]) -> None:
    """Appends records (one JSON line each) and flushes them to disk."""
    with open(path, "a", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _problems_digest(records: list[dict[str, Any]]) -> str | None:
    """SHA-1 of the records' ``problem_sha1`` values, sorted (None when a record predates them)."""
    if not all("problem_sha1" in r for r in records):
        return None
    return hashlib.sha1("\n".join(sorted(r["problem_sha1"] for r in records)).encode()).hexdigest()


def summarize_benchmark(records: list[dict[str, Any]], ks: list[int] | None = None,
                        extra_ks: list[int] | None = None, *, extraction: str | None = None,
                        time_limit: float | None = DEFAULT_TIME_LIMIT) -> dict[str, Any]:
    """pass@k and bookkeeping for one benchmark from its problem records (ordered by index).

    ``ks`` defaults to :func:`default_ks` of the smallest ``n``; ``extra_ks`` join them (the k of ``table.md``:
    ``--table-k``); k larger than a problem's ``n`` is dropped. With the verifier's ``extraction`` (records the math
    verifier scored) also ``maj_at_k`` for the same k (:mod:`pacs_fast.evaluation.majority`; ``time_limit``: seconds
    per answer extraction or comparison), where every record holds its answers or responses.
    """
    if not records:
        raise ValueError("summarize_benchmark: no records")
    records = sorted(records, key=lambda r: int(r["index"]))
    n = np.array([int(r.get("n", len(r["scores"]))) for r in records], dtype=np.int64)
    c = np.array([sum(is_correct(s) for s in r["scores"]) for r in records], dtype=np.int64)
    n_min = int(n.min())
    ks = [*(default_ks(n_min) if ks is None else ks), *(extra_ks or ())]
    ks = sorted({int(k) for k in ks if 1 <= int(k) <= n_min})
    status_counts: dict[str, int] = {}
    finish_counts: dict[str, int] = {}
    tokens, scores = [], []
    parts: dict[str, list[float]] = {}
    # a resume keeps one --reward-fn, so all records carry their parts, or none; but records written before parts were
    # recorded do not: then none count, and ``score_parts_missing`` says how many lack them
    missing = sum(not r.get("score_parts") for r in records)
    with_parts = missing == 0
    for r in records:
        scores.extend(float(x) for x in r["scores"])
        for name, values in (r["score_parts"] if with_parts else {}).items():
            parts.setdefault(name, []).extend(float(x) for x in values)
        for s in r.get("statuses", []):
            status_counts[s] = status_counts.get(s, 0) + 1
        for s in r.get("finish_reasons", []):
            finish_counts[s] = finish_counts.get(s, 0) + 1
        tokens.extend(r.get("num_tokens", []))
    out = {
        "n": int(n[0]) if (n == n[0]).all() else [int(x) for x in n],
        "num_problems": len(records),
        "ks": ks,
        "pass_at_k": {str(k): float(pass_at_k(n, c, k).mean()) for k in ks},
        "ids": [str(r.get("id", r["index"])) for r in records],
        # the problems' texts (eval compare: two files of one name whose rows have no id field share the ids 0..N-1)
        "problems_sha1": _problems_digest(records),
        "correct_counts": [int(x) for x in c],
        "status_counts": status_counts,
        "finish_reasons": finish_counts,
        "mean_response_tokens": float(np.mean(tokens)) if tokens else None,
        "mean_score": float(np.mean(scores)) if scores else None,  # (soft rewards: more than pass@1 says)
    }
    if extraction is not None:
        maj = records_majority(records, ks, extraction, time_limit, correct=is_correct)
        if maj is not None:
            out["maj_at_k"] = maj
    if parts:
        out["mean_score_parts"] = {name: float(np.mean(v)) for name, v in parts.items()}
    elif 0 < missing < len(records):
        out["score_parts_missing"] = missing
    return out


def parts_warnings(results: dict[str, Any]) -> list[str]:
    """One line per benchmark whose records carry a mix's component rewards (``score_parts``) only in part (records
    of a run resumed from one made before they were recorded): its component means are left out."""
    return [f"{b}: {br['score_parts_missing']} of {br['num_problems']} problems were scored before each component's "
            f"rewards were recorded (score_parts): their means are left out of results.json and table.md (a new "
            f"--out scores every problem with them)"
            for b, br in results.get("benchmarks", {}).items() if br.get("score_parts_missing")]


def results_from_samples(out_dir: str | Path, benchmarks: list[str] | None = None, *,
                         ks: list[int] | None = None, expected: dict[str, int] | None = None,
                         meta: dict[str, Any] | None = None, extra_ks: list[int] | None = None,
                         time_limit: float | None = DEFAULT_TIME_LIMIT) -> dict[str, Any]:
    """The results of a run directory (every ``samples_*.jsonl`` there, or the given benchmarks).

    ``expected`` (benchmark -> number of problems of this run) marks a benchmark ``complete`` or not, and
    leaves out records past that number (samples of an earlier run with a larger ``--limit``). maj@k under the
    extraction of ``meta``'s ``settings`` (none recorded: the verifier's ``reference``), none when they name a
    ``reward_fn`` (a user's reward scored the responses: no verifier answers to vote with).
    """
    settings = {**LEGACY_SETTINGS, **((meta or {}).get("settings") or {})}
    extraction = None if settings.get("reward_fn") else settings.get("extraction")
    out_dir = Path(out_dir)
    if benchmarks is None:
        benchmarks = sorted(p.name[len("samples_"):-len(".jsonl")] for p in out_dir.glob("samples_*.jsonl"))
    if not benchmarks:
        raise ValueError(f"no samples_*.jsonl files in {out_dir}")
    results: dict[str, Any] = dict(meta or {})
    results["benchmarks"] = {}
    for b in benchmarks:
        recs = read_samples(samples_path(out_dir, b))
        if expected is not None and b in expected:
            recs = {i: r for i, r in recs.items() if i < expected[b]}
        if not recs:
            continue
        summary = summarize_benchmark(list(recs.values()), ks, extra_ks, extraction=extraction, time_limit=time_limit)
        if expected is not None and b in expected:
            summary["complete"] = summary["num_problems"] >= expected[b]
            summary["expected_problems"] = int(expected[b])  # (what `eval report` recomputes over)
        results["benchmarks"][b] = summary
    return results


def recompute_pass_at_k(benchmark_result: dict[str, Any], ks: list[int]) -> dict[str, float]:
    """pass@k for other k from the stored per-problem correct counts."""
    c = np.asarray(benchmark_result["correct_counts"], dtype=np.int64)
    n = np.broadcast_to(np.asarray(benchmark_result["n"], dtype=np.int64), c.shape)
    return {str(k): float(pass_at_k(n, c, k).mean()) for k in ks if k <= int(n.min())}


def load_results(path: str | Path) -> dict[str, Any]:
    """A ``results.json``; a ValueError names the file when it is not UTF-8, not JSON or not results."""
    try:
        res = json.loads(Path(path).read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable results file ({e})") from None
    if not isinstance(res, dict) or "benchmarks" not in res:
        raise ValueError(f"{path}: not a pacs_fast results file (no 'benchmarks' key)")
    wrong = results_error(res)
    if wrong:
        raise ValueError(f"{path}: not a pacs_fast results file as written ({wrong}); write it again with "
                         f"python -m pacs_fast.eval report --out <its folder>")
    return res


def results_error(res: dict) -> str | None:
    """What in ``res`` (a parsed ``results.json``) is not as :func:`results_from_samples` writes it, naming the key,
    or None. Checked: what ``compare`` and ``report`` read (each benchmark's ``n``, ``num_problems``,
    ``correct_counts`` and ``pass_at_k``; the ``settings`` and ``label``). A hand-edited file had failed with a
    bare KeyError or AttributeError, or printed a pass@k of 150%."""
    if not isinstance(res["benchmarks"], dict):
        return "benchmarks is not an object"
    for key in ("label", "model", "revision"):  # (revision: a hub id's commit, where the run recorded one)
        if res.get(key) is not None and not isinstance(res[key], str):
            return f"{key} is not a string"
    if res.get("settings") is not None and not isinstance(res["settings"], dict):
        return "settings is not an object"
    for b, br in res["benchmarks"].items():
        where = f"benchmarks.{b}"
        if not isinstance(br, dict):
            return f"{where} is not an object"
        if not _count(br.get("num_problems")) or not br["num_problems"]:
            return f"{where}.num_problems is not an integer >= 1"
        n, counts = br.get("n"), br.get("correct_counts")
        ns = n if isinstance(n, list) else [n] * br["num_problems"]
        if len(ns) != br["num_problems"] or not all(_count(x) and x >= 1 for x in ns):
            return f"{where}.n is not an integer >= 1 or a list of one per problem"
        if (not isinstance(counts, list) or len(counts) != br["num_problems"]
                or not all(_count(c) and c <= m for c, m in zip(counts, ns))):
            return f"{where}.correct_counts is not a list of one count (0 to n) per problem"
        p = br.get("pass_at_k")
        if not isinstance(p, dict) or not all(k.isdigit() and _real(v) and 0 <= v <= 1 for k, v in p.items()):
            return f"{where}.pass_at_k is not an object of k to a fraction in [0, 1]"
        m = br.get("maj_at_k")
        if m is not None and (not isinstance(m, dict) or not all(k.isdigit() and _real(v) and 0 <= v <= 1
                                                                 for k, v in m.items())):
            return f"{where}.maj_at_k is not an object of k to a fraction in [0, 1]"
        if br.get("mean_score") is not None and not _real(br["mean_score"]):
            return f"{where}.mean_score is not a number"
    return None
