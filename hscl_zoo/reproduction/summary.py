"""Per-method rows and the paper's claims judged from reproduction run records.

A record is one finished run (`runs/<method>-s<seed>.json`): method, seed, linear-probe top1 /
top5, knn_top1, and `history`, the per-epoch metrics the pretraining recipe logs (kNN monitor,
Assumption 1 fraction, the Lemma-1 losses, negative-cosine quantiles, the threshold's kept
fraction). Everything here is a function of those records, so tables and verdicts cannot drift
from the data.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from hscl_zoo.losses.methods import METHODS
from hscl_zoo.reproduction.statistics import PairedDifference, epochs_to_reach, mean_std, paired_difference

HARD_SUPERVISED = ("hscl-beta", "hscl-tau")
# A threshold that keeps at least this fraction of the negatives at every epoch selects nothing:
# the H-SCL(tau) row is then SCL under another name.
KEEPS_EVERYTHING = 0.999
# Two methods whose training losses agree this closely at every epoch of every shared seed train
# the same way: one is the other in disguise at this budget.
SAME_LOSS = 1e-3
ASSUMPTION_LEVEL = 0.95  # the paper: Assumption 1 holds for over 95 % of anchors across all epochs
REACH_FRACTION = 0.25  # the paper: H-SCL(beta) needs < 50 of SCL's 200 epochs to reach SCL's accuracy

Record = dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    """One claim of the paper, its verdict ("reproduced", "not reproduced", "not testable at this
    budget"), the numbers that decide it, and `measure`: the deciding figure in a few words (a
    paired interval, epochs, a count), what a cell of the claims x budgets table shows; empty when
    the claim is not testable."""

    claim: str
    verdict: str
    evidence: str
    measure: str = ""


def display(method: str) -> str:
    """The paper's name of a method (its `MethodSpec.display`)."""
    return METHODS[method].display


def by_method(records: list[Record]) -> dict[str, list[Record]]:
    """Records grouped by method in the method table's order (methods without runs left out)."""
    groups = {m: sorted((r for r in records if r["method"] == m), key=lambda r: r["seed"]) for m in METHODS}
    return {m: rs for m, rs in groups.items() if rs}


def per_seed(records: list[Record], key: str = "top1") -> dict[int, float]:
    return {r["seed"]: r[key] for r in records}


def mean_curve(records: list[Record], key: str) -> list[float]:
    """Per-epoch mean over runs of a history metric, over the epochs all runs have."""
    epochs = min(len(r["history"]) for r in records)
    return [statistics.fmean(r["history"][e][key] for r in records) for e in range(epochs)]


def history_values(records: list[Record], key: str) -> list[float]:
    return [h[key] for r in records for h in r["history"] if key in h and not math.isnan(h[key])]


