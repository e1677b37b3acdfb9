r"""A global K-component mixture posterior over rank-1 factors of a transformer trunk: K packed
sub-trunks, one vectorised pass (Dusenberry et al. 2020; maths in
:mod:`bayesattn.functional.mixture`).

Every projection of every encoder layer — the packed ``in_proj_weight`` (``W_q, W_k, W_v``
stacked, one input factor shared by the three since they read the same input), ``out_proj``
(``W_o``) and the feed-forward ``linear1``/``linear2`` — is rescaled by a rank-1 factor,
:math:`W = \bar W \circ (s\,r^\top)`. The factors of the whole trunk are one vector
:math:`\theta \in \mathbb R^D` with the prior :math:`\mathcal N(1, s_0^2 I)` and the posterior

.. math:: q(\theta) = \frac1K \sum_k \mathcal N(\theta;\ \mu_k, \operatorname{diag}\sigma_k^2)

(``std=None``: K point masses :math:`\delta_{\mu_k}`, a packed ensemble with no KL). The shared
weights :math:`\bar W`, biases, norms, embedding and head are point estimates. :math:`\theta` is
one **global** latent (``"trunk_mixture.factors"``), drawn outside the data plate; its KL is
charged once per data set, unscaled by ``N/B``, with the convexity bound
:math:`\mathrm{KL}(q\|p) \le \frac1K\sum_k \mathrm{KL}(q_k\|p)` (:meth:`Rank1Mixture.kl`; the
true KL is at least that minus :math:`\log K`).

How the draws travel (attention mode, :mod:`bayesattn.nn.modes`):

``"elbo"`` (training): ``P`` particles become ``K·P`` stratified reparameterised draws, draw
``i`` from component ``i % K``: every step evaluates every component, and ``elbo_loss`` averages
the likelihood over the pass's sample dim (not a sum). ``"guide"`` (``predict``): ``S`` draws
stratified the same way; ``S > 1`` must be a multiple of ``K`` (``ValueError`` naming
``num_samples`` and ``K``); ``S = 1`` is one draw of a component chosen uniformly at random (a
single posterior draw). ``"model"``: draws from the prior. ``"mean"`` (also the default in eval
mode when no mode is set, :func:`~bayesattn.nn.modes.default_mode`): the K component means in
one pass, their predictive averaged into the logits, :math:`\log\frac1K\sum_k
\operatorname{softmax}(f_{\mu_k}(x))` (so ``net(x)``, and the validation loss, is the mixture's
mean-component predictive).

The sample dim starts at the input (layer 0): the draws are ``(S, O, I)`` weights that
:func:`~bayesattn.nn.attention.linear` broadcasts against ``(S, B, T, I)`` states, swapped in for
the parameters for the duration of the pass (:func:`swapped_parameters`).

Shape glossary: ``K`` components, ``D`` factor numbers, ``S`` draws, ``B`` batch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import pyro.distributions as dist
import torch
import torch.nn.functional as F
from pyro.distributions import constraints
from pyro.nn import PyroModule
from torch import Tensor, nn

from .._validation import check_int, check_real
from ..functional.mixture import mixture_kl_bound, mixture_log_prob, rank1_weight, stratified_draws
from .modes import current_global_values, current_kl_collector, default_mode
from .networks import BayesianNetwork, TransformerClassifier

__all__ = ["MixturePosterior", "Rank1Mixture", "rank1_mixture", "swapped_parameters"]

#: the projections of an encoder layer that get rank-1 factors: (module path in the layer, name)
TARGETS = (
    ("self_attn", "in_proj_weight"),
    ("self_attn.out_proj", "weight"),
    ("linear1", "weight"),
    ("linear2", "weight"),
)
MixtureInit = Literal["normal", "sign"]


def _inv_softplus(x: float) -> float:
    return x + math.log(-math.expm1(-x))


def _check_draws(num_samples: int, K: int) -> None:
    if num_samples > 1 and num_samples % K:
        raise ValueError(
            f"num_samples={num_samples} must be a multiple of the mixture's K={K} components "
            f"(draw i is component i % K); num_samples=1 draws one component at random"
        )


class MixturePosterior(dist.TorchDistribution):
    r"""The equal-weight mixture :math:`\frac1K\sum_k \mathcal N(\mu_k, \sigma_k^2)` (or K point
    masses, ``std=None``) with **stratified** sampling: ``sample((S,))`` gives ``S/K`` draws of
    every component, draw ``i`` from component ``i % K`` (``S`` a multiple of ``K``); ``sample()``
    one draw of a uniformly chosen component. Reparameterised given the component.

    Shape:
        mean, std ``(K, D)``; event ``(D,)``; ``sample((S,))`` → ``(S, D)``.
    """

    arg_constraints: dict = {}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, mean: Tensor, std: Tensor | None) -> None:
        self.mean_, self.std_ = mean, std
        super().__init__(torch.Size(), mean.shape[-1:], validate_args=False)

    @property
    def num_components(self) -> int:
        return int(self.mean_.shape[0])

    def rsample(self, sample_shape: Any = torch.Size()) -> Tensor:
        shape = torch.Size(sample_shape)
        K = self.num_components
        if len(shape) > 1:
            raise ValueError(f"sample_shape must be () or (S,); got {tuple(shape)}")
        if not shape or shape[0] == 1:
            k = int(torch.randint(K, ()))
            mean = self.mean_[k : k + 1]
            std = None if self.std_ is None else self.std_[k : k + 1]
            theta = stratified_draws(mean, std, 1)  # (1, D)
            return theta if shape else theta[0]
        _check_draws(shape[0], K)
        return stratified_draws(self.mean_, self.std_, shape[0] // K)  # (S, D)

    def sample(self, sample_shape: Any = torch.Size()) -> Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value: Tensor) -> Tensor:
        if self.std_ is None:
            raise ValueError("a mixture of point masses (std=None) has no density")
        return mixture_log_prob(value, self.mean_, self.std_)


def swapped_parameters(values: Mapping[tuple[nn.Module, str], Tensor]) -> Any:
    """Context manager: ``module.name`` reads ``values[(module, name)]`` (any tensor, e.g.
    ``(S, O, I)`` draws) instead of the parameter; restored (in its place) on exit. The value
    is held as a buffer for the duration, so ``named_parameters()`` (and so ``pyro.module``,
    which a ``PyroModule`` parent calls on attribute access) never sees it: no stale tensor
    enters Pyro's param store."""

    @contextlib.contextmanager
    def ctx() -> Iterator[None]:
        saved = {m: dict(m._parameters) for (m, _) in values}
        try:
            for (m, n), v in values.items():
                del m._parameters[n]
                m._buffers[n] = v
            yield
        finally:
            for m, n in values:
                m._buffers.pop(n, None)
            for m, params in saved.items():
                m._parameters.clear()
                m._parameters.update(params)  # the original order

    return ctx()


