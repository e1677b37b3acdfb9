"""Deprecated: post-hoc SVI calibration of a converted model moved to :mod:`bayesattn.posthoc`
(:class:`~bayesattn.posthoc.AttentionRead`); these names keep working for one release with a
``DeprecationWarning`` (migration table in ``docs/posthoc-reads.md``)."""

from __future__ import annotations

from .._deprecation import moved_names

__all__: list[str] = []

_CORE = "bayesattn.posthoc._svi_core"
__getattr__ = moved_names(__name__, {
    "PosthocCalibration": (_CORE, "PosthocCalibration", "bayesattn.posthoc.AttentionRead"),
    "fit_posthoc": (_CORE, "fit_posthoc", "bayesattn.posthoc.AttentionRead(model).fit"),
    "sample_probs": (_CORE, "sample_probs", "bayesattn.posthoc.AttentionRead(model).predict"),
    "mean_probs": (_CORE, "mean_probs", "bayesattn.uncertainty.predict(..., mode='mean')"),
    "evaluate": (_CORE, "evaluate", "bayesattn.posthoc._svi_core.evaluate"),
    "family_parameters": (_CORE, "family_parameters", "bayesattn.posthoc._svi_core.family_parameters"),
    "freeze_for_posthoc": (_CORE, "freeze_for_posthoc",
                           "bayesattn.posthoc._svi_core.freeze_for_posthoc"),
})  # fmt: skip
