"""The contrastive objectives: the loss contract (docs/losses.md), its fast path, hardening
functions, the global-batch gather, the paper's diagnostics and the method table.

    objective     ContrastiveLoss: the general computation, input checks, the pair sets
    fused         the one-node fast path for uniform, exponential-tilt and threshold weights
    hardening     hardening functions (exponential tilt, threshold, its linear schedule)
    distributed   gathering the global batch with gradient under torch.distributed
    methods       MethodSpec, the method table and build_loss
    diagnostics   Assumption 1 and the Lemma-1 losses of the paper's Sec. V-B
    queue         MemoryQueue: a labelled FIFO of earlier batches' rows, extra candidates
    reference     a plain-loop float64 implementation, for tests and benchmarks
    compat        drop-in losses with SupContrast's, lightly's and pytorch-metric-learning's calls
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from hscl_zoo._lazy import lazy_exports as _lazy_exports

_EXPORTS = {
    **dict.fromkeys(("MetricLearningLoss", "NTXentLoss", "SupConLoss"), "hscl_zoo.losses.compat"),
    **dict.fromkeys(("ExponentialTilt", "LinearThresholdSchedule", "Threshold"), "hscl_zoo.losses.hardening"),
    **dict.fromkeys(("LOSS_NAMES", "METHODS", "Hyperparameter", "MethodSpec", "build_loss", "get_method",
                     "register_method"), "hscl_zoo.losses.methods"),
    "ContrastiveLoss": "hscl_zoo.losses.objective",
    "MemoryQueue": "hscl_zoo.losses.queue",
}
__all__ = [
    "ContrastiveLoss",
    "ExponentialTilt",
    "Hyperparameter",
    "LOSS_NAMES",
    "LinearThresholdSchedule",
    "METHODS",
    "MemoryQueue",
    "MethodSpec",
    "MetricLearningLoss",
    "NTXentLoss",
    "SupConLoss",
    "Threshold",
    "build_loss",
    "get_method",
    "register_method",
]
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)

if _TYPE_CHECKING:
    from hscl_zoo.losses.compat import MetricLearningLoss, NTXentLoss, SupConLoss
    from hscl_zoo.losses.hardening import ExponentialTilt, LinearThresholdSchedule, Threshold
    from hscl_zoo.losses.methods import (
        LOSS_NAMES,
        METHODS,
        Hyperparameter,
        MethodSpec,
        build_loss,
        get_method,
        register_method,
    )
    from hscl_zoo.losses.objective import ContrastiveLoss
    from hscl_zoo.losses.queue import MemoryQueue
