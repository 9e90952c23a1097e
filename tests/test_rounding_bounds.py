"""The rounding bounds the cross-path comparisons use (tests/rounding.py), against sums computed
in several orders, a float64 reference, and hand-counted decisions."""

from __future__ import annotations

import numpy as np
import torch

from rounding import dot_product_bound, near_a_boundary, reordered_sum_bound, undecided_argmax, unit_roundoff


def test_float32_sums_in_four_orders_stay_within_the_reordering_bound_and_it_is_not_vacuous():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 4096)
    ordered = [x, x.flip(0), x[x.abs().argsort()]]
    orders = [np.add.accumulate(v.numpy())[-1] for v in ordered] + [x.sum()]  # numpy accumulates in float32
    bound = reordered_sum_bound(float(x.abs().sum()), len(x), torch.float32)
    exact = float(x.double().sum())
    assert all(abs(float(a) - float(b)) <= bound for a in orders for b in orders)
    assert all(abs(float(a) - exact) <= bound / 2 for a in orders)
    assert max(abs(float(a) - float(b)) for a in orders for b in orders) > 0, "the orders should differ"
    assert bound < 1e-2 * float(x.abs().sum()), "a bound this loose would accept a wrong sum"


def test_dot_products_of_two_shapes_stay_within_the_dot_product_bound():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 777, generator=gen), torch.randn(777, 48, generator=gen)
    whole, rows = a @ b, torch.cat([a[i:i + 5] @ b for i in range(0, 64, 5)])
    looped = torch.stack([(a * b[:, j]).sum(dim=1) for j in range(48)], dim=1)
    bound = dot_product_bound(a.abs() @ b.abs(), 777, torch.float32)
    assert ((whole - rows).abs() <= bound).all() and ((whole - looped).abs() <= bound).all()
    assert ((whole.double() - a.double() @ b.double()).abs() <= bound / 2).all()


def test_decisions_near_a_boundary_and_near_ties_are_counted_by_hand():
    assert unit_roundoff(torch.float32) == 2.0 ** -24 and unit_roundoff(torch.float64) == 2.0 ** -53
    values = torch.tensor([0.1, 0.48, 0.5, 0.53, 0.9, 0.97])
    assert near_a_boundary(values, torch.tensor([0.5, 1.0]), 0.04) == 4  # 0.48, 0.5, 0.53 and 0.97
    assert near_a_boundary(values, 0.5, 0.0) == 1
    logits = torch.tensor([[1.0, 0.99, 0.0], [2.0, 0.0, 1.0], [0.5, 0.5, 0.5]])
    assert undecided_argmax(logits, 0.005).tolist() == [True, False, True]
    assert undecided_argmax(logits, torch.full((3, 3), 0.004)).tolist() == [False, False, True]
