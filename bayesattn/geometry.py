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
* :func:`token_distances` — distances between a network's tokens (pixels between patch centres
  for a :class:`~bayesattn.nn.networks.VisionTransformer`, positions otherwise), and
  :func:`spatial_attention_distance` — :math:`\sum_j w_{ij} d_{ij}` over content tokens (CLS left
  out, rows renormalised), the ViT paper's "mean attention distance".
* :func:`spread_by_distance` — how the attention posterior's mass and its spread across posterior
  draws (sd of :math:`w_{ij}`) vary with the query–key distance.
* :func:`geometry_report` — all of it for every layer of a trained network, with figures.

Pure tensor functions; the module-level helpers only read weights and run a forward pass.
Shape glossary: ``B`` batch, ``H`` heads, ``Tq``/``Tk`` query/key length, ``E`` embed dim,
``Dh = E / H``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, get_args

import torch
from torch import Tensor, nn

from ._validation import check_float_tensor
from .functional import entropy
from .nn.attention import BayesianMultiheadAttention
from .nn.modes import attention_mode

if TYPE_CHECKING:
    from .nn.networks import BayesianNetwork

#: Which projection of a multi-head attention layer: query, key, value or output.
Projection = Literal["q", "k", "v", "o"]
_PROJECTIONS: tuple[str, ...] = get_args(Projection)

__all__ = [
    "attention_entropy",
    "mean_attention_distance",
    "mean_distance_per_head",
    "attention_distance_by_layer",
    "head_projection_weights",
    "head_subspace_angles",
    "token_distances",
    "spatial_attention_distance",
    "spread_by_distance",
    "geometry_report",
]


def _check_weights(weights: Any, name: str = "weights") -> Tensor:
    """Attention weights: a floating-point tensor ``(..., Tq, Tk)``."""
    return check_float_tensor(name, weights, 2, layout="(..., Tq, Tk)")


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
        for mod, flag in flags:
            mod.training = flag

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


def _is_mha(module: Any) -> TypeGuard[BayesianMultiheadAttention | nn.MultiheadAttention]:
    return isinstance(module, (BayesianMultiheadAttention, nn.MultiheadAttention))


