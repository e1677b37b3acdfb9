"""Cheaper posterior draws, each checked against the per-sample path it replaces, bit for bit.

* the first random encoder layer (classifiers, ViTs, a ``CausalLM``'s decoder) draws its ``S`` samples from the shared input (projections,
  scores and the guide's parameters once) = the input expanded to ``S`` copies first;
* :func:`~bayesattn.functional.supports.attend.sample_matmul` = ``torch.matmul`` = one matmul
  per sample;
* the masked distributions' draws finished in place (no gradient needed) = the autograd path;
* predict's bookkeeping reads module flags without a ``PyroModule`` miss, same answers.
"""

from __future__ import annotations

import pyro
import pytest
import torch
from torch import nn

from bayesattn.distributions import (
    MaskedConcrete,
    MaskedDirichlet,
    MaskedGamma,
    MaskedNormal,
    MaskedWeibull,
)
from bayesattn.functional.supports.attend import FOLD_ROWS, sample_matmul
from bayesattn.nn.blocks import AttentionConfig, Decoder, EncoderLayer
from bayesattn.nn.modes import attention_mode, collect_kl
from bayesattn.nn.networks import CausalLM, TransformerClassifier, VisionTransformer
from bayesattn.nn.networks.global_sites import module_flag as _flag
from bayesattn.uncertainty import predict

FAMILIES = ["dirichlet", "logistic_normal", "weibull", "concrete"]


def _tokens(pad: bool) -> torch.Tensor:
    x = torch.randint(1, 9, (4, 6), generator=torch.Generator().manual_seed(0))
    if pad:
        x[1, 3:] = 0
        x[2, 1:] = 0
    return x


def _classifier(family: str, pooling: str) -> TransformerClassifier:
    torch.manual_seed(0)
    pyro.clear_param_store()
    cfg = AttentionConfig(family=family)
    return TransformerClassifier(
        3, vocab_size=9, d_model=8, nhead=2, num_layers=2, dim_feedforward=16,
        pooling=pooling, attention=cfg,
    ).eval()  # fmt: skip


@pytest.fixture
def per_sample_layers(monkeypatch):
    """The path before: a layer asked for ``S`` draws runs on ``S`` copies of its input."""
    shared = EncoderLayer.forward_samples

    def expanded(self, src, num_samples, src_mask=None, src_key_padding_mask=None,
                 is_causal=False):  # fmt: skip
        if num_samples is not None:
            src = src.expand((num_samples,) + src.shape)  # (S, B, T, E)
        return shared(self, src, None, src_mask, src_key_padding_mask, is_causal)

    def use() -> None:
        monkeypatch.setattr(EncoderLayer, "forward_samples", expanded)

    return use


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("pad", [False, True])
def test_first_random_layer_draws_from_the_shared_input(family, pooling, pad, per_sample_layers):
    net, x, S = _classifier(family, pooling), _tokens(pad), 5
    seen: list[torch.Size] = []
    hook = net.encoder.layers[0].self_attn.register_forward_pre_hook(
        lambda m, args: seen.append(args[0].shape)
    )
    out = {}
    for mode in ("guide", "model"):
        torch.manual_seed(1)
        out[mode] = predict(net, x, S, mode=mode)
    torch.manual_seed(2)
    with torch.no_grad(), net.pyro_context, collect_kl() as col:
        logits = net.forward_logits(x, None, S)
    hook.remove()
    assert seen and all(s == (4, 7 if pooling == "cls" else 6, 8) for s in seen)  # no S dim
    per_sample_layers()
    for mode in ("guide", "model"):
        torch.manual_seed(1)
        ref = predict(net, x, S, mode=mode)
        assert torch.equal(out[mode].probs, ref.probs)
        assert out[mode].probs.std(0).max() > 0  # the draws differ
        for name, a in ref.attention.items():
            assert torch.equal(out[mode].attention[name].samples, a.samples)
    torch.manual_seed(2)
    with torch.no_grad(), net.pyro_context, collect_kl() as ref_col:
        ref_logits = net.forward_logits(x, None, S)
    assert torch.equal(logits, ref_logits)
    assert col.terms.keys() == ref_col.terms.keys()
    for name, kl in ref_col.terms.items():
        assert torch.equal(col.terms[name], kl)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_num_samples_equals_expanded_input(norm_first):
    torch.manual_seed(0)
    layer = EncoderLayer(8, 2, 16, 0.0, batch_first=True, norm_first=norm_first,
                         family="dirichlet").eval()  # fmt: skip
    x = torch.randn(3, 5, 8)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, 3:] = True
    with attention_mode("guide"):
        torch.manual_seed(4)
        shared = layer.forward_samples(x, 6, src_key_padding_mask=pad)
        torch.manual_seed(4)
        copies = layer(x.expand(6, 3, 5, 8), src_key_padding_mask=pad)
    assert shared.shape == (6, 3, 5, 8)
    assert torch.equal(shared, copies)


