"""Tests of bayesattn.diagnostics: ArviZ export (both API generations), PSIS k-hat, LOO model
comparison, NUTS as ground truth for SVI."""

from __future__ import annotations

import math
import subprocess
import sys
import types

import matplotlib.pyplot as plt
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import Predictive

from bayesattn import diagnostics as D
from bayesattn.diagnostics import arviz_io
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.nn.weights import bayesian_projections


def _clf(family="dirichlet", num_layers=1, num_classes=2):
    cfg = AttentionConfig(family=family)
    return TransformerClassifier(
        num_classes,
        vocab_size=10,
        d_model=16,
        nhead=2,
        num_layers=num_layers,
        dim_feedforward=32,
        dropout=0.0,
        attention=cfg,
    )


def _arviz_major():
    az = pytest.importorskip("arviz")
    return int(az.__version__.split(".")[0])


needs_arviz0 = pytest.mark.skipif(
    D.arviz_major_version() >= 1, reason="InferenceData API (arviz 0.x) test"
)


# ------------------------------------------------------------------------------------------------
# to_arviz_dict: the version-independent part (no arviz needed)
# ------------------------------------------------------------------------------------------------


def test_import_does_not_import_arviz():
    """Lazy ArviZ/matplotlib; and the models never import the diagnostics (no upward import)."""
    code = (
        "import sys, bayesattn.models; up = 'bayesattn.diagnostics' in sys.modules; "
        "import bayesattn.diagnostics; "
        "sys.exit(up or any(m in sys.modules for m in ('arviz', 'matplotlib')))"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_package_layout_keeps_every_public_name_and_the_layering():
    """Each public name lives in one concern module and is re-exported unchanged; the NUTS
    regression model sits with the models, ``NetworkDraws`` with the predictive engine that
    makes them (see test_import_does_not_import_arviz for layering)."""
    import importlib

    from bayesattn import models as M

    for name in D.__all__:
        obj = getattr(D, name)
        home = getattr(obj, "__module__", None)
        if home is not None:
            homes = ("bayesattn.diagnostics.", "bayesattn.models.", "bayesattn.predictive.")
            assert home.startswith(homes), (name, home)
            assert getattr(importlib.import_module(home), name) is obj
    for name in ("AttentionRegressionData", "attention_regression_model"):
        assert getattr(M, name) is getattr(D, name)
        assert getattr(M, name).__module__ == "bayesattn.models.regression"


def test_flat_draws_become_one_chain_with_attention_dims_and_tokens():
    S, B, H, T = 5, 2, 2, 3
    post = {
        "encoder.layers.0.self_attn.weights": torch.rand(S, B, H, T, T),
        "w.in_proj_weight": torch.randn(S, 1, 4, 3),  # Predictive's singleton dim
        "obs": torch.randint(0, 2, (S, B)),  # Predictive returns obs with the latents
    }
    data, dims, coords = D.to_arviz_dict(
        post,
        observed_data={"obs": torch.tensor([0, 1])},
        sample_dims=("sample",),
        tokens="a b c".split(),
    )
    assert set(data) == {"posterior", "posterior_predictive", "observed_data"}
    w = data["posterior"]["encoder.layers.0.self_attn.weights"]
    assert isinstance(w, np.ndarray) and w.shape == (1, S, B, H, T, T)
    assert data["posterior"]["w.in_proj_weight"].shape == (1, S, 4, 3)
    assert data["posterior_predictive"]["obs"].shape == (1, S, B)
    assert data["observed_data"]["obs"].shape == (B,)
    assert dims["encoder.layers.0.self_attn.weights"] == ["example", "head", "query", "key"]
    assert dims["obs"] == ["example"]
    assert dims["w.in_proj_weight"] == ["w.in_proj_weight_dim_0", "w.in_proj_weight_dim_1"]
    assert coords == {}  # positions: arviz's integer coordinates; the words come with to_arviz


def test_chain_draw_input_repeated_tokens_and_user_dims_coords():
    post = {"weights": np.random.rand(2, 4, 1, 1, 3, 3), "sigma": np.random.rand(2, 4)}
    data, dims, coords = D.to_arviz_dict(
        post, tokens=["x", "y", "x"], dims={"sigma": []}, coords={"head": ["h0"]}
    )
    assert data["posterior"]["weights"].shape == (2, 4, 1, 1, 3, 3)
    assert data["posterior"]["sigma"].shape == (2, 4)
    assert "query" not in coords and coords["head"] == ["h0"]  # repeated words: no dim labels


@needs_arviz0
def test_tokens_are_a_coordinate_beside_the_positions():
    """Positions index ``query``/``key``; the words are ``query_token``/``key_token``, repeats
    included, and select by word; ``az.summary`` labels are positions, never ``"i:word"``."""
    import arviz as az

    w = np.random.default_rng(0).dirichlet(np.ones(3), size=(2, 4, 1, 1, 3))  # (C, D, B, H, Tq, Tk)
    idata = D.to_arviz({"weights": w}, tokens=["x", "y", "x"])
    post = idata.posterior["weights"]
    assert list(post["query"].values) == [0, 1, 2] and list(post["key"].values) == [0, 1, 2]
    assert list(post["query_token"].values) == ["x", "y", "x"]
    assert post["query_token"].dims == ("query",) and post["key_token"].dims == ("key",)
    np.testing.assert_array_equal(post.sel(query_token="x").values, w[:, :, :, :, [0, 2]])
    np.testing.assert_array_equal(post.sel(query_token="y", key_token="x").values,
                                  w[:, :, :, :, 1][..., [0, 2]])  # fmt: skip
    labels = az.summary(idata, var_names=["weights"], kind="stats").index
    assert "weights[0, 0, 2, 1]" in labels and not any(":" in label for label in labels)
    cross = {"dec.cross.weights": np.random.rand(1, 3, 1, 1, 2, 3)}  # 2 queries, 3 keys
    only_keys = D.to_arviz(cross, tokens=["a", "b", "c"]).posterior
    assert "key_token" in only_keys.coords and "query_token" not in only_keys.coords


def test_stack_layers_and_conflicting_sizes_get_numbered_dims():
    S = 3
    post = {
        "encoder.layers.0.self_attn.weights": torch.rand(S, 2, 2, 4, 4),
        "encoder.layers.1.self_attn.weights": torch.rand(S, 2, 2, 4, 4),
        "decoder.layers.0.cross_attn.weights": torch.rand(S, 2, 2, 3, 4),
    }
    data, dims, coords = D.to_arviz_dict(post, sample_dims=("sample",), stack_layers=True)
    assert list(data["posterior"]) == ["encoder.self_attn.weights", "decoder.cross_attn.weights"]
    assert data["posterior"]["encoder.self_attn.weights"].shape == (1, S, 2, 2, 2, 4, 4)
    assert dims["encoder.self_attn.weights"] == ["layer", "example", "head", "query", "key"]
    assert coords["layer"] == [0, 1]
    # the cross-attention's 3 queries disagree with the 4 of self-attention; keys agree
    assert dims["decoder.cross_attn.weights"] == ["layer_1", "example", "head", "query_1", "key"]
    assert coords["layer_1"] == [0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            dict(posterior={"a": np.zeros((2, 3))}, log_likelihood={"b": np.zeros((3, 3))}),
            "mismatched",
        ),
        (dict(posterior={"a": np.zeros((1, 0, 2))}), "at least one draw"),
        (dict(posterior={"a": np.zeros(3)}), "leading sample dims"),
        (dict(posterior={"a": np.zeros((1, 2, 3))}, dims={"b": ["x"]}), "unknown variables"),
        (dict(posterior={"a": np.zeros((1, 2, 3))}, dims={"a": ["x", "y"]}), "has 2 names"),
        (dict(posterior={"a": np.zeros((1, 2, 3))}, coords={"zz": [1]}), "unknown dim"),
        (dict(posterior={"a": np.zeros((1, 2, 3))}, coords={"a_dim_0": [1]}), "has size 3"),
        (dict(posterior={"a/b": np.zeros((1, 2))}), "contains '/'"),
        (dict(posterior={"a": np.zeros((1, 2))}, sample_dims="chain"), "sample_dims"),
        (dict(posterior={"weights": np.zeros((1, 2, 1, 1, 2, 2))}, tokens=["a"]), "tokens"),
        (dict(posterior={}), "nothing to convert"),
        (dict(posterior={"a": np.zeros((5, 2))}, sample_dims=("s",), num_chains=2), "divisible"),
        (dict(posterior={"a": np.zeros((4, 2))}, num_chains=2), "already has"),
    ],
)
def test_to_arviz_dict_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        D.to_arviz_dict(**kwargs)


