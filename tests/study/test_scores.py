"""The study's post-hoc scores and temperature scaling against independent implementations."""

import numpy as np
import pytest
import torch
from scipy.optimize import minimize_scalar
from sklearn.neighbors import NearestNeighbors

from bayesattn import calibration as C
from bayesattn.posthoc.features import extract_features
from bayesattn.study.datasets.mnist1d import SignalTransformer
from bayesattn.study.metrics import _scaled
from bayesattn.study.scores import choose_k, fit_mahalanobis, knn_distance


def _feats(n, d=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64)


def test_knn_distance_matches_sklearn_on_normalised_features():
    train, z = _feats(80), _feats(15, seed=1)
    tn = (train / train.norm(dim=1, keepdim=True)).numpy()
    zn = (z / z.norm(dim=1, keepdim=True)).numpy()
    nn = NearestNeighbors(n_neighbors=5).fit(tn)
    dist, _ = nn.kneighbors(zn)
    for k in (1, 3, 5):
        np.testing.assert_allclose(knn_distance(train, z, k).numpy(), dist[:, k - 1], atol=1e-10)
    # a training row is not its own neighbour with exclude_self
    dist_self, _ = nn.kneighbors(tn, n_neighbors=4)
    np.testing.assert_allclose(
        knn_distance(train, train, 3, exclude_self=True).numpy(), dist_self[:, 3], atol=1e-10
    )
    with pytest.raises(ValueError, match="k must be"):
        knn_distance(train, z, 0)
    with pytest.raises(ValueError, match="z must be"):
        knn_distance(train, torch.zeros(3), 1)


def test_choose_k_uses_validation_errors_only():
    train = _feats(60)
    # errors far from the training set, correct examples on it
    val = torch.cat([train[:20] + 0.01 * _feats(20, seed=2), 5 * _feats(5, seed=3) + 3.0])
    correct = torch.tensor([True] * 20 + [False] * 5)
    k, by_k = choose_k(train, val, correct, (1, 5, 10))
    assert k in (1, 5, 10) and by_k[k] == max(by_k.values())
    by_hand = C.ood_auroc(knn_distance(train, val[:20], 5), knn_distance(train, val[20:], 5))
    assert by_k[5] == pytest.approx(by_hand)
    assert choose_k(train, val, torch.ones(25, dtype=torch.bool), (1, 5, 10)) == (5, {})


def test_relative_mahalanobis_matches_a_direct_numpy_computation():
    g = np.random.default_rng(0)
    C_, D = 3, 4
    y = np.repeat(np.arange(C_), 30)
    z = g.normal(size=(90, D)) + 2.0 * y[:, None]
    q = g.normal(size=(7, D)) * 3
    ridge = 1e-6
    mus = np.stack([z[y == c].mean(0) for c in range(C_)])
    cen = z - mus[y]
    cov = cen.T @ cen / len(z)
    cov += ridge * np.trace(cov) / D * np.eye(D)
    cov0 = (z - z.mean(0)).T @ (z - z.mean(0)) / len(z)
    cov0 += ridge * np.trace(cov0) / D * np.eye(D)
    P, P0 = np.linalg.inv(cov), np.linalg.inv(cov0)
    want = []
    for x in q:
        md = [(x - mus[c]) @ P @ (x - mus[c]) for c in range(C_)]
        md0 = (x - z.mean(0)) @ P0 @ (x - z.mean(0))
        want.append(min(m - md0 for m in md))
    fitted = fit_mahalanobis(torch.from_numpy(z), torch.from_numpy(y), C_, ridge=ridge)
    np.testing.assert_allclose(fitted.score(torch.from_numpy(q)).numpy(), want, rtol=1e-8)
    with pytest.raises(ValueError, match="every class"):
        fit_mahalanobis(torch.from_numpy(z), torch.from_numpy(y), C_ + 1)


def test_temperature_scaling_of_a_predictive_matches_scipy():
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(400, 5, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, -1)  # over-confident: the labels follow softmax(logits / 2)
    y = torch.multinomial(torch.softmax(logits / 2, -1), 1, generator=g).squeeze(1)
    logp = p.log()
    T = C.fit_temperature(logp, y)

    def nll(t):
        return float(torch.nn.functional.cross_entropy(logp / t, y))

    best = minimize_scalar(nll, bounds=(0.05, 50), method="bounded", options={"xatol": 1e-8})
    assert 1.2 < T < 4 and T == pytest.approx(best.x, rel=1e-4)
    scaled = _scaled(p, T)
    want = p ** (1 / T) / (p ** (1 / T)).sum(-1, keepdim=True)
    torch.testing.assert_close(scaled, want)


def test_pooled_features_are_what_the_head_reads():
    torch.manual_seed(0)
    from bayesattn.nn.networks import VisionTransformer

    for net, x in (
        (VisionTransformer(4, d_model=8, nhead=2, num_layers=2, dim_feedforward=8),
         torch.rand(5, 8, 8)),
        (SignalTransformer(4, length=12, patch=3, d_model=8, nhead=2, num_layers=1,
                           dim_feedforward=8), torch.randn(5, 12)),
    ):  # fmt: skip
        net.eval()
        f = extract_features(net, x, batch_size=2, tokens=False).cls
        assert f.shape == (5, 8)
        with torch.no_grad():
            torch.testing.assert_close(net.head(f), net(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="signals must be"):
        SignalTransformer(4, length=12, patch=3, d_model=8, nhead=2).check_batch(
            torch.randn(2, 10), None
        )


def test_signal_windows_overlap_and_tile():
    x = torch.randn(3, 12)
    plain = SignalTransformer(4, length=12, patch=3, d_model=8, nhead=2)
    torch.testing.assert_close(plain.patchify(x), x.reshape(3, 4, 3), rtol=0, atol=0)
    over = SignalTransformer(4, length=12, patch=4, stride=2, d_model=8, nhead=2)
    w = over.patchify(x)  # windows x[:, 2i : 2i + 4], i = 0..4
    assert w.shape == (3, 5, 4)
    for i in range(5):
        torch.testing.assert_close(w[:, i], x[:, 2 * i : 2 * i + 4], rtol=0, atol=0)
    over.eval()
    assert over(x).shape == (3, 4)
    with pytest.raises(ValueError, match="tile length=12"):
        SignalTransformer(4, length=12, patch=4, stride=3, d_model=8, nhead=2)
    with pytest.raises(ValueError, match="stride must be a positive int; got 0"):
        SignalTransformer(4, length=12, patch=4, stride=0, d_model=8, nhead=2)
