"""Tests for bayesattn.families against independent references.

References are torch's own distributions and KLs (Dirichlet, Normal, Weibull, Gamma,
ExpRelaxedCategorical), applied row by row to the allowed sub-vector; Monte-Carlo estimates with
tolerances derived from the sampling variance; and numerical integration with SciPy.
Everything precision-sensitive runs in float64; ``conftest.py`` seeds every test.
"""

from __future__ import annotations

import math

import numpy as np
import pyro
import pyro.distributions as pdist
import pytest
import torch
from scipy import integrate, special, stats
from torch.distributions import (
    Dirichlet,
    Gamma,
    Normal,
    Weibull,
    kl_divergence,
)
from torch.distributions.relaxed_categorical import ExpRelaxedCategorical

from bayesattn import functional as BF
from bayesattn.distributions import (
    MaskedConcrete,
    MaskedDirichlet,
    MaskedGamma,
    MaskedNormal,
    MaskedWeibull,
    kl_weibull_gamma,
)
from bayesattn.families import (
    ConcreteWeights,
    DirichletWeights,
    LogisticNormalWeights,
    WeibullWeights,
    get_family,
)

D64 = torch.float64
B, H, TQ, TK = 2, 3, 4, 5
NAMES = ["dirichlet", "logistic_normal", "weibull", "concrete"]


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------


def make_mask(shape=(B, H, TQ, TK)) -> torch.Tensor:
    """Random allowed-mask with: one fully masked row, one row with a single allowed key,
    one fully allowed row, the rest random (at least one allowed key each)."""
    allowed = torch.rand(shape) < 0.7
    allowed[..., 0] |= ~allowed.any(-1)  # ensure >= 1 allowed key before the special rows
    allowed[0, 0, 0] = False  # fully masked row
    allowed[0, 1, 1] = False
    allowed[0, 1, 1, 2] = True  # exactly one allowed key
    allowed[1, 2, 3] = True  # all allowed
    return allowed


def rows(allowed: torch.Tensor):
    """Iterate over row indices of a (..., Tk) mask."""
    return list(np.ndindex(*allowed.shape[:-1]))


def assert_mc_close(est, se, ref, n_se=5.0, slack=0.0):
    """|est - ref| <= n_se * se + slack, elementwise (NumPy or torch)."""
    est, se, ref = (torch.as_tensor(t, dtype=D64) for t in (est, se, ref))
    err = (est - ref).abs()
    bound = n_se * se + slack
    assert bool((err <= bound).all()), (
        f"MC mismatch: max err {err.max().item():.3g}, "
        f"worst err/bound {(err / bound.clamp_min(1e-300)).max().item():.3g}"
    )


def mean_se(x: torch.Tensor, dim: int = 0):
    n = x.shape[dim]
    return x.mean(dim), x.std(dim) / math.sqrt(n)


def log_priors() -> dict[str, torch.Tensor | None]:
    """Log-priors for the family tests: none; PyTorch masks via mask_to_log_prior (incl. a fully
    masked query row and a padded key); a hand-made finite non-uniform prior with -inf entries."""
    attn_mask = torch.zeros(TQ, TK, dtype=torch.bool)
    attn_mask[2] = True  # query 2 may read no key
    attn_mask[0, 3:] = True
    kpm = torch.zeros(B, TK, dtype=torch.bool)
    kpm[1, -1] = True
    from_masks = BF.mask_to_log_prior(
        attn_mask, kpm, batch_size=B, num_heads=H, tgt_len=TQ, src_len=TK, dtype=D64
    )
    g = torch.Generator().manual_seed(123)
    by_hand = torch.randn(B, 1, TQ, TK, generator=g, dtype=D64)
    by_hand[0, 0, 1, :] = -math.inf
    by_hand[1, 0, 0, 1:] = -math.inf  # single allowed key
    by_hand[:, :, 3, 0] = -math.inf
    return {"none": None, "masks": from_masks, "by_hand": by_hand}


LOG_PRIORS = log_priors()


def exact_posterior_ref(logits, log_prior):
    """Bayes' rule written out: prior * likelihood / evidence, 0 for rows with no allowed key."""
    prior = torch.ones_like(logits) if log_prior is None else log_prior.exp().expand_as(logits)
    joint = prior * logits.exp()
    z = joint.sum(-1, keepdim=True)
    return torch.where(z > 0, joint / z.clamp_min(1e-300), torch.zeros_like(joint))


def allowed_ref(logits, log_prior):
    if log_prior is None:
        return torch.ones_like(logits, dtype=torch.bool)
    return (log_prior > -math.inf).expand_as(logits)


def make_family(name, **kw):
    return get_family(name, H, **kw)


# ----------------------------------------------------------------------------------------------
# 1. MaskedDirichlet
# ----------------------------------------------------------------------------------------------


