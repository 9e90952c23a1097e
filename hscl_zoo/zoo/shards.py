"""Weights on disk in the Hub's layout: one ``model.safetensors``, or shards
``model-00001-of-0000N.safetensors`` with ``model.safetensors.index.json`` mapping every tensor to
its shard (the convention transformers and timm read), in float32, bfloat16 or float16.

Writing splits with ``huggingface_hub.split_torch_state_dict_into_shards``. Reading is strict,
because an index is data from elsewhere: every shard it names is a plain file name inside the
folder, every key lies in exactly one shard, and the index equals the shards' own headers. Each
violation is one ``ShardLayoutError`` line naming the file, the key and the fix.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

__all__ = ["WEIGHTS_NAME", "INDEX_NAME", "DTYPES", "ShardLayoutError", "WeightFiles", "dtype_name", "cast_state",
           "shard_bytes", "write_weights", "read_index", "weight_files", "tensor_shapes", "read_state"]

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The precisions weights may be stored in, by the name config.json records (``torch_dtype``)."""
_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
_MAX_INDEX_BYTES = 16 * 2**20
_RESAVE = "re-save it with hscl_zoo.save_pretrained"


class ShardLayoutError(ValueError):
    """A sharded folder whose index and shards disagree, or whose index points outside the folder."""


@dataclass(frozen=True)
class WeightFiles:
    """The weight files of one model: ``paths`` maps each file name to where it lies (a folder, or
    a Hub cache snapshot); ``index`` is the index file's path for a sharded model, else None."""

    paths: Mapping[str, Path]
    index: Path | None = None

    def __str__(self) -> str:
        return str(self.index if self.index is not None else next(iter(self.paths.values())))


def dtype_name(dtype: torch.dtype | str) -> str:
    """The stored-precision name (``"bfloat16"``) of a torch dtype or of a name such as ``"bf16"``."""
    for name, value in DTYPES.items():
        if dtype == value or dtype == name or (isinstance(dtype, str) and _ALIASES.get(dtype.lower()) == name):
            return name
    raise ValueError(f"dtype {dtype!r} is not a precision weights are stored in; use one of "
                     f"{', '.join(f'torch.{n}' for n in DTYPES)} (or 'fp32', 'bf16', 'fp16').")


def cast_state(state: Mapping[str, torch.Tensor], dtype: torch.dtype | str) -> dict[str, torch.Tensor]:
    """The state dict with its floating-point tensors in ``dtype``; integer buffers (BatchNorm's
    ``num_batches_tracked``) keep theirs."""
    target = DTYPES[dtype_name(dtype)]
    return {k: v.to(target) if v.is_floating_point() else v for k, v in state.items()}


