"""bayesattn.predictive: the one posterior-predictive engine; every old entry point is a call of it.

Each entry point is run twice from the same seed, once through its public function and once
through ``Predictive`` directly: the outputs must be bit-identical (``torch.equal``), so no entry
point can drift into its own sampling path again. Independent references: a hand-written MC
dropout loop, ``torch.softmax`` of the deterministic forward, Pyro's own ``Predictive``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from pyro.infer import Predictive as PyroPredictive
from torch import nn

import bayesattn.diagnostics as D
from bayesattn import convert
from bayesattn.data.sequences import make_reverse_task
from bayesattn.nn.blocks import AttentionConfig
from bayesattn.nn.networks import CausalLM, Seq2Seq, TransformerClassifier
from bayesattn.nn.weights import bayesian_projections
from bayesattn.predictive import PredictionResult, Predictive
from bayesattn.uncertainty import predict, predict_ensemble, predict_mc_dropout

SMALL = dict(d_model=8, nhead=2, dim_feedforward=16)


def _clf(family: str | None = "dirichlet", dropout: float = 0.0, seed: int = 0):
    torch.manual_seed(seed)
    att = AttentionConfig(family) if family else None
    return TransformerClassifier(
        3, vocab_size=7, num_layers=2, attention=att, dropout=dropout, **SMALL
    )


def _x(B: int = 5, T: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 7, (B, T), generator=g)
    x[0, -1] = 0  # one padding token
    return x


def _same(fn_a, fn_b, seed: int = 3):
    """Both calls from the same global seed."""
    torch.manual_seed(seed)
    a = fn_a()
    torch.manual_seed(seed)
    b = fn_b()
    return a, b


def _assert_same_result(a: PredictionResult, b: PredictionResult) -> None:
    assert torch.equal(a.probs, b.probs) and a.kind == b.kind
    assert a.attention.keys() == b.attention.keys()
    for k in a.attention:
        assert torch.equal(a.attention[k].samples, b.attention[k].samples), k
    assert (a.mask is None) == (b.mask is None)
    if a.mask is not None:
        assert torch.equal(a.mask, b.mask)


@pytest.mark.parametrize("mode", ["guide", "model", "mean"])
def test_predict_is_the_engine(mode):
    net = _clf()
    bayesian_projections(net, init_scale=0.1)
    a, b = _same(
        lambda: predict(net, _x(), 4, batch_size=2, mode=mode),
        lambda: Predictive(net, 4, 2, mode=mode)(_x()),
    )
    _assert_same_result(a, b)
    assert a.probs.shape == (4, 5, 3) and a.attention  # attention kept by default


def test_mc_dropout_is_the_engine_and_a_hand_written_loop():
    net = _clf(dropout=0.3)
    a, b = _same(
        lambda: predict_mc_dropout(net, _x(), 6, batch_size=3),
        lambda: Predictive(net, 6, 3, mode="mean", dropout=True, keep_attention=False)(_x()),
    )
    _assert_same_result(a, b)
    assert a.kind == "mc_dropout" and float(a.mutual_information.mean()) > 0
    assert net.training  # flags restored (a new network is in training mode)
    # independent: one sample is one forward with every dropout on and mean attention
    from bayesattn.nn.modes import attention_mode

    net.eval()
    torch.manual_seed(0)
    with torch.no_grad(), attention_mode("mean"):
        for m in net.modules():
            if isinstance(m, nn.Dropout):
                m.train()
        ref = torch.softmax(net(_x()), -1)
    net.eval()
    torch.manual_seed(0)
    got = Predictive(net, 1, mode="mean", dropout=True, keep_attention=False)(_x()).probs
    torch.testing.assert_close(got[0], ref)


def test_ensemble_is_the_engine_and_stacks_members():
    nets = [_clf(seed=s) for s in range(3)]
    a, b = _same(
        lambda: predict_ensemble(nets, _x(), mode="guide", num_samples=2),
        lambda: Predictive(nets, 2, mode="guide")(_x()),
    )
    _assert_same_result(a, b)
    assert a.probs.shape == (6, 5, 3) and a.kind == "ensemble/guide" and not a.attention
    # mean mode: one deterministic forward per member, in member order
    m = Predictive(nets, 4, mode="mean")(_x())
    with torch.no_grad():
        ref = torch.stack([torch.softmax(n.eval()(_x()), -1) for n in nets])
    torch.testing.assert_close(m.probs, ref)


@pytest.mark.parametrize("vectorised", [False, True])
def test_foreign_predict_is_the_engine(vectorised):
    torch.manual_seed(0)

    class Foreign(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 1)
            self.head = nn.Linear(8, 3)

        def forward(self, z):
            return self.head(self.enc(z).mean(-2))

    model = convert(Foreign(), family="dirichlet")
    z = torch.randn(5, 4, 8)
    a, b = _same(
        lambda: predict(model, z, 3, batch_size=4, vectorised=vectorised, temperature=2.0),
        lambda: Predictive(model, 3, 4, vectorised=vectorised, temperature=2.0)(z),
    )
    _assert_same_result(a, b)
    assert a.probs.shape == (3, 5, 3)


def test_sequence_models_and_lightning_validation_are_the_engine():
    pytest.importorskip("lightning")
    from bayesattn.training.lightning import predictive_probs

    task = make_reverse_task(8, length=5, vocab_size=8, seed=0)
    torch.manual_seed(0)
    s2s = Seq2Seq(
        task.src_vocab_size, task.tgt_vocab_size, d_model=16, nhead=2, num_encoder_layers=1,
        num_decoder_layers=1, dim_feedforward=32, max_len=16,
        attention=AttentionConfig(family="dirichlet", which=("cross",)),
    )  # fmt: skip
    src, tgt = task.src[:4], task.tgt[:4]
    a, b = _same(lambda: predict(s2s, src, 3, y=tgt), lambda: Predictive(s2s, 3)(src, tgt))
    _assert_same_result(a, b)
    # validation: the averaged predictive at the non-padding targets
    (p, t), (q, u) = _same(
        lambda: predictive_probs(s2s, src, tgt, 3),
        lambda: Predictive(s2s, 3, keep_attention=False).probs_and_targets(src, tgt),
    )
    assert torch.equal(p, q) and torch.equal(t, u)
    mask = a.mask
    assert mask is not None and p.shape == (int(mask.sum()), task.tgt_vocab_size)
    torch.manual_seed(3)
    full = Predictive(s2s, 3, keep_attention=False)(src, tgt)
    assert torch.equal(p, full.mean_probs[mask])
    # a classifier: scored on its labels
    net, y = _clf(), torch.tensor([0, 1, 2, 0, 1])
    (p, t), (q, _) = _same(
        lambda: predictive_probs(net, _x(), y, 4),
        lambda: Predictive(net, 4, keep_attention=False).probs_and_targets(_x(), y),
    )
    assert torch.equal(p, q) and torch.equal(t, y) and p.shape == (5, 3)
    # a deterministic language model: its one pass, exactly the softmax of its logits
    torch.manual_seed(0)
    lm = CausalLM(8, d_model=16, nhead=2, num_layers=1, dim_feedforward=32, max_len=16)
    x = tgt[:, :7].clamp_max(7)
    p, t = predictive_probs(lm, x, None, 3)
    logits, tmask = lm.eval().forward_logits(x, None, 1), lm.targets(x, None)[1]
    assert torch.equal(p, torch.softmax(logits, -1)[tmask])


def test_network_draws_is_the_engine_and_pyro_predictive():
    net, x = _clf(), _x()
    y = torch.tensor([0, 1, 2, 0, 1])
    for parallel in (True, False):
        a = D.network_draws(net, x, y, 4, seed=0, parallel=parallel)
        b = Predictive(net, 4).trace(x, y, seed=0, parallel=parallel)
        assert torch.equal(a.predictive, b.predictive)
        assert a.log_likelihood is not None and b.log_likelihood is not None
        assert torch.equal(a.log_likelihood, b.log_likelihood)
        assert a.sites.keys() == b.sites.keys() and a.sites
        assert all(torch.equal(a.sites[k], b.sites[k]) for k in a.sites)
    # independent: Pyro's own Predictive, the model conditioned on our latent draws, recomputes
    # the same attention weights
    lat, w = "encoder.layers.0.self_attn.latent", "encoder.layers.0.self_attn.weights"
    ours = Predictive(net, 3).trace(x, y, var_names=[lat, w], parallel=False).sites
    net.eval()
    with torch.no_grad():
        pyro_pred = PyroPredictive(net.model, posterior_samples={lat: ours[lat]}, return_sites=[w])
        ref = pyro_pred(x, y)[w]
    torch.testing.assert_close(ours[w].reshape(ref.shape), ref)


def test_one_arviz_export_reads_results_networks_and_engines():
    net, x = _clf(), _x()
    y = torch.tensor([0, 1, 2, 0, 1])
    res = Predictive(net, 4)(x)
    torch.manual_seed(9)
    new = D.predictive_to_arviz(res, y=y)
    assert not hasattr(D, "prediction_to_arviz")  # its deprecated alias, removed in 0.4
    assert new.posterior["probs"].shape == (1, 4, 5, 3)
    # a network, or an engine built on one: the same trace draws
    a = D.predictive_to_arviz(net, x, y, num_samples=4, seed=0)
    b = D.predictive_to_arviz(Predictive(net, 4), x, y, seed=0)
    assert (a.log_likelihood["obs"].values == b.log_likelihood["obs"].values).all()
    with pytest.raises(ValueError, match="x"):
        D.predictive_to_arviz(res, x, y)
    with pytest.raises(ValueError, match="x"):
        D.predictive_to_arviz(net, y=y)
    with pytest.raises(TypeError, match="PredictionResult"):
        D.predictive_to_arviz(res.probs, y=y)


def test_engine_errors_name_the_argument():
    net = _clf()
    with pytest.raises(ValueError, match="num_samples"):
        Predictive(net, 0)
    with pytest.raises(ValueError, match="batch_size"):
        Predictive(net, 2, 0)
    with pytest.raises(ValueError, match="mode"):
        Predictive(net, 2, mode="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="forward, temperature and vectorised"):
        Predictive(net, 2, temperature=2.0)
    with pytest.raises(TypeError, match="dropout"):
        Predictive([net, net], 2, dropout=True)
    with pytest.raises(TypeError, match="one network type"):
        Predictive([net, _clf().to(torch.float64), Seq2Seq(5, 5, d_model=8, nhead=2)], 2)
    with pytest.raises(ValueError, match="at least one"):
        Predictive([], 2)
    with pytest.raises(TypeError, match="BayesianNetwork"):
        Predictive(object(), 2)(_x())
    with pytest.raises(TypeError, match="ensemble"):
        Predictive([net], 2).trace(_x())
    with pytest.raises(ValueError, match="labels y"):
        Predictive(net, 2).probs_and_targets(_x())
    with pytest.raises(TypeError, match="sequence of BayesianNetworks"):
        predict_ensemble(net, _x())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="BayesianNetwork"):
        predict([net, net], _x())  # an ensemble is predict_ensemble's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert "num_samples=2" in repr(Predictive(net, 2))


# ---- issue 33: round 4 ------------------------------------------------------------------------
def _tiny_classifier():
    torch.manual_seed(0)
    return TransformerClassifier(3, vocab_size=6, d_model=8, nhead=2, num_layers=1,
                                 dim_feedforward=16, attention="dirichlet")  # fmt: skip


def test_probs_and_targets_checks_a_classifiers_labels():
    net = _tiny_classifier()
    x = torch.randint(1, 6, (5, 4))
    engine = Predictive(net, 2)
    for y, err, msg in (
        (torch.tensor([0, 1, 2]), ValueError, r"y must be \(B,\) = \(5,\)"),
        (torch.tensor([0, 1, 2, 3, 0]), ValueError, r"labels y must be in \[0, 3\)"),
        (torch.tensor([0, 1, -1, 2, 0]), ValueError, r"labels y must be in \[0, 3\)"),
        (torch.zeros(5), TypeError, "integer labels"),
        (torch.zeros(5, 1, dtype=torch.long), ValueError, r"y must be \(B,\)"),
    ):
        with pytest.raises(err, match=msg):
            engine.probs_and_targets(x, y)
    probs, targets = engine.probs_and_targets(x, torch.tensor([0, 1, 2, 0, 1]))
    torch.testing.assert_close(probs.sum(-1), torch.ones(5))


def test_more_draws_than_memory_is_a_clear_error_not_an_allocation_attempt(monkeypatch):
    """batch_size bounds the inputs per pass, not the samples: Predictive(net, 10**9,
    batch_size=1) tried to allocate 160 GB. The result alone is checked against the machine's
    memory, and a pass that cannot allocate says which argument to lower."""
    from bayesattn.predictive import network as N

    net = _tiny_classifier()
    x = torch.randint(1, 6, (3, 4))
    monkeypatch.setattr(N, "_memory_bytes", lambda: 2**30)  # a 1 GiB machine
    with pytest.raises(ValueError, match=r"num_samples=100000000 draws .* more than this"):
        Predictive(net, 10**8, batch_size=1)(x)

    def no_memory(*a, **k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")

    monkeypatch.setattr(N, "_run_pass", no_memory)
    with pytest.raises(ValueError, match=r"num_samples=4 samples .* do not fit in memory"):
        Predictive(net, 4, batch_size=1)(x)


def test_forward_must_be_callable_and_models_must_hold_values():
    model = nn.Sequential(nn.Linear(4, 3))
    with pytest.raises(TypeError, match=r"forward must be a callable \(model, x\) -> logits"):
        Predictive(model, 2, forward=3)
    with pytest.raises(ValueError, match="'0.weight' is on the meta device"):
        Predictive(model.to("meta"), 2)(torch.randn(2, 4))
