"""Data, in the order it flows: the dataset table, loading into one internal form, per-image
transforms, multi-view training datasets and seeded loaders, and the device-side augmentation.

    catalog          DatasetSpec, the dataset table, register_dataset
    digits           scikit-learn's digits, the dataset that needs no network
    sources          your own data: imagefolder:PATH, parquet:PATH, hf:owner/name
    datasets         load_splits / load_split into (image, label) tables, balanced subsets
    transforms       the SimCLR augmentation and the evaluation transform
    views            MultiViewDataset: V augmented views per image, seeded per item
    loaders          make_loader: a row order that is a function of (seed, epoch)
    raw_images       RawImageDataset: uint8 images for augmentation on the device
    device_augment   BatchSimCLRAugment: the SimCLR augmentation, batched on the device
    device_ops       its batched kernels
    resident         ResidentBatches: the training split kept on the device, each batch gathered there
    streaming        open_stream, StreamingViews, StreamLoader: a training split read as a stream
    stream_eval      a streamed run's evaluation data: a balanced sample of the stream and the test split
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from hscl_zoo._lazy import lazy_exports as _lazy_exports

_EXPORTS = {
    **dict.fromkeys(("DATASETS", "DatasetSpec", "get_spec", "register_dataset"), "hscl_zoo.data.catalog"),
    **dict.fromkeys(("INTERNAL_IMAGE", "INTERNAL_LABEL", "LoadedData", "balanced_subset", "label_array", "load_split",
                     "load_splits", "require_internal_columns", "to_internal"), "hscl_zoo.data.datasets"),
    **dict.fromkeys(("SOURCE_KEYS", "UNLABELLED", "SourceOptions", "is_source"), "hscl_zoo.data.source_options"),
    "source_spec": "hscl_zoo.data.sources",
}
__all__ = [
    "DATASETS",
    "DatasetSpec",
    "SOURCE_KEYS",
    "SourceOptions",
    "UNLABELLED",
    "INTERNAL_IMAGE",
    "INTERNAL_LABEL",
    "LoadedData",
    "balanced_subset",
    "get_spec",
    "is_source",
    "label_array",
    "load_split",
    "load_splits",
    "register_dataset",
    "require_internal_columns",
    "source_spec",
    "to_internal",
]
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)

if _TYPE_CHECKING:
    from hscl_zoo.data.catalog import DATASETS, DatasetSpec, get_spec, register_dataset
    from hscl_zoo.data.datasets import (
        INTERNAL_IMAGE,
        INTERNAL_LABEL,
        LoadedData,
        balanced_subset,
        label_array,
        load_split,
        load_splits,
        require_internal_columns,
        to_internal,
    )
    from hscl_zoo.data.source_options import SOURCE_KEYS, UNLABELLED, SourceOptions, is_source
    from hscl_zoo.data.sources import source_spec
