"""Encoders as files other tools open: a timm folder, an ONNX graph, a TorchScript module.

* :func:`export_timm` writes ``config.json`` + ``model.safetensors`` in timm's own Hub layout, so
  ``timm.create_model("local-dir:DIR", pretrained=True)`` (or ``"hf-hub:owner/name"`` once the
  folder is uploaded) builds the backbone with the linear head as timm's classifier: its output is
  the class logits, ``num_classes=0`` (or ``forward_head(..., pre_logits=True)``) gives the pooled
  features of ``model.encode``. An encoder with timm's own stem opens in plain timm. One with the
  CIFAR stem (``small_stem=True``: the zoo's CIFAR and Tiny ImageNet models) is written as the
  architecture ``NAME_cifar`` (e.g. ``resnet18_cifar``), which :mod:`hscl_zoo.timm_models`
  registers in timm: ``import hscl_zoo.timm_models`` before ``timm.create_model`` (see
  :func:`timm_usage`). timm has no slot for the projection head; export it through ONNX or
  TorchScript.
* :func:`export_onnx` and :func:`export_torchscript` write one graph from a preprocessed float32
  batch ``images`` (N, 3, H, W) to ``features``, ``projection`` or ``logits``, with the batch size
  free, and ``preprocess.json`` beside it: how to turn an image file into that batch.

Every export is loaded back and compared with PyTorch on a random batch before it is returned
(timm and TorchScript to 1e-5, ONNX Runtime to 1e-4), so a file that does not reproduce the model
is never left looking finished.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timm
import torch
from torch import nn
from torchvision.transforms import v2

from hscl_zoo.models import _MODEL_ARG_KEYS, ContrastiveEncoder
from hscl_zoo.protocol import OUTPUTS
from hscl_zoo.timm_models import CIFAR_SUFFIX, cifar_architecture

__all__ = ["OUTPUTS", "PREPROCESS_NAME", "INPUT_NAME", "export_timm", "export_onnx", "export_torchscript",
           "preprocess_config", "timm_usage"]

PREPROCESS_NAME = "preprocess.json"
INPUT_NAME = "images"

_TIMM_CFG_KEYS = ("architecture", "first_conv", "classifier", "fixed_input_size")
"""timm pretrained_cfg keys that describe the architecture; the rest (tags, licences, URLs of
timm's own ImageNet weights) would misdescribe exported weights."""
_TIMM_FILES = ("config.json", "model.safetensors")
_PREPROCESS_KEYS = ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")


def _encoder(model: nn.Module, what: str) -> ContrastiveEncoder:
    if not isinstance(model, ContrastiveEncoder):
        raise TypeError(f"{what} takes a hscl_zoo ContrastiveEncoder (hscl_zoo.load or hscl_zoo.create_model), "
                        f"got {type(model).__name__}.")
    return model


def _check_output(output: str) -> str:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}.")
    return output


def _example_batch(encoder: ContrastiveEncoder, batch: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, *encoder.pretrained_cfg["input_size"], generator=generator)


def _check_close(name: str, got: torch.Tensor, expected: torch.Tensor, atol: float) -> None:
    if got.shape != expected.shape:
        raise RuntimeError(f"{name} gives shape {tuple(got.shape)}, the model {tuple(expected.shape)}; "
                           "the export is broken (please report it).")
    error = float((got - expected).abs().max())
    if error > atol:
        raise RuntimeError(f"{name} differs from the PyTorch model by {error:.2e} (> {atol:g}); "
                           "the export is not faithful (please report it with the backbone name).")


class _Graph(nn.Module):
    """A CPU float32 eval-mode copy of an encoder whose ``forward`` is one of :data:`OUTPUTS`."""

    def __init__(self, encoder: ContrastiveEncoder, output: str) -> None:
        super().__init__()
        self.encoder = copy.deepcopy(encoder).float().cpu()
        self.output = _check_output(output)
        self.eval()

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.output == "features":
            return self.encoder.encode(images)
        if self.output == "projection":
            return self.encoder.project(images)
        return self.encoder(images)