def test_dirichlet_all_allowed_matches_torch():
    a = torch.rand(B, H, TQ, TK, dtype=D64) * 3 + 0.2
    b = torch.rand(B, H, TQ, TK, dtype=D64) * 3 + 0.2
    d, e = MaskedDirichlet(a), MaskedDirichlet(b)
    x = Dirichlet(a).sample()
    torch.testing.assert_close(d.log_prob(x), Dirichlet(a).log_prob(x))
    torch.testing.assert_close(kl_divergence(d, e), kl_divergence(Dirichlet(a), Dirichlet(b)))
    torch.testing.assert_close(d.mean, a / a.sum(-1, keepdim=True))
    assert d.batch_shape == (B, H, TQ) and d.event_shape == (TK,)


def test_dirichlet_masked_matches_torch_on_allowed_subvector():
    allowed = make_mask()
    a = torch.rand(B, H, TQ, TK, dtype=D64) * 3 + 0.2
    b = torch.rand(B, H, TQ, TK, dtype=D64) * 3 + 0.2
    d, e = MaskedDirichlet(a, allowed), MaskedDirichlet(b, allowed)
    x = d.sample()
    lp, kl = d.log_prob(x), kl_divergence(d, e)
    for r in rows(allowed):
        m = allowed[r]
        if not m.any():
            assert lp[r] == 0 and kl[r] == 0
            continue
        ref = Dirichlet(a[r][m]).log_prob(x[r][m])
        torch.testing.assert_close(lp[r], ref)
        torch.testing.assert_close(kl[r], kl_divergence(Dirichlet(a[r][m]), Dirichlet(b[r][m])))
    # log_prob ignores whatever sits at masked keys of the concentration
    a_junk = torch.where(allowed, a, torch.full_like(a, 123.0))
    torch.testing.assert_close(MaskedDirichlet(a_junk, allowed).log_prob(x), lp)


def test_dirichlet_samples_on_masked_simplex_with_correct_mean():
    allowed = make_mask()
    a = torch.rand(B, H, TQ, TK, dtype=D64) * 3 + 0.3
    d = MaskedDirichlet(a, allowed)
    n = 20000
    w = d.sample((n,))
    assert w.shape == (n, B, H, TQ, TK)
    assert bool((w >= 0).all()) and bool((w[:, ~allowed] == 0).all())
    live = allowed.any(-1)
    s = w.sum(-1)
    torch.testing.assert_close(s[:, live], torch.ones_like(s[:, live]))
    assert bool((s[:, ~live] == 0).all())
    # Dirichlet moments over the allowed keys: mean a_j/a0, var a_j(a0-a_j)/(a0^2 (a0+1))
    am = torch.where(allowed, a, torch.zeros_like(a))
    a0 = am.sum(-1, keepdim=True)
    mean = torch.where(live.unsqueeze(-1), am / a0.clamp_min(1e-300), torch.zeros_like(am))
    var = am * (a0 - am) / (a0**2 * (a0 + 1)).clamp_min(1e-300)
    assert_mc_close(w.mean(0), (var / n).sqrt(), mean, slack=1e-12)
    torch.testing.assert_close(d.mean, mean)


def test_dirichlet_rsample_gradient_matches_mean_gradient():
    """Pathwise gradient of E[c·w] w.r.t. the concentration equals d/da (c·a/a0)."""
    allowed = torch.tensor([True, False, True, True, False, True])
    a = torch.tensor([0.7, 2.0, 1.5, 3.0, 0.4, 0.9], dtype=D64)
    c = torch.tensor([1.0, -2.0, 0.5, -1.0, 3.0, 2.0], dtype=D64)
    n = 40000
    leaf = a.repeat(n, 1).requires_grad_()  # one leaf row per sample -> per-sample gradients
    w = MaskedDirichlet(leaf, allowed).rsample()
    (w * c).sum().backward()
    g = leaf.grad
    assert torch.isfinite(g).all() and bool((g[:, ~allowed] == 0).all())
    am = a[allowed]
    a0 = am.sum()
    ref = torch.zeros_like(a)
    ref[allowed] = (c[allowed] - (c[allowed] * am).sum() / a0) / a0
    est, se = mean_se(g)
    assert_mc_close(est, se, ref, slack=1e-12)


# ----------------------------------------------------------------------------------------------
# 2. MaskedNormal
# ----------------------------------------------------------------------------------------------


