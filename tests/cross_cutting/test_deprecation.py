"""The 0.3 spellings (issue 12, "one meaning per word"; docs/glossary.md) are gone in 0.4 (issue 20):
each old spelling fails with the error a misspelt name gets (``TypeError`` for a keyword argument,
``AttributeError`` for an attribute or module name, ``ValueError`` naming the argument for an
option value), while files written with the old names (checkpoints, ``state_dict`` keys, saved
``TrainConfig``s) still load, silently."""

import contextlib
import importlib
import pkgutil
import warnings
from importlib.machinery import PathFinder

import pyro
import pytest
import torch

import bayesattn
from bayesattn import families as F
from bayesattn.nn.attention import BayesianMultiheadAttention
from bayesattn.nn.blocks import AttentionConfig, DecoderLayer, EncoderLayer
from bayesattn.nn.modes import MODES, attention_mode
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


@contextlib.contextmanager
def _no_warning():
    """A block in which any DeprecationWarning is an error (also outside the pytest config)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        yield


# ---- modules and names: AttributeError / ImportError ----------------------------------------


@pytest.mark.parametrize(
    "where, old, new",
    [
        ("bayesattn", "AttentionPosterior", "AttentionFamily"),
        ("bayesattn", "posteriors", "families"),
        ("bayesattn", "data_long", "data"),
        ("bayesattn.families", "AttentionPosterior", "AttentionFamily"),
        ("bayesattn.families", "get_posterior", "get_family"),
        ("bayesattn.families", "PRIOR_LOCATIONS", "MODEL_LOCATIONS"),
        ("bayesattn.posthoc._svi_core", "posterior_parameters", "family_parameters"),
        ("bayesattn.diagnostics", "prediction_to_arviz", "predictive_to_arviz"),
    ],
)
def test_old_names_are_gone(where, old, new):
    mod = importlib.import_module(where)
    assert hasattr(mod, new)
    with pytest.raises(AttributeError, match=old):
        getattr(mod, old)
    assert old not in getattr(mod, "__all__", ())


@pytest.mark.parametrize("module", ["posteriors", "data_long"])
def test_old_modules_are_gone(module):
    """The package has no such module (looked up on the package's own path: an editable install's
    finder of another checkout must not count)."""
    assert PathFinder.find_spec(f"bayesattn.{module}", list(bayesattn.__path__)) is None
    assert module not in {m.name for m in pkgutil.iter_modules(bayesattn.__path__)}
    assert PathFinder.find_spec("bayesattn.families", list(bayesattn.__path__)) is not None


def test_star_import_uses_no_old_name():
    ns: dict = {}
    exec("from bayesattn import *", ns)
    assert "AttentionPosterior" not in ns and "posteriors" not in ns and "data_long" not in ns
    assert ns["AttentionFamily"] is F.AttentionFamily


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
def test_old_family_keywords_and_attributes_are_gone(cls, old, new, value):
    with pytest.raises(TypeError, match=old):
        cls(2, **{old: value})
    fam = cls(2, **{new: value})
    assert getattr(fam, new) == value
    with pytest.raises(AttributeError, match=old):
        getattr(fam, old)
    name = {F.DirichletWeights: "dirichlet", F.LogisticNormalWeights: "logistic_normal",
            F.WeibullWeights: "weibull", F.ConcreteWeights: "concrete"}[cls]  # fmt: skip
    with pytest.raises(TypeError, match=old):
        F.get_family(name, 2, **{old: value})
    with pytest.raises(TypeError, match=old):
        AttentionConfig(family=name, family_kwargs={old: value})


@pytest.mark.parametrize(
    "old, new",
    [("posterior", "guide"), ("prior", "model"), ("prior_log_location", "model_log_location")],
)
def test_old_family_methods_are_gone(old, new):
    fam = F.LogisticNormalWeights(2, model_location="attention")
    assert callable(getattr(fam, new))
    with pytest.raises(AttributeError, match=old):
        getattr(fam, old)


def test_a_family_written_against_the_old_extension_points_is_refused():
    """Overriding only an old method name would silently never be called: a TypeError naming
    the method and its new name, at class creation."""
    with pytest.raises(TypeError, match="'posterior'.*'guide'"):

        class OldStyle(F.DirichletWeights):
            def posterior(self, logits, log_prior=None, query=None):
                return self.guide(logits, log_prior, query)

    with pytest.raises(TypeError, match="'prior'.*'model'"):

        class OldModel(F.DirichletWeights):
            def prior(self, log_prior, like, key=None):
                return self.model(log_prior, like, key)

    class Both(F.DirichletWeights):  # defines the new name too: the old one is just a method
        def guide(self, logits, log_prior=None, query=None):
            return super().guide(logits, log_prior, query)

        def posterior(self):
            return "mine"

    assert Both(2).posterior() == "mine"


# ---- attention modes, prediction kinds: ValueError naming the argument ---------------------------


@pytest.mark.parametrize("old, new", [("posterior", "guide"), ("prior", "model")])
def test_old_attention_modes_are_gone(old, new):
    assert new in MODES and old not in MODES
    with pytest.raises(ValueError, match=f"mode must be one of.*'{old}' was renamed '{new}'"):
        with attention_mode(old):
            pass
    net, x = _clf().eval(), _tokens()
    with pytest.raises(ValueError, match=f"mode must be one of.*'{new}'"):
        predict(net, x, 3, mode=old)
    with pytest.raises(ValueError, match="mode must be one of"):
        predict_ensemble([net], x, mode=old, num_samples=2)
    with pytest.raises(ValueError, match="mode must be one of"):
        _s2s("dirichlet").eval().generate(_tokens(2, 3), max_len=3, num_samples=2, mode=old)


def test_bad_modes_still_name_the_choices():
    with pytest.raises(ValueError, match="mode must be one of") as e:
        with attention_mode("posterior_mean"):
            pass
    assert "renamed" not in str(e.value)
    with pytest.raises(ValueError, match="mode must be one of"):
        predict(_clf(), _tokens(), 2, mode="sample")


def test_prediction_result_mode_is_gone():
    probs = torch.full((2, 3, 4), 0.25)
    with pytest.raises(TypeError, match="'mode'"):
        PredictionResult(probs=probs, mode="mc_dropout")
    r = PredictionResult(probs=probs, kind="mc_dropout")
    with pytest.raises(AttributeError, match="mode"):
        getattr(r, "mode")  # noqa: B009 (the point is the attribute lookup)


# ---- posterior= (a variational family) → family= -----------------------------------------------


def test_attention_posterior_keyword_and_attribute_are_gone():
    with pytest.raises(TypeError, match="'posterior'"):
        BayesianMultiheadAttention(8, 2, batch_first=True, posterior="dirichlet")
    m = BayesianMultiheadAttention(8, 2, batch_first=True, family="dirichlet")
    with pytest.raises(AttributeError, match="posterior"):
        getattr(m, "posterior")  # noqa: B009


def test_block_posterior_keywords_are_gone():
    with pytest.raises(TypeError, match="'posterior'"):
        EncoderLayer(8, 2, 16, posterior="weibull")
    with pytest.raises(TypeError, match="'self_posterior'"):
        DecoderLayer(8, 2, 16, self_posterior="dirichlet")
    with pytest.raises(TypeError, match="'cross_posterior'"):
        DecoderLayer(8, 2, 16, cross_posterior="concrete")
    dec = DecoderLayer(8, 2, 16, self_family="dirichlet", cross_family="concrete")
    assert isinstance(dec.multihead_attn.family, F.ConcreteWeights)


@pytest.mark.parametrize("old", ["posterior", "posterior_kwargs"])
def test_attention_config_posterior_fields_are_gone(old):
    value = "dirichlet" if old == "posterior" else {}
    with pytest.raises(TypeError, match=f"'{old}'"):
        AttentionConfig(**{old: value})
    with pytest.raises(TypeError, match=f"'{old}'"):
        AttentionConfig.last_layer(**{old: value})
    with pytest.raises(AttributeError, match=old):
        getattr(AttentionConfig(family="dirichlet"), old)


def test_convert_posterior_keyword_is_gone():
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 1, enable_nested_tensor=False
    )
    with pytest.raises(TypeError, match="'posterior'"):
        bayesattn.convert(model, posterior="dirichlet")
    assert not bayesattn.interop.bayesian_attention_modules(model)  # nothing converted


def test_convert_hf_posterior_keyword_is_gone_and_old_state_dict_keys_load():
    transformers = pytest.importorskip("transformers")
    from bayesattn.interop.hf import convert_hf, hf_attention_modules, unconvert_hf

    def bert():
        torch.manual_seed(0)
        cfg = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                      intermediate_size=16, vocab_size=20,
                                      attn_implementation="eager")  # fmt: skip
        return transformers.BertModel(cfg).eval()

    with pytest.raises(TypeError, match="'posterior'"):
        convert_hf(bert(), posterior="dirichlet")
    a = convert_hf(bert(), family="dirichlet")
    (mod,) = hf_attention_modules(a).values()
    with torch.no_grad():
        mod.bayesattn_family.log_concentration.add_(0.5)
    old = {k.replace("bayesattn_family.", "bayesattn_posterior."): v
           for k, v in a.state_dict().items()}  # fmt: skip
    assert any("bayesattn_posterior." in k for k in old)
    b = convert_hf(bert(), family="dirichlet")
    with _no_warning():  # a file's old keys load silently
        b.load_state_dict(old, strict=True)
    (mb,) = hf_attention_modules(b).values()
    torch.testing.assert_close(mb.bayesattn_family.log_concentration,
                               mod.bayesattn_family.log_concentration)  # fmt: skip
    unconvert_hf(b)
    assert not hasattr(mb, "_bayesattn_old_keys_hook")


# ---- saved files with the old names still load, silently -----------------------------------------


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
    with _no_warning():
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


def test_library_code_uses_no_deprecated_name():
    """Train, predict and decode with every DeprecationWarning an error: internal code is on the
    new names (the whole suite also runs with ``error::DeprecationWarning``, pyproject.toml)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        net = _clf(AttentionConfig.last_layer())
        bayesattn.training.fit(
            net, (_tokens(8), torch.randint(0, 3, (8,))), epochs=1, batch_size=4, progress=False
        )
        for mode in MODES:
            predict(net, _tokens(), 2, mode=mode)
        _s2s("weibull").generate(_tokens(2, 3), 2, num_samples=2)


