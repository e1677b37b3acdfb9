"""Calibration and uncertainty-quality metrics.

A functional core of pure functions.  Every function accepts :class:`torch.Tensor` inputs (NumPy
arrays and nested sequences are converted with ``torch.as_tensor(np.asarray(x))``, so Python
floats stay float64) and returns a Python ``float`` or a small dataclass of tensors.  All
reductions are computed in ``float64`` so results do not depend on the input precision beyond the
rounding of the inputs themselves.

Conventions shared by every function:

* ``probs`` is an ``(N, C)`` matrix of class probabilities: finite, non-negative, rows summing to
  1 within ``1e-3``.  ``labels`` is an ``(N,)`` integer tensor with values in ``[0, C)``.
* The *prediction* is ``argmax_c p_c``; on ties the first (lowest-index) maximal class wins
  (:func:`torch.argmax` semantics).  The *confidence* is ``max_c p_c``.
* ``uncertainty`` / OOD ``scores``: *higher* means *less certain* / *more likely OOD*.
* Bad input raises :class:`ValueError` (wrong shape, range or value) or :class:`TypeError` (wrong
  dtype / unconvertible object) with a message naming the argument and the shape seen.
"""

# public helpers of the package, outside __all__ (plots and user code check inputs with them)
from .alignment import alignment_error_rate, argmax_links, link_precision_recall
from .checks import Strategy as Strategy
from .checks import check_probs_labels as check_probs_labels
from .metrics import (
    ReliabilityCurve,
    accuracy,
    brier_score,
    expected_calibration_error,
    maximum_calibration_error,
    negative_log_likelihood,
    predictive_entropy,
    reliability_curve,
)
from .ood import check_ood_scores as check_ood_scores
from .ood import ood_aupr, ood_auroc
from .selective import (
    PAvPUCurve,
    RiskCoverage,
    accuracy_at_coverage,
    aurc,
    pavpu,
    pavpu_curve,
    risk_coverage_curve,
)
from .temperature import TemperatureScaler, fit_temperature
from .variance_temperature import fit_variance_temperature, variance_tempered

__all__ = [
    "PAvPUCurve",
    "ReliabilityCurve",
    "RiskCoverage",
    "TemperatureScaler",
    "accuracy",
    "alignment_error_rate",
    "argmax_links",
    "aurc",
    "accuracy_at_coverage",
    "brier_score",
    "expected_calibration_error",
    "fit_temperature",
    "fit_variance_temperature",
    "link_precision_recall",
    "maximum_calibration_error",
    "negative_log_likelihood",
    "ood_aupr",
    "ood_auroc",
    "pavpu",
    "pavpu_curve",
    "predictive_entropy",
    "reliability_curve",
    "risk_coverage_curve",
    "variance_tempered",
]
