r"""The study's mixture-posterior methods (issue 30, item 1): a global K-component mixture over
rank-1 factors of the whole trunk (:mod:`bayesattn.nn.mixture`), K packed sub-trunks trained
once on the plain ELBO, and its ablations. Registered, not run unless named (``--methods``):

``mixture``
    K = 4 Gaussian components (the full mixture).
``mixture_point``
    the same K point masses, no spread and no KL: a packed ensemble.
``mixture_k1``
    K = 1 with spread: a unimodal rank-1 posterior (today's single-mode Bayesian trunk).
``mixture_wide``
    the full mixture on a trunk twice as wide (``d_model`` and ``dim_feedforward`` × 2,
    Packed-Ensembles' α = 2).
``mixture_k2``
    K = 2 Gaussian components: the cheaper trade-off (a training step costs about K passes).

Settings (all): prior :math:`\mathcal N(1, 0.3^2)`, component means :math:`1 + 0.25\,
\varepsilon`, initial std 0.05, the dataset's epochs, batch size and learning rate. Chosen on
the in-distribution validation split of one digits run (held-out pair 2/7, seed 0; val NLL of
the K=4 mixture: spread 0.5 → .295, 0.25 → .167, 0.15 → .188; prior std 1 → .167, 0.3 → .153;
initial std 0.2 → .441; half the epochs underfits, .50; batch × 2 underfits, .36).

Each reports its global KL (the convexity upper bound, nats; 0 for point masses) and predicts
with ``num_samples`` rounded up to a multiple of K, stratified over the components. The
hyperparameters (K, :math:`s_0`, the initial spread and std) were chosen on in-distribution
validation NLL/accuracy only, never on held-out classes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from ..nn.mixture import rank1_mixture
from ..nn.networks import BayesianNetwork
from ..uncertainty import PredictionResult, predict
from .methods import Fitted, Method, register_method
from .runs import Run

__all__ = ["MixtureMethod", "MIXTURE_METHODS"]

_BATCH = 512


class MixtureMethod(Method):
    """A network with a :func:`~bayesattn.nn.mixture.rank1_mixture` posterior, trained with
    :meth:`Run.train` (the hybrid ELBO, ``kl_weight = 1``; the study's KL annealing when the
    components have spread) and predicted through :func:`bayesattn.uncertainty.predict`.

    Args:
        name, description: the registry entry.
        num_components: K.
        spread: Gaussian components (``False``: K point masses, a packed ensemble).
        width: the factor on ``d_model`` and ``dim_feedforward``.
        prior_std, init_spread, init_std: as :func:`~bayesattn.nn.mixture.rank1_mixture`.
        batch_factor, epoch_factor: the run's batch size and epochs are multiplied by these
            (a step evaluates all K sub-trunks, so a larger batch amortises its overhead).
    """

    def __init__(
        self,
        name: str,
        description: str,
        num_components: int = 4,
        spread: bool = True,
        width: int = 1,
        prior_std: float = 0.3,
        init_spread: float = 0.25,
        init_std: float = 0.05,
        batch_factor: int = 1,
        epoch_factor: float = 1.0,
    ) -> None:
        self.name, self.description = name, description
        self.batch_factor, self.epoch_factor = batch_factor, epoch_factor
        self.num_components, self.spread, self.width = num_components, spread, width
        self.prior_std, self.init_spread, self.init_std = prior_std, init_spread, init_std

    def network(self, run: Run) -> BayesianNetwork:
        """A fresh network of the run's architecture (``width`` × wider), with the mixture."""
        if self.width != 1:
            m = run.model
            cfg = dataclasses.replace(
                run.cfg,
                d_model=self.width * m["d_model"],
                dim_feedforward=self.width * m["dim_feedforward"],
            )
            run = dataclasses.replace(run, cfg=cfg, cache={})
        net = run.network(None)
        rank1_mixture(
            net,
            self.num_components,
            prior_std=self.prior_std,
            init_spread=self.init_spread,
            init_std=self.init_std if self.spread else None,
        )
        return net

    def _training_run(self, run: Run) -> Run:
        if self.batch_factor == 1 and self.epoch_factor == 1.0:
            return run
        m = run.model
        cfg = dataclasses.replace(
            run.cfg,
            batch_size=self.batch_factor * m["batch_size"],
            epochs=max(1, round(self.epoch_factor * m["epochs"])),
        )
        return dataclasses.replace(run, cfg=cfg, cache={})

    def fit(self, run: Run) -> Fitted:
        torch.manual_seed(run.seed)
        net = self.network(run)
        secs = self._training_run(run).train(net, run.seed, bayes=self.spread, kl_weight=1.0)
        K = self.num_components
        S = K * math.ceil(run.cfg.num_samples / K)
        params: dict[str, Any] = {
            "num_components": K,
            "spread": self.spread,
            "width": self.width,
            "prior_std": self.prior_std,
            "init_spread": self.init_spread,
            "init_std": self.init_std if self.spread else None,
            "batch_factor": self.batch_factor,
            "epoch_factor": self.epoch_factor,
            "num_samples": S,
            "chosen_by": "validation NLL/accuracy (in-distribution), few runs",
        }
        return Fitted([net.eval()], secs, params, {"num_samples": S})

    def predict(self, fitted: Fitted, x: Tensor) -> PredictionResult:
        S = fitted.state["num_samples"]
        return predict(fitted.nets[0], x, S, batch_size=_BATCH, keep_attention=False)

    def posterior_kl(self, fitted: Fitted, run: Run) -> tuple[float, float]:
        """``(0, global KL)``: no per-example latents; the mixture's KL bound, in nats."""
        mix = fitted.nets[0].trunk_mixture
        if mix is None:
            raise ValueError(f"{self.name}: the fitted network has no trunk mixture")
        with torch.no_grad():
            return 0.0, float(mix.kl())


#: the registered mixture methods (issue 30): name -> method
MIXTURE_METHODS: dict[str, MixtureMethod] = {
    m.name: m
    for m in (
        MixtureMethod("mixture", "rank-1 mixture posterior over the trunk, K=4 Gaussians"),
        MixtureMethod("mixture_point", "the same K=4 point masses: a packed ensemble",
                      spread=False),
        MixtureMethod("mixture_k1", "rank-1 posterior over the trunk, one Gaussian (K=1)",
                      num_components=1),
        MixtureMethod("mixture_wide", "the K=4 mixture on a trunk twice as wide", width=2),
        MixtureMethod("mixture_k2", "the mixture with K=2 Gaussians (half the cost)",
                      num_components=2),
    )
}  # fmt: skip
for _m in MIXTURE_METHODS.values():
    register_method(_m)
