"""Contrastive encoders: a timm backbone, the paper's projection head and a linear classifier.

A ``ContrastiveEncoder`` is fully described by a JSON-able config in the shape timm uses for Hub
checkpoints (``architecture``, ``num_classes``, ``label_names``, ``pretrained_cfg``,
``model_args``), so ``ContrastiveEncoder.from_config(model.model_config())`` rebuilds the same
architecture. This module knows nothing of files, the Hub or datasets (see ``hscl_zoo.zoo.hub``):
it needs timm, the CIFAR stem (``hscl_zoo.timm_models``, which also registers it in timm), the
evaluation transform (``hscl_zoo.data.transforms``) and the config schema (``hscl_zoo.zoo.schema``);
its Hub methods are spellings of ``hscl_zoo.zoo.hub.load`` and ``hscl_zoo.zoo.saving``'s functions,
which sit below the encoder: they build and save any encoder through its config alone.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import timm
import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models.resnet import ResNet
from torch import nn

from hscl_zoo.data.transforms import CROP_MODES, INTERPOLATIONS, eval_transform
from hscl_zoo.timm_models import small_stem_
from hscl_zoo.zoo.schema import CONFIG_LIBRARY_NAME, TIMM_KWARGS, check_config

__all__ = ["ContrastiveEncoder", "create_model", "SMALL_IMAGE_MAX_SIZE", "CONFIG_LIBRARY_NAME"]

SMALL_IMAGE_MAX_SIZE = 64
"""Image sizes up to this use the small (CIFAR) stem by default on ResNet-family backbones."""

_MODEL_ARG_KEYS = ("image_size", "small_stem", "proj_hidden_dim", "proj_dim")
_RESERVED_TIMM_KWARGS = ("num_classes", "model_name", "pretrained_cfg", "checkpoint_path")


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}.")
    return value


def _check_triplet(name: str, value: Sequence[float]) -> list[float]:
    values = [float(v) for v in value]
    if len(values) != 3:
        raise ValueError(f"{name} must have one value per RGB channel (3 values), got {list(value)!r}.")
    if name == "std" and any(v <= 0 for v in values):
        raise ValueError(f"std must be positive per channel, got {values!r}.")
    return values


def _is_resnet_family(backbone: str) -> bool:
    return timm.models.model_entrypoint(backbone).__module__ == ResNet.__module__


def _small_stem_error(backbone: str, fixed_input_size: bool) -> ValueError:
    family = timm.models.model_entrypoint(backbone).__module__.rpartition(".")[2]
    if fixed_input_size:
        fix = (f"give it small patches through timm's own arguments, e.g. create_model({backbone!r}, "
               "num_classes=..., image_size=32, small_stem=False, patch_size=4)")
    else:
        fix = (f"pass small_stem=False (and any stem arguments timm's {family} models accept as keyword "
               "arguments), or use a ResNet-family backbone such as 'resnet18'")
    return ValueError(f"small_stem=True is implemented for timm ResNet-family backbones only; {backbone!r} is a "
                      f"{family} model: {fix}.")


class ContrastiveEncoder(nn.Module):
    """A timm backbone with the H-SCL projection head and a linear classification head.

    ``encode`` gives the backbone's pooled features (what the linear probe reads), ``project`` the
    L2-normalised 128-d projection the contrastive losses consume, and ``forward`` the class logits
    of the linear head on top of the features. Freezing the backbone for a linear probe is the
    caller's choice (``requires_grad_(False)``), so ``encode`` stays differentiable.

    Args:
        backbone: timm model name, e.g. ``"resnet18"``.
        num_classes: number of classes of the linear head.
        image_size: square input resolution the model is built and preprocessed for.
        small_stem: use the CIFAR stem (3x3 stride-1 first conv, no max-pool; ResNet family only).
            ``None`` picks it for ResNets when ``image_size <= 64``.
        proj_hidden_dim: hidden width of the projection head (paper: 512).
        proj_dim: output width of the projection head (paper: 128).
        class_names: one name per class; defaults to ``"0"``, ``"1"``, ...
        mean: per-channel normalisation mean; ImageNet statistics unless given.
        std: per-channel normalisation standard deviation; ImageNet statistics unless given.
        interpolation: resize interpolation of the eval transform.
        crop_pct: centre-crop fraction of the eval transform (1.0: no crop, as for CIFAR).
        crop_mode: timm crop mode of the eval transform.
        pretrained: load timm's pretrained backbone weights (downloads them).
        **timm_kwargs: passed to ``timm.create_model`` and recorded in the config.
    """

    def __init__(
        self,
        backbone: str,
        num_classes: int,
        image_size: int,
        *,
        small_stem: bool | None = None,
        proj_hidden_dim: int = 512,
        proj_dim: int = 128,
        class_names: Sequence[str] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        interpolation: str = "bicubic",
        crop_pct: float = 1.0,
        crop_mode: str = "center",
        pretrained: bool = False,
        **timm_kwargs: Any,
    ) -> None:
        super().__init__()
        if not isinstance(backbone, str) or not timm.is_model(backbone):
            close = difflib.get_close_matches(str(backbone), timm.list_models(), n=5, cutoff=0.6)
            hint = f" Closest timm names: {', '.join(close)}." if close else " See timm.list_models('resnet*')."
            raise ValueError(f"Unknown timm backbone {backbone!r}.{hint}")
        num_classes = _check_positive_int("num_classes", num_classes)
        image_size = _check_positive_int("image_size", image_size)
        proj_hidden_dim = _check_positive_int("proj_hidden_dim", proj_hidden_dim)
        proj_dim = _check_positive_int("proj_dim", proj_dim)
        if small_stem is not None and not isinstance(small_stem, bool):
            raise ValueError(f"small_stem must be True, False or None (auto), got {small_stem!r}.")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {tuple(INTERPOLATIONS)}, got {interpolation!r}.")
        if crop_mode not in CROP_MODES:
            raise ValueError(f"crop_mode must be one of {CROP_MODES}, got {crop_mode!r}.")
        if not 0.0 < float(crop_pct) <= 1.0:
            raise ValueError(f"crop_pct must be in (0, 1], got {crop_pct!r}.")
        reserved = sorted(set(timm_kwargs) & set(_RESERVED_TIMM_KWARGS))
        if reserved:
            raise ValueError(f"{reserved} are set by ContrastiveEncoder itself; remove them from the timm keyword arguments.")
        if class_names is None:
            class_names = [str(i) for i in range(num_classes)]
        elif isinstance(class_names, str) or len(class_names) != num_classes:
            raise ValueError(
                f"class_names must list one name per class ({num_classes}), got "
                f"{class_names if isinstance(class_names, str) else len(class_names)!r}."
            )

        timm_kwargs = dict(timm_kwargs)
        fixed_input_size = bool(timm.models.get_pretrained_cfg(backbone).fixed_input_size)
        is_resnet = _is_resnet_family(backbone)
        if small_stem is None:
            small_stem = is_resnet and image_size <= SMALL_IMAGE_MAX_SIZE
        if small_stem and not is_resnet:
            raise _small_stem_error(backbone, fixed_input_size)
        if fixed_input_size and "img_size" not in timm_kwargs:
            timm_kwargs["img_size"] = image_size
        self.backbone = timm.create_model(backbone, pretrained=pretrained, num_classes=0, **timm_kwargs)
        if small_stem:
            if not isinstance(self.backbone, ResNet):
                raise _small_stem_error(backbone, fixed_input_size)
            small_stem_(self.backbone)

        self.num_features: int = int(self.backbone.num_features)
        self.num_classes = num_classes
        self.projector = nn.Sequential(
            nn.Linear(self.num_features, proj_hidden_dim, bias=False),
            nn.BatchNorm1d(proj_hidden_dim),
            nn.ReLU(inplace=True),
            nn.Linear(proj_hidden_dim, proj_dim),
        )
        self.classifier = nn.Linear(self.num_features, num_classes)

        self.backbone_name = backbone
        self.class_names: list[str] = [str(c) for c in class_names]
        self.model_args: dict[str, Any] = {
            "image_size": image_size,
            "small_stem": small_stem,
            "proj_hidden_dim": proj_hidden_dim,
            "proj_dim": proj_dim,
            **timm_kwargs,
        }
        self.pretrained_cfg: dict[str, Any] = {
            "input_size": [3, image_size, image_size],
            "interpolation": interpolation,
            "mean": _check_triplet("mean", IMAGENET_DEFAULT_MEAN if mean is None else mean),
            "std": _check_triplet("std", IMAGENET_DEFAULT_STD if std is None else std),
            "crop_pct": float(crop_pct),
            "crop_mode": crop_mode,
        }
        self.transform = eval_transform(self.pretrained_cfg)
        self.training_summary: dict[str, Any] | None = None

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled backbone features, shape (B, num_features): the representation the probe reads."""
        return self.backbone(x)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """L2-normalised projection, shape (B, proj_dim): what the contrastive losses consume."""
        return _project(self.backbone, self.projector, x)

    def projection_network(self) -> nn.Module:
        """The part pretraining optimises, as one module: backbone and projection head, shared
        with this encoder (not copied), its ``forward`` equal to :meth:`project`.

        The linear classifier is trained afterwards by the probe; leaving it out keeps DDP free
        of unused parameters, and the module's state dict holds exactly ``backbone.*`` and
        ``projector.*``.
        """
        return _ProjectionNetwork(self.backbone, self.projector)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits of the linear head on the backbone features, shape (B, num_classes)."""
        return self.classifier(self.encode(x))

    @torch.inference_mode()
    def predict(self, images: Any) -> torch.Tensor:
        """Class probabilities (B, num_classes) for PIL images, or for already preprocessed tensors.

        PIL images (one or a list) go through ``self.transform``; a (C, H, W) or (B, C, H, W)
        tensor is taken as preprocessed. Runs in eval mode on the model's device and restores
        the previous train/eval mode.
        """
        from PIL import Image

        if isinstance(images, Image.Image):
            images = [images]
        if isinstance(images, torch.Tensor):
            batch = images if images.ndim == 4 else images.unsqueeze(0)
        elif isinstance(images, Sequence) and images and all(isinstance(im, Image.Image) for im in images):
            batch = torch.stack([self.transform(im.convert("RGB")) for im in images])
        else:
            raise TypeError("predict() takes a PIL image, a list of PIL images, or a preprocessed image tensor; "
                            f"got {type(images).__name__}. Open files with PIL.Image.open(path).")
        was_training = self.training
        self.eval()
        try:
            device = next(self.parameters()).device
            return self(batch.to(device)).softmax(dim=-1)
        finally:
            self.train(was_training)

    def model_config(self) -> dict[str, Any]:
        """The timm-shaped, JSON-able config that rebuilds this architecture (no training summary)."""
        return {
            "library_name": CONFIG_LIBRARY_NAME,
            "architecture": self.backbone_name,
            "num_classes": self.num_classes,
            "num_features": self.num_features,
            "label_names": list(self.class_names),
            "pretrained_cfg": {**self.pretrained_cfg, "num_classes": self.num_classes},
            "model_args": dict(self.model_args),
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ContrastiveEncoder:
        """Rebuild an untrained encoder from ``model_config()`` output (e.g. a loaded config.json).

        The config is checked against :mod:`hscl_zoo.zoo.schema` first (a ``ValueError`` naming the
        key and the fix), so a plain timm config or a hand-edited file is caught before anything is
        built, and only the schema's ``TIMM_KWARGS`` reach ``timm.create_model``.
        """
        check_config(dict(config) if isinstance(config, Mapping) else config)
        model_args, pretrained_cfg = config["model_args"], config["pretrained_cfg"]
        image_size = model_args["image_size"]
        timm_kwargs = {k: model_args[k] for k in TIMM_KWARGS if k in model_args}
        return cls(
            config["architecture"],
            config["num_classes"],
            image_size,
            small_stem=model_args["small_stem"],
            proj_hidden_dim=model_args["proj_hidden_dim"],
            proj_dim=model_args["proj_dim"],
            class_names=config.get("label_names"),
            mean=pretrained_cfg["mean"],
            std=pretrained_cfg["std"],
            interpolation=pretrained_cfg.get("interpolation", "bicubic"),
            crop_pct=pretrained_cfg.get("crop_pct", 1.0),
            crop_mode=pretrained_cfg.get("crop_mode", "center"),
            **timm_kwargs,
        )

    @classmethod
    def from_pretrained(cls, source: Any, **kwargs: Any) -> ContrastiveEncoder:
        """The Hugging Face spelling of ``hscl_zoo.load(source, **kwargs)``: a zoo name,
        ``hf-hub:owner/name[@revision]``, ``local-dir:/path`` or a folder."""
        from hscl_zoo.zoo.hub import load

        return load(source, **kwargs)

    def save_pretrained(self, save_directory: str | Path, *, training: Mapping[str, Any] | None = None,
                        **options: Any) -> Path:
        """``hscl_zoo.save_pretrained(self, save_directory, **options)`` (``dtype``, ``max_shard_size``);
        ``training`` defaults to the summary the model was loaded with, so a loaded model saves back
        whole. Returns the folder."""
        training = self.training_summary if training is None else training
        from hscl_zoo.zoo.saving import save_pretrained

        return save_pretrained(self, save_directory, training=training, **options)

    def push_to_hub(self, repo_id: str, **kwargs: Any) -> Any:
        """``hscl_zoo.push_to_hub(self, repo_id, **kwargs)`` (card, extra files, private, token,
        revision, commit_message); ``training`` defaults as in ``save_pretrained``. Returns the
        ``hscl_zoo.zoo.saving.PushResult`` (commit and sha256 to pin)."""
        kwargs.setdefault("training", self.training_summary)
        from hscl_zoo.zoo.saving import push_to_hub

        return push_to_hub(self, repo_id, **kwargs)


class _ProjectionNetwork(nn.Module):
    """Backbone and projection head of an encoder (see ``ContrastiveEncoder.projection_network``)."""

    def __init__(self, backbone: nn.Module, projector: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.projector = projector

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _project(self.backbone, self.projector, x)


def _project(backbone: nn.Module, projector: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.normalize(projector(backbone(x)), dim=-1)


def create_model(backbone: str, num_classes: int, image_size: int, **options: Any) -> ContrastiveEncoder:
    """Build an untrained ``ContrastiveEncoder`` on any timm backbone (nothing is downloaded
    unless ``pretrained=True``).

    ``options`` are ``ContrastiveEncoder``'s keyword arguments, documented there: ``small_stem``,
    ``proj_hidden_dim``, ``proj_dim``, ``class_names``, ``mean``, ``std``, ``interpolation``,
    ``crop_pct``, ``crop_mode``, ``pretrained``, and any keyword of ``timm.create_model``.

    Example: ``hscl_zoo.create_model("resnet18", num_classes=10, image_size=32)`` gives a
    ResNet-18 with the CIFAR stem, a 512 -> 512 -> 128 projection head and a 10-way linear head.
    """
    return ContrastiveEncoder(backbone, num_classes, image_size, **options)
