"""Bayesian attention inside models you did not write.

* :mod:`bayesattn.interop.convert` — :func:`convert` swaps every ``torch.nn.MultiheadAttention``
  of any ``nn.Module`` for a :class:`~bayesattn.nn.attention.BayesianMultiheadAttention` (same
  weights, same mean-mode outputs, Pyro sites named by module path); :func:`unconvert` goes back.
* :mod:`bayesattn.interop.hf` — Hugging Face ``transformers`` models through their
  ``AttentionInterface`` (optional extra ``bayesattn[hf]``; imported lazily).
* :mod:`bayesattn.interop.posthoc` — post-hoc calibration of a trained model: frozen weights,
  attention posteriors and a temperature fitted by SVI, posterior-predictive probabilities.
* :mod:`bayesattn.interop.posthoc_gp` — post hoc without converting anything: a random-feature
  GP read of the features a trained model's head reads (torch or Hugging Face), its samples and
  its mean-field predictive (a temperature that grows with the GP variance).
* :mod:`bayesattn.interop.posthoc_mixture` — post hoc on the attention itself: a K-component
  mixture over rank-1 factors of the attention projections of a frozen model, fitted by the ELBO
  in one vectorised pass (hooks from :mod:`bayesattn.interop.rank1_hooks`).
"""

from .convert import bayesian_attention_modules, convert, unconvert

__all__ = ["convert", "unconvert", "bayesian_attention_modules"]
