"""H-SCL(beta) computed the way the paper's released training script does it, for timing only.

This is NOT the official code. It is our own transcription of its *approach*, written so that
benchmarks/loss_bench.py can time that approach against hscl_zoo's vectorised log-space loss
without a copy of the official repository (with one, `loss_bench.py --official-repo PATH` times
the official function itself, see `official_repo.py`):

* the two views are concatenated view-major into N = 2B embeddings and the whole similarity
  matrix is exponentiated (dense arithmetic in exp space, no max-subtraction);
* the same-label mask is filled by a Python loop over the N rows, each row finding its
  same-label columns with a data-dependent index (one host/device synchronisation per row on
  a GPU);
* the hard-negative importance weights exp(beta * log(e^{g})) are written into a zero tensor by
  boolean-mask indexed assignment, and the (anchor, positive) terms are picked out by indexing.

Definition: for anchor i and positive p (same label, p != i),
    loss_ip = -log( e^{g_ip} / (e^{g_ip} + (N - 2) * sum_j w_ij e^{g_ij} / sum_j w_ij) ),
w_ij = exp(beta * g_ij) on different-label j, g = cosine / temperature, averaged over all pairs.
That is hscl_zoo's `build_loss("hscl-beta", beta=beta, temperature=temperature)` (label
positives, M = N - 2, weights not detached) whenever every anchor has at least one
different-label embedding; the transcription has no guard for anchors without negatives (it
yields NaN there, as the approach it copies does).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def official_style_hscl_beta(features: Tensor, labels: Tensor, temperature: float = 0.5, beta: float = 1.0) -> Tensor:
    """H-SCL(beta) of `features` (B, 2, d) and `labels` (B,) in the official script's style."""
    B, V, _ = features.shape
    if V != 2:
        raise ValueError(f"the official-style transcription handles exactly two views, got V = {V}.")
    z = F.normalize(features, dim=-1)
    out = torch.cat([z[:, 0], z[:, 1]], dim=0)
    label = torch.cat([labels, labels], dim=0)
    n = out.shape[0]
    exp_sim = torch.exp(out @ out.t() / temperature)

    same = torch.zeros(n, n, dtype=out.dtype, device=out.device)
    for row in range(n):
        columns = (label == label[row]).nonzero().flatten()
        same[row, columns] = 1.0
    diff = 1.0 - same
    pos_mask = same - torch.eye(n, dtype=out.dtype, device=out.device)

    neg = diff * exp_sim
    is_neg = diff.bool()
    weight = torch.zeros_like(neg)
    weight[is_neg] = torch.exp(beta * torch.log(neg[is_neg]))
    weighted_mean = (weight * neg).sum(dim=1) / weight.sum(dim=1)

    pos = pos_mask * exp_sim
    ratio = pos / (pos + (n - 2) * weighted_mean[:, None])
    anchors, positives = (pos_mask != 0).nonzero(as_tuple=True)
    return -torch.log(ratio[anchors, positives]).mean()
