r"""The training objective, shared by both loops (:class:`~bayesattn.training.trainer.Trainer` and
:class:`~bayesattn.training.lightning.BayesianLightningModule`): the β-weighted negative ELBO per
training example,

.. math::
    \mathcal L_\beta = -\frac{1}{B}\sum_{b\in\text{batch}}\Big(E_q\log p(y_b\mid x_b, w_b)
    - \beta\,\mathrm{KL}\big(q(w_b\mid x_b)\,\|\,p(w_b\mid x_b)\big)\Big)
    + \frac{\beta}{N}\big(\mathrm{KL}_{\text{weights}} + \mathrm{KL}_{\text{global}}\big),

estimated with ``num_particles`` samples :math:`P` (averaged), β from :func:`kl_beta` at the
optimiser step. The network scales the minibatch to the data set size :math:`N` (``num_data``)
and charges the global KLs (Bayesian weights, sparse-GP inducing values:
:attr:`~bayesattn.nn.modes.KLCollector.global_terms`) once per pass; the objective divides by
:math:`N`. Two estimators (``TrainConfig.method``):

``"hybrid"``
    ``network.elbo_loss``: one network pass with analytic per-layer KLs; particles vectorised (a
    leading sample dim) or, with ``vectorize_particles=False``, ``P`` sequential passes.
``"svi"``
    Pyro's ``Trace_ELBO``/``TraceMeanField_ELBO`` of ``network.model`` against ``network.guide``,
    both under :class:`~bayesattn.training.kl.ScaleLatents` (the KL weight β).

:meth:`ElboObjective.loss` gives the differentiable loss (what Lightning back-propagates);
:meth:`ElboObjective.loss_and_grads` back-propagates itself, one particle graph at a time, and
returns the gradients in per-example units (what the ``Trainer`` steps on). Both give the logits
of the sampled pass, ``(*P, B, ...)``; :func:`predictive_scores` averages particles into the
posterior predictive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch import Tensor

from .config import TrainConfig
from .kl import AnnealedPair, kl_beta

__all__ = ["ElboObjective", "ObjectiveStep", "make_svi_elbo", "predictive_scores"]


def make_svi_elbo(config: TrainConfig) -> Trace_ELBO:
    """The Pyro ELBO of the SVI method: ``config.elbo`` (``"trace"``/``"meanfield"``) with
    ``config.num_particles`` particles (vectorised when ``config.vectorize_particles``)."""
    elbo_cls = Trace_ELBO if config.elbo == "trace" else TraceMeanField_ELBO
    return elbo_cls(
        num_particles=config.num_particles,
        vectorize_particles=config.vectorize_particles and config.num_particles > 1,
        max_plate_nesting=1,
    )


def predictive_scores(logits: Tensor, target_dims: int) -> Tensor:
    r"""Scores whose argmax is the prediction: the logits of one pass, or, with leading particle
    dims, the log of the particle-averaged probabilities :math:`\log\frac1P\sum_p
    \mathrm{softmax}(\ell_p)`.

    Shape:
        logits ``(*P, B, [T,] C)``, ``target_dims`` the dims of the targets (1 for ``(B,)``,
        2 for ``(B, T)``) → ``(B, [T,] C)``.
    """
    if logits.dim() <= target_dims + 1:
        return logits
    probs = torch.softmax(logits, -1).reshape((-1,) + logits.shape[-target_dims - 1 :])
    return probs.mean(0).log()  # (B, [T,] C)


@dataclass
class ObjectiveStep:
    """What :meth:`ElboObjective.loss_and_grads` leaves: the loss value (per example), the
    detached logits ``(*P, B, ...)`` and the parameters that received gradients."""

    loss: float
    logits: Tensor
    params: list[Tensor]


class ElboObjective:
    """The β-weighted negative ELBO per training example of ``network`` under ``config``
    (``method``, ``num_particles``, ``vectorize_particles``, ``elbo`` and the KL-annealing fields;
    see the module docstring).

    Attributes:
        beta: the KL weight of the step in progress (set by :meth:`set_step`).
        pair: the annealed model/guide pair the SVI estimator steps on.
        elbo: the Pyro ELBO (``None`` with the hybrid method).
    """

    def __init__(self, network: Any, config: TrainConfig) -> None:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a TrainConfig; got {type(config).__name__}")
        self.network = network
        self.config = config
        self.beta = 1.0
        self.pair = AnnealedPair(network, self.current_beta)  # a method: picklable
        self.elbo = make_svi_elbo(config) if config.method == "svi" else None

    def current_beta(self) -> float:
        """The KL weight of the step in progress (read by the annealed pair at every site)."""
        return self.beta

    def beta_at(self, step: int) -> float:
        """The KL weight at (0-based) optimiser step ``step`` (:func:`kl_beta`)."""
        c = self.config
        return kl_beta(step, c.kl_anneal_steps, c.kl_start, c.kl_weight)

    def set_step(self, step: int) -> float:
        """Set (and return) β for optimiser step ``step``."""
        self.beta = self.beta_at(step)
        return self.beta

    # ---- the differentiable loss (Lightning) ------------------------------------------------
    def loss(self, xb: Tensor, yb: Tensor | None, num_data: int) -> tuple[Tensor, Tensor]:
        """The loss per training example (differentiable, a scalar) and the detached logits
        ``(*P, B, ...)`` of the sampled pass; sequential particles are averaged in one graph."""
        c, net, n, beta = self.config, self.network, num_data, self.beta
        if c.method == "svi":
            assert self.elbo is not None
            self.pair.clear()
            loss = self.elbo.differentiable_loss(self.pair.model, self.pair.guide, xb, yb, n)
            return loss / n, self.pair.pop_logits()
        if c.num_particles == 1 or c.vectorize_particles:
            loss, logits = net.elbo_loss(
                xb, yb, num_data=n, beta=beta, num_particles=c.num_particles
            )
            return loss / n, logits.detach()
        losses, outs = [], []
        for _ in range(c.num_particles):
            loss, logits = net.elbo_loss(xb, yb, num_data=n, beta=beta)
            losses.append(loss)
            outs.append(logits.detach())
        return torch.stack(losses).mean() / n, torch.stack(outs)

    # ---- loss and gradients (Trainer) ---------------------------------------------------------
    def loss_and_grads(self, xb: Tensor, yb: Tensor | None, num_data: int) -> ObjectiveStep:
        """Back-propagate the loss per training example (gradients accumulate into ``.grad``;
        sequential particles one graph at a time) and return its value, the logits and the
        parameters that took part (the network's for hybrid; the traced Pyro params for SVI,
        like :meth:`pyro.infer.SVI.step`)."""
        if self.config.method == "svi":
            return self._svi_loss_and_grads(xb, yb, num_data)
        c, net, N, beta = self.config, self.network, num_data, self.beta
        if c.num_particles == 1 or c.vectorize_particles:
            loss, logits = net.elbo_loss(
                xb, yb, num_data=N, beta=beta, num_particles=c.num_particles
            )
            (loss / N).backward()
            total, logits = float(loss.detach()), logits.detach()
        else:  # sequential particles: average P one-particle estimates
            total, outs = 0.0, []
            for _ in range(c.num_particles):
                loss, logits = net.elbo_loss(xb, yb, num_data=N, beta=beta)
                (loss / (N * c.num_particles)).backward()
                total += float(loss.detach()) / c.num_particles
                outs.append(logits.detach())
            logits = torch.stack(outs)
        return ObjectiveStep(total / N, logits, list(net.parameters()))

    def _svi_loss_and_grads(self, xb: Tensor, yb: Tensor | None, N: int) -> ObjectiveStep:
        assert self.elbo is not None
        self.pair.clear()
        with poutine.trace(param_only=True) as capture:
            loss = self.elbo.loss_and_grads(self.pair.model, self.pair.guide, xb, yb, N)
        params, seen = [], set()
        for name, site in capture.trace.nodes.items():
            if site["value"] is None:  # pragma: no cover - Pyro records every param's value
                raise RuntimeError(f"param site {name!r} has no value")
            p = site["value"].unconstrained()
            if id(p) not in seen:
                seen.add(id(p))
                params.append(p)
        for p in params:
            if p.grad is not None:
                p.grad.div_(N)
        return ObjectiveStep(float(loss) / N, self.pair.pop_logits(), params)
