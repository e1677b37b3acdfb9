"""bayesattn.uncertainty: posterior-predictive sampling, entropy decomposition, attention stats."""

from __future__ import annotations

import math

import pytest
import torch
from pyro import poutine

from bayesattn.nn.attention import BayesianMultiheadAttention
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.modes import attention_mode
from bayesattn.nn.networks import Seq2Seq, TransformerClassifier, VisionTransformer
from bayesattn.nn.weights import bayesian_projections
from bayesattn.predictive.network import draw_weights
from bayesattn.uncertainty import (
    AttentionSamples,
    PredictionResult,
    entropy,
    predict,
)

SMALL = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0)


def _clf(family="dirichlet", num_layers=2, **kw):
    kw = {**SMALL, **kw}
    return TransformerClassifier(
        3, vocab_size=7, num_layers=num_layers, attention=AttentionConfig(family), **kw
    )


def _tokens(B=5, T=4):
    x = torch.randint(1, 7, (B, T))
    x[0, -1] = 0  # one padding token
    return x


def test_shapes_decomposition_and_attention_rows():
    net = _clf()
    x = _tokens()
    res = predict(net, x, num_samples=8)
    S, B, C, H, T = 8, 5, 3, 2, 4
    assert res.probs.shape == (S, B, C) and res.mean_probs.shape == (B, C)
    for t in (res.predictive_entropy, res.expected_entropy, res.mutual_information):
        assert t.shape == (B,) and torch.isfinite(t).all()
    torch.testing.assert_close(res.probs.sum(-1), torch.ones(S, B))
    # H[E p] = E[H p] + MI, and MI >= 0 (Jensen)
    torch.testing.assert_close(
        res.predictive_entropy,
        res.expected_entropy + res.mutual_information,
        atol=1e-6,
        rtol=0,
    )
    assert torch.all(res.mutual_information >= 0)
    assert res.mutual_information.max() > 0  # stochastic attention → samples differ
    torch.testing.assert_close(res.predictive_entropy, entropy(res.mean_probs))
    assert torch.equal(res.predictions, res.mean_probs.argmax(-1))
    torch.testing.assert_close(res.confidence, res.mean_probs.max(-1).values)
    # attention: every layer, (S, B, H, Tq, Tk), rows on the simplex, padding key unread
    assert list(res.attention) == ["encoder.layers.0.self_attn", "encoder.layers.1.self_attn"]
    for a in res.attention.values():
        assert a.samples.shape == (S, B, H, T, T)
        torch.testing.assert_close(a.samples.sum(-1), torch.ones(S, B, H, T))
        assert torch.all(a.samples[:, 0, :, :, -1] == 0)
        assert a.mean.shape == a.std.shape == (B, H, T, T)
        assert a.entropy_of_mean().shape == a.mean_key_std().shape == (B, H, T)
        assert not a.samples[0].equal(a.samples[1])
    s = res.summary()
    assert s["num_samples"] == 8.0
    assert "attention/encoder.layers.0.self_attn/mean_key_std" in s
    assert all(isinstance(v, float) and math.isfinite(v) for v in s.values())


def test_deterministic_network_has_zero_mutual_information():
    net = _clf(family=None)
    x = _tokens()
    with pytest.warns(UserWarning, match="nothing random to draw"):
        res = predict(net, x, num_samples=6)
    assert res.probs.shape == (6, 5, 3)
    assert res.mutual_information.abs().max() < 1e-6
    torch.testing.assert_close(res.mean_probs, torch.softmax(net(x), -1))
    a = res.attention["encoder.layers.0.self_attn"]
    assert a.samples.shape == (6, 5, 2, 4, 4)
    assert a.std.abs().max() == 0 and a.mean_key_std().abs().max() == 0
    # mode="mean" makes a Bayesian network deterministic too (S copies of the posterior mean)
    bnet = _clf()
    res = predict(bnet, x, num_samples=4, mode="mean")
    assert res.mutual_information.abs().max() < 1e-6
    torch.testing.assert_close(res.mean_probs, torch.softmax(bnet(x), -1))


