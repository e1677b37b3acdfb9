r"""The network contract: what a network must provide to be trained, sampled and diagnosed.

:class:`~bayesattn.training.Trainer` (and ``fit``), :class:`~bayesattn.training.lightning.BayesianLightningModule`,
:func:`~bayesattn.uncertainty.predict` and :mod:`~bayesattn.diagnostics` call a network only
through the members of :class:`NetworkContract`. Write a network by subclassing
:class:`~bayesattn.nn.networks.BayesianNetwork` and implementing the two **required** methods:

* ``forward_logits(x, y=None, num_samples=1) -> logits`` ``(*S, B, ..., C)``: one pass, in the
  attention mode and Pyro context the caller set up; with ``num_samples = S > 1`` the ``S``
  posterior draws travel as a leading sample dim;
* ``targets(x, y) -> (targets, mask, event_dims)``: what the likelihood scores.

The **optional** methods have defaults in the base class: ``check_batch(x, y)`` (input
validation; the default checks tensors and batch sizes) and ``likelihood(logits, mask,
event_dims)`` (the observation distribution; the default is categorical). The base class
**provides** the rest from them:

.. math::
    \text{model:}\quad \theta\sim p(\theta),\quad
    w_b\sim p(w\mid x_b),\quad y_b\sim\text{likelihood}(\text{forward\_logits}(x_b; w_b, \theta))
    \quad(b\in\text{plate "data" of size }N)

``guide`` draws :math:`w_b\sim q(w\mid x_b)` (the attention posteriors) and
:math:`\theta\sim q(\theta)` (``weight_guide``, if projection weights are Bayesian);
``elbo_loss`` is the same negative ELBO in one pass; ``forward`` gives deterministic logits
(posterior-mean attention). ``weight_sites()``, ``weight_prior_model()``, ``weights_from(values)``,
``weight_guide`` and ``pyro_context`` are the weight-space pieces that
:func:`~bayesattn.nn.weights.bayesian_projections` and ``predict`` use.

:class:`~bayesattn.training.lightning.BayesianLightningModule` also reads an ``int`` attribute
``num_classes`` (the size ``C`` of the logits' last dim) for its accuracy and calibration metrics;
the built-in networks have it (or their vocabulary size), a user network sets it itself.

:class:`NetworkContract` is a ``runtime_checkable`` :class:`typing.Protocol`: ``isinstance(net,
NetworkContract)`` checks that every member exists; :func:`check_network` says which are missing.

The sample dim of a pass is spelled ``num_samples`` (shape letter ``S``) everywhere, as in
``predict(net, x, num_samples)``; ``num_particles`` is kept only for the Monte-Carlo samples of an
ELBO estimate (Pyro's ``Trace_ELBO(num_particles=)``, ``TrainConfig.num_particles``,
``elbo_loss``). A network whose ``forward_logits`` or ``forward`` still declares ``num_particles``
(its spelling before 0.4) is refused with a ``TypeError`` (:func:`check_sample_argument`), both when a
:class:`~bayesattn.nn.networks.BayesianNetwork` subclass is created and by :func:`check_network`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from pyro.distributions import TorchDistribution
from pyro.infer.autoguide import AutoGuide
from torch import Tensor, nn

__all__ = [
    "NetworkContract",
    "REQUIRED",
    "OPTIONAL",
    "PROVIDED",
    "SAMPLE_ARGUMENT",
    "check_network",
    "check_sample_argument",
]

#: Methods a network must implement (no default in ``BayesianNetwork``).
REQUIRED: tuple[str, ...] = ("forward_logits", "targets")
#: Methods with a default in ``BayesianNetwork`` that a network may override.
OPTIONAL: tuple[str, ...] = ("check_batch", "likelihood")
#: Members ``BayesianNetwork`` builds from the above (override only with care).
PROVIDED: tuple[str, ...] = (
    "forward",
    "model",
    "guide",
    "elbo_loss",
    "bayesian_layers",
    "weight_guide",
    "weight_sites",
    "weight_prior_model",
    "weights_from",
    "pyro_context",
)
#: The name of the sample-count argument of ``forward_logits`` and ``forward``, and the
#: methods that take it (a network declaring the old spelling ``num_particles`` is refused).
SAMPLE_ARGUMENT: str = "num_samples"
_SAMPLE_METHODS: tuple[str, ...] = ("forward_logits", "forward")
_OLD_SAMPLE_ARGUMENT = "num_particles"
#: The 0.2 private names of the contract's methods, ``{old: new}``: kept as aliases through 0.3,
#: removed in 0.4 (a subclass defining only an old name is refused; it would never be called).
REMOVED_PRIVATE_NAMES: dict[str, str] = {
    "_forward_logits": "forward_logits",
    "_targets": "targets",
    "_check_batch": "check_batch",
    "_obs_dist": "likelihood",
    "_weights_from": "weights_from",
    "_weight_prior_model": "weight_prior_model",
}


@runtime_checkable
class NetworkContract(Protocol):
    """Everything the trainers, ``predict`` and the diagnostics call on a network.

    Shapes: ``x`` ``(B, ...)`` as the network takes it, ``y`` ``(B, ...)`` or ``None``; logits
    ``(*S, B, ..., C)`` (the sample dim ``S`` only when ``num_samples > 1``; ``...`` e.g. ``T``
    for per-token predictions); ``targets``/``mask`` ``(B, ...)``.
    """

    #: Autoguide over Bayesian projection weights :math:`q(\theta)`, or ``None``.
    weight_guide: AutoGuide | None

    # ---- required ----------------------------------------------------------------------------
    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        """Logits ``(*S, B, ..., C)`` of one pass in the current attention mode (required)."""
        ...

    def targets(self, x: Tensor, y: Tensor | None) -> tuple[Tensor | None, Tensor | None, int]:
        """``(targets (B, ...) or None, mask (B, ...) or None, event_dims)`` (required)."""
        ...

    # ---- optional (defaults in BayesianNetwork) ----------------------------------------------
    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        """Raise ``TypeError``/``ValueError`` on a bad batch, naming argument and shape."""
        ...

    def likelihood(self, logits: Tensor, mask: Tensor | None, event_dims: int) -> TorchDistribution:
        """:math:`p(y\\mid x, w)` with ``log_prob(targets)`` of shape ``(*S, B)``."""
        ...

    # ---- provided by BayesianNetwork ---------------------------------------------------------
    def forward(self, x: Tensor, y: Tensor | None = None, num_samples: int = 1) -> Tensor:
        """Deterministic logits (posterior-mean attention) unless a mode is set."""
        ...

    def model(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> Tensor:
        """Pyro model: priors, then ``pyro.sample("obs", likelihood, obs=targets)`` in a plate."""
        ...

    def guide(self, x: Tensor, y: Tensor | None = None, num_data: int | None = None) -> None:
        """Pyro guide: attention posteriors and the weight autoguide."""
        ...

    def elbo_loss(
        self,
        x: Tensor,
        y: Tensor | None,
        num_data: int | None = None,
        beta: float = 1.0,
        num_particles: int = 1,
    ) -> tuple[Tensor, Tensor]:
        """``(negative ELBO scaled to num_data, logits (*S, B, ..., C))`` in one pass; the
        ``num_particles`` Monte-Carlo samples of the estimate are the pass's ``S`` samples."""
        ...

    @property
    def bayesian_layers(self) -> list[str]:
        """Module paths of the attention layers with a family."""
        ...

    def weight_sites(self) -> list[tuple[nn.Module, str, str]]:
        """``(module, attribute, site name)`` of each Bayesian projection weight."""
        ...

    def weight_prior_model(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        """Draw the Bayesian weights from their prior: ``{site name: value}``."""
        ...

    def weights_from(
        self, values: dict[str, Tensor] | None
    ) -> contextlib.AbstractContextManager[None]:
        """Context manager using given values for the Bayesian weights."""
        ...

    @property
    def pyro_context(self) -> contextlib.AbstractContextManager[Any]:
        """The network's Pyro module context, entered around ``forward_logits``."""
        ...


def check_sample_argument(owner: Any, methods: Mapping[str, Any] | None = None) -> None:
    """Raise a ``TypeError`` if ``forward_logits`` or ``forward`` of ``owner`` (a network class or
    object) declares the pre-0.4 argument ``num_particles``: the sample count of a pass is
    ``num_samples``. ``methods`` (``{name: function}``, e.g. a class's ``__dict__``) limits the
    check to those given (a class's own definitions); by default both are looked up on
    ``owner``. No alias is accepted: the argument must be renamed."""
    label = owner.__name__ if isinstance(owner, type) else type(owner).__name__
    if methods is None:
        methods = {m: getattr(owner, m) for m in _SAMPLE_METHODS if hasattr(owner, m)}
    for m in _SAMPLE_METHODS:
        fn = methods.get(m)
        if fn is None or not callable(fn):
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            continue
        if _OLD_SAMPLE_ARGUMENT in params:
            raise TypeError(
                f"{label}.{m}() declares the argument {_OLD_SAMPLE_ARGUMENT!r}: the sample dim of "
                f"a forward pass is spelled {SAMPLE_ARGUMENT!r} since 0.4; rename the argument "
                f"to {SAMPLE_ARGUMENT} ({m}(x, y=None, {SAMPLE_ARGUMENT}=1), logits "
                "(*S, B, ..., C); see bayesattn.nn.contract)"
            )


def check_network(network: Any, name: str = "network") -> Any:
    """Return ``network`` if it has every member of :class:`NetworkContract`; otherwise raise a
    ``TypeError`` naming the missing ones (required methods first), or naming a
    ``forward_logits``/``forward`` that still declares ``num_particles`` (rename it
    ``num_samples``)."""
    missing = [m for m in REQUIRED + OPTIONAL + PROVIDED if not hasattr(network, m)]
    if missing:
        raise TypeError(
            f"{name} ({type(network).__name__}) does not implement the bayesattn network "
            f"contract: missing {', '.join(missing)} (subclass bayesattn.nn.BayesianNetwork and "
            f"implement {' and '.join(REQUIRED)}; see bayesattn.nn.contract)"
        )
    check_sample_argument(network)
    return network