def test_every_layer_vit_predict_equals_the_per_sample_path(per_sample_layers):
    torch.manual_seed(0)
    net = VisionTransformer(4, image_size=4, patch_size=2, d_model=8, nhead=2, num_layers=3,
                            dim_feedforward=16, attention=AttentionConfig("weibull")).eval()  # fmt: skip
    x = torch.rand(3, 4, 4)
    torch.manual_seed(5)
    fast = predict(net, x, 8, keep_attention=False).probs
    per_sample_layers()
    torch.manual_seed(5)
    assert torch.equal(fast, predict(net, x, 8, keep_attention=False).probs)


@pytest.mark.parametrize(
    "cfg",
    [
        AttentionConfig.last_layer(),
        AttentionConfig("dirichlet"),
        AttentionConfig("weibull", layers=[1]),
    ],
    ids=["last_layer", "dirichlet", "weibull_layer1"],
)
def test_causal_lm_shares_the_trunk_and_equals_the_per_sample_path(cfg, monkeypatch):
    torch.manual_seed(0)
    net = CausalLM(10, d_model=8, nhead=2, num_layers=3, dim_feedforward=16, attention=cfg).eval()
    x = torch.randint(3, 10, (3, 6), generator=torch.Generator().manual_seed(1))
    x[:, 0] = 1

    def run() -> list[torch.Tensor]:
        torch.manual_seed(3)
        res = predict(net, x, 6)
        torch.manual_seed(4)
        with torch.no_grad(), net.pyro_context, collect_kl() as col:
            logits = net.forward_logits(x, None, 6)
        torch.manual_seed(5)
        gen = net.generate(x[:, :2], 4, num_samples=3)
        kls = [col.terms[k] for k in sorted(col.terms)]
        return [res.probs, *(a.samples for a in res.attention.values()), logits, *kls,
                gen.tokens, gen.probs]  # fmt: skip

    seen: list[torch.Size] = []
    hook = net.decoder.layers[0].register_forward_pre_hook(lambda m, a: seen.append(a[0].shape))
    fast = run()
    hook.remove()
    if cfg.layers == "last":  # layers 0 and 1 run once for all samples
        assert seen and all(len(s) == 3 for s in seen)

    def per_sample(self, tgt, num_samples, first, draws, tgt_key_padding_mask=None):
        return self(tgt.expand((num_samples,) + tgt.shape), None, tgt_key_padding_mask)

    monkeypatch.setattr(Decoder, "forward_samples", per_sample)
    ref = run()
    assert len(fast) == len(ref)
    for a, b in zip(fast, ref, strict=True):
        assert torch.equal(a, b)


# ---- sample_matmul ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "w_shape, v_shape",
    [
        ((8, 3, 2, 1, 5), (3, 2, 5, 4)),  # one query row: folded
        ((8, 3, 2, FOLD_ROWS - 1, 5), (3, 2, 5, 4)),
        ((6, 3, 2, FOLD_ROWS + 3, 5), (3, 2, 5, 4)),  # one GEMM per sample
        ((2, 3, 3, 2, 9, 5), (3, 2, 5, 4)),  # two sample dims
        ((3, 2, 9, 5), (3, 2, 5, 4)),  # no sample dim: plain matmul
        ((4, 3, 2, 9, 5), (4, 3, 2, 5, 4)),  # v with the sample dim: plain matmul
    ],
)
def test_sample_matmul_equals_matmul_and_the_per_sample_products(w_shape, v_shape):
    g = torch.Generator().manual_seed(0)
    w, v = torch.rand(w_shape, generator=g), torch.randn(v_shape, generator=g)
    out = sample_matmul(w, v)
    assert torch.equal(out, torch.matmul(w, v))
    extra = w.dim() - v.dim()
    if extra > 0:
        flat = w.reshape((-1,) + w.shape[extra:])
        per = torch.stack([torch.matmul(ws, v) for ws in flat]).reshape(out.shape)
        assert torch.equal(out, per)


