"""``python -m pacs_fast.eval compare a.json b.json --out plot.png [--table table.md]``: one table and one pass@k
plot for several ``results.json`` files, refusing an output path that would replace an input or an eval folder's
records."""
from __future__ import annotations

import sys
from pathlib import Path

from pacs_fast.evaluation.args import ArgumentParser, UsageError
from pacs_fast.evaluation.parser import int_list
from pacs_fast.evaluation.report import comparison_warnings, markdown_table, plot_pass_at_k
from pacs_fast.evaluation.results import load_results
from pacs_fast.files import write_text_atomic


def _eval_record(name: str) -> bool:
    """Whether a file named ``name`` is one an eval folder keeps its samples, settings or results in (what
    ``compare --table`` / ``--out`` must not replace: the samples are hours of sampling)."""
    return (name.startswith("samples_") and name.endswith(".jsonl")) or name in ("results.json", "run_config.json")


def compare(argv: list[str]) -> int:
    p = ArgumentParser(prog="python -m pacs_fast.eval compare",
                                description="One table and one pass@k plot for several results.json files")
    p.add_argument("results", nargs="+", help="results.json files (or run folders holding one)")
    p.add_argument("--out", required=True, help="PNG path of the pass@k plot")
    p.add_argument("--table", default=None, help="also write the markdown table here")
    p.add_argument("--labels", default=None, help="comma-separated model names, one per results file")
    p.add_argument("--table-k", type=int_list, default=None)
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = p.parse_args(argv)
    args.out = str(Path(args.out).expanduser())  # (--out=~/x: the shell leaves that ~)
    args.table = str(Path(args.table).expanduser()) if args.table else None
    args.results = [str(Path(r).expanduser()) for r in args.results]
    results, inputs = [], set()
    for r in args.results:
        path = Path(r) / "results.json" if Path(r).is_dir() else Path(r)
        if not path.is_file():
            raise UsageError(f"no results file {path}")
        results.append(load_results(path))
        inputs.add(path.resolve())
    for flag, target in (("--out", args.out), ("--table", args.table)):  # (--table a/results.json replaced it)
        if target and Path(target).is_dir():
            raise UsageError(f"{flag} {target} is a folder: give the path of the file to write")
        if target and Path(target).resolve() in inputs:
            raise UsageError(f"{flag} {target} is one of the results files compared: it would be overwritten; "
                             f"give another path")
        if target and Path(target).is_file() and _eval_record(Path(target).name):  # (--table samples_amc23.jsonl,
            raise UsageError(f"{flag} {target} is an eval folder's {Path(target).name}: it would be replaced by "
                             f"the {'table' if flag == '--table' else 'plot'}; give another path")  # had lost them)
    if args.table and Path(args.table).resolve() == Path(args.out).resolve():
        raise UsageError(f"--table {args.table} and --out are one file: the table would replace the plot")
    if args.labels is not None:  # (--labels "", an unset shell variable: one empty label, not the defaults)
        labels = [lab.strip() for lab in args.labels.split(",")]
        if len(labels) != len(results) or not all(labels):
            raise UsageError(f"--labels: {len(labels)} labels for {len(results)} results files" if all(labels) else
                             f"--labels {args.labels!r}: label {labels.index('') + 1} is empty")
        for r, lab in zip(results, labels):
            r["label"] = lab
    for line in comparison_warnings(results):
        print(f"warning: {line}", file=sys.stderr)
    table = markdown_table(results, args.table_k)
    plot_pass_at_k(results, args.out)
    if args.table:
        write_text_atomic(args.table, table)
    print(table)
    return 0
