r"""Means with 95% t-intervals over the study's units (held-out pair × seed), and paired
differences.

For values :math:`v_1..v_n`: :math:`\bar v \pm t_{0.975,\,n-1}\, s/\sqrt n` with :math:`s` the
sample sd (``n - 1`` in the denominator). A paired difference takes, unit by unit, the method's
value minus the reference's *on the same pair and seed* (same split, same first member), then the
interval of those differences; it is **resolved** when the interval excludes 0. With one unit
the interval is undefined (``lo = hi = nan``, not resolved)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["t_interval", "paired_interval"]


def _t_quantile(p: float, df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(p, df))


def t_interval(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
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
        return {"mean": m, "sd": 0.0, "n": 1, "lo": math.nan, "hi": math.nan,
                "half_width": math.nan}  # fmt: skip
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = _t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return {"mean": m, "sd": sd, "n": n, "lo": m - h, "hi": m + h, "half_width": h}


def paired_interval(
    values: Sequence[float], reference: Sequence[float], level: float = 0.95
) -> dict[str, Any]:
    """The t-interval of ``values[i] − reference[i]`` and whether it excludes 0 (``resolved``)."""
    if len(values) != len(reference):
        raise ValueError(
            f"paired values need the same units; got {len(values)} and {len(reference)}"
        )
    out = t_interval([a - b for a, b in zip(values, reference, strict=True)], level)
    out["resolved"] = bool(out["n"] > 1 and (out["lo"] > 0 or out["hi"] < 0))
    return out
