r"""Seeded long-sequence tasks for the efficient attention kernels (:mod:`bayesattn.nn.supports`).

:func:`make_retrieval_task` — *needle retrieval*: a sequence of ``length`` noise tokens holds one
needle token somewhere; the label is which of ``num_values`` needles it is. A classifier that pools
a CLS query must put its attention on one key among thousands: dense and top-k attention can,
a local window only when the needle falls inside it, and a low-rank read only through its learned
mixtures of positions. ``near_fraction`` of the examples place the needle within ``near`` tokens of
the start (where a CLS query's local window reaches), so a local kernel's accuracy is about
``near_fraction + (1 - near_fraction) / num_values``.

Token ids: ``0`` padding (unused), ``1 .. num_values`` needles (label ``id - 1``), then
``num_noise`` noise tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .._validation import check_int, check_real, torch_generator

__all__ = ["RetrievalTask", "make_retrieval_task"]


@dataclass
class RetrievalTask:
    """Token sequences ``x (N, T)`` int64, labels ``y (N,)``, the needle positions ``pos (N,)``
    and how the task was generated (``meta``); ``vocab_size`` and ``num_classes`` size a model."""

    x: Tensor
    y: Tensor
    pos: Tensor
    vocab_size: int
    num_classes: int
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def subset(self, index: Tensor | slice) -> RetrievalTask:
        return RetrievalTask(
            self.x[index], self.y[index], self.pos[index], self.vocab_size, self.num_classes,
            dict(self.meta),
        )  # fmt: skip


def make_retrieval_task(
    n: int,
    length: int = 2048,
    num_values: int = 4,
    num_noise: int = 8,
    near: int = 32,
    near_fraction: float = 0.25,
    seed: int = 0,
) -> RetrievalTask:
    r"""Needle retrieval at sequence length ``length`` (see the module docstring).

    Each row: ``length`` noise tokens drawn uniformly from ``num_noise`` ids, one position
    replaced by needle ``y + 1`` with ``y`` uniform in ``0 .. num_values - 1``; the position is
    uniform in ``[0, near)`` with probability ``near_fraction``, else uniform over the sequence.
    Same ``seed``, same task.

    Shape:
        x ``(n, length)`` int64, y ``(n,)`` int64, pos ``(n,)`` int64.

    Example:
        >>> t = make_retrieval_task(3, length=16, seed=0)
        >>> t.x.shape, int((t.x[torch.arange(3), t.pos] == t.y + 1).sum())
        (torch.Size([3, 16]), 3)
    """
    n = check_int("n", n, 1)
    length = check_int("length", length, 2)
    num_values = check_int("num_values", num_values, 2)
    num_noise = check_int("num_noise", num_noise, 1)
    near = check_int("near", near, 1)
    if near > length:
        raise ValueError(f"near must be <= length={length}; got {near}")
    check_real("near_fraction", near_fraction, ge=0.0, le=1.0)
    seed = check_int("seed", seed)
    g = torch_generator(seed)
    first_noise = 1 + num_values
    x = torch.randint(first_noise, first_noise + num_noise, (n, length), generator=g)  # (N, T)
    y = torch.randint(0, num_values, (n,), generator=g)  # (N,)
    is_near = torch.rand(n, generator=g) < near_fraction
    far_pos = torch.randint(0, length, (n,), generator=g)
    near_pos = torch.randint(0, near, (n,), generator=g)
    pos = torch.where(is_near, near_pos, far_pos)  # (N,)
    x[torch.arange(n), pos] = y + 1
    meta = {
        "task": "retrieval",
        "length": length,
        "num_values": num_values,
        "num_noise": num_noise,
        "near": near,
        "near_fraction": float(near_fraction),
        "seed": seed,
    }
    return RetrievalTask(x, y, pos, first_noise + num_noise, num_values, meta)
