"""``train()``/``eval()`` mean what torch means (:func:`bayesattn.nn.modes.default_mode`), for every
kind of layer that samples: in eval mode without a mode a layer is deterministic and equals its
``"mean"`` mode; ``attention_mode("guide")``, a ``num_samples`` keyword or a
``bayesattn.num_samples(S)`` context ask for draws; training mode draws."""

from __future__ import annotations

from pathlib import Path

import pyro
import pytest
import torch
from torch import nn

import bayesattn
from bayesattn import BayesianMultiheadAttention, attention_mode
from bayesattn.families import list_families
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.gp_read import SparseGP
from bayesattn.nn.mixture import rank1_mixture
from bayesattn.nn.modes import asking_for_draws, default_mode, draws_asked
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.nn.weights import bayesian_projections
from bayesattn.uncertainty import predict

E, H, T, B = 8, 2, 6, 3


@pytest.fixture(autouse=True)
def _seed():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)


def _differ(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() > 1e-5)


def test_default_mode_follows_train_eval_and_the_contexts():
    assert default_mode(True) == "guide"
    assert default_mode(False) == "mean"
    assert default_mode(False, draws=True) == "guide"
    with attention_mode("model"):
        assert default_mode(False) == default_mode(True) == "model"
    assert not draws_asked()
    with asking_for_draws():
        assert draws_asked() and default_mode(False) == "guide"
    with bayesattn.num_samples(4):
        assert default_mode(False) == "guide"
        with bayesattn.num_samples(None):  # clears the count, not the request for draws
            assert default_mode(False) == "guide"
    with bayesattn.num_samples(None):
        assert default_mode(False) == "mean"


def _check_layer(call, module: nn.Module) -> None:
    """``call()`` → an output tensor of ``module``; the train/eval contract on it."""
    module.eval()
    with torch.no_grad():
        a, b = call(), call()
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # eval(): deterministic
        with attention_mode("mean"):
            torch.testing.assert_close(a, call(), rtol=0, atol=0)  # ... the posterior mean
        with attention_mode("guide"):
            assert _differ(call(), call())  # asked for draws
        with bayesattn.num_samples(2):
            s = call()
            assert _differ(s[0], s[1])  # a context count draws in eval mode too
        module.train()
        assert _differ(call(), call())  # training mode draws
        module.eval()


@pytest.mark.parametrize("family", list_families())
def test_dense_layer_with_each_family(family):
    m = BayesianMultiheadAttention(E, H, batch_first=True, family=family)
    x = torch.randn(B, T, E)
    _check_layer(lambda: m(x, x, x)[0], m)
    with torch.no_grad():
        y, w = m(x, x, x, num_samples=2)  # an explicit keyword asks for draws in eval mode
        assert _differ(y[0], y[1]) and _differ(w[0], w[1])


@pytest.mark.parametrize("support", ["local", "local_global", "topk", "tiled", "lowrank"])
def test_reduced_supports_with_a_family(support):
    m = BayesianMultiheadAttention(E, H, batch_first=True, family="dirichlet", support=support)
    x = torch.randn(B, T, E)
    _check_layer(lambda: m(x, x, x, need_weights=False)[0], m)


@pytest.mark.parametrize("family", [None, "dirichlet"])
def test_gp_read_with_and_without_a_family(family):
    gp = SparseGP(H, E // H, E // H, num_inducing=4)
    m = BayesianMultiheadAttention(E, H, batch_first=True, family=family, gp_read=gp)
    x = torch.randn(B, T, E)
    m.train()
    m(x, x, x)  # initialises the inducing keys from a training batch
    _check_layer(lambda: m(x, x, x)[0], m)


def test_sparse_gp_alone():
    gp = SparseGP(2, 3, 2, num_inducing=4)
    x = torch.randn(B, 2, 5, 3)  # (B, G, N, D)
    _check_layer(lambda: gp(x), gp)
    with torch.no_grad():
        gp.eval()
        s = gp(x, num_samples=2)  # the keyword asks for draws
        assert _differ(s[0], s[1])


def test_converted_torch_model_and_torchs_fast_path():
    layer = nn.TransformerEncoderLayer(E, H, 16, 0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    model = bayesattn.convert(model, family="dirichlet")
    x = torch.randn(B, T, E)
    _check_layer(lambda: model(x), model)
    plain = bayesattn.unconvert(bayesattn.convert(model, family="dirichlet")).eval()
    with torch.no_grad():
        want = plain(x)  # torch's own layers
    bayesattn.convert(model, family="dirichlet")
    model.eval()
    with torch.no_grad():  # eval() keeps torch's fused fast path and its numbers
        layers = bayesattn.interop.bayesian_attention_modules(model).values()
        assert len(layers) == 2 and all(m._qkv_same_embed_dim for m in layers)
        torch.testing.assert_close(model(x), want, atol=1e-5, rtol=0)


def test_converted_hf_model():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        hidden_size=E, num_hidden_layers=2, num_attention_heads=H, intermediate_size=16,
        vocab_size=20, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        attn_implementation="eager", num_labels=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg).eval()
    ids = torch.randint(1, 20, (B, T))
    with torch.no_grad():
        want = model(ids).logits
    from bayesattn.interop.hf import convert_hf

    convert_hf(model, family="dirichlet")
    _check_layer(lambda: model(ids, output_hidden_states=True).hidden_states[-1], model)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, want, rtol=0, atol=0)  # its own output


