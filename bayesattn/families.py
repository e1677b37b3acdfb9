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

The families draw from the masked distributions of :mod:`bayesattn.distributions`
(``batch_shape (..., Tq)``, ``event_shape (Tk,)``, an ``allowed`` mask that broadcasts with the
parameters) and use their registered KLs.

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
from torch.distributions import Distribution
from torch.distributions.kl import kl_divergence

from ._validation import check_float_tensor, check_int, check_no_nan, check_real, check_tensor
from .distributions import (
    LOW_PRECISION,
    MaskedConcrete,
    MaskedDirichlet,
    MaskedGamma,
    MaskedNormal,
    MaskedWeibull,
    check_kl_shapes,
    tiny,
    weibull_mean_factor,
)
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
    "get_family",
    "FAMILIES",
    "register_family",
    "list_families",
]

#: where a family's weight model is centred: the key-relevance prior π, or the exact posterior p̄
ModelLocation = Literal["key_relevance", "attention"]
MODEL_LOCATIONS: tuple[str, ...] = get_args(ModelLocation)
#: the built-in families :func:`get_family` builds by name (:data:`FAMILIES` may hold more)
FamilyName = Literal["dirichlet", "logistic_normal", "weibull", "concrete"]

#: extension-point methods renamed in 0.3 (old -> new): a subclass defining only an old name is
#: refused (it would otherwise never be called)
_RENAMED_METHODS = {
    "posterior": "guide",
    "prior": "model",
    "prior_log_location": "model_log_location",
}


# --------------------------------------------------------------------------------------------
# families
# --------------------------------------------------------------------------------------------


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
        raise NotImplementedError(_not_implemented(self, 'guide'))

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
        raise NotImplementedError(_not_implemented(self, 'model'))

    def to_weights(self, latent: Tensor, allowed: Tensor | None) -> Tensor:
        """Latent ``(…, B, H, Tq, Tk)`` → simplex weights, same shape, 0 on masked keys.

        ``allowed`` is a bool mask broadcastable to ``latent`` (``None``: nothing masked); a row
        with no allowed key gets all-zero weights."""
        raise NotImplementedError(_not_implemented(self, 'to_weights'))

    def kl(self, q_dist: Distribution, p_dist: Distribution, num_samples: int = 1) -> Tensor:
        r""":math:`\mathrm{KL}(q\|p)` per row ``(..., Tq)`` between a :meth:`guide` and a :meth:`model`
        distribution: closed form when registered (``analytic_kl``), else a Monte-Carlo estimate
        with ``num_samples`` reparameterised draws."""
        check_kl_shapes(q_dist, p_dist)
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
        lam = (lp.exp() / weibull_mean_factor(k)).clamp_min(1e-8)  # (B, H, Tq, Tk)
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
        return g / g.sum(-1, keepdim=True).clamp_min(tiny(g))


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
        if latent.dtype in LOW_PRECISION:  # log-weights rounded to a few bits: renormalise
            w = self.to_weights(latent.float(), allowed)
            return (w / w.sum(-1, keepdim=True).clamp_min(tiny(w))).to(latent.dtype)
        return latent.exp() if allowed is None else torch.where(allowed, latent.exp(), 0.0)


#: the extension points every family implements (the registry refuses a class without them)
EXTENSION_POINTS = ("guide", "model", "to_weights")


def _not_implemented(family: AttentionFamily, method: str) -> str:
    return (
        f"{type(family).__name__} does not implement {method}, an extension point of "
        f"AttentionFamily ({', '.join(EXTENSION_POINTS)}); see docs/extending.md"
    )


def check_family(family: Any) -> AttentionFamily:
    """``family`` as an :class:`AttentionFamily` instance whose class implements every
    extension point (a ``TypeError`` naming the missing ones otherwise)."""
    if not isinstance(family, AttentionFamily):
        raise TypeError(f"family must be an AttentionFamily; got {type(family).__name__}")
    cls = type(family)
    missing = [m for m in EXTENSION_POINTS if getattr(cls, m) is getattr(AttentionFamily, m)]
    if missing:
        raise TypeError(
            f"family {cls.__name__} does not implement {', '.join(missing)} (the extension "
            "points of AttentionFamily it must override; see docs/extending.md)"
        )
    return family


#: the families by name (:class:`~bayesattn.registry.Registry`); add one with
#: :func:`register_family`. Each is built as ``factory(num_heads=H, **family_kwargs)``, plus
#: ``head_dim=Dh`` when it has a ``head_dim`` parameter.
FAMILIES: Registry[Callable[..., AttentionFamily]] = Registry(
    "family", AttentionFamily, register_with="bayesattn.register_family",
    required=EXTENSION_POINTS,
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
