"""Deprecated: the post-hoc GP read moved to :mod:`bayesattn.posthoc`
(:class:`~bayesattn.posthoc.GPRead`); these names keep working for one release with a
``DeprecationWarning`` (migration table in ``docs/posthoc-reads.md``)."""

from __future__ import annotations

from .._deprecation import moved_names

__all__: list[str] = []

_CORE = "bayesattn.posthoc._gp_core"
__getattr__ = moved_names(__name__, {
    "PosthocGP": (_CORE, "PosthocGP", "bayesattn.posthoc.GPRead"),
    "fit_posthoc_gp": (_CORE, "fit_posthoc_gp", "bayesattn.posthoc.GPRead(model).fit"),
    "_fit_mean_field": (_CORE, "_fit_mean_field", "bayesattn.calibration.fit_variance_temperature"),
    "_mean_field": (_CORE, "_mean_field", "bayesattn.calibration.variance_tempered"),
})  # fmt: skip
