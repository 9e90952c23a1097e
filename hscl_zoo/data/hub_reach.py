"""Whether a Hub dataset can be read now, and the one-line error when it cannot.

``datasets.load_dataset`` retries an unreachable Hub for tens of seconds before it gives up with
a traceback. A dataset that is neither in the local caches nor reachable is reported at once
instead: offline mode (``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE``) or a Hub endpoint that does
not answer a TCP connection within a second or two, and no cached copy. The error names the
dataset, the command that downloads it and the ``--data_dir`` to pass afterwards.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

__all__ = ["DatasetUnavailableError", "offline_mode", "hub_reachable", "hub_cached", "download_hint",
           "check_hub_dataset"]

_TRUE = {"1", "ON", "YES", "TRUE"}
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
CONNECT_TIMEOUT = 2.0
"""Seconds the endpoint may take to accept a TCP connection before it counts as unreachable."""


class DatasetUnavailableError(ValueError):
    """A Hub dataset that is neither cached nor reachable; the message says how to get it."""


def _flag(name: str) -> bool | None:
    value = os.environ.get(name)
    return None if value is None else value.strip().upper() in _TRUE


def offline_mode() -> bool:
    """Whether the Hub libraries are told to stay offline: ``HF_DATASETS_OFFLINE`` when set,
    else ``HF_HUB_OFFLINE`` (the order ``datasets`` reads them in), or ``datasets.config``'s
    flag (which ``datasets`` read from them when it was imported)."""
    from datasets import config

    datasets_flag = _flag("HF_DATASETS_OFFLINE")
    from_environment = datasets_flag if datasets_flag is not None else bool(_flag("HF_HUB_OFFLINE"))
    return from_environment or bool(config.HF_HUB_OFFLINE)


def hub_reachable(timeout: float = CONNECT_TIMEOUT) -> bool:
    """Whether the Hub endpoint (``HF_ENDPOINT``, default huggingface.co) accepts a TCP connection.
    Behind a proxy a direct connection proves nothing, so the Hub counts as reachable there."""
    if any(os.environ.get(name) for name in _PROXY_VARIABLES):
        return True
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname or "", port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _cache_roots() -> list[Path]:
    from datasets import config
    from huggingface_hub import constants

    return [Path(config.HF_DATASETS_CACHE), Path(constants.HF_HUB_CACHE)]


def hub_cached(hub_id: str) -> bool:
    """Whether either local cache (``datasets``' prepared tables or the Hub's file cache) holds
    anything of ``hub_id``; ``load_dataset`` then decides whether it is enough."""
    owner, _, name = hub_id.rpartition("/")
    names = [f"{owner}___{name}".lower(), f"datasets--{hub_id.replace('/', '--')}".lower()]
    for root in _cache_roots():
        if root.is_dir() and any(entry.name.lower() in names for entry in root.iterdir()):
            return True
    return False


def download_hint(hub_id: str, local: str) -> str:
    """The command that downloads a Hub dataset's files into ``local`` and the option that reads them."""
    return (f"download it where there is network with 'hf download {hub_id} --repo-type dataset --local-dir {local}' "
            f"and pass '--data_dir {local}' (data_dir= in Python)")


def unavailable(name: str, hub_id: str, why: str) -> DatasetUnavailableError:
    """The error for dataset ``name`` (Hub repo ``hub_id``) that cannot be read, ``why`` saying why."""
    folder = name if name.replace("-", "").isalnum() else hub_id.rpartition("/")[2]
    return DatasetUnavailableError(f"cannot read the {name} dataset ({hub_id} on the Hugging Face Hub): {why}; "
                                   f"{download_hint(hub_id, f'data/{folder}')}.")


def check_hub_dataset(name: str, hub_id: str) -> None:
    """Raise :class:`DatasetUnavailableError` at once when ``hub_id`` is in no local cache and the
    Hub is out of reach (offline mode, or no answer from its endpoint)."""
    if hub_cached(hub_id):
        return
    if offline_mode():
        raise unavailable(name, hub_id, "offline mode is on (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) and it is not "
                          "in the local cache")
    if not hub_reachable():
        raise unavailable(name, hub_id, "the Hub cannot be reached and it is not in the local cache")
