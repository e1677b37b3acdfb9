r"""The network contract: what a network must provide to be trained, sampled and diagnosed.

:class:`~bayesattn.training.Trainer` (and ``fit``), :class:`~bayesattn.training.lightning.BayesianLightningModule`,
:func:`~bayesattn.uncertainty.predict` and :mod:`~bayesattn.diagnostics` call a network only
through the members of :class:`NetworkContract`. Write a network by subclassing
:class:`~bayesattn.nn.networks.BayesianNetwork` and implementing the two **required** methods:

* ``forward_logits(x, y=None, num_particles=1) -> logits`` ``(*P, B, ..., C)``: one pass, in the
  attention mode and Pyro context the caller set up; with ``num_particles = P > 1`` the ``P``
  posterior draws travel as a leading dim;
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
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol, runtime_checkable

from pyro.distributions import TorchDistribution
from pyro.infer.autoguide import AutoGuide
from torch import Tensor, nn

__all__ = ["NetworkContract", "REQUIRED", "OPTIONAL", "PROVIDED", "check_network"]

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
#: The 0.2 private names, kept as aliases: ``{old: new}``.
PRIVATE_ALIASES: dict[str, str] = {
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
    ``(*P, B, ..., C)`` (``P`` particles only when ``num_particles > 1``; ``...`` e.g. ``T`` for
    per-token predictions); ``targets``/``mask`` ``(B, ...)``.
    """

    #: Autoguide over Bayesian projection weights :math:`q(\theta)`, or ``None``.
    weight_guide: AutoGuide | None

    # ---- required ----------------------------------------------------------------------------
    def forward_logits(self, x: Tensor, y: Tensor | None = None, num_particles: int = 1) -> Tensor:
        """Logits ``(*P, B, ..., C)`` of one pass in the current attention mode (required)."""
        ...

    def targets(self, x: Tensor, y: Tensor | None) -> tuple[Tensor | None, Tensor | None, int]:
        """``(targets (B, ...) or None, mask (B, ...) or None, event_dims)`` (required)."""
        ...

    # ---- optional (defaults in BayesianNetwork) ----------------------------------------------
    def check_batch(self, x: Tensor, y: Tensor | None) -> None:
        """Raise ``TypeError``/``ValueError`` on a bad batch, naming argument and shape."""
        ...

    def likelihood(self, logits: Tensor, mask: Tensor | None, event_dims: int) -> TorchDistribution:
        """:math:`p(y\\mid x, w)` with ``log_prob(targets)`` of shape ``(*P, B)``."""
        ...

    # ---- provided by BayesianNetwork ---------------------------------------------------------
    def forward(self, x: Tensor, y: Tensor | None = None, num_particles: int = 1) -> Tensor:
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
        """``(negative ELBO scaled to num_data, logits)`` in one pass."""
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


def check_network(network: Any, name: str = "network") -> Any:
    """Return ``network`` if it has every member of :class:`NetworkContract`; otherwise raise a
    ``TypeError`` naming the missing ones (required methods first)."""
    missing = [m for m in REQUIRED + OPTIONAL + PROVIDED if not hasattr(network, m)]
    if missing:
        raise TypeError(
            f"{name} ({type(network).__name__}) does not implement the bayesattn network "
            f"contract: missing {', '.join(missing)} (subclass bayesattn.nn.BayesianNetwork and "
            f"implement {' and '.join(REQUIRED)}; see bayesattn.nn.contract)"
        )
    return network
