"""The study's figures: per method on the first run of each dataset (reliability, entropy in vs
out, accuracy vs confidence, attention with uncertainty + its ArviZ netCDF, attention geometry)
and per dataset (Pareto quality-vs-cost, ensemble-size curve, corruption-severity curves). Every
file is registered in the run's manifest before it is written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from .._study_io import register_output
from .datasets import get_dataset
from .methods import Fitted, Method
from .results import DatasetBlock, Interval, PooledRow
from .runs import Run

__all__ = ["run_figures", "dataset_figures", "prefix"]

#: methods whose attention geometry the study reports (first run of a data set with ``geometry``)
GEOMETRY = ("deterministic", "last_layer", "dirichlet")


def prefix(dataset: str) -> str:
    """File-name prefix of a dataset's figures (its :attr:`~.datasets.StudyDataset.figure_prefix`)."""
    return get_dataset(dataset).figure_prefix


def run_figures(
    out: Path, run: Run, method: Method, fitted: Fitted, preds: dict[str, Any]
) -> dict[str, Any]:
    """Figures of one method on the first run of a dataset; returns what was written."""
    from .. import plots

    p, name, y = prefix(run.dataset), method.name, run.data.y_test
    res, res_ood = preds["test"], preds["ood"]
    files = []
    f = register_output(out, f"{p}reliability_{name}.png")
    plots.plot_reliability_diagram(res.mean_probs, y, title=name, path=f)
    files.append(f.name)
    f = register_output(out, f"{p}entropy_{name}.png")
    plots.plot_uncertainty_histograms(
        res.predictive_entropy, res_ood.predictive_entropy, label="predictive entropy", path=f
    )
    files.append(f.name)
    f = register_output(out, f"{p}accuracy_confidence_{name}.png")
    plots.plot_accuracy_vs_confidence(res.mean_probs, y, path=f)
    files.append(f.name)
    extra: dict[str, Any] = {"figures": files}
    if method.attention_outputs:
        extra["attention"] = _attention_outputs(out, run, name, fitted)
    if run.cfg.geometry and run.spec.geometry and name in GEOMETRY:
        extra["geometry"] = _geometry(out, run, name, fitted)
    return extra


def _attention_outputs(out: Path, run: Run, method: str, fitted: Fitted) -> dict[str, Any]:
    """Attention map with uncertainty (PNG) and the attention posterior as ArviZ netCDF."""
    from .. import plots
    from ..diagnostics import to_arviz
    from ..uncertainty import predict

    p = prefix(run.dataset)
    x = run.data.x_test[: run.cfg.arviz_examples]
    res = predict(fitted.nets[0].eval(), x, num_samples=run.cfg.num_samples)
    layer = sorted(res.attention)[-1]
    att = res.attention[layer]  # samples (S, B, H, Tq, Tk)
    labels = ["cls"] + [f"p{i}" for i in range(att.samples.shape[-1] - 1)]
    png = register_output(out, f"{p}attention_{method}.png")
    plots.plot_attention_uncertainty(
        att.mean[0].mean(0), att.std[0].mean(0), query_labels=labels, key_labels=labels,
        title=f"{method}: {layer} (example 0, head mean)", path=png,
    )  # fmt: skip
    idata = to_arviz(
        posterior={f"{layer}.weights": att.samples}, sample_dims=("sample",), tokens=labels
    )
    nc = register_output(out, f"{p}attention_{method}.nc")
    idata.to_netcdf(str(nc))
    return {"figure": png.name, "netcdf": nc.name, "layer": layer, **att.summary()}


def _geometry(out: Path, run: Run, method: str, fitted: Fitted) -> dict[str, Any]:
    """:func:`bayesattn.geometry.geometry_report` of the trained network on 64 test images."""
    from ..geometry import geometry_report

    with tempfile.TemporaryDirectory(dir=out) as tmp:
        rep = geometry_report(fitted.nets[0].eval(), run.data.x_test[:64], tmp,
                              num_samples=run.cfg.num_samples)  # fmt: skip
        figures = []
        for f in rep["figures"]:
            target = register_output(out, f"geometry_{method}_{f}")
            os.replace(Path(tmp) / f, target)
            figures.append(target.name)
    keep = ("layers", "distance_unit", "distance_mean", "entropy_mean", "posterior_sd",
            "subspace_angle_mean", "local_to_global", "spread_by_distance")  # fmt: skip
    return {k: rep[k] for k in keep} | {"figures": figures}


def dataset_figures(out: Path, dataset: str, block: DatasetBlock) -> dict[str, str]:
    """Pareto, ensemble-size and corruption-severity figures of one dataset."""
    files = {"pareto": _pareto(out, dataset, block["pooled"])}
    if block["ensemble_curve"]:
        files["ensemble_curve"] = _ensemble_curve(out, dataset, block)
    files["corruptions"] = _corruption_curves(out, dataset, block["pooled"])
    return files


def _err(r: Interval) -> float:
    h = r.get("half_width", 0.0)
    return 0.0 if h != h else float(h)  # NaN (one run): no bar