def test_normal_log_prob_and_kl_match_torch_over_allowed():
    allowed = make_mask()
    mu1, mu2 = torch.randn(2, B, H, TQ, TK, dtype=D64)
    s1, s2 = torch.rand(2, B, H, TQ, TK, dtype=D64) + 0.1
    p, q = MaskedNormal(mu1, s1, allowed), MaskedNormal(mu2, s2, allowed)
    x = torch.randn(B, H, TQ, TK, dtype=D64)
    lp = p.log_prob(x)
    kl = kl_divergence(p, q)
    ref_lp = torch.where(allowed, Normal(mu1, s1).log_prob(x), 0.0).sum(-1)
    ref_kl = torch.where(allowed, kl_divergence(Normal(mu1, s1), Normal(mu2, s2)), 0.0).sum(-1)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(kl, ref_kl)
    dead = ~allowed.any(-1)
    assert bool((lp[dead] == 0).all()) and bool((kl[dead] == 0).all())
    # masked -inf locations are harmless
    mu_inf = torch.where(allowed, mu1, -math.inf)
    torch.testing.assert_close(MaskedNormal(mu_inf, s1, allowed).log_prob(x), lp)
    xs = p.rsample((3,))
    assert xs.shape == (3, B, H, TQ, TK) and torch.isfinite(xs).all()


# ----------------------------------------------------------------------------------------------
# 3. Weibull / Gamma and their closed-form KL
# ----------------------------------------------------------------------------------------------

KL_CASES = [  # (k, lambda, alpha, beta)
    (0.5, 1.3, 0.7, 2.0),
    (2.0, 0.4, 1.5, 0.8),
    (10.0, 0.9, 3.0, 1.2),
    (1.0, 2.0, 2.0, 0.5),
    (2.0, 0.2, 0.3, 5.0),
]


@pytest.mark.parametrize("k, lam, alpha, beta", KL_CASES)
def test_kl_weibull_gamma_matches_monte_carlo(k, lam, alpha, beta):
    t = lambda v: torch.tensor(v, dtype=D64)  # noqa: E731
    q, p = Weibull(t(lam), t(k)), Gamma(t(alpha), t(beta))
    x = q.sample((250_000,)).clamp_min(1e-300)
    est, se = mean_se(q.log_prob(x) - p.log_prob(x))
    kl = kl_weibull_gamma(t(k), t(lam), t(alpha), t(beta))
    assert_mc_close(est, se, kl, n_se=4.0)
    assert kl >= 0


def test_kl_weibull_gamma_matches_quadrature():
    k, lam, alpha, beta = 2.0, 0.7, 1.8, 1.5

    def log_q(x):
        return math.log(k / lam) + (k - 1) * math.log(x / lam) - (x / lam) ** k

    def log_p(x):
        return (
            alpha * math.log(beta) + (alpha - 1) * math.log(x) - beta * x - special.gammaln(alpha)
        )

    def f(x):
        return math.exp(log_q(x)) * (log_q(x) - log_p(x)) if x > 0 else 0.0

    ref, err = integrate.quad(f, 0, np.inf, epsabs=1e-12, epsrel=1e-12, limit=200)
    t = lambda v: torch.tensor(v, dtype=D64)  # noqa: E731
    got = kl_weibull_gamma(t(k), t(lam), t(alpha), t(beta)).item()
    assert err < 1e-9
    assert abs(got - ref) < 1e-6


def test_kl_divergence_dispatches_for_torch_weibull_gamma():
    k = torch.tensor([0.5, 2.0, 10.0], dtype=D64)
    lam = torch.tensor([1.0, 0.3, 2.0], dtype=D64)
    alpha = torch.tensor([0.5, 1.0, 4.0], dtype=D64)
    beta = torch.tensor([2.0, 1.0, 0.5], dtype=D64)
    got = kl_divergence(Weibull(lam, k), Gamma(alpha, beta))
    torch.testing.assert_close(got, kl_weibull_gamma(k, lam, alpha, beta))


def test_masked_weibull_gamma_log_prob_and_kl_match_torch():
    allowed = make_mask()
    k = torch.rand(B, H, TQ, TK, dtype=D64) * 5 + 0.5
    lam = torch.rand(B, H, TQ, TK, dtype=D64) + 0.1
    alpha = torch.rand(B, H, TQ, TK, dtype=D64) * 3 + 0.2
    beta = torch.rand(B, H, TQ, TK, dtype=D64) * 3 + 0.2
    q, p = MaskedWeibull(k, lam, allowed), MaskedGamma(alpha, beta, allowed)
    x = torch.rand(B, H, TQ, TK, dtype=D64) * 2 + 0.01

    ref_q = torch.where(allowed, Weibull(lam, k).log_prob(x), 0.0).sum(-1)
    ref_p = torch.where(allowed, Gamma(alpha, beta).log_prob(x), 0.0).sum(-1)
    torch.testing.assert_close(q.log_prob(x), ref_q)
    torch.testing.assert_close(p.log_prob(x), ref_p)

    kl = kl_divergence(q, p)
    ref_kl = torch.zeros(B, H, TQ, dtype=D64)
    for r in rows(allowed):
        m = allowed[r]
        if m.any():
            ref_kl[r] = kl_divergence(
                Weibull(lam[r][m], k[r][m]), Gamma(alpha[r][m], beta[r][m])
            ).sum()
    torch.testing.assert_close(kl, ref_kl)
    assert bool((kl >= 0).all())
    dead = ~allowed.any(-1)
    assert bool((kl[dead] == 0).all()) and bool((q.log_prob(x)[dead] == 0).all())

    torch.testing.assert_close(q.mean, lam * torch.exp(torch.lgamma(1 + 1 / k)))
    torch.testing.assert_close(p.mean[allowed], (alpha / beta)[allowed])


