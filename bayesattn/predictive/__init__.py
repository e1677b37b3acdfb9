r"""The posterior predictive: one engine, :class:`Predictive`, and what it returns.

.. math:: p_s(c\mid x) = p(c\mid x, w_s, \theta_s), \qquad
          \bar p(c\mid x) = \frac1S\sum_{s=1}^S p_s(c\mid x)

* :mod:`~bayesattn.predictive.engine`: :class:`Predictive`, built from a network (ours, a converted
  torch/Hugging Face model, a list of ensemble members; MC dropout by ``dropout=True``) with
  ``num_samples`` and ``batch_size``; ``Predictive(...)(x)`` gives a :class:`PredictionResult`,
  ``.probs_and_targets(x, y)`` the averaged predictive per target (validation), ``.trace(x, y)``
  Pyro's ``Predictive`` on the network's model and guide (:class:`NetworkDraws`);
* :mod:`~bayesattn.predictive.alignment`: :func:`alignment_posterior`, the prior and posterior
  alignment of every target word of a ``Seq2Seq`` (:class:`AlignmentPosterior`);
* :mod:`~bayesattn.predictive.result`: :class:`PredictionResult` and :class:`AttentionSamples`;
* the passes: :mod:`~bayesattn.predictive.network` (a bayesattn network, ``S`` as a leading
  sample dim), :mod:`~bayesattn.predictive.foreign` (a model we did not write),
  :mod:`~bayesattn.predictive.trace` (guide draws, model replayed).

:func:`bayesattn.uncertainty.predict` and its baselines, the Lightning module's validation, the
study and the ArviZ export (:func:`bayesattn.diagnostics.predictive_to_arviz`) all call
:class:`Predictive`.

Example:
    >>> net = TransformerClassifier(2, vocab_size=8, attention=AttentionConfig("dirichlet"))
    >>> res = Predictive(net, num_samples=16)(torch.randint(1, 8, (4, 6)))
    >>> res.probs.shape
    torch.Size([16, 4, 2])
"""

from __future__ import annotations

from .alignment import AlignmentPosterior, alignment_posterior
from .engine import Predictive
from .result import AttentionSamples, PredictionResult
from .trace import NetworkDraws

__all__ = [
    "AlignmentPosterior",
    "AttentionSamples",
    "NetworkDraws",
    "PredictionResult",
    "Predictive",
    "alignment_posterior",
]
