"""Saving and loading encoders: local folders, a real Hub cache read by huggingface_hub offline,
checksums, strict loading, and every error a user can act on."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import constants, scan_cache_dir
from PIL import Image
from safetensors.torch import load_file, save_file

import hscl_zoo
from hscl_zoo.models import create_model
from hscl_zoo.zoo import saving
from hscl_zoo.zoo.hub import ChecksumMismatchError, ConfigMismatchError, NotCachedError, WeightsNotPublishedError, load, sha256_file
from hscl_zoo.zoo.registry import info
from hscl_zoo.zoo.releases import pin_folder
from hscl_zoo.zoo.saving import save_pretrained
from helpers import make_hub_cache

REPO = "hscl-test/tiny-resnet"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TRAINING = {
    "dataset": "cifar10", "method": "hscl-beta", "hyperparameters": {"beta": 1.0, "temperature": 0.5},
    "epochs": 1, "global_batch_size": 8, "expected_negatives_per_anchor": 14,
}


def _trained(model):
    """Move BatchNorm statistics off their defaults so a save that drops buffers would show."""
    torch.manual_seed(0)
    model.train()
    with torch.no_grad():
        model.project(torch.randn(4, 3, 32, 32))
    return model.eval()


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return _trained(create_model("resnet10t", num_classes=3, image_size=32, class_names=["cat", "dog", "eel"]))


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
    return save_pretrained(model, tmp_path_factory.mktemp("saved") / "tiny", training=TRAINING)


@pytest.fixture(scope="module")
def batch():
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def cache(saved, tmp_path_factory):
    root = tmp_path_factory.mktemp("hub-cache")
    make_hub_cache(root, REPO, saved, COMMIT)
    return root


def test_save_writes_safetensors_and_timm_shaped_config(saved, model):
    assert sorted(p.name for p in saved.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((saved / "config.json").read_text())
    assert config["architecture"] == "resnet10t" and config["num_classes"] == 3
    assert config["label_names"] == ["cat", "dog", "eel"]
    assert config["pretrained_cfg"]["input_size"] == [3, 32, 32]
    assert config["model_args"]["small_stem"] is True
    assert config["training"] == TRAINING
    state = load_file(saved / "model.safetensors")
    assert state.keys() == model.state_dict().keys()
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in state)


@pytest.mark.parametrize("as_source", [lambda p: f"local-dir:{p}", str, lambda p: p])
def test_save_then_load_gives_identical_outputs(saved, model, batch, as_source):
    loaded = load(as_source(saved))
    assert not loaded.training
    assert loaded.class_names == ["cat", "dog", "eel"]
    assert loaded.training_summary == TRAINING
    assert callable(loaded.transform)
    for fn in ("forward", "encode", "project"):
        assert torch.equal(getattr(loaded, fn)(batch), getattr(model, fn)(batch)), fn


def test_vit_round_trip(tmp_path, batch):
    torch.manual_seed(0)
    vit = create_model("vit_tiny_patch16_224", num_classes=4, image_size=32, patch_size=4).eval()
    loaded = load(save_pretrained(vit, tmp_path / "vit"))
    assert loaded.model_args["patch_size"] == 4 and loaded.training_summary is None
    assert torch.equal(loaded(batch), vit(batch))


def test_load_through_the_real_hub_cache_offline(offline, cache, model, batch):
    cached = {(repo.repo_id, rev.commit_hash) for repo in scan_cache_dir(cache).repos for rev in repo.revisions}
    assert cached == {(REPO, COMMIT)}, "the test cache must be a layout huggingface_hub itself recognises"
    for source in (f"hf-hub:{REPO}", f"hf-hub:{REPO}@{COMMIT}", f"hf-hub:{REPO}@main"):
        loaded = load(source, cache_dir=cache)
        assert torch.equal(loaded(batch), model(batch)), source
    assert torch.equal(load(f"hf-hub:{REPO}", cache_dir=cache, revision=COMMIT)(batch), model(batch))


def test_local_files_only_reads_the_cache_without_offline_mode(monkeypatch, cache, model, batch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert torch.equal(load(f"hf-hub:{REPO}", cache_dir=cache, local_files_only=True)(batch), model(batch))
    with pytest.raises(NotCachedError, match="local_files_only=True"):
        load("hf-hub:hscl-test/absent", cache_dir=cache, local_files_only=True)


def test_three_lines_on_a_pil_image_with_env_offline_and_env_cache(cache, tmp_path):
    image = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(image)
    script = (
        "import hscl_zoo; from PIL import Image\n"
        f"model = hscl_zoo.load('hf-hub:{REPO}')\n"
        f"probs = model.predict(Image.open({str(image)!r}))\n"
        "print(list(probs.shape), round(float(probs.sum()), 5), model.class_names, model.training)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1, 3] 1.0 ['cat', 'dog', 'eel'] False"


def test_offline_and_not_cached_names_repo_cache_and_local_dir(offline, tmp_path):
    with pytest.raises(NotCachedError) as err:
        load("hf-hub:hscl-test/never-downloaded@v1", cache_dir=tmp_path)
    message = str(err.value)
    assert "hscl-test/never-downloaded@v1" in message
    assert str(tmp_path.resolve() / "models--hscl-test--never-downloaded") in message or \
        str(tmp_path / "models--hscl-test--never-downloaded") in message
    assert "HF_HUB_OFFLINE=1" in message
    assert "hf download hscl-test/never-downloaded --revision v1 --local-dir" in message
    assert "hscl_zoo.load('local-dir:" in message


def _published(entry_name, files):
    return dataclasses.replace(info(entry_name), hub_repo=REPO, revision=COMMIT, files=files, metrics={"top1": 90.0})


def test_registry_entry_checksum_is_checked(offline, cache, saved, model, batch):
    pins = pin_folder(saved)
    good = _published("hscl-beta-cifar10", pins)
    assert torch.equal(load(good, cache_dir=cache)(batch), model(batch))

    bad = _published("hscl-beta-cifar10", {**pins, "model.safetensors": ("0" * 64, pins["model.safetensors"].size)})
    with pytest.raises(ChecksumMismatchError) as err:
        load(bad, cache_dir=cache)
    message = str(err.value)
    weights = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT / "model.safetensors"
    assert f"Refusing {weights}" in message and "0" * 64 in message and pins["model.safetensors"].sha256 in message
    assert "hscl-beta-cifar10" in message and "delete it" in message


def test_corrupted_cached_blob_is_refused(offline, saved, tmp_path):
    make_hub_cache(tmp_path, REPO, saved, COMMIT)
    blob = tmp_path / f"models--{REPO.replace('/', '--')}" / "blobs" / sha256_file(saved / "model.safetensors")
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ChecksumMismatchError, match="Refusing"):
        load(_published("scl-cifar10", pin_folder(saved)), cache_dir=tmp_path)


def test_unpublished_name_says_how_to_train():
    with pytest.raises(WeightsNotPublishedError) as err:
        hscl_zoo.load("hscl-beta-tinyimagenet")  # no tag of it is published
    message = str(err.value)
    assert "no published weights yet" in message
    assert "hscl-zoo train --config hscl-beta-tinyimagenet --output_dir runs/hscl-beta-tinyimagenet" in message


def test_unknown_name_lists_closest_names():
    with pytest.raises(ValueError, match="Closest names: .*hscl-tau-cifar100"):
        load("hscl-tau-cifar1000")
    with pytest.raises(ValueError, match="write 'hf-hub:hscl-zoo/nope'"):
        load("hscl-zoo/nope")


@pytest.mark.parametrize("source,kwargs,error,message", [
    ("./no/such/dir", {}, FileNotFoundError, "neither a zoo name nor an existing directory"),
    ("local-dir:/no/such/dir", {}, FileNotFoundError, "no such directory"),
    ("hf-hub:not a repo", {}, ValueError, "does not name a Hub repo"),
    ("hf-hub:owner/name@a@b", {}, ValueError, "more than one '@'"),
    ("hf-hub:owner/name@v1", {"revision": "v2"}, ValueError, "pins revision 'v1'"),
    ("scl-cifar10", {"revision": "v2"}, ValueError, "hf-hub:hscl-zoo/scl-cifar10@v2"),
    ("", {}, ValueError, "zoo name, 'hf-hub:owner/name' or a directory"),
])
def test_bad_sources(source, kwargs, error, message):
    with pytest.raises(error, match=message):
        load(source, **kwargs)


def test_revision_on_a_local_dir_is_an_error(saved):
    with pytest.raises(ValueError, match="Hub repos only"):
        load(saved, revision="main")


def test_folder_without_model_files(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(FileNotFoundError, match="lacks config.json and model.safetensors.*Pickled"):
        load(tmp_path)


def test_config_and_weights_that_disagree_name_the_keys(saved, tmp_path):
    folder = tmp_path / "mixed"
    other = create_model("resnet10t", num_classes=5, image_size=32, proj_dim=64)
    save_pretrained(other, folder)
    (folder / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    with pytest.raises(ConfigMismatchError) as err:
        load(folder)
    message = str(err.value)
    assert "classifier.weight: file (3, 512) vs model (5, 512)" in message
    assert "projector.3.weight: file (128, 512) vs model (64, 512)" in message
    assert "save_pretrained" in message


def test_missing_and_unexpected_keys_are_errors_not_partial_loads(saved, tmp_path):
    folder = tmp_path / "edited"
    folder.mkdir()
    (folder / "config.json").write_bytes((saved / "config.json").read_bytes())
    state = load_file(saved / "model.safetensors")
    del state["classifier.bias"]
    state["extra.weight"] = torch.zeros(1)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ConfigMismatchError, match="missing keys: classifier.bias.*unexpected keys: extra.weight"):
        load(folder)


def test_wrapped_state_dict_gets_a_hint(saved, tmp_path):
    folder = tmp_path / "ddp"
    folder.mkdir()
    (folder / "config.json").write_bytes((saved / "config.json").read_bytes())
    save_file({f"module.{k}": v for k, v in load_file(saved / "model.safetensors").items()}, folder / "model.safetensors")
    with pytest.raises(ConfigMismatchError, match="wrapped model"):
        load(folder)


@pytest.mark.parametrize("content,message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"architecture": "resnet18", "num_classes": 3, "pretrained_cfg": {}}), "plain timm checkpoint"),
])
def test_broken_configs(saved, tmp_path, content, message):
    (tmp_path / "config.json").write_text(content)
    (tmp_path / "model.safetensors").write_bytes((saved / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match=message) as err:
        load(tmp_path)
    assert str(tmp_path / "config.json") in str(err.value)


def test_save_unwraps_data_parallel_and_compile(model, tmp_path, batch):
    for wrapped in (torch.nn.DataParallel(model), torch.compile(model)):
        folder = save_pretrained(wrapped, tmp_path / type(wrapped).__name__)
        assert load_file(folder / "model.safetensors").keys() == model.state_dict().keys()
        assert torch.equal(load(folder)(batch), model(batch))
    with pytest.raises(TypeError, match="ContrastiveEncoder"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path / "linear")


def test_failed_save_leaves_a_good_folder_untouched(model, saved, tmp_path):
    folder = tmp_path / "good"
    save_pretrained(model, folder, training=TRAINING)
    (folder / "README.md").write_text("card")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    other = create_model("resnet10t", num_classes=5, image_size=32)
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        save_pretrained(other, folder, training={**TRAINING, "hyperparameters": {"beta": object()}})
    with pytest.raises(ValueError, match=r"training summary lacks \['epochs'"):
        save_pretrained(other, folder, training={k: v for k, v in TRAINING.items() if k != "epochs"})
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    save_pretrained(other, folder)
    assert (folder / "README.md").read_text() == "card", "save_pretrained leaves other files alone"
    assert json.loads((folder / "config.json").read_text())["num_classes"] == 5
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no staging folders left behind"


def test_push_to_hub_rejects_bad_input_before_any_network(model):
    with pytest.raises(ValueError, match="does not name a Hub repo"):
        saving.push_to_hub(model, "no slash here")
    with pytest.raises(ValueError, match="would overwrite"):
        saving.push_to_hub(model, "owner/name", extra_files={"config.json": "{}"})


def test_device_argument(saved):
    loaded = load(saved, device="cpu")
    assert {p.device.type for p in loaded.parameters()} == {"cpu"}
