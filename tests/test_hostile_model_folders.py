"""Hostile model folders (issue 27): a folder is data, not code. Every config.json below is refused
with one line naming the file, the key and the fix, before anything is built; none of them makes
``load`` touch the network (a real HTTP server on 127.0.0.1 records requests) or a file outside
the folder (the kernel's inotify reports every open of a sentinel file)."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants

from hscl_zoo.models import create_model
from hscl_zoo.zoo import schema
from hscl_zoo.zoo.hub import ConfigMismatchError, load
from hscl_zoo.zoo.saving import save_pretrained

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="inotify and /proc/self are Linux's")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_model("resnet10t", num_classes=3, image_size=32, class_names=["cat", "dog", "eel"]).eval()


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory) -> Path:
    return save_pretrained(model, tmp_path_factory.mktemp("saved") / "tiny")


def hostile(saved: Path, where: Path, edit=None, text: str | None = None) -> Path:
    """A copy of the saved folder at ``where`` whose config.json is ``edit``ed (or replaced by ``text``)."""
    shutil.copytree(saved, where)
    if text is None:
        config = json.loads((saved / "config.json").read_text())
        edit(config)
        text = json.dumps(config, allow_nan=True)
    (where / "config.json").write_text(text)
    return where


def set_(key: str, value):
    """An edit setting a dotted key of the config."""
    *parents, last = key.split(".")

    def edit(config: dict) -> None:
        for part in parents:
            config = config[part]
        config[last] = value
    return edit


def edits(*steps):
    def edit(config: dict) -> None:
        for step in steps:
            step(config)
    return edit


def drop(key: str):
    def edit(config: dict) -> None:
        config.pop(key)
    return edit


def attempt(folder: Path) -> Exception | None:
    """What loading the folder raised (None if it loaded), to look at the side effects first."""
    try:
        load(folder)
    except Exception as err:  # noqa: BLE001 - any outcome is inspected by the caller
        return err
    return None


def one_line(error: Exception | None, folder: Path, key: str, fix: str) -> None:
    """The error is a one-line ValueError naming the folder's config.json, ``key`` and ``fix``."""
    assert isinstance(error, ValueError), f"expected a ValueError, got {error!r}"
    message = str(error)
    assert "\n" not in message, message
    assert message.startswith(f"{folder / 'config.json'}: "), message
    assert key in message and fix in message, message


def refused(folder: Path, key: str, fix: str) -> None:
    one_line(attempt(folder), folder, key, fix)


def size(n: int):
    return edits(set_("model_args.image_size", n), set_("pretrained_cfg.input_size", [3, n, n]))


