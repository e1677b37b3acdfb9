"""The input checks of the post-hoc reads: one label check, one logits/feature check (every
error names the argument, what was seen and what is allowed)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["check_labels", "check_matrix"]


def check_labels(name: str, y: Any, n: int | None = None, num_classes: int | None = None) -> Tensor:
    """``y`` a non-empty 1-D integer label tensor (of length ``n``, values in
    ``[0, num_classes)`` where given), as ``int64``.

    Raises:
        TypeError: not a tensor, or not an integer dtype (bool and float are refused).
        ValueError: not 1-D, the wrong length, empty, or a label out of range.
    """
    if not isinstance(y, Tensor):
        raise TypeError(f"{name} must be a 1-D integer label tensor; got {type(y).__name__}")
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise TypeError(f"{name} must hold integer class labels; got dtype {y.dtype}")
    if y.dim() != 1 or (n is not None and y.shape[0] != n):
        want = f" of length {n} ({n},), one per example" if n is not None else ""
        raise ValueError(f"{name} must be a 1-D label tensor{want}; got shape {tuple(y.shape)}")
    if y.numel() == 0:
        raise ValueError(f"{name} is empty: a read needs at least one labelled example")
    if num_classes is not None and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(
            f"{name} must hold labels in [0, {num_classes}) (the model has {num_classes} "
            f"classes); got {int(y.min())}..{int(y.max())}"
        )
    return y.long()


def check_matrix(name: str, t: Any, n: int | None = None, dim: int | None = None) -> Tensor:
    """``t`` a finite, non-empty floating ``(n, dim)`` tensor (``None`` = any size).

    Raises:
        TypeError: not a floating-point tensor.
        ValueError: not 2-D (e.g. 1-D logits), the wrong batch or width, empty, NaN or Inf.
    """
    if not isinstance(t, Tensor) or not t.is_floating_point():
        got = t.dtype if isinstance(t, Tensor) else type(t).__name__
        raise TypeError(f"{name} must be a floating-point tensor (B, D); got {got}")
    want = f"({'B' if n is None else n}, {'D' if dim is None else dim})"
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D {want}; got shape {tuple(t.shape)}")
    if (n is not None and t.shape[0] != n) or (dim is not None and t.shape[1] != dim):
        raise ValueError(f"{name} must be {want}; got shape {tuple(t.shape)}")
    if t.shape[0] == 0:
        raise ValueError(f"{name} is empty (0 rows): a read needs at least one example")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} holds NaN or Inf values; the read needs finite inputs")
    return t