def test_masked_weibull_and_gamma_samplers_follow_their_laws():
    """Kolmogorov-Smirnov against SciPy's Weibull/Gamma CDFs on one allowed key each."""
    allowed = torch.tensor([True, False, True])
    k = torch.tensor([0.7, 3.0, 4.0], dtype=D64)
    lam = torch.tensor([1.5, 1.0, 0.3], dtype=D64)
    alpha = torch.tensor([0.6, 1.0, 2.5], dtype=D64)
    beta = torch.tensor([1.0, 1.0, 3.0], dtype=D64)
    g = MaskedWeibull(k, lam, allowed).rsample((5000,))
    h = MaskedGamma(alpha, beta, allowed).rsample((5000,))
    for j in (0, 2):
        cdf_w = stats.weibull_min(c=k[j].item(), scale=lam[j].item()).cdf
        cdf_g = stats.gamma(a=alpha[j].item(), scale=1 / beta[j].item()).cdf
        assert stats.kstest(g[:, j].numpy(), cdf_w).pvalue > 1e-3
        assert stats.kstest(h[:, j].numpy(), cdf_g).pvalue > 1e-3
    assert bool((g > 0).all()) and bool((h > 0).all())


# ----------------------------------------------------------------------------------------------
# 4. MaskedConcrete
# ----------------------------------------------------------------------------------------------


def test_concrete_all_allowed_matches_exp_relaxed_categorical():
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    tau = torch.tensor(0.7, dtype=D64)
    d = MaskedConcrete(logits, tau.expand(B, H, TQ, TK))
    ref = ExpRelaxedCategorical(tau, logits=logits)
    x = ref.sample((4,))
    torch.testing.assert_close(d.log_prob(x), ref.log_prob(x))
    y = d.rsample((4,))
    torch.testing.assert_close(d.log_prob(y), ref.log_prob(y))


def test_concrete_masked_samples_and_log_prob_match_on_subvector():
    allowed = make_mask()
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    tau = 0.6
    d = MaskedConcrete(logits, torch.full_like(logits, tau), allowed)
    x = d.rsample((6,))
    live = allowed.any(-1)
    assert torch.isfinite(x).all()
    assert bool((x[:, ~allowed] == 0).all())  # value 0 off the support (weight 0)
    w = torch.where(allowed, x.exp(), torch.zeros_like(x))
    s = w.sum(-1)
    torch.testing.assert_close(s[:, live], torch.ones_like(s[:, live]))
    lp = d.log_prob(x)
    for r in rows(allowed):
        m = allowed[r]
        n = int(m.sum())
        if n == 0:
            assert bool((lp[(slice(None), *r)] == 0).all())
            continue
        if n == 1:
            assert bool((lp[(slice(None), *r)] == 0).all())
            assert bool((x[(slice(None), *r)][:, m] == 0).all())  # w = 1 on the only key
            continue
        ref = ExpRelaxedCategorical(torch.tensor(tau, dtype=D64), logits=logits[r][m])
        torch.testing.assert_close(lp[(slice(None), *r)], ref.log_prob(x[(slice(None), *r)][:, m]))


def test_concrete_is_gumbel_max_in_the_argmax():
    """argmax of an ExpConcrete draw is exactly Categorical(p): the Gumbel-max trick."""
    logits = torch.tensor([0.3, -1.0, 1.2, 0.0], dtype=D64)
    allowed = torch.tensor([True, True, False, True])
    n = 20000
    x = MaskedConcrete(logits, torch.full_like(logits, 2.0), allowed).sample((n,))
    x = x.masked_fill(~allowed, -math.inf)
    onehot = torch.nn.functional.one_hot(x.argmax(-1), 4).to(D64)
    p = BF.posterior_weights(logits, torch.where(allowed, 0.0, -math.inf))
    est, se = onehot.mean(0), (p * (1 - p) / n).sqrt()
    assert_mc_close(est, se, p, slack=1e-12)


