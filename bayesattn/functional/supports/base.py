r"""What every support shares: input checks, the score scale, masks as a chunked log-prior, the
fused read under a log-prior and the gather read of per-row key indices.

A :data:`ChunkLogPrior` is a callable ``(start, stop, key_index) -> log-prior`` for queries
``start:stop`` against the keys at positions ``key_index``, so no ``(Tq, Tk)`` matrix is ever
built; :func:`chunk_log_prior` makes one from PyTorch's masks and an optional key-relevance
prior (:math:`\log\pi_{ij} = -\infty` on what a mask forbids, the prior's value added).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._validation import check_real
from ..posterior import mask_to_log_prior

__all__ = [
    "NEG_INF",
    "ChunkLogPrior",
    "chunk_log_prior",
    "check_qkv",
    "resolve_scale",
    "tile_prior",
    "sdpa_rows",
    "empty_rows",
    "gather_attend",
]

ChunkLogPrior = Callable[[int, int, Tensor], "Tensor | None"]
"""``(start, stop, key_index (Kc,)) -> log-prior`` broadcastable to ``(…, stop - start, Kc)``."""

NEG_INF = float("-inf")


def resolve_scale(scale: float | None, d: int) -> float:
    """The score scale :math:`s`: ``1/sqrt(d)`` by default, else ``scale`` (finite, > 0)."""
    if scale is None:
        return 1.0 / math.sqrt(d)
    return check_real("scale", scale, gt=0.0)


def check_qkv(q: Tensor, k: Tensor, v: Tensor | None = None) -> None:
    """``q (…, Tq, D)``, ``k (…, Tk, D)``, ``v (…, Tk, Dv)``: tensors, same ``D``, same ``Tk``."""
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
            c = c.masked_fill(key_index.unsqueeze(0) > qi, NEG_INF)  # (n, Kc)
            out = c if out is None else out + c
        if prior is not None:
            p = prior(start, stop, key_index)
            if p is not None:
                out = p if out is None else out + p
        return out

    return fn


def tile_prior(
    lp_fn: ChunkLogPrior | None, s: int, e: int, Tk: int, device: torch.device
) -> Tensor | None:
    """Log-prior of queries ``s:e`` on every key, ``(…|1, n|1, Tk)``, or ``None``."""
    return None if lp_fn is None else lp_fn(s, e, torch.arange(Tk, device=device))


# ---------------------------------------------------------------------------------------------
# reads shared by the supports
# ---------------------------------------------------------------------------------------------


def sdpa_rows(q: Tensor, k: Tensor, v: Tensor, lp: Tensor, sc: float, p: float) -> Tensor:
    """Fused attention under a log-prior; rows with no allowed key read zeros."""
    dead = ~(lp > NEG_INF).any(-1, keepdim=True)  # (…|1, n, 1)
    if torch.compiler.is_compiling():  # no data-dependent branch in a traced graph
        lp = lp.masked_fill(dead, 0.0)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=lp, dropout_p=p, scale=sc)
        return o.masked_fill(dead, 0.0)
    has_dead = bool(dead.any())
    if has_dead:
        lp = lp.masked_fill(dead, 0.0)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=lp, dropout_p=p, scale=sc)
    return o.masked_fill(dead, 0.0) if has_dead else o  # (…, n, Dv)


def empty_rows(q: Tensor, v: Tensor) -> Tensor:
    """Zeros ``(…, Tq, Dv)``: the read of rows that see no key (or of no row at all)."""
    lead = torch.broadcast_shapes(q.shape[:-2], v.shape[:-2])
    return q.new_zeros(lead + (q.shape[-2], v.shape[-1]))


def gather_attend(w: Tensor, index: Tensor, v: Tensor, chunk_size: int) -> Tensor:
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
