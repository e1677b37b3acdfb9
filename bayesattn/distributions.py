r"""Distributions over attention weights with masked keys, and their KLs.

Every distribution here is over the weights (or an unnormalised or log version of them) of a row of
attention, :math:`w_i \in \Delta^{T_k-1}`: ``batch_shape (..., Tq)`` and ``event_shape (Tk,)``.
Its ``allowed`` mask (bool, broadcastable to the parameters) marks the keys inside the support:
masked keys (:math:`\pi_{ij}=0`) get weight exactly 0 and contribute nothing to log-densities or
KLs, so a row is a distribution over its *allowed* keys only; a row with no allowed key has zero
weights and zero log-density.

* :class:`MaskedDirichlet` (reparameterised Gamma draws), :class:`MaskedNormal` (the logistic
  normal's Gaussian), :class:`MaskedWeibull` and :class:`MaskedGamma` (the Weibull guide and Gamma
  weight model of Bayesian attention modules), :class:`MaskedConcrete` (the log-weights of a
  relaxed categorical);
* closed-form KLs registered with :func:`torch.distributions.kl.register_kl`: Dirichlet–Dirichlet,
  Normal–Normal and Weibull–Gamma (:func:`kl_weibull_gamma`, also for torch's own ``Weibull`` and
  ``Gamma``).

The variational families built from them are in :mod:`bayesattn.families`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from pyro.distributions.torch_distribution import TorchDistribution
from torch import Tensor
from torch.distributions import Distribution, constraints
from torch.distributions.kl import register_kl

__all__ = [
    "MaskedDirichlet",
    "MaskedNormal",
    "MaskedWeibull",
    "MaskedGamma",
    "MaskedConcrete",
    "kl_weibull_gamma",
    "EULER_GAMMA",
]

EULER_GAMMA = 0.5772156649015329
#: a shape argument as torch.distributions takes it
_Shape = torch.Size | list[int] | tuple[int, ...]
#: dtypes drawn in float32 and renormalised (few mantissa bits)
LOW_PRECISION = (torch.float16, torch.bfloat16)


def tiny(x: Tensor) -> float:
    """The smallest positive normal number of ``x``'s dtype (a floor for normalisers)."""
    return torch.finfo(x.dtype).tiny


def check_kl_shapes(p: Distribution, q: Distribution) -> None:
    """Both distributions must be over the same keys (``event_shape (Tk,)``) and broadcast."""
    if p.event_shape != q.event_shape:
        raise ValueError(
            f"KL between distributions over different key sets: event shapes (Tk,) "
            f"{tuple(p.event_shape)} vs {tuple(q.event_shape)}"
        )
    try:
        torch.broadcast_shapes(p.batch_shape, q.batch_shape)
    except RuntimeError:
        raise ValueError(
            f"KL between distributions of batch shapes {tuple(p.batch_shape)} and "
            f"{tuple(q.batch_shape)} that do not broadcast"
        ) from None


def _in_place_ok(draw: Tensor, *params: Tensor) -> bool:
    """Whether ``draw`` may be finished in place with ``params``: no autograd graph (grad mode
    off, or no parameter requires a gradient) and no type promotion (every parameter of the
    draw's dtype). The same kernels, bit for bit, without a fresh buffer per step (at
    ``(S, B, H, Tq, Tk)`` the allocations and their page faults cost as much as the arithmetic)."""
    if any(p.dtype != draw.dtype for p in params):
        return False
    return not torch.is_grad_enabled() or not any(p.requires_grad for p in params)


def _sampling_dtype(x: Tensor) -> torch.dtype:
    """float32 for half/bfloat16 (torch has no half Gamma sampler on CPU, and their few mantissa
    bits would leave normalised draws visibly off the simplex), else ``x``'s dtype."""
    return torch.float32 if x.dtype in LOW_PRECISION else x.dtype


