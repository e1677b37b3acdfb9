"""Matplotlib figures for calibration, uncertainty and attention diagnostics.

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

from bayesattn._validation import check_int
from bayesattn.calibration import (
    ReliabilityCurve,
    Strategy,
    aurc,
    check_ood_scores,
    check_probs_labels,
    ood_auroc,
    reliability_curve,
    risk_coverage_curve,
)
from bayesattn.training.curves import plot_history as _plot_history

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from bayesattn.training.history import History

__all__ = [
    "plot_accuracy_vs_confidence",
    "plot_attention_distance",
    "plot_attention_uncertainty",
    "plot_reliability_diagram",
    "plot_risk_coverage",
    "plot_uncertainty_histograms",
    "plot_history",
]

PathLike = str | os.PathLike[str]


def _new_figure(**kwargs: Any) -> Figure:
    from matplotlib.figure import Figure

    return Figure(**kwargs)


def _root_figure(ax: Axes) -> Figure:
    from matplotlib.figure import Figure, SubFigure

    fig: Figure | SubFigure | None
    try:
        fig = ax.get_figure(root=True)  # matplotlib >= 3.10
    except TypeError:  # pragma: no cover - older matplotlib
        fig = ax.figure
        while isinstance(fig, SubFigure):  # up to the root figure
            fig = fig.figure
    if not isinstance(fig, Figure):
        raise ValueError(f"ax must belong to a matplotlib Figure; got {type(fig).__name__}")
    return fig


def _finish(fig: Figure, path: PathLike | None) -> Figure:
    if path is not None and os.path.isdir(path):
        raise ValueError(f"path {str(path)!r} is a folder; give a file name such as 'figure.png'")
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
    p, y = check_probs_labels(probs, labels)
    curve = reliability_curve(p, y, n_bins=n_bins, strategy=strategy)
    filled = curve.count > 0
    ece = float((curve.count[filled] / curve.count.sum() * curve.gap[filled]).sum())
    conf = p.max(dim=1).values.numpy()

    fig, ax, ax_hist = _reliability_axes(ax)
    _draw_reliability_bars(ax, curve, strategy, ece, title)
    _draw_confidence_histogram(ax_hist, conf, n_bins, strategy)
    return _finish(fig, path)


def _reliability_axes(ax: Axes | None) -> tuple[Figure, Axes, Axes]:
    """The diagram's axes and the confidence-histogram axes below it (a new figure if ``ax`` is
    None, else appended under ``ax`` in its figure)."""
    if ax is None:
        fig = _new_figure(figsize=(5.0, 6.0), layout="constrained")
        ax, ax_hist = fig.subplots(
            2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]}, squeeze=True
        )
    else:
        from mpl_toolkits.axes_grid1 import make_axes_locatable

        fig = _root_figure(ax)
        ax_hist = make_axes_locatable(ax).append_axes("bottom", size="30%", pad=0.35, sharex=ax)
    return fig, ax, ax_hist


def _draw_reliability_bars(
    ax: Axes, curve: ReliabilityCurve, strategy: Strategy, ece: float, title: str | None
) -> None:
    """Per-bin accuracy bars, the shaded gap to the mean confidence and the diagonal."""
    filled = curve.count > 0
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


def _draw_confidence_histogram(ax_hist: Axes, conf: Any, n_bins: int, strategy: Strategy) -> None:
    """Histogram of the confidences ``max_c p_c`` with their mean marked."""
    hist_bins: int | list[float]
    if strategy == "uniform":
        hist_bins = (torch.arange(n_bins + 1, dtype=torch.float64) / n_bins).tolist()
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
    check_int("bins", bins, 1)
    s_in, s_out = check_ood_scores(scores_in, scores_out)
    auroc = ood_auroc(s_in, s_out)
    lo = float(torch.minimum(s_in.min(), s_out.min()))
    hi = float(torch.maximum(s_in.max(), s_out.max()))
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    edges = torch.linspace(lo, hi, bins + 1, dtype=torch.float64).tolist()

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


# --------------------------------------------------------------------------------------------
# Attention figures
# --------------------------------------------------------------------------------------------


def _as_2d(x: Any, name: str) -> np.ndarray:
    if isinstance(x, Tensor):
        arr = x.detach().to(device="cpu", dtype=torch.float64).numpy()
    else:
        try:
            arr = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"{name} must be a 2-D tensor or array; got {type(x).__name__}"
            ) from exc
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (Tq, Tk); got shape {tuple(arr.shape)}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite; got NaN or Inf in shape {tuple(arr.shape)}")
    return arr


def _check_labels_len(labels: Any, n: int, name: str) -> list[str] | None:
    if labels is None:
        return None
    labels = [str(t) for t in labels]
    if len(labels) != n:
        raise ValueError(f"{name} must have {n} entries; got {len(labels)}")
    return labels


def plot_attention_uncertainty(
    mean: Tensor,
    std: Tensor,
    query_labels: Any = None,
    key_labels: Any = None,
    title: str | None = None,
    std_label: str = "posterior std",
    axes: Any = None,
    path: PathLike | None = None,
) -> Figure:
    r"""Two heatmaps side by side: the posterior mean attention weights :math:`\bar w_{ij}` and
    their spread (the posterior std, or e.g. a credible-interval width: set ``std_label``).

    Rows are queries, columns keys; optional token labels go on the axes and each panel has its
    own colorbar. For one head of an :class:`bayesattn.uncertainty.AttentionSamples` ``a``:
    ``plot_attention_uncertainty(a.mean[b, h], a.std[b, h], tokens, tokens)``.

    Args:
        axes: optional pair of matplotlib Axes to draw into (mean, spread).

    Shape:
        mean ``(Tq, Tk)``, std ``(Tq, Tk)``, query_labels ``Tq`` strings, key_labels ``Tk``.
    """
    m = _as_2d(mean, "mean")
    s = _as_2d(std, "std")
    if m.shape != s.shape:
        raise ValueError(
            f"mean and std must have the same shape (Tq, Tk); got mean {m.shape}, std {s.shape}"
        )
    q_labels = _check_labels_len(query_labels, m.shape[0], "query_labels")
    k_labels = _check_labels_len(key_labels, m.shape[1], "key_labels")
    if axes is None:
        w = max(4.0, 0.35 * m.shape[1] + 2.0)
        h = max(3.0, 0.35 * m.shape[0] + 1.5)
        fig = _new_figure(figsize=(2 * w, h), layout="constrained")
        ax_m, ax_s = fig.subplots(1, 2)
    else:
        from matplotlib.axes import Axes

        try:
            pair = list(axes) if not isinstance(axes, (str, bytes)) else []
        except TypeError:
            pair = []
        if len(pair) != 2 or not all(isinstance(a, Axes) for a in pair):
            raise TypeError(f"axes must be a pair of matplotlib Axes or None; got {axes!r}")
        ax_m, ax_s = pair
        fig = _root_figure(ax_m)
    panels = ((ax_m, m, "mean attention", "viridis"), (ax_s, s, std_label, "magma"))
    for ax, data, label, cmap in panels:
        im = ax.imshow(data, cmap=cmap, aspect="auto", interpolation="nearest", vmin=0.0)
        fig.colorbar(im, ax=ax, label=label)
        ax.set_title(label)
        ax.set_xlabel("key")
        ax.set_ylabel("query")
        if k_labels is not None:
            ax.set_xticks(range(len(k_labels)), k_labels, rotation=90)
        if q_labels is not None:
            ax.set_yticks(range(len(q_labels)), q_labels)
    if title is not None:
        fig.suptitle(title)
    return _finish(fig, path)


def plot_attention_distance(
    distances_by_layer: dict[str, Any],
    ax: Axes | None = None,
    title: str | None = None,
    path: PathLike | None = None,
) -> Figure:
    r"""Mean attention distance per layer: one line (with markers) per head plus the mean over
    heads (dashed). Input as returned by
    :func:`bayesattn.geometry.attention_distance_by_layer`.

    Shape:
        ``{layer name: (H,)}`` with the same ``H`` for every layer.
    """
    _check_ax(ax)
    if not isinstance(distances_by_layer, dict) or not distances_by_layer:
        raise ValueError("distances_by_layer must be a non-empty dict {layer: (H,) distances}")
    names = list(distances_by_layer)
    rows = []
    for name in names:
        v = distances_by_layer[name]
        arr = (
            v.detach().to("cpu", torch.float64).numpy()
            if isinstance(v, Tensor)
            else np.asarray(v, dtype=np.float64)
        )
        if arr.ndim != 1 or arr.shape[0] == 0:
            raise ValueError(
                f"distances_by_layer[{name!r}] must be 1-D (H,); got shape {tuple(arr.shape)}"
            )
        rows.append(arr)
    H = rows[0].shape[0]
    if any(r.shape[0] != H for r in rows):
        raise ValueError(
            f"every layer must have the same number of heads; got {[r.shape[0] for r in rows]}"
        )
    d = np.stack(rows)  # (L, H)
    if ax is None:
        fig = _new_figure(figsize=(max(5.0, 0.8 * len(names) + 3.0), 4.0), layout="constrained")
        ax = fig.subplots()
    else:
        fig = _root_figure(ax)
    x = np.arange(len(names))
    for h in range(H):
        ax.plot(x, d[:, h], marker="o", linewidth=1, alpha=0.8, label=f"head {h}")
    ax.plot(x, d.mean(1), color="black", linestyle="--", linewidth=1.5, label="mean over heads")
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean attention distance (positions)")
    top = float(np.nanmax(d)) if np.isfinite(d).any() else 1.0
    ax.set_ylim(0, 1.1 * top if top > 0 else 1.0)
    ax.legend(fontsize="small", ncol=2 if H > 4 else 1)
    ax.set_title(title if title is not None else "Mean attention distance per layer")
    return _finish(fig, path)


def plot_accuracy_vs_confidence(
    probs: Tensor,
    labels: Tensor,
    thresholds: Any = None,
    ax: Axes | None = None,
    title: str | None = None,
    path: PathLike | None = None,
) -> Figure:
    r"""Accuracy of the examples whose confidence :math:`\max_c p_c` is at least a threshold
    :math:`\tau`, and the fraction of examples retained, against :math:`\tau`:

    .. math:: \mathrm{acc}(\tau) = \frac{\sum_n 1[c_n \ge \tau]\,1[\hat y_n = y_n]}
              {\sum_n 1[c_n \ge \tau]}, \qquad \mathrm{kept}(\tau) = \frac1N\sum_n 1[c_n\ge\tau]

    (accuracy is undefined, and not drawn, where nothing is kept). Thresholds default to 51
    equally spaced values on ``[0, 1]``.

    Shape:
        probs ``(N, C)`` (e.g. ``PredictionResult.mean_probs``), labels ``(N,)``,
        thresholds ``(T,)``.
    """
    _check_ax(ax)
    p, y = check_probs_labels(probs, labels)
    if thresholds is None:
        thr = np.linspace(0.0, 1.0, 51)
    else:
        thr = np.asarray(
            thresholds.detach().cpu() if isinstance(thresholds, Tensor) else thresholds,
            dtype=np.float64,
        )
        if thr.ndim != 1 or thr.shape[0] == 0:
            raise ValueError(f"thresholds must be a non-empty 1-D sequence; got shape {thr.shape}")
        if not (np.isfinite(thr).all() and (thr >= 0).all() and (thr <= 1).all()):
            raise ValueError(f"thresholds must be confidences in [0, 1]; got {thr.tolist()}")
    conf = p.max(dim=1).values.numpy()  # (N,)
    correct = (p.argmax(dim=1) == y).numpy()  # (N,)
    kept = conf[None, :] >= thr[:, None]  # (T, N)
    n_kept = kept.sum(1)
    frac = n_kept / conf.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(n_kept > 0, (kept & correct[None, :]).sum(1) / n_kept, np.nan)

    if ax is None:
        fig = _new_figure(figsize=(6.0, 4.0), layout="constrained")
        ax = fig.subplots()
    else:
        fig = _root_figure(ax)
    ax.plot(thr, acc, color="tab:blue", marker=".", linewidth=1.5, label="accuracy of kept")
    ax.plot(thr, frac, color="tab:orange", linestyle="--", linewidth=1.5, label="fraction kept")
    ax.set_xlim(float(thr.min()), float(thr.max()) if thr.max() > thr.min() else 1.0)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("confidence threshold")
    ax.set_ylabel("accuracy / fraction")
    ax.legend(fontsize="small")
    ax.set_title(title if title is not None else "Accuracy vs confidence threshold")
    return _finish(fig, path)


def plot_history(history: History, path: PathLike | None = None) -> Figure:
    """Training curves of a :class:`~bayesattn.training.history.History`: loss per example
    (train −ELBO/N and validation), accuracy, and the learning-rate and KL-weight β schedules,
    one point per epoch, with the best epoch marked (drawn by
    :func:`bayesattn.training.curves.plot_history`, which
    :meth:`~bayesattn.training.history.History.plot` calls). Saved as an image (format from the
    file name, ``dpi=100``) when ``path`` is given. matplotlib is imported lazily."""
    return _plot_history(history, path)
