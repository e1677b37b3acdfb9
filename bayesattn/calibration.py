"""Calibration and uncertainty-quality metrics.

A functional core of pure functions.  Every function accepts :class:`torch.Tensor` inputs (NumPy
arrays and nested sequences are converted with ``torch.as_tensor(np.asarray(x))``, so Python
floats stay float64) and returns a Python ``float`` or a small dataclass of tensors.  All
reductions are computed in ``float64`` so results do not depend on the input precision beyond the
rounding of the inputs themselves.

Conventions shared by every function:

* ``probs`` is an ``(N, C)`` matrix of class probabilities: finite, non-negative, rows summing to
  1 within ``1e-3``.  ``labels`` is an ``(N,)`` integer tensor with values in ``[0, C)``.
* The *prediction* is ``argmax_c p_c``; on ties the first (lowest-index) maximal class wins
  (:func:`torch.argmax` semantics).  The *confidence* is ``max_c p_c``.
* ``uncertainty`` / OOD ``scores``: *higher* means *less certain* / *more likely OOD*.
* Bad input raises :class:`ValueError` (wrong shape, range or value) or :class:`TypeError` (wrong
  dtype / unconvertible object) with a message naming the argument and the shape seen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import Tensor, nn

from ._validation import check_int, check_real
from .functional import entropy

__all__ = [
    "PAvPUCurve",
    "ReliabilityCurve",
    "RiskCoverage",
    "TemperatureScaler",
    "accuracy",
    "aurc",
    "brier_score",
    "expected_calibration_error",
    "fit_temperature",
    "maximum_calibration_error",
    "negative_log_likelihood",
    "ood_aupr",
    "ood_auroc",
    "pavpu",
    "pavpu_curve",
    "predictive_entropy",
    "reliability_curve",
    "risk_coverage_curve",
]

Strategy = Literal["uniform", "quantile"]
_STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
_ROW_SUM_TOL = 1e-3
_F64 = torch.float64


# --------------------------------------------------------------------------------------------
# Input validation helpers
# --------------------------------------------------------------------------------------------


def _to_tensor(x: Any, name: str) -> Tensor:
    """Convert ``x`` to a tensor (no copy for tensors), raising TypeError naming ``name``."""
    if isinstance(x, Tensor):
        t = x.detach()
    else:
        try:
            # Via NumPy so Python float sequences become float64 (torch would pick float32).
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(
                f"{name} must be a torch.Tensor or array-like of numbers, got "
                f"{type(x).__name__} ({exc})"
            ) from exc
    if t.is_complex():
        raise TypeError(f"{name} must be real-valued, got dtype {t.dtype}")
    return t


def _to_float64(x: Any, name: str) -> Tensor:
    t = _to_tensor(x, name).to(device="cpu", dtype=_F64)
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or Inf values (shape {tuple(t.shape)})")
    return t


def _check_probs(probs: Any, name: str = "probs") -> Tensor:
    t = _to_tensor(probs, name)
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D with shape (N, C), got shape {tuple(t.shape)}")
    n, c = t.shape
    if n == 0 or c == 0:
        raise ValueError(f"{name} must be non-empty with shape (N, C), got shape {tuple(t.shape)}")
    t = _to_float64(t, name)
    if bool((t < 0).any()):
        raise ValueError(
            f"{name} must be non-negative, got minimum {t.min().item():.4g} "
            f"(shape {tuple(t.shape)})"
        )
    dev = (t.sum(dim=1) - 1.0).abs()
    if bool((dev > _ROW_SUM_TOL).any()):
        row = int(dev.argmax())
        raise ValueError(
            f"{name} rows must sum to 1 within {_ROW_SUM_TOL:g} (shape {tuple(t.shape)}); "
            f"row {row} sums to {t[row].sum().item():.6g}"
        )
    return t


def _check_labels(labels: Any, n: int, c: int, name: str = "labels") -> Tensor:
    t = _to_tensor(labels, name)
    if t.dtype == torch.bool or t.dtype.is_floating_point:
        raise TypeError(
            f"{name} must have an integer dtype, got {t.dtype} (shape {tuple(t.shape)})"
        )
    if t.dim() != 1 or t.shape[0] != n:
        raise ValueError(
            f"{name} must have shape ({n},) to match probs of shape ({n}, {c}), "
            f"got shape {tuple(t.shape)}"
        )
    t = t.to(device="cpu", dtype=torch.long)
    if bool(((t < 0) | (t >= c)).any()):
        raise ValueError(
            f"{name} must lie in [0, {c}) for probs with C={c} classes, got values in "
            f"[{int(t.min())}, {int(t.max())}] (shape {tuple(t.shape)})"
        )
    return t


def check_probs_labels(probs: Any, labels: Any) -> tuple[Tensor, Tensor]:
    """``probs`` ``(N, C)`` rows on the simplex and integer ``labels`` ``(N,)`` in ``[0, C)``,
    as float64 / int64 tensors; ``ValueError``/``TypeError`` naming the argument otherwise."""
    p = _check_probs(probs)
    y = _check_labels(labels, p.shape[0], p.shape[1])
    return p, y


def _check_strategy(strategy: Any) -> Strategy:
    if strategy not in _STRATEGIES:
        raise ValueError(f"strategy must be one of {_STRATEGIES}, got {strategy!r}")
    return strategy


def _check_1d(x: Any, name: str) -> Tensor:
    """Finite, non-empty, 1-D float64 tensor."""
    t = _to_tensor(x, name)
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D with shape (N,), got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} must be non-empty, got shape {tuple(t.shape)}")
    return _to_float64(t, name)


def _check_uncertainty_correct(uncertainty: Any, correct: Any) -> tuple[Tensor, Tensor]:
    u = _check_1d(uncertainty, "uncertainty")
    k = _to_tensor(correct, "correct")
    if k.shape != u.shape:
        raise ValueError(
            f"correct must have the same shape as uncertainty {tuple(u.shape)}, "
            f"got shape {tuple(k.shape)}"
        )
    if k.dtype != torch.bool:
        kf = k.to(device="cpu", dtype=_F64)
        if not bool(((kf == 0) | (kf == 1)).all()):
            raise ValueError(
                f"correct must be boolean or contain only 0/1 values (shape {tuple(k.shape)})"
            )
        k = kf == 1
    return u, k.to("cpu")


# --------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------


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
        interior = torch.arange(1, n_bins, dtype=_F64) / n_bins
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
    strategy = _check_strategy(strategy)
    conf, pred = p.max(dim=1).values, p.argmax(dim=1)
    hit = (pred == y).to(_F64)
    idx = _bin_assignment(conf, n_bins, strategy)

    count = torch.bincount(idx, minlength=n_bins)
    conf_sum = torch.zeros(n_bins, dtype=_F64).index_add_(0, idx, conf)
    acc_sum = torch.zeros(n_bins, dtype=_F64).index_add_(0, idx, hit)
    empty = count == 0
    denom = count.to(_F64).clamp_min(1)
    nan = torch.tensor(float("nan"), dtype=_F64)
    confidence = torch.where(empty, nan, conf_sum / denom)
    acc = torch.where(empty, nan, acc_sum / denom)

    if strategy == "uniform":
        edges = torch.arange(n_bins + 1, dtype=_F64) / n_bins
        lower, upper = edges[:-1].clone(), edges[1:].clone()
    else:
        lower = torch.full((n_bins,), float("inf"), dtype=_F64).scatter_reduce(
            0, idx, conf, reduce="amin"
        )
        upper = torch.full((n_bins,), -float("inf"), dtype=_F64).scatter_reduce(
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
    weights = curve.count[mask].to(_F64) / curve.count.sum()
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
    onehot = torch.nn.functional.one_hot(y, p.shape[1]).to(_F64)
    return float(((p - onehot) ** 2).sum(dim=1).mean())


def accuracy(probs: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy ``(1/N) Σ_i 1[argmax_c p_ic = y_i]`` (ties → lowest class index).

    Shape:
        probs ``(N, C)``, labels ``(N,)`` → float.
    """
    p, y = check_probs_labels(probs, labels)
    return float((p.argmax(dim=1) == y).to(_F64).mean())