class Rank1Mixture(PyroModule):
    r"""The mixture posterior over a trunk's rank-1 factors (see the module docstring); attach
    it with :func:`rank1_mixture`, which fills :attr:`slots` from the network.

    Args:
        dim: ``D``, the number of factor entries.
        num_components: ``K``.
        prior_std: :math:`s_0` of the prior :math:`\mathcal N(1, s_0^2)`.
        init: ``"normal"``: :math:`\mu_k = 1 + c\,\varepsilon`, :math:`\varepsilon\sim\mathcal
            N(0, 1)`; ``"sign"``: each entry :math:`-1` with probability ``c``, else :math:`+1`
            (Dusenberry et al.'s random-sign init); ``c`` = ``init_spread``.
        init_std: initial :math:`\sigma_k` (``None``: point masses, nothing learned about spread).

    The defaults (:math:`s_0 = 0.3`, spread 0.25, std 0.05) are the study's, chosen on the
    digits' in-distribution validation split (:mod:`bayesattn.study.mixture_methods`).

    Shape:
        ``mean``/``std`` ``(K, D)``; a draw ``(D,)`` or ``(S, D)``.
    """

    is_bayesian = True  # a latent the posterior predictive must sample
    global_latent = True  # drawn once per pass, outside the data plate
    samples_from_input = True  # its draws enter at layer 0 (they change every projection)

    def __init__(
        self,
        dim: int,
        num_components: int = 4,
        prior_std: float = 0.3,
        init: MixtureInit = "normal",
        init_spread: float = 0.25,
        init_std: float | None = 0.05,
    ) -> None:
        check_int("dim", dim, 1)
        K = check_int("num_components", num_components, 1)
        self.prior_std = check_real("prior_std", prior_std, gt=0.0)
        if init not in ("normal", "sign"):
            raise ValueError(f"init must be 'normal' or 'sign'; got {init!r}")
        spread = check_real("init_spread", init_spread, ge=0.0)
        if init == "sign" and spread > 1:
            raise ValueError(f"init_spread is a probability for init='sign'; got {spread}")
        if init_std is not None:
            check_real("init_std", init_std, gt=0.0)
        super().__init__()
        if init == "normal":
            mean = 1.0 + spread * torch.randn(K, dim)
        else:
            mean = torch.where(torch.rand(K, dim) < spread, -1.0, 1.0)
        self.mean = nn.Parameter(mean)  # (K, D)
        self.raw_std = (
            None
            if init_std is None
            else nn.Parameter(torch.full((K, dim), _inv_softplus(init_std)))
        )
        #: per factored weight: (module path, parameter name, O, I, offset of its r in theta;
        #: its s follows r)
        self.slots: list[tuple[str, str, int, int, int]] = []

    @property
    def num_components(self) -> int:
        return int(self.mean.shape[0])

    @property
    def point_masses(self) -> bool:
        return self.raw_std is None

    @property
    def std(self) -> Tensor | None:
        r""":math:`\sigma` ``(K, D)`` (``None`` for point masses)."""
        return None if self.raw_std is None else F.softplus(self.raw_std) + 1e-6

    @property
    def site_name(self) -> str:
        """The global Pyro site of the factors ``(D,)``."""
        with self._pyro_context:
            return self._pyro_get_fullname("factors")

    def posterior(self) -> MixturePosterior:
        """:math:`q(\\theta)`, stratified sampling (:class:`MixturePosterior`)."""
        return MixturePosterior(self.mean, self.std)

    def prior(self) -> dist.TorchDistribution:
        """:math:`p(\\theta) = \\mathcal N(1, s_0^2 I)`, event ``(D,)``."""
        loc = torch.ones_like(self.mean[0])
        return dist.Normal(loc, self.prior_std * torch.ones_like(loc)).to_event(1)

    def kl(self) -> Tensor:
        r"""The KL charged by the ELBO, in nats: the convexity upper bound
        :math:`\frac1K\sum_k\mathrm{KL}(q_k\|p)` (0 for point masses: no KL is defined, the
        packed ensemble is trained on the likelihood alone)."""
        std = self.std
        if std is None:
            return self.mean.new_zeros(())
        return mixture_kl_bound(self.mean, std, 1.0, self.prior_std)[0]

    # ---- the draw ------------------------------------------------------------------------------
    def draw(self, num_samples: int) -> Tensor:
        """This pass's factors: ``(D,)`` (no sample dim) or ``(S, D)`` (see the module
        docstring for each mode). A value preset by :func:`~bayesattn.nn.modes.global_values`
        wins."""
        name = self.site_name
        preset = current_global_values()
        if preset is not None and name in preset:
            return preset[name]
        mode = default_mode(self.training)  # set by the network's passes; alone: train/eval
        K = self.num_components
        if mode == "mean":  # every component's mean (K, D), combined in read_logits
            return self.mean if K > 1 else self.mean[0]
        if mode == "elbo":
            col = current_kl_collector()
            if col is not None and name in col.global_values:
                return col.global_values[name]
            v = stratified_draws(self.mean, self.std, num_samples)  # (K·P, D)
            if col is not None:
                col.add_global(name, self.kl(), v)
            return v
        if mode == "model":
            return self.prior().sample(torch.Size(() if num_samples == 1 else (num_samples,)))
        _check_draws(num_samples, K)
        return self.posterior().rsample(torch.Size(() if num_samples == 1 else (num_samples,)))

    def weights(self, net: nn.Module, theta: Tensor) -> dict[tuple[nn.Module, str], Tensor]:
        r"""The factored weights :math:`\bar W\circ(s\,r^\top)` of every slot for factors
        ``theta`` ``(D,)`` → ``(O, I)``, or ``(S, D)`` → ``(S, O, I)``."""
        out: dict[tuple[nn.Module, str], Tensor] = {}
        for path, pname, O, I, off in self.slots:
            module = net.get_submodule(path)
            W = module._parameters[pname]
            assert W is not None
            r, s = theta[..., off : off + I], theta[..., off + I : off + I + O]
            out[(module, pname)] = rank1_weight(W, r, s)  # (*S, O, I)
        return out

    @contextlib.contextmanager
    def trunk(self, net: nn.Module, num_samples: int) -> Iterator[int]:
        """Context manager for one pass of ``net``'s encoder: draws the factors, swaps the
        factored weights in and yields the pass's number of samples (``K·P`` in ``"elbo"`` mode,
        ``K`` in ``"mean"`` mode, else ``num_samples``)."""
        theta = self.draw(num_samples)
        S = theta.shape[0] if theta.dim() == 2 else num_samples
        if theta.dim() == 2 and S == 1:
            theta = theta[0]  # one draw: plain (O, I) weights, no sample dim
        with swapped_parameters(self.weights(net, theta)):
            yield S

    def read_logits(self, logits: Tensor, num_samples: int) -> Tensor:
        r"""In ``"mean"`` mode, the K components' logits ``(K, B, ..., C)`` become
        :math:`\log\frac1K\sum_k\operatorname{softmax}` ``(B, ..., C)`` (expanded to
        ``(S, B, ..., C)`` for ``num_samples = S > 1``); unchanged in other modes."""
        if default_mode(self.training) != "mean" or self.num_components == 1:
            return logits
        out = torch.logsumexp(torch.log_softmax(logits, -1), 0) - math.log(self.num_components)
        return out.expand((num_samples,) + out.shape) if num_samples > 1 else out

    def extra_repr(self) -> str:
        std = "point masses" if self.point_masses else f"prior_std={self.prior_std}"
        return f"num_components={self.num_components}, dim={self.mean.shape[1]}, {std}"


