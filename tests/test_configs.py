"""The shipped recipe configs (hscl_zoo/configs/*.yaml): one per registry entry, each the paper's recipe,
read by zoo name or by path."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

import hscl_zoo
import hscl_zoo.configs
from hscl_zoo.configs import config_names
from hscl_zoo.data.catalog import DATASETS
from hscl_zoo.losses.methods import LOSS_NAMES
from hscl_zoo.training.config import PretrainConfig
from hscl_zoo.training.pretrain import parse_args

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = Path(hscl_zoo.configs.__file__).parent
CONFIG_FILES = sorted(CONFIG_DIR.glob("*.yaml"))
ENTRIES = {name: hscl_zoo.info(name) for name in hscl_zoo.list_models()
           if hscl_zoo.info(name).tag is None and hscl_zoo.info(name).modality == "image"}
"""The paper's image grid; graph entries have no recipe config (their command line says it all)."""
"""The paper's grid: every untagged entry (a tagged one is a release of its entry, with its config)."""

# the paper's grids (Sec. "Numerical results")
BETA_GRID = {0.1, 0.5, 1.0, 2.0, 5.0}
THRESHOLD_START_GRID = {-0.5, -0.3, -0.1}
THRESHOLD_END_GRID = {-0.1, 0.0, 0.1}


def _entry_for(path: Path):
    matches = [e for e in ENTRIES.values() if e.config == path.stem]
    assert len(matches) == 1, f"{path.name} is the config of {len(matches)} registry entries"
    return matches[0]


