"""Post-hoc rank-1 mixture on the attention projections of a frozen model (torch, converted, HF)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bayesattn
from bayesattn import calibration as C
from bayesattn.functional.mixture import rank1_weight
from bayesattn.posthoc._mixture_core import factor_logits, fit_posthoc_mixture
from bayesattn.posthoc.rank1_hooks import apply_factors, hook_count, rank1_sites

E, H, K = 16, 4, 3


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


class Classifier(nn.Module):
    """Plain torch encoder; ``batch_first=False`` puts the batch at dim 1 inside."""

    def __init__(self, batch_first: bool = True, scale: float = 1.0) -> None:
        super().__init__()
        self.batch_first, self.scale = batch_first, scale
        self.embed = nn.Embedding(10, E)
        layer = nn.TransformerEncoderLayer(E, H, 32, 0.1, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(E, K)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        if not self.batch_first:
            return self.scale * self.head(self.encoder(h.transpose(0, 1)).mean(0))
        return self.scale * self.head(self.encoder(h).mean(-2))


def _data(n: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(0, 10, (n, 6))
    return x, (x == 3).sum(1).clamp(max=K - 1)


def _torch_model(kind: str) -> nn.Module:
    model = Classifier(batch_first=kind != "seq_first")
    return bayesattn.convert(model) if kind == "converted" else model


def _hf_model() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=12, hidden_size=E, num_hidden_layers=2, num_attention_heads=H,
        intermediate_size=32, max_position_embeddings=8, num_labels=K,
        attn_implementation="eager", initializer_range=0.3,  # logits the factors visibly move
    )  # fmt: skip
    ids = torch.randint(2, 12, (5, 8))
    return transformers.BertForSequenceClassification(cfg).eval(), {
        "input_ids": ids, "attention_mask": torch.ones_like(ids),
    }  # fmt: skip


def _model_and_x(kind: str) -> tuple[nn.Module, object]:
    model, x = _hf_model() if kind.startswith("hf") else (_torch_model(kind).eval(), _data(5)[0])
    if kind == "hf_converted":  # through bayesattn's AttentionInterface function
        from bayesattn.interop.hf import convert_hf

        convert_hf(model, family=None)
    with torch.no_grad():  # nonzero biases (they start at 0): the output side must spare them
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model, x


def _fwd(m: nn.Module, x: object) -> torch.Tensor:
    return m(**x).logits if isinstance(x, dict) else m(x)


@torch.no_grad()
def _reference(model: nn.Module, x: object, sites: list, theta: torch.Tensor) -> torch.Tensor:
    """The loop reference: for each draw, rescale the weights themselves
    (``rank1_weight``), run the plain model, restore the weights."""
    out = []
    saved = {id(p): p.detach().clone() for p in model.parameters()}
    for t in theta:
        for st in sites:
            f = t[st.offset : st.offset + st.size]
            if st.hooked == "linear":
                w = st.module.weight
                ones_in, ones_out = torch.ones(w.shape[1]), torch.ones(w.shape[0])
                r, s = (f, ones_out) if st.side == "in" else (ones_in, f)
                w.copy_(rank1_weight(w, r, s))
            elif st.role == "o":
                st.module.out_proj.weight.mul_(f[:, None])
            else:
                i = "qkv".index(st.role)
                st.module.in_proj_weight[i * E : (i + 1) * E].mul_(f[None, :])
        out.append(_fwd(model, x))
        for p in model.parameters():
            p.copy_(saved[id(p)])
    return torch.stack(out)  # (J, B, C)


KINDS = ["plain", "seq_first", "converted", "hf", "hf_converted"]


@pytest.mark.parametrize("kind", KINDS)
def test_identity_factors_reproduce_the_frozen_logits(kind):
    model, x = _model_and_x(kind)
    sites = rank1_sites(model)
    assert len(sites) == (16 if kind.startswith("hf") else 8)  # 2 layers × (8 HF | 4 MHA) sites
    with torch.no_grad():
        want = _fwd(model, x)
        got = factor_logits(model, _fwd, x, sites, torch.ones(3, sites[-1].offset + E))
    for j in range(3):
        torch.testing.assert_close(got[j], want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_vectorised_pass_equals_a_loop_over_rescaled_weights(kind):
    model, x = _model_and_x(kind)
    sites = rank1_sites(model)
    theta = 1 + 0.3 * torch.randn(K, sites[-1].offset + sites[-1].size)
    with torch.no_grad():
        got = factor_logits(model, _fwd, x, sites, theta)  # one pass, (K·B) rows
    want = _reference(model, x, sites, theta)
    assert not torch.allclose(want[0], want[1], atol=1e-3)  # the draws do differ
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_fit_lowers_nll_freezes_the_model_and_leaves_no_hooks():
    model = Classifier(scale=4.0)  # over-confident: a temperature alone already helps
    model.train()  # restored afterwards
    x, y = _data(64)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = hook_count(model)
    with torch.no_grad():
        model.eval()
        before = C.negative_log_likelihood(torch.softmax(model(x), -1), y)
        model.train()
    mix = fit_posthoc_mixture(model, x, y, 3, steps=40, lr=0.05, batch_size=32, seed=1)
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert hook_count(model) == hooks
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    assert all(p.grad is None for p in model.parameters())
    p = mix.probs(x, 12, seed=0)
    assert p.shape == (12, 64, K)
    torch.testing.assert_close(p.sum(-1), torch.ones(12, 64))
    assert C.negative_log_likelihood(p.mean(0), y) < before - 0.05
    assert len(mix.history) == 40 and mix.history[-1] < mix.history[0]
    up, lo = mix.kl_bounds()
    assert mix.kl == up > 0 and lo == pytest.approx(up - torch.log(torch.tensor(3.0)).item())
    fs = mix.factors()
    assert len(fs) == 8 and fs["encoder.layers.0.self_attn.q.in"][0].shape == (3, E)
    assert mix.probs(x[:4]).shape == (3, 4, K)  # default: one draw per component
    pm = mix.probs(x[:4], 6, spread=False)  # point masses: draw i is component i mod K
    torch.testing.assert_close(pm[:3], pm[3:])


def test_an_error_inside_the_fit_leaves_no_hooks_and_restores_flags():
    model = Classifier()
    x, y = _data(16)
    hooks = hook_count(model)

    def broken(m: nn.Module, xb: torch.Tensor) -> torch.Tensor:
        m(xb)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit_posthoc_mixture(model, x, y, 2, forward=broken, steps=3)
    assert hook_count(model) == hooks
    assert all(p.requires_grad for p in model.parameters())
    sites = rank1_sites(model)
    with pytest.raises(ValueError, match="theta must be"):
        with apply_factors(sites, torch.ones(2, 3)):
            pass
    assert hook_count(model) == hooks


def test_bad_inputs_are_refused_with_the_argument_named():
    model = Classifier()
    x, y = _data(16)
    with pytest.raises(ValueError, match="num_components"):
        fit_posthoc_mixture(model, x, y, 0)
    for s0 in (0.0, -1.0):
        with pytest.raises(ValueError, match="prior_std"):
            fit_posthoc_mixture(model, x, y, 2, prior_std=s0)
    with pytest.raises(ValueError, match="length 16"):
        fit_posthoc_mixture(model, x, y[:10], 2)
    with pytest.raises(ValueError, match="no attention layers"):
        fit_posthoc_mixture(nn.Sequential(nn.Flatten(), nn.Linear(6, K)), x.float(), y, 2)
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        fit_posthoc_mixture("model", x, y, 2)  # type: ignore[arg-type]


def test_fit_on_a_hugging_face_model_leaves_it_unchanged():
    model, x = _model_and_x("hf")
    y = torch.randint(0, K, (5,))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = hook_count(model)
    mix = fit_posthoc_mixture(model, x, y, 2, forward=_fwd, steps=5, batch_size=4)
    assert hook_count(model) == hooks
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
    assert mix.mean.shape == (2, 2 * 8 * E)  # 2 layers × 8 sites of E factors
    assert mix.probs(x, 4, seed=0).shape == (4, 5, K)


def test_mixture_read_predict_is_seeded_and_equals_the_fitted_draws():
    """MixtureRead.predict(x, S, seed=s): the core's stratified draws under that seed (equal for
    equal seeds, different for different ones); temperature is the fitted one."""
    from bayesattn.posthoc import MixtureRead

    model = Classifier(scale=4.0).eval()
    x, y = _data(32)
    read = MixtureRead(model, num_components=2, steps=5, lr=0.05, batch_size=16, seed=1).fit(x, y)
    a, b = read.predict(x, 4, seed=3), read.predict(x, 4, seed=3)
    torch.testing.assert_close(a.probs, b.probs, rtol=0, atol=0)
    torch.testing.assert_close(a.probs, read.core_.probs(x, 4, seed=3), rtol=0, atol=0)
    assert not torch.equal(a.probs, read.predict(x, 4, seed=4).probs)
    assert a.kind == "posthoc/mixture" and a.components.tolist() == [0, 1, 0, 1]
    assert read.temperature == pytest.approx(float(read.core_.log_temperature.exp()))
    with pytest.raises(ValueError, match="num_samples"):
        read.predict(x, 0)