def test_the_suite_runs_with_deprecation_warnings_as_errors():
    """pyproject.toml's ``error::DeprecationWarning``: a warning attributed to bayesattn code, or
    (a ``stacklevel`` pointing at the caller) to a test, raises instead of being recorded."""
    with pytest.raises(DeprecationWarning, match="probe"):
        warnings.warn_explicit(
            "probe", DeprecationWarning, F.__file__, 1, module="bayesattn.families"
        )
    with pytest.raises(DeprecationWarning, match="probe"):
        warnings.warn("probe", DeprecationWarning, stacklevel=1)


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


# --- 0.5 (issue 32): "support", not "kernel" ---------------------------------------------------

_OLD_SUPPORT_NAMES = {
    "AttentionKernel": "AttentionSupport",
    "LocalKernel": "LocalSupport",
    "LocalGlobalKernel": "LocalGlobalSupport",
    "TopKKernel": "TopKSupport",
    "ClusterTopKKernel": "ClusterTopKSupport",
    "TiledKernel": "TiledSupport",
    "LowRankKernel": "LowRankSupport",
}


def test_kernel_keywords_are_gone():
    with pytest.raises(TypeError, match="'kernel'"):
        BayesianMultiheadAttention(8, 2, kernel="local")
    with pytest.raises(TypeError, match="'kernel'"):
        AttentionConfig(kernel="local")
    with pytest.raises(TypeError, match="'kernel_kwargs'"):
        AttentionConfig(kernel_kwargs={})
    with pytest.raises(TypeError, match="'kernel'"):
        EncoderLayer(8, 2, 16, kernel="local")
    with pytest.raises(TypeError, match="'self_kernel'"):
        DecoderLayer(8, 2, 16, self_kernel="local")
    from bayesattn.nn import supports

    for gone in ("get_kernel", "KernelName", "kernel_attention", "draw_attention_weights"):
        assert not hasattr(supports, gone)
    assert importlib.util.find_spec("bayesattn.functional.bayesian_read") is None


