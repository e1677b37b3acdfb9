"""Far-OOD sanity sets and 1-D corruptions, for inputs of any shape ``(N, *F)`` in the scale of
the in-distribution data.

* ``uniform``: uniform noise over the data's value range ``[min(x), max(x)]``;
* ``inverted``: ``min(x) + max(x) − x`` (black ↔ white for images, a sign flip for centred
  signals);
* ``permuted``: each example's features shuffled by its own seeded permutation (same values,
  no structure).

A detector that cannot flag these is broken; they are not a benchmark. The harder far set,
chosen before any result was seen (issue 28), is

* ``moments`` (:func:`moment_matched`): class-conditional Gaussians with the training classes'
  means and covariances, drawn in the training classes' proportions and clipped to the data's
  range: the first two moments of every class are right, nothing beyond them is.

Every draw comes from a ``torch.Generator`` seeded with ``seed``."""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from .._validation import check_float_tensor, check_int, check_seed, torch_generator

__all__ = ["FAR_OOD_KINDS", "far_ood_suite", "moment_matched", "SEQUENCE_CORRUPTIONS",
           "corrupt_sequences"]  # fmt: skip

FarOODKind = Literal["uniform", "inverted", "permuted"]
FAR_OOD_KINDS: tuple[FarOODKind, ...] = get_args(FarOODKind)


def far_ood_suite(
    x: Tensor, seed: int = 0, train: tuple[Tensor, Tensor] | None = None
) -> dict[str, Tensor]:
    """``{kind: (N, *F)}`` for every kind of :data:`FAR_OOD_KINDS`, made from ``x``; with
    ``train = (x_train, y_train)`` also ``moments`` (:func:`moment_matched`, ``N`` draws).

    Shape:
        x ``(N, *F)`` floating point, ``N >= 1``; x_train ``(M, *F)``, y_train ``(M,)``.
    """
    x = check_float_tensor("x", x, 2)
    if x.shape[0] == 0:
        raise ValueError(f"x must hold at least one example; got shape {tuple(x.shape)}")
    g = torch_generator(check_seed(seed))
    lo, hi = float(x.min()), float(x.max())
    n = x.shape[0]
    flat = x.reshape(n, -1)  # (N, D)
    uniform = lo + (hi - lo) * torch.rand(x.shape, generator=g, dtype=x.dtype)
    perm = torch.argsort(torch.rand(flat.shape, generator=g), dim=1)  # (N, D) one per example
    permuted = flat.gather(1, perm).reshape(x.shape)
    out = {"uniform": uniform, "inverted": lo + hi - x, "permuted": permuted}
    if train is not None:
        out["moments"] = moment_matched(train[0], train[1], n, seed).clamp(lo, hi).to(x.dtype)
    return out


def moment_matched(x: Tensor, y: Tensor, n: int, seed: int = 0, ridge: float = 1e-3) -> Tensor:
    r"""``n`` draws from class-conditional Gaussians fitted to ``(x, y)``: class :math:`c` with
    probability :math:`N_c / N`, then :math:`\mathcal N(\mu_c, \Sigma_c + r I)` with the class's
    mean and (maximum-likelihood) covariance of the flattened inputs and
    :math:`r = \text{ridge} \cdot \operatorname{tr}\Sigma_c / D` (a class with one example
    has :math:`\Sigma_c = 0`: its draws are its mean plus the ridge), clipped to
    ``[min(x), max(x)]``.

    Shape:
        x ``(M, *F)`` floating point, y ``(M,)`` ints → ``(n, *F)``.
    """
    x = check_float_tensor("x", x, 2)
    y = torch.as_tensor(y)
    if y.shape != (x.shape[0],) or y.is_floating_point() or not len(y):
        raise ValueError(f"y must be (M,) = ({x.shape[0]},) integer labels; got {tuple(y.shape)}")
    n = check_int("n", n, 1)
    g = torch_generator(check_seed(seed))
    flat = x.reshape(len(x), -1).double()  # (M, D)
    classes, counts = torch.unique(y, return_counts=True)
    which = torch.multinomial(counts.double(), n, replacement=True, generator=g)  # (n,)
    out = torch.empty(n, flat.shape[1], dtype=torch.float64)
    for i, c in enumerate(classes):
        z = flat[y == c]  # (N_c, D)
        mu = z.mean(0)
        cov = (z - mu).T @ (z - mu) / len(z)  # (D, D)
        eye = torch.eye(len(mu), dtype=torch.float64)
        cov = cov + ridge * max(float(cov.diagonal().mean()), 1e-12) * eye
        sel = which == i
        eps = torch.randn(int(sel.sum()), len(mu), generator=g, dtype=torch.float64)
        out[sel] = mu + eps @ torch.linalg.cholesky(cov).T
    lo, hi = float(x.min()), float(x.max())
    return out.clamp(lo, hi).reshape(n, *x.shape[1:]).to(x.dtype)


SequenceCorruption = Literal["noise", "occlusion", "shift"]
SEQUENCE_CORRUPTIONS: tuple[SequenceCorruption, ...] = get_args(SequenceCorruption)
_SEQ_NOISE = (0.1, 0.2, 0.4, 0.6, 0.8)  # × the data's sd (1 for MNIST-1D)
_SEQ_OCCLUDE = (0.1, 0.2, 0.3, 0.4, 0.5)  # fraction of the steps zeroed
_SEQ_SHIFT = (0.05, 0.1, 0.15, 0.2, 0.25)  # fraction of the length, circular


def corrupt_sequences(x: Tensor, kind: SequenceCorruption, severity: int, seed: int = 0) -> Tensor:
    """A corrupted copy of sequences ``x`` at ``severity`` 1..5: ``noise`` adds Gaussian noise
    of sd ``(0.1, 0.2, 0.4, 0.6, 0.8)``; ``occlusion`` zeroes a window of ``(10 … 50)%`` of the
    steps at a random place; ``shift`` rolls each sequence by ``(5 … 25)%`` of its length in a
    random direction. Draws do not depend on the severity (common random numbers).

    Shape:
        x ``(N, T)`` → ``(N, T)``.
    """
    x = check_float_tensor("x", x, ndim=2)
    if kind not in SEQUENCE_CORRUPTIONS:
        raise ValueError(f"kind must be one of {SEQUENCE_CORRUPTIONS}, got {kind!r}")
    severity = check_int("severity", severity, 1, 5)
    g = torch_generator(check_seed(seed))
    n, t = x.shape
    if kind == "noise":
        return x + _SEQ_NOISE[severity - 1] * torch.randn(x.shape, generator=g, dtype=x.dtype)
    u = torch.rand(n, generator=g)  # (N,)
    if kind == "occlusion":
        width = max(1, round(_SEQ_OCCLUDE[severity - 1] * t))
        start = torch.floor(u * (t - width + 1)).long()  # (N,)
        steps = torch.arange(t)
        mask = (steps >= start[:, None]) & (steps < start[:, None] + width)  # (N, T)
        return x.masked_fill(mask, 0.0)
    by = max(1, round(_SEQ_SHIFT[severity - 1] * t))
    sign = torch.where(u < 0.5, -1, 1)  # (N,)
    idx = (torch.arange(t)[None, :] - sign[:, None] * by) % t  # (N, T)
    return x.gather(1, idx)
