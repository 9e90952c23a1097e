"""Exports that run outside hscl_zoo: a timm folder opened by plain timm in a fresh interpreter that
never imports hscl_zoo, the CIFAR stem as a registered timm architecture (every published image
encoder opened by timm's loader and preprocessing, its features those of ``hscl_zoo.load``), ONNX
graphs run by ONNX Runtime, TorchScript modules; the preprocessing written beside them; and the
Hugging Face-style methods of ContrastiveEncoder."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import timm
import torch
from PIL import Image

import hscl_zoo
from hscl_zoo import ContrastiveEncoder
from hscl_zoo.export import OUTPUTS, PREPROCESS_NAME, export_onnx, export_timm, export_torchscript, timm_usage
from helpers import SHARED_DATA, missing_data

TRAINING = {"dataset": "cifar10", "method": "scl", "hyperparameters": {"temperature": 0.5}, "epochs": 1,
            "global_batch_size": 8, "expected_negatives_per_anchor": 14}
MEAN, STD = [0.49, 0.48, 0.45], [0.25, 0.24, 0.26]


def _trained(model: ContrastiveEncoder) -> ContrastiveEncoder:
    """Move BatchNorm statistics and the heads off their initial values, so a lost buffer shows."""
    torch.manual_seed(0)
    model.train()
    with torch.no_grad():
        model.project(torch.randn(8, *model.pretrained_cfg["input_size"]))
        model.classifier.bias.normal_()
    return model.eval()


@pytest.fixture(scope="module")
def timm_model() -> ContrastiveEncoder:
    """timm's own stem (small_stem=False), the case plain timm can express."""
    torch.manual_seed(0)
    return _trained(hscl_zoo.create_model("resnet10t", num_classes=3, image_size=32, small_stem=False,
                                          class_names=["cat", "dog", "eel"], mean=MEAN, std=STD, crop_pct=0.875))


@pytest.fixture(scope="module")
def cifar_model() -> ContrastiveEncoder:
    """The CIFAR stem (3x3 stride-1 conv, no max-pool), as the zoo's CIFAR models have."""
    torch.manual_seed(1)
    return _trained(hscl_zoo.create_model("resnet18", num_classes=4, image_size=16, small_stem=True,
                                          mean=MEAN, std=STD))


def _batch(model: ContrastiveEncoder, n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, *model.pretrained_cfg["input_size"], generator=torch.Generator().manual_seed(seed))


def _reference(model: ContrastiveEncoder, output: str, images: torch.Tensor) -> np.ndarray:
    fn = {"features": model.encode, "projection": model.project, "logits": model.forward}[output]
    with torch.no_grad():
        return fn(images).numpy()


# ---- timm ------------------------------------------------------------------------------------

PLAIN_TIMM = """
import json, sys
import numpy as np, timm, torch
folder, images = sys.argv[1], torch.from_numpy(np.load(sys.argv[2]))
model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
pooled = timm.create_model(f"local-dir:{folder}", pretrained=True, num_classes=0).eval()
with torch.no_grad():
    np.save(sys.argv[3], pooled(images).numpy())
    np.save(sys.argv[4], model(images).numpy())
    np.save(sys.argv[5], model.forward_head(model.forward_features(images), pre_logits=True).numpy())
data = timm.data.resolve_data_config({}, model=model)
print(json.dumps({"data": {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()},
                  "labels": model.pretrained_cfg.get("label_names"),
                  "hscl_zoo_imported": any(m.startswith("hscl_zoo") for m in sys.modules)}))
"""