def rank1_mixture(
    network: TransformerClassifier,
    num_components: int = 4,
    prior_std: float = 0.3,
    init: MixtureInit = "normal",
    init_spread: float = 0.25,
    init_std: float | None = 0.05,
) -> Rank1Mixture:
    """Give ``network`` a K-component mixture posterior over rank-1 factors of every encoder
    layer's ``in_proj_weight``, ``out_proj.weight``, ``linear1.weight`` and ``linear2.weight``
    (attached as ``network.trunk_mixture``; returned). ``init_std=None``: K point masses (a
    packed ensemble). Arguments as :class:`Rank1Mixture`.

    Raises:
        TypeError: ``network`` is not a :class:`~bayesattn.nn.networks.TransformerClassifier`.
        ValueError: a mixture or Bayesian projections are already attached, or a layer has no
            packed ``in_proj_weight``.
    """
    if not isinstance(network, TransformerClassifier):
        raise TypeError(
            f"network must be a TransformerClassifier (or ViT); got {type(network).__name__}"
        )
    if network.trunk_mixture is not None:
        raise ValueError("rank1_mixture was already applied to this network")
    if isinstance(network, BayesianNetwork) and network.weight_sites():
        raise ValueError("rank1_mixture does not combine with bayesian_projections")
    slots: list[tuple[str, str, int, int, int]] = []
    off = 0
    for i, _ in enumerate(network.encoder.layers):
        for sub, pname in TARGETS:
            path = f"encoder.layers.{i}.{sub}"
            W = network.get_submodule(path)._parameters.get(pname)
            if W is None or W.dim() != 2:
                raise ValueError(f"{path}.{pname} must be a 2-D parameter; got {W!r}")
            O, I = W.shape
            slots.append((path, pname, O, I, off))
            off += O + I
    mix = Rank1Mixture(off, num_components, prior_std, init, init_spread, init_std)
    mix.slots = slots
    network.attach_trunk_mixture(mix)
    return mix
