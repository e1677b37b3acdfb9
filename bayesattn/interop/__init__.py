"""Bayesian attention inside models you did not write.

* :mod:`bayesattn.interop.convert` — :func:`convert` swaps every ``torch.nn.MultiheadAttention``
  of any ``nn.Module`` for a :class:`~bayesattn.nn.attention.BayesianMultiheadAttention` (same
  weights, same mean-mode outputs, Pyro sites named by module path); :func:`unconvert` goes back.
* :mod:`bayesattn.interop.hf` — Hugging Face ``transformers`` models through their
  ``AttentionInterface`` (optional extra ``bayesattn[hf]``; imported lazily).
* :mod:`bayesattn.interop.recipe` — which attention modules a conversion touches.

The post-hoc reads of a trained model (temperature, density, GP, attention SVI, rank-1 mixture)
are in :mod:`bayesattn.posthoc`; the modules ``interop.posthoc``, ``interop.posthoc_gp``,
``interop.posthoc_mixture``, ``interop.class_density`` and ``interop.rank1_hooks`` keep their old
names for one release, with a ``DeprecationWarning``.
"""

from .convert import bayesian_attention_modules, convert, unconvert

__all__ = ["convert", "unconvert", "bayesian_attention_modules"]