def predictive_entropy(probs: Tensor) -> Tensor:
    """Entropy of each row, ``H_i = −Σ_c p_ic log p_ic`` (natural log, ``0 · log 0 = 0``).

    Returned in the floating dtype of ``probs`` (float64 for non-floating input).

    Shape:
        probs ``(N, C)`` → ``(N,)``.
    """
    raw = _to_tensor(probs, "probs")
    p = _check_probs(raw)
    h = entropy(p, dim=1)
    h = h.clamp_min(0.0)
    return h.to(raw.dtype) if raw.dtype.is_floating_point else h


# --------------------------------------------------------------------------------------------
# Temperature scaling
# --------------------------------------------------------------------------------------------


def _check_logits(logits: Any, name: str = "logits") -> Tensor:
    t = _to_tensor(logits, name)
    if t.dim() != 2 or t.shape[0] == 0 or t.shape[1] == 0:
        raise ValueError(
            f"{name} must be 2-D and non-empty with shape (N, C), got shape {tuple(t.shape)}"
        )
    return _to_float64(t, name)


class TemperatureScaler(nn.Module):
    """Post-hoc temperature scaling (Guo et al., 2017): ``p = softmax(z / T)``.

    The single parameter is ``log_temperature`` (so ``T = exp(log_temperature) > 0``).
    :meth:`fit` minimises the NLL ``−(1/N) Σ_i log softmax(z_i / T)_{y_i}`` with L-BFGS.

    Shape:
        forward: logits ``(..., C)`` → probs ``(..., C)``.
    """

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)) or (
            temperature <= 0
        ):
            raise ValueError(f"temperature must be a finite float > 0, got {temperature!r}")
        self.log_temperature = nn.Parameter(torch.tensor(math.log(temperature)))

    @property
    def temperature(self) -> float:
        """The fitted temperature ``T = exp(log_temperature)``."""
        return float(self.log_temperature.detach().exp())

    def forward(self, logits: Tensor) -> Tensor:
        """Calibrated probabilities ``softmax(logits / T)`` over the last dimension."""
        if not isinstance(logits, Tensor):
            logits = _to_tensor(logits, "logits")
        if not logits.is_floating_point():
            logits = logits.to(torch.get_default_dtype())
        if logits.dim() < 1 or logits.shape[-1] == 0:
            raise ValueError(
                f"logits must have a non-empty class dimension (..., C), got shape "
                f"{tuple(logits.shape)}"
            )
        t = self.log_temperature.to(device=logits.device, dtype=logits.dtype).exp()
        return torch.softmax(logits / t, dim=-1)

    def fit(self, logits: Tensor, labels: Tensor, max_iter: int = 100) -> TemperatureScaler:
        """Fit ``T`` by minimising the NLL of ``softmax(logits / T)`` on ``(logits, labels)``.

        Optimisation runs in float64 with ``torch.optim.LBFGS`` (strong-Wolfe line search)
        starting from the current temperature; the result is copied into ``log_temperature``.

        Shape:
            logits ``(N, C)``, labels ``(N,)``.
        """
        check_int("max_iter", max_iter, 1)
        z = _check_logits(logits)
        y = _check_labels(labels, z.shape[0], z.shape[1])
        log_t = self.log_temperature.detach().to(device="cpu", dtype=_F64).clone()
        log_t.requires_grad_(True)
        opt = torch.optim.LBFGS(
            [log_t],
            lr=1.0,
            max_iter=max_iter,
            tolerance_grad=1e-10,
            tolerance_change=1e-12,
            line_search_fn="strong_wolfe",
        )

        def closure() -> Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(z / log_t.exp(), y)
            loss.backward()
            return loss

        with torch.enable_grad():
            opt.step(closure)
        if not bool(torch.isfinite(log_t).all()):
            raise RuntimeError("temperature scaling diverged (non-finite log-temperature)")
        with torch.no_grad():
            self.log_temperature.copy_(log_t.detach().to(self.log_temperature))
        return self


