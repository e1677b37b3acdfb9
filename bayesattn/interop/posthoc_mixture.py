"""Deprecated: the post-hoc rank-1 mixture moved to :mod:`bayesattn.posthoc`
(:class:`~bayesattn.posthoc.MixtureRead`); these names keep working for one release with a
``DeprecationWarning`` (migration table in ``docs/posthoc-reads.md``)."""

from __future__ import annotations

from .._deprecation import moved_names

__all__: list[str] = []

_CORE = "bayesattn.posthoc._mixture_core"
__getattr__ = moved_names(__name__, {
    "PosthocMixture": (_CORE, "PosthocMixture", "bayesattn.posthoc.MixtureRead"),
    "fit_posthoc_mixture": (_CORE, "fit_posthoc_mixture",
                            "bayesattn.posthoc.MixtureRead(model).fit"),
    "factor_logits": (_CORE, "factor_logits", "bayesattn.posthoc._mixture_core.factor_logits"),
})  # fmt: skip