# ----------------------------------------------------------------------------------------------
# 5. variational families
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lp_name", list(LOG_PRIORS))
@pytest.mark.parametrize("name", NAMES)
def test_mean_weights_is_exact_posterior(name, lp_name):
    log_prior = LOG_PRIORS[lp_name]
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    fam = make_family(name)
    got = fam.mean_weights(logits, log_prior)
    assert torch.equal(got, BF.posterior_weights(logits, log_prior))
    torch.testing.assert_close(got, exact_posterior_ref(logits, log_prior))
    logits32 = logits.float()
    lp32 = None if log_prior is None else log_prior.float()
    assert torch.equal(fam.mean_weights(logits32, lp32), BF.posterior_weights(logits32, lp32))


@pytest.mark.parametrize("lp_name", list(LOG_PRIORS))
def test_dirichlet_family_posterior_mean_is_exact_posterior(lp_name):
    log_prior = LOG_PRIORS[lp_name]
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    fam = DirichletWeights(H, init_concentration=5.0)
    pbar = exact_posterior_ref(logits, log_prior)
    q = fam.guide(logits, log_prior)
    torch.testing.assert_close(q.mean, pbar)
    n = 20000
    w = fam.to_weights(q.sample((n,)), q.allowed)
    est, se = mean_se(w)
    assert_mc_close(est, se, pbar, slack=1e-12)
    # docstring: Var[w_j] = pbar_j (1 - pbar_j) / (kappa n_i + 1); MC estimate E[(w - pbar)^2]
    # with its own standard error (the draws are heavy-tailed for small concentrations)
    n_i = q.allowed.sum(-1, keepdim=True).to(D64)
    var_ref = pbar * (1 - pbar) / (5.0 * n_i + 1)
    est_var, se_var = mean_se((w - pbar) ** 2)
    assert_mc_close(est_var, se_var, var_ref, slack=1e-12)
    # the prior is Dir(kappa0 n pi): its mean is the normalised prior
    pi = exact_posterior_ref(torch.zeros_like(logits), log_prior)
    torch.testing.assert_close(fam.model(log_prior, logits).mean, pi)


@pytest.mark.parametrize("lp_name", list(LOG_PRIORS))
def test_weibull_family_latent_mean_is_exact_posterior(lp_name):
    log_prior = LOG_PRIORS[lp_name]
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    pbar = exact_posterior_ref(logits, log_prior)
    allowed = allowed_ref(logits, log_prior)
    fam = WeibullWeights(H, init_shape=3.0)
    q = fam.guide(logits, log_prior)
    n = 20000
    g = q.rsample((n,))
    est, se = mean_se(g)
    assert_mc_close(est[allowed], se[allowed], pbar[allowed], slack=1e-12)
    torch.testing.assert_close(q.mean[allowed], pbar[allowed])
    # Gamma prior has mean pi
    pi = exact_posterior_ref(torch.zeros_like(logits), log_prior)
    p = fam.model(log_prior, logits)
    torch.testing.assert_close(p.mean[allowed], pi[allowed])


@pytest.mark.parametrize("lp_name", list(LOG_PRIORS))
def test_weibull_family_normalised_weights_concentrate_for_large_shape(lp_name):
    log_prior = LOG_PRIORS[lp_name]
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    pbar = exact_posterior_ref(logits, log_prior)
    k = 200.0
    fam = WeibullWeights(H, init_shape=k)
    q = fam.guide(logits, log_prior)
    n = 4000
    w = fam.to_weights(q.rsample((n,)), q.allowed)
    est, se = mean_se(w)
    # g_j = pbar_j R_j with E[R]=1 and CV(R) = sqrt(G(1+2/k)/G(1+1/k)^2 - 1) ~ 1.28/k; the ratio
    # g_j / sum g has bias O(CV^2) (delta method); 5 CV^2 is a conservative bound for that bias.
    cv2 = math.exp(math.lgamma(1 + 2 / k) - 2 * math.lgamma(1 + 1 / k)) - 1
    assert_mc_close(est, se, pbar, slack=5 * cv2 + 1e-12)
    assert (est - pbar).abs().max() < 2e-3


@pytest.mark.parametrize("lp_name", list(LOG_PRIORS))
def test_logistic_normal_family_centred_on_exact_posterior(lp_name):
    log_prior = LOG_PRIORS[lp_name]
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    pbar = exact_posterior_ref(logits, log_prior)
    sigma = 0.01
    fam = LogisticNormalWeights(H, init_scale=sigma)
    q = fam.guide(logits, log_prior)
    torch.testing.assert_close(fam.to_weights(q.loc, q.allowed), pbar)
    torch.testing.assert_close(q.scale, torch.full_like(q.scale, sigma), rtol=1e-5, atol=0)
    n = 4000
    w = fam.to_weights(q.rsample((n,)), q.allowed)
    est, se = mean_se(w)
    # E[softmax(mu + s e)] - softmax(mu) = (s^2/2) tr(Hessian) + O(s^4); every Hessian diagonal
    # entry of a softmax component is bounded by 2 in absolute value, so |bias| <= Tk s^2.
    assert_mc_close(est, se, pbar, slack=TK * sigma**2 + 1e-12)


