r"""Block-wise local attention: query ``i`` reads keys ``|i - j| <= window``."""

from __future__ import annotations

import torch
from torch import Tensor

from ..._validation import check_int
from ...functional import supports as K
from .base import AttentionSupport

__all__ = ["LocalSupport"]


class LocalSupport(AttentionSupport):
    r"""Block-wise local attention: query ``i`` reads keys ``|i - j| <= window``.

    Equal to dense attention under a hard :class:`~bayesattn.priors.LocalWindowPrior(window)`,
    at :math:`O(T\cdot w)` memory. Masks and priors apply within the band (e.g. ``is_causal``
    keeps ``i - window <= j <= i``)."""

    name = "local"

    def __init__(self, window: int = 64, chunk_size: int | None = None) -> None:
        super().__init__()
        self.window = check_int("window", window, 0)
        self.chunk_size = check_int("chunk_size", chunk_size, 1, allow_none=True)

    def reduce(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        is_causal: bool = False,
    ) -> tuple[K.ReducedSupport, Tensor]:
        s = K.local_support(q, k, self.window, log_prior, chunk_size=self.chunk_size)
        return s, v

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor:
        return K.local_attention(
            q,
            k,
            v,
            self.window,
            log_prior,
            chunk_size=self.chunk_size,
            dropout_p=dropout_p,
            training=dropout_p > 0,
            global_keys=self.global_keys(q.device, k.shape[-2]),
        )

    def global_keys(
        self, device: torch.device, num_keys: int | None = None
    ) -> tuple[int, ...] | None:
        """Positions every query also reads (none for the plain window); ``num_keys``: ``T``."""
        return None

    def extra_repr(self) -> str:
        return f"window={self.window}"
