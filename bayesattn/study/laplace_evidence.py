r"""The Laplace approximation to the log marginal likelihood (evidence) of a model with an
isotropic Gaussian prior :math:`\mathcal N(0, \delta^{-1} I)` over its ``P`` parameters, as a
function of the prior precision :math:`\delta`, and its maximiser.

At the trained parameters :math:`\theta_*` with Hessian (GGN / Fisher) :math:`H` of the negative
log likelihood (eigenvalues :math:`\lambda_i \ge 0`):

.. math::

    \log Z(\delta) = \log p(\mathcal D \mid \theta_*) - \tfrac12 \delta \lVert\theta_*\rVert^2
        + \tfrac P2 \log\delta - \tfrac12 \sum_i \log(\lambda_i + \delta)

(:math:`\log\det(H + \delta I) - \log\det(\delta I)`, the log-determinant ratio, and the
scatter :math:`\delta\lVert\theta_*\rVert^2`; laplace-torch's ``log_marginal_likelihood``).
Its derivative in :math:`\log\delta` is :math:`\tfrac12(\gamma(\delta) - \delta
\lVert\theta_*\rVert^2)` with :math:`\gamma(\delta) = \sum_i \lambda_i / (\lambda_i + \delta)`
(the effective number of parameters), strictly decreasing in :math:`\delta`: :math:`\log Z` is
concave in :math:`\log\delta` and its maximiser is MacKay's fixed point :math:`\delta_* =
\gamma(\delta_*) / \lVert\theta_*\rVert^2`, found here by bisection in :math:`\log\delta`. It is
interior (finite, positive) whenever :math:`\theta_* \ne 0` and :math:`H \ne 0`; for a linear
model with a Gaussian likelihood, :math:`\theta_*` the posterior mean, :math:`\log Z` is the
exact evidence."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LaplaceEvidence", "laplace_evidence"]

_F64 = torch.float64


@dataclass(frozen=True)
class LaplaceEvidence:
    """The pieces of :math:`\\log Z(\\delta)`: the log likelihood at the mode, the squared norm
    of the mode and the Hessian's eigenvalues ``(P,)`` (float64, clamped at 0)."""

    log_likelihood: float
    sq_norm: float
    eigenvalues: Tensor

    @property
    def num_params(self) -> int:
        return int(self.eigenvalues.numel())

    def log_evidence(self, prior_precision: Tensor | float) -> Tensor:
        """:math:`\\log Z(\\delta)` at each prior precision. Shape: ``(*D,)`` → ``(*D,)``."""
        d = torch.as_tensor(prior_precision, dtype=_F64)
        if bool((d <= 0).any()) or not bool(torch.isfinite(d).all()):
            raise ValueError(f"prior_precision must be positive and finite; got {d}")
        lam = self.eigenvalues
        logdet = torch.log(lam + d[..., None]).sum(-1)  # (*D,)
        return (self.log_likelihood - 0.5 * d * self.sq_norm + 0.5 * self.num_params * d.log()
                - 0.5 * logdet)  # fmt: skip

    def effective_parameters(self, prior_precision: float) -> float:
        """:math:`\\gamma(\\delta) = \\sum_i \\lambda_i / (\\lambda_i + \\delta)`: how many
        parameter directions the data determine (``P``: the prior has no say, the posterior
        is as narrow as the data make it)."""
        lam = self.eigenvalues
        return float((lam / (lam + float(prior_precision))).sum())

    def maximise(self, tol: float = 1e-10) -> float:
        """The prior precision maximising :math:`\\log Z`: the root of
        :math:`\\gamma(\\delta) - \\delta\\lVert\\theta_*\\rVert^2` by bisection in
        :math:`\\log\\delta` (a unique root, always interior)."""
        if self.sq_norm <= 0 or float(self.eigenvalues.max()) <= 0:
            raise ValueError(
                "the evidence has no interior maximum: the mode is zero or the Hessian is zero "
                f"(|theta|^2={self.sq_norm}, max eigenvalue={float(self.eigenvalues.max())})"
            )

        def slope(log_d: float) -> float:  # 2 · d log Z / d log δ
            d = math.exp(log_d)
            return self.effective_parameters(d) - d * self.sq_norm

        lo, hi = -1.0, 1.0
        while slope(lo) <= 0:
            lo -= 2.0
        while slope(hi) >= 0:
            hi += 2.0
        while hi - lo > tol:
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if slope(mid) > 0 else (lo, mid)
        return math.exp(0.5 * (lo + hi))


def laplace_evidence(hessian: Tensor, mode: Tensor, log_likelihood: float) -> LaplaceEvidence:
    """:class:`LaplaceEvidence` of a Laplace approximation: the Hessian of the negative log
    likelihood at the mode (symmetric PSD, e.g. the GGN), the mode and the log likelihood there.

    Shape:
        hessian ``(P, P)``, mode ``(P,)``.
    """
    if (
        not isinstance(hessian, Tensor)
        or hessian.dim() != 2
        or hessian.shape[0] != hessian.shape[1]
    ):
        raise ValueError(f"hessian must be square (P, P); got {getattr(hessian, 'shape', hessian)}")
    if not isinstance(mode, Tensor) or mode.shape != (hessian.shape[0],):
        raise ValueError(
            f"mode must be (P,) = ({hessian.shape[0]},); got {getattr(mode, 'shape', mode)}"
        )
    h = hessian.detach().to(_F64)
    eig = torch.linalg.eigvalsh(0.5 * (h + h.T)).clamp_min(0.0)  # (P,)
    theta = mode.detach().to(_F64)
    return LaplaceEvidence(float(log_likelihood), float(theta @ theta), eig)
