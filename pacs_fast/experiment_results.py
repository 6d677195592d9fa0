"""The experiment runner's results: per arm and seed the held-out accuracy of every finished run,
paired differences against a baseline arm with percentile-bootstrap intervals over seeds, the
tables of ``results.md`` / ``results.json`` and the curves of ``curves.png``.

Main table: sampled held-out accuracy (``eval/acc``) at step 0, at the end (*final*) and the highest
evaluation after step 0 (*best*, optimistic by construction). Second table: the final greedy
accuracy (``eval/greedy_acc``) and pass@n (``eval/pass@n``, n = ``rollout.eval_n``), also paired. At
``rollout.eval_temperature=0`` (read from each run's ``config.yaml``) the accuracy is the greedy one and
there is no second table.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from pacs_fast.files import write_atomic, write_text_atomic


def eval_records(run_dir: Path) -> list[dict]:
    """The run's ``eval`` records of ``metrics.jsonl`` (step 0 first), with the keys the tables read."""
    from pacs_fast.trainer.metrics import read_jsonl
    path = run_dir / "metrics.jsonl"
    keys = ("eval/acc", "eval/greedy_acc", "eval/pass@n")  # what the tables read, not every metric of the run
    return [r for r in read_jsonl(path, keys=keys) if r.get("kind") == "eval"] if path.is_file() else []


def bootstrap_ci(diffs: np.ndarray, *, n: int = 10_000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``diffs`` (resampling seeds)."""
    if len(diffs) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, len(diffs), size=(n, len(diffs)))].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def finished(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` has finished: its ``summary.json`` (the run's last file) is there and was
    written for the ``train.steps`` its ``config.yaml`` records now. A finished run resumed with more steps
    (``--resume RUN train.steps=N``) and stopped before its new end keeps its older summary: that had counted as
    this end's (a "done" run never resumed, its table row an earlier step's final accuracy). A summary or config
    that cannot be read counts as finished here: :func:`collect` names the run as damaged."""
    import yaml

    path = run_dir / "summary.json"
    if not path.is_file():
        return False
    try:
        steps = json.loads(path.read_text(encoding="utf-8")).get("steps")
        wanted = (yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}).get("train", {}) \
            .get("steps")
    except (OSError, ValueError, AttributeError, yaml.YAMLError):
        return True
    return not (type(steps) is int and type(wanted) is int and steps != wanted)


def collect(jobs: list, damaged: dict | None = None) -> dict:
    """Per arm and seed: step-0, final and best held-out accuracy, final greedy accuracy and
    pass@n, and the curve (finished runs only). A finished run whose files cannot give them (``summary.json``
    unreadable, the step-0 or final evaluation missing or not a number, the final one not the summary's) is left
    out, its reason in ``damaged[(arm, seed)]`` when given."""
    res: dict = {}
    for job in jobs:
        if not finished(job.run_dir):
            continue
        try:
            result = run_result(job.run_dir)
        except ValueError as e:
            if damaged is not None:
                damaged[(job.arm.name, job.seed)] = str(e)
            continue
        res.setdefault(job.arm.name, {})[job.seed] = result
    return res


