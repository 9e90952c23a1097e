"""Releases (issue 39): published = pinned, sources tried in order with every checksum checked
(a local mirror, then a real Hub cache laid out on disk), and `hscl-zoo release` building a
release folder from a real (tiny) run, refusing a cast that breaks the model."""

from __future__ import annotations

import hashlib
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

import hscl_zoo
from hscl_zoo.cli import main as cli_main
from hscl_zoo.models import create_model
from hscl_zoo.publishing.release import ReleaseRefused, build_release, registry_entry_text
from hscl_zoo.zoo import registry
from hscl_zoo.zoo.hub import ChecksumMismatchError, NotCachedError, load
from hscl_zoo.zoo.registry import ZooEntry
from hscl_zoo.zoo.releases import RELEASES_ENV, ReleaseFallbackWarning, pin_folder
from hscl_zoo.zoo.saving import save_pretrained
from helpers import REPO as CHECKOUT, make_hub_cache

NAME = "scl-cifar10.test-mirror"
REPO = f"hscl-zoo/{NAME}"
COMMIT = "4444444444444444444444444444444444444444"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.delenv(RELEASES_ENV, raising=False)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("resnet10t", num_classes=10, image_size=32).eval()


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory) -> Path:
    return save_pretrained(model, tmp_path_factory.mktemp("release") / NAME, dtype=torch.bfloat16,
                           max_shard_size="2MB")


@pytest.fixture(scope="module")
def entry(saved) -> ZooEntry:
    return ZooEntry(name=NAME, method="scl", dataset="cifar10", backbone="resnet10t", hub_repo=REPO,
                    config="scl-cifar10", revision=COMMIT, files=pin_folder(saved), tag="test-mirror",
                    budget="a test model")


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def _mirror(saved: Path, root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = shutil.copytree(saved, root / NAME)
    monkeypatch.setenv(RELEASES_ENV, str(root))
    return copy


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))


def test_pins_cover_every_file(saved, entry) -> None:
    assert set(entry.files) == {p.name for p in saved.iterdir()} and len(entry.files) >= 4
    for name, pin in entry.files.items():
        data = (saved / name).read_bytes()
        assert pin == (hashlib.sha256(data).hexdigest(), len(data))


def test_a_bad_mirror_copy_is_refused_even_with_a_good_cache_copy(saved, entry, model, tmp_path, monkeypatch) -> None:
    """The mirror is tried first and refused for its checksum; the Hub cache's good copy is then
    loaded, and the fallback is said in a warning naming the refused file and the source used."""
    cache = tmp_path / "cache"
    make_hub_cache(cache, REPO, saved, COMMIT)
    shard = sorted((_mirror(saved, tmp_path / "mirror", monkeypatch)).glob("model-*.safetensors"))[0]
    _flip_a_byte(shard)
    with pytest.warns(ReleaseFallbackWarning) as caught:
        loaded = load(entry, cache_dir=cache)
    message = str(caught[0].message)
    assert f"Refusing {shard}: its sha256 is {hashlib.sha256(shard.read_bytes()).hexdigest()}" in message
    assert f"pins {entry.files[shard.name].sha256}" in message and "The mirror's copy is corrupt" in message
    assert f"Loaded {NAME} from the Hub cache ({REPO}) instead" in message and "\n" not in message
    expected = load(saved)
    assert torch.equal(loaded(_x()), expected(_x()))