def test_predict_warns_only_when_draws_cannot_differ():
    import warnings

    x = _tokens()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        predict(_clf(), x, num_samples=4)  # Bayesian attention: the draws differ, no warning
        predict(_clf(), x, num_samples=4, mode="mean")  # asked for the mean: no warning
        predict(_clf(family=None), x, num_samples=1)  # one draw: nothing to compare
    with pytest.warns(UserWarning, match="convert"):  # a plain torch model the user forgot to convert
        predict(torch.nn.Sequential(torch.nn.Linear(3, 2)), torch.randn(4, 3), num_samples=3)


def _has_token3(n, g, low=4, T=8, V=10):
    """Synthetic task: label = whether token 3 occurs (in half the sequences, at a random
    position); other tokens uniform on [low, V)."""
    x = torch.randint(low, V, (n, T), generator=g)
    has = torch.rand(n, generator=g) < 0.5
    pos = torch.randint(0, T, (n,), generator=g)
    x[has, pos[has]] = 3
    return x, (x == 3).any(1).long()


def test_trained_network_is_less_uncertain_in_distribution():
    """After ~150 hybrid-ELBO steps the posterior predictive's epistemic uncertainty (MI) on
    in-distribution inputs is below (a) the prior predictive's (no data: attention drawn from the
    flat Dirichlet prior) and (b) the MI on OOD inputs that contain tokens never seen in training.

    (Not compared with the untrained network: its output is nearly constant in the attention
    weights, so its MI is ~0 whatever the posterior spread.)"""
    g = torch.Generator().manual_seed(0)
    N = 512
    x, y = _has_token3(N, g)
    net = TransformerClassifier(
        2,
        vocab_size=10,
        d_model=16,
        nhead=2,
        num_layers=1,
        dim_feedforward=32,
        dropout=0.0,
        max_len=8,
        attention=AttentionConfig(family="dirichlet"),
    )
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for _ in range(150):
        idx = torch.randint(0, N, (32,), generator=g)
        loss, _ = net.elbo_loss(x[idx], y[idx], num_data=N)
        opt.zero_grad()
        loss.backward()
        opt.step()
    gt = torch.Generator().manual_seed(123)
    x_in, y_in = _has_token3(128, gt)
    x_ood, _ = _has_token3(128, gt, low=1)  # tokens 1, 2 never seen in training
    post = predict(net, x_in, num_samples=32)
    prior = predict(net, x_in, num_samples=32, mode="model")
    ood = predict(net, x_ood, num_samples=32)
    assert (post.predictions == y_in).float().mean() > 0.95
    mi_in = post.mutual_information.mean()
    assert mi_in < 0.5 * prior.mutual_information.mean()
    assert mi_in < 0.5 * ood.mutual_information.mean()


def test_credible_intervals_and_key_summaries():
    net = _clf()
    res = predict(net, _tokens(), num_samples=64)
    a = res.attention["encoder.layers.1.self_attn"]
    lo, hi = a.interval(0.9)
    assert lo.shape == hi.shape == (5, 2, 4, 4)
    assert torch.all(lo <= a.mean + 1e-6) and torch.all(a.mean <= hi + 1e-6)
    lo5, hi5 = a.interval(0.5)
    assert torch.all(lo <= lo5 + 1e-7) and torch.all(hi5 <= hi + 1e-7)
    torch.testing.assert_close(lo, torch.quantile(a.samples, 0.05, dim=0))
    torch.testing.assert_close(hi, torch.quantile(a.samples, 0.95, dim=0))
    assert torch.all(a.std >= 0)
    k = a.keys_excluding(0.05, prob=0.9)
    assert k.shape == (5, 2, 4, 4) and k.dtype == torch.bool
    assert torch.equal(k, lo > 0.05)
    assert not a.keys_excluding(1.0).any()
    assert not k[0, :, :, -1].any()  # padding key: weight exactly 0
    # the padding key does not count in the average key std
    std = a.std[0]  # (H, Tq, Tk)
    torch.testing.assert_close(a.mean_key_std()[0], std[..., :3].mean(-1))


