r"""Block-local (banded) attention: each query :math:`i` reads the keys :math:`|i - j| \le w`
(:math:`K = 2w + 1` slots, slot ``m`` is key ``i - w + m``).

Queries are taken in chunks of ``chunk_size``, each scored against its ``chunk + 2w``
neighbouring keys in one matmul, then the band is cut out, so memory is :math:`O(T\cdot w)`. It is
*exactly* dense attention under a hard :class:`~bayesattn.priors.LocalWindowPrior`: a window prior
puts zero mass off the band.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._validation import check_int
from .base import NEG_INF, ChunkLogPrior, check_qkv, empty_rows, resolve_scale, sdpa_rows
from .global_keys import GlobalKeys, dense_rows_attention, global_prior, resolve_global_keys
from .results import ReducedSupport, empty_support

__all__ = ["local_support", "local_attention", "local_attend", "local_chunk"]


def _band(x: Tensor, K: int) -> Tensor:
    """``(…, n, L)`` → ``(…, n, K)`` with ``out[..., r, m] = x[..., r, r + m]`` (needs r+m < L).

    Skew by padding: in ``x`` flattened, ``(r, r + m)`` sits at ``r·L + r + m = r·(L+1) + m``."""
    n, L = x.shape[-2:]
    flat = F.pad(x.reshape(x.shape[:-2] + (n * L,)), (0, n))  # (…, n·(L+1))
    return flat.reshape(x.shape[:-2] + (n, L + 1))[..., :K]


def _unband(w: Tensor, L: int) -> Tensor:
    """Inverse of :func:`_band`: ``(…, n, K)`` → ``(…, n, L)``, zeros off the band."""
    n, K = w.shape[-2:]
    x = F.pad(w, (0, L + 1 - K))  # (…, n, L+1)
    return x.reshape(w.shape[:-2] + (n * (L + 1),))[..., : n * L].reshape(w.shape[:-2] + (n, L))


def local_chunk(c: int | None, window: int) -> int:
    """Queries per block: ``chunk_size``, by default ``max(256, 2w)``."""
    return c if c is not None else max(256, 2 * window)


def _local_blocks(
    q: Tensor, k: Tensor, window: int, chunk_size: int | None
) -> Iterator[tuple[int, int, int, Tensor, Tensor]]:
    """Yield ``(start, stop, L, key_index (L,), valid (L,))`` for each query chunk: its keys are
    rows ``start : start + L`` of ``k`` padded by ``window`` zeros before (and enough after),
    i.e. key positions ``start - window ...``; ``valid`` marks those inside ``[0, Tk)``."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    c = local_chunk(chunk_size, window)
    for s in range(0, Tq, c):
        e = min(s + c, Tq)
        L = e - s + 2 * window
        kidx = torch.arange(s - window, s - window + L, device=q.device)  # (L,)
        valid = (kidx >= 0) & (kidx < Tk)
        yield s, e, L, kidx, valid


def _pad_keys(x: Tensor, window: int, Tq: int) -> Tensor:
    """``w`` zero rows before the keys and enough after: key ``j`` is row ``j + w``."""
    Tk = x.shape[-2]
    return F.pad(x, (0, 0, window, window + max(0, Tq - Tk)))  # (…, w + Tk + …, D)


def _chunk_prior(
    lp_fn: ChunkLogPrior | None,
    s: int,
    e: int,
    kidx: Tensor,
    valid: Tensor,
    Tk: int,
    dtype: torch.dtype,
) -> Tensor:
    """Log-prior of queries ``s:e`` on the block's keys: ``-inf`` on keys outside ``[0, Tk)``."""
    lp = torch.zeros(valid.shape, dtype=dtype, device=valid.device).masked_fill(~valid, NEG_INF)
    if lp_fn is not None:
        extra = lp_fn(s, e, kidx.clamp(0, Tk - 1))
        if extra is not None:
            lp = lp + extra  # (…, n, L)
    return lp


def local_support(
    q: Tensor,
    k: Tensor,
    window: int,
    log_prior: ChunkLogPrior | None = None,
    *,
    scale: float | None = None,
    chunk_size: int | None = None,
) -> ReducedSupport:
    r"""Scores of every query on its band :math:`|i - j| \le w`, block by block.

    Query chunk :math:`[s, e)` is scored against keys :math:`[s - w, e + w)` in one matmul
    (``chunk·(chunk + 2w)`` entries), then the band is cut out. Slot ``m`` of query ``i`` is key
    ``i - w + m``; slots outside ``[0, Tk)`` get ``log_prior = -inf``.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)`` → logits/log_prior ``(…, Tq, 2w+1)``, index
        ``(Tq, 2w+1)``.
    """
    check_qkv(q, k)
    window = check_int("window", window, 0)
    sc = resolve_scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    K = 2 * window + 1
    if Tq == 0:
        return empty_support(q, k, K, "local", window=window)
    kp = _pad_keys(k, window, Tq)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    logits, lps = [], []
    out = None  # without autograd, bands are written into one preallocated tensor
    for s, e, L, kidx, valid in _local_blocks(q, k, window, chunk_size):
        blk = torch.matmul(q[..., s:e, :] * sc, kp[..., s : s + L, :].transpose(-1, -2))  # (…,n,L)
        if grad:
            logits.append(_band(blk, K))  # (…, n, K)
        else:
            if out is None:
                out = blk.new_empty(blk.shape[:-2] + (Tq, K))
            out[..., s:e, :] = _band(blk, K)
        del blk
        lp = _chunk_prior(log_prior, s, e, kidx, valid, Tk, q.dtype)  # (…|1, n|1, L)
        lp = lp.expand(lp.shape[:-2] + (e - s, L)) if lp.dim() >= 2 else lp.expand(e - s, L)
        lps.append(_band(lp, K))  # (…|1, n, K)
    lead = torch.broadcast_shapes(*(t.shape[:-2] for t in lps))
    lp_all = torch.cat([t.expand(lead + t.shape[-2:]) for t in lps], dim=-2)  # (…, Tq, K)
    index = (
        torch.arange(Tq, device=q.device).unsqueeze(-1) - window + torch.arange(K, device=q.device)
    )  # (Tq, K)
    logits_all = torch.cat(logits, dim=-2) if grad else out
    if logits_all is None:  # pragma: no cover - _local_blocks yields at least one block
        raise RuntimeError("local_support: no query block was scored")
    return ReducedSupport(logits_all, lp_all, index, Tk, "local", window=window)


