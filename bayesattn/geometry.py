r"""Geometry of attention: how far and how broadly queries read, and how heads split the space.

* :func:`attention_entropy` — :math:`H_i = -\sum_j w_{ij}\log w_{ij}` per query (nats); ``log Tk``
  for uniform weights, 0 for a one-hot read.
* :func:`mean_attention_distance` — :math:`D_i = \sum_j w_{ij}\,|p^q_i - p^k_j|`, the expected
  distance (in positions) between a query and the key it reads; :func:`mean_distance_per_head`
  averages it over queries and examples, and :func:`attention_distance_by_layer` does so for
  every attention layer of a network (deterministic, posterior-mean weights).
* :func:`head_subspace_angles` — principal angles between the subspaces that different heads
  read (``q``/``k``/``v``) or write (``o``): for orthonormal bases :math:`Q_a, Q_b` of the
  per-head projections, :math:`\cos\theta_k = \sigma_k(Q_a^\top Q_b)` (Björck–Golub).

Pure tensor functions; the module-level helpers only read weights and run a forward pass.
Shape glossary: ``B`` batch, ``H`` heads, ``Tq``/``Tk`` query/key length, ``E`` embed dim,
``Dh = E / H``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from .functional import entropy
from .nn.attention import BayesianMultiheadAttention
from .nn.modes import attention_mode

__all__ = [
    "attention_entropy",
    "mean_attention_distance",
    "mean_distance_per_head",
    "attention_distance_by_layer",
    "head_projection_weights",
    "head_subspace_angles",
]


def _check_weights(weights: Any, name: str = "weights") -> Tensor:
    if not isinstance(weights, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(weights).__name__}")
    if not weights.is_floating_point():
        raise TypeError(f"{name} must be floating point; got dtype {weights.dtype}")
    if weights.dim() < 2:
        raise ValueError(
            f"{name} must have at least 2 dims (..., Tq, Tk); got {tuple(weights.shape)}"
        )
    return weights


def attention_entropy(weights: Tensor) -> Tensor:
    r"""Entropy of each query's attention distribution,
    :math:`H_i = -\sum_j w_{ij}\log w_{ij}` (nats, :math:`0\log 0 = 0`).

    Uniform weights over ``Tk`` keys give :math:`\log T_k`; a one-hot row gives 0.

    Shape:
        weights ``(..., Tq, Tk)`` → ``(..., Tq)``.

    Example:
        >>> attention_entropy(torch.full((2, 4), 0.25))
        tensor([1.3863, 1.3863])
    """
    return entropy(_check_weights(weights))


def _positions(pos: Tensor | None, n: int, name: str, like: Tensor) -> Tensor:
    if pos is None:
        return torch.arange(n, dtype=like.dtype, device=like.device)
    if not isinstance(pos, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None; got {type(pos).__name__}")
    if pos.dim() < 1 or pos.shape[-1] != n:
        raise ValueError(f"{name} must have last dim {n}; got shape {tuple(pos.shape)}")
    return pos.to(like.dtype)


def mean_attention_distance(
    weights: Tensor, q_pos: Tensor | None = None, k_pos: Tensor | None = None
) -> Tensor:
    r"""Expected distance between each query and the key it reads,
    :math:`D_i = \sum_j w_{ij}\,|p^q_i - p^k_j|`.

    Positions default to ``0..Tq-1`` and ``0..Tk-1`` (self-attention: :math:`|i-j|`). Rows that
    sum to less than 1 (e.g. fully masked rows, all zero) contribute their unnormalised sum.

    Shape:
        weights ``(..., Tq, Tk)``, q_pos ``(Tq,)`` or broadcastable ``(..., Tq)``, k_pos ``(Tk,)``
        or ``(..., Tk)`` → ``(..., Tq)``.

    Example:
        >>> mean_attention_distance(torch.eye(3).flip(-1))  # query i reads key 2 - i
        tensor([2., 0., 2.])
    """
    w = _check_weights(weights)
    Tq, Tk = w.shape[-2:]
    qp = _positions(q_pos, Tq, "q_pos", w)  # (..., Tq)
    kp = _positions(k_pos, Tk, "k_pos", w)  # (..., Tk)
    dist = (qp.unsqueeze(-1) - kp.unsqueeze(-2)).abs()  # (..., Tq, Tk)
    return (w * dist).sum(-1)


def mean_distance_per_head(
    weights: Tensor,
    query_mask: Tensor | None = None,
    q_pos: Tensor | None = None,
    k_pos: Tensor | None = None,
) -> Tensor:
    r"""Mean attention distance of every head, averaged over queries and all leading dims:
    :math:`\bar D_h = \frac{1}{|\mathcal Q|}\sum_{(b,i)\in\mathcal Q} D_{bhi}`.

    Args:
        weights: ``(..., B, H, Tq, Tk)`` with at least ``(H, Tq, Tk)``.
        query_mask: optional bool ``(B, Tq)`` (or broadcastable to ``(..., B, Tq)``), ``True`` for
            queries to include (e.g. not padding).

    Shape:
        → ``(H,)``.
    """
    w = _check_weights(weights)
    if w.dim() < 3:
        raise ValueError(f"weights must be (..., H, Tq, Tk); got shape {tuple(w.shape)}")
    d = mean_attention_distance(w, q_pos, k_pos)  # (..., H, Tq)
    d = d.movedim(-2, 0).reshape(d.shape[-2], -1, d.shape[-1])  # (H, N, Tq)
    if query_mask is None:
        return d.mean((1, 2))
    if not isinstance(query_mask, Tensor) or query_mask.dtype != torch.bool:
        raise TypeError("query_mask must be a bool tensor (B, Tq) or None")
    lead = w.shape[:-3]
    try:
        m = query_mask.expand(lead + (w.shape[-2],))  # (..., Tq)
    except RuntimeError as exc:
        raise ValueError(
            f"query_mask shape {tuple(query_mask.shape)} does not broadcast to "
            f"{tuple(lead + (w.shape[-2],))} (weights {tuple(w.shape)})"
        ) from exc
    m = m.reshape(1, -1, w.shape[-2]).to(d.dtype)  # (1, N, Tq)
    return (d * m).sum((1, 2)) / m.sum().clamp_min(1.0)


def _attention_layers(network: nn.Module) -> list[tuple[str, BayesianMultiheadAttention]]:
    if not isinstance(network, nn.Module):
        raise TypeError(f"network must be a torch.nn.Module; got {type(network).__name__}")
    layers = [
        (n, m) for n, m in network.named_modules() if isinstance(m, BayesianMultiheadAttention)
    ]
    if not layers:
        raise TypeError(
            f"network ({type(network).__name__}) has no BayesianMultiheadAttention layer"
        )
    return layers


@torch.no_grad()
def attention_distance_by_layer(
    network: nn.Module, x: Tensor, y: Tensor | None = None, exclude_padding: bool = True
) -> dict[str, Tensor]:
    r"""Mean attention distance of every head of every attention layer of ``network``.

    Runs ``network(x)`` (``network(x, y)`` if ``y`` is given, e.g. a ``Seq2Seq`` target) once
    deterministically (posterior-mean attention, eval mode, no grad) with ``record_weights`` on
    every :class:`~bayesattn.nn.attention.BayesianMultiheadAttention`, then applies
    :func:`mean_distance_per_head`. For token classifiers with ``exclude_padding`` the padding
    queries (:meth:`padding_mask`, with the CLS slot kept) are left out. Training flags and the
    layers' ``record_weights``/``last_weights`` are restored.

    Shape:
        x as the network takes it → ``{layer path: (H,)}`` in module order.
    """
    layers = _attention_layers(network)
    saved = [(m, m.record_weights, m.last_weights) for _, m in layers]
    flags = [(m, m.training) for m in network.modules()]
    try:
        network.eval()
        for _, m in layers:
            m.record_weights = True
            m.last_weights = None
        with attention_mode("mean"):
            network(x) if y is None else network(x, y)
        weights = {n: m.last_weights for n, m in layers}
    finally:
        for m, rec, last in saved:
            m.record_weights, m.last_weights = rec, last
        for m, flag in flags:
            m.training = flag

    query_mask = None
    pad_fn = getattr(network, "padding_mask", None)
    if exclude_padding and callable(pad_fn) and isinstance(x, Tensor) and x.dim() == 2:
        pad = pad_fn(x)  # (B, T) True at padding, or None
        if pad is not None:
            if getattr(network, "cls", None) is not None:
                pad = torch.cat([pad.new_zeros(pad.shape[0], 1), pad], dim=1)  # (B, 1+T)
            query_mask = ~pad
    out: dict[str, Tensor] = {}
    for name, w in weights.items():
        if w is None:  # layer not used by this forward pass
            continue
        qm = query_mask if query_mask is not None and query_mask.shape[-1] == w.shape[-2] else None
        out[name] = mean_distance_per_head(w, qm)  # (H,)
    return out


def _is_mha(module: Any) -> bool:
    return isinstance(module, (BayesianMultiheadAttention, nn.MultiheadAttention))


def head_projection_weights(
    mha: nn.Module, which: str = "q", weight: Tensor | None = None
) -> Tensor:
    r"""Per-head projection matrices of a multi-head attention layer, as maps in math convention
    :math:`W_h \in \mathbb R^{d_{in}\times D_h}` (so :math:`q_h = x W_h`): head ``h`` reads the
    column space of :math:`W_h` (``q``/``k``/``v``) or writes into it (``o``:
    :math:`W^O_h = W^O[:, hD_h:(h+1)D_h]`, ``d_in = E``).

    Works for :class:`~bayesattn.nn.attention.BayesianMultiheadAttention` and
    ``torch.nn.MultiheadAttention``. ``weight`` overrides the stored matrix (``(3E, E)`` packed
    ``in_proj_weight`` or the ``(E, d)`` per-projection weight; ``(E, E)`` for ``o``); it is
    required when the weight is a Bayesian (``PyroSample``) site, e.g.
    ``network.weight_guide.median()["encoder.layers.0.self_attn.in_proj_weight"]``.

    Shape:
        → ``(H, d_in, Dh)``.
    """
    if not _is_mha(mha):
        raise TypeError(
            f"mha must be a BayesianMultiheadAttention or torch.nn.MultiheadAttention; got "
            f"{type(mha).__name__}"
        )
    if which not in ("q", "k", "v", "o"):
        raise ValueError(f"which must be 'q', 'k', 'v' or 'o'; got {which!r}")
    E, H = mha.embed_dim, mha.num_heads
    Dh = E // H
    samples = getattr(mha, "_pyro_samples", {})
    out_samples = getattr(mha.out_proj, "_pyro_samples", {})
    idx = "qkv".find(which)
    if which == "o":
        if weight is None:
            if "weight" in out_samples:
                raise ValueError(
                    "out_proj.weight is a Bayesian (PyroSample) site: pass weight= (e.g. the "
                    "weight guide's median)"
                )
            weight = mha.out_proj.weight
        if weight.shape != (E, E):
            raise ValueError(f"weight for 'o' must be (E, E) = {(E, E)}; got {tuple(weight.shape)}")
        return weight.detach().reshape(E, H, Dh).permute(1, 0, 2)  # (H, E, Dh)
    if weight is None:
        packed = mha._qkv_same_embed_dim
        name = "in_proj_weight" if packed else f"{which}_proj_weight"
        if name in samples:
            raise ValueError(
                f"{name} is a Bayesian (PyroSample) site: pass weight= (e.g. the weight guide's "
                f"median)"
            )
        weight = getattr(mha, name)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError(
            f"weight must be a 2-D tensor; got {getattr(weight, 'shape', type(weight).__name__)}"
        )
    if weight.shape[0] == 3 * E:
        weight = weight[idx * E : (idx + 1) * E]  # (E, d_in)
    if weight.shape[0] != E:
        raise ValueError(
            f"weight must be (3E, E) packed or (E, d_in) with E={E}; got {tuple(weight.shape)}"
        )
    d_in = weight.shape[1]
    return weight.detach().reshape(H, Dh, d_in).transpose(-1, -2)  # (H, d_in, Dh)


def head_subspace_angles(
    mha: nn.Module, which: str = "q", mean: bool = False, weight: Tensor | None = None
) -> Tensor:
    r"""Principal angles (degrees) between the subspaces of every pair of heads.

    With :math:`W_a, W_b\in\mathbb R^{d\times D_h}` the per-head projections
    (:func:`head_projection_weights`) and :math:`Q_a, Q_b` orthonormal bases of their column
    spaces (left singular vectors), the principal angles satisfy
    :math:`\cos\theta_k = \sigma_k(Q_a^\top Q_b)` (descending singular values → ascending
    angles). Small angles are computed from
    :math:`\sin\theta_k = \sigma_{D_h+1-k}\big((I - Q_aQ_a^\top)Q_b\big)` for accuracy
    (Knyazev & Argentati, 2002); everything runs in float64. Identical subspaces give 0°,
    orthogonal ones 90°. A rank-deficient :math:`W_h` gets an arbitrary completion of its basis.

    Args:
        mha: the attention layer.
        which: ``"q"``, ``"k"``, ``"v"`` (input subspaces read by each head) or ``"o"`` (output
            subspaces written by each head).
        mean: return the mean angle over the ``Dh`` principal angles.
        weight: overrides the stored weight (see :func:`head_projection_weights`).

    Shape:
        → ``(H, H, Dh)`` ascending along the last dim, or ``(H, H)`` with ``mean=True``.
    """
    W = head_projection_weights(mha, which, weight).to(torch.float64)  # (H, d, Dh)
    Q = torch.linalg.svd(W, full_matrices=False).U  # (H, d, Dh) orthonormal columns
    C = torch.einsum("adk,bdl->abkl", Q, Q)  # (H, H, Dh, Dh): Q_a^T Q_b
    cos = torch.linalg.svdvals(C).clamp(0.0, 1.0)  # (H, H, Dh) descending
    P = Q.unsqueeze(0) - torch.einsum("adk,abkl->abdl", Q, C)  # (H, H, d, Dh): (I-QaQa^T)Qb
    sin = torch.linalg.svdvals(P).flip(-1).clamp(0.0, 1.0)  # (H, H, Dh) ascending
    theta = torch.where(sin.square() < 0.5, torch.asin(sin), torch.acos(cos))  # (H, H, Dh)
    deg = theta * (180.0 / math.pi)
    return deg.mean(-1) if mean else deg
