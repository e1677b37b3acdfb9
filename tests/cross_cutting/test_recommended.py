"""The recommended configuration (plain softmax, read by the density read) and the last-layer
Bayesian attention (``AttentionConfig.last_layer()``): attention-centred priors, the shared trunk
/ CLS-only last layer, the plain ELBO learning, and the one posterior-predictive path with its
baselines."""

import pyro
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO

from bayesattn.families import DirichletWeights, LogisticNormalWeights, WeibullWeights
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.modes import attention_mode
from bayesattn.nn.networks import CausalLM, Seq2Seq, TransformerClassifier, VisionTransformer
from bayesattn.nn.weights import bayesian_projections
from bayesattn.posthoc import DensityRead
from bayesattn.training import fit
from bayesattn.uncertainty import predict, predict_ensemble, predict_mc_dropout

SMALL = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0)


def _vit(attention=None, num_layers=2, **kw):
    kw = {**SMALL, **kw}
    return VisionTransformer(
        4, image_size=4, patch_size=2, num_layers=num_layers, attention=attention, **kw
    )


# ---- what is recommended -------------------------------------------------------------------------


def test_recommended_is_the_plain_softmax_configuration_and_last_layer_the_old_preset():
    assert AttentionConfig.recommended() == AttentionConfig()
    assert AttentionConfig.recommended(layers="last") == AttentionConfig(layers="last")
    assert _vit(AttentionConfig.recommended()).bayesian_layers == []
    cfg = AttentionConfig.last_layer()
    assert (cfg.family, cfg.layers) == ("logistic_normal", "last")
    assert cfg.family_kwargs == {"input_dependent": True, "model_location": "attention"}
    assert _vit(cfg).bayesian_layers == ["encoder.layers.1.self_attn"]


def test_the_documented_call_reads_a_network_built_from_recommended():
    """recommended()'s docstring: one DensityRead call after training gives the predictive and
    the OOD score (an untrained network here: the call, shapes and normalisation)."""
    torch.manual_seed(0)
    net = _vit(AttentionConfig.recommended()).eval()
    x, y = torch.rand(48, 4, 4), torch.arange(48) % 4
    read = DensityRead(net).fit(x[:32], y[:32], val=(x[32:], y[32:]))
    res, score = read.predict_and_score(torch.rand(6, 4, 4))
    assert res.probs.shape == (1, 6, 4) and score.shape == (6,)
    torch.testing.assert_close(res.probs.sum(-1), torch.ones(1, 6))
    assert torch.isfinite(score).all()


# ---- priors centred on the attention ----------------------------------------------------------


def test_logistic_normal_attention_centred_kl_is_closed_form_spread_only():
    fam = LogisticNormalWeights(2, init_scale=0.3, model_scale=1.2, model_location="attention")
    logits = torch.randn(3, 2, 4, 5)
    q = fam.guide(logits)
    p = fam.model(None, logits)
    kl = fam.kl(q, p)  # (3, 2, 4)
    r = (0.3 / 1.2) ** 2
    expected = 5 * 0.5 * (r - 1 - torch.log(torch.tensor(r)))  # 5 keys, same location
    torch.testing.assert_close(kl, expected.expand_as(kl), rtol=1e-4, atol=1e-5)
    # and it does not depend on where the attention looks
    kl2 = fam.kl(fam.guide(10 * logits), fam.model(None, 10 * logits))
    torch.testing.assert_close(kl2, kl, rtol=1e-4, atol=1e-5)
    # the default (key relevance) prior charges a sharp attention row for its location
    base = LogisticNormalWeights(2, init_scale=0.3, model_scale=1.2)
    assert (base.kl(base.guide(10 * logits), base.model(None, 10 * logits)) > kl2 + 1).all()


@pytest.mark.parametrize("family", [DirichletWeights, WeibullWeights])
def test_attention_centred_prior_means_equal_the_exact_posterior(family):
    fam = family(2, model_location="attention")
    logits = torch.randn(2, 2, 3, 6)
    mask = torch.zeros(2, 1, 3, 6)
    mask[..., -1] = float("-inf")  # a masked key stays masked under the prior too
    p = fam.model(mask, logits)
    exact = torch.softmax(logits + mask, -1)
    mean = torch.where(p.allowed, p.mean, torch.zeros_like(p.mean))
    mean = mean / mean.sum(-1, keepdim=True)  # Gamma: unnormalised weights with mean m
    torch.testing.assert_close(mean, exact, atol=1e-5, rtol=1e-4)


def test_dirichlet_attention_centred_kl_is_zero_at_the_prior_concentration():
    fam = DirichletWeights(
        2, init_concentration=3.0, model_concentration=3.0, model_location="attention"
    )
    logits = torch.randn(2, 2, 3, 6)
    kl = fam.kl(fam.guide(logits), fam.model(None, logits))
    torch.testing.assert_close(kl, torch.zeros_like(kl), atol=2e-4, rtol=0)


