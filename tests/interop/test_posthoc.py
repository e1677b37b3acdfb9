"""Post-hoc calibration: frozen weights, attention posteriors + temperature by SVI, predictive."""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

import bayesattn
from bayesattn import calibration as C
from bayesattn.posthoc import _svi_core as posthoc

E, H, K = 16, 4, 3


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    pyro.clear_param_store()


class Classifier(nn.Module):
    """Plain torch: broadcasts over leading sample dims (mean over tokens at dim -2)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, E)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(E, H, 32, 0.1, batch_first=True), 2,
            enable_nested_tensor=False,
        )  # fmt: skip
        self.head = nn.Linear(E, K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(x)).mean(-2))


def _data(n=64):
    x = torch.randint(0, 10, (n, 6))
    return x, (x == 3).sum(1).clamp(max=K - 1)


def test_fit_moves_only_posteriors_and_temperature():
    model = bayesattn.convert(Classifier(), family="dirichlet")
    model.train()  # restored afterwards
    x, y = _data()
    frozen = {k: v.clone() for k, v in model.state_dict().items() if ".family." not in k}
    fams = [m.family for m in bayesattn.interop.bayesian_attention_modules(model).values()]
    kappa0 = [f.log_concentration.detach().clone() for f in fams]
    cal = posthoc.fit_posthoc(model, x, y, steps=15, batch_size=32, lr=0.05)
    assert model.training
    assert all(p.requires_grad for p in model.parameters())  # flags restored
    assert len(cal.history) == 15 and all(torch.isfinite(torch.tensor(cal.history)))
    state = model.state_dict()
    for k, v in frozen.items():
        torch.testing.assert_close(state[k], v, rtol=0, atol=0)
    assert any(not torch.equal(f.log_concentration, k0) for f, k0 in zip(fams, kappa0, strict=True))
    assert cal.temperature != 1.0
    with pytest.raises(ValueError, match="convert it first"):
        posthoc.fit_posthoc(Classifier(), x, y, steps=1)
    with pytest.raises(ValueError, match="y must be"):
        posthoc.fit_posthoc(model, x, y[:3], steps=1)


def test_repeat_and_vectorised_predictives_agree():
    model = bayesattn.convert(Classifier().eval(), family="dirichlet")
    x, _ = _data(4)
    S = 400
    rep = posthoc.sample_probs(model, x, S, method="repeat", batch_size=64)  # several chunks
    vec = posthoc.sample_probs(model, x, S, method="vectorised")
    assert rep.shape == vec.shape == (S, 4, K)
    torch.testing.assert_close(rep.sum(-1), torch.ones(S, 4))
    assert rep.std(0).max() > 1e-3  # draws differ
    # same predictive distribution: Monte-Carlo means and spreads agree
    torch.testing.assert_close(rep.mean(0), vec.mean(0), atol=0.02, rtol=0)
    torch.testing.assert_close(rep.std(0), vec.std(0), atol=0.02, rtol=0)
    with pytest.raises(ValueError, match="method='repeat'"):
        flat = nn.Sequential()  # a model that cannot carry a sample dim
        posthoc.sample_probs(
            model, x, 3, method="vectorised", forward=lambda m, x: flat(m(x).mean(0))
        )


def test_mean_probs_and_evaluate_against_calibration_functions():
    model = Classifier().eval()
    x, y = _data(32)
    with torch.no_grad():
        want = torch.softmax(model(x) / 2.0, -1)
    bayesattn.convert(model, family="dirichlet")
    p = posthoc.mean_probs(model, x, temperature=2.0)
    torch.testing.assert_close(p[0], want, atol=1e-6, rtol=0)
    q = posthoc.sample_probs(model, x, 5, temperature=2.0)
    m = posthoc.evaluate(q, y, posthoc.sample_probs(model, x.flip(1), 5))
    pm = q.mean(0).double()
    assert m["ece"] == pytest.approx(C.expected_calibration_error(pm, y))
    assert m["nll"] == pytest.approx(C.negative_log_likelihood(pm, y))
    assert 0.0 <= m["ood_auroc"] <= 1.0 and set(m) == {"accuracy", "ece", "nll", "brier", "ood_auroc"}  # fmt: skip
    with pytest.raises(ValueError, match=r"\(S, B, C\)"):
        posthoc.evaluate(q[0], y)


def test_dict_inputs_for_transformers_models():
    transformers = pytest.importorskip("transformers")
    from bayesattn.interop.hf import convert_hf

    cfg = transformers.BertConfig(
        hidden_size=E, num_hidden_layers=1, num_attention_heads=H, intermediate_size=32,
        vocab_size=20, max_position_embeddings=8, num_labels=2, attn_implementation="eager",
    )  # fmt: skip
    model = convert_hf(transformers.BertForSequenceClassification(cfg).eval(), family="dirichlet")
    ids = torch.randint(0, 20, (10, 8))
    x = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    y = torch.randint(0, 2, (10,))

    def fwd(m, x):
        return m(**x).logits

    cal = posthoc.fit_posthoc(model, x, y, forward=fwd, steps=3, batch_size=4)
    probs = cal.sample_probs(x, 6)
    assert probs.shape == (6, 10, 2)
    with pytest.raises(ValueError, match="batch size"):
        posthoc.sample_probs(model, {"input_ids": ids, "attention_mask": ids[:3]}, 2, forward=fwd)


def test_fit_refuses_nan_logits_and_bad_labels_and_keeps_parameters_finite():
    """A model with NaN logits stops with FloatingPointError before any step (T and the family
    parameters stay finite and unchanged); bad labels, dtypes, empty sets and seeds are named."""
    model = bayesattn.convert(Classifier(), family="dirichlet")
    x, y = _data(16)
    fams = [m.family for m in bayesattn.interop.bayesian_attention_modules(model).values()]
    before = [f.log_concentration.detach().clone() for f in fams]
    with torch.no_grad():
        model.head.bias.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match="logits are not finite"):
        posthoc.fit_posthoc(model, x, y, steps=3, batch_size=8)
    for f, b in zip(fams, before, strict=True):
        assert torch.equal(f.log_concentration, b)
    assert all(p.requires_grad for p in model.parameters())  # flags restored on the error path
    model = bayesattn.convert(Classifier(), family="dirichlet")
    with pytest.raises(ValueError, match=r"labels in \[0, 3\)"):
        posthoc.fit_posthoc(model, x, torch.full_like(y, 5), steps=1)
    with pytest.raises(ValueError, match=r"labels in \[0, 3\)"):
        posthoc.fit_posthoc(model, x, torch.full_like(y, -1), steps=1)
    with pytest.raises(TypeError, match="integer class labels"):
        posthoc.fit_posthoc(model, x, y.float(), steps=1)
    with pytest.raises(ValueError, match="empty"):
        posthoc.fit_posthoc(model, x[:0], y[:0], steps=1)
    with pytest.raises(ValueError, match="seed"):
        posthoc.fit_posthoc(model, x, y, steps=1, seed=-1)
    with pytest.raises(ValueError, match="logits"):
        posthoc.fit_posthoc(model, x, y, steps=1, forward=lambda m, xb: m(xb)[0])


# ---- issue 33: round 4 ------------------------------------------------------------------------
def test_evaluate_refuses_ood_probabilities_of_another_class_count():
    p_in = torch.softmax(torch.randn(4, 6, 3), -1)
    p_ood = torch.softmax(torch.randn(4, 5, 2), -1)
    with pytest.raises(ValueError, match="probs_ood must have the same class count C as probs"):
        posthoc.evaluate(p_in, torch.randint(0, 3, (6,)), p_ood)


def test_fit_posthoc_takes_int32_labels():
    x, y = _data(16)
    model = bayesattn.convert(Classifier(), family="dirichlet")
    cal = posthoc.fit_posthoc(model, x, y.int(), steps=2, batch_size=8)
    assert len(cal.history) == 2


class _NoSampleDim(nn.Module):
    """A model that reshapes with the batch size it was given: it cannot broadcast samples."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, E)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True), 1,
            enable_nested_tensor=False,
        )  # fmt: skip
        self.w = nn.Parameter(torch.randn(E, K))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x))
        return h.reshape(x.shape[0], x.shape[1], E).mean(1) @ self.w


def test_vectorised_sampling_of_a_model_without_a_sample_dim_is_a_clear_error():
    model = bayesattn.convert(_NoSampleDim(), family="dirichlet")
    x, _ = _data(4)
    with pytest.raises(ValueError, match="does not broadcast the samples.*method='repeat'"):
        posthoc.sample_probs(model, x, 4, method="vectorised")
    assert posthoc.sample_probs(model, x, 4).shape == (4, 4, K)  # batched repetition works