def fit_temperature(logits: Tensor, labels: Tensor, max_iter: int = 100) -> float:
    """Fit a :class:`TemperatureScaler` and return the temperature ``T``.

    Shape:
        logits ``(N, C)``, labels ``(N,)`` → float.
    """
    return TemperatureScaler().fit(logits, labels, max_iter=max_iter).temperature


# --------------------------------------------------------------------------------------------
# Out-of-distribution detection
# --------------------------------------------------------------------------------------------


def check_ood_scores(scores_in: Any, scores_out: Any) -> tuple[Tensor, Tensor]:
    """Finite, non-empty 1-D in- and out-of-distribution scores as float64 tensors;
    ``ValueError`` naming the argument and both shapes otherwise."""
    s_in = _to_tensor(scores_in, "scores_in")
    s_out = _to_tensor(scores_out, "scores_out")
    for name, t in (("scores_in", s_in), ("scores_out", s_out)):
        if t.dim() != 1:
            raise ValueError(f"{name} must be 1-D with shape (N,), got shape {tuple(t.shape)}")
        if t.shape[0] == 0:
            raise ValueError(
                f"{name} is empty (shape {tuple(t.shape)}): OOD metrics need both "
                f"in-distribution and out-of-distribution scores (labels with only one class); "
                f"got scores_in {tuple(s_in.shape)}, scores_out {tuple(s_out.shape)}"
            )
    return _to_float64(s_in, "scores_in"), _to_float64(s_out, "scores_out")


