"""bayesattn.convert / unconvert on models written with plain torch, and num_samples from outside."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Trace_ELBO
from torch import nn

import bayesattn
from bayesattn import BayesianMultiheadAttention, attention_mode
from bayesattn.families import DirichletWeights, get_family
from bayesattn.interop import bayesian_attention_modules, convert, unconvert
from bayesattn.priors import DistanceDecayPrior

E, H = 16, 4


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    pyro.clear_param_store()


class TinyViT(nn.Module):
    """A model we 'did not write': blocks of torch layers in a plain ModuleList, cross-attention
    from a class token, kdim/vdim attention."""

    def __init__(self, depth: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True) for _ in range(depth)
        )
        self.pool = nn.MultiheadAttention(E, H, batch_first=True, kdim=8, vdim=8)
        self.to_kv = nn.Linear(E, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, E))
        self.head = nn.Linear(E, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (…, B, T, E) → (…, B, 3)
        for b in self.blocks:
            x = b(x)
        kv = self.to_kv(x)
        cls = self.cls.expand(x.shape[:-2] + (1, E))
        return self.head(self.pool(cls, kv, kv, need_weights=False)[0][..., 0, :])


def _sites(model, *args) -> list[str]:
    with attention_mode("guide"):  # eval() alone is the posterior mean: no sites
        tr = poutine.trace(model).get_trace(*args)
    return [n for n, s in tr.nodes.items() if s["type"] == "sample"]


def test_convert_keeps_weights_and_mean_outputs_and_names_sites_by_path():
    model = TinyViT().eval()
    x = torch.randn(4, 6, E)
    want = model(x)
    with torch.no_grad():
        want_fast = model(x)  # torch's fast path
    state = {k: v.clone() for k, v in model.state_dict().items()}
    convert(model, family="dirichlet")
    assert all(
        isinstance(m, BayesianMultiheadAttention)
        for n, m in model.named_modules()
        if n.endswith(("self_attn", "pool"))
    )
    new_state = model.state_dict()
    for k, v in state.items():
        torch.testing.assert_close(new_state[k], v, rtol=0, atol=0)
    with attention_mode("mean"):
        torch.testing.assert_close(model(x), want, atol=1e-5, rtol=0)
        with torch.no_grad():
            torch.testing.assert_close(model(x), want_fast, atol=1e-5, rtol=0)
    names = _sites(model, x)
    assert names == [f"blocks.{i}.self_attn.latent" for i in range(3)] + ["pool.latent"]
    fams = [m.family for m in bayesian_attention_modules(model).values()]
    assert len({id(f) for f in fams}) == 4  # one posterior per layer, never shared


def test_converted_foreign_model_trains_with_pyro_svi():
    model = TinyViT(depth=2).eval()
    convert(model, family="dirichlet", layers=[0, 1])  # the two encoder layers only
    assert isinstance(model.pool, BayesianMultiheadAttention) is False
    x, y = torch.randn(8, 5, E), torch.randint(0, 3, (8,))

    def pmodel(x, y):
        with attention_mode("model"), pyro.plate("data", x.shape[0]):
            pyro.sample("obs", dist.Categorical(logits=model(x)), obs=y)

    def guide(x, y):
        with attention_mode("guide"), pyro.plate("data", x.shape[0]):
            model(x)

    before = {k: v.clone() for k, v in model.state_dict().items()}
    # Pyro registers every PyroModule parameter (requires_grad switched back on): the optimiser
    # must leave the network's weights alone by name
    def lr(name, param):
        return {"lr": 0.05 if ".family" in name else 0.0}

    svi = SVI(pmodel, guide, pyro.optim.Adam(lr), Trace_ELBO())
    losses = [svi.step(x, y) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
    store = set(pyro.get_param_store().keys())  # registered by module path, no clashes
    assert {f"blocks.{i}.self_attn.family$$$log_concentration" for i in range(2)} <= store
    after = model.state_dict()
    for k, v in before.items():
        moved = not torch.equal(after[k], v)
        assert moved == k.endswith("family.log_concentration"), k


def test_layer_selection_prior_and_errors():
    model = TinyViT()
    convert(model, family="dirichlet", layers="last")
    assert list(bayesian_attention_modules(model)) == ["pool"]
    model = TinyViT()
    convert(model, family=DirichletWeights(num_heads=H), layers=["blocks.1.self_attn"])
    assert list(bayesian_attention_modules(model)) == ["blocks.1.self_attn"]
    assert type(model.blocks[0].self_attn) is nn.MultiheadAttention
    model = TinyViT()
    convert(model, prior=DistanceDecayPrior(H), layers=lambda path, m: path.startswith("blocks"))
    priors = [model.blocks[i].self_attn.prior for i in range(3)]
    assert all(isinstance(p, DistanceDecayPrior) for p in priors) and priors[0] is not priors[1]
    with pytest.raises(ValueError, match="no torch.nn.MultiheadAttention"):
        convert(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="out of range"):
        convert(TinyViT(), layers=[7])
    with pytest.raises(ValueError, match="not an attention module"):
        convert(TinyViT(), layers=["head"])
    with pytest.raises(TypeError, match="nn.Module"):
        convert("model")
    single = convert(nn.MultiheadAttention(E, H), family="dirichlet")
    assert isinstance(single, BayesianMultiheadAttention) and single.is_bayesian


def test_unconvert_round_trip_is_plain_torch():
    model = TinyViT().eval()
    x = torch.randn(2, 5, E)
    want = model(x)
    unconvert(convert(model, family="weibull"))
    assert not any(isinstance(m, BayesianMultiheadAttention) for m in model.modules())
    assert sum(type(m) is nn.MultiheadAttention for m in model.modules()) == 4
    torch.testing.assert_close(model(x), want, atol=1e-6, rtol=0)
    with pytest.raises(TypeError, match="UniformPrior"):
        unconvert(convert(TinyViT(), prior=DistanceDecayPrior(H)))


def test_num_samples_reaches_layers_of_a_foreign_model():
    model = convert(TinyViT().eval(), family="dirichlet")
    x = torch.randn(3, 5, E)
    with torch.no_grad():
        with bayesattn.num_samples(7):
            out = model(x)  # first layer adds S; later layers draw one weight per sample
        assert out.shape == (7, 3, 3)
        assert (out[0] - out[1]).abs().max() > 0  # distinct draws
        with bayesattn.num_samples(7), attention_mode("mean"):
            same = model(x)  # mean mode: S identical copies (shapes do not depend on the mode)
        assert same.shape == (7, 3, 3) and bool((same == same[0]).all())
    with pytest.raises(ValueError, match="num_samples"):
        with bayesattn.num_samples(0):
            pass
    # batch_first=False layers carry the sample dim too: (S, T, B, E)
    mha = convert(nn.MultiheadAttention(E, H), family="dirichlet")
    q = torch.randn(5, 2, E)
    with bayesattn.num_samples(4):
        y, w = mha(q, q, q)
    assert y.shape == (4, 5, 2, E) and w.shape == (4, 2, 5, 5)
    y2, _ = mha(y, y, y)  # already sampled input: one draw per sample
    assert y2.shape == (4, 5, 2, E)


@pytest.mark.parametrize("kw", [{}, {"kdim": 3, "vdim": 5, "add_bias_kv": True, "bias": False}])
def test_mha_constructor_args_rebuild_the_same_layer_both_ways(kw):
    """One description of an attention layer's constructor serves convert and to_torch."""
    from bayesattn.nn.attention import mha_constructor_args

    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True, add_zero_attn=True, **kw)
    args = mha_constructor_args(mha)
    assert args == {
        "embed_dim": 8, "num_heads": 2, "dropout": 0.1, "bias": kw.get("bias", True),
        "add_bias_kv": kw.get("add_bias_kv", False), "add_zero_attn": True,
        "kdim": kw.get("kdim", 8), "vdim": kw.get("vdim", 8), "batch_first": True,
        "device": torch.device("cpu"), "dtype": torch.float32,
    }  # fmt: skip
    bmha = BayesianMultiheadAttention(**args)
    assert mha_constructor_args(bmha) == args
    back = torch.nn.MultiheadAttention(**mha_constructor_args(bmha))
    assert {k: v.shape for k, v in back.state_dict().items()} == {
        k: v.shape for k, v in mha.state_dict().items()
    }
    with pytest.raises(TypeError, match="MultiheadAttention; got Linear"):
        mha_constructor_args(torch.nn.Linear(2, 2))


