"""Pretraining, in the order a run goes: its configuration, the loop, checkpoints, the per-epoch
monitors, and the Hub-ready folder at the end.

    config          PretrainConfig: defaults, YAML files, --key value overrides
    pretrain        pretrain(argv) / main(argv): the loop `recipes/pretrain.py` runs
    monitoring      the kNN monitor, the paper's diagnostics, metrics.jsonl upkeep
    checkpointing   per-epoch checkpoints that a crash cannot corrupt
    publishing      the run's training summary, model card and metrics beside its weights
"""

from hscl_zoo.training.config import PretrainConfig, parse_overrides
from hscl_zoo.training.pretrain import main, pretrain

__all__ = ["PretrainConfig", "main", "parse_overrides", "pretrain"]
