"""The method table: one `MethodSpec` per training objective, read by everything that names one.

A method is the loss contract (docs/losses.md) with three choices fixed: which candidates are
negatives, which are positives by default, and how negatives are weighted (a hardening function
built from the method's hyperparameters, or uniform weights). `build_loss` turns a name into a
`ContrastiveLoss`; the pretraining config, the training summary, the model cards, the zoo registry
and the benchmarks read the same spec, so adding a method is one `register_method(MethodSpec(...))`
and, if it hardens, one function that builds its weights. The table itself imports no torch (the
zoo registry reads it for ``hscl-zoo list``); `build_loss` and the hardening builders import the
loss modules when called.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, get_args

from hscl_zoo._table import NamedTable
from hscl_zoo.losses.pairs import Negatives, Positives

if TYPE_CHECKING:
    from hscl_zoo.losses.hardening import HardeningFn
    from hscl_zoo.losses.objective import ContrastiveLoss

__all__ = [
    "Hyperparameter",
    "MethodSpec",
    "METHODS",
    "LOSS_NAMES",
    "COMMON_OPTIONS",
    "register_method",
    "get_method",
    "build_loss",
    "hyperparameter_values",
]

COMMON_OPTIONS: tuple[str, ...] = ("temperature", "positives", "M", "unlabelled", "unlabelled_negatives", "queue_size",
                                   "queue_positives", "queue_start_epoch")
"""`build_loss` keywords every method takes (see `ContrastiveLoss`)."""

_LOSS_KEYWORDS = ("tau_plus",)
"""Hyperparameters that are `ContrastiveLoss` arguments rather than inputs of the hardening."""


@dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter of a method: a `build_loss` keyword and, unless `recipe` is False, the
    pretraining config key of the same name.

    Attributes:
        name: the keyword (``"beta"``).
        default: the value `build_loss` uses when it is not given (None: off).
        low, high: the valid range, inclusive at `low`; inclusive at `high` unless `high_open`.
        high_open: whether `high` itself is excluded (a class prior lies in [0, 1)).
        schedule: the recipe sets it as a linear schedule over the epochs, with the config keys
            ``<name>_start`` and ``<name>_end``; `build_loss` takes a number or a
            `LinearThresholdSchedule`.
        recipe: whether the pretraining config sets it (False for an alternative only
            `build_loss` offers, such as H-UCL's threshold).
        doc: what it does, for error messages and docs.
    """

    name: str
    default: float | None
    low: float = -math.inf
    high: float = math.inf
    high_open: bool = False
    schedule: bool = False
    recipe: bool = True
    doc: str = ""

    @property
    def config_keys(self) -> tuple[str, ...]:
        """The pretraining config keys that set it."""
        if not self.recipe:
            return ()
        return (f"{self.name}_start", f"{self.name}_end") if self.schedule else (self.name,)

    @property
    def range_text(self) -> str:
        """The valid range in words: ">= 0", "in [-1, 1]", "in [0, 1)"."""
        if math.isinf(self.high):
            return "of any value" if math.isinf(self.low) else f">= {self.low:g}"
        return f"in [{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def check(self, value: Any, method: str, key: str | None = None) -> None:
        """Raise ValueError unless `value` is a finite number in range (or, if scheduled, a
        schedule); the message names `key` (a config key such as ``threshold_start``) if given."""
        if self.schedule:
            from hscl_zoo.losses.hardening import LinearThresholdSchedule

            if isinstance(value, LinearThresholdSchedule):
                return
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        above_high = number and (value >= self.high if self.high_open else value > self.high)
        if not number or value < self.low or above_high:
            hint = f" ({self.doc})" if self.doc else ""
            name = key or self.name
            raise ValueError(f"{method}: {name} must be a finite number {self.range_text}, got {value!r}{hint}.")


HardeningBuilder = Callable[[Mapping[str, Any], float], "HardeningFn"]
"""Builds a method's hardening function from its hyperparameter values and the temperature."""


