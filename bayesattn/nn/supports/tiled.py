r"""Exact dense attention in :math:`O(T)` memory: queries in tiles, draws made and read per tile."""

from __future__ import annotations

import torch.nn.functional as F
from pyro.contrib.autoname import scope
from torch import Tensor

from ..._validation import check_int
from ...functional import supports as K
from .base import AttentionSupport, Drawer

__all__ = ["TiledSupport"]


class TiledSupport(AttentionSupport):
    r"""Exact dense attention in :math:`O(T)` memory: the posterior mean runs in query tiles of
    ``tile`` rows (fused attention per tile), and in the stochastic modes each tile's weights are
    drawn, read and dropped before the next (rows are independent given the logits), so ``S``
    draws cost :math:`O(S\cdot\text{tile}\cdot T)` memory, never :math:`O(S T^2)`. Each tile is
    its own latent site ``tile<start>/<layer>.latent`` (event shape ``(H, tile, Tk)``); in
    ``"elbo"`` mode the KL is summed over tiles. The weights (all of them, ``(…, Tq, Tk)``) are
    formed only when asked (``need_weights=True`` or ``record_weights``)."""

    name = "tiled"

    def __init__(self, tile: int = 512) -> None:
        super().__init__()
        self.tile = check_int("tile", tile, 1)

    def reduce(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        is_causal: bool = False,
    ) -> tuple[K.ReducedSupport, Tensor]:
        return K.dense_support(q, k, log_prior), v

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor:
        return K.tiled_attention(q, k, v, log_prior, tile=self.tile, dropout_p=dropout_p)

    def sample_output(
        self,
        draw: Drawer,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        dropout_p: float,
    ) -> Tensor | None:
        if q.shape[-2] == 0:
            return None
        start = [0]

        def draw_tile(logits: Tensor, lp: Tensor | None, qt: Tensor) -> Tensor:
            s = start[0]
            start[0] += logits.shape[-2]
            with scope(prefix=f"tile{s}"):
                w = draw(logits, lp, qt, k)
            return F.dropout(w, dropout_p, training=True) if dropout_p > 0 else w

        return K.tiled_posterior_read(q, k, v, draw_tile, log_prior, tile=self.tile)

    def extra_repr(self) -> str:
        return f"tile={self.tile}"