def test_attention_samples_closed_forms():
    # one entry takes the values 0.1 .. 0.5 over S = 5 draws; everything else is uniform
    S, T = 5, 4
    w = torch.full((S, 1, 1, 1, T), 1.0 / T)
    vals = torch.tensor([0.5, 0.1, 0.4, 0.2, 0.3])
    w[:, 0, 0, 0, 0] = vals
    w[:, 0, 0, 0, 1] = 0.5 - vals
    w[:, 0, 0, 0, 2:] = 0.25
    a = AttentionSamples(w)
    lo, hi = a.interval(0.5)
    assert lo[0, 0, 0, 0].item() == pytest.approx(0.2)  # quantiles 0.25, 0.75 of 0.1..0.5
    assert hi[0, 0, 0, 0].item() == pytest.approx(0.4)
    assert a.mean[0, 0, 0, 0].item() == pytest.approx(0.3)
    assert a.std[0, 0, 0, 0].item() == pytest.approx(vals.std().item())
    u = AttentionSamples(torch.full((3, 2, 2, 3, 5), 0.2))
    torch.testing.assert_close(u.entropy_of_mean(), torch.full((2, 2, 3), math.log(5)))
    assert torch.all(u.mean_key_std() == 0)
    assert torch.equal(u.keys_excluding(0.1), torch.ones(2, 2, 3, 5, dtype=torch.bool))
    # explicit allowed mask
    m = torch.tensor([True, True, False, False]).reshape(1, 1, 1, T)
    b = AttentionSamples(w, allowed=m)
    torch.testing.assert_close(b.mean_key_std()[0, 0, 0], a.std[0, 0, 0, :2].mean())


def test_batch_size_splitting_and_progress():
    x = _tokens(B=7)
    det = _clf(family=None)
    full = predict(det, x, num_samples=3)
    split = predict(det, x, num_samples=3, batch_size=3, progress=True)
    assert split.probs.shape == full.probs.shape == (3, 7, 3)
    torch.testing.assert_close(split.probs, full.probs)
    for k in full.attention:
        torch.testing.assert_close(split.attention[k].samples, full.attention[k].samples)
    net = _clf()
    a = predict(net, x, num_samples=4, batch_size=2)
    b = predict(net, x, num_samples=4)
    assert a.probs.shape == b.probs.shape == (4, 7, 3)
    for k in b.attention:
        assert a.attention[k].samples.shape == b.attention[k].samples.shape == (4, 7, 2, 4, 4)
    one = predict(net, x, num_samples=1, keep_attention=False)
    assert one.probs.shape == (1, 7, 3) and one.attention == {}
    assert torch.all(one.mutual_information.abs() < 1e-6)


def test_bayesian_projections_give_epistemic_uncertainty_without_bayesian_attention():
    net = _clf(family=None)
    bayesian_projections(net, init_scale=0.1)
    x = _tokens()
    res = predict(net, x, num_samples=16)
    assert res.probs.shape == (16, 5, 3)
    assert res.mutual_information.mean() > 1e-5
    a = res.attention["encoder.layers.0.self_attn"]
    assert not a.samples[0].equal(a.samples[1])  # attention varies with the sampled projections
    torch.testing.assert_close(
        res.predictive_entropy, res.expected_entropy + res.mutual_information, atol=1e-6, rtol=0
    )
    # "mean" mode uses the weight guide's median, exactly like the plain forward
    med = predict(net, x, num_samples=3, mode="mean")
    torch.testing.assert_close(med.mean_probs, torch.softmax(net(x), -1))
    assert med.mutual_information.abs().max() < 1e-6
    prior = predict(net, x, num_samples=4, mode="model")
    assert prior.probs.shape == (4, 5, 3)


def test_bayesian_head_weights_vectorise():
    """A Bayesian classifier head (weight (S, C, E)) travels through the one vectorised pass."""
    net = _clf(family="dirichlet", num_layers=1)
    bayesian_projections(net, targets="head.weight", init_scale=0.3)
    res = predict(net, _tokens(), num_samples=6, batch_size=3)
    assert res.probs.shape == (6, 5, 3)
    assert res.attention["encoder.layers.0.self_attn"].samples.shape == (6, 5, 2, 4, 4)
    assert res.mutual_information.mean() > 1e-4
    torch.testing.assert_close(
        res.predictive_entropy, res.expected_entropy + res.mutual_information, atol=1e-6, rtol=0
    )


