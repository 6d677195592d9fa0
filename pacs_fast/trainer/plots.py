"""PNG plots of a run's curves (matplotlib, headless), written at the end of training."""
from __future__ import annotations

from pathlib import Path

from pacs_fast.files import write_atomic

PANELS = [
    ("train", "reward/mean", "train reward"),
    ("eval", "eval/acc", "held-out accuracy (sampled)"),
    ("eval", "eval/greedy_acc", "held-out accuracy (greedy)"),
    ("train", "entropy", "entropy / token"),
    ("train", "learner/grad_norm", "grad norm"),
    ("train", "response/length", "response length"),
    ("train", "pacs/psi_std", "psi std (group-centred score)"),
    ("train", "pacs/brier", "Brier(sigmoid(psi), R)"),
    ("train", "learner/loss", "loss"),
    ("train", "perf/tokens_per_s", "tokens / s"),
]


def plot_run(run_dir: str | Path, records: list[dict], calibration=None) -> list[Path]:
    """Writes ``run_dir/plots/curves.png`` (and ``calibration.png`` given ``(pred, R)`` arrays).
    Returns the files written (none when matplotlib is missing)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out_dir = Path(run_dir) / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    panels = [p for p in PANELS if any(r.get("kind") == p[0] and r.get(p[1]) is not None for r in records)]
    written = []
    if panels:
        cols = 3
        rows = -(-len(panels) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 2.8 * rows), squeeze=False)
        for ax, (kind, key, title) in zip(axes.flat, panels):
            pts = [(r["step"], r[key]) for r in records if r.get("kind") == kind and r.get(key) is not None]
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if kind == "eval" else None, lw=1.2)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.tight_layout()
        path = out_dir / "curves.png"
        _save(fig, path)
        written.append(path)
    if calibration is not None and len(calibration[0]):
        import numpy as np
        pred, R = (np.asarray(x, dtype=float) for x in calibration)
        bins = np.linspace(0, 1, 11)
        idx = np.clip(np.digitize(pred, bins) - 1, 0, 9)
        xs, ys, ns = [], [], []
        for b in range(10):
            sel = idx == b
            if sel.any():
                xs.append(pred[sel].mean()); ys.append(R[sel].mean()); ns.append(int(sel.sum()))
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.plot([0, 1], [0, 1], "k--", lw=0.8)
        ax.scatter(xs, ys, s=[10 + 60 * n / max(ns) for n in ns])
        ax.set_xlabel("sigmoid(psi) (predicted reward)")
        ax.set_ylabel("verifier reward R")
        ax.set_title("PACS calibration", fontsize=9)
        fig.tight_layout()
        path = out_dir / "calibration.png"
        _save(fig, path)
        written.append(path)
    return written


def _save(fig, path: Path) -> None:
    """Written whole, then renamed over the old plot (a kill mid-write left a 0-byte PNG in its place)."""
    import matplotlib.pyplot as plt

    try:
        write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), fsync=False)
    finally:
        plt.close(fig)
