r"""Efficient attention over a *reduced key support*: block-local, sparse top-k and low-rank reads.

Dense attention scores every query against every key, :math:`O(T_q T_k)` in time and memory.
Each function here keeps, for every query :math:`i`, a support of :math:`K \ll T_k` slots and
returns the scores on that support only, as a :class:`ReducedSupport`:

* :func:`local_support` — the band :math:`|i - j| \le w` (:math:`K = 2w + 1`), computed block by
  block (queries in chunks of ``chunk_size``, each against its ``chunk + 2w`` neighbouring keys),
  so memory is :math:`O(T\cdot w)`. It is *exactly* dense attention under a hard
  :class:`~bayesattn.priors.LocalWindowPrior`: a window prior puts zero mass off the band.
* :func:`topk_support` — each query's :math:`k` most probable keys under the exact posterior
  :math:`\bar p_{ij} = \operatorname{softmax}_j(\log\pi_{ij} + q_i\cdot k_j/\sqrt d)`, scored in
  query chunks (:math:`O(\text{chunk}\cdot T_k)` transient, :math:`O(T\cdot k)` kept). The read is the
  exact posterior *restricted* to those keys, :math:`\bar p_{ij}/\sum_{l\in S_i}\bar p_{il}`; the
  mass it drops, :math:`\delta_i = 1 - \sum_{l\in S_i}\bar p_{il}`, is returned and bounds the
  error: :math:`\lVert y_i^{(k)} - y_i\rVert \le 2\delta_i\max_j\lVert v_j\rVert`.
* :func:`lowrank_project` + :func:`lowrank_support` — Linformer (Wang et al., 2020): keys and values
  are projected along the sequence, :math:`\tilde K = E K`, :math:`\tilde V = F V` with learned
  :math:`E, F \in \mathbb R^{r\times T}`, and every query reads a posterior over the :math:`r`
  mixed keys; :math:`O(T\cdot r)`.

A :class:`ReducedSupport` carries the likelihood scores ``logits`` and the log-prior
``log_prior`` (``-inf`` on empty or masked slots) separately, so every family of
:mod:`bayesattn.families` runs on it unchanged: the support *is* the key axis. Sampling a
family on the support equals sampling the dense family whose prior is restricted (``-inf``) to the
same keys. :func:`support_attend` reads the values for weights on the support (with any leading
sample dims), and :class:`SupportWeights` turns them back into a dense ``(…, Tq, Tk)`` matrix when
asked.

Masks and priors reach the supports as a :data:`ChunkLogPrior`: a callable
``(start, stop, key_index) -> log-prior`` for queries ``start:stop`` against the keys at positions
``key_index``, so no ``(Tq, Tk)`` matrix is ever built; :func:`chunk_log_prior` makes one from
PyTorch's masks and an optional key-relevance prior.

Shape glossary: ``S`` samples (leftmost), ``…`` batch dims (e.g. ``B, H``), ``Tq``/``Tk``
query/key length, ``K`` support size, ``D`` head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .._validation import check_int, check_real
from .posterior import mask_to_log_prior, posterior_weights

__all__ = [
    "ChunkLogPrior",
    "ReducedSupport",
    "SupportWeights",
    "chunk_log_prior",
    "local_support",
    "local_attention",
    "topk_support",
    "cluster_topk_support",
    "local_global_support",
    "tiled_attention",
    "tiled_posterior_read",
    "dense_support",
    "lowrank_project",
    "lowrank_support",
    "support_attend",
    "dense_support_mask",
]

ChunkLogPrior = Callable[[int, int, Tensor], "Tensor | None"]
"""``(start, stop, key_index (Kc,)) -> log-prior`` broadcastable to ``(…, stop - start, Kc)``."""

_NEG_INF = float("-inf")


def _scale(scale: float | None, d: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(d)
    return check_real("scale", scale, gt=0.0)


def _check_qkv(q: Tensor, k: Tensor, v: Tensor | None = None) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t is not None and (not isinstance(t, Tensor) or t.dim() < 2):
            raise ValueError(f"{name} must be a tensor (..., T, D); got {getattr(t, 'shape', t)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the last (feature) dim; got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if v is not None and v.shape[-2] != k.shape[-2]:
        raise ValueError(
            f"k and v must have the same length; got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )


# ---------------------------------------------------------------------------------------------
# masks and priors, one query chunk at a time
# ---------------------------------------------------------------------------------------------


def chunk_log_prior(
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    prior: Callable[[int, int, Tensor], Tensor | None] | None = None,
    *,
    batch_size: int,
    num_heads: int,
    tgt_len: int,
    src_len: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> ChunkLogPrior | None:
    r"""PyTorch's masks (and an optional chunked prior) as a :data:`ChunkLogPrior`.

    ``attn_mask``/``key_padding_mask`` follow :func:`bayesattn.functional.mask_to_log_prior`
    (bool ``True`` = not allowed, float = added); ``is_causal`` without an ``attn_mask`` adds
    :math:`\log\pi_{ij} = -\infty` for :math:`j > i`, evaluated per chunk (never a ``(Tq, Tk)``
    matrix). ``prior(start, stop, key_index)`` adds a key-relevance log-prior. Returns ``None``
    when nothing is masked.
    """
    static = mask_to_log_prior(
        attn_mask,
        key_padding_mask,
        False,
        batch_size=batch_size,
        num_heads=num_heads,
        tgt_len=tgt_len,
        src_len=src_len,
        dtype=dtype,
        device=device,
    )  # (B|1, H|1, Tq|1, Tk) or None
    causal = bool(is_causal) and attn_mask is None
    if static is None and not causal and prior is None:
        return None

    def fn(start: int, stop: int, key_index: Tensor) -> Tensor | None:
        out: Tensor | None = None
        if static is not None:
            s = static if static.shape[-2] == 1 else static[..., start:stop, :]
            out = s.index_select(-1, key_index)  # (B|1, H|1, n|1, Kc)
        if causal:
            qi = torch.arange(start, stop, device=key_index.device).unsqueeze(-1)  # (n, 1)
            c = torch.zeros((), dtype=dtype, device=key_index.device)
            c = c.masked_fill(key_index.unsqueeze(0) > qi, _NEG_INF)  # (n, Kc)
            out = c if out is None else out + c
        if prior is not None:
            p = prior(start, stop, key_index)
            if p is not None:
                out = p if out is None else out + p
        return out

    return fn


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------


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
        kind: ``"local"``, ``"local_global"``, ``"topk"``, ``"dense"`` or ``"lowrank"``.
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
    kind: str
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
        if needs_grad or self.log_prior is None:
            return posterior_weights(self.logits, self.log_prior)
        a = self.logits + self.log_prior  # (…, Tq, K), fresh
        dead = a.amax(-1, keepdim=True) == _NEG_INF  # (…, Tq, 1) rows with no allowed slot
        any_dead = bool(dead.any())
        if any_dead:
            a.masked_fill_(dead, 0.0)
        w = torch._softmax(a, -1, False, out=a)
        return w.masked_fill_(dead, 0.0) if any_dead else w

    def allowed(self) -> Tensor | None:
        """Bool ``(…, Tq, K)``: slots with non-zero prior mass, or ``None`` (all)."""
        if self.log_prior is None:
            return None
        return (self.logits + self.log_prior) > _NEG_INF


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
        _NEG_INF,
        dtype=support.logits.dtype,
        device=idx.device,
    )
    idx = idx.clamp(0, support.num_keys - 1)
    src = torch.where(ok, 0.0, _NEG_INF).to(out.dtype)
    out = out.scatter_reduce(-1, idx, src, reduce="amax")
    g = support.global_support
    if g is not None and support.global_rows is not None:
        g_ok = g.allowed()
        shape = out.shape[:-2] + g.logits.shape[-2:]
        rows = (
            torch.zeros(shape, dtype=out.dtype, device=out.device)
            if g_ok is None
            else torch.where(g_ok.expand(shape), 0.0, _NEG_INF).to(out.dtype)
        )
        out = out.index_copy(-2, support.global_rows, rows)
    return out


# ---------------------------------------------------------------------------------------------
# local window (banded) attention, block by block
# ---------------------------------------------------------------------------------------------


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


def _local_chunk(c: int | None, window: int) -> int:
    return c if c is not None else max(256, 2 * window)


def _local_blocks(
    q: Tensor, k: Tensor, window: int, chunk_size: int | None
) -> Iterator[tuple[int, int, int, Tensor, Tensor]]:
    """Yield ``(start, stop, L, key_index (L,), valid (L,))`` for each query chunk: its keys are
    rows ``start : start + L`` of ``k`` padded by ``window`` zeros before (and enough after),
    i.e. key positions ``start - window ...``; ``valid`` marks those inside ``[0, Tk)``."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    c = _local_chunk(chunk_size, window)
    for s in range(0, Tq, c):
        e = min(s + c, Tq)
        L = e - s + 2 * window
        kidx = torch.arange(s - window, s - window + L, device=q.device)  # (L,)
        valid = (kidx >= 0) & (kidx < Tk)
        yield s, e, L, kidx, valid


