r"""Variational families over attention weights :math:`w_i \in \Delta^{T_k-1}`.

A *family* (see ``docs/glossary.md``) pairs the *weight model* :math:`p(w_i \mid \pi_i)` — the
distribution the Pyro model draws the attention weights from; it depends only on the key-relevance
prior :math:`\pi_i` (or, with ``model_location="attention"``, on the exact posterior) — with an
amortised *guide* :math:`q(w_i \mid x)` *centred on the exact posterior*
:math:`\bar p_i = \operatorname{softmax}(\log\pi_i + q_i\cdot k/\sqrt d)`:

================================  ===========================  ================================
family                            latent (``pyro.sample``)     weights
================================  ===========================  ================================
:class:`DirichletWeights`         :math:`w\sim\mathrm{Dir}(\kappa\bar p)`   :math:`w`  (``E[w] = \bar p``)
:class:`LogisticNormalWeights`    :math:`y\sim\mathcal N(\log\bar p, \sigma^2)`  :math:`\mathrm{softmax}(y)`
:class:`WeibullWeights` (BAM)     :math:`g\sim\mathrm{Weibull}(k,\lambda)`, ``E[g] = \bar p``  :math:`g/\sum g`
:class:`ConcreteWeights`          :math:`x = \log w\sim\mathrm{ExpConcrete}(\tau, \bar p)`  :math:`e^x`
================================  ===========================  ================================

Masked keys (:math:`\pi_{ij}=0`) are outside the support: they get weight exactly 0 and contribute
nothing to log-densities or KLs, so a row is a distribution over its *allowed* keys only. A row with
no allowed key has zero weights and zero log-density.

All distributions here have ``batch_shape (..., Tq)`` and ``event_shape (Tk,)``; their ``allowed``
mask broadcasts with the parameters.

A new family subclasses :class:`AttentionFamily` and implements :meth:`AttentionFamily.guide`,
:meth:`AttentionFamily.model` and :meth:`AttentionFamily.to_weights` (and sets ``analytic_kl``);
:func:`register_family` gives it a name that ``AttentionConfig(family=...)`` and the layers accept
(``docs/extending.md``).
This module was ``bayesattn.posteriors`` before 0.3 (the alias is gone since 0.4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Literal, get_args

import torch
from pyro.distributions.torch_distribution import TorchDistribution
from pyro.infer.util import is_validation_enabled
from torch import Tensor, nn
from torch.distributions import Distribution, constraints
from torch.distributions.kl import kl_divergence, register_kl

from ._validation import check_float_tensor, check_int, check_no_nan, check_real, check_tensor
from .functional import log_posterior_weights, posterior_weights
from .registry import Registry

__all__ = [
    "AttentionFamily",
    "FamilyName",
    "ModelLocation",
    "DirichletWeights",
    "LogisticNormalWeights",
    "WeibullWeights",
    "ConcreteWeights",
    "MaskedDirichlet",
    "MaskedNormal",
    "MaskedWeibull",
    "MaskedGamma",
    "MaskedConcrete",
    "kl_weibull_gamma",
    "get_family",
    "FAMILIES",
    "register_family",
    "list_families",
]

EULER_GAMMA = 0.5772156649015329
#: where a family's weight model is centred: the key-relevance prior π, or the exact posterior p̄
ModelLocation = Literal["key_relevance", "attention"]
MODEL_LOCATIONS: tuple[str, ...] = get_args(ModelLocation)
#: the built-in families :func:`get_family` builds by name (:data:`FAMILIES` may hold more)
FamilyName = Literal["dirichlet", "logistic_normal", "weibull", "concrete"]

#: a shape argument as torch.distributions takes it
_Shape = torch.Size | list[int] | tuple[int, ...]
#: extension-point methods renamed in 0.3 (old -> new): a subclass defining only an old name is
#: refused (it would otherwise never be called)
_RENAMED_METHODS = {
    "posterior": "guide",
    "prior": "model",
    "prior_log_location": "model_log_location",
}


# --------------------------------------------------------------------------------------------
# masked distributions over (…, Tq, Tk)
# --------------------------------------------------------------------------------------------


def _tiny(x: Tensor) -> float:
    return torch.finfo(x.dtype).tiny


_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _sampling_dtype(x: Tensor) -> torch.dtype:
    """float32 for half/bfloat16 (torch has no half Gamma sampler on CPU, and their few mantissa
    bits would leave normalised draws visibly off the simplex), else ``x``'s dtype."""
    return torch.float32 if x.dtype in _LOW_PRECISION else x.dtype


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
        g = self._keep(g, 0.0)
        tot = g.sum(-1, keepdim=True)
        w = g / tot.clamp_min(_tiny(g))
        return w.clamp_min(0.0).to(conc.dtype)

    @property
    def _safe_total(self) -> Tensor:
        a0 = self._mask_sum(self._safe_conc)  # (..., Tq)
        return self._rowwise(a0, 1.0)

    def log_prob(self, value: Tensor) -> Tensor:
        a = self._safe_conc
        logw = value.clamp_min(_tiny(value)).log()
        lp = (
            torch.lgamma(self._safe_total)
            - self._mask_sum(torch.lgamma(a))
            + self._mask_sum((a - 1.0) * logw)
        )
        return self._rowwise(lp, 0.0)

    @property
    def mean(self) -> Tensor:
        a = self._keep(self.concentration, 0.0)
        return a / a.sum(-1, keepdim=True).clamp_min(_tiny(a))


