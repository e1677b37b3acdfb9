"""The Laplace evidence and its maximiser (bayesattn.study.laplace_evidence), checked against
the exact evidence of Bayesian linear regression, against laplace-torch's own log marginal
likelihood (Cholesky, not eigenvalues), by finite differences, and in the study's ``laplace``
method (an interior precision, a predictive that differs from the deterministic network's)."""

import math

import pytest
import torch

from bayesattn.study.laplace_evidence import laplace_evidence

F64 = torch.float64


def test_linear_gaussian_evidence_is_exact():
    """y = X θ + ε, ε ~ N(0, I), θ ~ N(0, δ⁻¹ I): at the posterior mean θ* the Laplace evidence
    is log N(y; 0, I + X Xᵀ / δ), in closed form."""
    g = torch.Generator().manual_seed(0)
    n, p = 40, 5
    X = torch.randn(n, p, generator=g, dtype=F64)
    y = X @ torch.randn(p, generator=g, dtype=F64) + torch.randn(n, generator=g, dtype=F64)
    for delta in (0.05, 1.0, 30.0):
        H = X.T @ X  # Hessian of the negative log likelihood (noise variance 1)
        theta = torch.linalg.solve(H + delta * torch.eye(p, dtype=F64), X.T @ y)
        loglik = float(torch.distributions.Normal(X @ theta, 1.0).log_prob(y).sum())
        ev = laplace_evidence(H, theta, loglik)
        cov = torch.eye(n, dtype=F64) + X @ X.T / delta
        exact = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=F64), cov).log_prob(y)
        torch.testing.assert_close(ev.log_evidence(delta), exact, rtol=0, atol=1e-9)


def _evidence_problem():
    g = torch.Generator().manual_seed(1)
    p = 12
    A = torch.randn(p, p, generator=g, dtype=F64)
    H = A @ A.T * torch.linspace(0.01, 5.0, p, dtype=F64)[:, None]  # PSD, not isotropic
    H = 0.5 * (H + H.T)
    theta = torch.randn(p, generator=g, dtype=F64)
    return laplace_evidence(H, theta, -17.0), H, theta


def test_the_maximiser_is_interior_and_macKays_fixed_point():
    ev, _, theta = _evidence_problem()
    d = ev.maximise()
    assert 1e-6 < d < 1e6
    # MacKay: δ* ‖θ‖² = γ(δ*)
    assert math.isclose(d * float(theta @ theta), ev.effective_parameters(d), rel_tol=1e-6)
    # finite differences in log δ: zero slope, lower on both sides, and the dense grid's best
    # point is no grid end
    h = 1e-4
    up, mid, down = (float(ev.log_evidence(d * math.exp(s))) for s in (h, 0.0, -h))
    assert abs((up - down) / (2 * h)) < 1e-6 and up < mid and down < mid
    grid = torch.logspace(-6, 6, 241, dtype=F64)
    best = int(ev.log_evidence(grid).argmax())
    assert 0 < best < len(grid) - 1
    assert float(ev.log_evidence(grid).max()) <= mid + 1e-12


def test_the_slope_matches_finite_differences_away_from_the_optimum():
    ev, _, theta = _evidence_problem()
    for d in (1e-3, 0.3, 40.0):
        h = 1e-5
        fd = (float(ev.log_evidence(d * math.exp(h))) - float(ev.log_evidence(d * math.exp(-h))))
        fd /= 2 * h
        want = 0.5 * (ev.effective_parameters(d) - d * float(theta @ theta))
        assert math.isclose(fd, want, rel_tol=1e-5, abs_tol=1e-8)


def test_it_equals_laplace_torchs_log_marginal_likelihood():
    laplace = pytest.importorskip("laplace")
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    X = torch.randn(60, 6)
    y = (X @ (2 * torch.randn(6, 3)) + 0.5 * torch.randn(60, 3)).argmax(1)
    head = torch.nn.Linear(6, 3)
    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    for _ in range(200):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(X), y).backward()
        opt.step()
    la = laplace.Laplace(head, "classification", subset_of_weights="all",
                         hessian_structure="full")  # fmt: skip
    la.fit(DataLoader(TensorDataset(X, y), batch_size=32))
    ev = laplace_evidence(la.H, la.mean, -float(la.loss))
    for d in (0.1, 1.0, 10.0):
        want = float(la.log_marginal_likelihood(torch.tensor(d)))
        assert math.isclose(float(ev.log_evidence(d)), want, rel_tol=1e-5)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="hessian"):
        laplace_evidence(torch.ones(3, 2), torch.ones(3), 0.0)
    with pytest.raises(ValueError, match="mode"):
        laplace_evidence(torch.eye(3), torch.ones(2), 0.0)
    ev = laplace_evidence(torch.eye(3), torch.ones(3), 0.0)
    with pytest.raises(ValueError, match="prior_precision"):
        ev.log_evidence(0.0)
    with pytest.raises(ValueError, match="interior"):
        laplace_evidence(torch.eye(3), torch.zeros(3), 0.0).maximise()


def test_the_study_laplace_is_interior_and_differs_from_the_deterministic_network():
    pytest.importorskip("laplace")
    from bayesattn.study import StudyConfig, get_method
    from bayesattn.study.runs import Run

    cfg = StudyConfig.quick(epochs=1, progress=False)
    run = Run.load(cfg, "digits", (8, 9), 0)
    la, det = get_method("laplace"), get_method("deterministic")
    f = la.fit(run)
    p = f.params
    assert 0 < p["prior_precision"] < 1e4 and p["prior_precision"] != p["grid_prior_precision"]
    assert 0 < p["effective_params"] < p["num_params"]
    x = run.data.x_test
    torch.manual_seed(0)
    pl = la.predict(f, x)
    pd = det.predict(det.fit(run), x)
    assert float((pl.mean_probs - pd.mean_probs).abs().max()) > 1e-3
    assert float(pl.mutual_information.mean()) > 0