def method_rows(records: list[Record]) -> list[dict[str, Any]]:
    """One row per method: accuracies (mean, sd over seeds), paired differences against SCL and
    UCL, epochs to SCL's final kNN, the diagnostics at first and last epoch, cost."""
    groups = by_method(records)
    scl_final = mean_curve(groups["scl"], "knn_top1")[-1] if "scl" in groups else None
    rows = []
    for method, rs in groups.items():
        row: dict[str, Any] = {"method": method, "seeds": len(rs)}
        for key in ("top1", "top5", "knn_top1"):
            row[f"{key}_mean"], row[f"{key}_std"] = mean_std([r[key] for r in rs])
        for ref in ("scl", "ucl"):
            diff = paired_difference(per_seed(rs), per_seed(groups[ref])) if ref in groups and ref != method else None
            row[f"top1_minus_{ref}"] = diff.mean if diff else None
            row[f"top1_minus_{ref}_ci"] = (diff.low, diff.high) if diff and diff.low is not None else None
        row["epochs_to_scl_final_knn"] = (
            epochs_to_reach(mean_curve(rs, "knn_top1"), scl_final) if scl_final is not None else None
        )
        row["epochs"] = min(len(r["history"]) for r in rs)
        row["assumption_first"] = statistics.fmean(r["history"][0]["assumption_fraction"] for r in rs)
        row["assumption_last"] = statistics.fmean(r["history"][-1]["assumption_fraction"] for r in rs)
        measured = history_values(rs, "assumption_fraction")
        row["assumption_min"] = min(measured) if measured else None
        row["assumption_rises_every_epoch"] = sum(_rises(r, "assumption_fraction") for r in rs)
        row["lemma_hscl_le_hucl_every_epoch"] = all(h["loss_hscl"] <= h["loss_hucl"] for r in rs for h in r["history"])
        row["kept_first"], row["kept_last"] = _first_last(rs, "threshold_kept_fraction")
        row["threshold_first"], row["threshold_last"] = _first_last(rs, "threshold")
        kept = history_values(rs, "threshold_kept_fraction")
        row["keeps_every_negative"] = bool(kept) and min(kept) >= KEEPS_EVERYTHING
        order = list(METHODS)
        simpler = order[:order.index(method)]
        row["trains_as"] = next((m for m in simpler if m in groups and same_training(rs, groups[m])), None)
        row["train_minutes_median"] = statistics.median(r["train_seconds"] for r in rs) / 60
        later = [h["views_per_second"] for r in rs for h in r["history"][1:]]
        row["views_per_second_after_epoch1"] = statistics.median(later) if later else None
        rows.append(row)
    return rows


def same_training(a: list[Record], b: list[Record]) -> bool:
    """True when the two methods' per-epoch training losses agree to SAME_LOSS on every shared seed."""
    pairs = [(x, y) for x in a for y in b if x["seed"] == y["seed"]]
    return bool(pairs) and all(
        len(x["history"]) == len(y["history"])
        and all(abs(hx["train_loss"] - hy["train_loss"]) <= SAME_LOSS for hx, hy in zip(x["history"], y["history"]))
        for x, y in pairs
    )


def _rises(record: Record, key: str) -> bool:
    values = [h[key] for h in record["history"]]
    return all(b > a for a, b in zip(values, values[1:]))


def _first_last(records: list[Record], key: str) -> tuple[float | None, float | None]:
    if not all(key in r["history"][0] for r in records):
        return None, None
    return (statistics.fmean(r["history"][0][key] for r in records),
            statistics.fmean(r["history"][-1][key] for r in records))


def verdicts(records: list[Record]) -> list[Verdict]:
    """The paper's claims, each judged from the records by a rule stated in its evidence."""
    groups = by_method(records)
    out = [_beats(groups, "hscl-beta", ref) for ref in ("scl", "hucl", "ucl")]
    out.append(_reaches_sooner(groups))
    out.append(_assumption(groups))
    out.append(_lemma(groups))
    out.append(_ucl_crossing(groups))
    out.append(_paper_ordering(groups))
    return out


def _beats(groups: dict[str, list[Record]], method: str, ref: str) -> Verdict:
    claim = f"{display(method)} beats {display(ref)} in linear-probe top-1"
    missing = [display(m) for m in (method, ref) if m not in groups]
    if missing:
        return Verdict(claim, "not testable at this budget", f"no {' or '.join(missing)} run yet.")
    diff: PairedDifference | None = paired_difference(per_seed(groups[method]), per_seed(groups[ref]))
    if diff is None:
        return Verdict(claim, "not testable at this budget", "the two methods share no seed yet.")
    evidence = f"paired difference {diff.describe()}."
    if diff.low is None:
        return Verdict(claim, "not testable at this budget", evidence + " A paired interval needs at least 2 seeds.")
    measure = f"{diff.mean:+.2f} [{diff.low:+.2f}, {diff.high:+.2f}], {_count(diff.n, 'seed')}"
    if diff.low > 0:
        return Verdict(claim, "reproduced", evidence + " The interval lies above 0.", measure)
    where = "below 0" if diff.high < 0 else "across 0 (a tie at this budget)"
    return Verdict(claim, "not reproduced", evidence + f" The interval lies {where}.", measure)


