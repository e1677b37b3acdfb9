"""How many attention draws a forward pass takes, set from outside a model you did not write.

``with num_samples(S): model(x)`` makes every Bayesian attention layer inside ``model`` that sees
an input *without* sample dims draw ``S`` weight samples in one pass (its output gains a leading
``S``); layers further down, whose input already carries the sample dim, draw one sample per
existing sample. This is the vectorised path: it needs a model whose other operations broadcast
over a leading dim (our networks do; many foreign models do not, see
:func:`bayesattn.interop.posthoc.sample_probs`, which falls back to batched repetition).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from .._validation import check_int

__all__ = ["num_samples", "current_num_samples"]

_NUM_SAMPLES: ContextVar[int | None] = ContextVar("bayesattn_num_samples", default=None)


def current_num_samples() -> int | None:
    """The sample count set by the innermost :func:`num_samples`, or ``None``."""
    return _NUM_SAMPLES.get()


@contextlib.contextmanager
def num_samples(n: int | None) -> Iterator[None]:
    """Context manager: Bayesian attention layers inside draw ``n`` samples per pass."""
    check_int("num_samples", n, 1, allow_none=True)
    token = _NUM_SAMPLES.set(n)
    try:
        yield
    finally:
        _NUM_SAMPLES.reset(token)