# one (colour, marker) pair per method: 10 colours × 7 markers, distinct for up to 70 methods
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def method_styles(methods: list[str]) -> dict[str, tuple[Any, str]]:
    """A distinct ``(colour, marker)`` for every method, in order (tab10 colours; the marker
    changes too, so the 11th method never repeats the 1st's look)."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: (cmap(k % 10), _MARKERS[k % len(_MARKERS)]) for k, m in enumerate(methods)}


def _pareto(out: Path, dataset: str, pooled: dict[str, PooledRow]) -> str:
    """Quality (NLL, held-out AUROC) against cost (inference ms/example at batch 512, training
    seconds); means with 95% intervals over runs. Each method has its own colour and marker and is
    named in one legend (no labels on the points, which overlap); every panel says which way is
    better."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    from .. import plots

    fig = plots._new_figure(figsize=(10.0, 8.0), layout="constrained")
    axes = fig.subplots(2, 2, sharey="row")
    style = method_styles(list(pooled))
    qs = (("nll", "test NLL  (↓ lower is better)"),
          ("auroc_primary", "held-out AUROC  (↑ higher is better)"))  # fmt: skip
    cs = (("infer_ms_batch512", "inference ms / example, batch 512  (← cheaper)"),
          ("train_seconds", "training seconds  (← cheaper)"))  # fmt: skip
    for i, (q, qlabel) in enumerate(qs):
        for j, (c, clabel) in enumerate(cs):
            ax = axes[i][j]
            for m, r in pooled.items():
                colour, marker = style[m]
                ax.errorbar(r[c]["mean"], r[q]["mean"], xerr=_err(r[c]), yerr=_err(r[q]),
                            fmt=marker, ms=7, capsize=2, elinewidth=0.8, alpha=0.9, label=m,
                            color=colour, markeredgecolor="black", markeredgewidth=0.4)  # fmt: skip
            ax.set_xscale("log")
            # labels at 1, 2, 5 × 10^k only: never more than three to a decade, so none overlap
            ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
            ax.xaxis.set_minor_formatter(FormatStrFormatter("%g"))
            if len(ax.get_xticks(minor=True)) > 6:  # a wide span: the decades alone
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.tick_params(axis="x", which="both", labelsize=8)
            ax.set_xlabel(clabel, fontsize=9)
            if j == 0:
                ax.set_ylabel(qlabel, fontsize=9)
            ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=9, loc="outside lower center", ncols=min(5, len(labels)),
               title="method (mean, 95% interval over runs)", title_fontsize=9)  # fmt: skip
    fig.suptitle(f"{dataset}: uncertainty quality against cost. Best: top row low, bottom row "
                 "high, both at the left", fontsize=11)  # fmt: skip
    path = register_output(out, f"pareto_{dataset}.png")
    plots._finish(fig, path)
    return path.name


def _ensemble_curve(out: Path, dataset: str, block: DatasetBlock) -> str:
    """NLL and held-out AUROC of ensembles of 1..M members against their training cost, with
    every other method as a point (read it as 'worth M members')."""
    from .. import plots

    curve, pooled = block["ensemble_curve"], block["pooled"]
    sizes = sorted(curve, key=int)
    fig = plots._new_figure(figsize=(10.0, 4.0), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, q, label in ((axes[0], "nll", "NLL"), (axes[1], "auroc_entropy", "held-out AUROC")):
        xs = [curve[s]["train_seconds"]["mean"] for s in sizes]
        ys = [curve[s][q]["mean"] for s in sizes]
        ax.errorbar(xs, ys, yerr=[_err(curve[s][q]) for s in sizes], fmt="-o", color="k",
                    label="ensemble of M", capsize=3)  # fmt: skip
        for s, x_, y_ in zip(sizes, xs, ys, strict=True):
            ax.annotate(f"M={s}", (x_, y_), textcoords="offset points", xytext=(4, -10),
                        fontsize=8)  # fmt: skip
        for m, r in pooled.items():
            if m in ("ensemble", "deterministic"):
                continue
            ax.plot(r["train_seconds"]["mean"], r[q]["mean"], "o", label=m)
        ax.set_xscale("log")
        ax.set_xlabel("training seconds")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"{dataset}: ensemble size 1..{sizes[-1]} against cost")
    path = register_output(out, f"ensemble_curve_{dataset}.png")
    plots._finish(fig, path)
    return path.name


def _corruption_curves(out: Path, dataset: str, pooled: dict[str, PooledRow]) -> str:
    """Accuracy and entropy AUROC against severity, one panel per corruption kind."""
    from .. import plots

    first = next(iter(pooled.values()))["corruption_curve"]
    kinds = sorted({c.rsplit("_", 1)[0] for c in first})
    fig = plots._new_figure(figsize=(4.0 * len(kinds), 6.0), layout="constrained")
    axes = fig.subplots(2, len(kinds), squeeze=False)
    for j, kind in enumerate(kinds):
        for m, r in pooled.items():
            cs = sorted((c for c in r["corruption_curve"] if c.rsplit("_", 1)[0] == kind),
                        key=lambda c: int(c.rsplit("_", 1)[1]))  # fmt: skip
            sev = [int(c.rsplit("_", 1)[1]) for c in cs]
            for i, k in enumerate(("accuracy", "auroc_entropy")):
                axes[i][j].plot(sev, [r["corruption_curve"][c][k] for c in cs], "-o", label=m)
        axes[0][j].set_title(kind)
        axes[1][j].set_xlabel("severity")
    axes[0][0].set_ylabel("accuracy")
    axes[1][0].set_ylabel("AUROC (entropy) vs clean")
    axes[0][-1].legend(fontsize=7)
    path = register_output(out, f"corruptions_{dataset}.png")
    plots._finish(fig, path)
    return path.name