def _pad_keys(x: Tensor, window: int, Tq: int) -> Tensor:
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
    lp = torch.zeros(valid.shape, dtype=dtype, device=valid.device).masked_fill(~valid, _NEG_INF)
    if lp_fn is not None:
        extra = lp_fn(s, e, kidx.clamp(0, Tk - 1))
        if extra is not None:
            lp = lp + extra  # (…, n, L)
    return lp


def _empty_support(
    q: Tensor, k: Tensor, K: int, kind: str, window: int | None = None
) -> ReducedSupport:
    """The support of zero queries (``Tq = 0``): every tensor has a zero-length query axis."""
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    z = q.new_zeros(lead + (0, K))
    idx = torch.zeros(lead + (0, K), dtype=torch.long, device=q.device)
    dm = q.new_zeros(lead + (0,)) if kind == "topk" else None
    return ReducedSupport(z, z.clone(), idx, k.shape[-2], kind, window=window, dropped_mass=dm)


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
    _check_qkv(q, k)
    window = check_int("window", window, 0)
    sc = _scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    K = 2 * window + 1
    if Tq == 0:
        return _empty_support(q, k, K, "local", window=window)
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
    global_keys: Tensor | None = None,
) -> Tensor:
    r"""Posterior-mean output of local attention without keeping any weights: each query chunk
    runs fused ``scaled_dot_product_attention`` against its ``chunk + 2w`` keys under the band
    log-prior. Rows with no allowed key give zeros (as everywhere in bayesattn).

    With ``global_keys`` (positions ``(G,)``) it is local + global attention, the read of
    :func:`local_global_support`: every chunk also reads the global keys, and the global queries'
    rows read every key.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)``, v ``(…, Tk, Dv)`` → ``(…, Tq, Dv)``.
    """
    _check_qkv(q, k, v)
    window = check_int("window", window, 0)
    sc = _scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    gk = _check_global_keys(global_keys, Tk, q.device)
    if Tq == 0:
        return _empty_rows(q, v)
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
                off, _NEG_INF
            )
        lp = band_cache[n] + _chunk_prior(log_prior, s, e, kidx, valid, Tk, q.dtype)  # (…|1, n, L)
        keys, vals = kp[..., s : s + L, :], vp[..., s : s + L, :]
        if gk is not None and kg is not None and vg is not None:
            lpg = _global_prior(log_prior, s, e, gk, window, q.dtype)  # (…|1, n, G)
            lead = torch.broadcast_shapes(lp.shape[:-2], lpg.shape[:-2])
            lp = torch.cat([lp.expand(lead + lp.shape[-2:]), lpg.expand(lead + lpg.shape[-2:])], -1)
            keys, vals = torch.cat([keys, kg], dim=-2), torch.cat([vals, vg], dim=-2)
        o = _sdpa_rows(q[..., s:e, :], keys, vals, lp, sc, dropout_p if training else 0.0)
        outs.append(o)  # (…, n, Dv)
    out = torch.cat(outs, dim=-2)
    rows = _global_rows(gk, Tq)
    if rows is not None:  # global queries read every key
        read = _dense_rows_attention(q, k, v, rows, log_prior, sc, dropout_p if training else 0.0)
        out = out.index_copy(-2, rows, read.expand(out.shape[:-2] + read.shape[-2:]))
    return out