def test_to_arviz_dict_type_errors():
    with pytest.raises(TypeError, match="torch.Tensor or numpy"):
        D.to_arviz_dict({"a": "not an array"})
    with pytest.raises(TypeError, match="mapping"):
        D.to_arviz_dict([np.zeros((1, 2))])


def test_v1_adapter_passes_the_datatree_contract(monkeypatch):
    """The 1.x branch of the adapter, run against a stand-in for ``arviz_base.from_dict`` that
    builds the DataTree with xarray exactly as the 1.x signature documents."""
    xr = pytest.importorskip("xarray")
    calls = {}

    def from_dict(data, *, sample_dims=None, coords=None, dims=None, **kw):
        calls.update(sample_dims=sample_dims, dims=dims, coords=coords)
        tree = {}
        for group, variables in data.items():
            sd = [] if "data" in group else list(sample_dims)
            tree[group] = xr.Dataset(
                {
                    v: (sd + dims.get(v, [f"{v}_dim_{i}" for i in range(a.ndim - len(sd))]), a)
                    for v, a in variables.items()
                },
                coords={k: v for k, v in coords.items() if any(k in d for d in dims.values())},
            )
        return xr.DataTree.from_dict(tree)

    monkeypatch.setitem(sys.modules, "arviz_base", types.SimpleNamespace(from_dict=from_dict))
    monkeypatch.setattr(arviz_io, "arviz_is_v1", lambda: True)  # the adapter's own switch
    w = torch.rand(6, 2, 1, 3, 3)
    tree = D.to_arviz(
        {"weights": w},
        log_likelihood={"obs": torch.randn(6, 2)},
        sample_dims=("sample",),
        tokens=["a", "b", "c"],
    )
    assert calls["sample_dims"] == ["chain", "draw"]
    assert isinstance(tree, xr.DataTree)
    post = tree["posterior"].to_dataset()
    assert post["weights"].dims == ("chain", "draw", "example", "head", "query", "key")
    assert list(post["query"].values) == [0, 1, 2]
    assert list(post["query_token"].values) == ["a", "b", "c"]
    assert tree["posterior"]["weights"].sel(key_token="b").dims[-1] == "query"
    assert tree["log_likelihood"].to_dataset()["obs"].dims == ("chain", "draw", "example")