@dataclass(frozen=True)
class MethodSpec:
    """Everything the package knows about one training objective.

    Attributes:
        name: the key (``"hscl-beta"``): `build_loss` name, config ``method``, zoo-name prefix.
        display: the paper's name (``"H-SCL(β)"``).
        summary: one sentence for model cards.
        negatives: ``"other-images"`` or ``"other-labels"`` (see `ContrastiveLoss`).
        positives: the default positives, ``"views"`` or ``"labels"``.
        hardening: builds the weights of the negatives from the hyperparameter values and the
            temperature; None for uniform weights.
        hyperparameters: the method's own `build_loss` keywords beyond `COMMON_OPTIONS`.
        exclusive: groups of hyperparameters of which at most one may be given.
        paper_top1: Table 1 of the paper, linear-probe top-1 % per dataset: (mean, std or None).
    """

    name: str
    display: str
    summary: str
    negatives: Negatives
    positives: Positives
    hardening: HardeningBuilder | None = None
    hyperparameters: tuple[Hyperparameter, ...] = ()
    exclusive: tuple[tuple[str, ...], ...] = ()
    paper_top1: Mapping[str, tuple[float, float | None]] = field(default_factory=dict)

    @property
    def reads_labels(self) -> bool:
        """Whether the method's own rule (default positives, negatives) uses the labels at all."""
        return self.positives == "labels" or self.negatives == "other-labels"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name != self.name.lower().replace("_", "-"):
            raise ValueError(f"a method name is lower-case with '-' (not '_'), got {self.name!r}.")
        if self.negatives not in get_args(Negatives):
            raise ValueError(f"{self.name}: negatives must be one of {get_args(Negatives)}, got {self.negatives!r}.")
        if self.positives not in get_args(Positives):
            raise ValueError(f"{self.name}: positives must be one of {get_args(Positives)}, got {self.positives!r}.")
        if self.hardening is not None and not callable(self.hardening):
            raise ValueError(f"{self.name}: hardening must build a hardening function, got {self.hardening!r}.")
        names = [h.name for h in self.hyperparameters]
        clashes = sorted({n for n in names if names.count(n) > 1} | set(names) & {*COMMON_OPTIONS, "detach_weights"})
        if clashes:
            raise ValueError(f"{self.name}: hyperparameter names {clashes} repeat or shadow a common option.")
        strays = sorted({n for group in self.exclusive for n in group} - set(names))
        if strays:
            raise ValueError(f"{self.name}: exclusive names {strays} that are not hyperparameters.")
        object.__setattr__(self, "paper_top1", MappingProxyType(dict(self.paper_top1)))

    @property
    def options(self) -> tuple[str, ...]:
        """Every `build_loss` keyword the method takes (detach_weights only when it hardens)."""
        extra = ("detach_weights",) if self.hardening is not None else ()
        return (*COMMON_OPTIONS, *(h.name for h in self.hyperparameters), *extra)


METHODS: NamedTable[MethodSpec] = NamedTable("method", MethodSpec)
"""Every registered method by name, the paper's five first (read-only; see `register_method`)."""


def register_method(spec: MethodSpec, *, replace: bool = False) -> MethodSpec:
    """Add a method to the table, so `build_loss`, the pretraining recipe and the model cards know it.

    A name that is taken is refused unless ``replace=True``. Returns the spec.
    """
    return METHODS.register(spec, replace=replace)


def get_method(name: str) -> MethodSpec:
    """The spec registered under `name` (``"hscl_beta"`` is read as ``"hscl-beta"``)."""
    key = name.lower().replace("_", "-") if isinstance(name, str) else name
    if key not in METHODS:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(METHODS)}.")
    return METHODS[key]


