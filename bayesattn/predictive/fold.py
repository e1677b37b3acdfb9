"""Deprecated: the fold (``FoldError``, ``FoldPlan``, ``fold_plan``, ``folded``) lives in
:mod:`bayesattn.nn.fold`, below the networks that sample by it; this path warns and is removed
in the next release."""

from __future__ import annotations

from .._deprecation import moved_module
from ..nn import fold as _new

__all__: list[str] = []

__getattr__ = moved_module(__name__, _new, ("FoldError", "FoldPlan", "fold_plan", "folded"))