def test_v1_real_arviz():
    if _arviz_major() < 1:
        pytest.skip("arviz >= 1 not installed")
    import arviz as az

    tree = D.to_arviz({"weights": torch.rand(50, 2, 1, 3, 3)}, sample_dims=("sample",))
    assert tree["posterior"]["weights"].dims[:2] == ("chain", "draw")
    assert az.ess(tree["posterior"].to_dataset())["weights"].shape == (2, 1, 3, 3)


# ------------------------------------------------------------------------------------------------
# to_arviz / predictive_to_arviz with arviz 0.x
# ------------------------------------------------------------------------------------------------


@needs_arviz0
def test_predictive_output_to_inferencedata_and_netcdf_round_trip(tmp_path):
    import arviz as az

    net = _clf(num_layers=2)
    bayesian_projections(net, targets=["*layers.0.self_attn.out_proj.weight"])
    x = torch.randint(1, 10, (3, 4))
    draws = Predictive(net.model, guide=net.guide, num_samples=20, parallel=True)(x)
    idata = D.to_arviz(draws, sample_dims=("sample",), tokens=["the", "cat", "sat", "down"])
    assert isinstance(idata, az.InferenceData)
    w = idata.posterior["encoder.layers.1.self_attn.weights"]
    assert w.dims == ("chain", "draw", "example", "head", "query", "key")
    assert w.shape == (1, 20, 3, 2, 4, 4)
    assert list(w["key"].values) == [0, 1, 2, 3]
    assert list(w["key_token"].values) == ["the", "cat", "sat", "down"]
    assert idata.posterior["encoder.layers.0.self_attn.out_proj.weight"].shape == (1, 20, 16, 16)
    assert idata.posterior_predictive["obs"].dims == ("chain", "draw", "example")
    path = tmp_path / "attention.nc"
    idata.to_netcdf(str(path))
    back = az.from_netcdf(str(path))
    np.testing.assert_array_equal(back.posterior[w.name].values, w.values)
    assert list(back.posterior[w.name]["query_token"].values) == ["the", "cat", "sat", "down"]