def test_a_good_mirror_is_used_first_and_silently(saved, entry, tmp_path, monkeypatch) -> None:
    """Order: a good mirror wins over a corrupt cache, which is never read."""
    cache = tmp_path / "cache"
    repo_dir = make_hub_cache(cache, REPO, saved, COMMIT)
    for blob in (repo_dir / "blobs").iterdir():
        _flip_a_byte(blob)
    _mirror(saved, tmp_path / "mirror", monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = load(entry, cache_dir=cache)
    assert torch.equal(loaded(_x()), load(saved)(_x()))


def test_bad_copies_everywhere_are_one_line_naming_each(saved, entry, tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    repo_dir = make_hub_cache(cache, REPO, saved, COMMIT)
    _flip_a_byte((repo_dir / "snapshots" / COMMIT / "config.json").resolve())
    mirrored = _mirror(saved, tmp_path / "mirror", monkeypatch)
    _flip_a_byte(mirrored / "config.json")
    with pytest.raises(ChecksumMismatchError) as err:
        load(entry, cache_dir=cache)
    message = str(err.value)
    assert "\n" not in message and message.count("Refusing") == 2
    assert str(mirrored / "config.json") in message and "The cached file is corrupt" in message


def test_no_source_at_all_says_where_it_looked(entry, tmp_path) -> None:
    with pytest.raises(NotCachedError) as err:
        load(entry, cache_dir=tmp_path)
    message = str(err.value)
    assert "\n" not in message and f"the Hub cache lacks {REPO}@{COMMIT}/" in message and "offline" in message


def test_a_mirror_variable_that_is_not_a_folder(entry, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(RELEASES_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match=f"{RELEASES_ENV}=.*nowhere is not a directory"):
        load(entry, cache_dir=tmp_path)


# --- hscl-zoo release from a real tiny run --------------------------------------------------------

@pytest.fixture(scope="module")
def digits_entry():
    """A zoo name for the digits dataset (the paper's grid has none), for this module only."""
    entry = ZooEntry(name="hscl-beta-digits", method="hscl-beta", dataset="digits", backbone="resnet18",
                     hub_repo="hscl-zoo/hscl-beta-digits", config="hscl-beta-digits")
    registry.register_model(entry)
    yield entry
    registry._ENTRIES.remove(entry.name)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, digits_entry) -> Path:
    from hscl_zoo.training.pretrain import main as pretrain

    run = tmp_path_factory.mktemp("run") / "digits"
    pretrain(["--subset", "200", "--batch_size", "64", "--epochs", "1", "--probe_epochs", "10",
              "--monitor_train_size", "200", "--output_dir", str(run)])
    return run


def _head_top1_by_hand(folder: Path) -> tuple[float, int]:
    """The released model's linear head on the digits test split, one image at a time."""
    from hscl_zoo.data import load_splits

    model = load(folder)
    test = load_splits("digits", None, subset=200, seed=0).test
    right = 0
    with torch.inference_mode():
        for row in test:
            logits = model(model.transform(row["image"]).unsqueeze(0))[0]
            right += int(logits[row["label"]] > logits[torch.arange(len(logits)) != row["label"]].max())
    return 100.0 * right / len(test), len(test)


def test_release_builds_a_pinned_folder_and_loads_by_name(run_dir, tmp_path, monkeypatch, capsys) -> None:
    """In float32 the released head must score exactly the run's own probe (same features, same
    head); a 1-epoch model's near-tied logits make its bf16 cast flip test images (the committed
    release is the bf16 case)."""
    name = "hscl-beta-digits.test-1ep"
    out = tmp_path / "releases" / name
    assert cli_main(["release", str(run_dir), "--name", name, "--out", str(out), "--dtype", "fp32",
                     "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir())
    assert names == ["README.md", "config.json", "eval.json", "model-00001-of-00004.safetensors",
                     "model-00002-of-00004.safetensors", "model-00003-of-00004.safetensors",
                     "model-00004-of-00004.safetensors", "model.safetensors.index.json"]
    assert all((out / n).stat().st_size < 15 * 2**20 for n in names)  # ResNet-18 in float32 is 44 MiB
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
    evaluation = json.loads((out / "eval.json").read_text())
    run_top1 = json.loads((run_dir / "linear_eval.json").read_text())["top1"]
    assert evaluation["float32_run"]["top1"] == run_top1 == pytest.approx(evaluation["linear_top1"], abs=1e-6)
    by_hand, test_images = _head_top1_by_hand(out)
    assert evaluation["linear_top1"] == pytest.approx(by_hand, abs=1e-4)  # float32 mean; an image is 2 points
    assert evaluation["test_images"] == test_images and evaluation["stored_dtype"] == "float32"
    assert "6 epochs" not in evaluation["budget"] and "1 epochs on a class-balanced 200-image subset" in evaluation["budget"]
    assert evaluation["commit"] and evaluation["hardware"].startswith("CPU") and "--epochs 1" in evaluation["train_command"]
    card = (out / "README.md").read_text()
    assert f"{evaluation['linear_top1']:.2f}" in card
    assert "Trained without a shipped config" in card and "--config" not in card, "the run named no config"
    assert evaluation["release_command"] is None, "called in-process, not from the command line"
    assert "release_command" not in card, "the card names only the commands eval.json holds"

    pasted = registry_entry_text(name, json.loads(json.dumps(_entry_from(printed))))
    assert pasted.replace(" ", "") in printed.replace(" ", "")
    entry_dict = _entry_from(printed)
    assert (entry_dict["method"], entry_dict["dataset"]) == ("hscl-beta", "digits")
    for file, pin in entry_dict["files"].items():
        assert pin["sha256"] == hashlib.sha256((out / file).read_bytes()).hexdigest()
    monkeypatch.setitem(registry._RELEASES, name, entry_dict)
    registry.register_model(registry.release_entry(name, entry_dict))
    try:
        monkeypatch.setenv(RELEASES_ENV, str(out.parent))
        assert registry.resolve("hscl-beta-digits").name == name
        loaded = hscl_zoo.load("hscl-beta-digits")
        assert loaded.classifier.weight.dtype == torch.float32
        assert torch.equal(loaded.classifier.weight, load(out).classifier.weight)
    finally:
        registry._ENTRIES.remove(name)


@pytest.fixture(scope="module")
def run_dir_2ep(tmp_path_factory, digits_entry) -> Path:
    """A second real run of the same model, trained longer: another release of the same zoo name."""
    from hscl_zoo.training.pretrain import main as pretrain

    run = tmp_path_factory.mktemp("run") / "digits-2ep"
    pretrain(["--subset", "200", "--batch_size", "64", "--epochs", "2", "--probe_epochs", "10",
              "--monitor_train_size", "200", "--output_dir", str(run)])
    return run


def test_a_bare_name_serves_its_best_release_each_recounted_exactly(run_dir, run_dir_2ep, tmp_path, monkeypatch) -> None:
    """Two real fp16 releases of hscl-beta-digits (1 and 2 epochs): each one's eval.json top-1 is its
    whole test split counted image by image here, on the CPU that evaluated it, exactly; the bare name
    loads the one that scores more, whichever tag it has."""
    from hscl_zoo.publishing.release import release_entry

    folders = tmp_path / "releases"
    scores = {}
    for run, name in ((run_dir, "hscl-beta-digits.test-1ep"), (run_dir_2ep, "hscl-beta-digits.test-2ep")):
        assert cli_main(["release", str(run), "--name", name, "--out", str(folders / name), "--dtype", "fp16",
                         "--device", "cpu"]) == 0
        evaluation = json.loads((folders / name / "eval.json").read_text())
        by_hand, test_images = _head_top1_by_hand(folders / name)
        assert evaluation["stored_dtype"] == "float16" and evaluation["test_images"] == test_images
        assert evaluation["linear_top1"] == pytest.approx(by_hand, abs=1e-4)  # an image is half a point
        record = release_entry(folders / name)
        registry.register_model(registry.release_entry(name, record))
        scores[name] = record["metrics"]["top1"]
    try:
        assert len(set(scores.values())) == 2, scores
        best, other = sorted(scores, key=scores.get, reverse=True)
        monkeypatch.setenv(RELEASES_ENV, str(folders))
        assert registry.resolve("hscl-beta-digits").name == best
        loaded = hscl_zoo.load("hscl-beta-digits")
        assert torch.equal(loaded.classifier.weight, load(folders / best).classifier.weight)
        assert not torch.equal(loaded.classifier.weight, load(folders / other).classifier.weight)
    finally:
        for name in scores:
            registry._ENTRIES.remove(name)


def _entry_from(printed: str) -> dict:
    text = printed.split("hscl_zoo/zoo/released.json (or rerun with --register):\n", 1)[1]
    return json.loads("{" + text + "}").popitem()[1]


def test_release_refuses_a_cast_that_zeroes_a_layer(run_dir, tmp_path) -> None:
    def zero_last_stage(model: torch.nn.Module) -> None:
        with torch.no_grad():
            for parameter in model.backbone.layer4.parameters():
                parameter.zero_()

    out = tmp_path / "refused"
    run_top1 = json.loads((run_dir / "linear_eval.json").read_text())["top1"]
    with pytest.raises(ReleaseRefused) as err:
        build_release(run_dir, "hscl-beta-digits.test-broken", out=out, cast=zero_last_stage)
    message = str(err.value)
    assert "\n" not in message and f"float32 {run_top1:.2f} %" in message and "linear top-1 is " in message
    assert not out.exists()


@pytest.mark.parametrize("name,fix", [("hscl-beta-digits", "'<zoo name>.<tag>'"), ("hscl-beta-digitz.cpu", "closest"),
                                      ("hscl-beta-digits.CPU", "lowercase"), ("scl-cifar10.cpu", "not as the zoo's")])
def test_release_names_are_checked_first(run_dir, tmp_path, name, fix) -> None:
    with pytest.raises(ValueError, match=fix):
        build_release(run_dir, name, out=tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_push_offline_is_one_line(saved, tmp_path, capsys) -> None:
    folder = shutil.copytree(saved, tmp_path / NAME)
    (folder / "eval.json").write_text("{}")
    assert cli_main(["push", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"could not upload {folder} to {REPO}" in err and "hf auth login" in err


def test_a_release_folder_built_elsewhere_registers_as_build_release_registered_it(tmp_path) -> None:
    """`hscl-zoo register` (a GPU sprint's folder, unpacked): the record computed from the folder
    alone equals the one released.json holds for a committed GPU release; a graph release or a
    renamed folder is refused before anything is written."""
    from hscl_zoo.publishing.release import register_release, release_entry

    name = "hscl-beta-cifar100.gpu-30ep"
    committed = json.loads(Path(registry.RELEASED_FILE).read_text())[name]
    assert release_entry(CHECKOUT / "releases" / name) == committed
    released = register_release(name, release_entry(CHECKOUT / "releases" / name), tmp_path / "released.json")
    assert json.loads(released.read_text()) == {name: committed}

    renamed = tmp_path / "renamed"
    shutil.copytree(CHECKOUT / "releases" / name, renamed)
    for folder in (renamed, CHECKOUT / "releases" / "hscl-beta-mutag"):
        with pytest.raises(ValueError, match="not an image release named after its folder"):
            release_entry(folder)
