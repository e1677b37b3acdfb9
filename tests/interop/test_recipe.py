"""``convert(model, config=...)`` and ``convert_hf(model, config=...)``: an AttentionConfig as
the recipe of a conversion."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import bayesattn
from bayesattn import AttentionConfig
from bayesattn.families import LogisticNormalWeights
from bayesattn.interop import bayesian_attention_modules
from bayesattn.priors import LocalWindowPrior, UniformPrior


def _encoder(layers: int = 3) -> nn.TransformerEncoder:
    layer = nn.TransformerEncoderLayer(16, 4, 32, 0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def test_the_last_layer_recipe_on_a_torch_encoder():
    model = bayesattn.convert(_encoder(), config=AttentionConfig.last_layer())
    layers = bayesian_attention_modules(model)
    assert list(layers) == ["layers.2.self_attn"]  # the last layer only
    fam = layers["layers.2.self_attn"].family
    assert isinstance(fam, LogisticNormalWeights) and fam.input_dependent
    assert fam.model_location == "attention"
    assert type(model.layers[0].self_attn) is nn.MultiheadAttention  # the others untouched
    # the same as the arguments it stands for (agreeing arguments are allowed)
    same = bayesattn.convert(
        _encoder(), "logistic_normal", layers="last", config=AttentionConfig.last_layer()
    )
    assert list(bayesian_attention_modules(same)) == ["layers.2.self_attn"]


@pytest.mark.parametrize(
    "config", [AttentionConfig(), AttentionConfig.recommended(), AttentionConfig(layers="last")]
)
def test_a_config_without_a_family_is_refused_with_the_way_out(config):
    """A config that selects no family (the recommended, plain softmax one) would convert
    nothing into Bayesian attention: a ValueError naming last_layer() and the density read,
    and the model is left as it was."""
    model = _encoder()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        ValueError, match=r"selects no Bayesian attention.*last_layer\(\).*DensityRead\(model\)"
    ):
        bayesattn.convert(model, config=config)
    assert all(type(m.self_attn) is nn.MultiheadAttention for m in model.layers)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    # without a config, family=None still means deterministic drop-ins
    plain = bayesattn.convert(_encoder(), family=None)
    assert all(type(m.self_attn).__name__ == "BayesianMultiheadAttention" for m in plain.layers)
    assert not bayesian_attention_modules(plain)


def test_config_layers_prior_and_roles():
    cfg = AttentionConfig("dirichlet", prior="local", prior_kwargs={"window": 2}, layers=[0, -1])
    model = bayesattn.convert(_encoder(), config=cfg)
    layers = bayesian_attention_modules(model)
    assert list(layers) == ["layers.0.self_attn", "layers.2.self_attn"]
    assert all(isinstance(m.prior, LocalWindowPrior) for m in layers.values())
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 4, 32, batch_first=True), 2)
    bayesattn.convert(dec, config=AttentionConfig("dirichlet", which="cross", layers="last"))
    assert list(bayesian_attention_modules(dec)) == ["layers.1.multihead_attn"]


@pytest.mark.parametrize(
    "kwargs, match",
    [({"family": "dirichlet"}, "family='dirichlet'"), ({"layers": "all"}, "layers='all'"),
     ({"prior": UniformPrior()}, "prior=UniformPrior")],
)  # fmt: skip
def test_arguments_that_conflict_with_the_config_are_refused(kwargs, match):
    model = _encoder()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=f"{match}.*conflict"):
        bayesattn.convert(model, config=AttentionConfig.last_layer(), **kwargs)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert not bayesian_attention_modules(model)
    with pytest.raises(ValueError, match="support"):
        bayesattn.convert(_encoder(), config=AttentionConfig("dirichlet", support="topk"))
    with pytest.raises(TypeError, match="AttentionConfig"):
        bayesattn.convert(_encoder(), config="dirichlet")


def test_convert_hf_takes_the_recipe():
    transformers = pytest.importorskip("transformers")
    from bayesattn.interop.hf import convert_hf

    cfg = transformers.BertConfig(
        hidden_size=16, num_hidden_layers=3, num_attention_heads=4, intermediate_size=32,
        vocab_size=20, max_position_embeddings=16, attn_implementation="eager",
    )  # fmt: skip
    model = convert_hf(transformers.BertModel(cfg).eval(), config=AttentionConfig.last_layer())
    fams = {
        n: m.bayesattn_family for n, m in model.named_modules() if hasattr(m, "bayesattn_family")
    }
    assert list(fams) == ["encoder.layer.2.attention.self"]
    fam = fams["encoder.layer.2.attention.self"]
    assert isinstance(fam, LogisticNormalWeights) and fam.input_dependent
    bad = [{"family": "dirichlet"}, {"layers": [0]}, {"input_dependent": False}]
    for kw in bad:
        with pytest.raises(ValueError, match="conflict"):
            convert_hf(transformers.BertModel(cfg), config=AttentionConfig.last_layer(), **kw)
    with pytest.raises(ValueError, match="uniform"):
        convert_hf(transformers.BertModel(cfg), config=AttentionConfig("dirichlet", prior="causal"))
    bert = transformers.BertModel(cfg)
    with pytest.raises(ValueError, match=r"convert_hf: config selects no Bayesian attention"):
        convert_hf(bert, config=AttentionConfig.recommended())
    assert not any(hasattr(m, "bayesattn_family") for m in bert.modules())  # left as it was