class _Masked(TorchDistribution):
    """Base: factors over allowed keys; ``allowed`` is a bool tensor broadcastable to the params."""

    _param_names: tuple[str, ...] = ()
    support: constraints.Constraint = constraints.real_vector  # refined by subclasses

    def _init(
        self,
        allowed: Tensor | None,
        *params: Tensor,
        validate_args: bool | None = None,
    ) -> None:
        shape = torch.broadcast_shapes(*(p.shape for p in params))
        # allowed=None: every key allowed; a free expanded view and no masking work at all
        self._all = allowed is None
        if allowed is None:
            allowed = torch.ones((), dtype=torch.bool, device=params[0].device).expand(shape)
        if allowed.dtype != torch.bool:
            raise TypeError(f"allowed must be a bool tensor; got {allowed.dtype}")
        shape = torch.broadcast_shapes(shape, allowed.shape)
        self.allowed = allowed.expand(shape)
        if len(shape) < 1:
            raise ValueError("parameters need at least one (key) dim")

    def _finish(self, validate_args: bool | None) -> None:
        shape = self.allowed.shape
        super().__init__(shape[:-1], shape[-1:], validate_args=validate_args)

    def expand(self, batch_shape: _Shape, _instance: Any = None) -> _Masked:
        batch_shape = torch.Size(batch_shape)
        full = batch_shape + self.event_shape
        kwargs = {n: self._expand_param(n, full) for n in self._param_names}
        allowed = None if self._all else self.allowed.expand(full)
        # the parameters were validated (or built valid) already: no second pass over them
        build: Callable[..., _Masked] = type(self)  # subclasses take parameters by name, allowed=
        return build(**kwargs, **self._extra_kwargs(), allowed=allowed, validate_args=False)

    def _extra_kwargs(self) -> dict:
        return {}

    def _expand_param(self, name: str, shape: torch.Size) -> Tensor:
        return getattr(self, name).expand(shape)

    def _keep(self, x: Tensor, fill: float) -> Tensor:
        """``x`` on allowed keys, ``fill`` elsewhere."""
        return x if self._all else torch.where(self.allowed, x, fill)

    def _mask_sum(self, x: Tensor) -> Tensor:
        return self._keep(x, 0.0).sum(-1)

    @property
    def n_allowed(self) -> Tensor:
        if self._all:
            return torch.full(
                self.allowed.shape[:-1], self.allowed.shape[-1], device=self.allowed.device
            )
        return self.allowed.sum(-1)

    def _rowwise(self, x: Tensor, fill: float) -> Tensor:
        """``x`` for rows with an allowed key, ``fill`` for rows with none."""
        return x if self._all else torch.where(self.n_allowed > 0, x, fill)


