"""Every measured number that README.md and docs/*.md quote has a source.

Convention: a measured number (one with a decimal point, or with a unit: %, s, ms, min, MiB, GiB,
x, img/s, views/s, points) sits in a paragraph, list or table that names the file it comes from,
a path under `results/` or `benchmarks/results/`, or follows, under the same heading, the block
that names it. For each such file this test rebuilds, from the file's raw fields (never from a
pre-rendered copy such as queue_collapse.json's `table`), the text the docs quote, and every
measured number of the quoting block must be one of the numbers of that text. A number that is a
definition rather than a measurement (a default, a threshold, the paper's settings) is in SPEC with
the code or config text that defines it. Code (fenced, indented, inline) and the generated
`<!-- results:NAME -->` blocks are left out: tests/test_reproduce.py rebuilds those.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from scipy.stats import t as student_t

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

UNIT = r"(?:\s?(?:%|ms|min|s|MB|GB|MiB|GiB|img/s|views/s|points)|x)"
NUMBER = re.compile(r"(?<![\w.^])[+-]?(\d[\d,]*(?:\.\d+)?(?:e[+-]?\d+)?)(" + UNIT + r")?(?![\w/]|\.\w)")
CITATION = re.compile(r"(?:benchmarks/)?results/[\w/.*-]+")
GENERATED = re.compile(r"<!-- results:([\w-]+) -->.*?<!-- /results:\1 -->", re.S)

# Definitions, not measurements: each number with a file and the text in it that defines it.
SPEC: dict[str, tuple[str, str]] = {
    "3.11": ("pyproject.toml", 'requires-python = ">=3.11"'),
    "2209.00078": ("hscl_zoo/zoo/cards.py", 'PAPER_URL = "https://arxiv.org/abs/2209.00078"'),
    "0.5": ("hscl_zoo/training/config.py", "temperature: float = 0.5"),
    "1.0": ("hscl_zoo/losses/methods.py", '_BETA = Hyperparameter("beta", 1.0'),
    "0.3": ("hscl_zoo/training/config.py", "threshold_start: float = -0.3"),
    "0.0": ("hscl_zoo/losses/methods.py", '_HSCL_THRESHOLD = Hyperparameter("threshold", 0.0'),
    "0.9": ("hscl_zoo/training/monitoring.py", "COLLAPSED_COSINE = 0.9"),
    "0.95x": ("tests/test_recipe_vs_loop.py", "the issue's goal, >= 0.95x"),
    "95%": ("hscl_zoo/reproduction/statistics.py", "two-sided 95 % Student-t interval"),
    "90%": ("tools/mutation.py", "at least 90 % of the non-equivalent mutants"),
    "85%": ("hscl_zoo/training/resources.py", "more than 85% of them"),
    "0.2": ("hscl_zoo/training/config.py", "test_fraction: float = 0.2"),
    "0.08": ("hscl_zoo/data/transforms.py", "scale: tuple[float, float] = (0.08, 1.0)"),
    "0.4": ("hscl_zoo/data/transforms.py", "v2.ColorJitter(0.4 * strength"),
    "0.1": ("hscl_zoo/data/transforms.py", "0.1 * strength)"),
    "0.8": ("hscl_zoo/data/transforms.py", "v2.RandomApply([jitter], p=0.8)"),
    "10%": ("hscl_zoo/data/transforms.py", "(10% of the side, as in SimCLR)"),
    "0.05": ("hscl_zoo/losses/diagnostics.py", "NEGATIVE_COSINE_QUANTILES = (0.05"),
    "0.07": ("hscl_zoo/losses/compat.py", "def __init__(self, temperature: float = 0.07"),
    "0.35": ("hscl_zoo/training/finetune.py", '"light": {"scale": (0.35, 1.0)'),
    "256MiB": ("hscl_zoo/retrieval.py", "one chunk of queries (256 MiB by default)"),
    "16MiB": ("hscl_zoo/zoo/schema.py", "the file itself <= 16 MiB"),
    "240MiB": ("tests/test_committed_releases.py", "The cap on releases/, 240 MiB"),
    "64MiB": ("tools/gpu_sprint.sh", "over the 64 MiB a call carries"),
    "80GB": ("benchmarks/results/h100_env.json", "NVIDIA H100 80GB HBM3"),
    "300MB": ("tests/test_hostile_model_folders.py", "the peak may not rise by 300 MB"),
}


def measured(text: str) -> set[str]:
    """The measured numbers of a text, normalised: no sign, no space before the unit."""
    found = set()
    for match in NUMBER.finditer(text):
        number, unit = match.group(1), (match.group(2) or "").strip()
        if "." in number or unit:
            found.add(number.replace(",", "") + unit)
    return found


def prose_blocks(page: Path) -> list[tuple[str, str]]:
    """(block with code removed, block as written) for each paragraph, list or table of a page."""
    text = GENERATED.sub("", page.read_text())
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    blocks = []
    for raw in re.split(r"\n\s*\n", text):
        lines = [line for line in raw.splitlines() if not line.startswith("    ")]
        written = "\n".join(lines)
        prose = re.sub(r"`[^`]*`", "", written)
        prose = re.sub(r"\]\([^)]*\)", "]", prose)
        prose = re.sub(r"<!--.*?-->", "", prose, flags=re.S)
        blocks.append((prose, written))
    return blocks


def _json(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def _sci(x: float) -> str:
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def default_run() -> str:
    run = _json("results/default-digits.json")
    return (f"{run['wall_seconds']:.0f} s wall; {run['linear_top1']:.1f} % linear-probe top-1 "
            f"({run['linear_top5']:.1f} % top-5; kNN {run['knn_top1']:.1f} %); commit {run['git_commit'][:7]}")


def gradient_cache_table() -> str:
    rows = {row["mode"]: row for row in _json("benchmarks/results/gradient_cache_amd-epyc-2-cores.json")["rows"]}
    direct, cache = rows["direct"], rows["cache"]
    return ("| step's gradient | peak memory (RSS growth) | process CPU time | wall time |\n"
            "|---|---:|---:|---:|\n"
            f"| direct (one graph) | {direct['peak_mib']:,.0f} MiB | {direct['step_cpu_s']:.1f} s | {direct['step_s']:.1f} s |\n"
            f"| gradient cache, chunks of {cache['chunk_size']} | {cache['peak_mib']:,.0f} MiB "
            f"({cache['peak_mib'] / direct['peak_mib']:.3f}x) | {cache['step_cpu_s']:.1f} s "
            f"({cache['step_cpu_s'] / direct['step_cpu_s']:.2f}x) | {cache['step_s']:.1f} s |")


def queue_collapse_table(every: int = 5) -> str:
    steps = _json("benchmarks/results/queue_collapse.json")["steps"]
    lines = ["| step | " + " | ".join(steps) + " |", "|---:|" + "---:|" * len(steps)]
    for step in range(every, len(next(iter(steps.values()))) + 1, every):
        cells = []
        for rows in steps.values():
            (row,) = [r for r in rows if r["step"] == step]
            cells.append(f"{row['batch_median_cos']:.3f}")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def loss_bench_tables() -> tuple[str, str]:
    bench = _json("benchmarks/results/loss_bench_cpu.json")
    betas = ["0.5", "1", "2"]
    times = ["| B | floor | ucl | hucl | scl | hscl-tau | hscl-beta, beta = 0.5 / 1 / 2 | official, beta = 0.5 / 1 / 2 "
             "| official-style, beta = 0.5 / 1 / 2 | loop-reference |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    ratios = ["| B | beta | hscl-beta / floor | official / hscl-beta | official-style / official |",
              "|---|---:|---:|---:|---:|"]
    for row in bench["rows"]:
        if row["threads"] != 1:
            continue
        ms = row["median_ms"]
        trio = [" / ".join(_ms(ms[f"{name} b={b}"]) for b in betas) for name in ("hscl-beta", "official", "official-style")]
        times.append(f"| {row['B']} | " + " | ".join(_ms(ms[k]) for k in ("floor", "ucl", "hucl", "scl", "hscl-tau"))
                     + " | " + " | ".join(trio) + f" | {_ms(ms.get('loop-reference'))} |")
        if row["B"] == 256:
            continue
        for b in betas:
            cells = [row["ratios"][key] for key in (f"hscl-beta b={b} / floor", f"official / hscl-beta b={b}",
                                                     f"official-style / official b={b}")]
            ratios.append(f"| {row['B']} | {b} | " + " | ".join(
                f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})" for r in cells) + " |")
    return "\n".join(times), "\n".join(ratios)


def loss_bench() -> str:
    bench = _json("benchmarks/results/loss_bench_cpu.json")
    return "\n".join(loss_bench_tables()) + f"\ntemperature {bench['temperature']}; betas {bench['betas']}"


def loss_precision() -> str:
    rows = _json("benchmarks/results/loss_precision_after.json")["rows"]
    worst_value = max(rows, key=lambda r: r["value_rel_err"])
    worst_grad = max(rows, key=lambda r: r["grad_rel_err"])
    temperatures = sorted({r["temperature"] for r in rows})
    return (f"T in {{{', '.join(map(str, temperatures))}}}: worst {_sci(worst_value['value_rel_err'])} on the value, "
            f"{_sci(worst_grad['grad_rel_err'])} on the gradient at T = {worst_grad['temperature']}")


def _runs(pattern: str) -> list[dict]:
    return [json.loads(Path(p).read_text()) for p in sorted(glob.glob(str(ROOT / pattern)))]


def negatives_study() -> str:
    """Plain batch 64 against plain batch 256 (the paired t interval written out here), the steps
    each took, and how high the queue started at epoch 4 takes the collapse rule's quantile."""
    b64 = {r["seed"]: r for r in _runs("results/studies/negatives-cifar10-10k/runs/b64-s*.json")}
    b256 = {r["seed"]: r for r in _runs("results/cpu-cifar10-10k/runs/hscl-beta-s*.json")}
    diffs = [b64[s]["top1"] - b256[s]["top1"] for s in sorted(b64)]
    mean = sum(diffs) / len(diffs)
    half = student_t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    rows, small, large = b64[0]["config"]["subset"], b64[0]["config"]["batch_size"], b256[0]["config"]["batch_size"]
    (e4,) = _runs("results/studies/negatives-cifar10-10k/runs/b64-queue-e4-s0.json")
    return (f"{mean:+.2f} points [95 % CI {mean - half:+.2f}, {mean + half:+.2f}]; {large // small}x as many steps "
            f"({rows // small} against {rows // large}); e4 peaks at {max(e['neg_cos_q05'] for e in e4['history']):.3f}")