@register_kl(MaskedDirichlet, MaskedDirichlet)
def _kl_masked_dirichlet(p: MaskedDirichlet, q: MaskedDirichlet) -> Tensor:
    r""":math:`\mathrm{KL} = \log\Gamma(a_0) - \sum\log\Gamma(a_j) - \log\Gamma(b_0) + \sum\log\Gamma(b_j)
    + \sum (a_j - b_j)(\psi(a_j) - \psi(a_0))` over allowed keys."""
    _check_kl_shapes(p, q)
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
    _check_kl_shapes(p, q)
    var_ratio = (p.scale / q.scale).pow(2)
    t = ((p.loc - q.loc) / q.scale).pow(2)
    return p._mask_sum(0.5 * (var_ratio + t - 1 - var_ratio.log()))


def _weibull_mean_factor(k: Tensor) -> Tensor:
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
        u = u.clamp(_tiny(u), 1.0 - torch.finfo(u.dtype).eps)
        g = self.scale * (-torch.log(u)).pow(1.0 / self._k)
        return self._keep(g, 1.0)

    def log_prob(self, value: Tensor) -> Tensor:
        k, lam = self._k, self.scale
        x = value.clamp_min(_tiny(value))
        lp = k.log() - lam.log() + (k - 1) * (x.log() - lam.log()) - (x / lam).pow(k)
        return self._mask_sum(lp)

    @property
    def mean(self) -> Tensor:
        return self.scale * _weibull_mean_factor(self._k)


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
        return g.clamp_min(_tiny(a)).to(a.dtype)

    def log_prob(self, value: Tensor) -> Tensor:
        a, b = self.concentration, self.rate
        x = value.clamp_min(_tiny(value))
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
        + beta * lam * _weibull_mean_factor(k)
        - EULER_GAMMA
        - 1.0
        - alpha * beta.log()
        + torch.lgamma(alpha)
    )


@register_kl(torch.distributions.Weibull, torch.distributions.Gamma)
def _kl_weibull_gamma_torch(
    p: torch.distributions.Weibull, q: torch.distributions.Gamma
) -> Tensor:
    return kl_weibull_gamma(p.concentration, p.scale, q.concentration, q.rate)


@register_kl(MaskedWeibull, MaskedGamma)
def _kl_masked_weibull_gamma(p: MaskedWeibull, q: MaskedGamma) -> Tensor:
    _check_kl_shapes(p, q)
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
        u = u.clamp(_tiny(u), 1.0 - torch.finfo(u.dtype).eps)
        y = (self.logits - torch.log(-torch.log(u))) / self.temperature
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


# --------------------------------------------------------------------------------------------
# families
# --------------------------------------------------------------------------------------------


def _check_kl_shapes(p: Distribution, q: Distribution) -> None:
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


def _allowed(logits: Tensor, log_prior: Tensor | None) -> Tensor:
    a = logits if log_prior is None else logits + log_prior
    return a > float("-inf")


def _num_allowed(allowed: Tensor | None, like: Tensor) -> Tensor | float:
    """Number of allowed keys per row ``(..., Tq, 1)`` (at least 1), or ``Tk`` if unmasked."""
    if allowed is None:
        return float(like.shape[-1])
    return allowed.sum(-1, keepdim=True).clamp_min(1).to(like.dtype)


