"""DiagnosticsMeter keeps its sums on the features' device and never reads a value back in
`update`: its records equal the standalone diagnostics functions batch by batch (unlabelled rows
and a threshold included), and `update` runs on the meta device, where every read of a value
(.item(), bool(), .tolist(), .cpu(), a boolean-mask index) raises."""

from __future__ import annotations

import math

import pytest
import torch

from hscl_zoo.losses.diagnostics import (
    NEGATIVE_COSINE_BINS,
    DiagnosticsMeter,
    assumption_counts,
    lemma_losses,
    negative_cosines,
    negative_masses,
)
from hscl_zoo.losses.hardening import ExponentialTilt, Threshold
from hscl_zoo.losses.terms import log_weighted_mean_exp, normalized, pair_sets
from rounding import near_a_boundary, reordered_sum_bound, unit_roundoff

V = 2


def batches(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four batches: fully labelled, partly unlabelled (-1), one without any label, and another size."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for B, unlabelled in ((16, ()), (20, (0, 3, 4, 11, 19)), (6, tuple(range(6))), (12, (5,))):
        labels = torch.randint(0, 4, (B,), generator=gen)
        labels[list(unlabelled)] = -1
        out.append((torch.randn(B, V, 8, generator=gen, dtype=dtype), labels))
    return out


def expected_state(data, *, beta=None, threshold=None, temperature=0.5) -> torch.Tensor:
    """The meter's state, laid out as DiagnosticsMeter.state(), from the standalone functions."""
    kw = dict(beta=beta, threshold=threshold, temperature=temperature)
    eta = Threshold(threshold, temperature) if threshold is not None else ExponentialTilt(beta)
    holds = eligible = n_batches = held = kept = labelled = unlabelled = 0
    losses = dict.fromkeys(DiagnosticsMeter.LOSSES, 0.0)
    masses = dict.fromkeys(DiagnosticsMeter.MASSES, 0.0)
    counts = torch.zeros(NEGATIVE_COSINE_BINS, dtype=torch.float64)
    for f, y in data:
        n = int((y != -1).sum()) * V
        labelled, unlabelled = labelled + n, unlabelled + y.numel() * V - n
        if n == 0:
            continue
        h, e = assumption_counts(f, y, **kw)
        batch_losses = lemma_losses(f, y, **kw)
        holds, eligible, n_batches = holds + h, eligible + e, n_batches + 1
        held += batch_losses["hscl"] <= batch_losses["hucl"]
        for k in losses:
            losses[k] += batch_losses[k]
        for k, value in negative_masses(f, y, eta, temperature=temperature).items():
            masses[k] += float(value.mean())
        cosines = negative_cosines(f, y).float().clamp(-1.0, 1.0)
        counts += torch.histc(cosines, bins=NEGATIVE_COSINE_BINS, min=-1.0, max=1.0).double()
        if threshold is not None:
            kept += int((cosines >= threshold).sum())
    scalars = [holds, eligible, n_batches, held, kept, labelled, unlabelled, *losses.values(), *masses.values()]
    return torch.cat([torch.tensor(scalars, dtype=torch.float64), counts])


def reach(scale: float, n_terms: int, dtype: torch.dtype) -> float:
    """How far the meter's value of a quantity may lie from the standalone functions': the meter
    works on the whole batch with unlabelled rows masked, the functions on the labelled rows only,
    so their products and reductions run over other shapes and orders. Sixteen reordering bounds
    of an `n_terms` reduction at `scale` cover the normalisation, the product, the log-sum-exp and
    the division each quantity chains (each at most one such reduction)."""
    return 16 * reordered_sum_bound(scale, n_terms, dtype)


def undecided(data, *, beta=None, threshold=None, temperature=0.5) -> dict[str, int]:
    """Per decision the meter counts, how many of the data's decisions lie within `reach` of their
    boundary, where the two computations may take them differently: an eligible anchor's Assumption 1
    (mean over collisions >= mean over other labels; with a threshold, also any cosine at its level),
    a batch's lemma (L_HSCL <= L_HUCL), a cosine's threshold and its histogram bin (after the cast to
    float32 and histc's own arithmetic, a few float32 roundings more)."""
    eta = Threshold(threshold, temperature) if threshold is not None else ExponentialTilt(beta)
    tilt = 0.0 if threshold is not None else beta
    out = dict.fromkeys(("holds", "held", "kept", "bins"), 0)
    edges = torch.linspace(-1.0, 1.0, NEGATIVE_COSINE_BINS + 1, dtype=torch.float64)
    for f, y in data:
        if not (y != -1).any():
            continue
        n = f.shape[0] * V
        kept_f, kept_y = f[y != -1], y[y != -1]
        z = normalized(kept_f, loss_name="test").reshape(-1, f.shape[-1])
        cosines = z @ z.T
        sets = pair_sets(len(kept_y), V, len(kept_y), 0, kept_y, device=f.device)
        near_cosine = reach(1.0, max(n, f.shape[-1]) + 1, f.dtype)
        cast = near_cosine + 4 * unit_roundoff(torch.float32)
        out["bins"] += near_a_boundary(cosines[sets.other_labels], edges, cast)
        if threshold is not None:
            out["kept"] += near_a_boundary(cosines[sets.other_labels], threshold, cast)
        g = cosines / temperature
        has_collision, has_other = sets.collisions.any(dim=1), sets.other_labels.any(dim=1)
        margin = (log_weighted_mean_exp(g, sets.collisions, has_collision, eta)
                  - log_weighted_mean_exp(g, sets.other_labels, has_other, eta))
        near_mean = (1 + 2 * tilt) * near_cosine / temperature + reach(float(g.abs().max()) + math.log(n), n, f.dtype)
        ambiguous = margin.abs() <= near_mean
        if threshold is not None:
            at_level = ((cosines - threshold).abs() <= near_cosine) & (sets.collisions | sets.other_labels)
            ambiguous |= at_level.any(dim=1)
        out["holds"] += int((ambiguous & has_collision & has_other).sum())
        losses = lemma_losses(f, y, beta=beta, threshold=threshold, temperature=temperature)
        scale = abs(losses["hscl"]) + abs(losses["hucl"]) + float(g.abs().max()) + math.log(n)
        out["held"] += abs(losses["hscl"] - losses["hucl"]) <= reach(scale, n * n, f.dtype)
    return out


@pytest.mark.parametrize("dtype, rel", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("hardening", [{"beta": 1.0}, {"threshold": 0.1}])
def test_meter_sums_equal_the_standalone_functions(dtype, rel, hardening):
    data = batches(dtype)
    meter = DiagnosticsMeter(**hardening)
    for f, y in data:
        meter.update(f, y)
    state, expected = meter.state(), expected_state(data, **hardening)
    assert state.dtype == torch.float64 and state.shape == expected.shape
    assert expected[2] == 3 and expected[6] == (5 + 6 + 1) * V, "a batch without labels and unlabelled rows are in"
    assert expected[4] > 0 if "threshold" in hardening else expected[4] == 0
    masks_only = [1, 2, 5, 6]
    decisions = {"holds": 0, "held": 3, "kept": 4}
    sums = slice(7, 7 + len(meter.LOSSES) + len(meter.MASSES))
    counts = slice(sums.stop, None)
    assert state[masks_only].tolist() == expected[masks_only].tolist(), "eligible anchors, batches, rows: from masks"
    open_ = undecided(data, **hardening)
    for name, index in decisions.items():
        assert abs(state[index] - expected[index]) <= open_[name], (
            f"{name}: {state[index]} against {expected[index]}, where only {open_[name]} decision(s) lie within "
            "rounding reach of their boundary")
    moved = (state[counts] - expected[counts]).abs().sum()
    assert moved <= 2 * open_["bins"] and state[counts].sum() == expected[counts].sum(), (
        f"{moved / 2} cosine(s) in another bin, where only {open_['bins']} lie within rounding reach of a bin edge")
    torch.testing.assert_close(state[sums], expected[sums], rtol=rel, atol=0)
    decided = expected.clone()
    decided[list(decisions.values())] = state[list(decisions.values())]
    decided[counts] = state[counts]

    record, reference = meter.compute(), meter.summarise(decided)
    assert record.keys() == reference.keys()
    assert ("threshold_kept_fraction" in record) == ("threshold" in hardening)
    for key, value in record.items():
        assert value == pytest.approx(reference[key], rel=rel, abs=0), key


def test_meter_update_reads_nothing_back_from_the_device():
    """On the meta device tensors have shapes and no values: any host read raises, so `update`
    completing there (twice, threshold and tilt, unlabelled rows included) shows it has none, and
    the sums stay on the features' device."""
    probe = torch.ones(3, device="meta")
    host_reads = [lambda t: t.sum().item(), lambda t: bool(t.any()), lambda t: int(t.sum()), lambda t: t.tolist(),
                  lambda t: t.cpu(), lambda t: t[t > 0], lambda t: t[torch.tensor(1, device="meta")]]
    for read in host_reads:
        with pytest.raises((RuntimeError, NotImplementedError)):
            read(probe)
    f = torch.empty(8, V, 4, device="meta")
    labels = torch.empty(8, dtype=torch.int64, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError)):  # the standalone functions do read values back
        assumption_counts(f, labels, beta=1.0)
    for hardening in ({"beta": 1.0}, {"threshold": 0.1}, {"hardening": ExponentialTilt(2.0)}):
        meter = DiagnosticsMeter(**hardening)
        meter.update(f, labels)
        meter.update(f[:5], labels[:5])
        state = meter.state()
        assert state.device.type == "meta" and state.dtype == torch.float64 and state.shape == (meter.state_size,)


def test_meter_refuses_bad_inputs_when_it_reports():
    """The input checks cost a host read, so `update` counts violations on the device and
    `compute` / `summarise` raise them."""
    f = torch.randn(6, V, 4)
    meter = DiagnosticsMeter(beta=1.0)
    meter.update(f, torch.tensor([0, 1, -3, 0, -1, 2]))
    with pytest.raises(ValueError, match="label -3 is negative"):
        meter.compute()
    with pytest.raises(ValueError, match="label -3 is negative"):
        meter.summarise(meter.state())
    meter.reset()
    bad = f.clone()
    bad[2, 1, 0] = math.nan
    meter.update(bad, torch.tensor([0, 1, 2, 0, 1, 2]))
    with pytest.raises(ValueError, match="NaN or inf"):
        meter.compute()
    meter.reset()
    meter.update(f, torch.tensor([0, 1, 2, 0, -1, 2]))
    assert meter.compute()["diagnostics_unlabelled_anchors"] == V
    with pytest.raises(ValueError, match="integer class ids"):  # shapes and dtypes are checked at once
        meter.update(f, torch.zeros(6))


def test_a_meter_started_from_a_saved_state_continues_it_exactly():
    """A run resumed within an epoch starts its meter from the sums saved at the stop: fed the
    remaining batches, it holds the sums of all of them, added in the order one meter fed every
    batch adds them (so equal to its bits), and it still refuses bad input."""
    data = batches(torch.float64)
    whole, first, resumed = (DiagnosticsMeter(threshold=0.1) for _ in range(3))
    for f, y in data:
        whole.update(f, y)
    for f, y in data[:2]:
        first.update(f, y)
    resumed.start_from(torch.tensor(first.state().tolist(), dtype=torch.float64))  # through JSON's floats
    for f, y in data[2:]:
        resumed.update(f, y)
    assert torch.equal(resumed.state(), whole.state())
    torch.testing.assert_close(resumed.state(), expected_state(data, threshold=0.1), rtol=1e-12, atol=0)
    assert resumed.compute() == whole.compute()

    resumed.update(data[0][0], torch.full_like(data[0][1], -3))
    with pytest.raises(ValueError, match="label -3 is negative"):
        resumed.compute()
    with pytest.raises(ValueError, match=r"a state holds \d+ sums, got shape \(3,\)"):
        DiagnosticsMeter(beta=1.0).start_from(torch.zeros(3))


def test_a_meter_started_from_a_state_summarises_it_before_any_batch_and_sums_in_float64():
    """A run stopped right at a checkpoint resumes with no batch left in the epoch: the meter
    started from the saved state summarises it as the meter that saved it did. A state that
    travelled as float32 is widened, so the sums still add in float64."""
    data = batches(torch.float64)
    first, resumed, widened = (DiagnosticsMeter(threshold=0.1) for _ in range(3))
    for f, y in data:
        first.update(f, y)
    resumed.start_from(first.state())
    assert resumed.compute() == first.compute()
    widened.start_from(first.state().float())
    widened.update(*data[0])
    assert widened.state().dtype == torch.float64
