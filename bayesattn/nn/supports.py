r"""Attention kernels a :class:`~bayesattn.nn.attention.BayesianMultiheadAttention` can run on:
thin modules over the pure functions of :mod:`bayesattn.functional.supports`.

==========================  ==========================================  =====================
kernel                      support of query ``i``                      cost (time / memory)
==========================  ==========================================  =====================
:class:`LocalKernel`        keys ``|i - j| <= window`` (a hard window   ``O(T·w)`` / ``O(T·w)``
                            prior, computed block by block)
:class:`LocalGlobalKernel`  its window plus the global tokens; a        ``O(T·(w+G))`` /
                            global token's query reads every key        ``O(T·(w+G))``
:class:`TopKKernel`         its ``k`` most probable keys; the dropped   ``O(T²)`` / ``O(T·k)``
                            posterior mass is reported
:class:`ClusterTopKKernel`  ``k`` best keys of the k-means clusters it  ``O(T·√T)`` / ``O(T·k)``
                            probes; a bound on the dropped mass
:class:`TiledKernel`        every key (exact), queries in tiles; draws  ``O(T²)`` /
                            made and read one tile at a time            ``O(S·tile·T)``
:class:`LowRankKernel`      ``rank`` learned mixtures of keys and       ``O(T·r)`` / ``O(T·r)``
                            values along the sequence (Linformer)
==========================  ==========================================  =====================

Every mode works on the support: posterior mean (``"mean"``), and draws of every family
(``"guide"``, ``"model"``, ``"elbo"``), whose latent site then has event shape
``(H, Tq, K)``. With ``need_weights=True`` the layer returns a
:class:`~bayesattn.functional.supports.SupportWeights` (per head, on the support;
``.to_dense()`` gives torch's layout). ``record_weights`` stores dense weights (local, top-k) or the weights over the
``r`` mixtures (low rank).

Restrictions (a clear ``ValueError`` otherwise): no ``add_bias_kv``/``add_zero_attn``; the
low-rank kernel takes only a ``key_padding_mask`` (a per-key prior, causal or ``attn_mask`` cannot
be expressed on mixtures of keys) and at most ``max_len`` keys; the cluster top-k kernel takes a
``key_padding_mask`` and ``is_causal`` only (its candidates are found per key).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pyro.contrib.autoname import scope
from torch import Tensor, nn

from .._validation import check_int
from ..functional import supports as K
from ..functional.bayesian_read import add_key_prior, sample_attention_weights
from ..priors import UniformPrior
from ..registry import Registry
from .modes import current_kl_collector

__all__ = [
    "AttentionKernel",
    "LocalKernel",
    "LocalGlobalKernel",
    "TopKKernel",
    "ClusterTopKKernel",
    "TiledKernel",
    "LowRankKernel",
    "get_kernel",
    "kernel_attention",
    "draw_attention_weights",
    "SUPPORTS",
    "register_support",
    "list_supports",
]


class AttentionKernel(nn.Module):
    """Base class: how a layer scores queries against a reduced key support."""

    name = "dense"
    supports_masks = True  # attn_mask, is_causal and key-relevance priors
    supports_causal = True  # is_causal (when supports_masks is False)

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

    def sample_output(
        self,
        layer: Any,
        mode: str,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        num_samples: int | None,
        dropout_p: float,
    ) -> Tensor | None:
        """Output of posterior draws without returning weights (a leaner path), or ``None`` to
        draw on the whole support. Draws go through :func:`draw_attention_weights`."""
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
            global_keys=self._keys(q.device, k.shape[-2]),
        )

    def _keys(self, device: torch.device, num_keys: int | None = None) -> Tensor | None:
        """Positions every query also reads (none for the plain window); ``num_keys``: ``T``."""
        return None

    def extra_repr(self) -> str:
        return f"window={self.window}"


class LocalGlobalKernel(LocalKernel):
    r"""Local + global attention (Longformer, BigBird's window and global parts): query ``i``
    reads keys ``|i - j| <= window`` and the ``global_tokens`` (positions, default ``(0,)``: a CLS
    token prepended by the network); the global tokens' own queries read every key. A position
    at or past the sequence length ``T`` is a ``ValueError`` naming ``global_tokens`` and ``T``
    (the functional :func:`~bayesattn.functional.supports.local_global_support` drops them).

    Equal to dense attention under the log-prior that is 0 on that support and ``-inf`` off it
    (:func:`bayesattn.functional.supports.dense_support_mask`), at :math:`O(T(w + G))` cost. In
    the stochastic modes the global queries' rows are a second latent site, ``global/<layer>.latent``, of event
    shape ``(H, Gq, Tk)``."""

    name = "local_global"

    def __init__(
        self,
        window: int = 64,
        global_tokens: tuple[int, ...] | list[int] = (0,),
        chunk_size: int | None = None,
    ) -> None:
        super().__init__(window, chunk_size)
        if isinstance(global_tokens, (str, bytes)) or not isinstance(global_tokens, Iterable):
            raise TypeError(
                "global_tokens must be a tuple or list of token positions (() for none); got "
                f"{global_tokens!r}"
            )
        toks = tuple(int(check_int("global_tokens", t, 0)) for t in global_tokens)
        if len(set(toks)) != len(toks):
            raise ValueError(f"global_tokens must not repeat a position; got {toks}")
        self.global_tokens = toks

    def _keys(self, device: torch.device, num_keys: int | None = None) -> Tensor | None:
        if not self.global_tokens:
            return None
        if num_keys == 0:
            return None  # no keys at all: the read is empty, as in dense attention
        if num_keys is not None and max(self.global_tokens) >= num_keys:
            raise ValueError(
                f"global_tokens must be positions < T = {num_keys} (the sequence length); got "
                f"{self.global_tokens}"
            )
        return torch.tensor(self.global_tokens, dtype=torch.long, device=device)

    def support(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
    ) -> tuple[K.ReducedSupport, Tensor]:
        s = K.local_global_support(
            q, k, self.window, self._keys(q.device, k.shape[-2]), log_prior,
            chunk_size=self.chunk_size,
        )
        return s, v

    def extra_repr(self) -> str:
        return f"window={self.window}, global_tokens={self.global_tokens}"


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


class ClusterTopKKernel(AttentionKernel):
    r"""Top-k without scoring every key (routing attention): keys are clustered by k-means, each
    query scores the keys of its ``probes`` most promising clusters and keeps its ``k`` best
    (:func:`bayesattn.functional.supports.cluster_topk_support`). ``last_dropped_mass``
    ``(…, B, H, Tq)`` holds an *upper bound* on the posterior mass each query dropped. Takes a
    ``key_padding_mask`` and ``is_causal``, not an ``attn_mask`` or a key-relevance prior."""

    name = "cluster_topk"
    supports_masks = False

    def __init__(
        self,
        k: int = 64,
        num_clusters: int | None = None,
        probes: int | None = None,
        iters: int = 4,
        chunk_size: int = 64,
    ) -> None:
        super().__init__()
        self.k = check_int("k", k, 1)
        self.num_clusters = check_int("num_clusters", num_clusters, 1, allow_none=True)
        self.probes = check_int("probes", probes, 1, allow_none=True)
        self.iters = check_int("iters", iters, 0)
        self.chunk_size = check_int("chunk_size", chunk_size, 1)
        self.last_dropped_mass: Tensor | None = None
        self.is_causal = False  # set per call by kernel_attention

    def support(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
    ) -> tuple[K.ReducedSupport, Tensor]:
        kpm = None
        if key_padding_mask is not None:
            kpm = _bool_padding(key_padding_mask).unsqueeze(-2)  # (B, 1, Tk)
        s = K.cluster_topk_support(
            q, k, self.k, key_padding_mask=kpm, is_causal=self.is_causal,
            num_clusters=self.num_clusters, probes=self.probes, iters=self.iters,
            chunk_size=self.chunk_size,
        )  # fmt: skip
        self.last_dropped_mass = s.dropped_mass
        return s, v

    def extra_repr(self) -> str:
        return f"k={self.k}, num_clusters={self.num_clusters}, probes={self.probes}"


class TiledKernel(AttentionKernel):
    r"""Exact dense attention in :math:`O(T)` memory: the posterior mean runs in query tiles of
    ``tile`` rows (fused attention per tile), and in the stochastic modes each tile's weights are
    drawn, read and dropped before the next (rows are independent given the logits), so ``S``
    draws cost :math:`O(S\cdot\text{tile}\cdot T)` memory, never :math:`O(S T^2)`. Each tile is
    its own latent site ``tile<start>/<layer>.latent`` (event shape ``(H, tile, Tk)``); in
    ``"elbo"`` mode the KL is summed over tiles. The weights (all of them, ``(…, Tq, Tk)``) are
    formed only when asked (``need_weights=True`` or ``record_weights``)."""

    name = "tiled"

    def __init__(self, tile: int = 512) -> None:
        super().__init__()
        self.tile = check_int("tile", tile, 1)

    def support(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
    ) -> tuple[K.ReducedSupport, Tensor]:
        return K.dense_support(q, k, log_prior), v

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor:
        return K.tiled_attention(q, k, v, log_prior, tile=self.tile, dropout_p=dropout_p)

    def sample_output(
        self,
        layer: Any,
        mode: str,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        num_samples: int | None,
        dropout_p: float,
    ) -> Tensor | None:
        if q.shape[-2] == 0:
            return None
        start = [0]

        def draw(logits: Tensor, lp: Tensor | None, qt: Tensor) -> Tensor:
            s = start[0]
            start[0] += logits.shape[-2]
            with scope(prefix=f"tile{s}"):
                w = draw_attention_weights(layer, mode, logits, lp, qt, k, num_samples)
            return F.dropout(w, dropout_p, training=True) if dropout_p > 0 else w

        return K.tiled_posterior_read(q, k, v, draw, log_prior, tile=self.tile)

    def extra_repr(self) -> str:
        return f"tile={self.tile}"


def _bool_padding(key_padding_mask: Tensor) -> Tensor:
    """A key padding mask as bool ``True`` = padded (a float mask: ``-inf`` entries)."""
    if key_padding_mask.dtype == torch.bool:
        return key_padding_mask
    return key_padding_mask == float("-inf")


def _hard_padding(key_padding_mask: Tensor | None) -> Tensor | None:
    """A float key padding mask of ``0`` (keep) and ``-inf`` (padded) as bool, as the other
    kernels accept it; soft float values cannot be applied to mixtures of keys."""
    if key_padding_mask is None or key_padding_mask.dtype == torch.bool:
        return key_padding_mask
    if not key_padding_mask.is_floating_point():
        raise TypeError(
            f"key_padding_mask must be bool or float (0 keep, -inf padded); got "
            f"{key_padding_mask.dtype}"
        )
    pad = key_padding_mask == float("-inf")
    if not bool(((key_padding_mask == 0) | pad).all()):
        raise ValueError(
            "kernel='lowrank' takes a float key_padding_mask of 0 (keep) and -inf (padded) "
            "only: its slots are mixtures of keys, so soft per-key biases cannot be applied"
        )
    return pad


class LowRankKernel(AttentionKernel):
    r"""Linformer attention: keys and values projected along the sequence to ``rank`` mixtures,
    :math:`\tilde K = E K`, :math:`\tilde V = F V`, with learned :math:`E, F\in\mathbb R^{r\times
    n}` (``n = max_len``, shared by the heads; a sequence of ``T <= n`` keys uses the first ``T``
    columns). Initialised like Linformer's ``nn.Linear(max_len, rank)``: uniform on
    :math:`\pm 1/\sqrt{n}`."""

    name = "lowrank"
    supports_masks = False
    supports_causal = False

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
        key_padding_mask = _hard_padding(key_padding_mask)
        k_r, v_r = K.lowrank_project(k, v, self.proj_k, self.proj_v, key_padding_mask)
        return K.lowrank_support(q, k_r, dead=_all_padded(key_padding_mask, k)), v_r

    def mean_output(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        dropout_p: float,
    ) -> Tensor:
        key_padding_mask = _hard_padding(key_padding_mask)
        k_r, v_r = K.lowrank_project(k, v, self.proj_k, self.proj_v, key_padding_mask)
        out = F.scaled_dot_product_attention(q, k_r, v_r, dropout_p=dropout_p)
        dead = _all_padded(key_padding_mask, k)
        return out if dead is None else out.masked_fill(dead, 0.0)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, max_len={self.max_len}"


def _all_padded(key_padding_mask: Tensor | None, k: Tensor) -> Tensor | None:
    """``(B, 1, 1, 1)`` bool: sequences whose every key is padded (their rows read nothing, as
    in dense attention), or ``None`` when there are none. With ``Tk = 0`` every row is dead."""
    if k.shape[-2] == 0:
        return torch.ones((1,) * 4, dtype=torch.bool, device=k.device)
    if key_padding_mask is None:
        return None
    dead = _bool_padding(key_padding_mask).all(-1)  # (B,)
    return dead.view(-1, 1, 1, 1) if bool(dead.any()) else None


#: A built-in support by name (``"dense"``: every key, no support); :data:`SUPPORTS` may hold more.
KernelName = Literal["dense", "local", "local_global", "topk", "cluster_topk", "tiled", "lowrank"]
#: the reduced key supports ("kernels") by name (:class:`~bayesattn.registry.Registry`), as
#: ``AttentionConfig(kernel=name, kernel_kwargs=...)`` and the layers take them; add one with
#: :func:`register_support`. ``"dense"`` (no support) is not an entry.
SUPPORTS: Registry[Callable[..., AttentionKernel]] = Registry(
    "support", AttentionKernel, register_with="bayesattn.register_support", reserved=("dense",)
)
SUPPORTS.register("local", LocalKernel)
SUPPORTS.register("local_global", LocalGlobalKernel)
SUPPORTS.register("topk", TopKKernel)
SUPPORTS.register("cluster_topk", ClusterTopKKernel)
SUPPORTS.register("tiled", TiledKernel)
SUPPORTS.register("lowrank", LowRankKernel)
#: ``@register_support("name")`` on an :class:`AttentionKernel` subclass (or a function returning
#: one) makes ``kernel="name"`` work in layers and in ``AttentionConfig``.
register_support = SUPPORTS.register


def list_supports() -> tuple[str, ...]:
    """The registered support names (built-in and user), in registration order; ``"dense"`` (no
    support) is accepted too."""
    return SUPPORTS.names()


def get_kernel(name: KernelName | str | None, **kwargs: Any) -> AttentionKernel | None:
    """Build a support by name: ``"local"`` (``window``), ``"local_global"`` (``window``,
    ``global_tokens``), ``"topk"`` (``k``), ``"cluster_topk"`` (``k``, ``num_clusters``,
    ``probes``), ``"tiled"`` (``tile``), ``"lowrank"`` (``rank``, ``max_len``) or one added with
    :func:`register_support`; ``"dense"`` or ``None`` give ``None`` (dense attention)."""
    if name is None or name == "dense":
        if kwargs:
            raise ValueError(f"dense attention takes no kernel options; got {sorted(kwargs)}")
        return None
    SUPPORTS.get(name, argument="kernel", also=("dense",))  # an unknown name lists "dense" too
    return SUPPORTS.create(name, **kwargs)


def draw_attention_weights(
    layer: Any,  # a BayesianMultiheadAttention with a family
    mode: str,
    logits: Tensor,
    log_prior: Tensor | None,
    q: Tensor,
    k: Tensor,
    num_samples: int | None,
) -> Tensor:
    """One draw of ``layer``'s weights on a support (``mode`` ``"guide"``/``"model"``/``"elbo"``):
    :func:`bayesattn.functional.bayesian_read.sample_attention_weights` with the layer's family
    and Pyro sites, the same call as the dense layer's. Kernels' :meth:`AttentionKernel.sample_output`
    draw through it.

    Shape:
        logits ``(…, B, H, Tq, K)`` → weights ``(*S, …, B, H, Tq, K)``.
    """
    return sample_attention_weights(
        layer.family,
        mode,
        logits,
        log_prior,
        q,
        k,
        site=layer.site_name("latent"),
        weights_site=layer.site_name("weights"),
        num_samples=num_samples,
        kl_sink=current_kl_collector(),
    )


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
        if is_causal and not kern.supports_causal:
            bad.append("is_causal")
        if not isinstance(layer.prior, UniformPrior):
            bad.append(f"prior={type(layer.prior).__name__}")
        if bad:
            why = (
                "its slots are mixtures of keys"
                if not kern.supports_causal
                else "its candidates are found per key, not per (query, key) pair"
            )
            raise ValueError(
                f"kernel={kern.name!r} takes only a key_padding_mask"
                f"{'' if not kern.supports_causal else ' and is_causal'}: {why}, so "
                f"{', '.join(bad)} cannot be applied"
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
                return add_key_prior(
                    layer.prior, None, q[..., s:e, :], k.index_select(-2, kidx), qp[s:e], kp[kidx]
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
    if isinstance(kern, ClusterTopKKernel):
        kern.is_causal = bool(is_causal) and attn_mask is None
    mode = layer.mode()
    dropout_p = layer.dropout if layer.training else 0.0
    if not need_weights and not layer.record_weights:
        if mode == "mean":
            out = kern.mean_output(q, k, v, lp_fn, key_padding_mask, dropout_p)
        else:
            out = kern.sample_output(layer, mode, q, k, v, lp_fn, num_samples, dropout_p)
        if out is not None:
            return out, None
    support, v_read = kern.support(q, k, v, lp_fn, key_padding_mask)
    g, rows = support.global_support, support.global_rows
    gw: Tensor | None = None
    if mode == "mean":
        w = support.posterior_weights()  # (…, B, H, Tq, K)
        gw = g.posterior_weights() if g is not None else None  # (…, B, H, Gq, Tk)
    else:
        w = draw_attention_weights(
            layer, mode, support.logits, support.log_prior, q, k, num_samples
        )
        if g is not None and rows is not None:  # the global queries' rows: a second site
            with scope(prefix="global"):
                gw = draw_attention_weights(
                    layer, mode, g.logits, g.log_prior, q.index_select(-2, rows), k, num_samples
                )
    sw = K.SupportWeights(
        w, support.index, Tk, support.dropped_mass, average_attn_weights, rows, gw
    )
    if layer.record_weights:
        rec = K.SupportWeights(
            w.detach(), support.index, Tk, None, False, rows, None if gw is None else gw.detach()
        )
        layer.last_weights = rec.to_dense() if support.index is not None else rec.weights
    if dropout_p > 0:
        w = F.dropout(w, dropout_p, training=True)
        gw = F.dropout(gw, dropout_p, training=True) if gw is not None else None
        sw.weights, sw.global_weights = w, gw
    out = K.support_attend(w, support, v_read, global_weights=gw)  # (*S, …, B, H, Tq, Dh)
    return out, (sw if need_weights else None)