class AttentionFamily(nn.Module):
    r"""A variational family over attention weights: weight model, guide, weights map, KL.

    Subclasses implement the extension points :meth:`guide` and :meth:`model` (both return a
    distribution over the family's latent with ``batch_shape (B, H, Tq)``, ``event_shape (Tk,)``)
    and :meth:`to_weights` (latent → simplex weights, zero on masked keys), and set
    :attr:`analytic_kl` (``False`` when no closed-form KL between the two is registered).

    Inputs: ``logits = q·k/√d`` ``(B, H, Tq, Tk)``; ``log_prior`` (the key-relevance log-prior
    :math:`\log\pi`) broadcastable to it (``-inf`` = masked); ``query`` per-head queries
    ``(B, H, Tq, Dh)`` for input-dependent variances.

    Formerly ``AttentionPosterior`` with methods ``posterior``/``prior`` (renamed in 0.3, removed
    in 0.4): a subclass defining one of the old method names only is a ``TypeError``.
    """

    #: ``True``: :meth:`kl` uses the closed form registered with ``torch.distributions``
    analytic_kl: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in _RENAMED_METHODS.items():
            if old in cls.__dict__ and new not in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} defines {old!r}, the pre-0.3 name of the extension point "
                    f"{new!r} (removed in 0.4): rename the method to {new!r}"
                )

    def __init__(self, num_heads: int = 1, model_location: ModelLocation = "key_relevance") -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, 1)
        if model_location not in MODEL_LOCATIONS:
            raise ValueError(
                f"model_location must be one of {MODEL_LOCATIONS}; got {model_location!r}"
            )
        self.model_location: ModelLocation = model_location

    def model_log_location(
        self, log_prior: Tensor | None, logits: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        r"""Where the weight model is centred: ``(log m, allowed)``, ``0`` at masked keys.

        ``"key_relevance"``: :math:`m_i = \pi_i` (the key-relevance prior alone, normalised);
        ``"attention"``: :math:`m_i = \bar p_i = \operatorname{softmax}(\log\pi_i + q_i\cdot k/\sqrt d)`,
        a data-dependent weight model that expects softmax attention, so the KL to a guide centred
        on :math:`\bar p_i` measures only the spread (see ``docs/training.md``).
        """
        if self.model_location == "attention":
            return self.exact_log_posterior(logits, log_prior)
        return self.normalised_log_prior(log_prior, logits)

    def _check_inputs(self, logits: Tensor, log_prior: Tensor | None) -> None:
        """``logits (…, B, H, Tq, Tk)`` float without NaN/+inf, ``log_prior`` broadcastable."""
        check_float_tensor("logits", logits, min_dim=4)
        if logits.shape[-3] not in (1, self.num_heads) and self.num_heads != 1:
            raise ValueError(
                f"{type(self).__name__} has {self.num_heads} heads; logits (…, B, H, Tq, Tk) "
                f"have H = {logits.shape[-3]} (shape {tuple(logits.shape)})"
            )
        if log_prior is not None:
            check_float_tensor("log_prior", log_prior)
            try:
                ok = torch.broadcast_shapes(log_prior.shape, logits.shape) == logits.shape
            except RuntimeError:
                ok = False
            if not ok:
                raise ValueError(
                    f"log_prior must broadcast to the logits' shape {tuple(logits.shape)}; got "
                    f"{tuple(log_prior.shape)}"
                )
        if is_validation_enabled():
            check_no_nan("logits", logits)
            if log_prior is not None:
                check_no_nan("log_prior", log_prior)

    def _check_like(self, like: Tensor, log_prior: Tensor | None) -> None:
        check_float_tensor("like", like, min_dim=4)
        if log_prior is not None:
            check_tensor("log_prior", log_prior)

    # helpers ------------------------------------------------------------------------------
    @staticmethod
    def exact_log_posterior(
        logits: Tensor, log_prior: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        """``(log p̄ with 0 at masked keys, allowed)``; ``p̄ = softmax(log π + logits)``.
        ``allowed`` is ``None`` when nothing is masked (``log_prior is None``)."""
        if log_prior is None:
            return torch.log_softmax(logits, dim=-1), None
        allowed = _allowed(logits, log_prior)
        lp = log_posterior_weights(logits, log_prior)
        return torch.where(allowed, lp, torch.zeros_like(lp)), allowed

    @staticmethod
    def normalised_log_prior(
        log_prior: Tensor | None, like: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """``(log π normalised over allowed keys, 0 at masked; allowed)`` with ``like``'s shape;
        ``allowed`` is ``None`` when nothing is masked."""
        if log_prior is None:
            return torch.full_like(like, -math.log(like.shape[-1])), None
        zeros = torch.zeros_like(like)
        lp = log_posterior_weights(zeros, log_prior)
        allowed = lp > float("-inf")
        return torch.where(allowed, lp, zeros), allowed

    def _head_param(self, p: Tensor) -> Tensor:
        return p.view(1, -1, 1, 1) if p.numel() > 1 else p.view(1, 1, 1, 1)

    # extension points ----------------------------------------------------------------------
    def guide(
        self, logits: Tensor, log_prior: Tensor | None = None, query: Tensor | None = None
    ) -> TorchDistribution:
        r"""The amortised guide :math:`q(\text{latent} \mid x)`, centred on the exact posterior.

        Args:
            logits: scores :math:`q\cdot k/\sqrt d`, ``(B, H, Tq, Tk)`` (leading sample dims allowed).
            log_prior: key-relevance log-prior :math:`\log\pi` broadcastable to ``logits``
                (``-inf`` = masked key), or ``None`` (uniform, nothing masked).
            query: per-head queries ``(B, H, Tq, Dh)``, for input-dependent spreads.

        Returns:
            a distribution with ``batch_shape (B, H, Tq)`` and ``event_shape (Tk,)`` whose draws
            :meth:`to_weights` maps to the simplex (reparameterised: ``has_rsample``).
        """
        raise NotImplementedError

    def model(
        self, log_prior: Tensor | None, like: Tensor, key: Tensor | None = None
    ) -> TorchDistribution:
        r"""The weight model :math:`p(\text{latent} \mid \pi)` the Pyro model draws from.

        Args:
            log_prior: key-relevance log-prior :math:`\log\pi` broadcastable to ``like``
                (``-inf`` = masked), or ``None``.
            like: a tensor with the logits' shape, dtype and device ``(B, H, Tq, Tk)`` (the
                logits themselves: ``model_location="attention"`` centres on them).
            key: per-head keys ``(B, H, Tk, Dh)``, for contextual weight models.

        Returns:
            a distribution over the same latent as :meth:`guide`, same shapes.
        """
        raise NotImplementedError

    def to_weights(self, latent: Tensor, allowed: Tensor | None) -> Tensor:
        """Latent ``(…, B, H, Tq, Tk)`` → simplex weights, same shape, 0 on masked keys.

        ``allowed`` is a bool mask broadcastable to ``latent`` (``None``: nothing masked); a row
        with no allowed key gets all-zero weights."""
        raise NotImplementedError

    def kl(self, q_dist: Distribution, p_dist: Distribution, num_samples: int = 1) -> Tensor:
        r""":math:`\mathrm{KL}(q\|p)` per row ``(..., Tq)`` between a :meth:`guide` and a :meth:`model`
        distribution: closed form when registered (``analytic_kl``), else a Monte-Carlo estimate
        with ``num_samples`` reparameterised draws."""
        _check_kl_shapes(q_dist, p_dist)
        if self.analytic_kl:
            return kl_divergence(q_dist, p_dist)
        x = q_dist.rsample((num_samples,))
        return (q_dist.log_prob(x) - p_dist.log_prob(x)).mean(0)

    def mean_weights(self, logits: Tensor, log_prior: Tensor | None = None) -> Tensor:
        """Deterministic weights used in ``"mean"`` mode: the exact posterior ``p̄``.

        Bit-for-bit :func:`bayesattn.functional.posterior_weights` (``exp(log_softmax)`` would
        differ from ``softmax`` in the last ulp)."""
        return posterior_weights(logits, log_prior)


class DirichletWeights(AttentionFamily):
    r"""Dirichlet attention weights.

    Guide :math:`q(w_i) = \mathrm{Dir}(\kappa_h n_i \bar p_i)` with a learned per-head precision
    :math:`\kappa_h` (``n_i`` allowed keys), so :math:`E_q[w_i] = \bar p_i` exactly and
    :math:`\mathrm{Var}[w_{ij}] = \bar p_{ij}(1-\bar p_{ij})/(\kappa_h n_i + 1)`.
    Weight model :math:`p(w_i) = \mathrm{Dir}(\kappa_0 n_i \pi_i)` (``κ0 = 1``, uniform π: flat Dirichlet).
    """

    def __init__(
        self,
        num_heads: int = 1,
        init_concentration: float = 10.0,
        model_concentration: float = 1.0,
        model_location: ModelLocation = "key_relevance",
    ) -> None:
        super().__init__(num_heads, model_location)
        check_real("init_concentration", init_concentration, gt=0.0)
        check_real("model_concentration", model_concentration, gt=0.0)
        self.model_concentration = float(model_concentration)
        self.log_concentration = nn.Parameter(
            torch.full((num_heads,), math.log(init_concentration))
        )

    def guide(
        self, logits: Tensor, log_prior: Tensor | None = None, query: Tensor | None = None
    ) -> MaskedDirichlet:
        self._check_inputs(logits, log_prior)
        lp, allowed = self.exact_log_posterior(logits, log_prior)  # (B, H, Tq, Tk)
        n = _num_allowed(allowed, lp)  # (B, H, Tq, 1)
        kappa = self._head_param(self.log_concentration.exp().to(lp.dtype))
        conc = (kappa * n * lp.exp()).clamp_min(1e-6)
        return MaskedDirichlet(conc, allowed, validate_args=False)

    def model(
        self, log_prior: Tensor | None, like: Tensor, key: Tensor | None = None
    ) -> MaskedDirichlet:
        self._check_like(like, log_prior)
        lp, allowed = self.model_log_location(log_prior, like)
        n = _num_allowed(allowed, lp)
        conc = (self.model_concentration * n * lp.exp()).clamp_min(1e-6)
        return MaskedDirichlet(conc, allowed, validate_args=False)

    def to_weights(self, latent: Tensor, allowed: Tensor | None) -> Tensor:
        return latent if allowed is None else torch.where(allowed, latent, 0.0)


class LogisticNormalWeights(AttentionFamily):
    r"""Logistic-normal attention weights: :math:`w_i = \operatorname{softmax}(y_i)`.

    Guide :math:`y_{ij} \sim \mathcal N(\log\bar p_{ij}, \sigma_{hi}^2)`; the location's softmax is
    the exact posterior (and :math:`E[w]\to\bar p` as :math:`\sigma\to 0`). The scale is a learned
    per-head constant, or input-dependent :math:`\sigma_{hi} = \mathrm{softplus}(u_h\cdot q_i + c_h)`
    when ``input_dependent=True`` (needs ``head_dim``). Weight model :math:`y_{ij}\sim\mathcal N(\log\pi_{ij},
    \sigma_0^2)`.
    """

    def __init__(
        self,
        num_heads: int = 1,
        init_scale: float = 0.5,
        model_scale: float = 1.0,
        input_dependent: bool = False,
        head_dim: int | None = None,
        model_location: ModelLocation = "key_relevance",
    ) -> None:
        super().__init__(num_heads, model_location)
        check_real("init_scale", init_scale, gt=0.0)
        check_real("model_scale", model_scale, gt=0.0)
        self.model_scale = float(model_scale)
        inv = init_scale + math.log(-math.expm1(-init_scale))  # softplus⁻¹, no overflow
        self.input_dependent = input_dependent
        if input_dependent:
            if head_dim is None or head_dim < 1:
                raise ValueError(f"input_dependent=True needs head_dim >= 1; got {head_dim!r}")
            self.scale_weight = nn.Parameter(torch.zeros(num_heads, head_dim))
        self.scale_bias = nn.Parameter(torch.full((num_heads,), inv))

    def _scale(self, like: Tensor, query: Tensor | None) -> Tensor:
        b = self._head_param(self.scale_bias.to(like.dtype))  # (1, H, 1, 1)
        if not self.input_dependent:
            return nn.functional.softplus(b)
        if query is None:
            raise ValueError("LogisticNormalWeights(input_dependent=True) needs the query")
        u = self.scale_weight.to(like.dtype)  # (H, Dh)
        s = torch.einsum("...hqd,hd->...hq", query, u).unsqueeze(-1)  # (B, H, Tq, 1)
        return nn.functional.softplus(s + b) + 1e-4

    def guide(
        self, logits: Tensor, log_prior: Tensor | None = None, query: Tensor | None = None
    ) -> MaskedNormal:
        self._check_inputs(logits, log_prior)
        lp, allowed = self.exact_log_posterior(logits, log_prior)
        return MaskedNormal(lp, self._scale(lp, query).expand_as(lp), allowed, validate_args=False)

    def model(
        self, log_prior: Tensor | None, like: Tensor, key: Tensor | None = None
    ) -> MaskedNormal:
        self._check_like(like, log_prior)
        lp, allowed = self.model_log_location(log_prior, like)
        return MaskedNormal(lp, torch.full_like(lp, self.model_scale), allowed, validate_args=False)

    def to_weights(self, latent: Tensor, allowed: Tensor | None) -> Tensor:
        if allowed is None:
            return torch.softmax(latent, dim=-1)
        y = latent.masked_fill(~allowed, float("-inf"))
        dead = ~allowed.any(-1, keepdim=True)
        w = torch.softmax(y.masked_fill(dead, 0.0), dim=-1)
        return w.masked_fill(dead | ~allowed, 0.0)


class WeibullWeights(AttentionFamily):
    r"""Bayesian Attention Modules (Fan et al., 2020): Weibull guide, Gamma weight model, normalised.

    Guide :math:`g_{ij}\sim\mathrm{Weibull}(k_h, \lambda_{ij})` with
    :math:`\lambda_{ij} = \bar p_{ij}/\Gamma(1+1/k_h)`, so :math:`E[g_{ij}] = \bar p_{ij}`; weights
    :math:`w_{ij} = g_{ij}/\sum_l g_{il}`. Weight model :math:`g_{ij}\sim\mathrm{Gamma}(c\,\pi_{ij}, c)` with
    ``c = model_concentration · n_i`` (mean :math:`\pi_{ij}`); use a
    :class:`~bayesattn.priors.ContextualPrior` for BAM's contextual weight model. Closed-form KL.

    The learned shape is bounded below, :math:`k_h = \max(e^{\text{log_shape}_h}, k_{\min})` with
    ``min_shape`` :math:`k_{\min} \ge 0.1` (default 0.1): below it a float32 draw
    :math:`\lambda(-\log u)^{1/k}` overflows to ``inf`` and the normalised weights become NaN
    (one SVI step at a large learning rate can push the shape there).
    """

    #: smallest shape for which float32 draws stay finite: :math:`g = \lambda(-\log u)^{1/k}` with
    #: :math:`-\log u \le 87.3` overflows float32 once :math:`1/k \gtrsim 20`.
    MIN_SHAPE = 0.1

    def __init__(
        self,
        num_heads: int = 1,
        init_shape: float = 10.0,
        model_concentration: float = 1.0,
        min_shape: float = MIN_SHAPE,
        model_location: ModelLocation = "key_relevance",
    ) -> None:
        super().__init__(num_heads, model_location)
        check_real("init_shape", init_shape, gt=0.0)
        check_real("model_concentration", model_concentration, gt=0.0)
        self.min_shape = check_real("min_shape", min_shape, ge=self.MIN_SHAPE)
        if init_shape < self.min_shape:
            raise ValueError(
                f"init_shape must be >= min_shape = {self.min_shape:g} (smaller shapes overflow "
                f"the Weibull draws to inf and the weights to NaN); got {init_shape!r}"
            )
        self.model_concentration = float(model_concentration)
        self.log_shape = nn.Parameter(torch.full((num_heads,), math.log(init_shape)))

    @property
    def shape_k(self) -> Tensor:
        r"""Per-head Weibull shape :math:`k_h = \max(e^{\text{log_shape}_h}, k_{\min})`."""
        return self.log_shape.exp().clamp_min(self.min_shape)

    def guide(
        self, logits: Tensor, log_prior: Tensor | None = None, query: Tensor | None = None
    ) -> MaskedWeibull:
        self._check_inputs(logits, log_prior)
        lp, allowed = self.exact_log_posterior(logits, log_prior)
        k = self._head_param(self.shape_k.to(lp.dtype))  # (1, H, 1, 1)
        lam = (lp.exp() / _weibull_mean_factor(k)).clamp_min(1e-8)  # (B, H, Tq, Tk)
        return MaskedWeibull(k, lam, allowed, validate_args=False)

    def model(
        self, log_prior: Tensor | None, like: Tensor, key: Tensor | None = None
    ) -> MaskedGamma:
        self._check_like(like, log_prior)
        lp, allowed = self.model_log_location(log_prior, like)
        c = self.model_concentration * _num_allowed(allowed, lp)
        rate = c.expand_as(lp) if isinstance(c, Tensor) else torch.full_like(lp, c)
        return MaskedGamma((c * lp.exp()).clamp_min(1e-6), rate, allowed, validate_args=False)

    def to_weights(self, latent: Tensor, allowed: Tensor | None) -> Tensor:
        g = latent if allowed is None else torch.where(allowed, latent, 0.0)
        return g / g.sum(-1, keepdim=True).clamp_min(_tiny(g))


class ConcreteWeights(AttentionFamily):
    r"""Relaxed-categorical (Concrete / Gumbel-softmax) attention weights.

    Guide :math:`\log w_i\sim\mathrm{ExpConcrete}(\tau, \bar p_i)`; as :math:`\tau\to 0` draws are
    one-hot with probabilities :math:`\bar p_i` (hard attention), so :math:`E[w_i]\to\bar p_i`.
    Weight model :math:`\mathrm{ExpConcrete}(\tau_0, \pi_i)`. No closed-form KL: Monte Carlo.
    """

    analytic_kl = False

    def __init__(
        self, num_heads: int = 1, temperature: float = 0.5, model_temperature: float | None = None
    ) -> None:
        super().__init__(num_heads)
        check_real("temperature", temperature, gt=0.0)
        if model_temperature is not None:
            check_real("model_temperature", model_temperature, gt=0.0)
        self.temperature = float(temperature)
        self.model_temperature = float(model_temperature or temperature)

    def guide(
        self, logits: Tensor, log_prior: Tensor | None = None, query: Tensor | None = None
    ) -> MaskedConcrete:
        self._check_inputs(logits, log_prior)
        lp, allowed = self.exact_log_posterior(logits, log_prior)
        return MaskedConcrete(
            lp, torch.full_like(lp, self.temperature), allowed, validate_args=False
        )

    def model(
        self, log_prior: Tensor | None, like: Tensor, key: Tensor | None = None
    ) -> MaskedConcrete:
        self._check_like(like, log_prior)
        lp, allowed = self.normalised_log_prior(log_prior, like)
        return MaskedConcrete(
            lp, torch.full_like(lp, self.model_temperature), allowed, validate_args=False
        )

    def to_weights(self, latent: Tensor, allowed: Tensor | None) -> Tensor:
        if latent.dtype in _LOW_PRECISION:  # log-weights rounded to a few bits: renormalise
            w = self.to_weights(latent.float(), allowed)
            return (w / w.sum(-1, keepdim=True).clamp_min(_tiny(w))).to(latent.dtype)
        return latent.exp() if allowed is None else torch.where(allowed, latent.exp(), 0.0)


#: the families by name (:class:`~bayesattn.registry.Registry`); add one with
#: :func:`register_family`. Each is built as ``factory(num_heads=H, **family_kwargs)``, plus
#: ``head_dim=Dh`` when it has a ``head_dim`` parameter.
FAMILIES: Registry[Callable[..., AttentionFamily]] = Registry(
    "family", AttentionFamily, register_with="bayesattn.register_family"
)
FAMILIES.register("dirichlet", DirichletWeights)
FAMILIES.register("logistic_normal", LogisticNormalWeights)
FAMILIES.register("weibull", WeibullWeights)
FAMILIES.register("concrete", ConcreteWeights)
#: ``@register_family("name")`` on an :class:`AttentionFamily` subclass (or a function returning
#: one) makes ``family="name"`` work in layers and in every network built from an
#: ``AttentionConfig``; see ``docs/extending.md``.
register_family = FAMILIES.register


def list_families() -> tuple[str, ...]:
    """The registered family names (built-in and user), in registration order."""
    return FAMILIES.names()


def get_family(
    name: FamilyName | str, num_heads: int, head_dim: int | None = None, **kwargs: Any
) -> AttentionFamily:
    """Build a registered family by name: ``"dirichlet"``, ``"logistic_normal"``, ``"weibull"``,
    ``"concrete"`` or one added with :func:`register_family`.

    ``kwargs`` go to the family's constructor; ``head_dim`` goes to a family whose constructor
    has a ``head_dim`` parameter (``logistic_normal`` uses it with ``input_dependent=True``)."""
    if head_dim is not None and "head_dim" in (FAMILIES.arguments(name) or ()):
        kwargs.setdefault("head_dim", head_dim)
    return FAMILIES.create(name, num_heads=num_heads, **kwargs)