def _reaches_sooner(groups: dict[str, list[Record]]) -> Verdict:
    claim = (f"{display('hscl-beta')} reaches SCL's final accuracy within {REACH_FRACTION:.0%} of the epochs "
             "(the paper: under 50 of 200)")
    if "hscl-beta" not in groups or "scl" not in groups:
        return Verdict(claim, "not testable at this budget", f"needs both SCL and {display('hscl-beta')} runs.")
    scl_curve, curve = mean_curve(groups["scl"], "knn_top1"), mean_curve(groups["hscl-beta"], "knn_top1")
    epochs = len(scl_curve)
    limit = max(1, math.floor(REACH_FRACTION * epochs))
    reached = epochs_to_reach(curve, scl_curve[-1])
    evidence = (f"per-epoch kNN monitor, mean over seeds: SCL ends at {scl_curve[-1]:.2f} % after {epochs} epochs; "
                f"{display('hscl-beta')} {'first reaches it at epoch ' + str(reached) if reached else 'never reaches it'} "
                f"(the claim needs epoch <= {limit}).")
    measure = (f"epoch {reached} of {epochs}" if reached else f"not reached in {epochs} epochs") + f" (needs <= {limit})"
    return Verdict(claim, "reproduced" if reached is not None and reached <= limit else "not reproduced", evidence,
                   measure)


def _assumption(groups: dict[str, list[Record]]) -> Verdict:
    claim = f"Assumption 1 holds for over {ASSUMPTION_LEVEL:.0%} of anchors at every epoch (H-SCL runs)"
    runs = [r for m in HARD_SUPERVISED for r in groups.get(m, [])]
    if not runs:
        return Verdict(claim, "not testable at this budget", f"no {display('hscl-beta')} or {display('hscl-tau')} run yet.")
    values = history_values(runs, "assumption_fraction")
    if not values:
        return Verdict(claim, "not testable at this budget", "no batch of the H-SCL runs held two images of one label, "
                       "so no anchor had a positive to measure Assumption 1 on.")
    rising = sum(_rises(r, "assumption_fraction") for r in runs)
    evidence = (f"over {_count(len(runs), 'H-SCL run')} and all their epochs the fraction ranges {min(values):.1%}-{max(values):.1%} "
                f"(last epoch: {statistics.fmean(r['history'][-1]['assumption_fraction'] for r in runs):.1%} on average); "
                f"it rises at every epoch in {rising} of {len(runs)} runs.")
    return Verdict(claim, "reproduced" if min(values) > ASSUMPTION_LEVEL else "not reproduced", evidence,
                   f"{min(values):.1%}-{max(values):.1%} of anchors")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _lemma(groups: dict[str, list[Record]]) -> Verdict:
    claim = "L_HSCL <= L_HUCL at every epoch (Lemma 1, H-SCL runs)"
    runs = [r for m in HARD_SUPERVISED for r in groups.get(m, [])]
    if not runs:
        return Verdict(claim, "not testable at this budget", f"no {display('hscl-beta')} or {display('hscl-tau')} run yet.")
    epochs = [h for r in runs for h in r["history"]]
    held = sum(h["loss_hscl"] <= h["loss_hucl"] for h in epochs)
    everywhere = [h for rs in groups.values() for r in rs for h in r["history"]]
    held_all = sum(h["loss_hscl"] <= h["loss_hucl"] for h in everywhere)
    evidence = (f"held at {held} of {len(epochs)} epochs of the {_count(len(runs), 'H-SCL run')} "
                f"({held_all} of {len(everywhere)} epochs over all runs).")
    return Verdict(claim, "reproduced" if held == len(epochs) else "not reproduced", evidence,
                   f"held at {held} of {len(epochs)} epochs")