@pytest.mark.parametrize("old, new", sorted(_OLD_SUPPORT_NAMES.items()))
def test_old_support_class_names_resolve_only_for_old_pickles(old, new):
    from bayesattn.nn import supports

    assert old not in supports.__all__ and old not in dir(bayesattn)
    with pytest.warns(DeprecationWarning, match=f"{old} was renamed {new}"):
        cls = getattr(supports, old)
    assert cls is getattr(supports, new)


def test_layer_pickled_with_a_kernel_loads_with_its_support():
    """A 0.4 layer held its support as ``kernel`` (attribute and class name): the pickle loads,
    the support lands in ``support`` and the read is the same."""
    import pickle

    from bayesattn.nn.supports import LocalSupport

    torch.manual_seed(0)
    layer = BayesianMultiheadAttention(8, 2, batch_first=True, support=LocalSupport(window=1))
    x = torch.randn(2, 5, 8)
    want = layer(x, x, x)[0]
    layer._modules["kernel"] = layer._modules.pop("support")  # the 0.4 layout
    new_name = b"bayesattn.nn.supports.local\nLocalSupport\n"
    data = pickle.dumps(layer, protocol=2)
    assert new_name in data
    data = data.replace(new_name, b"bayesattn.nn.supports\nLocalKernel\n")  # 0.4's class path
    with pytest.warns(DeprecationWarning, match="LocalKernel was renamed LocalSupport"):
        old = pickle.loads(data)
    assert isinstance(old.support, LocalSupport) and "kernel" not in old._modules
    torch.testing.assert_close(old(x, x, x)[0], want, rtol=0, atol=0)


