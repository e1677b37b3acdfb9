"""Bayesian attention in Hugging Face models through transformers' AttentionInterface."""

from __future__ import annotations

import pyro
import pytest
import torch
from pyro import poutine

from bayesattn import attention_mode
from bayesattn.nn.modes import collect_kl

transformers = pytest.importorskip("transformers")
from bayesattn.interop.hf import (  # noqa: E402
    ATTN_NAME,
    convert_hf,
    hf_attention_modules,
    unconvert_hf,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    pyro.clear_param_store()


def _pad_mask():
    return torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])


def _bert():
    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        vocab_size=50, attn_implementation="eager",
    )  # fmt: skip
    return transformers.BertModel(cfg), dict(
        input_ids=torch.randint(0, 50, (3, 7)), attention_mask=_pad_mask()
    )


def _vit():
    cfg = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        image_size=16, patch_size=4, num_channels=3, attn_implementation="eager",
    )  # fmt: skip
    return transformers.ViTModel(cfg), dict(pixel_values=torch.randn(2, 3, 16, 16))


def _gpt2():
    cfg = transformers.GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=50, n_positions=32, bos_token_id=0,
        eos_token_id=0, attn_implementation="eager",
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg), dict(
        input_ids=torch.randint(0, 50, (3, 7)), attention_mask=_pad_mask()
    )


def _llama():  # grouped-query attention: 4 query heads, 2 key/value heads
    cfg = transformers.LlamaConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=50, attn_implementation="eager",
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg), dict(
        input_ids=torch.randint(0, 50, (3, 7)), attention_mask=_pad_mask()
    )


PATHS = {
    "bert": "encoder.layer.{}.attention.self",
    "vit": None,
    "gpt2": "transformer.h.{}.attn",
    "llama": "model.layers.{}.self_attn",
}


def _valid(out: torch.Tensor, name: str, inputs: dict) -> torch.Tensor:
    """Compare only positions that are not padding (their values are arbitrary in any model)."""
    if "attention_mask" in inputs and name in ("gpt2", "llama"):
        return out[inputs["attention_mask"].bool()]
    return out


@pytest.mark.parametrize("name, build", [("bert", _bert), ("vit", _vit), ("gpt2", _gpt2), ("llama", _llama)])  # fmt: skip
def test_mean_mode_is_the_models_own_output_and_sites_are_per_layer(name, build):
    model, inputs = build()
    model.eval()
    with torch.no_grad():
        want = model(**inputs)[0]
    n_params = sum(p.numel() for p in model.parameters())
    convert_hf(model, family="dirichlet")
    assert model.config._attn_implementation == ATTN_NAME
    mods = hf_attention_modules(model)
    assert len(mods) == 2
    fams = [m.bayesattn_family for m in mods.values()]
    assert fams[0] is not fams[1]  # each attention module owns its posterior
    assert sum(p.numel() for p in model.parameters()) == n_params + sum(
        p.numel() for f in fams for p in f.parameters()
    )
    assert any("bayesattn_family" in k for k in model.state_dict())
    with torch.no_grad():
        with attention_mode("mean"):
            torch.testing.assert_close(model(**inputs)[0], want, rtol=0, atol=0)
        eval_out = model(**inputs)[0]  # eval() without a mode: the posterior mean
        with attention_mode("guide"):
            tr = poutine.trace(lambda: model(**inputs)).get_trace()
            sampled = model(**inputs)[0]
    torch.testing.assert_close(eval_out, want, rtol=0, atol=0)
    sites = [n for n, s in tr.nodes.items() if s["type"] == "sample"]
    assert sites == [f"{p}.latent" for p in mods]
    if PATHS[name]:
        assert sites == [PATHS[name].format(i) + ".latent" for i in range(2)]
    assert (_valid(sampled, name, inputs) - _valid(want, name, inputs)).abs().max() > 1e-4
    unconvert_hf(model)
    assert model.config._attn_implementation == "eager"
    assert not any("bayesattn" in k for k in model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs)[0], want, rtol=0, atol=0)


