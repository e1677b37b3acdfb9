"""The class-conditional density read's maths (bayesattn.posthoc._density_core)."""

import math

import pytest
import torch

from bayesattn import calibration as C
from bayesattn.functional.niw import niw_kl
from bayesattn.posthoc._density_core import fit_class_density, fit_density_temperature


def _blobs(n: int, seed: int, shift: float = 0.0, D: int = 4):
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % 3
    centres = torch.tensor([[3.0, 0, 0, 0], [0, 3.0, 0, 0], [0, 0, 3.0, 0]])[:, :D]
    h = centres[y] + torch.randn(n, D, generator=g) * torch.tensor([1.0, 0.5, 0.8, 0.3])[:D] + shift
    return h, y


def _read(n=600, **kw):
    h, y = _blobs(n, 0)
    hv, yv = _blobs(300, 1)
    return fit_class_density([h], y, [hv], yv, 3, **kw), (h, y), (hv, yv)


def test_density_matches_gaussian_mixture_of_class_estimates_with_much_data():
    """With many examples per class the posterior predictive is the Gaussian of the class's
    sample mean and covariance (an independent computation with torch's MVN)."""
    read, (h, y), _ = _read(n=30000, strengths=(1.0,))
    x, _ = _blobs(50, 2)
    comps = []
    for c in range(3):
        hc = h[y == c].double()
        mvn = torch.distributions.MultivariateNormal(hc.mean(0), torch.cov(hc.T))
        comps.append(mvn.log_prob(x.double()) + math.log(1 / 3))
    ref = torch.logsumexp(torch.stack(comps, -1), -1)
    torch.testing.assert_close(read.log_density([x])[0], ref, atol=5e-3, rtol=0)


def test_score_flags_far_inputs_and_is_standardised_on_validation():
    read, _, (hv, _) = _read()
    s_val = read.score([hv])
    assert abs(float(s_val.mean())) < 1e-9 and float(s_val.std()) == pytest.approx(1.0)
    x_in, _ = _blobs(200, 3)
    x_out, _ = _blobs(200, 4, shift=2.5)
    assert C.ood_auroc(read.score([x_in]), read.score([x_out])) > 0.95
    assert read.strengths[0] in (1.0, 4.0, 16.0, 64.0, 256.0)


def test_two_views_sum_their_standardised_scores():
    h, y = _blobs(400, 0)
    hv, yv = _blobs(200, 1)
    two = fit_class_density([h, 2 * h[:, :2]], y, [hv, 2 * hv[:, :2]], yv, 3)
    one = fit_class_density([h], y, [hv], yv, 3)
    other = fit_class_density([2 * h[:, :2]], y, [2 * hv[:, :2]], yv, 3)
    x, _ = _blobs(30, 5, shift=1.0)
    torch.testing.assert_close(two.score([x, 2 * x[:, :2]]), one.score([x]) + other.score([2 * x[:, :2]]))


def test_sampled_generative_classifier_disagrees_more_off_the_data_and_kl_is_the_sum():
    read, _, _ = _read(n=60)
    x_in, _ = _blobs(200, 3)
    x_out = _blobs(200, 4)[0] * 6.0
    p_in, p_out = read.sample_probs([x_in], 64, seed=0), read.sample_probs([x_out], 64, seed=0)
    assert p_in.shape == (64, 200, 3)
    torch.testing.assert_close(p_in.sum(-1), torch.ones(64, 200, dtype=torch.float64))

    def mi(p):
        m = p.mean(0)
        return (-(m * m.clamp_min(1e-12).log()).sum(-1) + (p * p.clamp_min(1e-12).log()).sum(-1).mean(0))

    assert float(mi(p_out).mean()) > 3 * float(mi(p_in).mean())
    assert float((p_in.mean(0).argmax(-1) == _blobs(200, 3)[1]).float().mean()) > 0.9
    kl = read.kl()
    assert kl > 0
    assert kl == pytest.approx(sum(niw_kl(q, read.priors[0]) for q in read.posteriors[0]))


