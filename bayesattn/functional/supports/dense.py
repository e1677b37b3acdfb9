r"""The dense support: every key is a slot (:math:`K = T_k`, :math:`O(T_q T_k)`), the whole of
what :func:`~bayesattn.functional.supports.tiled_posterior_read` draws on tile by tile.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .base import ChunkLogPrior, check_qkv, resolve_scale, tile_prior
from .results import ReducedSupport

__all__ = ["dense_support"]


def dense_support(
    q: Tensor, k: Tensor, log_prior: ChunkLogPrior | None = None, *, scale: float | None = None
) -> ReducedSupport:
    """Every key as the support (``O(Tq Tk)``): what
    :func:`~bayesattn.functional.supports.tiled_posterior_read` draws on, whole.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)`` → logits/log_prior ``(…, Tq, Tk)``, index ``(1, Tk)``.
    """
    check_qkv(q, k)
    sc = resolve_scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    logits = torch.matmul(q * sc, k.transpose(-1, -2))  # (…, Tq, Tk)
    lp = tile_prior(log_prior, 0, Tq, Tk, q.device)
    index = torch.arange(Tk, device=q.device).expand(1, Tk)
    return ReducedSupport(logits, lp, index, Tk, "dense")
