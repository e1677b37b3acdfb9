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
from bayesattn.nn.attention import BayesianMultiheadAttention
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.modes import MODES, attention_mode, current_mode
from bayesattn.nn.networks import Seq2Seq, TransformerClassifier
from bayesattn.training import TrainConfig, Trainer, load_checkpoint
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
    assert P.WeibullWeights is F.WeibullWeights


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
        family="logistic_normal",
        family_kwargs={"model_scale": 0.8, "model_location": "attention"},
    )
    net2 = _clf(new_cfg)
    state = load_checkpoint(tmp_path / "ckpt.pt")  # torch.load(weights_only=True)
    net2.load_state_dict(state["network"])
    assert state["config"] == TrainConfig(**state["config"]).to_dict()
    with torch.no_grad():
        torch.testing.assert_close(net2.eval()(x), net.eval()(x))
    fam = net2.encoder.layers[0].self_attn.family
    assert (fam.model_scale, fam.model_location) == (0.8, "attention")


def test_library_code_uses_no_deprecated_name():
    """Train, predict and decode with every DeprecationWarning an error: internal code is on the
    new names (the whole suite also runs with ``-W error::DeprecationWarning:bayesattn``)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        net = _clf(AttentionConfig.recommended())
        bayesattn.training.fit(
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


# ---- posterior= (a variational family) → family= ---------------------------------------------


def test_attention_posterior_keyword_and_attribute_are_family():
    with pytest.warns(DeprecationWarning, match="'posterior=' .* use 'family='"):
        m = BayesianMultiheadAttention(8, 2, batch_first=True, posterior="dirichlet")
    assert isinstance(m.family, F.DirichletWeights) and m.is_bayesian
    with pytest.warns(DeprecationWarning, match="'BayesianMultiheadAttention.posterior'"):
        assert m.posterior is m.family
    with pytest.warns(DeprecationWarning, match="'family'"):
        m.posterior = None  # assigning the old attribute sets the family (no stray submodule)
    assert m.family is None and "posterior" not in m._modules and not m.is_bayesian
    with pytest.raises(TypeError, match="both"):
        BayesianMultiheadAttention(8, 2, posterior="dirichlet", family="dirichlet")


def test_block_posterior_keywords_are_family():
    from bayesattn.nn.blocks import DecoderLayer, EncoderLayer

    with pytest.warns(DeprecationWarning, match="'family='"):
        enc = EncoderLayer(8, 2, 16, posterior="weibull")
    assert isinstance(enc.self_attn.family, F.WeibullWeights)
    with pytest.warns(DeprecationWarning) as rec:
        dec = DecoderLayer(8, 2, 16, self_posterior="dirichlet", cross_posterior="concrete")
    assert {str(w.message).split("'")[3] for w in rec} == {"self_family=", "cross_family="}
    assert isinstance(dec.self_attn.family, F.DirichletWeights)
    assert isinstance(dec.multihead_attn.family, F.ConcreteWeights)


def test_attention_config_posterior_fields_are_family():
    new = AttentionConfig(family="logistic_normal", family_kwargs={"input_dependent": True})
    with pytest.warns(DeprecationWarning) as rec:
        old = AttentionConfig(posterior="logistic_normal", posterior_kwargs={"input_dependent": True})
    assert sorted(str(w.message).split("'")[3] for w in rec) == ["family=", "family_kwargs="]
    assert old == new
    with pytest.warns(DeprecationWarning, match="'AttentionConfig.posterior'"):
        assert old.posterior == "logistic_normal"
    with pytest.warns(DeprecationWarning, match="'AttentionConfig.posterior_kwargs'"):
        assert old.posterior_kwargs == {"input_dependent": True}
    with pytest.warns(DeprecationWarning):
        assert AttentionConfig.recommended(posterior="dirichlet", posterior_kwargs={}).family == (
            "dirichlet"
        )


def test_saved_attention_config_with_posterior_fields_loads():
    """A config saved as a dict of fields (hparams, JSON) before the rename builds the same net."""
    saved = {"posterior": "dirichlet", "prior": "alibi", "layers": [0], "which": ["self"],
             "posterior_kwargs": {"init_concentration": 2.0}, "prior_kwargs": {}}  # fmt: skip
    with pytest.warns(DeprecationWarning):
        old = AttentionConfig(**saved)
    new = AttentionConfig(**{("family" if k == "posterior" else "family_kwargs"
                              if k == "posterior_kwargs" else k): v for k, v in saved.items()})  # fmt: skip
    assert old == new
    torch.manual_seed(0)
    a = _clf(old)
    torch.manual_seed(0)
    b = _clf(new)
    x = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(a.eval()(x), b.eval()(x))


def test_convert_posterior_keyword_is_family():
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 1, enable_nested_tensor=False
    )
    with pytest.warns(DeprecationWarning, match="'family='"):
        bayesattn.convert(model, posterior="dirichlet")
    layers = bayesattn.interop.bayesian_attention_modules(model)
    assert list(layers) == ["layers.0.self_attn"]
    assert isinstance(layers["layers.0.self_attn"].family, F.DirichletWeights)


def test_posthoc_posterior_parameters_is_family_parameters():
    from bayesattn.interop import posthoc

    model = bayesattn.convert(torch.nn.MultiheadAttention(8, 2), family="dirichlet")
    holder = torch.nn.Sequential(model)
    with pytest.warns(DeprecationWarning, match="family_parameters"):
        old = posthoc.posterior_parameters
    assert old is posthoc.family_parameters
    assert old(holder) == list(model.family.parameters()) != []


def _old_keys(sd):
    """A state_dict as saved before 0.3: the attention families under ``posterior.*``."""
    return {k.replace(".family.", ".posterior."): v for k, v in sd.items()}


def test_state_dict_with_old_family_keys_loads():
    torch.manual_seed(0)
    a = _s2s("dirichlet")
    with torch.no_grad():
        for p in a.parameters():
            p.add_(0.1 * torch.randn_like(p))
    old = _old_keys(a.state_dict())
    assert any(".posterior.log_concentration" in k for k in old)
    assert not any(".family." in k for k in old)
    b = _s2s("dirichlet")
    b.load_state_dict(old, strict=True)  # no missing or unexpected keys
    for k, v in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[k], v)
    layer = BayesianMultiheadAttention(8, 2, family="dirichlet")  # a root layer: bare keys
    sd = {("posterior." + k[len("family."):] if k.startswith("family.") else k): v
          for k, v in layer.state_dict().items()}  # fmt: skip
    assert "posterior.log_concentration" in sd
    BayesianMultiheadAttention(8, 2, family="dirichlet").load_state_dict(sd, strict=True)


@pytest.mark.parametrize("method", ["svi", "hybrid"])
def test_checkpoint_with_old_names_resumes(method, tmp_path):
    """A checkpoint written by save_checkpoint with the pre-0.3 names ("mode" entry and config
    field, ``posterior.*`` network/optimiser keys) resumes exactly like the new one."""
    from bayesattn.training import save_checkpoint

    x, y = _tokens(8), torch.randint(0, 3, (8,))
    kw = dict(method=method, epochs=2, batch_size=4, progress=False, seed=3)
    pyro.clear_param_store()
    torch.manual_seed(0)
    ref = Trainer(_clf(), **kw)
    ref.fit((x, y))  # 2 epochs straight through
    pyro.clear_param_store()
    torch.manual_seed(0)
    first = Trainer(_clf(), **kw, max_steps=2)  # interrupted after the first epoch
    first.fit((x, y))
    state = first.state_dict()
    state["mode"] = state.pop("method")
    state["config"] = {("mode" if k == "method" else k): v for k, v in state["config"].items()}
    state["network"] = _old_keys(state["network"])
    if method == "svi":
        state["optimizer"] = {k.replace(".family$$$", ".posterior$$$"): v
                              for k, v in state["optimizer"].items()}  # fmt: skip
        assert any(".posterior$$$" in k for k in state["optimizer"])
    save_checkpoint(tmp_path / "old.pt", state)
    loaded = load_checkpoint(tmp_path / "old.pt")  # weights_only=True
    assert loaded["method"] == method and loaded["config"]["method"] == method
    assert "mode" not in loaded and "mode" not in loaded["config"]
    pyro.clear_param_store()
    torch.manual_seed(0)
    net = _clf()
    h = bayesattn.training.fit(
        net, (x, y), checkpoint_path=tmp_path / "old.pt", resume=True, max_steps=None
    )
    assert h.step == ref.history.step
    for k, v in ref.network.state_dict().items():
        torch.testing.assert_close(net.state_dict()[k], v)


# ---- TrainConfig.mode (a training method) → method: removed in 0.4 ----------------------------


def test_train_config_saved_with_mode_loads():
    """0.4 removed ``TrainConfig(mode=...)``, ``config.mode``, ``fit``/``Trainer``/
    ``BayesianLightningModule``'s ``mode=`` and ``MODES``; a config saved before 0.3 (key
    ``"mode"``) still loads, silently."""
    with pytest.raises(TypeError, match="mode"):
        TrainConfig(mode="svi")  # type: ignore[call-arg]
    assert not hasattr(TrainConfig(), "mode")
    with pytest.raises(ValueError, match="TrainConfig.method"):
        TrainConfig(method="mcmc")
    saved = {**TrainConfig(method="svi").to_dict()}
    saved["mode"] = saved.pop("method")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # a saved config loads silently
        assert TrainConfig.from_dict(saved) == TrainConfig(method="svi")


def test_fit_and_trainer_mode_keyword_is_gone():
    x, y = _tokens(8), torch.randint(0, 3, (8,))
    with pytest.raises(TypeError, match="mode"):
        Trainer(_clf(None), mode="svi", progress=False)
    with pytest.raises(TypeError, match="mode"):
        bayesattn.training.fit(_clf(None), (x, y), mode="svi", epochs=1, progress=False)


@pytest.mark.parametrize("module", ["bayesattn.training", "bayesattn.training.config"])
def test_train_modes_constant_is_gone(module):
    m = importlib.import_module(module)
    assert m.METHODS == ("svi", "hybrid")
    assert not hasattr(m, "MODES")


def test_lightning_old_checkpoint_metadata():
    pytest.importorskip("lightning")
    from bayesattn.training.lightning import BayesianLightningModule

    with pytest.raises(TypeError, match="mode"):
        BayesianLightningModule(_clf(), mode="svi")
    module = BayesianLightningModule(_clf(), method="svi")
    fresh = BayesianLightningModule(_clf(), method="svi")
    ckpt = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(ckpt)
    cfg = ckpt["bayesattn"]["config"]
    cfg["mode"] = cfg.pop("method")  # a Lightning checkpoint written before 0.3
    ckpt["state_dict"] = _old_keys(ckpt["state_dict"])
    assert any(".posterior." in k for k in ckpt["state_dict"])
    fresh.on_load_checkpoint(ckpt)
    fresh.load_state_dict(ckpt["state_dict"], strict=True)
    for k, v in module.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v)
    cfg["mode"] = "hybrid"
    with pytest.raises(ValueError, match="method 'hybrid'"):
        fresh.on_load_checkpoint(ckpt)


def test_convert_hf_posterior_keyword_and_old_state_dict_keys():
    transformers = pytest.importorskip("transformers")
    from bayesattn.interop.hf import convert_hf, hf_attention_modules, unconvert_hf

    def bert():
        torch.manual_seed(0)
        cfg = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=16, vocab_size=20,
                                      attn_implementation="eager")  # fmt: skip
        return transformers.BertModel(cfg).eval()

    with pytest.warns(DeprecationWarning, match="'family='"):
        a = convert_hf(bert(), posterior="dirichlet")
    (mod,) = hf_attention_modules(a).values()
    assert isinstance(mod.bayesattn_family, F.DirichletWeights)
    with torch.no_grad():
        mod.bayesattn_family.log_concentration.add_(0.5)
    old = {k.replace("bayesattn_family.", "bayesattn_posterior."): v
           for k, v in a.state_dict().items()}  # fmt: skip
    assert any("bayesattn_posterior." in k for k in old)
    b = convert_hf(bert(), family="dirichlet")
    b.load_state_dict(old, strict=True)
    (mb,) = hf_attention_modules(b).values()
    torch.testing.assert_close(mb.bayesattn_family.log_concentration,
                               mod.bayesattn_family.log_concentration)  # fmt: skip
    unconvert_hf(b)
    assert not hasattr(mb, "_bayesattn_old_keys_hook")
