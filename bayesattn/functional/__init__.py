r"""The functional layer: pure tensor maths of attention read as Bayesian inference, below every
module and network of the package (it imports only torch, Pyro and :mod:`bayesattn._validation`).

* :mod:`~bayesattn.functional.posterior`: logits, masks as log-priors, the exact posterior
  :math:`\bar p_{ij} = \operatorname{softmax}_j(\log\pi_{ij} + q_i\cdot k_j/\sqrt d)`, the read
  :math:`y_i = \sum_j \bar p_{ij} v_j`, entropy and the uncertainty decomposition. Its public
  functions are re-exported here (``bayesattn.functional.posterior_weights`` etc.).
* :mod:`~bayesattn.functional.supports`: reduced key supports (block-local, top-k, cluster top-k,
  low-rank) and tiled exact attention in :math:`O(T)` memory.
* :mod:`~bayesattn.functional.gaussian_process`: covariance functions, the sparse-GP posterior and
  its KL, random Fourier features.
* :mod:`~bayesattn.functional.mixture`: a mixture of Gaussians over rank-1 weight factors, its KL
  bounds and their Monte-Carlo check.
* :mod:`~bayesattn.functional.niw`: the conjugate Normal–inverse-Wishart model of one class's
  features (posterior, Student-t predictive, closed-form KL, draws).
* :mod:`~bayesattn.functional.alignment`: a categorical alignment over source positions as a latent
  variable: the exact mixture likelihood, its Bayes-rule posterior, KL, entropy and disagreement.
"""

from __future__ import annotations

from . import alignment, gaussian_process, mixture, niw, posterior, supports
from .posterior import (
    allowed_keys,
    attend,
    attention,
    attention_logits,
    causal_log_prior,
    check_finite,
    entropy,
    log_posterior_weights,
    mask_to_log_prior,
    posterior_logits,
    posterior_weights,
    uncertainty_decomposition,
)

__all__ = [
    "attention_logits",
    "causal_log_prior",
    "mask_to_log_prior",
    "posterior_logits",
    "posterior_weights",
    "log_posterior_weights",
    "allowed_keys",
    "attend",
    "attention",
    "check_finite",
    "entropy",
    "uncertainty_decomposition",
    "posterior",
    "supports",
    "gaussian_process",
    "mixture",
    "niw",
    "alignment",
]