def dropin_losses() -> str:
    """Per pair and batch size: the median time and memory ratios, and for pytorch-metric-learning's
    NTXentLoss the times, peaks and the size of the matrix that kept it from running at B = 512."""
    parts = []
    for row in _json("benchmarks/results/dropin_losses_cpu.json")["rows"]:
        digits = 3 if row["pair"].startswith("MetricLearningLoss") else 2
        if "time_ratio" in row:
            parts.append(f"{row['time_ratio']['median']:.{digits}f}x time, {row['memory_ratio']['median']:.{digits}f}x memory")
        if row["pair"].startswith("MetricLearningLoss"):
            parts.append(f"{row['ours_ms']:.0f} ms, {row['ours_peak_mib']:.{1 if row['ours_peak_mib'] < 10 else 0}f} MiB")
            if "reference_ms" in row:
                parts.append(f"{row['reference_ms'] / 1000:.1f} s, {row['reference_peak_mib']:.0f} MiB")
            else:
                parts.append(row["reference_skipped"])
    return "; ".join(parts)


def h100_throughput_table() -> str:
    """Views/s of the data, compute and end-to-end stages per backbone and configuration, eager and compiled."""
    rows = _json("benchmarks/results/h100_throughput.json")["rows"] + _json("benchmarks/results/h100_compile.json")["rows"]
    configs = list(dict.fromkeys((row["backbone"], row["config"]) for row in rows))
    lines = ["| backbone (small stem) | configuration | data | compute | end to end | peak MiB |",
             "|---|---|---:|---:|---:|---:|"]
    for backbone, config in configs:
        stage = {r["stage"]: r for r in rows if (r["backbone"], r["config"]) == (backbone, config)}
        lines.append(f"| {backbone} | {config} | " + " | ".join(f"{stage[s]['img_per_s']:,.0f}" for s in ("data", "compute", "e2e"))
                     + f" | {stage['e2e']['peak_mib']:,.0f} |")
    return "\n".join(lines)


