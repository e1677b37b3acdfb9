"""Tests for bayesattn.calibration against independent NumPy loops and scikit-learn."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import (
    average_precision_score,
    brier_score_loss,
    log_loss,
    roc_auc_score,
)

from bayesattn.calibration import (
    PAvPUCurve,
    ReliabilityCurve,
    RiskCoverage,
    TemperatureScaler,
    accuracy,
    aurc,
    brier_score,
    expected_calibration_error,
    fit_temperature,
    maximum_calibration_error,
    negative_log_likelihood,
    ood_aupr,
    ood_auroc,
    pavpu,
    pavpu_curve,
    predictive_entropy,
    reliability_curve,
    risk_coverage_curve,
)

# ----------------------------------------------------------------------------------------------
# Independent reference implementations (plain NumPy / Python loops; never call the module)
# ----------------------------------------------------------------------------------------------


def ref_bins(conf: np.ndarray, n_bins: int, strategy: str) -> list[list[int]]:
    """Indices of examples in each bin."""
    n = len(conf)
    bins: list[list[int]] = [[] for _ in range(n_bins)]
    if strategy == "uniform":
        edges = [b / n_bins for b in range(n_bins + 1)]
        for i in range(n):
            for b in range(n_bins):
                if conf[i] <= edges[b + 1] or b == n_bins - 1:
                    bins[b].append(i)
                    break
    else:
        order = sorted(range(n), key=lambda i: conf[i])  # Python's sort is stable
        base, extra = divmod(n, n_bins)
        pos = 0
        for b in range(n_bins):
            size = base + (1 if b < extra else 0)
            bins[b] = order[pos : pos + size]
            pos += size
    return bins


def ref_bin_stats(probs, labels, n_bins, strategy):
    probs = np.asarray(probs, dtype=np.float64)
    conf, pred = [], []
    for row in probs:
        best = 0
        for c in range(len(row)):
            if row[c] > row[best]:
                best = c
        conf.append(row[best])
        pred.append(best)
    conf = np.array(conf)
    stats = []
    for members in ref_bins(conf, n_bins, strategy):
        if not members:
            stats.append((0, math.nan, math.nan))
            continue
        c_mean = sum(conf[i] for i in members) / len(members)
        a_mean = sum(1.0 for i in members if pred[i] == labels[i]) / len(members)
        stats.append((len(members), c_mean, a_mean))
    return stats


def ref_ece(probs, labels, n_bins=15, strategy="uniform"):
    n = len(labels)
    total = 0.0
    for count, c, a in ref_bin_stats(probs, labels, n_bins, strategy):
        if count:
            total += count / n * abs(a - c)
    return total


def ref_mce(probs, labels, n_bins=15, strategy="uniform"):
    return max(abs(a - c) for k, c, a in ref_bin_stats(probs, labels, n_bins, strategy) if k)


def ref_nll(probs, labels, eps=1e-12):
    return -sum(math.log(max(probs[i][labels[i]], eps)) for i in range(len(labels))) / len(labels)


def ref_brier(probs, labels):
    total = 0.0
    for i in range(len(labels)):
        for c in range(len(probs[i])):
            total += (probs[i][c] - (1.0 if c == labels[i] else 0.0)) ** 2
    return total / len(labels)


def ref_auroc(s_in, s_out):
    total = 0.0
    for so in s_out:
        for si in s_in:
            total += 1.0 if so > si else (0.5 if so == si else 0.0)
    return total / (len(s_in) * len(s_out))


def ref_ap(s_in, s_out):
    scores = list(s_out) + list(s_in)
    pos = [1] * len(s_out) + [0] * len(s_in)
    ap, prev_recall = 0.0, 0.0
    for t in sorted(set(scores), reverse=True):
        tp = sum(p for s, p in zip(scores, pos, strict=True) if s >= t)
        npred = sum(1 for s in scores if s >= t)
        recall = tp / len(s_out)
        ap += (recall - prev_recall) * (tp / npred)
        prev_recall = recall
    return ap


def ref_risks(unc, correct):
    order = sorted(range(len(unc)), key=lambda i: unc[i])
    risks, errors = [], 0
    for k, i in enumerate(order, start=1):
        errors += 0 if correct[i] else 1
        risks.append(errors / k)
    return risks


def ref_pavpu(unc, correct, thr):
    good = 0
    for u, ok in zip(unc, correct, strict=True):
        certain = u <= thr
        good += int((ok and certain) or ((not ok) and (not certain)))
    return good / len(unc)


def ref_entropy(probs):
    out = []
    for row in probs:
        out.append(-sum(p * math.log(p) for p in row if p > 0))
    return np.array(out)


# ----------------------------------------------------------------------------------------------
# Fixtures / data
# ----------------------------------------------------------------------------------------------


def random_problem(seed: int, n: int = 300, c: int = 5, scale: float = 3.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, c)) * scale
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    labels = rng.integers(0, c, size=n)
    return probs, labels


def one_hot(idx, c):
    return np.eye(c)[np.asarray(idx)]


# ----------------------------------------------------------------------------------------------
# Calibration metrics
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
@pytest.mark.parametrize("n_bins", [1, 7, 15])
def test_ece_mce_match_reference(seed, strategy, n_bins):
    probs, labels = random_problem(seed)
    got_ece = expected_calibration_error(
        torch.tensor(probs), torch.tensor(labels), n_bins, strategy
    )
    got_mce = maximum_calibration_error(probs, labels, n_bins=n_bins, strategy=strategy)
    assert isinstance(got_ece, float) and isinstance(got_mce, float)
    assert got_ece == pytest.approx(ref_ece(probs, labels, n_bins, strategy), abs=1e-12)
    assert got_mce == pytest.approx(ref_mce(probs, labels, n_bins, strategy), abs=1e-12)


@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_reliability_curve_matches_reference(strategy):
    probs, labels = random_problem(3, n=97, c=4)
    curve = reliability_curve(probs, labels, n_bins=10, strategy=strategy)
    assert isinstance(curve, ReliabilityCurve)
    for field in ("bin_lower", "bin_upper", "confidence", "accuracy", "count"):
        assert getattr(curve, field).shape == (10,)
    ref = ref_bin_stats(probs, labels, 10, strategy)
    np.testing.assert_array_equal(curve.count.numpy(), [r[0] for r in ref])
    np.testing.assert_allclose(curve.confidence.numpy(), [r[1] for r in ref], atol=1e-12)
    np.testing.assert_allclose(curve.accuracy.numpy(), [r[2] for r in ref], atol=1e-12)
    assert int(curve.count.sum()) == 97
    if strategy == "uniform":
        np.testing.assert_allclose(curve.bin_lower.numpy(), np.arange(10) / 10)
        np.testing.assert_allclose(curve.bin_upper.numpy(), np.arange(1, 11) / 10)
    else:
        counts = curve.count.numpy()
        assert counts.max() - counts.min() <= 1
        assert (curve.bin_lower <= curve.confidence).all()
        assert (curve.confidence <= curve.bin_upper).all()


def test_reliability_curve_empty_bins_are_nan():
    probs = np.array([[0.95, 0.05], [0.92, 0.08]])
    curve = reliability_curve(probs, [0, 1], n_bins=10)
    empty = curve.count == 0
    assert int(empty.sum()) == 9
    assert torch.isnan(curve.confidence[empty]).all()
    assert torch.isnan(curve.accuracy[empty]).all()
    assert curve.count[9] == 2
    assert curve.confidence[9].item() == pytest.approx(0.935)
    assert curve.accuracy[9].item() == pytest.approx(0.5)
    # quantile with N < n_bins: first N bins have one example each, others empty with NaN edges.
    q = reliability_curve(probs, [0, 1], n_bins=4, strategy="quantile")
    assert q.count.tolist() == [1, 1, 0, 0]
    assert torch.isnan(q.bin_lower[2:]).all() and torch.isnan(q.bin_upper[2:]).all()
    assert q.bin_lower[0].item() == pytest.approx(0.92)
    assert q.bin_lower[1].item() == pytest.approx(0.95)


def test_uniform_bin_edges_are_right_closed():
    # Confidences exactly on edges i/10 go to the bin (lo, hi] ending at that edge.
    probs = np.array(
        [
            [0.3, 0.25, 0.25, 0.2],  # conf 0.3 -> bin 2 = (0.2, 0.3]
            [0.5, 0.5, 0.0, 0.0],  # conf 0.5 -> bin 4 = (0.4, 0.5], argmax tie -> class 0
            [1.0, 0.0, 0.0, 0.0],  # conf 1.0 -> last bin
            [0.25, 0.25, 0.25, 0.25],  # conf 0.25 -> bin 2
        ]
    )
    curve = reliability_curve(probs, [0, 0, 0, 1], n_bins=10)
    assert curve.count.tolist() == [0, 0, 2, 0, 1, 0, 0, 0, 0, 1]
    assert curve.accuracy[2].item() == pytest.approx(0.5)  # row 0 correct, row 3 predicts 0
    assert curve.accuracy[4].item() == 1.0
    # a single bin [0, 1] holds everything
    assert reliability_curve(probs, [0, 0, 0, 1], n_bins=1).count.tolist() == [4]


def test_quantile_ties_are_split_in_input_order():
    # All confidences tied: stable sort keeps input order; sizes 4, 3, 3.
    probs = np.tile([0.6, 0.4], (10, 1))
    labels = np.array([0, 0, 0, 0, 1, 1, 1, 0, 0, 0])
    curve = reliability_curve(probs, labels, n_bins=3, strategy="quantile")
    assert curve.count.tolist() == [4, 3, 3]
    np.testing.assert_allclose(curve.accuracy.numpy(), [1.0, 0.0, 1.0])
    np.testing.assert_allclose(curve.confidence.numpy(), [0.6, 0.6, 0.6])
    got = expected_calibration_error(probs, labels, n_bins=3, strategy="quantile")
    assert got == pytest.approx(ref_ece(probs, labels, 3, "quantile"))
    assert got == pytest.approx(0.4 * 0.4 + 0.3 * 0.6 + 0.3 * 0.4)


def test_ties_in_confidence_uniform():
    probs, labels = random_problem(5, n=200, c=3)
    probs = np.round(probs, 1)  # many exact ties, some on bin edges
    probs /= probs.sum(axis=1, keepdims=True)
    for strategy in ("uniform", "quantile"):
        assert expected_calibration_error(probs, labels, 10, strategy) == pytest.approx(
            ref_ece(probs, labels, 10, strategy), abs=1e-12
        )


def test_all_correct_one_hot():
    labels = np.array([0, 2, 1, 2, 0])
    probs = one_hot(labels, 3)
    for strategy in ("uniform", "quantile"):
        assert expected_calibration_error(probs, labels, strategy=strategy) == 0.0
        assert maximum_calibration_error(probs, labels, strategy=strategy) == 0.0
    assert accuracy(probs, labels) == 1.0
    assert negative_log_likelihood(probs, labels) == 0.0
    assert brier_score(probs, labels) == 0.0


def test_all_wrong_one_hot():
    labels = np.array([0, 2, 1, 2, 0])
    probs = one_hot((labels + 1) % 3, 3)
    assert expected_calibration_error(probs, labels) == 1.0
    assert maximum_calibration_error(probs, labels) == 1.0
    assert accuracy(probs, labels) == 0.0
    assert negative_log_likelihood(probs, labels) == pytest.approx(-math.log(1e-12))
    assert negative_log_likelihood(probs, labels, eps=1e-3) == pytest.approx(-math.log(1e-3))
    assert brier_score(probs, labels) == 2.0


def test_everything_in_one_bin():
    rng = np.random.default_rng(7)
    labels = rng.integers(0, 4, size=50)
    probs = np.tile([0.7, 0.1, 0.1, 0.1], (50, 1))
    acc = float(np.mean(labels == 0))
    assert expected_calibration_error(probs, labels) == pytest.approx(abs(acc - 0.7))
    assert maximum_calibration_error(probs, labels) == pytest.approx(abs(acc - 0.7))
    curve = reliability_curve(probs, labels)
    assert int((curve.count > 0).sum()) == 1


def test_single_example():
    probs = np.array([[0.2, 0.8]])
    for strategy in ("uniform", "quantile"):
        assert expected_calibration_error(probs, [1], strategy=strategy) == pytest.approx(0.2)
        assert expected_calibration_error(probs, [0], strategy=strategy) == pytest.approx(0.8)
    assert accuracy(probs, [1]) == 1.0
    assert negative_log_likelihood(probs, [1]) == pytest.approx(-math.log(0.8))
    assert brier_score(probs, [0]) == pytest.approx(0.8**2 + 0.8**2)
    assert predictive_entropy(probs).shape == (1,)


@pytest.mark.parametrize("seed", [0, 1])
def test_nll_brier_accuracy_match_reference_and_sklearn(seed):
    probs, labels = random_problem(seed, n=250, c=6, scale=1.0)  # probs bounded away from 0
    assert negative_log_likelihood(probs, labels) == pytest.approx(ref_nll(probs, labels))
    assert negative_log_likelihood(probs, labels) == pytest.approx(
        log_loss(labels, probs, labels=list(range(6))), rel=1e-9
    )
    assert brier_score(probs, labels) == pytest.approx(ref_brier(probs, labels))
    assert brier_score(probs, labels) == pytest.approx(
        brier_score_loss(labels, probs, labels=list(range(6))), rel=1e-9
    )
    assert accuracy(torch.tensor(probs), torch.tensor(labels)) == pytest.approx(
        float(np.mean(probs.argmax(axis=1) == labels))
    )


def test_brier_binary_is_twice_sklearn_binary():
    rng = np.random.default_rng(11)
    p1 = rng.uniform(size=100)
    probs = np.stack([1 - p1, p1], axis=1)
    y = rng.integers(0, 2, size=100)
    assert brier_score(probs, y) == pytest.approx(2 * brier_score_loss(y, p1))


def test_float32_and_numpy_inputs_agree():
    probs, labels = random_problem(4, n=120, c=3)
    p32 = torch.tensor(probs, dtype=torch.float32)
    p32 = p32 / p32.sum(1, keepdim=True)
    ref = ref_ece(p32.double().numpy(), labels, 15, "uniform")
    assert expected_calibration_error(p32, torch.tensor(labels)) == pytest.approx(ref, abs=1e-12)
    assert expected_calibration_error(p32.numpy(), labels) == pytest.approx(ref, abs=1e-12)
    assert accuracy(probs.tolist(), labels.tolist()) == accuracy(probs, labels)


def test_predictive_entropy():
    probs, _ = random_problem(8, n=40, c=5)
    probs[0] = [1.0, 0.0, 0.0, 0.0, 0.0]
    probs[1] = [0.5, 0.5, 0.0, 0.0, 0.0]
    probs[2] = 0.2
    h = predictive_entropy(torch.tensor(probs))
    assert h.shape == (40,) and h.dtype == torch.float64
    np.testing.assert_allclose(h.numpy(), ref_entropy(probs), atol=1e-12)
    assert h[0].item() == 0.0
    assert h[1].item() == pytest.approx(math.log(2))
    assert h[2].item() == pytest.approx(math.log(5))
    h32 = predictive_entropy(torch.tensor(probs, dtype=torch.float32))
    assert h32.dtype == torch.float32 and torch.isfinite(h32).all()


# ----------------------------------------------------------------------------------------------
# Temperature scaling
# ----------------------------------------------------------------------------------------------


def _tempered_data(true_t: float, n: int, c: int = 10, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=g) * 4.0
    labels = torch.multinomial(torch.softmax(logits / true_t, dim=1), 1, generator=g).squeeze(1)
    return logits, labels


def test_temperature_recovers_known_value():
    logits, labels = _tempered_data(2.5, 20000)
    t_hat = fit_temperature(logits, labels)
    assert isinstance(t_hat, float)
    assert abs(t_hat - 2.5) < 0.1


def test_temperature_scaler_module_and_improves_calibration():
    logits, labels = _tempered_data(3.0, 4000, seed=1)  # raw logits are over-confident
    scaler = TemperatureScaler()
    assert isinstance(scaler, torch.nn.Module)
    assert [name for name, _ in scaler.named_parameters()] == ["log_temperature"]
    assert scaler.temperature == pytest.approx(1.0)
    out = scaler.fit(logits, labels, max_iter=50)
    assert out is scaler
    assert scaler.temperature > 1.5
    raw = torch.softmax(logits, dim=1)
    with torch.no_grad():
        cal = scaler(logits)
    assert cal.shape == logits.shape and cal.dtype == logits.dtype
    torch.testing.assert_close(cal.sum(1), torch.ones(len(logits)))
    torch.testing.assert_close(cal, torch.softmax(logits / scaler.temperature, dim=1))
    assert negative_log_likelihood(cal, labels) < negative_log_likelihood(raw, labels) - 0.1
    assert expected_calibration_error(cal, labels) < 0.5 * expected_calibration_error(raw, labels)
    # forward is differentiable w.r.t. the temperature and accepts batch dims
    scaler.zero_grad()
    scaler(logits.reshape(40, 100, 10))[..., 0].sum().backward()
    assert scaler.log_temperature.grad is not None


def test_temperature_scaler_fit_is_optimum():
    logits, labels = _tempered_data(1.7, 3000, seed=2)
    t = fit_temperature(logits.numpy(), labels.numpy())

    def nll(temp):
        return float(torch.nn.functional.cross_entropy(logits.double() / temp, labels))

    assert nll(t) <= nll(t * 1.05) and nll(t) <= nll(t / 1.05)


# ----------------------------------------------------------------------------------------------
# OOD detection
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tied", [False, True])
def test_ood_auroc_aupr_match_reference_and_sklearn(seed, tied):
    rng = np.random.default_rng(seed)
    s_in = rng.normal(size=60)
    s_out = rng.normal(loc=0.8, size=45)
    if tied:
        s_in, s_out = np.round(s_in * 2) / 2, np.round(s_out * 2) / 2  # heavy ties
    y = np.r_[np.zeros(len(s_in)), np.ones(len(s_out))]
    s = np.r_[s_in, s_out]
    auroc = ood_auroc(torch.tensor(s_in), torch.tensor(s_out))
    aupr = ood_aupr(s_in, s_out)
    assert auroc == pytest.approx(ref_auroc(s_in, s_out), abs=1e-12)
    assert auroc == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    assert aupr == pytest.approx(ref_ap(s_in, s_out), abs=1e-12)
    assert aupr == pytest.approx(average_precision_score(y, s), abs=1e-12)


def test_ood_edge_cases():
    assert ood_auroc([0.0, 1.0], [2.0, 3.0]) == 1.0
    assert ood_aupr([0.0, 1.0], [2.0, 3.0]) == 1.0
    assert ood_auroc([2.0, 3.0], [0.0, 1.0]) == 0.0
    assert ood_auroc([1.0, 1.0], [1.0]) == 0.5  # all tied
    assert ood_aupr([1.0, 1.0], [1.0]) == pytest.approx(1 / 3)  # = prevalence
    assert ood_auroc([0.0], [1.0]) == 1.0  # one each
    assert ood_aupr([1.0], [0.0]) == pytest.approx(0.5)
    assert ood_aupr([1.0], [0.0]) == pytest.approx(average_precision_score([0, 1], [1.0, 0.0]))


# ----------------------------------------------------------------------------------------------
# Selective prediction
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_risk_coverage_and_aurc_match_reference(seed):
    rng = np.random.default_rng(seed)
    unc = np.round(rng.uniform(size=150), 1)  # ties
    correct = rng.uniform(size=150) > unc
    rc = risk_coverage_curve(torch.tensor(unc), torch.tensor(correct))
    assert isinstance(rc, RiskCoverage)
    ref = ref_risks(unc, correct)
    np.testing.assert_allclose(rc.risk.numpy(), ref, atol=1e-12)
    np.testing.assert_allclose(rc.coverage.numpy(), np.arange(1, 151) / 150)
    np.testing.assert_array_equal(rc.threshold.numpy(), np.sort(unc))
    assert aurc(unc, correct.astype(int)) == pytest.approx(np.mean(ref), abs=1e-12)
    assert rc.risk[-1].item() == pytest.approx(1 - correct.mean())


def test_risk_coverage_edge_cases():
    assert aurc([0.3], [True]) == 0.0
    assert aurc([0.3], [False]) == 1.0
    assert aurc([0.1, 0.2, 0.3], [1, 1, 1]) == 0.0
    assert aurc([0.1, 0.2, 0.3], [0, 0, 0]) == 1.0
    # errors ranked most uncertain: risks 0, 0, 1/3
    assert aurc([0.1, 0.2, 0.3], [1, 1, 0]) == pytest.approx(1 / 9)
    # errors ranked most certain: risks 1, 1/2, 1/3
    assert aurc([0.1, 0.2, 0.3], [0, 1, 1]) == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    # ties keep input order (stable sort)
    np.testing.assert_allclose(risk_coverage_curve([0.5, 0.5], [0, 1]).risk.numpy(), [1.0, 0.5])


@pytest.mark.parametrize("seed", [0, 1])
def test_pavpu_matches_reference(seed):
    rng = np.random.default_rng(seed)
    unc = np.round(rng.uniform(size=120), 2)
    correct = rng.uniform(size=120) > unc
    for thr in [-1.0, 0.0, 0.25, unc[3], 0.5, 0.99, 2.0]:
        assert pavpu(unc, correct, thr) == pytest.approx(ref_pavpu(unc, correct, thr))
    assert pavpu(unc, correct, -1.0) == pytest.approx(1 - correct.mean())  # all uncertain
    assert pavpu(unc, correct, 2.0) == pytest.approx(correct.mean())  # all certain
    curve = pavpu_curve(unc, correct, n_thresholds=11)
    assert isinstance(curve, PAvPUCurve)
    np.testing.assert_allclose(curve.threshold.numpy(), np.quantile(unc, np.linspace(0, 1, 11)))
    np.testing.assert_allclose(
        curve.pavpu.numpy(), [ref_pavpu(unc, correct, t) for t in curve.threshold.numpy()]
    )
    given_thr = [0.1, 0.5, 0.9]
    curve2 = pavpu_curve(torch.tensor(unc), torch.tensor(correct), thresholds=given_thr)
    np.testing.assert_allclose(curve2.threshold.numpy(), given_thr)
    np.testing.assert_allclose(
        curve2.pavpu.numpy(), [ref_pavpu(unc, correct, t) for t in given_thr]
    )


def test_pavpu_perfect_uncertainty():
    unc = np.array([0.1, 0.2, 0.8, 0.9])
    correct = np.array([True, True, False, False])
    assert pavpu(unc, correct, 0.5) == 1.0
    assert pavpu(unc, ~correct, 0.5) == 0.0
    assert pavpu(torch.tensor(unc), torch.tensor(correct), torch.tensor(0.5)) == 1.0


# ----------------------------------------------------------------------------------------------
# Error messages
# ----------------------------------------------------------------------------------------------

GOOD_P = np.array([[0.7, 0.3], [0.4, 0.6]])
GOOD_Y = np.array([0, 1])


@pytest.mark.parametrize(
    ("probs", "labels", "exc", "match"),
    [
        (np.array([0.7, 0.3]), GOOD_Y, ValueError, r"probs must be 2-D .*\(N, C\).*\(2,\)"),
        (
            np.zeros((0, 3)),
            np.zeros(0, dtype=int),
            ValueError,
            r"probs must be non-empty.*\(0, 3\)",
        ),
        (np.array([[0.7, 0.4], [0.4, 0.6]]), GOOD_Y, ValueError, r"probs rows must sum to 1"),
        (np.array([[1.2, -0.2], [0.4, 0.6]]), GOOD_Y, ValueError, r"probs must be non-negative"),
        (np.array([[np.nan, 0.3], [0.4, 0.6]]), GOOD_Y, ValueError, r"probs contains NaN or Inf"),
        (np.array([[np.inf, 0.3], [0.4, 0.6]]), GOOD_Y, ValueError, r"probs contains NaN or Inf"),
        (GOOD_P, np.array([0, 1, 1]), ValueError, r"labels must have shape \(2,\).*\(3,\)"),
        (GOOD_P, np.array([[0, 1]]), ValueError, r"labels must have shape \(2,\).*\(1, 2\)"),
        (GOOD_P, np.array([0, 2]), ValueError, r"labels must lie in \[0, 2\)"),
        (GOOD_P, np.array([-1, 0]), ValueError, r"labels must lie in \[0, 2\)"),
        (GOOD_P, np.array([0.0, 1.0]), TypeError, r"labels must have an integer dtype"),
        ("abc", GOOD_Y, TypeError, r"probs must be a torch.Tensor"),
        (GOOD_P.astype(complex), GOOD_Y, TypeError, r"probs must be real-valued"),
    ],
)
def test_probs_labels_errors(probs, labels, exc, match):
    fns = [
        expected_calibration_error,
        maximum_calibration_error,
        reliability_curve,
        negative_log_likelihood,
        brier_score,
        accuracy,
    ]
    for fn in fns:
        with pytest.raises(exc, match=match):
            fn(probs, labels)


def test_predictive_entropy_errors():
    with pytest.raises(ValueError, match=r"probs must be 2-D.*\(3,\)"):
        predictive_entropy(np.array([0.2, 0.3, 0.5]))
    with pytest.raises(ValueError, match="probs rows must sum to 1"):
        predictive_entropy(np.array([[0.2, 0.3]]))


@pytest.mark.parametrize("fn", [expected_calibration_error, maximum_calibration_error])
def test_bin_argument_errors(fn):
    with pytest.raises(ValueError, match=r"n_bins must be a positive int; got 0"):
        fn(GOOD_P, GOOD_Y, n_bins=0)
    with pytest.raises(TypeError, match="n_bins must be an int"):
        fn(GOOD_P, GOOD_Y, n_bins=2.5)
    with pytest.raises(TypeError, match="n_bins must be an int"):
        fn(GOOD_P, GOOD_Y, n_bins=True)
    with pytest.raises(ValueError, match="strategy must be one of"):
        fn(GOOD_P, GOOD_Y, strategy="equal")


def test_nll_eps_error():
    with pytest.raises(ValueError, match="eps must be"):
        negative_log_likelihood(GOOD_P, GOOD_Y, eps=0.0)


@pytest.mark.parametrize("fn", [ood_auroc, ood_aupr])
def test_ood_errors(fn):
    with pytest.raises(ValueError, match=r"scores_in is empty.*only one class"):
        fn([], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"scores_out is empty.*\(0,\)"):
        fn([1.0, 2.0], np.array([]))
    with pytest.raises(ValueError, match=r"scores_in must be 1-D.*\(2, 2\)"):
        fn(np.ones((2, 2)), [1.0])
    with pytest.raises(ValueError, match=r"scores_out must be 1-D.*\(\)"):
        fn([1.0], torch.tensor(1.0))
    with pytest.raises(ValueError, match="scores_out contains NaN or Inf"):
        fn([1.0], [float("nan")])
    with pytest.raises(ValueError, match="scores_in contains NaN or Inf"):
        fn([float("inf")], [1.0])


@pytest.mark.parametrize(
    "fn",
    [
        risk_coverage_curve,
        aurc,
        lambda u, c: pavpu(u, c, 0.5),
        lambda u, c: pavpu_curve(u, c),
    ],
)
def test_uncertainty_correct_errors(fn):
    with pytest.raises(ValueError, match=r"correct must have the same shape as uncertainty \(3,\)"):
        fn([0.1, 0.2, 0.3], [True, False])
    with pytest.raises(ValueError, match=r"uncertainty must be non-empty.*\(0,\)"):
        fn([], [])
    with pytest.raises(ValueError, match=r"uncertainty must be 1-D.*\(1, 2\)"):
        fn([[0.1, 0.2]], [[True, False]])
    with pytest.raises(ValueError, match="uncertainty contains NaN or Inf"):
        fn([0.1, float("nan")], [True, False])
    with pytest.raises(ValueError, match="correct must be boolean or contain only 0/1"):
        fn([0.1, 0.2], [0, 2])


def test_pavpu_threshold_errors():
    with pytest.raises(ValueError, match="threshold must not be NaN"):
        pavpu([0.1], [True], float("nan"))
    with pytest.raises(TypeError, match="threshold must be a real number"):
        pavpu([0.1], [True], "high")
    with pytest.raises(ValueError, match=r"thresholds must be a non-empty 1-D.*\(0,\)"):
        pavpu_curve([0.1], [True], thresholds=[])
    with pytest.raises(ValueError, match="thresholds contains NaN"):
        pavpu_curve([0.1], [True], thresholds=[0.1, float("nan")])
    with pytest.raises(ValueError, match="n_thresholds must be a positive int; got 0"):
        pavpu_curve([0.1], [True], n_thresholds=0)


def test_temperature_errors():
    with pytest.raises(ValueError, match=r"logits must be 2-D.*\(5,\)"):
        fit_temperature(torch.zeros(5), torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must have shape \(5,\).*\(4,\)"):
        fit_temperature(torch.zeros(5, 3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        fit_temperature(torch.zeros(2, 3), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="logits contains NaN or Inf"):
        fit_temperature(torch.tensor([[0.0, float("nan")]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="max_iter must be a positive int; got 0"):
        fit_temperature(torch.zeros(2, 3), torch.tensor([0, 1]), max_iter=0)
    with pytest.raises(ValueError, match="temperature must be a finite float > 0"):
        TemperatureScaler(temperature=0.0)
    with pytest.raises(ValueError, match=r"logits must have a non-empty class dimension"):
        TemperatureScaler()(torch.zeros(3, 0))


# ----------------------------------------------------------------------------------------------
# Property tests
# ----------------------------------------------------------------------------------------------


@st.composite
def prob_problems(draw):
    n = draw(st.integers(1, 40))
    c = draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from([0.0, 0.5, 3.0, 20.0]))
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(n, c)) * scale
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    labels = rng.integers(0, c, size=n)
    return probs, labels


@settings(database=None, max_examples=40, deadline=None)
@given(prob_problems(), st.integers(1, 20), st.sampled_from(["uniform", "quantile"]))
def test_property_ece_bounds(problem, n_bins, strategy):
    probs, labels = problem
    ece = expected_calibration_error(probs, labels, n_bins=n_bins, strategy=strategy)
    mce = maximum_calibration_error(probs, labels, n_bins=n_bins, strategy=strategy)
    assert 0.0 <= ece <= 1.0 + 1e-12
    assert mce >= ece - 1e-12
    assert mce <= 1.0 + 1e-12
    assert ece == pytest.approx(ref_ece(probs, labels, n_bins, strategy), abs=1e-9)
    assert 0.0 <= brier_score(probs, labels) <= 2.0 + 1e-9


scores = st.lists(
    st.floats(-5, 5, allow_nan=False).map(lambda x: round(x, 1)), min_size=1, max_size=30
)


@settings(database=None, max_examples=80, deadline=None)
@given(scores, scores)
def test_property_auroc_antisymmetric(s_in, s_out):
    a = ood_auroc(s_in, s_out)
    b = ood_auroc(s_out, s_in)
    assert 0.0 <= a <= 1.0
    assert a + b == pytest.approx(1.0, abs=1e-12)
    assert a == pytest.approx(ref_auroc(s_in, s_out), abs=1e-12)
    ap = ood_aupr(s_in, s_out)
    assert 0.0 < ap <= 1.0 + 1e-12
    assert ap == pytest.approx(ref_ap(s_in, s_out), abs=1e-12)


@settings(database=None, max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=1, max_size=30))
def test_property_aurc_bounds(pairs):
    unc = [u for u, _ in pairs]
    ok = [c for _, c in pairs]
    value = aurc(unc, ok)
    assert 0.0 <= value <= 1.0
    assert value == pytest.approx(float(np.mean(ref_risks(unc, ok))), abs=1e-12)


def test_accuracy_at_coverage_keeps_the_most_certain_examples():
    from bayesattn.calibration import accuracy_at_coverage

    u = torch.tensor([0.1, 0.9, 0.2, 0.8, 0.3, 0.7, 0.4, 0.6, 0.5, 1.0])
    ok = torch.tensor([1, 0, 1, 1, 1, 0, 1, 1, 0, 0]).bool()
    # by hand: the 9 most certain (all but u=1.0) hold 6 correct; the 8 most certain 6 of 8
    assert accuracy_at_coverage(u, ok, 0.9) == pytest.approx(6 / 9)
    assert accuracy_at_coverage(u, ok, 0.8) == pytest.approx(6 / 8)
    assert accuracy_at_coverage(u, ok, 1.0) == pytest.approx(6 / 10)
    assert accuracy_at_coverage(u, ok, 0.1) == 1.0
    for bad in (0.0, 1.5, True):
        with pytest.raises(ValueError, match="coverage"):
            accuracy_at_coverage(u, ok, bad)
