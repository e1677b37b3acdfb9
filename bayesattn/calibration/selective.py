"""Selective prediction: the risk–coverage curve, AURC and PAvPU."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .._validation import check_int
from .checks import F64, check_uncertainty_correct, to_tensor


@dataclass(frozen=True)
class RiskCoverage:
    """Risk–coverage curve (all fields ``(N,)``, float64).

    ``coverage[k-1] = k / N``; ``risk[k-1]`` = error rate among the ``k`` most certain examples;
    ``threshold[k-1]`` = the ``k``-th smallest uncertainty (the cut-off at that coverage).
    """

    coverage: Tensor
    risk: Tensor
    threshold: Tensor


def risk_coverage_curve(uncertainty: Tensor, correct: Tensor) -> RiskCoverage:
    """Selective risk as a function of coverage.

    Sort by uncertainty ascending (stable: ties keep input order), then for ``k = 1..N``:
    ``coverage_k = k / N``, ``risk_k = (1/k) Σ_{j≤k} (1 − correct_(j))``.

    Shape:
        uncertainty ``(N,)``, correct ``(N,)`` (bool or 0/1) → fields ``(N,)``.
    """
    u, ok = check_uncertainty_correct(uncertainty, correct)
    n = u.shape[0]
    sorted_u, order = torch.sort(u, stable=True)
    errors = (~ok[order]).to(F64)
    k = torch.arange(1, n + 1, dtype=F64)
    return RiskCoverage(coverage=k / n, risk=torch.cumsum(errors, 0) / k, threshold=sorted_u)


def aurc(uncertainty: Tensor, correct: Tensor) -> float:
    """Area under the risk–coverage curve, ``AURC = (1/N) Σ_{k=1}^{N} risk_k``.

    Shape:
        uncertainty ``(N,)``, correct ``(N,)`` → float.
    """
    return float(risk_coverage_curve(uncertainty, correct).risk.mean())


def accuracy_at_coverage(uncertainty: Tensor, correct: Tensor, coverage: float) -> float:
    """Accuracy on the ``ceil(coverage · N)`` most certain examples (the rest abstained on):
    ``1 − risk_k`` of the risk–coverage curve at ``k = ceil(coverage · N)``.

    Shape:
        uncertainty ``(N,)``, correct ``(N,)`` → float.
    """
    if isinstance(coverage, bool) or not isinstance(coverage, (int, float)) or not (
        0 < coverage <= 1
    ):
        raise ValueError(f"coverage must be a number in (0, 1]; got {coverage!r}")
    rc = risk_coverage_curve(uncertainty, correct)
    k = max(1, math.ceil(coverage * rc.risk.shape[0] - 1e-9))
    return float(1.0 - rc.risk[k - 1])


def pavpu(uncertainty: Tensor, correct: Tensor, threshold: float) -> float:
    """Patch accuracy vs patch uncertainty (Mukhoti & Gal, 2018).

    An example is *certain* iff ``uncertainty <= threshold``;
    ``PAvPU = (n_ac + n_iu) / N`` with ``n_ac`` = #(accurate ∧ certain) and
    ``n_iu`` = #(inaccurate ∧ uncertain).

    Shape:
        uncertainty ``(N,)``, correct ``(N,)`` → float.
    """
    u, ok = check_uncertainty_correct(uncertainty, correct)
    thr = _check_threshold(threshold)
    return float(_pavpu(u, ok, torch.tensor([thr], dtype=F64))[0])


def _check_threshold(threshold: Any) -> float:
    if isinstance(threshold, Tensor) and threshold.numel() == 1:
        threshold = threshold.item()
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        try:
            threshold = float(threshold)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"threshold must be a real number, got {type(threshold).__name__}"
            ) from exc
    if math.isnan(threshold):
        raise ValueError("threshold must not be NaN")
    return float(threshold)


def _pavpu(u: Tensor, ok: Tensor, thresholds: Tensor) -> Tensor:
    certain = u[None, :] <= thresholds[:, None]  # (T, N)
    good = (ok[None, :] & certain) | (~ok[None, :] & ~certain)
    return good.to(F64).mean(dim=1)


@dataclass(frozen=True)
class PAvPUCurve:
    """PAvPU evaluated at several thresholds (both fields ``(T,)``, float64)."""

    threshold: Tensor
    pavpu: Tensor


def pavpu_curve(
    uncertainty: Tensor,
    correct: Tensor,
    thresholds: Tensor | Sequence[float] | None = None,
    n_thresholds: int = 21,
) -> PAvPUCurve:
    """PAvPU (see :func:`pavpu`) at each threshold.

    If ``thresholds`` is None, use the empirical quantiles of ``uncertainty`` at levels
    ``linspace(0, 1, n_thresholds)`` (linear interpolation, :func:`torch.quantile`).

    Shape:
        uncertainty ``(N,)``, correct ``(N,)``, thresholds ``(T,)`` → fields ``(T,)``.
    """
    u, ok = check_uncertainty_correct(uncertainty, correct)
    if thresholds is None:
        n_thresholds = check_int("n_thresholds", n_thresholds, 1)
        thr = torch.quantile(u, torch.linspace(0, 1, n_thresholds, dtype=F64))
    else:
        t = to_tensor(thresholds, "thresholds")
        if t.dim() == 0:
            t = t.reshape(1)
        if t.dim() != 1 or t.shape[0] == 0:
            raise ValueError(
                f"thresholds must be a non-empty 1-D sequence, got shape {tuple(t.shape)}"
            )
        thr = t.to(device="cpu", dtype=F64)
        if bool(torch.isnan(thr).any()):
            raise ValueError(f"thresholds contains NaN (shape {tuple(thr.shape)})")
    return PAvPUCurve(threshold=thr, pavpu=_pavpu(u, ok, thr))
