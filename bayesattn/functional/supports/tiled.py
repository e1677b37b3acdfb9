r"""Exact attention in :math:`O(T)` memory: the posterior mean :math:`y_i = \sum_j \bar p_{ij}
v_j` and reads of posterior draws, one query tile at a time against every key, never holding a
``(Tq, Tk)`` matrix.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._validation import check_int
from .base import ChunkLogPrior, check_qkv, empty_rows, resolve_scale, sdpa_rows, tile_prior

__all__ = ["tiled_attention", "tiled_posterior_read"]


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    log_prior: ChunkLogPrior | None = None,
    *,
    tile: int = 512,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    r"""Exact posterior-mean attention :math:`y_i = \sum_j \bar p_{ij} v_j` in query tiles: each
    tile runs fused ``scaled_dot_product_attention`` against every key under its slice of the
    log-prior, so at most ``(…, tile, Tk)`` entries exist at a time (none at all without a prior:
    torch's CPU flash kernel tiles the keys with an online softmax). Rows with no allowed key read
    zeros.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)``, v ``(…, Tk, Dv)`` → ``(…, Tq, Dv)``.
    """
    check_qkv(q, k, v)
    tile = check_int("tile", tile, 1)
    sc = resolve_scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    if Tq == 0:
        return empty_rows(q, v)
    if Tk == 0:
        return empty_rows(q, v)
    outs = []
    for s in range(0, Tq, tile):
        e = min(s + tile, Tq)
        lp = tile_prior(log_prior, s, e, Tk, q.device)
        if lp is None:
            outs.append(
                F.scaled_dot_product_attention(q[..., s:e, :], k, v, dropout_p=dropout_p, scale=sc)
            )
        else:
            outs.append(sdpa_rows(q[..., s:e, :], k, v, lp, sc, dropout_p))
    return torch.cat(outs, dim=-2)


def tiled_posterior_read(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    draw: Callable[[Tensor, Tensor | None, Tensor], Tensor],
    log_prior: ChunkLogPrior | None = None,
    *,
    tile: int = 512,
    scale: float | None = None,
) -> Tensor:
    r"""Reads of posterior *draws* of the weights, one query tile at a time, never holding a
    ``(Tq, Tk)`` matrix: for each tile the logits :math:`s\,q_i\cdot k_j` ``(…, n, Tk)`` and the
    log-prior go to ``draw(logits, log_prior, q_tile)``, which returns weights ``(*S, …, n, Tk)``
    (e.g. ``S`` draws of a family's guide, rows independent given the logits), and those are read
    against ``v``. Peak memory :math:`O(S\cdot\text{tile}\cdot T_k)`.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)``, v ``(…, Tk, Dv)`` → ``(*S, …, Tq, Dv)``.
    """
    check_qkv(q, k, v)
    tile = check_int("tile", tile, 1)
    sc = resolve_scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    if Tq == 0:
        raise ValueError("tiled_posterior_read needs at least one query row; got Tq=0")
    kT = k.transpose(-1, -2)
    outs = []
    for s in range(0, Tq, tile):
        e = min(s + tile, Tq)
        qt = q[..., s:e, :]
        lg = torch.matmul(qt * sc, kT)  # (…, n, Tk)
        lp = tile_prior(log_prior, s, e, Tk, q.device)
        w = draw(lg, None if lp is None else lp.expand(lg.shape), qt)  # (*S, …, n, Tk)
        outs.append(torch.matmul(w, v))  # (*S, …, n, Dv)
        del lg, w
    return torch.cat(outs, dim=-2)
