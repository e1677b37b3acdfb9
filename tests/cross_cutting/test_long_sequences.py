"""The long-sequence pieces: the seeded retrieval task, a toy run of the kernel comparison
(``benchmarks/long_task.py``), and the geometry report (``bayesattn.geometry.geometry_report``)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from bayesattn import AttentionConfig, VisionTransformer
from bayesattn.data.long import make_retrieval_task
from bayesattn.geometry import (
    geometry_report,
    spatial_attention_distance,
    spread_by_distance,
    token_distances,
)

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------- the task
def test_retrieval_task_is_seeded_and_has_one_needle_per_row():
    a = make_retrieval_task(200, length=300, num_values=5, num_noise=7, near=20, seed=3)
    b = make_retrieval_task(200, length=300, num_values=5, num_noise=7, near=20, seed=3)
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert not torch.equal(a.x, make_retrieval_task(200, length=300, seed=4).x)
    needles = (a.x >= 1) & (a.x <= 5)
    assert torch.equal(needles.sum(1), torch.ones(200, dtype=torch.long))
    assert torch.equal(needles.float().argmax(1), a.pos)
    assert torch.equal(a.x[torch.arange(200), a.pos], a.y + 1)
    assert int(a.x.max()) == a.vocab_size - 1 == 12 and a.num_classes == 5
    near = (a.pos < 20).float().mean()
    assert 0.15 < float(near) < 0.45  # 25 % placed near + ~7 % of the rest by chance
    with pytest.raises(ValueError, match="near"):
        make_retrieval_task(2, length=10, near=11)
    with pytest.raises(ValueError, match="near_fraction"):
        make_retrieval_task(2, length=10, near=5, near_fraction=1.5)


def _load_long_task():
    spec = importlib.util.spec_from_file_location("long_task", ROOT / "benchmarks" / "long_task.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_long_task_toy_run_for_every_kernel():
    lt = _load_long_task()
    args = argparse.Namespace(
        train=32, test=8, length=64, pretrain_length=32, pretrain_steps=2, steps=1, batch=8,
        lr=3e-3, seed=0, family=None, samples=2, progress=False,
    )  # fmt: skip
    for kind in lt.KINDS:
        r = lt.run_kind(kind, args)
        assert 0.0 <= r["acc"] <= 1.0 and 0.0 <= r["ece"] <= 1.0
        assert math.isfinite(r["nll"]) and r["train_ms_per_step"] > 0
    args.family = "dirichlet"
    r = lt.run_kind("local", args)
    assert math.isfinite(r["nll"])


def test_long_sequence_benchmark_runs_every_method_and_path():
    spec = importlib.util.spec_from_file_location(
        "long_sequence", ROOT / "benchmarks" / "long_sequence.py"
    )
    ls = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ls)
    outs = {}
    for method in ls.KERNELS:
        for path in ls.PATHS:
            if method == "torch" and path == "S=8":
                continue
            y = ls.make_call(method, path, 40, 16, 2)()[0]
            assert y.shape == ((8, 1, 40, 16) if path == "S=8" else (1, 40, 16))
            outs[(method, path)] = y
    # exact kinds agree with dense on the posterior mean (same seed, same weights)
    for m in ("tiled", "topk"):  # k = 64 >= T: every key
        torch.testing.assert_close(outs[(m, "mean")], outs[("dense", "mean")], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------- geometry
def _vit(family="dirichlet", layers=2):
    torch.manual_seed(0)
    return VisionTransformer(
        4, d_model=16, nhead=2, num_layers=layers, dim_feedforward=16, dropout=0.0,
        attention=AttentionConfig(family=family) if family else None,
    )  # fmt: skip


def test_token_distances_are_pixels_between_patch_centres():
    d, first = token_distances(_vit(), 17)
    assert first == 1 and d.shape == (16, 16)
    assert float(d[0, 1]) == 2.0 and float(d[0, 4]) == 2.0
    assert math.isclose(float(d[0, 5]), 2 * math.sqrt(2))
    assert math.isclose(float(d[0, 15]), 2 * math.sqrt(18))
    torch.testing.assert_close(d, d.T)


def test_spatial_distance_and_spread_closed_forms():
    d = torch.tensor([[0.0, 1.0, 2.0], [1.0, 0.0, 1.0], [2.0, 1.0, 0.0]])
    w = torch.zeros(4, 4)
    w[:, 0] = 0.5  # CLS key gets half of every row: dropped and renormalised away
    w[1:, 1:] = 0.5 * torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    torch.testing.assert_close(
        spatial_attention_distance(w, d, first=1), torch.tensor([2.0, 1.0, 1.0])
    )
    # two draws: identity and the reversal; per-entry sd is 0.5 wherever they differ
    eye = torch.eye(3)
    samples = torch.stack([eye, eye.flip(-1)])  # (2, 3, 3)
    r = spread_by_distance(samples, d, num_bins=2)
    assert r["distance"] == [0.0, 0.5, 1.5]
    # d=0: mean weights (1, .5, 1)/3... entries (0,0),(1,1),(2,2): means .5, 1, .5
    assert math.isclose(r["mean_weight"][0], 2 / 3) and math.isclose(r["sd"][0], 1 / 3)
    assert math.isclose(r["mean_weight"][1], 0.0) and r["sd"][1] == 0.0  # d=1: never read
    assert math.isclose(r["mean_weight"][2], 0.5) and math.isclose(r["sd"][2], 0.5)
    same = spread_by_distance(torch.stack([eye, eye]), d)
    assert all(s == 0.0 for s in same["sd"])


def test_geometry_report_writes_figures_and_json_ready_numbers(tmp_path):
    x = torch.rand(6, 8, 8)
    r = geometry_report(_vit(), x, tmp_path, num_samples=3)
    json.dumps(r)
    assert r["layers"] == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    for f in r["figures"]:
        assert (tmp_path / f).stat().st_size > 1000
    max_d = 2 * math.sqrt(18)
    for n in r["layers"]:
        assert len(r["distance"][n]) == 2 and all(0 <= v <= max_d for v in r["distance"][n])
        assert 0 <= r["entropy_mean"][n] <= r["entropy_uniform"] + 1e-6
        assert r["posterior_sd"][n] > 0  # Dirichlet draws differ
        ang = torch.tensor(r["subspace_angle"][n])
        assert ang.shape == (2, 2) and float(ang.diagonal().abs().max()) < 1e-3
    dm = [r["distance_mean"][n] for n in r["layers"]]
    assert r["local_to_global"] == (dm[1] > dm[0])
    # 16 patches + CLS: the entropy is over 17 keys, so "uniform" is log 17 (not log 16)
    assert r["num_keys"] == 17 and math.isclose(r["entropy_uniform"], math.log(17))
    det = geometry_report(_vit(None), x, tmp_path / "det", num_samples=2, figures=False)
    assert det["figures"] == [] and not (tmp_path / "det").exists()
    assert all(v == 0.0 for v in det["posterior_sd"].values())


def test_geometry_uniform_line_is_log_of_the_keys_the_entropy_is_over(tmp_path, monkeypatch):
    """The "uniform" reference in the entropy-by-depth figure is log T over all T keys, so no
    entropy can plot above it (it was log 16 for 17 keys)."""
    from matplotlib.figure import Figure

    saved: dict[str, Figure] = {}
    real = Figure.savefig
    monkeypatch.setattr(
        Figure,
        "savefig",
        lambda self, f, **kw: (saved.setdefault(Path(f).name, self), real(self, f, **kw)),
    )
    r = geometry_report(_vit(), torch.rand(4, 8, 8), tmp_path, num_samples=2)
    ax = saved["spread_by_depth.png"].axes[0]
    (line,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("uniform")]
    assert math.isclose(line.get_ydata()[0], math.log(17), rel_tol=1e-9)
    assert max(r["entropy_mean"].values()) <= line.get_ydata()[0] + 1e-6
