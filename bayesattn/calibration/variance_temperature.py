r"""A variance-aware temperature: logits divided by a temperature that grows with a per-example
variance (or novelty) :math:`v(x) \ge 0`, fitted by the NLL on a calibration split.

Two parametrisations of the same family (:math:`b = T^2 a`):

* ``"additive"`` — :math:`z / \sqrt{T^2 + b\,v}` (the density read: :math:`T \to 0` leaves a
  temperature proportional to :math:`\sqrt v`), started from temperature scaling's :math:`T_0`
  and :math:`b = 10^{-2} T_0^2`; falls back to :math:`(T_0, 0)` when the fit is not finite or
  not better than temperature scaling;
* ``"scaled"`` — :math:`z / (T\sqrt{1 + a\,v})` (the GP read's mean-field predictive, the probit
  approximation), started from :math:`T = 1, a = 1`; falls back to :math:`(T_0, 0)` when the fit
  is not finite.

Both minimise the mean cross-entropy by float64 L-BFGS (strong Wolfe line search, 200
iterations) over the logarithms of the two parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor, nn

from .temperature import fit_temperature

__all__ = ["VarianceForm", "fit_variance_temperature", "variance_tempered"]

VarianceForm = Literal["additive", "scaled"]


def variance_tempered(
    logits: Tensor, variance: Tensor, temperature: Tensor | float, scale: Tensor | float,
    form: VarianceForm = "additive",
) -> Tensor:  # fmt: skip
    r"""The tempered logits ``(B, C)``: :math:`z/\sqrt{T^2 + s v}` (``"additive"``) or
    :math:`z/(T\sqrt{1 + s v})` (``"scaled"``), ``variance`` ``(B,)``."""
    if form == "additive":
        return logits / torch.sqrt(temperature**2 + scale * variance).clamp_min(1e-12)[..., None]
    return logits / (temperature * torch.sqrt(1 + scale * variance))[..., None]


def _lbfgs(loss: Callable[[Tensor, Tensor], Tensor], p: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """Minimise ``loss(p, q)`` over the two float64 scalars (L-BFGS, in place)."""
    p.requires_grad_(True)
    q.requires_grad_(True)
    opt = torch.optim.LBFGS([p, q], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        out = loss(p, q)
        out.backward()
        return out

    with torch.enable_grad():
        opt.step(closure)
    return p.detach(), q.detach()


def fit_variance_temperature(
    logits: Tensor, variance: Tensor, labels: Tensor, form: VarianceForm = "additive"
) -> tuple[float, float]:
    r"""``(T, s)`` of :func:`variance_tempered` minimising the NLL (module docstring).

    Shape:
        logits ``(B, C)``, variance ``(B,)``, labels ``(B,)``.
    """
    if form not in ("additive", "scaled"):
        raise ValueError(f"form must be 'additive' or 'scaled'; got {form!r}")
    if (
        not all(isinstance(t, Tensor) for t in (logits, variance, labels))
        or logits.dim() != 2 or variance.shape != logits.shape[:1]
        or labels.shape != logits.shape[:1]
    ):  # fmt: skip
        raise ValueError(
            "logits must be (B, C) with variance and labels (B,); got "
            f"{[tuple(getattr(t, 'shape', ())) for t in (logits, variance, labels)]}"
        )
    z, v, y = logits.double(), variance.double(), labels.long()
    if form == "scaled":
        return _fit_scaled(z, v, y)
    T0 = fit_temperature(z, y)
    base = float(nn.functional.cross_entropy(z / T0, y))
    log_t2 = torch.tensor(2 * math.log(T0), dtype=torch.float64)
    log_b = torch.tensor(math.log(1e-2 * T0**2), dtype=torch.float64)
    log_t2, log_b = _lbfgs(
        lambda a, b: nn.functional.cross_entropy(variance_tempered(z, v, (0.5 * a).exp(), b.exp()), y),
        log_t2, log_b,
    )  # fmt: skip
    T, b = float((0.5 * log_t2).exp()), float(log_b.exp())
    if not (math.isfinite(T) and math.isfinite(b)):
        return T0, 0.0
    nll = float(nn.functional.cross_entropy(variance_tempered(z, v, T, b), y))
    return (T, b) if nll <= base else (T0, 0.0)


def _fit_scaled(z: Tensor, v: Tensor, y: Tensor) -> tuple[float, float]:
    log_t = torch.zeros((), dtype=torch.float64)
    log_a = torch.zeros((), dtype=torch.float64)
    log_t, log_a = _lbfgs(
        lambda a, b: nn.functional.cross_entropy(
            variance_tempered(z, v, a.exp(), b.exp(), "scaled"), y
        ),
        log_t, log_a,
    )  # fmt: skip
    T, a = float(log_t.exp()), float(log_a.exp())
    if not (math.isfinite(T) and math.isfinite(a) and T > 0):  # degenerate: temperature only
        return fit_temperature(z, y), 0.0
    return T, a
