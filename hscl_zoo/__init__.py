"""hscl_zoo: contrastive image encoders trained with the losses of
"Supervised Contrastive Learning with Hard Negative Samples" (Jiang et al.), loadable by name."""

__version__ = "0.1.0"

# losses and diagnostics
from hscl_zoo.losses import LOSS_NAMES, ContrastiveLoss, build_loss
from hscl_zoo.diagnostics import assumption_fraction, lemma_losses, DiagnosticsMeter

# models, registry and hub (issue 3)
from hscl_zoo.models import ContrastiveEncoder, create_model
from hscl_zoo.registry import ZooEntry, info, list_models
from hscl_zoo.hub import load, push_to_hub, save_pretrained

# data and evaluation (issue 4)
from hscl_zoo.data import DATASETS, DatasetSpec, LoadedData, load_split, load_splits
from hscl_zoo.augment import MultiViewDataset, eval_transform, make_loader, simclr_transform
from hscl_zoo.evaluation import ProbeResult, evaluate_encoder, extract_features, knn_top1, linear_probe

# exact large-batch gradients in small memory (issue 16)
from hscl_zoo.gradient_cache import BATCHNORM_MODES, gradient_cache_backward, prepare_batchnorm