def _sdpa_rows(q: Tensor, k: Tensor, v: Tensor, lp: Tensor, sc: float, p: float) -> Tensor:
    """Fused attention under a log-prior; rows with no allowed key read zeros."""
    dead = ~(lp > _NEG_INF).any(-1, keepdim=True)  # (…|1, n, 1)
    has_dead = bool(dead.any())
    if has_dead:
        lp = lp.masked_fill(dead, 0.0)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=lp, dropout_p=p, scale=sc)
    return o.masked_fill(dead, 0.0) if has_dead else o  # (…, n, Dv)


def _empty_rows(q: Tensor, v: Tensor) -> Tensor:
    lead = torch.broadcast_shapes(q.shape[:-2], v.shape[:-2])
    return q.new_zeros(lead + (q.shape[-2], v.shape[-1]))


# ---------------------------------------------------------------------------------------------
# local + global (Longformer / BigBird) attention
# ---------------------------------------------------------------------------------------------


def _check_global_keys(global_keys: Tensor | None, Tk: int, device: torch.device) -> Tensor | None:
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


def _global_rows(gk: Tensor | None, Tq: int) -> Tensor | None:
    if gk is None:
        return None
    rows = gk[gk < Tq]
    return rows if rows.numel() else None


def _global_prior(
    lp_fn: ChunkLogPrior | None, s: int, e: int, gk: Tensor, window: int, dtype: torch.dtype
) -> Tensor:
    """Log-prior of queries ``s:e`` on the global keys: ``-inf`` where the key is already in the
    query's band (``|i - g| <= w``: each key appears once in a support), plus masks and priors."""
    qi = torch.arange(s, e, device=gk.device).unsqueeze(-1)  # (n, 1)
    dup = (qi - gk).abs() <= window  # (n, G)
    lp = torch.zeros(dup.shape, dtype=dtype, device=gk.device).masked_fill(dup, _NEG_INF)
    if lp_fn is not None:
        extra = lp_fn(s, e, gk)
        if extra is not None:
            lp = lp + extra  # (…|1, n, G)
    return lp


def _rows_prior(
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


def _dense_rows_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rows: Tensor,
    lp_fn: ChunkLogPrior | None,
    sc: float,
    p: float,
) -> Tensor:
    qr = q.index_select(-2, rows)  # (…, Gq, D)
    lp = _rows_prior(lp_fn, rows, k.shape[-2], q.device)
    if lp is None:
        return F.scaled_dot_product_attention(qr, k, v, dropout_p=p, scale=sc)
    return _sdpa_rows(qr, k, v, lp, sc, p)  # (…, Gq, Dv)