HOSTILE = {
    "timm-downloads-weights": (set_("model_args.pretrained", True), "model_args.pretrained", "remove it"),
    "timm-overlay": (set_("model_args.pretrained_cfg_overlay", {"url": "http://127.0.0.1:9/w.pth"}),
                     "model_args.pretrained_cfg_overlay", "remove it"),
    "timm-checkpoint": (set_("model_args.checkpoint_path", "/etc/hostname"), "model_args.checkpoint_path", "remove it"),
    "timm-pretrained-cfg": (set_("model_args.pretrained_cfg", {"file": "/etc/hostname"}),
                            "model_args.pretrained_cfg", "remove it"),
    "other-timm-kwarg": (set_("model_args.in_chans", 1), "model_args.in_chans", "may hold only image_size"),
    "url-in-pretrained-cfg": (set_("pretrained_cfg.url", "http://127.0.0.1:9/w.pth"), "pretrained_cfg.url", "remove it"),
    "billion-classes": (edits(set_("num_classes", 10**9), drop("label_names")), "num_classes", "between 1 and 200000"),
    "billion-proj-dim": (set_("model_args.proj_dim", 10**9), "model_args.proj_dim", "between 1 and 16384"),
    "billion-proj-hidden": (set_("model_args.proj_hidden_dim", 10**9), "model_args.proj_hidden_dim", "between 1 and 16384"),
    "huge-images": (size(10**5), "model_args.image_size", "between 1 and 2048"),
    "nan-std": (set_("pretrained_cfg.std", [float("nan"), 1.0, 1.0]), "pretrained_cfg.std", "finite numbers, got NaN"),
    "infinite-mean": (set_("pretrained_cfg.mean", [float("inf"), 0.0, 0.0]), "pretrained_cfg.mean", "finite"),
    "zero-std": (set_("pretrained_cfg.std", [0.5, 0.0, 0.5]), "pretrained_cfg.std", "positive per channel, got 0.0"),
    "bool-in-mean": (set_("pretrained_cfg.mean", [True, 0.5, 0.5]), "pretrained_cfg.mean", "got true"),
    "bool-crop": (set_("pretrained_cfg.crop_pct", True), "pretrained_cfg.crop_pct", "must be a finite number, got true"),
    "float-classes": (set_("num_classes", 3.0), "num_classes", "must be an integer, got 3.0"),
    "bool-classes": (edits(set_("num_classes", True), drop("label_names")), "num_classes", "must be an integer, got true"),
    "numeric-labels": (set_("label_names", [1, 2, 3]), "label_names", "list of strings"),
    "training-not-object": (set_("training", "x"), "training", "give the training summary as an object"),
    "args-not-object": (set_("model_args", []), "model_args", "must be a JSON object"),
    "hub-architecture": (set_("architecture", "hf-hub:timm/resnet18"), "architecture", "timm model name"),
    "img-size-disagrees": (set_("model_args.img_size", 64), "model_args.img_size", "remove it"),
    "tiny-patches": (edits(size(2048), set_("model_args.patch_size", 16)), "model_args.patch_size",
                     "use patch_size >= 32"),
    "nan-drop-path": (set_("model_args.drop_path_rate", float("nan")), "model_args.drop_path_rate", "finite"),
    "drop-everything": (set_("model_args.drop_rate", 1.0), "model_args.drop_rate", "[0.0, 1.0)"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_config_is_one_line_naming_file_key_and_fix(saved, tmp_path, name):
    edit, key, fix = HOSTILE[name]
    refused(hostile(saved, tmp_path / name, edit), key, fix)


def test_deep_nesting_is_refused_before_json_recurses(saved, tmp_path):
    text = (saved / "config.json").read_text().replace("{", '{"deep": ' + "[" * 100_000 + "]" * 100_000 + ",", 1)
    refused(hostile(saved, tmp_path / "deep", text=text), "nests deeper than 32 levels", "re-save")
    ok = (saved / "config.json").read_text().replace("{", '{"deep": ' + "[" * 31 + "]" * 31 + ",", 1)
    load(hostile(saved, tmp_path / "deep-ok", text=ok))


def test_oversized_config_is_refused_unread(saved, tmp_path):
    padded = (saved / "config.json").read_text().replace("{", '{"padding": "' + "x" * schema.MAX_CONFIG_BYTES + '",', 1)
    refused(hostile(saved, tmp_path / "padded", text=padded), "larger than 16 MiB", "re-save")


def test_bounds_admit_every_real_use(model):
    """The largest real values fit (Bamboo's 115,217 classes, a Barlow Twins 8,192-wide projector,
    Sapiens' 1,024-px input in 16-px patches), and so do the documented bounds themselves."""
    config = json.loads(json.dumps(model.model_config()))
    config.pop("label_names")
    config["training"] = None
    for classes, width, image, patch in ((115_217, 8_192, 1_024, 16), (200_000, 16_384, 2_048, 32)):
        config["num_classes"] = classes
        config["pretrained_cfg"].update(input_size=[3, image, image], crop_pct=1e-3)
        config["model_args"].update(image_size=image, img_size=image, patch_size=patch, proj_dim=width,
                                    proj_hidden_dim=width, drop_rate=0.0, drop_path_rate=0.99, small_stem=None)
        assert schema.check_config(config) is config


def test_save_refuses_a_model_its_folder_could_not_load(tmp_path):
    pooled = create_model("resnet10t", num_classes=3, image_size=32, global_pool="max")
    with pytest.raises(ValueError, match=r"^the config.json to save: model_args.global_pool is not a key"):
        save_pretrained(pooled, tmp_path / "pooled")
    assert not list(tmp_path.iterdir()), "nothing is written"


# ---- nothing outside the folder ------------------------------------------------------------


class RecordingServer:
    """A real HTTP server on 127.0.0.1 that records each request's path and answers 404. It stops
    by itself after ``lifetime`` seconds and records at most 100 requests."""

    def __init__(self, lifetime: float = 60.0) -> None:
        self.requests: list[str] = []
        requests = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if len(requests) < 100:
                    requests.append(self.path)
                self.send_error(404)

            do_HEAD = do_GET

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.deadline = threading.Timer(lifetime, self.server.shutdown)

    def __enter__(self) -> RecordingServer:
        self.thread.start()
        self.deadline.start()
        return self

    def __exit__(self, *exc) -> None:
        self.deadline.cancel()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class FileWatch:
    """The kernel's inotify on one file: whether anything opened or read it since the watch began."""

    IN_ACCESS, IN_OPEN, IN_NONBLOCK = 0x1, 0x20, 0o4000

    def __init__(self, path: Path) -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        self.fd = libc.inotify_init1(self.IN_NONBLOCK)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, os.fsencode(path), self.IN_OPEN | self.IN_ACCESS) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {path}")

    def touched(self) -> bool:
        try:
            return len(os.read(self.fd, 4096)) > 0
        except BlockingIOError:
            return False

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))