def _ucl_crossing(groups: dict[str, list[Record]]) -> Verdict:
    claim = f"L_UCL is below L_HSCL in early epochs and above it in later ones (the paper's Fig. 5, {display('hscl-tau')})"
    runs = groups.get("hscl-tau", [])
    if not runs:
        return Verdict(claim, "not testable at this budget", f"no {display('hscl-tau')} run yet.")
    patterns = [_crossing_pattern(r) for r in runs]
    crossed = patterns.count("below, then above")
    counts = ", ".join(f"{p}: {patterns.count(p)}" for p in sorted(set(patterns)))
    evidence = f"L_UCL against L_HSCL over the epochs of the {len(runs)} {display('hscl-tau')} runs: {counts}."
    return Verdict(claim, "reproduced" if crossed == len(runs) else "not reproduced", evidence,
                   f"crossed in {crossed} of {_count(len(runs), 'run')}")


def _crossing_pattern(record: Record) -> str:
    signs = [h["loss_ucl"] > h["loss_hscl"] for h in record["history"]]
    if all(signs):
        return "above at every epoch"
    if not any(signs):
        return "below at every epoch"
    first_above = signs.index(True)
    if not signs[0] and all(signs[first_above:]):
        return "below, then above"
    return "mixed"


def _paper_ordering(groups: dict[str, list[Record]]) -> Verdict:
    """Table 1's order of the methods on the runs' dataset, judged pair by pair: every method must
    beat the next one down the paper's order with a paired interval above 0."""
    claim = "Linear-probe top-1 follows the paper's Table 1 order of the methods on this dataset"
    datasets = {r.get("config", {}).get("dataset") for rs in groups.values() for r in rs}
    if not datasets:
        return Verdict(claim, "not testable at this budget", "no run yet.")
    if len(datasets) > 1 or None in datasets:
        return Verdict(claim, "not testable at this budget", "the runs do not all name one dataset (config.dataset).")
    dataset = datasets.pop()
    paper = {m: spec.paper_top1[dataset][0] for m, spec in METHODS.items() if dataset in spec.paper_top1}
    if not paper:
        return Verdict(claim, "not testable at this budget", f"the paper reports no {dataset} results.")
    order = sorted(paper, key=paper.__getitem__, reverse=True)
    evidence = "the paper's order on " + dataset + ": " + " > ".join(f"{display(m)} {paper[m]:.2f}" for m in order) + "."
    missing = [display(m) for m in order if m not in groups]
    if missing:
        return Verdict(claim, "not testable at this budget", evidence + f" No {' or '.join(missing)} run yet.")
    means = {m: statistics.fmean(r["top1"] for r in groups[m]) for m in order}
    measured = sorted(order, key=means.__getitem__, reverse=True)
    evidence += (" Measured means: " + " > ".join(f"{display(m)} {means[m]:.2f}" for m in measured)
                 + f"; they {'fall' if measured == order else 'do not fall'} in the paper's order.")
    pairs = [(a, b, paired_difference(per_seed(groups[a]), per_seed(groups[b]))) for a, b in zip(order, order[1:])]
    if any(diff is None or diff.low is None for _, _, diff in pairs):
        return Verdict(claim, "not testable at this budget",
                       evidence + " A paired interval needs at least 2 shared seeds for every neighbouring pair.")
    above = sum(diff.low > 0 for _, _, diff in pairs)
    evidence += (" Neighbours in the paper's order, paired: "
                 + "; ".join(f"{display(a)} minus {display(b)} {d.mean:+.2f} [{d.low:+.2f}, {d.high:+.2f}]"
                             for a, b, d in pairs)
                 + f" ({_count(min(d.n for _, _, d in pairs), 'seed')}). {above} of {len(pairs)} intervals lie above 0.")
    return Verdict(claim, "reproduced" if above == len(pairs) else "not reproduced", evidence,
                   f"{above} of {len(pairs)} neighbour intervals above 0")
