"""Figures of the paper from runs' metrics.jsonl: Fig. 1 (accuracy vs epoch), Fig. 4 (Assumption 1)
and Fig. 5 (the four Lemma-1 losses).

    python recipes/plot.py runs/c10-* --out results/figures
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

LEMMA_LOSSES = ("ucl", "scl", "hucl", "hscl")


def read_run(run: Path) -> tuple[str, list[dict]]:
    """(label, per-epoch records) of one run directory."""
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise SystemExit(f"error: {run} has no metrics.jsonl; pass output_dirs of recipes/pretrain.py.")
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else {}
    label = f"{config.get('method', run.name)} (seed {config['seed']})" if "seed" in config else config.get("method", run.name)
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"error: {metrics} holds no epoch yet; plot a run once it has finished an epoch.")
    return label, rows


def plot_runs(runs: list[Path], out: Path) -> list[Path]:
    """Write fig1_accuracy.png, fig4_assumption.png and fig5_losses.png into `out`; return their paths."""
    data = [read_run(r) for r in runs]
    labels = [label for label, _ in data]
    # runs sharing method and seed (e.g. two datasets) are told apart by their directory names
    data = [(f"{label} [{run.name}]" if labels.count(label) > 1 else label, rows) for run, (label, rows) in zip(runs, data)]
    return plot_histories(data, out)


def plot_histories(data: list[tuple[str, list[dict]]], out: Path) -> list[Path]:
    """The three figures from (label, per-epoch records) pairs."""
    if not data:
        raise ValueError("nothing to plot: pass at least one run.")
    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rows in data:
        ax.plot([r["epoch"] for r in rows], [r.get("knn_top1", float("nan")) for r in rows], marker="o", label=label)
    ax.set(xlabel="epoch", ylabel="kNN top-1 on the test split (%)", title="Accuracy vs epoch (paper Fig. 1)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "fig1_accuracy.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rows in data:
        ax.plot([r["epoch"] for r in rows], [100 * r.get("assumption_fraction", float("nan")) for r in rows], marker="o", label=label)
    ax.axhline(95, color="grey", linestyle="--", linewidth=1, label="95% (paper's claim)")
    ax.set(xlabel="epoch", ylabel="anchors satisfying Assumption 1 (%)", title="Assumption 1 (paper Fig. 4)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "fig4_assumption.png"))

    cols = min(len(data), 3)
    rows_n = (len(data) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.5 * cols, 3.5 * rows_n), squeeze=False)
    for ax, (label, rows) in zip(axes.flat, data):
        for name in LEMMA_LOSSES:
            ax.plot([r["epoch"] for r in rows], [r.get(f"loss_{name}", float("nan")) for r in rows], label=f"L_{name.upper()}")
        ax.set(xlabel="epoch", ylabel="loss (label positives)", title=label)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    fig.suptitle("The four losses of Lemma 1 (paper Fig. 5)")
    written.append(_save(fig, out / "fig5_losses.png"))
    return written


def _save(fig, path: Path) -> Path:
    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="output_dirs of recipes/pretrain.py")
    parser.add_argument("--out", type=Path, default=Path("results/figures"))
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    paths = plot_runs(args.runs, args.out)
    print("wrote " + ", ".join(str(p) for p in paths))
    return paths


if __name__ == "__main__":
    main()
