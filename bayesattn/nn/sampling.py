"""How many attention draws a layer takes: one rule, one place (:func:`layer_num_samples`).

A :class:`~bayesattn.nn.attention.BayesianMultiheadAttention` learns its sample count ``S`` in one
way: its ``num_samples`` keyword. ``with num_samples(S): model(x)`` only sets that keyword's
*default* from outside a model you did not write, for every Bayesian layer inside that sees an
input without sample dims; such a layer draws ``S`` weight samples in one pass and its output
gains a leading ``S``. Layers further down then see that leading dim: it is already the sample
dim, so they take no keyword default and draw one sample per existing sample. In full,
:func:`layer_num_samples`:

===================================  ===========================================================
the layer is called with             it draws
===================================  ===========================================================
``num_samples=S``                    ``S`` samples (a leading ``S`` on its outputs)
no keyword, ``(B, T, E)`` input,     the context's ``S`` (``None`` outside ``num_samples``)
a family or a GP read
no keyword, ``(*S, B, T, E)`` input  one sample per leading entry (the dims are batch dims to it)
===================================  ===========================================================

The context is the vectorised path: it needs a model whose other operations broadcast over a
leading dim (our networks do; many foreign models do not, see
:func:`bayesattn.posthoc.AttentionRead.predict`, which falls back to batched repetition).
Inside ``torch.compile`` the context is read once, at trace time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .._validation import check_int
from .modes import entered, pass_context

__all__ = ["num_samples", "current_num_samples", "layer_num_samples"]


def current_num_samples() -> int | None:
    """The sample count set by the innermost :func:`num_samples`, or ``None``."""
    return pass_context().num_samples


#: Dynamo cannot trace ContextVar.get: inside torch.compile the count is read once at trace time
_num_samples_at_trace = torch.compiler.assume_constant_result(current_num_samples)


def context_num_samples() -> int | None:
    """:func:`current_num_samples`, read once at trace time inside ``torch.compile``."""
    return _num_samples_at_trace() if torch.compiler.is_compiling() else current_num_samples()


def layer_num_samples(num_samples: int | None, *, reads_context: bool) -> int | None:
    """The number of draws a layer takes (the table in the module docstring): the keyword when
    given, else the context's when ``reads_context`` (an input without sample dims to a layer
    that draws), else ``None``.

    Raises:
        ValueError: ``num_samples`` below 1; TypeError: not an int.
    """
    if num_samples is not None:
        check_int("num_samples", num_samples, 1)
        return num_samples
    return context_num_samples() if reads_context else None


@contextlib.contextmanager
def num_samples(n: int | None) -> Iterator[None]:
    """Context manager: Bayesian attention layers inside that see an input without sample dims
    draw ``n`` samples per pass (the default of their ``num_samples`` keyword). ``n`` not
    ``None`` also asks for draws (:func:`~bayesattn.nn.modes.asking_for_draws`): layers in eval
    mode draw from the guide instead of taking the posterior mean, down to those that see the
    sample dim; ``num_samples(None)`` clears the count only."""
    check_int("num_samples", n, 1, allow_none=True)
    # n set: draws asked for too (asking_for_draws); None: the count cleared, draws unchanged
    with entered(num_samples=n) if n is None else entered(num_samples=n, draws=True):
        yield
