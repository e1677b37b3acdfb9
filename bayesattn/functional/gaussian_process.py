r"""Sparse Gaussian-process maths as pure tensor functions (no modules, no Pyro).

These are the pieces of a *global, distance-aware* posterior over a function of the input: a
stationary covariance :math:`c(x, x') = \sigma^2 \rho(\lVert x - x'\rVert / \ell)` (RBF or
Matérn-5/2), ``M`` inducing inputs :math:`Z`, and a whitened Gaussian posterior over the inducing
values. Whitening: :math:`u = L_Z v` with :math:`L_Z L_Z^\top = C_{ZZ}`, prior
:math:`v \sim \mathcal N(0, I)`, posterior :math:`q(v) = \mathcal N(m, S)`, :math:`S = L_S L_S^\top`.
For a query :math:`x` with :math:`a(x) = L_Z^{-1} c_{Zx}`:

.. math:: f(x)\mid v \sim \mathcal N\big(a(x)^\top v,\; c(x, x) - a(x)^\top a(x)\big),\qquad
          E_q f(x) = a^\top m,\quad \operatorname{Var}_q f(x) = c(x,x) - a^\top a + a^\top S a.

Far from every inducing input :math:`a(x) \to 0`, so the variance returns to the prior's
:math:`\sigma^2` whatever :math:`S` is: that is what makes it *know what it does not know*.

"Covariance" here is the Gaussian-process covariance function; it has nothing to do with the
reduced key supports of :mod:`bayesattn.functional.supports`.

Shape glossary: ``G`` independent groups (e.g. attention heads), ``N`` inputs, ``M`` inducing
inputs, ``D`` input dim, ``P`` outputs per group (sharing one :math:`S` per group).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch
from torch import Tensor

from .._validation import (
    check_broadcasts,
    check_float_tensor,
    check_no_nan,
    check_positive,
)

__all__ = [
    "CovarianceName",
    "rbf_covariance",
    "matern52_covariance",
    "get_covariance",
    "whitened_projection",
    "sparse_gp_marginals",
    "whitened_kl",
    "random_fourier_features",
]

#: A stationary covariance function by name.
CovarianceName = Literal["rbf", "matern52"]
Covariance = Callable[..., Tensor]


def _check_points(x1: Tensor, x2: Tensor, names: tuple[str, str] = ("x1", "x2")) -> None:
    """Two point sets ``(*, N, D)`` and ``(*, M, D)`` of floats without NaN sharing ``D``."""
    for n, t in zip(names, (x1, x2), strict=True):
        check_float_tensor(n, t, 2, layout="(*, N, D)")
        check_no_nan(n, t, allow_neg_inf=False)
    if x1.shape[-1] != x2.shape[-1]:
        raise ValueError(
            f"{names[0]} and {names[1]} must share their last (feature) dim D; got "
            f"{names[0]} {tuple(x1.shape)}, {names[1]} {tuple(x2.shape)}"
        )


def _scales(
    lengthscale: Tensor | float,
    outputscale: Tensor | float,
    like: Tensor,
    groups: tuple[int, ...],
    into: bool = True,
) -> tuple[Tensor, Tensor]:
    """``lengthscale``/``outputscale`` as positive tensors (a float becomes a tensor of ``like``'s
    dtype) that broadcast with the leading ``groups`` dims (``into``: without growing them)."""
    ls = check_positive("lengthscale", lengthscale, like)
    os_ = check_positive("outputscale", outputscale, like)
    layout = "the leading (*G) dims" if groups else "a scalar"
    check_broadcasts("lengthscale", ls, groups, layout, into=into)
    check_broadcasts("outputscale", os_, groups, layout, into=into)
    return ls, os_


def _check_tril(name: str, tril: Tensor) -> None:
    """``tril`` is a lower-triangular factor (zero above the diagonal) with finite values."""
    if tril.device.type == "meta":
        return
    if not bool(torch.isfinite(tril).all()):
        raise ValueError(f"{name} must be finite; got NaN or Inf")
    if not bool((tril.triu(1) == 0).all()):
        raise ValueError(
            f"{name} must be a lower-triangular Cholesky factor (zero above the diagonal); got "
            f"non-zero entries above it, shape {tuple(tril.shape)}"
        )


def _scaled_sqdist(x1: Tensor, x2: Tensor, lengthscale: Tensor) -> Tensor:
    """:math:`\\lVert x_1 - x_2\\rVert^2/\\ell^2`; ``lengthscale`` ``(*G)`` broadcasts over the
    groups. Shape: ``(*, N, D)``, ``(*, M, D)`` → ``(*, N, M)``."""
    ls = lengthscale[..., None, None]  # (*G, 1, 1)
    a, b = x1 / ls, x2 / ls
    d = (a * a).sum(-1, keepdim=True) - 2 * a @ b.transpose(-1, -2) + (b * b).sum(-1).unsqueeze(-2)
    return d.clamp_min(0.0)


def _rbf(x1: Tensor, x2: Tensor, ls: Tensor, os_: Tensor) -> Tensor:
    return os_[..., None, None] * torch.exp(-0.5 * _scaled_sqdist(x1, x2, ls))


def _matern52(x1: Tensor, x2: Tensor, ls: Tensor, os_: Tensor) -> Tensor:
    r2 = _scaled_sqdist(x1, x2, ls)
    r = torch.sqrt(r2 + 1e-12)
    s5 = 5.0**0.5
    return os_[..., None, None] * (1 + s5 * r + (5.0 / 3.0) * r2) * torch.exp(-s5 * r)


def _checked(raw: Covariance, x1: Tensor, x2: Tensor, lengthscale: Tensor | float,
             outputscale: Tensor | float) -> Tensor:  # fmt: skip
    """``raw`` on checked points and scales (shapes as :func:`rbf_covariance`)."""
    _check_points(x1, x2)
    groups = tuple(torch.broadcast_shapes(x1.shape[:-2], x2.shape[:-2]))
    ls, os_ = _scales(lengthscale, outputscale, x1, groups, into=False)
    return raw(x1, x2, ls, os_)


def rbf_covariance(
    x1: Tensor, x2: Tensor, lengthscale: Tensor | float, outputscale: Tensor | float
) -> Tensor:
    r"""Squared-exponential covariance :math:`\sigma^2\exp(-\lVert x_1-x_2\rVert^2/2\ell^2)`.

    Shape: ``x1 (*, N, D)``, ``x2 (*, M, D)``, ``lengthscale``/``outputscale`` (tensors
    broadcasting with ``*``, or numbers) → ``(*, N, M)``."""
    return _checked(_rbf, x1, x2, lengthscale, outputscale)


def matern52_covariance(
    x1: Tensor, x2: Tensor, lengthscale: Tensor | float, outputscale: Tensor | float
) -> Tensor:
    r"""Matérn-5/2 covariance :math:`\sigma^2(1 + \sqrt5 r + \tfrac53 r^2)e^{-\sqrt5 r}`,
    :math:`r = \lVert x_1 - x_2\rVert/\ell`. Shapes as :func:`rbf_covariance`."""
    return _checked(_matern52, x1, x2, lengthscale, outputscale)


#: the unchecked forms, for callers that checked their inputs once (whitened_projection)
_RAW: dict[str, Covariance] = {"rbf": _rbf, "matern52": _matern52}
_COVARIANCES: dict[str, Covariance] = {"rbf": rbf_covariance, "matern52": matern52_covariance}


def get_covariance(name: CovarianceName) -> Covariance:
    """The covariance function called ``name`` (``"rbf"`` or ``"matern52"``)."""
    if name not in _COVARIANCES:
        raise ValueError(f"covariance must be one of {get_args(CovarianceName)}; got {name!r}")
    return _COVARIANCES[name]


def whitened_projection(
    x: Tensor,
    inducing: Tensor,
    lengthscale: Tensor | float,
    outputscale: Tensor | float,
    covariance: CovarianceName = "rbf",
    jitter: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    r"""``(a, r)``: :math:`a(x) = L_Z^{-1} c_{Zx}` and the conditional variance
    :math:`r(x) = c(x,x) - a^\top a \ge 0` (the part no inducing value explains).

    Shape:
        x ``(*, G, N, D)``, inducing ``(G, M, D)``, lengthscale/outputscale ``(G,)`` →
        a ``(*, G, N, M)``, r ``(*, G, N)``.
    """
    check_float_tensor("inducing", inducing, ndim=3, layout="(G, M, D)")
    check_float_tensor("x", x, 3, layout="(*, G, N, D)")
    if x.shape[-1] != inducing.shape[-1] or x.shape[-3] != inducing.shape[0]:
        raise ValueError(
            f"x (*, G, N, D) and inducing (G, M, D) must share G and D; got x {tuple(x.shape)}, "
            f"inducing {tuple(inducing.shape)}"
        )
    check_no_nan("x", x, allow_neg_inf=False)
    check_no_nan("inducing", inducing, allow_neg_inf=False)
    lengthscale, outputscale = _scales(lengthscale, outputscale, inducing, (inducing.shape[0],))
    if not isinstance(jitter, (int, float)) or isinstance(jitter, bool) or not jitter >= 0:
        raise ValueError(f"jitter must be a number >= 0; got {jitter!r}")
    get_covariance(covariance)  # validates the name
    cov = _RAW[covariance]  # x, inducing and the scales are checked above
    M = inducing.shape[-2]
    eye = torch.eye(M, dtype=inducing.dtype, device=inducing.device)
    kzz = cov(inducing, inducing, lengthscale, outputscale) + jitter * eye  # (G, M, M)
    lz = torch.linalg.cholesky(kzz)  # (G, M, M)
    kxz = cov(x, inducing, lengthscale, outputscale)  # (*, G, N, M)
    # a^T = c_xZ L_Z^{-T}: L_Z a = c_Zx, broadcasting L_Z over the leading dims
    a = torch.linalg.solve_triangular(lz, kxz.transpose(-1, -2), upper=False)  # (*, G, M, N)
    a = a.transpose(-1, -2)  # (*, G, N, M)
    prior_var = outputscale[..., None].expand(kxz.shape[-3], 1)  # (G, 1): c(x, x) = σ²
    r = (prior_var - (a * a).sum(-1)).clamp_min(0.0)  # (*, G, N)
    return a, r


def sparse_gp_marginals(
    a: Tensor, r: Tensor, q_mean: Tensor, q_scale_tril: Tensor
) -> tuple[Tensor, Tensor]:
    r"""Posterior mean :math:`a^\top m` and variance :math:`r + a^\top S a` of :math:`f(x)` under
    :math:`q(v)=\mathcal N(m, L_S L_S^\top)` (one :math:`S` shared by the ``P`` outputs of a group).

    Shape:
        a ``(*, G, N, M)``, r ``(*, G, N)``, q_mean ``(G, P, M)``, q_scale_tril ``(G, M, M)`` →
        mean ``(*, G, N, P)``, var ``(*, G, N)`` (the same for every output of a group).
    """
    G, M = a.shape[-3], a.shape[-1]
    if a.dim() < 3 or r.shape != a.shape[:-1]:
        raise ValueError(
            f"a must be (*, G, N, M) and r (*, G, N) (whitened_projection's output); got a "
            f"{tuple(a.shape)}, r {tuple(r.shape)}"
        )
    check_float_tensor("q_mean", q_mean, ndim=3, layout=f"(G, P, M) = ({G}, P, {M})")
    if q_mean.shape[0] != G or q_mean.shape[-1] != M:
        raise ValueError(
            f"q_mean must be (G, P, M) = ({G}, P, {M}) for a projection a {tuple(a.shape)}; got "
            f"{tuple(q_mean.shape)}"
        )
    if q_scale_tril.shape != (G, M, M):
        raise ValueError(
            f"q_scale_tril must be (G, M, M) = {(G, M, M)}; got {tuple(q_scale_tril.shape)}"
        )
    _check_tril("q_scale_tril", q_scale_tril)
    mean = a @ q_mean.transpose(-1, -2)  # (*, G, N, P)
    var = r + ((a @ q_scale_tril) ** 2).sum(-1)  # (*, G, N)
    return mean, var


def whitened_kl(q_mean: Tensor, q_scale_tril: Tensor) -> Tensor:
    r""":math:`\sum_{g,p}\mathrm{KL}(\mathcal N(m_{gp}, S_g)\,\|\,\mathcal N(0, I))
    = \tfrac12\sum_{g,p}\big(\operatorname{tr} S_g + m_{gp}^\top m_{gp} - M - \log\det S_g\big)`.

    Shape: q_mean ``(G, P, M)``, q_scale_tril ``(G, M, M)`` → scalar.
    """
    check_float_tensor("q_mean", q_mean, ndim=3, layout="(G, P, M)")
    G, P, M = q_mean.shape
    if q_scale_tril.shape != (G, M, M):
        raise ValueError(
            f"q_scale_tril must be (G, M, M) = {(G, M, M)}; got {tuple(q_scale_tril.shape)}"
        )
    _check_tril("q_scale_tril", q_scale_tril)
    tr = (q_scale_tril**2).sum((-2, -1))  # (G,)
    logdet = 2 * torch.log(torch.diagonal(q_scale_tril, dim1=-2, dim2=-1).abs()).sum(-1)  # (G,)
    per_group = P * (tr - M - logdet) + (q_mean**2).sum((-2, -1))  # (G,)
    return 0.5 * per_group.sum()


def random_fourier_features(
    x: Tensor,
    weight: Tensor,
    phase: Tensor,
    lengthscale: Tensor | float,
    outputscale: Tensor | float,
) -> Tensor:
    r"""Random Fourier features :math:`\phi(x) = \sqrt{2\sigma^2/R}\cos(W x/\ell + b)` with
    :math:`W_{rd}\sim\mathcal N(0,1)`, :math:`b_r\sim U(0, 2\pi)`: :math:`E_W\,\phi(x)^\top\phi(x')`
    is the RBF covariance :math:`\sigma^2\exp(-\lVert x-x'\rVert^2/2\ell^2)` (Rahimi & Recht).

    Shape: x ``(*, D)``, weight ``(R, D)``, phase ``(R,)``, scalars → ``(*, R)``.
    """
    check_float_tensor("x", x, 1, layout="(*, D)")
    check_float_tensor("weight", weight, ndim=2, layout=f"(R, D = {x.shape[-1]})")
    if weight.shape[-1] != x.shape[-1] or phase.shape != (weight.shape[0],):
        raise ValueError(
            f"weight must be (R, D) with x's D = {x.shape[-1]} and phase (R,); got weight "
            f"{tuple(weight.shape)}, phase {tuple(phase.shape)}"
        )
    lengthscale, outputscale = _scales(lengthscale, outputscale, x, (1,), into=False)
    R = weight.shape[0]
    return torch.sqrt(2 * outputscale / R) * torch.cos(x @ weight.T / lengthscale + phase)
