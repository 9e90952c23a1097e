"""The finer contract of :mod:`hscl_zoo.zoo.hub` (issue 25): which HF_HUB_OFFLINE values switch
offline mode on, what each error message tells the user to do, how key mismatches are listed,
which revision a source resolves to, and that ``device`` is honoured. Every expectation below is
derived by hand from the documented behaviour, on real files and a real Hub cache in tmp_path."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants
from safetensors.torch import save_file

from hscl_zoo._version import __version__
from hscl_zoo.models import ContrastiveEncoder, create_model
from hscl_zoo.zoo import hub, sources
from hscl_zoo.zoo.hub import ConfigMismatchError, ModelSource, NotCachedError, check_weights, load, load_weights, parse_source
from hscl_zoo.zoo.registry import info
from hscl_zoo.zoo.releases import pin_folder
from hscl_zoo.zoo.saving import save_pretrained
from helpers import make_hub_cache

REPO = "hscl-test/contract-net"
MAIN_COMMIT = "1111111111111111111111111111111111111111"
OTHER_COMMIT = "2222222222222222222222222222222222222222"


@pytest.fixture(scope="module")
def model() -> ContrastiveEncoder:
    torch.manual_seed(0)
    return create_model("resnet10t", num_classes=3, image_size=32).eval()


@pytest.fixture(scope="module")
def saved(model: ContrastiveEncoder, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_pretrained(model, tmp_path_factory.mktemp("contract") / "tiny")


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline mode off, whatever the surrounding shell says."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline mode on, through the variable and huggingface_hub's own constant alike."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


class FakeHub:
    """A real HTTP server on 127.0.0.1 answering the Hub's resolve URLs for the files ``publish``ed to
    it, with the headers huggingface_hub reads (commit, etag, size), and the Hub's "entry not found"
    404 for the files ``absent`` names. Anything else gets a page without them, as from a firewall or
    captive portal. Records each request's method, path and User-Agent."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[str, bytes]] = {}
        self.absent: set[str] = set()
        self.requests: list[tuple[str, str, str]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: bool) -> None:
                if len(hub.requests) < 100:
                    hub.requests.append((self.command, self.path, self.headers.get("User-Agent", "")))
                if self.path in hub.absent:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                commit, data = hub.files.get(self.path, (None, b"<html>portal</html>"))
                self.send_response(200)
                if commit is not None:
                    self.send_header("X-Repo-Commit", commit)
                    self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer(body=True)

            def do_HEAD(self) -> None:
                self._answer(body=False)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def publish(self, repo_id: str, commit: str, folder: Path) -> None:
        """Serve ``folder``'s files as ``repo_id`` at ``commit``, under the commit and under main."""
        for path in folder.iterdir():
            for revision in (commit, "main"):
                self.files[f"/{repo_id}/resolve/{revision}/{path.name}"] = (commit, path.read_bytes())