def local_global_support(
    q: Tensor,
    k: Tensor,
    window: int,
    global_keys: Tensor | None,
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
        q ``(…, Tq, D)``, k ``(…, Tk, D)``, global_keys ``(G,)`` → logits/log_prior
        ``(…, Tq, 2w+1+G)``, index ``(Tq, 2w+1+G)``; global_support ``(…, Gq, Tk)``.
    """
    _check_qkv(q, k)
    window = check_int("window", window, 0)
    sc = _scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    band = local_support(q, k, window, log_prior, scale=scale, chunk_size=chunk_size)
    gk = _check_global_keys(global_keys, Tk, q.device)
    if gk is None or Tq == 0:
        return band
    G = gk.numel()
    lg = torch.matmul(q * sc, k.index_select(-2, gk).transpose(-1, -2))  # (…, Tq, G)
    c = _local_chunk(chunk_size, window)
    lps = [
        _global_prior(log_prior, s, min(s + c, Tq), gk, window, q.dtype) for s in range(0, Tq, c)
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
    rows = _global_rows(gk, Tq)
    g_sup = None
    if rows is not None:
        lp_all = lp_all.index_fill(-2, rows, _NEG_INF)  # read densely, below
        lg_rows = torch.matmul(q.index_select(-2, rows) * sc, k.transpose(-1, -2))  # (…, Gq, Tk)
        g_sup = ReducedSupport(
            lg_rows,
            _rows_prior(log_prior, rows, Tk, q.device),
            torch.arange(Tk, device=q.device).expand(rows.numel(), Tk),
            Tk,
            "dense",
        )
    return ReducedSupport(
        logits, lp_all, index, Tk, "local_global", window=window, global_keys=gk,
        global_rows=rows, global_support=g_sup,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# sparse top-k attention
# ---------------------------------------------------------------------------------------------


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
    _check_qkv(q, k)
    topk = check_int("topk", topk, 1)
    chunk_size = check_int("chunk_size", chunk_size, 1)
    sc = _scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    kk = min(topk, Tk)
    if Tq == 0:
        return _empty_support(q, k, kk, "topk")
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
            dead = lse_all == _NEG_INF
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


# ---------------------------------------------------------------------------------------------
# top-k through clusters of keys: candidates without scoring every key
# ---------------------------------------------------------------------------------------------


def _kmeans(k: Tensor, valid: Tensor, C: int, iters: int) -> tuple[Tensor, Tensor]:
    """Lloyd's k-means on the valid keys of each row of ``k`` ``(N, T, D)``; centroids start on
    evenly spaced keys. Returns centroids ``(N, C, D)`` and assignments ``(N, T)``."""
    N, T, D = k.shape
    mu = k[:, torch.linspace(0, T - 1, C, device=k.device).long()]  # (N, C, D)
    kv = k * valid.unsqueeze(-1).to(k.dtype)
    for it in range(iters + 1):
        score = torch.baddbmm(
            (-0.5 * mu.square().sum(-1)).unsqueeze(1), k, mu.transpose(1, 2)
        )  # (N, T, C): k·μ - |μ|²/2, argmax = nearest centroid
        assign = score.argmax(-1)  # (N, T)
        if it == iters:
            break
        sums = torch.zeros_like(mu).scatter_add_(1, assign.unsqueeze(-1).expand(N, T, D), kv)
        cnt = torch.zeros(N, C, dtype=k.dtype, device=k.device).scatter_add_(
            1, assign, valid.to(k.dtype)
        )
        mu = torch.where(cnt.unsqueeze(-1) > 0, sums / cnt.clamp_min(1).unsqueeze(-1), mu)
    return mu, assign


def cluster_topk_support(
    q: Tensor,
    k: Tensor,
    topk: int,
    *,
    key_padding_mask: Tensor | None = None,
    is_causal: bool = False,
    num_clusters: int | None = None,
    probes: int | None = None,
    iters: int = 4,
    scale: float | None = None,
    chunk_size: int = 64,
) -> ReducedSupport:
    r"""Approximate top-k without scoring every key (routing attention), with a sound bound on the
    posterior mass it drops.

    1. The keys of each (batch, head) are clustered by k-means (``num_clusters`` :math:`C`,
       default :math:`\lceil\sqrt{T_k}\rceil`; :math:`O(T C D)`); cluster :math:`c` has centroid
       :math:`\mu_c`, radius :math:`r_c = \max_{j\in c}\lVert k_j - \mu_c\rVert` and
       :math:`n_c` (unpadded) keys.
    2. By Cauchy–Schwarz every key of :math:`c` has :math:`q\cdot k_j \le q\cdot\mu_c +
       \lVert q\rVert r_c`, so the cluster's unnormalised posterior mass is at most
       :math:`u_{ic} = n_c\exp(s(q_i\cdot\mu_c + \lVert q_i\rVert r_c))` (the masks only lower it;
       with ``is_causal`` :math:`n_c` counts the cluster's keys :math:`j \le i`).
       Clusters are cut into buckets of at most :math:`\lceil T_k/C\rceil` keys (same centroid,
       own radius and count), so every query scores the same number of candidates. Each query
       probes the ``probes`` buckets (default 8) whose best possible key scores highest,
       :math:`q_i\cdot\mu_c + \lVert q_i\rVert r_c`, scores their keys exactly and keeps its
       ``topk`` best: :math:`8\lceil T_k/C\rceil \approx 8\sqrt{T_k}` scored keys per query.
    3. With :math:`Z_S` the mass of the kept keys, :math:`Z_P` that of all probed keys and
       :math:`U_i = \sum_{c\ \text{not probed}} u_{ic}`, the dropped mass satisfies
       :math:`\delta_i \le 1 - Z_S / (Z_P + U_i)` (:math:`x/(a+x)` grows with :math:`x`): that is
       ``dropped_mass``, an upper bound that is exact when every cluster is probed.

    Masks: ``key_padding_mask`` (bool, ``True`` = padded, broadcastable to ``(…, Tk)``, e.g.
    ``(B, 1, Tk)`` for ``(B, H, ·, ·)`` inputs) and ``is_causal`` (key ``j > i`` dropped). Cost:
    :math:`O(T(C + P\,T/C)D) = O(T^{3/2} D)` instead of :math:`O(T^2 D)`.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)`` → logits/log_prior/index ``(…, Tq, K)`` with
        ``K = min(topk, candidates)``, dropped_mass ``(…, Tq)``.
    """
    _check_qkv(q, k)
    topk = check_int("topk", topk, 1)
    iters = check_int("iters", iters, 0)
    chunk_size = check_int("chunk_size", chunk_size, 1)
    sc = _scale(scale, q.shape[-1])
    Tq, Tk, D = q.shape[-2], k.shape[-2], q.shape[-1]
    if Tq == 0 or Tk == 0:
        return topk_support(q, k, topk, _padding_prior(key_padding_mask, Tk), scale=scale)
    C = check_int("num_clusters", num_clusters if num_clusters is not None else
                  math.ceil(math.sqrt(Tk)), 1)  # fmt: skip
    C = min(C, Tk)
    P = check_int("probes", probes if probes is not None else 8, 1)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    N = math.prod(lead)
    qf = q.expand(lead + (Tq, D)).reshape(N, Tq, D)
    kf = k.expand(lead + (Tk, D)).reshape(N, Tk, D)
    valid = torch.ones(N, Tk, dtype=torch.bool, device=q.device)
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool or key_padding_mask.shape[-1] != Tk:
            raise ValueError(
                f"key_padding_mask must be bool (..., Tk={Tk}); got {key_padding_mask.dtype} "
                f"{tuple(key_padding_mask.shape)}"
            )
        valid = ~key_padding_mask.expand(lead + (Tk,)).reshape(N, Tk)
    with torch.no_grad():
        kd = kf.detach()
        mu, assign = _kmeans(kd, valid, C, iters)  # (N, C, D), (N, Tk)
        assign = assign.masked_fill(~valid, C)  # padded keys: in no cluster
        cnt = torch.zeros(N, C + 1, dtype=kd.dtype, device=kd.device).scatter_add_(
            1, assign, torch.ones_like(kd[..., 0])
        )[:, :C]  # (N, C) unpadded keys per cluster
        dist = (
            (kd - mu.gather(1, assign.clamp_max(C - 1).unsqueeze(-1).expand(N, Tk, D)))
            .norm(dim=-1)
            .masked_fill(~valid, 0.0)
        )  # (N, Tk)
        # clusters cut into buckets of at most cap = ceil(Tk / C) keys (a big cluster becomes
        # several buckets with its centroid), so every query scores exactly P·cap candidates
        cap = max(math.ceil(Tk / C), 1)
        order = torch.argsort(assign, dim=-1, stable=True)  # (N, Tk) keys sorted by cluster
        sa = assign.gather(1, order)
        cnt_all = torch.cat([cnt, (~valid).sum(1, keepdim=True).to(cnt.dtype)], 1)  # (N, C+1)
        first = (torch.cumsum(cnt_all, 1) - cnt_all).long()  # start of each cluster in order
        rank = torch.arange(Tk, device=kd.device) - first.gather(1, sa)  # (N, Tk)
        nb = torch.ceil(cnt / cap).long()  # (N, C) buckets per cluster
        boff = torch.cumsum(nb, 1) - nb
        NB = max(int(nb.sum(1).max()), 1)
        bucket = torch.where(
            sa < C,
            boff.gather(1, sa.clamp_max(C - 1)) + torch.div(rank, cap, rounding_mode="floor"),
            NB,
        )  # (N, Tk) bucket of each sorted key; NB: padded keys
        slot = torch.where(sa < C, bucket * cap + rank % cap, NB * cap)
        members = torch.full((N, NB * cap + 1), -1, dtype=torch.long, device=kd.device)
        members = members.scatter(1, slot, order)[:, : NB * cap].view(N, NB, cap)
        ones = torch.ones_like(kd[..., 0])
        b_cnt = torch.zeros(N, NB + 1, dtype=kd.dtype, device=kd.device)
        b_cnt = b_cnt.scatter_add_(1, bucket, ones)[:, :NB]  # (N, NB)
        b_clu = torch.zeros(N, NB + 1, dtype=torch.long, device=kd.device)
        b_clu = b_clu.scatter(1, bucket, sa.clamp_max(C - 1))[:, :NB]  # cluster of each bucket
        b_mu = mu.gather(1, b_clu.unsqueeze(-1).expand(N, NB, D))  # (N, NB, D)
        b_rad = torch.zeros(N, NB + 1, dtype=kd.dtype, device=kd.device).scatter_reduce(
            1, bucket, dist.gather(1, order), reduce="amax"
        )[:, :NB]  # (N, NB) radius of each bucket around its centroid
        log_n = b_cnt.log()  # -inf for empty buckets
        upto = None  # causal: keys j <= i of each bucket, (N, Tk, NB)
        if is_causal:
            by_pos = torch.zeros_like(bucket).scatter(1, order, bucket)  # bucket of key j
            onehot = torch.zeros(N, Tk, NB + 1, dtype=kd.dtype, device=kd.device)
            upto = onehot.scatter_(2, by_pos.unsqueeze(-1), 1.0)[..., :NB].cumsum(1)
        P = min(P, NB)
        mu, radius = b_mu, b_rad
    logits, lps, idxs, bounds = [], [], [], []
    ar = torch.arange(N, device=q.device).view(N, 1, 1)
    flat = (members.clamp_min(0) + ar * Tk).reshape(-1)
    kb = kf.reshape(N * Tk, D).index_select(0, flat).view(N * NB, cap * D)  # keys by bucket

    def pos_c(s: int, e: int) -> Tensor:
        return torch.arange(s, e, device=q.device).clamp_max(Tk - 1)

    for s in range(0, Tq, chunk_size):
        e = min(s + chunk_size, Tq)
        qc = qf[:, s:e] * sc  # (N, n, D)
        with torch.no_grad():
            qd = qc.detach()
            top_score = torch.bmm(qd, mu.transpose(1, 2)) + qd.norm(
                dim=-1, keepdim=True
            ) * radius.unsqueeze(1)  # (N, n, C) the highest score a key of c can have
            log_nq = log_n.unsqueeze(1) if upto is None else upto[:, pos_c(s, e)].log()
            ub = top_score + log_nq  # (N, n, C) log of the bound u_ic
            # best first: the clusters whose best key could score highest (a lone needle key
            # widens its cluster's radius, so that cluster is probed)
            probe = top_score.masked_fill(log_nq == _NEG_INF, _NEG_INF).topk(P, dim=-1).indices
            rest = ub.scatter(-1, probe, _NEG_INF)
            log_u = torch.logsumexp(rest, dim=-1)  # (N, n)
            cand = members.gather(1, probe.reshape(N, -1, 1).expand(-1, -1, cap))
            cand = cand.reshape(N, e - s, P * cap)  # (N, n, M) candidate keys, -1: none
            ok = cand >= 0
            if is_causal:
                ok = ok & (cand <= torch.arange(s, e, device=q.device).view(1, -1, 1))
            cidx = cand.clamp_min(0)
        rows = (probe + ar * NB).reshape(-1)  # whole buckets: contiguous (cap·D) rows
        kc = kb.index_select(0, rows).view(N, e - s, P * cap, D)  # (N, n, M, D)
        lg = torch.matmul(kc, qc.unsqueeze(-1)).squeeze(-1)  # (N, n, M)
        lp = torch.zeros(ok.shape, dtype=q.dtype, device=q.device).masked_fill(~ok, _NEG_INF)
        kk = min(topk, lg.shape[-1])
        with torch.no_grad():
            post = lg.detach() + lp
            top, pos = post.topk(kk, dim=-1, sorted=False)  # (N, n, kk)
            lse_p = torch.logsumexp(post, dim=-1)  # probed mass
            lse_s = torch.logsumexp(top, dim=-1)  # kept mass
            denom = torch.logaddexp(lse_p, log_u)
            d = (-torch.expm1(lse_s - denom)).clamp(0.0, 1.0)
            bounds.append(torch.where(denom == _NEG_INF, torch.zeros_like(d), d))
        logits.append(lg.gather(-1, pos))
        lps.append(lp.gather(-1, pos))
        idxs.append(cidx.gather(-1, pos))
    kk = logits[0].shape[-1]
    return ReducedSupport(
        torch.cat(logits, 1).reshape(lead + (Tq, kk)),
        torch.cat(lps, 1).reshape(lead + (Tq, kk)),
        torch.cat(idxs, 1).reshape(lead + (Tq, kk)),
        Tk,
        "topk",
        dropped_mass=torch.cat(bounds, 1).reshape(lead + (Tq,)),
    )


def _padding_prior(key_padding_mask: Tensor | None, Tk: int) -> ChunkLogPrior | None:
    if key_padding_mask is None:
        return None
    kpm = key_padding_mask

    def fn(start: int, stop: int, key_index: Tensor) -> Tensor:
        m = kpm.index_select(-1, key_index).unsqueeze(-2)  # (…, 1, Kc)
        return torch.zeros(m.shape).masked_fill(m, _NEG_INF)

    return fn


# ---------------------------------------------------------------------------------------------
# exact attention in O(T) memory, with posterior draws per query tile
# ---------------------------------------------------------------------------------------------


def _tile_prior(
    lp_fn: ChunkLogPrior | None, s: int, e: int, Tk: int, device: torch.device
) -> Tensor | None:
    return None if lp_fn is None else lp_fn(s, e, torch.arange(Tk, device=device))


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
    _check_qkv(q, k, v)
    tile = check_int("tile", tile, 1)
    sc = _scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    if Tq == 0:
        return _empty_rows(q, v)
    if Tk == 0:
        return _empty_rows(q, v)
    outs = []
    for s in range(0, Tq, tile):
        e = min(s + tile, Tq)
        lp = _tile_prior(log_prior, s, e, Tk, q.device)
        if lp is None:
            outs.append(
                F.scaled_dot_product_attention(q[..., s:e, :], k, v, dropout_p=dropout_p, scale=sc)
            )
        else:
            outs.append(_sdpa_rows(q[..., s:e, :], k, v, lp, sc, dropout_p))
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
    _check_qkv(q, k, v)
    tile = check_int("tile", tile, 1)
    sc = _scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    if Tq == 0:
        raise ValueError("tiled_posterior_read needs at least one query row; got Tq=0")
    kT = k.transpose(-1, -2)
    outs = []
    for s in range(0, Tq, tile):
        e = min(s + tile, Tq)
        qt = q[..., s:e, :]
        lg = torch.matmul(qt * sc, kT)  # (…, n, Tk)
        lp = _tile_prior(log_prior, s, e, Tk, q.device)
        w = draw(lg, None if lp is None else lp.expand(lg.shape), qt)  # (*S, …, n, Tk)
        outs.append(torch.matmul(w, v))  # (*S, …, n, Dv)
        del lg, w
    return torch.cat(outs, dim=-2)


def dense_support(
    q: Tensor, k: Tensor, log_prior: ChunkLogPrior | None = None, *, scale: float | None = None
) -> ReducedSupport:
    """Every key as the support (``O(Tq Tk)``): what :func:`tiled_posterior_read` draws on, whole.

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)`` → logits/log_prior ``(…, Tq, Tk)``, index ``(1, Tk)``.
    """
    _check_qkv(q, k)
    sc = _scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    logits = torch.matmul(q * sc, k.transpose(-1, -2))  # (…, Tq, Tk)
    lp = _tile_prior(log_prior, 0, Tq, Tk, q.device)
    index = torch.arange(Tk, device=q.device).expand(1, Tk)
    return ReducedSupport(logits, lp, index, Tk, "dense")


# ---------------------------------------------------------------------------------------------
# low-rank (Linformer) attention
# ---------------------------------------------------------------------------------------------


def lowrank_project(
    k: Tensor,
    v: Tensor,
    proj_k: Tensor,
    proj_v: Tensor,
    key_padding_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Project keys and values along the sequence: :math:`\tilde K = E_{:, :T_k} K`,
    :math:`\tilde V = F_{:, :T_k} V` (Linformer). Padded keys (``key_padding_mask`` ``True``,
    shape ``(B, Tk)``) are zeroed first so they contribute nothing.

    Shape:
        k ``(…, B, H, Tk, D)``, v ``(…, B, H, Tk, Dv)``, proj_k/proj_v ``(r, max_len)`` →
        ``(…, B, H, r, D)``, ``(…, B, H, r, Dv)``.
    """
    _check_qkv(k, k, v)
    Tk = k.shape[-2]
    for name, p in (("proj_k", proj_k), ("proj_v", proj_v)):
        if p.dim() != 2:
            raise ValueError(f"{name} must be (rank, max_len); got {tuple(p.shape)}")
        if p.shape[-1] < Tk:
            raise ValueError(
                f"the low-rank kernel was built for sequences of at most {p.shape[-1]} keys "
                f"(max_len); got Tk={Tk}"
            )
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool:
            raise TypeError(
                f"key_padding_mask must be bool for the low-rank kernel; got {key_padding_mask.dtype}"
            )
        if key_padding_mask.dim() != 2 or key_padding_mask.shape[-1] != Tk:
            raise ValueError(
                f"key_padding_mask must be (B, Tk={Tk}); got {tuple(key_padding_mask.shape)}"
            )
        keep = (~key_padding_mask).to(k.dtype)[:, None, :, None]  # (B, 1, Tk, 1)
        k, v = k * keep, v * keep
    k_r = torch.matmul(proj_k[:, :Tk].to(k.dtype), k)  # (…, r, D)
    v_r = torch.matmul(proj_v[:, :Tk].to(v.dtype), v)  # (…, r, Dv)
    return k_r, v_r


