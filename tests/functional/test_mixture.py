"""The rank-1 mixture maths (bayesattn.functional.mixture) against closed forms and Monte Carlo."""

import math

import pytest
import torch

from bayesattn.functional import mixture as M


def _components(K: int, D: int, spread: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mean = 1.0 + spread * torch.randn(K, D, generator=g, dtype=torch.float64)
    std = 0.05 + 0.2 * torch.rand(K, D, generator=g, dtype=torch.float64)
    return mean, std


def test_rank1_weight_is_diag_s_w_diag_r():
    g = torch.Generator().manual_seed(0)
    W, r, s = torch.randn(3, 4, generator=g), torch.randn(5, 4, generator=g), torch.randn(5, 3, generator=g)
    out = M.rank1_weight(W, r, s)
    assert out.shape == (5, 3, 4)
    for i in range(5):
        torch.testing.assert_close(out[i], torch.diag(s[i]) @ W @ torch.diag(r[i]))
    with pytest.raises(ValueError, match=r"r must be \(\*S, 4\)"):
        M.rank1_weight(W, r[:, :3], s)


def test_component_kl_matches_torch_closed_form():
    mean, std = _components(3, 7, 0.5)
    p = torch.distributions.Normal(torch.tensor(1.0, dtype=torch.float64), 0.7)
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mean, std), p).sum(-1)
    torch.testing.assert_close(M.component_kl(mean, std, 1.0, 0.7), ref)


def test_mixture_log_prob_matches_mixture_same_family():
    mean, std = _components(4, 5, 0.3)
    q = torch.distributions.MixtureSameFamily(
        torch.distributions.Categorical(torch.ones(4, dtype=torch.float64)),
        torch.distributions.Independent(torch.distributions.Normal(mean, std), 1),
    )
    theta = q.sample((11,))
    torch.testing.assert_close(M.mixture_log_prob(theta, mean, std), q.log_prob(theta))


@pytest.mark.parametrize("spread", [0.0, 0.05, 3.0])
def test_kl_bounds_bracket_the_monte_carlo_kl(spread):
    """U - log K <= KL(q||p) <= U: MC agrees within 4 standard errors at both ends (identical
    components: KL = U; far-apart components: KL = U - log K)."""
    K = 4
    mean, std = _components(K, 6, spread)
    if spread == 0.0:
        mean, std = mean[:1].expand(K, -1).clone(), std[:1].expand(K, -1).clone()
    upper, lower = M.mixture_kl_bound(mean, std, 1.0, 0.5)
    assert float(upper - lower) == pytest.approx(math.log(K))
    est, se = M.mixture_kl_mc(mean, std, 1.0, 0.5, num_samples=40000,
                              generator=torch.Generator().manual_seed(1))
    assert float(lower) - 4 * se <= est <= float(upper) + 4 * se
    if spread == 0.0:
        assert est == pytest.approx(float(upper), abs=4 * se + 1e-9)
    if spread == 3.0:  # no overlap: the lower end is reached
        assert est == pytest.approx(float(lower), abs=4 * se + 1e-3)


def test_stratified_draws_layout_and_point_masses():
    mean, std = _components(3, 2, 1.0)
    d = M.stratified_draws(mean, std * 1e-6, 5, torch.Generator().manual_seed(0))
    assert d.shape == (15, 2)
    torch.testing.assert_close(d.reshape(5, 3, 2), mean.expand(5, 3, 2), atol=1e-4, rtol=0)
    torch.testing.assert_close(M.stratified_draws(mean, None, 2), torch.cat([mean, mean]))
    with pytest.raises(ValueError, match="per_component"):
        M.stratified_draws(mean, std, 0)
    with pytest.raises(ValueError, match="std must be finite and > 0"):
        M.component_kl(mean, -std, 1.0, 1.0)
    with pytest.raises(ValueError, match="prior_std"):
        M.component_kl(mean, std, 1.0, 0.0)
