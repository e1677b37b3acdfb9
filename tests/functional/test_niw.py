"""The Normal-inverse-Wishart maths (bayesattn.functional.niw) against independent computations:
sequential vs batch conjugate updates, the Student-t predictive vs a Monte-Carlo average of
Gaussians under posterior draws, and the closed-form KL vs Monte Carlo with torch's Wishart."""

import math

import pytest
import torch

from bayesattn.functional import niw as N


def _prior(D: int = 3) -> N.NIW:
    g = torch.Generator().manual_seed(0)
    A = torch.randn(D, D, generator=g, dtype=torch.float64)
    return N.NIW(torch.randn(D, generator=g, dtype=torch.float64), 0.7, A @ A.T + D * torch.eye(D, dtype=torch.float64), D + 2.5)


def _data(n: int, D: int = 3, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=g, dtype=torch.float64) * torch.tensor([1.0, 2.0, 0.5][:D]) + 0.3


def test_posterior_is_conjugate_sequential_equals_batch():
    p, h = _prior(), _data(40)
    both = N.niw_posterior(h, p)
    seq = N.niw_posterior(h[25:], N.niw_posterior(h[:25], p))
    torch.testing.assert_close(both.mean, seq.mean)
    torch.testing.assert_close(both.scale, seq.scale)
    assert (both.kappa, both.df) == pytest.approx((seq.kappa, seq.df))
    assert N.niw_posterior(h[:0], p) is p


def test_student_t_matches_torch_for_one_dim_and_mvn_limit():
    x = torch.linspace(-3, 3, 7, dtype=torch.float64)[:, None]
    ref = torch.distributions.StudentT(5.0, 0.2, 1.5).log_prob(x[:, 0])
    lp = N.student_t_log_prob(x, torch.tensor([0.2], dtype=torch.float64), torch.tensor([[1.5]], dtype=torch.float64), 5.0)
    torch.testing.assert_close(lp, ref)
    L = torch.tensor([[1.0, 0.0], [0.5, 2.0]], dtype=torch.float64)
    xs = torch.randn(5, 2, dtype=torch.float64)
    mvn = torch.distributions.MultivariateNormal(torch.zeros(2, dtype=torch.float64), scale_tril=L)
    torch.testing.assert_close(N.student_t_log_prob(xs, torch.zeros(2, dtype=torch.float64), L, 1e7),
                               mvn.log_prob(xs), atol=1e-5, rtol=0)


def test_predictive_equals_average_gaussian_under_posterior_draws():
    """p(x | data) = E_{(mu, Sigma) ~ NIW posterior} N(x; mu, Sigma): checks the sampler and the
    Student-t predictive against each other."""
    post = N.niw_posterior(_data(12), _prior())
    mean, tril = N.niw_sample(post, 20000, torch.Generator().manual_seed(3))
    x = torch.tensor([[0.3, 0.3, 0.3], [1.5, -2.0, 0.8]], dtype=torch.float64)
    comp = torch.distributions.MultivariateNormal(mean, scale_tril=tril).log_prob(x[:, None, :])  # (2, S)
    mc = torch.logsumexp(comp, -1) - math.log(mean.shape[0])
    torch.testing.assert_close(mc, N.niw_log_predictive(x, post), atol=0.03, rtol=0)


def test_kl_closed_form_matches_monte_carlo():
    p = _prior()
    q = N.niw_posterior(_data(8), p)
    V = torch.cholesky_inverse(torch.linalg.cholesky(q.scale))
    W = torch.distributions.Wishart(df=torch.tensor(q.df, dtype=torch.float64), covariance_matrix=V)
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    lam = W.sample((20000,))  # precisions (S, D, D)
    L = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(lam)))
    mu = q.mean + (L @ torch.randn(20000, 3, 1, generator=g, dtype=torch.float64)).squeeze(-1) / math.sqrt(q.kappa)

    def log_density(d: N.NIW) -> torch.Tensor:
        Vd = torch.cholesky_inverse(torch.linalg.cholesky(d.scale))
        wd = torch.distributions.Wishart(df=torch.tensor(d.df, dtype=torch.float64), covariance_matrix=Vd)
        normal = torch.distributions.MultivariateNormal(d.mean, precision_matrix=d.kappa * lam)
        return wd.log_prob(lam) + normal.log_prob(mu)

    diff = log_density(q) - log_density(p)
    est, se = float(diff.mean()), float(diff.std() / math.sqrt(len(diff)))
    assert N.niw_kl(q, p) == pytest.approx(est, abs=4 * se + 1e-3)
    assert N.niw_kl(p, p) == pytest.approx(0.0, abs=1e-9)


def test_bad_inputs_are_named():
    p = _prior()
    with pytest.raises(ValueError, match="df must be > D - 1"):
        N.NIW(p.mean, 1.0, p.scale, 1.0)
    with pytest.raises(ValueError, match="kappa"):
        N.NIW(p.mean, 0.0, p.scale, 5.0)
    with pytest.raises(ValueError, match=r"h must be \(n, 3\)"):
        N.niw_posterior(torch.zeros(4, 2), p)
    with pytest.raises(ValueError, match="NaN"):
        N.niw_posterior(torch.full((2, 3), float("nan")), p)
