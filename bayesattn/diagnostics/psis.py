r"""PSIS :math:`\hat k` of a variational fit (Yao et al. 2018, "Yes, but did it work?").

With :math:`\log w_s = \log p(x, \theta_s) - \log q(\theta_s)`, :math:`\theta_s\sim q`, the
Pareto shape :math:`\hat k` of the weights' upper tail reads :math:`\hat k < 0.5` good,
:math:`0.5`-:math:`0.7` ok, :math:`> 0.7` unreliable. One implementation: :func:`psis_smooth`
(the tail fit is Pyro's ``pyro.ops.stats.fit_generalized_pareto``; the smoothing follows
Vehtari et al. 2024), used by :func:`psis_diagnostic`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.ops.stats import fit_generalized_pareto
from torch import Tensor

from .._validation import check_int, seeded
from ..predictive.trace import max_plate_nesting, per_draw

__all__ = ["KHAT_INTERPRETATIONS", "interpret_khat", "psis_smooth", "PSISResult", "psis_diagnostic"]


#: interpretation labels of :func:`interpret_khat`, best first
KHAT_INTERPRETATIONS = ("good", "ok", "unreliable")


def interpret_khat(khat: float) -> str:
    r"""Yao et al. (2018): :math:`\hat k < 0.5` ``"good"``, :math:`0.5 \le \hat k \le 0.7`
    ``"ok"``, :math:`\hat k > 0.7` (or NaN) ``"unreliable"``."""
    k = float(khat)
    if k < 0.5:
        return "good"
    if k <= 0.7:
        return "ok"
    return "unreliable"


def _fit_gpd(exceedances: np.ndarray) -> tuple[float, float]:
    """Generalized-Pareto ``(k, sigma)`` of sorted positive exceedances, by Pyro's
    ``fit_generalized_pareto`` (Zhang & Stephens 2009, shrunk towards ``k = 0.5``)."""
    return fit_generalized_pareto(torch.from_numpy(np.ascontiguousarray(exceedances, float)))


def _gpinv(p: np.ndarray, k: float, sigma: float) -> np.ndarray:
    """Quantile function of the generalized Pareto distribution (``0 < p < 1``)."""
    if not sigma > 0:
        return np.full_like(p, np.nan)
    if abs(k) < np.finfo(float).eps:
        return -sigma * np.log1p(-p)
    return sigma * np.expm1(-k * np.log1p(-p)) / k


def psis_smooth(log_weights: Any, reff: float = 1.0) -> tuple[np.ndarray, float]:
    r"""Pareto-smoothed importance sampling of one vector of log weights (Vehtari et al. 2024).

    The largest :math:`M = \lceil\min(S/5,\ 3\sqrt{S/r_{\text{eff}}})\rceil` weights are replaced
    by the expected order statistics of a generalized Pareto distribution fitted to them
    (:math:`p(w) \propto (1 + k (w-\mu)/\sigma)^{-1/k-1}`), truncated at the largest raw weight;
    :math:`\hat k` is the fitted shape. The tail fit is Pyro's
    ``pyro.ops.stats.fit_generalized_pareto`` (Zhang & Stephens 2009 with the weak prior on
    :math:`k` of Vehtari et al.), so :math:`\hat k` does not depend on which ArviZ is installed;
    the result agrees with ``arviz.psislw`` of arviz 0.x to rounding. The one PSIS of the library:
    :func:`psis_diagnostic` uses it too.

    Returns ``(smoothed log weights normalised to logsumexp 0, k̂)``; ``k̂ = inf`` when the tail
    has fewer than 5 draws, ``-inf`` when all weights are equal (q is exact to rounding).

    Shape:
        ``(S,)`` → ``((S,), scalar)``.
    """
    if isinstance(reff, bool) or not isinstance(reff, (int, float)):
        raise TypeError(f"reff must be a float > 0; got {reff!r}")
    if not (math.isfinite(reff) and reff > 0):
        raise ValueError(
            f"reff (relative efficiency of the draws) must be finite and > 0; got {reff!r}"
        )
    if isinstance(log_weights, (str, bytes)):
        raise TypeError(f"log_weights must be an array of floats; got {type(log_weights).__name__}")
    try:
        x = np.array(log_weights, dtype=float).reshape(-1)
    except (TypeError, ValueError) as e:
        raise TypeError(f"log_weights must be an array of floats ({e})") from e
    n = x.size
    if n < 2:
        raise ValueError(f"need at least 2 log weights; got {n}")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("log weights must not contain NaN or +inf")
    if np.isneginf(x).all():
        raise ValueError("every log weight is -inf (no draw has positive weight)")
    x -= x.max()
    if np.all(x == 0.0):
        return x - math.log(n), float("-inf")
    cutoff_ind = -int(np.ceil(min(n / 5.0, 3 * (n / reff) ** 0.5))) - 1
    order = np.argsort(x)
    xcutoff = max(x[order[cutoff_ind]], np.log(np.finfo(float).tiny))
    expcut = np.exp(xcutoff)
    (tail_idx,) = np.where(x > xcutoff)
    tail = x[tail_idx]
    if len(tail) <= 4:
        k = float("inf")
    else:
        tail_order = np.argsort(tail)
        exceed = np.exp(tail[tail_order]) - expcut
        k, sigma = _fit_gpd(exceed)
        if np.isfinite(k):
            probs = np.arange(0.5, len(tail)) / len(tail)
            smoothed = np.log(_gpinv(probs, k, sigma) + expcut)
            x[tail_idx[tail_order]] = smoothed
            x[x > 0] = 0.0
    m = x.max()
    x -= m + np.log(np.exp(x - m).sum())
    return x, float(k)


@dataclass
class PSISResult:
    r"""PSIS diagnostic of a variational guide.

    ``khat``: Pareto shape :math:`\hat k`; ``interpretation``: ``"good"``/``"ok"``/
    ``"unreliable"`` (:func:`interpret_khat`); ``log_weights``: raw
    :math:`\log p(x,\theta_s) - \log q(\theta_s)`, ``(S,)``; ``smoothed_log_weights``: normalised
    PSIS weights, ``(S,)``; ``ess``: importance-sampling effective sample size
    :math:`1/\sum_s \tilde w_s^2` of the smoothed weights.
    """

    khat: float
    interpretation: str
    log_weights: np.ndarray
    smoothed_log_weights: np.ndarray = field(repr=False)
    ess: float = float("nan")

    @property
    def elbo(self) -> float:
        r"""Monte-Carlo ELBO :math:`\frac1S\sum_s\log w_s`."""
        return float(np.mean(self.log_weights))


def _log_prob_per_draw(tr: Any, num: int, dim: int) -> Tensor:
    """Per-draw sum of every sample site's (scaled, masked) log-density: ``(num,)``."""
    tr.compute_log_prob()
    total = torch.zeros(num, dtype=torch.float64)
    for site in tr.nodes.values():
        if site["type"] == "sample":
            lp = site["log_prob"]
            if not isinstance(lp, Tensor):
                lp = torch.as_tensor(lp)
            total = total + per_draw(lp.to(torch.float64), num, dim).sum(1)
    return total


