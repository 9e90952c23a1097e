"""The zoo registry: names, tags, wildcards, pinning rules and Table 1 of the paper, and a real
published release (files in a Hub cache, pinned commit and per-file sha256) loaded by its zoo name."""

import dataclasses
import re

import pytest
import torch
from huggingface_hub import constants
from huggingface_hub.utils import validate_repo_id
from safetensors.torch import load_file

import hscl_zoo
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.hub import ChecksumMismatchError
from hscl_zoo.zoo.registry import ZooEntry, info, list_models
from hscl_zoo.zoo.releases import pin_folder
from hscl_zoo.zoo.saving import save_pretrained
from helpers import make_hub_cache, smoke_release

PUBLISHED_NAME = "scl-cifar10.test-2ep"
PINNED = "89abcdef0123456789abcdef0123456789abcdef"

FILES = {"model.safetensors": ("b" * 64, 1234)}
METHODS = ["ucl", "hucl", "scl", "hscl-beta", "hscl-tau"]
DATASETS = ["stl10", "cifar10", "cifar100", "tinyimagenet"]
TABLE_2 = {"ucl": (86.8, 50.4, 55.3, 72.2, 49.6), "hucl": (87.2, 50.4, 57.3, 72.8, 49.6),
           "scl": (86.9, 50.4, 55.8, 72.4, 49.9), "hscl-beta": (87.2, 50.7, 57.7, 73.0, 50.1)}
GRAPH_DATASETS = ["mutag", "enzymes", "ptc-mr", "imdb-binary", "imdb-multi"]
GRAPH_GRID = sorted(f"{m}-{d}" for m in TABLE_2 for d in GRAPH_DATASETS)
IMAGE_GRID = sorted(f"{m}-{d}" for m in METHODS for d in DATASETS)


def test_one_name_per_method_and_dataset():
    untagged = [name for name in list_models() if "." not in name]
    assert [name for name in untagged if info(name).modality == "image"] == IMAGE_GRID
    graphs = [name for name in untagged if info(name).modality == "graph"]
    assert set(GRAPH_GRID) <= set(graphs)
    assert all(info(name).published and info(name).paper_top1 is None for name in set(graphs) - set(GRAPH_GRID))
    assert hscl_zoo.list_models is list_models and hscl_zoo.info is info


@pytest.mark.parametrize("pattern,expected", [
    ("hscl-*-cifar100", ["hscl-beta-cifar100", "hscl-tau-cifar100"]),
    ("*-cifar10", ["hscl-beta-cifar10", "hscl-tau-cifar10", "hucl-cifar10", "scl-cifar10", "ucl-cifar10"]),
    ("?cl-stl10", ["scl-stl10", "ucl-stl10"]),
    (["ucl-*", "hucl-tiny*"], ["hucl-tinyimagenet", "ucl-cifar10", "ucl-cifar100", "ucl-enzymes", "ucl-imdb-binary",
                               "ucl-imdb-multi", "ucl-mutag", "ucl-ptc-mr", "ucl-stl10", "ucl-tinyimagenet"]),
    ("?cl-imdb-*", ["scl-imdb-binary", "scl-imdb-multi", "ucl-imdb-binary", "ucl-imdb-multi"]),
    ("resnet*", []),
])
def test_wildcards(pattern, expected):
    assert [name for name in list_models(pattern) if "." not in name] == expected


@pytest.fixture
def published(monkeypatch, tmp_path):
    """One tagged release published for real: a model saved by save_pretrained, laid out in a Hub
    cache under the release's repo at a pinned commit, and its line (backbone, budget, commit,
    per-file sha256 and size, metrics) in the registry's _RELEASES table, from which its entry is
    built and registered (and removed afterwards). Offline mode is on."""
    torch.manual_seed(0)
    model = hscl_zoo.create_model("resnet10t", num_classes=10, image_size=32).eval()
    folder = save_pretrained(model, tmp_path / "weights")
    cache = tmp_path / "hub-cache"
    make_hub_cache(cache, f"{registry.HUB_ORG}/{PUBLISHED_NAME}", folder, PINNED)
    release = {"method": "scl", "dataset": "cifar10", "backbone": "resnet10t", "budget": "two test epochs",
               "revision": PINNED,
               "files": {name: pin._asdict() for name, pin in pin_folder(folder).items()}, "metrics": {"top1": 12.5}}
    monkeypatch.setitem(registry._RELEASES, PUBLISHED_NAME, release)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    registry.register_model(registry.release_entry(PUBLISHED_NAME, release))
    try:
        yield model, cache
    finally:
        registry._ENTRIES.remove(PUBLISHED_NAME)