def test_sampled_weights_respect_padding_and_causality():
    model, inputs = _gpt2()
    convert_hf(model.eval(), family="dirichlet")
    out = model(**inputs, output_attentions=True)
    w = out.attentions[0]  # (B, H, T, T) sampled weights
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-5, rtol=0)
    assert (w.triu(1) == 0).all()  # causal
    assert (w[1, :, :, 5:] == 0).all()  # padded keys of example 1


def test_elbo_mode_collects_one_kl_per_layer_and_grads_reach_posteriors():
    model, inputs = _bert()
    convert_hf(model.eval(), family="logistic_normal", layers="last")
    mods = hf_attention_modules(model)
    assert [hasattr(m, "bayesattn_family") for m in mods.values()] == [False, True]
    with collect_kl() as col:
        out = model(**inputs)[0]
    assert list(col.terms) == ["encoder.layer.1.attention.self.latent"]
    (out.sum() + col.total().sum()).backward()
    fam = mods["encoder.layer.1.attention.self"].bayesattn_family
    assert all(p.grad is not None for p in fam.parameters())
    with pytest.raises(ValueError, match="AttentionInterface"):
        convert_hf(torch.nn.Linear(2, 2))


def test_default_sdpa_model_round_trip():
    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        vocab_size=50,
    )  # fmt: skip
    model = transformers.BertModel(cfg).eval()
    assert model.config._attn_implementation == "sdpa"
    ids = torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        want = model(input_ids=ids)[0]
        convert_hf(model)
        with attention_mode("mean"):  # eager maths against torch's fused SDPA: rounding only
            torch.testing.assert_close(model(input_ids=ids)[0], want, atol=1e-5, rtol=0)
        unconvert_hf(model)
        assert model.config._attn_implementation == "sdpa"
        torch.testing.assert_close(model(input_ids=ids)[0], want, atol=0, rtol=0)