def h100_loss_table() -> str:
    lines = ["| B | floor | SCL | H-SCL(beta = 1) | official-style, beta = 1 | official-style / H-SCL(beta = 1) |",
             "|---:|---:|---:|---:|---:|---:|"]
    for row in _json("benchmarks/results/h100_loss_bench.json")["rows"]:
        ms, ratio = row["median_ms"], row["ratios"]["official-style / hscl-beta b=1"]
        lines.append(f"| {row['B']} | {ms['floor']:.1f} | {ms['scl']:.1f} | {ms['hscl-beta b=1']:.1f} | "
                     f"{ms['official-style b=1']:,.0f} | {ratio['median']:.1f}x ({ratio['min']:.1f}-{ratio['max']:.1f}) |")
    return "\n".join(lines)


def h100_parity_table() -> str:
    lines = ["| check | relative gap | tolerance | passed |", "|---|---:|---:|---|"]
    for check in _json("benchmarks/results/h100_parity.json")["checks"]:
        lines.append(f"| {check['check']} | {check['gap']:.2e} | {check['tolerance']:.0e} | {'yes' if check['ok'] else 'no'} |")
    return "\n".join(lines)


def h100() -> str:
    """The GPU sprint's files: the tables, and each figure the prose quotes from them."""
    rows = _json("benchmarks/results/h100_throughput.json")["rows"] + _json("benchmarks/results/h100_compile.json")["rows"]
    resume = _json("benchmarks/results/h100_resume.json")
    augment = _json("benchmarks/results/h100_augment.json")["augment"]
    overlap = _json("benchmarks/results/h100_overlap.json")["rows"]
    return "\n".join([
        "; ".join(f"{r['ms_per_step']:.1f} ms" for r in overlap),
        h100_throughput_table(), h100_loss_table(), h100_parity_table(),
        "; ".join(f"{r['img_per_s']:,.0f} views/s" for r in rows),
        f"{resume['relative_gap']:.1e}; " + "; ".join(f"{v:,.0f} views/s" for v in resume["views_per_second"]),
        "; ".join(f"{a['ms_per_batch']:.1f} ms, {a['ms_per_batch']:,.0f} ms, {a['views_per_s']:,.0f} views/s" for a in augment),
    ])