@pytest.mark.parametrize("lp_name", list(LOG_PRIORS))
def test_concrete_family_low_temperature_mean_is_exact_posterior(lp_name):
    log_prior = LOG_PRIORS[lp_name]
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    pbar = exact_posterior_ref(logits, log_prior)
    tau = 0.05
    fam = ConcreteWeights(H, temperature=tau)
    q = fam.guide(logits, log_prior)
    n = 20000
    w = fam.to_weights(q.rsample((n,)), q.allowed)
    est, se = mean_se(w)
    # Gumbel-max: P(argmax = j) = pbar_j exactly, and |E w_j - pbar_j| <= E[1 - w_max]
    # <= sum_l E[exp(-D_l/tau); D_l > 0] where D_l (max of the other perturbed logits minus
    # key l's) is logistic with density <= 1/4, so the bias is <= n_allowed * tau / 4.
    n_allowed = q.allowed.sum(-1, keepdim=True).to(D64)
    slack = n_allowed * tau / 4 + 1e-12
    assert_mc_close(est, se, pbar, slack=slack)
    # and, much tighter than the bound, the mean is already close in practice
    assert (est - pbar).abs().max() < 0.03


@pytest.mark.parametrize("lp_name", list(LOG_PRIORS))
@pytest.mark.parametrize("name", NAMES)
def test_family_weights_are_valid_and_differentiable(name, lp_name):
    log_prior = LOG_PRIORS[lp_name]
    fam = make_family(name)
    logits = (3 * torch.randn(B, H, TQ, TK, dtype=D64)).requires_grad_()
    q = fam.guide(logits, log_prior)
    p = fam.model(log_prior, logits)
    assert q.batch_shape == (B, H, TQ) and q.event_shape == (TK,)
    assert p.batch_shape == (B, H, TQ) and p.event_shape == (TK,)
    allowed = allowed_ref(logits.detach(), log_prior)
    assert torch.equal(q.allowed, allowed) and torch.equal(p.allowed, allowed)
    live = allowed.any(-1)

    z = q.rsample((8,))
    w = fam.to_weights(z, q.allowed)
    assert w.shape == (8, B, H, TQ, TK)
    assert not torch.isnan(w).any() and bool((w >= 0).all())
    assert bool((w[:, ~allowed] == 0).all())
    s = w.sum(-1)
    torch.testing.assert_close(s[:, live], torch.ones_like(s[:, live]))
    assert bool((s[:, ~live] == 0).all())

    kl = fam.kl(q, p, num_samples=4)
    lq = q.log_prob(z)
    assert torch.isfinite(kl).all() and torch.isfinite(lq).all()
    assert bool((kl[~live] == 0).all()) and bool((lq[:, ~live] == 0).all())

    v = torch.randn(B, H, TK, 2, dtype=D64)
    loss = (w @ v).square().sum() + kl.sum() + lq.sum()
    loss.backward()
    assert torch.isfinite(logits.grad).all()
    assert bool((logits.grad.masked_select(~allowed) == 0).all())
    for prm in fam.parameters():
        assert prm.grad is None or torch.isfinite(prm.grad).all()


@pytest.mark.parametrize("lp_name", list(LOG_PRIORS))
@pytest.mark.parametrize("name", ["dirichlet", "logistic_normal", "weibull"])
def test_analytic_kl_is_nonnegative_and_matches_monte_carlo(name, lp_name):
    """Validates log_prob and the closed-form KL together: KL = E_q[log q - log p]."""
    log_prior = LOG_PRIORS[lp_name]
    kw = {
        "dirichlet": dict(init_concentration=4.0, model_concentration=1.5),
        "logistic_normal": dict(init_scale=0.4, model_scale=1.3),
        "weibull": dict(init_shape=3.0, model_concentration=2.0),
    }[name]
    fam = make_family(name, **kw)
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    q, p = fam.guide(logits, log_prior), fam.model(log_prior, logits)
    kl = fam.kl(q, p)
    assert kl.shape == (B, H, TQ) and bool((kl >= 0).all())
    x = q.rsample((20000,))
    est, se = mean_se(q.log_prob(x) - p.log_prob(x))
    assert_mc_close(est, se, kl, slack=1e-9)


