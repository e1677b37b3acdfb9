"""A model we did not write as a network (``bayesattn.nn.networks.foreign.ModuleClassifier``):
its ``S`` samples take the one foreign sampling path, batched repetition folded at the first
Bayesian layer (``bayesattn.nn.fold.repeated_rows``), the path ``Predictive`` takes for the bare
model. Checked against the independent slow path, batched repetition of the whole model
(``fold=False``): with the same seed both draw the same weights in the same order."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from torch import nn

import bayesattn
from bayesattn.nn.fold import fold_plan
from bayesattn.nn.modes import attention_mode
from bayesattn.nn.networks import ModuleClassifier
from bayesattn.uncertainty import predict

E, H, C, S, B, T = 16, 4, 3, 6, 5, 7


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(E, H, 32, 0.1, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 3, enable_nested_tensor=False)
        self.head = nn.Linear(E, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(x).mean(-2))  # (B, C)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return bayesattn.convert(Classifier(), family="dirichlet", layers=[1])


def _draws(net: ModuleClassifier, x: torch.Tensor, seed: int = 3) -> torch.Tensor:
    torch.manual_seed(seed)
    with torch.no_grad(), attention_mode("guide"), net.pyro_context:
        return net.forward_logits(x, num_samples=S)  # (S, B, C)


def test_eval_pass_is_folded_and_equals_whole_model_repetition():
    model = _model()
    x = torch.randn(B, T, E)
    rows: list[list[int]] = [[] for _ in model.enc.layers]
    for i, m in enumerate(model.enc.layers):  # (sample ×) batch rows of each layer's output
        m.register_forward_hook(lambda m, a, o, r=rows[i]: r.append(o.numel() // (T * E)))
    net = ModuleClassifier(model).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fold applies: no fallback warning
        folded = _draws(net, x)
    assert rows == [[B], [S * B], [S * B]]  # layer 0, before the first Bayesian layer: once
    for r in rows:
        r.clear()
    full = _draws(ModuleClassifier(model, fold=False).eval(), x)
    assert rows == [[S * B]] * 3  # the old path: every layer on S·B rows
    torch.testing.assert_close(folded, full, rtol=0, atol=1e-5)
    assert folded.shape == (S, B, C) and folded.std(0).max() > 1e-3  # the draws differ


def test_training_mode_repeats_the_whole_model():
    """Dropout before the first Bayesian layer differs between the copies in training: no fold."""
    model = _model()
    net = ModuleClassifier(model).train()
    assert net._fold_plan() is None and fold_plan(model) is not None
    x = torch.randn(B, T, E)
    rows: list[int] = []
    model.enc.layers[0].register_forward_hook(lambda m, a, o: rows.append(o.shape[0]))
    with attention_mode("elbo"), net.pyro_context:
        net.forward_logits(x, num_samples=S)
    assert rows == [S * B]


def test_predict_on_the_wrapper_equals_predict_on_the_bare_model():
    """One sampling path: the network's predictive and the foreign-model predictive agree."""
    model = _model()
    x = torch.randn(B, T, E)
    torch.manual_seed(5)
    wrapped = predict(ModuleClassifier(model), x, num_samples=S).probs
    torch.manual_seed(5)
    bare = predict(model, x, num_samples=S).probs
    torch.testing.assert_close(wrapped, bare, rtol=0, atol=1e-6)
    assert wrapped.std(0).max() > 1e-3


def test_a_model_the_fold_cannot_follow_falls_back_with_the_same_draws():
    model = _model()
    x = torch.randn(B, T, E)

    def bad(m: nn.Module, xb: torch.Tensor) -> torch.Tensor:
        out = m(xb)
        return out[: xb.shape[0]]  # a forward that keeps only the input's batch rows

    net = ModuleClassifier(model, forward=bad).eval()
    with pytest.warns(UserWarning, match="batched repetition of the whole model"):
        got = _draws(net, x)
    want = _draws(ModuleClassifier(model, fold=False).eval(), x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("old", "names", "new"),
    [("bayesattn.training.foreign", ("ModuleClassifier", "as_network"),
      "bayesattn.nn.networks.foreign"),
     ("bayesattn.predictive.fold", ("FoldError", "FoldPlan", "fold_plan", "folded"),
      "bayesattn.nn.fold")],
)  # fmt: skip
def test_the_old_paths_warn_and_hand_out_the_moved_objects(old, names, new):
    mod, home = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        with pytest.warns(DeprecationWarning, match=f"{old}.{name} moved to {new}.{name}"):
            assert getattr(mod, name) is getattr(home, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        mod.nope  # noqa: B018