def test_networks_forward_is_the_mean_and_predict_draws():
    """A network's ``forward`` is the posterior mean in train and eval mode (unchanged);
    ``predict`` sets its own mode and draws in eval mode."""
    torch.manual_seed(0)
    net = TransformerClassifier(
        3, vocab_size=10, d_model=E, nhead=H, num_layers=2, dropout=0.0,
        attention=AttentionConfig(family="dirichlet"),
    ).eval()  # fmt: skip
    x = torch.randint(1, 10, (B, T))
    with torch.no_grad():
        a = net(x)
        torch.testing.assert_close(a, net(x), rtol=0, atol=0)
        with attention_mode("mean"):
            torch.testing.assert_close(a, net(x), rtol=0, atol=0)
        with attention_mode("guide"):
            assert _differ(net(x), net(x))
    probs = predict(net, x, num_samples=4).probs  # (S, B, C)
    assert _differ(probs[0], probs[1])


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_networks_forward_draws_when_draws_are_asked_for(mode):
    """An explicit request for draws is honoured by a network's ``forward`` in ``train()`` and
    ``eval()``: ``net(x, num_samples=S)`` and ``with bayesattn.num_samples(S): net(x)`` give S
    different draws (not S copies of the mean); without a request it stays the mean."""
    torch.manual_seed(0)
    net = TransformerClassifier(
        3, vocab_size=10, d_model=E, nhead=H, num_layers=2, dropout=0.0,
        attention=AttentionConfig(family="dirichlet"),
    )  # fmt: skip
    getattr(net, mode)()
    x = torch.randint(1, 10, (B, T))
    with torch.no_grad():
        mean = net(x)
        kw = net(x, num_samples=3)  # (S, B, C)
        with bayesattn.num_samples(3):
            ctx = net(x)
        for s in (kw, ctx):
            assert s.shape == (3, B, 3)
            assert _differ(s[0], s[1]) and _differ(s[1], s[2])
        torch.testing.assert_close(net(x), mean, rtol=0, atol=0)  # no request: the mean
        with attention_mode("mean"):  # a mode set wins over the request
            s = net(x, num_samples=2)
            torch.testing.assert_close(s[0], s[1], rtol=0, atol=0)


def test_sampled_projection_weights_in_eval_are_the_guide_median():
    torch.manual_seed(0)
    net = TransformerClassifier(3, vocab_size=10, d_model=E, nhead=H, num_layers=1, dropout=0.0)
    bayesian_projections(net, ["*.linear1.weight"])
    x = torch.randint(1, 10, (B, T))
    net.weight_guide(x)  # builds the autoguide's parameters
    net.eval()
    with torch.no_grad():
        a = net(x)
        torch.testing.assert_close(a, net(x), rtol=0, atol=0)  # the guide's median weights
        with net.pyro_context, net.weights_from(net.weight_guide.median()), attention_mode("mean"):
            torch.testing.assert_close(a, net.forward_logits(x), rtol=0, atol=0)
    probs = predict(net, x, num_samples=4).probs
    assert _differ(probs[0], probs[1])  # predict draws the weights


def test_rank1_mixture():
    torch.manual_seed(0)
    net = TransformerClassifier(3, vocab_size=10, d_model=E, nhead=H, num_layers=1, dropout=0.0)
    mix = rank1_mixture(net, num_components=2, init_std=0.2)
    x = torch.randint(1, 10, (B, T))
    net.eval()
    with torch.no_grad(), net.pyro_context:
        a = net.forward_logits(x)  # no mode set, eval(): the K components' mean predictive
        torch.testing.assert_close(a, net.forward_logits(x), rtol=0, atol=0)
        with attention_mode("mean"):
            torch.testing.assert_close(a, net.forward_logits(x), rtol=0, atol=0)
        with attention_mode("guide"):
            assert _differ(net.forward_logits(x), net.forward_logits(x))
        net.train()
        assert default_mode(mix.training) == "guide"
        assert _differ(net.forward_logits(x), net.forward_logits(x))


def test_a_pass_context_has_one_owner_and_nests():
    """Every context manager of a pass changes one field of one immutable PassContext and
    restores the outer one on exit (also when the block raises)."""
    from bayesattn.nn.modes import PassContext, collect_kl, global_values, pass_context
    from bayesattn.nn.sampling import num_samples

    assert pass_context() == PassContext()
    g = {"site": torch.zeros(2)}
    with attention_mode("guide"):
        with num_samples(4), global_values(g):
            ctx = pass_context()
            assert (ctx.mode, ctx.num_samples, ctx.draws) == ("guide", 4, True)
            assert ctx.global_values == g and ctx.kl is None
            with collect_kl() as col:
                assert pass_context().kl is col and pass_context().mode == "elbo"
                with num_samples(None):  # clears the count, keeps the draws
                    assert pass_context().num_samples is None and pass_context().draws
            assert pass_context() is ctx
        with pytest.raises(RuntimeError), asking_for_draws():
            raise RuntimeError
        assert pass_context() == PassContext(mode="guide")
    assert pass_context() == PassContext()
    # the package keeps its pass state in this one ContextVar
    root = Path(bayesattn.__file__).parent
    made = [p for p in root.rglob("*.py") if "ContextVar(" in p.read_text()]
    assert [p.relative_to(root).as_posix() for p in made] == ["nn/modes.py"]
    assert (root / "nn" / "modes.py").read_text().count("ContextVar(") == 1
