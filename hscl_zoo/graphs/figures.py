"""The graph table as a figure: per dataset, each method's accuracy over seeds (mean, with the
standard deviation as an error bar) beside the paper's Table 2 number (a black tick), for one
protocol and one way of choosing beta. Drawn from the same cells as summary.md:

    python -m hscl_zoo.graphs.figures --root results/graphs-paper
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hscl_zoo.graphs.catalog import GRAPH_DATASETS, TABLE_2_METHODS  # noqa: E402
from hscl_zoo.graphs.summary import CHOICE_TEXT, Record, method_cells  # noqa: E402
from hscl_zoo.losses.methods import get_method  # noqa: E402

__all__ = ["FIGURE_METHODS", "table_two_figure", "plot_table_two"]

FIGURE_METHODS = (*TABLE_2_METHODS, "hscl-tau")


def table_two_figure(records: list[Record], protocol: str, choice: str):
    """The matplotlib figure: one panel per dataset with records, one bar per method with records
    (its height the mean over seeds, %). Returns the figure; `plot_table_two` saves it."""
    specs = [s for s in GRAPH_DATASETS.values()
             if any(r["dataset"] == s.tu_name and r["protocol"] == protocol for r in records)]
    if not specs:
        raise ValueError(f"no protocol-({protocol}) records to draw.")
    fig, axes = plt.subplots(1, len(specs), figsize=(2.6 * len(specs), 3.4), squeeze=False)
    for ax, spec in zip(axes[0], specs):
        cells = method_cells([r for r in records if r["dataset"] == spec.tu_name and r["protocol"] == protocol], choice)
        methods = [m for m in FIGURE_METHODS if m in cells]
        means = [cells[m].mean_std[0] for m in methods]
        stds = [cells[m].mean_std[1] for m in methods]
        ax.bar(range(len(methods)), means, yerr=stds, capsize=3, color="#7aa6c2", label="measured")
        for k, method in enumerate(methods):
            paper = spec.paper_accuracy.get(method)
            if paper is not None:
                ax.plot([k - 0.4, k + 0.4], [paper, paper], color="black", linewidth=2,
                        label="paper (Table 2)" if k == 0 else None)
        ax.set_xticks(range(len(methods)), [get_method(m).display for m in methods], rotation=45, ha="right")
        low = min(min(m - s for m, s in zip(means, stds)), *spec.paper_accuracy.values())
        ax.set_ylim(max(0.0, low - 5), 100 if max(means) > 90 else max(max(means), *spec.paper_accuracy.values()) + 5)
        ax.set_title(f"{spec.display} (seeds: {max(c.seeds for c in cells.values())})", fontsize=10)
    axes[0][0].set_ylabel("accuracy % (10-fold SVM)")
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"Table 2, protocol ({protocol}), {CHOICE_TEXT[choice]}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_table_two(records: list[Record], out: Path) -> list[Path]:
    """Save one figure per protocol with records (beta chosen on training folds) into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for protocol in ("a", "b"):
        if not any(r["protocol"] == protocol for r in records):
            continue
        fig = table_two_figure(records, protocol, "train")
        path = out / f"table2-protocol-{protocol}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse

    from hscl_zoo.graphs.summary import load_records

    parser = argparse.ArgumentParser(description="Draw results/graphs-paper/figures/ from its records.")
    parser.add_argument("--root", type=Path, default=Path("results/graphs-paper"))
    args = parser.parse_args(argv)
    for path in plot_table_two(load_records(args.root / "records"), args.root / "figures"):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
