"""The graph objective against a float64 loop written from docs/graphs.md's formula, and UCL
against InfoGraph's Jensen-Shannon estimator written as InfoGraph states it."""

import math

import pytest
import torch

from hscl_zoo.graphs.objective import LocalGlobalLoss, build_graph_loss


def _softplus(x: float) -> float:
    return math.log1p(math.exp(-abs(x))) + max(x, 0.0)


def _loop(graphs, nodes, batch, labels, positives, negatives, eta, temperature=0.5, tau_plus=0.0):
    s = (nodes.double() @ graphs.double().T).tolist()
    scale = max(abs(v) for row in s for v in row)
    total, count = 0.0, 0
    for i, row in enumerate(s):
        a = int(batch[i])
        pos = [p for p in range(len(row)) if (p == a if positives == "views" else labels[p] == labels[a])]
        neg = [q for q in range(len(row)) if (q != a if negatives == "other-images" else labels[q] != labels[a])]
        if not neg:
            continue
        w = [eta(row[q] / scale / temperature) for q in neg]
        if sum(w) == 0:
            w = [1.0] * len(neg)
        expected = sum(wq * _softplus(row[q]) for wq, q in zip(w, neg)) / sum(w)
        for p in pos:
            term = expected if tau_plus == 0 else max((expected - tau_plus * _softplus(row[p])) / (1 - tau_plus), 0.0)
            total += _softplus(-row[p]) + term
            count += 1
    return total / count if count else 0.0


def _batch(seed=0, graphs=6, dim=5):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(1, 5, (graphs,), generator=gen)
    batch = torch.repeat_interleave(torch.arange(graphs), sizes)
    labels = torch.tensor([0, 1, 0, 2, 1, 0][:graphs])
    return (torch.randn(graphs, dim, generator=gen) * 2, torch.randn(len(batch), dim, generator=gen) * 2, batch, labels)


def _tilt(beta):
    return lambda t: math.exp(beta * t)


def _threshold(level, temperature=0.5):
    return lambda t: 1.0 if t * temperature >= level else 0.0


CASES = [
    ("ucl", {}, "views", "other-images", lambda t: 1.0, 0.0),
    ("hucl", {"beta": 2.0}, "views", "other-images", _tilt(2.0), 0.0),
    ("hucl", {"beta": 1.0, "tau_plus": 0.3}, "views", "other-images", _tilt(1.0), 0.3),
    ("hucl", {"threshold": 0.2}, "views", "other-images", _threshold(0.2), 0.0),
    ("scl", {}, "labels", "other-labels", lambda t: 1.0, 0.0),
    ("hscl-beta", {"beta": 10.0}, "labels", "other-labels", _tilt(10.0), 0.0),
    ("hscl-beta", {"beta": 1.0, "positives": "views"}, "views", "other-labels", _tilt(1.0), 0.0),
    ("hscl-tau", {"threshold": 0.0}, "labels", "other-labels", _threshold(0.0), 0.0),
    ("hscl-tau", {"threshold": 0.9}, "labels", "other-labels", _threshold(0.9), 0.0),
]


@pytest.mark.parametrize("method,kwargs,positives,negatives,eta,tau_plus", CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_method_equals_the_float64_loop(method, kwargs, positives, negatives, eta, tau_plus, seed):
    graphs, nodes, batch, labels = _batch(seed)
    loss = build_graph_loss(method, **kwargs)(graphs, nodes, batch, labels)
    expected = _loop(graphs, nodes, batch, labels.tolist(), positives, negatives, eta, tau_plus=tau_plus)
    assert float(loss) == pytest.approx(expected, rel=2e-6), (method, kwargs)


def test_a_high_threshold_falls_back_to_uniform_weights_on_anchors_with_no_hard_negative():
    graphs, nodes, batch, labels = _batch(3)
    hard = build_graph_loss("hscl-tau", threshold=1.0)(graphs, nodes, batch, labels)
    uniform = build_graph_loss("scl")(graphs, nodes, batch, labels)
    assert abs(float(hard) - float(uniform)) < 1e-6 * abs(float(uniform))


def test_ucl_is_infographs_jensen_shannon_loss_plus_two_log_two():
    graphs, nodes, batch, _ = _batch(4)
    s = nodes.double() @ graphs.double().T
    own = torch.nn.functional.one_hot(batch, graphs.shape[0]).bool()
    # InfoGraph: E_pos = mean over (node, own graph) of log 2 - softplus(-s);
    # E_neg = mean over (node, other graph) of softplus(-s) + s - log 2; loss = E_neg - E_pos.
    e_pos = (math.log(2) - torch.nn.functional.softplus(-s[own])).mean()
    e_neg = (torch.nn.functional.softplus(-s[~own]) + s[~own] - math.log(2)).mean()
    loss = build_graph_loss("ucl")(graphs, nodes, batch)
    assert float(loss) == pytest.approx(float(e_neg - e_pos) + 2 * math.log(2), rel=1e-6)


def test_no_negatives_anywhere_gives_zero_with_a_gradient():
    graphs, nodes, batch, _ = _batch(5)
    graphs.requires_grad_(True)
    labels = torch.zeros(graphs.shape[0], dtype=torch.long)
    loss = build_graph_loss("scl")(graphs, nodes, batch, labels)
    loss.backward()
    assert loss.item() == 0.0 and graphs.grad is not None


def test_label_methods_refuse_a_call_without_labels_and_options_are_checked():
    graphs, nodes, batch, _ = _batch(0)
    with pytest.raises(ValueError, match="pass labels"):
        build_graph_loss("hscl-beta")(graphs, nodes, batch)
    with pytest.raises(ValueError, match="does not take queue_size"):
        build_graph_loss("scl", queue_size=4)
    with pytest.raises(ValueError, match="beta must be a finite number >= 0"):
        build_graph_loss("hscl-beta", beta=-1.0)
    with pytest.raises(ValueError, match="tau_plus"):
        LocalGlobalLoss("other-images", "views", tau_plus=1.0)


def test_the_tilt_moves_weight_to_the_hardest_negative():
    graphs = torch.tensor([[1.0, 0.0], [0.9, 0.1], [-1.0, 0.0]])
    nodes = torch.tensor([[2.0, 0.0]])
    batch = torch.tensor([0])
    plain = build_graph_loss("ucl")(graphs, nodes, batch)
    hard = build_graph_loss("hucl", beta=10.0)(graphs, nodes, batch)
    # The hard negative (score 1.8) dominates: its softplus is larger than the easy one's (score -2).
    assert float(hard) > float(plain)
