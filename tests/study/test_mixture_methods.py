"""The study's mixture methods (bayesattn.study.mixture_methods): registered, not default, and
each fits the network it says (K, spread, width), predicts with a multiple of K stratified draws
and reports the mixture's KL bound."""

import pytest
import torch

from bayesattn.study import DEFAULT_METHODS, FULL_METHODS, METHODS, StudyConfig, get_method
from bayesattn.study.mixture_methods import MIXTURE_METHODS

NAMES = ("mixture", "mixture_point", "mixture_k1", "mixture_wide", "mixture_k2")


def test_registered_not_default_and_only_the_mixture_in_the_full_protocol():
    assert set(MIXTURE_METHODS) == set(NAMES)
    for n in NAMES:
        assert n in METHODS and n not in DEFAULT_METHODS
        # the ablations decided (docs/which-attention.md): they run by name
        assert (n in FULL_METHODS) == (n == "mixture")


@pytest.fixture(scope="module")
def run():
    from bayesattn.study.runs import Run

    cfg = StudyConfig.quick(epochs=1, num_samples=6, progress=False)
    return Run.load(cfg, "digits", (8, 9), 0)


@pytest.mark.parametrize(
    ("name", "K", "spread", "width"),
    [("mixture", 4, True, 1), ("mixture_point", 4, False, 1), ("mixture_k1", 1, True, 1),
     ("mixture_wide", 4, True, 2)],
)  # fmt: skip
def test_fit_predict_and_kl(run, name, K, spread, width):
    m = get_method(name)
    f = m.fit(run)
    net = f.nets[0]
    mix = net.trunk_mixture
    assert mix.num_components == K and mix.point_masses is not spread
    assert net.encoder.layers[0].linear1.weight.shape == (64 * width, 32 * width)
    S = f.state["num_samples"]
    assert S % K == 0 and S >= run.cfg.num_samples  # 6 rounded up to a multiple of K
    r = m.predict(f, run.data.x_test[:8])
    assert r.probs.shape == (S, 8, run.data.num_classes)
    assert r.components is not None and r.components.tolist() == [i % K for i in range(S)]
    local, global_ = m.posterior_kl(f, run)
    assert local == 0.0
    if spread:
        assert global_ == pytest.approx(float(mix.kl().detach())) and global_ > 0
    else:
        assert global_ == 0.0
    assert f.train_seconds > 0 and f.params["num_components"] == K
    torch.testing.assert_close(r.probs.sum(-1), torch.ones(S, 8))
