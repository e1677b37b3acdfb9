"""Renamed names (issue 12, "one meaning per word"; docs/glossary.md): every old spelling still
works for one release, gives the same result as the new one and warns naming the new spelling."""

import importlib
import sys
import warnings

import pyro
import pytest
import torch

import bayesattn
from bayesattn import families as F
from bayesattn.inference import TrainConfig, Trainer, load_checkpoint
from bayesattn.nn.attention import BayesianMultiheadAttention
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.modes import MODES, attention_mode, current_mode
from bayesattn.nn.networks import Seq2Seq, TransformerClassifier
from bayesattn.uncertainty import PredictionResult, predict, predict_ensemble

SMALL = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0)


def _clf(attention="dirichlet"):
    return TransformerClassifier(3, vocab_size=7, num_layers=1, attention=attention, **SMALL)


def _s2s(attention):
    return Seq2Seq(7, 7, num_encoder_layers=1, num_decoder_layers=1, attention=attention, **SMALL)


def _tokens(B=5, T=4):
    return torch.randint(0, 7, (B, T))


# ---- modules and names --------------------------------------------------------------------


def test_posteriors_module_is_a_warning_alias_of_families():
    _forget_posteriors_module()
    with pytest.warns(DeprecationWarning, match="bayesattn.families"):
        P = importlib.import_module("bayesattn.posteriors")
    assert P.DirichletWeights is F.DirichletWeights
    assert P.MaskedDirichlet is F.MaskedDirichlet and P.kl_weibull_gamma is F.kl_weibull_gamma


@pytest.mark.parametrize(
    "where, old, new",
    [
        ("bayesattn", "AttentionPosterior", F.AttentionFamily),
        ("bayesattn.families", "AttentionPosterior", F.AttentionFamily),
        ("bayesattn.families", "get_posterior", F.get_family),
        ("bayesattn.families", "PRIOR_LOCATIONS", F.MODEL_LOCATIONS),
        ("bayesattn.posteriors", "AttentionPosterior", F.AttentionFamily),
        ("bayesattn.posteriors", "get_posterior", F.get_family),
    ],
)
def test_old_names_are_the_new_objects_and_warn(where, old, new):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the module alias itself
        mod = importlib.import_module(where)
    with pytest.warns(DeprecationWarning, match=f"{old}.*deprecated.*use"):
        assert getattr(mod, old) is new
    with pytest.raises(AttributeError):
        getattr(mod, old + "_nonexistent")


# ---- family keyword arguments, attributes and methods --------------------------------------


@pytest.mark.parametrize(
    "cls, old, new, value",
    [
        (F.DirichletWeights, "prior_concentration", "model_concentration", 2.5),
        (F.DirichletWeights, "prior_location", "model_location", "attention"),
        (F.LogisticNormalWeights, "prior_scale", "model_scale", 0.7),
        (F.LogisticNormalWeights, "prior_location", "model_location", "attention"),
        (F.WeibullWeights, "prior_concentration", "model_concentration", 3.0),
        (F.WeibullWeights, "prior_location", "model_location", "attention"),
        (F.ConcreteWeights, "prior_temperature", "model_temperature", 0.8),
    ],
)
def test_old_family_keywords_and_attributes(cls, old, new, value):
    with pytest.warns(DeprecationWarning, match=f"'{old}='.*'{new}='"):
        fam = cls(2, **{old: value})
    assert getattr(fam, new) == value
    with pytest.warns(DeprecationWarning, match=f"{old}.*'{new}'"):
        assert getattr(fam, old) == value
    logits = torch.randn(1, 2, 3, 4)
    ref, p = cls(2, **{new: value}), fam.model(None, logits)
    z = ref.model(None, logits).rsample()
    torch.testing.assert_close(p.log_prob(z), ref.model(None, logits).log_prob(z))
    with pytest.raises(TypeError, match="both"):
        cls(2, **{old: value, new: value})


def test_old_family_methods_give_the_new_distributions():
    torch.manual_seed(0)
    fam = F.LogisticNormalWeights(2, model_location="attention")
    logits, lp = torch.randn(2, 2, 3, 5), torch.zeros(1, 1, 3, 5)
    with pytest.warns(DeprecationWarning, match="'guide'"):
        q = fam.posterior(logits, lp)
    with pytest.warns(DeprecationWarning, match="'model'"):
        p = fam.prior(lp, logits)
    with pytest.warns(DeprecationWarning, match="'model_log_location'"):
        loc = fam.prior_log_location(lp, logits)
    torch.testing.assert_close(q.loc, fam.guide(logits, lp).loc)
    torch.testing.assert_close(p.loc, fam.model(lp, logits).loc)
    torch.testing.assert_close(loc[0], fam.model_log_location(lp, logits)[0])


