"""Deprecated: the rank-1 factor hooks moved to :mod:`bayesattn.posthoc.rank1_hooks`; these
names keep working for one release with a ``DeprecationWarning``."""

from __future__ import annotations

from .._deprecation import moved_names

__all__: list[str] = []

_NEW = "bayesattn.posthoc.rank1_hooks"
__getattr__ = moved_names(__name__, {
    n: (_NEW, n, f"{_NEW}.{n}")
    for n in ("Rank1Site", "apply_factors", "rank1_sites", "hook_count")
})  # fmt: skip