@pytest.fixture
def hub_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """A FakeHub that huggingface_hub takes for the Hub."""
    fake = FakeHub()
    monkeypatch.setattr(constants, "ENDPOINT", fake.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", fake.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    fake.thread.start()
    try:
        yield fake
    finally:
        fake.server.shutdown()
        fake.server.server_close()
        fake.thread.join(timeout=5)


def _weights(model: ContrastiveEncoder, path: Path, drop: tuple[str, ...] = (), extra: dict | None = None,
             reshape: tuple[str, ...] = ()) -> Path:
    """A safetensors file of ``model``'s state without ``drop``, with ``extra`` and with ``reshape``d keys."""
    state = {k: v.clone() for k, v in model.state_dict().items() if k not in drop}
    for key in reshape:
        state[key] = torch.zeros(*state[key].shape, 2)
    state.update(extra or {})
    save_file(state, path)
    return path


# --- HF_HUB_OFFLINE -------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["1", "on", "ON", "yes", "Yes", "true", "TRUE", " true "])
def test_offline_values_switch_offline_mode_on(monkeypatch: pytest.MonkeyPatch, online: None, value: str) -> None:
    """huggingface_hub's truthy spellings, in any case and with spaces around, mean offline."""
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert sources._env_offline() is True


@pytest.mark.parametrize("value", [None, "", "0", "off", "no", "false", "2"])
def test_other_offline_values_leave_it_off(monkeypatch: pytest.MonkeyPatch, online: None, value: str | None) -> None:
    """Unset, empty and the falsy spellings keep the network reachable."""
    if value is not None:
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
    monkeypatch.setenv("hf_hub_offline", "1")
    assert sources._env_offline() is False


def test_huggingface_hubs_own_offline_flag_is_obeyed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offline mode set through huggingface_hub (its constant, read at its import) counts too."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert sources._env_offline() is True


def test_env_offline_message_names_the_repo_main_revision_and_a_local_copy(offline: None, tmp_path: Path) -> None:
    """No revision means the Hub's main; the suggested download lands in ./<repo name>, not ./<owner>."""
    with pytest.raises(NotCachedError) as err:
        load("hf-hub:some-owner/absent-net", cache_dir=tmp_path)
    message = str(err.value)
    assert message.startswith("Cannot load model.safetensors of some-owner/absent-net@main: offline mode is on "
                              "(HF_HUB_OFFLINE=1 or local_files_only=True) and it is not in the Hub cache at ")
    assert "hf download some-owner/absent-net --revision main --local-dir ./absent-net\n" in message
    assert message.endswith("copy that folder here and load it with hscl_zoo.load('local-dir:./absent-net').")


def test_not_cached_message_names_the_default_cache(offline: None, monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    """Without cache_dir the message points at the cache huggingface_hub uses (HF_HUB_CACHE)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(NotCachedError) as err:
        load("hf-hub:some-owner/absent-net@v2")
    assert f"not in the Hub cache at {tmp_path / 'hub' / 'models--some-owner--absent-net'}." in str(err.value)


def test_an_endpoint_that_is_not_the_hub_is_not_called_offline_mode(online: None, hub_server: FakeHub,
                                                                       tmp_path: Path) -> None:
    """Online, when what answers is not the Hub (a firewall, a portal), the message says the Hub could
    not be reached, and does not blame offline mode."""
    with pytest.raises(NotCachedError) as err:
        load("hf-hub:some-owner/absent-net", cache_dir=tmp_path)
    message = str(err.value)
    assert "some-owner/absent-net@main: the Hub could not be reached and it is not in the Hub cache" in message
    assert "offline mode" not in message
    assert hub_server.requests, "the load went online"


def test_online_download_pins_the_revision_and_names_the_library(online: None, hub_server: FakeHub, saved: Path,
                                                                 model: ContrastiveEncoder, tmp_path: Path) -> None:
    """A download asks for the requested revision and tells the Hub which library (and version) asks."""
    hub_server.publish(REPO, OTHER_COMMIT, saved)
    loaded = load(f"hf-hub:{REPO}@{OTHER_COMMIT}", cache_dir=tmp_path)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(loaded(x), model(x))
    paths = {path for _, path, _ in hub_server.requests}
    assert paths == {f"/{REPO}/resolve/{OTHER_COMMIT}/config.json", f"/{REPO}/resolve/{OTHER_COMMIT}/model.safetensors"}
    agents = {agent for _, _, agent in hub_server.requests}
    assert agents and all(f"hscl_zoo/{__version__}" in agent for agent in agents), agents


def test_local_files_only_never_reaches_the_hub(online: None, hub_server: FakeHub, saved: Path,
                                                tmp_path: Path) -> None:
    """With local_files_only=True and HF_HUB_OFFLINE unset, a file the Hub holds is still not fetched."""
    hub_server.publish(REPO, MAIN_COMMIT, saved)
    with pytest.raises(NotCachedError, match="offline mode is on"):
        load(f"hf-hub:{REPO}", cache_dir=tmp_path, local_files_only=True)
    assert hub_server.requests == []


@pytest.mark.parametrize("revision, shown", [(None, "main"), ("v1", "v1")])
def test_a_hub_repo_without_weights_is_named_as_not_written_by_hscl_zoo(online: None, hub_server: FakeHub,
                                                                       saved: Path, tmp_path: Path,
                                                                       revision: str | None, shown: str) -> None:
    """Online, a repo whose config.json is there but neither weights file is: the Hub says both are
    absent, and the message names the repo, its revision and what wrote it."""
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(saved / "config.json", config_only)
    hub_server.publish(REPO, MAIN_COMMIT, config_only)
    hub_server.files.update({path.replace(f"/{MAIN_COMMIT}/", "/v1/"): file for path, file in hub_server.files.items()})
    hub_server.absent.update(f"/{REPO}/resolve/{rev}/{name}" for rev in ("main", "v1")
                             for name in ("model.safetensors", "model.safetensors.index.json"))
    with pytest.raises(FileNotFoundError) as err:
        load(f"hf-hub:{REPO}" + (f"@{revision}" if revision else ""), cache_dir=tmp_path / "cache")
    assert str(err.value) == (f"{REPO}@{shown} has neither model.safetensors nor model.safetensors.index.json: it is "
                              "not a repo written by hscl_zoo.push_to_hub.")


# --- revisions ------------------------------------------------------------------------------------

def test_a_pinned_revision_loads_that_snapshot_not_main(offline: None, saved: Path, model: ContrastiveEncoder,
                                                        tmp_path: Path) -> None:
    """With main pointing elsewhere, '@commit' must read that commit's files."""
    torch.manual_seed(1)
    other = save_pretrained(create_model("resnet10t", num_classes=5, image_size=32), tmp_path / "other")
    cache = tmp_path / "cache"
    make_hub_cache(cache, REPO, other, MAIN_COMMIT, ref="main")
    make_hub_cache(cache, REPO, saved, OTHER_COMMIT, ref=None)
    assert load(f"hf-hub:{REPO}", cache_dir=cache).num_classes == 5
    pinned = load(f"hf-hub:{REPO}@{OTHER_COMMIT}", cache_dir=cache)
    assert pinned.num_classes == 3
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(pinned(x), model(x))


def test_local_files_only_refuses_a_config_missing_from_the_cache(online: None, hub_server: FakeHub,
                                                                  saved: Path, tmp_path: Path) -> None:
    """local_files_only=True holds for both files: a cached weights file does not let the Hub's config be fetched."""
    hub_server.publish(REPO, MAIN_COMMIT, saved)
    weights_only = tmp_path / "weights-only"
    weights_only.mkdir()
    shutil.copy(saved / "model.safetensors", weights_only)
    cache = tmp_path / "cache"
    make_hub_cache(cache, REPO, weights_only, MAIN_COMMIT, ref="main")
    with pytest.raises(NotCachedError, match=r"^Cannot load config\.json of hscl-test/contract-net@main: offline mode"):
        load(f"hf-hub:{REPO}", cache_dir=cache, local_files_only=True)
    assert hub_server.requests == []


def test_parse_source_kinds_and_revisions(saved: Path) -> None:
    """Each spelling resolves to the documented kind, repo and revision."""
    assert parse_source("hf-hub:owner/name") == ModelSource("hf-hub", repo_id="owner/name")
    assert parse_source("hf-hub:owner/name@v1") == ModelSource("hf-hub", repo_id="owner/name", revision="v1")
    assert parse_source("hf-hub:owner/name", revision="v2") == ModelSource("hf-hub", repo_id="owner/name", revision="v2")
    assert parse_source(f"local-dir:{saved}") == ModelSource("local-dir", path=saved)
    entry = info("scl-cifar10")
    published = dataclasses.replace(entry, hub_repo=REPO, revision=MAIN_COMMIT, files={"model.safetensors": ("a" * 64, 1)})
    expected = ModelSource("zoo", repo_id=REPO, revision=MAIN_COMMIT, entry=published)
    assert parse_source(published) == expected
    assert parse_source(published, revision=MAIN_COMMIT) == expected
    with pytest.raises(ValueError, match=f"pinned to revision {MAIN_COMMIT}.*'hf-hub:{REPO}@v9'"):
        parse_source(published, revision="v9")


def test_revision_on_a_local_dir_prefix_is_an_error(saved: Path) -> None:
    """A revision cannot apply to a folder, however the folder is named."""
    with pytest.raises(ValueError, match=r"revision='main' applies to Hub repos only"):
        load(f"local-dir:{saved}", revision="main")


# --- source messages ------------------------------------------------------------------------------

@pytest.mark.parametrize("source", ["hf-hub:not a repo", "hf-hub:justaname", "hf-hub:owner/bad name",
                                    "hf-hub:owner/name.git", "hf-hub:a/b/c"])
def test_bad_hub_sources_quote_the_source_and_the_form(source: str) -> None:
    """No slash, too many, or characters the Hub refuses: each is caught before any download."""
    with pytest.raises(ValueError) as err:
        parse_source(source)
    message = str(err.value)
    assert message.startswith(f"{source!r} does not name a Hub repo")
    assert "'hf-hub:owner/name[@revision]'" in message


def test_missing_local_dir_says_what_the_folder_must_hold() -> None:
    """A missing local-dir: (an unknown ~user included) is a missing folder, and the message says what it must hold."""
    for source in ("local-dir:/no/such/folder", "local-dir:~no-such-user/net"):
        with pytest.raises(FileNotFoundError) as err:
            parse_source(source)
        assert str(err.value).endswith("written by hscl_zoo.save_pretrained (config.json + model.safetensors).")


@pytest.mark.parametrize("source", ["no/such/dir", "./missing", ".missing", "~/missing-folder", "~no-such-user/net", "/missing"])
def test_path_like_sources_are_missing_directories(source: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A source that looks like a path (leading '.', '~' or '/', or two slashes) is a missing folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError) as err:
        parse_source(source)
    message = str(err.value)
    assert message.startswith(f"{source!r} is neither a zoo name nor an existing directory (")
    assert message.endswith("does not exist). Check the path, or use 'hf-hub:owner/name' for a Hub repo.")


def test_one_slash_names_are_pointed_to_both_prefixes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """'owner/net' may mean a repo or a folder; the message offers both spellings."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"write 'hf-hub:owner/net'; for a folder, 'local-dir:owner/net'"):
        parse_source("owner/net")


# --- local folders --------------------------------------------------------------------------------

def test_folder_without_anything_gets_no_pickle_hint(tmp_path: Path) -> None:
    """An empty folder is told what it lacks, with no hint about pickles it does not hold."""
    with pytest.raises(FileNotFoundError) as err:
        load(tmp_path)
    assert str(err.value) == (f"{tmp_path} lacks config.json and model.safetensors: it is not a folder written by "
                              "hscl_zoo.save_pretrained(model, directory).")


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "checkpoint.pth"])
def test_pickled_checkpoints_get_the_resave_hint(tmp_path: Path, saved: Path, name: str) -> None:
    """Every usual pickle suffix beside a missing model.safetensors gets the re-save hint."""
    shutil.copy(saved / "config.json", tmp_path)
    (tmp_path / name).write_bytes(b"pickle")
    with pytest.raises(FileNotFoundError) as err:
        load(tmp_path)
    assert str(err.value).endswith("lacks model.safetensors: it is not a folder written by hscl_zoo.save_pretrained("
                                   "model, directory). Pickled checkpoints are not loaded; re-save the model with "
                                   "hscl_zoo.save_pretrained.")


def test_missing_config_beside_a_pickle_gets_no_pickle_hint(tmp_path: Path, saved: Path) -> None:
    """The pickle hint is about the weights; a folder that has model.safetensors does not get it."""
    shutil.copy(saved / "model.safetensors", tmp_path)
    (tmp_path / "old.pt").write_bytes(b"pickle")
    with pytest.raises(FileNotFoundError) as err:
        load(tmp_path)
    assert str(err.value).endswith("lacks config.json: it is not a folder written by hscl_zoo.save_pretrained("
                                   "model, directory).")


def test_linked_file_message_says_copy_it_in(tmp_path: Path, saved: Path) -> None:
    """A file linked from outside the folder is refused with the fix spelled out."""
    folder = tmp_path / "linked"
    folder.mkdir()
    shutil.copy(saved / "config.json", folder)
    (folder / "model.safetensors").symlink_to(saved / "model.safetensors")
    with pytest.raises(ValueError) as err:
        load(folder)
    assert str(err.value).endswith("must lie inside it: copy the file in (cp -L) instead of linking to it.")


def test_unreadable_weights_say_resave(tmp_path: Path, saved: Path) -> None:
    """A model.safetensors that is not one names the file, the reason and the fix."""
    shutil.copy(saved / "config.json", tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError) as err:
        load(tmp_path)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'model.safetensors'} is not a readable safetensors file (")
    assert message.endswith("); re-save it with hscl_zoo.save_pretrained.")


def test_unbuildable_config_names_its_file(tmp_path: Path, saved: Path) -> None:
    """A config that passes the schema but names no timm model is reported against its file."""
    shutil.copy(saved / "model.safetensors", tmp_path)
    config = json.loads((saved / "config.json").read_text())
    config["architecture"] = "not_a_timm_model"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as err:
        load(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'config.json'}: Unknown timm backbone 'not_a_timm_model'")


def test_sha256_message_says_how_to_recover(offline: None, saved: Path, tmp_path: Path) -> None:
    """A pinned checksum that differs names both digests, the entry and how to recover."""
    entry = info("scl-cifar10")
    pinned = dataclasses.replace(entry, hub_repo=REPO, revision=MAIN_COMMIT,
                                 files={**pin_folder(saved), "model.safetensors": ("0" * 64, 1)})
    make_hub_cache(tmp_path, REPO, saved, MAIN_COMMIT, ref="main")
    with pytest.raises(hub.ChecksumMismatchError) as err:
        load(pinned, cache_dir=tmp_path)
    actual = hashlib.sha256((saved / "model.safetensors").read_bytes()).hexdigest()
    message = str(err.value)
    assert f"its sha256 is {actual}, but the registry entry scl-cifar10 ({REPO}@{MAIN_COMMIT}) pins {'0' * 64}" in message
    assert message.endswith("The cached file is corrupt or was replaced; delete it (and the blob it links to) and "
                            "load again with network access.")


# --- key mismatches -------------------------------------------------------------------------------

def test_only_missing_keys_are_listed_alone(model: ContrastiveEncoder, tmp_path: Path) -> None:
    """Only the categories that occur are listed; without config_path the message names config.json."""
    path = _weights(model, tmp_path / "w.safetensors", drop=("classifier.weight", "classifier.bias"))
    with pytest.raises(ConfigMismatchError) as err:
        check_weights(model, path)
    assert str(err.value) == (f"{path} does not match the resnet10t encoder described by config.json (missing keys: "
                              "classifier.bias, classifier.weight). Save the weights and the config from the same "
                              "model with hscl_zoo.save_pretrained(model, directory).")


def test_only_unexpected_keys_are_listed_alone(model: ContrastiveEncoder, tmp_path: Path) -> None:
    """Unexpected keys alone, sorted, against the config the caller named."""
    path = _weights(model, tmp_path / "w.safetensors", extra={"z.b": torch.zeros(1), "z.a": torch.zeros(1)})
    with pytest.raises(ConfigMismatchError) as err:
        check_weights(model, path, config_path="/models/net/config.json")
    assert "described by /models/net/config.json (unexpected keys: z.a, z.b). Save the weights" in str(err.value)


def test_only_shape_mismatches_are_listed_alone(model: ContrastiveEncoder, tmp_path: Path) -> None:
    """A mis-shaped key alone gives both shapes."""
    path = _weights(model, tmp_path / "w.safetensors", reshape=("classifier.bias",))
    with pytest.raises(ConfigMismatchError) as err:
        check_weights(model, path)
    assert "(shape mismatches: classifier.bias: file (3, 2) vs model (3,)). Save" in str(err.value)


def test_missing_and_unexpected_are_separated_by_semicolons(model: ContrastiveEncoder, tmp_path: Path) -> None:
    """Two categories are joined by '; ', and unexpected keys that all carry a wrapper prefix get the hint."""
    path = _weights(model, tmp_path / "w.safetensors", drop=("classifier.bias",), extra={"module.x": torch.zeros(1)})
    with pytest.raises(ConfigMismatchError) as err:
        check_weights(model, path)
    message = str(err.value)
    assert "(missing keys: classifier.bias; unexpected keys: module.x). The file was saved from a wrapped model " \
           "(DDP 'module.' or torch.compile '_orig_mod.'); Save" in message


def test_missing_keys_alone_get_no_wrapper_hint(model: ContrastiveEncoder, tmp_path: Path) -> None:
    """The wrapper hint needs unexpected keys; missing keys alone do not trigger it."""
    path = _weights(model, tmp_path / "w.safetensors", drop=("classifier.bias",))
    with pytest.raises(ConfigMismatchError) as err:
        check_weights(model, path)
    assert "wrapped" not in str(err.value)


@pytest.mark.parametrize("count", [7, 8, 9, 10])
def test_long_key_lists_show_eight_and_the_total(model: ContrastiveEncoder, tmp_path: Path, count: int) -> None:
    """At most eight keys are named; past eight the total is given."""
    keys = sorted(model.state_dict())[:count]
    path = _weights(model, tmp_path / "w.safetensors", drop=tuple(keys))
    with pytest.raises(ConfigMismatchError) as err:
        check_weights(model, path)
    shown = ", ".join(keys[:8])
    tail = f", ... ({count} in all)" if count > 8 else ""
    assert f"(missing keys: {shown}{tail}). Save" in str(err.value)


def test_load_weights_names_the_config_it_was_given(model: ContrastiveEncoder, tmp_path: Path) -> None:
    """load_weights refuses a mismatched file naming the caller's config, not a default."""
    path = _weights(model, tmp_path / "w.safetensors", drop=("classifier.bias",))
    with pytest.raises(ConfigMismatchError, match="described by /models/net/config.json "):
        load_weights(model, path, config_path="/models/net/config.json")


def test_load_names_the_folders_config(saved: Path, model: ContrastiveEncoder, tmp_path: Path) -> None:
    """load names the folder's own config.json when its weights do not match it."""
    shutil.copy(saved / "config.json", tmp_path)
    _weights(model, tmp_path / "model.safetensors", drop=("classifier.bias",))
    with pytest.raises(ConfigMismatchError) as err:
        load(tmp_path)
    assert f"described by {tmp_path / 'config.json'} (missing keys: classifier.bias)" in str(err.value)


# --- device ---------------------------------------------------------------------------------------

def test_device_argument_is_honoured(saved: Path) -> None:
    """The meta device exists on every machine, so moving there shows ``device`` is obeyed."""
    loaded = load(saved, device="meta")
    assert {p.device.type for p in loaded.parameters()} == {"meta"}
    assert {p.device.type for p in load(saved).parameters()} == {"cpu"}


@pytest.mark.parametrize("size", [0, 5, (1 << 20) * 2 + 5], ids=["empty", "one-short-block", "three-blocks"])
def test_sha256_file_hashes_every_block_and_stops_at_the_end(tmp_path, size):
    """The digest of a file read in blocks equals hashlib's of its whole bytes, and the read stops at
    the end of the file: it runs in a thread given 5 s (it needs milliseconds), so a read loop that
    never recognises the end fails here instead of hanging the suite."""
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    path = tmp_path / "blob"
    path.write_bytes(data)
    result: dict[str, str] = {}
    worker = threading.Thread(target=lambda: result.update(digest=hub.sha256_file(path)), daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), "sha256_file did not stop at the end of the file"
    assert result["digest"] == hashlib.sha256(data).hexdigest()