def gpu_cifar10_runs() -> str:
    """Each gpu-cifar10 run's linear-probe top-1, and the paper's for its method (the method table)."""
    from hscl_zoo.losses import METHODS
    return "; ".join(f"{r['method']} {r['top1']:.2f} % (paper {METHODS[r['method']].paper_top1['cifar10'][0]:.2f} %)"
                     for r in _runs("results/gpu-cifar10/runs/*.json"))


def recipe_vs_loop_quote(path: str = "benchmarks/results/recipe_vs_loop_cpu.json") -> str:
    """The median ratio of the recipe's epoch to the bare loop's, its range over the reruns and
    both median views/s, as docs/benchmarks.md quotes them."""
    run = _json(path)
    ratios = [r["ratio"] for r in run["runs"]]
    return (f"{run['median']['ratio']:.3f}x (reruns {min(ratios):.3f}-{max(ratios):.3f}): the recipe "
            f"{run['median']['recipe_views_per_s']:.1f} views/s, the bare loop {run['median']['bare_views_per_s']:.1f} views/s")


def recipe_breakdown_table(path: str = "benchmarks/results/recipe_vs_loop_cpu.json") -> str:
    """Each extra of the recipe over the bare loop, timed alone, in seconds and as a share of the
    bare loop's step (its median views/s) or epoch."""
    run = _json(path)
    step = run["setting"]["batch_size"] * run["setting"]["views"] / run["median"]["bare_views_per_s"]
    epoch = step * run["setting"]["steps_per_epoch"]
    per_step, per_epoch = run["breakdown"]["per_step"], run["breakdown"]["per_epoch_not_counted"]
    rows = [
        ("diagnostics update, one sampled step", per_step["diagnostics_update_s"], step),
        ("per-item seeded RNG and plan, one batch", per_step["decode_batch_seeded_views_s"]
         - per_step["decode_batch_bare_views_s"], step),
        ("Accelerate's prepared loader, one epoch", per_step["loader_epoch_accelerate_decode_only_s"]
         - per_step["loader_epoch_plain_decode_only_s"], epoch),
        ("progress bar, loss readback and stop check, one step", per_step["bar_loss_item_and_stop_check_s"], step),
        ("kNN monitor, one epoch (not counted)", per_epoch["knn_monitor_s"], epoch),
        ("checkpoint, one epoch (not counted)", per_epoch["checkpoint_s"], epoch),
    ]
    lines = ["| extra of the recipe | seconds | share of the bare loop's |", "|---|---:|---:|"]
    for name, seconds, whole in rows:
        unit = "an epoch" if "epoch" in name else "a step"
        lines.append(f"| {name} | {seconds:.4f} | {100 * seconds / whole:.2f} % of {unit} |")
    return "\n".join(lines)


