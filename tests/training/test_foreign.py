"""``fit`` trains any ``nn.Module`` that returns logits (:mod:`bayesattn.nn.networks.foreign`): converted
torch and transformers models, with and without Bayesian layers, by both methods, with exact
resume."""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

import bayesattn
from bayesattn.nn.modes import attention_mode, collect_kl
from bayesattn.training import ModuleClassifier, Trainer, fit
from bayesattn.uncertainty import predict

E, H, V, T = 16, 2, 8, 6


@pytest.fixture(autouse=True)
def _seed():
    pyro.clear_param_store()
    torch.manual_seed(0)


class Encoder(nn.Module):
    """A plain torch classifier: embedding, one encoder layer, mean pool, linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, E)
        layer = nn.TransformerEncoderLayer(E, H, 32, 0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
        self.head = nn.Linear(E, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x)).mean(1))  # (B, 2)


def _task(n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, V, (n, T), generator=g)
    return x, (x == 3).any(1).long()  # balanced-ish: "does token 3 occur?"


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    probs = predict(model, x, num_samples=4).probs.mean(0)  # (B, C)
    return float((probs.argmax(-1) == y).float().mean())


@pytest.mark.parametrize("method", ["hybrid", "svi"])
def test_fit_trains_a_converted_torch_model_in_place(method):
    x, y = _task()
    model = bayesattn.convert(Encoder(), family="dirichlet")
    fam = dict(model.named_parameters())["enc.layers.0.self_attn.family.log_concentration"]
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert _accuracy(model, x[192:], y[192:]) < 0.75
    hist = fit(model, (x[:192], y[:192]), val_data=(x[192:], y[192:]), epochs=6,
               batch_size=32, lr=3e-3, progress=False, method=method)  # fmt: skip
    after = model.state_dict()
    assert not torch.equal(after["head.weight"], before["head.weight"])  # plain parameters
    assert not torch.equal(fam.detach(), before["enc.layers.0.self_attn.family.log_concentration"])
    assert not model.training  # left in eval mode, as a network is
    assert hist.val_acc[-1] > 0.8 and _accuracy(model, x[192:], y[192:]) > 0.8
    # the trained model's layers draw: predict gives spread, eval() alone is deterministic
    assert float(predict(model, x[:8], num_samples=8).probs.std(0).max()) > 1e-4
    torch.testing.assert_close(model(x[:8]), model(x[:8]), rtol=0, atol=0)


def test_fit_a_plain_module_without_bayesian_layers_is_cross_entropy():
    x, y = _task()
    model = Encoder()
    net = ModuleClassifier(model)
    assert net.bayesian_layers == []
    xb, yb = x[:32], y[:32]
    net.eval()
    loss, logits = net.elbo_loss(xb, yb, num_data=32)
    want = nn.functional.cross_entropy(model(xb), yb, reduction="sum")
    torch.testing.assert_close(loss, want)
    hist = fit(model, (x[:192], y[:192]), val_data=(x[192:], y[192:]), epochs=6, batch_size=32,
               lr=3e-3, progress=False)  # fmt: skip
    assert hist.val_acc[-1] > 0.8


def test_particles_repeat_rows_and_keep_per_example_kls():
    """``num_samples = S > 1``: batched repetition, logits ``(S, B, C)``, each copy its own draw;
    the layers' KLs ``(S·B,)`` come back as ``(S, B)``; ``"mean"`` mode is one pass."""
    x, _ = _task(4)
    model = bayesattn.convert(Encoder(), family="dirichlet")
    net = ModuleClassifier(model).train()
    with net.pyro_context, collect_kl() as col:
        out = net.forward_logits(x, num_samples=3)
    assert out.shape == (3, 4, 2) and (out[0] - out[1]).abs().max() > 1e-6
    assert [tuple(t.shape) for t in col.terms.values()] == [(3, 4)]
    with attention_mode("mean"):
        m = net.forward_logits(x, num_samples=3)
    torch.testing.assert_close(m[0], m[2], rtol=0, atol=0)
    hist = fit(model, _task(64), epochs=1, batch_size=32, num_particles=2,
               vectorize_particles=True, progress=False)  # fmt: skip
    assert len(hist.train_loss) == 1 and torch.isfinite(torch.tensor(hist.train_loss)).all()


def test_fit_trains_a_converted_hf_model():
    transformers = pytest.importorskip("transformers")
    from bayesattn.interop.hf import convert_hf

    cfg = transformers.BertConfig(
        hidden_size=E, num_hidden_layers=1, num_attention_heads=H, intermediate_size=32,
        vocab_size=V, max_position_embeddings=T, num_labels=2, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="eager",
    )  # fmt: skip
    model = convert_hf(transformers.BertForSequenceClassification(cfg), family="dirichlet")
    x, y = _task()
    hist = fit(model, (x[:192], y[:192]), val_data=(x[192:], y[192:]), epochs=8, batch_size=32,
               lr=5e-3, progress=False)  # fmt: skip
    assert hist.val_acc[-1] > 0.8 and _accuracy(model, x[192:], y[192:]) > 0.8
    assert float(predict(model, x[:8], num_samples=8).probs.std(0).max()) > 1e-4


def test_resume_is_exact(tmp_path):
    x, y = _task(128)
    ckpt = tmp_path / "ckpt.pt"
    torch.manual_seed(5)
    full = bayesattn.convert(Encoder(), family="dirichlet")
    init = {k: v.clone() for k, v in full.state_dict().items()}
    fit(full, (x, y), epochs=2, batch_size=32, progress=False)
    pyro.clear_param_store()
    part = bayesattn.convert(Encoder(), family="dirichlet")
    part.load_state_dict(init)
    fit(part, (x, y), epochs=2, batch_size=32, max_steps=5, checkpoint_path=ckpt, progress=False)
    pyro.clear_param_store()
    fresh = bayesattn.convert(Encoder(), family="dirichlet")
    fit(fresh, (x, y), checkpoint_path=ckpt, resume=True, max_steps=None, progress=False)
    for k, v in full.state_dict().items():
        torch.testing.assert_close(fresh.state_dict()[k], v, rtol=0, atol=0)


def test_errors_name_the_way():
    with pytest.raises(TypeError, match="ModuleClassifier"):
        fit(object(), _task(8), progress=False)
    with pytest.raises(ValueError, match="forward="):
        fit(nn.Embedding(V, 2), _task(8), epochs=1, progress=False)  # (B, T, 2): not (B, C)
    with pytest.raises(
        ValueError, match=r"Linear failed on a batch x .* dtype torch.int64.*forward="
    ):
        fit(nn.Linear(T, 2), _task(8), epochs=1, progress=False)  # ids into a float layer
    with pytest.raises(ValueError, match=r"y must be \(B,\)"):
        x, y = _task(8)
        fit(Encoder(), (x, y[:, None]), epochs=1, progress=False)
    with pytest.raises(TypeError, match="train it directly"):
        ModuleClassifier(bayesattn.nn.networks.TransformerClassifier(2, vocab_size=V, d_model=E))
    # forward= maps the model's own output to logits
    x, y = _task(64)
    net = ModuleClassifier(nn.Embedding(V, 2), forward=lambda m, x: m(x).mean(1))
    assert len(Trainer(net, epochs=1, batch_size=32, progress=False).fit((x, y)).train_loss) == 1
