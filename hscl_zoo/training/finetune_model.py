"""The model side of fine-tuning (`hscl_zoo.training.finetune`): which backbone stages to freeze
(timm's coarse parameter groups), BatchNorm of frozen stages kept in eval mode, a classifier head
for the dataset's classes, and the one module Accelerate trains."""

from __future__ import annotations

import timm
import torch
from torch import nn

from hscl_zoo.models import ContrastiveEncoder

__all__ = ["classifier_for", "freeze_stages", "frozen_batchnorm_eval", "stage_count", "stage_groups"]


def stage_groups(backbone: nn.Module) -> dict[int, list[str]]:
    """The backbone's parameter names per stage: timm's coarse groups (stem first), in order."""
    if not hasattr(backbone, "group_matcher"):
        raise ValueError(f"{type(backbone).__name__} has no timm group_matcher, so its stages are unknown; "
                         "use --freeze_stages 0.")
    groups = timm.models.group_parameters(backbone, backbone.group_matcher(coarse=True))
    return dict(sorted(groups.items()))


def stage_count(backbone: nn.Module) -> int:
    """How many stages `freeze_stages` can freeze."""
    return len(stage_groups(backbone))


def freeze_stages(encoder: ContrastiveEncoder, stages: int) -> list[str]:
    """Stop the gradient of the first `stages` backbone stages; returns the frozen parameter names
    (prefixed ``backbone.``). Their BatchNorm layers are kept in eval mode by `frozen_batchnorm_eval`."""
    if stages == 0:
        return []
    groups = stage_groups(encoder.backbone)
    if not 0 <= stages <= len(groups):
        raise ValueError(f"freeze_stages={stages}: {encoder.backbone_name} has {len(groups)} stages (timm's coarse "
                         f"groups); use 0 to {len(groups)}.")
    frozen = [name for group in list(groups.values())[:stages] for name in group]
    params = dict(encoder.backbone.named_parameters())
    for name in frozen:
        params[name].requires_grad_(False)
    return [f"backbone.{name}" for name in frozen]


def frozen_batchnorm_eval(encoder: ContrastiveEncoder) -> None:
    """Put every normalisation layer whose parameters are all frozen in eval mode, so that training
    leaves its running statistics as they were."""
    for module in encoder.backbone.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            params = list(module.parameters(recurse=False))
            if params and not any(p.requires_grad for p in params):
                module.eval()


def classifier_for(model: ContrastiveEncoder, class_names: list[str], image_size: int | None = None) -> tuple[ContrastiveEncoder, str]:
    """`model` if its head already classifies `class_names` at its size, else the same backbone and
    projection head (weights copied) with a new head for them at `image_size`; and "loaded" or "new"."""
    config = model.model_config()
    size = image_size or config["model_args"]["image_size"]
    if list(model.class_names) == list(class_names) and size == config["model_args"]["image_size"]:
        return model, "loaded"
    config.update(num_classes=len(class_names), label_names=list(class_names))
    config["pretrained_cfg"] = {**config["pretrained_cfg"], "num_classes": len(class_names), "input_size": [3, size, size]}
    config["model_args"] = {**config["model_args"], "image_size": size}
    new = ContrastiveEncoder.from_config(config)
    new.backbone.load_state_dict(model.backbone.state_dict())
    new.projector.load_state_dict(model.projector.state_dict())
    head = "loaded" if list(model.class_names) == list(class_names) else "new"
    if head == "loaded":
        new.classifier.load_state_dict(model.classifier.state_dict())
    return new, head


class _Finetuned(nn.Module):
    """Backbone, projection head and classifier of an encoder as one module for Accelerate:
    returns the class logits and, with `project`, the projections too."""

    def __init__(self, encoder: ContrastiveEncoder) -> None:
        super().__init__()
        self.backbone, self.projector, self.classifier = encoder.backbone, encoder.projector, encoder.classifier

    def forward(self, x: torch.Tensor, project: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        h = self.backbone(x)
        return self.classifier(h), (self.projector(h) if project else None)