def test_prior_location_is_validated():
    with pytest.raises(ValueError, match="model_location"):
        DirichletWeights(2, model_location="keys")
    cfg = AttentionConfig.last_layer(layers="all")
    assert cfg.layers == "all" and cfg.family == "logistic_normal"
    assert cfg.family_kwargs["model_location"] == "attention"


# ---- shared trunk, CLS-only last layer ---------------------------------------------------------


def test_cls_only_last_layer_equals_the_full_computation():
    net = _vit(AttentionConfig.last_layer()).eval()
    x = torch.rand(5, 4, 4)
    fast = net(x)  # last layer computes the CLS row only
    last = net.encoder.layers[-1].self_attn
    last.record_weights = True  # recording a map forces every row
    full = net(x)
    last.record_weights = False
    torch.testing.assert_close(fast, full, atol=1e-6, rtol=1e-5)


def test_samples_share_the_trunk_and_equal_the_unshared_computation(monkeypatch):
    net = _vit(AttentionConfig.last_layer()).eval()
    x = torch.rand(3, 4, 4)
    with attention_mode("mean"):
        assert net.first_stochastic_layer() == 2
    with attention_mode("guide"):
        assert net.first_stochastic_layer() == 1
        torch.manual_seed(3)
        shared = net.forward_logits(x, None, 6)  # (6, 3, C)
        monkeypatch.setattr(type(net), "first_stochastic_layer", lambda self: 0)
        torch.manual_seed(3)
        unshared = net.forward_logits(x, None, 6)
    assert shared.shape == (6, 3, 4)
    assert shared.std(0).max() > 1e-4  # the samples do differ
    torch.testing.assert_close(shared, unshared, atol=1e-5, rtol=1e-4)
    net.train()
    net.encoder.layers[0].dropout.p = 0.5
    assert net.first_stochastic_layer() == 0  # active dropout: nothing can be shared


def test_last_layer_one_pass_elbo_matches_pyro_trace_elbo():
    """Only the CLS rows of the last layer are latent: our analytic one-pass ELBO and Pyro's
    Trace_ELBO on model/guide (a second implementation) agree in expectation."""
    net = _vit(AttentionConfig.last_layer())
    x, y = torch.rand(4, 4, 4), torch.randint(0, 4, (4,))
    torch.manual_seed(1)
    reps, P = 10, 100
    with torch.no_grad():
        ours = torch.stack([net.elbo_loss(x, y, num_particles=P)[0] for _ in range(reps)])
        elbo = Trace_ELBO(num_particles=P, vectorize_particles=True, max_plate_nesting=1)
        pyros = torch.tensor([elbo.loss(net.model, net.guide, x, y) for _ in range(reps)])
    se = (ours.var() / reps + pyros.var() / reps).sqrt()
    assert abs(ours.mean() - pyros.mean()) < 4 * se + 1e-3, (ours.mean(), pyros.mean(), se)
    tr = poutine.trace(net.guide).get_trace(x, y)
    (site,) = [n for n, s in tr.nodes.items() if s["type"] == "sample" and n != "data"]
    assert site == "encoder.layers.1.self_attn.latent"
    assert tr.nodes[site]["value"].shape == (4, 2, 1, 5)  # (B, H, CLS row, keys)