def recipe_profile_quote(path: str = "benchmarks/results/recipe_vs_loop_cpu.json") -> str:
    """Where one profiled recipe epoch's seconds went, from the file's cProfile."""
    profile = _json(path)["breakdown"]["profile_of_one_recipe_epoch"]
    seconds = profile["cumulative_seconds"]
    return (f"of one profiled recipe epoch's {profile['epoch_seconds_profiled']:.1f} s, the backward pass took "
            f"{seconds['Accelerator.backward']:.1f} s, fetching batches (decode, per-item seed, augmentation) "
            f"{seconds['DataLoader fetch (items + collate)']:.1f} s, the forward pass {seconds['model forward']:.1f} s "
            f"and the diagnostics {seconds['DiagnosticsMeter.update']:.3f} s")


def install_size() -> str:
    size = _json("benchmarks/results/install_size.json")
    return f"{size['venv_bytes'] / 1e9:.1f} GB, {size['cuda_libraries_bytes'] / 1e9:.1f} GB"


def ci_time() -> str:
    """Each measured `.ci/run` and `pytest`: its wall seconds and minutes, each phase's seconds, and
    the ratio of the newest full run to the one before the CI-time work."""
    runs = _json("benchmarks/results/ci_time.json")
    parts = []
    for entry in runs.values():
        parts.append(f"{entry['wall_seconds']:.0f} s ({entry['wall_seconds'] / 60:.0f} min)")
        parts += [f"{phase['name']} {phase['seconds']:.0f} s" for phase in entry["phases"]]
        parts += [f"{session['seconds']:.0f} s" for session in entry["pytest_sessions"]]
    if {"ci/before", "ci/after"} <= set(runs):
        parts.append(f"{100 * runs['ci/after']['wall_seconds'] / runs['ci/before']['wall_seconds']:.0f} %")
    return "; ".join(parts)


def recipe_vs_loop() -> str:
    return "\n".join([recipe_vs_loop_quote(), recipe_breakdown_table(), recipe_profile_quote()])


