r"""A distance-aware posterior fitted post hoc on a frozen trained model: a random-feature
Gaussian process on the features its classifier reads (the pooled / CLS attention output).

The model (torch or Hugging Face) is not converted: one ordinary forward pass gives its logits
:math:`z(x)` and, through a forward hook on its classification ``head`` module, the features
:math:`h(x)` that head reads. On a calibration split :func:`fit_posthoc_gp` fits a temperature
:math:`T` (as temperature scaling) and a Gaussian posterior over random-feature output weights
(:func:`~bayesattn.functional.gaussian_process.random_fourier_features`, RBF length-scale the median
feature distance), with a Gaussian likelihood of unit noise, so its covariance is the closed form
:math:`\Sigma = (I + \Phi^\top\Phi)^{-1}` (``Phi`` the calibration features). The predictive is

.. math:: \text{logits}_s(x) = z(x)/T + \phi(h(x))^\top L_\Sigma\,\varepsilon_s,\qquad
          \varepsilon_s\sim\mathcal N(0, I_{R\times C}),

one global :math:`\varepsilon_s` per posterior sample shared by every input: near the
calibration features :math:`\phi^\top\Sigma\phi\approx 0` (temperature scaling), far from them
it returns to the prior's :math:`\sigma^2`, so samples disagree (mutual information) where the
model has seen nothing like the input. :math:`\sigma^2` is chosen on half of the calibration
split (the other half giving :math:`\Sigma`) by the predictive NLL, from
``outputscales`` × the mean per-example variance of the tempered logits.

``S`` samples cost one forward pass plus a ``(B, R) @ (R, S·C)`` product
(``benchmarks/posthoc_gp.py`` prints the ratio to one plain forward pass).

:meth:`PosthocGP.probs` is the deterministic **mean-field** predictive (the probit
approximation SNGP uses), a distance-aware temperature:

.. math:: p(x) = \operatorname{softmax}\!\Big(\frac{z(x)}{T_{\rm mf}\sqrt{1 + a\,v(x)}}\Big),

with :math:`v(x)` the GP variance averaged over two covariances, each fitted on one half of the
calibration split, and :math:`(T_{\rm mf}, a\ge 0)` fitted by the NLL on the calibration split
with every example's variance taken *out of fold* (from the half it is not in), so the
calibration inputs look as unseen as test inputs do. :math:`a = 0` is temperature scaling; a
large :math:`a` flattens the predictive where the input is far from the calibration features.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .. import calibration as C
from .._validation import check_int, check_seed
from ..calibration.variance_temperature import fit_variance_temperature, variance_tempered
from ..functional.gaussian_process import random_fourier_features
from ..predictive.foreign import Inputs, default_forward, input_batch_size
from ._checks import check_labels
from .features import extract_features

__all__ = ["PosthocGP", "fit_posthoc_gp"]

Forward = Callable[[nn.Module, Any], Tensor]


def _logits_and_features(
    model: nn.Module, head: nn.Module, x: Inputs, forward: Forward, batch_size: int
) -> tuple[Tensor, Tensor]:
    """``(logits (B, C), features (B, E))`` of one hooked pass (:mod:`bayesattn.posthoc.features`: the input of
    ``head``; posterior-mean attention)."""
    f = extract_features(model, x, head=head, forward=forward, batch_size=batch_size,
                         tokens=False)  # fmt: skip
    return f.logits, f.cls


@dataclass
class PosthocGP:
    """A fitted post-hoc random-feature GP read (see the module docstring)."""

    model: nn.Module | None  # None: fitted on features (bayesattn.posthoc.GPRead)
    head: nn.Module | None
    forward: Forward | None
    temperature: float
    rff_weight: Tensor  # (R, E)
    rff_phase: Tensor  # (R,)
    lengthscale: float
    outputscale: float
    scale_tril: Tensor  # (R, R): L_Σ
    batch_size: int = 4096
    mf_temperature: float = 1.0  # T_mf
    mf_scale: float = 0.0  # a ≥ 0
    half_tril: Tensor | None = None  # (R, R): L with LLᵀ = (Σ_a + Σ_b)/2, Σ of each half
    #: KL(N(0, Σ) ‖ N(0, I)) of one output column, nats (float64, at the fit)
    column_kl: float = 0.0

    def features(self, h: Tensor) -> Tensor:
        """:math:`\\phi(h)` ``(B, R)``."""
        return random_fourier_features(
            h.to(self.rff_weight.dtype), self.rff_weight, self.rff_phase,
            torch.tensor(self.lengthscale), torch.tensor(self.outputscale),
        )  # fmt: skip

    def variance_of(self, h: Tensor) -> Tensor:
        r"""Posterior variance :math:`\phi^\top\Sigma\phi` ``(B,)`` of features ``h (B, E)``."""
        a = self.features(h) @ self.scale_tril  # (B, R)
        return (a * a).sum(-1)

    def half_variance(self, phi: Tensor) -> Tensor:
        r""":math:`v = \tfrac12(\phi^\top\Sigma_a\phi + \phi^\top\Sigma_b\phi)` ``(B,)``: the
        GP variance averaged over the covariances fitted on each half of the calibration split
        (the full covariance where there are none), from features ``phi (B, R)``; one
        ``(B, R) @ (R, R)`` product through the Cholesky factor of the averaged covariance."""
        tril = self.half_tril if self.half_tril is not None else self.scale_tril
        if not isinstance(phi, Tensor) or phi.dim() != 2 or phi.shape[-1] != tril.shape[0]:
            shape = tuple(phi.shape) if isinstance(phi, Tensor) else type(phi).__name__
            raise ValueError(
                f"phi must be the read's features (B, {tril.shape[0]}) from features(h); "
                f"got {shape}"
            )
        if not bool(torch.isfinite(phi).all()):
            raise ValueError("phi must be finite; got NaN or Inf features")
        a = phi.to(tril.dtype) @ tril  # (B, R)
        return (a * a).sum(-1)

    def mean_field_of(self, z: Tensor, h: Tensor) -> Tensor:
        """The mean-field predictive ``(B, C)`` of logits ``z (B, C)`` and features ``h``."""
        v = self.half_variance(self.features(h)).to(z.dtype)  # (B,)
        return torch.softmax(_mean_field(z, v, self.mf_temperature, self.mf_scale), -1)

    def samples_of(self, z: Tensor, h: Tensor, num_samples: int, seed: int | None) -> Tensor:
        """``(S, B, C)`` posterior-predictive draws of logits ``z`` and features ``h``."""
        check_int("num_samples", num_samples, 1)
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        R, Cn = self.scale_tril.shape[0], z.shape[-1]
        eps = torch.randn(num_samples, R, Cn, generator=g, dtype=self.scale_tril.dtype)
        beta = (self.scale_tril @ eps).to(z.dtype)  # (S, R, C): one global draw per sample
        delta = torch.matmul(self.features(h).to(z.dtype), beta)  # (S, B, C)
        return torch.softmax(z / self.temperature + delta, -1)

    def _pass(self, x: Inputs) -> tuple[Tensor, Tensor]:
        if self.model is None or self.head is None:
            raise TypeError("this read was fitted on features: call it on features, not inputs")
        fwd = self.forward or default_forward
        return _logits_and_features(self.model, self.head, x, fwd, self.batch_size)

    def variance(self, x: Inputs) -> Tensor:
        r"""Posterior variance :math:`\phi^\top\Sigma\phi` of every logit, ``(B,)``."""
        return self.variance_of(self._pass(x)[1])

    @torch.no_grad()
    def probs(self, x: Inputs) -> Tensor:
        """The mean-field predictive ``(B, C)`` in one forward pass (module docstring)."""
        return self.mean_field_of(*self._pass(x))

    @torch.no_grad()
    def sample_probs(self, x: Inputs, num_samples: int = 32, seed: int | None = None) -> Tensor:
        """``(S, B, C)`` posterior-predictive probabilities in one forward pass of the model."""
        check_int("num_samples", num_samples, 1)
        return self.samples_of(*self._pass(x), num_samples, seed)


def _covariance_tril(phi: Tensor) -> Tensor:
    """:math:`L` with :math:`LL^\\top = (I + \\Phi^\\top\\Phi)^{-1}` ``(R, R)``."""
    eye = torch.eye(phi.shape[-1], dtype=phi.dtype)
    cov = torch.cholesky_inverse(torch.linalg.cholesky(eye + phi.T @ phi))
    return torch.linalg.cholesky(cov)


def _mean_field(z: Tensor, v: Tensor, temperature: Any, scale: Any) -> Tensor:
    r""":math:`z / (T\sqrt{1 + a v})` ``(B, C)`` from logits ``(B, C)`` and variances ``(B,)``."""
    return variance_tempered(z, v, temperature, scale, "scaled")


def _fit_mean_field(z: Tensor, v: Tensor, y: Tensor) -> tuple[float, float]:
    """``(T_mf, a)`` minimising the NLL of :func:`_mean_field`
    (:func:`~bayesattn.calibration.fit_variance_temperature`, ``form="scaled"``)."""
    return fit_variance_temperature(z, v, y, "scaled")


def check_outputscales(outputscales: Any) -> tuple[float, ...]:
    """A non-empty sequence of finite positive numbers."""
    if isinstance(outputscales, (str, bytes, Tensor)) or not isinstance(outputscales, Sequence):
        raise TypeError(f"outputscales must be a sequence of numbers; got {outputscales!r}")
    ok = all(
        isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s > 0
        for s in outputscales
    )
    if not outputscales or not ok:
        raise ValueError(
            f"outputscales must be a non-empty sequence of finite numbers > 0; got "
            f"{tuple(outputscales)!r}"
        )
    return tuple(float(s) for s in outputscales)


def _nll(probs: Tensor, y: Tensor) -> float:
    return C.negative_log_likelihood(probs.mean(0), y)


def _check_model_and_head(model: Any, head: Any) -> None:
    """``model`` an ``nn.Module`` and ``head`` one of its modules."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
    if not isinstance(head, nn.Module):
        raise TypeError(f"head must be the model's classification nn.Module; got {head!r}")
    if not any(m is head for m in model.modules()):
        raise ValueError(
            f"head ({type(head).__name__}) is not a module of the model: pass the model's own "
            "classification module (e.g. model.head, model.classifier)"
        )


