"""The per-epoch collapse warning (hscl_zoo.training.monitoring.collapse_warning), judged on the
committed study runs: the queue run that collapsed is flagged from its first epoch with the queue
named as the cause, and no epoch of a healthy run is; and the rule itself on synthetic histories
either side of its threshold."""

import json
import math
from pathlib import Path

from hscl_zoo.training.config import PretrainConfig
from hscl_zoo.training.monitoring import COLLAPSED_COSINE, collapse_warning

RUNS = Path(__file__).resolve().parents[1] / "results"


def history(path: str) -> tuple[list[dict], PretrainConfig]:
    run = json.loads((RUNS / path).read_text())
    config = {k: v for k, v in run["config"].items() if k in PretrainConfig.__dataclass_fields__}
    return run["history"], PretrainConfig(**config)


def test_the_collapsed_queue_run_is_flagged_every_epoch_and_the_queue_named():
    records, cfg = history("studies/negatives-cifar10-10k/runs/b64-queue-s0.json")
    warnings = [collapse_warning(r, cfg) for r in records]
    assert all(w is not None for w in warnings)
    assert warnings[0].startswith("warning: epoch 1: the embeddings are collapsing") and "queue_size=384" in warnings[0]
    assert "chunk_size" in warnings[0]


def test_healthy_runs_are_never_flagged():
    for path in ("studies/negatives-cifar10-10k/runs/b64-s0.json", "cpu-cifar10-10k/runs/hscl-tau-s0.json",
                 "cpu-cifar10-10k/runs/scl-s0.json", "cpu-cifar10-10k/runs/ucl-s0.json"):
        records, cfg = history(path)
        assert [collapse_warning(r, cfg) for r in records] == [None] * len(records), path


def test_without_a_queue_or_diagnostics():
    cfg = PretrainConfig()
    assert "lower lr" in collapse_warning({"epoch": 3, "neg_cos_q05": 0.95}, cfg)
    assert collapse_warning({"epoch": 3, "train_loss": 1.0}, cfg) is None


def test_rule_on_synthetic_histories_either_side_of_the_threshold():
    """Warned exactly on the epochs whose neg_cos_q05 is >= COLLAPSED_COSINE, the epoch and value named."""
    level = COLLAPSED_COSINE
    q05 = [-0.2, 0.5, math.nextafter(level, -1.0), level, 0.97, math.nextafter(level, 0.0), 1.0, 0.3]
    records = [{"epoch": e, "neg_cos_q05": q} for e, q in enumerate(q05, start=1)]
    for cfg in (PretrainConfig(), PretrainConfig(queue_size=256)):
        warnings = [collapse_warning(r, cfg) for r in records]
        assert [w is not None for w in warnings] == [q >= level for q in q05]
        for record, warning in zip(records, warnings):
            if warning is not None:
                assert f"epoch {record['epoch']}:" in warning and f">= {record['neg_cos_q05']:.3f}" in warning
                assert ("queue_size=256" in warning) == bool(cfg.queue_size)


def test_no_negative_pair_is_no_collapse():
    """neg_cos_q05 is NaN when the epoch saw no other-label negative (histogram_quantile): nothing to judge."""
    assert collapse_warning({"epoch": 1, "neg_cos_q05": math.nan}, PretrainConfig()) is None
