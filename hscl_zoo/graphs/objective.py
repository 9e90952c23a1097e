"""The local-global objective for graphs: InfoGraph's estimator with the method table's negatives
and hardening (docs/graphs.md states it as a formula).

An anchor is a node i of graph a(i); the candidates are the batch's graphs, scored by the dot
product s_ig of the node's and the graph's projections (InfoGraph's scores). A method fixes, as
for images, the positives P_i (``views``: the node's own graph; ``labels``: every graph of its
graph's label), the negatives N_i (``other-images``: every other graph; ``other-labels``: graphs
of another label) and the hardening eta of the negatives. Per (anchor, positive) pair,

    psi_ip = softplus(-s_ip) + sum_{n in N_i} w_in softplus(s_in) / sum_{n in N_i} w_in,

with w_in = eta(t_in) and t_in = (s_in / max |s|) / temperature: the batch's largest score
(a constant, not differentiated) maps the scores into [-1, 1], the role a cosine plays for
images, so beta and threshold mean what they mean there (HCL's graph code scales the same way).
The loss is the mean of psi over all pairs whose anchor has a negative. With tau_plus > 0 (H-UCL's
debiasing, Robinson et al.) the negative term becomes
max((E_w - tau_plus softplus(s_ip)) / (1 - tau_plus), 0). For UCL this is InfoGraph's
Jensen-Shannon loss plus the constant 2 log 2.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hscl_zoo.losses.hardening import HardeningFn, log_hardening_weight
from hscl_zoo.losses.methods import get_method, hyperparameter_values
from hscl_zoo.losses.pairs import Negatives, Positives

__all__ = ["LocalGlobalLoss", "build_graph_loss", "GRAPH_LOSS_OPTIONS"]

GRAPH_LOSS_OPTIONS = ("temperature", "positives")
"""Keywords every method takes for graphs, besides its own hyperparameters."""


class LocalGlobalLoss(nn.Module):
    """The graph objective of one method (see the module docstring).

    Call with (graph projections (G, d), node projections (N, d), each node's graph (N,), graph
    labels (G,) or None). Labels are needed for ``labels`` positives or ``other-labels`` negatives.
    """

    def __init__(self, negatives: Negatives, positives: Positives, hardening: HardeningFn | None = None,
                 temperature: float = 0.5, tau_plus: float = 0.0, name: str = "") -> None:
        super().__init__()
        if not 0.0 <= tau_plus < 1.0:
            raise ValueError(f"tau_plus is a class prior in [0, 1), got {tau_plus!r}.")
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}.")
        self.negatives, self.positives = negatives, positives
        self.hardening, self.temperature, self.tau_plus, self.name = hardening, float(temperature), float(tau_plus), name

    @property
    def needs_labels(self) -> bool:
        return self.positives == "labels" or self.negatives == "other-labels"

    def forward(self, graphs: Tensor, nodes: Tensor, batch: Tensor, labels: Tensor | None = None) -> Tensor:
        if self.needs_labels and labels is None:
            raise ValueError(f"{self.name or 'this loss'} uses graph labels (positives={self.positives}, "
                             f"negatives={self.negatives}); pass labels.")
        scores = nodes @ graphs.T
        own = batch[:, None] == torch.arange(graphs.shape[0], device=batch.device)[None, :]
        same = own if labels is None else labels[batch][:, None] == labels[None, :]
        positive = same if self.positives == "labels" else own
        negative = ~(same if self.negatives == "other-labels" else own)
        has_negative = negative.any(dim=1)
        pairs = positive & has_negative[:, None]
        count = int(pairs.sum())
        if count == 0:
            return (scores * 0).sum()
        softplus = F.softplus(scores)
        if self.hardening is None:
            weights = negative / negative.sum(dim=1, keepdim=True).clamp_min(1)
        else:
            scale = scores.detach().abs().max().clamp_min(torch.finfo(scores.dtype).tiny)
            log_w = log_hardening_weight(self.hardening, scores / scale / self.temperature)
            none_hard = ~(torch.isfinite(log_w) & negative).any(dim=1, keepdim=True)
            log_w = torch.where(none_hard, torch.zeros_like(log_w), log_w).masked_fill(~negative, -math.inf)
            weights = torch.softmax(log_w.masked_fill(~has_negative[:, None], 0.0), dim=1) * negative
        expected = (weights * softplus).sum(dim=1)
        positive_term = softplus - scores
        if self.tau_plus > 0:
            debiased = ((expected[:, None] - self.tau_plus * softplus) / (1 - self.tau_plus)).clamp_min(0.0)
            return (positive_term + debiased)[pairs].sum() / count
        per_anchor = pairs.sum(dim=1)
        return ((positive_term * pairs).sum() + (per_anchor * expected).sum()) / count


def build_graph_loss(name: str, **kwargs: Any) -> LocalGlobalLoss:
    """The graph objective of a registered method ("ucl", "hucl", "scl", "hscl-beta", "hscl-tau", or
    one you registered): its negatives, default positives and hardening come from the method table.

    Keywords: temperature (0.5: the scaled scores lie in [-2, 2]), positives (the method's default),
    and the method's own hyperparameters (beta, threshold, tau_plus) with their defaults and ranges.
    """
    spec = get_method(name)
    allowed = (*GRAPH_LOSS_OPTIONS, *(h.name for h in spec.hyperparameters))
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(f"{spec.name} on graphs does not take {', '.join(unknown)}; it takes {', '.join(allowed)}.")
    temperature = kwargs.get("temperature", 0.5)
    values = hyperparameter_values(spec, kwargs)
    hardening = spec.hardening(values, temperature) if spec.hardening is not None else None
    return LocalGlobalLoss(spec.negatives, kwargs.get("positives", spec.positives), hardening, temperature,
                           values.get("tau_plus") or 0.0, spec.name)
