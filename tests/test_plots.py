"""Smoke tests for bayesattn.plots: every figure renders to a PNG with the expected axes."""

from __future__ import annotations

import ast
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from bayesattn.plots import (  # noqa: E402
    plot_reliability_diagram,
    plot_risk_coverage,
    plot_uncertainty_histograms,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _problem(seed: int = 0, n: int = 400, c: int = 5):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, c)) * 3
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    labels = rng.integers(0, c, size=n)
    return probs, labels


def _assert_png(path):
    assert path.exists()
    data = path.read_bytes()
    assert len(data) > len(PNG_MAGIC)
    assert data[:8] == PNG_MAGIC


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_reliability_diagram(tmp_path, figures, strategy):
    probs, labels = _problem()
    path = tmp_path / f"reliability_{strategy}.png"
    fig = plot_reliability_diagram(
        torch.tensor(probs), torch.tensor(labels), n_bins=10, strategy=strategy, path=path
    )
    figures.append(fig)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 2
    assert "ECE" in fig.axes[0].get_title()
    _assert_png(path)


def test_reliability_diagram_on_given_axes(tmp_path, figures):
    probs, labels = _problem(1)
    fig = Figure()
    figures.append(fig)
    ax = fig.subplots()
    out = plot_reliability_diagram(
        probs, labels, ax=ax, title="custom", path=str(tmp_path / "r.png")
    )
    assert out is fig
    assert len(fig.axes) == 2  # the given axes plus the appended confidence histogram
    assert ax.get_title() == "custom"
    _assert_png(tmp_path / "r.png")


def test_uncertainty_histograms(tmp_path, figures):
    rng = np.random.default_rng(2)
    path = tmp_path / "hist.png"
    fig = plot_uncertainty_histograms(
        rng.gamma(2.0, size=300), rng.gamma(4.0, size=200), label="entropy", bins=20, path=path
    )
    figures.append(fig)
    assert len(fig.axes) == 1
    legend = fig.axes[0].get_legend()
    assert legend is not None and "AUROC" in legend.get_title().get_text()
    assert fig.axes[0].get_xlabel() == "entropy"
    _assert_png(path)


def test_uncertainty_histograms_constant_scores(tmp_path, figures):
    path = tmp_path / "const.png"
    fig = plot_uncertainty_histograms([1.0, 1.0], [1.0], path=path)
    figures.append(fig)
    assert len(fig.axes) == 1
    _assert_png(path)


def test_risk_coverage(tmp_path, figures):
    rng = np.random.default_rng(3)
    unc = rng.uniform(size=250)
    correct = rng.uniform(size=250) > unc
    path = tmp_path / "rc.png"
    fig = plot_risk_coverage(torch.tensor(unc), torch.tensor(correct), path=path)
    figures.append(fig)
    assert len(fig.axes) == 1
    assert len(fig.axes[0].get_lines()) == 3  # model, oracle, full-coverage risk
    _assert_png(path)


def test_no_path_writes_nothing(tmp_path, figures, monkeypatch):
    monkeypatch.chdir(tmp_path)
    probs, labels = _problem(4, n=50)
    figures.append(plot_reliability_diagram(probs, labels))
    figures.append(plot_uncertainty_histograms([0.1, 0.2], [0.3, 0.5]))
    figures.append(plot_risk_coverage([0.1, 0.2, 0.3], [1, 0, 1]))
    assert list(tmp_path.iterdir()) == []


def test_bad_inputs_raise(figures):
    probs, labels = _problem(5, n=20)
    with pytest.raises(ValueError, match="labels must have shape"):
        plot_reliability_diagram(probs, labels[:-1])
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes"):
        plot_reliability_diagram(probs, labels, ax="not an axes")
    with pytest.raises(ValueError, match="scores_out is empty"):
        plot_uncertainty_histograms([0.1], [])
    with pytest.raises(ValueError, match="bins must be a positive int; got 0"):
        plot_uncertainty_histograms([0.1], [0.2], bins=0)
    with pytest.raises(ValueError, match="correct must have the same shape"):
        plot_risk_coverage([0.1, 0.2], [1])


def test_matplotlib_is_imported_lazily():
    # No module-level matplotlib import (TYPE_CHECKING-only imports are fine), so importing
    # bayesattn.plots never selects a backend.
    import bayesattn.plots as plots_module

    tree = ast.parse(Path(plots_module.__file__).read_text())
    for node in tree.body:
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        assert not any(name.split(".")[0] == "matplotlib" for name in names), names