def test_timm_folder_opens_in_plain_timm_with_the_same_features(timm_model, tmp_path):
    folder = export_timm(timm_model, tmp_path / "timm")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "resnet10t" and config["num_classes"] == 3
    assert "tag" not in config["pretrained_cfg"], "timm's ImageNet weight tag would misdescribe the export"

    images = _batch(timm_model, 5, seed=2)
    np.save(tmp_path / "images.npy", images.numpy())
    outs = [tmp_path / f"{name}.npy" for name in ("pooled", "logits", "pre_logits")]
    done = subprocess.run([sys.executable, "-c", PLAIN_TIMM, str(folder), str(tmp_path / "images.npy"), *map(str, outs)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["hscl_zoo_imported"] is False

    features = _reference(timm_model, "features", images)
    np.testing.assert_allclose(np.load(outs[0]), features, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.load(outs[2]), features, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.load(outs[1]), _reference(timm_model, "logits", images), atol=1e-5, rtol=0)
    assert report["labels"] == ["cat", "dog", "eel"]
    assert report["data"] == {"input_size": [3, 32, 32], "interpolation": "bicubic", "mean": MEAN, "std": STD,
                              "crop_pct": 0.875, "crop_mode": "center"}


@pytest.mark.parametrize("backbone", ["resnet18", "resnet10t"])  # a 7x7 stem conv, a deep 3x3 stem
def test_cifar_stem_folder_is_a_registered_timm_architecture(backbone, tmp_path):
    torch.manual_seed(2)
    model = _trained(hscl_zoo.create_model(backbone, num_classes=4, image_size=16, small_stem=True, mean=MEAN, std=STD))
    folder = export_timm(model, tmp_path / "timm")
    assert json.loads((folder / "config.json").read_text())["architecture"] == f"{backbone}_cifar"
    reloaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    assert isinstance(reloaded.maxpool, torch.nn.Identity)
    assert [info["reduction"] for info in reloaded.feature_info] == [1, 1, 2, 4, 8]
    images = _batch(model, 3, seed=5)
    with torch.no_grad():
        pooled = reloaded.forward_head(reloaded.forward_features(images), pre_logits=True).numpy()
    np.testing.assert_allclose(pooled, _reference(model, "features", images), atol=1e-5, rtol=0)
    assert timm_usage(folder).splitlines() == [
        f"import timm, hscl_zoo.timm_models  # registers {backbone}_cifar in timm",
        f"model = timm.create_model('local-dir:{folder}', pretrained=True)"]


TIMM_USER = """
import json, sys
from pathlib import Path
import numpy as np, timm, torch
from PIL import Image
folder, pngs, out = sys.argv[1:]
try:
    timm.create_model(f"local-dir:{folder}", pretrained=True)
    before = "opened"
except RuntimeError as error:
    before = str(error)
import hscl_zoo.timm_models
model = timm.create_model(f"local-dir:{folder}", pretrained=True, num_classes=0).eval()
transform = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
batch = torch.stack([transform(Image.open(p).convert("RGB")) for p in sorted(Path(pngs).glob("*.png"))])
with torch.no_grad():
    np.save(out, model(batch).numpy())
print(json.dumps({"before_import": before, "architecture": model.pretrained_cfg["architecture"],
                  "zoo_modules": sorted(m for m in sys.modules if m.startswith("hscl_zoo"))}))
"""
"""What a timm user runs: timm's own loader and timm's own preprocessing on image files."""
IMAGE_RELEASES = [n for n in hscl_zoo.list_models(published_only=True) if hscl_zoo.info(n).modality == "image"]
FAST_RELEASE = "ucl-cifar10.gpu-30ep"


def _test_pngs(dataset: str, folder: Path, n: int = 6) -> Path:
    """The first ``n`` test images of the release's dataset, as the PNG files they are stored as."""
    import pyarrow.parquet as pq

    split = SHARED_DATA / dataset / "test-00000-of-00001.parquet"
    if not split.is_file():
        pytest.skip(missing_data(split))
    folder.mkdir()
    for i, image in enumerate(pq.read_table(split, columns=["img"]).slice(0, n).column("img").to_pylist()):
        (folder / f"{i}.png").write_bytes(image["bytes"])
    return folder


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n == FAST_RELEASE else [pytest.mark.slow])
                                  for n in IMAGE_RELEASES])  # 5-10 s each; one runs by default
def test_every_published_image_encoder_opens_in_timm_with_its_features(name, tmp_path):
    model = hscl_zoo.load(name)
    folder = export_timm(model, tmp_path / "timm")
    pngs = _test_pngs(hscl_zoo.info(name).dataset, tmp_path / "pngs")
    done = subprocess.run([sys.executable, "-c", TIMM_USER, str(folder), str(pngs), str(tmp_path / "f.npy")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    cifar_stem = model.model_args["small_stem"]
    assert report["architecture"] == "resnet18" + ("_cifar" if cifar_stem else "")
    assert report["before_import"] == ("Unknown model (resnet18_cifar)" if cifar_stem else "opened")
    assert "hscl_zoo.models" not in report["zoo_modules"], "opening the folder needs the registration only"

    batch = torch.stack([model.transform(Image.open(p).convert("RGB")) for p in sorted(pngs.glob("*.png"))])
    with torch.no_grad():
        expected = model.encode(batch).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "f.npy"), expected, atol=1e-5, rtol=1e-5)


def test_timm_export_takes_only_encoders(tmp_path):
    with pytest.raises(TypeError, match="ContrastiveEncoder"):
        export_timm(torch.nn.Linear(2, 2), tmp_path / "timm")


# ---- ONNX ------------------------------------------------------------------------------------


@pytest.mark.parametrize("output", [
    "features",
    *(pytest.param(output, marks=pytest.mark.slow) for output in OUTPUTS if output != "features"),
])  # each export costs about 5 s of CPU in torch.onnx; the other two outputs run with -m slow
def test_onnx_round_trip_matches_pytorch(cifar_model, tmp_path, output):
    path = export_onnx(cifar_model, tmp_path / f"{output}.onnx", output)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"]
    assert [o.name for o in session.get_outputs()] == [output]
    for n in (1, 7):  # the batch dimension is free
        images = _batch(cifar_model, n, seed=n)
        got = session.run(None, {"images": images.numpy()})[0]
        np.testing.assert_allclose(got, _reference(cifar_model, output, images), atol=1e-4, rtol=0)
    preprocess = json.loads((tmp_path / PREPROCESS_NAME).read_text())
    width = {"features": 512, "projection": 128, "logits": 4}[output]
    assert preprocess["graphs"] == {path.name: {"output": output, "shape": ["batch", width]}}


