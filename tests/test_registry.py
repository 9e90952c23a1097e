"""The zoo registry: names, wildcards, pinning rules and Table 1 of the paper."""

import dataclasses
import re

import pytest
from huggingface_hub.utils import validate_repo_id

import hscl_zoo
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.registry import ZooEntry, info, list_models

METHODS = ["ucl", "hucl", "scl", "hscl-beta", "hscl-tau"]
DATASETS = ["stl10", "cifar10", "cifar100", "tinyimagenet"]


def test_one_name_per_method_and_dataset():
    expected = sorted(f"{m}-{d}" for m in METHODS for d in DATASETS)
    assert list_models() == expected
    assert hscl_zoo.list_models is list_models and hscl_zoo.info is info


@pytest.mark.parametrize("pattern,expected", [
    ("hscl-*-cifar100", ["hscl-beta-cifar100", "hscl-tau-cifar100"]),
    ("*-cifar10", ["hscl-beta-cifar10", "hscl-tau-cifar10", "hucl-cifar10", "scl-cifar10", "ucl-cifar10"]),
    ("?cl-stl10", ["scl-stl10", "ucl-stl10"]),
    (["ucl-*", "hucl-tiny*"], ["hucl-tinyimagenet", "ucl-cifar10", "ucl-cifar100", "ucl-stl10", "ucl-tinyimagenet"]),
    ("resnet*", []),
])
def test_wildcards(pattern, expected):
    assert list_models(pattern) == expected


def test_published_only_lists_exactly_the_published_entries():
    assert list_models(published_only=True) == [n for n in list_models() if info(n).published]


def test_bad_pattern_is_an_error():
    with pytest.raises(ValueError, match="wildcard string"):
        list_models(3)


@pytest.mark.parametrize("name", list_models())
def test_entry_is_consistent(name):
    entry = info(name)
    assert entry.name == f"{entry.method}-{entry.dataset}" == name
    assert entry.config == f"recipes/configs/{name}.yaml"
    assert entry.hub_repo == f"hscl-zoo/{name}"
    validate_repo_id(entry.hub_repo)
    assert entry.backbone == "resnet50"
    assert entry.paper_top1 is not None and 50 < entry.paper_top1 < 95
    assert (entry.paper_top1_std is not None) == (entry.dataset == "stl10")
    if entry.published:
        assert re.fullmatch(r"[0-9a-f]{40}", entry.revision) and re.fullmatch(r"[0-9a-f]{64}", entry.sha256)
    else:
        assert entry.revision is None and entry.sha256 is None and dict(entry.metrics) == {}
        assert "not published yet" in str(entry) and entry.train_command in str(entry)


def test_nothing_is_published_yet():
    assert list_models(published_only=True) == []


@pytest.mark.parametrize("name,top1,std", [
    ("ucl-stl10", 64.36, 0.92), ("hucl-cifar100", 67.77, None), ("scl-tinyimagenet", 62.06, None),
    ("hscl-beta-cifar100", 75.11, None), ("hscl-tau-stl10", 71.02, 2.03), ("hscl-beta-cifar10", 93.98, None),
])
def test_paper_numbers_are_table_1(name, top1, std):
    entry = info(name)
    assert (entry.paper_top1, entry.paper_top1_std) == (top1, std)


def test_unknown_name_lists_closest():
    with pytest.raises(ValueError, match="Unknown zoo model 'hscl-beta-cifar'") as err:
        info("hscl-beta-cifar")
    assert "hscl-beta-cifar10" in str(err.value) and "hscl-beta-cifar100" in str(err.value)
    assert "list_models" in str(err.value)


def test_summary_shows_publication_status():
    text = str(info("hscl-beta-cifar100"))
    assert "hscl-zoo/hscl-beta-cifar100" in text and "75.11" in text
    assert "accelerate launch recipes/pretrain.py --config recipes/configs/hscl-beta-cifar100.yaml" in text
    published = dataclasses.replace(info("hscl-beta-cifar100"), revision="a" * 40, sha256="b" * 64,
                                    metrics={"top1": 74.9})
    text = str(published)
    assert "published at revision " + "a" * 40 in text and "top1=74.9" in text and "train it" not in text


@pytest.mark.parametrize("changes,message", [
    ({"revision": "main", "sha256": "b" * 64}, "40-hex commit"),
    ({"revision": "a" * 40, "sha256": "xyz"}, "64 lowercase hex"),
    ({"revision": "a" * 40}, "published together"),
    ({"metrics": {"top1": 75.0}}, "metrics without published weights"),
    ({"revision": "a" * 40, "sha256": "b" * 64, "metrics": {"top1": "75"}}, "must be a number"),
    ({"method": "simclr"}, "Unknown method"),
])
def test_entries_claim_nothing_they_cannot_back(changes, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(info("scl-cifar10"), **changes)


def test_entries_are_immutable():
    entry = dataclasses.replace(info("scl-cifar10"), revision="a" * 40, sha256="b" * 64, metrics={"top1": 93.0})
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.revision = "c" * 40
    with pytest.raises(TypeError):
        entry.metrics["top1"] = 99.0
    assert isinstance(entry, ZooEntry) and entry.num_classes == 10


def test_find_by_repo_needs_the_pinned_revision():
    entry = info("scl-cifar10")
    assert registry.find_by_repo(entry.hub_repo, None) is None
    assert registry.find_by_repo(entry.hub_repo, entry.revision) is None  # unpublished: nothing to check


def test_an_entry_outside_the_paper_grid_carries_its_own_backbone():
    from hscl_zoo.zoo.cards import render_card
    from hscl_zoo.zoo.hub import WeightsNotPublishedError

    entry = ZooEntry(name="scl-cifar10-resnet18", method="scl", dataset="cifar10", backbone="resnet18",
                     hub_repo="hscl-zoo/scl-cifar10-resnet18", config=registry.config_path("scl-cifar10-resnet18"))
    registry.register_model(entry)
    try:
        assert "scl-cifar10-resnet18" in list_models("scl-cifar10*") and info("scl-cifar10-resnet18") is entry
        assert info("scl-cifar10").backbone == "resnet50"  # the paper's grid is untouched
        assert "A `resnet18` image encoder" in render_card(entry)
        with pytest.raises(WeightsNotPublishedError, match="recipes/configs/scl-cifar10-resnet18.yaml"):
            hscl_zoo.load("scl-cifar10-resnet18")
        with pytest.raises(ValueError, match="already registered"):
            registry.register_model(entry)
    finally:
        registry._ENTRIES.remove(entry.name)
    assert not registry.is_model("scl-cifar10-resnet18")
    with pytest.raises(ValueError, match="backbone must name a timm model"):
        dataclasses.replace(info("scl-cifar10"), backbone="")