def build_loss(name: str, **kwargs: Any) -> ContrastiveLoss:
    """Build a registered objective by name: the paper's "ucl", "hucl", "scl", "hscl-beta", "hscl-tau".

    Keyword arguments: temperature (0.5); positives ("views" or "labels"; default the method's:
    views for ucl/hucl, labels for scl/hscl); M (None: embeddings - 2); then the method's
    hyperparameters (`METHODS[name].hyperparameters`): beta (hucl, hscl-beta; default 1.0);
    threshold (hscl-tau, or hucl instead of beta: a cosine level in [-1, 1] or a
    `LinearThresholdSchedule`; default 0.0); tau_plus (hucl debiasing, default 0); and
    detach_weights (False; the official script keeps the weights' gradient for beta >= 1 and, in
    one version of its file, detaches them for beta < 1) for methods whose weights have a gradient.
    queue_size K (None/0: no queue) adds a `MemoryQueue` of the last K embeddings of earlier
    batches as extra candidates, from epoch queue_start_epoch (1); queue_positives (False) also
    makes its same-label rows positives (label positives only). An
    option that has no effect on the method is refused. For another hardening function,
    `register_method` a `MethodSpec` or construct `ContrastiveLoss`. See docs/losses.md.
    """
    from hscl_zoo.losses.hardening import Threshold
    from hscl_zoo.losses.objective import ContrastiveLoss
    from hscl_zoo.losses.queue import MemoryQueue
    from hscl_zoo.losses.unlabelled import UNLABELLED

    spec = get_method(name)
    unknown = set(kwargs) - set(spec.options)
    if unknown:
        raise ValueError(
            f"{spec.name} does not take {', '.join(sorted(unknown))}; it takes {', '.join(sorted(spec.options))}."
        )
    temperature = kwargs.get("temperature", 0.5)
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}; the paper uses 0.5.")
    values = hyperparameter_values(spec, kwargs)
    hardening = spec.hardening(values, temperature) if spec.hardening is not None else None
    if "detach_weights" in kwargs and isinstance(hardening, Threshold):
        raise ValueError(
            f"{spec.name}: detach_weights has no effect with threshold weights: they are piecewise constant in the "
            "similarity, so no gradient flows through them. Drop detach_weights."
        )
    return ContrastiveLoss(
        negatives=spec.negatives,
        positives=kwargs.get("positives", spec.positives),
        hardening=hardening,
        temperature=temperature,
        M=kwargs.get("M"),
        detach_weights=kwargs.get("detach_weights", False),
        name=spec.name,
        unlabelled=kwargs.get("unlabelled", UNLABELLED),
        unlabelled_negatives=kwargs.get("unlabelled_negatives", True),
        queue=MemoryQueue(kwargs["queue_size"], start_epoch=kwargs.get("queue_start_epoch", 1))
        if kwargs.get("queue_size") else None,
        queue_positives=kwargs.get("queue_positives", False),
        **{k: values[k] for k in _LOSS_KEYWORDS if values.get(k) is not None},
    )