def preprocess_config(model: ContrastiveEncoder) -> dict[str, Any]:
    """How an image becomes the exported graphs' input, read off ``model.transform`` (the same
    preprocessing ``hscl_zoo`` evaluates with): RGB, resize, centre crop, scale to [0, 1],
    normalise, NCHW float32. ``class_names`` index the ``logits`` output."""
    encoder = _encoder(model, "preprocess_config")
    steps = encoder.transform.transforms
    resize = next(t for t in steps if isinstance(t, v2.Resize))
    crop = next(t for t in steps if isinstance(t, v2.CenterCrop))
    size = list(resize.size)
    return {
        "input_name": INPUT_NAME,
        "input_layout": "NCHW",
        "input_dtype": "float32",
        "input_size": list(encoder.pretrained_cfg["input_size"]),
        "color_mode": "RGB",
        "resize": {
            "size": size,
            "meaning": "shorter side to this length, keeping the aspect ratio" if len(size) == 1
            else "to (height, width), ignoring the aspect ratio",
            "interpolation": resize.interpolation.value,
            "antialias": bool(resize.antialias),
        },
        "center_crop": list(crop.size),
        "scale": "divide 8-bit pixel values by 255",
        "mean": list(encoder.pretrained_cfg["mean"]),
        "std": list(encoder.pretrained_cfg["std"]),
        "normalize": "(x - mean) / std per channel, after scaling",
        "timm_pretrained_cfg": {k: encoder.pretrained_cfg[k] for k in _PREPROCESS_KEYS},
        "class_names": list(encoder.class_names),
    }


def _preprocess_recorder(encoder: ContrastiveEncoder, model_file: Path) -> Callable[[str, int], Path]:
    """Check ``preprocess.json`` beside ``model_file`` before anything is exported; the returned
    function then writes it, listing ``model_file`` among the folder's graphs.

    Several graphs of one model share the folder's file; a preprocess.json describing another
    model's input is not overwritten.
    """
    path = model_file.parent / PREPROCESS_NAME
    config = preprocess_config(encoder)
    graphs: dict[str, Any] = {}
    if path.is_file():
        try:
            existing = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            existing = {}
        if not isinstance(existing, dict) or {k: v for k, v in existing.items() if k != "graphs"} != config:
            raise ValueError(f"{path} describes the preprocessing of another model; export into an empty folder "
                             "(or delete that preprocess.json with the files it lists).")
        graphs = dict(existing.get("graphs") or {})

    def record(output: str, dim: int) -> Path:
        graphs[model_file.name] = {"output": output, "shape": ["batch", dim]}
        path.write_text(json.dumps({**config, "graphs": graphs}, indent=2) + "\n", encoding="utf-8")
        return path

    return record


def _graph_file(out_path: str | os.PathLike[str], suffix: str) -> Path:
    path = Path(out_path).expanduser()
    if path.suffix != suffix:
        raise ValueError(f"{path} should end in {suffix} (the exported file itself, e.g. model{suffix}); "
                         f"preprocess.json is written beside it.")
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; give the file to write, e.g. {path / ('model' + suffix)}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def export_timm(model: ContrastiveEncoder, out_dir: str | os.PathLike[str]) -> Path:
    """Write a folder that timm opens: ``timm.create_model("local-dir:DIR", pretrained=True)``.

    The backbone keeps its timm weights and keyword arguments; the linear head becomes timm's
    classifier (``label_names`` from ``model.class_names``); ``pretrained_cfg`` carries the
    model's preprocessing, so ``timm.data.resolve_data_config(model=...)`` reproduces it. The
    projection head is left out. A CIFAR-stem encoder's architecture is ``NAME_cifar``, which
    needs ``import hscl_zoo.timm_models`` in the process that opens the folder (:func:`timm_usage`
    says what to run). Raises ``ValueError`` for a backbone whose timm classifier is not one
    linear layer on the pooled features. Returns the folder.
    """
    from timm.models import save_for_hf

    encoder = _encoder(model, "export_timm")
    architecture = cifar_architecture(encoder.backbone_name) if encoder.model_args.get("small_stem") \
        else encoder.backbone_name
    timm_kwargs = {k: v for k, v in encoder.model_args.items() if k not in _MODEL_ARG_KEYS}
    backbone = timm.create_model(architecture, num_classes=encoder.num_classes, **timm_kwargs)
    head = backbone.get_classifier()
    if not isinstance(head, nn.Linear) or head.in_features != encoder.num_features:
        raise ValueError(f"{encoder.backbone_name}'s timm classifier is {type(head).__name__}, not one linear layer "
                         f"on the {encoder.num_features} pooled features, so the zoo's linear head has no place in "
                         "a timm folder; export it with hscl_zoo.export.export_onnx(model, 'out/features.onnx') "
                         "instead.")
    keys = backbone.load_state_dict(encoder.backbone.state_dict(), strict=False)
    head_keys = {f"{name}.{param}" for name, module in backbone.named_modules() if module is head
                 for param in ("weight", "bias")}
    if keys.unexpected_keys or set(keys.missing_keys) != head_keys:
        raise RuntimeError(f"timm's {architecture} does not take the encoder's backbone weights "
                           f"(missing {keys.missing_keys}, unexpected {keys.unexpected_keys}); please report it.")
    head.load_state_dict(encoder.classifier.state_dict())
    backbone.pretrained_cfg = {
        **{k: v for k, v in backbone.pretrained_cfg.items() if k in _TIMM_CFG_KEYS},
        **{k: encoder.pretrained_cfg[k] for k in _PREPROCESS_KEYS},
        "num_classes": encoder.num_classes,
    }
    folder = Path(out_dir).expanduser()
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}.", dir=folder.parent) as staging:
        save_for_hf(backbone.eval(), staging, model_config={"label_names": list(encoder.class_names)},
                    safe_serialization=True)
        _check_timm_folder(encoder, Path(staging))
        folder.mkdir(exist_ok=True)
        for name in _TIMM_FILES:
            os.replace(Path(staging) / name, folder / name)
    return folder