def shard_bytes(size: int | str) -> int:
    """A shard size in bytes: an int, or ``"15MiB"`` / ``"2GiB"`` (binary) or ``"15MB"`` (decimal,
    as huggingface_hub writes them)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B)\s*", size) if isinstance(size, str) else None
    if match:
        unit = match.group(2)
        value = float(match.group(1)) * (1024 if "i" in unit else 1000) ** ("KMGT".index(unit[0]) + 1)
    elif isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        value = 0
    if value < 1:
        raise ValueError(f"max_shard_size {size!r} is not a size; give bytes (an int) or a string such as '15MiB' "
                         "or '5GB'.")
    return int(value)


def write_weights(state: Mapping[str, torch.Tensor], folder: Path, *, max_shard_size: int | str) -> list[str]:
    """Write ``state`` into ``folder`` as one file or as shards + index; returns the names written."""
    split = split_torch_state_dict_into_shards(dict(state), max_shard_size=shard_bytes(max_shard_size))
    metadata = {"format": "pt"}
    if not split.is_sharded:
        save_file(dict(state), folder / WEIGHTS_NAME, metadata=metadata)
        return [WEIGHTS_NAME]
    for filename, keys in split.filename_to_tensors.items():
        save_file({k: state[k] for k in keys}, folder / filename, metadata=metadata)
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size() for v in state.values())},
             "weight_map": dict(sorted(split.tensor_to_filename.items()))}
    (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [*split.filename_to_tensors, INDEX_NAME]


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise ShardLayoutError(f"lists {key!r} twice; each key belongs to exactly one shard")
        seen[key] = value
    return seen


def read_index(index_path: Path) -> dict[str, str]:
    """The ``weight_map`` of an index file, each shard name checked to be a plain ``.safetensors``
    file name (no folder, no ``..``, not absolute), so nothing outside the folder is ever opened."""
    with open(index_path, "rb") as handle:
        data = handle.read(_MAX_INDEX_BYTES + 1)
    if len(data) > _MAX_INDEX_BYTES:
        raise ShardLayoutError(f"{index_path}: is larger than {_MAX_INDEX_BYTES // 2**20} MiB; {_RESAVE}.")
    try:
        index = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except ShardLayoutError as err:
        raise ShardLayoutError(f"{index_path}: {err}; {_RESAVE}.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ShardLayoutError(f"{index_path}: is not valid JSON ({err}); {_RESAVE}.") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ShardLayoutError(f"{index_path}: has no 'weight_map' object of key -> shard file; {_RESAVE}.")
    for key, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors"):
            raise ShardLayoutError(f"{index_path}: maps {key!r} to {shard!r}, not a .safetensors file name; {_RESAVE}.")
        if shard != Path(shard).name or shard in (".", "..") or "\\" in shard or os.path.isabs(shard):
            raise ShardLayoutError(f"{index_path}: names shard {shard!r} outside the model folder; an index may name "
                                   f"only files beside it ({_RESAVE}).")
    return weight_map


def _header_keys(path: Path) -> list[str]:
    try:
        with safe_open(os.fspath(path), framework="pt", device="cpu") as handle:
            return list(handle.keys())
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a readable safetensors file ({err}); {_RESAVE}.") from None


def weight_files(find: Callable[[str], Path | None], where: str) -> WeightFiles:
    """The weight files of a model whose files ``find`` locates by name (None: not there): the
    single file when there is one, else the index and its shards, checked against each other.

    ``where`` names the folder or repo in messages. Raises ``FileNotFoundError`` when neither form
    is there and ``ShardLayoutError`` for both at once, a missing shard, a key in two shards or
    an index that differs from the headers.
    """
    single, index_path = find(WEIGHTS_NAME), find(INDEX_NAME)
    if single is not None and index_path is not None:
        raise ShardLayoutError(f"{where} holds both {WEIGHTS_NAME} and {INDEX_NAME}; keep the one save_pretrained "
                               "wrote last and delete the other.")
    if single is not None:
        return WeightFiles({WEIGHTS_NAME: single})
    if index_path is None:
        raise FileNotFoundError(f"{where} has neither {WEIGHTS_NAME} nor {INDEX_NAME}; {_RESAVE}.")
    weight_map = read_index(index_path)
    paths: dict[str, Path] = {}
    for shard in sorted(set(weight_map.values())):
        path = find(shard)
        if path is None:
            raise ShardLayoutError(f"{index_path}: names shard {shard}, which is not in {where}; copy the whole "
                                   f"folder or {_RESAVE}.")
        paths[shard] = path
    holders: dict[str, list[str]] = {}
    for shard, path in paths.items():
        for key in _header_keys(path):
            holders.setdefault(key, []).append(shard)
    for key, shards in sorted(holders.items()):
        if len(shards) > 1:
            raise ShardLayoutError(f"{where}: key {key!r} is in two shards, {shards[0]} and {shards[1]}; each key "
                                   f"belongs to exactly one ({_RESAVE}).")
        if weight_map.get(key) != shards[0]:
            raise ShardLayoutError(f"{index_path}: shard {shards[0]} holds {key!r}, but the index puts it in "
                                   f"{weight_map.get(key)}; the index must equal the shards' headers ({_RESAVE}).")
    absent = sorted(set(weight_map) - set(holders))
    if absent:
        raise ShardLayoutError(f"{index_path}: puts {absent[0]!r} in {weight_map[absent[0]]}, which does not hold it; "
                               f"the index must equal the shards' headers ({_RESAVE}).")
    return WeightFiles(paths, index_path)


def tensor_shapes(files: WeightFiles) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape, read from the headers alone (nothing is allocated)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files.paths.values():
        try:
            with safe_open(os.fspath(path), framework="pt", device="cpu") as handle:
                shapes.update({key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()})
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{path} is not a readable safetensors file ({err}); {_RESAVE}.") from None
    return shapes


def read_state(files: WeightFiles) -> dict[str, torch.Tensor]:
    """All tensors of all files, in the precision they were stored in."""
    state: dict[str, torch.Tensor] = {}
    for path in files.paths.values():
        try:
            state.update(load_file(os.fspath(path), device="cpu"))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{path} is not a readable safetensors file ({err}); {_RESAVE}.") from None
    return state
