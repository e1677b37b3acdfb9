r"""KL annealing: the weight :math:`\beta` of the KL term (:func:`kl_beta`) and
:class:`ScaleLatents`, the messenger that applies it to every latent sample site with the SVI method."""

from __future__ import annotations

from collections.abc import Callable

from pyro.poutine.messenger import Messenger
from pyro.poutine.util import site_is_subsample

__all__ = ["kl_beta", "ScaleLatents"]


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

    def _process_message(self, msg) -> None:
        if msg["type"] != "sample" or msg["is_observed"] or site_is_subsample(msg):
            return
        beta = self.beta() if callable(self.beta) else self.beta
        if beta <= 0:
            raise ValueError(f"ScaleLatents needs beta > 0; got {beta}")
        msg["scale"] = beta * msg["scale"]