def head_projection_weights(
    mha: nn.Module, which: Projection = "q", weight: Tensor | None = None
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
    if which not in _PROJECTIONS:
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
        packed = mha.kdim == mha.embed_dim and mha.vdim == mha.embed_dim  # one in_proj_weight
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
    mha: nn.Module, which: Projection = "q", mean: bool = False, weight: Tensor | None = None
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


# ---------------------------------------------------------------------------------------------
# distances between tokens, spread of the posterior, and the whole report
# ---------------------------------------------------------------------------------------------


def token_distances(network: nn.Module, num_tokens: int) -> tuple[Tensor, int]:
    r"""Distances between the content tokens of ``network`` and the index of the first one.

    For a :class:`~bayesattn.nn.networks.VisionTransformer`: Euclidean distance in pixels between
    patch centres, :math:`d_{ij} = p\,\lVert(r_i, c_i) - (r_j, c_j)\rVert` on the row-major patch
    grid (patch size :math:`p`). Otherwise :math:`|i - j|` in positions. A CLS token (pooling
    ``"cls"``) sits at index 0 and has no position: ``first = 1``.

    Shape:
        → ``((N, N), first)`` with ``N = num_tokens - first``.
    """
    first = 1 if getattr(network, "cls", None) is not None else 0
    n = num_tokens - first
    if n < 1:
        raise ValueError(f"num_tokens={num_tokens} leaves no content token (first={first})")
    patch_size: int | None = getattr(network, "patch_size", None)
    image_size: int | None = getattr(network, "image_size", None)
    if patch_size is not None and image_size is not None:
        g = image_size // patch_size
        if g * g != n:
            raise ValueError(f"a {g}x{g} patch grid has {g * g} tokens; got {n}")
        idx = torch.arange(n)
        rc = torch.stack([idx // g, idx % g], dim=-1).to(torch.float64)  # (N, 2)
        return torch.cdist(rc, rc) * patch_size, first
    pos = torch.arange(n, dtype=torch.float64)
    return (pos[:, None] - pos[None, :]).abs(), first


def _content(weights: Tensor, first: int) -> Tensor:
    """Weights among content tokens, rows renormalised (CLS query and key dropped)."""
    w = weights[..., first:, first:]
    return w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)


def spatial_attention_distance(weights: Tensor, distances: Tensor, first: int = 0) -> Tensor:
    r"""Mean attention distance :math:`D_i = \sum_j w_{ij} d_{ij}` over content tokens (the
    first ``first`` tokens — a CLS — dropped and each row renormalised over the rest).

    Shape:
        weights ``(..., T, T)``, distances ``(T - first, T - first)`` → ``(..., T - first)``.
    """
    w = _content(_check_weights(weights), first)
    if distances.shape != w.shape[-2:]:
        raise ValueError(
            f"distances must be {tuple(w.shape[-2:])} for weights {tuple(weights.shape)} with "
            f"first={first}; got {tuple(distances.shape)}"
        )
    return (w * distances.to(w.dtype)).sum(-1)


def spread_by_distance(
    samples: Tensor, distances: Tensor, first: int = 0, num_bins: int = 6
) -> dict[str, list[float]]:
    r"""Attention mass and posterior spread as a function of query–key distance.

    From draws :math:`w^{(s)}_{ij}` (content tokens, rows renormalised) the entries are grouped
    by distance into ``num_bins`` equal-width bins over :math:`(0, d_{max}]` plus the diagonal
    :math:`d = 0`; per bin: the mean posterior weight :math:`\bar w`, the mean across-draw
    standard deviation :math:`\mathrm{sd}(w)`, and their ratio (coefficient of variation, how
    uncertain a weight is relative to its size).

    Shape:
        samples ``(S, ..., T, T)``, distances ``(T - first, T - first)`` → lists of length
        ``num_bins + 1``.
    """
    if not isinstance(num_bins, int) or num_bins < 1:
        raise ValueError(f"num_bins must be a positive int; got {num_bins!r}")
    w = _content(_check_weights(samples, "samples"), first).to(torch.float64)
    if w.dim() < 3:
        raise ValueError(f"samples must be (S, ..., T, T); got {tuple(samples.shape)}")
    mean = w.mean(0).reshape(-1, *w.shape[-2:])  # (N, T, T)
    sd = w.std(0, correction=0).reshape(-1, *w.shape[-2:])
    d = distances.to(torch.float64)
    dmax = float(d.max()) if d.numel() else 0.0
    edges = [0.0] + [dmax * (b + 1) / num_bins for b in range(num_bins)]
    out: dict[str, list[float]] = {"distance": [], "mean_weight": [], "sd": [], "cv": []}
    for b in range(num_bins + 1):
        if b == 0:
            sel, centre = d == 0, 0.0
        else:
            lo, hi = edges[b - 1], edges[b]
            sel, centre = (d > lo) & (d <= hi), 0.5 * (lo + hi)
        if not bool(sel.any()):
            continue
        m = float(mean[:, sel].mean())
        s = float(sd[:, sel].mean())
        out["distance"].append(centre)
        out["mean_weight"].append(m)
        out["sd"].append(s)
        out["cv"].append(s / m if m > 0 else float("nan"))
    return out


def _layer_weight(network: nn.Module, name: str, mha: BayesianMultiheadAttention) -> Tensor | None:
    """The in-projection to analyse: stored, or the weight guide's median for a Bayesian one."""
    packed = mha.kdim == mha.embed_dim and mha.vdim == mha.embed_dim
    site = "in_proj_weight" if packed else "q_proj_weight"
    if site in getattr(mha, "_pyro_samples", {}):
        guide = getattr(network, "weight_guide", None)
        return None if guide is None else guide.median()[f"{name}.{site}"].detach()
    return None


@torch.no_grad()
def geometry_report(
    net: BayesianNetwork,
    x: Tensor,
    out_dir: str | Any,
    num_samples: int = 16,
    num_bins: int = 6,
    figures: bool = True,
) -> dict[str, Any]:
    r"""The geometry of a trained classifier's attention, as numbers and PNG figures.

    For every attention layer (in depth order), from ``num_samples`` posterior draws of the
    attention weights on inputs ``x`` (:func:`bayesattn.uncertainty.predict`; a deterministic
    network gives identical draws, spread 0):

    * ``distance``: mean attention distance per head (:func:`spatial_attention_distance` of the
      posterior-mean weights, pixels for a ViT), and ``distance_mean`` over heads — does reading
      go from local to global with depth (``local_to_global``: the mean grows layer on layer)?
    * ``entropy``: entropy per head of the posterior-mean weights over all ``T`` keys (CLS
      included; nats), the spread of the categorical posterior over keys; ``entropy_uniform`` =
      :math:`\log T`, its value for uniform weights (the largest it can be), with ``num_keys = T``
      read from the recorded weights.
    * ``posterior_sd``: mean across-draw sd of the weights; ``spread_by_distance``: mass, sd and
      their ratio by query–key distance (:func:`spread_by_distance`).
    * ``subspace_angle``: mean principal angle (degrees) between the query subspaces of each pair
      of heads (:func:`head_subspace_angles`), ``(H, H)``, and its off-diagonal mean.

    Figures written to ``out_dir``: ``attention_distance.png``, ``spread_vs_distance.png``,
    ``spread_by_depth.png``, ``subspace_angles.png`` (``figures=False``: none). Returns a
    JSON-ready dict (lists, floats) with ``figures`` naming the files.
    """
    from .uncertainty import predict

    layers = _attention_layers(net)
    res = predict(net, x, num_samples=num_samples)
    names = [n for n, _ in layers if n in res.attention]
    if not names:
        raise ValueError("the forward pass recorded no attention weights")
    T = res.attention[names[0]].samples.shape[-1]
    dist, first = token_distances(net, T)
    report: dict[str, Any] = {
        "layers": names,
        "distance_unit": "pixels" if hasattr(net, "patch_size") else "positions",
        "num_samples": num_samples,
        "distance": {},
        "distance_mean": {},
        "entropy": {},
        "entropy_mean": {},
        "num_keys": T,
        "entropy_uniform": math.log(T),  # uniform weights over the T keys the entropy sums over
        "posterior_sd": {},
        "spread_by_distance": {},
        "subspace_angle": {},
        "subspace_angle_mean": {},
    }
    mods = dict(layers)
    for name in names:
        samples = res.attention[name].samples  # (S, B, H, T, T)
        w_in = _layer_weight(net, name, mods[name])
        for key, value in _layer_geometry(samples, mods[name], w_in, dist, first, num_bins).items():
            report[key][name] = value  # {layer: value} per entry
    dm = [report["distance_mean"][n] for n in names]
    report["local_to_global"] = bool(all(b > a for a, b in zip(dm, dm[1:], strict=False)))
    report["figures"] = []
    if figures:
        report["figures"] = _geometry_figures(report, Path(out_dir))
    return report


def _layer_geometry(
    samples: Tensor,
    module: nn.Module,
    w_in: Tensor | None,
    dist: Tensor,
    first: int,
    num_bins: int,
) -> dict[str, Any]:
    """One attention layer's entries of :func:`geometry_report` from its weight draws
    ``(S, B, H, T, T)`` and its query projection ``w_in``."""
    mean = samples.mean(0)  # (B, H, T, T)
    d = spatial_attention_distance(mean, dist, first).mean((0, 2))  # (H,)
    ent = attention_entropy(mean).mean((0, 2))  # (H,)
    ang = head_subspace_angles(module, "q", mean=True, weight=w_in)  # (H, H)
    H = ang.shape[0]
    off = ang[~torch.eye(H, dtype=torch.bool)]
    return {
        "distance": d.tolist(),
        "distance_mean": float(d.mean()),
        "entropy": ent.tolist(),
        "entropy_mean": float(ent.mean()),
        "posterior_sd": float(samples.std(0, correction=0).mean()),
        "spread_by_distance": spread_by_distance(samples, dist, first, num_bins),
        "subspace_angle": ang.tolist(),
        "subspace_angle_mean": float(off.mean()) if off.numel() else 0.0,
    }


def _geometry_figures(report: dict[str, Any], out: str | Path) -> list[str]:
    from . import plots

    names = report["layers"]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    short = [n.replace("encoder.layers.", "L").replace(".self_attn", "") for n in names]
    fig = plots.plot_attention_distance(
        {s: report["distance"][n] for s, n in zip(short, names, strict=True)},
        title=f"Mean attention distance per layer ({report['distance_unit']})",
    )
    fig.axes[0].set_ylabel(f"mean attention distance ({report['distance_unit']})")
    fig.savefig(out / "attention_distance.png", dpi=120)
    figures.append("attention_distance.png")

    fig = plots._new_figure(figsize=(10, 3.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    for s, n in zip(short, names, strict=True):
        r = report["spread_by_distance"][n]
        ax1.plot(r["distance"], r["mean_weight"], marker="o", label=s)
        ax2.plot(r["distance"], r["sd"], marker="o", label=s)
    ax1.set(xlabel=f"query–key distance ({report['distance_unit']})", ylabel="mean posterior weight",
            title="Attention mass by distance")  # fmt: skip
    ax2.set(xlabel=f"query–key distance ({report['distance_unit']})",
            ylabel="sd of the weight across draws", title="Posterior spread by distance")  # fmt: skip
    ax1.set_yscale("log")
    ax1.legend(fontsize="small")
    fig.savefig(out / "spread_vs_distance.png", dpi=120)
    figures.append("spread_vs_distance.png")

    fig = plots._new_figure(figsize=(8, 3.5), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    xs = list(range(len(names)))
    ax1.plot(xs, [report["entropy_mean"][n] for n in names], marker="o")
    uniform = report["entropy_uniform"]  # log of the number of keys the entropy is over
    ax1.axhline(uniform, color="grey", linestyle=":",
                label=f"uniform over {report['num_keys']} keys (log {report['num_keys']})")  # fmt: skip
    ax1.set(xticks=xs, xticklabels=short, ylabel="entropy of the mean weights (nats)",
            title="Posterior over keys: entropy by depth")  # fmt: skip
    ax1.legend(fontsize="small")
    ax2.plot(xs, [report["posterior_sd"][n] for n in names], marker="o", color="C3")
    ax2.set(xticks=xs, xticklabels=short, ylabel="mean sd across draws",
            title="Weight uncertainty by depth")  # fmt: skip
    fig.savefig(out / "spread_by_depth.png", dpi=120)
    figures.append("spread_by_depth.png")

    fig = plots._new_figure(figsize=(3.2 * len(names), 3.2), layout="constrained")
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    for ax, s, n in zip(axes, short, names, strict=True):
        im = ax.imshow(report["subspace_angle"][n], vmin=0, vmax=90, cmap="viridis")
        ax.set(title=f"{s}: query subspaces", xlabel="head", ylabel="head")
    fig.colorbar(im, ax=list(axes), label="mean principal angle (degrees)")
    fig.savefig(out / "subspace_angles.png", dpi=120)
    figures.append("subspace_angles.png")
    return figures