def _draw_log_densities(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    S: int,
    vectorize: bool,
) -> tuple[Tensor, Tensor, torch.dtype | None]:
    """``(log p (S,), log q (S,), dtype)`` of ``S`` guide draws, the model replayed on each: all
    in one pass under an outer plate (``vectorize``) or one draw at a time; ``dtype`` is that of
    the model's log density (``None`` if not a tensor)."""
    gtr = poutine.trace(guide).get_trace(*args, **kwargs)
    mtr = poutine.trace(poutine.replay(model, trace=gtr)).get_trace(*args, **kwargs)
    if vectorize:
        dim = -(max_plate_nesting(gtr, mtr) + 1)
        with pyro.plate("_bayesattn_psis", S, dim=dim):
            gtr = poutine.trace(guide).get_trace(*args, **kwargs)
            mtr = poutine.trace(poutine.replay(model, trace=gtr)).get_trace(*args, **kwargs)
        logp, logq = _log_prob_per_draw(mtr, S, dim), _log_prob_per_draw(gtr, S, dim)
    else:
        max_plate_nesting(gtr, mtr)  # rejects enumerated sites
        lps = [(mtr.log_prob_sum(), gtr.log_prob_sum())]
        for _ in range(S - 1):
            g = poutine.trace(guide).get_trace(*args, **kwargs)
            m = poutine.trace(poutine.replay(model, trace=g)).get_trace(*args, **kwargs)
            lps.append((m.log_prob_sum(), g.log_prob_sum()))
        logp = torch.tensor([float(a) for a, _ in lps], dtype=torch.float64)
        logq = torch.tensor([float(b) for _, b in lps], dtype=torch.float64)
    lp_sum = mtr.log_prob_sum()
    return logp, logq, lp_sum.dtype if isinstance(lp_sum, Tensor) else None


