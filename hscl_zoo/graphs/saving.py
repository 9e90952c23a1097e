"""A graph encoder's folder: ``config.json`` (architecture, node features, classes, what trained it)
and ``model.safetensors``, the layout of the image encoders' model folders."""

from __future__ import annotations

import json
from pathlib import Path

from hscl_zoo.graphs.encoder import GraphEncoder

__all__ = ["save_graph_encoder", "load_graph_encoder"]


def save_graph_encoder(encoder: GraphEncoder, folder: str | Path) -> Path:
    """Write `encoder` into `folder` (created); returns the folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in encoder.state_dict().items()}
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(encoder.to_config(), indent=2) + "\n")
    return folder


def load_graph_encoder(folder: str | Path) -> GraphEncoder:
    """The encoder saved in `folder`, in eval mode; every weight must match the config's shapes."""
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder} lacks {name}; a graph encoder folder holds config.json and "
                                    "model.safetensors (written by save_graph_encoder).")
    config = json.loads((folder / "config.json").read_text())
    encoder = GraphEncoder.from_config(config)
    state = load_file(folder / "model.safetensors")
    if encoder.head is None and any(k.startswith("head.") for k in state):
        raise ValueError(f"{folder}: weights hold a linear head but config.json names no classes.")
    encoder.load_state_dict(state, strict=True)
    return encoder.eval()
