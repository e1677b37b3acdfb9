"""Explicit Pyro models of attention.

* :mod:`bayesattn.models.attention_read`: a single attention read (categorical ``z``, factor
  ``q·k/√d``), exact enumeration;
* :mod:`bayesattn.models.key_relevance`: online Dirichlet belief updates over key relevance;
* :mod:`bayesattn.models.regression`: a one-layer attention regression small enough for NUTS,
  the ground truth of :mod:`bayesattn.diagnostics.svi_nuts`.

Every public name of these modules is importable from ``bayesattn.models``.
"""

from .attention_read import (
    attention_model,
    exact_evidence,
    exact_posterior,
    fit_categorical_guide,
)
from .key_relevance import OnlineKeyRelevance, fit_relevance_guide, relevance_model
from .regression import (
    AttentionRegressionData,
    attention_regression_model,
    simulate_attention_regression,
)

__all__ = [
    "attention_model",
    "exact_posterior",
    "exact_evidence",
    "fit_categorical_guide",
    "OnlineKeyRelevance",
    "relevance_model",
    "fit_relevance_guide",
    # NUTS ground truth (also exported by bayesattn.diagnostics)
    "AttentionRegressionData",
    "simulate_attention_regression",
    "attention_regression_model",
]