def test_a_family_written_against_the_old_extension_points_still_works_in_a_layer():
    calls = []
    with pytest.warns(DeprecationWarning) as rec:

        class OldStyle(F.DirichletWeights):  # overrides the old names only, calls super()'s
            def posterior(self, logits, log_prior=None, query=None):
                calls.append("posterior")
                return super().posterior(logits, log_prior, query)

            def prior(self, log_prior, like, key=None):
                calls.append("prior")
                return super().prior(log_prior, like, key)

    assert sorted(str(w.message).split("'")[1] for w in rec) == ["OldStyle.posterior", "OldStyle.prior"]
    x = torch.randn(2, 4, 8)
    m = BayesianMultiheadAttention(8, 2, batch_first=True, posterior=OldStyle(2))
    for mode in ("guide", "model"):
        with attention_mode(mode):
            tr = pyro.poutine.trace(m).get_trace(x, x, x)
        assert tr.nodes["latent"]["value"].shape == (2, 2, 4, 4)
    assert calls == ["posterior", "prior"]  # the layer reached the user's overrides
    fam, logits = OldStyle(2), torch.randn(1, 2, 3, 4)
    torch.manual_seed(3)
    z = fam.posterior(logits).rsample()  # direct old-name call: the override, once
    torch.manual_seed(3)
    torch.testing.assert_close(z, F.DirichletWeights(2).guide(logits).rsample())
    assert calls[2:] == ["posterior"]


# ---- attention modes, prediction kinds ------------------------------------------------------


@pytest.mark.parametrize("old, new", [("posterior", "guide"), ("prior", "model")])
def test_old_attention_modes_map_to_the_new_ones(old, new):
    assert new in MODES and old not in MODES
    with pytest.warns(DeprecationWarning, match=f"mode='{old}'.*mode='{new}'"):
        with attention_mode(old):
            assert current_mode() == new
    net, x = _clf().eval(), _tokens()
    with pytest.warns(DeprecationWarning, match=f"mode='{new}'"):
        torch.manual_seed(1)
        r_old = predict(net, x, 3, mode=old)
    torch.manual_seed(1)
    r_new = predict(net, x, 3, mode=new)
    torch.testing.assert_close(r_old.probs, r_new.probs)
    assert r_old.kind == new
    with pytest.warns(DeprecationWarning, match=f"mode='{new}'"):
        r_ens = predict_ensemble([net], x, mode=old, num_samples=2)
    assert r_ens.kind == f"ensemble/{new}"
    s2s = _s2s("dirichlet").eval()
    with pytest.warns(DeprecationWarning, match=f"mode='{new}'"):
        torch.manual_seed(2)
        g_old = s2s.generate(_tokens(2, 3), max_len=3, num_samples=2, mode=old)
    torch.manual_seed(2)
    g_new = s2s.generate(_tokens(2, 3), max_len=3, num_samples=2, mode=new)
    assert torch.equal(g_old.tokens, g_new.tokens)


def test_bad_modes_still_name_the_choices():
    with pytest.raises(ValueError, match="mode must be one of"):
        with attention_mode("posterior_mean"):
            pass
    with pytest.raises(ValueError, match="mode must be one of"):
        predict(_clf(), _tokens(), 2, mode="sample")


def test_prediction_result_mode_is_kind():
    probs = torch.full((2, 3, 4), 0.25)
    with pytest.warns(DeprecationWarning, match="'kind='"):
        r = PredictionResult(probs=probs, mode="mc_dropout")
    assert r.kind == "mc_dropout"
    with pytest.warns(DeprecationWarning, match="'kind'"):
        assert r.mode == "mc_dropout"


# ---- saved configs and checkpoints ----------------------------------------------------------


def test_checkpoint_of_a_network_built_from_an_old_config_loads_into_the_new_spelling(tmp_path):
    old_cfg = dict(
        posterior="logistic_normal",
        posterior_kwargs={"prior_scale": 0.8, "prior_location": "attention"},
    )
    with pytest.warns(DeprecationWarning, match="model_"):
        net = _clf(AttentionConfig(**old_cfg))
    x, y = _tokens(8), torch.randint(0, 3, (8,))
    trainer = Trainer(net, TrainConfig(epochs=1, batch_size=4, progress=False))
    trainer.fit((x, y), checkpoint_path=tmp_path / "ckpt.pt")
    new_cfg = AttentionConfig(
        posterior="logistic_normal",
        posterior_kwargs={"model_scale": 0.8, "model_location": "attention"},
    )
    net2 = _clf(new_cfg)
    state = load_checkpoint(tmp_path / "ckpt.pt")  # torch.load(weights_only=True)
    net2.load_state_dict(state["network"])
    assert state["config"] == TrainConfig(**state["config"]).to_dict()
    with torch.no_grad():
        torch.testing.assert_close(net2.eval()(x), net.eval()(x))
    fam = net2.encoder.layers[0].self_attn.posterior
    assert (fam.model_scale, fam.model_location) == (0.8, "attention")


def test_library_code_uses_no_deprecated_name():
    """Train, predict and decode with every DeprecationWarning an error: internal code is on the
    new names (the whole suite also runs with ``-W error::DeprecationWarning:bayesattn``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        net = _clf(AttentionConfig.recommended())
        bayesattn.inference.fit(
            net, (_tokens(8), torch.randint(0, 3, (8,))), epochs=1, batch_size=4, progress=False
        )
        for mode in MODES:
            predict(net, _tokens(), 2, mode=mode)
        _s2s("weibull").generate(_tokens(2, 3), 2, num_samples=2)


def _forget_posteriors_module():
    sys.modules.pop("bayesattn.posteriors", None)
    bayesattn.__dict__.pop("posteriors", None)  # set by an earlier import of the submodule


def test_star_import_and_all_use_no_deprecated_name():
    _forget_posteriors_module()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        exec("from bayesattn import *", {})
    assert "AttentionPosterior" not in bayesattn.__all__ and "posteriors" not in bayesattn.__all__
    with pytest.warns(DeprecationWarning, match="bayesattn.families"):
        assert bayesattn.posteriors.DirichletWeights is F.DirichletWeights
