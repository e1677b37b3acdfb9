"""ReadEnsemble: each network's read fitted on its own features, predictives stacked and scores
averaged, checked against reads fitted one by one (and, in the study, against density_pair)."""

from __future__ import annotations

import io

import pytest
import torch

from bayesattn.posthoc import DensityRead, GPRead, ReadEnsemble, TemperatureRead, extract_features

from .test_reads import Encoder, _data


def _nets(n: int = 2) -> list[Encoder]:
    nets = []
    for s in range(n):
        torch.manual_seed(s)
        nets.append(Encoder().eval())
    return nets


def test_the_ensemble_is_its_reads_fitted_one_by_one():
    x, y = _data()
    nets = _nets()
    ens = ReadEnsemble.of(nets).fit(x[:90], y[:90], val=(x[90:], y[90:]))
    alone = [DensityRead(n).fit(x[:90], y[:90], val=(x[90:], y[90:])) for n in nets]
    q = x[120:]
    res = ens.predict(q)
    assert res.probs.shape == (2, 30, 3) and res.kind == "posthoc/ensemble"
    torch.testing.assert_close(res.probs, torch.cat([r.predict(q).probs for r in alone]))
    torch.testing.assert_close(ens.score(q), (alone[0].score(q) + alone[1].score(q)) / 2)
    assert not torch.allclose(alone[0].score(q), alone[1].score(q))
    both, score = ens.predict_and_score(q)
    assert torch.equal(both.probs, res.probs) and torch.equal(score, ens.score(q))
    torch.testing.assert_close(res.mean_probs, (alone[0].predict(q).probs[0]
                                                + alone[1].predict(q).probs[0]) / 2)  # fmt: skip
    assert res.mutual_information.min() >= 0 and res.mutual_information.max() > 0
    assert ens.kl() == pytest.approx(alone[0].kl() + alone[1].kl())


def test_reads_without_predict_and_score_and_with_draws():
    x, y = _data()
    nets = _nets(3)
    val = (x[90:], y[90:])
    mixed = ReadEnsemble([GPRead(nets[0], num_features=32), TemperatureRead(nets[1]),
                          DensityRead(nets[2])]).fit(x[:90], y[:90], val=val)  # fmt: skip
    q = x[120:]
    res, score = mixed.predict_and_score(q)  # TemperatureRead has no predict_and_score
    assert torch.allclose(score, mixed.score(q)) and mixed.num_classes == 3
    assert res.probs.shape[1:] == (30, 3)
    gps = ReadEnsemble.of(nets[:2], GPRead, num_features=32).fit(x[:90], y[:90], val=val)
    draws = gps.predict(q, num_samples=4)
    assert draws.probs.shape == (8, 30, 3)  # M·S draws
    torch.testing.assert_close(draws.probs[4:], gps.reads[1].predict(q, num_samples=4).probs)


def test_saved_ensembles_load_with_weights_only():
    x, y = _data()
    nets = _nets()
    ens = ReadEnsemble.of(nets).fit(x[:90], y[:90], val=(x[90:], y[90:]))
    buf = io.BytesIO()
    torch.save(ens.state_dict(), buf)
    buf.seek(0)
    fresh = ReadEnsemble.of(nets).load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(fresh.predict(x[:9]).probs, ens.predict(x[:9]).probs)
    assert torch.equal(fresh.score(x[:9]), ens.score(x[:9]))
    with pytest.raises(ValueError, match="state holds 2 reads; this ensemble has 3"):
        ReadEnsemble.of(_nets(3)).load_state_dict(ens.state_dict())


def test_bad_ensembles_are_refused_with_a_clear_error():
    nets = _nets()
    with pytest.raises(ValueError, match="at least 2"):
        ReadEnsemble([DensityRead(nets[0])])
    with pytest.raises(TypeError, match="sequence of post-hoc reads"):
        ReadEnsemble(DensityRead(nets[0]))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"reads\[1\] must be a PosthocRead"):
        ReadEnsemble([DensityRead(nets[0]), nets[1]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"reads\[1\] \(DensityRead\) has no model"):
        ReadEnsemble([DensityRead(nets[0]), DensityRead()])
    with pytest.raises(ValueError, match="same network"):
        ReadEnsemble([DensityRead(nets[0]), DensityRead(nets[0])])
    with pytest.raises(TypeError, match="sequence of networks"):
        ReadEnsemble.of(nets[0])  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not fitted"):
        ReadEnsemble.of(nets).score(_data()[0][:4])


def test_features_of_each_network_differ():
    """Why every read holds its own network: one set of features would read one network."""
    x, _ = _data()
    a, b = (extract_features(n, x[:8]) for n in _nets())
    assert not torch.allclose(a.cls, b.cls)