def test_published_only_lists_exactly_the_published_entries(published):
    committed = set(registry._RELEASES) - {PUBLISHED_NAME}
    assert list_models(published_only=True) == sorted({PUBLISHED_NAME} | committed)
    assert list_models("scl-cifar10.*", published_only=True) == [PUBLISHED_NAME]  # scl-cifar100.gpu-30ep is not one
    unreleased = next(name for name in IMAGE_GRID if not any(r.split(".")[0] == name for r in committed))
    assert list_models([unreleased, f"{unreleased}.*"], published_only=True) == []
    assert len(list_models()) == len(IMAGE_GRID) + len(GRAPH_GRID) + len(committed - set(GRAPH_GRID)) + 1
    entry = info(PUBLISHED_NAME)
    assert entry.published and (entry.revision, dict(entry.metrics)) == (PINNED, {"top1": 12.5})
    assert f"published: the Hub at revision {PINNED}" in str(entry) and "top1=12.5" in str(entry)
    assert "budget:      two test epochs" in str(entry)
    assert not info("scl-cifar100").published


def test_bare_name_loads_its_best_published_tag_and_info_lists_tags(published, monkeypatch):
    """The bare name resolves to the published tag with the best top-1; info lists every tag."""
    bare = info("scl-cifar10")
    assert not bare.published and registry.resolve("scl-cifar10").name == PUBLISHED_NAME
    assert "tags:        scl-cifar10.test-2ep (default)" in str(bare)
    better = dict(registry._RELEASES[PUBLISHED_NAME], metrics={"top1": 40.0}, revision=None)
    registry.register_model(registry.release_entry("scl-cifar10.test-9ep", better))
    try:
        assert registry.resolve("scl-cifar10").name == "scl-cifar10.test-9ep"
        assert "tags:        scl-cifar10.test-2ep, scl-cifar10.test-9ep (default)" in str(info("scl-cifar10"))
        assert registry.resolve(PUBLISHED_NAME).name == PUBLISHED_NAME
    finally:
        registry._ENTRIES.remove("scl-cifar10.test-9ep")
    untagged = next(name for name in IMAGE_GRID if not any(r.split(".")[0] == name for r in registry._RELEASES))
    assert registry.resolve(untagged) is info(untagged)  # a bare name with no published tag is itself


def test_bad_pattern_is_an_error():
    with pytest.raises(ValueError, match="wildcard string"):
        list_models(3)


@pytest.mark.parametrize("name", IMAGE_GRID)
def test_entry_is_consistent(name):
    entry = info(name)
    assert entry.name == f"{entry.method}-{entry.dataset}" == name
    assert entry.config == name
    assert entry.hub_repo == f"hscl-zoo/{name}"
    validate_repo_id(entry.hub_repo)
    assert entry.backbone == "resnet50"
    assert entry.paper_top1 is not None and 50 < entry.paper_top1 < 95
    assert (entry.paper_top1_std is not None) == (entry.dataset == "stl10")
    assert not entry.published, "the paper's own recipe is published as a tag"
    assert entry.revision is None and dict(entry.files) == {} and dict(entry.metrics) == {}
    if not registry.tags_of(name):
        assert "not published yet" in str(entry) and entry.train_command in str(entry)


@pytest.mark.parametrize("name", GRAPH_GRID)
def test_a_graph_entry_is_table_2s(name):
    entry = info(name)
    assert entry.name == f"{entry.method}-{entry.dataset}" == name and entry.hub_repo == f"hscl-zoo/{name}"
    assert (entry.backbone, entry.config, entry.modality) == ("gin-3x32", None, "graph")
    assert entry.paper_top1 == TABLE_2[entry.method][GRAPH_DATASETS.index(entry.dataset)]
    assert entry.tag is None, "a graph encoder at Table 2's budget publishes the paper's name itself"
    tu = {"mutag": "MUTAG", "enzymes": "ENZYMES", "ptc-mr": "PTC_MR", "imdb-binary": "IMDB-BINARY",
          "imdb-multi": "IMDB-MULTI"}[entry.dataset]
    assert entry.train_command.startswith(f"hscl-zoo train --dataset tu:{tu} --method {entry.method}")
    if entry.published:
        assert set(entry.metrics) == {"svm_accuracy", "linear_cv_accuracy"}
        assert ("beta" in entry.hyperparameters) == (entry.method in ("hucl", "hscl-beta"))


def test_published_names_are_exactly_the_committed_releases():
    assert list_models(published_only=True) == sorted(registry._RELEASES)


@pytest.mark.parametrize("name,top1,std", [
    ("ucl-stl10", 64.36, 0.92), ("hucl-cifar100", 67.77, None), ("scl-tinyimagenet", 62.06, None),
    ("hscl-beta-cifar100", 75.11, None), ("hscl-tau-stl10", 71.02, 2.03), ("hscl-beta-cifar10", 93.98, None),
    ("hscl-beta-ptc-mr", 57.7, None), ("ucl-imdb-binary", 72.2, None), ("hucl-enzymes", 50.4, None),
])
def test_paper_numbers_are_table_1(name, top1, std):
    entry = info(name)
    assert (entry.paper_top1, entry.paper_top1_std) == (top1, std)


