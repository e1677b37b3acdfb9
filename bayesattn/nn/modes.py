"""How Bayesian attention layers draw their weights: one switch shared by a whole network.

Modes (set with :func:`attention_mode`; the default is ``"posterior"`` for layers that have a
posterior family and ``"mean"`` otherwise):

``"mean"``
    deterministic posterior mean: the exact posterior weights (softmax attention under the prior);
    no Pyro sites. This is the ``torch.nn.MultiheadAttention``-compatible mode.
``"posterior"``
    draw weights from the amortised posterior ``q(w | x)`` at a ``pyro.sample`` site (the guide).
``"prior"``
    draw weights from the prior ``p(w | π)`` at the same site (the model; under a guide's trace
    replay the site takes the guide's value and scores it under the prior).
``"elbo"``
    one-pass ELBO: draw from the posterior *without* Pyro sites and add each layer's
    ``KL(q‖p)`` to the collector opened by :func:`collect_kl` (analytic where registered).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from torch import Tensor

__all__ = [
    "MODES",
    "attention_mode",
    "current_mode",
    "collect_kl",
    "current_kl_collector",
    "KLCollector",
]

MODES = ("mean", "posterior", "prior", "elbo")

_MODE: ContextVar[str | None] = ContextVar("bayesattn_attention_mode", default=None)
_KL: ContextVar[KLCollector | None] = ContextVar("bayesattn_kl", default=None)


def current_mode() -> str | None:
    """The mode set by the innermost :func:`attention_mode`, or ``None`` (layer default)."""
    return _MODE.get()


@contextlib.contextmanager
def attention_mode(mode: str | None) -> Iterator[None]:
    """Context manager setting how every Bayesian attention layer inside draws its weights."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"mode must be one of {MODES} or None; got {mode!r}")
    token = _MODE.set(mode)
    try:
        yield
    finally:
        _MODE.reset(token)


class KLCollector:
    """Accumulates per-example ``KL(q‖p)`` terms, shape ``(*S, B)``, from layers in ``"elbo"`` mode."""

    def __init__(self) -> None:
        self.terms: dict[str, Tensor] = {}

    def add(self, name: str, kl: Tensor) -> None:
        self.terms[name] = self.terms[name] + kl if name in self.terms else kl

    def total(self) -> Tensor | float:
        out: Tensor | float = 0.0
        for t in self.terms.values():
            out = out + t
        return out


@contextlib.contextmanager
def collect_kl() -> Iterator[KLCollector]:
    """Open a KL collector and set ``"elbo"`` mode inside it."""
    col = KLCollector()
    token = _KL.set(col)
    try:
        with attention_mode("elbo"):
            yield col
    finally:
        _KL.reset(token)


def current_kl_collector() -> KLCollector | None:
    return _KL.get()