def lowrank_support(
    q: Tensor, k_r: Tensor, *, scale: float | None = None, dead: Tensor | None = None
) -> ReducedSupport:
    r"""Scores of every query on the ``r`` projected keys, :math:`q_i\cdot\tilde k_m/\sqrt d`
    (uniform prior over the mixtures; no key positions). ``dead`` (bool, broadcastable to
    ``(…, Tq, 1)``, e.g. ``(B, 1, 1, 1)``) marks rows with no key at all (a sequence whose every
    key is padded): their prior is ``-inf`` on every slot, so they read zeros, as in dense attention.

    Shape:
        q ``(…, Tq, D)``, k_r ``(…, r, D)`` → logits ``(…, Tq, r)``.
    """
    _check_qkv(q, k_r)
    sc = _scale(scale, q.shape[-1])
    logits = torch.matmul(q * sc, k_r.transpose(-1, -2))  # (…, Tq, r)
    lp = None
    if dead is not None:
        lp = torch.zeros(dead.shape, dtype=q.dtype, device=q.device).masked_fill(dead, _NEG_INF)
    return ReducedSupport(logits, lp, None, k_r.shape[-2], "lowrank")


# ---------------------------------------------------------------------------------------------
# reading the values
# ---------------------------------------------------------------------------------------------


