"""The pretraining recipe's configuration: defaults, YAML files, command-line overrides.

One flat dataclass so that a run is described by plain JSON (saved beside its checkpoints, no
pickled objects) and every key can be set as `--key value` on the command line. The defaults are
the embedded CPU run: scikit-learn's digits, a small timm ResNet with timm's own stem, a few
epochs. The paper's settings ship in the package (`hscl_zoo.configs`), one per zoo name.
What a method's hyperparameters are, and which keys set them, comes from the method table
(`hscl_zoo.losses.methods`).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hscl_zoo.configs import read_config_text
from hscl_zoo.data.labelling import check_labelled_fraction
from hscl_zoo.losses.hardening import LinearThresholdSchedule
from hscl_zoo.losses.methods import METHODS, MethodSpec
from hscl_zoo.training.overrides import coerce, parse_value, split_argv

MIN_IMAGE_SIZE = 8
"""The smallest side a run trains at: SimCLR's blur pads by at least one pixel each side, and a
backbone that downsamples 32 times still keeps one feature."""
MAX_IMAGE_SIZE = 2048
MAX_VIEWS = 64
DIAGNOSTICS_EVERY = {"cpu": 10, "cuda": 25}
"""Steps between two diagnostics updates when `diagnostics_every` is unset. An update makes a few
passes over the step's (B*V)^2 pairs, a cost that grows with the batch while a step's may shrink
(a faster CPU, a smaller backbone): sampled every 10th batch on the CPU (the first of each epoch
included) as every 25th on CUDA, it stays a small fraction of an epoch
(benchmarks/results/recipe_vs_loop_cpu.json times one update and one step). Each epoch's record names the
cadence its diagnostics were sampled at."""
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
"""torch.compile's modes a run may ask for ("reduce-overhead" captures CUDA graphs: the recipe's
batches have one shape, as the loader drops the last incomplete batch)."""


@dataclass
class PretrainConfig:
    """Every setting of a pretraining run; see the field comments for units and choices."""

    # data
    dataset: str = "digits"  # a dataset name (hscl_zoo.DATASETS) or imagefolder:PATH, parquet:PATH, hf:owner/name
    data_dir: str | None = None  # local folder of the dataset's parquet files (None: the Hub or its cache)
    subset: int | None = None  # class-balanced number of training images (None: all)
    full_test: bool = False  # with subset: keep the whole test split (else the same fraction of it)
    views: int = 2  # augmented views per image (V)
    label_positive_pairing: bool = False  # draw later views from other images of the same class
    labelled_fraction: float = 1.0  # seeded, class-balanced part of the training labels kept; the rest become -1
    train_on_unlabelled: bool = True  # false: pretrain on the labelled images only (the supervised baseline)
    # own data (dataset "imagefolder:PATH", "parquet:PATH", "hf:owner/name"; hscl_zoo.data.sources)
    image_column: str | None = None  # None: guessed from the features (tables only)
    label_column: str | None = None  # None: guessed; no label column means unlabelled (UCL, H-UCL only)
    train_split: str | None = None  # None: "train"
    test_split: str | None = None  # None: test/validation/valid/val if present, else held out of train
    test_fraction: float = 0.2  # part of each class held out when the source has no test split
    skip_unreadable: bool = False  # leave out images that do not decode (else an error naming them)
    mean: list | None = None  # per-channel RGB mean in [0, 1] (None: the dataset's, measured for own data)
    std: list | None = None  # per-channel RGB std (None: as mean)
    # streaming (the training split read as a stream: docs, Training at scale)
    streaming: bool = False  # read the training split with datasets' streaming=True, sharded over processes; no copy on disk
    stream_buffer_size: int = 10000  # examples in the seeded shuffle buffer, mixing shards (its order changes every epoch); a split stored sorted by class needs one spanning several classes
    stream_epoch_examples: int | None = None  # training examples an epoch holds at most (None: one pass over the split)
    stream_eval_examples: int = 10000  # training examples, class-balanced from the shuffled stream, the kNN monitor and the final probe fit on
    # model
    backbone: str = "resnet18"  # a timm model name
    stem: str = "default"  # "small" (3x3 stride-1 conv, no max-pool), "default" (timm's), "auto" (small up to 64 px)
    image_size: int | None = None  # None: the dataset's native size
    # objective
    method: str = "hscl-beta"  # ucl, hucl, scl, hscl-beta or hscl-tau (hscl_zoo.METHODS)
    temperature: float = 0.5  # the paper's gamma: cosines are divided by it
    beta: float = 1.0  # exponential-tilt strength of H-UCL and H-SCL(beta)
    threshold_start: float = -0.3  # H-SCL(tau): cosine level at epoch 1 ...
    threshold_end: float = 0.0  # ... and at the last epoch (the paper's linear schedule)
    tau_plus: float = 0.0  # H-UCL debiasing class prior
    positives: str | None = None  # None: the method's own (views for ucl/hucl, labels for scl/hscl)
    M: float | None = None  # None: global number of embeddings (+ queue rows in use) - 2
    unlabelled_negatives: bool = True  # labelled anchors also contrast against unlabelled (-1) images
    queue_size: int = 0  # rows of earlier batches kept as extra candidates (hscl_zoo.losses.queue); 0: none
    queue_positives: bool = False  # same-label queue rows are positives too (label positives only)
    queue_start_epoch: int = 1  # first epoch that reads and fills the queue
    # optimisation
    epochs: int = 8  # passes over the training split
    batch_size: int = 256  # global, across processes: the contrastive batch every anchor meets
    chunk_size: int | None = None  # images encoded at once (each with its views) by the gradient cache; None: all
    optimizer: str = "adam"  # "adam" (the paper's), "adamw" or "sgd"
    lr: float = 1e-3  # learning rate
    weight_decay: float = 1e-6  # the optimiser's weight decay
    mixed_precision: str = "no"  # "no" or "bf16" (fp16 is refused: see validate)
    seed: int = 0  # fixes the initialisation, batch order, augmentations and subsets
    num_workers: int = 0  # DataLoader worker processes
    # fast path (None: on when training on a CUDA device, off on the CPU)
    channels_last: bool | None = None  # channels-last memory format for the model and batches
    fused_optimizer: bool | None = None  # torch's fused Adam kernel
    gpu_augment: bool | None = None  # batched SimCLR views on the device from uint8 images
    cache_images: bool | None = None  # decode the training set once into memory (None: with gpu_augment)
    device_data: bool | None = None  # keep the decoded training split on the device and gather each batch there (None: with gpu_augment and cache_images on CUDA, unless label_positive_pairing)
    compile: bool = False  # torch.compile the model and the device augmentation (the loss stays eager); off on CUDA too until measured there
    compile_mode: str = "default"  # torch.compile's mode: "default", "reduce-overhead" (CUDA graphs) or "max-autotune"
    # device resources and cadence (None: decided per device, see `device_plan`)
    sync_batchnorm: bool | None = None  # BatchNorm statistics over all processes (None: on with several CUDA processes)
    memory_check: bool = True  # on CUDA, refuse a run estimated not to fit the device (hscl_zoo.training.resources)
    dist_timeout: int = 1800  # seconds a process waits for the others at a collective operation (a lost or hung machine ends the run after it); keep it above the main process's solo work (docs: Safety)
    monitor_every: int = 1  # epochs between kNN monitors (and always the last)
    checkpoint_every: int = 1  # epochs between checkpoints (and always the last)
    # monitoring and evaluation
    knn_k: int = 20  # neighbours voting in the kNN monitor and evaluation
    monitor_train_size: int | None = 5000  # training images used by the per-epoch kNN monitor
    monitor_test_size: int | None = None  # class-balanced test images it classifies (None: all)
    diagnostics: bool = True  # log the paper's Sec. V-B diagnostics (Assumption 1, Lemma 1, Proposition 2) per epoch
    diagnostics_every: int | None = None  # batches between diagnostics updates, each a few (B*V)^2 passes, no host sync (None: 10 on CPU, 25 on CUDA)
    probe_epochs: int = 100  # epochs of the final linear probe
    log_with: str | None = None  # an Accelerate tracker ("tensorboard", "wandb", ...) or None
    verbose: bool = False  # print every metric of each epoch (default: its loss, views/s and kNN top-1; metrics.jsonl has all)
    # output
    output_dir: str = "runs/default"  # where the run writes config.json, metrics.jsonl, checkpoints/, hub/
    keep_checkpoints: int = 2  # newest checkpoints kept

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the bad key and what to pass instead."""
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is unknown; choose one of {', '.join(METHODS)}.")
        for h in self.method_spec.hyperparameters:
            for key in h.config_keys:
                if key not in self.field_names():
                    raise ValueError(f"method {self.method!r}: no config key {key!r} sets its hyperparameter "
                                     f"{h.name!r}; add that field to PretrainConfig or mark it recipe=False.")
                h.check(getattr(self, key), self.method, key)
        if self.stem not in ("small", "default", "auto"):
            raise ValueError(f"stem={self.stem!r}: use 'small', 'default' or 'auto'.")
        if self.views < 2:
            raise ValueError(f"views={self.views}: contrastive losses need at least 2 views per image.")
        for key in ("epochs", "batch_size", "knn_k", "probe_epochs", "keep_checkpoints", "diagnostics_every",
                    "monitor_every", "checkpoint_every", "dist_timeout"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be >= 1.")
        if self.num_workers < 0:
            raise ValueError(f"num_workers={self.num_workers} must be >= 0.")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr={self.lr} must be a positive number (the paper uses 1e-3).")
        if self.optimizer not in ("adam", "adamw", "sgd"):
            raise ValueError(f"optimizer={self.optimizer!r}: use 'adam' (the paper), 'adamw' or 'sgd'.")
        if self.mixed_precision == "fp16":
            raise ValueError("mixed_precision='fp16' is refused: the loss stops the run on non-finite features, so one "
                             "fp16 overflow in the encoder would end it where a gradient scaler would only skip a step. "
                             "Use 'bf16' (float32's range, as fast on GPUs that have it) or 'no'.")
        if self.mixed_precision not in ("no", "bf16"):
            raise ValueError(f"mixed_precision={self.mixed_precision!r}: use 'no' or 'bf16'.")
        if self.positives not in (None, "views", "labels"):
            raise ValueError(f"positives={self.positives!r}: use 'views', 'labels' or leave it unset.")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name}={value} must be a finite number.")
        if self.temperature <= 0:
            raise ValueError(f"temperature={self.temperature} must be > 0 (the paper uses 0.5).")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay} must be >= 0 (the paper uses 1e-6).")
        if self.M is not None and self.M <= 0:
            raise ValueError(f"M={self.M} must be > 0 (the number of negatives the hardened loss normalises by), or "
                             "unset for the number of embeddings in the batch minus 2.")
        if self.image_size is not None and not MIN_IMAGE_SIZE <= self.image_size <= MAX_IMAGE_SIZE:
            raise ValueError(f"image_size={self.image_size} must lie in {MIN_IMAGE_SIZE}..{MAX_IMAGE_SIZE} px, or be "
                             "unset for the dataset's own size.")
        if self.views > MAX_VIEWS:
            raise ValueError(f"views={self.views}: at most {MAX_VIEWS} views per image (the paper uses 2; every "
                             "view multiplies the batch the loss compares).")
        import timm  # here, not at import: hscl-zoo list/info load no torch

        if not timm.is_model(self.backbone):
            close = difflib.get_close_matches(self.backbone, timm.list_models(), n=1)
            raise ValueError(f"backbone={self.backbone!r} is not a timm model"
                             f"{f' (did you mean {close[0]!r}?)' if close else ''}; see timm.list_models().")
        for key in ("monitor_train_size", "monitor_test_size"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)} must be a positive number of images, or unset for all.")
        if not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction={self.test_fraction} must lie strictly between 0 and 1.")
        for key in ("mean", "std"):
            value = getattr(self, key)
            if value is not None and (len(value) != 3 or not all(isinstance(v, (int, float)) for v in value)
                                      or (key == "std" and min(value) <= 0)):
                raise ValueError(f"{key}={value!r}: give three numbers, one per RGB channel (std > 0), or unset it.")
        check_labelled_fraction(self.labelled_fraction)
        self._validate_large_batch()
        if self.streaming:
            self._validate_streaming()
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode={self.compile_mode!r}: use one of {', '.join(map(repr, COMPILE_MODES))}.")
        if self.device_data and (self.gpu_augment is False or self.cache_images is False):
            raise ValueError("device_data=true keeps the decoded images on the device and augments them there: it needs "
                             "gpu_augment and cache_images; drop device_data, or leave those unset.")
        if self.device_data and self.label_positive_pairing:
            raise ValueError("device_data=true does not make label-positive pairs (views from two images of a class): "
                             "drop device_data (the DataLoader path pairs them) or label_positive_pairing.")
        if self.subset is not None and self.subset < 1:
            raise ValueError(f"subset={self.subset} must be a positive number of images, or unset for all.")

    def _validate_large_batch(self) -> None:
        """The gradient cache and the memory queue (issue 16): chunk_size, queue_* keys."""
        if self.chunk_size is not None and not 1 <= self.chunk_size <= self.batch_size:
            raise ValueError(f"chunk_size={self.chunk_size} must lie in 1..{self.batch_size} (batch_size): it counts "
                             f"the images encoded at once, like batch_size, each with its {self.views} views. "
                             "Unset it to encode the whole batch at once.")
        if self.queue_size < 0:
            raise ValueError(f"queue_size={self.queue_size} must be >= 0 (0: no queue).")
        if self.queue_start_epoch < 1:
            raise ValueError(f"queue_start_epoch={self.queue_start_epoch} must be >= 1 (1: from the first epoch).")
        if self.queue_size and self.queue_start_epoch > self.epochs:
            raise ValueError(f"queue_start_epoch={self.queue_start_epoch} comes after the last epoch ({self.epochs}): "
                             "the queue would never be used. Lower it or set queue_size 0.")
        if self.queue_positives and not self.queue_size:
            raise ValueError("queue_positives=true needs a queue: set queue_size > 0.")
        if self.queue_positives and (self.positives or self.method_spec.positives) != "labels":
            raise ValueError(f"queue_positives=true with positives='views' ({self.method}): a queue row is never "
                             "another view of the anchor's image, so only label positives can come from it. "
                             "Set positives labels or drop queue_positives.")

    # ---- construction ----

    def _validate_streaming(self) -> None:
        refused = {"subset": self.subset is not None, "label_positive_pairing": self.label_positive_pairing,
                   "labelled_fraction": self.labelled_fraction != 1.0, "train_on_unlabelled": not self.train_on_unlabelled,
                   "gpu_augment": bool(self.gpu_augment), "cache_images": bool(self.cache_images),
                   "device_data": bool(self.device_data)}
        given = [key for key, on in refused.items() if on]
        if given:
            raise ValueError(f"streaming=true reads the training split as a stream, augmented in DataLoader workers: it does not "
                             f"take {', '.join(given)}; drop {'it' if len(given) == 1 else 'them'} or drop streaming.")
        for key in ("stream_buffer_size", "stream_epoch_examples", "stream_eval_examples"):
            value = getattr(self, key)
            if value is not None and value < (0 if key == "stream_buffer_size" else 1):
                raise ValueError(f"{key}={value} must be {'>= 0' if key == 'stream_buffer_size' else '>= 1'}.")
        if self.stream_epoch_examples is not None and self.stream_epoch_examples < self.batch_size:
            raise ValueError(f"stream_epoch_examples={self.stream_epoch_examples} is fewer than one batch of "
                             f"{self.batch_size}; raise it or lower batch_size.")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, source: str = "config") -> PretrainConfig:
        unknown = [k for k in values if k not in cls.field_names()]
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, cls.field_names(), n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ValueError(
                f"{source}: unknown key(s) {', '.join(hints)}. Valid keys: {', '.join(cls.field_names())}."
            )
        return cls(**{k: coerce(k, v, _allowed_types(k), source) for k, v in values.items()})

    @classmethod
    def from_sources(cls, config_path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> PretrainConfig:
        """Defaults, then the YAML config (a file path, or the name of a shipped config such as
        ``hscl-beta-cifar100``), then command-line overrides (strings are parsed as YAML scalars)."""
        values: dict[str, Any] = {}
        if config_path is not None:
            text, source = read_config_text(config_path)
            try:
                loaded = yaml.safe_load(text) or {}
            except yaml.YAMLError as error:
                raise ValueError(f"{source} is not valid YAML: {' '.join(str(error).split())}") from None
            if not isinstance(loaded, dict):
                raise ValueError(f"{source}: a config is a mapping of key: value lines, got {type(loaded).__name__}.")
            cls.from_dict(loaded, source=source)
            values.update(loaded)
        if overrides:
            parsed = {k: parse_value(k, v, _allowed_types(k)) if isinstance(v, str) else v for k, v in overrides.items()}
            cls.from_dict(parsed, source="command line")
            values.update(parsed)
        return cls.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    # ---- derived settings ----

    @property
    def method_spec(self) -> MethodSpec:
        """The method table's entry for `method`."""
        return METHODS[self.method]

    def loss_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `build_loss(self.method, ...)`: the common options and the method's
        hyperparameters; a scheduled one (H-SCL(tau)'s threshold) gets a fresh linear schedule."""
        kwargs: dict[str, Any] = {"temperature": self.temperature, "M": self.M,
                                  "unlabelled_negatives": self.unlabelled_negatives}
        if self.queue_size:
            kwargs.update(queue_size=self.queue_size, queue_positives=self.queue_positives,
                          queue_start_epoch=self.queue_start_epoch)
        if self.positives is not None:
            kwargs["positives"] = self.positives
        for h in self.method_spec.hyperparameters:
            if h.recipe and h.schedule:
                start, end = (getattr(self, key) for key in h.config_keys)
                kwargs[h.name] = LinearThresholdSchedule(start, end, self.epochs)
            elif h.recipe:
                kwargs[h.name] = getattr(self, h.name)
        return kwargs

    def fast_path(self, device_type: str) -> dict[str, bool]:
        """The fast-path switches resolved for a device: unset ones are on for CUDA only."""
        on_gpu = device_type == "cuda"
        gpu_augment = on_gpu and not self.streaming if self.gpu_augment is None else self.gpu_augment
        cache_images = gpu_augment if self.cache_images is None else self.cache_images
        device_data = on_gpu and gpu_augment and cache_images and not self.label_positive_pairing
        return {
            "channels_last": on_gpu if self.channels_last is None else self.channels_last,
            "fused_optimizer": on_gpu if self.fused_optimizer is None else self.fused_optimizer,
            "gpu_augment": gpu_augment or bool(self.device_data),
            "cache_images": cache_images or bool(self.device_data),
            "device_data": device_data if self.device_data is None else self.device_data,
            "compile": self.compile,
        }

    def device_plan(self, device_type: str, num_processes: int) -> dict[str, Any]:
        """The device-dependent settings resolved: `sync_batchnorm` (on with several CUDA
        processes unless set) and `diagnostics_every` (`DIAGNOSTICS_EVERY` of the device unless set).
        Raises ValueError for SyncBatchNorm across CPU processes, which torch does not run."""
        on_gpu = device_type == "cuda"
        sync = on_gpu and num_processes > 1 if self.sync_batchnorm is None else self.sync_batchnorm
        if sync and num_processes > 1 and not on_gpu:
            raise ValueError(f"sync_batchnorm=true with {num_processes} {device_type} processes: torch's SyncBatchNorm "
                             "runs on GPUs only. Drop it (each process then normalises its own share of the batch).")
        every = self.diagnostics_every if self.diagnostics_every is not None else DIAGNOSTICS_EVERY["cuda" if on_gpu else "cpu"]
        return {"sync_batchnorm": sync, "diagnostics_every": every}

    def method_hyperparameters(self) -> dict[str, Any]:
        """The objective's hyperparameters as a model card and config.json report them."""
        spec = self.method_spec
        out: dict[str, Any] = {"temperature": self.temperature, "positives": self.positives or spec.positives}
        out.update({key: getattr(self, key) for h in spec.hyperparameters for key in h.config_keys})
        queue = " + queue rows" if self.queue_size else ""
        out["M"] = self.M if self.M is not None else f"global embeddings{queue} - 2"
        if self.queue_size:
            out.update(queue_size=self.queue_size, queue_positives=self.queue_positives,
                       queue_start_epoch=self.queue_start_epoch)
        return out


def _allowed_types(key: str) -> tuple[type, ...]:
    hint = typing.get_type_hints(PretrainConfig).get(key)
    if hint is None:
        return ()
    return typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)


def parse_overrides(argv: list[str]) -> dict[str, str]:
    """Turn ['--lr', '0.01', '--epochs=3', '--skip_unreadable'] into {'lr': '0.01', 'epochs': '3',
    'skip_unreadable': 'true'}: a true/false key given bare (last, or before the next --key) is true,
    as a flag is on ``hscl-zoo eval`` and ``embed``."""
    return split_argv(argv, lambda key: bool in _allowed_types(key))


__all__ = ["PretrainConfig", "parse_overrides"]