@pytest.mark.parametrize("guide", ["normal", "lowrank"])
def test_vectorised_weight_samples_match_sequential_runs(guide):
    """The S weight draws travel as a leading sample dim: sample s of the vectorised pass equals a
    separate single-sample pass with draw s (checked with deterministic attention)."""
    net = _clf(family=None).eval()
    bayesian_projections(net, init_scale=0.1, guide=guide)
    x = _tokens()
    values = draw_weights(net, "guide", 3)
    assert all(v.shape[0] == 3 for v in values.values())
    assert not torch.equal(*[v[:2] for v in values.values()][0])

    def run(vals, S):
        with torch.no_grad(), poutine.block(), attention_mode("mean"):
            with net._pyro_context, net.weights_from(vals):
                return net.forward_logits(x, None, S)

    vec = run(values, 3)  # (3, B, C)
    for s in range(3):
        torch.testing.assert_close(vec[s], run({k: v[s] for k, v in values.items()}, 1))


def test_vision_transformer_includes_cls_token():
    vit = VisionTransformer(
        4,
        image_size=8,
        patch_size=2,
        num_layers=1,
        attention=AttentionConfig("logistic_normal"),
        **SMALL,
    )
    res = predict(vit, torch.rand(3, 8, 8), num_samples=5)
    assert res.probs.shape == (5, 3, 4)
    (a,) = res.attention.values()
    assert a.samples.shape == (5, 3, 2, 17, 17)
    torch.testing.assert_close(a.samples.sum(-1), torch.ones(5, 3, 2, 17))


def test_restores_layer_flags_and_training_mode():
    net = _clf().train()
    layers = [m for m in net.modules() if isinstance(m, BayesianMultiheadAttention)]
    predict(net, _tokens(), num_samples=2)
    assert net.training and all(m.training for m in net.modules())
    assert all(m.record_weights is False and m.last_weights is None for m in layers)


def test_predict_hides_sites_from_outer_handlers():
    net = _clf()
    with poutine.trace() as tr:
        predict(net, _tokens(), num_samples=2)
    assert len(tr.trace.nodes) == 0


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(num_samples=0), ValueError, "num_samples must be a positive int; got 0"),
        (dict(num_samples=True), ValueError, "num_samples"),
        (dict(num_samples=2.0), ValueError, "num_samples"),
        (dict(batch_size=0), ValueError, "batch_size must be a positive int or None; got 0"),
        (dict(mode="map"), ValueError, "mode must be one of"),
    ],
)
def test_predict_bad_arguments(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        predict(_clf(), _tokens(), **kwargs)


def test_predict_bad_networks_and_inputs():
    with pytest.raises(TypeError, match="BayesianNetwork"):
        predict(object(), torch.zeros(2, 3))
    s2s = Seq2Seq(6, 7, **SMALL)
    with pytest.raises(ValueError, match="needs y .*generate"):  # sequence models: teacher forcing
        predict(s2s, torch.randint(3, 6, (2, 4)))
    net = _clf()
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        predict(net, [[1, 2]])
    with pytest.raises(TypeError, match="integer token ids"):
        predict(net, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"2-D \(B, T\)"):
        predict(net, torch.ones(3, dtype=torch.long))
    with pytest.raises(ValueError, match="at least one input"):
        predict(net, torch.ones(0, 3, dtype=torch.long))


def test_result_and_samples_bad_inputs():
    with pytest.raises(ValueError, match=r"probs must be \(S, B, C\) or \(S, B, T, V\)"):
        PredictionResult(torch.rand(4, 3))
    with pytest.raises(ValueError, match="mask must have shape"):
        PredictionResult(
            torch.rand(2, 3, 4, 5).softmax(-1), mask=torch.ones(3, 5, dtype=torch.bool)
        )
    with pytest.raises(TypeError, match="probs must be a torch.Tensor"):
        PredictionResult([[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"samples must be 5-D \(S, B, H, Tq, Tk\)"):
        AttentionSamples(torch.rand(2, 3, 4, 4))
    with pytest.raises(TypeError, match="floating point"):
        AttentionSamples(torch.ones(1, 1, 1, 2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="allowed must be a 4-D bool"):
        AttentionSamples(torch.rand(1, 1, 1, 2, 2), allowed=torch.ones(2, 2))
    a = AttentionSamples(torch.rand(3, 1, 1, 2, 2))
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match=r"prob must be in \(0, 1\)"):
            a.interval(bad)
    with pytest.raises(TypeError, match="prob"):
        a.interval("0.9")
    for bad in (-0.1, 1.1):
        with pytest.raises(ValueError, match=r"threshold must be in \[0, 1\]"):
            a.keys_excluding(bad)
    with pytest.raises(ValueError, match="prob"):
        a.keys_excluding(0.2, prob=1.0)
