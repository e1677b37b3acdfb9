"""The moment-matched far-OOD set (bayesattn.data.far_ood.moment_matched): class moments of
the training data, drawn in its class proportions, clipped to its range, seeded."""

import pytest
import torch

from bayesattn.data.far_ood import far_ood_suite, moment_matched


def _two_classes(n=4000):
    g = torch.Generator().manual_seed(0)
    y = (torch.rand(n, generator=g) < 0.25).long()  # class 1: a quarter
    cov = torch.tensor([[1.0, 0.8], [0.8, 1.0]])
    z = torch.randn(n, 2, generator=g) @ torch.linalg.cholesky(cov).T
    x = z + torch.where(y[:, None] == 1, torch.tensor([10.0, -10.0]), torch.tensor([0.0, 0.0]))
    return x.reshape(n, 1, 2), y  # a feature shape of (1, 2)


def test_draws_match_the_class_moments_and_proportions():
    x, y = _two_classes()
    out = moment_matched(x, y, 6000, seed=1)
    assert out.shape == (6000, 1, 2)
    flat = out.reshape(-1, 2)
    one = flat[:, 0] > 5  # the classes are far apart: which class a draw came from
    assert abs(float(one.float().mean()) - float((y == 1).float().mean())) < 0.03
    for mask, mu in ((one, torch.tensor([10.0, -10.0])), (~one, torch.zeros(2))):
        z = flat[mask]
        torch.testing.assert_close(z.mean(0), mu, atol=0.1, rtol=0)
        assert float(torch.corrcoef(z.T)[0, 1]) == pytest.approx(0.8, abs=0.05)
    assert float(flat.min()) >= float(x.min()) and float(flat.max()) <= float(x.max())
    assert torch.equal(moment_matched(x, y, 6000, seed=1), out)
    assert not torch.equal(moment_matched(x, y, 6000, seed=2), out)


def test_the_suite_adds_moments_only_with_training_data():
    x, y = _two_classes(200)
    assert set(far_ood_suite(x, 0)) == {"uniform", "inverted", "permuted"}
    far = far_ood_suite(x[:50], 0, train=(x, y))
    assert far["moments"].shape == (50, 1, 2) and far["moments"].dtype == x.dtype


def test_bad_input_raises():
    x, y = _two_classes(20)
    with pytest.raises(ValueError, match="y must be"):
        moment_matched(x, y[:5], 10)
    with pytest.raises(ValueError, match="y must be"):
        moment_matched(x, y.float(), 10)
    with pytest.raises((ValueError, TypeError), match="n"):
        moment_matched(x, y, 0)