def _gather_attend(w: Tensor, index: Tensor, v: Tensor, chunk_size: int) -> Tensor:
    """``y_i = Σ_m w_im v_{index_im}`` for per-row key indices, in query chunks."""
    lead = torch.broadcast_shapes(index.shape[:-2], v.shape[:-2])  # (…,)
    Tq, K = index.shape[-2:]
    Tk, Dv = v.shape[-2:]
    extra = w.shape[: w.dim() - len(lead) - 2]  # sample dims in front of (…)
    N = math.prod(lead)
    v2 = v.expand(lead + (Tk, Dv)).reshape(N * Tk, Dv)  # (N·Tk, Dv)
    base = (torch.arange(N, device=v.device) * Tk).view(N, 1, 1)  # (N, 1, 1)
    idx = index.expand(lead + (Tq, K)).reshape(N, Tq, K)
    wf = w.expand(extra + lead + (Tq, K)).reshape(extra + (N, Tq, K))
    outs = []
    for s in range(0, Tq, chunk_size):
        e = min(s + chunk_size, Tq)
        g = v2[(idx[:, s:e] + base).reshape(-1)].view(N, e - s, K, Dv)  # (N, n, K, Dv)
        o = torch.matmul(wf[..., s:e, :].unsqueeze(-2), g).squeeze(-2)  # (*S, N, n, Dv)
        outs.append(o)
    out = torch.cat(outs, dim=-2)  # (*S, N, Tq, Dv)
    return out.reshape(extra + lead + (Tq, Dv))


