import pytest
import torch
from pyro import poutine

from bayesattn.nn.blocks import AttentionConfig, Decoder, DecoderLayer, Encoder, EncoderLayer
from bayesattn.nn.modes import attention_mode
from bayesattn.priors import CausalPrior, DistanceDecayPrior, LocalWindowPrior


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_reproduces_torch(norm_first, activation):
    ref = torch.nn.TransformerEncoderLayer(
        16, 4, 32, 0.1, activation, batch_first=True, norm_first=norm_first
    ).eval()
    ours = EncoderLayer(16, 4, 32, 0.1, activation, batch_first=True, norm_first=norm_first).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(3, 5, 16)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[0, -2:] = True
    cm = torch.nn.Transformer.generate_square_subsequent_mask(5)
    for kw in [{}, dict(src_key_padding_mask=kpm), dict(src_mask=cm, is_causal=True)]:
        with torch.no_grad():
            torch.testing.assert_close(ours(x, **kw), ref(x, **kw), atol=1e-5, rtol=0)
        # with gradients torch takes its slow path; still equal
        torch.testing.assert_close(ours(x, **kw), ref(x, **kw), atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_reproduces_torch(norm_first):
    ref = torch.nn.TransformerDecoderLayer(16, 4, 32, 0.1, batch_first=True, norm_first=norm_first)
    ours = DecoderLayer(16, 4, 32, 0.1, batch_first=True, norm_first=norm_first)
    ours.load_state_dict(ref.state_dict())
    ref.eval(), ours.eval()
    t, m = torch.randn(3, 4, 16), torch.randn(3, 6, 16)
    mkpm = torch.zeros(3, 6, dtype=torch.bool)
    mkpm[1, -3:] = True
    cm = torch.nn.Transformer.generate_square_subsequent_mask(4)
    kw = dict(tgt_mask=cm, tgt_is_causal=True, memory_key_padding_mask=mkpm)
    torch.testing.assert_close(ours(t, m, **kw), ref(t, m, **kw), atol=1e-5, rtol=0)


def test_stacks_reproduce_torch_stacks():
    ref = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(16, 4, 32, 0.0, batch_first=True),
        2,
        enable_nested_tensor=False,
    ).eval()
    ours = Encoder(16, 4, 2, dim_feedforward=32, dropout=0.0).eval()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=0)


def test_attention_config_selects_layers_and_priors():
    cfg = AttentionConfig(family="dirichlet", prior="alibi", layers="last")
    enc = Encoder(16, 4, 3, cfg, dim_feedforward=8)
    assert [layer.self_attn.is_bayesian for layer in enc.layers] == [False, False, True]
    assert all(isinstance(layer.self_attn.prior, DistanceDecayPrior) for layer in enc.layers)
    cfg = AttentionConfig(family="weibull", layers=[0], which=("cross",))
    dec = Decoder(16, 4, 2, cfg, dim_feedforward=8)
    flags = [(lay.self_attn.is_bayesian, lay.multihead_attn.is_bayesian) for lay in dec.layers]
    assert flags == [(False, True), (False, False)]
    cfg = AttentionConfig(prior="local", prior_kwargs={"window": 2, "causal": True})
    assert isinstance(cfg.build_prior(4, 4), LocalWindowPrior)
    cfg = AttentionConfig(prior=lambda h, d: CausalPrior())
    assert isinstance(cfg.build_prior(4, 4), CausalPrior)


def test_every_bayesian_site_is_distinct_and_named_by_path():
    cfg = AttentionConfig(family="dirichlet")
    dec = Decoder(16, 4, 2, cfg, dim_feedforward=8)
    tr = poutine.trace(dec).get_trace(torch.randn(2, 3, 16), torch.randn(2, 4, 16))
    names = [n for n, s in tr.nodes.items() if s["type"] == "sample"]
    assert names == [
        "layers.0.self_attn.latent",
        "layers.0.multihead_attn.latent",
        "layers.1.self_attn.latent",
        "layers.1.multihead_attn.latent",
    ]
    # separate posterior parameters per layer
    ps = [lay.self_attn.family.log_concentration for lay in dec.layers]
    assert ps[0] is not ps[1]


def test_decoder_is_causal_and_sample_dims_flow():
    dec = Decoder(16, 4, 1, cross_attention=False, dim_feedforward=8, dropout=0.0).eval()
    x = torch.randn(2, 5, 16)
    y = dec(x)
    x2 = x.clone()
    x2[:, 3:] = torch.randn(2, 2, 16)  # changing the future leaves the past unchanged
    torch.testing.assert_close(dec(x2)[:, :3], y[:, :3])
    bdec = Decoder(16, 4, 1, AttentionConfig(family="dirichlet"), dim_feedforward=8)
    with attention_mode("guide"):
        out = bdec(torch.randn(7, 2, 3, 16), torch.randn(7, 2, 4, 16))
    assert out.shape == (7, 2, 3, 16)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: AttentionConfig(prior="gaussian"), "prior must be one of"),
        (lambda: AttentionConfig(layers="first"), "layers must be"),
        (lambda: AttentionConfig(which=("self", "other")), "which must contain"),
        (lambda: AttentionConfig(family="beta"), "family must be one of"),
        (lambda: EncoderLayer(16, 3), "divisible by nhead"),
        (lambda: EncoderLayer(16, 4, dropout=2.0), "dropout"),
        (lambda: EncoderLayer(16, 4, activation="tanh"), "activation"),
        (lambda: Encoder(16, 4, 0), "num_layers"),
        (lambda: Encoder(16, 4, 1, colour="red"), "unexpected block arguments"),
    ],
)
def test_block_errors(make, match):
    with pytest.raises((ValueError, TypeError), match=match):
        make()


def test_decoder_needs_memory():
    with pytest.raises(ValueError, match="needs memory"):
        Decoder(16, 4, 1, dim_feedforward=8)(torch.randn(1, 2, 16))