def test_shared_attention_module_stays_shared_through_convert_and_unconvert():
    """ALBERT-style sharing: one module at two paths is converted once, put at both paths (its
    parameters stay one set), and unconverted back to one module."""
    mha = nn.MultiheadAttention(E, H, batch_first=True)
    model = nn.ModuleList([mha, mha, nn.MultiheadAttention(E, H, batch_first=True)])
    want = [m.in_proj_weight.detach().clone() for m in model]
    convert(model, family="dirichlet")
    assert isinstance(model[0], BayesianMultiheadAttention) and model[0] is model[1]
    assert isinstance(model[2], BayesianMultiheadAttention) and model[2] is not model[0]
    assert torch.equal(model[1].in_proj_weight, want[1])
    n_params = sum(p.numel() for p in model.parameters())  # shared ones counted once
    assert n_params == sum(p.numel() for m in (model[0], model[2]) for p in m.parameters())
    assert sorted(bayesian_attention_modules(model)) == ["0", "2"]
    unconvert(model)
    assert type(model[0]) is nn.MultiheadAttention and model[0] is model[1]
    assert model[2] is not model[0]


class _SameForward(nn.MultiheadAttention):
    """A subclass that only adds an attribute: torch's computation."""

    tag = "same"


class _OwnForward(nn.MultiheadAttention):
    """A subclass with its own computation: not ours to replace."""

    def forward(self, query, key, value, **kw):  # type: ignore[override]
        return super().forward(query * 2, key, value, **kw)


