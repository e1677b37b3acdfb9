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

One module per support, every name above re-exported here: ``base`` (input checks, the chunked
log-prior, the shared reads), ``results`` (:class:`ReducedSupport`, :class:`SupportWeights`),
``local``, ``global_keys`` + ``local_global`` (Longformer/BigBird), ``topk``, ``cluster_topk``,
``tiled`` (exact attention in :math:`O(T)` memory), ``dense``, ``lowrank`` and ``attend``
(:func:`support_attend`).

Shape glossary: ``S`` samples (leftmost), ``…`` batch dims (e.g. ``B, H``), ``Tq``/``Tk``
query/key length, ``K`` support size, ``D`` head dim.
"""

from __future__ import annotations

from .attend import support_attend
from .base import ChunkLogPrior, chunk_log_prior
from .cluster_topk import cluster_topk_support
from .dense import dense_support
from .local import local_attention, local_support
from .local_global import local_global_support
from .lowrank import lowrank_project, lowrank_support
from .results import ReducedSupport, SupportWeights, dense_support_mask
from .tiled import tiled_attention, tiled_posterior_read
from .topk import topk_support

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
