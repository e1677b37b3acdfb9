r"""Attention kernels a :class:`~bayesattn.nn.attention.BayesianMultiheadAttention` can run on:
thin modules over the pure functions of :mod:`bayesattn.kernels`.

=====================  ==========================================  ============================
kernel                 support of query ``i``                      cost (time / memory)
=====================  ==========================================  ============================
:class:`LocalKernel`   keys ``|i - j| <= window`` (a hard window   ``O(T·w)`` / ``O(T·w)``
                       prior, computed block by block)
:class:`TopKKernel`    its ``k`` most probable keys; the dropped   ``O(T²)`` / ``O(T·k)``
                       posterior mass is reported
:class:`LowRankKernel` ``rank`` learned mixtures of keys and       ``O(T·r)`` / ``O(T·r)``
                       values along the sequence (Linformer)
=====================  ==========================================  ============================

Every mode works on the support: posterior mean (``"mean"``), and draws of every family
(``"guide"``, ``"model"``, ``"elbo"``), whose latent site then has event shape
``(H, Tq, K)``. With ``need_weights=True`` the layer returns a
:class:`~bayesattn.kernels.SupportWeights` (per head, on the support; ``.to_dense()`` gives
torch's layout). ``record_weights`` stores dense weights (local, top-k) or the weights over the
``r`` mixtures (low rank).

Restrictions (a clear ``ValueError`` otherwise): no ``add_bias_kv``/``add_zero_attn``; the
low-rank kernel takes only a ``key_padding_mask`` (a per-key prior, causal or ``attn_mask`` cannot
be expressed on mixtures of keys) and at most ``max_len`` keys.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .. import kernels as K
from .._validation import check_int
from ..priors import UniformPrior

if TYPE_CHECKING:
    from .attention import BayesianMultiheadAttention

__all__ = [
    "AttentionKernel",
    "LocalKernel",
    "TopKKernel",
    "LowRankKernel",
    "get_kernel",
    "kernel_attention",
]


class AttentionKernel(nn.Module):
    """Base class: how a layer scores queries against a reduced key support."""

    name = "dense"
    supports_masks = True  # attn_mask, is_causal and key-relevance priors

    def support(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
    ) -> tuple[K.ReducedSupport, Tensor]:
        """``(support, values to read)``."""
        raise NotImplementedError

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor | None:
        """Posterior-mean output without weights (a faster path), or ``None`` to use the
        support."""
        return None


class LocalKernel(AttentionKernel):
    r"""Block-wise local attention: query ``i`` reads keys ``|i - j| <= window``.

    Equal to dense attention under a hard :class:`~bayesattn.priors.LocalWindowPrior(window)`,
    at :math:`O(T\cdot w)` memory. Masks and priors apply within the band (e.g. ``is_causal``
    keeps ``i - window <= j <= i``)."""

    name = "local"

    def __init__(self, window: int = 64, chunk_size: int | None = None) -> None:
        super().__init__()
        self.window = check_int("window", window, 0)
        self.chunk_size = check_int("chunk_size", chunk_size, 1, allow_none=True)

    def support(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
    ) -> tuple[K.ReducedSupport, Tensor]:
        s = K.local_support(q, k, self.window, log_prior, chunk_size=self.chunk_size)
        return s, v

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor:
        return K.local_attention(
            q,
            k,
            v,
            self.window,
            log_prior,
            chunk_size=self.chunk_size,
            dropout_p=dropout_p,
            training=dropout_p > 0,
        )

    def extra_repr(self) -> str:
        return f"window={self.window}"


class TopKKernel(AttentionKernel):
    r"""Sparse top-k attention: each query reads the exact posterior restricted to its ``k``
    most probable keys; the dropped mass of the last call is kept in ``last_dropped_mass``
    ``(…, B, H, Tq)``."""

    name = "topk"

    def __init__(self, k: int = 64, chunk_size: int = 256) -> None:
        super().__init__()
        self.k = check_int("k", k, 1)
        self.chunk_size = check_int("chunk_size", chunk_size, 1)
        self.last_dropped_mass: Tensor | None = None

    def support(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
    ) -> tuple[K.ReducedSupport, Tensor]:
        s = K.topk_support(q, k, self.k, log_prior, chunk_size=self.chunk_size)
        self.last_dropped_mass = s.dropped_mass
        return s, v

    def extra_repr(self) -> str:
        return f"k={self.k}"


class LowRankKernel(AttentionKernel):
    r"""Linformer attention: keys and values projected along the sequence to ``rank`` mixtures,
    :math:`\tilde K = E K`, :math:`\tilde V = F V`, with learned :math:`E, F\in\mathbb R^{r\times
    n}` (``n = max_len``, shared by the heads; a sequence of ``T <= n`` keys uses the first ``T``
    columns). Initialised like Linformer's ``nn.Linear(max_len, rank)``: uniform on
    :math:`\pm 1/\sqrt{n}`."""

    name = "lowrank"
    supports_masks = False

    def __init__(self, rank: int = 64, max_len: int = 4096) -> None:
        super().__init__()
        self.rank = check_int("rank", rank, 1)
        self.max_len = check_int("max_len", max_len, 1)
        bound = 1.0 / math.sqrt(max_len)  # nn.Linear(max_len, rank)'s default bound
        self.proj_k = nn.Parameter(torch.empty(rank, max_len).uniform_(-bound, bound))
        self.proj_v = nn.Parameter(torch.empty(rank, max_len).uniform_(-bound, bound))

    def support(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
    ) -> tuple[K.ReducedSupport, Tensor]:
        k_r, v_r = K.lowrank_project(k, v, self.proj_k, self.proj_v, key_padding_mask)
        return K.lowrank_support(q, k_r), v_r

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor:
        k_r, v_r = K.lowrank_project(k, v, self.proj_k, self.proj_v, key_padding_mask)
        return F.scaled_dot_product_attention(q, k_r, v_r, dropout_p=dropout_p)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, max_len={self.max_len}"


#: A kernel by name (``"dense"``: every key, no kernel).
KernelName = Literal["dense", "local", "topk", "lowrank"]
_KERNELS: dict[str, type[AttentionKernel]] = {
    "local": LocalKernel,
    "topk": TopKKernel,
    "lowrank": LowRankKernel,
}


def get_kernel(name: KernelName | None, **kwargs: Any) -> AttentionKernel | None:
    """Build a kernel by name: ``"local"`` (``window``), ``"topk"`` (``k``) or ``"lowrank"``
    (``rank``, ``max_len``); ``"dense"`` or ``None`` give ``None`` (dense attention)."""
    if name is None or name == "dense":
        if kwargs:
            raise ValueError(f"dense attention takes no kernel options; got {sorted(kwargs)}")
        return None
    if name not in _KERNELS:
        raise ValueError(f"kernel must be one of {['dense', *_KERNELS]}; got {name!r}")
    return _KERNELS[name](**kwargs)


def _check_layer(layer: Any, attn_mask: Tensor | None, is_causal: bool) -> None:
    # layer: a BayesianMultiheadAttention whose ``kernel`` is set (Any: that attribute is Optional)
    kern = layer.kernel
    if layer.bias_k is not None or layer.add_zero_attn:
        raise ValueError(
            f"kernel={kern.name!r} does not support add_bias_kv or add_zero_attn (they append a "
            "key outside the sequence)"
        )
    if not kern.supports_masks:
        bad = []
        if attn_mask is not None:
            bad.append("attn_mask")
        if is_causal:
            bad.append("is_causal")
        if not isinstance(layer.prior, UniformPrior):
            bad.append(f"prior={type(layer.prior).__name__}")
        if bad:
            raise ValueError(
                f"kernel={kern.name!r} takes only a key_padding_mask: its slots are mixtures of "
                f"keys, so {', '.join(bad)} cannot be applied"
            )


def kernel_attention(
    layer: Any,  # a BayesianMultiheadAttention whose ``kernel`` is set
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None,
    key_padding_mask: Tensor | None,
    is_causal: bool,
    q_pos: Tensor | None,
    k_pos: Tensor | None,
    need_weights: bool,
    average_attn_weights: bool,
    num_samples: int | None,
) -> tuple[Tensor, K.SupportWeights | None]:
    """The attention read of ``layer`` through its kernel, in the layer's current mode.

    Shape:
        q ``(…, B, H, Tq, Dh)``, k/v ``(…, B, H, Tk, Dh)`` → output ``(*S, …, B, H, Tq, Dh)`` and
        weights on the support (or ``None``).
    """
    _check_layer(layer, attn_mask, is_causal)
    kern: AttentionKernel = layer.kernel
    B, H, Tq, Tk = q.shape[-4], layer.num_heads, q.shape[-2], k.shape[-2]
    lp_fn = None
    if kern.supports_masks:
        prior_fn = None
        if not isinstance(layer.prior, UniformPrior):
            qp = q_pos if q_pos is not None else torch.arange(Tq, device=q.device)
            kp = k_pos if k_pos is not None else torch.arange(Tk, device=q.device)

            def prior_fn(s: int, e: int, kidx: Tensor) -> Tensor:
                return layer._add_prior(
                    None, q[..., s:e, :], k.index_select(-2, kidx), qp[s:e], kp[kidx]
                )

        lp_fn = K.chunk_log_prior(
            attn_mask,
            key_padding_mask,
            is_causal,
            prior_fn,
            batch_size=B,
            num_heads=H,
            tgt_len=Tq,
            src_len=Tk,
            dtype=q.dtype,
            device=q.device,
        )
    mode = layer.mode()
    dropout_p = layer.dropout if layer.training else 0.0
    if mode == "mean" and not need_weights and not layer.record_weights:
        out = kern.mean_output(q, k, v, lp_fn, key_padding_mask, dropout_p)
        if out is not None:
            return out, None
    support, v_read = kern.support(q, k, v, lp_fn, key_padding_mask)
    if mode == "mean":
        w = support.posterior_weights()  # (…, B, H, Tq, K)
    else:
        w = layer._sample_weights(mode, support.logits, support.log_prior, q, k, num_samples)
    sw = K.SupportWeights(w, support.index, Tk, support.dropped_mass, average_attn_weights)
    if layer.record_weights:
        rec = K.SupportWeights(w.detach(), support.index, Tk)
        layer.last_weights = rec.to_dense() if support.index is not None else rec.weights
    if dropout_p > 0:
        w = F.dropout(w, dropout_p, training=True)
        sw.weights = w
    out = K.support_attend(w, support, v_read)  # (*S, …, B, H, Tq, Dh)
    return out, (sw if need_weights else None)


def finish(
    layer: BayesianMultiheadAttention, out: Tensor, w: K.SupportWeights | None, unbatched: bool
) -> tuple[Tensor, K.SupportWeights | None]:
    """Merge heads, project out and restore the layer's batch layout (the tail of
    ``BayesianMultiheadAttention.forward`` for kernel outputs)."""
    from .attention import linear

    Tq = out.shape[-2]
    out = out.transpose(-3, -2).reshape(out.shape[:-3] + (Tq, layer.embed_dim))  # (…, B, Tq, E)
    out = linear(out, layer.out_proj.weight, layer.out_proj.bias)
    if unbatched:
        out = out.squeeze(-3)
        if w is not None:  # drop the batch dim of size 1 (…, 1, H, Tq, K) → (…, H, Tq, K)
            w.weights = w.weights.squeeze(-4)
            if w.index is not None and w.index.dim() >= 4:
                w.index = w.index.squeeze(-4)
            if w.dropped_mass is not None:
                w.dropped_mass = w.dropped_mass.squeeze(-3)
    elif not layer.batch_first:
        out = out.transpose(-3, -2)  # (…, Tq, B, E)
    return out, w
