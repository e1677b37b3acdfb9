"""The ArviZ export of a mixture posterior's predictions: a ``component`` dim."""

import pytest
import torch

from bayesattn.diagnostics import predictive_to_arviz
from bayesattn.nn.mixture import rank1_mixture
from bayesattn.nn.networks import VisionTransformer
from bayesattn.uncertainty import predict

pytest.importorskip("arviz")


def _posterior(idata):
    return idata.posterior if hasattr(idata, "posterior") else idata["posterior"]


def _fitted():
    torch.manual_seed(0)
    net = VisionTransformer(3, image_size=4, patch_size=2, d_model=8, nhead=2, num_layers=1,
                            dim_feedforward=16, dropout=0.0)  # fmt: skip
    rank1_mixture(net, 2, init_std=0.05)
    x = torch.randn(5, 4, 4)
    return net.eval(), x, torch.randint(0, 3, (5,))


def test_mixture_result_exports_a_component_dim():
    net, x, y = _fitted()
    r = predict(net, x, 6, keep_attention=True)
    idata = predictive_to_arviz(r, y=y)
    post = _posterior(idata)
    w = post["encoder.layers.0.self_attn.weights"]
    assert w.dims == ("chain", "draw", "component", "example", "head", "query", "key")
    assert w.shape == (1, 3, 2, 5, 2, 5, 5)
    samples = r.attention["encoder.layers.0.self_attn"].samples
    for k in range(2):  # component k's draws are samples[k::K]
        got = torch.as_tensor(w.sel(component=k).values[0])
        torch.testing.assert_close(got, samples[k::2])
    assert post["probs"].dims[:3] == ("chain", "draw", "component")
    ll = idata.log_likelihood if hasattr(idata, "log_likelihood") else idata["log_likelihood"]
    assert ll["obs"].shape == (1, 3, 5)  # one value per stratum (a draw of each component)
    expect = torch.logsumexp(r.log_likelihood(y).reshape(3, 2, 5), 1) - torch.tensor(2.0).log()
    torch.testing.assert_close(torch.as_tensor(ll["obs"].values[0]), expect)


def test_mixture_export_splits_chains_and_refuses_a_bad_split():
    net, x, y = _fitted()
    r = predict(net, x, 8, keep_attention=True)
    post = _posterior(predictive_to_arviz(r, num_chains=2))
    assert post["probs"].shape[:3] == (2, 2, 2)
    with pytest.raises(ValueError, match="num_chains=3 must divide the 4 draws per component"):
        predictive_to_arviz(r, num_chains=3)


def test_mixture_export_labels_tokens():
    net, x, _ = _fitted()
    r = predict(net, x, 2, keep_attention=True)
    labels = ["cls", "a", "b", "c", "a"]  # a repeated token: positions tell them apart
    post = _posterior(predictive_to_arviz(r, tokens=labels))
    assert list(post["query"].values) == [0, 1, 2, 3, 4]
    assert list(post["query_token"].values) == labels
