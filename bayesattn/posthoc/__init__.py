r"""Post-hoc reads of a trained model: one shape, :class:`PosthocRead` (scikit-learn's
estimator API), the reads, one feature source.

.. code-block:: python

    read = DensityRead(model).fit(x_train, y_train, val=(x_val, y_val))
    res = read.predict(x_test)          # PredictionResult (S, B, C)
    score = read.score(x_test)          # (B,) OOD score
    torch.save(read.state_dict(), "read.pt")

* :mod:`~bayesattn.posthoc.base` — :class:`PosthocRead`: ``fit(features, y, *, val) -> self``
  (or a ``DataLoader``), ``predict(features, num_samples=None) -> PredictionResult``,
  ``score(features) -> (B,)``, ``kl() -> float``, ``state_dict``/``load_state_dict``;
* :mod:`~bayesattn.posthoc.features` — :class:`Features` ``(logits, cls, tokens)`` of one
  forward pass (our networks' ``forward_features``/``forward_head``; hooks on torch and Hugging
  Face models): :func:`extract_features`;
* the reads, one per module: :class:`TemperatureRead` (temperature scaling),
  :class:`DensityRead` (class-conditional NIW density of the features, density-aware
  temperature), :class:`GPRead` (random-feature GP on the head's input),
  :class:`AttentionRead` (SVI over a converted model's attention posteriors),
  :class:`MixtureRead` (a mixture over rank-1 factors of the attention projections);
* :mod:`~bayesattn.posthoc.text` -- :class:`TextDensityRead`, the recommended read of a token
  classifier: the density read of its CLS output + a bag of words' entropy, standardised;
* :mod:`~bayesattn.posthoc.ensemble` -- :class:`ReadEnsemble`, one read per network of a small
  ensemble, predictives and scores averaged (two density reads: the recipe for images).

The first three read :class:`Features` (or the model's inputs, extracted once); the attention and
mixture reads change the model's pass and read its inputs; the text read takes token ids (its
bag of words reads the words).
"""

from __future__ import annotations

from .attention import AttentionRead
from .base import PosthocRead
from .density import DensityRead
from .ensemble import ReadEnsemble
from .features import Features, extract_features
from .gp import GPRead
from .mixture import MixtureRead
from .temperature import TemperatureRead
from .text import TextDensityRead

__all__ = [
    "AttentionRead",
    "DensityRead",
    "Features",
    "GPRead",
    "MixtureRead",
    "PosthocRead",
    "ReadEnsemble",
    "TemperatureRead",
    "TextDensityRead",
    "extract_features",
]