def _t5():
    cfg = transformers.T5Config(
        vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, dropout_rate=0.0, attn_implementation="eager",
        decoder_start_token_id=0,
    )  # fmt: skip
    ids = torch.randint(0, 40, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    return transformers.T5Model(cfg), dict(input_ids=ids, attention_mask=mask,
                                           decoder_input_ids=ids)


def _gemma2():  # logit soft-capping, sliding-window layers, grouped-query attention
    cfg = transformers.Gemma2Config(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=4, attn_logit_softcapping=2.0,
        final_logit_softcapping=None, sliding_window=3, attn_implementation="eager",
    )  # fmt: skip
    ids = torch.randint(0, 40, (2, 6))
    return transformers.Gemma2Model(cfg), dict(
        input_ids=ids, attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    )


@pytest.mark.parametrize("build", [_t5, _gemma2], ids=["t5 position_bias", "gemma2 softcap"])
def test_extra_interface_arguments_are_honoured_like_eager(build):
    """T5's relative position bias and Gemma-2's soft-capping reach the scores exactly as in the
    model's own eager attention (they were dropped before: outputs off by ~0.2)."""
    model, inputs = build()
    model.eval()
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
        convert_hf(model, family="dirichlet")
        with attention_mode("mean"):
            got = model(**inputs).last_hidden_state
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        assert bool(torch.isfinite(model(**inputs).last_hidden_state).all())  # draws


def test_unknown_interface_arguments_are_refused_naming_the_model_type():
    from bayesattn.interop.hf import bayesian_attention_forward

    model, _ = _gemma2()
    attn = model.layers[0].self_attn
    q = torch.randn(1, 4, 3, 4)
    kv = torch.randn(1, 2, 3, 4)
    with pytest.raises(TypeError, match=r"\['s_aux'\].*model type 'gemma2'"):
        bayesian_attention_forward(attn, q, kv, kv, None, s_aux=torch.zeros(4))
    out, _ = bayesian_attention_forward(attn, q, kv, kv, None, sliding_window=3, s_aux=None)
    assert out.shape == (1, 3, 4, 4)  # ignored as eager ignores them; None means unused


class _Wrapper(torch.nn.Module):
    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert
        self.head = torch.nn.Linear(32, 2)

    def forward(self, **kw):
        return self.head(self.bert(**kw).last_hidden_state[:, 0])


def test_wrapped_models_convert_and_unconvert_or_are_refused_unchanged():
    bert, inputs = _bert()
    bert.eval()
    wrapped = _Wrapper(bert)
    with torch.no_grad():
        want = wrapped(**inputs)
        convert_hf(wrapped, family="dirichlet")
        assert bert.config._attn_implementation == ATTN_NAME
        assert all(hasattr(m, "bayesattn_family") for m in hf_attention_modules(wrapped).values())
        with attention_mode("mean"):
            torch.testing.assert_close(wrapped(**inputs), want, atol=1e-6, rtol=0)
        unconvert_hf(wrapped)
        assert bert.config._attn_implementation == "eager"
        assert not any(hasattr(m, "bayesattn_family") for m in bert.modules())
        torch.testing.assert_close(wrapped(**inputs), want, atol=0, rtol=0)
    encoder_only = torch.nn.Sequential(bert.encoder)  # attention modules, no PreTrainedModel
    with pytest.raises(TypeError, match="nothing was changed"):
        convert_hf(encoder_only)
    assert not any(hasattr(m, "bayesattn_family") for m in bert.modules())


def test_all_masked_rows_draw_around_the_uniform_mean():
    """An all-zero attention_mask: transformers' mean is uniform over every key; the draws
    follow the same rule (finite, on the simplex, centred on uniform), not all-zero rows."""
    from bayesattn.interop.hf import bayesian_attention_forward

    model, _ = _bert()
    convert_hf(model.eval(), family="dirichlet")
    attn = model.encoder.layer[0].attention.self
    q, k, v = torch.randn(3, 1, 4, 2, 8).unbind(0)  # (B=1, H=4, T=2, D=8)
    mask = torch.full((1, 1, 2, 2), torch.finfo(torch.float32).min)
    with attention_mode("mean"):
        _, w_mean = bayesian_attention_forward(attn, q, k, v, mask)
    torch.testing.assert_close(w_mean, torch.full_like(w_mean, 0.5))
    with torch.no_grad():
        draws = torch.stack(
            [bayesian_attention_forward(attn, q, k, v, mask)[1] for _ in range(300)]
        )
    torch.testing.assert_close(draws.sum(-1), torch.ones(draws.shape[:-1]), atol=1e-5, rtol=0)
    assert float((draws.mean(0) - 0.5).abs().max()) < 0.08


def test_num_samples_gives_draws_on_hf_models_and_unconvert_leaves_unconverted_models():
    """``with num_samples(S)`` on a converted transformers model: S draws ``(S, B, ...)`` (inputs
    repeated along the batch), identical in mean mode and equal to the model's own output there;
    a wrapper that only holds the model refuses it; unconvert_hf removes the hooks and leaves a
    never-converted model alone."""
    import bayesattn

    model, inputs = _bert()
    model.eval()
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
        convert_hf(model, family="dirichlet")
        with bayesattn.num_samples(4):
            draws = model(**inputs).last_hidden_state
            with attention_mode("mean"):
                means = model(**inputs).last_hidden_state
    assert draws.shape == (4,) + want.shape and means.shape == (4,) + want.shape
    torch.testing.assert_close(means, want.expand_as(means), atol=1e-6, rtol=0)
    assert float((draws[0] - draws[1]).abs().max()) > 0  # independent draws per sample
    wrapped = _Wrapper(transformers.BertModel(model.config).eval())
    convert_hf(wrapped, family="dirichlet")
    with bayesattn.num_samples(4), pytest.raises(ValueError, match="predict"):
        wrapped(**inputs)
    unconvert_hf(model)
    with torch.no_grad(), bayesattn.num_samples(4):
        assert model(**inputs).last_hidden_state.shape == want.shape  # plain model again
    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
        vocab_size=50,
    )  # fmt: skip
    plain = transformers.BertModel(cfg)
    assert plain.config._attn_implementation == "sdpa"
    unconvert_hf(plain)
    assert plain.config._attn_implementation == "sdpa"  # never converted: unchanged


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_convert_hf_default_family_in_half_precision(dtype):
    """The convert_hf default (Dirichlet) draws in float16/bfloat16 models (torch has no half
    Gamma sampler on CPU: the draw runs in float32), with finite outputs and KL."""
    model, inputs = _bert()
    convert_hf(model.to(dtype).eval())
    with attention_mode("elbo"), collect_kl() as col:
        out = model(**inputs).last_hidden_state
        kl = col.total()
    assert out.dtype == dtype
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(kl).all())


