"""Explicit Pyro models: a single attention read (:mod:`.attention_read`) and the one-layer
attention regression used as NUTS ground truth (:mod:`.regression`)."""

from .attention_read import *  # noqa: F403
from .attention_read import __all__ as _read_all

__all__ = [*_read_all]
