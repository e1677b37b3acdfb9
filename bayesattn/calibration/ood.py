"""Out-of-distribution detection scores: AUROC and AUPR of in- against out-of-distribution
scores."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .checks import F64, to_float64, to_tensor


def check_ood_scores(scores_in: Any, scores_out: Any) -> tuple[Tensor, Tensor]:
    """Finite, non-empty 1-D in- and out-of-distribution scores as float64 tensors;
    ``ValueError`` naming the argument and both shapes otherwise."""
    s_in = to_tensor(scores_in, "scores_in")
    s_out = to_tensor(scores_out, "scores_out")
    for name, t in (("scores_in", s_in), ("scores_out", s_out)):
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D with shape (N,), got shape {tuple(t.shape)}")
        if t.shape[0] == 0:
            raise ValueError(
                f"{name} is empty (shape {tuple(t.shape)}): OOD metrics need both "
                f"in-distribution and out-of-distribution scores (labels with only one class); "
                f"got scores_in {tuple(s_in.shape)}, scores_out {tuple(s_out.shape)}"
            )
    return to_float64(s_in, "scores_in"), to_float64(s_out, "scores_out")


def ood_auroc(scores_in: Tensor, scores_out: Tensor) -> float:
    """AUROC for detecting OOD inputs (positive class = OOD, higher score = more OOD).

    Mann–Whitney form with ties counted as 1/2:
    ``AUROC = (1 / (n_in n_out)) Σ_{j∈out} Σ_{i∈in} (1[s_j > s_i] + ½ 1[s_j = s_i])``.
    Equals ``P(s_out > s_in) + ½ P(s_out = s_in)``; ``ood_auroc(a, b) = 1 − ood_auroc(b, a)``.

    Shape:
        scores_in ``(N_in,)``, scores_out ``(N_out,)`` → float.
    """
    s_in, s_out = check_ood_scores(scores_in, scores_out)
    sorted_in, s_out = torch.sort(s_in).values, s_out.contiguous()  # a column slice is strided
    less = torch.searchsorted(sorted_in, s_out, right=False)
    less_eq = torch.searchsorted(sorted_in, s_out, right=True)
    # Integer arithmetic: 2·U = Σ_j (2·less_j + ties_j), exact for any realistic N.
    twice_u = int((less + less_eq).sum())
    return twice_u / (2.0 * s_in.shape[0] * s_out.shape[0])


def ood_aupr(scores_in: Tensor, scores_out: Tensor) -> float:
    """Area under the precision–recall curve for OOD detection (positive class = OOD).

    Average precision, as in scikit-learn: over the distinct score thresholds ``t_n`` in
    decreasing order, ``AP = Σ_n (R_n − R_{n−1}) P_n`` with ``R_0 = 0``, where ``P_n``/``R_n`` are
    precision/recall when predicting OOD for ``s >= t_n`` (tied scores enter together).

    Shape:
        scores_in ``(N_in,)``, scores_out ``(N_out,)`` → float.
    """
    s_in, s_out = check_ood_scores(scores_in, scores_out)
    scores = torch.cat([s_out, s_in])
    is_pos = torch.cat(
        [torch.ones(s_out.shape[0], dtype=F64), torch.zeros(s_in.shape[0], dtype=F64)]
    )
    order = torch.sort(scores, descending=True, stable=True).indices
    scores, is_pos = scores[order], is_pos[order]
    # Last index of every run of equal scores = one threshold.
    last = torch.ones_like(scores, dtype=torch.bool)
    last[:-1] = scores[1:] != scores[:-1]
    ends = torch.nonzero(last).squeeze(1)
    tps = torch.cumsum(is_pos, 0)[ends]
    n_pred = (ends + 1).to(F64)
    precision = tps / n_pred
    recall = tps / s_out.shape[0]
    d_recall = torch.diff(recall, prepend=torch.zeros(1, dtype=F64))
    return float((d_recall * precision).sum())
