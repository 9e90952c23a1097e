"""The method table: what each spec lets build_loss take, options without effect refused, bad specs
refused, and the zoo's Table 1 read from it."""

from __future__ import annotations

import pytest

import hscl_zoo
from hscl_zoo import METHODS, MethodSpec, build_loss
from hscl_zoo.losses import ExponentialTilt, Hyperparameter, LinearThresholdSchedule, Threshold


def test_the_papers_methods_in_order():
    assert tuple(METHODS)[:5] == hscl_zoo.LOSS_NAMES == ("ucl", "hucl", "scl", "hscl-beta", "hscl-tau")
    assert {m: (METHODS[m].negatives, METHODS[m].positives) for m in hscl_zoo.LOSS_NAMES} == {
        "ucl": ("other-images", "views"), "hucl": ("other-images", "views"), "scl": ("other-labels", "labels"),
        "hscl-beta": ("other-labels", "labels"), "hscl-tau": ("other-labels", "labels"),
    }


@pytest.mark.parametrize("name", hscl_zoo.LOSS_NAMES)
def test_build_loss_follows_the_spec(name):
    spec = METHODS[name]
    loss = build_loss(name)
    assert (loss.negatives, loss.positives, loss.name) == (spec.negatives, spec.positives, name)
    assert (loss.hardening is None) == (spec.hardening is None)
    for key in ("beta", "threshold", "tau_plus"):
        if key not in spec.options:
            with pytest.raises(ValueError, match=f"{name} does not take {key}"):
                build_loss(name, **{key: 0.5})


def test_defaults_and_alternatives():
    assert build_loss("hscl-beta").hardening.beta == 1.0
    assert build_loss("hscl-tau").hardening.current_level == 0.0
    assert isinstance(build_loss("hucl").hardening, ExponentialTilt) and build_loss("hucl").tau_plus == 0.0
    assert isinstance(build_loss("hucl", threshold=0.2).hardening, Threshold)
    schedule = LinearThresholdSchedule(-0.3, 0.0, 5)
    assert build_loss("hscl-tau", threshold=schedule).hardening.level is schedule
    assert build_loss("hucl", tau_plus=0.1).tau_plus == 0.1
    with pytest.raises(ValueError, match="hucl takes either beta or threshold, not both"):
        build_loss("hucl", beta=1.0, threshold=0.0)


@pytest.mark.parametrize("name, kwargs", [
    ("hscl-tau", {"detach_weights": True}),
    ("hscl-tau", {"detach_weights": False}),
    ("hucl", {"threshold": 0.1, "detach_weights": True}),
])
def test_detach_weights_is_refused_where_the_weights_have_no_gradient(name, kwargs):
    with pytest.raises(ValueError, match="piecewise constant"):
        build_loss(name, **kwargs)


@pytest.mark.parametrize("name", ["ucl", "scl"])
def test_detach_weights_is_refused_without_hardening(name):
    with pytest.raises(ValueError, match=f"{name} does not take detach_weights"):
        build_loss(name, detach_weights=True)


@pytest.mark.parametrize("name, kwargs, match", [
    ("hscl-beta", {"beta": float("nan")}, "beta must be a finite number >= 0"),
    ("hscl-tau", {"threshold": -1.5}, r"threshold must be a finite number in \[-1, 1\]"),
    ("hucl", {"tau_plus": -0.1}, r"tau_plus must be a finite number in \[0, 1\)"),
    ("hscl-beta", {"beta": True}, "beta must be a finite number"),
])
def test_hyperparameter_ranges(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_loss(name, **kwargs)


@pytest.mark.parametrize("changes, match", [
    ({"name": "My_Method"}, "lower-case"),
    ({"negatives": "everything"}, "negatives must be one of"),
    ({"positives": "pairs"}, "positives must be one of"),
    ({"hyperparameters": (Hyperparameter("M", 1.0),)}, "shadow a common option"),
    ({"hyperparameters": (Hyperparameter("a", 1.0), Hyperparameter("a", 2.0))}, "repeat"),
    ({"exclusive": (("beta", "gamma"),)}, "not hyperparameters"),
])
def test_bad_specs_are_refused(changes, match):
    fields = dict(name="toy", display="Toy", summary="a toy", negatives="other-labels", positives="labels")
    with pytest.raises(ValueError, match=match):
        MethodSpec(**{**fields, **changes})


def test_register_method_takes_a_spec():
    with pytest.raises(ValueError, match="expected a MethodSpec"):
        hscl_zoo.register_method({"name": "toy"})


def test_zoo_table_1_is_the_method_tables():
    for name in hscl_zoo.list_models():
        entry = hscl_zoo.info(name)
        if entry.modality == "image":
            assert (entry.paper_top1, entry.paper_top1_std) == METHODS[entry.method].paper_top1[entry.dataset]
