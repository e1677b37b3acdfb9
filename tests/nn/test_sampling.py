"""The sample count of a layer (:mod:`bayesattn.nn.sampling`): one way in, the ``num_samples``
keyword, whose default a ``with bayesattn.num_samples(S)`` context sets for inputs without sample
dims; leading sample dims already there get one draw each."""

from __future__ import annotations

import pyro
import pytest
import torch

import bayesattn
from bayesattn.nn.attention import BayesianMultiheadAttention
from bayesattn.nn.sampling import layer_num_samples

E, H, B, T = 8, 2, 3, 4


def _seeded(fn):
    torch.manual_seed(1)
    pyro.set_rng_seed(1)
    return fn()


@pytest.fixture
def layer():
    torch.manual_seed(0)
    return BayesianMultiheadAttention(E, H, batch_first=True, family="dirichlet")


def test_layer_num_samples_rule():
    assert layer_num_samples(None, reads_context=True) is None
    assert layer_num_samples(5, reads_context=False) == 5
    with bayesattn.num_samples(3):
        assert layer_num_samples(None, reads_context=True) == 3
        assert layer_num_samples(None, reads_context=False) is None
        assert layer_num_samples(5, reads_context=True) == 5  # the keyword wins
    for bad, err in ((0, ValueError), (1.5, TypeError)):
        with pytest.raises(err, match="num_samples"):
            layer_num_samples(bad, reads_context=True)


def test_context_is_the_keyword_default(layer):
    """``with num_samples(S)`` gives the layer exactly the draws of ``num_samples=S``."""
    x = torch.randn(B, T, E)
    y_kw, w_kw = _seeded(lambda: layer(x, x, x, num_samples=3))
    with bayesattn.num_samples(3):
        y_ctx, w_ctx = _seeded(lambda: layer(x, x, x))
        y_in, _ = _seeded(lambda: layer(x, x, x, num_samples=2))  # the keyword wins
    assert y_kw.shape == (3, B, T, E) and w_kw.shape == (3, B, T, T)
    torch.testing.assert_close(y_ctx, y_kw, atol=0, rtol=0)
    torch.testing.assert_close(w_ctx, w_kw, atol=0, rtol=0)
    assert y_in.shape == (2, B, T, E)


def test_leading_sample_dims_draw_once_per_entry(layer):
    """An input with a leading sample dim gains no new one under the context: each entry is one
    draw (distinct draws of the same example)."""
    x = torch.randn(B, T, E).expand(2, B, T, E)  # (S, B, T, E)
    with bayesattn.num_samples(3):
        y, w = layer(x, x, x)
    assert y.shape == (2, B, T, E) and w.shape == (2, B, T, T)
    assert not torch.equal(w[0], w[1])


def test_deterministic_layer_ignores_the_context():
    """A layer without a family or GP read draws nothing: the context adds no sample dim (the
    keyword still gives S identical copies, so shapes do not depend on the layer)."""
    torch.manual_seed(0)
    m = BayesianMultiheadAttention(E, H, batch_first=True)
    x = torch.randn(B, T, E)
    with bayesattn.num_samples(3):
        y, _ = m(x, x, x)
    assert y.shape == (B, T, E)
    y3, _ = m(x, x, x, num_samples=3)
    assert y3.shape == (3, B, T, E)
    torch.testing.assert_close(y3[2], y, atol=0, rtol=0)