@needs_arviz0
def test_predictive_to_arviz_groups_and_unscaled_log_likelihood():
    net = _clf()
    x, y = torch.randint(1, 10, (4, 3)), torch.tensor([0, 1, 1, 0])
    idata = D.predictive_to_arviz(net, x, y, num_samples=30, seed=0, num_data=1000)
    assert set(idata.groups()) == {
        "posterior",
        "posterior_predictive",
        "observed_data",
        "log_likelihood",
    }
    assert idata.posterior["encoder.layers.0.self_attn.weights"].shape == (1, 30, 4, 2, 3, 3)
    np.testing.assert_array_equal(idata.observed_data["obs"].values, y.numpy())
    ll = idata.log_likelihood["obs"].values
    assert ll.shape == (1, 30, 4) and np.all(ll <= 0)
    # num_data scales the ELBO, never the pointwise log-likelihood
    ll1 = D.pointwise_log_likelihood(net, x, y, 30, seed=0)
    np.testing.assert_allclose(ll[0], ll1.numpy(), rtol=1e-6)
    # weights are simplex rows
    w = idata.posterior["encoder.layers.0.self_attn.weights"].values
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)


def test_log_likelihood_of_deterministic_network_is_log_softmax_and_parallel_equals_loop():
    net = _clf(family=None).eval()
    x, y = torch.randint(1, 10, (5, 3)), torch.tensor([0, 1, 1, 0, 1])
    expect = torch.log_softmax(net(x), -1)[torch.arange(5), y]
    for parallel in (True, False):
        ll = D.pointwise_log_likelihood(net, x, y, 4, parallel=parallel)
        assert ll.shape == (4, 5)
        torch.testing.assert_close(ll, expect.expand(4, 5).detach())


def test_parallel_and_sequential_draws_agree_in_distribution():
    net = _clf()
    x, y = torch.randint(1, 10, (3, 3)), torch.tensor([0, 1, 1])
    a = D.network_draws(net, x, y, 400, seed=1)
    b = D.network_draws(net, x, y, 60, parallel=False, seed=2)
    name = "encoder.layers.0.self_attn.weights"
    assert a.sites[name].shape == (400, 3, 2, 3, 3) and b.sites[name].shape == (60, 3, 2, 3, 3)
    wa, wb = a.sites[name].mean(0), b.sites[name].mean(0)
    se = (a.sites[name].std(0) ** 2 / 400 + b.sites[name].std(0) ** 2 / 60).sqrt()
    assert bool(((wa - wb).abs() <= 5 * se + 1e-6).all())
    assert a.predictive.shape == (400, 3) and b.log_likelihood.shape == (60, 3)


def test_network_draws_errors():
    net = _clf()
    x, y = torch.randint(1, 10, (2, 3)), torch.tensor([0, 1])
    with pytest.raises(ValueError, match="num_samples"):
        D.network_draws(net, x, y, 0)
    with pytest.raises(ValueError, match="unknown sites"):
        D.network_draws(net, x, y, 2, var_names=["nope"])
    with pytest.raises(TypeError, match="callable .model"):
        D.network_draws(object(), x, y, 2)
    with pytest.raises(ValueError, match="needs the observed y"):
        D.pointwise_log_likelihood(net, x, None, 2)