def _header(path: Path) -> str:
    """The comment block at the top of a config file, without the '#' markers."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return "\n".join(lines)


def test_one_config_per_registry_entry():
    on_disk = {p.stem for p in CONFIG_FILES}
    named = {e.config for e in ENTRIES.values()}
    assert config_names() == sorted(on_disk)
    assert len(ENTRIES) == len(LOSS_NAMES) * 4 == 20  # the paper's five methods on its four datasets
    assert on_disk - named == set(), f"config files no registry entry names: {sorted(on_disk - named)}"
    assert named - on_disk == set(), f"registry entries without a config file: {sorted(named - on_disk)}"
    for entry in ENTRIES.values():
        assert entry.train_command == f"hscl-zoo train --config {entry.name}"
    assert not (REPO / "recipes" / "configs").exists(), "one copy of the configs: the package's"


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_config_is_the_papers_recipe(path: Path):
    raw = yaml.safe_load(path.read_text())
    cfg = PretrainConfig.from_sources(path)
    entry = _entry_for(path)

    # name, registry entry and content agree
    assert path.name == f"{cfg.method}-{cfg.dataset}.yaml" == f"{entry.name}.yaml"
    assert (cfg.dataset, cfg.method) == (entry.dataset, entry.method)
    assert cfg.backbone == entry.backbone == "resnet50"
    assert cfg.output_dir == f"runs/{entry.name}"

    # the paper's training procedure, set explicitly in the file (not left to CPU defaults)
    for key, value in {"batch_size": 512, "epochs": 200, "temperature": 0.5, "optimizer": "adam", "lr": 1e-3,
                       "weight_decay": 1e-6, "views": 2, "mixed_precision": "bf16", "knn_k": 200,
                       "monitor_train_size": 10000, "num_workers": 8}.items():
        assert key in raw, f"{path.name} does not set {key}"
        assert getattr(cfg, key) == pytest.approx(value) if isinstance(value, float) else getattr(cfg, key) == value, (
            f"{path.name}: {key}={getattr(cfg, key)!r}, paper/GPU setting {value!r}")
    assert cfg.M is None and cfg.positives is None  # M = global embeddings - 2; positives by method
    assert cfg.stem == ("default" if cfg.dataset == "stl10" else "small")
    assert cfg.image_size is None

    header = _header(path)
    assert "GPU" in header and "--backbone resnet18" in header, "the header names the GPU settings and a CPU override"
    assert "Stem:" in header

    # method hyperparameters: only the method's own keys are set, and they lie in the paper's grids
    method_keys = {"beta", "tau_plus", "threshold_start", "threshold_end"}
    expected = {"ucl": set(), "scl": set(), "hscl-beta": {"beta"}, "hucl": {"beta", "tau_plus"},
                "hscl-tau": {"threshold_start", "threshold_end"}}[cfg.method]
    assert method_keys & set(raw) == expected, f"{path.name} sets {sorted(method_keys & set(raw))}, want {sorted(expected)}"
    if cfg.method in ("hscl-beta", "hucl"):
        assert cfg.beta in BETA_GRID
        assert f"beta = {cfg.beta:g}" in header, "the header states the grid point it uses"
    if cfg.method == "hucl":
        num_classes = DATASETS[cfg.dataset].num_classes
        assert cfg.tau_plus == pytest.approx(1 / num_classes), "tau_plus is the class prior 1 / num_classes"
    if cfg.method == "hscl-tau":
        assert cfg.threshold_start in THRESHOLD_START_GRID
        assert cfg.threshold_end in THRESHOLD_END_GRID
        assert cfg.threshold_start <= cfg.threshold_end, "the threshold rises during training"
        assert f"threshold_start = {cfg.threshold_start:g}" in header
        assert f"threshold_end = {cfg.threshold_end:g}" in header
    # what the run will report as its hyperparameters
    hyper = cfg.method_hyperparameters()
    assert hyper["positives"] == ("views" if cfg.method in ("ucl", "hucl") else "labels")


def test_documented_cpu_override_parses(monkeypatch, tmp_path: Path):
    """The CPU command in each file's header is accepted by the recipe's own argument parser."""
    monkeypatch.chdir(tmp_path)  # the commands run from anywhere: --config names the shipped file
    for path in CONFIG_FILES:
        header = _header(path)
        match = re.search(r"hscl-zoo train (.*?)\n(?!\s*--)", header + "\n", re.S)
        assert match, f"{path.name}: no example command in the header"
        argv = shlex.split(match.group(1).replace("\\\n", " "))
        cfg, args, overrides = parse_args(argv)
        assert args.config == path.stem
        assert (cfg.backbone, cfg.stem, cfg.epochs, cfg.batch_size) == ("resnet18", "default", 5, 128)
        assert cfg.mixed_precision == "no"  # the text 'no', not YAML's boolean false
        # everything not overridden still comes from the file
        assert (cfg.method, cfg.dataset, cfg.lr, cfg.temperature) == (
            PretrainConfig.from_sources(path).method, _entry_for(path).dataset, 1e-3, 0.5)


def test_config_by_zoo_name_is_the_shipped_file(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    by_name = PretrainConfig.from_sources("hscl-tau-stl10")
    assert by_name == PretrainConfig.from_sources(CONFIG_DIR / "hscl-tau-stl10.yaml")
    assert (by_name.method, by_name.dataset, by_name.stem) == ("hscl-tau", "stl10", "default")
    cfg, args, _ = parse_args(["--config", "hucl-cifar100", "--epochs", "3"])
    assert (cfg.method, cfg.dataset, cfg.epochs, cfg.tau_plus) == ("hucl", "cifar100", 3, pytest.approx(0.01))
    own = tmp_path / "scl-cifar10"  # a file of that name in the working directory is a path, and wins
    own.write_text("method: scl\ndataset: digits\n")
    assert PretrainConfig.from_sources("scl-cifar10").dataset == "digits"


def test_unknown_config_name_is_one_line_with_the_closest(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        PretrainConfig.from_sources("hscl-beta-cifar")
    message = str(info.value)
    assert "\n" not in message and "no shipped config 'hscl-beta-cifar' and no such file" in message
    assert "hscl-beta-cifar10" in message and "hscl-zoo list" in message


def test_unknown_key_is_refused_with_the_valid_keys(tmp_path: Path):
    bad = tmp_path / "scl-cifar10.yaml"
    bad.write_text((CONFIG_DIR / "scl-cifar10.yaml").read_text() + "learning_rate: 0.1\nbatchsize: 64\n")
    with pytest.raises(ValueError) as info:
        PretrainConfig.from_sources(bad)
    message = str(info.value)
    assert str(bad) in message
    assert "'learning_rate'" in message and "'batchsize'" in message
    assert "did you mean 'batch_size'" in message
    assert "Valid keys:" in message
    for key in PretrainConfig.field_names():
        assert key in message


def test_bad_value_and_non_mapping_are_refused(tmp_path: Path):
    wrong_type = tmp_path / "wrong.yaml"
    wrong_type.write_text("method: scl\nepochs: many\n")
    with pytest.raises(ValueError, match=r"epochs='many' must be int"):
        PretrainConfig.from_sources(wrong_type)
    unknown_method = tmp_path / "method.yaml"
    unknown_method.write_text("method: hscl-gamma\n")
    with pytest.raises(ValueError, match="hscl-gamma.*choose one of"):
        PretrainConfig.from_sources(unknown_method)
    listing = tmp_path / "list.yaml"
    listing.write_text("- method: scl\n")
    with pytest.raises(ValueError, match="mapping"):
        PretrainConfig.from_sources(listing)
