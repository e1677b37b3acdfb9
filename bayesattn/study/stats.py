r"""Means with 95% t-intervals over the study's units (held-out pair × seed), and paired
differences.

For values :math:`v_1..v_n`: :math:`\bar v \pm t_{0.975,\,n-1}\, s/\sqrt n` with :math:`s` the
sample sd (``n - 1`` in the denominator). A paired difference takes, unit by unit, the method's
value minus the reference's *on the same pair and seed* (same split, same first member), then the
interval of those differences; it is **resolved** when the interval excludes 0. With one unit
the interval is undefined (``lo = hi = nan``, not resolved).

Many differences are read at once, so :func:`holm` adjusts their two-sided t-test p-values
(Holm, 1979: the ``i``-th smallest of ``m`` p-values times ``m − i + 1``, made monotone, capped
at 1), controlling the family-wise error rate at 5% over a table; a difference is **resolved
after Holm** when its adjusted p-value is below 0.05."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .results import Interval, PairedInterval

__all__ = ["t_interval", "paired_interval", "holm"]


def _t_quantile(p: float, df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(p, df))


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """``{"mean", "sd", "n", "lo", "hi", "half_width"}`` of ``values`` (NaN-free floats)."""
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("values must hold at least one number")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1); got {level}")
    if any(math.isnan(v) for v in xs):
        raise ValueError(f"values must not be NaN; got {xs}")
    n = len(xs)
    m = sum(xs) / n
    if n == 1:
        return Interval(mean=m, sd=0.0, n=1, lo=math.nan, hi=math.nan, half_width=math.nan)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = _t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean=m, sd=sd, n=n, lo=m - h, hi=m + h, half_width=h)


def paired_interval(
    values: Sequence[float], reference: Sequence[float], level: float = 0.95
) -> PairedInterval:
    """The t-interval of ``values[i] − reference[i]`` and whether it excludes 0 (``resolved``)."""
    if len(values) != len(reference):
        raise ValueError(
            f"paired values need the same units; got {len(values)} and {len(reference)}"
        )
    iv = t_interval([a - b for a, b in zip(values, reference, strict=True)], level)
    resolved = bool(iv["n"] > 1 and (iv["lo"] > 0 or iv["hi"] < 0))
    return PairedInterval(**iv, resolved=resolved, p=_t_test_p(iv))


def _t_test_p(iv: Interval) -> float:
    """Two-sided p-value of the one-sample t-test of mean 0 (``nan`` with one unit; a zero sd:
    0 for a non-zero mean, 1 for a zero one)."""
    from scipy.stats import t

    n, m, sd = iv["n"], iv["mean"], iv["sd"]
    if n < 2:
        return math.nan
    if sd == 0:
        return 0.0 if m != 0 else 1.0
    return float(2 * t.sf(abs(m) / (sd / math.sqrt(n)), n - 1))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order (``nan`` stays ``nan`` and is not counted
    in the family)."""
    ps = [float(p) for p in pvalues]
    if any(not math.isnan(p) and not 0 <= p <= 1 for p in ps):
        raise ValueError(f"pvalues must be in [0, 1] (or nan); got {ps}")
    idx = sorted((i for i, p in enumerate(ps) if not math.isnan(p)), key=lambda i: ps[i])
    out, running = list(ps), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (len(idx) - rank) * ps[i]))
        out[i] = running
    return out