@needs_arviz0
def test_arviz_summary_ess_rhat_and_plots_on_attention_weights():
    """Independent variational draws: ESS ≈ S and R-hat ≈ 1 by construction (they say nothing
    about the fit); the summary and plots are for looking at attention uncertainty."""
    import arviz as az

    S = 400
    conc = torch.tensor([[[[8.0, 2.0], [1.0, 1.0]]]])  # (B=1, H=1, Tq=2, Tk=2)
    w = dist.Dirichlet(conc).sample((S,))  # (S, 1, 1, 2, 2)
    idata = D.to_arviz({"layer.weights": w}, sample_dims=("sample",), tokens=["cls", "tok"])
    assert np.isnan(az.rhat(idata)["layer.weights"].values).all()  # one chain: R-hat undefined
    idata = D.to_arviz(
        {"layer.weights": w}, sample_dims=("sample",), tokens=["cls", "tok"], num_chains=4
    )
    summ = az.summary(idata, var_names=["layer.weights"])
    assert len(summ) == 4
    assert "layer.weights[0, 0, 0, 1]" in summ.index  # positions: (example, head, query, key)
    np.testing.assert_allclose(summ["mean"].values, [0.8, 0.2, 0.5, 0.5], atol=0.05)
    ess = az.ess(idata)["layer.weights"].values
    rhat = az.rhat(idata)["layer.weights"].values
    assert np.all(ess > 0.6 * S) and np.all(ess < 1.6 * S)
    assert np.all(np.abs(rhat - 1) < 0.02)
    axes = az.plot_forest(idata, var_names=["layer.weights"], combined=True)
    assert len(np.ravel(axes)) >= 1
    axes = az.plot_posterior(idata, var_names=["layer.weights"], coords={"query_token": ["cls"]})
    assert np.ravel(axes).size == 2
    plt.close("all")


# ------------------------------------------------------------------------------------------------
# PSIS
# ------------------------------------------------------------------------------------------------


@needs_arviz0
@pytest.mark.parametrize("seed", range(4))
def test_psis_smooth_matches_arviz_psislw(seed):
    import arviz as az

    rng = np.random.default_rng(seed)
    for lw in (
        rng.normal(size=1000),  # light tail (log-normal weights)
        rng.standard_t(2, size=1000) * 2,  # heavy tail
        np.log(rng.pareto(1.5, size=700) + 1e-3),  # k ≈ 0.67
        -rng.exponential(size=50),  # few draws
    ):
        ours, k = D.psis_smooth(lw)
        ref, kref = az.psislw(lw.copy())
        assert k == pytest.approx(float(kref), rel=1e-9, abs=1e-12)
        np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-12)


def test_psis_smooth_edge_cases():
    lw, k = D.psis_smooth(np.zeros(10))
    assert k == float("-inf") and np.allclose(np.exp(lw), 0.1)
    with pytest.raises(ValueError, match="NaN"):
        D.psis_smooth(np.array([0.0, np.nan, 1.0]))
    with pytest.raises(ValueError, match="at least 2"):
        D.psis_smooth(np.array([0.0]))
    assert [D.interpret_khat(k) for k in (0.1, 0.5, 0.7, 0.71, float("inf"), float("nan"))] == [
        "good",
        "ok",
        "ok",
        "unreliable",
        "unreliable",
        "unreliable",
    ]


def _normal_mean_model(x):
    mu = pyro.sample("mu", dist.Normal(x.new_zeros(()), 1.0))
    with pyro.plate("data", x.shape[0]):
        pyro.sample("x", dist.Normal(mu, 1.0), obs=x)


def _normal_guide(loc, scale):
    def guide(x):
        pyro.sample("mu", dist.Normal(x.new_tensor(loc), scale))

    return guide


@pytest.fixture
def conjugate():
    """x_i ~ N(mu, 1), mu ~ N(0, 1): posterior N(sum x / (n + 1), 1 / (n + 1))."""
    x = torch.randn(20, dtype=torch.float64) + 1.0
    n = x.shape[0]
    return x, float(x.sum() / (n + 1)), 1.0 / math.sqrt(n + 1)


@pytest.mark.parametrize("k_true", [0.2, 0.5, 0.8])
def test_psis_khat_recovers_the_pareto_shape_of_known_tails(k_true):
    """Weights drawn from a generalized Pareto distribution with shape k: k-hat estimates k (the
    weak prior shrinks towards 0.5 by 10 / (M + 10) with M = 3·sqrt(S) ≈ 520 tail draws)."""
    rng = np.random.default_rng(0)
    u = rng.uniform(size=30_000)
    w = (u ** (-k_true) - 1.0) / k_true  # GPD(k, sigma=1) by inversion
    _, k = D.psis_smooth(np.log(w))
    assert k == pytest.approx(k_true, abs=0.08)