def _preprocess_with_pil(image: Image.Image, spec: dict) -> np.ndarray:
    """What a user without torch does with preprocess.json: resize, centre-crop, scale, normalise."""
    image = image.convert(spec["color_mode"])
    (short,) = spec["resize"]["size"]
    scale = short / min(image.size)
    size = (round(image.width * scale), round(image.height * scale))
    image = image.resize(size, getattr(Image.Resampling, spec["resize"]["interpolation"].upper()))
    height, width = spec["center_crop"]
    left, top = round((image.width - width) / 2), round((image.height - height) / 2)
    pixels = np.asarray(image.crop((left, top, left + width, top + height)), dtype=np.float32) / 255.0
    return ((pixels - spec["mean"]) / spec["std"]).transpose(2, 0, 1).astype(np.float32)


def test_preprocess_json_reproduces_the_model_transform(timm_model, tmp_path):
    export_torchscript(timm_model, tmp_path / "features.pt")
    spec = json.loads((tmp_path / PREPROCESS_NAME).read_text())
    assert (spec["input_size"], spec["mean"], spec["std"]) == ([3, 32, 32], MEAN, STD)
    assert spec["resize"]["size"] == [36] and spec["center_crop"] == [32, 32]  # floor(32 / 0.875)
    assert spec["class_names"] == ["cat", "dog", "eel"]
    rng = np.random.default_rng(0)
    for size, mode in (((50, 40), "RGB"), ((36, 64), "L"), ((32, 32), "RGBA")):
        image = Image.fromarray(rng.integers(0, 256, (size[1], size[0], len(mode)), dtype=np.uint8).squeeze(), mode)
        np.testing.assert_allclose(_preprocess_with_pil(image, spec), timm_model.transform(image).numpy(), atol=1e-6)


def test_graphs_of_one_model_share_preprocess_json_and_another_model_is_refused(timm_model, cifar_model, tmp_path):
    export_torchscript(cifar_model, tmp_path / "features.pt")
    export_torchscript(cifar_model, tmp_path / "logits.pt", "logits")
    graphs = json.loads((tmp_path / PREPROCESS_NAME).read_text())["graphs"]
    assert graphs == {"features.pt": {"output": "features", "shape": ["batch", 512]},
                      "logits.pt": {"output": "logits", "shape": ["batch", 4]}}
    with pytest.raises(ValueError, match="another model.*empty folder"):
        export_torchscript(timm_model, tmp_path / "other.pt")
    assert not (tmp_path / "other.pt").exists(), "the conflict is found before anything is exported"


@pytest.mark.parametrize("call, error, message", [
    (lambda m, d: export_onnx(m, d / "x.onnx", "pooled"), ValueError, "output must be one of"),
    (lambda m, d: export_onnx(m, d / "x.pt"), ValueError, r"should end in \.onnx"),
    (lambda m, d: export_torchscript(m, d, "features"), ValueError, r"should end in \.pt"),
])
def test_bad_export_arguments(cifar_model, tmp_path, call, error, message):
    with pytest.raises(error, match=message):
        call(cifar_model, tmp_path)
    assert not list(tmp_path.iterdir())


# ---- TorchScript -----------------------------------------------------------------------------


def test_torchscript_round_trip_matches_pytorch(cifar_model, tmp_path):
    path = export_torchscript(cifar_model, tmp_path / "projection.pt", "projection")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated upstream
        loaded = torch.jit.load(str(path))
    images = _batch(cifar_model, 6, seed=3)
    with torch.no_grad():
        got = loaded(images).numpy()
    np.testing.assert_allclose(got, _reference(cifar_model, "projection", images), atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


# ---- Hugging Face conventions ----------------------------------------------------------------


def test_save_pretrained_and_from_pretrained_methods(timm_model, tmp_path):
    folder = timm_model.save_pretrained(tmp_path / "saved")
    loaded = ContrastiveEncoder.from_pretrained(f"local-dir:{folder}")
    assert isinstance(loaded, ContrastiveEncoder) and loaded.training_summary is None
    images = _batch(timm_model, 3, seed=4)
    np.testing.assert_array_equal(_reference(loaded, "logits", images), _reference(timm_model, "logits", images))

    with_training = hscl_zoo.save_pretrained(timm_model, tmp_path / "trained", training=TRAINING)
    reloaded = ContrastiveEncoder.from_pretrained(with_training)
    reloaded.save_pretrained(tmp_path / "again")  # a loaded model saves back whole
    assert json.loads((tmp_path / "again" / "config.json").read_text())["training"] == TRAINING


def test_push_to_hub_method_checks_the_repo_id_before_any_network(timm_model):
    with pytest.raises(ValueError, match="does not name a Hub repo"):
        timm_model.push_to_hub("not a repo id")
