"""The diagnostics' contract at its edges: the exact refusals (hardening choice, temperature,
labels, features), ties in Assumption 1, histogram quantiles derived by hand (first, last and
empty bins, counts beyond float32 precision), and DiagnosticsMeter's record on degenerate
batches and its refusals pooled over several updates."""

import math

import numpy as np
import pytest
import torch

from hscl_zoo.losses.diagnostics import (
    NEGATIVE_COSINE_BINS,
    NEGATIVE_COSINE_QUANTILES,
    DiagnosticsMeter,
    assumption_counts,
    assumption_fraction,
    histogram_quantile,
    lemma_losses,
    negative_masses,
)
from hscl_zoo.losses.hardening import ExponentialTilt

from test_diagnostics import clustered, loop_assumption_counts

V = 2
HARDENING_MESSAGE = ("pass exactly one of beta= (exponential tilt), threshold= (cosine level in [-1, 1]) "
                     "or hardening= (a hardening function, e.g. a loss's own).")
NAN_MESSAGE = ("diagnostics: features contain NaN or inf (or values whose norm overflows); check the encoder's "
               "output (learning rate, mixed precision).")


def raised(call, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as caught:
        call(*args, **kwargs)
    return str(caught.value)


def meter_fed(batches, **hardening) -> DiagnosticsMeter:
    meter = DiagnosticsMeter(**(hardening or {"beta": 1.0}))
    for f, y in batches:
        meter.update(f, y)
    return meter


def test_hardening_that_is_not_exactly_one_choice_is_refused_with_the_whole_message():
    f, labels = clustered(B=6)
    assert raised(assumption_fraction, f, labels) == HARDENING_MESSAGE
    assert raised(assumption_fraction, f, labels, beta=1.0, hardening=ExponentialTilt(1.0)) == HARDENING_MESSAGE
    assert raised(DiagnosticsMeter, beta=1.0, threshold=0.1) == HARDENING_MESSAGE


@pytest.mark.parametrize("temperature", [0, 0.0, -0.5, math.inf, -math.inf, math.nan, "0.5", None], ids=repr)
def test_temperature_that_is_not_a_finite_positive_number_is_refused_with_the_whole_message(temperature):
    f, labels = clustered(B=6)
    message = f"temperature must be a finite number > 0, got {temperature!r}; the paper uses 0.5."
    assert raised(assumption_fraction, f, labels, beta=1.0, temperature=temperature) == message
    assert raised(negative_masses, f, labels, ExponentialTilt(1.0), temperature=temperature) == message
    assert raised(DiagnosticsMeter, beta=1.0, temperature=temperature) == message


def test_missing_labels_are_refused_with_the_whole_message():
    f, _ = clustered(B=4)
    message = "diagnostics: needs labels: call loss_fn(features, labels) with labels of shape (4,), int64."
    assert raised(assumption_fraction, f, None, beta=1.0) == message
    assert raised(negative_masses, f, None, ExponentialTilt(1.0)) == message
    assert raised(lemma_losses, f, None) == message


def test_negative_label_other_than_the_marker_is_refused_with_the_whole_message():
    f, _ = clustered(B=4)
    labels = torch.tensor([0, -1, -3, 1])
    message = ("diagnostics: label -3 is negative; class ids are >= 0 and -1 marks an unlabelled image "
               "(unlabelled=-1). Relabel, or pass unlabelled=-3 if that value is your marker.")
    assert raised(assumption_fraction, f, labels, beta=1.0) == message
    assert raised(lemma_losses, f, labels) == message


def test_non_finite_features_of_a_labelled_image_are_refused_with_the_whole_message():
    f, labels = clustered(B=6)
    f = f.clone()
    f[2, 1, 0] = math.nan
    assert raised(assumption_fraction, f, labels, beta=1.0) == NAN_MESSAGE
    assert raised(negative_masses, f, labels, ExponentialTilt(1.0)) == NAN_MESSAGE
    assert raised(lemma_losses, f, labels) == NAN_MESSAGE
    f[2, 1, 0] = math.inf
    assert raised(lemma_losses, f, labels, threshold=0.1) == NAN_MESSAGE


def test_equal_hardened_means_count_as_assumption_1_holding():
    """Assumption 1 asks for 'at least': with every embedding equal, the collision and the
    other-label means are equal and every eligible anchor (images 0 and 1) satisfies it."""
    f = torch.ones(3, V, 4, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    assert assumption_counts(f, labels, beta=1.0) == (4, 4)
    assert assumption_counts(f, labels, threshold=0.5) == (4, 4)
    assert assumption_fraction(f, labels, beta=2.0) == 1.0
    record = meter_fed([(f, labels)]).compute()
    assert record["assumption_fraction"] == 1.0


def test_assumption_fraction_uses_the_temperature_it_is_given():
    f, labels = clustered(B=12, spread=1.5, seed=0)
    eta = ExponentialTilt(1.0)
    cold, warm = loop_assumption_counts(f, labels, 0.25, eta), loop_assumption_counts(f, labels, 0.5, eta)
    assert cold[0] != warm[0], "the temperatures must disagree to test anything"
    assert assumption_fraction(f, labels, beta=1.0, temperature=0.25) == cold[0] / cold[1]
    assert assumption_fraction(f, labels, beta=1.0, temperature=0.5) == warm[0] / warm[1]


def test_assumption_fraction_with_a_hardening_function_matches_the_loop():
    f, labels = clustered(B=12, spread=1.5, seed=1)
    eta = ExponentialTilt(3.0)
    holds, eligible = loop_assumption_counts(f, labels, 0.5, eta)
    assert 0 < holds < eligible
    assert assumption_fraction(f, labels, hardening=eta) == holds / eligible
    assert assumption_fraction(f, labels, hardening=eta) != assumption_fraction(f, labels, beta=1.0)


def test_diagnostics_build_their_sets_on_the_features_device_whatever_the_default_device():
    """A script that set torch's default device elsewhere (here 'meta', standing in for
    torch.set_default_device('cuda') on a machine without one) and passes CPU features gets its
    diagnostics computed on the CPU: the masks are made on the features' device. Three equal images
    (labels 0, 0, 1) at T = 0.5 have g = 2 and eta = e^2 for every pair, so alpha_HUCL = e^2; anchors
    of images 0 and 1 have alpha_HSCL = alpha_Hcol = e^2 / 2 (2 of their 4 other-image views each),
    image 2's alpha_HSCL = e^2 and alpha_Hcol = 0; Assumption 1 holds, with equality, for the 4
    eligible anchors (images 0 and 1)."""
    f = torch.ones(3, V, 4, dtype=torch.float64)
    labels = torch.tensor([0, 0, 1])
    e2 = math.exp(2.0)
    expected = {"hucl": [e2] * 6, "hscl": [e2 / 2] * 4 + [e2] * 2, "hcol": [e2 / 2] * 4 + [0.0] * 2}
    with torch.device("meta"):
        masses = negative_masses(f, labels, ExponentialTilt(1.0))
        counts = assumption_counts(f, labels, beta=1.0)
    assert counts == (4, 4)
    for name, values in expected.items():
        assert masses[name].device == torch.device("cpu")
        assert masses[name].tolist() == pytest.approx(values, rel=1e-12), name


def bins(**filled) -> torch.Tensor:
    """200 float64 bins over [-1, 1], zero except the given ones (`b17=3.0`: bin 17 holds 3)."""
    counts = torch.zeros(NEGATIVE_COSINE_BINS, dtype=torch.float64)
    for name, value in filled.items():
        counts[int(name[1:])] = value
    return counts


WIDTH = 2.0 / NEGATIVE_COSINE_BINS


@pytest.mark.parametrize("counts, q, expected", [
    (bins(b0=4.0), 0.5, -1.0 + WIDTH * 0.5),  # first bin: nothing below it
    (bins(b0=4.0), 0.25, -1.0 + WIDTH * 0.25),
    (bins(b0=2.0, b1=4.0), 0.5, -1.0 + WIDTH * (1 + 1 / 4)),  # rank 3: one past the 2 of bin 0, in bin 1 of 4
    (bins(b0=2.0, b3=2.0), 0.75, -1.0 + WIDTH * (3 + 1 / 2)),
    (bins(b199=5.0), 0.5, 1.0 - WIDTH * 0.5),  # last bin
    (bins(b198=1.0, b199=3.0), 1.0, 1.0),
], ids=["first-bin-median", "first-bin-quartile", "second-bin", "fourth-bin", "last-bin", "top"])
def test_histogram_quantile_is_linear_within_the_bin_holding_the_rank(counts, q, expected):
    assert histogram_quantile(counts, q) == pytest.approx(expected, abs=1e-12)


def test_histogram_quantile_lies_in_the_bin_of_numpy_inverted_cdf_quantile():
    """The rank q * total is the inverse of the empirical CDF (numpy's "inverted_cdf"): the
    histogram's quantile lies in the bin of that value."""
    values = np.array([-0.9951, -0.3, -0.3, 0.42, 0.9999, 0.0049, -0.55])
    counts = torch.histc(torch.from_numpy(values), bins=NEGATIVE_COSINE_BINS, min=-1.0, max=1.0).double()
    for q in (0.0, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 0.95, 1.0):
        exact = float(np.quantile(values, q, method="inverted_cdf"))
        low = -1.0 + WIDTH * math.floor((exact + 1.0) / WIDTH)
        assert low - 1e-12 <= histogram_quantile(counts, q) <= low + WIDTH + 1e-12, q


def test_histogram_quantile_of_a_nan_count_is_nan():
    """NaN in, NaN out, as an empty histogram gives NaN: after a NaN count the cumulative counts
    have no order, and the rank q * total is NaN, which falls past every bin, so this also checks
    that no index beyond the counts is read."""
    assert math.isnan(histogram_quantile(bins(b3=2.0, b7=math.nan), 0.5))
    assert math.isnan(histogram_quantile(bins(b3=2.0, b199=math.nan), 0.25))


@pytest.mark.parametrize("q", [-0.1, 1.5, math.nan])
def test_histogram_quantile_refuses_a_level_outside_zero_one(q):
    """A level outside [0, 1] (or NaN) has no quantile: above 1 it would read a cosine past the top
    bin, so it is refused with the range to use."""
    with pytest.raises(ValueError) as err:
        histogram_quantile(bins(b3=2.0, b7=1.0), q)
    assert str(err.value) == f"histogram_quantile needs a level q in [0, 1], got {q!r}."


def test_histogram_quantile_places_ranks_beyond_float32_precision_exactly():
    """An epoch's pooled float64 counts exceed 2**24: the median rank 33554437 is one past the
    33554436 values of bin 100, half-way into the 2 of bin 101 (a float32 rank would round to 33554436)."""
    counts = bins(b100=33554436.0, b101=2.0, b102=33554436.0)
    assert histogram_quantile(counts, 0.5) == pytest.approx(-1.0 + WIDTH * (101 + 1 / 2), abs=1e-12)


def test_histogram_quantile_of_float32_counts_is_exact_where_their_float32_total_rounds():
    """torch.histc counts are float32: their float32 total (16777219) rounds up to 16777220, past the
    last cumulative count. The top quantile is the top of the last non-empty bin (bin 1: -1 + 2 * width),
    not the top of the range."""
    counts = torch.zeros(NEGATIVE_COSINE_BINS)
    counts[0], counts[1] = 16777216.0, 3.0
    assert float(counts.sum()) > 16777219.0, "the float32 total must overshoot to test anything"
    assert histogram_quantile(counts, 1.0) == pytest.approx(-1.0 + 2 * WIDTH, abs=1e-12)


def test_fresh_meter_state_is_float64_zeros_to_pool_with_updated_ones():
    fresh = DiagnosticsMeter(beta=1.0).state()
    assert fresh.dtype == torch.float64 and fresh.shape == (DiagnosticsMeter(beta=1.0).state_size,)
    assert not fresh.any()
    fed = meter_fed([clustered(B=6)])
    assert fed.summarise(fresh + fed.state()) == fed.compute()


def test_summarising_before_any_update_is_refused_with_the_whole_message():
    meter = DiagnosticsMeter(beta=1.0)
    message = "DiagnosticsMeter: summarised before any update(); feed it at least one batch first."
    assert raised(meter.compute) == message
    assert raised(meter.summarise, meter.state()) == message


def test_meter_reports_a_batch_with_as_many_unlabelled_as_labelled_anchors():
    f, _ = clustered(B=2)
    record = meter_fed([(f, torch.tensor([0, -1]))]).compute()
    assert record["diagnostics_anchors"] == V and record["diagnostics_unlabelled_anchors"] == V
    assert math.isnan(record["assumption_fraction"])  # one labelled image: no collision, no other label
    assert record["mass_hucl"] == 0.0 and record["loss_ucl"] == 0.0


def test_meter_quantiles_count_negatives_in_the_lowest_bin():
    """Two antipodal images of different labels: every other-label cosine is -1, in the first bin."""
    e = torch.zeros(4, dtype=torch.float64)
    e[0] = 1.0
    f = torch.stack([e.expand(V, 4), -e.expand(V, 4)])
    record = meter_fed([(f, torch.tensor([0, 1]))], threshold=-0.5).compute()
    for q in NEGATIVE_COSINE_QUANTILES:
        assert record[f"neg_cos_q{round(100 * q):02d}"] == pytest.approx(-1.0 + WIDTH * q, abs=1e-12)
    assert record["threshold_kept_fraction"] == 0.0


def test_meter_kept_fraction_without_any_other_label_pair_is_nan():
    f, _ = clustered(B=4)
    record = meter_fed([(f, torch.zeros(4, dtype=torch.int64))], threshold=0.1).compute()
    assert math.isnan(record["threshold_kept_fraction"])
    assert all(math.isnan(record[f"neg_cos_q{round(100 * q):02d}"]) for q in NEGATIVE_COSINE_QUANTILES)


def test_meter_pools_refused_labels_over_updates():
    """Three batches (clean, one label -4, labels -2 and -3): three refused labels, the most negative -4."""
    f, _ = clustered(B=4)
    batches = [(f, torch.tensor([0, 1, 0, 1])), (f, torch.tensor([0, -4, 1, -1])), (f, torch.tensor([-2, 1, -3, 0]))]
    message = ("diagnostics: label -4 is negative; class ids are >= 0 and -1 marks an unlabelled image "
               "(3 such label(s) fed to update()).")
    meter = meter_fed(batches)
    assert raised(meter.compute) == message
    assert raised(meter.summarise, meter.state()) == message
    assert raised(meter_fed(batches[::-1]).compute) == message


def test_meter_refuses_a_bad_label_fed_after_clean_batches():
    f, _ = clustered(B=4)
    batches = [(f, torch.tensor([0, 1, 0, 1])), (f, torch.tensor([0, 1, 0, 1])), (f, torch.tensor([0, -5, 1, 1]))]
    message = ("diagnostics: label -5 is negative; class ids are >= 0 and -1 marks an unlabelled image "
               "(1 such label(s) fed to update()).")
    assert raised(meter_fed(batches).compute) == message


def test_meter_pools_non_finite_embeddings_over_updates():
    f, labels = clustered(B=4)
    one, two = f.clone(), f.clone()
    one[0, 1, 2] = math.nan
    two[1, 0, 0], two[3, 1, 3] = math.inf, math.nan
    message = ("diagnostics: features contain NaN or inf (or values whose norm overflows); check the encoder's "
               "output (3 such embedding(s) fed to update()).")
    assert raised(meter_fed([(one, labels), (f, labels), (two, labels)]).compute) == message
    assert raised(meter_fed([(f, labels), (two, labels), (one, labels)]).compute) == message