def test_state_dict_with_kernel_keys_loads_into_support():
    """A 0.4 ``state_dict`` of a low-rank layer holds ``kernel.proj_k``/``kernel.proj_v``."""
    torch.manual_seed(0)
    a = BayesianMultiheadAttention(8, 2, batch_first=True, support="lowrank")
    a.support.max_len  # noqa: B018 - the support is there
    sd = {k.replace("support.", "kernel."): v for k, v in a.state_dict().items()}
    assert "kernel.proj_k" in sd
    torch.manual_seed(1)
    b = BayesianMultiheadAttention(8, 2, batch_first=True, support="lowrank")
    b.load_state_dict(sd)  # strict: every key found
    assert torch.equal(b.support.proj_k, a.support.proj_k)
    torch.manual_seed(2)
    net = TransformerClassifier(3, vocab_size=7, num_layers=1, **SMALL,
                                attention=AttentionConfig(support="lowrank",
                                                          support_kwargs={"max_len": 8}))  # fmt: skip
    sd = {k.replace(".support.", ".kernel."): v for k, v in net.state_dict().items()}
    assert any(".kernel.proj_k" in k for k in sd)
    torch.manual_seed(3)
    net2 = TransformerClassifier(3, vocab_size=7, num_layers=1, **SMALL,
                                 attention=AttentionConfig(support="lowrank",
                                                           support_kwargs={"max_len": 8}))  # fmt: skip
    net2.load_state_dict(sd)
    for (k1, v1), (k2, v2) in zip(net.state_dict().items(), net2.state_dict().items(), strict=True):
        assert k1 == k2 and torch.equal(v1, v2)