def test_unknown_name_lists_closest():
    with pytest.raises(ValueError, match="Unknown zoo model 'hscl-beta-cifar'") as err:
        info("hscl-beta-cifar")
    assert "hscl-beta-cifar10" in str(err.value) and "hscl-beta-cifar100" in str(err.value)
    assert "list_models" in str(err.value)


def test_summary_shows_publication_status_and_a_hub_repo_only_once_it_is_there():
    text = str(info("hscl-beta-tinyimagenet"))  # no tag of it is published yet
    assert "65.39" in text and "hub repo" not in text and "hscl-zoo/" not in text
    assert "train it:    hscl-zoo train --config hscl-beta-tinyimagenet\n" in text + "\n"
    released = dataclasses.replace(info("hscl-beta-tinyimagenet"), files=FILES, metrics={"top1": 74.9})
    assert "published: releases/ (not on the Hub yet)" in str(released) and "hub repo" not in str(released)
    published = dataclasses.replace(info("hscl-beta-tinyimagenet"), revision="a" * 40, files=FILES, metrics={"top1": 74.9})
    text = str(published)
    assert "published: the Hub at revision " + "a" * 40 in text and "top1=74.9" in text and "train it" not in text
    assert "  hub repo:    hscl-zoo/hscl-beta-tinyimagenet\n" in text
    assert f"file:        model.safetensors sha256 {'b' * 64} (1,234 bytes)" in text


