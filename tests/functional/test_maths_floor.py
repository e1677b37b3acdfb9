"""The maths floor refuses nonsense with an error that names the argument (NIW, the mixture KL,
the GP maths), instead of NaN answers or raw torch errors; valid inputs give the same answers
as before (a float lengthscale equals the tensor one, a batched covariance equals its loop)."""

from __future__ import annotations

import pytest
import torch

from bayesattn.functional import gaussian_process as G
from bayesattn.functional import mixture as MX
from bayesattn.functional import niw as N

D64 = torch.float64
nan, inf = float("nan"), float("inf")


def _prior(D: int = 3) -> N.NIW:
    return N.NIW(torch.zeros(D, dtype=D64), 1.0, torch.eye(D, dtype=D64), D + 1.0)


@pytest.mark.parametrize(
    ("scale", "match"),
    [
        (torch.full((2, 2), nan, dtype=D64), "NIW scale must be finite"),
        (torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=D64), "NIW scale must be positive definite"),
        (torch.tensor([[1.0, 0.5], [0.0, 1.0]], dtype=D64), "NIW scale must be symmetric"),
        (-torch.eye(2, dtype=D64), "NIW scale must be positive definite"),
    ],
)
def test_niw_refuses_a_nan_or_non_positive_definite_scale(scale, match):
    with pytest.raises(ValueError, match=match):
        N.NIW(torch.zeros(2, dtype=D64), 1.0, scale, 3.0)


@pytest.mark.parametrize(
    ("kw", "err", "match"),
    [
        (dict(mean=torch.tensor([nan, 0.0], dtype=D64)), ValueError, "NIW mean must be finite"),
        (dict(mean=[0.0, 0.0]), TypeError, "NIW mean must be a torch.Tensor"),
        (dict(kappa="1"), TypeError, "NIW kappa must be a real number"),
        (dict(df=nan), ValueError, "NIW df must be"),
    ],
)
def test_niw_checks_every_argument_at_construction(kw, err, match):
    args = dict(mean=torch.zeros(2, dtype=D64), kappa=1.0, scale=torch.eye(2, dtype=D64), df=3.0)
    with pytest.raises(err, match=match):
        N.NIW(**{**args, **kw})


def test_niw_log_predictive_refuses_a_nan_query_and_keeps_its_answer():
    post = N.niw_posterior(torch.randn(10, 3, dtype=D64), _prior())
    x = torch.randn(4, 3, dtype=D64)
    ok = N.niw_log_predictive(x, post)
    assert bool(torch.isfinite(ok).all())
    x[1, 2] = nan
    with pytest.raises(ValueError, match="x must be finite; got 1 NaN"):
        N.niw_log_predictive(x, post)


def test_huge_features_are_refused_by_name_not_by_cholesky():
    h = torch.full((5, 3), 1e200, dtype=D64)
    h[0] = -1e200
    with pytest.raises(ValueError, match=r"h must have entries of magnitude below .*rescale"):
        N.niw_posterior(h, _prior())
    # large but representable features still work, and the scatter is exact
    h = torch.randn(6, 3, dtype=D64) * 1e100
    post = N.niw_posterior(h, _prior())
    assert bool(torch.isfinite(post.scale).all())


@pytest.mark.parametrize("bad", [True, 2.0, "3"])
def test_niw_sample_num_samples_must_be_an_int(bad):
    with pytest.raises(TypeError, match="num_samples must be an int"):
        N.niw_sample(_prior(), bad)


@pytest.mark.parametrize(
    ("mean", "std", "match"),
    [
        (torch.tensor([[nan, 0.0]]), torch.ones(1, 2), "mean must be finite"),
        (torch.zeros(1, 2), torch.tensor([[inf, 1.0]]), "std must be finite and > 0"),
        (torch.zeros(1, 2), torch.tensor([[nan, 1.0]]), "std must be finite and > 0"),
    ],
)
def test_mixture_kl_bound_refuses_nan_means_and_infinite_stds(mean, std, match):
    with pytest.raises(ValueError, match=match):
        MX.mixture_kl_bound(mean, std)


