"""How Bayesian attention layers draw their weights: one switch shared by a whole network.

Modes are named after what the weights are drawn from, in Pyro's terms, set with
:func:`attention_mode`. Without it a layer that has a family (or a GP read) follows torch's
``train()``/``eval()`` (:func:`default_mode`): it draws (``"guide"``) in training mode, and in
eval mode it is deterministic (``"mean"``, the posterior mean) unless draws are asked for: an
explicit ``num_samples=`` keyword or a :func:`bayesattn.num_samples` context (``predict`` sets
the mode itself). A layer without a family is always ``"mean"``:

``"mean"``
    deterministic: the exact posterior weights (softmax attention under the key-relevance prior);
    no Pyro sites. This is the ``torch.nn.MultiheadAttention``-compatible mode.
``"guide"``
    draw weights from the family's amortised guide ``q(w | x)`` at a ``pyro.sample`` site.
``"model"``
    draw weights from the family's weight model ``p(w | π)`` at the same site (under a guide's
    trace replay the site takes the guide's value and scores it under the weight model).
``"elbo"``
    one-pass ELBO: draw from the guide *without* Pyro sites and add each layer's
    ``KL(q‖p)`` to the collector opened by :func:`collect_kl` (analytic where registered).

``"posterior"`` and ``"prior"``, the pre-0.3 spellings of ``"guide"`` and ``"model"``, are removed
(a ``ValueError`` naming the new spelling; see ``docs/glossary.md``).

What a pass's context managers set (the mode, the KL collector, preset global values, whether
draws are asked for, and :func:`bayesattn.num_samples`'s count) has one owner: the immutable
:class:`PassContext` of the current context, one ``ContextVar``; each context manager enters a
copy with its field changed (:func:`entered`) and restores the outer one on exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Literal, get_args

import torch
from torch import Tensor

__all__ = [
    "AttentionMode",
    "MODES",
    "check_mode",
    "attention_mode",
    "current_mode",
    "context_mode",
    "default_mode",
    "asking_for_draws",
    "draws_asked",
    "collect_kl",
    "current_kl_collector",
    "KLCollector",
    "global_values",
    "current_global_values",
    "PassContext",
    "pass_context",
    "entered",
]

AttentionMode = Literal["mean", "guide", "model", "elbo"]
MODES: tuple[AttentionMode, ...] = get_args(AttentionMode)
#: attention modes renamed in 0.3 (old -> new; removed in 0.4): named in the error only
_OLD_MODES = {"posterior": "guide", "prior": "model"}



@dataclasses.dataclass(frozen=True)
class PassContext:
    """What the context managers of a pass have set (immutable; see the module docstring):
    ``mode`` (:func:`attention_mode`), ``kl`` (:func:`collect_kl`), ``global_values``
    (:func:`global_values`), ``draws`` (:func:`asking_for_draws`) and ``num_samples``
    (:func:`bayesattn.num_samples`)."""

    mode: AttentionMode | None = None
    kl: KLCollector | None = None
    global_values: dict[str, Tensor] | None = None
    draws: bool = False
    num_samples: int | None = None


#: outside every context manager (immutable, so one instance serves as the default)
_OUTSIDE = PassContext()
_PASS: ContextVar[PassContext] = ContextVar("bayesattn_pass", default=_OUTSIDE)


def pass_context() -> PassContext:
    """The :class:`PassContext` of the current context."""
    return _PASS.get()


@contextlib.contextmanager
def entered(**changes: Any) -> Iterator[PassContext]:
    """Context manager: the current :class:`PassContext` with ``changes`` (field values) while
    open, the outer one restored on exit."""
    ctx = dataclasses.replace(_PASS.get(), **changes)
    token = _PASS.set(ctx)
    try:
        yield ctx
    finally:
        _PASS.reset(token)


def _renamed_hint(mode: object) -> str:
    new = _OLD_MODES.get(mode) if isinstance(mode, str) else None
    return f" ({mode!r} was renamed {new!r} in 0.3)" if new else ""


def check_mode(mode: str, name: str = "mode") -> AttentionMode:
    """``mode`` as one of :data:`MODES`; anything else (a pre-0.3 spelling included) is a
    ``ValueError`` naming ``name``."""
    if mode not in MODES:
        raise ValueError(f"{name} must be one of {MODES}; got {mode!r}{_renamed_hint(mode)}")
    return mode


def current_mode() -> AttentionMode | None:
    """The mode set by the innermost :func:`attention_mode`, or ``None`` (layer default)."""
    return _PASS.get().mode


#: Dynamo cannot trace ContextVar.get: inside torch.compile the mode is read once at trace time
_current_mode_at_trace = torch.compiler.assume_constant_result(current_mode)


def context_mode() -> AttentionMode | None:
    """:func:`current_mode`, read once at trace time inside ``torch.compile`` (a compiled model
    runs in the mode it was compiled in)."""
    return _current_mode_at_trace() if torch.compiler.is_compiling() else current_mode()


def draws_asked() -> bool:
    """True inside :func:`asking_for_draws` (entered by :func:`bayesattn.num_samples`)."""
    return _PASS.get().draws


#: read once at trace time inside torch.compile, like the mode
_draws_asked_at_trace = torch.compiler.assume_constant_result(draws_asked)


@contextlib.contextmanager
def asking_for_draws() -> Iterator[None]:
    """Context manager: layers inside that have no :func:`attention_mode` draw their weights
    even in eval mode (``bayesattn.num_samples(S)`` enters it; so does a converted transformers
    model that repeats its inputs ``S`` times)."""
    with entered(draws=True):
        yield


def default_mode(training: bool, draws: bool = False) -> AttentionMode:
    """The mode of a layer with a family or a GP read, as torch's ``train()``/``eval()`` says.

    The innermost :func:`attention_mode` if one is set; else ``"guide"`` (a draw from the
    posterior) in training mode, or when draws are asked for (``draws``: the layer was called
    with ``num_samples=``; or inside :func:`asking_for_draws`, i.e. ``bayesattn.num_samples(S)``);
    else ``"mean"``: in eval mode a layer is deterministic, the posterior mean, as every torch
    module is. Inside ``torch.compile`` the contexts are read once, at trace time."""
    m = context_mode()
    if m is not None:
        return m
    if training or draws:
        return "guide"
    asked = _draws_asked_at_trace() if torch.compiler.is_compiling() else draws_asked()
    return "guide" if asked else "mean"


@contextlib.contextmanager
def attention_mode(mode: AttentionMode | None) -> Iterator[None]:
    """Context manager setting how every Bayesian attention layer inside draws its weights
    (``None``: each layer's default)."""
    if mode is not None:
        if mode not in MODES:
            raise ValueError(
                f"mode must be one of {MODES} or None; got {mode!r}{_renamed_hint(mode)}"
            )
    with entered(mode=mode):
        yield


class KLCollector:
    """Accumulates per-example ``KL(q‖p)`` terms, shape ``(*S, B)``, from layers in ``"elbo"`` mode,
    and the KL of *global* latents (outside the data plate: charged once per data set, never
    scaled by ``N/B``) with the value each drew, so a global is drawn once per pass."""

    def __init__(self) -> None:
        self.terms: dict[str, Tensor] = {}
        self.global_terms: dict[str, Tensor] = {}
        self.global_values: dict[str, Tensor] = {}
        #: the data set size N the ELBO is scaled to (set by ``elbo_loss``; ``None``: unknown)
        self.num_data: int | None = None

    def add(self, name: str, kl: Tensor) -> None:
        self.terms[name] = self.terms[name] + kl if name in self.terms else kl

    def add_global(self, name: str, kl: Tensor, value: Tensor) -> None:
        """Record global site ``name``'s draw and its (scalar) KL, once per pass."""
        if name in self.global_terms:
            raise ValueError(f"global site {name!r} was drawn twice in one pass")
        self.global_terms[name] = kl
        self.global_values[name] = value

    def global_total(self) -> Tensor | float:
        """Sum of the global KLs (a scalar; 0.0 without global latents)."""
        out: Tensor | float = 0.0
        for t in self.global_terms.values():
            out = out + t
        return out

    def total(self) -> Tensor | float:
        out: Tensor | float = 0.0
        for t in self.terms.values():
            out = out + t
        return out


@contextlib.contextmanager
def collect_kl() -> Iterator[KLCollector]:
    """Open a KL collector and set ``"elbo"`` mode inside it."""
    col = KLCollector()
    with entered(kl=col), attention_mode("elbo"):
        yield col


def current_kl_collector() -> KLCollector | None:
    """The collector opened by the innermost :func:`collect_kl`, or ``None``."""
    return _PASS.get().kl


@contextlib.contextmanager
def global_values(values: dict[str, Tensor] | None) -> Iterator[None]:
    """Context manager: global latents (e.g. a sparse Gaussian process's inducing values) take
    these ``{site name: value}`` draws instead of drawing their own, so one draw per posterior
    sample is shared by every example and every batch. ``None`` changes nothing."""
    if values is None:
        yield
        return
    outer = _PASS.get().global_values
    with entered(global_values={**(outer or {}), **values}):
        yield


def current_global_values() -> dict[str, Tensor] | None:
    """The ``{site name: value}`` set by the innermost :func:`global_values`, or ``None``."""
    return _PASS.get().global_values
