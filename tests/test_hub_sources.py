"""Where ``hscl_zoo.load`` finds a model's files (hscl_zoo/zoo/sources.py), on real folders and a real
Hub cache layout: a sharded repo, a shard or config.json missing offline, registry pins of a Hub
repo, a training run's output_dir, folders of model folders, and each refusal's whole message."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from huggingface_hub.errors import LocalEntryNotFoundError
from safetensors.torch import load_file, save_file

import hscl_zoo
from hscl_zoo.models import create_model
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.releases import ChecksumMismatchError, NotCachedError, pin_folder
from hscl_zoo.zoo.shards import ShardLayoutError
from hscl_zoo.zoo.sources import WeightsNotPublishedError, parse_source
from helpers import make_hub_cache, smoke_release

REPO = "hscl-test/tiny-gin"
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
RESAVE = "re-save it with hscl_zoo.save_pretrained"
LACKS = "it is not a folder written by hscl_zoo.save_pretrained(model, directory)."


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("resnet10t", num_classes=3, image_size=32).eval()


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
    return hscl_zoo.save_pretrained(model, tmp_path_factory.mktemp("saved") / "tiny")


@pytest.fixture(scope="module")
def weights(saved):
    return load_file(saved / "model.safetensors")


@pytest.fixture(scope="module")
def sharded(model, saved, tmp_path_factory):
    """The model saved in three shards (index + shards + config.json)."""
    size = (saved / "model.safetensors").stat().st_size
    folder = hscl_zoo.save_pretrained(model, tmp_path_factory.mktemp("s") / "gin", max_shard_size=size // 3 + 4096)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", *SHARDS, "model.safetensors.index.json"]
    return folder


@pytest.fixture(scope="module")
def doubled(sharded, tmp_path_factory):
    """``sharded`` with the first key of shard 1 also written into shard 2 (the index unchanged)."""
    folder = tmp_path_factory.mktemp("d") / "gin"
    shutil.copytree(sharded, folder)
    key = sorted(load_file(folder / SHARDS[0]))[0]
    second = load_file(folder / SHARDS[1])
    save_file({**second, key: load_file(folder / SHARDS[0])[key]}, folder / SHARDS[1], metadata={"format": "pt"})
    return folder, key


def _model_copy(saved: Path, folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(saved / name, folder / name)
    return folder


def _same_weights(model, expected) -> None:
    state = model.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in expected)


def _snapshot(cache: Path) -> Path:
    return cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT


def _not_cached(filename: str, revision: str, cache: Path) -> str:
    return (f"Cannot load {filename} of {REPO}@{revision}: offline mode is on (HF_HUB_OFFLINE=1 or "
            f"local_files_only=True) and it is not in the Hub cache at {cache / 'models--hscl-test--tiny-gin'}. "
            f"Either go online and retry, or on a machine with network run\n"
            f"    hf download {REPO} --revision {revision} --local-dir ./tiny-gin\n"
            f"copy that folder here and load it with hscl_zoo.load('local-dir:./tiny-gin').")


def _entry(name: str, files, revision: str | None = COMMIT) -> registry.ZooEntry:
    tag = name.partition(".")[2]
    return dataclasses.replace(registry.info("hscl-beta-cifar10"), name=name, tag=tag, budget="a test release",
                               hub_repo=REPO, revision=revision, files=files)


def test_a_sharded_repo_in_the_hub_cache_loads_offline(offline, sharded, weights, tmp_path):
    make_hub_cache(tmp_path, REPO, sharded, COMMIT)
    _same_weights(hscl_zoo.load(f"hf-hub:{REPO}", cache_dir=tmp_path), weights)


def test_config_missing_from_the_cache_offline_names_it_and_the_download(offline, sharded, tmp_path):
    make_hub_cache(tmp_path, REPO, sharded, COMMIT)
    (_snapshot(tmp_path) / "config.json").unlink()
    with pytest.raises(NotCachedError) as err:
        hscl_zoo.load(f"hf-hub:{REPO}@{COMMIT}", cache_dir=tmp_path)
    assert str(err.value) == _not_cached("config.json", COMMIT, tmp_path)
    assert isinstance(err.value.__cause__, LocalEntryNotFoundError)


def test_a_shard_missing_from_the_cache_offline_names_it_and_the_download(offline, sharded, tmp_path):
    """Not "the index names a shard the repo lacks": the shard exists, this cache does not hold it."""
    make_hub_cache(tmp_path, REPO, sharded, COMMIT)
    shard = sorted(p.name for p in _snapshot(tmp_path).glob("model-*.safetensors"))[1]
    (_snapshot(tmp_path) / shard).unlink()
    with pytest.raises(NotCachedError) as err:
        hscl_zoo.load(f"hf-hub:{REPO}@{COMMIT}", cache_dir=tmp_path)
    assert str(err.value) == _not_cached(shard, COMMIT, tmp_path)
    assert isinstance(err.value.__cause__, LocalEntryNotFoundError)


def test_nothing_cached_offline_names_the_single_weights_file(offline, tmp_path):
    with pytest.raises(NotCachedError) as err:
        hscl_zoo.load(f"hf-hub:{REPO}@v1", cache_dir=tmp_path)
    assert str(err.value) == _not_cached("model.safetensors", "v1", tmp_path)
    assert isinstance(err.value.__cause__, LocalEntryNotFoundError)


def test_a_key_in_two_shards_is_refused_naming_the_repo_folder_or_entry(offline, doubled, tmp_path):
    folder, key = doubled
    make_hub_cache(tmp_path, REPO, folder, COMMIT)
    name = "hscl-beta-cifar10.test-doubled"
    for source, where in ((f"hf-hub:{REPO}", f"{REPO}@main"), (f"local-dir:{folder}", str(folder)),
                          (_entry(name, pin_folder(folder)), name)):
        with pytest.raises(ShardLayoutError) as err:
            hscl_zoo.load(source, cache_dir=tmp_path)
        assert str(err.value) == (f"{where}: key {key!r} is in two shards, {SHARDS[0]} and {SHARDS[1]}; each key "
                                  f"belongs to exactly one ({RESAVE})."), source


def test_a_release_that_pins_no_config_is_refused(offline, sharded, tmp_path):
    make_hub_cache(tmp_path, REPO, sharded, COMMIT)
    pins = {k: v for k, v in pin_folder(sharded).items() if k != "config.json"}
    with pytest.raises(ValueError) as err:
        hscl_zoo.load(_entry("hscl-beta-cifar10.test-noconfig", pins), cache_dir=tmp_path)
    assert str(err.value) == ("The registry entry hscl-beta-cifar10.test-noconfig pins no config.json; a release "
                              "pins every file of its folder (hscl-zoo release prints them).")


def test_a_hub_repo_the_registry_pins_is_checked_file_by_file(offline, sharded, weights, tmp_path):
    make_hub_cache(tmp_path, REPO, sharded, COMMIT)
    name = "hscl-beta-cifar10.test-pinned"
    registry.register_model(_entry(name, pin_folder(sharded)))
    try:
        _same_weights(hscl_zoo.load(f"hf-hub:{REPO}@{COMMIT}", cache_dir=tmp_path), weights)
        shard = _snapshot(tmp_path) / SHARDS[2]
        blob = shard.resolve()
        blob.write_bytes(blob.read_bytes()[:-1] + b"\x01")
        actual = hashlib.sha256(blob.read_bytes()).hexdigest()
        with pytest.raises(ChecksumMismatchError) as err:
            hscl_zoo.load(f"hf-hub:{REPO}@{COMMIT}", cache_dir=tmp_path)
    finally:
        registry._ENTRIES.remove(name)
    assert str(err.value) == (
        f"Refusing {shard}: its sha256 is {actual}, but the registry entry {name} ({REPO}@{COMMIT}) pins "
        f"{pin_folder(sharded)[SHARDS[2]].sha256}. The cached file is corrupt or was replaced; delete it (and the "
        "blob it links to) and load again with network access.")


def test_local_files_only_keeps_a_zoo_release_off_the_network(monkeypatch, saved, tmp_path):
    (tmp_path / "checkout" / "releases").mkdir(parents=True)
    monkeypatch.setenv("HSCL_ZOO_ROOT", str(tmp_path / "checkout"))
    monkeypatch.delenv("HSCL_ZOO_RELEASES", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    name = "hscl-beta-cifar10.test-absent"
    entry = _entry(name, pin_folder(saved))
    with pytest.raises(NotCachedError) as err:
        hscl_zoo.load(entry, cache_dir=tmp_path, local_files_only=True)
    assert str(err.value) == (
        f"Cannot load {name}: no source holds its files (no {tmp_path / 'checkout' / 'releases' / name}; "
        f"the Hub cache lacks {REPO}@{COMMIT}/config.json; offline); run it once with "
        f"network access to fetch {REPO}@{COMMIT}.")


def test_a_training_run_loads_from_its_hub_folder_and_an_unfinished_one_says_so(saved, weights, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"epochs": 1}))
    (run / "metrics.jsonl").write_text('{"epoch": 1}\n')
    with pytest.raises(FileNotFoundError) as err:
        hscl_zoo.load(f"local-dir:{run}")
    assert str(err.value) == (f"{run} lacks model.safetensors: {LACKS} It looks like a training run that has not "
                              f"finished: the run writes its model to {run / 'hub'} at the end (--resume continues "
                              "it).")
    _model_copy(saved, run / "hub")
    _same_weights(hscl_zoo.load(f"local-dir:{run}"), weights)


def test_a_folder_of_model_folders_lists_the_first_five(saved, tmp_path):
    for name in ("m1", "m3", "m4", "m5", "m6", "m7"):
        _model_copy(saved, tmp_path / name)
    (tmp_path / "m0-empty").mkdir()
    (tmp_path / "m2-config-only").mkdir()
    shutil.copyfile(saved / "config.json", tmp_path / "m2-config-only" / "config.json")
    (tmp_path / "notes.txt").write_text("not a folder")
    with pytest.raises(FileNotFoundError) as err:
        hscl_zoo.load(f"local-dir:{tmp_path}")
    listed = ", ".join(str(tmp_path / name) for name in ("m1", "m3", "m4", "m5", "m6"))
    assert str(err.value) == (f"{tmp_path} lacks config.json and model.safetensors: {LACKS} Model folders inside "
                              f"it: {listed}; load one of those.")


def test_unpublished_name_lists_every_smoke_release_with_its_score_if_any():
    base = registry.info("hscl-beta-cifar10")
    unscored = {**registry._RELEASES["ucl-cifar10.gpu-30ep"], "method": "hscl-beta", "dataset": "cifar10",
                "metrics": {}}
    with smoke_release("hscl-beta-cifar10.cpu-a", 12.5), smoke_release("hscl-beta-cifar10.cpu-b", 3.25):
        registry.register_model(registry.release_entry("hscl-beta-cifar10.cpu-c", unscored))
        try:
            with pytest.raises(WeightsNotPublishedError) as err:
                hscl_zoo.load("hscl-beta-cifar10")
        finally:
            registry._ENTRIES.remove("hscl-beta-cifar10.cpu-c")
    assert str(err.value) == (
        "hscl-beta-cifar10 has no full-budget release yet, only CPU smoke tests: hscl-beta-cifar10.cpu-a (linear "
        "top-1 12.50 %), hscl-beta-cifar10.cpu-b (linear top-1 3.25 %), hscl-beta-cifar10.cpu-c; load one by its "
        "tagged name, "
        f"hscl_zoo.load('hscl-beta-cifar10.cpu-a'), or train it with '{base.train_command} --output_dir "
        "runs/hscl-beta-cifar10'.")


def test_an_unpublished_bare_entry_resolves_to_its_published_release():
    assert parse_source(registry.info("ucl-cifar10")).entry.name == "ucl-cifar10.gpu-30ep"
