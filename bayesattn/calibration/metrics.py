"""Calibration metrics of class probabilities: the reliability curve, ECE/MCE, NLL, Brier score,
accuracy and predictive entropy."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .._validation import check_int, check_real
from ..functional import entropy
from .checks import F64, Strategy, check_probs, check_probs_labels, check_strategy, to_tensor


@dataclass(frozen=True)
class ReliabilityCurve:
    """Per-bin statistics of a reliability diagram (all fields have shape ``(n_bins,)``).

    ``bin_lower``/``bin_upper``: for ``"uniform"`` the bin edges ``b/n_bins`` and
    ``(b+1)/n_bins``; for ``"quantile"`` the smallest and largest confidence falling in the bin
    (NaN for an empty bin).  ``confidence``/``accuracy``: mean confidence and accuracy in the bin
    (NaN for an empty bin).  ``count``: number of examples in the bin (int64).
    """

    bin_lower: Tensor
    bin_upper: Tensor
    confidence: Tensor
    accuracy: Tensor
    count: Tensor

    @property
    def n_bins(self) -> int:
        return int(self.count.shape[0])

    @property
    def gap(self) -> Tensor:
        """``|accuracy - confidence|`` per bin (NaN for empty bins)."""
        return (self.accuracy - self.confidence).abs()


def _bin_assignment(conf: Tensor, n_bins: int, strategy: str) -> Tensor:
    """Bin index in ``[0, n_bins)`` of every confidence value.

    uniform: edges ``e_b = b / n_bins`` (float64); bin ``b`` is ``(e_b, e_{b+1}]`` and the first
    bin is closed, ``[0, e_1]``; confidences above 1 (row-sum tolerance) fall in the last bin.
    quantile: stable ascending sort, then ``np.array_split``-style
    contiguous chunks whose sizes differ by at most one (the first ``N mod n_bins`` get the extra
    example); tied confidences keep their input order, so a run of ties may straddle two bins.
    """
    n = conf.shape[0]
    if strategy == "uniform":
        interior = torch.arange(1, n_bins, dtype=F64) / n_bins
        # bucketize(right=False): index i with interior[i-1] < x <= interior[i].
        return torch.bucketize(conf, interior, right=False)
    order = torch.sort(conf, stable=True).indices
    base, extra = divmod(n, n_bins)
    sizes = torch.full((n_bins,), base, dtype=torch.long)
    sizes[:extra] += 1
    sorted_bins = torch.repeat_interleave(torch.arange(n_bins), sizes)
    idx = torch.empty(n, dtype=torch.long)
    idx[order] = sorted_bins
    return idx


def reliability_curve(
    probs: Tensor, labels: Tensor, n_bins: int = 15, strategy: Strategy = "uniform"
) -> ReliabilityCurve:
    """Bin examples by confidence and report mean confidence and accuracy per bin.

    With ``conf_i = max_c p_ic``, ``ŷ_i = argmax_c p_ic`` and bins ``B_b``:
    ``conf_b = mean_{i∈B_b} conf_i``, ``acc_b = mean_{i∈B_b} 1[ŷ_i = y_i]``.

    Bins (``strategy``): ``"uniform"`` uses equal-width bins ``(b/n, (b+1)/n]`` with the first bin
    ``[0, 1/n]``; ``"quantile"`` uses equal-mass bins: examples are sorted by confidence with a
    stable sort (ties keep input order) and split into ``n_bins`` contiguous chunks whose sizes
    differ by at most one (larger chunks first).

    Shape:
        probs ``(N, C)``, labels ``(N,)`` → every field ``(n_bins,)``.
    """
    p, y = check_probs_labels(probs, labels)
    n_bins = check_int("n_bins", n_bins, 1)
    strategy = check_strategy(strategy)
    conf, pred = p.max(dim=1).values, p.argmax(dim=1)
    hit = (pred == y).to(F64)
    idx = _bin_assignment(conf, n_bins, strategy)

    count = torch.bincount(idx, minlength=n_bins)
    conf_sum = torch.zeros(n_bins, dtype=F64).index_add_(0, idx, conf)
    acc_sum = torch.zeros(n_bins, dtype=F64).index_add_(0, idx, hit)
    empty = count == 0
    denom = count.to(F64).clamp_min(1)
    nan = torch.tensor(float("nan"), dtype=F64)
    confidence = torch.where(empty, nan, conf_sum / denom)
    acc = torch.where(empty, nan, acc_sum / denom)

    if strategy == "uniform":
        edges = torch.arange(n_bins + 1, dtype=F64) / n_bins
        lower, upper = edges[:-1].clone(), edges[1:].clone()
    else:
        lower = torch.full((n_bins,), float("inf"), dtype=F64).scatter_reduce(
            0, idx, conf, reduce="amin"
        )
        upper = torch.full((n_bins,), -float("inf"), dtype=F64).scatter_reduce(
            0, idx, conf, reduce="amax"
        )
        lower = torch.where(empty, nan, lower)
        upper = torch.where(empty, nan, upper)
    return ReliabilityCurve(lower, upper, confidence, acc, count)


def expected_calibration_error(
    probs: Tensor, labels: Tensor, n_bins: int = 15, strategy: Strategy = "uniform"
) -> float:
    """Expected calibration error ``ECE = Σ_b (|B_b| / N) · |acc_b − conf_b|``.

    Bins as in :func:`reliability_curve`; empty bins contribute 0.  Result is in ``[0, 1]``.

    Shape:
        probs ``(N, C)``, labels ``(N,)`` → float.
    """
    curve = reliability_curve(probs, labels, n_bins=n_bins, strategy=strategy)
    mask = curve.count > 0
    weights = curve.count[mask].to(F64) / curve.count.sum()
    return float((weights * curve.gap[mask]).sum())


def maximum_calibration_error(
    probs: Tensor, labels: Tensor, n_bins: int = 15, strategy: Strategy = "uniform"
) -> float:
    """Maximum calibration error ``MCE = max_{b : |B_b| > 0} |acc_b − conf_b|``.

    Bins as in :func:`reliability_curve`.  Always ``MCE >= ECE``.

    Shape:
        probs ``(N, C)``, labels ``(N,)`` → float.
    """
    curve = reliability_curve(probs, labels, n_bins=n_bins, strategy=strategy)
    return float(curve.gap[curve.count > 0].max())


def negative_log_likelihood(probs: Tensor, labels: Tensor, eps: float = 1e-12) -> float:
    """Mean negative log-likelihood ``NLL = −(1/N) Σ_i log max(p_{i,y_i}, eps)``.

    Shape:
        probs ``(N, C)``, labels ``(N,)`` → float.
    """
    check_real("eps", eps, gt=0.0, lt=1.0)
    p, y = check_probs_labels(probs, labels)
    py = p.gather(1, y[:, None]).squeeze(1)
    return float(-torch.log(py.clamp_min(eps)).mean())


def brier_score(probs: Tensor, labels: Tensor) -> float:
    """Multi-class Brier score ``(1/N) Σ_i Σ_c (p_ic − 1[c = y_i])²``, in ``[0, 2]``.

    For ``C = 2`` this is twice the binary ``mean (p_i1 − y_i)²``.

    Shape:
        probs ``(N, C)``, labels ``(N,)`` → float.
    """
    p, y = check_probs_labels(probs, labels)
    onehot = torch.nn.functional.one_hot(y, p.shape[1]).to(F64)
    return float(((p - onehot) ** 2).sum(dim=1).mean())


def accuracy(probs: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy ``(1/N) Σ_i 1[argmax_c p_ic = y_i]`` (ties → lowest class index).

    Shape:
        probs ``(N, C)``, labels ``(N,)`` → float.
    """
    p, y = check_probs_labels(probs, labels)
    return float((p.argmax(dim=1) == y).to(F64).mean())


def predictive_entropy(probs: Tensor) -> Tensor:
    """Entropy of each row, ``H_i = −Σ_c p_ic log p_ic`` (natural log, ``0 · log 0 = 0``).

    Returned in the floating dtype of ``probs`` (float64 for non-floating input).

    Shape:
        probs ``(N, C)`` → ``(N,)``.
    """
    raw = to_tensor(probs, "probs")
    p = check_probs(raw)
    h = entropy(p, dim=1)
    h = h.clamp_min(0.0)
    return h.to(raw.dtype) if raw.dtype.is_floating_point else h