def test_mixture_kl_bound_refuses_a_nonnumeric_prior():
    with pytest.raises(TypeError, match="prior_std must be a real number"):
        MX.mixture_kl_bound(torch.zeros(1, 2), torch.ones(1, 2), prior_std="1")


def test_whitened_projection_refuses_nan_inputs():
    x, z = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    x[0, 1, 2] = nan
    ones = torch.ones(2)
    with pytest.raises(ValueError, match="x must not contain NaN"):
        G.whitened_projection(x, z, ones, ones)
    z[1, 0, 0] = nan
    with pytest.raises(ValueError, match="inducing must not contain NaN"):
        G.whitened_projection(x.nan_to_num(), z, ones, ones)


def test_gp_maths_name_mismatched_shapes():
    x, z = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    with pytest.raises(ValueError, match=r"lengthscale must be a scalar or broadcast to .*\(2,\)"):
        G.whitened_projection(x, z, torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match="must share G and D"):
        G.whitened_projection(torch.randn(2, 3, 6), z, torch.ones(2), torch.ones(2))
    with pytest.raises(ValueError, match="x1 and x2 must share their last"):
        G.rbf_covariance(torch.randn(3, 4), torch.randn(5, 6), torch.ones(()), torch.ones(()))
    with pytest.raises(ValueError, match="outputscale must be a scalar or broadcast with"):
        G.matern52_covariance(x, z, torch.ones(2), torch.ones(3))
    a, r = G.whitened_projection(x, z, torch.ones(2), torch.ones(2))
    with pytest.raises(ValueError, match=r"q_mean must be \(G, P, M\) = \(2, P, 5\)"):
        G.sparse_gp_marginals(a, r, torch.zeros(2, 3, 4), torch.eye(5).expand(2, 5, 5))
    with pytest.raises(ValueError, match=r"q_scale_tril must be \(G, M, M\)"):
        G.sparse_gp_marginals(a, r, torch.zeros(2, 3, 5), torch.eye(4).expand(2, 4, 4))
    with pytest.raises(ValueError, match=r"weight must be \(R, D\)"):
        G.random_fourier_features(torch.randn(3, 4), torch.randn(8, 5), torch.zeros(8), 1.0, 1.0)


def test_a_python_float_lengthscale_equals_the_tensor_one():
    x, z = torch.randn(3, 4, dtype=D64), torch.randn(5, 4, dtype=D64)
    for cov in (G.rbf_covariance, G.matern52_covariance):
        want = cov(x, z, torch.tensor(0.7, dtype=D64), torch.tensor(1.3, dtype=D64))
        got = cov(x, z, 0.7, 1.3)
        assert got.dtype == D64
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    xg, zg = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    a, r = G.whitened_projection(xg, zg, 0.7, 1.3)
    a2, r2 = G.whitened_projection(xg, zg, torch.full((2,), 0.7), torch.full((2,), 1.3))
    torch.testing.assert_close((a, r), (a2, r2), rtol=0, atol=0)
    # a batched covariance is the loop over its groups (an independent computation)
    ls = torch.tensor([0.5, 2.0])
    both = G.rbf_covariance(xg, zg, ls, torch.ones(2))
    for g in range(2):
        d2 = torch.cdist(xg[g], zg[g]) ** 2
        torch.testing.assert_close(both[g], torch.exp(-0.5 * d2 / ls[g] ** 2), atol=1e-5, rtol=0)
    with pytest.raises(TypeError, match="lengthscale must be a tensor or a real number"):
        G.rbf_covariance(x, z, "1", 1.0)
    with pytest.raises(ValueError, match="lengthscale must be finite and > 0"):
        G.rbf_covariance(x, z, -1.0, 1.0)
