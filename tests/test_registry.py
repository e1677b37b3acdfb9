"""The registries (``bayesattn.registry``): the generic class, the four instances, and user classes
registered by name reaching every network built from an ``AttentionConfig``.

The user family is the one ``docs/extending.md`` documents (its first code block, run here), so
the example the docs show is the one checked against closed forms and trained here."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import get_args

import pytest
import torch
from torch import nn

import bayesattn
from bayesattn import (
    AttentionConfig,
    AttentionFamily,
    BayesianMultiheadAttention,
    CausalLM,
    KeyRelevancePrior,
    Seq2Seq,
    TransformerClassifier,
    VisionTransformer,
)
from bayesattn import priors as P
from bayesattn.families import FAMILIES, DirichletWeights, FamilyName, get_family
from bayesattn.nn.blocks import PriorName
from bayesattn.nn.supports import SUPPORTS, LocalSupport, SupportName, get_support
from bayesattn.registry import Registry
from bayesattn.study import methods as study_methods
from bayesattn.training import fit
from bayesattn.uncertainty import predict

DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
DOCS_FAMILY = "learned_concrete"


# --------------------------------------------------------------------------------------------
# the generic class
# --------------------------------------------------------------------------------------------


class _Base:
    def __init__(self, size: int = 1) -> None:
        self.size = size


def test_register_get_create_and_names():
    reg: Registry = Registry("widget", _Base, register_with="register_widget")

    @reg.register("plain")
    class Plain(_Base):
        pass

    def sized(size: int = 3, *, scale: float = 1.0) -> _Base:
        return _Base(int(size * scale))

    assert reg.register("sized", sized) is sized  # the call form returns the entry
    assert reg.names() == ("plain", "sized") == tuple(reg)
    assert "plain" in reg and "other" not in reg and len(reg) == 2
    assert reg.get("plain") is Plain
    built = reg.create("sized", size=2, scale=2.0)
    assert type(built) is _Base and built.size == 4
    assert reg.arguments("sized") == ("size", "scale")
    assert reg.arguments("plain") == ("size",)  # a class: its __init__ without self

    class Inherits(_Base):  # _Base's constructor: its arguments
        pass

    reg.register("inherits", Inherits)
    assert reg.arguments("inherits") == ("size",)

    class NoInit(KeyRelevancePrior):  # nn.Module's (*args, **kwargs), from above the base: none
        pass

    modules: Registry = Registry("prior", KeyRelevancePrior)
    modules.register("no_init", NoInit)
    assert modules.arguments("no_init") == ()
    reg.register("anything", lambda **kw: _Base(**kw))
    assert reg.arguments("anything") is None  # **kwargs: any keyword
    assert reg.unregister("anything") is not None and "anything" not in reg
    assert reg.unregister("anything", missing_ok=True) is None


def test_duplicates_are_refused_unless_override():
    reg: Registry = Registry("widget", _Base)
    reg.register("a", _Base)
    with pytest.raises(ValueError, match="'a' is already registered.*override=True"):
        reg.register("a", lambda: _Base(2))
    assert reg.get("a") is _Base
    reg.register("b", _Base)
    reg.register("a", lambda: _Base(2), override=True)
    assert reg.create("a").size == 2
    assert reg.names() == ("a", "b")  # replaced in place


def test_unknown_names_and_bad_entries_are_clear_errors():
    reg: Registry = Registry("widget", _Base, register_with="register_widget")
    reg.register("a", _Base)
    reg.register("b", _Base)
    with pytest.raises(ValueError) as ei:
        reg.get("c", argument="part", also=("none",))
    msg = str(ei.value)
    assert msg.startswith("unknown widget 'c'; part must be one of the registered widgets")
    assert "['none', 'a', 'b']" in msg and "register_widget" in msg
    with pytest.raises(TypeError, match="widget name"):
        reg.get(3)  # type: ignore[arg-type]
    for bad in ("", "two words", "1st", None):
        with pytest.raises(ValueError, match="identifier"):
            reg.register(bad, _Base)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="does not subclass _Base"):
        reg.register("c", int)
    with pytest.raises(TypeError, match="not an instance"):
        reg.register("c", _Base())
    with pytest.raises(TypeError, match="function returning"):
        reg.register("c", 3)
    reg.register("c", lambda: "not a widget")
    with pytest.raises(TypeError, match="widget 'c' built a str, not a _Base"):
        reg.create("c")
    with pytest.raises(ValueError, match="unknown widget"):
        reg.unregister("z")
    inst: Registry = Registry("thing", _Base, instances=True)
    inst.register("one", _Base(1))
    with pytest.raises(TypeError, match="must be a _Base"):
        inst.register("two", _Base)


# --------------------------------------------------------------------------------------------
# the library's registries hold what the former private tables held
# --------------------------------------------------------------------------------------------


def test_builtin_names_are_the_literal_types():
    # the built-in names come first (test_docs may have registered the docs' family already)
    assert FAMILIES.names()[:4] == get_args(FamilyName)
    assert P.PRIORS.names()[:6] == get_args(PriorName)
    assert ("dense", *SUPPORTS.names()[:6]) == get_args(SupportName)
    assert bayesattn.list_families() == FAMILIES.names()
    assert bayesattn.list_priors() == P.PRIORS.names()
    assert bayesattn.list_supports() == SUPPORTS.names()
    assert bayesattn.register_family == FAMILIES.register
    assert bayesattn.register_prior == P.PRIORS.register
    assert bayesattn.register_support == SUPPORTS.register
    assert isinstance(study_methods._REGISTRY, Registry)
    assert tuple(study_methods.METHODS) == study_methods._REGISTRY.names()


def _former_prior(name: str, H: int, Dh: int, kw: dict) -> KeyRelevancePrior:
    """``AttentionConfig.build_prior`` as it was (0.3: a table of lambdas in nn/blocks.py)."""
    return {
        "uniform": lambda: P.UniformPrior(),
        "causal": lambda: P.CausalPrior(),
        "local": lambda: P.LocalWindowPrior(kw.get("window", 4), kw.get("causal", False)),
        "alibi": lambda: P.DistanceDecayPrior(H, learnable=kw.get("learnable", False)),
        "learned": lambda: P.LearnedPrior(H, kw.get("max_distance", 16)),
        "contextual": lambda: P.ContextualPrior(Dh, kw.get("hidden", 32)),
    }[name]()


@pytest.mark.parametrize(
    "name, kw",
    [
        ("uniform", {}),
        ("causal", {}),
        ("local", {}),
        ("local", {"window": 2, "causal": True}),
        ("alibi", {}),
        ("alibi", {"learnable": True}),
        ("learned", {}),
        ("learned", {"max_distance": 3}),
        ("contextual", {}),
        ("contextual", {"hidden": 5}),
    ],
)
def test_named_priors_build_as_before(name, kw):
    H, Dh = 3, 4
    cfg = AttentionConfig(prior=name, prior_kwargs=kw)
    torch.manual_seed(0)
    new = cfg.build_prior(H, Dh)
    torch.manual_seed(0)
    old = _former_prior(name, H, Dh, kw)
    assert type(new) is type(old) and repr(new) == repr(old)
    sd_new, sd_old = new.state_dict(), old.state_dict()
    assert sd_new.keys() == sd_old.keys()
    for k in sd_new:
        torch.testing.assert_close(sd_new[k], sd_old[k], rtol=0, atol=0)
    q, k = torch.randn(2, H, 5, Dh), torch.randn(2, H, 5, Dh)
    torch.testing.assert_close(new(q, k), old(q, k), rtol=0, atol=0)


def test_prior_kwargs_are_checked_against_the_factory():
    with pytest.raises(ValueError, match=r"\['win'\] are not arguments of prior 'local'.*window"):
        AttentionConfig(prior="local", prior_kwargs={"win": 2})
    with pytest.raises(ValueError, match="num_heads"):  # the layer supplies it
        AttentionConfig(prior="alibi", prior_kwargs={"num_heads": 2})


@pytest.mark.parametrize(
    "make, argument, registered",
    [
        (lambda: AttentionConfig(family="gaussian"), "family", FAMILIES),
        (lambda: AttentionConfig(prior="gaussian"), "prior", P.PRIORS),
        (lambda: AttentionConfig(support="gaussian"), "support", SUPPORTS),
        (lambda: BayesianMultiheadAttention(8, 2, family="gaussian"), "family", FAMILIES),
        (lambda: get_support("gaussian"), "support", SUPPORTS),
        (lambda: study_methods.get_method("gaussian"), "method", study_methods._REGISTRY),
    ],
)
def test_unknown_names_list_the_registered_names(make, argument, registered):
    with pytest.raises(ValueError) as ei:
        make()
    msg = str(ei.value)
    assert f"{argument} must be one of" in msg and "'gaussian'" in msg
    assert all(repr(n) in msg for n in registered.names())


# --------------------------------------------------------------------------------------------
# user classes through AttentionConfig
# --------------------------------------------------------------------------------------------


@pytest.fixture
def docs_family():
    """The family class of ``docs/extending.md`` (its first block, which registers it), removed
    from the registry afterwards (and any earlier registration, e.g. by test_docs, put back)."""
    code = re.findall(r"```python\n(.*?)```", DOCS_PAGE.read_text(encoding="utf-8"), re.S)[0]
    earlier = FAMILIES.unregister(DOCS_FAMILY, missing_ok=True)
    ns: dict = {"__name__": "docs_extending"}
    try:
        exec(compile(code, str(DOCS_PAGE), "exec"), ns)
        assert DOCS_FAMILY in FAMILIES
        yield FAMILIES.get(DOCS_FAMILY)
    finally:
        FAMILIES.unregister(DOCS_FAMILY, missing_ok=True)
        if earlier is not None:
            FAMILIES.register(DOCS_FAMILY, earlier)


def test_docs_family_draws_follow_the_gumbel_max_law(docs_family):
    """For every temperature the largest weight falls on key j with probability p̄_j, the exact
    posterior restricted to the allowed keys; weights are on the simplex, 0 on masked keys."""
    fam = get_family(DOCS_FAMILY, num_heads=2, init_temperature=0.7)
    assert isinstance(fam, docs_family) and isinstance(fam, AttentionFamily)
    logits = torch.tensor([[1.5, 0.5, 0.0, -1.0], [0.0, 2.0, 1.0, 0.5]]).view(1, 2, 1, 4)
    log_prior = torch.tensor([0.0, 0.0, float("-inf"), 0.0]).view(1, 1, 1, 4)  # key 2 masked
    p_bar = torch.softmax(logits + log_prior, -1)  # (1, 2, 1, 4), 0 on key 2
    torch.manual_seed(0)
    q = fam.guide(logits, log_prior)
    _, allowed = fam.exact_log_posterior(logits, log_prior)
    w = fam.to_weights(q.rsample((20000,)), allowed)  # (S, 1, 2, 1, 4)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    assert (w[..., 2] == 0).all()
    share = nn.functional.one_hot(w.argmax(-1), 4).float().mean(0)  # (1, 2, 1, 4)
    torch.testing.assert_close(share, p_bar, rtol=0, atol=0.015)
    kl = fam.kl(q, fam.model(log_prior, logits), num_samples=4)
    assert kl.shape == (1, 2, 1) and torch.isfinite(kl).all()


def test_docs_family_trains_in_a_vision_transformer(docs_family):
    torch.manual_seed(0)
    images = torch.randn(48, 1, 8, 8)
    labels = (images.mean((1, 2, 3)) > 0).long()
    net = VisionTransformer(
        2, image_size=8, patch_size=4, d_model=16, nhead=2, num_layers=2, dim_feedforward=32,
        attention=AttentionConfig(family=DOCS_FAMILY, family_kwargs={"init_temperature": 0.5}),
    )  # fmt: skip
    fams = [m.family for m in net.modules() if isinstance(m, BayesianMultiheadAttention)]
    assert len(fams) == 2 and all(type(f) is docs_family and f.num_heads == 2 for f in fams)
    before = [f.log_temperature.detach().clone() for f in fams]
    history = fit(
        net, (images, labels), method="hybrid", epochs=2, batch_size=16, lr=1e-2, progress=False
    )
    assert len(history.train_loss) == 2 and all(
        map(torch.isfinite, map(torch.tensor, history.train_loss))
    )
    # the temperatures are learned: the ELBO's gradient reached them
    assert all(not torch.equal(b, f.log_temperature) for b, f in zip(before, fams, strict=True))
    pred = predict(net, images[:5], num_samples=6)
    assert pred.probs.shape == (6, 5, 2)
    torch.testing.assert_close(pred.probs.sum(-1), torch.ones(6, 5))
    assert pred.probs.std(0).max() > 0  # draws differ: the family is sampled


@pytest.mark.parametrize("network", ["classifier", "seq2seq", "causal_lm"])
def test_docs_family_goes_into_every_network(docs_family, network):
    cfg = AttentionConfig(family=DOCS_FAMILY)
    torch.manual_seed(0)
    kw = dict(d_model=16, nhead=2, dim_feedforward=32, attention=cfg)
    x = torch.randint(3, 11, (4, 6))
    if network == "classifier":
        net: nn.Module = TransformerClassifier(2, vocab_size=11, num_layers=1, **kw)
        y = torch.tensor([0, 1, 0, 1])
    elif network == "seq2seq":
        net = Seq2Seq(11, 11, num_encoder_layers=1, num_decoder_layers=1, **kw)
        y = torch.randint(3, 11, (4, 5))
    else:
        net = CausalLM(11, num_layers=1, **kw)
        y = None
    layers = [m for m in net.modules() if isinstance(m, BayesianMultiheadAttention)]
    assert layers and all(type(m.family) is docs_family for m in layers)
    loss, _ = net.elbo_loss(x, y)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(m.family.log_temperature.grad is not None for m in layers)


@pytest.fixture
def scratch_registries():
    """Names registered during a test are removed after it."""
    regs = (FAMILIES, P.PRIORS, SUPPORTS)
    before = [set(r) for r in regs]
    yield
    for r, names in zip(regs, before, strict=True):
        for n in set(r) - names:
            r.unregister(n)


def test_user_prior_by_name_gets_the_layer_arguments_it_names(scratch_registries):
    @bayesattn.register_prior("per_head_bias")
    class PerHeadBias(KeyRelevancePrior):
        def __init__(self, num_heads: int, scale: float = 1.0) -> None:
            super().__init__()
            self.bias = nn.Parameter(scale * torch.arange(float(num_heads)).view(1, -1, 1, 1))

        def log_prior(self, q, k, q_pos, k_pos):
            return self.bias.expand(1, -1, 1, k.shape[-2])  # (1, H, 1, Tk)

    cfg = AttentionConfig(family="dirichlet", prior="per_head_bias", prior_kwargs={"scale": 2.0})
    net = TransformerClassifier(2, vocab_size=9, d_model=12, nhead=3, num_layers=2, attention=cfg)
    priors = [m.prior for m in net.modules() if isinstance(m, BayesianMultiheadAttention)]
    assert len(priors) == 2 and all(type(p) is PerHeadBias for p in priors)
    torch.testing.assert_close(priors[0].bias.flatten(), torch.tensor([0.0, 2.0, 4.0]))
    assert priors[0] is not priors[1]  # one per layer
    with pytest.raises(ValueError, match=r"\['shift'\] are not arguments.*\['scale'\]"):
        AttentionConfig(prior="per_head_bias", prior_kwargs={"shift": 1.0})


def test_user_support_by_name_reads_like_the_class_it_builds(scratch_registries):
    bayesattn.register_support("narrow", functools.partial(LocalSupport, window=1))
    torch.manual_seed(0)
    named = BayesianMultiheadAttention(8, 2, batch_first=True, support="narrow")
    direct = BayesianMultiheadAttention(8, 2, batch_first=True, support=LocalSupport(1))
    direct.load_state_dict(named.state_dict())
    x = torch.randn(2, 7, 8)
    with bayesattn.attention_mode("mean"):
        torch.testing.assert_close(named(x, x, x)[0], direct(x, x, x)[0])
    cfg = AttentionConfig(support="narrow")
    layer = cfg.build(8, 2, index=0, num_layers=1, which="self")
    assert isinstance(layer.support, LocalSupport) and layer.support.window == 1
    with pytest.raises(TypeError, match="built a"):
        bayesattn.register_support("broken", lambda: nn.Identity())
        get_support("broken")


def test_a_user_family_name_is_refused_once_taken(scratch_registries):
    @bayesattn.register_family("mine")
    class Mine(DirichletWeights):
        pass

    with pytest.raises(ValueError, match="'mine' is already registered"):
        bayesattn.register_family("mine", Mine)
    with pytest.raises(ValueError, match="'dirichlet' is already registered"):
        bayesattn.register_family("dirichlet", Mine)
    assert AttentionConfig(family="mine").family == "mine"


def test_a_family_that_implements_nothing_is_refused_by_name(scratch_registries):
    """A registered family (or one passed as an instance) must implement the extension points;
    a class that implements none was accepted and failed at first use with a bare
    NotImplementedError."""

    class Nothing(AttentionFamily):
        pass

    with pytest.raises(TypeError, match=r"the class Nothing does not implement guide, model, "
                       r"to_weights"):  # fmt: skip
        bayesattn.register_family("nothing", Nothing)
    assert "nothing" not in bayesattn.families.list_families()
    with pytest.raises(TypeError, match="family Nothing does not implement guide, model"):
        bayesattn.BayesianMultiheadAttention(8, 2, family=Nothing(2))

    class Half(AttentionFamily):  # guide only: the others are named
        def guide(self, logits, log_prior=None, query=None):
            raise AssertionError("not called")

    with pytest.raises(TypeError, match=r"does not implement model, to_weights \("):
        bayesattn.register_family("half", Half)
    with pytest.raises(NotImplementedError, match="Half does not implement model"):
        Half(2).model(None, torch.zeros(1, 1, 1, 2))


def test_the_built_in_dense_support_cannot_be_registered_over():
    """issue 33: register_support("dense", ...) replaced nothing visible and said nothing."""
    for override in (False, True):
        with pytest.raises(ValueError, match="'dense' is built in"):
            bayesattn.register_support("dense", LocalSupport, override=override)
    assert "dense" not in SUPPORTS and get_support("dense") is None
