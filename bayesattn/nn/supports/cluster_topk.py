r"""Top-k without scoring every key (routing attention): k-means clusters of keys, probed."""

from __future__ import annotations

from torch import Tensor

from ..._validation import check_int
from ...functional import supports as K
from .base import AttentionSupport, bool_padding

__all__ = ["ClusterTopKSupport"]


class ClusterTopKSupport(AttentionSupport):
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

    def reduce(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        log_prior: K.ChunkLogPrior | None,
        key_padding_mask: Tensor | None,
        is_causal: bool = False,
    ) -> tuple[K.ReducedSupport, Tensor]:
        kpm = None
        if key_padding_mask is not None:
            kpm = bool_padding(key_padding_mask, "support='cluster_topk'").unsqueeze(-2)  # (B, 1, Tk)
        s = K.cluster_topk_support(
            q, k, self.k, key_padding_mask=kpm, is_causal=is_causal,
            num_clusters=self.num_clusters, probes=self.probes, iters=self.iters,
            chunk_size=self.chunk_size,
        )  # fmt: skip
        self.last_dropped_mass = s.dropped_mass
        return s, v

    def extra_repr(self) -> str:
        return f"k={self.k}, num_clusters={self.num_clusters}, probes={self.probes}"
