"""hscl_zoo: contrastive image encoders trained with the losses of
"Supervised Contrastive Learning with Hard Negative Samples" (Jiang et al.), loadable by name.

The subpackages follow the data flow (docs/architecture.md): `data` (datasets, transforms, views,
loaders), `models` (encoders), `losses` (the objectives and the method table), `training` (the
pretraining loop), `evaluation` (linear probe, kNN) and `zoo` (registry, Hub files, model cards).
"""

from hscl_zoo._version import __version__

# losses, the method table and diagnostics
from hscl_zoo.losses.methods import LOSS_NAMES, METHODS, MethodSpec, build_loss, register_method
from hscl_zoo.losses.objective import ContrastiveLoss
from hscl_zoo.losses.diagnostics import assumption_fraction, lemma_losses, DiagnosticsMeter
from hscl_zoo.losses.compat import MetricLearningLoss, NTXentLoss, SupConLoss

# models, registry and hub
from hscl_zoo.models import ContrastiveEncoder, create_model
from hscl_zoo.zoo.registry import ZooEntry, info, list_models
from hscl_zoo.zoo.hub import load
from hscl_zoo.zoo.saving import push_to_hub, save_pretrained

# data and evaluation
from hscl_zoo.data.catalog import DATASETS, DatasetSpec, register_dataset
from hscl_zoo.data.datasets import LoadedData, load_split, load_splits
from hscl_zoo.data.transforms import eval_transform, simclr_transform
from hscl_zoo.data.views import MultiViewDataset
from hscl_zoo.data.loaders import make_loader
from hscl_zoo.evaluation import ProbeResult, evaluate_encoder, extract_features, knn_top1, linear_probe

# exact large-batch gradients in small memory
from hscl_zoo.training.gradient_cache import BATCHNORM_MODES, gradient_cache_backward, prepare_batchnorm