def run_result(run_dir: Path) -> dict:
    """The table's numbers of a finished run (its ``summary.json`` and ``metrics.jsonl``); a ValueError saying why
    when its files are damaged. The evaluations are read by their
    step: step 0 is the one at step 0, *final* the one at the summary's ``final_eval_step`` (the last one of a
    summary that does not record it), *best* the highest after step 0 (a record lost to a torn line had shifted
    them: the last evaluation read as the final one, another as step 0)."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"summary.json cannot be read ({type(e).__name__})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"summary.json holds a {type(summary).__name__}, not the run's summary")
    records = eval_records(run_dir)
    if not records:  # (a finished run has its step-0 and final evaluations)
        raise ValueError("metrics.jsonl holds no held-out evaluation" if (run_dir / "metrics.jsonl").is_file()
                         else "metrics.jsonl is missing")
    by_step = {}
    for r in records:
        step, acc = r.get("step"), r.get("eval/acc")
        if not _number(step) or step != int(step):  # (a record without its step had crashed the report: KeyError)
            raise ValueError(f"an evaluation has step {step!r}, not a step number")
        if not _number(acc):  # (Infinity, which json reads, had passed as a number: best inf, a NaN interval)
            raise ValueError(f"the evaluation of step {step} has eval/acc {acc!r}, not a number")
        by_step[int(step)] = r
    final_step = summary.get("final_eval_step", max(by_step))
    if 0 not in by_step or final_step not in by_step:
        missing = "step 0" if 0 not in by_step else f"step {final_step} (the final one)"
        raise ValueError(f"metrics.jsonl holds no evaluation of {missing}")
    if max(by_step) > final_step:  # not the run the summary reports (its best had taken a later model's evaluation)
        raise ValueError(f"metrics.jsonl holds an evaluation of step {max(by_step)}, after the final one "
                         f"(step {final_step})")
    final = by_step[final_step]
    after = summary.get("acc_after")
    if isinstance(after, (int, float)) and abs(float(after) - float(final["eval/acc"])) > 1e-9:
        raise ValueError(f"the final evaluation in metrics.jsonl ({final['eval/acc']}) is not summary.json's "
                         f"acc_after ({after})")
    curve = sorted((step, float(r["eval/acc"])) for step, r in by_step.items())
    return {"start": float(by_step[0]["eval/acc"]), "final": float(final["eval/acc"]),
            "best": max((a for step, a in curve if step > 0), default=float(by_step[0]["eval/acc"])),
            "greedy": _value(final.get("eval/greedy_acc")), "pass_n": _value(final.get("eval/pass@n")),
            "curve": curve, "wall_time_s": summary.get("wall_time_s"), "eval_temperature": _eval_temperature(run_dir),
            "code_versions": summary.get("code_versions") or ["unrecorded"]}


def _number(x) -> bool:
    """Whether ``x`` is a finite number (not a bool, None, a string, NaN or infinity)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _value(x) -> float:
    """``x`` as a float, NaN where it is not a finite number (a null greedy accuracy had crashed the report)."""
    return float(x) if _number(x) else float("nan")


def _eval_temperature(run_dir: Path) -> float | None:
    """``rollout.eval_temperature`` of the run (its ``config.yaml``): at 0 the held-out accuracy is greedy."""
    import yaml

    try:
        value = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("rollout", {}).get("eval_temperature")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def _mean_std(v: np.ndarray) -> tuple[float, float]:
    """Mean and sample std of the finite values of ``v`` (NaN where there are none / fewer than two)."""
    v = v[np.isfinite(v)]
    return (float(v.mean()) if len(v) else float("nan")), (float(v.std(ddof=1)) if len(v) > 1 else float("nan"))


def _some(v: np.ndarray) -> str:
    """`` (k of n seeds)`` where only k of the n seeds have a value, else nothing."""
    k = int(np.isfinite(v).sum())
    return f" ({k} of {len(v)} seeds)" if 0 < k < len(v) else ""


def _fmt(m, s):
    """mean ± std; the mean alone where there is no spread to show (one seed: std undefined); "no value" where
    no seed has one."""
    return "no value" if m != m else f"{m:.3f}" if s != s else f"{m:.3f} ± {s:.3f}"


def _json_safe(x):
    """``x`` with NaN / inf floats as null (strict JSON: a missing interval or value is null, not NaN)."""
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, float) and not np.isfinite(x):
        return None
    return x


MAIN = ("start", "final", "best")
FINAL_OTHER = ("greedy", "pass_n")
NAMES = {"start": "step 0", "final": "final", "best": "best", "greedy": "greedy (final)", "pass_n": "pass@n (final)"}