def _random_feature_draws(num_features: int, dim: int, seed: int) -> tuple[Tensor, Tensor]:
    """The random features' weights ``W (R, E)`` ~ N(0, 1) and phases ``b (R,)`` ~ U(0, 2π),
    float64, from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(num_features, dim, generator=g, dtype=torch.float64)
    b = 2 * math.pi * torch.rand(num_features, generator=g, dtype=torch.float64)
    return W, b


def _median_lengthscale(h: Tensor) -> float:
    """The RBF length-scale: the median distance between the first 512 features ``(N, E)``
    (1 with fewer than two, or when they are identical)."""
    pts = h[:512]
    d = torch.cdist(pts, pts)
    ls = float(d[~torch.eye(len(pts), dtype=torch.bool)].median()) if len(pts) > 1 else 1.0
    if not (math.isfinite(ls) and ls > 0):  # identical (e.g. all-zero) features: unit scale
        ls = 1.0
    return ls


def _choose_outputscale(
    make: Callable[[float, Tensor], PosthocGP],
    scales: tuple[float, ...],
    z: Tensor,
    h: Tensor,
    y: Tensor,
    halves: tuple[Tensor, Tensor],
    seed: int,
) -> float:
    """The candidate scale whose read, fitted on the first half of the split
    (``make(scale, rows)``), has the lowest predictive NLL on the second half; the first
    candidate when there is one, or no second half."""
    fit_half, check_half = halves
    best, best_nll = scales[0], math.inf
    if len(check_half) > 0 and len(scales) > 1:
        for s in scales:
            read = make(s, fit_half)
            p = _predict(read, z[check_half], h[check_half], 64, seed)
            nll = _nll(p, y[check_half])
            if nll < best_nll:
                best, best_nll = s, nll
    return best


def _out_of_fold_mean_field(
    phi: Tensor, z: Tensor, y: Tensor, halves: tuple[Tensor, Tensor]
) -> tuple[Tensor, float, float]:
    """``(half_tril, T_mf, a)``: the Cholesky factor of the two halves' averaged covariance and
    the mean-field predictive fitted on every example's variance from the half it is not in
    (features ``phi (N, R)``)."""
    trils = torch.stack([_covariance_tril(phi[rows]) for rows in halves])  # (2, R, R)
    v = torch.empty(len(phi), dtype=torch.float64)
    for rows, other in zip(halves, (trils[1], trils[0]), strict=True):
        a = phi[rows] @ other
        v[rows] = (a * a).sum(-1)
    cov = trils @ trils.transpose(-1, -2)  # (2, R, R)
    half_tril = torch.linalg.cholesky(cov.mean(0))
    return (half_tril, *_fit_mean_field(z, v, y))


def _to_precision(read: PosthocGP, dtype: torch.dtype) -> None:
    """The read's random features and Cholesky factors in ``dtype`` (sampling in the model's
    precision is cheap)."""
    read.rff_weight, read.rff_phase = read.rff_weight.to(dtype), read.rff_phase.to(dtype)
    read.scale_tril = read.scale_tril.to(dtype)
    if read.half_tril is not None:
        read.half_tril = read.half_tril.to(dtype)


def fit_posthoc_gp(
    model: nn.Module,
    x_cal: Inputs,
    y_cal: Tensor,
    head: nn.Module,
    *,
    forward: Forward | None = None,
    num_features: int = 256,
    outputscales: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0),
    seed: int = 0,
    batch_size: int = 4096,
) -> PosthocGP:
    r"""Fit the post-hoc GP read of ``model`` (frozen, unchanged) on a calibration split:
    the temperature, the output scale and covariance of the sampled read, and the mean-field
    predictive's :math:`(T_{\rm mf}, a)` on out-of-fold variances (module docstring); with fewer
    than two calibration examples the mean-field predictive is temperature scaling.

    Args:
        head: the module whose input are the features (``model.head``; a transformers
            classifier's ``model.classifier``).
        forward: ``forward(model, x)`` → logits ``(B, C)`` (default ``model(x)``/``model(**x)``).
        num_features: ``R`` random features.
        outputscales: candidate prior variances, in units of the mean per-example variance of
            the tempered logits; the one with the lowest NLL on the second half of the split.
    """
    check_int("num_features", num_features, 1)
    check_int("batch_size", batch_size, 1)
    check_seed(seed)
    fwd = forward or default_forward
    _check_model_and_head(model, head)
    scales = check_outputscales(outputscales)
    n = input_batch_size(x_cal)
    if n == 0:
        raise ValueError("the calibration split is empty (x_cal holds 0 examples)")
    check_labels("y_cal", y_cal, n)
    z, h = _logits_and_features(model, head, x_cal, fwd, batch_size)
    return fit_gp_features(z, h, y_cal, num_features, scales, seed, batch_size, (model, head, fwd))


def fit_gp_features(
    z: Tensor, h: Tensor, y_cal: Tensor, num_features: int, scales: tuple[float, ...],
    seed: int, batch_size: int = 4096,
    source: tuple[nn.Module | None, nn.Module | None, Forward | None] = (None, None, None),
) -> PosthocGP:  # fmt: skip
    """:func:`fit_posthoc_gp` on logits ``z (N, C)`` and features ``h (N, E)`` of the split."""
    y_cal = check_labels("y_cal", y_cal, len(z), z.shape[-1])
    y_cal = y_cal.to(device=z.device, dtype=torch.long)
    T = C.fit_temperature(z, y_cal)
    h64 = h.double()
    W, b = _random_feature_draws(num_features, h.shape[-1], seed)
    ls = _median_lengthscale(h64)
    unit = float((z.double() / T).var(-1).mean())
    halves = torch.arange(0, len(h), 2), torch.arange(1, len(h), 2)

    def make(scale: float, rows: Tensor) -> PosthocGP:
        read = PosthocGP(*source, T, W, b, ls, scale * unit, torch.eye(1), batch_size)
        read.scale_tril = _covariance_tril(read.features(h64[rows]))
        return read

    best = _choose_outputscale(make, scales, z, h64, y_cal, halves, seed)
    read = make(best, torch.arange(len(h)))
    if len(halves[1]) > 0:  # the mean-field predictive, on out-of-fold variances
        read.half_tril, read.mf_temperature, read.mf_scale = _out_of_fold_mean_field(
            read.features(h64), z, y_cal, halves
        )
    else:
        read.mf_temperature = T
    read.column_kl = _column_kl(read.scale_tril)
    _to_precision(read, z.dtype if z.is_floating_point() else torch.float32)
    return read


def _column_kl(tril: Tensor) -> float:
    r""":math:`\tfrac12(\operatorname{tr}\Sigma - R - \log|\Sigma|)` of :math:`\Sigma = LL^\top`
    ``(R, R)`` against :math:`I` (float64)."""
    tril = tril.double()
    logdet = 2 * float(torch.log(torch.diagonal(tril)).sum())
    return 0.5 * (float((tril * tril).sum()) - tril.shape[0] - logdet)


def _predict(read: PosthocGP, z: Tensor, h: Tensor, S: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    eps = torch.randn(S, read.scale_tril.shape[0], z.shape[-1], generator=g, dtype=torch.float64)
    delta = torch.matmul(read.features(h) @ read.scale_tril, eps)  # (S, B, C)
    return torch.softmax(z.double() / read.temperature + delta, -1)
