"""Where a GPU run's time goes (issue 48), rendered from the files the device wrote:

* the ResNet-18 rates of `benchmarks/results/h100_overlap.json` (`train_throughput.py --overlap`):
  data alone, compute alone, end to end with the views made before each step, and end to end
  with them made one batch ahead (`hscl_zoo.data.overlap`), each as a fraction of compute alone;
* a run's seconds outside training, item by item, before the audit's change (the two runs of the
  sprint log `BEFORE`, side by side) and after it (the run record `AFTER`, alone on the GPU).

    python tools/overlap_report.py                          # print the block
    python tools/overlap_report.py --quote docs/benchmarks.md   # and rewrite its <!-- results:gpu-overlap -->
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from hscl_zoo._files import replace_block

ROOT = Path(__file__).resolve().parents[1]
RATES = "benchmarks/results/h100_overlap.json"
BEFORE = "benchmarks/results/gpu_sprint_20261128T060824Z.json"
AFTER = "results/gpu-cifar100/runs/ucl-s0.json"
BLOCK = "gpu-overlap"
STAGES = (("data", "the views alone"), ("compute", "the step alone, on views already made"),
          ("e2e", "end to end, views made before each step"),
          ("e2e-overlap", "end to end, views made one batch ahead on a side stream"))


def rates(root: Path = ROOT) -> dict[str, dict]:
    """The rows of `RATES` by stage."""
    return {row["stage"]: row for row in json.loads((root / RATES).read_text())["rows"]}


def outside(root: Path = ROOT) -> tuple[list[dict], dict]:
    """The timings of the training parts of `BEFORE`, and the timings of the run `AFTER`."""
    parts = json.loads((root / BEFORE).read_text())["parts"]
    return ([p["timings"] for p in parts if p["part"].startswith("train-")],
            json.loads((root / AFTER).read_text())["timings"])


def render(root: Path = ROOT) -> str:
    rows = rates(root)
    compute = rows["compute"]["img_per_s"]
    lines = [f"ResNet-18 (small stem, bf16, batch 512 x 2 views) on CIFAR-100 (`{RATES}`, commit "
             f"{json.loads((root / RATES).read_text())['git_commit'][:7]}):", "",
             "| stage | views/s | ms per step | of compute alone |", "|---|---:|---:|---:|"]
    for stage, text in STAGES:
        row = rows[stage]
        lines.append(f"| {text} | {row['img_per_s']:,.0f} | {row['ms_per_step']:.1f} | {row['img_per_s'] / compute:.2f} |")
    before, after = outside(root)
    items = list(after["items"])
    lines += ["", f"A 30-epoch gpu-cifar100 run's seconds outside training: before (`{BEFORE}`, two runs side "
              f"by side, the median of the two) and after (`{AFTER}`, alone):", "",
              "| item | before | after |", "|---|---:|---:|"]
    for item in items:
        lines.append(f"| {item} | {statistics.median(b['items'][item] for b in before):.1f} | {after['items'][item]:.1f} |")
    for name in after["evaluation"]:
        lines.append(f"| evaluation: {name} | {statistics.median(b['evaluation'][name] for b in before):.1f} | "
                     f"{after['evaluation'][name]:.1f} |")
    share = lambda t: 100 * t["outside_training"] / t["wall"]  # noqa: E731
    lines.append(f"| outside training, of the run's wall time | {statistics.median(share(b) for b in before):.0f} % | "
                 f"{share(after):.0f} % |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quote", type=Path, nargs="*", default=[], help="pages whose <!-- results:gpu-overlap --> block to rewrite")
    args = p.parse_args(argv)
    text = render()
    for page in args.quote:
        page.write_text(replace_block(page.read_text(encoding="utf-8"), BLOCK, text), encoding="utf-8")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
