"""What a source (``imagefolder:PATH``, ``parquet:PATH``, ``hf:owner/name``) is and the options
that map its files to tables, without reading any: the command line builds its options from here
without importing datasets, numpy or PIL (:mod:`hscl_zoo.data.sources` reads the files).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["SOURCE_PREFIXES", "SOURCE_KEYS", "UNLABELLED", "SourceOptions", "is_source", "source_options"]

SOURCE_PREFIXES = ("imagefolder:", "parquet:", "hf:")
UNLABELLED = -1
"""The label of an image without a class."""


@dataclass(frozen=True)
class SourceOptions:
    """How a source's files map to the zoo's (image, label) tables; see :mod:`hscl_zoo.data.sources`.

    Attributes:
        image_column: column of the images (tables only; None: guessed).
        label_column: column of the labels (tables only; None: guessed, none for unlabelled data).
        train_split: split trained on (tables only; None: ``train``).
        test_split: held-out split (None: ``test``/``validation``/``valid``/``val`` if present,
            else a stratified part of the training split).
        test_fraction: the part of each class held out when the source has no test split.
        skip_unreadable: drop images that do not decode (and print how many) instead of failing.
    """

    image_column: str | None = None
    label_column: str | None = None
    train_split: str | None = None
    test_split: str | None = None
    test_fraction: float = 0.2
    skip_unreadable: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.test_fraction, bool) or not 0 < self.test_fraction < 1:
            raise ValueError(f"test_fraction={self.test_fraction!r} must be a number strictly between 0 and 1 "
                             "(e.g. 0.2 holds out a fifth of each class).")

    def non_default(self) -> dict[str, Any]:
        """The options that differ from their defaults."""
        defaults = asdict(SourceOptions())
        return {k: v for k, v in asdict(self).items() if v != defaults[k]}


SOURCE_KEYS = tuple(asdict(SourceOptions()))
"""The option names, which are also recipe config keys and ``hscl-zoo eval``/``embed`` options."""


def is_source(name: str) -> bool:
    """Whether ``name`` names an own data source (``imagefolder:``, ``parquet:``, ``hf:``)."""
    return isinstance(name, str) and name.startswith(SOURCE_PREFIXES)


def source_options(values: dict[str, Any]) -> dict[str, Any]:
    """The source options among ``values`` (e.g. a recipe config) that differ from the defaults."""
    return SourceOptions(**{k: values[k] for k in SOURCE_KEYS if k in values}).non_default()
