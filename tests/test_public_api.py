"""The public API does not change by accident: the names `import hscl_zoo` gives, the recipe's config
keys, and the files a saved model and a run's training summary consist of.

Changing any of these is a decision: update the expected values here together with README and
docs/architecture.md. (A run directory's own files, metrics.jsonl included, are pinned by
tests/test_extending.py, which trains one epoch.)
"""

from __future__ import annotations

import ast
import json
import types
from pathlib import Path

import hscl_zoo
from hscl_zoo.publishing.hub_folder import training_summary
from hscl_zoo.training.config import PretrainConfig

ROOT = Path(__file__).resolve().parents[1]

PUBLIC_NAMES = {
    # losses, the method table, diagnostics
    "LOSS_NAMES", "METHODS", "MethodSpec", "ContrastiveLoss", "build_loss", "register_method",
    "assumption_fraction", "lemma_losses", "DiagnosticsMeter", "MetricLearningLoss", "NTXentLoss", "SupConLoss",
    # models and the zoo
    "ContrastiveEncoder", "create_model", "ZooEntry", "info", "list_models", "load", "push_to_hub",
    "save_pretrained",
    # data and evaluation
    "DATASETS", "DatasetSpec", "register_dataset", "LoadedData", "load_split", "load_splits",
    "MultiViewDataset", "eval_transform", "make_loader", "simclr_transform",
    "ProbeResult", "evaluate_encoder", "extract_features", "knn_top1", "linear_probe",
    # training with more negatives than memory
    "BATCHNORM_MODES", "gradient_cache_backward", "prepare_batchnorm",
}

CONFIG_KEYS = [
    "dataset", "data_dir", "subset", "full_test", "views", "label_positive_pairing", "labelled_fraction",
    "train_on_unlabelled",
    "image_column", "label_column", "train_split", "test_split", "test_fraction", "skip_unreadable", "mean", "std",
    "streaming", "stream_buffer_size", "stream_epoch_examples", "stream_eval_examples",
    "backbone", "stem", "image_size",
    "method", "temperature", "beta", "threshold_start", "threshold_end", "tau_plus", "positives", "M",
    "unlabelled_negatives", "queue_size", "queue_positives", "queue_start_epoch",
    "epochs", "batch_size", "chunk_size", "optimizer", "lr", "weight_decay", "mixed_precision", "seed", "num_workers",
    "channels_last", "fused_optimizer", "gpu_augment", "cache_images", "device_data", "compile", "compile_mode",
    "sync_batchnorm", "memory_check", "dist_timeout", "monitor_every", "checkpoint_every",
    "knn_k", "monitor_train_size", "monitor_test_size", "diagnostics", "diagnostics_every", "probe_epochs", "log_with",
    "verbose", "output_dir", "keep_checkpoints",
]


def test_package_names():
    public = {n for n in dir(hscl_zoo) if not n.startswith("_") and not isinstance(getattr(hscl_zoo, n), types.ModuleType)}
    assert public == PUBLIC_NAMES
    assert hscl_zoo.LOSS_NAMES == ("ucl", "hucl", "scl", "hscl-beta", "hscl-tau")
    assert list(hscl_zoo.METHODS)[:5] == list(hscl_zoo.LOSS_NAMES)
    assert {"digits", "cifar10", "cifar100", "stl10", "tinyimagenet"} <= set(hscl_zoo.DATASETS)
    assert hscl_zoo.__version__ == "0.1.0"


def test_package_modules_do_not_import_the_package_root():
    """Only hscl_zoo/__init__.py re-exports; every other module imports the module it needs."""
    offenders = []
    for path in sorted((ROOT / "hscl_zoo").rglob("*.py")):
        if path.name == "__init__.py" and path.parent.name == "hscl_zoo":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "hscl_zoo":
                offenders.append(f"{path.relative_to(ROOT)}: from hscl_zoo import ...")
            if isinstance(node, ast.Import) and any(alias.name == "hscl_zoo" for alias in node.names):
                offenders.append(f"{path.relative_to(ROOT)}: import hscl_zoo")
    assert offenders == []


def test_recipes_and_benchmarks_do_not_edit_sys_path():
    scripts = [*(ROOT / "recipes").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    edits = [p.name for p in scripts if "sys.path" in p.read_text()]
    assert edits == []


def test_recipe_config_keys():
    assert PretrainConfig.field_names() == CONFIG_KEYS
    assert list(json.loads(PretrainConfig().to_json())) == sorted(CONFIG_KEYS)


def test_saved_model_files_and_config_keys(tmp_path):
    model = hscl_zoo.create_model("resnet10t", num_classes=3, image_size=16, class_names=["a", "b", "c"])
    cfg = PretrainConfig()
    training = training_summary(cfg, num_processes=1, num_classes=3, config_path=None)
    folder = hscl_zoo.save_pretrained(model, tmp_path / "model", training=training)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert list(config) == ["library_name", "architecture", "num_classes", "num_features", "label_names",
                            "pretrained_cfg", "model_args", "torch_dtype", "training"]
    assert set(config["pretrained_cfg"]) == {"input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode",
                                             "num_classes"}
    assert set(config["model_args"]) == {"image_size", "small_stem", "proj_hidden_dim", "proj_dim"}
    assert list(config["training"]) == [
        "dataset", "method", "hyperparameters", "epochs", "global_batch_size", "expected_negatives_per_anchor", "views",
        "label_positive_pairing", "subset", "optimizer", "mixed_precision", "num_processes", "seed", "stem",
        "recipe", "config", "recipe_config",
    ]
    assert config["training"]["hyperparameters"] == {"temperature": 0.5, "positives": "labels", "beta": 1.0,
                                                     "M": "global embeddings - 2"}
    assert config["training"]["recipe"] == "recipes/pretrain.py"
    assert config["training"]["expected_negatives_per_anchor"] == round(256 * 2 * 2 / 3)


def test_each_methods_reported_hyperparameters():
    reported = {m: list(PretrainConfig(method=m).method_hyperparameters()) for m in hscl_zoo.LOSS_NAMES}
    assert reported == {
        "ucl": ["temperature", "positives", "M"],
        "hucl": ["temperature", "positives", "beta", "tau_plus", "M"],
        "scl": ["temperature", "positives", "M"],
        "hscl-beta": ["temperature", "positives", "beta", "M"],
        "hscl-tau": ["temperature", "positives", "threshold_start", "threshold_end", "M"],
    }