def _local_attend(w: Tensor, v: Tensor, window: int, chunk_size: int | None) -> Tensor:
    Tq, K = w.shape[-2:]
    vp = _pad_keys(v, window, Tq)
    c = _local_chunk(chunk_size, window)
    outs = []
    for s in range(0, Tq, c):
        e = min(s + c, Tq)
        L = e - s + 2 * window
        blk = _unband(w[..., s:e, :], L)  # (*S, …, n, L)
        outs.append(torch.matmul(blk, vp[..., s : s + L, :]))  # (*S, …, n, Dv)
    return torch.cat(outs, dim=-2)


def support_attend(
    weights: Tensor,
    support: ReducedSupport,
    v: Tensor,
    *,
    chunk_size: int | None = None,
    global_weights: Tensor | None = None,
) -> Tensor:
    r"""Posterior read :math:`y_i = \sum_{m} w_{im}\, v_{j(i, m)}` for weights on a support.

    ``v`` are the values (for low rank: the projected values :math:`FV`, ``(…, r, Dv)``).
    ``weights`` may carry leading sample dims ``(*S, …, Tq, K)``. Values are read block by
    block (local) or gathered per query chunk (top-k), never as a ``(Tq, Tk)`` matrix. For a
    local + global support the global queries' rows read ``global_weights`` ``(*S, …, Gq, Tk)``
    (default: the exact posterior of ``support.global_support``).

    Shape:
        weights ``(*S, …, Tq, K)``, v ``(…, Tk, Dv)`` → ``(*S, …, Tq, Dv)``.
    """
    if weights.shape[-1] != support.size:
        raise ValueError(
            f"weights last dim must be the support size {support.size}; got {tuple(weights.shape)}"
        )
    if support.kind == "lowrank" or support.index is None:
        return torch.matmul(weights, v)
    if v.shape[-2] != support.num_keys:
        raise ValueError(f"v must have Tk={support.num_keys} rows; got shape {tuple(v.shape)}")
    if weights.shape[-2] == 0:
        return weights.new_zeros(weights.shape[:-1] + (v.shape[-1],))  # no query rows
    if support.kind == "dense":
        return torch.matmul(weights, v)
    if support.kind in ("local", "local_global"):
        if support.window is None:
            raise ValueError(f"a {support.kind!r} support needs its window; got window=None")
        Kb = 2 * support.window + 1
        out = _local_attend(weights[..., :Kb], v, support.window, chunk_size)
        if support.global_keys is not None:
            vg = v.index_select(-2, support.global_keys)  # (…, G, Dv)
            out = out + torch.matmul(weights[..., Kb:], vg)
        return _global_rows_read(out, support, v, global_weights)
    return _gather_attend(weights, support.index, v, chunk_size or 256)


def _global_rows_read(
    out: Tensor, support: ReducedSupport, v: Tensor, global_weights: Tensor | None
) -> Tensor:
    """Write the dense read of the global queries' rows into ``out`` ``(*S, …, Tq, Dv)``."""
    g, rows = support.global_support, support.global_rows
    if g is None or rows is None:
        return out
    gw = global_weights if global_weights is not None else g.posterior_weights()
    read = torch.matmul(gw, v)  # (*S, …, Gq, Dv)
    lead = torch.broadcast_shapes(out.shape[:-2], read.shape[:-2])
    out = out.expand(lead + out.shape[-2:])
    return out.index_copy(-2, rows, read.expand(lead + read.shape[-2:]))