def test_concrete_mc_kl_is_nonnegative_on_average():
    log_prior = LOG_PRIORS["masks"]
    fam = ConcreteWeights(H, temperature=0.5, model_temperature=1.0)
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    q, p = fam.guide(logits, log_prior), fam.model(log_prior, logits)
    x = q.rsample((4000,))
    diff = q.log_prob(x) - p.log_prob(x)
    est, se = mean_se(diff)
    assert bool((est >= -5 * se - 1e-12).all())
    kl = fam.kl(q, p, num_samples=4000)
    assert kl.shape == (B, H, TQ) and bool((kl >= -5 * se - 1e-12).all())
    one_key = q.allowed.sum(-1) <= 1  # a point mass (or nothing): KL exactly 0
    assert bool((kl[one_key] == 0).all())


@pytest.mark.parametrize("lp_name", list(LOG_PRIORS))
@pytest.mark.parametrize(
    "name, kw",
    [
        ("dirichlet", dict(init_concentration=1.0, model_concentration=1.0)),
        ("dirichlet", dict(init_concentration=2.5, model_concentration=2.5)),
        ("logistic_normal", dict(init_scale=1.0, model_scale=1.0)),
        ("logistic_normal", dict(init_scale=0.3, model_scale=0.3)),
        ("concrete", dict(temperature=0.7)),
    ],
)
def test_kl_is_zero_when_posterior_equals_prior(name, kw, lp_name):
    log_prior = LOG_PRIORS[lp_name]
    fam = make_family(name, **kw)
    logits = torch.zeros(B, H, TQ, TK, dtype=D64)  # no evidence: posterior = prior
    q, p = fam.guide(logits, log_prior), fam.model(log_prior, logits)
    kl = fam.kl(q, p, num_samples=16)
    torch.testing.assert_close(kl, torch.zeros_like(kl), atol=1e-5, rtol=0)


def test_input_dependent_logistic_normal_scale():
    dh = 6
    fam = get_family("logistic_normal", H, head_dim=dh, input_dependent=True, init_scale=0.5)
    assert fam.scale_weight.shape == (H, dh)
    with torch.no_grad():
        fam.scale_weight.normal_()
        fam.scale_bias.normal_()
    logits = torch.randn(B, H, TQ, TK, dtype=D64)
    query = torch.randn(B, H, TQ, dh, dtype=D64)
    q = fam.guide(logits, LOG_PRIORS["masks"], query)
    u, c = fam.scale_weight.detach().to(D64), fam.scale_bias.detach().to(D64)
    ref = torch.empty(B, H, TQ, dtype=D64)
    for b, h, i in np.ndindex(B, H, TQ):
        ref[b, h, i] = math.log1p(math.exp(float(query[b, h, i] @ u[h] + c[h]))) + 1e-4
    torch.testing.assert_close(q.scale, ref.unsqueeze(-1).expand(B, H, TQ, TK))
    with pytest.raises(ValueError, match="query"):
        fam.guide(logits, None)


def test_logistic_normal_init_scale_is_exact_over_a_wide_range():
    for s in (1e-6, 0.01, 1.0, 30.0, 1000.0):
        fam = LogisticNormalWeights(1, init_scale=s)
        q = fam.guide(torch.zeros(1, 1, 1, 3, dtype=D64))
        torch.testing.assert_close(q.scale, torch.full_like(q.scale, s), rtol=1e-5, atol=0)


# ----------------------------------------------------------------------------------------------
# 6. expand / to_event / pyro plates
# ----------------------------------------------------------------------------------------------


def masked_dists():
    allowed = make_mask()
    pos = lambda: torch.rand(B, H, TQ, TK, dtype=D64) + 0.5  # noqa: E731
    return {
        "dirichlet": MaskedDirichlet(pos(), allowed),
        "normal": MaskedNormal(torch.randn(B, H, TQ, TK, dtype=D64), pos(), allowed),
        "weibull": MaskedWeibull(pos(), pos(), allowed),
        "gamma": MaskedGamma(pos(), pos(), allowed),
        "concrete": MaskedConcrete(torch.randn(B, H, TQ, TK, dtype=D64), pos(), allowed),
    }


@pytest.mark.parametrize("kind", ["dirichlet", "normal", "weibull", "gamma", "concrete"])
def test_expand_and_to_event(kind):
    d = masked_dists()[kind]
    e = d.expand((7,) + d.batch_shape)
    assert type(e) is type(d)
    assert e.batch_shape == (7, B, H, TQ) and e.event_shape == (TK,)
    x = e.sample()
    assert x.shape == (7, B, H, TQ, TK)
    lp = e.log_prob(x)
    assert lp.shape == (7, B, H, TQ)
    torch.testing.assert_close(lp, d.log_prob(x))  # expanding changes nothing per row
    ind = d.to_event(2)
    assert ind.batch_shape == (B,) and ind.event_shape == (H, TQ, TK)
    y = ind.sample()
    torch.testing.assert_close(ind.log_prob(y), d.log_prob(y).sum((-1, -2)))
    assert ind.log_prob(y).shape == (B,)


