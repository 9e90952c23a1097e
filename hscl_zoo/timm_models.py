"""timm architectures for the zoo's CIFAR-stem ResNets, registered in timm's own model registry.

The zoo's CIFAR and Tiny ImageNet encoders use the CIFAR stem: a 3x3 stride-1 first conv and no
max-pool. timm's ResNet builds only stride-2 stems (a 7x7 conv, or a 3x3 "deep" stack, followed by
a stride-2 max-pool or conv), and none of its keyword arguments changes that. Importing this module
registers, for every timm ResNet ``NAME`` (``timm.list_models(module="resnet")``), the architecture
``NAME_cifar``: timm's own ``NAME`` with the CIFAR stem, built and loaded through timm's factory,
so that a folder :func:`hscl_zoo.export.export_timm` writes opens with

    import hscl_zoo.timm_models  # registers resnet18_cifar & co. in timm
    model = timm.create_model("local-dir:DIR", pretrained=True)

The registration lives in the Python process: timm alone does not know these names, so a process
must import this module before ``timm.create_model`` (``import hscl_zoo`` alone does not, to stay
cheap; building or loading any zoo model does, as :mod:`hscl_zoo.models` imports this module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import timm
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import load_pretrained, register_model, resolve_pretrained_cfg
from timm.models.resnet import ResNet
from torch import nn

__all__ = ["CIFAR_SUFFIX", "cifar_architecture", "small_stem_"]

CIFAR_SUFFIX = "_cifar"
"""``NAME + CIFAR_SUFFIX`` is timm's ResNet ``NAME`` with the CIFAR stem."""

default_cfgs: dict[str, dict[str, Any]] = {}
"""Read by timm's ``register_model``: each architecture's default ``pretrained_cfg`` (no weights of
its own; an exported folder's config.json brings the real preprocessing and class count)."""


def small_stem_(backbone: ResNet) -> None:
    """Turn a timm ResNet's stem into the CIFAR stem: a 3x3 stride-1 first conv and no max-pool.

    A plain 7x7 stem conv is replaced; a deep (3x3 stack) stem keeps its convs with the first
    one's stride set to 1. ``feature_info`` reductions drop by the stem's lost factor of 4.
    """
    stem = backbone.conv1
    if isinstance(stem, nn.Conv2d):
        backbone.conv1 = nn.Conv2d(stem.in_channels, stem.out_channels, 3, stride=1, padding=1, bias=False)
    else:
        first = stem[0]
        if not isinstance(first, nn.Conv2d) or first.kernel_size != (3, 3):
            raise ValueError(f"Unsupported ResNet stem {type(stem).__name__}; expected a Conv2d or a 3x3 deep stem.")
        first.stride = (1, 1)
    backbone.maxpool = nn.Identity()
    for info in getattr(backbone, "feature_info", []):
        info["reduction"] = max(1, info["reduction"] // 4)


def cifar_architecture(backbone: str) -> str:
    """The registered timm name of ``backbone`` (a timm ResNet name) with the CIFAR stem."""
    name = backbone + CIFAR_SUFFIX
    if not timm.is_model(name):
        raise ValueError(f"timm has no CIFAR-stem architecture for {backbone!r} (registered: the names of "
                         "timm.list_models(module='resnet') + '_cifar'); export this encoder with "
                         "hscl_zoo.export.export_onnx(model, 'out/features.onnx') instead.")
    return name


def _entrypoint(base: str) -> Callable[..., ResNet]:
    name = base + CIFAR_SUFFIX

    def create(pretrained: bool = False, **kwargs: Any) -> ResNet:
        cfg = resolve_pretrained_cfg(name, kwargs.pop("pretrained_cfg", None),
                                     kwargs.pop("pretrained_cfg_overlay", None)).to_dict()
        cache_dir = kwargs.pop("cache_dir", None)
        kwargs.pop("pretrained_model_args", None)
        if kwargs.get("features_only"):
            raise ValueError(f"{name} does not build a features_only wrapper; create it without features_only and "
                             "call model.forward_intermediates(images) for the stage outputs.")
        model = timm.create_model(base, **kwargs)
        small_stem_(model)
        model.pretrained_cfg = model.default_cfg = cfg
        if pretrained:
            load_pretrained(model, cfg, num_classes=model.num_classes, in_chans=model.in_chans, cache_dir=cache_dir)
        return model

    create.__name__ = create.__qualname__ = name
    create.__module__ = __name__
    create.__doc__ = f"timm's {base} with the CIFAR stem (3x3 stride-1 first conv, no max-pool)."
    return create


def _register_all() -> None:
    for base in timm.list_models(module="resnet"):
        name = base + CIFAR_SUFFIX
        if timm.is_model(name):
            continue
        default_cfgs[name] = {
            "url": "", "num_classes": 1000, "input_size": (3, 32, 32), "pool_size": (4, 4), "crop_pct": 1.0,
            "interpolation": "bicubic", "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD,
            "first_conv": timm.models.get_pretrained_cfg(base).first_conv, "classifier": "fc",
        }
        register_model(_entrypoint(base))


_register_all()
