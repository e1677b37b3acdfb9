"""The study's density read (bayesattn.study.density_methods): the interop read fitted on the
deterministic network's views, one pass shared between prediction and own score, nothing of the
network refitted, the read's KL reported."""

import pytest
import torch

from bayesattn.posthoc._density_core import fit_class_density
from bayesattn.posthoc.features import extract_features
from bayesattn.study import StudyConfig, get_method
from bayesattn.study.runs import Run


def state_views(net, x):
    f = extract_features(net, x)
    return f.logits, f.cls, f.tokens


def pooled_features(net, x):
    return extract_features(net, x, tokens=False).cls


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
    # prediction and own score share one pass on the same inputs; bit for bit the two-pass
    # values (state_views before the one-pass features)
    assert run.views("", x) is run.views("", x)
    assert torch.equal(m.predict(f, x).probs[0], read.probs(lx, [cx, tx]).float())


def test_density_pair_averages_two_members_reads_fitted_each_on_its_own_features(run):
    m = get_method("density_pair")
    f = m.fit(run)
    nets, _ = run.members(2)
    assert f.nets == nets and nets[0] is not nets[1]
    d, x = run.data, run.data.x_test[:16]
    probs, scores = [], []
    for net in nets:  # independent: the core read fitted by hand on each member's own views
        _, cls, tok = state_views(net, d.x_train)
        vl, vcls, vtok = state_views(net, d.x_val)
        read = fit_class_density([cls, tok], d.y_train, [vcls, vtok], d.y_val, d.num_classes,
                                 val_logits=vl)
        lx, cx, tx = state_views(net, x)
        probs.append(read.probs(lx, [cx, tx]).float())
        scores.append(read.score([cx, tx]))
    got = m.predict(f, x)
    assert got.probs.shape == (2, 16, d.num_classes)
    torch.testing.assert_close(got.probs, torch.stack(probs))
    torch.testing.assert_close(m.score(f, run, x), (scores[0] + scores[1]) / 2)
    assert not torch.allclose(scores[0], scores[1])  # two networks, two reads
    # member 0's read is the density method's own
    torch.testing.assert_close(got.probs[0], get_method("density").predict(
        get_method("density").fit(run), x).probs[0])
    assert len(f.params["temperature"]) == 2 and m.posterior_kl(f, run)[1] > 0


def test_density_pair_is_the_library_read_ensemble(run):
    from bayesattn.posthoc import ReadEnsemble

    m = get_method("density_pair")
    f = m.fit(run)
    d, x = run.data, run.data.x_test[:16]
    ens = ReadEnsemble.of(f.nets, views=("cls", "tokens")).fit(d.x_train, d.y_train,
                                                                val=(d.x_val, d.y_val))  # fmt: skip
    res, score = ens.predict_and_score(x)
    torch.testing.assert_close(m.predict(f, x).probs, res.probs)
    torch.testing.assert_close(m.score(f, run, x), score)


def test_density_cls_pair_reads_each_members_cls_from_a_cls_only_pass(run):
    from bayesattn.posthoc import ReadEnsemble

    m = get_method("density_cls_pair")
    f = m.fit(run)
    nets, _ = run.members(2)
    assert f.nets == nets and f.params["views"] == ["cls"]
    d, x = run.data, run.data.x_test[:16]
    probs, scores = [], []
    for net in nets:  # independent: the core read of each member's pooled CLS, fitted by hand
        vl = extract_features(net, d.x_val, tokens=False).logits
        read = fit_class_density([pooled_features(net, d.x_train)], d.y_train,
                                 [pooled_features(net, d.x_val)], d.y_val, d.num_classes,
                                 val_logits=vl)  # fmt: skip
        fx = extract_features(net, x, tokens=False)
        probs.append(read.probs(fx.logits, [fx.cls]).float())
        scores.append(read.score([fx.cls]))
    res, score = m.predict_and_score(f, run, x)
    torch.testing.assert_close(res.probs, torch.stack(probs))
    torch.testing.assert_close(score, (scores[0] + scores[1]) / 2)
    ens = ReadEnsemble.of(nets, views=("cls",)).fit(d.x_train, d.y_train, val=(d.x_val, d.y_val))
    lib_res, lib_score = ens.predict_and_score(x)
    torch.testing.assert_close(res.probs, lib_res.probs)
    torch.testing.assert_close(score, lib_score)
    # the CLS-only pass: no token view was computed for the pair
    assert run.passes("", x, member=1).tokens is None


@pytest.mark.parametrize("name", ["density", "density_pair", "density_cls_pair", "deterministic"])
def test_predict_and_score_is_predict_and_score_with_one_density_evaluation(run, name, monkeypatch):
    """What the study times is the method's predictive and own score, bit for bit, each density
    evaluated once per member and call."""
    from bayesattn.posthoc import _density_core
    from bayesattn.study import metrics

    m = get_method(name)
    f = m.fit(run)
    x = run.data.x_test[:16]
    res, score = m.predict_and_score(f, run, x)
    assert torch.equal(res.probs, m.predict(f, x).probs)
    assert score is None if name == "deterministic" else torch.equal(score, m.score(f, run, x))
    calls = []
    plain = _density_core.ClassDensityRead.score
    monkeypatch.setattr(_density_core.ClassDensityRead, "score",
                        lambda self, v: calls.append(1) or plain(self, v))  # fmt: skip
    metrics._cost(m, f, run)  # warm-up, 3 calls at batch 512, 15 at batch 1
    members = {"density": 1, "deterministic": 0}.get(name, 2)
    assert len(calls) == (1 + 3 + 15) * members
