r"""The uncertainty study: several ways of being uncertain, trained and scored on the same runs.

A **run** is a data set (the 8×8 digits, MNIST-1D sequences, the fortunes' tokens: a registry,
:mod:`.datasets`, one file each), a held-out class pair (the
out-of-distribution classes; ``holdout_rotation=K`` rotates over ``K`` disjoint pairs) and a
seed (its own split, initialisation and sampling). Every registered method (:mod:`.methods`:
the deterministic network, temperature scaling, MC dropout, deep ensembles and their size
curve, kNN and relative-Mahalanobis feature scores, last-layer Laplace, the last-layer and the
every-layer Bayesian attentions, Bayesian projection weights) is fitted and scored on every run
(:mod:`.metrics`); numbers are pooled over runs with 95% t-intervals and paired differences
(:mod:`.stats`, :mod:`.protocol`) and written as ``results.json`` (every run's numbers and the
configuration), ``report.md`` (:mod:`.report`) and figures (:mod:`.figures`).

Modules: :mod:`.config` (:class:`StudyConfig`), :mod:`.datasets` (the data sets:
:class:`StudyDataset`, :func:`register_dataset`), :mod:`.runs` (one run's data and networks),
:mod:`.methods` (the registry), :mod:`.scores` (kNN, Mahalanobis), :mod:`.metrics`,
:mod:`.stats`, :mod:`.protocol` (:func:`run_study`), :mod:`.report`, :mod:`.figures`.
"""

from __future__ import annotations

from . import (
    density_methods,  # noqa: F401 - registers the density read (issue 30)
    mixture_methods,  # noqa: F401 - registers mixture* (issue 30)
    word_methods,  # noqa: F401 - registers the methods for words
)
from ._compat import _train, _vit  # noqa: F401 - the 0.3 names benchmark scripts import
from .config import DATASETS, DEFAULT_ROTATION, MODEL_DEFAULTS, StudyConfig
from .datasets import FULL_DATASETS, StudyDataset, get_dataset, register_dataset
from .merge import merge_studies
from .methods import (
    DEFAULT_METHODS,
    FULL_METHODS,
    METHODS,
    Fitted,
    Method,
    get_method,
    register_method,
)
from .protocol import run_study
from .report import format_table

__all__ = [
    "StudyConfig",
    "METHODS",
    "DEFAULT_METHODS",
    "FULL_METHODS",
    "DATASETS",
    "FULL_DATASETS",
    "StudyDataset",
    "register_dataset",
    "get_dataset",
    "DEFAULT_ROTATION",
    "MODEL_DEFAULTS",
    "Method",
    "Fitted",
    "register_method",
    "get_method",
    "run_study",
    "merge_studies",
    "format_table",
]
