"""Deprecated alias of :mod:`bayesattn.families` (until 0.4).

The variational families over attention weights are *families*, not posteriors: in this library
"posterior" means only the exact posterior ``p(j | q)`` (see ``docs/glossary.md``). Importing this
module warns; ``AttentionPosterior``, ``get_posterior`` and ``PRIOR_LOCATIONS`` warn again when
used.
"""

from __future__ import annotations

from ._deprecation import module_getattr, warn_renamed
from .families import *  # noqa: F403
from .families import __all__ as _family_names

warn_renamed("bayesattn.posteriors", "bayesattn.families", "module", stacklevel=3)

__all__ = list(_family_names)  # the old names come from __getattr__, with a warning

__getattr__ = module_getattr(
    "bayesattn.posteriors",
    {
        "AttentionPosterior": ("bayesattn.families", "AttentionFamily"),
        "get_posterior": ("bayesattn.families", "get_family"),
        "PRIOR_LOCATIONS": ("bayesattn.families", "MODEL_LOCATIONS"),
    },
)