def table(res: dict, arms: list, baseline: str | None, keys: tuple = MAIN) -> tuple[str, dict]:
    """Markdown table of ``keys`` (mean ± std over seeds) and, for every key but ``start``, the
    paired difference to ``baseline``; and the same numbers as a dict."""
    paired = [k for k in keys if k != "start"] if baseline else []  # (no --baseline: no difference columns)
    columns = ["arm", "seeds"] + [NAMES[k] for k in keys] + [f"{NAMES[k].split(' ')[0]} − {baseline} (95% CI)"
                                                              for k in paired]
    lines = ["| " + " | ".join(columns) + " |", "|---|---|" + "---|" * (len(keys) + len(paired))]
    stats: dict = {}
    notes: list[str] = []
    base = res.get(baseline, {}) if baseline else {}
    for arm in arms:
        runs = res.get(arm.name, {})
        if not runs:
            lines.append(f"| {arm.name} | 0 |" + " |" * (len(keys) + len(paired)))
            continue
        row = {k: np.array([runs[s].get(k, np.nan) for s in sorted(runs)], dtype=float) for k in keys}
        st = {k: _mean_std(v) for k, v in row.items()}  # over the seeds with a value (a null one is no 0)
        cells = [arm.name, str(len(runs))] + [_fmt(*st[k]) + _some(row[k]) for k in keys]
        for k in keys:
            lacking = [s for s, x in zip(sorted(runs), row[k]) if not np.isfinite(x)]
            if lacking:
                notes.append(f"{arm.name}: {NAMES[k]}: seed(s) {lacking} have no value: "
                             + ("no mean" if len(lacking) == len(runs) else
                                f"the mean takes the other {len(runs) - len(lacking)}")
                             + (", the difference the seeds with a value in both arms" if k in paired else ""))
        entry = {"seeds": sorted(runs), **{k: {"mean": m, "std": s, "per_seed": row[k].tolist()}
                                           for k, (m, s) in st.items()}}
        for k in paired:
            common = [s for s in sorted(set(runs) & set(base))
                      if np.isfinite(runs[s].get(k, np.nan)) and np.isfinite(base[s].get(k, np.nan))]
            if baseline and arm.name != baseline and common:
                d = np.array([runs[s][k] - base[s][k] for s in common])
                lo, hi = bootstrap_ci(d)
                ci = f"[{lo:+.3f}, {hi:+.3f}]" if len(d) > 1 else "[no interval: one seed]"
                cells.append(f"{d.mean():+.3f} {ci} (n={len(d)})")
                entry[f"{k}_minus_{baseline}"] = {"mean": float(d.mean()), "ci95": [lo, hi],
                                                  "per_seed": d.tolist(), "seeds": common}
            elif baseline and arm.name != baseline and set(runs) & set(base):
                cells.append("no seed with a value in both")
            else:
                cells.append("")
        stats[arm.name] = entry
        lines.append("| " + " | ".join(cells) + " |")
        alone, base_alone = sorted(set(runs) - set(base)), sorted(set(base) - set(runs))
        if baseline and arm.name != baseline and paired and alone:  # the mean and the difference differ in seeds
            notes.append(f"{arm.name}: seed(s) {alone} have no finished {baseline} run: the differences pair "
                         f"seeds {sorted(set(runs) & set(base))}, the mean takes all {len(runs)}")
        if baseline and arm.name != baseline and paired and base_alone and set(runs) & set(base):
            notes.append(f"{baseline}: seed(s) {base_alone} have no finished {arm.name} run: the differences of "
                         f"{arm.name} pair seeds {sorted(set(runs) & set(base))}, {baseline}'s mean takes all "
                         f"{len(base)} (the difference is not the difference of the two means)")
    few = sorted({len(e[f"{k}_minus_{baseline}"]["seeds"]) for e in stats.values() for k in paired
                  if f"{k}_minus_{baseline}" in e} & {2, 3, 4})
    if few:  # the percentile bootstrap over n seeds covers less than its level when n is small
        notes.append(f"with {' or '.join(map(str, few))} paired seeds the percentile bootstrap's interval is narrower "
                     f"than 95% (at 2 seeds it is the range of the two differences)")
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else [])), stats


def curve_steps_left_out(runs: dict) -> list[int]:
    """The evaluation steps of an arm's ``runs`` that some of its seeds have and others not: :func:`plot` leaves
    them out (its mean and band are over every seed at each step)."""
    steps = [set(dict(r["curve"])) for r in runs.values()]
    return sorted(set.union(*steps) - set.intersection(*steps)) if steps else []


def plot(res: dict, arms: list, path: Path, title: str, kind: str = "sampled") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
    for arm in arms:
        runs = res.get(arm.name, {})
        curves = [dict(r["curve"]) for r in runs.values()]
        steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
        if not steps:
            continue
        acc = np.array([[c[s] for s in steps] for c in curves])
        m, sd = acc.mean(0), acc.std(0, ddof=1) if len(acc) > 1 else np.zeros(len(steps))
        line, = ax.plot(steps, m, label=f"{arm.name} (n={len(acc)})")
        ax.fill_between(steps, m - sd, m + sd, alpha=0.15, color=line.get_color())
    ax.set_xlabel("RL step")
    ax.set_ylabel(f"held-out accuracy ({kind})")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png"), fsync=False)
    plt.close(fig)


