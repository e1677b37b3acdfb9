"""Matplotlib figures for calibration and uncertainty diagnostics.

Matplotlib is imported lazily inside each function and no backend is selected here.  When no
``ax`` is given, a new :class:`matplotlib.figure.Figure` is created directly (not through
:mod:`matplotlib.pyplot`, so no global figure state is touched); it renders inline in Jupyter and
can be saved with ``path=`` or ``fig.savefig``.  Every function returns the Figure.  If ``path``
is given the figure is written as a PNG (``dpi=120``, ``bbox_inches="tight"``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from bayesattn.calibration import (
    Strategy,
    _check_ood,
    _check_probs_labels,
    aurc,
    ood_auroc,
    reliability_curve,
    risk_coverage_curve,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "plot_reliability_diagram",
    "plot_risk_coverage",
    "plot_uncertainty_histograms",
]

PathLike = str | os.PathLike[str]


def _new_figure(**kwargs: Any) -> Figure:
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _root_figure(ax: Axes) -> Figure:
    try:
        return ax.get_figure(root=True)  # matplotlib >= 3.10
    except TypeError:  # pragma: no cover - older matplotlib
        fig = ax.figure
        while getattr(fig, "figure", fig) is not fig:
            fig = fig.figure
        return fig


def _finish(fig: Figure, path: PathLike | None) -> Figure:
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight", format="png")
    return fig


def _check_ax(ax: Any) -> None:
    if ax is None:
        return
    from matplotlib.axes import Axes

    if not isinstance(ax, Axes):
        raise TypeError(f"ax must be a matplotlib Axes or None, got {type(ax).__name__}")


def plot_reliability_diagram(
    probs: Tensor,
    labels: Tensor,
    n_bins: int = 15,
    strategy: Strategy = "uniform",
    ax: Axes | None = None,
    title: str | None = None,
    path: PathLike | None = None,
) -> Figure:
    """Reliability diagram: per-bin accuracy bars against the diagonal, plus a histogram.

    The top axes shows ``acc_b`` as bars over each bin, the identity line (perfect
    calibration), the gap ``|acc_b − conf_b|`` shaded in red and the ECE in the legend.  A second
    axes below shows the histogram of confidences ``max_c p_c``.  If ``ax`` is given the diagram
    is drawn there and the histogram axes is appended below it in the same figure.  Bins as in
    :func:`bayesattn.calibration.reliability_curve`.

    Shape:
        probs ``(N, C)``, labels ``(N,)``.
    """
    _check_ax(ax)
    p, y = _check_probs_labels(probs, labels)
    curve = reliability_curve(p, y, n_bins=n_bins, strategy=strategy)
    filled = curve.count > 0
    ece = float((curve.count[filled] / curve.count.sum() * curve.gap[filled]).sum())
    conf = p.max(dim=1).values.numpy()

    if ax is None:
        fig = _new_figure(figsize=(5.0, 6.0), layout="constrained")
        ax, ax_hist = fig.subplots(
            2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]}, squeeze=True
        )
    else:
        from mpl_toolkits.axes_grid1 import make_axes_locatable

        fig = _root_figure(ax)
        ax_hist = make_axes_locatable(ax).append_axes("bottom", size="30%", pad=0.35, sharex=ax)

    mask = filled.numpy()
    lower, upper = curve.bin_lower.numpy()[mask], curve.bin_upper.numpy()[mask]
    acc, mean_conf = curve.accuracy.numpy()[mask], curve.confidence.numpy()[mask]
    if strategy == "quantile":
        # Data-dependent bins can be very narrow: give every bar a visible minimum width.
        min_w = 0.01
        centre = (lower + upper) / 2
        half = ((upper - lower) / 2).clip(min=min_w / 2)
        lower, upper = centre - half, centre + half
    width = upper - lower

    ax.bar(
        lower,
        acc,
        width=width,
        align="edge",
        color="tab:blue",
        edgecolor="black",
        linewidth=0.5,
        alpha=0.85,
        label="accuracy",
    )
    ax.bar(
        lower,
        np.abs(mean_conf - acc),
        bottom=np.minimum(acc, mean_conf),
        width=width,
        align="edge",
        color="tab:red",
        edgecolor="tab:red",
        alpha=0.3,
        hatch="//",
        label="gap",
    )
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1, label="perfect calibration")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", title=f"ECE = {ece:.4f}", fontsize="small")
    ax.set_title(title if title is not None else f"Reliability diagram (ECE = {ece:.4f})")

    if strategy == "uniform":
        hist_bins = (torch.arange(n_bins + 1, dtype=torch.float64) / n_bins).numpy()
    else:
        hist_bins = max(10, min(n_bins, 50))
    ax_hist.hist(
        conf, bins=hist_bins, range=(0, 1), color="tab:gray", edgecolor="black", linewidth=0.5
    )
    ax_hist.axvline(
        float(conf.mean()),
        color="tab:orange",
        linewidth=1.5,
        label=f"mean confidence {conf.mean():.3f}",
    )
    ax_hist.set_xlim(0, 1)
    ax_hist.set_xlabel("confidence (max probability)")
    ax_hist.set_ylabel("count")
    ax_hist.legend(loc="upper left", fontsize="small")
    return _finish(fig, path)


def plot_uncertainty_histograms(
    scores_in: Tensor,
    scores_out: Tensor,
    label: str = "predictive entropy",
    bins: int = 30,
    ax: Axes | None = None,
    title: str | None = None,
    path: PathLike | None = None,
) -> Figure:
    """Overlaid density histograms of an uncertainty score, in- vs out-of-distribution.

    Both histograms share the same ``bins`` equal-width bins over the pooled score range and are
    normalised to densities.  The legend reports the OOD AUROC (higher score = more OOD), see
    :func:`bayesattn.calibration.ood_auroc`.

    Shape:
        scores_in ``(N_in,)``, scores_out ``(N_out,)``.
    """
    _check_ax(ax)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an int >= 1, got {bins!r}")
    s_in, s_out = _check_ood(scores_in, scores_out)
    auroc = ood_auroc(s_in, s_out)
    lo = float(torch.minimum(s_in.min(), s_out.min()))
    hi = float(torch.maximum(s_in.max(), s_out.max()))
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64).numpy()

    if ax is None:
        fig = _new_figure(figsize=(6.0, 4.0), layout="constrained")
        ax = fig.subplots()
    else:
        fig = _root_figure(ax)
    ax.hist(
        s_in.numpy(),
        bins=edges,
        density=True,
        histtype="stepfilled",
        alpha=0.45,
        color="tab:blue",
        edgecolor="tab:blue",
        label=f"in-distribution (n={len(s_in)})",
    )
    ax.hist(
        s_out.numpy(),
        bins=edges,
        density=True,
        histtype="stepfilled",
        alpha=0.45,
        color="tab:orange",
        edgecolor="tab:orange",
        label=f"out-of-distribution (n={len(s_out)})",
    )
    ax.set_xlabel(label)
    ax.set_ylabel("density")
    ax.legend(title=f"AUROC = {auroc:.4f}", fontsize="small")
    ax.set_title(title if title is not None else f"{label}: in vs out of distribution")
    return _finish(fig, path)


def plot_risk_coverage(
    uncertainty: Tensor,
    correct: Tensor,
    ax: Axes | None = None,
    title: str | None = None,
    path: PathLike | None = None,
) -> Figure:
    """Risk–coverage curve with its AURC, the oracle curve and the full-coverage risk.

    The oracle ranks every correct prediction before every error:
    ``risk*_k = max(0, k − n_correct) / k``.  See
    :func:`bayesattn.calibration.risk_coverage_curve`.

    Shape:
        uncertainty ``(N,)``, correct ``(N,)``.
    """
    _check_ax(ax)
    rc = risk_coverage_curve(uncertainty, correct)
    area = aurc(uncertainty, correct)
    n = rc.coverage.shape[0]
    n_errors = round(float(rc.risk[-1]) * n)
    k = torch.arange(1, n + 1, dtype=torch.float64)
    oracle = (k - (n - n_errors)).clamp_min(0) / k
    oracle_area = float(oracle.mean())

    if ax is None:
        fig = _new_figure(figsize=(6.0, 4.0), layout="constrained")
        ax = fig.subplots()
    else:
        fig = _root_figure(ax)
    ax.plot(
        rc.coverage.numpy(),
        rc.risk.numpy(),
        color="tab:blue",
        linewidth=1.5,
        label=f"model (AURC = {area:.4f})",
    )
    ax.plot(
        rc.coverage.numpy(),
        oracle.numpy(),
        color="tab:green",
        linestyle="--",
        linewidth=1,
        label=f"oracle (AURC = {oracle_area:.4f})",
    )
    ax.axhline(
        float(rc.risk[-1]),
        color="gray",
        linestyle=":",
        linewidth=1,
        label=f"full-coverage risk = {float(rc.risk[-1]):.4f}",
    )
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("coverage")
    ax.set_ylabel("selective risk (error rate)")
    ax.legend(fontsize="small")
    ax.set_title(title if title is not None else "Risk–coverage curve")
    return _finish(fig, path)