@pytest.mark.slow
def test_the_plain_elbo_learns_well_above_chance():
    """KL weight 1 (no tempering): the last-layer recipe learns a token task."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 10, (600, 10), generator=g)
    y = (x == 3).any(1).long()
    net = TransformerClassifier(
        2,
        vocab_size=10,
        d_model=16,
        nhead=2,
        num_layers=2,
        dim_feedforward=32,
        dropout=0.0,
        pooling="cls",
        attention=AttentionConfig.last_layer(),
    )
    fit(
        net,
        (x[:500], y[:500]),
        method="hybrid",
        epochs=8,
        batch_size=50,
        lr=3e-3,
        kl_weight=1.0,
        kl_anneal_steps=20,
        seed=0,
        progress=False,
    )
    res = predict(net, x[500:], num_samples=8)
    acc = (res.predictions == y[500:]).float().mean()
    assert acc > 0.85, acc  # chance is about 0.5 (the classes are near balanced)
    assert res.mutual_information.mean() > 0  # the posterior is not a point mass


def test_guide_without_latent_attention_runs_no_network_pass():
    net = _vit(None)
    x, y = torch.rand(4, 4, 4), torch.randint(0, 4, (4,))
    calls = []
    net.encoder.register_forward_pre_hook(lambda *a: calls.append(1))
    tr = poutine.trace(net.guide).get_trace(x, y)
    assert not [n for n, s in tr.nodes.items() if s["type"] == "sample" and n != "data"]
    assert not calls
    svi = SVI(net.model, net.guide, pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    assert torch.isfinite(torch.tensor(svi.step(x, y)))


# ---- one posterior-predictive path -------------------------------------------------------------


def _check_result(res, shape):
    assert res.probs.shape == shape
    torch.testing.assert_close(res.probs.sum(-1), torch.ones(shape[:-1]))
    assert (res.mutual_information >= 0).all()
    assert res.predictive_entropy.shape == shape[1:-1]


def test_predict_every_network_type():
    cfg = AttentionConfig("logistic_normal")
    clf = TransformerClassifier(3, vocab_size=7, attention=cfg, **SMALL)
    x = torch.randint(1, 7, (4, 5))
    _check_result(predict(clf, x, 6), (6, 4, 3))
    vit = _vit(AttentionConfig.last_layer())
    _check_result(predict(vit, torch.rand(4, 4, 4), 6, keep_attention=False), (6, 4, 4))
    s2s = Seq2Seq(9, 9, num_encoder_layers=1, num_decoder_layers=1, attention=cfg, **SMALL)
    src, tgt = torch.randint(3, 9, (4, 5)), torch.randint(3, 9, (4, 6))
    tgt[:, 0] = s2s.bos_id
    tgt[0, -2:] = s2s.pad_id
    r = predict(s2s, src, 5, y=tgt)
    _check_result(r, (5, 4, 5, 9))
    assert r.mask.shape == (4, 5) and not r.mask[0, -2:].any() and r.mask[1].all()
    lm = CausalLM(vocab_size=9, attention=cfg, num_layers=1, **SMALL)
    r = predict(lm, torch.randint(3, 9, (4, 7)), 5)
    _check_result(r, (5, 4, 6, 9))
    assert "mean_mutual_information" in r.summary()
    proj = _vit(None)
    bayesian_projections(proj, targets=("*self_attn.in_proj_weight",))
    r = predict(proj, torch.rand(4, 4, 4), 5)
    _check_result(r, (5, 4, 4))
    assert r.mutual_information.mean() > 0
    # posterior-mean mode is the deterministic forward pass
    with torch.no_grad():
        ref = torch.softmax(lm.eval()(torch.randint(3, 9, (2, 7))), -1)
    assert ref.shape == (2, 6, 9)


def test_predict_mean_mode_equals_forward_and_target_rules():
    net = _vit(AttentionConfig.last_layer()).eval()
    x = torch.rand(3, 4, 4)
    r = predict(net, x, 4, mode="mean")
    with torch.no_grad():
        torch.testing.assert_close(r.probs[0], torch.softmax(net(x), -1))
    assert float(r.mutual_information.abs().max()) == 0.0
    s2s = Seq2Seq(9, 9, num_encoder_layers=1, num_decoder_layers=1, **SMALL)
    with pytest.raises(ValueError, match="Seq2Seq needs y"):
        predict(s2s, torch.randint(3, 9, (2, 4)), 2)
    with pytest.raises(ValueError, match="only used by Seq2Seq"):
        predict(net, x, 2, y=torch.zeros(3, 4, dtype=torch.long))
    with pytest.raises(TypeError, match="BayesianNetwork"):
        predict(lambda t: t, x, 2)
    with pytest.raises(ValueError, match="models we did not write"):
        predict(net, x, 2, vectorised=True)


def test_mc_dropout_baseline():
    net = _vit(None, dropout=0.3).eval()
    x = torch.rand(6, 4, 4)
    r = predict_mc_dropout(net, x, 8)
    assert r.kind == "mc_dropout" and r.probs.shape == (8, 6, 4)
    assert r.mutual_information.mean() > 0
    assert all(not m.training for m in net.modules())  # flags restored
    still = predict_mc_dropout(_vit(None, dropout=0.0), x, 8)
    assert float(still.mutual_information.max()) == 0.0


def test_ensemble_baseline_stacks_members():
    members = [_vit(None).eval() for _ in range(3)]
    x = torch.rand(5, 4, 4)
    r = predict_ensemble(members, x)
    assert r.probs.shape == (3, 5, 4)
    with torch.no_grad():
        for i, m in enumerate(members):
            torch.testing.assert_close(r.probs[i], torch.softmax(m(x), -1))
    assert r.mutual_information.mean() > 0
    with pytest.raises(TypeError, match="sequence of BayesianNetworks"):
        predict_ensemble(members[0], x)
    with pytest.raises(ValueError, match="at least one"):
        predict_ensemble([], x)
    with pytest.raises(TypeError, match="one network type"):
        predict_ensemble([members[0], TransformerClassifier(4, vocab_size=5, **SMALL)], x)


def test_predictive_to_arviz_reads_any_predictor_and_loo_runs():
    import warnings

    import arviz as az

    from bayesattn.diagnostics import arviz_major_version, predictive_to_arviz

    members = [_vit(None, dropout=0.2).eval() for _ in range(2)]
    x, y = torch.rand(5, 4, 4), torch.randint(0, 4, (5,))
    v1 = arviz_major_version() >= 1
    for res in (
        predict_mc_dropout(members[0], x, 30 if v1 else 6),
        predict_ensemble(members, x),
        predict(_vit(AttentionConfig.last_layer()), x, 6),
    ):
        ll = res.log_likelihood(y)  # (S, B), checked against a plain gather
        manual = torch.stack([res.probs[s, torch.arange(5), y].log() for s in range(len(ll))])
        torch.testing.assert_close(ll, manual)
        idata = predictive_to_arviz(res, y=y)
        got = idata.log_likelihood["obs"].values  # (chain, draw, example)
        assert got.shape == (1, res.num_samples, 5)
        torch.testing.assert_close(torch.from_numpy(got[0]), ll.double(), check_dtype=False)
        if v1 and res.num_samples < 25:
            continue  # arviz_stats' PSIS needs >= 5 tail draws: 25 (0.x smooths any S >= 2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loo = az.loo(idata)
            assert float(loo.elpd if v1 else loo.elpd_loo) < 0
    with pytest.raises(ValueError, match="y must have shape"):
        res.log_likelihood(y[:3])
    with pytest.raises(TypeError, match="PredictionResult"):
        predictive_to_arviz(res.probs, y=y)


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_layer_forward_rows_equals_forward(norm_first):
    from bayesattn.nn.blocks import EncoderLayer

    layer = EncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    x = torch.randn(3, 6, 8)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[0, -2:] = True
    full = layer(x, src_key_padding_mask=pad)
    torch.testing.assert_close(layer.forward_rows(x, 2, pad), full[:, :2], atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="rows must be an int in"):
        layer.forward_rows(x, 7)
    with pytest.raises(ValueError, match="batch_first=True"):
        EncoderLayer(8, 2, 16, norm_first=norm_first).forward_rows(x, 1)


def test_predict_a_converted_torch_model_through_the_same_path():
    import bayesattn

    torch.manual_seed(0)

    class Clf(torch.nn.Module):
        def __init__(self):
            super().__init__()
            layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
            self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.enc(x).mean(-2))

    plain = Clf().eval()
    x = torch.randn(5, 6, 8)
    with torch.no_grad():
        ref_logits = plain(x)
    ref = torch.softmax(ref_logits, -1)
    model = bayesattn.convert(plain, family="logistic_normal")  # in place
    mean = predict(model, x, 4, mode="mean")
    torch.testing.assert_close(mean.probs[0], ref, atol=1e-6, rtol=1e-5)
    assert float(mean.mutual_information.max()) == 0.0
    torch.manual_seed(1)
    rep = predict(model, x, 300, batch_size=64)  # batched repetition, several passes
    vec = predict(model, x, 300, vectorised=True)
    assert rep.probs.shape == vec.probs.shape == (300, 5, 3)
    assert rep.mutual_information.mean() > 0
    torch.testing.assert_close(rep.mean_probs, vec.mean_probs, atol=0.03, rtol=0)
    hot = predict(model, x, 4, temperature=0.5, mode="mean")
    torch.testing.assert_close(
        hot.probs[0], torch.softmax(2 * ref_logits, -1), atol=1e-5, rtol=1e-4
    )
    with pytest.raises(ValueError, match="temperature"):
        predict(model, x, 2, temperature=0.0)


def test_uncertainty_decomposition_closed_form_and_errors():
    from bayesattn.functional import uncertainty_decomposition

    # two samples that disagree completely: H[p̄] = log 2, E[H] = 0, MI = log 2
    p = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # (S=2, B=1, C=2)
    total, expected, mi = uncertainty_decomposition(p)
    torch.testing.assert_close(total, torch.tensor([0.6931472]))
    torch.testing.assert_close(expected, torch.tensor([0.0]))
    torch.testing.assert_close(mi, torch.tensor([0.6931472]))
    same = uncertainty_decomposition(torch.full((3, 4, 5), 0.2))
    assert float(same[2].abs().max()) == 0.0  # identical samples: no epistemic part
    with pytest.raises(TypeError, match="probs must be a torch.Tensor"):
        uncertainty_decomposition([[0.5, 0.5]])
    with pytest.raises(ValueError, match=r"\(S, \.\.\., C\)"):
        uncertainty_decomposition(torch.ones(3))