def hyperparameter_values(spec: MethodSpec, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The method's hyperparameters from `kwargs`, defaults filled in, each checked against its
    range, at most one of each exclusive group given (what `build_loss` and the graph objective
    share)."""
    for group in spec.exclusive:
        given = [n for n in group if kwargs.get(n) is not None]
        if len(given) > 1:
            raise ValueError(f"{spec.name} takes either {' or '.join(group)}, not both.")
    values: dict[str, Any] = {}
    for h in spec.hyperparameters:
        value = kwargs.get(h.name)
        if value is None:
            value = h.default
        if value is not None:
            h.check(value, spec.name)
        values[h.name] = value
    return values


def _tilt(values: Mapping[str, Any], temperature: float) -> HardeningFn:
    from hscl_zoo.losses.hardening import ExponentialTilt

    return ExponentialTilt(values["beta"])


def _threshold(values: Mapping[str, Any], temperature: float) -> HardeningFn:
    from hscl_zoo.losses.hardening import Threshold

    return Threshold(values["threshold"], temperature)


def _tilt_or_threshold(values: Mapping[str, Any], temperature: float) -> HardeningFn:
    return _threshold(values, temperature) if values["threshold"] is not None else _tilt(values, temperature)


_BETA = Hyperparameter("beta", 1.0, low=0.0, doc="exponential-tilt strength; the paper's grid is 0.1, 0.5, 1, 2, 5")
_TAU_PLUS = Hyperparameter("tau_plus", 0.0, low=0.0, high=1.0, high_open=True,
                           doc="class prior of the debiased estimator; 0 disables it")
_THRESHOLD_DOC = "cosine level a negative must reach to count as hard"
_HUCL_THRESHOLD = Hyperparameter("threshold", None, low=-1.0, high=1.0, schedule=True, recipe=False, doc=_THRESHOLD_DOC)
_HSCL_THRESHOLD = Hyperparameter("threshold", 0.0, low=-1.0, high=1.0, schedule=True, doc=_THRESHOLD_DOC)

# The paper's methods: name, display, negatives, default positives, hardening, hyperparameters, exclusive.
_PAPER_METHODS = (
    ("ucl", "UCL", "other-images", "views", None, (), ()),
    ("hucl", "H-UCL", "other-images", "views", _tilt_or_threshold, (_BETA, _HUCL_THRESHOLD, _TAU_PLUS),
     (("beta", "threshold"),)),
    ("scl", "SCL", "other-labels", "labels", None, (), ()),
    ("hscl-beta", "H-SCL(β)", "other-labels", "labels", _tilt, (_BETA,), ()),
    ("hscl-tau", "H-SCL(τ)", "other-labels", "labels", _threshold, (_HSCL_THRESHOLD,), ()),
)
_SUMMARIES = {
    "ucl": "unsupervised contrastive learning (SimCLR-style): positives are other views of the same image, "
           "negatives are all other images, weighted uniformly",
    "hucl": "hard unsupervised contrastive learning: UCL with negatives re-weighted towards the hardest ones by an "
            "exponential tilt",
    "scl": "supervised contrastive learning: positives share the anchor's label, negatives are images of other "
           "classes, weighted uniformly",
    "hscl-beta": "hard supervised contrastive learning: SCL with negatives of other classes re-weighted by the "
                 "exponential tilt exp(β·s)",
    "hscl-tau": "hard supervised contrastive learning: SCL keeping only negatives of other classes whose similarity "
                "passes a threshold that moves linearly from threshold_start to threshold_end over the epochs",
}
# Table 1 of the paper: linear-probe top-1 % (mean, std where the paper gives one), ResNet-50, 200 epochs.
_TABLE_1 = {
    "ucl": {"stl10": (64.36, 0.92), "cifar10": (89.16, None), "cifar100": (64.02, None), "tinyimagenet": (53.40, None)},
    "hucl": {"stl10": (67.82, 1.41), "cifar10": (90.35, None), "cifar100": (67.77, None), "tinyimagenet": (56.22, None)},
    "scl": {"stl10": (68.28, 0.92), "cifar10": (93.46, None), "cifar100": (71.68, None), "tinyimagenet": (62.06, None)},
    "hscl-beta": {"stl10": (72.52, 1.94), "cifar10": (93.98, None), "cifar100": (75.11, None),
                  "tinyimagenet": (65.39, None)},
    "hscl-tau": {"stl10": (71.02, 2.03), "cifar10": (92.95, None), "cifar100": (72.97, None),
                 "tinyimagenet": (63.84, None)},
}
for _name, _display, _negatives, _positives, _hardening, _hyperparameters, _exclusive in _PAPER_METHODS:
    register_method(MethodSpec(_name, _display, _SUMMARIES[_name], _negatives, _positives, _hardening,
                               _hyperparameters, _exclusive, _TABLE_1[_name]))

LOSS_NAMES: tuple[str, ...] = tuple(METHODS)
"""The paper's five objectives. `METHODS` also lists methods registered later."""
