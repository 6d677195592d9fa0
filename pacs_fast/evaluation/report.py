"""The pass@k table (the paper's layout) and the pass@k curves plot."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pacs_fast.data.datasets import DISPLAY_NAMES
from pacs_fast.evaluation.results import LEGACY_SETTINGS, recompute_pass_at_k
from pacs_fast.files import write_atomic

BENCHMARK_ORDER = ["math500", "amc23", "aime2024", "aime2025"]
TABLE_KS = [1, 16, 256]


def _label(res: dict[str, Any], i: int) -> str:
    return str(res.get("label") or res.get("model") or f"model {i + 1}")


def _ordered(benchmarks) -> list[str]:
    known = [b for b in BENCHMARK_ORDER if b in benchmarks]
    return known + sorted(b for b in benchmarks if b not in BENCHMARK_ORDER)


def _n_min(bench_result: dict[str, Any]) -> int:
    n = bench_result["n"]
    return int(min(n)) if isinstance(n, list) else int(n)


def table_ks(n_min: int, ks: list[int] | None = None) -> list[int]:
    """The k shown for a benchmark: ``ks`` (default 1, 16, 256) capped at n, plus n itself when
    some requested k exceeds it (MATH-500 at n = 32: 1, 16, 32)."""
    ks = TABLE_KS if ks is None else ks
    out = sorted({k for k in ks if k <= n_min})
    if any(k > n_min for k in ks) and n_min not in out:
        out.append(n_min)
    return out


def comparison_warnings(results: list[dict[str, Any]]) -> list[str]:
    """What makes a table of these results mislead (``python -m pacs_fast.eval compare``): a benchmark whose
    results hold different problems (another file of the same name, a ``--limit``: their pass@k are not
    comparable), results made with other sampling settings (:data:`COMPARED_SETTINGS`), and two rows with one
    label (``--labels`` names them)."""
    lines = []
    for b in _ordered({b for r in results for b in r["benchmarks"]}):
        held = [(i, r["benchmarks"][b]) for i, r in enumerate(results) if b in r["benchmarks"]]
        if all(br.get("problems_sha1") for _, br in held):  # the problems' texts, where every result has them
            keys = {br["problems_sha1"] for _, br in held}
        else:  # results written before: their ids (rows without an id field are numbered 0..N-1)
            keys = {tuple(sorted(map(str, br.get("ids") or []))) or br.get("num_problems") for _, br in held}
        if len(keys) > 1:
            sizes = ", ".join(f"{_label(results[i], i)}: {br.get('num_problems', '?')}" for i, br in held)
            lines.append(f"{DISPLAY_NAMES.get(b, b)}: the results evaluated different problems ({sizes} problems): "
                         f"their pass@k are not comparable")
    labels = [_label(r, i) for i, r in enumerate(results)]
    lines += _settings_warnings(results, labels)
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        shared = sum(labels.count(x) for x in repeated)
        lines.append(f"{shared} rows share a label ({', '.join(map(repr, repeated))}): name them with --labels")
    return lines


def incomplete_warnings(results: dict[str, Any], *, had_results: bool, out_dir: Path) -> list[str]:
    """What ``python -m pacs_fast.eval report`` should say of a run it recomputes that did not finish: a benchmark
    with fewer problems than its run asked for (``complete`` false), or, without the run's own ``results.json``
    (every finished run writes one), every benchmark: the table covers the problems sampled so far."""
    short = {b: br for b, br in results["benchmarks"].items() if br.get("complete") is False}
    lines = [f"{DISPLAY_NAMES.get(b, b)}: {br['num_problems']} of the {br['expected_problems']} problems its run "
             f"asked for are sampled (the run did not finish): its pass@k is over those only; rerun the eval "
             f"command to sample the rest" for b, br in short.items()]
    if not had_results:
        counts = ", ".join(f"{b}: {br['num_problems']}" for b, br in results["benchmarks"].items())
        lines.append(f"{out_dir} has no results.json, which a finished run writes: the run that sampled these "
                     f"problems ({counts}) may not have finished, and the table covers them only; rerun its eval "
                     f"command to complete it")
    return lines


# the sampling settings of run_config.json that change pass@k (n and the seed do not: pass@k is unbiased in n)
COMPARED_SETTINGS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "stop", "system", "instruction",
                     "template_kwargs", "prompt_template", "extraction", "reward_fn", "reward_fields", "reward_weights",
                     "engine", "dtype")


def _settings_warnings(results: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """One line naming the sampling settings that differ between results that recorded theirs (``settings``):
    greedy against sampled, another response budget, prompt or verifier extraction."""
    held = [(lab, {**LEGACY_SETTINGS, **r["settings"]}) for lab, r in zip(labels, results)
            if isinstance(r.get("settings"), dict)]
    # a setting a result did not record (written before it was) is unknown there, not a difference
    diff = [k for k in COMPARED_SETTINGS if len({repr(st[k]) for _, st in held if k in st}) > 1]
    if not diff:
        return []
    shown = "; ".join(f"{k}: " + ", ".join(f"{lab} {str(st[k])[:40]!r}" if k in st else f"{lab} (not recorded)"
                                          for lab, st in held) for k in diff)
    return [f"the results were made with other settings ({shown}): their pass@k compare the settings too"]


def markdown_table(results: list[dict[str, Any]], ks: list[int] | None = None) -> str:
    """One row per model, one column group per benchmark (MATH-500, AMC23, AIME 2024, AIME 2025,
    then others), pass@k in percent with two decimals, the best value of each column in bold,
    and an average of pass@1 over the benchmarks. A cell is ``-`` where a model lacks the result.
    """
    if not results:
        raise ValueError("markdown_table: no results")
    benches = _ordered({b for r in results for b in r["benchmarks"]})
    columns: list[tuple[str, int]] = []
    for b in benches:
        n_min = min(_n_min(r["benchmarks"][b]) for r in results if b in r["benchmarks"])
        columns += [(b, k) for k in table_ks(n_min, ks)]
    values: list[list[float | None]] = []
    for r in results:
        row = []
        for b, k in columns:
            br = r["benchmarks"].get(b)
            if br is None:
                row.append(None)
                continue
            v = br["pass_at_k"].get(str(k))
            if v is None:
                v = recompute_pass_at_k(br, [k]).get(str(k))
            row.append(None if v is None else 100.0 * v)
        p1 = [100.0 * v for b in benches if b in r["benchmarks"]  # (pass@1 from the counts where not stored)
              for v in [r["benchmarks"][b]["pass_at_k"].get("1", recompute_pass_at_k(r["benchmarks"][b], [1]).get("1"))]
              if v is not None]
        row.append(sum(p1) / len(p1) if p1 and len(p1) == len(benches) else None)
        values.append(row)
    headers = [f"{DISPLAY_NAMES.get(b, b)} pass@{k}" for b, k in columns] + ["Avg. pass@1"]
    return _percent_table(results, headers, values) + majority_table(results, ks) + component_table(results)


def _percent_table(results: list[dict[str, Any]], headers: list[str], values: list[list[float | None]]) -> str:
    """Markdown rows of percentages (one row of ``values`` per result, two decimals, ``-`` for None), the best of
    each column in bold when there are several results."""
    best = [max((row[j] for row in values if row[j] is not None), default=None) for j in range(len(headers))]
    lines = ["| Model | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
    for i, (r, row) in enumerate(zip(results, values)):
        cells = []
        for j, v in enumerate(row):
            if v is None:
                cells.append("-")
            elif len(results) > 1 and best[j] is not None and f"{v:.2f}" == f"{best[j]:.2f}":  # (as printed)
                cells.append(f"**{v:.2f}**")
            else:
                cells.append(f"{v:.2f}")
        lines.append(f"| {_label(r, i)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def majority_table(results: list[dict[str, Any]], ks: list[int] | None = None) -> str:
    """maj@k (``maj_at_k``, :mod:`pacs_fast.evaluation.majority`) in percent, after a blank line: a column per
    benchmark and k of the pass@k table (:func:`table_ks`) that every result holding the benchmark has (results
    written before maj@k, or scored by a user's reward, have none: their benchmarks get no column); ``""`` when no
    column is left."""
    columns: list[tuple[str, int]] = []
    for b in _ordered({b for r in results for b in r["benchmarks"]}):
        held = [r["benchmarks"][b] for r in results if b in r["benchmarks"]]
        if not all(isinstance(br.get("maj_at_k"), dict) for br in held):
            continue
        n_min = min(_n_min(br) for br in held)
        columns += [(b, k) for k in table_ks(n_min, ks) if all(str(k) in br["maj_at_k"] for br in held)]
    if not columns:
        return ""
    values = [[100.0 * r["benchmarks"][b]["maj_at_k"][str(k)] if b in r["benchmarks"] else None for b, k in columns]
              for r in results]
    headers = [f"{DISPLAY_NAMES.get(b, b)} maj@{k}" for b, k in columns]
    return ("\nMajority vote (maj@k: the answer most of k samples agree on, scored against the gold):\n\n"
            + _percent_table(results, headers, values))


def _component_specs(result: dict[str, Any]) -> dict[str, str]:
    """A result's component names (as ``mean_score_parts`` keys them: the function's name, or its whole spec where
    two share one) -> the whole spec (``module:function``, or ``verifier``), from its recorded ``--reward-fn``."""
    from pacs_fast.config.reward_specs import component_names, reward_specs

    spec = (result.get("settings") or {}).get("reward_fn") or ""
    specs = reward_specs(spec) if spec else []
    return dict(zip(component_names(specs), specs)) if specs else {}


def _header(columns: list[tuple[str, str | None]], bench: str, full: str | None) -> str:
    """A component column's head: ``(mix)`` for the mixed reward, else the function's name, or its whole spec
    where two functions of one name share the benchmark."""
    if full is None:
        return "(mix)"
    name = full.rsplit(":", 1)[-1]
    namesakes = {f for b, f in columns if b == bench and f is not None and f.rsplit(":", 1)[-1] == name}
    return full if len(namesakes) > 1 else name


def component_table(results: list[dict[str, Any]]) -> str:
    """For results scored by a mix of rewards (``mean_score_parts``): a second table of the mean mixed reward
    (``(mix)``: no function is named so) and each component's mean reward per benchmark (three decimals), after a
    blank line; ``""`` when none was. A column is one function (its whole spec, from each result's recorded
    ``--reward-fn``), headed by its name, or by its spec where two functions of one name appear."""
    benches = _ordered({b for r in results for b, br in r["benchmarks"].items() if br.get("mean_score_parts")})
    if not benches:
        return ""
    specs = [_component_specs(r) for r in results]
    columns: list[tuple[str, str | None]] = []
    for b in benches:
        seen: list[str] = []
        for r, spec_of in zip(results, specs):
            for name in (r["benchmarks"].get(b) or {}).get("mean_score_parts") or {}:
                full = spec_of.get(name, name)
                if full not in seen:
                    seen.append(full)
        columns += [(b, None)] + [(b, full) for full in seen]
    headers = [f"{DISPLAY_NAMES.get(b, b)} {_header(columns, b, full)}" for b, full in columns]
    lines = ["", "Mean reward (the mix, then each component):", "",
             "| Model | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
    for i, (r, spec_of) in enumerate(zip(results, specs)):
        cells = []
        for b, full in columns:
            br = r["benchmarks"].get(b) or {}
            if full is None:
                v = br.get("mean_score")
            else:
                by_spec = {spec_of.get(n, n): x for n, x in (br.get("mean_score_parts") or {}).items()}
                v = by_spec.get(full)
            cells.append("-" if v is None else f"{v:.3f}")
        lines.append(f"| {_label(r, i)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_pass_at_k(results: list[dict[str, Any]], path: str | Path) -> Path:
    """A PNG with one panel per benchmark: pass@k (%) against k (log2 axis), one line per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    benches = _ordered({b for r in results for b in r["benchmarks"]})
    if not benches:
        raise ValueError("plot_pass_at_k: no benchmarks in the results")
    fig, axes = plt.subplots(1, len(benches), figsize=(4.2 * len(benches), 3.6), squeeze=False)
    for ax, b in zip(axes[0], benches):
        for i, r in enumerate(results):
            br = r["benchmarks"].get(b)
            if br is None:
                continue
            ks = sorted(int(k) for k in br["pass_at_k"])
            ax.plot(ks, [100.0 * br["pass_at_k"][str(k)] for k in ks], marker="o", markersize=3,
                    label=_label(r, i))
        ax.set_xscale("log", base=2)
        ax.set_title(DISPLAY_NAMES.get(b, b))
        ax.set_xlabel("k")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("pass@k (%)")
    axes[0][-1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # written whole, then renamed over the old plot
        write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png"), fsync=False)
    finally:
        plt.close(fig)
    return path