def _check_timm_folder(encoder: ContrastiveEncoder, folder: Path) -> None:
    reloaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    reference = copy.deepcopy(encoder).float().cpu().eval()
    images = _example_batch(encoder, 3, seed=0)
    with torch.no_grad():
        pooled = reloaded.forward_head(reloaded.forward_features(images), pre_logits=True)
        _check_close("The timm folder's pooled features", pooled, reference.encode(images), 1e-5)
        _check_close("The timm folder's logits", reloaded(images), reference(images), 1e-5)


def timm_usage(folder: str | os.PathLike[str]) -> str:
    """The Python lines that open an exported timm folder, the registering import first when its
    architecture is one of :mod:`hscl_zoo.timm_models`' CIFAR-stem names."""
    architecture = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))["architecture"]
    opening = f"model = timm.create_model({f'local-dir:{folder}'!r}, pretrained=True)"
    if architecture.endswith(CIFAR_SUFFIX):
        return f"import timm, hscl_zoo.timm_models  # registers {architecture} in timm\n{opening}"
    return f"import timm\n{opening}"


def _require_onnx(check: bool) -> None:
    modules = ["onnx", "onnxscript"] + (["onnxruntime"] if check else [])
    missing = []
    for name in modules:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(f"ONNX export needs {', '.join(missing)}: pip install 'hscl-zoo[onnx]'.")


def export_onnx(
    model: ContrastiveEncoder,
    out_path: str | os.PathLike[str],
    output: str = "features",
    *,
    opset_version: int | None = None,
    check: bool = True,
) -> Path:
    """Export ``images`` (N, 3, H, W, preprocessed) -> ``output`` as one ONNX file, with PyTorch's
    ``torch.export``-based exporter, and write ``preprocess.json`` beside it.

    ``output`` is ``"features"`` (``model.encode``), ``"projection"`` (``model.project``, the
    L2-normalised head the losses use) or ``"logits"`` (the linear head); the graph's output is
    named after it and the batch dimension is dynamic. With ``check`` (the default) the file is run
    by ONNX Runtime on a batch of another size and compared with PyTorch to 1e-4. Needs the
    ``onnx`` extra (onnx, onnxscript, onnxruntime). Returns the ``.onnx`` path.
    """
    encoder = _encoder(model, "export_onnx")
    _check_output(output)
    _require_onnx(check)
    path = _graph_file(out_path, ".onnx")
    record = _preprocess_recorder(encoder, path)
    graph = _Graph(encoder, output)
    torch.onnx.export(
        graph, (_example_batch(encoder, 2, seed=0),), path, input_names=[INPUT_NAME], output_names=[output],
        dynamic_shapes=({0: torch.export.Dim("batch")},), opset_version=opset_version, dynamo=True,
        external_data=False, verbose=False,
    )
    images = _example_batch(encoder, 3, seed=1)
    with torch.no_grad():
        expected = graph(images)
    if check:
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = torch.from_numpy(session.run([output], {INPUT_NAME: images.numpy()})[0])
        _check_close(f"ONNX Runtime on {path.name}", got, expected, 1e-4)
    record(output, expected.shape[1])
    return path


def export_torchscript(model: ContrastiveEncoder, out_path: str | os.PathLike[str], output: str = "features") -> Path:
    """Trace ``images`` -> ``output`` (see :func:`export_onnx`) into a TorchScript ``.pt`` file that
    ``torch.jit.load`` runs without hscl_zoo or timm, and write ``preprocess.json`` beside it.

    The file is loaded back and compared with the model on a batch of another size to 1e-5.
    PyTorch has deprecated TorchScript (its FutureWarnings are silenced here); prefer ONNX for
    new deployments. Returns the ``.pt`` path.
    """
    encoder = _encoder(model, "export_torchscript")
    _check_output(output)
    path = _graph_file(out_path, ".pt")
    record = _preprocess_recorder(encoder, path)
    graph = _Graph(encoder, output)
    images = _example_batch(encoder, 3, seed=1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=FutureWarning)
        with torch.no_grad():
            traced = torch.jit.trace(graph, _example_batch(encoder, 2, seed=0), check_trace=False)
            traced.save(str(path))
            got = torch.jit.load(str(path))(images)
            expected = graph(images)
    _check_close(f"The TorchScript module {path.name}", got, expected, 1e-5)
    record(output, expected.shape[1])
    return path