def test_pyro_plate_broadcasts_masked_distribution():
    allowed = torch.rand(TQ, TK) < 0.7
    allowed[:, 0] = True
    d = MaskedDirichlet(torch.rand(TQ, TK, dtype=D64) + 0.5, allowed)  # batch (Tq,)

    def model():
        with pyro.plate("batch", 7, dim=-2):
            return pyro.sample("w", d)

    tr = pyro.poutine.trace(model).get_trace()
    site = tr.nodes["w"]
    assert site["fn"].batch_shape == (7, TQ)
    assert site["value"].shape == (7, TQ, TK)
    tr.compute_log_prob()
    assert site["log_prob"].shape == (7, TQ) and torch.isfinite(site["log_prob"]).all()
    assert isinstance(d, pdist.TorchDistribution)


# ----------------------------------------------------------------------------------------------
# 7. errors
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: DirichletWeights(2, init_concentration=0.0), "init_concentration"),
        (lambda: DirichletWeights(2, init_concentration=-1.0), "init_concentration"),
        (lambda: DirichletWeights(2, model_concentration=math.inf), "model_concentration"),
        (lambda: LogisticNormalWeights(2, model_scale=0.0), "model_scale"),
        (lambda: LogisticNormalWeights(2, init_scale=-0.5), "init_scale"),
        (lambda: ConcreteWeights(2, temperature=-1.0), "temperature"),
        (lambda: ConcreteWeights(2, model_temperature=0.0), "model_temperature"),
        (lambda: WeibullWeights(2, init_shape=math.nan), "init_shape"),
        (lambda: WeibullWeights(2, model_concentration=0), "model_concentration"),
        (lambda: DirichletWeights(0), "num_heads"),
        (lambda: WeibullWeights(num_heads=0), "num_heads"),
        (lambda: ConcreteWeights(num_heads=1.5), "num_heads"),
        (lambda: LogisticNormalWeights(2, input_dependent=True), "head_dim"),
        (lambda: get_family("logistic_normal", 2, input_dependent=True), "head_dim"),
        (lambda: get_family("dirichlet", 0), "num_heads"),
    ],
)
def test_invalid_hyperparameters_raise_value_error(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_get_family_unknown_name_lists_names():
    with pytest.raises(ValueError) as ei:
        get_family("gaussian", 2)
    msg = str(ei.value)
    assert "gaussian" in msg
    for n in NAMES:
        assert n in msg


def test_get_family_builds_each_family():
    classes = [DirichletWeights, LogisticNormalWeights, WeibullWeights, ConcreteWeights]
    for n, cls in zip(NAMES, classes, strict=True):
        fam = get_family(n, 3)
        assert type(fam) is cls and fam.num_heads == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_allowed_mask_must_be_bool(dtype):
    x = torch.rand(TQ, TK) + 0.5
    bad = torch.ones(TQ, TK, dtype=dtype)
    for make in (
        lambda: MaskedDirichlet(x, bad),
        lambda: MaskedNormal(x, x, bad),
        lambda: MaskedWeibull(x, x, bad),
        lambda: MaskedGamma(x, x, bad),
        lambda: MaskedConcrete(x, x, bad),
    ):
        with pytest.raises(TypeError, match="bool"):
            make()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["dirichlet", "logistic_normal", "weibull", "concrete"])
def test_every_family_samples_in_half_precision(name, dtype):
    """Half and bfloat16 layers draw (the samplers run in float32 where torch has no half
    kernel) weights on the simplex in the layer's dtype, with finite KL and gradients."""
    torch.manual_seed(0)
    from bayesattn import BayesianMultiheadAttention
    from bayesattn.nn import attention_mode, collect_kl

    mha = BayesianMultiheadAttention(8, 2, batch_first=True, family=name).to(dtype)
    x = torch.randn(3, 5, 8, dtype=dtype)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[0, 3:] = True
    with attention_mode("elbo"), collect_kl() as col:
        out, w = mha(x, x, x, key_padding_mask=kpm, average_attn_weights=False)
        kl = col.total()
    assert out.dtype == dtype and w.dtype == dtype
    torch.testing.assert_close(w.float().sum(-1), torch.ones(3, 2, 5), atol=1e-2, rtol=0)
    assert bool((w[0, ..., 3:] == 0).all())  # padded keys get no weight
    assert bool(torch.isfinite(kl).all())
    (out.float().sum() + kl.float().sum()).backward()
    grads = [p.grad for p in mha.parameters() if p.requires_grad]
    assert mha.in_proj_weight.grad is not None
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
