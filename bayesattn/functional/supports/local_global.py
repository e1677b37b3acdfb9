r"""Local + global support (Longformer, BigBird without random links): query :math:`i` reads its
band :math:`|i - j| \le w` **and** the global keys :math:`g \in G`; the global queries read every
key. Cost :math:`O(T(w + G))` time and memory.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..._validation import check_int
from .base import NEG_INF, ChunkLogPrior, check_qkv, resolve_scale
from .global_keys import GlobalKeys, global_prior, resolve_global_keys, rows_prior
from .local import local_chunk, local_support
from .results import ReducedSupport

__all__ = ["local_global_support"]


def local_global_support(
    q: Tensor,
    k: Tensor,
    window: int,
    global_keys: GlobalKeys,
    log_prior: ChunkLogPrior | None = None,
    *,
    scale: float | None = None,
    chunk_size: int | None = None,
) -> ReducedSupport:
    r"""Local + global support (Longformer, BigBird without random links): query :math:`i` reads
    its band :math:`|i - j| \le w` **and** the global keys :math:`g \in G` (a CLS token, chosen
    positions); the global queries (rows :math:`i \in G`) read *every* key.

    Support of an ordinary row: ``2w + 1 + G`` slots, the band then the global keys (a global key
    already inside the band is ``-inf`` in its global slot, so every key appears once). The rows of
    global queries are left empty (``-inf``) here and given as a ``"dense"`` support of ``Tk``
    slots in ``global_support`` (a handful of rows, :math:`O(G\,T)`). Masks and priors apply on
    both. Cost :math:`O(T(w + G))` time and memory.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)``, global_keys ``(G,)`` (or Python ints: static
        sizes under ``torch.compile``) → logits/log_prior
        ``(…, Tq, 2w+1+G)``, index ``(Tq, 2w+1+G)``; global_support ``(…, Gq, Tk)``.
    """
    check_qkv(q, k)
    window = check_int("window", window, 0)
    sc = resolve_scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    band = local_support(q, k, window, log_prior, scale=scale, chunk_size=chunk_size)
    gk, rows = resolve_global_keys(global_keys, Tq, Tk, q.device)
    if gk is None or Tq == 0:
        return band
    G = gk.numel()
    lg = torch.matmul(q * sc, k.index_select(-2, gk).transpose(-1, -2))  # (…, Tq, G)
    c = local_chunk(chunk_size, window)
    lps = [
        global_prior(log_prior, s, min(s + c, Tq), gk, window, q.dtype) for s in range(0, Tq, c)
    ]
    lead = torch.broadcast_shapes(*(t.shape[:-2] for t in lps))
    lp_g = torch.cat([t.expand(lead + t.shape[-2:]) for t in lps], dim=-2)  # (…, Tq, G)
    assert band.log_prior is not None and band.index is not None  # local_support sets both
    b_logits, b_lp, b_index = band.logits, band.log_prior, band.index
    del band  # each band tensor is freed as soon as it is copied: peak 3, not 4, (…, Tq, K)
    logits = torch.cat([b_logits, lg], dim=-1)  # (…, Tq, K)
    del b_logits, lg
    lead = torch.broadcast_shapes(b_lp.shape[:-2], lp_g.shape[:-2])
    lp_all = torch.cat([b_lp.expand(lead + b_lp.shape[-2:]), lp_g.expand(lead + (Tq, G))], -1)
    del b_lp
    index = torch.cat([b_index, gk.expand(Tq, G)], dim=-1)  # (Tq, K)
    g_sup = None
    if rows is not None:
        lp_all = lp_all.index_fill(-2, rows, NEG_INF)  # read densely, below
        lg_rows = torch.matmul(q.index_select(-2, rows) * sc, k.transpose(-1, -2))  # (…, Gq, Tk)
        g_sup = ReducedSupport(
            lg_rows,
            rows_prior(log_prior, rows, Tk, q.device),
            torch.arange(Tk, device=q.device).expand(rows.numel(), Tk),
            Tk,
            "dense",
        )
    return ReducedSupport(
        logits, lp_all, index, Tk, "local_global", window=window, global_keys=gk,
        global_rows=rows, global_support=g_sup,
    )  # fmt: skip