def test_pretrained_weights_from_a_url_are_refused_before_any_request(saved, tmp_path, offline):
    with RecordingServer() as server:
        overlay = {"url": f"{server.url}/weights.pth", "hf_hub_id": None}
        folder = hostile(saved, tmp_path / "url", edits(set_("model_args.pretrained", True),
                                                          set_("model_args.pretrained_cfg_overlay", overlay)))
        error = attempt(folder)
        assert server.requests == [], "load sent a request"
        one_line(error, folder, "model_args.pretrained", "remove it")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with pytest.raises(urllib.error.HTTPError):
            opener.open(f"{server.url}/alive", timeout=10)
        assert server.requests == ["/alive"], "the server records what reaches it"


def test_pretrained_weights_from_a_local_file_are_refused_before_it_is_opened(saved, tmp_path, offline):
    sentinel = tmp_path / "outside" / "secret.pth"
    sentinel.parent.mkdir()
    torch.save({"secret": torch.zeros(1)}, sentinel)
    folder = hostile(saved, tmp_path / "file", edits(set_("model_args.pretrained", True),
                                                       set_("model_args.pretrained_cfg_overlay", {"file": str(sentinel)})))
    watch = FileWatch(sentinel)
    try:
        error = attempt(folder)
        assert not watch.touched(), f"load opened {sentinel}"
        one_line(error, folder, "model_args.pretrained", "remove it")
        sentinel.read_bytes()
        assert watch.touched(), "the watch sees an open"
    finally:
        watch.close()


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_files_linked_from_outside_the_folder_are_refused_unread(saved, tmp_path, name):
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    shutil.copy(saved / name, outside)
    folder = tmp_path / "linked"
    shutil.copytree(saved, folder)
    (folder / name).unlink()
    (folder / name).symlink_to(Path("..", "elsewhere", name))
    watch = FileWatch(outside)
    try:
        error = attempt(folder)
        assert not watch.touched(), f"load read {outside}"
    finally:
        watch.close()
    assert isinstance(error, ValueError), f"expected a ValueError, got {error!r}"
    message = str(error)
    assert "\n" not in message
    assert message.startswith(f"{folder / name} links to {outside.resolve()}, outside the model folder"), message
    assert "copy the file in (cp -L)" in message


def test_links_inside_the_folder_load(saved, model, tmp_path):
    folder = tmp_path / "versions"
    shutil.copytree(saved, folder)
    (folder / "v1").mkdir()
    (folder / "model.safetensors").rename(folder / "v1" / "model.safetensors")
    (folder / "model.safetensors").symlink_to(Path("v1", "model.safetensors"))
    batch = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(load(folder)(batch), model(batch))


# ---- memory follows the weights file -------------------------------------------------------


def _peak_rss_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024


def test_a_large_architecture_over_a_small_file_allocates_nothing(saved, tmp_path):
    """ViT-Large (304M parameters, 1.2 GB) named over the tiny ResNet's 20 MB file: the meta-device
    skeleton is compared with the safetensors header, so the error comes before any allocation."""
    folder = hostile(saved, tmp_path / "large", edits(set_("architecture", "vit_large_patch16_224"),
                                                      set_("model_args.small_stem", False), size(224)))
    Path("/proc/self/clear_refs").write_text("5")  # resets the peak resident set (VmHWM) to now
    before = _peak_rss_bytes()
    with pytest.raises(ConfigMismatchError, match="does not match the vit_large_patch16_224 encoder"):
        load(folder)
    assert _peak_rss_bytes() - before < 300 * 2**20, "the file holds 20 MB; the peak may not rise by 300 MB"
