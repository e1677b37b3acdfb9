"""Deprecated alias of :mod:`bayesattn.families` (until 0.4).

The variational families over attention weights are *families*, not posteriors: in this library
"posterior" means only the exact posterior ``p(j | q)`` (see ``docs/glossary.md``). Importing this
module warns; ``AttentionPosterior`` and ``get_posterior`` warn again when used.
"""

from __future__ import annotations

from typing import Any

from . import families as _families
from ._deprecation import warn_renamed
from .families import *  # noqa: F403
from .families import __all__ as _family_names

warn_renamed("bayesattn.posteriors", "bayesattn.families", "module", stacklevel=3)

__all__ = list(_family_names)  # the old names come from __getattr__, with a warning

_RENAMED = {"AttentionPosterior": "AttentionFamily", "get_posterior": "get_family"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        warn_renamed(f"bayesattn.posteriors.{name}", f"bayesattn.families.{_RENAMED[name]}", "name")
        return getattr(_families, _RENAMED[name])
    if name in ("PRIOR_LOCATIONS",):
        return getattr(_families, name)  # warns there
    raise AttributeError(f"module 'bayesattn.posteriors' has no attribute {name!r}")