IMAGENET_TRAIN_IMAGES = 1_281_167


def stream_vs_map() -> str:
    """The streaming benchmark's views/s per side and process count (each process's too), the 224 px
    decode rates, and the ImageNet-1k plan extrapolated from them and from h100_throughput.json's
    ResNet-50 compute rate (32 px, small stem: layer1 at 32x32; at 224 px timm's stem gives 56x56,
    so the rate is scaled by (32/56)^2)."""
    run = _json("benchmarks/results/stream_vs_map_cpu.json")
    parts = []
    for side in run["runs"]:
        parts.append(f"{side['views_per_second']:.0f} views/s")
        parts += [f"{p['views_per_second']:.0f} views/s" for p in side["per_process"]]
    decode = run["decode_224"]
    per_core = decode["decode_and_two_views_images_per_second"]
    parts.append(f"{decode['decode_images_per_second']:.0f} img/s, {per_core:.0f} img/s")
    rn50 = next(r for r in _json("benchmarks/results/h100_throughput.json")["rows"]
                if r["backbone"] == "resnet50" and r["stage"] == "compute" and r["config"].startswith("fast"))
    gpu = rn50["img_per_s"] * (32 / 56) ** 2
    parts.append(f"{rn50['img_per_s']:.0f} img/s, {gpu:.0f} img/s, {gpu / per_core:.0f} cores")
    for gpus in (1, 8, 32):
        parts.append(f"{IMAGENET_TRAIN_IMAGES * 100 / (gpu * gpus) / 3600:.1f} h")
    return "; ".join(parts)


def stream_vs_map_scores() -> str:
    """The streamed and map-style runs' linear-probe and kNN top-1 per seed, each path's median, and
    the paired difference (stream - map) with its 95 % interval, as hscl_zoo.reproduction.statistics
    computes it; the sample's rows and the epochs."""
    from hscl_zoo.reproduction.statistics import paired_difference

    run = _json("benchmarks/results/stream_vs_map_scores_cpu.json")
    parts = [f"{run['rows']['train']:,} training rows, {run['rows']['test']:,} test rows, {len(run['seeds'])} seeds",
             " ".join(run["settings"])]
    for metric in ("linear_top1", "knn_top1"):
        by_path = {path: {r["seed"]: r[metric] for r in run["runs"] if r["path"] == path} for path in ("map", "stream")}
        parts += [f"{v:.1f} %" for values in by_path.values() for v in values.values()]
        parts += [f"{run['summary'][metric]['median'][path]:.1f} %" for path in ("map", "stream")]
        parts.append(paired_difference(by_path["stream"], by_path["map"]).describe())
    return "; ".join(parts)


def test_the_streaming_pages_verdict_is_the_interval_the_runs_give():
    from hscl_zoo.reproduction.statistics import paired_difference

    run = _json("benchmarks/results/stream_vs_map_scores_cpu.json")
    page = " ".join((ROOT / "docs" / "scale.md").read_text().split())
    for metric, name in (("linear_top1", "linear probe"), ("knn_top1", "kNN")):
        by_path = {path: {r["seed"]: r[metric] for r in run["runs"] if r["path"] == path} for path in ("map", "stream")}
        difference = paired_difference(by_path["stream"], by_path["map"])
        verdict = "includes 0" if difference.low <= 0 <= difference.high else "excludes 0"
        assert f"{name}: {difference.describe()}, an interval that {verdict}" in page, (name, verdict)
    if "the streamed linear probe was the lower in all three seeds" in page:
        assert len(run["seeds"]) == 3 and all(d < 0 for d in difference_of(run, "linear_top1"))


def difference_of(run: dict, metric: str) -> list[float]:
    """Per seed, the streamed run's `metric` minus the map-style run's."""
    by_path = {path: {r["seed"]: r[metric] for r in run["runs"] if r["path"] == path} for path in ("map", "stream")}
    return [by_path["stream"][seed] - by_path["map"][seed] for seed in sorted(by_path["map"])]


