r"""Top-k through clusters of keys (routing attention): candidates without scoring every key, and
a sound bound on the posterior mass dropped.

The steps, for the :math:`N` (batch, head) rows at once:

1. :func:`_cluster_keys`: k-means on the keys, centroid :math:`\mu_c`, count :math:`n_c`, and
   each key's distance to its centroid.
2. :func:`_cut_into_buckets`: each cluster cut into buckets of at most
   :math:`\lceil T_k/C\rceil` keys, so every query scores the same number of candidates.
3. :func:`_summarise_buckets`: per bucket its centroid, radius :math:`r_c = \max_{j\in c}\lVert
   k_j - \mu_c\rVert` and (log) count, with ``is_causal`` the count of keys :math:`j \le i`.
4. :func:`_probe`: per query the ``probes`` buckets with the highest possible score
   :math:`q\cdot\mu_c + \lVert q\rVert r_c` (Cauchy–Schwarz), and the bound
   :math:`U_i = \sum_{c\ \text{not probed}} n_c e^{q_i\cdot\mu_c + \lVert q_i\rVert r_c}` on the
   rest.
5. :func:`_score_probed` / :func:`_keep_topk`: exact scores of the probed keys, the ``topk``
   best kept, and :math:`\delta_i \le 1 - Z_S/(Z_P + U_i)`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from ..._validation import check_int
from .base import NEG_INF, ChunkLogPrior, check_qkv, resolve_scale
from .results import ReducedSupport
from .topk import topk_support

__all__ = ["cluster_topk_support"]


class _Layout(NamedTuple):
    """Keys sorted by cluster and cut into ``NB`` buckets of at most ``cap`` keys."""

    order: Tensor  # (N, Tk) key positions sorted by cluster (padded keys last)
    sorted_assign: Tensor  # (N, Tk) cluster of each sorted key, C: padded
    bucket: Tensor  # (N, Tk) bucket of each sorted key, NB: padded
    members: Tensor  # (N, NB, cap) key positions of each bucket, -1: empty slot


class _Buckets(NamedTuple):
    """What a query needs of the buckets to bound their keys' scores and to score them."""

    members: Tensor  # (N, NB, cap) key positions, -1: empty slot
    mu: Tensor  # (N, NB, D) centroid of each bucket's cluster
    radius: Tensor  # (N, NB) max ‖k_j − μ‖ over the bucket's keys
    log_n: Tensor  # (N, NB) log of the bucket's (unpadded) key count, -inf: empty
    upto: Tensor | None  # causal: (N, Tk, NB) keys j <= i of each bucket, else None


def _padding_prior(
    key_padding_mask: Tensor | None, Tk: int, dtype: torch.dtype
) -> ChunkLogPrior | None:
    """``key_padding_mask`` (``True`` = padded) as a :data:`ChunkLogPrior` (``-inf`` on pads)."""
    if key_padding_mask is None:
        return None
    kpm = key_padding_mask

    def fn(start: int, stop: int, key_index: Tensor) -> Tensor:
        m = kpm.index_select(-1, key_index).unsqueeze(-2)  # (…, 1, Kc)
        return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, NEG_INF)

    return fn


def _flatten_rows(
    q: Tensor, k: Tensor, key_padding_mask: Tensor | None, lead: tuple[int, ...]
) -> tuple[Tensor, Tensor, Tensor]:
    """Batch dims ``(…)`` flattened to ``N`` rows: q ``(N, Tq, D)``, k ``(N, Tk, D)`` and the
    unpadded keys ``valid`` ``(N, Tk)``."""
    Tq, Tk, D = q.shape[-2], k.shape[-2], q.shape[-1]
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
    return qf, kf, valid


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


