"""Which benchmarks an eval folder's results cover: every benchmark sampled there (every ``samples_*.jsonl``; the
folder's ``run_config.json`` holds them all to one set of settings), not only those of the last command. A folder
filled one benchmark per command had kept only the last one's in ``results.json``, and ``report`` and ``compare``
then left the others out without a word."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pacs_fast.evaluation.results import load_results


def sampled_benchmarks(out_dir: Path) -> list[str]:
    """The benchmarks with a samples file in ``out_dir``, by name."""
    return sorted(p.name[len("samples_"):-len(".jsonl")] for p in Path(out_dir).glob("samples_*.jsonl"))


def previous_results(out_dir: Path) -> tuple[dict[str, Any], str | None]:
    """The folder's ``results.json`` (``{}`` when there is none), and the reason it could not be read (then ``{}``
    too: what ``report`` is for is writing it again)."""
    path = Path(out_dir) / "results.json"
    if not path.is_file():
        return {}, None
    try:
        return load_results(path), None
    except ValueError as e:
        return {}, str(e)


def expected_counts(prev: dict[str, Any]) -> dict[str, int]:
    """The number of problems each benchmark's run asked for, as ``prev`` (a ``results.json``) recorded it (files
    written before ``expected_problems`` existed: the count of a complete benchmark)."""
    expected = {}
    for b, br in prev.get("benchmarks", {}).items():
        if br.get("expected_problems") or br.get("complete"):
            expected[b] = br.get("expected_problems") or br["num_problems"]
    return expected


def covered_benchmarks(out_dir: Path, prev: dict[str, Any], asked: dict[str, int]) -> tuple[list[str], dict]:
    """The benchmarks the folder's results cover and the problems each run asked for: ``asked`` (this command's,
    with their counts) first, then every other benchmark sampled in ``out_dir`` or named by ``prev`` (the folder's
    last ``results.json``, which gives its count where it names one)."""
    expected = {**expected_counts(prev), **asked}
    names = list(asked) + [b for b in [*prev.get("benchmarks", {}), *sampled_benchmarks(out_dir)] if b not in asked]
    names = list(dict.fromkeys(names))
    return names, {b: expected[b] for b in names if b in expected}


def lost_benchmarks(prev: dict[str, Any], results: dict[str, Any], asked=()) -> list[str]:
    """The benchmarks ``prev`` (the folder's last ``results.json``) lists, besides ``asked``, that ``results`` lack:
    their samples file is missing or empty now (the caller refuses or warns: results written without them lose
    them for good)."""
    return [b for b in prev.get("benchmarks", {}) if b not in asked and b not in results["benchmarks"]]


def coverage_warnings(results: dict[str, Any], expected: dict[str, int], gone: list[str] = ()) -> list[str]:
    """One line per benchmark of ``results`` whose run's problem count is unknown (``expected`` lacks it: sampled by
    a run that wrote no ``results.json``, which every finished run writes, or whose ``results.json`` an earlier
    version replaced with another benchmark's), and per benchmark of ``gone`` (listed
    by the folder's last ``results.json``, its samples file missing or empty now: left out)."""
    lines = [f"{b}: the folder's results.json does not say how many problems its run asked for (that run may not "
             f"have finished, or a version before 2026-12-02 wrote another benchmark's results over it): its pass@k "
             f"covers the {br['num_problems']} problems sampled so far; rerun its eval command to complete it"
             for b, br in results["benchmarks"].items() if b not in expected]
    lines += [f"{b}: the folder's results.json listed it, but its samples file is missing or empty: left out of "
              f"the results" for b in gone]
    return lines