def test_subclasses_of_torch_attention_are_converted_or_named():
    model = nn.ModuleDict(
        {"a": _SameForward(E, H, batch_first=True), "b": _OwnForward(E, H, batch_first=True)}
    )
    x = torch.randn(2, 3, E)
    want = model["a"](x, x, x)[0]
    with pytest.warns(UserWarning, match=r"b \(_OwnForward\)"):
        convert(model, family="dirichlet")
    assert isinstance(model["a"], BayesianMultiheadAttention)
    assert type(model["b"]) is _OwnForward  # left alone, and said so
    with attention_mode("mean"):
        torch.testing.assert_close(model["a"](x, x, x)[0], want, atol=1e-6, rtol=0)
    with pytest.raises(TypeError, match="_OwnForward.*own forward"):
        convert(nn.ModuleDict({"b": _OwnForward(E, H)}), layers=["b"])


def test_to_torch_returns_torchs_class_after_the_drop_in_swap(monkeypatch):
    """The drop-in recipe replaces ``torch.nn.MultiheadAttention`` by ours; ``to_torch`` (and so
    TorchScript) still builds torch's own layer."""
    torch_cls = nn.MultiheadAttention
    layer = BayesianMultiheadAttention(E, H, batch_first=True)
    monkeypatch.setattr(torch.nn, "MultiheadAttention", BayesianMultiheadAttention)
    back = layer.to_torch()
    assert type(back) is torch_cls
    x = torch.randn(2, 3, E)
    scripted = torch.jit.script(layer)
    torch.testing.assert_close(scripted(x, x, x)[0], layer(x, x, x)[0], atol=1e-6, rtol=0)


# ---- issue 33: round 4 ------------------------------------------------------------------------
def _encoder(layers=2):
    return nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), layers,
                                 enable_nested_tensor=False)  # fmt: skip


def test_convert_that_converts_nothing_is_refused():
    with pytest.raises(ValueError, match=r"layers=\[\] selected none"):
        convert(_encoder(), family="dirichlet", layers=[])
    with pytest.raises(ValueError, match="selected none"):
        convert(_encoder(), family="dirichlet", layers=lambda path, m: False)

    class Own(nn.MultiheadAttention):
        def forward(self, *a, **k):  # type: ignore[override]
            return super().forward(*a, **k)

    only = nn.ModuleDict({"lin": nn.Linear(8, 8), "attn": Own(8, 2)})
    with pytest.raises(ValueError, match=r"only attention modules are subclasses.*attn \(.*Own\)"):
        convert(only, family="dirichlet")


def test_a_convert_that_raises_leaves_the_model_as_it_was():
    enc = _encoder(3)
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    calls = []

    def family(path, mha):  # fails on the second layer
        calls.append(path)
        if len(calls) == 2:
            raise RuntimeError("no family for this layer")
        return get_family("dirichlet", num_heads=2)

    with pytest.raises(RuntimeError, match="no family"):
        convert(enc, family=family)
    assert all(type(layer.self_attn) is nn.MultiheadAttention for layer in enc.layers)
    assert all(torch.equal(before[k], v) for k, v in enc.state_dict().items())
    # a re-conversion of Bayesian layers that fails keeps their families too
    convert(enc, family="dirichlet")
    fams = [layer.self_attn.family for layer in enc.layers]
    calls.clear()
    with pytest.raises(RuntimeError, match="no family"):
        convert(enc, family=family)
    assert [layer.self_attn.family for layer in enc.layers] == fams


def test_converting_again_does_not_keep_the_old_familys_values_in_the_param_store():
    """After a trace, Pyro's param store holds the family's parameters under the layer's site
    names; converting again with a new family (same name, other values) left the old values
    there, so the store and the layer disagreed and the store's (old) values were trained."""
    import pyro

    from bayesattn.families import DirichletWeights

    pyro.clear_param_store()
    m = nn.Sequential(nn.MultiheadAttention(8, 2, batch_first=True))
    convert(m, family=DirichletWeights(2, init_concentration=1.0))
    x = torch.randn(2, 5, 8)
    pyro.poutine.trace(m[0]).get_trace(x, x, x)
    key = "0.family$$$log_concentration"
    assert torch.equal(pyro.param(key).detach(), torch.zeros(2))
    convert(m, family=DirichletWeights(2, init_concentration=50.0))
    pyro.poutine.trace(m[0]).get_trace(x, x, x)
    want = torch.full((2,), math.log(50.0))
    torch.testing.assert_close(pyro.param(key).detach(), want)
    torch.testing.assert_close(m[0].family.log_concentration.detach(), want)
    pyro.clear_param_store()
