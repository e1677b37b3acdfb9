r"""KL annealing: the weight :math:`\beta` of the KL term (:func:`kl_beta`) and
:class:`ScaleLatents`, the messenger that applies it to every latent sample site with the SVI method,
and :class:`AnnealedPair`, a network's model and guide under it (what SVI steps on)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample
from torch import Tensor

if TYPE_CHECKING:
    from pyro.poutine.runtime import Message

__all__ = ["kl_beta", "ScaleLatents", "AnnealedPair"]


def kl_beta(step: int, anneal_steps: int, start: float = 1e-3, final: float = 1.0) -> float:
    r"""KL weight at (0-based) optimiser step ``step``: ``final·start`` at step 0, rising linearly
    to ``final`` at ``anneal_steps`` and staying there; ``final`` when ``anneal_steps == 0``.

    .. math:: \beta_s = \beta_{\max}\big(\beta_0 + (1 - \beta_0)\min(1, s / S_{\text{anneal}})\big)

    ``final = 1`` is the ELBO; ``final < 1`` a tempered ELBO (a KL weight, as used for local
    attention latents whose KL would otherwise swamp a one-label-per-example likelihood).
    """
    if anneal_steps <= 0:
        return final
    return final * (start + (1.0 - start) * min(1.0, step / anneal_steps))


class ScaleLatents(Messenger):
    r"""Multiply the log-density scale of every *latent* sample site by :math:`\beta`.

    Observed sites (``"obs"``, and ``pyro.deterministic`` sites, which are observed) and plate
    subsample sites are left alone, so under a guide/model pair both wrapped in it the ELBO
    becomes :math:`E_q[\log p(y\mid w)] - \beta\,\mathrm{KL}(q\|p)`: the KL-annealed objective.
    ``beta`` may be a float or a zero-argument callable read at every site.

    Example::

        with ScaleLatents(0.1):
            tr = poutine.trace(net.guide).get_trace(x, y)  # latent sites: scale × 0.1
    """

    def __init__(self, beta: float | Callable[[], float] = 1.0) -> None:
        super().__init__()
        self.beta = beta

    def _process_message(self, msg: Message) -> None:
        if msg["type"] != "sample" or msg["is_observed"] or site_is_subsample(msg):
            return
        beta = self.beta() if callable(self.beta) else self.beta
        if beta <= 0:
            raise ValueError(f"ScaleLatents needs beta > 0; got {beta}")
        msg["scale"] = beta * msg["scale"]


class AnnealedPair:
    r"""A network's ``model`` and ``guide``, both under one :class:`ScaleLatents` (so the ELBO
    they define is KL-annealed by ``beta``), keeping the logits each model call returns.

    ``pair.model``/``pair.guide`` go to a Pyro ELBO in place of the network's own;
    :meth:`pop_logits` then gives the logits of the particles just run. ``network`` is any
    object with the contract's ``model``/``guide`` (:mod:`bayesattn.nn.contract`).
    """

    def __init__(self, network: Any, beta: float | Callable[[], float] = 1.0) -> None:
        missing = [m for m in ("model", "guide") if not callable(getattr(network, m, None))]
        if missing:
            raise TypeError(
                f"network must have callable model and guide methods; "
                f"{type(network).__name__} lacks {missing}"
            )
        self.network = network
        self.anneal = ScaleLatents(beta)
        self._logits: list[Tensor] = []

    def model(self, *args: Any, **kwargs: Any) -> Tensor:
        with self.anneal:
            logits = self.network.model(*args, **kwargs)
        self._logits.append(logits.detach())
        return logits

    def guide(self, *args: Any, **kwargs: Any) -> Any:
        with self.anneal:
            return self.network.guide(*args, **kwargs)

    def pop_logits(self) -> Tensor:
        """The (detached) logits of the model calls since the last pop: as returned for one
        call, stacked ``(P, ...)`` for ``P`` sequential particles; then forgets them."""
        logits, self._logits = self._logits, []
        if not logits:
            raise RuntimeError("pop_logits: the model has not run since the last pop")
        return logits[0] if len(logits) == 1 else torch.stack(logits)

    def clear(self) -> None:
        """Forget logits left by a step that did not finish."""
        self._logits = []
