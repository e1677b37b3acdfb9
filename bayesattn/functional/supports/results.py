r"""The result of a support: :class:`ReducedSupport` (the scores of every query on its ``K`` key
slots, with the log-prior kept apart) and :class:`SupportWeights` (weights on the slots, back to a
dense ``(…, Tq, Tk)`` matrix when asked).

The exact posterior on a support is :math:`\operatorname{softmax}_m(\log\pi_{im} + s\,q_i\cdot
k_{j(i,m)})`: every family of :mod:`bayesattn.families` runs on the slots as on a key axis, and
dense attention under :func:`dense_support_mask` (0 on the support, ``-inf`` elsewhere) reads the
same.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..posterior import posterior_weights
from .base import NEG_INF

__all__ = ["ReducedSupport", "SupportWeights", "dense_support_mask", "empty_support"]


@dataclass
class ReducedSupport:
    r"""Scores of every query on its reduced key support.

    Attributes:
        logits: likelihood scores :math:`q_i\cdot k_j/\sqrt d` on the support, ``(…, Tq, K)``
            (finite; slots outside the key range hold 0).
        log_prior: :math:`\log\pi` on the support, broadcastable to ``logits``; ``-inf`` on slots
            that are empty (outside the key range) or masked. ``None``: every slot allowed.
        index: key position of each slot, broadcastable to ``(…, Tq, K)``, or ``None`` when the
            slots are mixtures of keys (low rank).
        num_keys: ``Tk``.
        name: the support, ``"local"``, ``"local_global"``, ``"topk"``, ``"dense"`` or
            ``"lowrank"`` (how its slots are read: a band, gathers, every key, mixtures).
        window: the half-width ``w`` of a local support (slot ``m < 2w+1`` of query ``i`` is key
            ``i - w + m``); ``None`` otherwise.
        dropped_mass: ``(…, Tq)``, the posterior mass outside the support (top-k: exact; top-k
            by clusters: an upper bound), else ``None``.
        global_keys: ``(G,)`` positions of the global keys of a ``"local_global"`` support (its
            last ``G`` slots); ``None`` otherwise.
        global_rows: ``(Gq,)`` query rows that see every key (their rows here are empty, ``-inf``);
            read through ``global_support``.
        global_support: a ``"dense"`` support ``(…, Gq, Tk)`` for those rows.
    """

    logits: Tensor
    log_prior: Tensor | None
    index: Tensor | None
    num_keys: int
    name: str
    window: int | None = None
    dropped_mass: Tensor | None = None
    global_keys: Tensor | None = None
    global_rows: Tensor | None = None
    global_support: ReducedSupport | None = None

    @property
    def size(self) -> int:
        """Support size ``K``."""
        return self.logits.shape[-1]

    def posterior_weights(self) -> Tensor:
        r"""Exact posterior over the support, :math:`\operatorname{softmax}(\log\pi + \text{logits})`
        (zero on empty or masked slots), ``(…, Tq, K)``.

        Without autograd (inference) the softmax runs in place on one fresh tensor: at long
        ``T`` each extra ``(…, Tq, K)`` copy is a visible share of the peak memory."""
        if self.logits.shape[-1] == 0 or self.logits.shape[-2] == 0:  # no slot or no row
            shape = self.logits.shape
            if self.log_prior is not None:
                shape = torch.broadcast_shapes(shape, self.log_prior.shape)
            return self.logits.new_zeros(shape)
        needs_grad = torch.is_grad_enabled() and (
            self.logits.requires_grad
            or (self.log_prior is not None and self.log_prior.requires_grad)
        )
        if needs_grad or self.log_prior is None or torch.compiler.is_compiling():
            return posterior_weights(self.logits, self.log_prior)  # traceable: no data branch
        a = self.logits + self.log_prior  # (…, Tq, K), fresh
        dead = a.amax(-1, keepdim=True) == NEG_INF  # (…, Tq, 1) rows with no allowed slot
        any_dead = bool(dead.any())
        if any_dead:
            a.masked_fill_(dead, 0.0)
        w = torch._softmax(a, -1, False, out=a)
        return w.masked_fill_(dead, 0.0) if any_dead else w

    def allowed(self) -> Tensor | None:
        """Bool ``(…, Tq, K)``: slots with non-zero prior mass, or ``None`` (all)."""
        if self.log_prior is None:
            return None
        return (self.logits + self.log_prior) > NEG_INF


@dataclass
class SupportWeights:
    r"""Attention weights on a reduced support, as returned by a layer with an efficient kernel.

    Attributes:
        weights: ``(*S, …, Tq, K)``, each row sums to 1 over its support (0 on empty or masked
            slots) — the posterior mean, or a posterior draw in the stochastic modes.
        index: key position of each slot (see :class:`ReducedSupport`), ``None`` for low rank.
        num_keys: ``Tk``.
        dropped_mass: ``(…, Tq)`` exact posterior mass outside the support (top-k) or ``None``.
        average_heads: :meth:`to_dense` averages over the head dim (``-3``), as
            ``average_attn_weights=True`` does for dense attention.
    """

    weights: Tensor
    index: Tensor | None
    num_keys: int
    dropped_mass: Tensor | None = None
    average_heads: bool = False
    global_rows: Tensor | None = None
    global_weights: Tensor | None = None

    def to_dense(self) -> Tensor:
        r"""The weights as a dense ``(*S, …, Tq, Tk)`` matrix (``(*S, B, Tq, Tk)`` when averaging
        heads); costs :math:`O(T_q T_k)` memory. Not defined for low rank (slots mix keys).
        Rows of global queries (local + global) come from ``global_weights`` ``(*S, …, Gq, Tk)``."""
        if self.index is None:
            raise ValueError(
                "low-rank weights are over r mixed keys, not over key positions: there is no "
                "dense (Tq, Tk) matrix to return"
            )
        w = self.weights
        dense = w.new_zeros(w.shape[:-1] + (self.num_keys,))
        if self.num_keys > 0 and w.shape[-1] > 0:
            idx = self.index.clamp(0, self.num_keys - 1).expand(w.shape)
            dense = dense.scatter_add(-1, idx, w)  # empty slots carry weight 0
        if self.global_rows is not None and self.global_weights is not None:
            gw = self.global_weights.expand(dense.shape[:-2] + self.global_weights.shape[-2:])
            dense = dense.index_copy(-2, self.global_rows, gw)
        return dense.mean(-3) if self.average_heads else dense


def dense_support_mask(support: ReducedSupport) -> Tensor:
    r"""The dense log-prior that restricts attention to the support: 0 on each query's support
    keys, ``-inf`` elsewhere, ``(…, Tq, Tk)``. Used by tests and diagnostics (``O(Tq Tk)``): dense
    attention under ``log_prior + dense_support_mask(s)`` equals the kernel's read."""
    if support.index is None:
        raise ValueError("a low-rank support has no key positions")
    ok = support.allowed()
    idx = support.index.expand(support.logits.shape)
    ok = torch.ones_like(idx, dtype=torch.bool) if ok is None else ok.expand(idx.shape)
    out = torch.full(
        idx.shape[:-1] + (support.num_keys,),
        NEG_INF,
        dtype=support.logits.dtype,
        device=idx.device,
    )
    idx = idx.clamp(0, support.num_keys - 1)
    src = torch.where(ok, 0.0, NEG_INF).to(out.dtype)
    out = out.scatter_reduce(-1, idx, src, reduce="amax")
    g = support.global_support
    if g is not None and support.global_rows is not None:
        g_ok = g.allowed()
        shape = out.shape[:-2] + g.logits.shape[-2:]
        rows = (
            torch.zeros(shape, dtype=out.dtype, device=out.device)
            if g_ok is None
            else torch.where(g_ok.expand(shape), 0.0, NEG_INF).to(out.dtype)
        )
        out = out.index_copy(-2, support.global_rows, rows)
    return out


def empty_support(
    q: Tensor, k: Tensor, K: int, name: str, window: int | None = None
) -> ReducedSupport:
    """The support of zero queries (``Tq = 0``): every tensor has a zero-length query axis."""
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    z = q.new_zeros(lead + (0, K))
    idx = torch.zeros(lead + (0, K), dtype=torch.long, device=q.device)
    dm = q.new_zeros(lead + (0,)) if name == "topk" else None
    return ReducedSupport(z, z.clone(), idx, k.shape[-2], name, window=window, dropped_mass=dm)
