"""Small TU folders written for the graph tests: valid ones, and ones with one defect."""

from __future__ import annotations

from pathlib import Path


def write_tu(folder: Path, name: str = "TOY", graphs: int = 24, *, labels: list[str] | None = None,
             indicator: list[int] | None = None) -> Path:
    """A TU folder of `graphs` triangles (classes alternate 1, 2), or the given labels/indicator lines."""
    folder.mkdir(parents=True, exist_ok=True)
    nodes = 3 * graphs
    edges = [(3 * g + a, 3 * g + b) for g in range(graphs) for a, b in ((1, 2), (2, 3), (3, 1))]
    (folder / f"{name}_A.txt").write_text("".join(f"{i}, {j}\n{j}, {i}\n" for i, j in edges))
    indicator = indicator or [1 + n // 3 for n in range(nodes)]
    (folder / f"{name}_graph_indicator.txt").write_text("".join(f"{g}\n" for g in indicator))
    labels = labels or [str(1 + g % 2) for g in range(graphs)]
    (folder / f"{name}_graph_labels.txt").write_text("".join(f"{v}\n" for v in labels))
    (folder / f"{name}_node_labels.txt").write_text("".join(f"{n % 2}\n" for n in range(nodes)))
    return folder
