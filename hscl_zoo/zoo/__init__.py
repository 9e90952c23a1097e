"""The zoo: names of trained encoders, their Hub files and their model cards.

    registry   ZooEntry per name (method, dataset, backbone, Hub repo, pin, metrics), register_model
    hub        load: a zoo name, a Hub repo or a folder -> a ContrastiveEncoder, checksums checked
    saving     save_pretrained / push_to_hub: model.safetensors + config.json in the Hub's layout
    cards      the model card template, and the checked-in cards under model_cards/
               (run as ``python -m hscl_zoo.zoo.cards``, so not imported here)
"""

from hscl_zoo.zoo.registry import ZooEntry, info, list_models, register_model
from hscl_zoo.zoo.hub import load
from hscl_zoo.zoo.saving import push_to_hub, save_pretrained

__all__ = ["ZooEntry", "info", "list_models", "load", "push_to_hub", "register_model", "save_pretrained"]