def _weights_equal_to_rounding(
    lw: np.ndarray, logp: Tensor, logq: Tensor, dtype: torch.dtype | None
) -> bool:
    """Whether the log weights agree to 1000 ulps of the log densities' size: then q is the
    posterior and the "tail" would be rounding noise (ArviZ reports k = inf for ties)."""
    eps = torch.finfo(dtype if dtype is not None and dtype.is_floating_point else torch.float64).eps
    scale = 1.0 + float(logp.abs().mean() + logq.abs().mean())
    return bool(np.isfinite(lw).all()) and float(np.ptp(lw)) <= 1e3 * eps * scale


def psis_diagnostic(
    model: Callable[..., Any],
    guide: Callable[..., Any],
    *args: Any,
    num_samples: int = 1000,
    vectorize: bool = False,
    seed: int | None = None,
    **kwargs: Any,
) -> PSISResult:
    r"""Pareto :math:`\hat k` of the importance weights of a guide (Yao et al. 2018).

    .. math::

        \log w_s = \log p(x, \theta_s) - \log q(\theta_s), \qquad \theta_s \sim q,

    with :math:`\log q` from the guide's trace and :math:`\log p` from the model replayed on it
    (``trace.log_prob_sum()``, which **includes** Pyro scales: for a subsampled model the weight is
    that of the scaled joint, as in the ELBO). The tail of :math:`w` is fitted by
    :func:`psis_smooth` (Pyro's generalized-Pareto fit, whatever ArviZ is installed).

    Interpretation (:func:`interpret_khat`): :math:`\hat k < 0.5` good, :math:`0.5`–:math:`0.7`
    ok, :math:`> 0.7` unreliable (the guide is too narrow or misplaced; variational estimates and
    the ELBO are untrustworthy). Unlike ESS/R-hat of i.i.d. guide draws, this measures the fit.
    When all :math:`\log w_s` agree to rounding (within :math:`10^3\,\epsilon` of the log
    densities' size) the guide *is* the posterior: :math:`\hat k = -\infty` ("good"), where a
    tail fit of rounding noise would give ArviZ's :math:`+\infty` for ties.

    Args:
        model, guide: Pyro callables taking ``*args, **kwargs``; discrete latents must not be
            enumerated (marginalise them in the model).
        num_samples: draws ``S`` (>= 2; ~1000 for a stable :math:`\hat k`).
        vectorize: draw all ``S`` in one pass under an outer plate (the model must broadcast
            over a leading batch dim); default loops.
        seed: run under a forked torch RNG seeded with ``seed``.

    Shape:
        ``log_weights`` ``(S,)``.
    """
    check_int("num_samples", num_samples, 1)
    if num_samples < 2:
        raise ValueError(f"num_samples must be >= 2; got {num_samples}")
    S = num_samples
    with torch.no_grad(), seeded(seed):
        logp, logq, dtype = _draw_log_densities(model, guide, args, kwargs, S, vectorize)
    lw = (logp - logq).numpy()
    if np.isnan(lw).any() or np.isposinf(lw).any():
        raise ValueError("log weights contain NaN or +inf (a guide draw with q = 0 or p = inf?)")
    if _weights_equal_to_rounding(lw, logp, logq, dtype):
        smoothed, k = np.full(S, -math.log(S)), float("-inf")
    else:
        smoothed, k = psis_smooth(lw)
    ess = float(1.0 / np.exp(2 * smoothed).sum())
    return PSISResult(
        khat=k,
        interpretation=interpret_khat(k),
        log_weights=lw,
        smoothed_log_weights=smoothed,
        ess=ess,
    )