def _cluster_keys(
    kd: Tensor, valid: Tensor, C: int, iters: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""k-means of the keys ``kd`` ``(N, Tk, D)``: centroids ``(N, C, D)``, assignments
    ``(N, Tk)`` (``C`` for padded keys: in no cluster), unpadded keys per cluster :math:`n_c`
    ``(N, C)`` and each key's distance to its centroid :math:`\lVert k_j - \mu_c\rVert`
    ``(N, Tk)`` (0 when padded)."""
    N, Tk, D = kd.shape
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
    return mu, assign, cnt, dist


def _cut_into_buckets(assign: Tensor, cnt: Tensor, valid: Tensor, C: int) -> _Layout:
    r"""Clusters cut into buckets of at most ``cap`` :math:`= \lceil T_k/C\rceil` keys (a big
    cluster becomes several buckets with its centroid), so every query scores exactly
    ``P·cap`` candidates. ``assign`` ``(N, Tk)`` (``C``: padded), ``cnt`` ``(N, C)``."""
    N, Tk = assign.shape
    cap = max(math.ceil(Tk / C), 1)
    order = torch.argsort(assign, dim=-1, stable=True)  # (N, Tk) keys sorted by cluster
    sa = assign.gather(1, order)
    cnt_all = torch.cat([cnt, (~valid).sum(1, keepdim=True).to(cnt.dtype)], 1)  # (N, C+1)
    first = (torch.cumsum(cnt_all, 1) - cnt_all).long()  # start of each cluster in order
    rank = torch.arange(Tk, device=assign.device) - first.gather(1, sa)  # (N, Tk)
    nb = torch.ceil(cnt / cap).long()  # (N, C) buckets per cluster
    boff = torch.cumsum(nb, 1) - nb
    NB = max(int(nb.sum(1).max()), 1)
    bucket = torch.where(
        sa < C,
        boff.gather(1, sa.clamp_max(C - 1)) + torch.div(rank, cap, rounding_mode="floor"),
        NB,
    )  # (N, Tk) bucket of each sorted key; NB: padded keys
    slot = torch.where(sa < C, bucket * cap + rank % cap, NB * cap)
    members = torch.full((N, NB * cap + 1), -1, dtype=torch.long, device=assign.device)
    members = members.scatter(1, slot, order)[:, : NB * cap].view(N, NB, cap)
    return _Layout(order, sa, bucket, members)


def _summarise_buckets(
    kd: Tensor, mu: Tensor, dist: Tensor, lay: _Layout, C: int, is_causal: bool
) -> _Buckets:
    r"""Per bucket: its cluster's centroid, its radius :math:`\max_j\lVert k_j - \mu\rVert`, the
    log of its key count :math:`\log n_c` and, with ``is_causal``, the running count of its keys
    :math:`j \le i` ``(N, Tk, NB)``."""
    N, Tk, D = kd.shape
    NB = lay.members.shape[1]
    ones = torch.ones_like(kd[..., 0])
    b_cnt = torch.zeros(N, NB + 1, dtype=kd.dtype, device=kd.device)
    b_cnt = b_cnt.scatter_add_(1, lay.bucket, ones)[:, :NB]  # (N, NB)
    b_clu = torch.zeros(N, NB + 1, dtype=torch.long, device=kd.device)
    b_clu = b_clu.scatter(1, lay.bucket, lay.sorted_assign.clamp_max(C - 1))[:, :NB]
    b_mu = mu.gather(1, b_clu.unsqueeze(-1).expand(N, NB, D))  # (N, NB, D)
    b_rad = torch.zeros(N, NB + 1, dtype=kd.dtype, device=kd.device).scatter_reduce(
        1, lay.bucket, dist.gather(1, lay.order), reduce="amax"
    )[:, :NB]  # (N, NB) radius of each bucket around its centroid
    log_n = b_cnt.log()  # -inf for empty buckets
    upto = None  # causal: keys j <= i of each bucket, (N, Tk, NB)
    if is_causal:
        by_pos = torch.zeros_like(lay.bucket).scatter(1, lay.order, lay.bucket)  # bucket of key j
        onehot = torch.zeros(N, Tk, NB + 1, dtype=kd.dtype, device=kd.device)
        upto = onehot.scatter_(2, by_pos.unsqueeze(-1), 1.0)[..., :NB].cumsum(1)
    return _Buckets(lay.members, b_mu, b_rad, log_n, upto)


def _bucket_keys(kd: Tensor, valid: Tensor, C: int, iters: int, is_causal: bool) -> _Buckets:
    """The keys ``kd`` ``(N, Tk, D)`` clustered, cut into buckets and summarised (no gradient)."""
    mu, assign, cnt, dist = _cluster_keys(kd, valid, C, iters)
    lay = _cut_into_buckets(assign, cnt, valid, C)
    return _summarise_buckets(kd, mu, dist, lay, C, is_causal)


def _probe(
    qd: Tensor, bk: _Buckets, P: int, s: int, is_causal: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""For the scaled queries ``qd`` ``(N, n, D)`` of rows ``s : s + n``: the ``P`` buckets
    probed ``(N, n, P)``, the log of the bound :math:`U_i` on the others' mass ``(N, n)``, and
    the candidate keys ``(N, n, P·cap)`` (allowed mask, key positions)."""
    N, n, _ = qd.shape
    e = s + n
    top_score = torch.bmm(qd, bk.mu.transpose(1, 2)) + qd.norm(
        dim=-1, keepdim=True
    ) * bk.radius.unsqueeze(1)  # (N, n, NB) the highest score a key of c can have
    if bk.upto is None:
        log_nq = bk.log_n.unsqueeze(1)
    else:
        Tk = bk.upto.shape[1]
        log_nq = bk.upto[:, torch.arange(s, e, device=qd.device).clamp_max(Tk - 1)].log()
    ub = top_score + log_nq  # (N, n, NB) log of the bound u_ic
    # best first: the clusters whose best key could score highest (a lone needle key
    # widens its cluster's radius, so that cluster is probed)
    probe = top_score.masked_fill(log_nq == NEG_INF, NEG_INF).topk(P, dim=-1).indices
    rest = ub.scatter(-1, probe, NEG_INF)
    log_u = torch.logsumexp(rest, dim=-1)  # (N, n)
    cap = bk.members.shape[-1]
    cand = bk.members.gather(1, probe.reshape(N, -1, 1).expand(-1, -1, cap))
    cand = cand.reshape(N, n, P * cap)  # (N, n, M) candidate keys, -1: none
    ok = cand >= 0
    if is_causal:
        ok = ok & (cand <= torch.arange(s, e, device=qd.device).view(1, -1, 1))
    return probe, log_u, ok, cand.clamp_min(0)


def _score_probed(qc: Tensor, kb: Tensor, probe: Tensor, bk: _Buckets) -> Tensor:
    r"""Exact scores :math:`s\,q_i\cdot k_j` ``(N, n, P·cap)`` of the probed buckets' keys, from
    the keys stored bucket by bucket ``kb`` ``(N·NB, cap·D)`` (with gradient)."""
    N, n, D = qc.shape
    NB, cap = bk.members.shape[1:]
    ar = torch.arange(N, device=qc.device).view(N, 1, 1)
    rows = (probe + ar * NB).reshape(-1)  # whole buckets: contiguous (cap·D) rows
    kc = kb.index_select(0, rows).view(N, n, probe.shape[-1] * cap, D)  # (N, n, M, D)
    return torch.matmul(kc, qc.unsqueeze(-1)).squeeze(-1)  # (N, n, M)


def _keep_topk(lg: Tensor, lp: Tensor, log_u: Tensor, topk: int) -> tuple[Tensor, Tensor]:
    r"""The ``topk`` best candidates (slots ``(N, n, kk)``) and the bound on the mass dropped,
    :math:`\delta_i \le 1 - Z_S/(Z_P + U_i)` ``(N, n)`` (0 for a row with no allowed key)."""
    kk = min(topk, lg.shape[-1])
    post = lg + lp
    top, pos = post.topk(kk, dim=-1, sorted=False)  # (N, n, kk)
    lse_p = torch.logsumexp(post, dim=-1)  # probed mass
    lse_s = torch.logsumexp(top, dim=-1)  # kept mass
    denom = torch.logaddexp(lse_p, log_u)
    d = (-torch.expm1(lse_s - denom)).clamp(0.0, 1.0)
    return pos, torch.where(denom == NEG_INF, torch.zeros_like(d), d)


def _probe_chunks(
    qf: Tensor,
    kf: Tensor,
    bk: _Buckets,
    sc: float,
    P: int,
    topk: int,
    is_causal: bool,
    chunk_size: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each query chunk probed, scored and cut to its top-k: logits, log-prior and key index
    ``(N, Tq, kk)`` and the dropped-mass bound ``(N, Tq)``."""
    N, Tq, _ = qf.shape
    Tk, D = kf.shape[1:]
    NB, cap = bk.members.shape[1:]
    ar = torch.arange(N, device=qf.device).view(N, 1, 1)
    flat = (bk.members.clamp_min(0) + ar * Tk).reshape(-1)
    kb = kf.reshape(N * Tk, D).index_select(0, flat).view(N * NB, cap * D)  # keys by bucket
    logits, lps, idxs, bounds = [], [], [], []
    for s in range(0, Tq, chunk_size):
        qc = qf[:, s : min(s + chunk_size, Tq)] * sc  # (N, n, D)
        with torch.no_grad():
            probe, log_u, ok, cidx = _probe(qc.detach(), bk, P, s, is_causal)
        lg = _score_probed(qc, kb, probe, bk)  # (N, n, M)
        lp = torch.zeros(ok.shape, dtype=qf.dtype, device=qf.device).masked_fill(~ok, NEG_INF)
        with torch.no_grad():
            pos, bound = _keep_topk(lg.detach(), lp, log_u, topk)
        bounds.append(bound)
        logits.append(lg.gather(-1, pos))
        lps.append(lp.gather(-1, pos))
        idxs.append(cidx.gather(-1, pos))
    return torch.cat(logits, 1), torch.cat(lps, 1), torch.cat(idxs, 1), torch.cat(bounds, 1)


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
    check_qkv(q, k)
    topk = check_int("topk", topk, 1)
    iters = check_int("iters", iters, 0)
    chunk_size = check_int("chunk_size", chunk_size, 1)
    sc = resolve_scale(scale, q.shape[-1])
    Tq, Tk = q.shape[-2], k.shape[-2]
    check_int("num_clusters", num_clusters, 1, allow_none=True)
    P = check_int("probes", probes if probes is not None else 8, 1)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    if Tq == 0 or Tk == 0 or 0 in lead:  # nothing to cluster or no row: the exact (empty) top-k
        return topk_support(q, k, topk, _padding_prior(key_padding_mask, Tk, q.dtype), scale=scale)
    C = min(num_clusters if num_clusters is not None else math.ceil(math.sqrt(Tk)), Tk)
    qf, kf, valid = _flatten_rows(q, k, key_padding_mask, lead)  # (N, Tq, D), (N, Tk, D)
    with torch.no_grad():
        bk = _bucket_keys(kf.detach(), valid, C, iters, is_causal)
    P = min(P, bk.members.shape[1])
    logits, lp, index, dropped = _probe_chunks(qf, kf, bk, sc, P, topk, is_causal, chunk_size)
    K = logits.shape[-1]
    return ReducedSupport(
        logits.reshape(lead + (Tq, K)), lp.reshape(lead + (Tq, K)), index.reshape(lead + (Tq, K)),
        Tk, "topk", dropped_mass=dropped.reshape(lead + (Tq,)),
    )  # fmt: skip
