"""The finer contract of the hardening functions (`hscl_zoo.losses.hardening`) and of the method
table (`hscl_zoo.losses.methods`): the exact range of every threshold and hyperparameter (ends
included or not), what a custom hardening function may return, what each error message says, and
which `build_loss` keyword reaches which `ContrastiveLoss` attribute. Expected values come from
the formulas of docs/losses.md evaluated by hand on tiny inputs."""

from __future__ import annotations

import math
import re

import pytest
import torch

from hscl_zoo import METHODS, ContrastiveLoss, MethodSpec, build_loss
from hscl_zoo.losses import ExponentialTilt, Hyperparameter, LinearThresholdSchedule, Threshold
from hscl_zoo.losses.hardening import log_hardening_weight
from hscl_zoo.losses.methods import get_method
from hscl_zoo.losses.unlabelled import check_marker
from rounding import unit_roundoff

INF = math.inf
PAPER_LOSSES = "ucl, hucl, scl, hscl-beta, hscl-tau"
THRESHOLD_HINT = "cosine level a negative must reach to count as hard"
TOY = dict(name="toy", display="Toy", summary="a toy", negatives="other-labels", positives="labels")


class Named:
    """A custom hardening function (no `log_weight`) with a fixed repr, for exact messages."""

    def __init__(self, fn, name):
        self.fn, self.name = fn, name

    def __call__(self, t):
        return self.fn(t)

    def __repr__(self):
        return self.name


def message(excinfo) -> str:
    return str(excinfo.value)


# ---- custom hardening functions: log(eta(t)) and what eta may return ----

