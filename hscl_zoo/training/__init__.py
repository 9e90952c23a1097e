"""Pretraining, in the order a run goes: its configuration, the loop, checkpoints, the per-epoch
monitors, and the Hub-ready folder at the end.

    config          PretrainConfig: defaults, YAML files, --key value overrides
    pretrain        pretrain(argv) / main(argv): the run `recipes/pretrain.py` runs, in three parts:
    setup             the run's setup: arguments, run folder, data, encoder, optimizer, views
    epochs            the epochs: one pass, resume, the monitors' calls, checkpoints, a stop
    finish            the run's end: linear probe, linear_eval.json, the Hub-ready folder
    monitoring      the kNN monitor, the paper's diagnostics, metrics.jsonl upkeep
    checkpointing   per-epoch checkpoints that a crash cannot corrupt (and the loss's memory queue)
    steps           the gradient-cache step the loop takes with chunk_size

The Hub-ready folder and releases are `hscl_zoo.publishing`'s; graph datasets train through
`hscl_zoo.graphs.recipe`. The names below load on first use,
so that importing the package loads no torch.
"""

from hscl_zoo._lazy import lazy_exports as _lazy_exports

_EXPORTS = {
    "PretrainConfig": "hscl_zoo.training.config",
    "parse_overrides": "hscl_zoo.training.config",
    "main": "hscl_zoo.training.pretrain",
    "pretrain": "hscl_zoo.training.pretrain",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