def local_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    log_prior: ChunkLogPrior | None = None,
    *,
    scale: float | None = None,
    chunk_size: int | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    global_keys: GlobalKeys = None,
) -> Tensor:
    r"""Posterior-mean output of local attention without keeping any weights: each query chunk
    runs fused ``scaled_dot_product_attention`` against its ``chunk + 2w`` keys under the band
    log-prior. Rows with no allowed key give zeros (as everywhere in bayesattn).

    With ``global_keys`` (positions ``(G,)``) it is local + global attention, the read of
    :func:`~bayesattn.functional.supports.local_global_support`: every chunk also reads the
    global keys, and the global queries' rows read every key.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)``, v ``(…, Tk, Dv)`` → ``(…, Tq, Dv)``.
    """
    check_qkv(q, k, v)
    window = check_int("window", window, 0)
    sc = resolve_scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    gk, rows = resolve_global_keys(global_keys, Tq, Tk, q.device)
    if Tq == 0:
        return empty_rows(q, v)
    kp, vp = _pad_keys(k, window, Tq), _pad_keys(v, window, Tq)
    kg = vg = None
    if gk is not None:
        kg, vg = k.index_select(-2, gk), v.index_select(-2, gk)  # (…, G, D), (…, G, Dv)
    outs = []
    band_cache: dict[int, Tensor] = {}
    for s, e, L, kidx, valid in _local_blocks(q, k, window, chunk_size):
        n = e - s
        if n not in band_cache:  # (n, L): 0 on the band r <= col <= r + 2w, -inf elsewhere
            r = torch.arange(n, device=q.device).unsqueeze(-1)
            col = torch.arange(L, device=q.device)
            off = (col < r) | (col > r + 2 * window)
            band_cache[n] = torch.zeros(n, L, dtype=q.dtype, device=q.device).masked_fill(
                off, NEG_INF
            )
        lp = band_cache[n] + _chunk_prior(log_prior, s, e, kidx, valid, Tk, q.dtype)  # (…|1, n, L)
        keys, vals = kp[..., s : s + L, :], vp[..., s : s + L, :]
        if gk is not None and kg is not None and vg is not None:
            lpg = global_prior(log_prior, s, e, gk, window, q.dtype)  # (…|1, n, G)
            lead = torch.broadcast_shapes(lp.shape[:-2], lpg.shape[:-2])
            lp = torch.cat([lp.expand(lead + lp.shape[-2:]), lpg.expand(lead + lpg.shape[-2:])], -1)
            keys, vals = torch.cat([keys, kg], dim=-2), torch.cat([vals, vg], dim=-2)
        o = sdpa_rows(q[..., s:e, :], keys, vals, lp, sc, dropout_p if training else 0.0)
        outs.append(o)  # (…, n, Dv)
    out = torch.cat(outs, dim=-2)
    if rows is not None:  # global queries read every key
        read = dense_rows_attention(q, k, v, rows, log_prior, sc, dropout_p if training else 0.0)
        out = out.index_copy(-2, rows, read.expand(out.shape[:-2] + read.shape[-2:]))
    return out


def local_attend(w: Tensor, v: Tensor, window: int, chunk_size: int | None) -> Tensor:
    r"""Read of band weights, :math:`y_i = \sum_m w_{im} v_{i - w + m}`, block by block:
    ``w`` ``(*S, …, Tq, 2w+1)``, ``v`` ``(…, Tk, Dv)`` → ``(*S, …, Tq, Dv)``."""
    Tq, K = w.shape[-2:]
    vp = _pad_keys(v, window, Tq)
    c = local_chunk(chunk_size, window)
    outs = []
    for s in range(0, Tq, c):
        e = min(s + c, Tq)
        L = e - s + 2 * window
        blk = _unband(w[..., s:e, :], L)  # (*S, …, n, L)
        outs.append(torch.matmul(blk, vp[..., s : s + L, :]))  # (*S, …, n, Dv)
    return torch.cat(outs, dim=-2)
