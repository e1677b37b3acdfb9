"""The attention read (:mod:`bayesattn.nn.read`): one read object, and its one draw function, that
the dense layer, the reduced supports and the Hugging Face interop all call.

Each path is checked two ways: it calls :func:`sample_attention_weights` (a spy), and under the
same seed it returns the draw of a direct call of that function on logits computed here from the
layer's own projections."""

from __future__ import annotations

import inspect
import math

import pyro
import pytest
import torch
import torch.nn.functional as F

import bayesattn.interop.hf as hf
import bayesattn.nn.read as BR
from bayesattn.families import get_family
from bayesattn.nn.attention import BayesianMultiheadAttention
from bayesattn.nn.modes import attention_mode, collect_kl
from bayesattn.nn.read import AttentionRead, sample_attention_weights
from bayesattn.nn.supports import TiledSupport, TopKSupport
from bayesattn.priors import ContextualPrior, DistanceDecayPrior, add_key_prior

E, H, T, B = 8, 2, 5, 3
Dh = E // H


def _qk(m: BayesianMultiheadAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's per-head queries and keys ``(B, H, T, Dh)``, computed here (packed in_proj)."""
    w, b = m.in_proj_weight, m.in_proj_bias
    q = F.linear(x, w[:E], b[:E]).reshape(B, T, H, Dh).transpose(1, 2)
    k = F.linear(x, w[E : 2 * E], b[E : 2 * E]).reshape(B, T, H, Dh).transpose(1, 2)
    return q, k


def _logits(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return torch.matmul(q / math.sqrt(Dh), k.transpose(-1, -2))  # (B, H, T, T)


def _seeded(fn):
    torch.manual_seed(3)
    pyro.set_rng_seed(3)
    return fn()


@pytest.fixture
def layer_and_input():
    torch.manual_seed(0)
    # training mode: a layer without an attention mode draws from the guide (eval(): the mean)
    m = BayesianMultiheadAttention(E, H, batch_first=True, family="logistic_normal").train()
    x = torch.randn(B, T, E)
    return m, x


@pytest.fixture
def calls(monkeypatch):
    """Spy on the one draw function in every module that calls it."""
    seen: list[tuple[str, str]] = []
    real = BR.sample_attention_weights

    def spy(family, mode, *args, **kwargs):
        seen.append((mode, kwargs["site"]))
        return real(family, mode, *args, **kwargs)

    monkeypatch.setattr(BR, "sample_attention_weights", spy)
    return seen


@pytest.mark.parametrize("mode", ["guide", "model"])
def test_dense_layer_draw_is_the_direct_call(layer_and_input, calls, mode):
    m, x = layer_and_input
    q, k = _qk(m, x)
    with attention_mode(mode):
        # key/value not the query object: the layer projects them separately, as _qk does
        _, w = _seeded(lambda: m(x, x.clone(), x.clone(), average_attn_weights=False))
    direct = _seeded(
        lambda: sample_attention_weights(m.family, mode, _logits(q, k), None, q, k)
    )  # (B, H, T, T)
    torch.testing.assert_close(w, direct)
    assert calls == [(mode, "latent")]


def test_support_paths_draw_the_dense_draw(layer_and_input, calls):
    """A tiled support reads every key: its support draw (with weights) and its tile-by-tile draw
    (without) equal the dense layer's, through the same function."""
    m, x = layer_and_input
    dense_y, dense_w = _seeded(lambda: m(x, x.clone(), x.clone(), average_attn_weights=False))
    m.support = TiledSupport(tile=T)  # one tile: one site, the same rows in the same order
    _, sw = _seeded(lambda: m(x, x.clone(), x.clone(), average_attn_weights=False))
    torch.testing.assert_close(sw.to_dense(), dense_w)
    y, _ = _seeded(lambda: m(x, x.clone(), x.clone(), need_weights=False))
    torch.testing.assert_close(y, dense_y)
    assert calls == [("guide", "latent")] * 3


def test_hf_interop_draws_the_layer_draw(layer_and_input, calls):
    """transformers' attention function of a converted model, given the layer's family and the
    same q, k: the same draw, at the module's own site."""
    transformers = pytest.importorskip("transformers")
    m, x = layer_and_input
    q, k = _qk(m, x)
    v = torch.randn(B, H, T, Dh)
    cfg = transformers.BertConfig(
        hidden_size=E, num_hidden_layers=1, num_attention_heads=H, intermediate_size=16,
        vocab_size=10, attn_implementation="eager",
    )  # fmt: skip
    bert = hf.convert_hf(transformers.BertModel(cfg).eval(), family=m.family)  # a copy of it
    (path, module), *_ = hf.hf_attention_modules(bert).items()
    with attention_mode("guide"):  # eval() alone: the model's own softmax, no draw
        _, w_hf = _seeded(lambda: hf.bayesian_attention_forward(module, q, k, v, None, Dh**-0.5))
    _, w = _seeded(lambda: m(x, x.clone(), x.clone(), average_attn_weights=False))
    torch.testing.assert_close(w_hf, w)
    assert calls == [("guide", f"{path}.latent"), ("guide", "latent")]


def test_elbo_kl_and_model_sites():
    """``"elbo"``: no Pyro site, KL ``(*S, B)`` under the site name; ``"model"``: the latent and
    the deterministic weights sites; ``num_samples`` prepends S."""
    fam = get_family("dirichlet", num_heads=H, head_dim=Dh)
    q, k = torch.randn(B, H, T, Dh), torch.randn(B, H, T, Dh)
    lp = torch.zeros(1, 1, 1, T)
    lp[..., -1] = float("-inf")  # the last key ruled out
    with collect_kl() as col:
        w = sample_attention_weights(
            fam, "elbo", _logits(q, k), lp, q, k, site="a.latent", num_samples=4, kl_sink=col
        )
    assert w.shape == (4, B, H, T, T) and list(col.terms) == ["a.latent"]
    assert col.terms["a.latent"].shape == (4, B) and bool((col.terms["a.latent"] >= 0).all())
    assert bool((w[..., -1] == 0).all())
    torch.testing.assert_close(w.sum(-1), torch.ones(4, B, H, T))
    tr = pyro.poutine.trace(sample_attention_weights).get_trace(
        fam, "model", _logits(q, k), lp, q, k, site="a.latent", weights_site="a.weights"
    )
    assert [n for n in tr.nodes if n.startswith("a.")] == ["a.latent", "a.weights"]
    with pytest.raises(ValueError, match="mode"):
        sample_attention_weights(fam, "mean", _logits(q, k), None, q, k)


def test_add_key_prior_folds_sample_dims():
    """Leading sample dims are folded into the batch for a query-dependent prior: the same as
    calling the prior on each sample; a prior that ignores the batch stays ``(1, H, T, T)``."""
    torch.manual_seed(0)
    prior = ContextualPrior(Dh)
    q, k = torch.randn(2, B, H, T, Dh), torch.randn(2, B, H, T, Dh)
    base = torch.randn(B, 1, T, T)
    lp = add_key_prior(prior, base, q, k)  # (2, B, H, T, T)
    for s in range(2):
        torch.testing.assert_close(lp[s], base + prior(q[s], k[s], None, None))
    decay = DistanceDecayPrior(H)
    assert add_key_prior(decay, None, q, k).shape == (1, H, T, T)


def test_topk_support_draw_is_on_the_support(calls):
    """A reduced support (top-k): the draw is over ``K`` keys per query, at the layer's site."""
    torch.manual_seed(0)
    m = BayesianMultiheadAttention(E, H, batch_first=True, family="dirichlet", support=TopKSupport(2))
    x = torch.randn(B, T, E)
    _, sw = m(x, x, x, average_attn_weights=False)
    assert sw.weights.shape == (B, H, T, 2)
    assert calls == [("guide", "latent")]


@pytest.mark.parametrize("support", ["dense", "local", "local_global", "topk", "cluster_topk",
                                     "tiled", "lowrank"])  # fmt: skip
@pytest.mark.parametrize("need_weights", [True, False])
def test_every_support_reads_through_one_attention_read(monkeypatch, support, need_weights):
    """The layer makes one :class:`AttentionRead` per call, whatever its support; the support
    gets tensors and the read's drawer, never the layer."""
    from bayesattn.nn.read import AttentionRead
    from bayesattn.nn.supports import SUPPORTS, AttentionSupport, DenseSupport

    reads, seen = [], []
    real_call = AttentionRead.__call__

    def spy_call(self, sup, *args, **kwargs):
        reads.append(type(sup).__name__)
        return real_call(self, sup, *args, **kwargs)

    def spy_sample(self, draw, *args, **kwargs):
        seen.append(draw)
        return real_sample[type(self)](self, draw, *args, **kwargs)

    classes = (DenseSupport, *(SUPPORTS.get(n) for n in SUPPORTS))
    real_sample = {c: c.sample_output for c in classes}
    for c in real_sample:
        monkeypatch.setattr(c, "sample_output", spy_sample)
    monkeypatch.setattr(AttentionRead, "__call__", spy_call)
    torch.manual_seed(0)
    kw = {"max_len": 16} if support == "lowrank" else {}
    from bayesattn.nn.supports import get_support

    m = BayesianMultiheadAttention(E, H, batch_first=True, family="dirichlet",
                                   support=get_support(support, **kw))  # fmt: skip
    x = torch.randn(B, T, E)
    with attention_mode("guide"):
        m(x, x, x, need_weights=need_weights)
    assert len(reads) == 1
    assert reads[0] == ("DenseSupport" if support == "dense" else type(m.support).__name__)
    for d in seen:  # the drawer, a bound method of the read: no layer in sight
        assert getattr(d, "__self__", None).__class__ is AttentionRead
        assert not isinstance(d, torch.nn.Module)
    for name in ("reduce", "mean_output", "sample_output", "log_prior"):
        params = inspect.signature(getattr(AttentionSupport, name)).parameters
        assert "layer" not in params


def test_hf_interface_reads_through_the_attention_read(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from bayesattn.nn.read import AttentionRead

    calls = []
    real = AttentionRead.from_logits

    def spy(self, *args, **kwargs):
        calls.append(self.mode)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(AttentionRead, "from_logits", spy)
    cfg = transformers.BertConfig(hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=16, vocab_size=20, attn_implementation="eager")  # fmt: skip
    bert = hf.convert_hf(transformers.BertModel(cfg).eval(), family="dirichlet")
    ids = torch.randint(0, 20, (2, 4))
    for mode in ("mean", "guide"):
        with attention_mode(mode):
            bert(input_ids=ids)
    assert calls == ["mean", "mean", "guide", "guide"]  # two layers, each call through the read


@pytest.mark.parametrize(
    ("kw", "err", "match"),
    [
        (dict(mode="bogus"), ValueError, "mode must be one of"),
        (dict(mode="mean", dropout_p=1.5), ValueError, r"dropout_p must be in \[0, 1\]; got 1.5"),
        (dict(mode="mean", dropout_p=-0.1), ValueError, "dropout_p must be in"),
        (dict(mode="mean", num_samples=0), ValueError, "num_samples must be a positive int"),
        (dict(mode="mean", num_samples=True), TypeError, "num_samples must be an int"),
        (dict(mode="mean", record=1), TypeError, "record must be a bool"),
        (dict(family="dirichlet", mode="guide"), TypeError, "family must be an instance of"),
        (dict(mode="mean", gp=3), TypeError, "gp must be an instance of SparseGP or None"),
    ],
)
def test_attention_read_checks_its_arguments_at_construction(kw, err, match):
    kw = {"family": None, **kw}
    with pytest.raises(err, match=match):
        AttentionRead(**kw)
