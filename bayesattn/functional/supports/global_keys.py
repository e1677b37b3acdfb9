r"""The global tokens of local + global attention (Longformer, BigBird): their positions, the
log-prior of ordinary queries on them, and the dense read of the global queries' own rows.

A global key :math:`g` already inside query :math:`i`'s band (:math:`|i - g| \le w`) gets
:math:`\log\pi_{ig} = -\infty` in its global slot, so every key appears once in a support; the
rows :math:`i \in G` read every key (:math:`O(G\,T)`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._validation import check_int
from .base import NEG_INF, ChunkLogPrior, sdpa_rows

__all__ = [
    "check_global_keys",
    "resolve_global_keys",
    "global_rows",
    "global_prior",
    "rows_prior",
    "dense_rows_attention",
]


def check_global_keys(global_keys: Tensor | None, Tk: int, device: torch.device) -> Tensor | None:
    """Global key positions as a sorted, unique int64 ``(G,)`` tensor inside ``[0, Tk)``; those
    at or past ``Tk`` (a shorter sequence) are dropped. ``None``/empty: no global tokens."""
    if global_keys is None:
        return None
    if not isinstance(global_keys, Tensor):
        global_keys = torch.as_tensor(list(global_keys), dtype=torch.long)
    if global_keys.dim() != 1 or global_keys.is_floating_point() or global_keys.dtype == torch.bool:
        raise ValueError(
            f"global_keys must be a 1-D integer tensor of positions; got dtype "
            f"{global_keys.dtype}, shape {tuple(global_keys.shape)}"
        )
    if global_keys.numel() and int(global_keys.min()) < 0:
        raise ValueError(f"global_keys must be >= 0; got {global_keys.tolist()}")
    gk = torch.unique(global_keys.to(device=device, dtype=torch.long))  # sorted
    gk = gk[gk < Tk]
    return gk if gk.numel() else None


GlobalKeys = Tensor | Sequence[int] | None


def resolve_global_keys(
    global_keys: GlobalKeys, Tq: int, Tk: int, device: torch.device
) -> tuple[Tensor | None, Tensor | None]:
    """``(keys (G,), rows (Gq,))``: :func:`check_global_keys` and :func:`global_rows` in one.
    Positions given as Python ints (a tuple, list or set, in any order, repeats allowed) are
    resolved in Python, so the sizes are static (``torch.compile(fullgraph=True)`` traces them);
    a tensor of positions is resolved on the device."""
    if global_keys is None or isinstance(global_keys, Tensor):
        gk = check_global_keys(global_keys, Tk, device)
        return gk, global_rows(gk, Tq)
    if isinstance(global_keys, (str, bytes)) or not isinstance(global_keys, Iterable):
        raise TypeError(
            f"global_keys must be a 1-D integer tensor or a collection of int positions; got "
            f"{global_keys!r}"
        )
    keys = sorted({check_int("global_keys", g, 0) for g in global_keys})
    keys = [g for g in keys if g < Tk]
    rows = [g for g in keys if g < Tq]
    as_tensor = lambda xs: torch.tensor(xs, dtype=torch.long, device=device) if xs else None  # noqa: E731
    return as_tensor(keys), as_tensor(rows)


def global_rows(gk: Tensor | None, Tq: int) -> Tensor | None:
    """The global keys that are also query rows (``< Tq``), ``(Gq,)``, or ``None``."""
    if gk is None:
        return None
    rows = gk[gk < Tq]
    return rows if rows.numel() else None


def global_prior(
    lp_fn: ChunkLogPrior | None, s: int, e: int, gk: Tensor, window: int, dtype: torch.dtype
) -> Tensor:
    """Log-prior of queries ``s:e`` on the global keys: ``-inf`` where the key is already in the
    query's band (``|i - g| <= w``: each key appears once in a support), plus masks and priors."""
    qi = torch.arange(s, e, device=gk.device).unsqueeze(-1)  # (n, 1)
    dup = (qi - gk).abs() <= window  # (n, G)
    lp = torch.zeros(dup.shape, dtype=dtype, device=gk.device).masked_fill(dup, NEG_INF)
    if lp_fn is not None:
        extra = lp_fn(s, e, gk)
        if extra is not None:
            lp = lp + extra  # (…|1, n, G)
    return lp


def rows_prior(
    lp_fn: ChunkLogPrior | None, rows: Tensor, Tk: int, device: torch.device
) -> Tensor | None:
    """Log-prior of the (few) query ``rows`` on every key, ``(…|1, Gq, Tk)``, one row at a time."""
    if lp_fn is None:
        return None
    keys = torch.arange(Tk, device=device)
    parts = [lp_fn(r, r + 1, keys) for r in rows.tolist()]
    if any(p is None for p in parts):
        return None
    ps = [p for p in parts if p is not None]
    lead = torch.broadcast_shapes(*(p.shape[:-2] for p in ps))
    return torch.cat([p.expand(lead + (1, Tk)) for p in ps], dim=-2)


def dense_rows_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    lp_fn: ChunkLogPrior | None,
    sc: float,
    p: float,
) -> Tensor:
    """Fused attention of the query ``rows`` on every key (the global queries' read),
    ``(…, Gq, Dv)``; rows with no allowed key read zeros."""
    qr = q.index_select(-2, rows)  # (…, Gq, D)
    lp = rows_prior(lp_fn, rows, k.shape[-2], q.device)
    if lp is None:
        return F.scaled_dot_product_attention(qr, k, v, dropout_p=p, scale=sc)
    return sdpa_rows(qr, k, v, lp, sc, p)  # (…, Gq, Dv)
