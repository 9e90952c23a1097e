"""The zoo: names of trained encoders, their Hub files and their model cards.

    registry   ZooEntry per name (method, dataset, backbone, Hub repo, pin, metrics), register_model
    hub        load: a zoo name, a Hub repo or a folder -> a ContrastiveEncoder, checksums checked
    saving     save_pretrained / push_to_hub: model.safetensors + config.json in the Hub's layout
    cards      the model card of an image model, from one template (the checked-in cards under
               model_cards/ are written by ``python -m hscl_zoo.publishing.cards``)

Names are imported on first use: the registry is read without loading torch.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from hscl_zoo._lazy import lazy_exports as _lazy_exports

_EXPORTS = {
    **dict.fromkeys(("ZooEntry", "info", "list_models", "register_model"), "hscl_zoo.zoo.registry"),
    "load": "hscl_zoo.zoo.hub",
    **dict.fromkeys(("push_to_hub", "save_pretrained"), "hscl_zoo.zoo.saving"),
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)

if _TYPE_CHECKING:
    from hscl_zoo.zoo.hub import load
    from hscl_zoo.zoo.registry import ZooEntry, info, list_models, register_model
    from hscl_zoo.zoo.saving import push_to_hub, save_pretrained
