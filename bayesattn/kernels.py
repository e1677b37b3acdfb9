r"""Efficient attention over a *reduced key support*: block-local, sparse top-k and low-rank reads.

Dense attention scores every query against every key, :math:`O(T_q T_k)` in time and memory.
Each kernel here keeps, for every query :math:`i`, a support of :math:`K \ll T_k` slots and
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

Masks and priors reach the kernels as a :data:`ChunkLogPrior`: a callable
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

from ._validation import check_int, check_real
from .functional import mask_to_log_prior, posterior_weights

__all__ = [
    "ChunkLogPrior",
    "ReducedSupport",
    "SupportWeights",
    "chunk_log_prior",
    "local_support",
    "local_attention",
    "topk_support",
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
        kind: ``"local"``, ``"topk"`` or ``"lowrank"``.
        window: the half-width ``w`` of a local support (slot ``m`` of query ``i`` is key
            ``i - w + m``); ``None`` otherwise.
        dropped_mass: ``(…, Tq)``, the exact posterior mass outside the support (top-k), else
            ``None``.
    """

    logits: Tensor
    log_prior: Tensor | None
    index: Tensor | None
    num_keys: int
    kind: str
    window: int | None = None
    dropped_mass: Tensor | None = None

    @property
    def size(self) -> int:
        """Support size ``K``."""
        return self.logits.shape[-1]

    def posterior_weights(self) -> Tensor:
        r"""Exact posterior over the support, :math:`\operatorname{softmax}(\log\pi + \text{logits})`
        (zero on empty or masked slots), ``(…, Tq, K)``.

        Without autograd (inference) the softmax runs in place on one fresh tensor: at long
        ``T`` each extra ``(…, Tq, K)`` copy is a visible share of the peak memory."""
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

    def to_dense(self) -> Tensor:
        r"""The weights as a dense ``(*S, …, Tq, Tk)`` matrix (``(*S, B, Tq, Tk)`` when averaging
        heads); costs :math:`O(T_q T_k)` memory. Not defined for low rank (slots mix keys)."""
        if self.index is None:
            raise ValueError(
                "low-rank weights are over r mixed keys, not over key positions: there is no "
                "dense (Tq, Tk) matrix to return"
            )
        w = self.weights
        idx = self.index.clamp(0, self.num_keys - 1).expand(w.shape)
        dense = w.new_zeros(w.shape[:-1] + (self.num_keys,))
        dense = dense.scatter_add(-1, idx, w)  # empty slots carry weight 0
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
    return out.scatter_reduce(-1, idx, src, reduce="amax")


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
) -> Tensor:
    r"""Posterior-mean output of local attention without keeping any weights: each query chunk
    runs fused ``scaled_dot_product_attention`` against its ``chunk + 2w`` keys under the band
    log-prior. Rows with no allowed key give zeros (as everywhere in bayesattn).

    Shape:
        q ``(…, Tq, D)``, k ``(…, Tk, D)``, v ``(…, Tk, Dv)`` → ``(…, Tq, Dv)``.
    """
    _check_qkv(q, k, v)
    window = check_int("window", window, 0)
    sc = _scale(scale, q.shape[-1])
    Tq = q.shape[-2]
    kp, vp = _pad_keys(k, window, Tq), _pad_keys(v, window, Tq)
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
        lp = band_cache[n] + _chunk_prior(
            log_prior, s, e, kidx, valid, k.shape[-2], q.dtype
        )  # (…|1, n, L)
        dead = ~(lp > _NEG_INF).any(-1, keepdim=True)  # (…|1, n, 1)
        has_dead = bool(dead.any())
        if has_dead:
            lp = lp.masked_fill(dead, 0.0)
        o = F.scaled_dot_product_attention(
            q[..., s:e, :],
            kp[..., s : s + L, :],
            vp[..., s : s + L, :],
            attn_mask=lp,
            dropout_p=dropout_p if training else 0.0,
            scale=sc,
        )  # (…, n, Dv)
        outs.append(o.masked_fill(dead, 0.0) if has_dead else o)
    return torch.cat(outs, dim=-2)


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


def lowrank_support(q: Tensor, k_r: Tensor, *, scale: float | None = None) -> ReducedSupport:
    r"""Scores of every query on the ``r`` projected keys, :math:`q_i\cdot\tilde k_m/\sqrt d`
    (uniform prior over the mixtures; no key positions).

    Shape:
        q ``(…, Tq, D)``, k_r ``(…, r, D)`` → logits ``(…, Tq, r)``.
    """
    _check_qkv(q, k_r)
    sc = _scale(scale, q.shape[-1])
    logits = torch.matmul(q * sc, k_r.transpose(-1, -2))  # (…, Tq, r)
    return ReducedSupport(logits, None, None, k_r.shape[-2], "lowrank")


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
    weights: Tensor, support: ReducedSupport, v: Tensor, *, chunk_size: int | None = None
) -> Tensor:
    r"""Posterior read :math:`y_i = \sum_{m} w_{im}\, v_{j(i, m)}` for weights on a support.

    ``v`` are the values (for low rank: the projected values :math:`FV`, ``(…, r, Dv)``).
    ``weights`` may carry leading sample dims ``(*S, …, Tq, K)``. Values are read block by
    block (local) or gathered per query chunk (top-k), never as a ``(Tq, Tk)`` matrix.

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
    if support.kind == "local":
        if support.window is None:
            raise ValueError("a 'local' support needs its window; got window=None")
        return _local_attend(weights, v, support.window, chunk_size)
    return _gather_attend(weights, support.index, v, chunk_size or 256)