def test_density_temperature_is_temperature_scaling_at_b_zero_and_grows_with_noise_far_away():
    g = torch.Generator().manual_seed(0)
    n = 3000
    u = torch.rand(n, generator=g) * 4
    z = torch.randn(n, 3, generator=g) * 3
    p_true = torch.softmax(z / torch.sqrt(1.5**2 + 4.0 * u)[:, None], -1)
    y = torch.multinomial(p_true, 1, generator=g)[:, 0]
    T, b = fit_density_temperature(z, u, y)
    assert b == pytest.approx(4.0, rel=0.35) and T == pytest.approx(1.5, rel=0.25)
    # labels that ignore u: b ends near 0 and the NLL is temperature scaling's (or better)
    y0 = torch.multinomial(torch.softmax(z / 2.0, -1), 1, generator=g)[:, 0]
    T0, b0 = fit_density_temperature(z, u, y0)
    assert b0 < 0.1 and T0 == pytest.approx(2.0, rel=0.15)
    read, _, (hv, yv) = _read()
    read.scale = 0.0
    logits = torch.randn(300, 3, generator=g)
    torch.testing.assert_close(read.probs(logits, [hv]),
                               torch.softmax(logits.double() / read.temperature, -1))


def test_bad_inputs_name_the_argument():
    h, y = _blobs(60, 0)
    with pytest.raises(ValueError, match="every class needs training examples"):
        fit_class_density([h], y.clamp(max=1), [h], y, 3)
    with pytest.raises(ValueError, match=r"val_views\[0\] must have D = 4"):
        fit_class_density([h], y, [h[:, :2]], y, 3)
    with pytest.raises(ValueError, match=r"y_train must hold labels in \[0, 3\)"):
        fit_class_density([h], y + 5, [h], y, 3)
    with pytest.raises(ValueError, match="NaN"):
        fit_class_density([h * float("nan")], y, [h], y, 3)
    with pytest.raises(ValueError, match="strengths"):
        fit_class_density([h], y, [h], y, 3, strengths=(0.0,))
    read = fit_class_density([h], y, [h], y, 3)
    with pytest.raises(ValueError, match="views must be a sequence of 1"):
        read.score([h, h])
    with pytest.raises(ValueError, match=r"views\[0\] must be \(B, 4\)"):
        read.score([h[:, :3]])
    same = torch.ones(60, 4)  # identical features: the ridge keeps every covariance definite
    assert torch.isfinite(fit_class_density([same], y, [same], y, 3).score([same])).all()


def test_fit_network_density_is_deprecated_and_reads_one_pass_of_a_cls_network():
    from bayesattn.nn.networks import TransformerClassifier
    from bayesattn.posthoc.features import extract_features

    torch.manual_seed(0)
    net = TransformerClassifier(3, input_dim=2, d_model=16, nhead=2, num_layers=1,
                                dim_feedforward=16, pooling="cls").eval()
    x = torch.randn(90, 5, 2)
    y = torch.arange(90) % 3
    with pytest.warns(DeprecationWarning, match="DensityRead"):
        from bayesattn.interop.class_density import fit_network_density
        r = fit_network_density(net, (x[:60], y[:60]), (x[60:], y[60:]))
    p, s = r(x[:7])
    f = extract_features(net, x[:7])
    core = r.read.core_
    torch.testing.assert_close(p, core.probs(f.logits, [f.cls, f.tokens]))
    torch.testing.assert_close(s, core.score([f.cls, f.tokens]))
    torch.testing.assert_close(f.logits, net(x[:7]), atol=1e-5, rtol=0)
    assert r.sample_probs(x[:7], 4).shape == (4, 7, 3)
    with pytest.warns(DeprecationWarning):
        one = fit_network_density(net, (x[:60], y[:60]), (x[60:], y[60:]), views=("cls",))
    assert one.read.core_.num_views == 1
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match="TransformerClassifier"):
        fit_network_density(torch.nn.Linear(2, 2), (x, y), (x, y))
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="views must be distinct"):
        fit_network_density(net, (x, y), (x, y), views=("cls", "cls"))


def test_batched_class_likelihood_is_each_class_students_t():
    """The classes' Student-t log densities, batched, equal niw_log_predictive class by class."""
    from bayesattn.functional.niw import niw_log_predictive

    read, _, _ = _read()
    x, _ = _blobs(17, 9, shift=0.7)
    got = read.class_log_likelihood([x])[0]  # (B, C)
    want = torch.stack([niw_log_predictive(x.double(), p) for p in read.posteriors[0]], -1)
    torch.testing.assert_close(got, want)