def test_zero_weight_of_a_custom_function_is_minus_infinity_and_positive_weight_its_log():
    t = torch.tensor([[-1.0, 0.0, 0.5], [2.0, -3.0, 1.0]], dtype=torch.float64)
    log_w = log_hardening_weight(Named(torch.relu, "relu"), t)
    expected = torch.tensor([[-INF, -INF, math.log(0.5)], [math.log(2.0), -INF, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(log_w, expected, rtol=4 * unit_roundoff(torch.float64), atol=0, msg=lambda m: (
        f"{m}\ntorch.log (vectorised or not) and math.log are each within one ulp of log: two ulps apart at most"))


def test_zero_weights_give_no_nan_gradient():
    t = torch.tensor([-1.0, 0.0, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
    log_w = log_hardening_weight(Named(torch.relu, "relu"), t)
    log_w[torch.isfinite(log_w)].sum().backward()
    assert torch.equal(t.grad, torch.tensor([0.0, 0.0, 2.0, 0.5], dtype=torch.float64))


def test_a_custom_function_of_the_wrong_shape_is_refused_with_what_it_returned():
    t = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError) as excinfo:
        log_hardening_weight(Named(lambda x: x.sum(dim=-1), "row_sum"), t)
    assert message(excinfo) == (
        "a hardening function must map a tensor of scaled similarities to a tensor of the same shape; "
        "row_sum returned Tensor of shape torch.Size([2])."
    )


def test_a_custom_function_that_returns_no_tensor_is_refused_with_its_type():
    t = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError) as excinfo:
        log_hardening_weight(Named(lambda x: x.tolist(), "as_list"), t)
    assert message(excinfo) == (
        "a hardening function must map a tensor of scaled similarities to a tensor of the same shape; "
        "as_list returned list of shape None."
    )


@pytest.mark.parametrize("fn", [lambda x: x - 10.0, lambda x: torch.full_like(x, INF), lambda x: torch.full_like(x, math.nan)])
def test_negative_or_non_finite_custom_weights_are_refused(fn):
    t = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    with pytest.raises(ValueError) as excinfo:
        log_hardening_weight(Named(fn, "bad_eta"), t)
    assert message(excinfo) == (
        "hardening function bad_eta returned negative or non-finite weights; it must be non-negative and finite."
    )


def test_a_single_negative_weight_among_finite_ones_is_refused():
    t = torch.tensor([1.0, 2.0, -0.25], dtype=torch.float64)
    with pytest.raises(ValueError, match="returned negative or non-finite weights"):
        log_hardening_weight(Named(lambda x: x, "identity"), t)


def test_the_tilt_gives_its_log_weight_without_forming_the_weight():
    t = torch.tensor([-2.0, 0.0, 800.0], dtype=torch.float64)
    eta = ExponentialTilt(1.5)
    assert torch.equal(log_hardening_weight(eta, t), torch.tensor([-3.0, 0.0, 1200.0], dtype=torch.float64))
    assert torch.isinf(eta(t)[2])
    assert eta(t)[0].item() == pytest.approx(math.exp(-3.0), rel=1e-15)


# ---- the threshold eta = 1(s >= level) on s = t * temperature ----

def test_a_negative_exactly_at_the_threshold_counts_as_hard():
    eta = Threshold(0.5, temperature=0.5)
    t = torch.tensor([0.5, 1.0, 1.5], dtype=torch.float64)  # s = 0.25, 0.5 (the level), 0.75
    weight = eta(t)
    assert weight.dtype == torch.float64
    assert torch.equal(weight, torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64))
    assert torch.equal(eta.log_weight(t), torch.tensor([-INF, 0.0, 0.0], dtype=torch.float64))


def test_threshold_weights_take_the_similarities_dtype():
    assert Threshold(0.0, 0.5)(torch.tensor([1.0, -1.0], dtype=torch.float32)).dtype == torch.float32


def test_a_threshold_below_every_cosine_keeps_every_negative_and_above_keeps_none():
    t = torch.tensor([-2.0, 0.0, 2.0], dtype=torch.float64)
    assert torch.equal(Threshold(-INF, 0.5)(t), torch.ones(3, dtype=torch.float64))
    assert torch.equal(Threshold(-INF, 0.5).log_weight(t), torch.zeros(3, dtype=torch.float64))
    assert torch.equal(Threshold(INF, 0.5)(t), torch.zeros(3, dtype=torch.float64))


def test_a_threshold_below_every_cosine_is_scl():
    torch.manual_seed(3)
    f = torch.nn.functional.normalize(torch.randn(6, 2, 3, dtype=torch.float64), dim=-1)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    loss = ContrastiveLoss(negatives="other-labels", positives="labels", hardening=Threshold(-INF, 0.5))
    assert loss(f, labels).item() == pytest.approx(build_loss("scl")(f, labels).item(), abs=1e-12)


@pytest.mark.parametrize("level", [-1.0, 1.0])
def test_the_ends_of_the_cosine_range_are_valid_thresholds(level):
    assert Threshold(level, 0.5).current_level == level


@pytest.mark.parametrize("level", [-1.5, 1.5])
def test_a_threshold_outside_the_cosine_range_is_refused(level):
    with pytest.raises(ValueError) as excinfo:
        Threshold(level, 0.5)
    assert message(excinfo) == f"threshold is a cosine similarity and must lie in [-1, 1], got {level}."


# ---- the linear threshold schedule ----

def test_a_one_epoch_schedule_stays_at_its_start():
    schedule = LinearThresholdSchedule(-0.2, 0.6, epochs=1)
    schedule.set_epoch(1)
    assert schedule.value == -0.2


def test_the_schedule_moves_linearly_and_can_go_back_to_epoch_one():
    schedule = LinearThresholdSchedule(-0.5, 0.5, epochs=3)
    schedule.set_epoch(2)
    assert schedule.value == 0.0
    schedule.set_epoch(3)
    assert schedule.value == 0.5
    schedule.set_epoch(1)
    assert schedule.value == -0.5


@pytest.mark.parametrize("epoch", [0, 4])
def test_an_epoch_outside_the_schedule_is_refused(epoch):
    schedule = LinearThresholdSchedule(-0.5, 0.5, epochs=3)
    with pytest.raises(ValueError) as excinfo:
        schedule.set_epoch(epoch)
    assert message(excinfo) == f"epoch must lie in 1..3 (1-based), got {epoch}."


def test_a_schedule_without_epochs_is_refused():
    with pytest.raises(ValueError) as excinfo:
        LinearThresholdSchedule(0.0, 0.5, epochs=0)
    assert message(excinfo) == "epochs must be >= 1 for a threshold schedule, got 0."


def test_a_schedule_may_span_the_whole_cosine_range():
    schedule = LinearThresholdSchedule(-1.0, 1.0, epochs=2)
    schedule.set_epoch(2)
    assert schedule.value == 1.0


@pytest.mark.parametrize("start, end, name, value", [
    (-1.5, 0.0, "start", -1.5), (1.5, 0.0, "start", 1.5), (0.0, -1.5, "end", -1.5), (0.0, 1.5, "end", 1.5),
])
def test_a_schedule_end_outside_the_cosine_range_is_refused_by_name(start, end, name, value):
    with pytest.raises(ValueError) as excinfo:
        LinearThresholdSchedule(start, end, epochs=5)
    assert message(excinfo) == f"threshold {name} is a cosine similarity and must lie in [-1, 1], got {value}."


# ---- MethodSpec validation ----

@pytest.mark.parametrize("name, shown", [("my_method", "'my_method'"), ("", "''"), (5, "5")])
def test_a_method_name_that_is_not_lower_case_with_dashes_is_refused(name, shown):
    with pytest.raises(ValueError) as excinfo:
        MethodSpec(**{**TOY, "name": name})
    assert message(excinfo) == f"a method name is lower-case with '-' (not '_'), got {shown}."


def test_unknown_negatives_and_positives_are_refused_with_the_choices():
    with pytest.raises(ValueError) as excinfo:
        MethodSpec(**{**TOY, "negatives": "everything"})
    assert message(excinfo) == "toy: negatives must be one of ('other-images', 'other-labels'), got 'everything'."
    with pytest.raises(ValueError) as excinfo:
        MethodSpec(**{**TOY, "positives": "pairs"})
    assert message(excinfo) == "toy: positives must be one of ('views', 'labels'), got 'pairs'."


def test_a_hardening_that_is_not_callable_is_refused():
    with pytest.raises(ValueError) as excinfo:
        MethodSpec(**{**TOY, "hardening": 3})
    assert message(excinfo) == "toy: hardening must build a hardening function, got 3."


def test_a_hyperparameter_may_not_be_called_detach_weights():
    with pytest.raises(ValueError) as excinfo:
        MethodSpec(**{**TOY, "hyperparameters": (Hyperparameter("detach_weights", None),)})
    assert message(excinfo) == "toy: hyperparameter names ['detach_weights'] repeat or shadow a common option."


def test_the_table_1_numbers_of_a_spec_are_a_read_only_copy():
    numbers = {"stl10": (60.0, 1.0)}
    spec = MethodSpec(**TOY, paper_top1=numbers)
    numbers["cifar10"] = (90.0, None)
    assert dict(spec.paper_top1) == {"stl10": (60.0, 1.0)}
    with pytest.raises(TypeError):
        spec.paper_top1["cifar10"] = (90.0, None)
    with pytest.raises(TypeError):
        METHODS["scl"].paper_top1["stl10"] = (0.0, None)


# ---- get_method ----

def test_get_method_reads_underscores_and_upper_case():
    assert get_method("HSCL_BETA") is METHODS["hscl-beta"]
    assert get_method("hscl_tau") is METHODS["hscl-tau"]


@pytest.mark.parametrize("name, shown", [("nope", "'nope'"), (5, "5")])
def test_an_unknown_method_is_refused_with_the_known_ones(name, shown):
    with pytest.raises(ValueError) as excinfo:
        get_method(name)
    assert re.fullmatch(rf"unknown loss {shown}; known losses: {PAPER_LOSSES}(, [a-z0-9-]+)*\.", message(excinfo))


# ---- Hyperparameter.check: the ranges, ends included or not ----

@pytest.mark.parametrize("name, kwargs", [
    ("hscl-beta", {"beta": 0.0}), ("hucl", {"beta": 0.0}), ("hscl-tau", {"threshold": 1.0}),
    ("hscl-tau", {"threshold": -1.0}), ("hucl", {"threshold": 1.0}), ("hucl", {"tau_plus": 0.0}),
    ("hucl", {"tau_plus": 0.999}),
])
def test_the_closed_ends_of_each_range_are_accepted(name, kwargs):
    build_loss(name, **kwargs)


@pytest.mark.parametrize("name, kwargs, expected", [
    ("hucl", {"tau_plus": 1.0},
     "hucl: tau_plus must be a finite number in [0, 1), got 1.0 (class prior of the debiased estimator; 0 disables it)."),
    ("hscl-beta", {"beta": -0.5},
     "hscl-beta: beta must be a finite number >= 0, got -0.5 (exponential-tilt strength; the paper's grid is 0.1, "
     "0.5, 1, 2, 5)."),
    ("hscl-beta", {"beta": INF},
     "hscl-beta: beta must be a finite number >= 0, got inf (exponential-tilt strength; the paper's grid is 0.1, "
     "0.5, 1, 2, 5)."),
    ("hscl-beta", {"beta": "1.0"},
     "hscl-beta: beta must be a finite number >= 0, got '1.0' (exponential-tilt strength; the paper's grid is 0.1, "
     "0.5, 1, 2, 5)."),
    ("hscl-tau", {"threshold": 1.5}, f"hscl-tau: threshold must be a finite number in [-1, 1], got 1.5 ({THRESHOLD_HINT})."),
    ("hucl", {"threshold": -1.5}, f"hucl: threshold must be a finite number in [-1, 1], got -1.5 ({THRESHOLD_HINT})."),
])
def test_a_hyperparameter_out_of_range_is_refused_with_its_range_and_meaning(name, kwargs, expected):
    with pytest.raises(ValueError) as excinfo:
        build_loss(name, **kwargs)
    assert message(excinfo) == expected


def test_a_hyperparameter_without_doc_is_refused_without_a_hint():
    with pytest.raises(ValueError) as excinfo:
        Hyperparameter("gamma", 1.0, low=0.0).check(-1.0, "toy")
    assert message(excinfo) == "toy: gamma must be a finite number >= 0, got -1.0."


def test_a_config_key_is_named_in_place_of_the_hyperparameter():
    threshold = METHODS["hscl-tau"].hyperparameters[0]
    with pytest.raises(ValueError) as excinfo:
        threshold.check(1.5, "hscl-tau", key="threshold_start")
    assert message(excinfo) == (
        f"hscl-tau: threshold_start must be a finite number in [-1, 1], got 1.5 ({THRESHOLD_HINT})."
    )


# ---- build_loss: refusals ----

def test_options_a_method_does_not_take_are_listed_with_those_it_takes():
    with pytest.raises(ValueError) as excinfo:
        build_loss("scl", gamma=2.0, beta=1.0)
    assert message(excinfo) == (
        "scl does not take beta, gamma; it takes M, positives, queue_positives, queue_size, queue_start_epoch, "
        "temperature, unlabelled, unlabelled_negatives."
    )


@pytest.mark.parametrize("temperature", [0, 0.0, -0.5, INF, math.nan, "0.5"])
def test_a_bad_temperature_is_reported_before_the_hyperparameters(temperature):
    with pytest.raises(ValueError) as excinfo:
        build_loss("hscl-beta", temperature=temperature, beta=-1.0)
    assert message(excinfo) == f"temperature must be a finite number > 0, got {temperature!r}; the paper uses 0.5."


def test_hucl_refuses_beta_and_threshold_together():
    with pytest.raises(ValueError) as excinfo:
        build_loss("hucl", beta=2.0, threshold=0.1)
    assert message(excinfo) == "hucl takes either beta or threshold, not both."


def test_hucl_takes_beta_alone_or_threshold_alone():
    assert build_loss("hucl", beta=2.0).hardening.beta == 2.0
    assert build_loss("hucl", threshold=0.1).hardening.current_level == 0.1


@pytest.mark.parametrize("name, kwargs", [("hscl-tau", {}), ("hucl", {"threshold": 0.1})])
def test_detach_weights_with_a_threshold_is_refused_with_the_reason(name, kwargs):
    with pytest.raises(ValueError) as excinfo:
        build_loss(name, detach_weights=False, **kwargs)
    assert message(excinfo) == (
        f"{name}: detach_weights has no effect with threshold weights: they are piecewise constant in the "
        "similarity, so no gradient flows through them. Drop detach_weights."
    )


# ---- build_loss: every keyword reaches the loss ----

def test_every_option_reaches_the_loss():
    loss = build_loss("hscl-beta", temperature=0.1, M=6.0, beta=2.0, detach_weights=True, unlabelled=-7,
                      unlabelled_negatives=False, queue_size=8, queue_start_epoch=3, queue_positives=True,
                      positives="labels")
    assert (loss.name, loss.negatives, loss.positives) == ("hscl-beta", "other-labels", "labels")
    assert (loss.temperature, loss.M, loss.hardening.beta, loss.detach_weights) == (0.1, 6.0, 2.0, True)
    assert (loss.unlabelled, loss.unlabelled_negatives, loss.queue_positives) == (-7, False, True)
    assert (loss.queue.size, loss.queue.start_epoch) == (8, 3)


def test_the_documented_defaults():
    loss = build_loss("hscl-beta")
    assert (loss.temperature, loss.M, loss.hardening.beta, loss.detach_weights, loss.tau_plus) == (0.5, None, 1.0, False, 0.0)
    assert (loss.unlabelled, loss.unlabelled_negatives, loss.queue, loss.queue_positives) == (-1, True, None, False)
    assert build_loss("scl", queue_size=4).queue.start_epoch == 1
    assert build_loss("ucl").positives == "views" and build_loss("scl").positives == "labels"


def test_positives_other_than_the_methods_default():
    assert build_loss("ucl", positives="labels").positives == "labels"
    assert build_loss("scl", positives="views").positives == "views"


@pytest.mark.parametrize("queue_size", [None, 0])
def test_no_queue_without_a_queue_size(queue_size):
    assert build_loss("scl", queue_size=queue_size).queue is None


def test_the_threshold_sees_the_losses_temperature_and_the_debiasing_its_prior():
    assert build_loss("hscl-tau", temperature=0.2, threshold=0.3).hardening.temperature == 0.2
    assert build_loss("hucl", temperature=0.2, threshold=0.3).hardening.temperature == 0.2
    assert build_loss("hucl", tau_plus=0.25).tau_plus == 0.25


@pytest.mark.parametrize("beta", [math.inf, -math.inf, math.nan, -0.5])
def test_exponential_tilt_refuses_a_beta_that_is_not_finite_and_non_negative(beta):
    with pytest.raises(ValueError) as error:
        ExponentialTilt(beta)
    assert str(error.value) == f"beta must be a finite number >= 0, got {beta!r}; the paper's grid is 0.1, 0.5, 1, 2, 5."


@pytest.mark.parametrize("marker", [-1.5, True, 0, 3, "-1"])
def test_unlabelled_marker_must_be_a_negative_integer(marker):
    with pytest.raises(ValueError) as error:
        check_marker(marker)
    assert str(error.value) == (
        f"unlabelled={marker!r} must be a negative integer (the label that marks an image without a class; "
        "the default is -1), since class ids are >= 0.")
    assert check_marker(-7) == -7
