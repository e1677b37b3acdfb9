"""bayesattn: attention as explicit Bayesian inference, with calibrated uncertainty.

For a query q the attention weight on key k_j is the posterior
p(j | q) ∝ π_j · exp(q·k_j/√d) under a prior π over key relevance. This package makes the prior,
the likelihood and the posterior explicit (Pyro models, exact enumeration), makes the weights
uncertain (variational families), and builds trainable Bayesian transformers and the tools to
check their uncertainty (calibration, OOD, ArviZ diagnostics).

Heavy optional pieces (ArviZ, matplotlib, scikit-learn) are imported only when used:
``bayesattn.diagnostics``, ``bayesattn.plots`` and ``bayesattn.data`` load them lazily.
``bayesattn.training.lightning`` needs the ``lightning`` extra and is imported only when asked for.

Families, priors and reduced key supports of your own join by name with ``register_family``,
``register_prior`` and ``register_support`` (:mod:`bayesattn.registry`, ``docs/extending.md``).
"""

from __future__ import annotations

import importlib
from typing import Any

from . import functional
from .families import (
    AttentionFamily,
    ConcreteWeights,
    DirichletWeights,
    LogisticNormalWeights,
    WeibullWeights,
    list_families,
    register_family,
)
from .interop.convert import convert, unconvert
from .nn import (
    AttentionConfig,
    BayesianMultiheadAttention,
    CausalLM,
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    Seq2Seq,
    TransformerClassifier,
    VisionTransformer,
    attention_mode,
    bayesian_projections,
    collect_kl,
)
from .nn.sampling import num_samples
from .nn.supports import list_supports, register_support
from .priors import (
    CausalPrior,
    ContextualPrior,
    DistanceDecayPrior,
    KeyRelevancePrior,
    LearnedPrior,
    LocalWindowPrior,
    UniformPrior,
    list_priors,
    register_prior,
)

__version__ = "0.5.0"

_SUBMODULES = (
    "calibration",
    "data",
    "diagnostics",
    "geometry",
    "models",
    "plots",
    "predictive",
    "uncertainty",
    "cli",
    "training",
    "families",
    "distributions",
)

__all__ = [
    "functional",
    "KeyRelevancePrior",
    "UniformPrior",
    "CausalPrior",
    "LocalWindowPrior",
    "DistanceDecayPrior",
    "LearnedPrior",
    "ContextualPrior",
    "AttentionFamily",
    "DirichletWeights",
    "LogisticNormalWeights",
    "WeibullWeights",
    "ConcreteWeights",
    "BayesianMultiheadAttention",
    "AttentionConfig",
    "EncoderLayer",
    "DecoderLayer",
    "Encoder",
    "Decoder",
    "TransformerClassifier",
    "VisionTransformer",
    "Seq2Seq",
    "CausalLM",
    "bayesian_projections",
    "attention_mode",
    "collect_kl",
    "convert",
    "unconvert",
    "num_samples",
    "register_family",
    "register_prior",
    "register_support",
    "list_families",
    "list_priors",
    "list_supports",
    *_SUBMODULES,
]


def __getattr__(name: str) -> Any:
    """Submodules are imported on first use (``bayesattn.diagnostics`` etc.)."""
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'bayesattn' has no attribute {name!r}")