SOURCES: dict[str, Callable[[], str]] = {
    r"results/default-digits\.json": default_run,
    r"benchmarks/results/gradient_cache_[\w-]+\.json": gradient_cache_table,
    r"benchmarks/results/queue_collapse\.json": queue_collapse_table,
    r"benchmarks/results/loss_bench_cpu\.json": loss_bench,
    r"benchmarks/results/loss_precision_after\.json": loss_precision,
    r"results/studies/negatives-cifar10-10k/runs/": negatives_study,
    r"benchmarks/results/dropin_losses_cpu\.json": dropin_losses,
    r"benchmarks/results/h100_\w+\.json": h100,
    r"results/gpu-cifar10/runs/": gpu_cifar10_runs,
    r"benchmarks/results/recipe_vs_loop_cpu\.json": recipe_vs_loop,
    r"benchmarks/results/install_size\.json": install_size,
    r"benchmarks/results/ci_time\.json": ci_time,
    r"benchmarks/results/stream_vs_map_cpu\.json": stream_vs_map,
    r"benchmarks/results/stream_vs_map_scores_cpu\.json": stream_vs_map_scores,
}


def sourced(citations: list[str]) -> set[str]:
    numbers: set[str] = set()
    for cited in citations:
        for pattern, render in SOURCES.items():
            if re.match(pattern, cited):
                numbers |= measured(render())
    return numbers


