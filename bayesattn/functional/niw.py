r"""The conjugate Normal–inverse-Wishart (NIW) model of one class's features, as pure tensor
functions (no modules).

For features :math:`h_1..h_n \in \mathbb R^D` of one class, :math:`h_i \mid \mu, \Sigma \sim
\mathcal N(\mu, \Sigma)` with the prior :math:`\Sigma \sim \mathcal{IW}(\Psi_0, \nu_0)`,
:math:`\mu \mid \Sigma \sim \mathcal N(\mu_0, \Sigma/\kappa_0)`, the posterior is NIW with

.. math:: \kappa_n = \kappa_0 + n,\quad \nu_n = \nu_0 + n,\quad
          \mu_n = \frac{\kappa_0\mu_0 + n\bar h}{\kappa_n},\quad
          \Psi_n = \Psi_0 + S + \frac{\kappa_0 n}{\kappa_n}(\bar h - \mu_0)(\bar h - \mu_0)^\top,

:math:`S = \sum_i (h_i - \bar h)(h_i - \bar h)^\top`, and the posterior predictive of a new
feature is a multivariate Student-t with :math:`\nu_n - D + 1` degrees of freedom, location
:math:`\mu_n` and shape :math:`\Psi_n (\kappa_n + 1) / (\kappa_n(\nu_n - D + 1))`.

Read as attention: a query (the CLS output) attends over class-memory slots with a Gaussian
kernel; the NIW posterior is a global posterior over what attention writes, and its KL from the
prior has the closed form :func:`niw_kl`.

Everything is float64 (covariances of 32–128 dims are ill-conditioned in float32).
Shape glossary: ``n`` examples of one class, ``D`` feature dim, ``B`` queries, ``S`` draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .._validation import check_finite, check_float_tensor, check_int, check_real, check_spd

__all__ = ["NIW", "niw_posterior", "student_t_log_prob", "student_t_log_prob_batched",
           "niw_predictive", "niw_log_predictive",
           "niw_kl",
           "niw_sample"]  # fmt: skip


@dataclass(frozen=True)
class NIW:
    """Parameters of a Normal–inverse-Wishart: ``mean (D,)``, ``kappa > 0``, ``scale (D, D)``
    (:math:`\\Psi`, symmetric positive definite), ``df > D - 1`` (:math:`\\nu`)."""

    mean: Tensor
    kappa: float
    scale: Tensor
    df: float

    def __post_init__(self) -> None:
        check_float_tensor("NIW mean", self.mean, layout="(D,)")
        check_float_tensor("NIW scale", self.scale, layout="(D, D)")
        D = self.mean.shape[-1] if self.mean.dim() else 0
        if self.mean.dim() != 1 or self.scale.shape != (D, D):
            raise ValueError(
                f"NIW mean must be (D,) and scale (D, D); got mean {tuple(self.mean.shape)}, "
                f"scale {tuple(self.scale.shape)}"
            )
        check_finite("NIW mean", self.mean)
        check_spd("NIW scale", self.scale)
        check_real("NIW kappa", self.kappa, gt=0)
        check_real("NIW df", self.df)
        if not self.df > D - 1:
            raise ValueError(f"NIW df must be > D - 1 = {D - 1}; got {self.df!r}")

    @property
    def dim(self) -> int:
        return int(self.mean.shape[-1])


def niw_posterior(h: Tensor, prior: NIW) -> NIW:
    r"""The NIW posterior given the rows of ``h`` (the closed-form update above).

    Shape:
        h ``(n, D)`` (``n = 0``: the prior itself).
    """
    check_float_tensor("h", h, layout=f"(n, {prior.dim})")
    if h.dim() != 2 or h.shape[1] != prior.dim:
        raise ValueError(f"h must be (n, {prior.dim}); got {tuple(h.shape)}")
    check_finite("h", h)
    n = h.shape[0]
    # the scatter Σ (h - h̄)(h - h̄)ᵀ must not overflow float64 (|h|² · n well below its max)
    big = math.sqrt(torch.finfo(torch.float64).max / (8 * max(n, 1))) / 4
    if n and float((h.double() - prior.mean.double()).abs().max()) > big:
        raise ValueError(
            f"h must have entries of magnitude below {big:.3g} (their scatter overflows float64); "
            f"got max |h| = {float(h.double().abs().max()):.3g}: rescale the features"
        )
    if n == 0:
        return prior
    h = h.double()
    mu0, psi0 = prior.mean.double(), prior.scale.double()
    mean = h.mean(0)  # (D,)
    c = h - mean
    S = c.T @ c  # (D, D)
    kn = prior.kappa + n
    d = (mean - mu0)[:, None]  # (D, 1)
    scale = psi0 + S + (prior.kappa * n / kn) * (d @ d.T)
    scale = 0.5 * (scale + scale.T)  # exactly symmetric
    return NIW((prior.kappa * mu0 + n * mean) / kn, kn, scale, prior.df + n)


def student_t_log_prob(x: Tensor, loc: Tensor, scale_tril: Tensor, df: float) -> Tensor:
    r"""Log density of a multivariate Student-t with shape :math:`LL^\top`:

    .. math:: \log\Gamma(\tfrac{\nu+D}{2}) - \log\Gamma(\tfrac\nu2) - \tfrac D2\log(\nu\pi)
              - \log|L| - \tfrac{\nu+D}{2}\log\big(1 + \lVert L^{-1}(x-\mu)\rVert^2/\nu\big).

    Shape:
        x ``(B, D)``, loc ``(D,)``, scale_tril ``(D, D)`` → ``(B,)``.
    """
    D = loc.shape[-1]
    z = torch.linalg.solve_triangular(scale_tril, (x.double() - loc).T, upper=False)  # (D, B)
    maha = (z * z).sum(0)  # (B,)
    logdet = torch.log(torch.diagonal(scale_tril)).sum()
    return (
        math.lgamma((df + D) / 2) - math.lgamma(df / 2) - 0.5 * D * math.log(df * math.pi)
        - logdet - 0.5 * (df + D) * torch.log1p(maha / df)
    )  # fmt: skip


def student_t_log_prob_batched(x: Tensor, loc: Tensor, scale_tril: Tensor, df: Tensor) -> Tensor:
    r""":func:`student_t_log_prob` of every row of ``x`` under each of ``C`` Student-t
    distributions at once (one batched triangular solve).

    Shape:
        x ``(B, D)``, loc ``(C, D)``, scale_tril ``(C, D, D)``, df ``(C,)`` → ``(B, C)``.
    """
    D = loc.shape[-1]
    diff = (x.unsqueeze(0) - loc.unsqueeze(1)).transpose(-1, -2)  # (C, D, B)
    z = torch.linalg.solve_triangular(scale_tril, diff, upper=False)  # (C, D, B)
    maha = (z * z).sum(-2)  # (C, B)
    logdet = torch.log(torch.diagonal(scale_tril, dim1=-2, dim2=-1)).sum(-1)  # (C,)
    const = (torch.lgamma((df + D) / 2) - torch.lgamma(df / 2)
             - 0.5 * D * torch.log(df * math.pi) - logdet)  # (C,)  # fmt: skip
    lp = const[:, None] - 0.5 * (df + D)[:, None] * torch.log1p(maha / df[:, None])  # (C, B)
    return lp.T  # (B, C)


def niw_predictive(post: NIW) -> tuple[Tensor, Tensor, float]:
    """The Student-t posterior predictive's ``(loc (D,), scale_tril (D, D), df)``: location
    :math:`\\mu_n`, a Cholesky factor of :math:`\\Psi_n(\\kappa_n + 1)/(\\kappa_n(\nu_n - D + 1))`
    and :math:`\nu_n - D + 1` degrees of freedom."""
    D = post.dim
    df = post.df - D + 1
    shape = post.scale * (post.kappa + 1) / (post.kappa * df)
    return post.mean, torch.linalg.cholesky(shape), df


def niw_log_predictive(x: Tensor, post: NIW) -> Tensor:
    """Log posterior-predictive density of each row of ``x`` (the Student-t above).

    Shape:
        x ``(B, D)`` → ``(B,)``.
    """
    check_float_tensor("x", x, layout=f"(B, {post.dim})")
    if x.dim() != 2 or x.shape[1] != post.dim:
        raise ValueError(f"x must be (B, {post.dim}); got {tuple(x.shape)}")
    check_finite("x", x)
    loc, tril, df = niw_predictive(post)
    return student_t_log_prob(x, loc, tril, df)


def _mvdigamma(a: float, D: int) -> float:
    return float(sum(torch.special.digamma(torch.tensor(a + (1 - i) / 2, dtype=torch.float64))
                     for i in range(1, D + 1)))  # fmt: skip


def niw_kl(q: NIW, p: NIW) -> float:
    r""":math:`\mathrm{KL}(q\,\|\,p)` of two NIW distributions, in nats (closed form):

    .. math:: \mathrm{KL} = \mathrm{KL}\big(\mathcal W(\Psi_q^{-1}, \nu_q)\,\|\,
              \mathcal W(\Psi_p^{-1}, \nu_p)\big) + \tfrac12\Big(D\big(\tfrac{\kappa_p}{\kappa_q}
              - 1 + \log\tfrac{\kappa_q}{\kappa_p}\big) + \kappa_p\nu_q (\mu_q - \mu_p)^\top
              \Psi_q^{-1}(\mu_q - \mu_p)\Big),

    the Wishart part over the precision :math:`\Sigma^{-1}` (the KL does not depend on the
    parameterisation) being :math:`\tfrac{\nu_p}2(\log|\Psi_q| - \log|\Psi_p|) +
    \tfrac{\nu_q}2(\operatorname{tr}\Psi_p\Psi_q^{-1} - D) + \log\Gamma_D(\tfrac{\nu_p}2) -
    \log\Gamma_D(\tfrac{\nu_q}2) + \tfrac{\nu_q - \nu_p}2\psi_D(\tfrac{\nu_q}2)`.
    """
    if q.dim != p.dim:
        raise ValueError(f"q and p must have the same dim; got {q.dim} and {p.dim}")
    D = q.dim
    Lq = torch.linalg.cholesky(q.scale.double())
    Lp = torch.linalg.cholesky(p.scale.double())
    logdet_q = 2 * torch.log(torch.diagonal(Lq)).sum()
    logdet_p = 2 * torch.log(torch.diagonal(Lp)).sum()
    trace = torch.cholesky_solve(p.scale.double(), Lq).diagonal().sum()  # tr(Ψq⁻¹ Ψp)
    lg = torch.special.multigammaln
    wishart = (
        0.5 * p.df * (logdet_q - logdet_p) + 0.5 * q.df * (trace - D)
        + lg(torch.tensor(p.df / 2, dtype=torch.float64), D)
        - lg(torch.tensor(q.df / 2, dtype=torch.float64), D)
        + 0.5 * (q.df - p.df) * _mvdigamma(q.df / 2, D)
    )  # fmt: skip
    d = (q.mean.double() - p.mean.double())[:, None]  # (D, 1)
    maha = (d.T @ torch.cholesky_solve(d, Lq)).squeeze()
    normal = 0.5 * (
        D * (p.kappa / q.kappa - 1 + math.log(q.kappa / p.kappa)) + p.kappa * q.df * maha
    )
    return float(wishart + normal)


def niw_sample(
    post: NIW, num_samples: int, generator: torch.Generator | None = None
) -> tuple[Tensor, Tensor]:
    r"""``S`` draws :math:`(\mu_s, L_s)` with :math:`\Sigma_s = L_s L_s^\top`:
    :math:`\Sigma_s^{-1} \sim \mathcal W(\Psi^{-1}, \nu)` (Bartlett decomposition),
    :math:`\mu_s \sim \mathcal N(\mu, \Sigma_s/\kappa)`.

    Shape:
        → mean ``(S, D)``, scale_tril ``(S, D, D)``.
    """
    check_int("num_samples", num_samples, 1)
    D, S = post.dim, num_samples
    dt, dev = torch.float64, post.mean.device
    # Bartlett: Λ = (C A)(C A)ᵀ with C Cᵀ = Ψ⁻¹, A lower, A_ii² ~ χ²(ν - i + 1), A_ij ~ N(0, 1)
    psi_inv = torch.cholesky_inverse(torch.linalg.cholesky(post.scale.double()))
    Cl = torch.linalg.cholesky(psi_inv)  # (D, D)
    chi2_df = torch.tensor([post.df - i for i in range(D)], dtype=dt, device=dev)  # (D,)
    gamma = torch.distributions.Gamma(chi2_df / 2, torch.full_like(chi2_df, 0.5))
    diag = gamma.sample((S,)).sqrt() if generator is None else _gamma_with(gamma, S, generator)
    A = torch.tril(torch.randn((S, D, D), generator=generator, dtype=dt, device=dev), -1)
    A = A + torch.diag_embed(diag)  # (S, D, D)
    prec_tril = Cl @ A  # Λ_s = prec_tril prec_trilᵀ, (S, D, D)
    # Σ_s = Λ_s⁻¹: a lower factor of Σ from the upper-triangular inverse of prec_trilᵀ
    eye = torch.eye(D, dtype=dt, device=dev).expand(S, D, D)
    inv_t = torch.linalg.solve_triangular(prec_tril.transpose(-1, -2), eye, upper=True)
    sigma = inv_t @ inv_t.transpose(-1, -2)
    tril = torch.linalg.cholesky(0.5 * (sigma + sigma.transpose(-1, -2)))
    eps = torch.randn((S, D, 1), generator=generator, dtype=dt, device=dev)
    mean = post.mean.double() + (tril @ eps).squeeze(-1) / math.sqrt(post.kappa)
    return mean, tril


def _gamma_with(gamma: torch.distributions.Gamma, S: int, generator: torch.Generator) -> Tensor:
    """Gamma draws from ``generator`` (torch's Gamma has no generator argument): the global
    generator is reseeded from ``generator`` inside a forked RNG state."""
    seed = int(torch.randint(0, 2**62, (), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return gamma.sample((S,)).sqrt()
