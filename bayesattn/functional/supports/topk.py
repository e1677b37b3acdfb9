r"""Sparse top-k attention: each query's :math:`k` most probable keys under the exact posterior
:math:`\bar p_{ij} = \operatorname{softmax}_j(\log\pi_{ij} + q_i\cdot k_j/\sqrt d)`.

Scored in query chunks (:math:`O(\text{chunk}\cdot T_k)` transient, :math:`O(T\cdot k)` kept). The
read is the exact posterior *restricted* to those keys, :math:`\bar p_{ij}/\sum_{l\in S_i}\bar
p_{il}`; the mass it drops, :math:`\delta_i = 1 - \sum_{l\in S_i}\bar p_{il}`, is returned and
bounds the error: :math:`\lVert y_i^{(k)} - y_i\rVert \le 2\delta_i\max_j\lVert v_j\rVert`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..._validation import check_int
from .base import NEG_INF, ChunkLogPrior, check_qkv, resolve_scale
from .results import ReducedSupport, empty_support

__all__ = ["topk_support"]


def topk_support(
    q: Tensor,
    k: Tensor,
    topk: int,
    log_prior: ChunkLogPrior | None = None,
    *,
    scale: float | None = None,
    chunk_size: int = 256,
) -> ReducedSupport:
    r"""Each query's ``topk`` most probable keys under the exact posterior, and the mass dropped.

    Query chunks of ``chunk_size`` are scored against all keys (transient ``(…, chunk, Tk)``), the
    ``k`` largest posterior logits :math:`\log\pi_{ij} + q_i\cdot k_j/\sqrt d` are kept, and the
    dropped mass :math:`\delta_i = 1 - \exp(\operatorname{lse}_{S_i} - \operatorname{lse}_{\text{all}})`
    is computed from the full row (no gradient). ``topk >= Tk`` keeps every key (dense attention).
    A row with no allowed key has ``δ = 0``.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)`` → logits/log_prior/index ``(…, Tq, min(k, Tk))``,
        dropped_mass ``(…, Tq)``.
    """
    check_qkv(q, k)
    topk = check_int("topk", topk, 1)
    chunk_size = check_int("chunk_size", chunk_size, 1)
    sc = resolve_scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    kk = min(topk, Tk)
    if Tq == 0:
        return empty_support(q, k, kk, "topk")
    all_keys = torch.arange(Tk, device=q.device)
    kT = k.transpose(-1, -2)
    logits, lps, idxs, dropped = [], [], [], []
    for s in range(0, Tq, chunk_size):
        e = min(s + chunk_size, Tq)
        lg = torch.matmul(q[..., s:e, :] * sc, kT)  # (…, n, Tk)
        lp = log_prior(s, e, all_keys) if log_prior is not None else None
        post = lg if lp is None else lg + lp  # (…, n, Tk)
        with torch.no_grad():
            top, idx = post.detach().topk(kk, dim=-1, sorted=False)  # (…, n, kk)
            lse_all = torch.logsumexp(post.detach(), dim=-1)  # (…, n)
            lse_top = torch.logsumexp(top, dim=-1)
            dead = lse_all == NEG_INF
            d = (-torch.expm1(lse_top - lse_all)).clamp_min(0.0)
            dropped.append(torch.where(dead, torch.zeros_like(d), d))
        logits.append(lg.expand(idx.shape[:-1] + (Tk,)).gather(-1, idx))
        if lp is not None:
            lps.append(lp.expand(idx.shape[:-1] + (Tk,)).gather(-1, idx))
        idxs.append(idx)
    lp_all = torch.cat(lps, dim=-2) if lps else None
    return ReducedSupport(
        torch.cat(logits, dim=-2),
        lp_all,
        torch.cat(idxs, dim=-2),
        Tk,
        "topk",
        dropped_mass=torch.cat(dropped, dim=-1),
    )
