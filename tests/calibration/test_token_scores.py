"""Scores and views for token inputs (bayesattn.calibration.token_scores and
bayesattn.posthoc.token_views), each against a hand computation or a second implementation."""

import math

import pytest
import torch

from bayesattn.calibration.token_scores import (
    combine_scores,
    masked_token_mean,
    mutual_information,
    sequence_mutual_information,
    sequence_surprisal,
    standardise,
    unknown_rate,
)
from bayesattn.nn.networks import TransformerClassifier
from bayesattn.posthoc.features import extract_features
from bayesattn.posthoc.token_views import token_views

X = torch.tensor([[5, 1, 1, 7, 0, 0], [1, 4, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])


def test_unknown_rate():
    assert unknown_rate(X).tolist() == [0.5, 0.5, 0.0]
    assert unknown_rate(X, unk_id=5).tolist() == [0.25, 0.0, 0.0]
    with pytest.raises(ValueError, match="tokens"):
        unknown_rate(X.float())


def test_masked_token_mean():
    states = torch.arange(3 * 6 * 2, dtype=torch.float64).reshape(3, 6, 2)
    m = masked_token_mean(states, X)
    assert torch.equal(m[0], (states[0, 0] + states[0, 3]) / 2)  # 5 and 7; unknowns dropped
    assert torch.equal(m[1], states[1, 1])
    assert torch.equal(m[2], torch.zeros(2))  # nothing to average
    with_unk = masked_token_mean(states, X, unk_id=None)
    assert torch.equal(with_unk[0], states[0, :4].mean(0))
    with pytest.raises(ValueError, match="states"):
        masked_token_mean(states[:, :5], X)


def test_standardise_and_combine():
    ref = torch.tensor([1.0, 2.0, 3.0, 4.0])
    s = torch.tensor([2.5, 4.0])
    sd = math.sqrt(5 / 3)  # the unbiased standard deviation of 1..4
    assert torch.allclose(standardise(s, ref), torch.tensor([0.0, 1.5 / sd], dtype=torch.float64))
    both = combine_scores([s, 10 * s], [ref, 10 * ref + 7])
    expected = standardise(s, ref) + standardise(10 * s, 10 * ref + 7)
    assert torch.allclose(both, expected)
    # standardised on validation: a score's units and offset do not change its weight
    assert torch.allclose(combine_scores([1000 * s + 3], [1000 * ref + 3]), standardise(s, ref))
    with pytest.raises(ValueError, match="reference"):
        standardise(s, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="one length"):
        combine_scores([s], [])
    with pytest.raises(ValueError, match="NaN"):
        standardise(torch.tensor([float("nan")]), ref)


def test_mutual_information():
    agree = torch.tensor([[[0.7, 0.3]], [[0.7, 0.3]]])
    assert float(mutual_information(agree)[0]) == pytest.approx(0.0, abs=1e-12)
    split = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])  # certain members that disagree
    assert float(mutual_information(split)[0]) == pytest.approx(math.log(2))
    p = torch.softmax(torch.randn(4, 5, 3, generator=torch.Generator().manual_seed(0)), -1)
    h = lambda q: -(q * q.log()).sum(-1)  # noqa: E731
    assert torch.allclose(mutual_information(p), (h(p.mean(0)) - h(p).mean(0)).double())


def test_sequence_surprisal():
    lp = torch.log_softmax(torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(1)), -1)
    y = torch.tensor([[2, 5, 0], [0, 0, 0]])
    s = sequence_surprisal(lp, y)
    assert float(s[0]) == pytest.approx(-(float(lp[0, 0, 2]) + float(lp[0, 1, 5])) / 2)
    assert float(s[1]) == 0.0
    with pytest.raises(ValueError, match="log_probs"):
        sequence_surprisal(lp[:, :2], y)


def test_sequence_mutual_information_is_the_positions_mutual_information_averaged():
    g = torch.Generator().manual_seed(2)
    lp = torch.log_softmax(torch.randn(4, 2, 3, 6, generator=g), -1)  # (S, B, T, V)
    y = torch.tensor([[2, 5, 0], [0, 0, 0]])
    got = sequence_mutual_information(lp, y)
    per_pos = mutual_information(lp.exp().reshape(4, 6, 6)).reshape(2, 3)  # (B, T)
    assert float(got[0]) == pytest.approx(float(per_pos[0, :2].mean()), rel=1e-5)
    assert float(got[1]) == 0.0  # all padding
    same = lp[:1].expand(4, -1, -1, -1)  # draws that agree: no disagreement
    assert torch.allclose(sequence_mutual_information(same, y), torch.zeros(2, dtype=torch.float64),
                          atol=1e-6)  # fmt: skip
    with pytest.raises(ValueError, match="log_probs"):
        sequence_mutual_information(lp[0], y)
    with pytest.raises(ValueError, match="log_probs"):
        sequence_mutual_information(lp[:, :, :2], y)
    with pytest.raises(ValueError, match="finite floating-point"):
        sequence_mutual_information(lp.long(), y)
    with pytest.raises(ValueError, match="1 non-finite"):
        sequence_mutual_information(lp.index_put((torch.tensor([0]),) * 4, torch.tensor(float("nan"))), y)


def test_token_views_match_the_network_and_the_read_features():
    torch.manual_seed(0)
    net = TransformerClassifier(3, vocab_size=20, max_len=8, pooling="cls", d_model=16, nhead=2,
                                num_layers=3, dim_feedforward=32).eval()  # fmt: skip
    x = torch.randint(1, 20, (5, 8))
    x[:, 6:] = 0
    v = token_views(net, x, batch_size=2)
    logits, cls, tok = extract_features(net, x)
    assert v.layer_cls.shape == (3, 5, 16) and v.states.shape == (5, 8, 16)
    assert torch.allclose(v.logits, net.forward_logits(x), atol=1e-5)
    assert torch.allclose(v.logits, logits, atol=1e-6) and torch.allclose(v.layer_cls[-1], cls)
    assert torch.allclose(masked_token_mean(v.states, x, unk_id=None), tok, atol=1e-6)
    # the first layer's CLS is the residual stream after layer 0, computed by hand
    layer0 = net.encoder.layers[0]
    h = torch.cat([net.cls.expand(5, 1, -1), net.embed(x)], 1)
    pad = torch.cat([torch.zeros(5, 1, dtype=torch.bool), x == 0], 1)
    with torch.no_grad():
        assert torch.allclose(v.layer_cls[0], layer0(h, src_key_padding_mask=pad)[:, 0], atol=1e-6)
    with pytest.raises(ValueError, match="CLS-pooled"):
        token_views(TransformerClassifier(3, vocab_size=20, d_model=16, nhead=2), x)
