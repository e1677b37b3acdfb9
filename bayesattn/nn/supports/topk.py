r"""Sparse top-k attention: each query reads its ``k`` most probable keys."""

from __future__ import annotations

from torch import Tensor

from ..._validation import check_int
from ...functional import supports as K
from .base import AttentionSupport

__all__ = ["TopKSupport"]


class TopKSupport(AttentionSupport):
    r"""Sparse top-k attention: each query reads the exact posterior restricted to its ``k``
    most probable keys; the dropped mass of the last call is kept in ``last_dropped_mass``
    ``(…, B, H, Tq)``."""

    name = "topk"

    def __init__(self, k: int = 64, chunk_size: int = 256) -> None:
        super().__init__()
        self.k = check_int("k", k, 1)
        self.chunk_size = check_int("chunk_size", chunk_size, 1)
        self.last_dropped_mass: Tensor | None = None

    def reduce(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        is_causal: bool = False,
    ) -> tuple[K.ReducedSupport, Tensor]:
        s = K.topk_support(q, k, self.k, log_prior, chunk_size=self.chunk_size)
        self.last_dropped_mass = s.dropped_mass
        return s, v

    def extra_repr(self) -> str:
        return f"k={self.k}"
