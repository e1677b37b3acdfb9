"""Attention figures in bayesattn.plots render to PNG (Agg) with the expected axes and data."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from bayesattn.geometry import attention_distance_by_layer  # noqa: E402
from bayesattn.nn.blocks import AttentionConfig  # noqa: E402
from bayesattn.nn.networks import TransformerClassifier  # noqa: E402
from bayesattn.plots import (  # noqa: E402
    plot_accuracy_vs_confidence,
    plot_attention_distance,
    plot_attention_uncertainty,
)
from bayesattn.uncertainty import predict  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _assert_png(path):
    assert path.exists()
    assert path.read_bytes()[:8] == PNG_MAGIC


def _net():
    return TransformerClassifier(
        3,
        vocab_size=7,
        d_model=8,
        nhead=2,
        num_layers=2,
        dim_feedforward=16,
        dropout=0.0,
        attention=AttentionConfig("dirichlet"),
    )


def test_attention_uncertainty_from_predict(tmp_path, figures):
    x = torch.randint(1, 7, (2, 5))
    res = predict(_net(), x, num_samples=16)
    a = res.attention["encoder.layers.1.self_attn"]
    tokens = [f"t{int(t)}" for t in x[0]]
    path = tmp_path / "attn.png"
    fig = plot_attention_uncertainty(
        a.mean[0, 1], a.std[0, 1], tokens, tokens, title="layer 1, head 1", path=path
    )
    figures.append(fig)
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 4  # two heatmaps + two colorbars
    ax_m, ax_s = fig.axes[0], fig.axes[1]
    assert [t.get_text() for t in ax_m.get_xticklabels()] == tokens
    assert [t.get_text() for t in ax_s.get_yticklabels()] == tokens
    np.testing.assert_allclose(ax_m.images[0].get_array(), a.mean[0, 1].double().numpy())
    np.testing.assert_allclose(ax_s.images[0].get_array(), a.std[0, 1].double().numpy())
    assert fig._suptitle.get_text() == "layer 1, head 1"
    _assert_png(path)


def test_attention_uncertainty_interval_width_on_given_axes(tmp_path, figures):
    rng = np.random.default_rng(0)
    w = rng.dirichlet(np.ones(4), size=(30, 3))  # (S, Tq, Tk)
    lo, hi = np.quantile(w, 0.05, axis=0), np.quantile(w, 0.95, axis=0)
    fig = Figure()
    figures.append(fig)
    axes = fig.subplots(1, 2)
    out = plot_attention_uncertainty(
        w.mean(0), hi - lo, std_label="90% interval width", axes=axes, path=tmp_path / "w.png"
    )
    assert out is fig
    assert axes[1].get_title() == "90% interval width"
    _assert_png(tmp_path / "w.png")


def test_attention_distance(tmp_path, figures):
    net = _net()
    d = attention_distance_by_layer(net, torch.randint(1, 7, (4, 6)))
    path = tmp_path / "dist.png"
    fig = plot_attention_distance(d, path=path)
    figures.append(fig)
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 3  # 2 heads + mean
    np.testing.assert_allclose(lines[0].get_ydata(), [float(v[0]) for v in d.values()])
    np.testing.assert_allclose(
        lines[2].get_ydata(), [float(v.double().mean()) for v in d.values()], rtol=1e-6
    )
    assert [t.get_text() for t in ax.get_xticklabels()] == list(d)
    _assert_png(path)


def test_accuracy_vs_confidence(tmp_path, figures):
    probs = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.3, 0.7], [0.45, 0.55]])
    labels = torch.tensor([0, 1, 1, 1])  # confidences 0.9 ✓, 0.6 ✗, 0.7 ✓, 0.55 ✓
    thr = [0.5, 0.58, 0.65, 0.8, 0.95]
    path = tmp_path / "acc.png"
    fig = plot_accuracy_vs_confidence(probs, labels, thresholds=thr, path=path)
    figures.append(fig)
    acc, kept = fig.axes[0].get_lines()
    np.testing.assert_allclose(acc.get_ydata(), [0.75, 2 / 3, 1.0, 1.0, np.nan])
    np.testing.assert_allclose(kept.get_ydata(), [1.0, 0.75, 0.5, 0.25, 0.0])
    _assert_png(path)
    # default thresholds, and the mean probs of a PredictionResult
    res = predict(_net(), torch.randint(1, 7, (20, 4)), num_samples=4)
    fig = plot_accuracy_vs_confidence(res.mean_probs, torch.randint(0, 3, (20,)))
    figures.append(fig)
    assert len(fig.axes[0].get_lines()[0].get_xdata()) == 51


def test_no_path_writes_nothing(tmp_path, figures, monkeypatch):
    monkeypatch.chdir(tmp_path)
    figures.append(plot_attention_uncertainty(np.eye(3), np.zeros((3, 3))))
    figures.append(plot_attention_distance({"a": [1.0, 2.0]}))
    figures.append(plot_accuracy_vs_confidence([[0.2, 0.8]], [1]))
    assert list(tmp_path.iterdir()) == []


def test_bad_inputs(figures):
    with pytest.raises(ValueError, match=r"mean must be 2-D \(Tq, Tk\)"):
        plot_attention_uncertainty(np.ones((2, 3, 3)), np.ones((3, 3)))
    with pytest.raises(ValueError, match="same shape"):
        plot_attention_uncertainty(np.ones((3, 3)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="key_labels must have 3 entries"):
        plot_attention_uncertainty(np.ones((2, 3)), np.ones((2, 3)), key_labels=["a"])
    with pytest.raises(TypeError, match="pair of matplotlib Axes"):
        plot_attention_uncertainty(np.ones((2, 2)), np.ones((2, 2)), axes="ax")
    with pytest.raises(ValueError, match="non-empty dict"):
        plot_attention_distance({})
    with pytest.raises(ValueError, match="same number of heads"):
        plot_attention_distance({"a": [1.0, 2.0], "b": [1.0]})
    with pytest.raises(ValueError, match=r"must be 1-D \(H,\)"):
        plot_attention_distance({"a": [[1.0]]})
    with pytest.raises(ValueError, match="labels must have shape"):
        plot_accuracy_vs_confidence([[0.2, 0.8]], [1, 0])
    with pytest.raises(ValueError, match="thresholds must be a non-empty 1-D"):
        plot_accuracy_vs_confidence([[0.2, 0.8]], [1], thresholds=[])
    with pytest.raises(TypeError, match="ax must be a matplotlib Axes"):
        plot_accuracy_vs_confidence([[0.2, 0.8]], [1], ax="ax")
