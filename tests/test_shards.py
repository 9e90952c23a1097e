"""Weights in any precision, in shards (issue 39): save_pretrained's dtype and max_shard_size, the
Hub's index convention, strict loading of both forms, and the model-type table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from hscl_zoo.models import ContrastiveEncoder, create_model
from hscl_zoo.zoo import model_types
from hscl_zoo.zoo.hub import load
from hscl_zoo.zoo.saving import save_pretrained
from hscl_zoo.zoo.shards import INDEX_NAME, ShardLayoutError, shard_bytes


@pytest.fixture(scope="module")
def model() -> ContrastiveEncoder:
    torch.manual_seed(0)
    encoder = create_model("resnet10t", num_classes=3, image_size=32)
    encoder.train()
    with torch.no_grad():
        encoder.project(torch.randn(4, 3, 32, 32))  # BatchNorm statistics off their defaults
    return encoder.eval()


@pytest.fixture(scope="module")
def sharded(model: ContrastiveEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_pretrained(model, tmp_path_factory.mktemp("bf16") / "net", dtype=torch.bfloat16,
                           max_shard_size="5MiB")


def _headers(folder: Path) -> dict[str, str]:
    keys = {}
    for shard in folder.glob("model-*.safetensors"):
        with safe_open(str(shard), framework="pt") as handle:
            keys.update(dict.fromkeys(handle.keys(), shard.name))
    return keys


def test_bf16_shards_follow_the_hub_convention(sharded: Path, model: ContrastiveEncoder) -> None:
    """Shards named model-0000k-of-0000N.safetensors, each under the limit, an index whose
    weight_map equals the shards' headers, and a config recording the stored precision."""
    shards = sorted(p.name for p in sharded.glob("model-*.safetensors"))
    count = len(shards)
    assert count >= 2 and shards == [f"model-{k:05d}-of-{count:05d}.safetensors" for k in range(1, count + 1)]
    assert not (sharded / "model.safetensors").exists()
    assert all((sharded / s).stat().st_size <= 5 * 2**20 + 64 * 1024 for s in shards)  # + the header
    index = json.loads((sharded / INDEX_NAME).read_text())
    assert index["weight_map"] == _headers(sharded)
    assert set(index["weight_map"]) == set(model.state_dict())
    state = model.state_dict()
    assert index["metadata"]["total_size"] == sum(
        v.numel() * (2 if v.is_floating_point() else v.element_size()) for v in state.values())
    assert json.loads((sharded / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_fp32_to_bf16_shards_to_fp32_equals_the_weights_cast_by_hand(sharded: Path, model: ContrastiveEncoder) -> None:
    loaded = load(sharded)
    by_hand = {k: v.to(torch.bfloat16).to(torch.float32) if v.is_floating_point() else v
               for k, v in model.state_dict().items()}
    got = loaded.state_dict()
    assert all(v.dtype == torch.float32 for v in got.values() if v.is_floating_point())
    for key, value in by_hand.items():
        assert torch.equal(got[key], value), key
    assert got["backbone.bn1.num_batches_tracked"].dtype == torch.int64
    changed = sum(not torch.equal(model.state_dict()[k], v) for k, v in by_hand.items())
    assert changed > 10, "bf16 rounding changed no weight: the cast was never applied"


def test_bf16_on_request_and_as_stored(sharded: Path, model: ContrastiveEncoder) -> None:
    for dtype in (torch.bfloat16, "stored"):
        loaded = load(sharded, dtype=dtype)
        weight = loaded.state_dict()["classifier.weight"]
        assert weight.dtype == torch.bfloat16
        assert torch.equal(weight, model.classifier.weight.detach().to(torch.bfloat16))


def test_a_resave_in_one_file_removes_the_old_shards(model: ContrastiveEncoder, sharded: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(sharded, tmp_path / "net")
    save_pretrained(model, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    assert torch.equal(load(folder).classifier.weight, model.classifier.weight)


@pytest.mark.parametrize("size,expected", [("15MiB", 15 * 2**20), ("15MB", 15_000_000), ("1.5KiB", 1536), (10, 10)])
def test_shard_sizes(size, expected) -> None:
    assert shard_bytes(size) == expected


@pytest.mark.parametrize("size", ["15 parsecs", "0MB", 0, True, None])
def test_bad_shard_sizes_are_refused(size, model: ContrastiveEncoder, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        save_pretrained(model, tmp_path / "net", max_shard_size=size)
    assert not (tmp_path / "net").exists()


def test_bad_dtype_is_refused_before_anything_is_written(model: ContrastiveEncoder, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="torch.bfloat16"):
        save_pretrained(model, tmp_path / "net", dtype=torch.int8)
    assert not (tmp_path / "net").exists()


def _edit_index(folder: Path, edit) -> None:
    path = folder / INDEX_NAME
    index = json.loads(path.read_text())
    edit(index["weight_map"])
    path.write_text(json.dumps(index))


def _one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_index_naming_a_missing_shard(sharded: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(sharded, tmp_path / "net")
    last = sorted(folder.glob("model-*.safetensors"))[-1]
    last.unlink()
    with pytest.raises(ShardLayoutError) as err:
        load(folder)
    assert f"names shard {last.name}, which is not in {folder}" in _one_line(err)


def test_key_in_two_shards(sharded: Path, tmp_path: Path) -> None:
    """A shard rewritten to also hold a key the index puts in another shard."""
    from safetensors.torch import load_file, save_file

    folder = shutil.copytree(sharded, tmp_path / "net")
    first, second = sorted(folder.glob("model-*.safetensors"))[:2]
    extra = load_file(second)
    key = sorted(extra)[0]
    save_file({**load_file(first), key: extra[key]}, first, metadata={"format": "pt"})
    with pytest.raises(ShardLayoutError) as err:
        load(folder)
    assert f"key {key!r} is in two shards, {first.name} and {second.name}" in _one_line(err)


def test_index_listing_a_key_twice(sharded: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(sharded, tmp_path / "net")
    text = (folder / INDEX_NAME).read_text()
    first_entry = text.index('"weight_map": {') + len('"weight_map": {')
    (folder / INDEX_NAME).write_text(text[:first_entry] + '"classifier.bias": "model-00001-of-00002.safetensors",'
                                     + text[first_entry:])
    with pytest.raises(ShardLayoutError) as err:
        load(folder)
    assert "lists 'classifier.bias' twice" in _one_line(err)


@pytest.mark.parametrize("shard", ["../model-00001-of-00002.safetensors", "/tmp/model.safetensors",
                                   "sub/model-00001-of-00002.safetensors", "..\\model.safetensors"])
def test_shard_path_outside_the_folder(sharded: Path, tmp_path: Path, shard: str) -> None:
    folder = shutil.copytree(sharded, tmp_path / "net")
    _edit_index(folder, lambda m: m.update({"classifier.bias": shard}))
    with pytest.raises(ShardLayoutError) as err:
        load(folder)
    assert f"names shard {shard!r} outside the model folder" in _one_line(err)


def test_index_disagreeing_with_the_headers(sharded: Path, tmp_path: Path) -> None:
    folder = shutil.copytree(sharded, tmp_path / "net")
    shards = sorted(p.name for p in folder.glob("model-*.safetensors"))
    index = json.loads((folder / INDEX_NAME).read_text())["weight_map"]
    key = next(k for k, v in index.items() if v == shards[0])
    _edit_index(folder, lambda m: m.update({key: shards[1]}))
    with pytest.raises(ShardLayoutError) as err:
        load(folder)
    assert f"shard {shards[0]} holds {key!r}, but the index puts it in {shards[1]}" in _one_line(err)


def test_both_forms_at_once_are_ambiguous(sharded: Path, model: ContrastiveEncoder, tmp_path: Path) -> None:
    folder = shutil.copytree(sharded, tmp_path / "net")
    shutil.copy(save_pretrained(model, tmp_path / "single") / "model.safetensors", folder)
    with pytest.raises(ShardLayoutError, match="holds both model.safetensors and model.safetensors.index.json"):
        load(folder)


# --- model types --------------------------------------------------------------------------------

class TinyEncoder(nn.Module):
    """A non-image encoder as a plug-in would write one: from_config / to_config / state_dict."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.layer = nn.Linear(3, width)

    @classmethod
    def from_config(cls, config: dict) -> TinyEncoder:
        if not isinstance(config.get("width"), int):
            raise ValueError("width must be an int")
        return cls(config["width"])

    def to_config(self) -> dict:
        return {"model_type": "tiny-test", "width": self.width}


@pytest.fixture
def tiny_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(model_types.MODEL_TYPES, "tiny-test", f"{__name__}:TinyEncoder")


def test_a_registered_model_type_saves_and_loads_in_bf16_shards(tiny_type: None, tmp_path: Path) -> None:
    torch.manual_seed(0)
    tiny = TinyEncoder(4096)
    folder = save_pretrained(tiny, tmp_path / "tiny", dtype="bf16", max_shard_size="20KB")
    assert (folder / INDEX_NAME).is_file()
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "tiny-test", "width": 4096,
                                                                "torch_dtype": "bfloat16"}
    loaded = load(folder)
    assert type(loaded) is TinyEncoder and not loaded.training
    assert torch.equal(loaded.layer.weight, tiny.layer.weight.detach().to(torch.bfloat16).float())


def test_no_model_type_is_the_image_encoder(model: ContrastiveEncoder, tmp_path: Path) -> None:
    folder = save_pretrained(model, tmp_path / "net")
    config = json.loads((folder / "config.json").read_text())
    assert "model_type" not in config and model_types.model_class(config, "x") is ContrastiveEncoder
    assert type(load(folder)) is ContrastiveEncoder


def test_an_unknown_model_type_is_one_line(tiny_type: None, tmp_path: Path) -> None:
    folder = save_pretrained(TinyEncoder(8), tmp_path / "tiny")
    (folder / "config.json").write_text(json.dumps({"model_type": "tiny-other", "width": 8}))
    with pytest.raises(ValueError) as err:
        load(folder)
    assert _one_line(err).startswith(f"{folder / 'config.json'}: model_type 'tiny-other' is not one hscl_zoo loads")
    (folder / "config.json").write_text(json.dumps({"model_type": "tiny-test", "width": "8"}))
    with pytest.raises(ValueError, match="config.json: width must be an int"):
        load(folder)


def test_the_graph_encoder_is_one_table_line_imported_lazily() -> None:
    import subprocess
    import sys

    assert model_types.MODEL_TYPES["graph-gin"] == "hscl_zoo.graphs.encoder:GraphEncoder"
    code = ("import sys, hscl_zoo.zoo.hub, hscl_zoo.zoo.saving; print(any(m.startswith('hscl_zoo.graphs') for m in "
            "sys.modules if m not in ('hscl_zoo.graphs', 'hscl_zoo.graphs.catalog')))")  # the dataset table: no code
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