def test_psis_diagnostic_uses_psis_smooth_whatever_arviz_is_installed(conjugate):
    """One PSIS: psis_diagnostic's k-hat and weights are psis_smooth's on the same log weights."""
    x, m, s = conjugate
    res = D.psis_diagnostic(
        _normal_mean_model, _normal_guide(m + s, 0.5 * s), x, num_samples=300, seed=0
    )
    smoothed, k = D.psis_smooth(res.log_weights)
    assert res.khat == k and math.isfinite(k)
    np.testing.assert_array_equal(res.smoothed_log_weights, smoothed)


def test_psis_tail_fit_is_pyros_generalized_pareto_fit():
    """The tail fit is pyro.ops.stats.fit_generalized_pareto (pinned with Pyro), not a copy."""
    from bayesattn.diagnostics import psis

    assert psis.fit_generalized_pareto is pyro.ops.stats.fit_generalized_pareto
    x = np.sort(np.random.default_rng(1).pareto(2.0, size=200))
    assert psis._fit_gpd(x) == pyro.ops.stats.fit_generalized_pareto(torch.from_numpy(x))


@needs_arviz0
@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto")
def test_loo_pareto_k_equals_psis_smooth_of_the_pointwise_log_likelihood():
    """az.loo smooths -log p(y_b | w_s) per observation: its k-hat are psis_smooth's."""
    import arviz as az

    rng = np.random.default_rng(3)
    S, B = 400, 6
    ll = rng.normal(size=(S, B)) * rng.uniform(0.2, 3.0, size=B) - 1.0  # (S, B)
    obj = D.to_arviz(log_likelihood={"obs": ll}, sample_dims=("sample",))
    loo = az.loo(obj, pointwise=True, reff=1.0)
    ours = [D.psis_smooth(-ll[:, b])[1] for b in range(B)]
    np.testing.assert_allclose(np.asarray(loo.pareto_k), ours, rtol=1e-9, atol=1e-12)


def test_psis_khat_small_for_exact_or_wider_guide_large_for_narrow_shifted(conjugate):
    x, m, s = conjugate
    exact = D.psis_diagnostic(_normal_mean_model, _normal_guide(m, s), x, num_samples=1000, seed=0)
    wide = D.psis_diagnostic(
        _normal_mean_model, _normal_guide(m, 1.3 * s), x, num_samples=1000, seed=0
    )
    bad = D.psis_diagnostic(
        _normal_mean_model, _normal_guide(m + 2 * s, 0.3 * s), x, num_samples=1000, seed=0
    )
    assert exact.khat < 0.5 and exact.interpretation == "good"
    assert wide.khat < 0.5 and wide.interpretation == "good"
    assert bad.khat > 0.7 and bad.interpretation == "unreliable"
    assert wide.ess > 0.5 * 1000 and bad.ess < 0.2 * 1000
    # exact guide: log w = log p(x) for every draw
    n = x.shape[0]
    log_evidence = float(
        dist.MultivariateNormal(
            torch.zeros(n, dtype=x.dtype), torch.eye(n, dtype=x.dtype) + 1.0
        ).log_prob(x)
    )
    np.testing.assert_allclose(exact.log_weights, log_evidence, atol=1e-9)


def test_psis_vectorised_equals_loop_in_expectation(conjugate):
    x, m, s = conjugate
    guide = _normal_guide(m + 0.5 * s, 0.8 * s)
    loop = D.psis_diagnostic(_normal_mean_model, guide, x, num_samples=400, seed=1)
    vec = D.psis_diagnostic(_normal_mean_model, guide, x, num_samples=4000, vectorize=True, seed=2)
    assert vec.log_weights.shape == (4000,)
    se = math.sqrt(loop.log_weights.var() / 400 + vec.log_weights.var() / 4000)
    assert abs(loop.elbo - vec.elbo) < 5 * se
    with pytest.raises(ValueError, match=">= 2"):
        D.psis_diagnostic(_normal_mean_model, guide, x, num_samples=1)


def test_psis_on_a_tiny_dirichlet_attention_classifier():
    net = _clf()
    x, y = torch.randint(1, 10, (2, 3)), torch.tensor([0, 1])
    res = D.psis_diagnostic(net.model, net.guide, x, y, num_samples=500, vectorize=True, seed=0)
    assert math.isfinite(res.khat)
    assert res.interpretation in D.KHAT_INTERPRETATIONS
    assert res.log_weights.shape == (500,) and np.isfinite(res.log_weights).all()