@pytest.mark.parametrize("rows", [1, FOLD_ROWS + 1])
def test_sample_matmul_follows_cpu_autocast(rows):
    w, v = torch.rand(4, 2, 2, rows, 5), torch.randn(2, 2, 5, 3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = sample_matmul(w, v), torch.matmul(w, v)
    assert out.dtype == ref.dtype == torch.bfloat16
    assert torch.equal(out, ref)


def test_sample_matmul_keeps_gradients():
    w = torch.rand(4, 2, 2, 9, 5, requires_grad=True)
    v = torch.randn(2, 2, 5, 3, requires_grad=True)
    sample_matmul(w, v).sum().backward()
    assert w.grad is not None and v.grad is not None
    w2, v2 = w.detach().requires_grad_(), v.detach().requires_grad_()
    torch.matmul(w2, v2).sum().backward()
    assert torch.equal(w.grad, w2.grad) and torch.equal(v.grad, v2.grad)


# ---- draws finished in place --------------------------------------------------------------------


def _dists(masked: bool) -> list:
    g = torch.Generator().manual_seed(3)
    shape = (2, 2, 3, 6)
    allowed = None
    if masked:
        allowed = torch.ones(shape, dtype=torch.bool)
        allowed[..., -2:] = False
        allowed[0, 0, 0] = False  # a row with no allowed key
    a = (torch.rand(shape, generator=g) * 3 + 0.1).requires_grad_()
    b = (torch.rand(shape, generator=g) + 0.5).requires_grad_()
    k = (torch.rand(1, 2, 1, 1, generator=g) * 3 + 0.5).requires_grad_()
    return [
        MaskedDirichlet(a, allowed),
        MaskedNormal(a, b, allowed),
        MaskedWeibull(k, b, allowed),
        MaskedGamma(a, b, allowed),
        MaskedConcrete(a, b, allowed),
    ]


@pytest.mark.parametrize("masked", [False, True])
def test_in_place_draws_equal_the_autograd_draws(masked):
    for d in _dists(masked):
        torch.manual_seed(7)
        grad_path = d.rsample((4,))
        assert grad_path.requires_grad, type(d).__name__
        torch.manual_seed(7)
        with torch.no_grad():
            fast = d.rsample((4,))
        assert torch.equal(fast, grad_path.detach()), type(d).__name__
        grad_path.sum().backward()  # the autograd path still differentiates


# ---- bookkeeping --------------------------------------------------------------------------------


def test_module_flags_read_instance_and_class_attributes():
    class Flagged(nn.Module):
        is_bayesian = True

    m = nn.Linear(2, 2)
    assert not _flag(m, "is_bayesian")
    m.is_bayesian = True  # an instance attribute counts too
    assert _flag(m, "is_bayesian") and _flag(Flagged(), "is_bayesian")
    Flagged.is_bayesian = False
    assert not _flag(Flagged(), "is_bayesian")


def test_predict_restores_training_flags_it_did_not_need_to_change():
    net = _classifier("dirichlet", "cls")
    net.encoder.layers[0].train()  # a mixed network: one submodule in training mode
    flags = {n: m.training for n, m in net.named_modules()}
    predict(net, _tokens(True), 3)
    assert {n: m.training for n, m in net.named_modules()} == flags


def test_draws_with_parameters_of_another_dtype_are_not_finished_in_place():
    loc, scale = torch.zeros(2, 5), torch.ones(2, 5, dtype=torch.float64)
    k = torch.full((1, 1), 2.0, dtype=torch.float64)
    for d in (MaskedNormal(loc, scale), MaskedWeibull(k, torch.ones(2, 5))):
        torch.manual_seed(0)
        ref = d.rsample((3,))  # promoted out of place
        torch.manual_seed(0)
        with torch.no_grad():
            fast = d.rsample((3,))
        assert fast.dtype == ref.dtype and torch.equal(fast, ref)
