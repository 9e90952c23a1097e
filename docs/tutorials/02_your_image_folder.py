# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Your own image folder: train, evaluate, embed, export
#
# From a folder of images with one subfolder per class to an ONNX file that runs without
# PyTorch. The tutorial makes its own folder (scikit-learn's digits, written as PNG files), so
# it runs anywhere in under a minute on one CPU core; point the same commands at your photos.
# Every step is an `hscl-zoo` command; here they run in-process through `hscl_zoo.cli.main`, which
# takes the same arguments as the shell command and returns its exit status.
#
# Everything is written under a fresh temporary folder, printed below.

# %%
import json
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import pyarrow.parquet as pq
import torch
from PIL import Image
from sklearn.datasets import load_digits

import hscl_zoo
from hscl_zoo.cli import main as hscl_zoo_cli

work = Path(tempfile.mkdtemp(prefix="hscl-zoo-tutorial-"))
print("working in", work)


def run(*args: str) -> None:
    """Run one hscl-zoo command, as `hscl-zoo ARGS` in a shell would, and stop if it fails."""
    print("$ hscl-zoo", " ".join(args))
    status = hscl_zoo_cli(list(args))
    assert status == 0, f"hscl-zoo {args[0]} exited with status {status}"


# %% [markdown]
# ## An image folder
#
# One subfolder per class, named after the class; the folder names, sorted, are the class names.
# Any common format, size and colour mode works (they are decoded to RGB). Without `train/` and
# `test/` subfolders a seeded, stratified fifth of each class is held out as the test split.
# Here: 40 digits per class, upscaled from 8x8 to 24x24 grey PNGs.

# %%
digits = load_digits()
names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
photos = work / "digits"
for label, name in enumerate(names):
    (photos / name).mkdir(parents=True)
    rows = np.flatnonzero(digits.target == label)[:40]
    for row in rows:
        pixels = (digits.images[row] * (255 / 16)).astype(np.uint8)
        image = Image.fromarray(pixels, mode="L").resize((24, 24), Image.BILINEAR)
        image.save(photos / name / f"{row}.png")
print(sum(1 for _ in photos.rglob("*.png")), "images in", len(names), "class folders")

# %% [markdown]
# ## Train
#
# `hscl-zoo train` is the pretraining recipe (`accelerate launch recipes/pretrain.py`); every
# key of [Pretraining keys](../../config/) is a `--key value`. `--dataset imagefolder:PATH` reads
# the folder; one pass over it checks every image decodes and measures the per-channel mean and
# std the model will normalise with. A real run takes the defaults (ResNet-18, 8 epochs, a
# 100-epoch linear probe); this one is cut to seconds.

# %%
run_dir = work / "runs" / "digits"
run("train", "--dataset", f"imagefolder:{photos}", "--method", "hscl-beta",
    "--backbone", "resnet10t", "--epochs", "2", "--batch_size", "64", "--probe_epochs", "20",
    "--knn_k", "5", "--output_dir", str(run_dir))
hub = run_dir / "hub"
print(sorted(p.name for p in hub.iterdir()))

# %% [markdown]
# `runs/digits/hub/` is the model folder: `model.safetensors`, `config.json` (architecture,
# preprocessing, class names, how it was trained), the model card `README.md` and `metrics.json`
# (the final evaluation and the per-epoch history). [Tutorial 3](../03_model_folder_and_figures/)
# looks inside one.
#
# ## Evaluate
#
# `hscl-zoo eval` repeats the run's own evaluation on the frozen encoder by default (the same
# split, probe epochs and k): linear probe, kNN, retrieval and the representation audit, written
# as JSON. `--dataset` evaluates on other data, several comma-separated datasets give one
# transfer row each ([Evaluation](../../evaluation/)).

# %%
run("eval", str(hub), "--device", "cpu", "--out", str(work / "eval.json"))
evaluation = json.loads((work / "eval.json").read_text())
print({key: evaluation[key] for key in ("top1", "knn_top1")})

# %% [markdown]
# ## Embed
#
# `hscl-zoo embed` encodes every image under a folder (recursively) with the model's own
# preprocessing: one row per file, named by its path relative to the folder, with the frozen
# backbone features (`--projection` for the 128-d normalised projection instead). A `.parquet`
# file keeps both in one table; `.npy` writes the array with a `.ids.csv` beside it.

# %%
run("embed", str(hub), str(photos), "--device", "cpu", "--out", str(work / "digits.parquet"))
table = pq.read_table(work / "digits.parquet")
embeddings = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
files = table.column("file").to_pylist()
print(table.num_rows, "rows of", embeddings.shape[1], "features; first:", files[0])

# %% [markdown]
# ## Export to ONNX and run it with ONNX Runtime
#
# `hscl-zoo export --format onnx` writes one graph from a preprocessed float32 batch to the
# features (`--output projection` or `logits` for the other heads) and `preprocess.json`, which
# says how an image becomes that batch. The export is run by ONNX Runtime and compared with
# PyTorch before the command returns ([Export and interop](../../export/)).

# %%
export_dir = work / "export"
run("export", str(hub), "--format", "onnx", "--out", str(export_dir))
preprocess = json.loads((export_dir / "preprocess.json").read_text())
print({key: preprocess[key] for key in ("input_size", "resize", "center_crop", "mean", "std")})

# %% [markdown]
# A deployment has only the `.onnx` file, `preprocess.json`, Pillow and NumPy. The function below
# follows `preprocess.json` step by step: RGB, resize the shorter side, centre crop, scale to
# [0, 1], normalise, channels first.


# %%
def preprocess_image(path: Path, recipe: dict) -> np.ndarray:
    """One image as the exported graph's (3, H, W) float32 input, following preprocess.json."""
    image = Image.open(path).convert(recipe["color_mode"])
    (short,) = recipe["resize"]["size"]
    scale = short / min(image.size)
    resample = Image.Resampling[recipe["resize"]["interpolation"].upper()]
    image = image.resize((round(image.width * scale), round(image.height * scale)), resample)
    height, width = recipe["center_crop"]
    left, top = (image.width - width) // 2, (image.height - height) // 2
    image = image.crop((left, top, left + width, top + height))
    pixels = np.asarray(image, dtype=np.float32) / 255
    pixels = (pixels - np.array(recipe["mean"], np.float32)) / np.array(recipe["std"], np.float32)
    return pixels.transpose(2, 0, 1)


session = onnxruntime.InferenceSession(str(export_dir / "features.onnx"),
                                       providers=["CPUExecutionProvider"])
batch = np.stack([preprocess_image(photos / name, preprocess) for name in files[:8]])
(onnx_features,) = session.run(None, {preprocess["input_name"]: batch})
print("ONNX Runtime:", onnx_features.shape)

# %% [markdown]
# The same eight images through PyTorch: the model loaded from its folder, its own
# `model.transform` and `model.encode`. The features agree with ONNX Runtime's, and with the rows
# `hscl-zoo embed` wrote.

# %%
model = hscl_zoo.load(str(hub))
with torch.no_grad():
    images = torch.stack([model.transform(Image.open(photos / name)) for name in files[:8]])
    torch_features = model.encode(images)
largest = np.abs(onnx_features - torch_features.numpy()).max()
print(f"largest difference, ONNX Runtime vs PyTorch: {largest:.2e}")
np.testing.assert_allclose(onnx_features, torch_features.numpy(), rtol=1e-4, atol=1e-4)
np.testing.assert_allclose(embeddings[:8], torch_features.numpy(), rtol=1e-4, atol=1e-4)
