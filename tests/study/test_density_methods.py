"""The study's density reads and spectrally normalised trunk (bayesattn.study.density_methods):
each is the interop read fitted on the trunk's views, shares one pass between prediction and
own score, refits nothing of the network, and reports the read's KL."""

import pytest
import torch

from bayesattn.interop.class_density import fit_class_density
from bayesattn.study import StudyConfig, get_method
from bayesattn.study.runs import SPECTRAL_NORM, Run, pooled_features, state_views


@pytest.fixture(scope="module")
def run():
    cfg = StudyConfig.quick(epochs=1, progress=False)
    return Run.load(cfg, "digits", (8, 9), 0)


def test_state_views_are_the_head_input_and_the_mean_token_state(run):
    net = run.members(1)[0][0]
    x = run.data.x_test[:20]
    logits, cls, tok = state_views(net, x)
    torch.testing.assert_close(cls, pooled_features(net, x), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, net.eval()(x), atol=1e-5, rtol=0)
    h, _ = net.encode(net.patchify(x), 1)
    torch.testing.assert_close(tok, h[:, 1:].mean(1), atol=1e-5, rtol=0)


def test_density_method_is_the_interop_read_on_the_views(run):
    m = get_method("density")
    f = m.fit(run)
    net = f.nets[0]
    before = [p.detach().clone() for p in net.parameters()]
    d = run.data
    _, cls, tok = state_views(net, d.x_train)
    vl, vcls, vtok = state_views(net, d.x_val)
    read = fit_class_density([cls, tok], d.y_train, [vcls, vtok], d.y_val, d.num_classes,
                             val_logits=vl)
    x = d.x_test[:16]
    lx, cx, tx = state_views(net, x)
    got = m.predict(f, x).probs
    assert got.shape == (1, 16, d.num_classes)
    torch.testing.assert_close(got[0], read.probs(lx, [cx, tx]).float())
    torch.testing.assert_close(m.score(f, run, x), read.score([cx, tx]))
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))
    local, global_ = m.posterior_kl(f, run)
    assert local == 0.0 and global_ == pytest.approx(read.kl()) and global_ > 0
    assert f.params["views"] == ["cls", "tokens"] and f.params["density_scale"] >= 0
    # prediction and own score share one pass on the same inputs
    assert run.views("plain", "", x) is run.views("plain", "", x)


def test_density_ablations_and_sampled_generative_classifier(run):
    x = run.data.x_test[:16]
    cls_only = get_method("density_cls")
    f = cls_only.fit(run)
    assert f.params["views"] == ["cls"] and f.state["read"].num_views == 1
    gda = get_method("density_gda")
    g = gda.fit(run)
    torch.manual_seed(0)
    p = gda.predict(g, x).probs
    assert p.shape == (run.cfg.num_samples, 16, run.data.num_classes)
    assert float(p.std(0).max()) > 0  # draws of the class parameters disagree


def test_spectral_trunk_is_bounded_shared_and_paired_with_member_zero(run):
    a, b = get_method("spectral"), get_method("spectral_density")
    fa, fb = a.fit(run), b.fit(run)
    assert fa.nets[0] is fb.nets[0] is run.spectral_member()[0]
    net = fa.nets[0]
    assert net.spectral_norm == SPECTRAL_NORM
    net.train()
    with torch.no_grad():  # power iteration (one step per training pass) converges slowly when
        for _ in range(200):  # the top singular values are close: the bound is approximate
            net(run.data.x_train[:8])
    net.eval()
    for m in net.encoder.modules():
        for name in getattr(m, "parametrizations", {}):
            assert float(torch.linalg.matrix_norm(getattr(m, name).detach(), 2)) <= SPECTRAL_NORM * 1.01
    gp = get_method("spectral_gp")
    fg = gp.fit(run)
    x = run.data.x_test[:8]
    assert gp.predict(fg, x).probs.shape == (1, 8, run.data.num_classes)
    assert (gp.score(fg, run, x) >= 0).all()
    with pytest.raises(ValueError, match="trunk must be"):
        run.trunk("other")
