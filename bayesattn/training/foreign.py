"""Deprecated: :class:`~bayesattn.nn.networks.ModuleClassifier` and
:func:`~bayesattn.nn.networks.foreign.as_network` live in :mod:`bayesattn.nn.networks.foreign`
(where the networks live); this path warns and is removed in the next release."""

from __future__ import annotations

from .._deprecation import moved_module
from ..nn.networks import foreign as _new

__all__: list[str] = []

__getattr__ = moved_module(__name__, _new, ("ModuleClassifier", "as_network"))
