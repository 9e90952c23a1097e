"""hscl_zoo: contrastive image encoders trained with the losses of
"Supervised Contrastive Learning with Hard Negative Samples" (Jiang et al.), loadable by name.

The subpackages follow the data flow (docs/architecture.md): `data` (datasets, transforms, views,
loaders), `models` (encoders), `losses` (the objectives and the method table), `training` (the
pretraining loop), `evaluation` (linear probe, kNN) and `zoo` (registry, Hub files, model cards).
Each name below is imported from its module on first use, so ``import hscl_zoo`` is cheap and
the registry (``hscl_zoo.list_models``, ``hscl_zoo.info``) is read without loading torch.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from hscl_zoo._lazy import lazy_exports as _lazy_exports
from hscl_zoo._version import __version__

_EXPORTS = {
    # losses, the method table and diagnostics
    **dict.fromkeys(("LOSS_NAMES", "METHODS", "MethodSpec", "build_loss", "register_method"), "hscl_zoo.losses.methods"),
    "ContrastiveLoss": "hscl_zoo.losses.objective",
    **dict.fromkeys(("MetricLearningLoss", "NTXentLoss", "SupConLoss"), "hscl_zoo.losses.compat"),
    **dict.fromkeys(("assumption_fraction", "lemma_losses", "DiagnosticsMeter"), "hscl_zoo.losses.diagnostics"),
    # models, registry and hub
    **dict.fromkeys(("ContrastiveEncoder", "create_model"), "hscl_zoo.models"),
    **dict.fromkeys(("ZooEntry", "info", "list_models"), "hscl_zoo.zoo.registry"),
    "load": "hscl_zoo.zoo.hub",
    **dict.fromkeys(("push_to_hub", "save_pretrained"), "hscl_zoo.zoo.saving"),
    # data and evaluation
    **dict.fromkeys(("DATASETS", "DatasetSpec", "register_dataset"), "hscl_zoo.data.catalog"),
    **dict.fromkeys(("LoadedData", "load_split", "load_splits"), "hscl_zoo.data.datasets"),
    **dict.fromkeys(("eval_transform", "simclr_transform"), "hscl_zoo.data.transforms"),
    "MultiViewDataset": "hscl_zoo.data.views",
    "make_loader": "hscl_zoo.data.loaders",
    "evaluate_encoder": "hscl_zoo.evaluation",
    "extract_features": "hscl_zoo.features",
    **dict.fromkeys(("ProbeResult", "knn_top1", "linear_probe"), "hscl_zoo.probes"),
    # exact large-batch gradients in small memory
    **dict.fromkeys(("BATCHNORM_MODES", "gradient_cache_backward", "prepare_batchnorm"),
                    "hscl_zoo.training.gradient_cache"),
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)

if _TYPE_CHECKING:
    from hscl_zoo.losses.compat import MetricLearningLoss, NTXentLoss, SupConLoss
    from hscl_zoo.data.catalog import DATASETS, DatasetSpec, register_dataset
    from hscl_zoo.data.datasets import LoadedData, load_split, load_splits
    from hscl_zoo.data.loaders import make_loader
    from hscl_zoo.data.transforms import eval_transform, simclr_transform
    from hscl_zoo.data.views import MultiViewDataset
    from hscl_zoo.evaluation import evaluate_encoder
    from hscl_zoo.features import extract_features
    from hscl_zoo.losses.diagnostics import DiagnosticsMeter, assumption_fraction, lemma_losses
    from hscl_zoo.losses.methods import LOSS_NAMES, METHODS, MethodSpec, build_loss, register_method
    from hscl_zoo.losses.objective import ContrastiveLoss
    from hscl_zoo.models import ContrastiveEncoder, create_model
    from hscl_zoo.probes import ProbeResult, knn_top1, linear_probe
    from hscl_zoo.training.gradient_cache import BATCHNORM_MODES, gradient_cache_backward, prepare_batchnorm
    from hscl_zoo.zoo.hub import load
    from hscl_zoo.zoo.registry import ZooEntry, info, list_models
    from hscl_zoo.zoo.saving import push_to_hub, save_pretrained