# ---- issue 33: round 4 ------------------------------------------------------------------------
class _TwoModels(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _bert()[0], _bert()[0]


def test_a_convert_hf_that_fails_on_a_wrapper_leaves_the_model_as_it_was(monkeypatch):
    wrapped = _TwoModels()
    names = [n for n, _ in wrapped.named_parameters()]
    sd = {k: v.clone() for k, v in wrapped.state_dict().items()}

    def refuse(*a, **k):
        raise ValueError("this model does not support the attention interface")

    monkeypatch.setattr(wrapped.b, "set_attn_implementation", refuse)
    with pytest.raises(ValueError, match="does not support"):
        convert_hf(wrapped, family="dirichlet")
    assert not any(hasattr(m, "bayesattn_family") for m in wrapped.modules())
    assert not any(hasattr(m, "_bayesattn_site") for m in wrapped.modules())
    assert wrapped.a.config._attn_implementation == "eager"
    assert wrapped.b.config._attn_implementation == "eager"
    assert [n for n, _ in wrapped.named_parameters()] == names
    assert wrapped.state_dict().keys() == sd.keys()
    monkeypatch.undo()
    convert_hf(wrapped, family="dirichlet")  # and it converts once the cause is gone
    assert wrapped.a.config._attn_implementation == ATTN_NAME


def _small_gpt2(cls, **kw):
    cfg = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=30, n_positions=32,
                                  attn_implementation="eager", pad_token_id=0, bos_token_id=1,
                                  eos_token_id=2, **kw)  # fmt: skip
    return cls(cfg).eval()


def test_gpt2_generate_with_left_padding_under_sampling():
    """Left padding changes nothing: greedy decoding in the mean mode gives the unpadded
    sequence's tokens, and drawn attention puts exactly no weight on the padding."""
    model = convert_hf(_small_gpt2(transformers.GPT2LMHeadModel), family="dirichlet")
    ids = torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    with torch.no_grad():
        with attention_mode("mean"):
            padded = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
            alone = model.generate(ids[1:, 2:], max_new_tokens=4, do_sample=False)
        assert padded[1, 4:].tolist() == alone[0, 2:].tolist()
        sampled = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=True)
        assert sampled.shape == (2, 8) and bool((sampled[:, :4] == ids).all())
        pos = (mask.cumsum(-1) - 1).clamp_min(0)
        out = model(ids, attention_mask=mask, position_ids=pos, output_attentions=True)
    for w in out.attentions:  # (B, H, T, T) drawn weights
        assert float(w[1, :, 2:, :2].abs().max()) == 0.0
        torch.testing.assert_close(w[1, :, 2:].sum(-1), torch.ones(2, 2))


def test_posthoc_gp_reads_the_position_a_gpt2_classifier_pools():
    """GPT-2's sequence classifier applies its head to every token and keeps the last one: the
    read's variance must depend on the tokens after the first (it read token 0 before)."""
    from bayesattn.posthoc._gp_core import fit_posthoc_gp

    model = _small_gpt2(transformers.GPT2ForSequenceClassification, num_labels=3)
    x, y = torch.randint(1, 30, (24, 6)), torch.randint(0, 3, (24,))
    read = fit_posthoc_gp(model, x, y, model.score, forward=lambda m, i: m(input_ids=i).logits,
                          num_features=32)  # fmt: skip
    other = x[:4].clone()
    other[:, 1:] = torch.randint(1, 30, (4, 5))
    v, v_other = read.variance(x[:4]), read.variance(other)
    assert not torch.allclose(v, v_other, rtol=1e-3, atol=0)
    # the features are those of the last token: the last token alone decides them
    same_last = x[:4].clone()
    same_last[:, :-1] = torch.randint(1, 30, (4, 5))
    assert not torch.allclose(read.variance(same_last), v, rtol=1e-6, atol=0)  # causal context


