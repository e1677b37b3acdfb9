r"""Key supports a :class:`~bayesattn.nn.attention.BayesianMultiheadAttention` can read over:
thin modules over the pure functions of :mod:`bayesattn.functional.supports`, one per file.

===========================  ==========================================  =====================
support                      support of query ``i``                      cost (time / memory)
===========================  ==========================================  =====================
:class:`DenseSupport`        every key (the default; torch's fused       ``O(T²)`` / ``O(T²)``
                             kernel for the posterior mean)
:class:`LocalSupport`        keys ``|i - j| <= window`` (a hard window   ``O(T·w)`` / ``O(T·w)``
                             prior, computed block by block)
:class:`LocalGlobalSupport`  its window plus the global tokens; a        ``O(T·(w+G))`` /
                             global token's query reads every key        ``O(T·(w+G))``
:class:`TopKSupport`         its ``k`` most probable keys; the dropped   ``O(T²)`` / ``O(T·k)``
                             posterior mass is reported
:class:`ClusterTopKSupport`  ``k`` best keys of the k-means clusters it  ``O(T·√T)`` / ``O(T·k)``
                             probes; a bound on the dropped mass
:class:`TiledSupport`        every key (exact), queries in tiles; draws  ``O(T²)`` /
                             made and read one tile at a time            ``O(S·tile·T)``
:class:`LowRankSupport`      ``rank`` learned mixtures of keys and       ``O(T·r)`` / ``O(T·r)``
                             values along the sequence (Linformer)
===========================  ==========================================  =====================

Every mode works on the support: posterior mean (``"mean"``), and draws of every family
(``"guide"``, ``"model"``, ``"elbo"``), whose latent site then has event shape
``(H, Tq, K)``. With ``need_weights=True`` a layer on a reduced support returns a
:class:`~bayesattn.functional.supports.SupportWeights` (per head, on the support;
``.to_dense()`` gives torch's layout). ``record_weights`` stores dense weights (local, top-k) or
the weights over the ``r`` mixtures (low rank). A support never sees the layer: the read
(:class:`bayesattn.nn.read.AttentionRead`) passes it tensors and a drawer
(:data:`~bayesattn.nn.supports.base.Drawer`).

Restrictions (a clear ``ValueError`` otherwise): no ``add_bias_kv``/``add_zero_attn`` on a
reduced support; the low-rank support takes only a ``key_padding_mask`` (a per-key prior, causal
or ``attn_mask`` cannot be expressed on mixtures of keys) and at most ``max_len`` keys; the
cluster top-k support takes a ``key_padding_mask`` and ``is_causal`` only (its candidates are
found per key).

The ``*Kernel`` names of 0.4 were renamed ``*Support`` in 0.5 (``CHANGELOG.md`` has the table);
the old names resolve here, with a ``DeprecationWarning``, only so that pickles that hold them load.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Literal

from ...registry import Registry
from .base import AttentionSupport, Drawer
from .cluster_topk import ClusterTopKSupport
from .dense import DENSE, DenseSupport
from .local import LocalSupport
from .local_global import LocalGlobalSupport
from .lowrank import LowRankSupport
from .tiled import TiledSupport
from .topk import TopKSupport

__all__ = [
    "AttentionSupport",
    "DenseSupport",
    "LocalSupport",
    "LocalGlobalSupport",
    "TopKSupport",
    "ClusterTopKSupport",
    "TiledSupport",
    "LowRankSupport",
    "Drawer",
    "DENSE",
    "SupportName",
    "get_support",
    "SUPPORTS",
    "register_support",
    "list_supports",
]

#: A built-in support by name (``"dense"``: every key); :data:`SUPPORTS` may hold more.
SupportName = Literal["dense", "local", "local_global", "topk", "cluster_topk", "tiled", "lowrank"]
#: the reduced key supports by name (:class:`~bayesattn.registry.Registry`), as
#: ``AttentionConfig(support=name, support_kwargs=...)`` and the layers take them; add one with
#: :func:`register_support`. ``"dense"`` (every key, the default) is not an entry.
SUPPORTS: Registry[Callable[..., AttentionSupport]] = Registry(
    "support", AttentionSupport, register_with="bayesattn.register_support", reserved=("dense",)
)
SUPPORTS.register("local", LocalSupport)
SUPPORTS.register("local_global", LocalGlobalSupport)
SUPPORTS.register("topk", TopKSupport)
SUPPORTS.register("cluster_topk", ClusterTopKSupport)
SUPPORTS.register("tiled", TiledSupport)
SUPPORTS.register("lowrank", LowRankSupport)
#: ``@register_support("name")`` on an :class:`AttentionSupport` subclass (or a function
#: returning one) makes ``support="name"`` work in layers and in ``AttentionConfig``.
register_support = SUPPORTS.register


def list_supports() -> tuple[str, ...]:
    """The registered support names (built-in and user), in registration order; ``"dense"`` (every
    key) is accepted too."""
    return SUPPORTS.names()


def get_support(name: SupportName | str | None, **kwargs: Any) -> AttentionSupport | None:
    """Build a support by name: ``"local"`` (``window``), ``"local_global"`` (``window``,
    ``global_tokens``), ``"topk"`` (``k``), ``"cluster_topk"`` (``k``, ``num_clusters``,
    ``probes``), ``"tiled"`` (``tile``), ``"lowrank"`` (``rank``, ``max_len``) or one added with
    :func:`register_support`; ``"dense"`` or ``None`` give ``None`` (every key: the layer reads
    through :data:`DENSE`)."""
    if name is None or name == "dense":
        if kwargs:
            raise ValueError(f"dense attention takes no support options; got {sorted(kwargs)}")
        return None
    SUPPORTS.get(name, argument="support", also=("dense",))  # an unknown name lists "dense" too
    return SUPPORTS.create(name, **kwargs)


#: 0.4 name → 0.5 name (the migration table in CHANGELOG.md)
RENAMED = {
    "AttentionKernel": "AttentionSupport",
    "LocalKernel": "LocalSupport",
    "LocalGlobalKernel": "LocalGlobalSupport",
    "TopKKernel": "TopKSupport",
    "ClusterTopKKernel": "ClusterTopKSupport",
    "TiledKernel": "TiledSupport",
    "LowRankKernel": "LowRankSupport",
}


def __getattr__(name: str) -> Any:
    """Old class names for pickles written by 0.4 (``torch.save(model)``), with a warning."""
    if name in RENAMED:
        new = RENAMED[name]
        warnings.warn(
            f"bayesattn.nn.supports.{name} was renamed {new} in 0.5; the old name exists only so "
            "that old pickles load",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
