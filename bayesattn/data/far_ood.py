"""Far-OOD sanity sets and 1-D corruptions, for inputs of any shape ``(N, *F)`` in the scale of
the in-distribution data.

* ``uniform``: uniform noise over the data's value range ``[min(x), max(x)]``;
* ``inverted``: ``min(x) + max(x) − x`` (black ↔ white for images, a sign flip for centred
  signals);
* ``permuted``: each example's features shuffled by its own seeded permutation (same values,
  no structure).

A detector that cannot flag these is broken; they are not a benchmark. Every draw comes from a
``torch.Generator`` seeded with ``seed``."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from .._validation import check_float_tensor, check_int, check_seed, torch_generator

__all__ = ["FAR_OOD_KINDS", "far_ood_suite", "SEQUENCE_CORRUPTIONS", "corrupt_sequences"]

FarOODKind = Literal["uniform", "inverted", "permuted"]
FAR_OOD_KINDS: tuple[FarOODKind, ...] = get_args(FarOODKind)


def far_ood_suite(x: Tensor, seed: int = 0) -> dict[str, Tensor]:
    """``{kind: (N, *F)}`` for every kind of :data:`FAR_OOD_KINDS`, made from ``x``.

    Shape:
        x ``(N, *F)`` floating point, ``N >= 1``.
    """
    x = check_float_tensor("x", x, 2)
    if x.shape[0] == 0:
        raise ValueError(f"x must hold at least one example; got shape {tuple(x.shape)}")
    g = torch_generator(check_seed(seed))
    lo, hi = float(x.min()), float(x.max())
    n = x.shape[0]
    flat = x.reshape(n, -1)  # (N, D)
    uniform = lo + (hi - lo) * torch.rand(x.shape, generator=g, dtype=x.dtype)
    perm = torch.argsort(torch.rand(flat.shape, generator=g), dim=1)  # (N, D) one per example
    permuted = flat.gather(1, perm).reshape(x.shape)
    return {"uniform": uniform, "inverted": lo + hi - x, "permuted": permuted}


SequenceCorruption = Literal["noise", "occlusion", "shift"]
SEQUENCE_CORRUPTIONS: tuple[SequenceCorruption, ...] = get_args(SequenceCorruption)
_SEQ_NOISE = (0.1, 0.2, 0.4, 0.6, 0.8)  # × the data's sd (1 for MNIST-1D)
_SEQ_OCCLUDE = (0.1, 0.2, 0.3, 0.4, 0.5)  # fraction of the steps zeroed
_SEQ_SHIFT = (0.05, 0.1, 0.15, 0.2, 0.25)  # fraction of the length, circular


def corrupt_sequences(x: Tensor, kind: SequenceCorruption, severity: int, seed: int = 0) -> Tensor:
    """A corrupted copy of sequences ``x`` at ``severity`` 1..5: ``noise`` adds Gaussian noise
    of sd ``(0.1, 0.2, 0.4, 0.6, 0.8)``; ``occlusion`` zeroes a window of ``(10 … 50)%`` of the
    steps at a random place; ``shift`` rolls each sequence by ``(5 … 25)%`` of its length in a
    random direction. Draws do not depend on the severity (common random numbers).

    Shape:
        x ``(N, T)`` → ``(N, T)``.
    """
    x = check_float_tensor("x", x, ndim=2)
    if kind not in SEQUENCE_CORRUPTIONS:
        raise ValueError(f"kind must be one of {SEQUENCE_CORRUPTIONS}, got {kind!r}")
    severity = check_int("severity", severity, 1, 5)
    g = torch_generator(check_seed(seed))
    n, t = x.shape
    if kind == "noise":
        return x + _SEQ_NOISE[severity - 1] * torch.randn(x.shape, generator=g, dtype=x.dtype)
    u = torch.rand(n, generator=g)  # (N,)
    if kind == "occlusion":
        width = max(1, round(_SEQ_OCCLUDE[severity - 1] * t))
        start = torch.floor(u * (t - width + 1)).long()  # (N,)
        steps = torch.arange(t)
        mask = (steps >= start[:, None]) & (steps < start[:, None] + width)  # (N, T)
        return x.masked_fill(mask, 0.0)
    by = max(1, round(_SEQ_SHIFT[severity - 1] * t))
    sign = torch.where(u < 0.5, -1, 1)  # (N,)
    idx = (torch.arange(t)[None, :] - sign[:, None] * by) % t  # (N, T)
    return x.gather(1, idx)