def test_posthoc_gp_read_of_a_converted_bert_is_deterministic():
    from bayesattn.posthoc._gp_core import fit_posthoc_gp

    cfg = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, vocab_size=30, num_labels=3,
                                  attn_implementation="eager")  # fmt: skip
    model = convert_hf(transformers.BertForSequenceClassification(cfg).eval(), family="dirichlet")
    x, y = torch.randint(1, 30, (24, 6)), torch.randint(0, 3, (24,))
    read = fit_posthoc_gp(model, x, y, model.classifier,
                          forward=lambda m, i: m(input_ids=i).logits, num_features=32)  # fmt: skip
    assert torch.equal(read.probs(x[:5]), read.probs(x[:5]))
    assert torch.equal(read.variance(x[:5]), read.variance(x[:5]))


def test_a_saved_converted_model_loads_and_runs_in_a_fresh_process(tmp_path):
    """``torch.save(model)`` of a converted BERT; a new interpreter that imports neither
    bayesattn.interop.hf nor anything else of bayesattn loads it and runs it (the attention
    implementation registers itself on unpickling), with the same mean-mode output."""
    import subprocess
    import sys

    bert, inputs = _bert()
    bert.eval()
    convert_hf(bert, family="dirichlet")
    with torch.no_grad():
        want = bert(**inputs).last_hidden_state
    torch.save({"model": bert, "inputs": inputs, "want": want}, tmp_path / "bert.pt")
    code = (
        "import sys, torch\n"
        f"d = torch.load({str(tmp_path / 'bert.pt')!r}, weights_only=False)\n"
        "assert 'bayesattn.interop.hf' in sys.modules  # imported by the unpickling itself\n"
        "with torch.no_grad():\n"
        "    got = d['model'](**d['inputs']).last_hidden_state\n"
        "torch.testing.assert_close(got, d['want'], rtol=0, atol=1e-6)\n"
        "print('ran', d['model'].config._attn_implementation)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert "ran bayesattn" in res.stdout
    unconvert_hf(bert)
    assert not hasattr(bert, "_bayesattn_registration")


def test_a_family_built_for_other_head_counts_is_refused_unchanged():
    from bayesattn.families import DirichletWeights

    bert, _ = _bert()  # 4 heads
    names = [n for n, _ in bert.named_parameters()]
    with pytest.raises(ValueError, match=r"DirichletWeights has 3 heads but the attention module "
                       r"'encoder.layer.0.attention.self' has 4"):  # fmt: skip
        convert_hf(bert, family=DirichletWeights(3))
    assert [n for n, _ in bert.named_parameters()] == names
    assert bert.config._attn_implementation == "eager"
    convert_hf(bert, family=DirichletWeights(1))  # one head shared by all: fits
    convert_hf(bert, family=DirichletWeights(4))


def test_a_convert_hf_failing_after_the_switch_leaves_the_model_as_it_was(monkeypatch):
    """A failure at the last step (the sample hooks) undoes everything: families, sites,
    implementation, registration and hooks, and the parameters are as they were."""
    bert, _ = _bert()
    names = [n for n, _ in bert.named_parameters()]

    def refuse(*a, **k):
        raise RuntimeError("no hooks today")

    monkeypatch.setattr(bert, "register_forward_hook", refuse)
    with pytest.raises(RuntimeError, match="no hooks today"):
        convert_hf(bert, family="dirichlet")
    assert [n for n, _ in bert.named_parameters()] == names
    assert not any(hasattr(m, "bayesattn_family") for m in bert.modules())
    assert bert.config._attn_implementation == "eager"
    assert not hasattr(bert, "_bayesattn_registration")
    assert not hasattr(bert, "_bayesattn_sample_hooks")
    assert not bert._forward_pre_hooks