class MaskedDirichlet(_Masked):
    r"""Dirichlet over the allowed keys of each row: :math:`w_M \sim \mathrm{Dir}(\alpha_M)`, :math:`w_{\bar M} = 0`.

    Sampled by normalising independent :math:`\mathrm{Gamma}(\alpha_j, 1)` draws over allowed keys
    (exact, reparameterised).
    """

    arg_constraints = {"concentration": constraints.positive}
    support = constraints.simplex
    has_rsample = True
    _param_names = ("concentration",)

    def __init__(
        self,
        concentration: Tensor,
        allowed: Tensor | None = None,
        validate_args: bool | None = None,
    ) -> None:
        self._init(allowed, concentration, validate_args=validate_args)
        self.concentration = concentration.expand(self.allowed.shape)
        self._finish(validate_args)

    @property
    def _safe_conc(self) -> Tensor:
        return self._keep(self.concentration, 1.0)

    def rsample(self, sample_shape: _Shape = torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        conc = self._safe_conc
        g = torch._standard_gamma(conc.to(_sampling_dtype(conc)).expand(shape))  # (*S,…,Tq,Tk)
        g = self._keep(g, 0.0)  # torch floors its Gamma draws at tiny: g > 0 on allowed keys
        tot = g.sum(-1, keepdim=True).clamp_min(tiny(g))  # (*S, …, Tq, 1)
        w = g.div_(tot) if _in_place_ok(g, tot) else g / tot  # >= 0: no clamp needed
        return w.to(conc.dtype)

    @property
    def _safe_total(self) -> Tensor:
        a0 = self._mask_sum(self._safe_conc)  # (..., Tq)
        return self._rowwise(a0, 1.0)

    def log_prob(self, value: Tensor) -> Tensor:
        a = self._safe_conc
        logw = value.clamp_min(tiny(value)).log()
        lp = (
            torch.lgamma(self._safe_total)
            - self._mask_sum(torch.lgamma(a))
            + self._mask_sum((a - 1.0) * logw)
        )
        return self._rowwise(lp, 0.0)

    @property
    def mean(self) -> Tensor:
        a = self._keep(self.concentration, 0.0)
        return a / a.sum(-1, keepdim=True).clamp_min(tiny(a))


@register_kl(MaskedDirichlet, MaskedDirichlet)
def _kl_masked_dirichlet(p: MaskedDirichlet, q: MaskedDirichlet) -> Tensor:
    r""":math:`\mathrm{KL} = \log\Gamma(a_0) - \sum\log\Gamma(a_j) - \log\Gamma(b_0) + \sum\log\Gamma(b_j)
    + \sum (a_j - b_j)(\psi(a_j) - \psi(a_0))` over allowed keys."""
    check_kl_shapes(p, q)
    a, b = p._safe_conc, q._safe_conc
    a0, b0 = p._safe_total, q._safe_total
    t = torch.lgamma(a0) - torch.lgamma(b0)
    t = t + p._mask_sum(torch.lgamma(b) - torch.lgamma(a))
    t = t + p._mask_sum((a - b) * (torch.digamma(a) - torch.digamma(a0).unsqueeze(-1)))
    return p._rowwise(t, 0.0)


class MaskedNormal(_Masked):
    r"""Independent normals over allowed keys (the logits of a logistic-normal)."""

    arg_constraints = {"loc": constraints.real, "scale": constraints.positive}
    support = constraints.real_vector
    has_rsample = True
    _param_names = ("loc", "scale")

    def __init__(
        self,
        loc: Tensor,
        scale: Tensor,
        allowed: Tensor | None = None,
        validate_args: bool | None = None,
    ):
        self._init(allowed, loc, scale, validate_args=validate_args)
        self.loc = self._keep(loc.expand(self.allowed.shape), 0.0)
        self.scale = scale.expand(self.allowed.shape)
        self._finish(validate_args)

    def rsample(self, sample_shape: _Shape = torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        eps = torch.randn(shape, dtype=self.loc.dtype, device=self.loc.device)
        if _in_place_ok(eps, self.loc, self.scale):
            return torch.addcmul(self.loc, self.scale, eps, out=eps)  # into ε's buffer
        return torch.addcmul(self.loc, self.scale, eps)  # loc + scale·ε in one pass

    def log_prob(self, value: Tensor) -> Tensor:
        z = (value - self.loc) / self.scale
        lp = -0.5 * z * z - self.scale.log() - 0.5 * math.log(2 * math.pi)
        return self._mask_sum(lp)

    @property
    def mean(self) -> Tensor:
        return self.loc


@register_kl(MaskedNormal, MaskedNormal)
def _kl_masked_normal(p: MaskedNormal, q: MaskedNormal) -> Tensor:
    check_kl_shapes(p, q)
    var_ratio = (p.scale / q.scale).pow(2)
    t = ((p.loc - q.loc) / q.scale).pow(2)
    return p._mask_sum(0.5 * (var_ratio + t - 1 - var_ratio.log()))


def weibull_mean_factor(k: Tensor) -> Tensor:
    r"""The Weibull mean :math:`E[g] = \lambda\,\Gamma(1 + 1/k)` divided by :math:`\lambda`."""
    return torch.exp(torch.lgamma(1.0 + 1.0 / k))  # Γ(1 + 1/k)


class MaskedWeibull(_Masked):
    r"""Independent :math:`\mathrm{Weibull}(k, \lambda)` unnormalised weights over allowed keys.

    :math:`f(g) = \tfrac{k}{\lambda}(g/\lambda)^{k-1}e^{-(g/\lambda)^k}`, sampled by inversion
    :math:`g = \lambda(-\log u)^{1/k}` (reparameterised).
    """

    arg_constraints = {"concentration": constraints.positive, "scale": constraints.positive}
    support = constraints.independent(constraints.positive, 1)
    has_rsample = True
    _param_names = ("concentration", "scale")

    def __init__(
        self,
        concentration: Tensor,
        scale: Tensor,
        allowed: Tensor | None = None,
        validate_args: bool | None = None,
    ):
        self._init(allowed, concentration, scale, validate_args=validate_args)
        self._k = concentration  # as given (e.g. per head, (1, H, 1, 1)): cheap k-only maths
        self.concentration = concentration.expand(self.allowed.shape)
        self.scale = scale.expand(self.allowed.shape)
        self._finish(validate_args)

    def _expand_param(self, name: str, shape: torch.Size) -> Tensor:
        return self._k if name == "concentration" else super()._expand_param(name, shape)

    def rsample(self, sample_shape: _Shape = torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        u = torch.rand(shape, dtype=self.scale.dtype, device=self.scale.device)
        lo, hi = tiny(u), 1.0 - torch.finfo(u.dtype).eps
        if _in_place_ok(u, self.scale, self._k):  # the same steps in u's buffer
            g = u.clamp_(lo, hi).log_().neg_().pow_(1.0 / self._k).mul_(self.scale)
        else:
            g = self.scale * (-torch.log(u.clamp(lo, hi))).pow(1.0 / self._k)
        return self._keep(g, 1.0)

    def log_prob(self, value: Tensor) -> Tensor:
        k, lam = self._k, self.scale
        x = value.clamp_min(tiny(value))
        lp = k.log() - lam.log() + (k - 1) * (x.log() - lam.log()) - (x / lam).pow(k)
        return self._mask_sum(lp)

    @property
    def mean(self) -> Tensor:
        return self.scale * weibull_mean_factor(self._k)


class MaskedGamma(_Masked):
    r"""Independent :math:`\mathrm{Gamma}(\alpha, \beta)` (rate ``β``) over allowed keys."""

    arg_constraints = {"concentration": constraints.positive, "rate": constraints.positive}
    support = constraints.independent(constraints.positive, 1)
    has_rsample = True
    _param_names = ("concentration", "rate")

    def __init__(
        self,
        concentration: Tensor,
        rate: Tensor,
        allowed: Tensor | None = None,
        validate_args: bool | None = None,
    ):
        self._init(allowed, concentration, rate, validate_args=validate_args)
        self.concentration = self._keep(concentration.expand(self.allowed.shape), 1.0)
        self.rate = rate.expand(self.allowed.shape)
        self._finish(validate_args)

    def rsample(self, sample_shape: _Shape = torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        a, dt = self.concentration, _sampling_dtype(self.concentration)
        g = torch._standard_gamma(a.to(dt).expand(shape)) / self.rate.to(dt)
        return g.clamp_min(tiny(a)).to(a.dtype)

    def log_prob(self, value: Tensor) -> Tensor:
        a, b = self.concentration, self.rate
        x = value.clamp_min(tiny(value))
        lp = a * b.log() + (a - 1) * x.log() - b * x - torch.lgamma(a)
        return self._mask_sum(lp)

    @property
    def mean(self) -> Tensor:
        return self.concentration / self.rate


def kl_weibull_gamma(k: Tensor, lam: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
    r"""Closed-form :math:`\mathrm{KL}(\mathrm{Weibull}(k,\lambda)\,\|\,\mathrm{Gamma}(\alpha,\beta))`
    (Fan et al., 2020, Bayesian Attention Modules):

    .. math::
        \frac{\gamma\alpha}{k} - \alpha\log\lambda + \log k + \beta\lambda\,\Gamma(1 + 1/k)
        - \gamma - 1 - \alpha\log\beta + \log\Gamma(\alpha)

    with :math:`\gamma` the Euler–Mascheroni constant. Elementwise.
    """
    return (
        EULER_GAMMA * alpha / k
        - alpha * lam.log()
        + k.log()
        + beta * lam * weibull_mean_factor(k)
        - EULER_GAMMA
        - 1.0
        - alpha * beta.log()
        + torch.lgamma(alpha)
    )


@register_kl(torch.distributions.Weibull, torch.distributions.Gamma)
def _kl_weibull_gamma_torch(p: torch.distributions.Weibull, q: torch.distributions.Gamma) -> Tensor:
    return kl_weibull_gamma(p.concentration, p.scale, q.concentration, q.rate)


@register_kl(MaskedWeibull, MaskedGamma)
def _kl_masked_weibull_gamma(p: MaskedWeibull, q: MaskedGamma) -> Tensor:
    check_kl_shapes(p, q)
    return p._mask_sum(kl_weibull_gamma(p._k, p.scale, q.concentration, q.rate))


class MaskedConcrete(_Masked):
    r"""ExpConcrete (log-space relaxed one-hot, Maddison et al. 2017) over allowed keys.

    Value :math:`x = \log w` on the allowed keys (0 elsewhere, where :math:`w = 0`). With
    :math:`n` allowed keys and probabilities :math:`p`:

    .. math:: \log f(x) = \log (n-1)! + (n-1)\log\tau + \sum_j(\log p_j - \tau x_j)
              - n\log\sum_j e^{\log p_j - \tau x_j}
    """

    arg_constraints = {"logits": constraints.real, "temperature": constraints.positive}
    support = constraints.real_vector
    has_rsample = True
    _param_names = ("logits", "temperature")

    def __init__(
        self,
        logits: Tensor,
        temperature: Tensor,
        allowed: Tensor | None = None,
        validate_args: bool | None = None,
    ):
        self._init(allowed, logits, temperature, validate_args=validate_args)
        self.logits = self._keep(logits.expand(self.allowed.shape), 0.0)
        self.temperature = temperature.expand(self.allowed.shape)
        self._finish(validate_args)

    def _masked_lse(self, x: Tensor) -> Tensor:
        return torch.logsumexp(self._keep(x, float("-inf")), dim=-1)

    def rsample(self, sample_shape: _Shape = torch.Size()) -> Tensor:
        shape = self._extended_shape(sample_shape)
        u = torch.rand(shape, dtype=self.logits.dtype, device=self.logits.device)
        lo, hi = tiny(u), 1.0 - torch.finfo(u.dtype).eps
        if _in_place_ok(u, self.logits, self.temperature):  # the same steps in u's buffer
            # logits - t == -t + logits exactly (IEEE subtraction adds the negation)
            y = u.clamp_(lo, hi).log_().neg_().log_().neg_().add_(self.logits)
            y = y.div_(self.temperature)
            x = y.sub_(self._masked_lse(y).unsqueeze(-1))
        else:
            y = (self.logits - torch.log(-torch.log(u.clamp(lo, hi)))) / self.temperature
            x = y - self._masked_lse(y).unsqueeze(-1)
        if self._all:
            return x
        dead = (self.n_allowed == 0).unsqueeze(-1)
        return torch.where(self.allowed & ~dead, x, torch.zeros_like(x))

    def log_prob(self, value: Tensor) -> Tensor:
        n = self.n_allowed.to(value.dtype)
        tau = self.temperature[..., 0]
        logp = self.logits - self._masked_lse(self.logits).unsqueeze(-1)
        s = logp - self.temperature * value
        lp = (
            torch.lgamma(n.clamp_min(1.0))
            + (n - 1).clamp_min(0.0) * tau.log()
            + self._mask_sum(s)
            - n * self._masked_lse(s)
        )
        return torch.where(n > 0, lp, torch.zeros_like(lp))