def unfinished(jobs: list, res: dict, damaged: dict | None = None) -> list[str]:
    """One line per arm whose runs of some seeds did not finish (not in the tables), and one per damaged run
    (``damaged``: :func:`collect`'s)."""
    missing: dict = {}
    damaged = damaged or {}
    for job in jobs:
        if job.seed not in res.get(job.arm.name, {}) and (job.arm.name, job.seed) not in damaged:
            missing.setdefault(job.arm.name, []).append(job.seed)
    return ([f"{arm}: seed(s) {seeds} did not finish (no summary.json of its train.steps and held-out "
             f"evaluations): not in the tables" for arm, seeds in missing.items()]
            + [f"{arm}: seed {seed} finished, but its files are damaged ({why}): not in the tables"
               for (arm, seed), why in damaged.items()])


class ReportNotWritten(OSError):
    """The report's files could not be written (``md``: the report, to print all the same)."""

    def __init__(self, md: str, error: OSError, path: Path):
        super().__init__(f"cannot write {path} ({error.strerror or error}); the table above was not saved")
        self.md = md


def report(jobs: list, arms: list, baseline: str | None, out: Path, header: str,
           collected: tuple[dict, dict] | None = None) -> str:
    """``results.md`` (returned), ``results.json`` and ``curves.png`` of the finished runs of ``jobs``
    (``collected``: :func:`collect`'s results and damaged runs when the caller has read them); a
    :class:`ReportNotWritten` (holding the report) when a file cannot be written (a full disk, a read-only
    folder)."""
    damaged: dict = {}
    res = collect(jobs, damaged) if collected is None else collected[0]
    damaged = damaged if collected is None else collected[1]
    missing = unfinished(jobs, res, damaged)
    if missing:
        header += "\n\n" + "\n".join(f"- {line}" for line in missing)
    text, stats = table(res, arms, baseline)
    temps = {r["eval_temperature"] for runs in res.values() for r in runs.values()
             if r.get("eval_temperature") is not None}
    greedy = temps == {0.0}  # rollout.eval_temperature=0: eval/acc is the greedy accuracy, one response a problem
    kind = "greedy" if greedy else "sampled"
    paired = ("; differences paired by seed, percentile bootstrap over seeds, 10,000 resamples"
              if baseline else "")
    md = f"{header}\n\nHeld-out {kind} accuracy (mean ± std over seeds, the sample std{paired}).\n\n{text}\n\n"
    versions: dict = {}  # the pacs_fast versions that trained each run (summary.json; older runs: unrecorded)
    for arm, runs in res.items():
        for seed, r in runs.items():
            versions.setdefault(" then ".join(r.get("code_versions") or ["unrecorded"]), []).append(f"{arm}/seed{seed}")
    if len(versions) > 1:
        md += ("The runs were trained by different pacs_fast code (sampling, training or defaults may differ between "
               "versions; pair runs of one version): " + "; ".join(f"{v}: {', '.join(runs)}"
                                                                 for v, runs in sorted(versions.items())) + ".\n\n")
    partial = {arm.name: dropped for arm in arms if (dropped := curve_steps_left_out(res.get(arm.name, {})))}
    if partial:  # (another train.eval_every in some seeds' runs, or a resume that changed it)
        md += ("curves.png plots each arm at the steps every seed of it evaluated; left out, evaluated by only some "
               "seeds: " + "; ".join(f"{arm}: steps {steps}" for arm, steps in partial.items()) + ".\n\n")
    if len(temps) > 1:
        md += (f"The runs were evaluated at different rollout.eval_temperature ({sorted(temps, key=str)}): their "
               f"accuracies are not the same quantity.\n\n")
    if greedy:
        md += ("rollout.eval_temperature=0: the accuracy above is greedy (one response per problem); there is no "
               "separate greedy accuracy or pass@n.\n")
    else:
        text2, stats2 = table(res, arms, baseline, FINAL_OTHER)
        for arm, entry in stats2.items():
            stats.setdefault(arm, {}).update({k: v for k, v in entry.items() if k != "seeds"})
        md += (f"At the final evaluation: greedy accuracy and pass@n (n = rollout.eval_n samples per problem), "
               f"{'paired the same way' if baseline else 'mean ± std over seeds'}.\n\n{text2}\n")
    path = out / "results.md"
    try:
        write_text_atomic(path, md)
        path = out / "results.json"
        write_text_atomic(path, json.dumps(_json_safe({"stats": stats, "runs": {
            a: {str(s): r for s, r in v.items()} for a, v in res.items()}}), indent=1, allow_nan=False))
        if res:
            path = out / "curves.png"
            plot(res, arms, path, header.splitlines()[0].lstrip("# "), kind)
    except OSError as e:
        raise ReportNotWritten(md, e, path) from e
    return md