# ------------------------------------------------------------------------------------------------
# LOO model comparison
# ------------------------------------------------------------------------------------------------


def _task(n, seed):
    """Label: does token 1 occur in the sequence?"""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, 10, (n, 4), generator=g)
    return x, (x == 1).any(-1).long()


@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto:UserWarning")
def test_loo_ranks_the_trained_network_first():
    """Under either ArviZ (its own compare table: ``elpd_loo`` in 0.x, ``elpd`` in 1.x)."""
    col = "elpd" if D.arviz_major_version() >= 1 else "elpd_loo"
    x, y = _task(128, 0)
    xh, yh = _task(64, 1)
    trained, untrained = _clf(), _clf()
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    for _ in range(100):
        loss, _ = trained.elbo_loss(x, y, num_data=128)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        acc = (trained(xh).argmax(-1) == yh).float().mean()
    assert acc > 0.8
    table = D.compare_attention_variants(
        {"untrained": (untrained, xh, yh), "trained": (trained, xh, yh)}, num_samples=100
    )
    assert list(table.index) == ["trained", "untrained"]
    assert np.isfinite(table[col]).all()
    assert table.loc["trained", col] > table.loc["untrained", col] + 5


# ------------------------------------------------------------------------------------------------
# NUTS as ground truth
# ------------------------------------------------------------------------------------------------


# jit_compile=True halves NUTS' time here (same draws as without); torch.jit.trace is deprecated
_JIT_OK = pytest.mark.filterwarnings("ignore:.*torch.jit.trace.*is deprecated:DeprecationWarning")


@pytest.fixture(scope="module")
def nuts_run():
    data = D.simulate_attention_regression(num_data=30, seed=0)
    nuts = D.nuts_attention_regression(
        data, num_samples=300, warmup_steps=200, num_chains=2, seed=0, jit_compile=True
    )
    return data, nuts


@pytest.mark.slow
@_JIT_OK
def test_nuts_converges_on_the_attention_regression(nuts_run):
    data, nuts = nuts_run
    assert nuts.samples["M"].shape == (2, 300, 2, 2)
    assert nuts.samples["log_pi"].shape == (2, 300, 2)
    assert nuts.max_rhat < 1.05
    assert nuts.min_ess_bulk > 100
    # the truth lies within 3 posterior sds
    for k, truth in data.true_params.items():
        s = nuts.samples[k].flatten(0, 1)
        assert bool(((s.mean(0) - truth).abs() < 3 * s.std(0)).all())


@pytest.mark.slow
@_JIT_OK
def test_full_rank_svi_matches_nuts_and_mean_field_is_narrower(nuts_run):
    data, nuts = nuts_run
    mvn = D.compare_svi_nuts(data, guide="mvn", nuts=nuts, svi_steps=1000, seed=0)
    # Tolerance: a Gaussian guide of a near-Gaussian posterior should put its mean within a
    # quarter posterior sd of NUTS'; add 3 Monte-Carlo errors of NUTS' mean (sd/sqrt(ESS)) and of
    # the guide draws' mean (sd/sqrt(n)).
    tol = 0.25 * mvn.nuts_sd + 3 * mvn.nuts_mcse + 3 * mvn.svi_sd / math.sqrt(mvn.num_svi_draws)
    assert np.all(np.abs(mvn.svi_mean - mvn.nuts_mean) < tol), mvn.table()
    assert np.all((mvn.sd_ratio > 0.5) & (mvn.sd_ratio < 1.5)), mvn.table()
    # Mean field minimises KL(q||p): for correlated posteriors it matches the conditional
    # variances 1/Lambda_ii <= marginal variances, so its sds are (on average) too small.
    mf = D.compare_svi_nuts(data, guide="normal", nuts=nuts, svi_steps=1000, seed=0)
    assert np.all(np.abs(mf.svi_mean - mf.nuts_mean) < tol + 0.25 * mf.nuts_sd), mf.table()
    assert mf.sd_ratio.mean() < mvn.sd_ratio.mean()
    assert mf.sd_ratio.mean() < 1.0
    assert not list(pyro.get_param_store().keys())  # SVI ran in a scoped param store
