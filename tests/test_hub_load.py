"""What ``hscl_zoo.load`` does past finding the files: the line it prints for a zoo name, the
precision it loads in, the config checks it names the file in, and a graph folder beside an image
one. Every message is compared whole, written out here by hand."""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

from hscl_zoo.models import create_model
from hscl_zoo.zoo.hub import ConfigMismatchError, check_weights, load
from hscl_zoo.zoo.registry import info
from hscl_zoo.zoo.releases import fetch_release, pin_folder
from hscl_zoo.zoo.saving import save_pretrained
from hscl_zoo.zoo.schema import ConfigSchemaError
from helpers import make_hub_cache

REPO = "hscl-test/tiny-load"
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return create_model("resnet10t", num_classes=3, image_size=32, class_names=["cat", "dog", "eel"]).eval()


@pytest.fixture(scope="module")
def folder(model: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_pretrained(model, tmp_path_factory.mktemp("fp32") / "net")


@pytest.fixture(scope="module")
def bf16_folder(model: nn.Module, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_pretrained(model, tmp_path_factory.mktemp("bf16") / "net", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def mutag() -> Path:
    """The folder of a published graph encoder, found as load finds it."""
    return fetch_release(info("hscl-beta-mutag"), offline=True).files["config.json"].parent


@pytest.fixture
def cache(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    make_hub_cache(tmp_path, REPO, folder, COMMIT)
    return tmp_path


def _copy(folder: Path, to: Path, **config_changes) -> Path:
    """The folder copied to ``to`` with its config.json's top-level keys changed (None: removed)."""
    shutil.copytree(folder, to)
    config = json.loads((to / "config.json").read_text())
    for key, value in config_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (to / "config.json").write_text(json.dumps(config))
    return to


def _dtypes(module: nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in module.parameters()}


# --- the line a zoo name prints --------------------------------------------------------------------

def _entry_from(folder: Path, metrics: dict[str, float]):
    """hscl-beta-cifar100's release entry, its files served from a Hub cache of ``folder``."""
    return dataclasses.replace(info("hscl-beta-cifar100.gpu-30ep"), hub_repo=REPO, revision=COMMIT,
                               files=pin_folder(folder), metrics=metrics)


def test_a_zoo_name_prints_its_name_score_and_training_on_stderr(cache: Path, folder: Path,
                                                                 capsys: pytest.CaptureFixture) -> None:
    load(_entry_from(folder, {"top1": 61.234}), cache_dir=cache)
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "hscl_zoo: loaded hscl-beta-cifar100.gpu-30ep: linear top-1 61.23 % (ResNet-18, 30 epochs on one GPU)\n"


def test_a_release_without_a_score_prints_no_score(cache: Path, folder: Path, capsys: pytest.CaptureFixture) -> None:
    load(_entry_from(folder, {}), cache_dir=cache)
    assert capsys.readouterr().err == "hscl_zoo: loaded hscl-beta-cifar100.gpu-30ep (ResNet-18, 30 epochs on one GPU)\n"


def test_a_folder_or_a_hub_repo_prints_nothing(cache: Path, folder: Path, capsys: pytest.CaptureFixture) -> None:
    load(folder)
    load(f"hf-hub:{REPO}", cache_dir=cache)
    assert capsys.readouterr() == ("", "")


# --- precision ---------------------------------------------------------------------------------------

def test_stored_bfloat16_loads_as_float32_unless_asked(bf16_folder: Path, model: nn.Module) -> None:
    assert _dtypes(load(bf16_folder)) == {torch.float32}
    as_stored = load(bf16_folder, dtype="stored")
    assert _dtypes(as_stored) == {torch.bfloat16}
    assert torch.equal(as_stored.classifier.weight, model.classifier.weight.detach().to(torch.bfloat16))


def test_float32_weights_load_in_the_precision_asked_for(folder: Path, model: nn.Module) -> None:
    assert _dtypes(load(folder, dtype="stored")) == {torch.float32}
    half = load(folder, dtype=torch.float16)
    assert _dtypes(half) == {torch.float16}
    assert torch.equal(half.classifier.weight, model.classifier.weight.detach().half())
    assert _dtypes(load(folder, dtype="bf16")) == {torch.bfloat16}


def test_a_config_without_torch_dtype_was_stored_in_float32(folder: Path, tmp_path: Path) -> None:
    old = _copy(folder, tmp_path / "old", torch_dtype=None)
    assert _dtypes(load(old, dtype="stored")) == {torch.float32}


def test_an_unknown_torch_dtype_names_the_file_the_choices_and_the_fix(mutag: Path, tmp_path: Path) -> None:
    """A graph config has no image schema to check its precision first: load's own check answers."""
    odd = _copy(mutag, tmp_path / "odd", torch_dtype="float8")
    with pytest.raises(ValueError) as err:
        load(odd)
    assert str(err.value) == (f"{odd / 'config.json'}: torch_dtype 'float8' is not one of ['float32', 'bfloat16', "
                              "'float16']; re-save the model with hscl_zoo.save_pretrained.")


def test_a_graph_config_without_torch_dtype_was_stored_in_float32(mutag: Path, tmp_path: Path) -> None:
    assert "torch_dtype" not in json.loads((mutag / "config.json").read_text())
    assert _dtypes(load(mutag, dtype="stored")) == {torch.float32}
    assert _dtypes(load(_copy(mutag, tmp_path / "half", torch_dtype="float16"), dtype="stored")) == {torch.float16}


# --- which checks run on which config ---------------------------------------------------------------

def test_an_image_config_is_refused_by_the_schema_naming_its_file_once(folder: Path, tmp_path: Path) -> None:
    broken = _copy(folder, tmp_path / "broken", num_classes=None)
    with pytest.raises(ConfigSchemaError) as err:
        load(broken)
    assert str(err.value) == (f"{broken / 'config.json'}: not an hscl_zoo encoder config: missing num_classes. "
                              "Write configs with hscl_zoo.save_pretrained(model, directory).")


def test_a_graph_folder_loads_beside_image_ones(capsys: pytest.CaptureFixture) -> None:
    """A config with a ``model_type`` is checked by its own class, not the image schema."""
    entry = info("hscl-beta-mutag")
    encoder = load(entry.name)
    assert type(encoder).__name__ == "GraphEncoder" and not encoder.training
    svm = entry.metrics["svm_accuracy"]
    assert capsys.readouterr().err == (f"hscl_zoo: loaded hscl-beta-mutag: SVM accuracy {svm:.2f} % "
                                       "(GIN 3 x 32, the paper's 200 epochs)\n")


def test_a_module_without_a_backbone_name_is_named_by_its_class(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"weight": torch.zeros(2, 3)}, tmp_path / "w.safetensors")
    with pytest.raises(ConfigMismatchError) as err:
        check_weights(nn.Linear(3, 2), tmp_path / "w.safetensors")
    assert str(err.value) == (f"{tmp_path / 'w.safetensors'} does not match the Linear encoder described by "
                              "config.json (missing keys: bias). Save the weights and the config from the same "
                              "model with hscl_zoo.save_pretrained(model, directory).")


# --- the device, checked before anything loads -----------------------------------------------------

def test_a_device_torch_does_not_know_is_refused_before_anything_loads(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(ValueError) as err:
        load("hscl-beta-mutag", device="tpu")
    assert str(err.value) == ("device 'tpu' is not a device torch knows; pass 'cpu', 'cuda', 'cuda:1', 'mps' or a "
                              "torch.device.")
    assert capsys.readouterr().err == ""


def test_cuda_loads_there_where_torch_has_it_and_is_refused_with_the_fix_where_not(capsys: pytest.CaptureFixture
                                                                                    ) -> None:
    if torch.cuda.is_available():
        assert {p.device.type for p in load("hscl-beta-mutag", device="cuda").parameters()} == {"cuda"}
        return
    for device in ("cuda", "cuda:1", 0):
        with pytest.raises(ValueError) as err:
            load("hscl-beta-mutag", device=device)
        assert str(err.value) == (f"device {device!r}: this machine has no CUDA device that torch can use; leave "
                                  "device out to load on the CPU.")
    assert capsys.readouterr().err == ""


def test_mps_loads_there_where_torch_has_it_and_is_refused_with_the_fix_where_not(capsys: pytest.CaptureFixture
                                                                                   ) -> None:
    if torch.backends.mps.is_available():
        assert {p.device.type for p in load("hscl-beta-mutag", device="mps").parameters()} == {"mps"}
        return
    with pytest.raises(ValueError) as err:
        load("hscl-beta-mutag", device="mps")
    assert str(err.value) == ("device 'mps': this machine has no MPS device that torch can use; leave device out to "
                              "load on the CPU.")
    assert capsys.readouterr().err == ""


def test_the_default_device_is_the_cpu_and_meta_is_honoured(folder: Path) -> None:
    assert {p.device.type for p in load(folder).parameters()} == {"cpu"}
    assert {p.device.type for p in load(folder, device="meta").parameters()} == {"meta"}
