"""The ArviZ export under the real ArviZ 1.x (``arviz_base``/``arviz_stats``, ``xarray.DataTree``).

``make test`` runs these in a second environment (``make test-arviz1``: Python 3.12, arviz >= 1,
``BAYESATTN_EXPECT_ARVIZ_MAJOR=1``); in the main environment (arviz 0.x) the 1.x tests skip and
``tests/diagnostics/test_diagnostics.py`` covers the InferenceData API.
``test_arviz_generation_is_the_expected_one`` makes a wrong environment fail instead of skipping
everything silently.
"""

from __future__ import annotations

import os

import numpy as np
import pyro.distributions as dist
import pytest
import torch

from bayesattn import diagnostics as D
from bayesattn.diagnostics import arviz_io
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import TransformerClassifier

az = pytest.importorskip("arviz")
MAJOR = D.arviz_major_version()
needs_arviz1 = pytest.mark.skipif(MAJOR < 1, reason=f"arviz {az.__version__}: 1.x API test")


def _clf(num_layers=1):
    return TransformerClassifier(
        2,
        vocab_size=10,
        d_model=16,
        nhead=2,
        num_layers=num_layers,
        dim_feedforward=32,
        dropout=0.0,
        attention=AttentionConfig(family="dirichlet"),
    )


def test_arviz_generation_is_the_expected_one():
    """``make test`` says which ArviZ generation each environment must have: a silent fallback
    to the other one (and so to skipped tests) fails here."""
    expect = os.environ.get("BAYESATTN_EXPECT_ARVIZ_MAJOR")
    if expect is None:
        pytest.skip("BAYESATTN_EXPECT_ARVIZ_MAJOR not set (make test sets it)")
    assert MAJOR == int(expect), f"arviz {az.__version__} installed, expected major {expect}"
    assert arviz_io.arviz_is_v1() == (MAJOR >= 1)


@pytest.fixture
def from_dict_calls(monkeypatch):
    """Counts calls of the real ``arviz_base.from_dict`` (it still does all the work)."""
    import arviz_base

    real, calls = arviz_base.from_dict, []

    def spy(*a, **k):
        calls.append(k.get("sample_dims"))
        return real(*a, **k)

    monkeypatch.setattr(arviz_base, "from_dict", spy)
    return calls


@needs_arviz1
def test_to_arviz_builds_a_datatree_through_arviz_base(from_dict_calls):
    import xarray as xr

    w = torch.rand(6, 2, 1, 3, 3)
    w = w / w.sum(-1, keepdim=True)
    ll = -torch.rand(6, 2)
    tree = D.to_arviz(
        {"layer.weights": w},
        log_likelihood={"obs": ll},
        sample_dims=("sample",),
        tokens=["a", "b", "c"],
    )
    assert from_dict_calls == [["chain", "draw"]]  # the 1.x path ran, with the real arviz_base
    assert isinstance(tree, xr.DataTree)
    post = tree["posterior"].to_dataset()
    assert post["layer.weights"].dims == ("chain", "draw", "example", "head", "query", "key")
    assert post["layer.weights"].shape == (1, 6, 2, 1, 3, 3)
    assert list(post["query"].values) == [0, 1, 2]
    assert list(post["query_token"].values) == ["a", "b", "c"]
    # unindexed under 1.x (its summary refuses a second index on a dim): index, then select
    w_b = post["layer.weights"].set_xindex("query_token").sel(query_token="b")
    assert w_b.dims[-1] == "key"
    np.testing.assert_array_equal(w_b.values, post["layer.weights"].values[..., 1, :])
    np.testing.assert_array_equal(post["layer.weights"].values[0], w.numpy())
    np.testing.assert_array_equal(tree["log_likelihood"].to_dataset()["obs"].values[0], ll.numpy())


@needs_arviz1
def test_predictive_to_arviz_groups_and_log_likelihood(from_dict_calls):
    net = _clf()
    x, y = torch.randint(1, 10, (4, 3)), torch.tensor([0, 1, 1, 0])
    tree = D.predictive_to_arviz(net, x, y, num_samples=30, seed=0, num_data=1000)
    assert len(from_dict_calls) == 1
    assert {"posterior", "posterior_predictive", "observed_data", "log_likelihood"} <= set(
        tree.children
    )
    w = tree["posterior"]["encoder.layers.0.self_attn.weights"].values
    assert w.shape == (1, 30, 4, 2, 3, 3)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(tree["observed_data"]["obs"].values, y.numpy())
    ll = tree["log_likelihood"]["obs"].values
    np.testing.assert_allclose(ll[0], D.pointwise_log_likelihood(net, x, y, 30, seed=0), rtol=1e-6)


@needs_arviz1
def test_arviz1_ess_rhat_summary_on_attention_weights():
    """Independent draws: ESS ≈ S, R-hat ≈ 1, means = the Dirichlet means, with arviz 1.x."""
    S = 400
    conc = torch.tensor([[[[8.0, 2.0], [1.0, 1.0]]]])  # (B=1, H=1, Tq=2, Tk=2)
    w = dist.Dirichlet(conc).sample((S,))  # (S, 1, 1, 2, 2)
    tree = D.to_arviz(
        {"layer.weights": w}, sample_dims=("sample",), tokens=["cls", "tok"], num_chains=4
    )
    ess = az.ess(tree)["layer.weights"].values
    rhat = az.rhat(tree)["layer.weights"].values
    assert np.all(ess > 0.6 * S) and np.all(ess < 1.6 * S)
    assert np.all(np.abs(rhat - 1) < 0.02)
    summ = az.summary(tree, var_names=["layer.weights"])
    assert len(summ) == 4
    np.testing.assert_allclose(summ["mean"].values.astype(float), [0.8, 0.2, 0.5, 0.5], atol=0.05)


@needs_arviz1
@pytest.mark.filterwarnings("ignore:Estimated shape parameter of Pareto:UserWarning")
def test_our_psis_gives_arviz_stats_loo_pareto_k():
    """One PSIS everywhere: our k̂ (Pyro's GPD fit) equals arviz-stats' LOO k̂ under arviz 1.x,
    as it equals ``az.psislw`` under 0.x (tests/diagnostics/test_diagnostics.py)."""
    import arviz_stats

    rng = np.random.default_rng(0)
    S, N = 400, 6
    ll = rng.standard_t(3, size=(1, S, N)) * np.array([0.2, 0.5, 1.0, 2.0, 3.0, 4.0])
    tree = az.from_dict({"posterior": {"mu": rng.normal(size=(1, S))}, "log_likelihood": {"obs": ll}})
    ref = np.asarray(arviz_stats.loo(tree, pointwise=True).pareto_k).ravel()  # (N,)
    ours = np.array([D.psis_smooth(-ll[0, :, i])[1] for i in range(N)])
    np.testing.assert_allclose(ours, ref, rtol=1e-9)
    assert ref.max() > 0.7  # the check covers heavy tails, not only the easy ones