@pytest.mark.parametrize("changes,message", [
    ({"revision": "main", "files": FILES}, "40-hex commit"),
    ({"files": {"model.safetensors": ("xyz", 1)}}, "64 lowercase"),
    ({"files": {"../model.safetensors": ("b" * 64, 1)}}, "plain file names"),
    ({"files": {"config.json": ("b" * 64, 1)}}, "names no .safetensors"),
    ({"revision": "a" * 40}, "a revision pins files"),
    ({"metrics": {"top1": 75.0}}, "metrics without published weights"),
    ({"files": FILES, "metrics": {"top1": "75"}}, "must be a number"),
    ({"name": "scl-cifar10.cpu"}, "give tag='cpu'"),
    ({"name": "scl-cifar10.cpu", "tag": "cpu"}, "states its budget"),
    ({"name": "scl-cifar10.CPU", "tag": "CPU", "budget": "x"}, "lowercase letters"),
    ({"method": "simclr"}, "Unknown method"),
])
def test_entries_claim_nothing_they_cannot_back(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(info("scl-cifar10"), **changes)


def test_entries_are_immutable():
    entry = dataclasses.replace(info("scl-cifar10"), revision="a" * 40, files=FILES, metrics={"top1": 93.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.revision = "c" * 40
    with pytest.raises(TypeError):
        entry.metrics["top1"] = 99.0
    assert isinstance(entry, ZooEntry) and entry.num_classes == 10


def test_find_by_repo_needs_the_pinned_revision(published):
    entry = info(PUBLISHED_NAME)
    assert registry.find_by_repo(entry.hub_repo, PINNED) is entry
    assert registry.find_by_repo(entry.hub_repo, None) is None
    assert registry.find_by_repo(entry.hub_repo, "main") is None
    assert registry.find_by_repo("hscl-zoo/scl-cifar100", PINNED) is None


def test_published_name_loads_the_pinned_weights_and_checks_their_sha256(published):
    model, cache = published
    entry = info(PUBLISHED_NAME)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    for source in (PUBLISHED_NAME, f"hf-hub:{entry.hub_repo}@{PINNED}", f"hf-hub:{entry.hub_repo}"):
        assert torch.equal(hscl_zoo.load(source, cache_dir=cache)(x), model(x)), source

    # Change one byte of a weight in the cached blob: the file still loads, but not at the pin.
    snapshot = cache / f"models--{registry.HUB_ORG}--{PUBLISHED_NAME}" / "snapshots" / PINNED / "model.safetensors"
    blob = snapshot.resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0x01
    blob.write_bytes(bytes(data))
    assert load_file(snapshot).keys() == model.state_dict().keys()
    for source in (PUBLISHED_NAME, f"hf-hub:{entry.hub_repo}@{PINNED}"):
        with pytest.raises(ChecksumMismatchError, match=f"{entry.files['model.safetensors'].sha256}"):
            hscl_zoo.load(source, cache_dir=cache)
    hscl_zoo.load(f"hf-hub:{entry.hub_repo}", cache_dir=cache)  # not the pinned revision: no checksum to check


def test_an_entry_outside_the_paper_grid_carries_its_own_backbone():
    from hscl_zoo.zoo.cards import render_card
    from hscl_zoo.zoo.hub import WeightsNotPublishedError

    entry = ZooEntry(name="scl-cifar10-resnet18", method="scl", dataset="cifar10", backbone="resnet18",
                     hub_repo="hscl-zoo/scl-cifar10-resnet18", config="configs/scl-cifar10-resnet18.yaml")
    registry.register_model(entry)
    try:
        assert "scl-cifar10-resnet18" in list_models("scl-cifar10*") and info("scl-cifar10-resnet18") is entry
        assert info("scl-cifar10").backbone == "resnet50"  # the paper's grid is untouched
        assert "A `resnet18` image encoder" in render_card(entry)
        with pytest.raises(WeightsNotPublishedError, match="hscl-zoo train --config configs/scl-cifar10-resnet18.yaml"):
            hscl_zoo.load("scl-cifar10-resnet18")
        with pytest.raises(ValueError, match="already registered"):
            registry.register_model(entry)
    finally:
        registry._ENTRIES.remove(entry.name)
    assert not registry.is_model("scl-cifar10-resnet18")
    with pytest.raises(ValueError, match="backbone must name a timm model"):
        dataclasses.replace(info("scl-cifar10"), backbone="")


def test_a_bare_name_never_serves_a_cpu_smoke_test():
    """A name whose only release is a CPU smoke test (26 %) loads nothing and says which tag exists;
    hscl-beta-cifar100's GPU release is what its bare name loads, even beside a smoke test scoring more."""
    from hscl_zoo.zoo.hub import WeightsNotPublishedError

    assert not registry.tags_of("hscl-beta-cifar10"), "the zoo commits no smoke release"
    with smoke_release("hscl-beta-cifar10.cpu-9", 26.0):
        assert registry.resolve("hscl-beta-cifar10") is info("hscl-beta-cifar10")
        with pytest.raises(WeightsNotPublishedError, match=r"only CPU smoke tests: hscl-beta-cifar10\.cpu-9 \(linear "
                                                           r"top-1 26\.00 %\); load one by its tagged name"):
            hscl_zoo.load("hscl-beta-cifar10")
    assert registry.resolve("hscl-beta-cifar100").name == "hscl-beta-cifar100.gpu-30ep"
    with smoke_release("hscl-beta-cifar100.cpu-9", 99.0):  # a smoke test with a higher score still does not serve
        assert registry.resolve("hscl-beta-cifar100").name == "hscl-beta-cifar100.gpu-30ep"
        assert registry.resolve("hscl-beta-cifar100.cpu-9").name == "hscl-beta-cifar100.cpu-9"


def test_the_models_page_recommends_the_best_published_encoder_of_each_dataset():
    """The Models page's 'Which encoder to use' names, per dataset, the bare name whose default tag
    scores best among the published image releases, and lists as missing only what has none."""
    from helpers import REPO

    page = (REPO / "docs" / "models.md").read_text()
    paragraph = page[page.index("**Which encoder to use.**"):page.index("A model you trained")]
    serving = [info(n) for n in registry._RELEASES if info(n).modality == "image" and registry.serves_bare_name(info(n))]
    for dataset in ("cifar100", "cifar10"):
        best = max((e for e in serving if e.dataset == dataset), key=lambda e: e.metrics["top1"])
        assert f'hscl_zoo.load("{best.base_name}")' in paragraph
        assert registry.resolve(best.base_name) is best
    published = {(e.method, e.dataset) for e in serving}
    assert not {("hucl", "cifar100"), ("hscl-tau", "cifar100")} & published and "H-UCL and H-SCL(tau) on CIFAR-100" in paragraph
    assert not {e.dataset for e in serving} & {"stl10", "tinyimagenet"} and "STL-10 and Tiny ImageNet" in paragraph


def test_a_bare_graph_name_serves_the_tag_with_the_best_svm_accuracy():
    """A graph release scores SVM accuracy, not linear top-1: the bare name compares its tags by it."""
    bare = ZooEntry(name="scl-mutag-wide", method="scl", dataset="mutag", backbone=registry.GRAPH_BACKBONE,
                    hub_repo="hscl-zoo/scl-mutag-wide")
    registry.register_model(bare)
    names = {"scl-mutag-wide.test-a": 85.0, "scl-mutag-wide.test-b": 80.0}
    try:
        for name, accuracy in names.items():
            record = dict(registry._RELEASES["scl-mutag"], metrics={"svm_accuracy": accuracy})
            registry.register_model(registry.release_entry(name, record))
        assert registry.resolve("scl-mutag-wide").name == "scl-mutag-wide.test-a"
    finally:
        for name in [*names, bare.name]:
            if registry.is_model(name):
                registry._ENTRIES.remove(name)
