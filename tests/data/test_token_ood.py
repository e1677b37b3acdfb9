"""Token far-OOD sets and corruptions (bayesattn.data.token_ood)."""

import pytest
import torch

from bayesattn.data.token_ood import TOKEN_CORRUPTIONS, corrupt_tokens, token_far_ood_suite

V = 50


def _tokens(n=64, t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(2, V, (n, t), generator=g)
    lengths = torch.randint(3, t + 1, (n,), generator=g)
    x[torch.arange(t)[None, :] >= lengths[:, None]] = 0  # left-aligned, padded at the end
    return x


def test_far_sets_keep_lengths_and_words():
    x = _tokens()
    y = torch.arange(len(x)) % 3
    far = token_far_ood_suite(x, V, seed=1, train=(x, y))
    assert set(far) == {"uniform", "reversed", "permuted", "moments"}
    for k in ("uniform", "reversed", "permuted"):
        assert torch.equal(far[k] == 0, x == 0), k  # the same padding
    n = (x != 0).sum(1)
    assert torch.equal(far["reversed"][0, : n[0]], x[0, : n[0]].flip(0))
    assert torch.equal(far["permuted"].sort(1).values, x.sort(1).values)  # same bag of words
    assert int(far["uniform"][x != 0].min()) >= 2
    m = far["moments"]
    assert m.shape == x.shape and int(m.max()) < V and int(m.min()) >= 0
    lens = (m != 0).sum(1)
    assert set(lens.tolist()) <= set(n.tolist())  # lengths drawn from the training rows
    assert torch.equal((m == 0), torch.arange(x.shape[1])[None, :] >= lens[:, None])
    assert torch.equal(token_far_ood_suite(x, V, 1, (x, y))["moments"], m)


def test_moments_follow_the_class_unigrams():
    x = torch.zeros(200, 10, dtype=torch.long)
    x[:100, :8] = 5  # class 0 says only word 5, class 1 only word 7
    x[100:, :8] = 7
    y = torch.cat([torch.zeros(100), torch.ones(100)]).long()
    m = token_far_ood_suite(x, V, 0, (x, y))["moments"]
    words = m[m != 0]
    assert float(((words == 5) | (words == 7)).float().mean()) > 0.7  # the rest: the +1 smoothing
    rows_5 = (m == 5).sum(1) > (m == 7).sum(1)
    assert 0.3 < float(rows_5.float().mean()) < 0.7


def test_corruptions_by_severity():
    x = _tokens(400, 20)
    words = x != 0
    for kind in TOKEN_CORRUPTIONS:
        changed = []
        for s in (1, 3, 5):
            c = corrupt_tokens(x, kind, s, V, seed=2)
            assert c.shape == x.shape
            changed.append(float((c != x)[words].float().mean()))
        assert changed[0] < changed[1] < changed[2], kind
    c = corrupt_tokens(x, "unknown", 5, V, seed=2)
    assert set(c[c != x].tolist()) == {1}
    assert abs(float((c != x)[words].float().mean()) - 0.5) < 0.05
    t = corrupt_tokens(x, "truncate", 5, V, seed=2)
    assert torch.equal(t[t != 0], x[t != 0]) and bool(((t != 0).sum(1) >= 1).all())


def test_bad_input_raises():
    with pytest.raises(ValueError, match="x must be"):
        token_far_ood_suite(torch.rand(3, 4), V)
    with pytest.raises(ValueError, match="ids must be"):
        corrupt_tokens(torch.full((2, 3), V), "unknown", 1, V)
    with pytest.raises(ValueError, match="kind"):
        corrupt_tokens(_tokens(), "swap", 1, V)