def test_spec_numbers_are_defined_where_they_say():
    for number, (path, text) in SPEC.items():
        assert text in (ROOT / path).read_text(), (number, path, text)
        assert number in measured(text), (number, text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_measured_number_has_a_source(page):
    unsourced = []
    section: list[str] = []
    for prose, written in prose_blocks(page):
        if written.lstrip().startswith("#"):
            section = []
        citations = CITATION.findall(written) or section
        section = citations
        allowed = sourced(citations) | set(SPEC)
        for number in sorted(measured(prose) - allowed):
            unsourced.append(f"{number} in: {' '.join(prose.split())[:100]}")
    assert not unsourced, f"{page.name}: numbers with no source file:\n" + "\n".join(unsourced)


def test_quoted_tables_are_rebuilt_from_the_raw_fields():
    docs = "\n".join(page.read_text() for page in PAGES)
    for table in (gradient_cache_table(), queue_collapse_table(), *loss_bench_tables(), h100_throughput_table(),
                  h100_loss_table(), h100_parity_table(), recipe_breakdown_table()):
        assert table in docs, table.splitlines()[0]


COMMIT = re.compile(r"[0-9a-f]{40}(\+dirty)?")


def test_every_quoted_file_names_the_code_it_measured():
    """Each result file the docs quote records the commit it was measured at (git's HEAD, '+dirty'
    when the tree differed), so a number can be traced to code; the H100 files name theirs through
    the sprint that wrote them (h100_sprint.json's source_commit, packed from a clean tree)."""
    sprint = _json("benchmarks/results/h100_sprint.json")["source_commit"]
    assert COMMIT.fullmatch(sprint)
    results = [f.relative_to(ROOT).as_posix() for folder in ("results", "benchmarks/results")
               for f in sorted((ROOT / folder).rglob("*.json"))]
    missing = []
    for pattern in SOURCES:
        files = [ROOT / f for f in results if re.match(pattern, f)]
        assert files, pattern
        for file in files:
            if file.name.startswith("h100_"):
                continue
            record = json.loads(file.read_text())
            measurements = list(record.values()) if file.name == "ci_time.json" else [record]  # one per label
            for measurement in measurements:
                commit = measurement.get("commit") or measurement.get("git_commit")
                if not (isinstance(commit, str) and COMMIT.fullmatch(commit)):
                    missing.append(file.relative_to(ROOT).as_posix())
    assert not missing, f"result files quoted without the commit they were measured at: {missing}"


def unnamed_gpu_files(root: Path) -> list[str]:
    """The GPU result files of the checkout at `root` that do not name the code that produced
    them: a gpu-cifar10 run record or a GPU check result (benchmarks/results/gpu_*.json) must be
    listed, byte for byte (sha256), in a sprint log (benchmarks/results/gpu_sprint_*.json) whose
    source names a commit, the hash of the carried tree's diff and the command; a run record's own
    commit must be that commit. The first session's records predate the logs: they name
    h100_sprint.json's source_commit (packed from a clean tree)."""
    first = json.loads((root / "benchmarks/results/h100_sprint.json").read_text())["source_commit"]
    listed: dict[str, tuple[str, str]] = {}
    bad = []
    for log in sorted((root / "benchmarks/results").glob("gpu_sprint_*.json")):
        record = json.loads(log.read_text())
        source = record.get("source", {})
        if not (COMMIT.fullmatch(str(source.get("commit"))) and re.fullmatch(r"[0-9a-f]{64}", str(source.get("diff_sha256")))
                and record.get("command")):
            bad.append(log.relative_to(root).as_posix())
            continue
        for part in record.get("parts", []):
            for path, digest in part.get("files", {}).items():
                listed[path] = (digest, source["commit"])
    gpu_files = [*sorted((root / "results/gpu-cifar10/runs").glob("*.json")),
                 *(p for p in sorted((root / "benchmarks/results").glob("gpu_*.json")) if not p.name.startswith("gpu_sprint_"))]
    for path in gpu_files:
        name = path.relative_to(root).as_posix()
        commit = json.loads(path.read_text()).get("commit")
        if name in listed:
            digest, source_commit = listed[name]
            if hashlib.sha256(path.read_bytes()).hexdigest() != digest or commit not in (None, source_commit):
                bad.append(name)
        elif commit != first:
            bad.append(name)
    return bad


def test_every_gpu_file_names_the_code_that_produced_it():
    assert unnamed_gpu_files(ROOT) == []


def test_a_gpu_file_edited_after_landing_or_left_out_of_its_log_is_caught(tmp_path):
    first = _json("benchmarks/results/h100_sprint.json")["source_commit"]
    (tmp_path / "results/gpu-cifar10/runs").mkdir(parents=True)
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / "benchmarks/results/h100_sprint.json").write_text(json.dumps({"source_commit": first}))
    (tmp_path / "results/gpu-cifar10/runs/scl-s0.json").write_text(json.dumps({"commit": first}))
    landed = tmp_path / "results/gpu-cifar10/runs/ucl-s0.json"
    landed.write_text(json.dumps({"commit": "a" * 40, "top1": 50.0}))
    check = tmp_path / "benchmarks/results/gpu_step_parity.json"
    check.write_text(json.dumps({"git_commit": "a" * 40}))
    files = {p.relative_to(tmp_path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in (landed, check)}
    log = {"source": {"commit": "a" * 40, "diff_sha256": "0" * 64}, "command": "bash tools/gpu_sprint.sh next",
           "parts": [{"part": "train-ucl-s0", "files": files}]}
    (tmp_path / "benchmarks/results/gpu_sprint_x.json").write_text(json.dumps(log))
    assert unnamed_gpu_files(tmp_path) == []
    landed.write_text(json.dumps({"commit": "a" * 40, "top1": 51.0}))  # a hand edit after landing
    (tmp_path / "results/gpu-cifar10/runs/hucl-s0.json").write_text(json.dumps({"commit": "a" * 40}))  # in no log
    assert unnamed_gpu_files(tmp_path) == ["results/gpu-cifar10/runs/hucl-s0.json", "results/gpu-cifar10/runs/ucl-s0.json"]
    del log["source"]["diff_sha256"]
    (tmp_path / "benchmarks/results/gpu_sprint_x.json").write_text(json.dumps(log))
    assert "benchmarks/results/gpu_sprint_x.json" in unnamed_gpu_files(tmp_path)
