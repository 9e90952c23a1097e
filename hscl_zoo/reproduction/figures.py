"""The paper's figures from per-epoch records: Fig. 1 (accuracy vs epoch), Fig. 4 (Assumption 1),
Fig. 5 (the four Lemma-1 losses), and what H-SCL(tau)'s threshold kept."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

LEMMA_LOSSES = ("ucl", "scl", "hucl", "hscl")
Series = tuple[str, list[dict]]


def read_run_dir(run: Path) -> Series:
    """(label, per-epoch records) of one pretraining output_dir."""
    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise ValueError(f"{run} has no metrics.jsonl; pass output_dirs of recipes/pretrain.py.")
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").is_file() else {}
    label = f"{config.get('method', run.name)} (seed {config['seed']})" if "seed" in config else config.get("method", run.name)
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{metrics} holds no epoch yet; plot a run once it has finished an epoch.")
    return label, rows


def plot_run_dirs(runs: list[Path], out: Path) -> list[Path]:
    """The figures for pretraining output_dirs; runs sharing a label are told apart by directory name."""
    data = [read_run_dir(r) for r in runs]
    labels = [label for label, _ in data]
    data = [(f"{label} [{run.name}]" if labels.count(label) > 1 else label, rows) for run, (label, rows) in zip(runs, data)]
    return plot_histories(data, out)


def plot_histories(data: list[Series], out: Path) -> list[Path]:
    """fig1_accuracy.png, fig4_assumption.png, fig5_losses.png (and fig_threshold.png when a series
    logged a threshold) in `out`, from (label, per-epoch records) pairs; returns the paths."""
    if not data:
        raise ValueError("nothing to plot: pass at least one run.")
    out.mkdir(parents=True, exist_ok=True)
    written = [
        _curves(data, "knn_top1", 1, "kNN top-1 on the test split (%)", "Accuracy vs epoch (paper Fig. 1)",
                out / "fig1_accuracy.png"),
        _curves(data, "assumption_fraction", 100, "anchors satisfying Assumption 1 (%)", "Assumption 1 (paper Fig. 4)",
                out / "fig4_assumption.png", level=(95, "95% (paper's claim)")),
        _loss_panels(data, out / "fig5_losses.png"),
    ]
    tau = [(label, rows) for label, rows in data if "threshold_kept_fraction" in rows[0]]
    if tau:
        written.append(_curves(tau, "threshold_kept_fraction", 100, "other-label negatives kept (%)",
                               "What H-SCL(tau)'s threshold kept", out / "fig_threshold.png"))
    return written


def _curves(data: list[Series], key: str, scale: float, ylabel: str, title: str, path: Path,
            level: tuple[float, str] | None = None) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rows in data:
        ax.plot([r["epoch"] for r in rows], [scale * r.get(key, float("nan")) for r in rows], marker="o", label=label)
    if level is not None:
        ax.axhline(level[0], color="grey", linestyle="--", linewidth=1, label=level[1])
    ax.set(xlabel="epoch", ylabel=ylabel, title=title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def _loss_panels(data: list[Series], path: Path) -> Path:
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
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    for ax in fig.axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