def ood_auroc(scores_in: Tensor, scores_out: Tensor) -> float:
    """AUROC for detecting OOD inputs (positive class = OOD, higher score = more OOD).

    Mann–Whitney form with ties counted as 1/2:
    ``AUROC = (1 / (n_in n_out)) Σ_{j∈out} Σ_{i∈in} (1[s_j > s_i] + ½ 1[s_j = s_i])``.
    Equals ``P(s_out > s_in) + ½ P(s_out = s_in)``; ``ood_auroc(a, b) = 1 − ood_auroc(b, a)``.

    Shape:
        scores_in ``(N_in,)``, scores_out ``(N_out,)`` → float.
    """
    s_in, s_out = check_ood_scores(scores_in, scores_out)
    sorted_in = torch.sort(s_in).values
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
        [torch.ones(s_out.shape[0], dtype=_F64), torch.zeros(s_in.shape[0], dtype=_F64)]
    )
    order = torch.sort(scores, descending=True, stable=True).indices
    scores, is_pos = scores[order], is_pos[order]
    # Last index of every run of equal scores = one threshold.
    last = torch.ones_like(scores, dtype=torch.bool)
    last[:-1] = scores[1:] != scores[:-1]
    ends = torch.nonzero(last).squeeze(1)
    tps = torch.cumsum(is_pos, 0)[ends]
    n_pred = (ends + 1).to(_F64)
    precision = tps / n_pred
    recall = tps / s_out.shape[0]
    d_recall = torch.diff(recall, prepend=torch.zeros(1, dtype=_F64))
    return float((d_recall * precision).sum())


# --------------------------------------------------------------------------------------------
# Selective prediction
# --------------------------------------------------------------------------------------------


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
    u, ok = _check_uncertainty_correct(uncertainty, correct)
    n = u.shape[0]
    sorted_u, order = torch.sort(u, stable=True)
    errors = (~ok[order]).to(_F64)
    k = torch.arange(1, n + 1, dtype=_F64)
    return RiskCoverage(coverage=k / n, risk=torch.cumsum(errors, 0) / k, threshold=sorted_u)


def aurc(uncertainty: Tensor, correct: Tensor) -> float:
    """Area under the risk–coverage curve, ``AURC = (1/N) Σ_{k=1}^{N} risk_k``.

    Shape:
        uncertainty ``(N,)``, correct ``(N,)`` → float.
    """
    return float(risk_coverage_curve(uncertainty, correct).risk.mean())


def pavpu(uncertainty: Tensor, correct: Tensor, threshold: float) -> float:
    """Patch accuracy vs patch uncertainty (Mukhoti & Gal, 2018).

    An example is *certain* iff ``uncertainty <= threshold``;
    ``PAvPU = (n_ac + n_iu) / N`` with ``n_ac`` = #(accurate ∧ certain) and
    ``n_iu`` = #(inaccurate ∧ uncertain).

    Shape:
        uncertainty ``(N,)``, correct ``(N,)`` → float.
    """
    u, ok = _check_uncertainty_correct(uncertainty, correct)
    thr = _check_threshold(threshold)
    return float(_pavpu(u, ok, torch.tensor([thr], dtype=_F64))[0])


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
    return good.to(_F64).mean(dim=1)


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
    u, ok = _check_uncertainty_correct(uncertainty, correct)
    if thresholds is None:
        n_thresholds = check_int("n_thresholds", n_thresholds, 1)
        thr = torch.quantile(u, torch.linspace(0, 1, n_thresholds, dtype=_F64))
    else:
        t = _to_tensor(thresholds, "thresholds")
        if t.dim() == 0:
            t = t.reshape(1)
        if t.dim() != 1 or t.shape[0] == 0:
            raise ValueError(
                f"thresholds must be a non-empty 1-D sequence, got shape {tuple(t.shape)}"
            )
        thr = t.to(device="cpu", dtype=_F64)
        if bool(torch.isnan(thr).any()):
            raise ValueError(f"thresholds contains NaN (shape {tuple(thr.shape)})")
    return PAvPUCurve(threshold=thr, pavpu=_pavpu(u, ok, thr))
