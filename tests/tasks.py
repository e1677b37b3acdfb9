"""Small seeded tasks shared by the training tests (imported as ``from tests.tasks import ...``)."""

from __future__ import annotations

import torch
from torch import Tensor


def contains3(n: int, seed: int, T: int = 8, vocab: int = 10) -> tuple[Tensor, Tensor]:
    """``n`` token sequences ``(n, T)`` over ``1..vocab-1``; label = whether token 3 occurs
    (about balanced for T=8, vocab=10)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, vocab, (n, T), generator=g)
    return x, (x == 3).any(1).long()
