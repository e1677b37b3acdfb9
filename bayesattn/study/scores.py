r"""Post-hoc feature-space OOD scores on a trained network's pooled features (no retraining);
higher means more out-of-distribution.

* **kNN distance** (Sun et al., 2022): features normalised to unit length,
  :math:`s(x) = \lVert \hat z(x) - \hat z_{(k)} \rVert` with :math:`\hat z_{(k)}` the
  :math:`k`-th nearest normalised training feature.
* **Relative Mahalanobis distance** (Ren et al., 2021): class means :math:`\mu_c`, a shared
  covariance :math:`\Sigma`, a background Gaussian :math:`(\mu_0, \Sigma_0)` over all training
  features; :math:`s(x) = \min_c [\mathrm{MD}(z; \mu_c, \Sigma) - \mathrm{MD}(z; \mu_0,
  \Sigma_0)]` with :math:`\mathrm{MD}(z;\mu,\Sigma) = (z-\mu)^\top\Sigma^{-1}(z-\mu)`.

:func:`choose_k` picks ``k`` on in-distribution validation data only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import calibration as C

__all__ = ["knn_distance", "choose_k", "Mahalanobis", "fit_mahalanobis"]


def _check_features(name: str, z: Tensor) -> Tensor:
    if not isinstance(z, Tensor) or z.dim() != 2 or not z.is_floating_point() or not len(z):
        raise ValueError(
            f"{name} must be non-empty float features (N, D); got {getattr(z, 'shape', z)!r}"
        )
    return z.double()


def knn_distance(train: Tensor, z: Tensor, k: int, exclude_self: bool = False) -> Tensor:
    """Distance from each unit-normalised row of ``z`` to its ``k``-th nearest unit-normalised
    row of ``train`` (``exclude_self``: ``z`` is ``train`` and a row is not its own neighbour).

    Shape:
        train ``(N, D)``, z ``(B, D)`` → ``(B,)`` float64.
    """
    tr = torch.nn.functional.normalize(_check_features("train", train), dim=1)  # (N, D)
    zz = torch.nn.functional.normalize(_check_features("z", z), dim=1)  # (B, D)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(tr) - exclude_self:
        raise ValueError(f"k must be an int in 1..{len(tr) - exclude_self}; got {k!r}")
    out = []
    for i in range(0, len(zz), 1024):
        d = torch.cdist(zz[i : i + 1024], tr)  # (b, N)
        if exclude_self:
            d[torch.arange(len(d)), torch.arange(i, i + len(d))] = float("inf")
        out.append(d.kthvalue(k, dim=1).values)
    return torch.cat(out)


def choose_k(
    train: Tensor, val: Tensor, val_correct: Tensor, ks: Sequence[int]
) -> tuple[int, dict[int, float]]:
    """The ``k`` whose kNN distance best flags the network's **misclassified validation
    examples** (AUROC of errors vs correct ones; ties → the smaller ``k``): a criterion on
    in-distribution validation data only. Without an error on validation, the median ``k``.

    Shape:
        train ``(N, D)``, val ``(V, D)``, val_correct ``(V,)`` bool → (k, {k: AUROC}).
    """
    ks = sorted({k for k in ks if k <= len(train)})
    if not ks:
        raise ValueError(f"no k in {list(ks)} is <= the {len(train)} training rows")
    ok = torch.as_tensor(val_correct, dtype=torch.bool)
    if bool(ok.all()) or not bool(ok.any()):
        return ks[len(ks) // 2], {}
    scores = {k: C.ood_auroc(knn_distance(train, val[ok], k), knn_distance(train, val[~ok], k))
              for k in ks}  # fmt: skip
    best = max(ks, key=lambda k: (scores[k], -k))
    return best, scores


@dataclass(frozen=True)
class Mahalanobis:
    """Fitted relative-Mahalanobis parameters (float64): class means ``(C, D)``, the shared
    precision ``(D, D)``, the background mean ``(D,)`` and precision ``(D, D)``."""

    means: Tensor
    precision: Tensor
    mean0: Tensor
    precision0: Tensor

    def distances(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Class distances ``MD_c(z)`` ``(B, C)`` and background distance ``MD_0(z)`` ``(B,)``."""
        z = _check_features("z", z)
        d = z[:, None, :] - self.means[None]  # (B, C, D)
        md = torch.einsum("bcd,de,bce->bc", d, self.precision, d)
        d0 = z - self.mean0  # (B, D)
        md0 = torch.einsum("bd,de,be->b", d0, self.precision0, d0)
        return md, md0

    def score(self, z: Tensor) -> Tensor:
        """Relative Mahalanobis OOD score ``min_c (MD_c − MD_0)``. Shape ``(B,)``."""
        md, md0 = self.distances(z)
        return (md - md0[:, None]).min(dim=1).values


def fit_mahalanobis(
    train: Tensor, labels: Tensor, num_classes: int, ridge: float = 1e-6
) -> Mahalanobis:
    """Maximum-likelihood class means, shared covariance ``Σ = (1/N) Σ_i (z_i − μ_{y_i})(…)ᵀ``
    and background ``Σ_0 = (1/N) Σ_i (z_i − μ_0)(…)ᵀ``, each plus ``ridge · tr(Σ)/D · I``.

    Shape:
        train ``(N, D)``, labels ``(N,)`` in ``0..num_classes-1``.
    """
    z = _check_features("train", train)
    y = torch.as_tensor(labels).long()
    if y.shape != (len(z),) or int(y.min()) < 0 or int(y.max()) >= num_classes:
        raise ValueError(f"labels must be (N,) = ({len(z)},) in [0, {num_classes}); got {y.shape}")
    if bool((torch.bincount(y, minlength=num_classes) == 0).any()):
        raise ValueError("every class needs at least one training feature")
    means = torch.stack([z[y == c].mean(0) for c in range(num_classes)])  # (C, D)

    def precision(centred: Tensor) -> Tensor:
        cov = centred.T @ centred / len(centred)  # (D, D)
        cov = cov + ridge * cov.diagonal().mean() * torch.eye(cov.shape[0], dtype=cov.dtype)
        return torch.linalg.inv(cov)

    mean0 = z.mean(0)
    return Mahalanobis(means, precision(z - means[y]), mean0, precision(z - mean0))
