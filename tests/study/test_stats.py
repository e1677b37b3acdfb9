"""Intervals and paired differences of the study against a hand computation."""

import math

import numpy as np
import pytest
from scipy import stats

from bayesattn.study.stats import paired_interval, t_interval


def test_t_interval_matches_a_hand_computation():
    xs = [0.91, 0.95, 0.93, 0.97, 0.90]
    n = len(xs)
    mean = sum(xs) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    t = 2.7764451051977987  # t_{0.975, 4} from a table
    assert stats.t.ppf(0.975, 4) == pytest.approx(t)
    r = t_interval(xs)
    assert r["n"] == n and r["mean"] == pytest.approx(mean) and r["sd"] == pytest.approx(sd)
    assert r["lo"] == pytest.approx(mean - t * sd / math.sqrt(n))
    assert r["hi"] == pytest.approx(mean + t * sd / math.sqrt(n))
    # another level and size, against scipy's own interval
    ys = np.random.default_rng(0).normal(size=12)
    lo, hi = stats.t.interval(0.9, 11, loc=ys.mean(), scale=stats.sem(ys))
    r = t_interval(ys.tolist(), level=0.9)
    assert (r["lo"], r["hi"]) == (pytest.approx(lo), pytest.approx(hi))


def test_one_value_has_no_interval_and_bad_input_is_refused():
    r = t_interval([0.5])
    assert r["mean"] == 0.5 and math.isnan(r["lo"]) and math.isnan(r["hi"])
    assert not paired_interval([0.5], [0.4])["resolved"]
    with pytest.raises(ValueError, match="at least one"):
        t_interval([])
    with pytest.raises(ValueError, match="NaN"):
        t_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="level"):
        t_interval([1.0, 2.0], level=1.5)
    with pytest.raises(ValueError, match="same units"):
        paired_interval([1.0, 2.0], [1.0])


def test_paired_differences_are_unit_by_unit_and_say_when_they_resolve():
    ref = [0.90, 0.80, 0.95, 0.70, 0.85]  # large spread between units
    better = [r + d for r, d in zip(ref, [0.011, 0.009, 0.010, 0.012, 0.008], strict=True)]
    r = paired_interval(better, ref)
    d = np.subtract(better, ref)
    h = stats.t.ppf(0.975, 4) * d.std(ddof=1) / math.sqrt(5)
    assert r["mean"] == pytest.approx(d.mean()) and r["lo"] == pytest.approx(d.mean() - h)
    assert r["resolved"]  # the pairing removes the between-unit spread
    # unpaired, the two means' intervals overlap widely
    assert t_interval(better)["lo"] < t_interval(ref)["hi"]
    noisy = [r + d for r, d in zip(ref, [0.05, -0.04, 0.03, -0.05, 0.02], strict=True)]
    assert not paired_interval(noisy, ref)["resolved"]


def test_paired_p_value_is_scipys_t_test_and_agrees_with_the_interval():
    from bayesattn.study.stats import paired_interval

    a = [0.91, 0.95, 0.93, 0.97, 0.90, 0.94]
    b = [0.90, 0.92, 0.93, 0.93, 0.91, 0.90]
    r = paired_interval(a, b)
    want = stats.ttest_rel(a, b).pvalue
    assert r["p"] == pytest.approx(want)
    assert r["resolved"] == (r["p"] < 0.05)
    assert math.isnan(paired_interval([1.0], [0.0])["p"])


def test_holm_matches_a_hand_computation_and_statsmodels_order():
    from bayesattn.study.stats import holm

    # sorted 0.01, 0.02, 0.03, 0.5 → ×4, ×3, ×2, ×1 = .04, .06, .06 (monotone), .5
    got = holm([0.03, 0.01, 0.5, 0.02, math.nan])
    assert got[:4] == pytest.approx([0.06, 0.04, 0.5, 0.06])
    assert math.isnan(got[4])
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped at 1
    with pytest.raises(ValueError, match="pvalues"):
        holm([1.5])
