r"""A mixture of Gaussians over rank-1 weight factors, as pure tensor functions (no modules).

A weight matrix :math:`\bar W \in \mathbb R^{O\times I}` is shared; a posterior *component*
:math:`k` rescales it by a rank-1 factor, :math:`W_k = \bar W \circ (s\, r^\top)`, i.e.
:math:`W_k x = s \circ \bar W (r \circ x)` (Dusenberry et al. 2020). The factors
:math:`\theta = (r, s)` of every weight are one vector of ``D`` numbers with

.. math:: q(\theta) = \frac1K \sum_{k=1}^K \mathcal N(\theta;\ \mu_k, \operatorname{diag}\sigma_k^2),
          \qquad p(\theta) = \mathcal N(\theta;\ m_0 \mathbf 1, s_0^2 I).

The KL of a mixture has no closed form. The bound used in the ELBO is the convexity (joint)
bound

.. math:: \mathrm{KL}(q\,\|\,p) \;\le\; \frac1K\sum_k \mathrm{KL}(q_k\,\|\,p) \;=:\; U,

tight when the components coincide; since :math:`H(q) \le \frac1K\sum_k H(q_k) + \log K`,
also :math:`\mathrm{KL}(q\,\|\,p) \ge U - \log K` (tight when the components do not overlap).
:func:`mixture_kl_mc` estimates the exact KL by Monte Carlo, to check both ends.

Shape glossary: ``K`` components, ``D`` factor numbers, ``S`` draws.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .._validation import check_finite, check_positive, check_real

__all__ = [
    "rank1_weight",
    "component_kl",
    "mixture_kl_bound",
    "mixture_log_prob",
    "mixture_kl_mc",
    "stratified_draws",
]


def _check_components(mean: Tensor, std: Tensor | None) -> None:
    if not isinstance(mean, Tensor) or mean.dim() != 2 or mean.shape[0] < 1:
        raise ValueError(
            f"mean must be a (K, D) tensor with K >= 1; got {tuple(getattr(mean, 'shape', ()))}"
        )
    if std is not None:
        if not isinstance(std, Tensor) or std.shape != mean.shape:
            raise ValueError(
                f"std must have mean's shape {tuple(mean.shape)}; got "
                f"{tuple(getattr(std, 'shape', ()))}"
            )
        check_positive("std", std)
    check_finite("mean", mean)


def _check_prior(prior_mean: float, prior_std: float) -> None:
    check_real("prior_mean", prior_mean)
    check_real("prior_std", prior_std, gt=0)


def rank1_weight(weight: Tensor, r: Tensor, s: Tensor) -> Tensor:
    r"""Rank-1 rescaled weights :math:`W = \bar W \circ (s\,r^\top)`, one per leading index.

    Shape:
        weight ``(O, I)``, r ``(*S, I)``, s ``(*S, O)`` → ``(*S, O, I)``.
    """
    if weight.dim() != 2:
        raise ValueError(f"weight must be (O, I); got {tuple(weight.shape)}")
    O, I = weight.shape
    if r.shape[-1] != I or s.shape[-1] != O or r.shape[:-1] != s.shape[:-1]:
        raise ValueError(
            f"r must be (*S, {I}) and s (*S, {O}) with the same leading dims for a weight "
            f"{tuple(weight.shape)}; got r {tuple(r.shape)}, s {tuple(s.shape)}"
        )
    return weight * s.unsqueeze(-1) * r.unsqueeze(-2)  # (*S, O, I)


def component_kl(mean: Tensor, std: Tensor, prior_mean: float, prior_std: float) -> Tensor:
    r""":math:`\mathrm{KL}(\mathcal N(\mu_k, \sigma_k^2)\,\|\,\mathcal N(m_0, s_0^2))` of each
    component, summed over ``D``: :math:`\sum_d \log\frac{s_0}{\sigma_{kd}} +
    \frac{\sigma_{kd}^2 + (\mu_{kd} - m_0)^2}{2 s_0^2} - \frac12`.

    Shape:
        mean, std ``(K, D)`` → ``(K,)``.
    """
    _check_components(mean, std)
    _check_prior(prior_mean, prior_std)
    var_ratio = (std / prior_std) ** 2
    kl = 0.5 * (var_ratio + ((mean - prior_mean) / prior_std) ** 2 - 1.0 - var_ratio.log())
    return kl.sum(-1)  # (K,)


def mixture_kl_bound(
    mean: Tensor, std: Tensor, prior_mean: float = 1.0, prior_std: float = 1.0
) -> tuple[Tensor, Tensor]:
    r"""``(upper, lower)`` bounds on the KL of the equal-weight mixture from the prior:
    :math:`U = \frac1K\sum_k \mathrm{KL}(q_k\|p)` and :math:`U - \log K` (nats, scalars). The
    ELBO charges ``upper`` (so it stays a lower bound on the evidence)."""
    upper = component_kl(mean, std, prior_mean, prior_std).mean()
    return upper, upper - math.log(mean.shape[0])


def mixture_log_prob(theta: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    r""":math:`\log q(\theta) = \operatorname{logsumexp}_k \log\mathcal N(\theta;\mu_k,\sigma_k^2)
    - \log K`.

    Shape:
        theta ``(*S, D)``, mean, std ``(K, D)`` → ``(*S,)``.
    """
    _check_components(mean, std)
    if theta.shape[-1] != mean.shape[-1]:
        raise ValueError(
            f"theta must be (*S, {mean.shape[-1]}); got {tuple(theta.shape)}"
        )
    z = (theta.unsqueeze(-2) - mean) / std  # (*S, K, D)
    comp = (-0.5 * z**2 - std.log() - 0.5 * math.log(2 * math.pi)).sum(-1)  # (*S, K)
    return torch.logsumexp(comp, -1) - math.log(mean.shape[0])


def stratified_draws(
    mean: Tensor,
    std: Tensor | None,
    per_component: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""``per_component`` draws of each component, interleaved: draw ``i`` comes from
    component ``i % K`` (draws ``k, k + K, k + 2K, …`` are component ``k``'s), so
    ``draws.reshape(per_component, K, D)[:, k]`` are component ``k``'s.
    ``std=None`` (point masses): the means themselves, repeated. Reparameterised (gradients
    reach ``mean`` and ``std``).

    Shape:
        mean, std ``(K, D)`` → ``(per_component · K, D)``.
    """
    _check_components(mean, std)
    if not isinstance(per_component, int) or isinstance(per_component, bool) or per_component < 1:
        raise ValueError(f"per_component must be an int >= 1; got {per_component!r}")
    K, D = mean.shape
    base = mean.expand(per_component, K, D)
    if std is None:
        return base.reshape(per_component * K, D)
    eps = torch.randn(
        (per_component, K, D), generator=generator, device=mean.device, dtype=mean.dtype
    )
    return (base + std * eps).reshape(per_component * K, D)  # (m·K, D)


def mixture_kl_mc(
    mean: Tensor,
    std: Tensor,
    prior_mean: float = 1.0,
    prior_std: float = 1.0,
    num_samples: int = 4096,
    generator: torch.Generator | None = None,
) -> tuple[float, float]:
    r"""Monte-Carlo estimate of :math:`\mathrm{KL}(q\|p) = E_q[\log q(\theta) - \log p(\theta)]`
    with stratified draws (``num_samples`` rounded up to a multiple of ``K``) and the standard
    error of the estimate: ``(estimate, standard error)`` in nats."""
    _check_components(mean, std)
    _check_prior(prior_mean, prior_std)
    K = mean.shape[0]
    m = max(1, math.ceil(num_samples / K))
    with torch.no_grad():
        theta = stratified_draws(mean, std, m, generator)  # (m·K, D)
        log_q = mixture_log_prob(theta, mean, std)
        z = (theta - prior_mean) / prior_std
        log_p = (-0.5 * z**2 - math.log(prior_std) - 0.5 * math.log(2 * math.pi)).sum(-1)
        d = (log_q - log_p).reshape(m, K).mean(1)  # per stratum: one draw of each component
    se = float(d.std() / math.sqrt(m)) if m > 1 else float("nan")
    return float(d.mean()), se
